// The C ABI bench.py loads through ctypes: the engine's own kernel
// (engine/backend/cuda/hopper_attention.cu), built standalone by build.sh so that it can be timed
// and profiled beside PyTorch's SDPA backends without the engine around it.
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/backend/cuda/hopper_attention.h"

// 0 when enqueued; -1 for a shape the kernel does not take, -2 for a head size other than 64 or
// 128; else the CUDA error of the launch. `cluster` 0 is the kernel's own per-shape choice (what
// the engine runs); 1, 2, 4 force a cluster size.
extern "C" int hopper_attention_fwd_cluster(void const* q, void const* k, void const* v, void* o,
                                            float* lse, int S, int Hq, int Hkv, int D, int cluster,
                                            void* stream) {
  if (D != 64 && D != 128) return -2;
  if (ithaca::cuda::HopperAttentionUnsupported(S, Hq, Hkv, D, q, k, v, o, lse) != nullptr) {
    return -1;
  }
  const cudaError_t e = ithaca::cuda::HopperAttentionForward(
      static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k),
      static_cast<const uint16_t*>(v), S, Hq, Hkv, D, static_cast<uint16_t*>(o), lse,
      static_cast<cudaStream_t>(stream), cluster);
  return e == cudaSuccess ? 0 : static_cast<int>(e);
}

extern "C" int hopper_attention_fwd(void const* q, void const* k, void const* v, void* o,
                                    float* lse, int S, int Hq, int Hkv, int D, void* stream) {
  return hopper_attention_fwd_cluster(q, k, v, o, lse, S, Hq, Hkv, D, 0, stream);
}

// The cluster size hopper_attention_fwd uses for this shape.
extern "C" int hopper_attention_cluster_size(int S, int Hq, int Hkv, int D) {
  return ithaca::cuda::HopperAttentionClusterSize(S, Hq, Hkv, D);
}
