#include "engine/parallel/upipe.h"

#include <algorithm>

#include "engine/parallel/pass_buffers.h"
#include "engine/parallel/ring_attention.h"

namespace ithaca {

TokenRuns UlyssesContext::RankRuns() const {
  return RankTokenRuns(ring_rank * plan.P + rank, plan.P, ring_size, s);
}

namespace {

// RoPE over this rank's tokens x [s, n, D], run by run of consecutive positions.
void RopeRankTokens(const UlyssesContext& c, const Tensor& x, bool inverse) {
  const TokenRuns runs = c.RankRuns();
  for (int i = 0; i < runs.n; ++i) {
    const TokenRun& r = runs.run[i];
    c.ops->Rope(x.Rows(r.local, r.local + r.len), r.pos, c.inv_freq, inverse, c.docs);
  }
}

absl::StatusOr<Buffer> Alloc(const UlyssesContext& c, DType t, Shape s, Tier tier) {
  return Buffer::Make(c.alloc, t, std::move(s), tier);
}

// Rows [h0·D, (h0+n)·D) of a [heads·D, d] projection weight: heads h0 .. h0+n−1.
Tensor HeadRows(const Tensor& w, int64_t h0, int64_t n, int64_t D) {
  return w.Rows(h0 * D, (h0 + n) * D);
}

// Starts exchanging equal chunks (one per rank). With one rank the data is already where it
// belongs (copied if `out` is another buffer).
absl::StatusOr<Issued> StartExchange(const UlyssesContext& c, const Tensor& in, const Tensor& out) {
  if (c.sp == nullptr || c.plan.P == 1) {
    if (in.data != out.data) c.ops->Copy(in, out);
    return Issued();
  }
  return c.sp->IssueAllToAll(in, out);
}

absl::Status Exchange(const UlyssesContext& c, const Tensor& in, const Tensor& out) {
  ASSIGN_OR_RETURN(Issued x, StartExchange(c, in, out));
  return x.Wait();
}

// A round's K/V: projected here (send) and received (the whole sequence for this rank's heads).
struct KvSet {
  Tensor k_send, v_send, k, v;
  Issued k_in, v_in;
};

// How a pass walks its stages: round r = st / stages_per_round, t = st % stages_per_round; a
// round's first stage brings its K/V. Look-ahead (pipelined) keeps two sets of stage buffers
// (and of K/V buffers when there are several rounds), stage st using set st % 2.
struct StageWalk {
  const HeadPlan& p;
  bool ahead;
  int64_t round(int64_t st) const { return st / p.stages_per_round; }
  int64_t step(int64_t st) const { return st % p.stages_per_round; }
  int64_t q_sets() const { return ahead ? 2 : 1; }
  int64_t kv_sets() const { return ahead && p.rounds > 1 ? 2 : 1; }
};

// A stage's result on its way back to this rank's tokens. Pipelined, it lands only after the
// next stage's compute has been issued, so the exchange runs under it.
struct Returning {
  Issued arrival;
  int64_t stage = -1;  // none on its way
  Tensor at;

