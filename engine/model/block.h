// One Llama transformer block, forward and backward, written against Ops (single rank, whole
// sequence on this rank). Attention-aware and full checkpointing are built from the same pieces:
// forward saves what the policy keeps, backward recomputes the rest.
#pragma once

#include "engine/backend/ops.h"
#include "engine/core/status.h"
#include "engine/memory/allocator.h"
#include "engine/model/config.h"

namespace ithaca {

// Everything a block's backward needs besides its input. Which members are filled depends on
// what forward was asked to keep.
struct BlockSaved {
  Buffer h;      // rmsnorm(x)                                   [S, d]          activations
  Buffer rstd1;  // f32 [S]                                                      activations
  Buffer q, k, v;  // roped q [S, Hq, D], roped k, v [S, Hkv, D]                 attention
  Buffer o;      // attention output [S, Hq, D]                                  attention
  Buffer lse;    // f32 [Hq, S]                                                  attention
  Buffer x2;     // x + o·Woᵀ (the MLP's residual input) [S, d]                  activations
  Buffer h2;     // rmsnorm(x2) [S, d]                                           activations
  Buffer rstd2;  // f32 [S]                                                      activations
};

// Views into one block's flat parameter unit (weights) or gradient unit (same layout).
struct BlockWeights {
  Tensor attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
};
BlockWeights BlockViews(const LlamaConfig& cfg, const Tensor& unit_flat);

struct BlockContext {
  const LlamaConfig* cfg;
  Ops* ops;
  Allocator* alloc;
  Tensor inv_freq;      // RoPE inverse frequencies, f32 [D/2] on the device
  int64_t pos0 = 0;     // global position of the first token
  int64_t tile_tokens;  // MLP tile
};

// y = block(x). Fills `saved` with everything backward needs.
absl::Status BlockForward(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                          const Tensor& y, BlockSaved* saved);

// Given dy (gradient wrt the block's output), writes dx (gradient wrt its input) and accumulates
// the weight gradients into `g`. Consumes `saved` (its buffers are released as soon as they are
// no longer needed). dx may alias dy.
absl::Status BlockBackward(const BlockContext& c, const BlockWeights& w, const BlockWeights& g,
                           const Tensor& x, BlockSaved* saved, const Tensor& dy,
                           const Tensor& dx);

}  // namespace ithaca
