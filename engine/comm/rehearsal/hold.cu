#include "engine/comm/rehearsal/hold.h"

namespace ithaca {
namespace {

__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void StampKernel(uint64_t* slot) { *slot = GlobalTimer(); }

__global__ void HoldKernel(const uint64_t* slot, uint64_t ns) {
  const uint64_t until = *slot + ns;
  while (GlobalTimer() < until) __nanosleep(1000);
}

}  // namespace

cudaError_t LaunchRehearsalStamp(cudaStream_t stream, uint64_t* slot) {
  StampKernel<<<1, 1, 0, stream>>>(slot);
  return cudaGetLastError();
}

cudaError_t LaunchRehearsalHold(cudaStream_t stream, const uint64_t* slot, uint64_t ns) {
  HoldKernel<<<1, 1, 0, stream>>>(slot, ns);
  return cudaGetLastError();
}

}  // namespace ithaca
