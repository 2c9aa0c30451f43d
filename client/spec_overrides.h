// `ithaca submit|plan JOB.toml --set training.steps=10 --set memory.offload=true`: the spec's
// TOML with keys set or replaced before it is sent. A value is read as TOML (10, 3e-4, true,
// "text", [1, 2]) when it is one, else taken as a string (--set data.path=shards/*.tok).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ithaca {

// `overrides`: "a.b=c" each. The result is the whole spec written back as TOML (its comments
// dropped); with no overrides, `toml_text` unchanged. INVALID_ARGUMENT naming the override or
// the spec's line when either cannot be read, or a key's parent is not a table.
absl::StatusOr<std::string> ApplyOverrides(const std::string& toml_text, const std::string& source,
                                           const std::vector<std::string>& overrides);

// The daemon's error about a spec ApplyOverrides rewrote ("SOURCE: KEY: what (line N)...")
// counts N in the text that was sent, which the user never saw. This gives the line of KEY in
// the user's file (`toml_text`), or names the --set that gave KEY; `message` unchanged when it
// names no key or there were no overrides.
std::string ExplainSpecError(const std::string& message, const std::string& toml_text,
                             const std::string& source, const std::vector<std::string>& overrides);

}  // namespace ithaca
