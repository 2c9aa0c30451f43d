// The one way Ithaca reads TOML text that may come from anyone (job specs sent to ithacad, the
// CLI's --set): toml++ with its settings and the guards in front of it. Include this header
// rather than <toml++/toml.h>, so that every reader gets the same settings.
#pragma once

#include <string>

#include "engine/core/status.h"

// Parse errors come back in a toml::parse_result instead of being thrown: the rest of the engine
// reports errors through absl::Status, and a throw across the parser would be easy to miss.
#define TOML_EXCEPTIONS 0
// toml++ 3.3 asserts on some malformed documents that its parser then refuses with an error
// anyway ("[#": a key expected after '['; found by fuzz/job_spec_fuzzer.cc). Without NDEBUG
// (Bazel's default build) the assert aborts the process, and ithacad parses specs sent by clients:
// the asserts are off here, as in a release build, and the error comes back as a status.
#define TOML_ASSERT(expr) static_assert(true)
#include <toml++/toml.h>

namespace ithaca {

// Bounds checked before toml++ sees the text. toml++ recurses once per part of a dotted key or
// table header (`a.a.a... = 1`): 200,000 parts overflow the stack of a gRPC thread.
inline constexpr size_t kMaxTomlBytes = size_t{1} << 20;  // 1 MiB
inline constexpr int kMaxTomlKeyParts = 16;

// Parses `text` (`source` names it in errors: "job.toml:3:7: invalid TOML: ..."). Refuses,
// before toml++ runs: text over kMaxTomlBytes; a dotted key or table header of more than
// kMaxTomlKeyParts parts; non-ASCII characters where toml++ 3.3 would reach undefined behaviour
// (outside strings and comments, where TOML does not allow them anyway).
absl::StatusOr<toml::table> ParseTomlText(const std::string& text, const std::string& source);

}  // namespace ithaca
