// Ops: the compute interface every backend implements (cpu/ is the fp32 oracle, cuda/ is bf16).
//
// Conventions, for every backend:
// - All tensors live on the backend's device. Activations use act_dtype() (f32 on CPU, bf16 on
//   CUDA); LSE, RMSNorm's rstd, per-token losses and optimizer state are always f32; token ids and
//   labels are i32. Gradients of parameters may be f32 or act_dtype().
// - Shapes: tokens lead. A linear weight is [out, in] (Hugging Face layout), so y = x · Wᵀ.
// - "written" outputs are overwritten; "accumulated" outputs get += (the caller zeroes them first).
// - Ops are enqueued in order on the backend's compute stream; only the functions that touch
//   host memory or return a host value (Upload, Download, SumSquares, Sum, Synchronize) make
//   the host wait. A training step calls them only where the loop reports (and uploads its
//   inputs before its compute starts); SumInto and SumSquaresInto reduce into the device
//   instead. CopyAsync is the exception to the ordering: it runs on a side stream until
//   WaitFence orders the compute stream after it.
// - A shape or dtype mismatch is a bug in the caller, and aborts (ITHACA_CHECK). A failure that
//   a job can reach at run time (device memory an op's workspace could not get, a library's
//   error, a kernel that would not launch) does not: the op records it and leaves its outputs
//   unwritten, and status() returns the first such failure from then on. LlamaModel checks it
//   after each block and at the end of a step, so the step returns it as its error.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/rope_config.h"
#include "engine/core/device_streams.h"
#include "engine/core/tensor.h"

namespace ithaca {

// The documents of a packed sample. starts[i] is the index of document i's first token in the
// coordinates of the whole sample sequence (0-based); strictly ascending; starts[0] == 0 when
// non-empty. Empty (or {0}) means one document: plain causal attention, RoPE position = index.
// `window` > 0 is a sliding window (Mistral's): a query also sees no key more than window − 1
// tokens before it (its last `window` keys, itself included), inside its document as ever.
struct DocumentMask {
  std::vector<int64_t> starts;
  int64_t window = 0;
  bool trivial() const { return starts.size() <= 1; }
};

// What the queries of a ring piece see of a key piece whose keys all come before them (q at
// sample positions [q_pos0, q_pos0 + sq), k at [k_pos0, k_pos0 + sk), k_pos0 + sk <= q_pos0):
// documents are runs of positions, so only the document of the last key reaches across the gap,
// and its queries (the piece's first `queries`) see its keys there (the piece's keys from
// `first_key` on), every one of them: one dense rectangle. `dense` is false where a window cuts
// into it (then the pairs are not all visible). queries 0 or first_key == sk: nothing seen.
struct PieceRectangle {
  int64_t queries = 0, first_key = 0;
  bool dense = true;
};
inline PieceRectangle VisiblePieceRectangle(const DocumentMask& docs, int64_t sq, int64_t sk,
                                            int64_t q_pos0, int64_t k_pos0) {
  // The document of the last key, [start, end): the last start at or before it, and the next.
  const auto next = std::upper_bound(docs.starts.begin(), docs.starts.end(), k_pos0 + sk - 1);
  const int64_t start = next == docs.starts.begin() ? 0 : *(next - 1);
  const int64_t end = next == docs.starts.end() ? INT64_MAX : *next;
  PieceRectangle r;
  r.queries = std::max<int64_t>(0, std::min(sq, end - q_pos0));
  r.first_key = std::max<int64_t>(0, start - k_pos0);
  if (r.queries == 0) r.first_key = sk;
  // The farthest pair: the rectangle's last query and first key.
  if (docs.window > 0 && r.queries > 0 &&
      (q_pos0 + r.queries - 1) - (k_pos0 + r.first_key) >= docs.window) {
    r.dense = false;
  }
  return r;
}

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;  // multiplies the gradient first (gradient clipping)
  int64_t step = 1;         // 1-based, for bias correction
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  virtual DType act_dtype() const = 0;
  // The device's peak dense bf16 FLOP/s, the denominator of MFU; 0 where it is not known (the
  // CPU, an unlisted GPU), and then no MFU is reported.
  virtual double PeakFlops() const = 0;
  // The streams a communicator orders its collectives with (Comm::UseStreams); none by default.
  virtual DeviceStreams streams() const { return {}; }
  // The first run-time failure of an op (see the conventions above); OK while there was none.
  virtual absl::Status status() const { return absl::OkStatus(); }

