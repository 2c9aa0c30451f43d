#include "engine/parallel/upipe.h"

#include <algorithm>

namespace ithaca {
namespace {

absl::StatusOr<Buffer> Alloc(const UlyssesContext& c, DType t, Shape s, Tier tier) {
  return Buffer::Make(c.alloc, t, std::move(s), tier);
}

// Rows [h0·D, (h0+n)·D) of a [heads·D, d] projection weight: heads h0 .. h0+n−1.
Tensor HeadRows(const Tensor& w, int64_t h0, int64_t n, int64_t D) {
  return w.Rows(h0 * D, (h0 + n) * D);
}

// Exchanges equal chunks (one per rank). With one rank the data is already where it belongs.
absl::Status Exchange(const UlyssesContext& c, const Tensor& in, const Tensor& out) {
  if (c.sp == nullptr || c.plan.P == 1) {
    if (in.data != out.data) c.ops->Copy(in, out);
    return absl::OkStatus();
  }
  return c.sp->AllToAll(in, out);
}

// One projection into all-to-all slots (forward) or out of them (backward): rows of `w` for n
// heads per destination rank; `buf` is [P, s, n, D], slot j for rank j's heads.
struct Projection {
  Tensor w;   // [heads·D, d]
  Tensor gw;  // its gradient (backward only)
  Tensor buf;
  bool rope = false;
};

Tensor Slot(const UlyssesContext& c, const Tensor& buf, int64_t j, int64_t n) {
  return buf.Slice(j * c.s * n * c.plan.D, {c.s, n * c.plan.D});
}

// Projects heads for every destination rank straight into its all-to-all slot:
// slot j = (roped) h · W[heads of j]ᵀ for each projection, h made tile by tile into `h_tile`
// once for all of them.
template <typename FirstHead>
void ProjectForRanks(const UlyssesContext& c, const NormedInput& in, const Tensor& h_tile,
                     std::initializer_list<Projection> projections, int64_t n,
                     FirstHead first_head) {
  const int64_t D = c.plan.D, s = c.s;
  for (int64_t t0 = 0; t0 < s; t0 += in.tile) {
    const int64_t t1 = std::min(s, t0 + in.tile);
    const Tensor h = h_tile.Rows(0, t1 - t0);
    c.ops->RmsNorm(in.x.Rows(t0, t1), in.norm_w, in.eps, h, in.rstd.Rows(t0, t1));
    for (const Projection& p : projections) {
      for (int64_t j = 0; j < c.plan.P; ++j) {
        c.ops->Gemm(h, false, HeadRows(p.w, first_head(j), n, D), true,
                    Slot(c, p.buf, j, n).Rows(t0, t1), 1.f, 0.f);
      }
    }
  }
  for (const Projection& p : projections) {
    if (!p.rope) continue;
    for (int64_t j = 0; j < c.plan.P; ++j) {
      c.ops->Rope(Slot(c, p.buf, j, n).Reshaped({s, n, D}), c.pos0(), c.inv_freq, false,
                  DocumentMask{});
    }
  }
}

// The reverse of ProjectForRanks for gradients: each projection's buf holds, in slot j, the
// gradient for this rank's tokens of j's heads. Per token tile: the weight gradient rows
// (dW += slotᵀ · h), then dh = Σ slot · W through the norm's backward into dx and dnorm_w.
template <typename FirstHead>
void BackpropForRanks(const UlyssesContext& c, const NormedInput& in, const Tensor& h_tile,
                      const Tensor& dh_tile, std::initializer_list<Projection> projections,
                      int64_t n, FirstHead first_head, const Tensor& dx, const Tensor& dnorm_w) {
  const int64_t D = c.plan.D, s = c.s;
  for (const Projection& p : projections) {
    if (!p.rope) continue;
    for (int64_t j = 0; j < c.plan.P; ++j) {
      c.ops->Rope(Slot(c, p.buf, j, n).Reshaped({s, n, D}), c.pos0(), c.inv_freq, true,
                  DocumentMask{});
    }
  }
  for (int64_t t0 = 0; t0 < s; t0 += in.tile) {
    const int64_t t1 = std::min(s, t0 + in.tile);
    const Tensor h = h_tile.Rows(0, t1 - t0), dh = dh_tile.Rows(0, t1 - t0);
    c.ops->RmsNorm(in.x.Rows(t0, t1), in.norm_w, in.eps, h, in.rstd.Rows(t0, t1));
    float beta = 0.f;  // the first product writes dh, the others add to it
    for (const Projection& p : projections) {
      for (int64_t j = 0; j < c.plan.P; ++j) {
        const Tensor slot = Slot(c, p.buf, j, n).Rows(t0, t1);
        c.ops->Gemm(slot, true, h, false, HeadRows(p.gw, first_head(j), n, D), 1.f, 1.f);
        c.ops->Gemm(slot, false, HeadRows(p.w, first_head(j), n, D), false, dh, 1.f, beta);
        beta = 1.f;
      }
    }
    c.ops->RmsNormBackward(in.x.Rows(t0, t1), in.norm_w, in.rstd.Rows(t0, t1), dh, dx.Rows(t0, t1),
                           dnorm_w);
  }
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
  const int64_t S = c.S(), D = p.D, u = p.u, kvr = p.kvr;
  ASSIGN_OR_RETURN(Buffer h,
                   Alloc(c, act, {std::min(in.tile, c.s), in.x.dim(1)}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer k_send, Alloc(c, act, {S, kvr, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer v_send, Alloc(c, act, {S, kvr, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer k, Alloc(c, act, {S, kvr, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer v, Alloc(c, act, {S, kvr, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer q_send, Alloc(c, act, {S, u, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer q, Alloc(c, act, {S, u, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer o, Alloc(c, act, {S, u, D}, Tier::kAttention));
  for (int64_t k_round = 0; k_round < p.rounds; ++k_round) {
    auto kv_head = [&](int64_t j) { return p.KvHead(j, k_round); };
    ProjectForRanks(
        c, in, h.tensor(),
        {{w.wk, {}, k_send.tensor(), /*rope=*/true}, {w.wv, {}, v_send.tensor(), /*rope=*/false}},
        kvr, kv_head);
    RETURN_IF_ERROR(Exchange(c, k_send.tensor(), k.tensor()));
    RETURN_IF_ERROR(Exchange(c, v_send.tensor(), v.tensor()));
    for (int64_t t = 0; t < p.stages_per_round; ++t) {
      auto q_head = [&](int64_t j) { return p.QHead(j, k_round, t); };
      ProjectForRanks(c, in, h.tensor(), {{w.wq, {}, q_send.tensor(), /*rope=*/true}}, u, q_head);
      RETURN_IF_ERROR(Exchange(c, q_send.tensor(), q.tensor()));
      const int64_t stage = k_round * p.stages_per_round + t;
      c.ops->Attention(q.tensor(), k.tensor(), v.tensor(), o.tensor(),
                       lse.Slice(stage * u * S, {u, S}), DocumentMask{});
      // Back to this rank's tokens: q_send is free again and takes the returning output.
      RETURN_IF_ERROR(Exchange(c, o.tensor(), q_send.tensor()));
      StageColumns(c, k_round, t, o_local, q_send.tensor(), /*to_local=*/true);
    }
  }
  return absl::OkStatus();
}

absl::Status UlyssesAttentionBackward(const UlyssesContext& c, const QkvWeights& w,
                                      const QkvWeights& g, const NormedInput& in,
                                      const Tensor& o_local, const Tensor& lse,
                                      const Tensor& do_local, const Tensor& dx,
                                      const Tensor& dnorm_w) {
  const HeadPlan& p = c.plan;
  const DType act = c.ops->act_dtype();
  const int64_t S = c.S(), D = p.D, u = p.u, kvr = p.kvr;
  const Shape tile_shape = {std::min(in.tile, c.s), in.x.dim(1)};
  ASSIGN_OR_RETURN(Buffer h, Alloc(c, act, tile_shape, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer dh, Alloc(c, act, tile_shape, Tier::kActivations));

  ASSIGN_OR_RETURN(Buffer send, Alloc(c, act, {S, std::max(u, kvr), D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer v_send, Alloc(c, act, {S, kvr, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer k, Alloc(c, act, {S, kvr, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer v, Alloc(c, act, {S, kvr, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer dk_sum, Alloc(c, DType::kF32, {S, kvr, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer dv_sum, Alloc(c, DType::kF32, {S, kvr, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer q, Alloc(c, act, {S, u, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer o, Alloc(c, act, {S, u, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer dout, Alloc(c, act, {S, u, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer dq, Alloc(c, act, {S, u, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer dk, Alloc(c, act, {S, kvr, D}, Tier::kAttention));
  ASSIGN_OR_RETURN(Buffer dv, Alloc(c, act, {S, kvr, D}, Tier::kAttention));
  const Tensor q_send = send.tensor().Slice(0, {S, u, D});
  const Tensor kv_send = send.tensor().Slice(0, {S, kvr, D});
  for (int64_t k_round = 0; k_round < p.rounds; ++k_round) {
    auto kv_head = [&](int64_t j) { return p.KvHead(j, k_round); };
    ProjectForRanks(c, in, h.tensor(),
                    {{w.wk, {}, kv_send, /*rope=*/true}, {w.wv, {}, v_send.tensor(), false}}, kvr,
                    kv_head);
    RETURN_IF_ERROR(Exchange(c, kv_send, k.tensor()));
    RETURN_IF_ERROR(Exchange(c, v_send.tensor(), v.tensor()));
    c.ops->Fill(dk_sum.tensor(), 0.f);
    c.ops->Fill(dv_sum.tensor(), 0.f);
    for (int64_t t = 0; t < p.stages_per_round; ++t) {
      auto q_head = [&](int64_t j) { return p.QHead(j, k_round, t); };
      ProjectForRanks(c, in, h.tensor(), {{w.wq, {}, q_send, /*rope=*/true}}, u, q_head);
      RETURN_IF_ERROR(Exchange(c, q_send, q.tensor()));
      StageColumns(c, k_round, t, o_local, q_send, /*to_local=*/false);
      RETURN_IF_ERROR(Exchange(c, q_send, o.tensor()));
      StageColumns(c, k_round, t, do_local, q_send, /*to_local=*/false);
      RETURN_IF_ERROR(Exchange(c, q_send, dout.tensor()));
      const int64_t stage = k_round * p.stages_per_round + t;
      c.ops->AttentionBackward(q.tensor(), k.tensor(), v.tensor(), o.tensor(), dout.tensor(),
                               lse.Slice(stage * u * S, {u, S}), dq.tensor(), dk.tensor(),
                               dv.tensor(), DocumentMask{});
      c.ops->Axpy(1.f, dk.tensor(), dk_sum.tensor());
      c.ops->Axpy(1.f, dv.tensor(), dv_sum.tensor());
      RETURN_IF_ERROR(Exchange(c, dq.tensor(), q_send));
      BackpropForRanks(c, in, h.tensor(), dh.tensor(), {{w.wq, g.wq, q_send, /*rope=*/true}}, u,
                       q_head, dx, dnorm_w);
    }
    // dK, dV summed over the round's stages go back once (as act dtype, like the forward).
    c.ops->Copy(dk_sum.tensor(), dk.tensor());
    RETURN_IF_ERROR(Exchange(c, dk.tensor(), kv_send));
    c.ops->Copy(dv_sum.tensor(), dv.tensor());
    RETURN_IF_ERROR(Exchange(c, dv.tensor(), v_send.tensor()));
    BackpropForRanks(c, in, h.tensor(), dh.tensor(),
                     {{w.wk, g.wk, kv_send, /*rope=*/true}, {w.wv, g.wv, v_send.tensor(), false}},
                     kvr, kv_head, dx, dnorm_w);
  }
  return absl::OkStatus();
}

}  // namespace ithaca
