// Attention of one block under Ulysses context parallelism with UPipe headwise stages
// (docs/schedules.md). Each rank holds s = S/P tokens; each stage projects only its heads' Q
// (K/V once per round), exchanges them with one all-to-all so every rank sees the whole sequence
// for its heads, runs causal attention (within each document of a packed sample), and sends the
// output back into its head columns of one preallocated O_local. With P = 1 the same code is
// headwise chunking on one device. Pipelined (UlyssesContext::overlap), every exchange but the
// first and last of a pass is hidden under a stage's attention.
#pragma once

#include "engine/backend/ops.h"
#include "engine/comm/comm.h"
#include "engine/core/status.h"
#include "engine/memory/allocator.h"
#include "engine/parallel/head_plan.h"
#include "engine/parallel/lora.h"
#include "engine/parallel/token_runs.h"

namespace ithaca {

struct UlyssesContext {
  Ops* ops;
  Allocator* alloc;
  Comm* sp;  // the Ulysses group; nullptr when P = 1
  HeadPlan plan;
  int64_t rank = 0;  // rank in the group
  int64_t s = 0;     // tokens on this rank
  // Ring attention across Ulysses groups (parallel.sp = u x r, docs/schedules.md): the sample is
  // cut into r chunks, one per group, in order; `ring` joins the ranks at this rank's place in
  // every group (ring_rank: this group's chunk). Each stage's attention runs on its group's chunk
  // of queries against every chunk of keys as they travel around the ring; nullptr when r = 1.
  Comm* ring = nullptr;
  int64_t ring_rank = 0, ring_size = 1;
  Tensor inv_freq;  // RoPE inverse frequencies, f32 [D/2]
  // The documents of the whole sample (S tokens): every rank's attention sees the whole sequence
  // for its heads, and RoPE restarts at each document, so each rank holds the sample's mask.
  DocumentMask docs;
  // Stage i+1's exchanges run under stage i's attention: its projections are made and sent a
  // stage ahead into a second set of buffers, and stage i's output travels back while stage i+1
  // computes. Only with a group to exchange with (P > 1) and more than one stage; off, each
  // exchange completes before the compute after it, with one set of buffers.
  bool overlap = false;
  // The family's extras (LlamaConfig): q/k/v biases (QkvWeights' bq, bk, bv), the per-head
  // RMSNorm of q and k before RoPE (q_norm, k_norm, with this eps), and YaRN's attention factor,
  // which multiplies every rotated q and k.
  bool qkv_bias = false;
  bool qk_norm = false;
  float qk_norm_eps = 1e-6f;
  float rope_scale = 1.f;
  bool pipelined() const { return overlap && sp != nullptr && plan.P > 1 && plan.stages() > 1; }
  // The tokens of this rank's group: the whole sample without a ring.
  int64_t S() const { return s * plan.P; }
  // This rank's tokens (RankTokenRuns; with a ring, of its group's two pieces of S() / 2).
  TokenRuns RankRuns() const;
};

// The two splits of a sequence-parallel group of u x r ranks, by a member's rank i in it (the
// model makes them in this order; a rehearsal replays them, RehearsalLayout::group_splits): its
// Ulysses group of u consecutive ranks, and its ring, the ranks at i's place in every group.
inline SplitArgs UlyssesGroupSplit(int i, int u) { return SplitArgs{i / u, i % u}; }
inline SplitArgs RingSplit(int i, int u) { return SplitArgs{i % u, i / u}; }

// Projection weights (full, gathered) or their gradients (f32), [heads·D, d] each; with the
// context's qkv_bias the biases [heads·D], with its qk_norm the norms' weights [D].
// With LoRA, the q/k/v adapters (or their gradients) and the scale alpha / rank; a frozen base's
// gradients leave wq, wk, wv (and the biases) empty and only its norms' are kept (scratch).
struct QkvWeights {
  Tensor wq, wk, wv;
  Tensor bq, bk, bv;
  Tensor q_norm, k_norm;
  LoraPair lq, lk, lv;
  float lora_scale = 0;
};

// The attention's input h = rmsnorm(x) · norm_w, made one token tile at a time wherever it is
// needed, so no [s, d] copy of it ever exists (ALST tiling of the norm).
struct NormedInput {
  Tensor x;       // the block input [s, d]
  Tensor norm_w;  // [d]
  Tensor rstd;    // f32 [s]: written by every pass (the same values each time)
  float eps = 1e-5f;
  int64_t tile = 0;  // tokens per tile
};

// x → O_local [s, Hq·D] (written) and lse f32 [stages·u, S] (written; stage i's rows
// [i·u, (i+1)·u) are its heads' log-sum-exp over the whole sequence, for the group's S tokens).
absl::Status UlyssesAttentionForward(const UlyssesContext& c, const QkvWeights& w,
                                     const NormedInput& in, const Tensor& o_local,
                                     const Tensor& lse);

// Given dO_local [s, Hq·D], accumulates dWq/dWk/dWv into `g`, and the gradient that flows back
// through the norm into dx [s, d] and dnorm_w, recomputing the projections and exchanges stage
// by stage (attention forward is not re-run). Norm backward is linear in its incoming gradient,
// so each projection's contribution goes through it tile by tile and no [s, d] dh exists.
absl::Status UlyssesAttentionBackward(const UlyssesContext& c, const QkvWeights& w,
                                      const QkvWeights& g, const NormedInput& in,
                                      const Tensor& o_local, const Tensor& lse,
                                      const Tensor& do_local, const Tensor& dx,
                                      const Tensor& dnorm_w);

}  // namespace ithaca