  absl::Status Send(const UlyssesContext& c, int64_t st, const Tensor& from, const Tensor& to) {
    ASSIGN_OR_RETURN(arrival, StartExchange(c, from, to));
    stage = st;
    at = to;
    return absl::OkStatus();
  }
  // Waits for it and hands it to use(stage, tensor).
  template <typename Use>
  absl::Status Land(Use&& use) {
    if (stage < 0) return absl::OkStatus();
    RETURN_IF_ERROR(arrival.Wait());
    use(stage, at);
    stage = -1;
    return absl::OkStatus();
  }
};

// One projection into all-to-all slots (forward) or out of them (backward): rows of `w` for n
// heads per destination rank; `buf` is [P, s, n, D], slot j for rank j's heads. `b` (with the
// context's qkv_bias) is the bias as the projection's GEMM adds it (times the rope scale where
// the GEMM carries that scale: AttentionExtras), `gb` the gradient of the model's bias; `norm`
// (q and k with its qk_norm) the per-head RMSNorm's weight, already multiplied by the rope scale
// when there is one (AttentionExtras).
struct Projection {
  Tensor w;   // [heads·D, d]
  Tensor gw;  // its gradient (backward only)
  Tensor buf;
  bool rope = false;
  Tensor b, gb;          // [heads·D]
  Tensor norm, gnorm;    // [D]
  LoraPair lora, glora;  // with LoRA on this projection
  float lora_scale = 0;
};

Tensor Slot(const UlyssesContext& c, const Tensor& buf, int64_t j, int64_t n) {
  return buf.Slice(j * c.s * n * c.plan.D, {c.s, n * c.plan.D});
}

// Scratch for the family's extras over one pass. A bias rides in its projection's GEMM
// (Ops::GemmBias, cuBLASLt's bias epilogue on CUDA); its gradient is the rank-1 GEMM onesᵀ · dY
// over a column of ones (cuBLASLt's BGRADB epilogue would fit the weight-gradient GEMM's layout,
// but it writes its sum where the tiles must accumulate it, and it is not measured yet). The
// per-head norms run in place in the projection's slot; the backward remakes their input in
// `raw` (Ops::RmsNormBackwardInPlace). The norms' weights, and the q/k biases of a rotated
// projection without a norm, are kept times the rope scale.
struct AttentionExtras {
  Tensor ones;              // act [tile, 1]
  Tensor raw;               // act [tile, max(u, kvr)·D] (backward)
  Tensor rstd;              // f32 [tile·max(u, kvr)] (the forward norm's, unused after it)
  Tensor q_norm, k_norm;    // act [D]: the weights times rope_scale (the weights when it is 1)
  Tensor dq_norm, dk_norm;  // f32 [D]: their gradients, before the scale (backward, scale ≠ 1)
  Tensor bq, bk;            // act [heads·D]: the biases times rope_scale (the biases when it is 1)
  Tensor lora_t, lora_dt;   // act [tile, rank]: LoRA's x·Aᵀ and its gradient (dt: backward)
};

absl::StatusOr<AttentionExtras> MakeExtras(const UlyssesContext& c, const QkvWeights& w,
                                           const QkvWeights* g, int64_t tile,
                                           std::vector<Buffer>* owned) {
  AttentionExtras e;
  const DType act = c.ops->act_dtype();
  const int64_t D = c.plan.D, n = std::max(c.plan.u, c.plan.kvr);
  auto make = [&](DType t, Shape shape) -> absl::StatusOr<Tensor> {
    ASSIGN_OR_RETURN(Buffer b, Buffer::Make(c.alloc, t, std::move(shape), Tier::kAttention));
    owned->push_back(std::move(b));
    return owned->back().tensor();
  };
  for (const LoraPair* l : {&w.lq, &w.lk, &w.lv}) {
    if (!l->on()) continue;
    ASSIGN_OR_RETURN(e.lora_t, make(act, {tile, l->a.dim(0)}));
    if (g) {
      ASSIGN_OR_RETURN(e.lora_dt, make(act, {tile, l->a.dim(0)}));
    }
    break;
  }
  if (!c.qkv_bias && !c.qk_norm) return e;
  ASSIGN_OR_RETURN(e.ones, make(act, {tile, 1}));
  c.ops->Fill(e.ones, 1.f);
  // v' = rope_scale · v, as the GEMM ones[1, 1] · v[1, len] scaled.
  auto scaled = [&](const Tensor& from, Tensor* to) -> absl::Status {
    const int64_t len = from.numel();
    ASSIGN_OR_RETURN(*to, make(act, {len}));
    c.ops->Gemm(e.ones.Rows(0, 1), false, from.Reshaped({1, len}), false, to->Reshaped({1, len}),
                c.rope_scale, 0.f);
    return absl::OkStatus();
  };
  if (c.qkv_bias) {
    e.bq = w.bq;
    e.bk = w.bk;
    if (!c.qk_norm && c.rope_scale != 1.f) {
      // The rotated projections' GEMMs carry the scale (ProjectionScale), and GemmBias adds its
      // bias after alpha: the bias goes in already scaled.
      RETURN_IF_ERROR(scaled(w.bq, &e.bq));
      RETURN_IF_ERROR(scaled(w.bk, &e.bk));
    }
  }
  if (!c.qk_norm) return e;
  if (g) {
    ASSIGN_OR_RETURN(e.raw, make(act, {tile, n * D}));
  }
  ASSIGN_OR_RETURN(e.rstd, make(DType::kF32, {tile * n}));
  e.q_norm = w.q_norm;
  e.k_norm = w.k_norm;
  if (c.rope_scale != 1.f) {
    RETURN_IF_ERROR(scaled(w.q_norm, &e.q_norm));
    RETURN_IF_ERROR(scaled(w.k_norm, &e.k_norm));
    if (g) {
      ASSIGN_OR_RETURN(e.dq_norm, make(DType::kF32, {D}));
      ASSIGN_OR_RETURN(e.dk_norm, make(DType::kF32, {D}));
      c.ops->Fill(e.dq_norm, 0.f);
      c.ops->Fill(e.dk_norm, 0.f);
    }
  }
  return e;
}

// The gradient of the unscaled norms' weights: rope_scale times that of the scaled ones.
void FinishExtras(const UlyssesContext& c, const AttentionExtras& e, const QkvWeights& g) {
  if (e.dq_norm.shape.empty() || g.q_norm.data == nullptr) return;
  c.ops->Axpy(c.rope_scale, e.dq_norm, g.q_norm);
  c.ops->Axpy(c.rope_scale, e.dk_norm, g.k_norm);
}

// The multiplier of a projection's own GEMMs: the rope scale for rotated projections without a
// norm (RoPE is linear, so scaling before it is scaling after), else 1 (the norm carries it).
float ProjectionScale(const UlyssesContext& c, const Projection& p) {
  return p.rope && p.norm.shape.empty() ? c.rope_scale : 1.f;
}

// Rows [h0·D, (h0+n)·D) of a bias [heads·D] as a [1, n·D] row.
Tensor BiasRow(const Tensor& b, int64_t h0, int64_t n, int64_t D) {
  return b.Slice(h0 * D, {1, n * D});
}

// slot = alpha · h · W[heads]ᵀ (+ bias in the same GEMM) (+ alpha · LoRA's h · Aᵀ · B[heads]ᵀ).
void Project(const UlyssesContext& c, const AttentionExtras& ex, const Tensor& h,
             const Projection& p, int64_t h0, int64_t n, float alpha, const Tensor& out) {
  const int64_t D = c.plan.D;
  if (p.b.shape.empty()) {
    c.ops->Gemm(h, false, HeadRows(p.w, h0, n, D), true, out, alpha, 0.f);
  } else {
    c.ops->GemmBias(h, false, HeadRows(p.w, h0, n, D), true, p.b.Slice(h0 * D, {n * D}), out, alpha,
                    0.f);
  }
  if (p.lora.on()) {
    LoraForward(*c.ops, p.lora, p.lora_scale, h, out, ex.lora_t, alpha, h0 * D, n * D);
  }
}

// Projects heads for every destination rank straight into its all-to-all slot:
// slot j = (roped) h · W[heads of j]ᵀ (+ b[heads of j], then each head RMS-normed in place) for
// each projection, h made tile by tile into `h_tile` once for all of them.
template <typename FirstHead>
void ProjectForRanks(const UlyssesContext& c, const NormedInput& in, const Tensor& h_tile,
                     const AttentionExtras& ex, std::initializer_list<Projection> projections,
                     int64_t n, FirstHead first_head) {
  const int64_t D = c.plan.D, s = c.s;
  for (int64_t t0 = 0; t0 < s; t0 += in.tile) {
    const int64_t t1 = std::min(s, t0 + in.tile), rows = t1 - t0;
    const Tensor h = h_tile.Rows(0, rows);
    c.ops->RmsNorm(in.x.Rows(t0, t1), in.norm_w, in.eps, h, in.rstd.Rows(t0, t1));
    for (const Projection& p : projections) {
      const float alpha = ProjectionScale(c, p);
      for (int64_t j = 0; j < c.plan.P; ++j) {
        const Tensor out = Slot(c, p.buf, j, n).Rows(t0, t1);
        Project(c, ex, h, p, first_head(j), n, alpha, out);
        if (!p.norm.shape.empty()) {
          const Tensor heads = out.Reshaped({rows * n, D});
          c.ops->RmsNorm(heads, p.norm, c.qk_norm_eps, heads, ex.rstd.Slice(0, {rows * n}));
        }
      }
    }
  }
  for (const Projection& p : projections) {
    if (!p.rope) continue;
    for (int64_t j = 0; j < c.plan.P; ++j) {
      RopeRankTokens(c, Slot(c, p.buf, j, n).Reshaped({s, n, D}), /*inverse=*/false);
    }
  }
}

// The reverse of ProjectForRanks for gradients: each projection's buf holds, in slot j, the
// gradient for this rank's tokens of j's heads. Per token tile: through the heads' norm (its
// input remade from h), the weight gradient rows (dW += slotᵀ · h, db += Σ slot), then
// dh = Σ slot · W through the attention norm's backward into dx and dnorm_w.
template <typename FirstHead>
void BackpropForRanks(const UlyssesContext& c, const NormedInput& in, const Tensor& h_tile,
                      const Tensor& dh_tile, const AttentionExtras& ex,
                      std::initializer_list<Projection> projections, int64_t n,
                      FirstHead first_head, const Tensor& dx, const Tensor& dnorm_w) {
  const int64_t D = c.plan.D, s = c.s;
  for (const Projection& p : projections) {
    if (!p.rope) continue;
    for (int64_t j = 0; j < c.plan.P; ++j) {
      RopeRankTokens(c, Slot(c, p.buf, j, n).Reshaped({s, n, D}), /*inverse=*/true);
    }
  }
  for (int64_t t0 = 0; t0 < s; t0 += in.tile) {
    const int64_t t1 = std::min(s, t0 + in.tile), rows = t1 - t0;
    const Tensor h = h_tile.Rows(0, rows), dh = dh_tile.Rows(0, rows);
    c.ops->RmsNorm(in.x.Rows(t0, t1), in.norm_w, in.eps, h, in.rstd.Rows(t0, t1));
    float beta = 0.f;  // the first product writes dh, the others add to it
    for (const Projection& p : projections) {
      const float alpha = ProjectionScale(c, p);
      for (int64_t j = 0; j < c.plan.P; ++j) {
        const Tensor slot = Slot(c, p.buf, j, n).Rows(t0, t1);
        if (!p.norm.shape.empty()) {
          // The slot holds the gradient wrt the normed heads: remake their input (raw = h · Wᵀ
          // + b, one GEMM) and go back through the norm in place, leaving the gradient wrt raw
          // in the slot.
          const Tensor raw = ex.raw.Slice(0, {rows, n * D});
          Project(c, ex, h, p, first_head(j), n, 1.f, raw);
          c.ops->RmsNormBackwardInPlace(raw.Reshaped({rows * n, D}), p.norm, c.qk_norm_eps,
                                        slot.Reshaped({rows * n, D}), p.gnorm);
        }
        if (p.gw.data != nullptr) {  // a frozen base has no weight gradients
          c.ops->Gemm(slot, true, h, false, HeadRows(p.gw, first_head(j), n, D), alpha, 1.f);
        }
        if (!p.b.shape.empty() && p.gb.data != nullptr) {
          c.ops->Gemm(ex.ones.Rows(0, rows), true, slot, false, BiasRow(p.gb, first_head(j), n, D),
                      alpha, 1.f);
        }
        c.ops->Gemm(slot, false, HeadRows(p.w, first_head(j), n, D), false, dh, alpha, beta);
        beta = 1.f;
        if (p.lora.on()) {
          LoraOutputBackward(*c.ops, p.lora, p.glora, p.lora_scale, h, slot, ex.lora_t, ex.lora_dt,
                             /*accumulate=*/j > 0, alpha, first_head(j) * D, n * D);
        }
      }
      if (p.lora.on()) LoraInputBackward(*c.ops, p.lora, p.glora, h, ex.lora_dt, dh);
    }
    c.ops->RmsNormBackward(in.x.Rows(t0, t1), in.norm_w, in.rstd.Rows(t0, t1), dh, dx.Rows(t0, t1),
                           dnorm_w);
  }
}

// The projections of a pass: q (rotated), k (rotated), v, each with its bias and norm where the
// model has them; `g` (backward) adds the gradients, `buf` is set by the caller.
Projection MakeProjection(const UlyssesContext& c, const AttentionExtras& ex, const QkvWeights& w,
                          const QkvWeights* g, char which, const Tensor& buf) {
  Projection p;
  p.buf = buf;
  p.rope = which != 'v';
  p.w = which == 'q' ? w.wq : which == 'k' ? w.wk : w.wv;
  if (g) p.gw = which == 'q' ? g->wq : which == 'k' ? g->wk : g->wv;
  p.lora = which == 'q' ? w.lq : which == 'k' ? w.lk : w.lv;
  p.lora_scale = w.lora_scale;
  if (g) p.glora = which == 'q' ? g->lq : which == 'k' ? g->lk : g->lv;
  if (c.qkv_bias) {
    p.b = which == 'q' ? ex.bq : which == 'k' ? ex.bk : w.bv;
    if (g) p.gb = which == 'q' ? g->bq : which == 'k' ? g->bk : g->bv;
  }
  if (c.qk_norm && which != 'v') {
    p.norm = which == 'q' ? ex.q_norm : ex.k_norm;
    if (g) {
      const bool scaled = !ex.dq_norm.shape.empty();
      p.gnorm =
          which == 'q' ? (scaled ? ex.dq_norm : g->q_norm) : (scaled ? ex.dk_norm : g->k_norm);
    }
  }
  return p;
}

// Moves this stage's head columns between O_local [s, Hq·D] and the all-to-all layout
// [P, s, u·D] (slot j = j's heads for this stage). to_local picks the direction.
void StageColumns(const UlyssesContext& c, int64_t k, int64_t t, const Tensor& o_local,
                  const Tensor& packed, bool to_local) {
  const HeadPlan& p = c.plan;
  const int64_t s = c.s, w = p.u * p.D, row = p.hq * p.D;
  for (int64_t j = 0; j < p.P; ++j) {
    Tensor local =
        o_local.Slice(p.QHead(j, k, t) * p.D, {o_local.numel() - p.QHead(j, k, t) * p.D});
    Tensor slot = packed.Slice(j * s * w, {s * w});
    if (to_local) {
      c.ops->Copy2D(slot, w, local, row, s, w);
    } else {
      c.ops->Copy2D(local, row, slot, w, s, w);
    }
  }
}

}  // namespace

absl::Status UlyssesAttentionForward(const UlyssesContext& c, const QkvWeights& w,
                                     const NormedInput& in, const Tensor& o_local,
                                     const Tensor& lse) {
  const HeadPlan& p = c.plan;
  const DType act = c.ops->act_dtype();
  const int64_t S = c.S(), D = p.D, u = p.u, kvr = p.kvr, stages = p.stages();
  const StageWalk walk{p, c.pipelined()};
  ASSIGN_OR_RETURN(Buffer h,
                   Alloc(c, act, {std::min(in.tile, c.s), in.x.dim(1)}, Tier::kActivations));
  std::vector<Buffer> extra_buffers;
  ASSIGN_OR_RETURN(const AttentionExtras ex,
                   MakeExtras(c, w, nullptr, std::min(in.tile, c.s), &extra_buffers));
  PassBuffers buffers(c.alloc);
  std::vector<KvSet> kv(walk.kv_sets());
  for (KvSet& set : kv) {
    RETURN_IF_ERROR(buffers.MakeEach({&set.k_send, &set.v_send, &set.k, &set.v}, act, {S, kvr, D}));
  }
  // A stage's query heads (sent, received) and its attention output.
  struct QSet {
    Tensor send, q, o;
    Issued q_in;
  };
  std::vector<QSet> qs(walk.q_sets());
  for (QSet& set : qs) {
    RETURN_IF_ERROR(buffers.MakeEach({&set.send, &set.q, &set.o}, act, {S, u, D}));
  }
  // Where outputs come back: a buffer of their own when the next stage's queries are already
  // on their way, else the stage's send buffer (free once its queries have arrived).
  Tensor back_buf;
  if (walk.ahead) {
    ASSIGN_OR_RETURN(back_buf, buffers.Make(act, {S, u, D}));
  }
  ASSIGN_OR_RETURN(RingBuffers ring, MakeRingBuffers(c, &buffers, /*backward=*/false));

  // Projects stage st's queries (and, first in a round, the round's K/V) and starts sending them.
  auto start = [&](int64_t st) -> absl::Status {
    const int64_t r = walk.round(st);
    if (walk.step(st) == 0) {
      KvSet& set = kv[r % kv.size()];
      ProjectForRanks(c, in, h.tensor(), ex,
                      {MakeProjection(c, ex, w, nullptr, 'k', set.k_send),
                       MakeProjection(c, ex, w, nullptr, 'v', set.v_send)},
                      kvr, [&](int64_t j) { return p.KvHead(j, r); });
      ASSIGN_OR_RETURN(set.k_in, StartExchange(c, set.k_send, set.k));
      ASSIGN_OR_RETURN(set.v_in, StartExchange(c, set.v_send, set.v));
    }
    QSet& set = qs[st % qs.size()];
    ProjectForRanks(c, in, h.tensor(), ex, {MakeProjection(c, ex, w, nullptr, 'q', set.send)}, u,
                    [&](int64_t j) { return p.QHead(j, r, walk.step(st)); });
    ASSIGN_OR_RETURN(set.q_in, StartExchange(c, set.send, set.q));
    return absl::OkStatus();
  };
  // Stage outputs come back into their columns of O_local.
  Returning back;
  auto land = [&]() {
    return back.Land([&](int64_t st, const Tensor& t) {
      StageColumns(c, walk.round(st), walk.step(st), o_local, t, /*to_local=*/true);
    });
  };

  RETURN_IF_ERROR(start(0));
  for (int64_t st = 0; st < stages; ++st) {
    QSet& cur = qs[st % qs.size()];
    KvSet& cur_kv = kv[walk.round(st) % kv.size()];
    if (walk.ahead && st + 1 < stages) RETURN_IF_ERROR(start(st + 1));
    RETURN_IF_ERROR(cur_kv.k_in.Wait());
    RETURN_IF_ERROR(cur_kv.v_in.Wait());
    RETURN_IF_ERROR(cur.q_in.Wait());
    RETURN_IF_ERROR(
        StageAttention(c, ring, cur.q, cur_kv.k, cur_kv.v, cur.o, lse.Slice(st * u * S, {u, S})));
    RETURN_IF_ERROR(land());  // the previous stage's output, back while this one computed
    RETURN_IF_ERROR(back.Send(c, st, cur.o, walk.ahead ? back_buf : cur.send));
    if (!walk.ahead) {
      RETURN_IF_ERROR(land());
      if (st + 1 < stages) RETURN_IF_ERROR(start(st + 1));
    }
  }
  return land();
}

absl::Status UlyssesAttentionBackward(const UlyssesContext& c, const QkvWeights& w,
                                      const QkvWeights& g, const NormedInput& in,
                                      const Tensor& o_local, const Tensor& lse,
                                      const Tensor& do_local, const Tensor& dx,
                                      const Tensor& dnorm_w) {
  const HeadPlan& p = c.plan;
  const DType act = c.ops->act_dtype();
  const int64_t S = c.S(), D = p.D, u = p.u, kvr = p.kvr, stages = p.stages();
  const StageWalk walk{p, c.pipelined()};
  const Shape tile_shape = {std::min(in.tile, c.s), in.x.dim(1)};
  ASSIGN_OR_RETURN(Buffer h, Alloc(c, act, tile_shape, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer dh, Alloc(c, act, tile_shape, Tier::kActivations));
  std::vector<Buffer> extra_buffers;
  ASSIGN_OR_RETURN(const AttentionExtras ex, MakeExtras(c, w, &g, tile_shape[0], &extra_buffers));
  PassBuffers buffers(c.alloc);

  // A stage's sends (queries, output, output gradient), what arrives for them, and dQ.
  struct QSet {
    Tensor q_send, o_send, do_send, q, o, dout, dq;
    Issued q_in, o_in, do_in;
  };
  std::vector<QSet> qs(walk.q_sets());
  std::vector<KvSet> kv(walk.kv_sets());
  Tensor back_buf;  // where dQ comes back when stages overlap
  if (walk.ahead) {
    for (QSet& set : qs) {
      RETURN_IF_ERROR(buffers.MakeEach({&set.q_send, &set.o_send, &set.do_send}, act, {S, u, D}));
    }
    for (KvSet& set : kv) {
      RETURN_IF_ERROR(buffers.MakeEach({&set.k_send, &set.v_send}, act, {S, kvr, D}));
    }
    ASSIGN_OR_RETURN(back_buf, buffers.Make(act, {S, u, D}));
  } else {
    // One exchange at a time: every send shares one buffer, and dQ comes back into it too.
    ASSIGN_OR_RETURN(Tensor send, buffers.Make(act, {S, std::max(u, kvr), D}));
    QSet& set = qs[0];
    set.q_send = set.o_send = set.do_send = send.Slice(0, {S, u, D});
    kv[0].k_send = send.Slice(0, {S, kvr, D});
    ASSIGN_OR_RETURN(kv[0].v_send, buffers.Make(act, {S, kvr, D}));
  }
  for (KvSet& set : kv) {
    RETURN_IF_ERROR(buffers.MakeEach({&set.k, &set.v}, act, {S, kvr, D}));
  }
  for (QSet& set : qs) {
    RETURN_IF_ERROR(buffers.MakeEach({&set.q, &set.o, &set.dout, &set.dq}, act, {S, u, D}));
  }
  ASSIGN_OR_RETURN(Tensor dk_sum, buffers.Make(DType::kF32, {S, kvr, D}));
  ASSIGN_OR_RETURN(Tensor dv_sum, buffers.Make(DType::kF32, {S, kvr, D}));
  ASSIGN_OR_RETURN(Tensor dk, buffers.Make(act, {S, kvr, D}));
  ASSIGN_OR_RETURN(Tensor dv, buffers.Make(act, {S, kvr, D}));
  ASSIGN_OR_RETURN(RingBuffers ring, MakeRingBuffers(c, &buffers, /*backward=*/true));

  auto kv_head_of = [&](int64_t r) { return [&p, r](int64_t j) { return p.KvHead(j, r); }; };
  auto q_head_of = [&](int64_t st) {
    return [&p, r = walk.round(st), t = walk.step(st)](int64_t j) { return p.QHead(j, r, t); };
  };
  // Each exchange waits at once when there is no look-ahead: the sends share one buffer.
  auto send = [&](const Tensor& from, const Tensor& to, Issued* arrival) -> absl::Status {
    ASSIGN_OR_RETURN(*arrival, StartExchange(c, from, to));
    return walk.ahead ? absl::OkStatus() : arrival->Wait();
  };
  // Remakes stage st's queries (and, first in a round, the round's K/V) and starts sending them
  // with the stage's output and output gradient.
  auto start = [&](int64_t st) -> absl::Status {
    const int64_t r = walk.round(st), t = walk.step(st);
    if (t == 0) {
      KvSet& set = kv[r % kv.size()];
      ProjectForRanks(c, in, h.tensor(), ex,
                      {MakeProjection(c, ex, w, nullptr, 'k', set.k_send),
                       MakeProjection(c, ex, w, nullptr, 'v', set.v_send)},
                      kvr, kv_head_of(r));
      RETURN_IF_ERROR(send(set.k_send, set.k, &set.k_in));
      RETURN_IF_ERROR(send(set.v_send, set.v, &set.v_in));
    }
    QSet& set = qs[st % qs.size()];
    ProjectForRanks(c, in, h.tensor(), ex, {MakeProjection(c, ex, w, nullptr, 'q', set.q_send)}, u,
                    q_head_of(st));
    RETURN_IF_ERROR(send(set.q_send, set.q, &set.q_in));
    StageColumns(c, r, t, o_local, set.o_send, /*to_local=*/false);
    RETURN_IF_ERROR(send(set.o_send, set.o, &set.o_in));
    StageColumns(c, r, t, do_local, set.do_send, /*to_local=*/false);
    return send(set.do_send, set.dout, &set.do_in);
  };
  // Each stage's dQ comes back to flow into dWq and dx.
  Returning back;
  auto land = [&]() {
    return back.Land([&](int64_t st, const Tensor& t) {
      BackpropForRanks(c, in, h.tensor(), dh.tensor(), ex, {MakeProjection(c, ex, w, &g, 'q', t)},
                       u, q_head_of(st), dx, dnorm_w);
    });
  };

  RETURN_IF_ERROR(start(0));
  for (int64_t st = 0; st < stages; ++st) {
    const int64_t r = walk.round(st);
    QSet& cur = qs[st % qs.size()];
    KvSet& cur_kv = kv[r % kv.size()];
    if (walk.ahead && st + 1 < stages) RETURN_IF_ERROR(start(st + 1));
    if (walk.step(st) == 0) {
      RETURN_IF_ERROR(cur_kv.k_in.Wait());
      RETURN_IF_ERROR(cur_kv.v_in.Wait());
      c.ops->Fill(dk_sum, 0.f);
      c.ops->Fill(dv_sum, 0.f);
    }
    for (Issued* arrival : {&cur.q_in, &cur.o_in, &cur.do_in}) RETURN_IF_ERROR(arrival->Wait());
    RETURN_IF_ERROR(StageAttentionBackward(c, ring, cur.q, cur_kv.k, cur_kv.v, cur.o, cur.dout,
                                           lse.Slice(st * u * S, {u, S}), cur.dq, dk, dv));
    c.ops->Axpy(1.f, dk, dk_sum);
    c.ops->Axpy(1.f, dv, dv_sum);
    RETURN_IF_ERROR(land());  // the previous stage's dQ, back while this one computed
    RETURN_IF_ERROR(back.Send(c, st, cur.dq, walk.ahead ? back_buf : cur.q_send));
    if (!walk.ahead || walk.step(st) + 1 == p.stages_per_round) RETURN_IF_ERROR(land());
    if (walk.step(st) + 1 == p.stages_per_round) {
      // dK, dV summed over the round's stages go back once (as act dtype, like the forward).
      c.ops->Copy(dk_sum, dk);
      RETURN_IF_ERROR(Exchange(c, dk, cur_kv.k_send));
      c.ops->Copy(dv_sum, dv);
      RETURN_IF_ERROR(Exchange(c, dv, cur_kv.v_send));
      BackpropForRanks(c, in, h.tensor(), dh.tensor(), ex,
                       {MakeProjection(c, ex, w, &g, 'k', cur_kv.k_send),
                        MakeProjection(c, ex, w, &g, 'v', cur_kv.v_send)},
                       kvr, kv_head_of(r), dx, dnorm_w);
    }
    if (!walk.ahead && st + 1 < stages) RETURN_IF_ERROR(start(st + 1));
  }
  FinishExtras(c, ex, g);
  return absl::OkStatus();
}

}  // namespace ithaca
