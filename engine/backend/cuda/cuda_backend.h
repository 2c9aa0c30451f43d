// The CUDA backend behind a header without CUDA types, so that code which only picks a backend
// (the worker) builds on machines without CUDA. A build with CUDA links cuda_backend.cc; one
// without it (bazel/cuda_configure.bzl: ITHACA_CUDA=none, or no toolkit found) links
// cuda_backend_stub.cc, whose functions answer FAILED_PRECONDITION "built without CUDA".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend/attention_choice.h"
#include "engine/backend/ops.h"
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
};

struct CudaBackendOptions {
  int gpu = 0;              // made the current device
  size_t budget_bytes = 0;  // the caching allocator's cap; 0: none
  // > 0: the memory probe's attention window (CudaOps::Options::probe_window).
  int64_t probe_window = 0;
  // Each attention pass's kernel (the job's [kernels]; engine/backend/attention_choice.h).
  AttentionKernel attention_forward = AttentionKernel::kAuto;
  AttentionKernel attention_backward = AttentionKernel::kAuto;
};

// CudaOps on a GPU with a caching allocator. FAILED_PRECONDITION when there is no such GPU or no
// CUDA. (The library versions are checked first by engine/runtime's MakeBackend, ReportLibraries.)
absl::StatusOr<CudaBackend> MakeCudaBackend(const CudaBackendOptions& options);

// GPU `gpu`'s memory in bytes; 0 when there is no such GPU (or no CUDA). Makes it the current
// device. (Collectives are put on CudaOps' streams through Ops::streams / Comm::UseStreams.)
int64_t CudaDeviceMemoryBytes(int gpu);

// The cuDNN this binary was compiled against and the one it loads, e.g.
// "cuDNN 9.19.0 (built with 9.19.0)". An error naming both when the loaded library is older
// than the headers, or when none can be loaded.
absl::StatusOr<std::string> CudnnVersionReport();

}  // namespace ithaca
