#include "engine/parallel/ring_attention.h"

#include <limits>

namespace ithaca {

absl::StatusOr<RingBuffers> MakeRingBuffers(const UlyssesContext& c, PassBuffers* buffers,
                                            bool backward) {
  RingBuffers b;
  if (c.ring == nullptr) return b;
  const DType act = c.ops->act_dtype();
  const int64_t S = c.S(), D = c.plan.D, u = c.plan.u, kvr = c.plan.kvr;
  RETURN_IF_ERROR(buffers->MakeEach({&b.k[0], &b.k[1], &b.v[0], &b.v[1]}, act, {S, kvr, D}));
  ASSIGN_OR_RETURN(b.acc, buffers->Make(DType::kF32, {S, u, D}));
  RETURN_IF_ERROR(buffers->MakeEach({&b.lse[0], &b.lse[1]}, DType::kF32, {u, S / 2}));
  if (backward) {
    RETURN_IF_ERROR(
        buffers->MakeEach({&b.dk[0], &b.dk[1], &b.dv[0], &b.dv[1]}, DType::kF32, {S, kvr, D}));
    RETURN_IF_ERROR(buffers->MakeEach({&b.dk_part, &b.dv_part}, act, {S, kvr, D}));
  } else {
    ASSIGN_OR_RETURN(b.part_o, buffers->Make(act, {S, u, D}));
    ASSIGN_OR_RETURN(b.part_lse, buffers->Make(DType::kF32, {u, S / 2}));
  }
  return b;
}

namespace {

// Ring step i: the chunk in hand came from group (ring_rank − i) mod r; it goes on to the next
// group and the one after it comes from the previous.
int64_t RingSource(const UlyssesContext& c, int64_t i) {
  return (c.ring_rank - i + c.ring_size) % c.ring_size;
}

// Starts sending `a` and `b` on to the next group while what the previous group sends lands in
// `a_next` and `b_next` (every rank of the ring calls it together).
absl::Status StartShift(const UlyssesContext& c, const Tensor& a, const Tensor& a_next,
                        const Tensor& b, const Tensor& b_next, Issued* a_in, Issued* b_in) {
  const int next = static_cast<int>((c.ring_rank + 1) % c.ring_size);
  const int prev = static_cast<int>((c.ring_rank + c.ring_size - 1) % c.ring_size);
  ASSIGN_OR_RETURN(*a_in, c.ring->IssueSendRecv(a, next, a_next, prev));
  ASSIGN_OR_RETURN(*b_in, c.ring->IssueSendRecv(b, next, b_next, prev));
  return absl::OkStatus();
}

// Piece p's columns [p·S/2, (p+1)·S/2) of an lse [u, S] and the contiguous [u, S/2] `piece`:
// from the lse into the piece (to_piece), or back.
void LsePiece(const UlyssesContext& c, const Tensor& lse, int p, const Tensor& piece,
              bool to_piece) {
  const int64_t S = c.S(), half = S / 2, u = c.plan.u;
  const Tensor cols = lse.Slice(p * half, {lse.numel() - p * half});
  if (to_piece) {
    c.ops->Copy2D(cols, S, piece, half, u, half);
  } else {
    c.ops->Copy2D(piece, half, cols, S, u, half);
  }
}

// Calls visit(qp, q_pos, kp, k_pos) for each (query piece, key piece) of this group's chunk and
// group `src`'s whose keys some query sees (a key piece wholly after a query piece is skipped).
template <typename Visit>
void ForEachVisiblePiecePair(const UlyssesContext& c, int64_t src, Visit visit) {
  const int64_t half = c.S() / 2;
  const TokenRuns mine = GroupTokenRuns(c.ring_rank, c.ring_size, half, 0, c.S());
  const TokenRuns theirs = GroupTokenRuns(src, c.ring_size, half, 0, c.S());
  for (int qp = 0; qp < 2; ++qp) {
    for (int kp = 0; kp < 2; ++kp) {
      const int64_t q_pos = mine.run[qp].pos, k_pos = theirs.run[kp].pos;
      if (k_pos > q_pos + half - 1) continue;
      visit(qp, q_pos, kp, k_pos);
    }
  }
}

}  // namespace

absl::Status StageAttention(const UlyssesContext& c, RingBuffers& rb, const Tensor& q,
                            const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse) {
  if (c.ring == nullptr) {
    c.ops->Attention(q, k, v, out, lse, c.docs);
    return absl::OkStatus();
  }
  const int64_t half = c.S() / 2;
  auto rows = [half](const Tensor& t, int p) { return t.Rows(p * half, (p + 1) * half); };
  c.ops->Fill(rb.acc, 0.f);
  for (const Tensor& l : rb.lse) c.ops->Fill(l, -std::numeric_limits<float>::infinity());
  Tensor hand_k = k, hand_v = v;
  for (int64_t i = 0; i < c.ring_size; ++i) {
    Issued k_in, v_in;
    const Tensor& next_k = rb.k[i % 2];
    const Tensor& next_v = rb.v[i % 2];
    if (i + 1 < c.ring_size) {
      RETURN_IF_ERROR(StartShift(c, hand_k, next_k, hand_v, next_v, &k_in, &v_in));
    }
    ForEachVisiblePiecePair(c, RingSource(c, i), [&](int qp, int64_t q_pos, int kp, int64_t k_pos) {
      c.ops->AttentionChunk(rows(q, qp), rows(hand_k, kp), rows(hand_v, kp), rows(rb.part_o, qp),
                            rb.part_lse, c.docs, q_pos, k_pos);
      c.ops->AttentionMerge(rows(rb.acc, qp), rb.lse[qp], rows(rb.part_o, qp), rb.part_lse);
    });
    RETURN_IF_ERROR(k_in.Wait());
    RETURN_IF_ERROR(v_in.Wait());
    hand_k = next_k;
    hand_v = next_v;
  }
  c.ops->Copy(rb.acc, out);
  for (int p = 0; p < 2; ++p) LsePiece(c, lse, p, rb.lse[p], /*to_piece=*/false);
  return absl::OkStatus();
}

absl::Status StageAttentionBackward(const UlyssesContext& c, RingBuffers& rb, const Tensor& q,
                                    const Tensor& k, const Tensor& v, const Tensor& o,
                                    const Tensor& dout, const Tensor& lse, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv) {
  if (c.ring == nullptr) {
    c.ops->AttentionBackward(q, k, v, o, dout, lse, dq, dk, dv, c.docs);
    return absl::OkStatus();
  }
  const int64_t half = c.S() / 2;
  auto rows = [half](const Tensor& t, int p) { return t.Rows(p * half, (p + 1) * half); };
  c.ops->Fill(rb.acc, 0.f);
  for (int p = 0; p < 2; ++p) LsePiece(c, lse, p, rb.lse[p], /*to_piece=*/true);
  Tensor hand_k = k, hand_v = v;
  // The accumulators in hand start at zero (this group is the first to add to its own chunk's).
  Tensor hand_dk = rb.dk[1], hand_dv = rb.dv[1];
  c.ops->Fill(hand_dk, 0.f);
  c.ops->Fill(hand_dv, 0.f);
  for (int64_t i = 0; i < c.ring_size; ++i) {
    const bool last = i + 1 == c.ring_size;
    Issued k_in, v_in;
    const Tensor& next_k = rb.k[i % 2];
    const Tensor& next_v = rb.v[i % 2];
    if (!last) RETURN_IF_ERROR(StartShift(c, hand_k, next_k, hand_v, next_v, &k_in, &v_in));
    ForEachVisiblePiecePair(c, RingSource(c, i), [&](int qp, int64_t q_pos, int kp, int64_t k_pos) {
      // dq's rows of the piece are scratch until the end (the sum is in rb.acc).
      c.ops->AttentionChunkBackward(rows(q, qp), rows(hand_k, kp), rows(hand_v, kp), rows(o, qp),
                                    rows(dout, qp), rb.lse[qp], rows(dq, qp), rows(rb.dk_part, kp),
                                    rows(rb.dv_part, kp), c.docs, q_pos, k_pos);
      c.ops->Axpy(1.f, rows(dq, qp), rows(rb.acc, qp));
      c.ops->Axpy(1.f, rows(rb.dk_part, kp), rows(hand_dk, kp));
      c.ops->Axpy(1.f, rows(rb.dv_part, kp), rows(hand_dv, kp));
    });
    // The accumulators go on with their chunk (after the last step: home to its group).
    const Tensor& next_dk = rb.dk[i % 2];
    const Tensor& next_dv = rb.dv[i % 2];
    Issued dk_in, dv_in;
    RETURN_IF_ERROR(StartShift(c, hand_dk, next_dk, hand_dv, next_dv, &dk_in, &dv_in));
    RETURN_IF_ERROR(dk_in.Wait());
    RETURN_IF_ERROR(dv_in.Wait());
    RETURN_IF_ERROR(k_in.Wait());
    RETURN_IF_ERROR(v_in.Wait());
    hand_k = next_k;
    hand_v = next_v;
    hand_dk = next_dk;
    hand_dv = next_dv;
  }
  c.ops->Copy(rb.acc, dq);
  c.ops->Copy(hand_dk, dk);
  c.ops->Copy(hand_dv, dv);
  return absl::OkStatus();
}

}  // namespace ithaca
