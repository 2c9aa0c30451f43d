// CpuOps: shape/dtype validation around the float instantiations of the CPU kernels.
#include "engine/backend/cpu/cpu_ops.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "engine/backend/cpu/attention.h"
#include "engine/backend/cpu/gemm.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/op_checks.h"

namespace ithaca {
namespace {

constexpr OpChecks kCheck("CpuOps");

void CheckCpu(const Tensor& t, const char* op, const char* name) {
  ITHACA_CHECK(t.device == Device::kCpu, "CpuOps::", op, ": ", name, " is ", t.DebugString(),
               ", not on the CPU");
  ITHACA_CHECK(t.data != nullptr || t.numel() == 0, "CpuOps::", op, ": ", name, " has no data");
}

void CheckDType(const Tensor& t, DType want, const char* op, const char* name) {
  CheckCpu(t, op, name);
  kCheck.DTypeIs(t, want, op, name);
}

void CheckF32(const Tensor& t, const char* op, const char* name) {
  CheckDType(t, DType::kF32, op, name);
}

template <typename To, typename From>
void ConvertLoop(const void* src, void* dst, int64_t n) {
  const From* s = static_cast<const From*>(src);
  To* d = static_cast<To*>(dst);
#pragma omp parallel for schedule(static) if (n > cpu::kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) d[i] = cpu::Convert<To>(s[i]);
}

// n elements from src (dtype sd) to dst (dtype dd); f32 <-> bf16 converts, i32 only to i32.
void ConvertElements(const void* src, DType sd, void* dst, DType dd, int64_t n, const char* op) {
  if (n == 0) return;
  if (sd == dd) {
    std::memmove(dst, src, static_cast<size_t>(n) * DTypeSize(sd));
  } else if (sd == DType::kF32 && dd == DType::kBF16) {
    ConvertLoop<bf16, float>(src, dst, n);
  } else if (sd == DType::kBF16 && dd == DType::kF32) {
    ConvertLoop<float, bf16>(src, dst, n);
  } else {
    ITHACA_CHECK(false, "CpuOps::", op, ": cannot convert ", DTypeName(sd), " to ", DTypeName(dd));
  }
}

// Validates q [S, Hq, D], k, v [S, Hkv, D] with Hq % Hkv == 0, and lse [Hq, S]; a chunk
// (`chunk`) may have another number of keys than queries.
void CheckAttentionShapes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                          const char* op, bool chunk = false) {
  CheckF32(q, op, "q");
  CheckF32(k, op, "k");
  CheckF32(v, op, "v");
  CheckF32(lse, op, "lse");
  ITHACA_CHECK(q.rank() == 3 && k.rank() == 3, "CpuOps::", op, ": q ", q.DebugString(), " and k ",
               k.DebugString(), " must be [S, H, D]");
  const int64_t s = q.dim(0), hq = q.dim(1), d = q.dim(2), hkv = k.dim(1);
  ITHACA_CHECK(d > 0 && hkv > 0 && hq % hkv == 0 && (chunk || k.dim(0) == s) && k.dim(2) == d,
               "CpuOps::", op, ": q ", q.DebugString(), " and k ", k.DebugString(),
               " are not a GQA pair");
  kCheck.Shape(v, k.shape, op, "v");
  kCheck.Shape(lse, {hq, s}, op, "lse");
}

}  // namespace

// ---- Memory movement and elementwise.

void CpuOps::Fill(const Tensor& x, float value) {
  CheckCpu(x, "Fill", "x");
  const int64_t n = x.numel();
  switch (x.dtype) {
    case DType::kF32:
      std::fill(x.as<float>(), x.as<float>() + n, value);
      break;
    case DType::kBF16:
      std::fill(x.as<bf16>(), x.as<bf16>() + n, FloatToBf16(value));
      break;
    case DType::kI32:
      std::fill(x.as<int32_t>(), x.as<int32_t>() + n, static_cast<int32_t>(value));
      break;
  }
}

void CpuOps::Copy(const Tensor& src, const Tensor& dst) {
  CheckCpu(src, "Copy", "src");
  CheckCpu(dst, "Copy", "dst");
  kCheck.Numel(dst, src.numel(), "Copy", "dst");
  ConvertElements(src.data, src.dtype, dst.data, dst.dtype, src.numel(), "Copy");
}

