// Launchers of the CUDA backend's kernels (one family per .cu file beside this header). Raw
// device pointers; bf16 data travels as uint16_t bits. Every launcher enqueues on `stream` and
// checks the launch; none synchronizes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ithaca {
namespace cuda {

// Element types, numbered as engine/core/dtype.h's DType (f32, bf16, i32).
enum class ElemType : int { kF32 = 0, kBF16 = 1, kI32 = 2 };

// ---- elementwise.cu
// x[:n] = value (converted to x's type).
void Fill(void* x, ElemType t, int64_t n, float value, cudaStream_t stream);
// dst[:n] = src[:n] converted (f32 <-> bf16; equal types are a cudaMemcpyAsync).
void Convert(const void* src, ElemType st, void* dst, ElemType dt, int64_t n, cudaStream_t stream);
// y[:n] += alpha · x[:n]; x f32 or bf16, y f32.
void Axpy(float alpha, const void* x, ElemType xt, float* y, int64_t n, cudaStream_t stream);
// c[r, :n] += bias[:n] for each of `rows` rows (leading dimension ldc), bf16: the bias of
// LtGemm's fallback, where cuBLASLt has no kernel with the bias epilogue for a layout.
void AddBiasRows(uint16_t* c, int64_t ldc, int64_t rows, int64_t n, const uint16_t* bias,
                 cudaStream_t stream);
// Per-block partial sums of x (or of x² when `squares`) in double, into partials[0, blocks);
// returns the number of blocks used (at most kMaxReduceBlocks).
constexpr int kMaxReduceBlocks = 264;
int ReducePartials(const void* x, ElemType t, int64_t n, bool squares, double* partials,
                   cudaStream_t stream);
// out[0] = Σ partials[0, blocks), in double, rounded once to f32: finishes a ReducePartials on
// the device, so the sum can feed collectives and later kernels without a host round trip.
void FinishReduce(const double* partials, int blocks, float* out, cudaStream_t stream);

// ---- embedding.cu
// out[t] = table[ids[t]] (bf16 [V, d]); an id outside [0, V) writes a zero row.
void EmbeddingForward(const int32_t* ids, int64_t tokens, const uint16_t* table, int64_t vocab,
                      int64_t d, uint16_t* out, cudaStream_t stream);
// dtable[ids[t]] += dout[t]; dout bf16, dtable f32 or bf16 (atomic adds).
void EmbeddingBackward(const int32_t* ids, int64_t tokens, const uint16_t* dout, int64_t vocab,
                       int64_t d, void* dtable, ElemType dt, cudaStream_t stream);

// ---- rope.cu
// In place on x bf16 [T, H, D]: pair (i, i + D/2) of token t rotates by pos·inv_freq[i]
// (negated when inverse), pos = (pos0 + t) minus the start of its document: `starts` (device,
// num_docs sample indices, see documents.cuh), or no documents when num_docs == 0.
void Rope(uint16_t* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t pos0,
          const float* inv_freq, bool inverse, const int64_t* starts, int64_t num_docs,
          cudaStream_t stream);

// ---- swiglu.cu (bf16, f32 math; outputs may alias inputs elementwise)
void SwiGLUForward(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n,
                   cudaStream_t stream);
void SwiGLUBackward(const uint16_t* gate, const uint16_t* up, const uint16_t* dout, uint16_t* dgate,
                    uint16_t* dup, int64_t n, cudaStream_t stream);

// ---- cross_entropy.cu
// One tile: logits [T, V] (bf16 or f32, as dlogits), labels i32 [T] (< 0: ignored), losses f32
// [T] written, dlogits = (softmax − onehot) · grad_scale written (may alias logits).
void CrossEntropy(const void* logits, ElemType lt, const int32_t* labels, int64_t tokens,
                  int64_t vocab, float* losses, void* dlogits, float grad_scale,
                  cudaStream_t stream);
// hits f32 [T] = 1 where labels[t] >= 0 is the row's first largest logit, else 0.
void LabelIsArgmax(const void* logits, ElemType lt, const int32_t* labels, int64_t tokens,
                   int64_t vocab, float* hits, cudaStream_t stream);

// ---- adamw.cu
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float step_size;     // lr / (1 − β1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 − β2^t)
};
// master, m, v f32 updated; grad f32 or bf16; working (may be null) f32 or bf16 written.
void AdamW(float* master, const void* grad, ElemType gt, float* m, float* v, void* working,
           ElemType wt, int64_t n, const AdamWArgs& a, cudaStream_t stream);

// ---- flash_attention.cu: the own causal GQA flash attention (fallback and second opinion).
// q, out [S, Hq, D]; k, v [S, Hkv, D] bf16; lse f32 [Hq, S]. D in {16, 32, 64, 128}. With
// documents (device `starts`, num_docs > 0, see documents.cuh) a query sees only the keys of its
// own document; num_docs == 0 is one causal sequence.
bool FlashAttentionSupports(int64_t head_dim);
void FlashAttentionForward(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t s,
                           int64_t hq, int64_t hkv, int64_t d, uint16_t* out, float* lse,
                           const int64_t* starts, int64_t num_docs, cudaStream_t stream);
// delta: f32 scratch [Hq, S]. dq, dk, dv written.
void FlashAttentionBackward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                            const uint16_t* out, const uint16_t* dout, const float* lse, int64_t s,
                            int64_t hq, int64_t hkv, int64_t d, float* delta, uint16_t* dq,
                            uint16_t* dk, uint16_t* dv, const int64_t* starts, int64_t num_docs,
                            cudaStream_t stream);
// Ring attention's chunks (Ops::AttentionChunk): q [sq, Hq, D] at sample positions
// [q_pos0, q_pos0 + sq), k, v [sk, Hkv, D] at [k_pos0, k_pos0 + sk); documents in sample
// positions; window > 0 a sliding window. A query that sees no key: out 0, lse −inf.
struct FlashSpan {
  int64_t sq = 0, sk = 0, q_pos0 = 0, k_pos0 = 0, window = 0;
};
void FlashAttentionChunkForward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                FlashSpan span, int64_t hq, int64_t hkv, int64_t d, uint16_t* out,
                                float* lse, const int64_t* starts, int64_t num_docs,
                                cudaStream_t stream);
// out, lse: the whole rows'; delta: f32 scratch [Hq, sq]. dq, dk, dv written.
void FlashAttentionChunkBackward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                 const uint16_t* out, const uint16_t* dout, const float* lse,
                                 FlashSpan span, int64_t hq, int64_t hkv, int64_t d, float* delta,
                                 uint16_t* dq, uint16_t* dk, uint16_t* dv, const int64_t* starts,
                                 int64_t num_docs, cudaStream_t stream);
// acc f32 [S, H, D], acc_lse f32 [H, S] folded with out bf16 [S, H, D], lse f32 [H, S]
// (Ops::AttentionMerge).
void AttentionMerge(float* acc, float* acc_lse, const uint16_t* out, const float* lse, int64_t s,
                    int64_t h, int64_t d, cudaStream_t stream);

// ---- documents.cu: packed samples' document metadata.
// dst[i] = values[i] for i < n (int32 when as_int32, else int64), written by kernels whose
// parameters carry the values: the host buffer may be reused at once and the host never waits.
void WriteIndices(const int64_t* values, int64_t n, void* dst, bool as_int32, cudaStream_t stream);
// dst [cols, rows] = src [rows, cols]ᵀ (f32).
void TransposeF32(const float* src, int64_t rows, int64_t cols, float* dst, cudaStream_t stream);

}  // namespace cuda
}  // namespace ithaca
