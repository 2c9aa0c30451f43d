// The CUDA backend behind a header without CUDA types, so that code which only picks a backend
// (the worker) builds on machines without CUDA. A build with CUDA links cuda_backend.cc; one
// without it (bazel/cuda_configure.bzl: ITHACA_CUDA=none, or no toolkit found) links
// cuda_backend_stub.cc, whose functions answer FAILED_PRECONDITION "built without CUDA".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend/ops.h"
#include "engine/comm/comm.h"
#include "engine/core/status.h"
#include "engine/memory/allocator.h"

namespace ithaca {

// True when this binary was built with CUDA.
bool BuiltWithCuda();

struct CudaBackend {
  // Declared first so it is destroyed last: the ops free their workspaces into it.
  std::unique_ptr<Allocator> alloc;
  std::unique_ptr<Ops> ops;
  int64_t device_bytes = 0;  // the GPU's memory
  // The cuDNN and NCCL versions loaded and built against, for the worker's start line:
  // "cuDNN 9.19.0 (built with 9.19.0), NCCL 2.28.9 (built with 2.28.9)".
  std::string libraries;
};

// CudaOps on GPU `gpu` (made the current device) with a caching allocator capped at
// `budget_bytes` (0: no cap). FAILED_PRECONDITION when there is no such GPU or no CUDA, or when
// the cuDNN or NCCL loaded is older than the one built against (naming both versions).
// `probe_window` > 0: the memory probe's attention window (CudaOps::Options::probe_window).
absl::StatusOr<CudaBackend> MakeCudaBackend(int gpu, size_t budget_bytes, int64_t probe_window = 0);

// GPU `gpu`'s memory in bytes; 0 when there is no such GPU (or no CUDA). Makes it the current
// device. (Collectives are put on CudaOps' streams through Ops::streams / Comm::UseStreams.)
int64_t CudaDeviceMemoryBytes(int gpu);

// The cuDNN this binary was compiled against and the one it loads, e.g.
// "cuDNN 9.19.0 (built with 9.19.0)". An error naming both when the loaded library is older
// than the headers, or when none can be loaded.
absl::StatusOr<std::string> CudnnVersionReport();

}  // namespace ithaca