  // ---- Memory movement and elementwise.
  // x[:] = value.
  virtual void Fill(const Tensor& x, float value) = 0;
  // dst = src, converting dtype when they differ (same element count). One side may be pinned
  // host memory from the backend's host pool (offload) when the dtypes are equal.
  virtual void Copy(const Tensor& src, const Tensor& dst) = 0;
  // 2-D strided copy, like cudaMemcpy2D: `rows` rows of `cols` elements; row r is read at element
  // r·src_stride of src and written at element r·dst_stride of dst. Same dtype. This is how
  // Ulysses packs head groups for its all-to-alls. The default is one Copy per row.
  virtual void Copy2D(const Tensor& src, int64_t src_stride, const Tensor& dst, int64_t dst_stride,
                      int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
      Copy(src.Slice(r * src_stride, {cols}), dst.Slice(r * dst_stride, {cols}));
    }
  }

  // ---- Asynchronous transfers (offload and prefetch, docs/schedules.md).
  // A Fence is a ticket for one CopyAsync; it needs no release. Transfers complete in the order
  // they were issued, so waiting on a fence also covers every transfer issued before it.
  struct Fence {
    uint64_t ticket = 0;  // 0: nothing in flight
    bool pending() const { return ticket != 0; }
  };
  // dst = src (same dtype and element count; one side is typically pinned host memory from the
  // backend's host pool) on a side stream, after all work enqueued so far, so it overlaps the
  // compute work enqueued next. Returns at once. Until WaitFence(fence), neither tensor may be
  // used by later ops or freed. The default copies at once and returns a passed fence.
  virtual Fence CopyAsync(const Tensor& src, const Tensor& dst) {
    Copy(src, dst);
    return Fence{};
  }
  // CopyAsync that does not wait for the compute enqueued so far (it still completes in order
  // with every other transfer): for a source the compute stream finished writing before the
  // host last waited for it, into a destination no compute enqueued since uses. Optimizer
  // offload moves gradients and working copies so under the next step's forward, whose
  // enqueued blocks would otherwise hold every transfer back. The default is CopyAsync.
  virtual Fence CopyAsyncUnordered(const Tensor& src, const Tensor& dst) {
    return CopyAsync(src, dst);
  }
  // Ops enqueued from now on wait for the copy; the host does not. Afterwards both tensors may
  // be used and freed (the allocators hand memory out again only to later ops).
  virtual void WaitFence(Fence /*fence*/) {}
  // The host waits until the copy (and every copy issued before it) has completed, without
  // waiting for the streams' other work (optimizer offload reads a downloaded gradient while
  // the next download runs). The default's copies complete at once.
  virtual void HostWaitFence(Fence /*fence*/) {}

  // Host memory (f32, bf16 or i32 as `host_dtype`) to/from a device tensor, converting dtype.
  virtual void Upload(const void* host, DType host_dtype, const Tensor& dst) = 0;
  virtual void Download(const Tensor& src, void* host, DType host_dtype) = 0;
  // y += alpha · x.
  virtual void Axpy(float alpha, const Tensor& x, const Tensor& y) = 0;
  // Blocks the host until every op enqueued so far has finished (the loop's step timing).
  virtual void Synchronize() const {}
  // Σ x² and Σ x (accumulated in double on the CPU, f32 at least elsewhere). Synchronizes.
  virtual double SumSquares(const Tensor& x) = 0;
  virtual double Sum(const Tensor& x) = 0;
  // The same sums written into `out` (f32, one element, on the device) as one more op on the
  // stream: the host does not wait, and collectives and later ops can use the result.
  virtual void SumSquaresInto(const Tensor& x, const Tensor& out) = 0;
  virtual void SumInto(const Tensor& x, const Tensor& out) = 0;

  // ---- Linear algebra.
  // c = alpha · op(a) · op(b) + beta · c, with a, b, c 2-D, op(x) = xᵀ when trans_x. c may be f32
  // while a, b are act_dtype().
  virtual void Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                    float alpha, float beta) = 0;
  // Gemm with a bias row added to every row of c: c = alpha · op(a) · op(b) + beta · c + 1 · biasᵀ,
  // bias [n] (c's columns), c and bias act_dtype(). The bias is NOT scaled by alpha (cuBLASLt's
  // CUBLASLT_EPILOGUE_BIAS adds it after alpha and beta; a caller wanting alpha · (a·b + bias)
  // passes alpha · bias). This is how a projection's bias costs no pass of its own.
  virtual void GemmBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                        const Tensor& bias, const Tensor& c, float alpha, float beta) = 0;

  // ---- Layers.
  // out[t] = table[ids[t]]: ids i32 [T], table [V, d], out [T, d] written.
  virtual void Embedding(const Tensor& ids, const Tensor& table, const Tensor& out) = 0;
  // dtable[ids[t]] += dout[t] (accumulated).
  virtual void EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) = 0;

  // out = x / rms(x) · w over the last dim; x, out [T, d]; w [d]; rstd f32 [T] written. out may
  // be x itself (the per-head q/k norms run in place).
  virtual void RmsNorm(const Tensor& x, const Tensor& w, float eps, const Tensor& out,
                       const Tensor& rstd) = 0;
  // dx accumulated (it is a residual-stream gradient); dw accumulated.
  virtual void RmsNormBackward(const Tensor& x, const Tensor& w, const Tensor& rstd,
                               const Tensor& dout, const Tensor& dx, const Tensor& dw) = 0;
  // RmsNormBackward for a norm that kept neither its output nor its rstd (the per-head q/k norms,
  // whose input the backward remakes): rstd is recomputed from x (with eps, as RmsNorm does),
  // and `grad` [T, d] holds dout on entry and dx on return (written, not accumulated); dw
  // accumulated. One pass instead of RmsNorm into a scratch, a zeroed dx and a copy back.
  virtual void RmsNormBackwardInPlace(const Tensor& x, const Tensor& w, float eps,
                                      const Tensor& grad, const Tensor& dw) = 0;

  // Rotary embedding in place on x [T, H, D]: token t of x is at sample index pos0 + t, and its
  // RoPE position is (pos0 + t) minus the start of the document (of `docs`) containing it. Pairs
  // (i, i + D/2) rotate by angle position · inv_freq[i] (Hugging Face's rotate_half convention).
  // inv_freq: f32 [D/2] on the device. inverse = true rotates by −angle (the backward).
  virtual void Rope(const Tensor& x, int64_t pos0, const Tensor& inv_freq, bool inverse,
                    const DocumentMask& docs) = 0;

  // Causal self-attention with GQA: q [S, Hq, D], k, v [S, Hkv, D], Hq % Hkv == 0 (query head h
  // uses K/V head h / (Hq / Hkv)); scale 1/sqrt(D). q, k, v span the whole sample sequence
  // (Ulysses/UPipe gather the sequence before attention), and a query attends only to keys at or
  // before it within its own document of `docs`. out [S, Hq, D] written; lse f32 [Hq, S] written
  // (natural log of the softmax denominator, scaled logits). With docs.window > 0 a query also
  // sees only its last docs.window keys. Never forms an S×S matrix.
  virtual void Attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                         const Tensor& lse, const DocumentMask& docs) = 0;
  // dq, dk, dv written (dk, dv summed over the query heads that share them).
  virtual void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& out, const Tensor& dout, const Tensor& lse,
                                 const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                 const DocumentMask& docs) = 0;

  // Ring attention's pieces: one chunk of queries against one chunk of keys of a longer sample.
  // q [Sq, Hq, D] holds the queries at sample positions [q_pos0, q_pos0 + Sq), k and v
  // [Sk, Hkv, D] the keys at [k_pos0, k_pos0 + Sk); the mask is Attention's over the whole sample
  // (a query sees the keys at or before its position, in its document, in its window), with
  // `docs` in sample coordinates. out [Sq, Hq, D] and lse f32 [Hq, Sq] written as Attention's
  // over these keys only; a query that sees none of them gets out 0 and lse −inf. With
  // q_pos0 == k_pos0 and Sq == Sk == the sample this is Attention.
  virtual void AttentionChunk(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& lse, const DocumentMask& docs, int64_t q_pos0,
                              int64_t k_pos0) = 0;
  // The chunk's part of the gradients: `out` and `lse` are the whole rows' (merged over every
  // key chunk), `dout` their gradient; dq (this key chunk's part of it), dk, dv written.
  virtual void AttentionChunkBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                                      const Tensor& out, const Tensor& dout, const Tensor& lse,
                                      const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                      const DocumentMask& docs, int64_t q_pos0, int64_t k_pos0) = 0;
  // Folds one chunk's (out, lse) into the running (acc, acc_lse) of the same queries:
  // m = logaddexp(acc_lse, lse); acc = acc · exp(acc_lse − m) + out · exp(lse − m);
  // acc_lse = m. acc f32 [Sq, H, D] and acc_lse f32 [H, Sq] start as 0 and −inf; out [Sq, H, D]
  // (act dtype) and lse f32 [H, Sq]. Rows whose lse are both −inf stay 0 / −inf.
  virtual void AttentionMerge(const Tensor& acc, const Tensor& acc_lse, const Tensor& out,
                              const Tensor& lse) = 0;

  // out = silu(gate) ⊙ up, all [T, F]. Elementwise: out may alias gate or up.
  virtual void SwiGLU(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  // dgate, dup written. Elementwise: dgate may alias gate and dup may alias up (each element is
  // read before it is written), which saves two [T, F] buffers per MLP tile.
  virtual void SwiGLUBackward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                              const Tensor& dgate, const Tensor& dup) = 0;

  // Cross-entropy fused with its gradient, for one tile of tokens: logits [T, V], labels i32 [T]
  // (a label < 0 is ignored: loss 0, gradient 0). losses f32 [T] written (natural log);
  // dlogits [T, V] written as (softmax − onehot) · grad_scale; dlogits may alias logits.
  virtual void CrossEntropy(const Tensor& logits, const Tensor& labels, const Tensor& losses,
                            const Tensor& dlogits, float grad_scale) = 0;
  // Whether each row's label is its argmax, for one tile: logits [T, V], labels i32 [T]; hits
  // f32 [T] written 1 where label >= 0 and the row's first largest logit (torch.argmax's pick) is
  // at the label, else 0. For scoring answers teacher-forced (the passkey eval); run it before
  // CrossEntropy, which may overwrite the logits with their gradient.
  virtual void LabelIsArgmax(const Tensor& logits, const Tensor& labels, const Tensor& hits) = 0;

  // AdamW on f32 master weights (decoupled weight decay): updates master, m, v in place from
  // grad (f32 or act dtype) and, when working.data != nullptr, writes the updated weights into
  // the working copy (act dtype).
  virtual void AdamW(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const Tensor& working, const AdamWParams& p) = 0;
};

}  // namespace ithaca
