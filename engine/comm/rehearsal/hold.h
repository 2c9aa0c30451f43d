// The rehearsal's two kernels: a collective stamps the GPU's clock when the comm stream reaches
// it, runs its copies, then holds the stream until its modeled time has passed since the stamp.
// One thread each, spinning with __nanosleep: they take a sliver of one SM, as little as a
// kernel can (NCCL's own kernels take more: docs/rehearsal.md).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ithaca {

// *slot = the GPU's global timer (ns), on `stream`.
cudaError_t LaunchRehearsalStamp(cudaStream_t stream, uint64_t* slot);
// Returns once the global timer has passed *slot + ns, on `stream`.
cudaError_t LaunchRehearsalHold(cudaStream_t stream, const uint64_t* slot, uint64_t ns);

}  // namespace ithaca
