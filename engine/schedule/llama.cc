#include "engine/schedule/llama.h"

#include <algorithm>
#include <tuple>

#include "engine/spec/validate.h"

namespace ithaca {
namespace {

// Holds a unit's gathered parameters for a scope and releases them at its end; with LoRA a
// block's lease holds its adapters' unit too (`lora`, -1: none).
class UnitLease {
 public:
  UnitLease(ParamStore* store, int unit, int lora = -1) : store_(store), unit_(unit), lora_(lora) {}
  ~UnitLease() {
    if (!held_) return;
    store_->Release(unit_);
    if (lora_ >= 0) store_->Release(lora_);
  }
  // Starts the gather (it runs under the compute issued until Get).
  absl::Status Start() {
    if (held_) return absl::OkStatus();
    RETURN_IF_ERROR(store_->Gather(unit_));
    if (lora_ >= 0) {
      if (absl::Status st = store_->Gather(lora_); !st.ok()) {
        store_->Release(unit_);
        return st;
      }
    }
    held_ = true;
    return absl::OkStatus();
  }
  // The gathered unit: starts the gather if Start did not, and waits for it.
  absl::StatusOr<Tensor> Get() {
    RETURN_IF_ERROR(Start());
    return store_->Gathered(unit_);
  }
  // A block's weights, with its adapters when it has them.
  absl::StatusOr<BlockWeights> Block(const LlamaConfig& cfg) {
    ASSIGN_OR_RETURN(Tensor params, Get());
    BlockWeights w = BlockViews(cfg, params);
    if (lora_ >= 0) {
      ASSIGN_OR_RETURN(Tensor adapters, store_->Gathered(lora_));
      AddLoraViews(cfg, adapters, &w);
    }
    return w;
  }

 private:
  ParamStore* store_;
  int unit_, lora_;
  bool held_ = false;
};

std::unique_ptr<UnitLease> BlockLease(ParamStore* store, const ParamLayout& layout, int64_t l) {
  return std::make_unique<UnitLease>(store, layout.block_unit(l), layout.lora_unit(l));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const LlamaConfig& cfg, Ops* ops,
                                                               Allocator* alloc, Options opts,
                                                               Comm* world, Comm* sp) {
  RETURN_IF_ERROR(ValidateConfig(cfg));
  if (opts.recompute == RecomputePolicy::kAuto) {
    return absl::InvalidArgumentError(
        "recompute \"auto\" is the planner's to resolve (ResolveJob) before a model is built");
  }
  if (opts.attention_aware_blocks < -1 || opts.attention_aware_blocks > cfg.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention_aware_blocks must be -1 (every block) or 0..", cfg.num_hidden_layers,
        " (the model's layers), got ", opts.attention_aware_blocks));
  }
  std::unique_ptr<LlamaModel> m(new LlamaModel(cfg, ops, alloc, opts));
  m->world_ = world;
  m->sp_ = sp;
  const int64_t sp_size = sp ? sp->size() : 1;
  ASSIGN_OR_RETURN(const int64_t ring, RingFor(cfg, sp_size, opts.ring, opts.head_chunk));
  const int64_t u = sp_size / ring;
  if (ring > 1) {
    // Groups of u consecutive ranks (inside a node) hold consecutive chunks of the sample; the
    // ranks at one place in every group form a ring.
    const SplitArgs ulysses = UlyssesGroupSplit(sp->rank(), static_cast<int>(u));
    const SplitArgs ring_args = RingSplit(sp->rank(), static_cast<int>(u));
    ASSIGN_OR_RETURN(m->ulysses_, sp->Split(ulysses.color, ulysses.key));
    ASSIGN_OR_RETURN(m->ring_, sp->Split(ring_args.color, ring_args.key));
  }
  ASSIGN_OR_RETURN(m->plan_, MakeHeadPlan(cfg, u, opts.head_chunk));
  ASSIGN_OR_RETURN(
      m->params_, ParamStore::Create(m->layout_, ops, alloc, world, opts.fsdp, opts.param_offload));
  m->params_->set_overlap(opts.overlap);
  const std::vector<float> inv = RopeInverseFrequencies(cfg.rope);
  ASSIGN_OR_RETURN(
      m->inv_freq_,
      Buffer::Make(alloc, DType::kF32, {static_cast<int64_t>(inv.size())}, Tier::kActivations));
  ops->Upload(inv.data(), DType::kF32, m->inv_freq_.tensor());
  return m;
}

