// LoRA on one linear, y = x·Wᵀ + scale · (x·Aᵀ)·Bᵀ, written against Ops: the adapter's part of
// the forward and its backward, for the block (engine/schedule/block.cc) and the q/k/v
// projections of UPipe attention (upipe.cc), which both call them beside the base's GEMMs. The
// base's own product and gradient stay with the caller (a frozen base computes no gradient).
#pragma once

#include "engine/backend/ops.h"
#include "engine/core/tensor.h"

namespace ithaca {

// One linear's adapter, A [rank, in] and B [out, rank] (act dtype), or their gradients (f32);
// empty (a.data == nullptr) where the linear has none.
struct LoraPair {
  Tensor a, b;
  bool on() const { return a.data != nullptr; }
};

// out += alpha · scale · (x·Aᵀ)·B[rows]ᵀ, x [n, in], out [n, rows]: B's rows [row0, row0 + rows)
// (a UPipe stage projects only its heads' rows). t: scratch [>= n, rank], written.
void LoraForward(Ops& ops, const LoraPair& w, float scale, const Tensor& x, const Tensor& out,
                 const Tensor& t, float alpha = 1.f, int64_t row0 = 0, int64_t rows = -1);

// The adapter's backward for dy [n, rows] (the gradient of those output rows): t = x·Aᵀ (remade),
// gB[rows] += alpha · scale · dyᵀ·t, and dt (written, or with `accumulate` added) =
// alpha · scale · dy·B[rows]. The caller then finishes with LoraInputBackward once every part of
// the output's gradient is in dt. t, dt: scratch [>= n, rank].
void LoraOutputBackward(Ops& ops, const LoraPair& w, const LoraPair& g, float scale,
                        const Tensor& x, const Tensor& dy, const Tensor& t, const Tensor& dt,
                        bool accumulate, float alpha = 1.f, int64_t row0 = 0, int64_t rows = -1);
// gA += dtᵀ·x, and dx += dt·A unless dx is empty.
void LoraInputBackward(Ops& ops, const LoraPair& w, const LoraPair& g, const Tensor& x,
                       const Tensor& dt, const Tensor& dx);

}  // namespace ithaca
