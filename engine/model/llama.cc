#include "engine/model/llama.h"

#include <algorithm>

namespace ithaca {

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const LlamaConfig& cfg, Ops* ops,
                                                                Allocator* alloc, Options opts) {
  RETURN_IF_ERROR(ValidateConfig(cfg));
  std::unique_ptr<LlamaModel> m(new LlamaModel(cfg, ops, alloc, opts));
  for (const ParamUnit& u : m->layout_.units()) {
    ASSIGN_OR_RETURN(Buffer p, Buffer::Make(alloc, ops->act_dtype(), {u.numel}, Tier::kParams));
    ASSIGN_OR_RETURN(Buffer g, Buffer::Make(alloc, DType::kF32, {u.numel}, Tier::kGrads));
    ops->Fill(p.tensor(), 0.f);
    m->params_.push_back(std::move(p));
    m->grads_.push_back(std::move(g));
  }
  m->ZeroGrads();
  const std::vector<float> inv = RopeInverseFrequencies(cfg.rope);
  ASSIGN_OR_RETURN(m->inv_freq_, Buffer::Make(alloc, DType::kF32, {static_cast<int64_t>(inv.size())},
                                              Tier::kActivations));
  ops->Upload(inv.data(), DType::kF32, m->inv_freq_.tensor());
  return m;
}

void LlamaModel::ZeroGrads() {
  for (Buffer& g : grads_) ops_->Fill(g.tensor(), 0.f);
}

BlockContext LlamaModel::Context(int64_t S) const {
  int64_t tile = opts_.tile_tokens > 0 ? opts_.tile_tokens : std::min<int64_t>(S, 4096);
  return BlockContext{&cfg_, ops_, alloc_, inv_freq_.tensor(), 0, tile};
}

Tensor LlamaModel::LmHead(const std::vector<Buffer>& units) const {
  const auto& head = layout_.units()[layout_.head_unit()];
  if (cfg_.tie_word_embeddings) {
    const auto& e = layout_.units()[layout_.embed_unit()].entries[0];
    return ParamLayout::View(units[layout_.embed_unit()].tensor(), e);
  }
  return ParamLayout::View(units[layout_.head_unit()].tensor(), head.entries[kLmHead]);
}

absl::StatusOr<LossSum> LlamaModel::ForwardBackward(const int32_t* inputs, const int32_t* labels,
                                                    int64_t S, float grad_scale) {
  return Run(inputs, labels, S, grad_scale, /*backward=*/true);
}

absl::StatusOr<LossSum> LlamaModel::Evaluate(const int32_t* inputs, const int32_t* labels,
                                             int64_t S) {
  return Run(inputs, labels, S, 0.f, /*backward=*/false);
}

absl::StatusOr<LossSum> LlamaModel::Run(const int32_t* inputs, const int32_t* labels, int64_t S,
                                        float grad_scale, bool backward) {
  const int64_t d = cfg_.hidden_size, L = cfg_.num_hidden_layers;
  const DType act = ops_->act_dtype();
  for (int64_t i = 0; i < S; ++i) {
    if (inputs[i] < 0 || inputs[i] >= cfg_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token ", inputs[i], " at position ", i,
                                                     " is outside the vocabulary of ",
                                                     cfg_.vocab_size));
    }
  }
  ASSIGN_OR_RETURN(Buffer ids, Buffer::Make(alloc_, DType::kI32, {S}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer lab, Buffer::Make(alloc_, DType::kI32, {S}, Tier::kActivations));
  ops_->Upload(inputs, DType::kI32, ids.tensor());
  ops_->Upload(labels, DType::kI32, lab.tensor());

  // xs[l] is block l's input (kept: the checkpoints tier); xs[L] the last block's output.
  std::vector<Buffer> xs(L + 1);
  for (int64_t l = 0; l <= L; ++l) {
    ASSIGN_OR_RETURN(xs[l], Buffer::Make(alloc_, act, {S, d},
                                         l < L ? Tier::kCheckpoints : Tier::kActivations));
  }
  const Tensor embed = ParamLayout::View(params(layout_.embed_unit()),
                                         layout_.units()[layout_.embed_unit()].entries[0]);
  ops_->Embedding(ids.tensor(), embed, xs[0].tensor());

  const BlockContext ctx = Context(S);
  const bool keep = opts_.checkpoint == CheckpointPolicy::kNone && backward;
  std::vector<BlockSaved> saved(L);
  for (int64_t l = 0; l < L; ++l) {
    const BlockWeights w = BlockViews(cfg_, params(layout_.block_unit(l)));
    BlockSaved scratch;
    RETURN_IF_ERROR(BlockForward(ctx, w, xs[l].tensor(), xs[l + 1].tensor(),
                                 keep ? &saved[l] : &scratch));
  }

  const int64_t labelled = std::count_if(labels, labels + S, [](int32_t v) { return v >= 0; });
  if (!backward) {
    ASSIGN_OR_RETURN(LossSum loss, LossHead(xs[L].tensor(), lab.tensor(), 0.f, nullptr));
    loss.tokens = labelled;
    return loss;
  }
  ASSIGN_OR_RETURN(Buffer dx, Buffer::Make(alloc_, act, {S, d}, Tier::kActivations));
  ASSIGN_OR_RETURN(LossSum loss, LossHead(xs[L].tensor(), lab.tensor(), grad_scale, &dx.tensor()));
  loss.tokens = labelled;
  xs[L].Reset();

  for (int64_t l = L - 1; l >= 0; --l) {
    const BlockWeights w = BlockViews(cfg_, params(layout_.block_unit(l)));
    const BlockWeights g = BlockViews(cfg_, grads(layout_.block_unit(l)));
    if (!keep) {
      // Full checkpointing: rebuild the block's activations from its saved input.
      ASSIGN_OR_RETURN(Buffer y, Buffer::Make(alloc_, act, {S, d}, Tier::kActivations));
      RETURN_IF_ERROR(BlockForward(ctx, w, xs[l].tensor(), y.tensor(), &saved[l]));
    }
    RETURN_IF_ERROR(BlockBackward(ctx, w, g, xs[l].tensor(), &saved[l], dx.tensor(), dx.tensor()));
    xs[l].Reset();
  }
  const Tensor dembed = ParamLayout::View(grads(layout_.embed_unit()),
                                          layout_.units()[layout_.embed_unit()].entries[0]);
  ops_->EmbeddingBackward(ids.tensor(), dx.tensor(), dembed);
  return loss;
}

