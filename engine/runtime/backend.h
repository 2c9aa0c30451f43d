// The compute backend a job asks for (`backend = "cpu" | "cuda"`): its Ops and its allocator.
#pragma once

#include <memory>

#include "engine/backend/ops.h"
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
absl::StatusOr<Backend> MakeBackend(const JobSpec& spec, int gpu, int64_t probe_window = 0);

}  // namespace ithaca