BlockContext LlamaModel::Context(int64_t s, const DocumentMask& docs, int64_t window) const {
  BlockContext c;
  c.cfg = &cfg_;
  c.attn.ops = ops_;
  c.attn.alloc = alloc_;
  Comm* ulysses = ring_ ? ulysses_.get() : sp_;
  c.attn.sp = plan_.P > 1 ? ulysses : nullptr;
  c.attn.plan = plan_;
  c.attn.rank = ulysses ? ulysses->rank() : 0;
  if (ring_) {
    c.attn.ring = ring_.get();
    c.attn.ring_rank = ring_->rank();
    c.attn.ring_size = ring_->size();
  }
  c.attn.s = s;
  c.attn.inv_freq = inv_freq_.tensor();
  c.attn.docs = docs;
  c.attn.docs.window = window;
  c.attn.overlap = opts_.overlap;
  c.attn.qkv_bias = cfg_.qkv_bias;
  c.attn.qk_norm = cfg_.qk_norm;
  c.attn.qk_norm_eps = static_cast<float>(cfg_.rms_norm_eps);
  c.attn.rope_scale = static_cast<float>(cfg_.rope.AttentionScaling());
  c.tile_tokens = opts_.tile_tokens > 0 ? opts_.tile_tokens : std::min<int64_t>(s, 4096);
  // O and LSE count as attention until a block keeps them with its input (Step::ctx).
  c.saved_attention_tier = Tier::kAttention;
  return c;
}

absl::Status LlamaModel::CheckSample(const int32_t* inputs, int64_t S,
                                     const DocumentMask& docs) const {
  for (int64_t i = 0; i < S; ++i) {
    if (inputs[i] < 0 || inputs[i] >= cfg_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token ", inputs[i], " at position ", i,
                                                     " is outside the vocabulary of ",
                                                     cfg_.vocab_size));
    }
  }
  const std::vector<int64_t>& st = docs.starts;
  for (size_t i = 0; i < st.size(); ++i) {
    const bool ok = i == 0 ? st[0] == 0 : st[i - 1] < st[i] && st[i] < S;
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("document ", i, " of a sample of ", S, " tokens starts at ", st[i],
                       ": document starts must rise strictly from 0 and stay inside the sample"));
    }
  }
  return absl::OkStatus();
}

namespace {

// This rank's share of a sample's tokens (or labels): its runs of positions (RankTokenRuns) of
// the S given, padded past the sample's end with `pad` (SequenceShare).
void CopyShare(const int32_t* from, int64_t S, const TokenRuns& runs, int32_t pad, int32_t* to) {
  for (int i = 0; i < runs.n; ++i) {
    const TokenRun& r = runs.run[i];
    const int64_t real = std::clamp<int64_t>(S - r.pos, 0, r.len);
    std::copy(from + r.pos, from + r.pos + real, to + r.local);
    std::fill(to + r.local + real, to + r.local + r.len, pad);
  }
}

// The labelled tokens of the share.
int64_t CountLabels(const int32_t* labels, int64_t S, const TokenRuns& runs) {
  int64_t n = 0;
  for (int i = 0; i < runs.n; ++i) {
    const TokenRun& r = runs.run[i];
    const int64_t real = std::clamp<int64_t>(S - r.pos, 0, r.len);
    n += std::count_if(labels + r.pos, labels + r.pos + real, [](int32_t v) { return v >= 0; });
  }
  return n;
}

}  // namespace