absl::StatusOr<LossSum> LlamaModel::LossHead(const Tensor& x, const Tensor& labels,
                                             float grad_scale, const Tensor* dx) {
  const int64_t S = x.dim(0), d = cfg_.hidden_size, V = cfg_.vocab_size;
  const DType act = ops_->act_dtype();
  // The [T, V] logits tile is the largest transient buffer: keep it near 32M elements.
  const int64_t T = opts_.loss_tile_tokens > 0
                        ? std::min(opts_.loss_tile_tokens, S)
                        : std::min<int64_t>(S, std::max<int64_t>(16, (int64_t{1} << 25) / V));
  const int head = layout_.head_unit();
  const Tensor norm_w = ParamLayout::View(params(head), layout_.units()[head].entries[kFinalNorm]);
  const Tensor norm_g = ParamLayout::View(grads(head), layout_.units()[head].entries[kFinalNorm]);
  const Tensor E = LmHead(params_);
  const Tensor dE = LmHead(grads_);
  ASSIGN_OR_RETURN(Buffer h, Buffer::Make(alloc_, act, {T, d}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer rstd, Buffer::Make(alloc_, DType::kF32, {T}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer logits, Buffer::Make(alloc_, act, {T, V}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer losses, Buffer::Make(alloc_, DType::kF32, {S}, Tier::kActivations));
  Buffer dh;
  if (dx) {
    ASSIGN_OR_RETURN(dh, Buffer::Make(alloc_, act, {T, d}, Tier::kActivations));
  }
  for (int64_t t0 = 0; t0 < S; t0 += T) {
    const int64_t t1 = std::min(S, t0 + T), n = t1 - t0;
    const Tensor xt = x.Rows(t0, t1), ht = h.tensor().Rows(0, n);
    const Tensor rt = rstd.tensor().Rows(0, n), lt = logits.tensor().Rows(0, n);
    ops_->RmsNorm(xt, norm_w, static_cast<float>(cfg_.rms_norm_eps), ht, rt);
    ops_->Gemm(ht, false, E, true, lt, 1.f, 0.f);
    ops_->CrossEntropy(lt, labels.Rows(t0, t1), losses.tensor().Rows(t0, t1), lt, grad_scale);
    if (!dx) continue;
    const Tensor dht = dh.tensor().Rows(0, n), dxt = dx->Rows(t0, t1);
    ops_->Gemm(lt, false, E, false, dht, 1.f, 0.f);  // dh = dlogits · E
    ops_->Gemm(lt, true, ht, false, dE, 1.f, 1.f);   // dE += dlogitsᵀ · h
    ops_->Fill(dxt, 0.f);
    ops_->RmsNormBackward(xt, norm_w, rt, dht, dxt, norm_g);
  }
  LossSum out;
  out.loss_sum = ops_->Sum(losses.tensor());
  return out;
}

}  // namespace ithaca
