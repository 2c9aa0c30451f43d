#include "engine/parallel/lora.h"

namespace ithaca {
namespace {

Tensor BRows(const Tensor& b, int64_t row0, int64_t rows) {
  return rows < 0 ? b : b.Rows(row0, row0 + rows);
}

}  // namespace

void LoraForward(Ops& ops, const LoraPair& w, float scale, const Tensor& x, const Tensor& out,
                 const Tensor& t, float alpha, int64_t row0, int64_t rows) {
  const Tensor tn = t.Rows(0, x.dim(0));
  ops.Gemm(x, false, w.a, true, tn, 1.f, 0.f);
  ops.Gemm(tn, false, BRows(w.b, row0, rows), true, out, alpha * scale, 1.f);
}

void LoraOutputBackward(Ops& ops, const LoraPair& w, const LoraPair& g, float scale,
                        const Tensor& x, const Tensor& dy, const Tensor& t, const Tensor& dt,
                        bool accumulate, float alpha, int64_t row0, int64_t rows) {
  const int64_t n = x.dim(0);
  const Tensor tn = t.Rows(0, n), dtn = dt.Rows(0, n);
  ops.Gemm(x, false, w.a, true, tn, 1.f, 0.f);
  ops.Gemm(dy, true, tn, false, BRows(g.b, row0, rows), alpha * scale, 1.f);
  ops.Gemm(dy, false, BRows(w.b, row0, rows), false, dtn, alpha * scale, accumulate ? 1.f : 0.f);
}

void LoraInputBackward(Ops& ops, const LoraPair& w, const LoraPair& g, const Tensor& x,
                       const Tensor& dt, const Tensor& dx) {
  const Tensor dtn = dt.Rows(0, x.dim(0));
  ops.Gemm(dtn, true, x, false, g.a, 1.f, 1.f);
  if (dx.data != nullptr) ops.Gemm(dtn, false, w.a, false, dx, 1.f, 1.f);
}

}  // namespace ithaca
