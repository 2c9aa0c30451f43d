// The own Hopper (sm_90a) causal GQA attention: forward (hopper_attention.cu: wgmma + TMA,
// warp-specialised, persistent) and backward (hopper_attention_bwd.cu, FlashAttention-3 style).
// Layouts are the engine's, as cuDNN's (cudnn_attention.h): q, o, dout, dq [S, Hq, D]; k, v, dk,
// dv [S, Hkv, D] (bf16 bits, token stride H·D); lse f32 [Hq, S], natural log of the row sums of
// exp(scale · q·k), scale = 1/sqrt(D) — what either backward reads, from either forward.
// CudaOps::Attention and AttentionBackward pick them per shape (cuda_ops_attention.cc: the rule
// and its figures); cuDNN stays the fallback.
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

// Whether the forward's CTAs take row blocks in pairs (p, M-1-p), the first walked up from key
// block 0, the second down from its diagonal: at head_dim 128 in clusters of 2 and 4. Without
// pairs each row block is walked down from its diagonal, so the two orders sum the key blocks of
// a row in a different order: the same values to rounding, not the same bits.
constexpr bool HopperForwardPairsRowBlocks(int64_t d, int cluster) {
  return d == 128 && cluster >= 2;
}

// Enqueues the forward on `stream`; the shape must qualify (see above). Returns the launch's
// error (cudaSuccess when enqueued). `cluster` 0 takes HopperAttentionClusterSize; 1, 2 or 4
// force a cluster size (benchmarks; it must divide Hq / Hkv). `doc_starts` and `window` add the
// masks of the backward below; the key blocks that no query of a row block sees are skipped.
cudaError_t HopperAttentionForward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   int64_t s, int64_t hq, int64_t hkv, int64_t d, uint16_t* o,
                                   float* lse, cudaStream_t stream, int cluster = 0,
                                   const int64_t* doc_starts = nullptr, int64_t ndocs = 0,
                                   int64_t window = 0);

// Bytes of device workspace HopperAttentionBackward needs: the f32 dQ accumulator
// [Hq, S_pad, D], the padded LSE·log2(e) and Dsum rows [Hq, S_pad] and the rows' document bounds
// (2 × int32 [S_pad]), S_pad = S rounded up to 128. About 4·Hq·S·(D + 2): half of cuDNN's
// backward workspace (8·Hq·S·D).
int64_t HopperAttentionBackwardWorkspace(int64_t s, int64_t hq, int64_t hkv, int64_t d);

// Enqueues the backward on `stream`: dq, dk, dv fully overwritten (dk, dv summed over each KV
// head's query heads). The shape must qualify as for the forward (every pointer 16-byte
// aligned, the workspace too) and `workspace_bytes` be at least the above; it needs no
// initialisation. `doc_starts` (device, int64 [ndocs], ascending, the first 0; nullptr or
// ndocs <= 1: one document) adds the document mask of packed samples: a query sees only the
// keys of its own document. `window` > 0 adds a sliding window: query i sees only the keys
// j > i - window (its last `window` keys, itself included; window >= S: the causal mask alone);
// the KV tiles outside every query tile's window are skipped. Returns the launches' error
// (cudaSuccess when enqueued).
cudaError_t HopperAttentionBackward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                    const uint16_t* o, const uint16_t* dout, const float* lse,
                                    int64_t s, int64_t hq, int64_t hkv, int64_t d, uint16_t* dq,
                                    uint16_t* dk, uint16_t* dv, void* workspace,
                                    int64_t workspace_bytes, cudaStream_t stream,
                                    const int64_t* doc_starts = nullptr, int64_t ndocs = 0,
                                    int64_t window = 0);

}  // namespace cuda
}  // namespace ithaca
