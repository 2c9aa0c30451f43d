#include "engine/schedule/block.h"

#include <algorithm>

#include "engine/model/params.h"

namespace ithaca {
namespace {

absl::StatusOr<Buffer> Alloc(const BlockContext& c, DType t, Shape s, Tier tier) {
  return Buffer::Make(c.alloc(), t, std::move(s), tier);
}

float Eps(const BlockContext& c) { return static_cast<float>(c.cfg->rms_norm_eps); }

// Tokens per tile of the attention input's norm: its tiles (h, and dh in the backward: 2·T·d)
// are sized to take no more than one MLP tile (h2, gate, up: T·(d + 2F)). Larger tiles mean
// fewer, larger projection GEMMs, and the norm is remade once per head stage.
int64_t ProjectionTile(const BlockContext& c) {
  const int64_t d = c.cfg->hidden_size, f = c.cfg->intermediate_size;
  return std::max<int64_t>(c.tile_tokens, c.tile_tokens * (d + 2 * f) / (2 * d));
}

NormedInput AttentionInput(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                           const BlockSaved& s) {
  return NormedInput{x, w.attn_norm, s.rstd1.tensor(), Eps(c), ProjectionTile(c)};
}

// The MLP over token tiles, in place: y holds x2 and becomes x2 + W2·(silu(W1·h2) ⊙ W3·h2),
// h2 = rmsnorm(x2) made per tile (each tile's rows are read before they are updated).
// LoRA's scratch for `rows` rows (x·Aᵀ, and its gradient `dt` when asked) when any of
// `targets` has an adapter; empty buffers otherwise.
absl::Status LoraScratch(const BlockContext& c, const BlockWeights& w,
                         std::initializer_list<int> targets, int64_t rows, Buffer* t, Buffer* dt) {
  for (int target : targets) {
    if (!w.lora[target].on()) continue;
    const int64_t r = w.lora[target].a.dim(0);
    ASSIGN_OR_RETURN(*t, Alloc(c, c.ops()->act_dtype(), {rows, r}, Tier::kActivations));
    if (dt) {
      ASSIGN_OR_RETURN(*dt, Alloc(c, c.ops()->act_dtype(), {rows, r}, Tier::kActivations));
    }
    break;
  }
  return absl::OkStatus();
}

// out (+)= x·Wᵀ (+ LoRA's part), one linear of the block.
void Linear(const BlockContext& c, const BlockWeights& w, int target, const Tensor& x,
            const Tensor& weight, const Tensor& out, float beta, const Buffer& t) {
  c.ops()->Gemm(x, false, weight, true, out, 1.f, beta);
  if (w.lora[target].on()) {
    LoraForward(*c.ops(), w.lora[target], w.lora_scale, x, out, t.tensor());
  }
}

absl::Status MlpForward(const BlockContext& c, const BlockWeights& w, const BlockSaved& s,
                        const Tensor& y) {
  Ops& ops = *c.ops();
  const int64_t n_tok = y.dim(0), F = c.cfg->intermediate_size;
  const int64_t T = std::min(c.tile_tokens, n_tok);
  const DType act = ops.act_dtype();
  ASSIGN_OR_RETURN(Buffer h2, Alloc(c, act, {T, c.cfg->hidden_size}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer gate, Alloc(c, act, {T, F}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer up, Alloc(c, act, {T, F}, Tier::kActivations));
  Buffer lt;
  RETURN_IF_ERROR(LoraScratch(c, w, {kLoraGate, kLoraUp, kLoraDown}, T, &lt, nullptr));
  for (int64_t t0 = 0; t0 < n_tok; t0 += T) {
    const int64_t t1 = std::min(n_tok, t0 + T), n = t1 - t0;
    Tensor g = gate.tensor().Rows(0, n), u = up.tensor().Rows(0, n), h = h2.tensor().Rows(0, n);
    ops.RmsNorm(y.Rows(t0, t1), w.mlp_norm, Eps(c), h, s.rstd2.tensor().Rows(t0, t1));
    Linear(c, w, kLoraGate, h, w.w_gate, g, 0.f, lt);
    Linear(c, w, kLoraUp, h, w.w_up, u, 0.f, lt);
    ops.SwiGLU(g, u, g);  // elementwise: the activation overwrites gate
    Linear(c, w, kLoraDown, g, w.w_down, y.Rows(t0, t1), 1.f, lt);
  }
  return absl::OkStatus();
}

// dy += the MLP's contribution to the gradient of x2 (dy is the gradient wrt the block output,
// which flows unchanged through the residual), tile by tile, recomputing each tile's h2 and
// intermediates. Each tile's rows of dy are read before they are updated.
absl::Status MlpBackward(const BlockContext& c, const BlockWeights& w, const BlockWeights& g,
                         const BlockSaved& s, const Tensor& dy) {
  Ops& ops = *c.ops();
  const DType act = ops.act_dtype();
  const int64_t n_tok = dy.dim(0), d = c.cfg->hidden_size, F = c.cfg->intermediate_size;
  const int64_t T = std::min(c.tile_tokens, n_tok);
  ASSIGN_OR_RETURN(Buffer h2, Alloc(c, act, {T, d}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer gate, Alloc(c, act, {T, F}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer up, Alloc(c, act, {T, F}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer a, Alloc(c, act, {T, F}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer dh2, Alloc(c, act, {T, d}, Tier::kActivations));
  Buffer lt, ldt;
  RETURN_IF_ERROR(LoraScratch(c, w, {kLoraGate, kLoraUp, kLoraDown}, T, &lt, &ldt));
  const bool base_grads = g.w_down.data != nullptr;  // else the base is frozen
  // LoRA's backward of one linear, x → dy, adding its input gradient into dx (when given).
  auto lora_backward = [&](int target, const Tensor& x, const Tensor& dyl, const Tensor& dx) {
    if (!w.lora[target].on()) return;
    LoraOutputBackward(ops, w.lora[target], g.lora[target], w.lora_scale, x, dyl, lt.tensor(),
                       ldt.tensor(), /*accumulate=*/false);
    LoraInputBackward(ops, w.lora[target], g.lora[target], x, ldt.tensor(), dx);
  };
  for (int64_t t0 = 0; t0 < n_tok; t0 += T) {
    const int64_t t1 = std::min(n_tok, t0 + T), n = t1 - t0;
    Tensor gt = gate.tensor().Rows(0, n), ut = up.tensor().Rows(0, n);
    Tensor at = a.tensor().Rows(0, n), dh2t = dh2.tensor().Rows(0, n);
    Tensor ht = h2.tensor().Rows(0, n), dyt = dy.Rows(t0, t1);
    const Tensor x2t = s.x2.tensor().Rows(t0, t1), rstd = s.rstd2.tensor().Rows(t0, t1);
    ops.RmsNorm(x2t, w.mlp_norm, Eps(c), ht, rstd);
    Linear(c, w, kLoraGate, ht, w.w_gate, gt, 0.f, lt);
    Linear(c, w, kLoraUp, ht, w.w_up, ut, 0.f, lt);
    ops.SwiGLU(gt, ut, at);
    if (base_grads) ops.Gemm(dyt, true, at, false, g.w_down, 1.f, 1.f);  // dW2 += dyᵀ·a
    if (w.lora[kLoraDown].on()) {  // its gradients need a before it becomes da
      LoraOutputBackward(ops, w.lora[kLoraDown], g.lora[kLoraDown], w.lora_scale, at, dyt,
                         lt.tensor(), ldt.tensor(), /*accumulate=*/false);
      LoraInputBackward(ops, w.lora[kLoraDown], g.lora[kLoraDown], at, ldt.tensor(), Tensor());
    }
    ops.Gemm(dyt, false, w.w_down, false, at, 1.f, 0.f);  // da = dy·W2 (reuses a)
    if (w.lora[kLoraDown].on()) {                         // da += dt·A
      ops.Gemm(ldt.tensor().Rows(0, n), false, w.lora[kLoraDown].a, false, at, 1.f, 1.f);
    }
    ops.SwiGLUBackward(gt, ut, at, gt, ut);  // dgate, dup in place
    if (base_grads) {
      ops.Gemm(gt, true, ht, false, g.w_gate, 1.f, 1.f);
      ops.Gemm(ut, true, ht, false, g.w_up, 1.f, 1.f);
    }
    ops.Gemm(gt, false, w.w_gate, false, dh2t, 1.f, 0.f);
    ops.Gemm(ut, false, w.w_up, false, dh2t, 1.f, 1.f);
    lora_backward(kLoraGate, ht, gt, dh2t);
    lora_backward(kLoraUp, ht, ut, dh2t);
    ops.RmsNormBackward(x2t, w.mlp_norm, rstd, dh2t, dyt, g.mlp_norm);
  }
  return absl::OkStatus();
}

}  // namespace

BlockWeights BlockViews(const LlamaConfig& cfg, const Tensor& unit_flat) {
  // A layout of one block: every block's entries sit at the same offsets in its unit.
  LlamaConfig one = cfg;
  one.num_hidden_layers = 1;
  const ParamLayout layout(one);
  const ParamUnit& u = layout.units()[1];
  auto v = [&](int p) { return p < 0 ? Tensor() : ParamLayout::View(unit_flat, u.entries[p]); };
  BlockWeights w{v(kAttnNorm), v(kWq),    v(kWk),  v(kWv),   v(kWo),
                 v(kMlpNorm),  v(kWGate), v(kWUp), v(kWDown)};
  w.bq = v(BlockEntryIndex(cfg, kBq));
  w.bk = v(BlockEntryIndex(cfg, kBk));
  w.bv = v(BlockEntryIndex(cfg, kBv));
  w.q_norm = v(BlockEntryIndex(cfg, kQNorm));
  w.k_norm = v(BlockEntryIndex(cfg, kKNorm));
  return w;
}

void AddLoraViews(const LlamaConfig& cfg, const Tensor& lora_unit_flat, BlockWeights* w) {
  LlamaConfig one = cfg;
  one.num_hidden_layers = 1;
  const ParamLayout layout(one);
  const ParamUnit& u = layout.units()[layout.lora_unit(0)];
  for (int t = 0; t < kNumLoraTargets; ++t) {
    const int e = layout.lora_entry(t);
    if (e < 0) continue;
    w->lora[t] = {ParamLayout::View(lora_unit_flat, u.entries[e]),
                  ParamLayout::View(lora_unit_flat, u.entries[e + 1])};
  }
  w->lora_scale = cfg.lora.scale();
}

int64_t FrozenNormElements(const LlamaConfig& cfg) {
  return 2 * cfg.hidden_size + 2 * cfg.head_dim;
}

BlockWeights FrozenBlockGrads(const LlamaConfig& cfg, const Tensor& norms) {
  const int64_t d = cfg.hidden_size, hd = cfg.head_dim;
  BlockWeights g;
  g.attn_norm = norms.Slice(0, {d});
  g.mlp_norm = norms.Slice(d, {d});
  if (cfg.qk_norm) {
    g.q_norm = norms.Slice(2 * d, {hd});
    g.k_norm = norms.Slice(2 * d + hd, {hd});
  }
  return g;
}

namespace {

// rstd1, O and LSE (re-running the attention forward) where they are missing.
absl::Status AttentionPart(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                           BlockSaved* s) {
  const LlamaConfig& cfg = *c.cfg;
  const int64_t n_tok = x.dim(0);
  if (s->rstd1.empty()) {
    ASSIGN_OR_RETURN(s->rstd1, Alloc(c, DType::kF32, {n_tok}, Tier::kActivations));
  }
  if (s->o.empty()) {
    const HeadPlan& p = c.attn.plan;
    ASSIGN_OR_RETURN(s->o, Alloc(c, c.ops()->act_dtype(), {n_tok, cfg.num_attention_heads * p.D},
                                 c.saved_attention_tier));
    ASSIGN_OR_RETURN(s->lse,
                     Alloc(c, DType::kF32, {p.stages() * p.u, c.attn.S()}, c.saved_attention_tier));
    RETURN_IF_ERROR(UlyssesAttentionForward(c.attn, w.qkv(), AttentionInput(c, w, x, *s),
                                            s->o.tensor(), s->lse.tensor()));
  }
  if (s->rstd2.empty()) {
    ASSIGN_OR_RETURN(s->rstd2, Alloc(c, DType::kF32, {n_tok}, Tier::kActivations));
  }
  return absl::OkStatus();
}

// x2 = x + O·Woᵀ (+ LoRA's part) into `out`.
absl::Status Residual(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                      const BlockSaved& s, const Tensor& out) {
  c.ops()->Copy(x, out);
  Buffer lt;
  RETURN_IF_ERROR(LoraScratch(c, w, {kLoraO}, x.dim(0), &lt, nullptr));
  Linear(c, w, kLoraO, s.o.tensor(), w.wo, out, 1.f, lt);
  return absl::OkStatus();
}

}  // namespace

absl::Status BlockRecompute(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                            BlockSaved* s) {
  RETURN_IF_ERROR(AttentionPart(c, w, x, s));
  if (s->x2.empty()) {
    ASSIGN_OR_RETURN(s->x2, Alloc(c, c.ops()->act_dtype(), x.shape, Tier::kActivations));
    RETURN_IF_ERROR(Residual(c, w, x, *s, s->x2.tensor()));
  }
  return absl::OkStatus();
}

absl::Status BlockForward(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                          const Tensor& y, BlockSaved* s, bool keep_attention_output,
                          bool keep_mlp_input) {
  *s = BlockSaved();
  RETURN_IF_ERROR(AttentionPart(c, w, x, s));
  RETURN_IF_ERROR(Residual(c, w, x, *s, y));  // y holds x2 until the MLP adds to it in place
  if (keep_mlp_input) {
    ASSIGN_OR_RETURN(s->x2, Alloc(c, c.ops()->act_dtype(), x.shape, Tier::kActivations));
    c.ops()->Copy(y, s->x2.tensor());
  }
  if (!keep_attention_output) {
    s->o.Reset();
    s->lse.Reset();
  }
  return MlpForward(c, w, *s, y);
}

absl::Status BlockBackward(const BlockContext& c, const BlockWeights& w, const BlockWeights& g,
                           const Tensor& x, BlockSaved* s, const Tensor& dy) {
  Ops& ops = *c.ops();
  // MLP half: dy becomes the gradient wrt x2.
  RETURN_IF_ERROR(MlpBackward(c, w, g, *s, dy));
  s->x2.Reset();
  s->rstd2.Reset();

  // Attention half: dO = dx2 · Wo, then dy accumulates the attention's contribution, so it ends
  // as the gradient wrt x (the residual carries dx2 through unchanged).
  ASSIGN_OR_RETURN(Buffer dout, Alloc(c, ops.act_dtype(), s->o.tensor().shape, Tier::kAttention));
  if (g.wo.data != nullptr) ops.Gemm(dy, true, s->o.tensor(), false, g.wo, 1.f, 1.f);  // dWo
  ops.Gemm(dy, false, w.wo, false, dout.tensor(), 1.f, 0.f);
  if (w.lora[kLoraO].on()) {
    Buffer lt, ldt;
    RETURN_IF_ERROR(LoraScratch(c, w, {kLoraO}, dy.dim(0), &lt, &ldt));
    LoraOutputBackward(ops, w.lora[kLoraO], g.lora[kLoraO], w.lora_scale, s->o.tensor(), dy,
                       lt.tensor(), ldt.tensor(), /*accumulate=*/false);
    LoraInputBackward(ops, w.lora[kLoraO], g.lora[kLoraO], s->o.tensor(), ldt.tensor(),
                      dout.tensor());
  }
  RETURN_IF_ERROR(UlyssesAttentionBackward(c.attn, w.qkv(), g.qkv(), AttentionInput(c, w, x, *s),
                                           s->o.tensor(), s->lse.tensor(), dout.tensor(), dy,
                                           g.attn_norm));
  *s = BlockSaved();
  return absl::OkStatus();
}

}  // namespace ithaca