absl::StatusOr<DeviceSample> LlamaModel::UploadSample(const int32_t* inputs, const int32_t* labels,
                                                      int64_t S, const DocumentMask& docs) {
  RETURN_IF_ERROR(CheckSample(inputs, S, docs));
  // This rank's slice of the sequence (labels were shifted before sharding), padded at the end.
  const int64_t ring = sp_size() / plan_.P, s = SequenceShare(S, sp_size(), ring);
  const TokenRuns runs = RankTokenRuns(sp_rank(), plan_.P, ring, s);
  std::vector<int32_t> ids(static_cast<size_t>(s)), shifted(static_cast<size_t>(s));
  CopyShare(inputs, S, runs, 0, ids.data());
  CopyShare(labels, S, runs, -1, shifted.data());
  ASSIGN_OR_RETURN(DeviceSample out, UploadShare(s, ids.data(), shifted.data()));
  out.tokens = std::count_if(shifted.begin(), shifted.end(), [](int32_t v) { return v >= 0; });
  out.docs = docs;
  return out;
}

absl::StatusOr<DeviceSample> LlamaModel::UploadSampleShape(int64_t S) {
  if (S <= 0) return absl::InvalidArgumentError(absl::StrCat("a sample of ", S, " tokens"));
  const int64_t ring = sp_size() / plan_.P;
  ASSIGN_OR_RETURN(DeviceSample out,
                   UploadShare(SequenceShare(S, sp_size(), ring), nullptr, nullptr));
  out.tokens = out.ids.tensor().numel();
  return out;
}

absl::StatusOr<DeviceSample> LlamaModel::UploadShare(int64_t s, const int32_t* ids,
                                                     const int32_t* labels) {
  DeviceSample out;
  ASSIGN_OR_RETURN(out.ids, Buffer::Make(alloc_, DType::kI32, {s}, Tier::kActivations));
  ASSIGN_OR_RETURN(out.labels, Buffer::Make(alloc_, DType::kI32, {s}, Tier::kActivations));
  ops_->Upload(ids, DType::kI32, out.ids.tensor());
  ops_->Upload(labels, DType::kI32, out.labels.tensor());
  return out;
}

absl::StatusOr<DeviceSample> LlamaModel::UploadSampleAsync(const int32_t* inputs,
                                                           const int32_t* labels, int64_t S,
                                                           const DocumentMask& docs,
                                                           std::vector<Buffer>* staging) {
  RETURN_IF_ERROR(CheckSample(inputs, S, docs));
  // This rank's slice of the sequence (labels were shifted before sharding), padded at the end.
  const int64_t ring = sp_size() / plan_.P, s = SequenceShare(S, sp_size(), ring);
  const TokenRuns runs = RankTokenRuns(sp_rank(), plan_.P, ring, s);
  DeviceSample out;
  ASSIGN_OR_RETURN(out.ids, Buffer::Make(alloc_, DType::kI32, {s}, Tier::kActivations));
  ASSIGN_OR_RETURN(out.labels, Buffer::Make(alloc_, DType::kI32, {s}, Tier::kActivations));
  Ops::Fence fence;
  for (auto [from, pad, to] :
       {std::tuple{inputs, 0, &out.ids}, std::tuple{labels, -1, &out.labels}}) {
    ASSIGN_OR_RETURN(Buffer host, Buffer::Make(alloc_, DType::kI32, {s}, Tier::kHostBlockInputs));
    CopyShare(from, S, runs, pad, static_cast<int32_t*>(host.tensor().data));
    fence = ops_->CopyAsync(host.tensor(), to->tensor());
    staging->push_back(std::move(host));
  }
  ops_->WaitFence(fence);  // transfers complete in order: the last fence covers both
  out.tokens = CountLabels(labels, S, runs);
  out.docs = docs;
  return out;
}

absl::StatusOr<LossSum> LlamaModel::ForwardBackward(const int32_t* inputs, const int32_t* labels,
                                                    int64_t S, float grad_scale,
                                                    const DocumentMask& docs) {
  ASSIGN_OR_RETURN(DeviceSample sample, UploadSample(inputs, labels, S, docs));
  ASSIGN_OR_RETURN(Buffer sum, Buffer::Make(alloc_, DType::kF32, {1}, Tier::kActivations));
  RETURN_IF_ERROR(ForwardBackward(sample, grad_scale, sum.tensor()));
  float host = 0;
  ops_->Download(sum.tensor(), &host, DType::kF32);
  LossSum out;
  out.loss_sum = host;
  out.tokens = sample.tokens;
  return out;
}

