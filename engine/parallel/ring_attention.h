// Ring attention across Ulysses groups (parallel.sp = u x r, docs/schedules.md): one UPipe
// stage's attention over the whole sample when the sample is cut into r chunks, one per group.
// Each group's K/V travel around the ring while every group's queries attend to the chunk in hand;
// the pieces' outputs merge by their log-sum-exp, and in the backward the dK/dV accumulators
// travel with their chunk and come home at the end.
#pragma once

#include "engine/backend/ops.h"
#include "engine/core/status.h"
#include "engine/parallel/pass_buffers.h"
#include "engine/parallel/upipe.h"

namespace ithaca {

// Ring attention's buffers for one pass (none without a ring): the K/V (and, backward, the dK/dV
// accumulators) arriving from the previous group while the chunk in hand is used, two sets that
// alternate; a piece's output and log-sum-exp (forward); the f32 accumulators of this group's
// queries (O or dQ) and, per piece of the group's chunk, its rows' log-sum-exp (the running one
// forward, the whole rows' backward: Ops takes a piece's [u, c] rows contiguous).
struct RingBuffers {
  Tensor k[2], v[2];        // act [S, kvr, D]
  Tensor dk[2], dv[2];      // f32 [S, kvr, D] (backward)
  Tensor part_o, part_lse;  // act [S, u, D], f32 [u, S/2] (forward)
  Tensor acc;               // f32 [S, u, D]: O (forward) or dQ (backward)
  Tensor lse[2];            // f32 [u, S/2] per piece
  Tensor dk_part, dv_part;  // act [S, kvr, D] (backward)
};

// Made once per pass in `buffers` (nothing without a ring).
absl::StatusOr<RingBuffers> MakeRingBuffers(const UlyssesContext& c, PassBuffers* buffers,
                                            bool backward);

// One stage's attention over the whole sample: q [S, u, D] (this group's chunk) against k, v
// [S, kvr, D] (this group's), out and lse written. Without a ring, Ops::Attention; with one, the
// K/V travel around the ring (each shift issued before the chunk in hand is used, so it runs
// under that compute), and each (query piece, key piece) pair's output is merged into its query
// piece's by the log-sum-exp.
absl::Status StageAttention(const UlyssesContext& c, RingBuffers& rb, const Tensor& q,
                            const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse);

// Its backward: dq [S, u, D] for this group's queries, and dk, dv [S, kvr, D] for this group's
// keys, written. With a ring each chunk's dK/dV accumulators (f32) travel with its K/V, every
// group adding its queries' part; one last shift brings each chunk's home.
absl::Status StageAttentionBackward(const UlyssesContext& c, RingBuffers& rb, const Tensor& q,
                                    const Tensor& k, const Tensor& v, const Tensor& o,
                                    const Tensor& dout, const Tensor& lse, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv);

}  // namespace ithaca