void CpuOps::Copy2D(const Tensor& src, int64_t src_stride, const Tensor& dst, int64_t dst_stride,
                    int64_t rows, int64_t cols) {
  CheckCpu(src, "Copy2D", "src");
  CheckCpu(dst, "Copy2D", "dst");
  kCheck.Copy2D(src, src_stride, dst, dst_stride, rows, cols);
  if (rows == 0 || cols == 0) return;
  const size_t esz = DTypeSize(src.dtype);
  const char* s = static_cast<const char*>(src.data);
  char* d = static_cast<char*>(dst.data);
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(d + r * dst_stride * esz, s + r * src_stride * esz, cols * esz);
  }
}

void CpuOps::Upload(const void* host, DType host_dtype, const Tensor& dst) {
  CheckCpu(dst, "Upload", "dst");
  ITHACA_CHECK(host != nullptr || dst.numel() == 0, "CpuOps::Upload: null host pointer");
  ConvertElements(host, host_dtype, dst.data, dst.dtype, dst.numel(), "Upload");
}

void CpuOps::Download(const Tensor& src, void* host, DType host_dtype) {
  CheckCpu(src, "Download", "src");
  ITHACA_CHECK(host != nullptr || src.numel() == 0, "CpuOps::Download: null host pointer");
  ConvertElements(src.data, src.dtype, host, host_dtype, src.numel(), "Download");
}

void CpuOps::Axpy(float alpha, const Tensor& x, const Tensor& y) {
  CheckF32(y, "Axpy", "y");
  CheckCpu(x, "Axpy", "x");
  kCheck.Numel(x, y.numel(), "Axpy", "x");
  if (x.dtype == DType::kBF16) {
    cpu::Axpy(y.numel(), alpha, x.as<bf16>(), y.f32());
  } else {
    cpu::Axpy(y.numel(), alpha, x.f32(), y.f32());
  }
}

double CpuOps::SumSquares(const Tensor& x) {
  CheckCpu(x, "SumSquares", "x");
  switch (x.dtype) {
    case DType::kF32:
      return cpu::SumSquares(x.numel(), x.as<float>());
    case DType::kBF16:
      return cpu::SumSquares(x.numel(), x.as<bf16>());
    case DType::kI32:
      return cpu::SumSquares(x.numel(), x.as<int32_t>());
  }
  return 0.0;
}

double CpuOps::Sum(const Tensor& x) {
  CheckCpu(x, "Sum", "x");
  switch (x.dtype) {
    case DType::kF32:
      return cpu::Sum(x.numel(), x.as<float>());
    case DType::kBF16:
      return cpu::Sum(x.numel(), x.as<bf16>());
    case DType::kI32:
      return cpu::Sum(x.numel(), x.as<int32_t>());
  }
  return 0.0;
}

// The double sum rounded once to f32, as the host-value versions' callers would store it.
void CpuOps::SumSquaresInto(const Tensor& x, const Tensor& out) {
  CheckF32(out, "SumSquaresInto", "out");
  kCheck.Numel(out, 1, "SumSquaresInto", "out");
  out.f32()[0] = static_cast<float>(CpuOps::SumSquares(x));
}

void CpuOps::SumInto(const Tensor& x, const Tensor& out) {
  CheckF32(out, "SumInto", "out");
  kCheck.Numel(out, 1, "SumInto", "out");
  out.f32()[0] = static_cast<float>(CpuOps::Sum(x));
}

// ---- Linear algebra.

void CpuOps::Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                  float alpha, float beta) {
  CheckF32(a, "Gemm", "a");
  CheckF32(b, "Gemm", "b");
  CheckF32(c, "Gemm", "c");
  const OpChecks::Dims2 da = kCheck.View2D(a, "Gemm", "a"), db = kCheck.View2D(b, "Gemm", "b"),
                        dc = kCheck.View2D(c, "Gemm", "c");
  const int64_t m = trans_a ? da.cols : da.rows, k = trans_a ? da.rows : da.cols;
  const int64_t kb = trans_b ? db.cols : db.rows, n = trans_b ? db.rows : db.cols;
  ITHACA_CHECK(k == kb && dc.rows == m && dc.cols == n, "CpuOps::Gemm: op(a) ", m, "x", k, " (a ",
               a.DebugString(), trans_a ? "ᵀ" : "", ") times op(b) ", kb, "x", n, " (b ",
               b.DebugString(), trans_b ? "ᵀ" : "", ") does not fit c ", c.DebugString());
  ITHACA_CHECK(!Overlap(c, a) && !Overlap(c, b), "CpuOps::Gemm: c overlaps an input");
  cpu::Gemm<float>(trans_a, trans_b, m, n, k, alpha, a.f32(), da.cols, b.f32(), db.cols, beta,
                   c.f32(), dc.cols);
}