bool LlamaModel::KeepsAttention(int64_t l) const {
  if (opts_.recompute != RecomputePolicy::kAttentionAware) return false;
  const int64_t n = opts_.attention_aware_blocks;
  return n < 0 || l >= cfg_.num_hidden_layers - n;
}

RecomputeSchedule LlamaModel::Schedule(const LlamaConfig& cfg, const Options& opts) {
  const int64_t L = cfg.num_hidden_layers;
  if (opts.recompute == RecomputePolicy::kNone) return RecomputeSchedule::Every(L, 1);
  if (opts.saved_block_inputs > 0) return RecomputeSchedule::AtMost(L, opts.saved_block_inputs);
  return RecomputeSchedule::Every(L, opts.recompute_interval);
}

// One step's state between its passes: the blocks' context and activations and, for a training
// step, what the forward keeps for the backward under the recompute policy.
struct LlamaModel::Step {
  Step(const LlamaModel& m, const DeviceSample& sample, bool backward)
      : backward(backward),
        keep_all(backward && m.opts_.recompute == RecomputePolicy::kNone),
        model(m),
        schedule(m.schedule_),
        cfg(m.cfg_),
        full(m.Context(sample.ids.tensor().numel(), sample.docs, 0)),
        windowed(m.cfg_.sliding_window > 0
                     ? m.Context(sample.ids.tensor().numel(), sample.docs, m.cfg_.sliding_window)
                     : BlockContext()),
        saved(m.ops_, m.alloc_, m.cfg_.num_hidden_layers, m.opts_.offload,
              m.opts_.offload_keep_last),
        resident(keep_all ? m.cfg_.num_hidden_layers : 0) {}

  const bool backward;  // a training step (Forward for evaluation saves nothing)
  // Without a backward nothing is saved, whatever the recompute policy.
  const bool keep_all;  // kNone: each block keeps everything it made (`resident`)
  // Whether block l's O and LSE are saved with its input (attention-aware recompute, on the
  // blocks the model's mix gives it).
  bool keep_attention(int64_t l) const { return backward && model.KeepsAttention(l); }
  const LlamaModel& model;
  // Which block inputs the forward saves, and how backward regrows the others.
  const RecomputeSchedule& schedule;
  // Block l's context: `windowed` for the layers with the model's sliding window (every layer of
  // a windowed Mistral; Qwen2/Qwen3's from max_window_layers on), `full` for the others; the O
  // and LSE a block keeps for its backward count with its input (block_inputs).
  BlockContext ctx(int64_t l) const {
    BlockContext c = cfg.LayerWindow(l) > 0 ? windowed : full;
    if (keep_attention(l)) c.saved_attention_tier = Tier::kBlockInputs;
    return c;
  }
  const LlamaConfig& cfg;
  const BlockContext full, windowed;
  Buffer x;  // the activations between blocks: the embedding, then each block's output
  BlockInputStore saved;
  std::vector<BlockSaved> resident;
  // The next block's parameters are gathered one block ahead, under this block's compute. With
  // overlap the loss head's are gathered under the last block's forward too (`head`), and the
  // last block's stay gathered for the first step of backward (`last`).
  std::unique_ptr<UnitLease> next, last;
  std::vector<std::unique_ptr<UnitLease>> head;
};

