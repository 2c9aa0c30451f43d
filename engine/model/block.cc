#include "engine/model/block.h"

#include <algorithm>

#include "engine/model/params.h"

namespace ithaca {
namespace {

absl::StatusOr<Buffer> Alloc(const BlockContext& c, DType t, Shape s, Tier tier) {
  return Buffer::Make(c.alloc, t, std::move(s), tier);
}

// [S, H, D] as the [S, H·D] matrix the projections read and write.
Tensor Mat(const Buffer& b) {
  const Tensor& t = b.tensor();
  return t.Reshaped({t.dim(0), t.numel() / t.dim(0)});
}

}  // namespace

BlockWeights BlockViews(const LlamaConfig& cfg, const Tensor& unit_flat) {
  // A throwaway layout of one block: the entries' offsets are the same for every block.
  LlamaConfig one = cfg;
  one.num_hidden_layers = 1;
  const ParamLayout layout(one);
  const ParamUnit& u = layout.units()[1];
  auto v = [&](BlockParam p) { return ParamLayout::View(unit_flat, u.entries[p]); };
  return {v(kAttnNorm), v(kWq), v(kWk), v(kWv), v(kWo), v(kMlpNorm), v(kWGate), v(kWUp), v(kWDown)};
}

absl::Status BlockForward(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                          const Tensor& y, BlockSaved* s) {
  const LlamaConfig& cfg = *c.cfg;
  Ops& ops = *c.ops;
  const DType act = ops.act_dtype();
  const int64_t S = x.dim(0), d = cfg.hidden_size, D = cfg.head_dim;
  const int64_t hq = cfg.num_attention_heads, hkv = cfg.num_key_value_heads;
  const float eps = static_cast<float>(cfg.rms_norm_eps);

  // Attention half.
  ASSIGN_OR_RETURN(s->h, Alloc(c, act, {S, d}, Tier::kActivations));
  ASSIGN_OR_RETURN(s->rstd1, Alloc(c, DType::kF32, {S}, Tier::kActivations));
  ops.RmsNorm(x, w.attn_norm, eps, s->h.tensor(), s->rstd1.tensor());
  ASSIGN_OR_RETURN(s->q, Alloc(c, act, {S, hq, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(s->k, Alloc(c, act, {S, hkv, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(s->v, Alloc(c, act, {S, hkv, D}, Tier::kAttention));
  ops.Gemm(s->h.tensor(), false, w.wq, true, Mat(s->q), 1.f, 0.f);
  ops.Gemm(s->h.tensor(), false, w.wk, true, Mat(s->k), 1.f, 0.f);
  ops.Gemm(s->h.tensor(), false, w.wv, true, Mat(s->v), 1.f, 0.f);
  ops.Rope(s->q.tensor(), c.pos0, c.inv_freq, false);
  ops.Rope(s->k.tensor(), c.pos0, c.inv_freq, false);
  ASSIGN_OR_RETURN(s->o, Alloc(c, act, {S, hq, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(s->lse, Alloc(c, DType::kF32, {hq, S}, Tier::kAttention));
  ops.Attention(s->q.tensor(), s->k.tensor(), s->v.tensor(), s->o.tensor(), s->lse.tensor());
  ASSIGN_OR_RETURN(s->x2, Alloc(c, act, {S, d}, Tier::kActivations));
  ops.Copy(x, s->x2.tensor());
  ops.Gemm(Mat(s->o), false, w.wo, true, s->x2.tensor(), 1.f, 1.f);

  // MLP half, over token tiles: the [T, F] intermediates exist one tile at a time.
  ASSIGN_OR_RETURN(s->h2, Alloc(c, act, {S, d}, Tier::kActivations));
  ASSIGN_OR_RETURN(s->rstd2, Alloc(c, DType::kF32, {S}, Tier::kActivations));
  ops.RmsNorm(s->x2.tensor(), w.mlp_norm, eps, s->h2.tensor(), s->rstd2.tensor());
  const int64_t F = cfg.intermediate_size, T = std::min(c.tile_tokens, S);
  ASSIGN_OR_RETURN(Buffer gate, Alloc(c, act, {T, F}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer up, Alloc(c, act, {T, F}, Tier::kActivations));
  ops.Copy(s->x2.tensor(), y);
  for (int64_t t0 = 0; t0 < S; t0 += T) {
    const int64_t t1 = std::min(S, t0 + T);
    Tensor g = gate.tensor().Rows(0, t1 - t0), u = up.tensor().Rows(0, t1 - t0);
    Tensor h2 = s->h2.tensor().Rows(t0, t1);
    ops.Gemm(h2, false, w.w_gate, true, g, 1.f, 0.f);
    ops.Gemm(h2, false, w.w_up, true, u, 1.f, 0.f);
    ops.SwiGLU(g, u, g);  // the activation overwrites gate: SwiGLU is elementwise
    ops.Gemm(g, false, w.w_down, true, y.Rows(t0, t1), 1.f, 1.f);
  }
  return absl::OkStatus();
}

absl::Status BlockBackward(const BlockContext& c, const BlockWeights& w, const BlockWeights& g,
                           const Tensor& x, BlockSaved* s, const Tensor& dy, const Tensor& dx) {
  const LlamaConfig& cfg = *c.cfg;
  Ops& ops = *c.ops;
  const DType act = ops.act_dtype();
  const int64_t S = x.dim(0), d = cfg.hidden_size, D = cfg.head_dim;
  const int64_t hq = cfg.num_attention_heads, hkv = cfg.num_key_value_heads;

  // MLP half, tile by tile, recomputing the tile's intermediates.
  ASSIGN_OR_RETURN(Buffer dx2, Alloc(c, act, {S, d}, Tier::kActivations));
  ops.Copy(dy, dx2.tensor());  // the residual path
  {
    const int64_t F = cfg.intermediate_size, T = std::min(c.tile_tokens, S);
    ASSIGN_OR_RETURN(Buffer gate, Alloc(c, act, {T, F}, Tier::kActivations));
    ASSIGN_OR_RETURN(Buffer up, Alloc(c, act, {T, F}, Tier::kActivations));
    ASSIGN_OR_RETURN(Buffer a, Alloc(c, act, {T, F}, Tier::kActivations));
    ASSIGN_OR_RETURN(Buffer dh2, Alloc(c, act, {T, d}, Tier::kActivations));
    for (int64_t t0 = 0; t0 < S; t0 += T) {
      const int64_t t1 = std::min(S, t0 + T), n = t1 - t0;
      Tensor gt = gate.tensor().Rows(0, n), ut = up.tensor().Rows(0, n);
      Tensor at = a.tensor().Rows(0, n), dh2t = dh2.tensor().Rows(0, n);
      Tensor h2 = s->h2.tensor().Rows(t0, t1), dyt = dy.Rows(t0, t1);
      ops.Gemm(h2, false, w.w_gate, true, gt, 1.f, 0.f);
      ops.Gemm(h2, false, w.w_up, true, ut, 1.f, 0.f);
      ops.SwiGLU(gt, ut, at);
      ops.Gemm(dyt, true, at, false, g.w_down, 1.f, 1.f);  // dW2 += dyᵀ·a
      ops.Gemm(dyt, false, w.w_down, false, at, 1.f, 0.f);  // da = dy·W2 (reuses a)
      ops.SwiGLUBackward(gt, ut, at, gt, ut);               // dgate, dup in place
      ops.Gemm(gt, true, h2, false, g.w_gate, 1.f, 1.f);
      ops.Gemm(ut, true, h2, false, g.w_up, 1.f, 1.f);
      ops.Gemm(gt, false, w.w_gate, false, dh2t, 1.f, 0.f);
      ops.Gemm(ut, false, w.w_up, false, dh2t, 1.f, 1.f);
      ops.RmsNormBackward(s->x2.tensor().Rows(t0, t1), w.mlp_norm, s->rstd2.tensor().Rows(t0, t1),
                          dh2t, dx2.tensor().Rows(t0, t1), g.mlp_norm);
    }
  }
  s->h2.Reset();
  s->rstd2.Reset();
  s->x2.Reset();

  // Attention half.
  ASSIGN_OR_RETURN(Buffer dout, Alloc(c, act, {S, hq, D}, Tier::kAttention));
  ops.Gemm(dx2.tensor(), true, Mat(s->o), false, g.wo, 1.f, 1.f);  // dWo += dx2ᵀ·o
  ops.Gemm(dx2.tensor(), false, w.wo, false, Mat(dout), 1.f, 0.f);
  ASSIGN_OR_RETURN(Buffer dq, Alloc(c, act, {S, hq, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer dk, Alloc(c, act, {S, hkv, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer dv, Alloc(c, act, {S, hkv, D}, Tier::kAttention));
  ops.AttentionBackward(s->q.tensor(), s->k.tensor(), s->v.tensor(), s->o.tensor(), dout.tensor(),
                        s->lse.tensor(), dq.tensor(), dk.tensor(), dv.tensor());
  dout.Reset();
  s->q.Reset();
  s->k.Reset();
  s->v.Reset();
  s->o.Reset();
  s->lse.Reset();
  ops.Rope(dq.tensor(), c.pos0, c.inv_freq, true);
  ops.Rope(dk.tensor(), c.pos0, c.inv_freq, true);
  const Tensor h = s->h.tensor();
  ops.Gemm(Mat(dq), true, h, false, g.wq, 1.f, 1.f);
  ops.Gemm(Mat(dk), true, h, false, g.wk, 1.f, 1.f);
  ops.Gemm(Mat(dv), true, h, false, g.wv, 1.f, 1.f);
  ASSIGN_OR_RETURN(Buffer dh, Alloc(c, act, {S, d}, Tier::kActivations));
  ops.Gemm(Mat(dq), false, w.wq, false, dh.tensor(), 1.f, 0.f);
  ops.Gemm(Mat(dk), false, w.wk, false, dh.tensor(), 1.f, 1.f);
  ops.Gemm(Mat(dv), false, w.wv, false, dh.tensor(), 1.f, 1.f);
  s->h.Reset();
  if (dx.data != dx2.tensor().data) ops.Copy(dx2.tensor(), dx);
  ops.RmsNormBackward(x, w.attn_norm, s->rstd1.tensor(), dh.tensor(), dx, g.attn_norm);
  s->rstd1.Reset();
  return absl::OkStatus();
}

}  // namespace ithaca
