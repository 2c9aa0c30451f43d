// LlamaModel: a single rank's Llama forward + backward over one sample, on any Ops backend.
// Holds the working copy of the weights (params tier) and their gradients (grads tier), one flat
// buffer per unit of ParamLayout. The optimizer (engine/train) owns the f32 master weights.
#pragma once

#include <memory>
#include <vector>

#include "engine/backend/ops.h"
#include "engine/memory/allocator.h"
#include "engine/model/block.h"
#include "engine/model/config.h"
#include "engine/model/params.h"
#include "engine/train/job_spec.h"

namespace ithaca {

struct LossSum {
  double loss_sum = 0;  // Σ of per-token cross-entropy (natural log) over labelled tokens
  int64_t tokens = 0;   // labelled tokens
};

class LlamaModel {
 public:
  struct Options {
    CheckpointPolicy checkpoint = CheckpointPolicy::kFull;
    int64_t tile_tokens = 0;  // MLP tile; 0 = auto
    int64_t loss_tile_tokens = 0;  // LM head + cross-entropy tile; 0 = auto
  };

  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(const LlamaConfig& cfg, Ops* ops,
                                                            Allocator* alloc, Options opts);

  const LlamaConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  Ops* ops() const { return ops_; }
  Allocator* allocator() const { return alloc_; }
  // Working-copy weights (act dtype) and f32 gradients of a unit, flat.
  const Tensor& params(int unit) const { return params_[unit].tensor(); }
  const Tensor& grads(int unit) const { return grads_[unit].tensor(); }
  void ZeroGrads();

  // Forward and backward over one sample of S tokens (host arrays). Gradients of the summed
  // loss times `grad_scale` are accumulated into grads(); returns the loss sum and token count.
  absl::StatusOr<LossSum> ForwardBackward(const int32_t* inputs, const int32_t* labels, int64_t S,
                                          float grad_scale);
  // Forward only (evaluation): the loss sum, no gradients.
  absl::StatusOr<LossSum> Evaluate(const int32_t* inputs, const int32_t* labels, int64_t S);

 private:
  LlamaModel(const LlamaConfig& cfg, Ops* ops, Allocator* alloc, Options opts)
      : cfg_(cfg), layout_(cfg), ops_(ops), alloc_(alloc), opts_(opts) {}
  BlockContext Context(int64_t S) const;
  // The embedding matrix used by the LM head (the embedding itself when tied), and its gradient.
  Tensor LmHead(const std::vector<Buffer>& units) const;
  absl::StatusOr<LossSum> Run(const int32_t* inputs, const int32_t* labels, int64_t S,
                              float grad_scale, bool backward);
  // LM head + cross-entropy over token tiles; with backward, writes dx [S, d] and accumulates the
  // head's gradients.
  absl::StatusOr<LossSum> LossHead(const Tensor& x, const Tensor& labels, float grad_scale,
                                   const Tensor* dx);

  LlamaConfig cfg_;
  ParamLayout layout_;
  Ops* ops_;
  Allocator* alloc_;
  Options opts_;
  std::vector<Buffer> params_;
  std::vector<Buffer> grads_;
  Buffer inv_freq_;
};

}  // namespace ithaca
