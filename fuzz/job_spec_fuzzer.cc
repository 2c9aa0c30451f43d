// libFuzzer harness: job spec TOML (engine/spec/job_spec.h) and the --set overrides ithacad
// applies to it (engine/spec/overrides.h). Any input must parse or be refused with a status; a
// crash, sanitizer report, leak or hang is a bug. The input is the spec, then, after each NUL
// byte, one override ("KEY=VALUE").
#include <cstddef>
#include <cstdint>
#include <string>

#include <vector>

#include "absl/strings/str_split.h"
#include "engine/spec/job_spec.h"
#include "engine/spec/overrides.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts = absl::StrSplit(input, '\0');
  const std::string text = parts[0];
  if (parts.size() > 1) {
    const std::vector<std::string> overrides(parts.begin() + 1, parts.end());
    absl::StatusOr<std::string> set = ithaca::ApplyOverrides(text, "fuzz.toml", overrides);
    if (set.ok()) {
      absl::StatusOr<ithaca::JobSpec> spec = ithaca::ParseJobSpec(*set, "fuzz.toml");
      if (!spec.ok()) {
        (void)ithaca::ExplainSpecError(std::string(spec.status().message()), text, "fuzz.toml",
                                       overrides);
      }
    }
  }
  absl::StatusOr<ithaca::JobSpec> spec = ithaca::ParseJobSpec(text, "fuzz.toml");
  // A preset named by a spec that parsed must resolve or be refused (a config.json path is not
  // followed: the fuzzer would read whatever files it names).
  if (spec.ok() && spec->model.config.empty()) (void)ithaca::ResolveModelConfig(*spec);
  return 0;
}
