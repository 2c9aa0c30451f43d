// libFuzzer harness: job spec TOML (engine/spec/job_spec.h). Any input must parse or be refused
// with a status; a crash, sanitizer report, leak or hang is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/spec/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ithaca::JobSpec> spec = ithaca::ParseJobSpec(text, "fuzz.toml");
  // A preset named by a spec that parsed must resolve or be refused (a config.json path is not
  // followed: the fuzzer would read whatever files it names).
  if (spec.ok() && spec->model.config.empty()) (void)ithaca::ResolveModelConfig(*spec);
  return 0;
}