// The GEMM, then the bias added to each row of c (after alpha and beta, as ops.h says).
void CpuOps::GemmBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                      const Tensor& bias, const Tensor& c, float alpha, float beta) {
  CheckF32(bias, "GemmBias", "bias");
  CpuOps::Gemm(a, trans_a, b, trans_b, c, alpha, beta);
  const OpChecks::Dims2 dc = kCheck.View2D(c, "GemmBias", "c");
  kCheck.Numel(bias, dc.cols, "GemmBias", "bias");
  ITHACA_CHECK(!Overlap(c, bias), "CpuOps::GemmBias: c overlaps the bias");
  const float* bv = bias.f32();
  for (int64_t r = 0; r < dc.rows; ++r) {
    float* row = c.f32() + r * dc.cols;
    for (int64_t i = 0; i < dc.cols; ++i) row[i] += bv[i];
  }
}

// ---- Layers.

void CpuOps::Embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  CheckDType(ids, DType::kI32, "Embedding", "ids");
  CheckF32(table, "Embedding", "table");
  CheckF32(out, "Embedding", "out");
  ITHACA_CHECK(table.rank() == 2, "CpuOps::Embedding: table is ", table.DebugString(),
               ", expected [V, d]");
  const int64_t tokens = ids.numel(), vocab = table.dim(0), d = table.dim(1);
  kCheck.Shape(out, {tokens, d}, "Embedding", "out");
  cpu::Embedding(ids.i32(), tokens, table.f32(), vocab, d, out.f32());
}

void CpuOps::EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  CheckDType(ids, DType::kI32, "EmbeddingBackward", "ids");
  CheckF32(dout, "EmbeddingBackward", "dout");
  CheckF32(dtable, "EmbeddingBackward", "dtable");
  ITHACA_CHECK(dtable.rank() == 2, "CpuOps::EmbeddingBackward: dtable is ", dtable.DebugString(),
               ", expected [V, d]");
  const int64_t tokens = ids.numel(), vocab = dtable.dim(0), d = dtable.dim(1);
  kCheck.Shape(dout, {tokens, d}, "EmbeddingBackward", "dout");
  cpu::EmbeddingBackward(ids.i32(), tokens, dout.f32(), vocab, d, dtable.f32());
}

void CpuOps::RmsNorm(const Tensor& x, const Tensor& w, float eps, const Tensor& out,
                     const Tensor& rstd) {
  CheckF32(x, "RmsNorm", "x");
  CheckF32(w, "RmsNorm", "w");
  CheckF32(out, "RmsNorm", "out");
  CheckF32(rstd, "RmsNorm", "rstd");
  const OpChecks::Dims2 dx = kCheck.View2D(x, "RmsNorm", "x");
  kCheck.Shape(w, {dx.cols}, "RmsNorm", "w");
  kCheck.Shape(out, x.shape, "RmsNorm", "out");
  kCheck.Numel(rstd, dx.rows, "RmsNorm", "rstd");
  cpu::RmsNorm(x.f32(), w.f32(), dx.rows, dx.cols, eps, out.f32(), rstd.f32());
}

void CpuOps::RmsNormBackward(const Tensor& x, const Tensor& w, const Tensor& rstd,
                             const Tensor& dout, const Tensor& dx, const Tensor& dw) {
  const char* op = "RmsNormBackward";
  CheckF32(x, op, "x");
  CheckF32(w, op, "w");
  CheckF32(rstd, op, "rstd");
  CheckF32(dout, op, "dout");
  CheckF32(dx, op, "dx");
  CheckF32(dw, op, "dw");
  const OpChecks::Dims2 d2 = kCheck.View2D(x, op, "x");
  kCheck.Shape(w, {d2.cols}, op, "w");
  kCheck.Shape(dw, {d2.cols}, op, "dw");
  kCheck.Numel(rstd, d2.rows, op, "rstd");
  kCheck.Shape(dout, x.shape, op, "dout");
  kCheck.Shape(dx, x.shape, op, "dx");
  cpu::RmsNormBackward(x.f32(), w.f32(), rstd.f32(), dout.f32(), d2.rows, d2.cols, dx.f32(),
                       dw.f32());
}

