// One Llama transformer block, forward and backward, on one rank of a Ulysses group (the whole
// sequence when P = 1): part of engine/schedule (see llama.h) rather than engine/model because
// its attention is the Ulysses/UPipe exchange of engine/parallel/upipe.h and because what it
// keeps for backward is the recompute policy's decision. The MLP runs over token tiles. The
// recompute policies are built from the same pieces: forward keeps what the policy keeps,
// BlockRecompute rebuilds the rest before backward.
#pragma once

#include "engine/backend/ops.h"
#include "engine/core/status.h"
#include "engine/memory/allocator.h"
#include "engine/model/config.h"
#include "engine/parallel/upipe.h"

namespace ithaca {

// A block's activations that backward needs besides its input x. Empty buffers are recomputed.
// The normed inputs rmsnorm(x) and rmsnorm(x2) are never kept whole: they are remade one token
// tile at a time where they are used, so a block holds at most four [s, d]-sized buffers.
struct BlockSaved {
  Buffer rstd1;  // f32 [s]                                          activations
  Buffer o;      // attention output O_local [s, Hq·D]               attention (or block_inputs)
  Buffer lse;    // f32 [Hq/P, S], stage by stage                    attention (or block_inputs)
  Buffer x2;     // x + O·Woᵀ, the MLP's residual input [s, d]       activations
  Buffer rstd2;  // f32 [s]                                          activations
};

// Views into one block's flat parameter unit (weights) or gradient unit (same layout). With LoRA
// also its adapters' unit (AddLoraViews); a frozen base's gradients (FrozenBlockGrads) have no
// matrices: the backward computes no gradient for them.
struct BlockWeights {
  Tensor attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
  Tensor bq, bk, bv;               // with cfg.qkv_bias (Qwen2); else empty
  Tensor q_norm, k_norm;           // with cfg.qk_norm (Qwen3); else empty
  LoraPair lora[kNumLoraTargets];  // by LoraTarget; empty where a linear has no adapter
  float lora_scale = 0;            // alpha / rank
  QkvWeights qkv() const {
    return {wq,     wk,     wv,           bq,           bk,           bv,
            q_norm, k_norm, lora[kLoraQ], lora[kLoraK], lora[kLoraV], lora_scale};
  }
};
BlockWeights BlockViews(const LlamaConfig& cfg, const Tensor& unit_flat);
// Sets w's adapters to views into one block's LoRA unit (weights or gradients).
void AddLoraViews(const LlamaConfig& cfg, const Tensor& lora_unit_flat, BlockWeights* w);
// The gradients of a frozen block: only its norms' weights, which the ops write, in `norms`
// (f32, FrozenNormElements(cfg), a scratch nothing reads); every other member empty.
int64_t FrozenNormElements(const LlamaConfig& cfg);
BlockWeights FrozenBlockGrads(const LlamaConfig& cfg, const Tensor& norms);

struct BlockContext {
  const LlamaConfig* cfg;
  UlyssesContext attn;  // ops, allocator, Ulysses group, head plan, local tokens, RoPE
  int64_t tile_tokens;  // MLP tile
  Tier saved_attention_tier = Tier::kAttention;  // O and LSE: block_inputs when kept across blocks
  Ops* ops() const { return attn.ops; }
  Allocator* alloc() const { return attn.alloc; }
};

// y = block(x), x and y [s, d]. Fills `saved` with O, LSE and the norms' rstd; without
// `keep_attention_output` O and LSE are freed as soon as the MLP's input has been made from
// them (the recompute rebuilds them). The MLP runs in place on y, so its input x2 is kept
// (a copy) only with `keep_mlp_input` (no recompute).
absl::Status BlockForward(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                          const Tensor& y, BlockSaved* saved, bool keep_attention_output,
                          bool keep_mlp_input);

// Rebuilds the members of `saved` that are empty: o, lse (and rstd1) by re-running the attention
// forward (full recompute; attention-aware keeps them), then x2.
absl::Status BlockRecompute(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                            BlockSaved* saved);

// Turns dy (gradient wrt the block's output) into dx (gradient wrt its input) in place and
// accumulates the weight gradients into `g`. Needs every member of `saved`, and releases them as
// soon as they are no longer needed.
absl::Status BlockBackward(const BlockContext& c, const BlockWeights& w, const BlockWeights& g,
                           const Tensor& x, BlockSaved* saved, const Tensor& dy);

// How a step runs its blocks: the three functions above, unless a replay of the step on the
// planner's meta device (engine/plan/block_tape.h) replays identical blocks from a record.
class BlockRunner {
 public:
  virtual ~BlockRunner() = default;
  virtual absl::Status Forward(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                               const Tensor& y, BlockSaved* saved, bool keep_attention_output,
                               bool keep_mlp_input) {
    return BlockForward(c, w, x, y, saved, keep_attention_output, keep_mlp_input);
  }
  // A forward run again in the backward because the block's input was not held: the same work
  // as Forward (a runner that times the step counts it apart).
  virtual absl::Status Regrow(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                              const Tensor& y, BlockSaved* saved, bool keep_attention_output) {
    return Forward(c, w, x, y, saved, keep_attention_output, /*keep_mlp_input=*/false);
  }
  virtual absl::Status Recompute(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                                 BlockSaved* saved) {
    return BlockRecompute(c, w, x, saved);
  }
  virtual absl::Status Backward(const BlockContext& c, const BlockWeights& w, const BlockWeights& g,
                                const Tensor& x, BlockSaved* saved, const Tensor& dy) {
    return BlockBackward(c, w, g, x, saved, dy);
  }
};

}  // namespace ithaca
