// Versions of the NVIDIA libraries a binary was built against and the ones it loaded at run
// time: a library older than its headers may lack what the code calls, and fails late and
// obscurely, so the worker checks at start.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

// cuDNN 9 and NCCL 2.9+ encode a version as major * 10000 + minor * 100 + patch: "9.19.0".
std::string FormatLibraryVersion(int64_t code);

// The oldest versions the code is known to run with (what it calls exists there, and the GPU
// suite passed on them). A library newer than that but older than the headers is fine: both
// keep their C API within a major version.
inline constexpr int64_t kMinCudnnVersion = 91400;  // the H200 hosts' cuDNN, measured
inline constexpr int64_t kMinNcclVersion = 21800;   // ncclCommSplit

// "cuDNN 9.19.0 (built with 9.14.0)". FAILED_PRECONDITION naming the version loaded and the one
// needed when `loaded` is older than `minimum` or of another major version than `built`;
// UNAVAILABLE when nothing was loaded (`loaded` <= 0).
absl::StatusOr<std::string> CheckLibraryVersion(const std::string& library, int64_t built,
                                                int64_t loaded, int64_t minimum);

// The libraries' reports (CheckLibraryVersion's results) as the one line a worker prints at
// start and `ithaca node` shows: "cuDNN 9.19.0 (built with 9.19.0), NCCL 2.28.9 (built with
// 2.28.9)", an error's message in place of a library that failed. `refusal` is the first
// FAILED_PRECONDITION among them (a library too old: the backend refuses to start), else OK.
struct LibraryReport {
  std::string line;
  absl::Status refusal;
};
LibraryReport CombineLibraryReports(const std::vector<absl::StatusOr<std::string>>& reports);

}  // namespace ithaca