// The oracle's way, from its own pieces: rstd as RmsNorm computes it, then RmsNormBackward into
// a zeroed dx, which replaces grad.
void CpuOps::RmsNormBackwardInPlace(const Tensor& x, const Tensor& w, float eps, const Tensor& grad,
                                    const Tensor& dw) {
  const char* op = "RmsNormBackwardInPlace";
  CheckF32(x, op, "x");
  CheckF32(w, op, "w");
  CheckF32(grad, op, "grad");
  CheckF32(dw, op, "dw");
  const OpChecks::Dims2 d2 = kCheck.View2D(x, op, "x");
  kCheck.Shape(w, {d2.cols}, op, "w");
  kCheck.Shape(dw, {d2.cols}, op, "dw");
  kCheck.Shape(grad, x.shape, op, "grad");
  ITHACA_CHECK(!Overlap(grad, x), "CpuOps::", op, ": grad overlaps x");
  const size_t n = static_cast<size_t>(d2.rows * d2.cols);
  std::vector<float> normed(n), rstd(static_cast<size_t>(d2.rows)), dx(n, 0.f);
  cpu::RmsNorm(x.f32(), w.f32(), d2.rows, d2.cols, eps, normed.data(), rstd.data());
  cpu::RmsNormBackward(x.f32(), w.f32(), rstd.data(), grad.f32(), d2.rows, d2.cols, dx.data(),
                       dw.f32());
  std::copy(dx.begin(), dx.end(), grad.f32());
}

namespace {

// A document mask over a sequence of `s` tokens: starts strictly ascending from 0, all < s.
void CheckDocuments(const DocumentMask& docs, int64_t s, const char* op) {
  const std::vector<int64_t>& st = docs.starts;
  ITHACA_CHECK(docs.window >= 0, "CpuOps::", op, ": a sliding window of ", docs.window, " keys");
  ITHACA_CHECK(st.empty() || st[0] == 0, "CpuOps::", op, ": the first document starts at ",
               st.empty() ? 0 : st[0], ", not 0");
  for (size_t i = 1; i < st.size(); ++i) {
    ITHACA_CHECK(st[i - 1] < st[i] && st[i] < s, "CpuOps::", op, ": document ", i, " starts at ",
                 st[i], " (after ", st[i - 1], ", in a sequence of ", s, ")");
  }
}

}  // namespace

void CpuOps::Rope(const Tensor& x, int64_t pos0, const Tensor& inv_freq, bool inverse,
                  const DocumentMask& docs) {
  CheckF32(x, "Rope", "x");
  CheckF32(inv_freq, "Rope", "inv_freq");
  ITHACA_CHECK(x.rank() == 3 && x.dim(2) % 2 == 0, "CpuOps::Rope: x is ", x.DebugString(),
               ", expected [T, H, D] with D even");
  kCheck.Shape(inv_freq, {x.dim(2) / 2}, "Rope", "inv_freq");
  ITHACA_CHECK(pos0 >= 0, "CpuOps::Rope: negative pos0 ", pos0);
  // The whole sample's mask, whose length Rope does not know: x may be one rank's share of it.
  CheckDocuments(docs, std::numeric_limits<int64_t>::max(), "Rope");
  cpu::Rope(x.f32(), x.dim(0), x.dim(1), x.dim(2), pos0, inv_freq.f32(), inverse,
            docs.starts.data(), static_cast<int64_t>(docs.starts.size()));
}

void CpuOps::Attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                       const Tensor& lse, const DocumentMask& docs) {
  CheckAttentionShapes(q, k, v, lse, "Attention");
  CheckDocuments(docs, q.dim(0), "Attention");
  CheckF32(out, "Attention", "out");
  kCheck.Shape(out, q.shape, "Attention", "out");
  cpu::AttentionForward(q.f32(), k.f32(), v.f32(), q.dim(0), q.dim(1), k.dim(1), q.dim(2),
                        out.f32(), lse.f32(), blocks_, docs.starts.data(),
                        static_cast<int64_t>(docs.starts.size()), docs.window);
}

