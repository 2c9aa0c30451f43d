// `ithaca submit|plan JOB.toml --set training.steps=10 --set memory.offload=true`, and the
// Python client's `overrides=`: the spec's TOML with keys set or replaced. The one
// implementation: the clients send the overrides as they are (SubmitJobRequest.overrides,
// PlanJobRequest.overrides) and ithacad applies them here before it parses the spec. A value is
// read as TOML (10, 3e-4, true, "text", [1, 2]) when it is one, else taken as a string
// (--set data.path=shards/*.tok). Every piece is read through ParseTomlText (toml_text.h: its
// bounds and guards).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ithaca {

// At most this many overrides in one request.
inline constexpr size_t kMaxOverrides = 256;

// `overrides`: "a.b=c" each. The result is the whole spec written back as TOML (its comments
// dropped); with no overrides, `toml_text` unchanged. INVALID_ARGUMENT naming the override or
// the spec's line when either cannot be read, or a key's parent is not a table, or there are
// more than kMaxOverrides.
// `flag`: what the client calls an override, in errors ("--set" when empty; the Python
// client's "overrides").
absl::StatusOr<std::string> ApplyOverrides(const std::string& toml_text, const std::string& source,
                                           const std::vector<std::string>& overrides,
                                           const std::string& flag = "--set");

// The parser's error about a spec ApplyOverrides rewrote ("SOURCE: KEY: what (line N)...")
// counts N in the rewritten text, which the user never saw. This gives the line of KEY in
// the user's file (`toml_text`), or names the --set that gave KEY; `message` unchanged when it
// names no key or there were no overrides.
std::string ExplainSpecError(const std::string& message, const std::string& toml_text,
                             const std::string& source, const std::vector<std::string>& overrides,
                             const std::string& flag = "--set");

}  // namespace ithaca
