// The compute backend a job asks for (`backend = "cpu" | "cuda"`): its Ops and its allocator.
#pragma once

#include <memory>

#include "engine/backend/ops.h"
#include "engine/core/library_version.h"
#include "engine/memory/allocator.h"
#include "engine/spec/job_spec.h"

namespace ithaca {

struct Backend {
  // Declared first so it is destroyed last: the ops free their workspaces into it.
  std::unique_ptr<Allocator> alloc;
  std::unique_ptr<Ops> ops;
  int64_t device_bytes = 0;  // the GPU's memory (0 on the CPU)
  // The cuDNN and NCCL versions loaded and built against (CUDA), for the start line; empty on
  // the CPU.
  std::string libraries;
  Device device() const { return ops->device(); }
};

// `gpu` is the CUDA device of this rank (ignored on the CPU). FAILED_PRECONDITION naming
// `backend` when the machine cannot run it. `probe_window` > 0 (benches only) makes a CUDA
// backend the memory probe's: attention sees a causal window of that many keys
// (CudaOps::Options::probe_window), every buffer keeps its full size.
// An older cuDNN or NCCL than the code needs (naming both versions) is refused before the
// backend is made (ReportLibraries), rather than failing obscurely mid-step.
absl::StatusOr<Backend> MakeBackend(const JobSpec& spec, int gpu, int64_t probe_window = 0);

// The memory of the GPU a backend of `spec` would run on (0 for the CPU backend), without
// making one: what resolving a spec against this host needs before its backend is made. A GPU
// that cannot be used answers with MakeBackend's error.
absl::StatusOr<int64_t> DeviceMemoryBytes(const JobSpec& spec, int gpu);

// The cuDNN and NCCL this binary loads and was built against (CudnnVersionReport,
// NcclVersionReport), as one line: the one report of the worker's start line (MakeBackend) and
// of `ithaca-worker --libraries` (what ithacad shows as the node's libraries). In a build
// without CUDA the line says so, twice.
LibraryReport ReportLibraries();

}  // namespace ithaca