absl::Status LlamaModel::ForwardBackward(const DeviceSample& sample, float grad_scale,
                                         const Tensor& loss_sum) {
  RETURN_IF_ERROR(CheckShare(sample));
  Step step(*this, sample, /*backward=*/true);
  RETURN_IF_ERROR(Embed(sample, &step));
  RETURN_IF_ERROR(BlocksForward(&step));
  RETURN_IF_ERROR(ops_->status());  // an op's run-time failure (ops.h)
  const int64_t s = sample.ids.tensor().numel(), d = cfg_.hidden_size;
  ASSIGN_OR_RETURN(Buffer dx, Buffer::Make(alloc_, ops_->act_dtype(), {s, d}, Tier::kActivations));
  RETURN_IF_ERROR(
      LossHead(step.x.tensor(), sample.labels.tensor(), grad_scale, dx.tensor(), loss_sum));
  step.head.clear();
  step.x.Reset();
  step.next = std::move(step.last);
  RETURN_IF_ERROR(Backward(&step, sample.ids.tensor(), dx.tensor()));
  RETURN_IF_ERROR(ops_->status());
  // Nothing is left to hide the last reductions under.
  return params_->FlushGradients();
}

absl::Status LlamaModel::Forward(const DeviceSample& sample, const Tensor& loss_sum) {
  return Forward(sample, loss_sum, Tensor());
}

absl::Status LlamaModel::Forward(const DeviceSample& sample, const Tensor& loss_sum,
                                 const Tensor& hits) {
  RETURN_IF_ERROR(CheckShare(sample));
  Step step(*this, sample, /*backward=*/false);
  RETURN_IF_ERROR(Embed(sample, &step));
  RETURN_IF_ERROR(BlocksForward(&step));
  RETURN_IF_ERROR(ops_->status());  // an op's run-time failure (ops.h)
  RETURN_IF_ERROR(LossHead(step.x.tensor(), sample.labels.tensor(), /*grad_scale=*/0.f, Tensor(),
                           loss_sum, hits));
  return ops_->status();
}