void CpuOps::AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& dout, const Tensor& lse, const Tensor& dq,
                               const Tensor& dk, const Tensor& dv, const DocumentMask& docs) {
  const char* op = "AttentionBackward";
  CheckAttentionShapes(q, k, v, lse, op);
  CheckDocuments(docs, q.dim(0), op);
  CheckF32(out, op, "out");
  CheckF32(dout, op, "dout");
  CheckF32(dq, op, "dq");
  CheckF32(dk, op, "dk");
  CheckF32(dv, op, "dv");
  kCheck.Shape(out, q.shape, op, "out");
  kCheck.Shape(dout, q.shape, op, "dout");
  kCheck.Shape(dq, q.shape, op, "dq");
  kCheck.Shape(dk, k.shape, op, "dk");
  kCheck.Shape(dv, k.shape, op, "dv");
  cpu::AttentionBackward(q.f32(), k.f32(), v.f32(), out.f32(), dout.f32(), lse.f32(), q.dim(0),
                         q.dim(1), k.dim(1), q.dim(2), dq.f32(), dk.f32(), dv.f32(), blocks_,
                         docs.starts.data(), static_cast<int64_t>(docs.starts.size()), docs.window);
}

void CpuOps::AttentionChunk(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const DocumentMask& docs, int64_t q_pos0,
                            int64_t k_pos0) {
  const char* op = "AttentionChunk";
  CheckAttentionShapes(q, k, v, lse, op, /*chunk=*/true);
  ITHACA_CHECK(q_pos0 >= 0 && k_pos0 >= 0, "CpuOps::", op, ": positions ", q_pos0, ", ", k_pos0);
  // The whole sample's mask, whose length the chunk does not know.
  CheckDocuments(docs, std::numeric_limits<int64_t>::max(), op);
  CheckF32(out, op, "out");
  kCheck.Shape(out, q.shape, op, "out");
  cpu::AttentionChunkForward(q.f32(), k.f32(), v.f32(),
                             cpu::AttentionSpan{q.dim(0), k.dim(0), q_pos0, k_pos0}, q.dim(1),
                             k.dim(1), q.dim(2), out.f32(), lse.f32(), blocks_, docs.starts.data(),
                             static_cast<int64_t>(docs.starts.size()), docs.window);
}

void CpuOps::AttentionChunkBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& out, const Tensor& dout, const Tensor& lse,
                                    const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                    const DocumentMask& docs, int64_t q_pos0, int64_t k_pos0) {
  const char* op = "AttentionChunkBackward";
  CheckAttentionShapes(q, k, v, lse, op, /*chunk=*/true);
  ITHACA_CHECK(q_pos0 >= 0 && k_pos0 >= 0, "CpuOps::", op, ": positions ", q_pos0, ", ", k_pos0);
  CheckDocuments(docs, std::numeric_limits<int64_t>::max(), op);
  for (const Tensor* t : {&out, &dout, &dq}) kCheck.Shape(*t, q.shape, op, "out, dout, dq");
  for (const Tensor* t : {&dk, &dv}) kCheck.Shape(*t, k.shape, op, "dk, dv");
  for (const Tensor* t : {&out, &dout, &dq, &dk, &dv}) CheckF32(*t, op, "out, dout, dq, dk, dv");
  cpu::AttentionChunkBackward(q.f32(), k.f32(), v.f32(), out.f32(), dout.f32(), lse.f32(),
                              cpu::AttentionSpan{q.dim(0), k.dim(0), q_pos0, k_pos0}, q.dim(1),
                              k.dim(1), q.dim(2), dq.f32(), dk.f32(), dv.f32(), blocks_,
                              docs.starts.data(), static_cast<int64_t>(docs.starts.size()),
                              docs.window);
}

void CpuOps::AttentionMerge(const Tensor& acc, const Tensor& acc_lse, const Tensor& out,
                            const Tensor& lse) {
  const char* op = "AttentionMerge";
  for (const Tensor* t : {&acc, &acc_lse, &out, &lse}) CheckF32(*t, op, "operand");
  ITHACA_CHECK(acc.rank() == 3, "CpuOps::", op, ": acc is ", acc.DebugString(),
               ", expected [S, H, D]");
  kCheck.Shape(out, acc.shape, op, "out");
  kCheck.Shape(acc_lse, {acc.dim(1), acc.dim(0)}, op, "acc_lse");
  kCheck.Shape(lse, {acc.dim(1), acc.dim(0)}, op, "lse");
  cpu::AttentionMerge(acc.f32(), acc_lse.f32(), out.f32(), lse.f32(), acc.dim(0), acc.dim(1),
                      acc.dim(2));
}

