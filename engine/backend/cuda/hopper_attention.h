// The own Hopper (sm_90a) causal GQA attention forward (hopper_attention.cu: wgmma + TMA,
// warp-specialised, persistent). Layouts are the engine's, as cuDNN's (cudnn_attention.h):
// q, o [S, Hq, D]; k, v [S, Hkv, D] (bf16 bits, token stride H·D); lse f32 [Hq, S], natural
// log of the row sums of exp(scale · q·k), scale = 1/sqrt(D) — what cuDNN's backward reads.
// CudaOps::Attention picks it per shape (cuda_ops_attention.cc: the rule and its figures);
// cuDNN stays the fallback and runs the backward.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ithaca {
namespace cuda {

// False in a build without CUTLASS (bazel/cuda_configure.bzl): hopper_attention_stub.cc.
bool HopperAttentionBuilt();

// Whether the current device can run the kernel: compute capability 9.0 exactly (the code is
// sm_90a SASS only). Looked up once per device.
bool HopperAttentionDeviceSupported();

// nullptr when the shape and pointers qualify, else why not: D ∈ {64, 128}, S > 0 and
// S % 8 == 0, Hq a multiple of Hkv, 16-byte aligned pointers (TMA).
const char* HopperAttentionUnsupported(int64_t s, int64_t hq, int64_t hkv, int64_t d, const void* q,
                                       const void* k, const void* v, const void* o,
                                       const float* lse);

// The thread-block cluster size the forward uses for this shape: 1 (no cluster), 2 or 4 CTAs
// that hold query heads of one KV head and share (multicast) each K/V block load. Chosen per
// shape from measurements (hopper_attention.cu, ClusterSizeFor).
int HopperAttentionClusterSize(int64_t s, int64_t hq, int64_t hkv, int64_t d);

// Enqueues the forward on `stream`; the shape must qualify (see above). Returns the launch's
// error (cudaSuccess when enqueued). `cluster` 0 takes HopperAttentionClusterSize; 1, 2 or 4
// force a cluster size (benchmarks; it must divide Hq / Hkv).
cudaError_t HopperAttentionForward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   int64_t s, int64_t hq, int64_t hkv, int64_t d, uint16_t* o,
                                   float* lse, cudaStream_t stream, int cluster = 0);

}  // namespace cuda
}  // namespace ithaca