absl::Status LlamaModel::CheckShare(const DeviceSample& sample) const {
  const int64_t s = sample.ids.tensor().numel(), labels = sample.labels.tensor().numel();
  if (s == 0 || labels != s) {
    return absl::InvalidArgumentError(absl::StrCat("a sample of ", s, " token ids and ", labels,
                                                   " labels (UploadSample makes it)"));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::Embed(const DeviceSample& sample, Step* step) {
  const Tensor ids = sample.ids.tensor();
  const int embed_unit = layout_.embed_unit();
  ASSIGN_OR_RETURN(step->x, Buffer::Make(alloc_, ops_->act_dtype(), {ids.numel(), cfg_.hidden_size},
                                         Tier::kBlockInputs));
  UnitLease embed(params_.get(), embed_unit);
  ASSIGN_OR_RETURN(Tensor e, embed.Get());
  ops_->Embedding(ids, ParamLayout::View(e, layout_.units()[embed_unit].entries[0]),
                  step->x.tensor());
  return absl::OkStatus();
}

absl::Status LlamaModel::BlocksForward(Step* step) {
  Step& st = *step;
  const int64_t L = cfg_.num_hidden_layers;
  ParamStore& ps = *params_;
  const int64_t s = st.x.tensor().dim(0), d = cfg_.hidden_size;
  for (int64_t l = 0; l < L; ++l) {
    std::unique_ptr<UnitLease> cur = std::move(st.next);
    if (!cur) cur = BlockLease(&ps, layout_, l);
    ASSIGN_OR_RETURN(const BlockWeights w, cur->Block(cfg_));
    if (l + 1 < L) {
      st.next = BlockLease(&ps, layout_, l + 1);
      RETURN_IF_ERROR(st.next->Start());
    } else if (opts_.overlap) {
      for (int unit : {layout_.head_unit(), layout_.embed_unit()}) {
        if (unit == layout_.embed_unit() && !cfg_.tie_word_embeddings) continue;
        st.head.push_back(std::make_unique<UnitLease>(&ps, unit));
        RETURN_IF_ERROR(st.head.back()->Start());
      }
    }
    const Tier y_tier = st.backward && l + 1 < L ? Tier::kBlockInputs : Tier::kActivations;
    ASSIGN_OR_RETURN(Buffer y, Buffer::Make(alloc_, ops_->act_dtype(), {s, d}, y_tier));
    BlockSaved bs;
    const bool saved = st.schedule.saved(l);
    const bool keep_o = st.keep_all || (st.keep_attention(l) && saved);
    RETURN_IF_ERROR(blocks_->Forward(st.ctx(l), w, st.x.tensor(), y.tensor(), &bs, keep_o,
                                     /*keep_mlp_input=*/st.keep_all));
    if (st.backward && saved) {
      SavedInputs in;
      in.x = std::move(st.x);
      if (st.keep_attention(l)) {
        in.o = std::move(bs.o);
        in.lse = std::move(bs.lse);
      }
      if (st.keep_all) st.resident[l] = std::move(bs);
      RETURN_IF_ERROR(st.saved.Put(l, std::move(in)));
    }
    st.x = std::move(y);
    if (st.backward && opts_.overlap && l + 1 == L) st.last = std::move(cur);
  }
  return absl::OkStatus();
}

absl::StatusOr<SavedInputs> LlamaModel::TakeSaved(Step* step, int64_t l,
                                                  std::vector<SavedInputs>* regrown) {
  Step& st = *step;
  const RecomputeSchedule& plan = st.schedule;
  std::vector<SavedInputs>& re = *regrown;
  if (!re[l].x.empty()) return std::move(re[l]);
  const int64_t l0 = plan.group_start(l);
  if (l == l0) return st.saved.Take(l);
  // Regrow from the nearest held input below l, as the schedule splits the way (recompute_
  // schedule.h): each run forward ends at an input that is held until its block's backward.
  auto held = [&](int64_t j) { return j == l0 || !re[j].x.empty(); };
  while (re[l].x.empty()) {
    const RecomputeSchedule::Regrowth r = plan.NextRegrowth(l, held);
    RETURN_IF_ERROR(Regrow(step, r.from, r.to, regrown));
  }
  return std::move(re[l]);
}

absl::Status LlamaModel::Regrow(Step* step, int64_t from, int64_t to,
                                std::vector<SavedInputs>* regrown) {
  Step& st = *step;
  std::vector<SavedInputs>& re = *regrown;
  const int64_t l0 = st.schedule.group_start(from);
  Buffer copy;  // the group's saved input, on the device only while it regrows the next one
  Tensor xm;
  if (from == l0) {
    ASSIGN_OR_RETURN(xm, st.saved.PeekInput(l0, &copy));
  } else {
    xm = re[from].x.tensor();
  }
  const int64_t s = xm.dim(0), d = cfg_.hidden_size;
  Buffer between;  // the input between two blocks of a longer run, held for the next only
  // With overlap, block m+1's gather runs under block m's regrowth.
  auto lease = BlockLease(params_.get(), layout_, from);
  for (int64_t m = from; m < to; ++m) {
    const std::unique_ptr<UnitLease> held = std::move(lease);
    ASSIGN_OR_RETURN(const BlockWeights w, held->Block(cfg_));
    if (m + 1 < to) {
      lease = BlockLease(params_.get(), layout_, m + 1);
      if (opts_.overlap) RETURN_IF_ERROR(lease->Start());
    }
    ASSIGN_OR_RETURN(Buffer y, Buffer::Make(alloc_, ops_->act_dtype(), {s, d}, Tier::kBlockInputs));
    // Attention-aware: the O and LSE of a block whose input is held are kept with it (block
    // l0's are saved with its input by the forward).
    const bool keep_o = st.keep_attention(m) && m == from && from > l0 && re[from].o.empty();
    BlockSaved bs;
    RETURN_IF_ERROR(blocks_->Regrow(st.ctx(m), w, xm, y.tensor(), &bs, keep_o));
    if (keep_o) {
      re[m].o = std::move(bs.o);
      re[m].lse = std::move(bs.lse);
    }
    copy.Reset();
    between = std::move(y);
    xm = between.tensor();
  }
  re[to].x = std::move(between);
  return absl::OkStatus();
}

absl::Status LlamaModel::Backward(Step* step, const Tensor& ids, const Tensor& dx) {
  Step& st = *step;
  const int64_t L = cfg_.num_hidden_layers;
  ParamStore& ps = *params_;
  // Inputs (and, attention-aware, O and LSE) of the blocks between two saved ones, rebuilt by
  // re-running the group's forward from its saved first input when backward reaches the group.
  std::vector<SavedInputs> regrown(L);
  // A frozen base's blocks compute no weight gradient; the norms' go to a scratch.
  const bool frozen = !layout_.units()[layout_.block_unit(0)].trainable;
  Buffer norm_scratch;
  if (frozen) {
    ASSIGN_OR_RETURN(norm_scratch,
                     Buffer::Make(alloc_, DType::kF32, {FrozenNormElements(cfg_)}, Tier::kGrads));
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    std::unique_ptr<UnitLease> cur = std::move(st.next);
    if (!cur) cur = BlockLease(&ps, layout_, l);
    ASSIGN_OR_RETURN(const BlockWeights w, cur->Block(cfg_));
    ASSIGN_OR_RETURN(SavedInputs in, TakeSaved(step, l, &regrown));
    // The previous block's inputs one block ahead (overlap), or only when their turn comes (one
    // fewer [s, d] buffer on the device).
    if (opts_.prefetch) RETURN_IF_ERROR(st.saved.Prefetch(l - 1));
    if (l > 0) {
      st.next = BlockLease(&ps, layout_, l - 1);
      RETURN_IF_ERROR(st.next->Start());
    }
    BlockWeights g;
    if (frozen) {
      g = FrozenBlockGrads(cfg_, norm_scratch.tensor());
    } else {
      ASSIGN_OR_RETURN(Tensor grads, ps.AcquireGrad(layout_.block_unit(l)));
      g = BlockViews(cfg_, grads);
    }
    if (layout_.has_lora()) {
      ASSIGN_OR_RETURN(Tensor lora_grads, ps.AcquireGrad(layout_.lora_unit(l)));
      AddLoraViews(cfg_, lora_grads, &g);
    }
    BlockSaved bs = st.keep_all ? std::move(st.resident[l]) : BlockSaved();
    if (st.keep_attention(l)) {
      bs.o = std::move(in.o);
      bs.lse = std::move(in.lse);
    }
    RETURN_IF_ERROR(blocks_->Recompute(st.ctx(l), w, in.x.tensor(), &bs));
    RETURN_IF_ERROR(blocks_->Backward(st.ctx(l), w, g, in.x.tensor(), &bs, dx));
    if (!frozen) RETURN_IF_ERROR(ps.ReduceGrad(layout_.block_unit(l)));
    if (layout_.has_lora()) RETURN_IF_ERROR(ps.ReduceGrad(layout_.lora_unit(l)));
  }
  const int embed_unit = layout_.embed_unit();
  if (!layout_.units()[embed_unit].trainable) return absl::OkStatus();
  ASSIGN_OR_RETURN(Tensor g, ps.AcquireGrad(embed_unit));
  ops_->EmbeddingBackward(ids, dx, ParamLayout::View(g, layout_.units()[embed_unit].entries[0]));
  return ps.ReduceGrad(embed_unit);
}

int64_t DefaultLossTileTokens(int64_t s, int64_t vocab) {
  constexpr int64_t kLogits = int64_t{1} << 28, kRows = 128;
  return std::min(s, std::max(kRows, kLogits / std::max<int64_t>(1, vocab) / kRows * kRows));
}

absl::Status LlamaModel::LossHead(const Tensor& x, const Tensor& labels, float grad_scale,
                                  const Tensor& dx, const Tensor& loss_sum, const Tensor& hits) {
  const int64_t s = x.dim(0), d = cfg_.hidden_size, V = cfg_.vocab_size;
  const DType act = ops_->act_dtype();
  const int64_t T = opts_.loss_tile_tokens > 0 ? std::min(opts_.loss_tile_tokens, s)
                                               : DefaultLossTileTokens(s, V);
  ParamStore& ps = *params_;
  const int head = layout_.head_unit(), embed = layout_.embed_unit();
  const bool tied = cfg_.tie_word_embeddings;
  const auto& head_entries = layout_.units()[head].entries;
  const ParamEntry& e_entry = tied ? layout_.units()[embed].entries[0] : head_entries[kLmHead];

  UnitLease head_lease(&ps, head), embed_lease(&ps, embed);
  ASSIGN_OR_RETURN(Tensor head_p, head_lease.Get());
  Tensor e_p = head_p;
  if (tied) {
    ASSIGN_OR_RETURN(e_p, embed_lease.Get());
  }
  const Tensor norm_w = ParamLayout::View(head_p, head_entries[kFinalNorm]);
  const Tensor E = ParamLayout::View(e_p, e_entry);
  const bool backward = dx.data != nullptr;  // else evaluation: the losses alone
  Tensor norm_g, dE;
  // A frozen head computes only dx; its norm's gradient goes to a scratch.
  const bool head_grads = backward && layout_.units()[head].trainable;
  Buffer norm_scratch;
  if (backward && !head_grads) {
    ASSIGN_OR_RETURN(norm_scratch, Buffer::Make(alloc_, DType::kF32, {d}, Tier::kGrads));
    norm_g = norm_scratch.tensor();
  }
  if (head_grads) {
    ASSIGN_OR_RETURN(Tensor head_g, ps.AcquireGrad(head));
    Tensor e_g = head_g;
    if (tied) {
      ASSIGN_OR_RETURN(e_g, ps.AcquireGrad(embed));
    }
    norm_g = ParamLayout::View(head_g, head_entries[kFinalNorm]);
    dE = ParamLayout::View(e_g, e_entry);
  }
  ASSIGN_OR_RETURN(Buffer h, Buffer::Make(alloc_, act, {T, d}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer rstd, Buffer::Make(alloc_, DType::kF32, {T}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer logits, Buffer::Make(alloc_, act, {T, V}, Tier::kActivations));
  ASSIGN_OR_RETURN(Buffer losses, Buffer::Make(alloc_, DType::kF32, {s}, Tier::kActivations));
  Buffer dh, row_hits;
  if (backward) {
    ASSIGN_OR_RETURN(dh, Buffer::Make(alloc_, act, {T, d}, Tier::kActivations));
  }
  if (hits.data != nullptr) {
    ASSIGN_OR_RETURN(row_hits, Buffer::Make(alloc_, DType::kF32, {s}, Tier::kActivations));
  }
  for (int64_t t0 = 0; t0 < s; t0 += T) {
    const int64_t t1 = std::min(s, t0 + T), n = t1 - t0;
    const Tensor xt = x.Rows(t0, t1), ht = h.tensor().Rows(0, n);
    const Tensor rt = rstd.tensor().Rows(0, n), lt = logits.tensor().Rows(0, n);
    ops_->RmsNorm(xt, norm_w, static_cast<float>(cfg_.rms_norm_eps), ht, rt);
    ops_->Gemm(ht, false, E, true, lt, 1.f, 0.f);
    // Before CrossEntropy, which overwrites the logits with their gradient.
    if (hits.data != nullptr) {
      ops_->LabelIsArgmax(lt, labels.Rows(t0, t1), row_hits.tensor().Rows(t0, t1));
    }
    ops_->CrossEntropy(lt, labels.Rows(t0, t1), losses.tensor().Rows(t0, t1), lt, grad_scale);
    if (!backward) continue;
    const Tensor dht = dh.tensor().Rows(0, n), dxt = dx.Rows(t0, t1);
    ops_->Gemm(lt, false, E, false, dht, 1.f, 0.f);                 // dh = dlogits · E
    if (head_grads) ops_->Gemm(lt, true, ht, false, dE, 1.f, 1.f);  // dE += dlogitsᵀ · h
    ops_->Fill(dxt, 0.f);
    ops_->RmsNormBackward(xt, norm_w, rt, dht, dxt, norm_g);
  }
  if (head_grads) {
    RETURN_IF_ERROR(ps.ReduceGrad(head));
    if (tied) RETURN_IF_ERROR(ps.ReduceGrad(embed));
  }
  // On the device: the loop reads it once per step, with the gradient norm.
  ops_->SumInto(losses.tensor(), loss_sum);
  if (hits.data != nullptr) ops_->SumInto(row_hits.tensor(), hits);
  return absl::OkStatus();
}

}  // namespace ithaca
