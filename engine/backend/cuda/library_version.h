// Versions of the NVIDIA libraries a binary was built against and the ones it loaded at run
// time: a library older than its headers may lack what the code calls, and fails late and
// obscurely, so the worker checks at start.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/status.h"

namespace ithaca {

// cuDNN 9 and NCCL 2.9+ encode a version as major * 10000 + minor * 100 + patch: "9.19.0".
std::string FormatLibraryVersion(int64_t code);

// "cuDNN 9.19.0 (built with 9.14.0)". FAILED_PRECONDITION naming both versions when `loaded` is
// older than `built`; UNAVAILABLE when nothing was loaded (`loaded` <= 0).
absl::StatusOr<std::string> CheckLibraryVersion(const std::string& library, int64_t built,
                                                int64_t loaded);

}  // namespace ithaca
