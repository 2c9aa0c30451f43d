// The C ABI bench_bwd.py loads through ctypes: the engine's own backward
// (engine/backend/cuda/hopper_attention_bwd.cu), built standalone by build.sh so that it and its
// compile-time variants (build_variants.sh) can be checked against PyTorch and timed beside its
// SDPA backends without the engine around it.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/backend/cuda/hopper_attention.h"

// Bytes of workspace hopper_attention_bwd needs (HopperAttentionBackwardWorkspace).
extern "C" size_t hopper_attention_bwd_workspace(int S, int Hq, int Hkv, int D) {
  return static_cast<size_t>(ithaca::cuda::HopperAttentionBackwardWorkspace(S, Hq, Hkv, D));
}

// 0 when enqueued; -1 for a shape, pointer or workspace the kernel does not take; -2 for a head
// size other than 64 or 128; else the CUDA error of a launch. dq, dk, dv are fully overwritten.
extern "C" int hopper_attention_bwd(void const* q, void const* k, void const* v, void const* o,
                                    void const* dout, float const* lse, void* dq, void* dk,
                                    void* dv, void* workspace, size_t workspace_bytes, int S,
                                    int Hq, int Hkv, int D, void* stream) {
  if (D != 64 && D != 128) return -2;
  auto bf = [](void const* p) { return static_cast<const uint16_t*>(p); };
  const cudaError_t e = ithaca::cuda::HopperAttentionBackward(
      bf(q), bf(k), bf(v), bf(o), bf(dout), lse, S, Hq, Hkv, D, static_cast<uint16_t*>(dq),
      static_cast<uint16_t*>(dk), static_cast<uint16_t*>(dv), workspace,
      static_cast<int64_t>(workspace_bytes), static_cast<cudaStream_t>(stream));
  return e == cudaErrorInvalidValue ? -1 : static_cast<int>(e);
}