void CpuOps::SwiGLU(const Tensor& gate, const Tensor& up, const Tensor& out) {
  CheckF32(gate, "SwiGLU", "gate");
  CheckF32(up, "SwiGLU", "up");
  CheckF32(out, "SwiGLU", "out");
  kCheck.Shape(up, gate.shape, "SwiGLU", "up");
  kCheck.Shape(out, gate.shape, "SwiGLU", "out");
  cpu::SwiGLU(gate.f32(), up.f32(), gate.numel(), out.f32());
}

void CpuOps::SwiGLUBackward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                            const Tensor& dgate, const Tensor& dup) {
  const char* op = "SwiGLUBackward";
  CheckF32(gate, op, "gate");
  CheckF32(up, op, "up");
  CheckF32(dout, op, "dout");
  CheckF32(dgate, op, "dgate");
  CheckF32(dup, op, "dup");
  for (const Tensor* t : {&up, &dout, &dgate, &dup}) kCheck.Shape(*t, gate.shape, op, "operand");
  cpu::SwiGLUBackward(gate.f32(), up.f32(), dout.f32(), gate.numel(), dgate.f32(), dup.f32());
}

void CpuOps::CrossEntropy(const Tensor& logits, const Tensor& labels, const Tensor& losses,
                          const Tensor& dlogits, float grad_scale) {
  const char* op = "CrossEntropy";
  CheckF32(logits, op, "logits");
  CheckDType(labels, DType::kI32, op, "labels");
  CheckF32(losses, op, "losses");
  CheckF32(dlogits, op, "dlogits");
  ITHACA_CHECK(logits.rank() == 2, "CpuOps::", op, ": logits is ", logits.DebugString(),
               ", expected [T, V]");
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  ITHACA_CHECK(vocab > 0 || tokens == 0, "CpuOps::", op, ": empty vocabulary");
  kCheck.Shape(labels, {tokens}, op, "labels");
  kCheck.Shape(losses, {tokens}, op, "losses");
  kCheck.Shape(dlogits, logits.shape, op, "dlogits");
  cpu::CrossEntropy(logits.f32(), labels.i32(), tokens, vocab, losses.f32(), dlogits.f32(),
                    grad_scale);
}

void CpuOps::LabelIsArgmax(const Tensor& logits, const Tensor& labels, const Tensor& hits) {
  const char* op = "LabelIsArgmax";
  CheckF32(logits, op, "logits");
  CheckDType(labels, DType::kI32, op, "labels");
  CheckF32(hits, op, "hits");
  ITHACA_CHECK(logits.rank() == 2, "CpuOps::", op, ": logits is ", logits.DebugString(),
               ", expected [T, V]");
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  kCheck.Shape(labels, {tokens}, op, "labels");
  kCheck.Shape(hits, {tokens}, op, "hits");
  cpu::LabelIsArgmax(logits.f32(), labels.i32(), tokens, vocab, hits.f32());
}

void CpuOps::AdamW(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                   const Tensor& working, const AdamWParams& p) {
  const char* op = "AdamW";
  CheckF32(master, op, "master");
  CheckF32(m, op, "m");
  CheckF32(v, op, "v");
  CheckCpu(grad, op, "grad");
  const int64_t n = master.numel();
  for (const Tensor* t : {&grad, &m, &v}) kCheck.Numel(*t, n, op, "operand");
  ITHACA_CHECK(grad.dtype != DType::kI32, "CpuOps::", op, ": grad is ", grad.DebugString());
  ITHACA_CHECK(p.step >= 1, "CpuOps::", op, ": step ", p.step, " is not 1-based");
  const bool has_working = working.data != nullptr;
  if (has_working) {
    CheckCpu(working, op, "working");
    kCheck.Numel(working, n, op, "working");
    ITHACA_CHECK(working.dtype != DType::kI32, "CpuOps::", op, ": working is ",
                 working.DebugString());
  }
  float* w = master.f32();
  // Dispatch on (grad dtype, working dtype); on the CPU both are normally f32.
  auto run = [&](auto* g) {
    if (!has_working) {
      cpu::AdamW(w, g, m.f32(), v.f32(), static_cast<float*>(nullptr), n, p);
    } else if (working.dtype == DType::kBF16) {
      cpu::AdamW(w, g, m.f32(), v.f32(), working.as<bf16>(), n, p);
    } else {
      cpu::AdamW(w, g, m.f32(), v.f32(), working.f32(), n, p);
    }
  };
  if (grad.dtype == DType::kBF16) {
    run(grad.as<const bf16>());
  } else {
    run(grad.as<const float>());
  }
}

}  // namespace ithaca
