// engine/schedule: how one training step runs the model on one rank. It owns the order of the
// step and every decision that trades memory for time: which FSDP unit is gathered when (one
// block ahead of its use, released after), what each block saves for backward
// (RecomputePolicy, and which block inputs are saved, the others regrown from them:
// RecomputeSchedule), where saved data waits (offload to the host, prefetch one block
// ahead), and the token tiles of the MLP and the loss. It composes the mechanisms of
// engine/parallel (ParamStore, BlockInputStore, Ulysses/UPipe attention) over what engine/model
// describes (LlamaConfig, ParamLayout); neither of those depends on it. The planner
// (engine/plan) replays this schedule on a meta device to measure its memory, and the trainer
// (engine/train) drives it.
//
// LlamaModel: one rank's forward + backward of a Llama over one sample, with those techniques in
// any combination. With one rank and no options it is the plain model (the oracle's shape).
#pragma once

#include <memory>
#include <vector>

#include "engine/backend/ops.h"
#include "engine/comm/comm.h"
#include "engine/memory/allocator.h"
#include "engine/model/config.h"
#include "engine/model/params.h"
#include "engine/parallel/fsdp.h"
#include "engine/parallel/head_plan.h"
#include "engine/parallel/offload.h"
#include "engine/schedule/block.h"
#include "engine/schedule/recompute_schedule.h"
#include "engine/spec/recompute_policy.h"

namespace ithaca {

struct LossSum {
  double loss_sum = 0;  // Σ of per-token cross-entropy (natural log) over this rank's tokens
  int64_t tokens = 0;   // labelled tokens on this rank
};

// This rank's share of one sample on the device: token ids and (shifted) labels, i32 [S/P], and
// the documents of the whole sample (on the host: they steer the ops, not the data).
struct DeviceSample {
  Buffer ids, labels;
  int64_t tokens = 0;  // labelled tokens in the share
  DocumentMask docs;
};

// The loss head's tile (LlamaModel::LossHead) when Options::loss_tile_tokens is 0: about 2^28
// logits (512 MiB in bf16), in whole 128-row GEMM tiles, at most s. Each tile adds its
// dlogitsᵀ·h into the whole [V, d] f32 gradient of E, reading and writing it once; at 2^25
// logits (261 tokens of a 128K vocabulary) those passes, not the multiplications, bounded the
// head.
int64_t DefaultLossTileTokens(int64_t s, int64_t vocab);

class LlamaModel {
 public:
  struct Options {
    RecomputePolicy recompute = RecomputePolicy::kFull;
    // Under kAttentionAware: how many blocks keep O and LSE, the last ones (whose backward comes
    // first); the others recompute fully. -1: every block.
    int64_t attention_aware_blocks = -1;
    int64_t tile_tokens = 0;       // MLP tile; 0 = auto
    int64_t loss_tile_tokens = 0;  // LM head + cross-entropy tile; 0: DefaultLossTileTokens
    int64_t head_chunk = 0;        // UPipe query heads per stage (group-wide); 0 = all heads
    // r of parallel.sp = u × r: Ulysses in groups of u = sp / r consecutive ranks, ring attention
    // across the r groups (ring_attention.h); 1: Ulysses over the whole sp group; 0: RingFor's
    // choice.
    int64_t ring = 0;
    bool offload = false;  // saved block data to the host between forward and backward
    int64_t offload_keep_last = 0;
    bool prefetch = true;  // bring block l−1's saved data back during block l's backward
    int64_t recompute_interval = 1;  // save every k-th block's input; regrow the others
    // > 0: hold at most this many block inputs at once, with the fewest regrowing forwards
    // (RecomputeSchedule::AtMost; recompute_interval is then 1).
    int64_t saved_block_inputs = 0;
    bool fsdp = true;  // shard parameter units over `world`
    // Collectives under compute: FSDP gathers one block ahead and reductions left in flight
    // (ParamStore), UPipe's exchanges double-buffered a stage ahead (upipe.h). Off: every
    // collective completes before the compute after it (the same results, less memory).
    bool overlap = true;
    // memory.param_offload: the working copy's shards live in pinned host memory and each unit
    // is uploaded (then, under FSDP, all-gathered) when its lease starts (ParamStore).
    bool param_offload = false;
  };

  // `world` spans every rank (FSDP and data parallel), `sp` this rank's sequence-parallel group
  // (split into Ulysses groups and rings when Options::ring > 1); either may be nullptr for one
  // rank.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(const LlamaConfig& cfg, Ops* ops,
                                                            Allocator* alloc, Options opts,
                                                            Comm* world = nullptr,
                                                            Comm* sp = nullptr);

  const LlamaConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  const HeadPlan& head_plan() const { return plan_; }
  Ops* ops() const { return ops_; }
  Allocator* allocator() const { return alloc_; }
  ParamStore& params() { return *params_; }
  // Runs the blocks through `blocks` from now on (it outlives the model); nullptr: directly.
  void set_block_runner(BlockRunner* blocks) { blocks_ = blocks ? blocks : &direct_; }
  int64_t sp_rank() const { return sp_ ? sp_->rank() : 0; }
  int64_t sp_size() const { return sp_ ? sp_->size() : 1; }

  // Checks one sample and uploads this rank's share of it: `inputs` and `labels` hold the whole
  // sample (S tokens, labels already shifted; < 0 ignored) and rank r of the P in its
  // sequence-parallel group takes tokens [r·s, (r+1)·s), s = ⌈S/P⌉ (SequenceShare: the last
  // ranks' shares are padded, the pad never attended by a real token nor trained on). `docs` are
  // the sample's documents (attention stays inside each, RoPE restarts at each); empty: one. An
  // upload makes the host wait for its copy.
  absl::StatusOr<DeviceSample> UploadSample(const int32_t* inputs, const int32_t* labels, int64_t S,
                                            const DocumentMask& docs = {});
  // A sample of S tokens that is only its shape, for a device that holds no data (the planner's
  // meta device, engine/plan/meta.h): this rank's share is allocated and uploaded as UploadSample
  // does it, from no host memory, so a replay at any length holds no per-token host arrays
  // (issue 53 R6: 12 bytes a token, 1.5 GB at 2^27). Every token counts as labelled.
  absl::StatusOr<DeviceSample> UploadSampleShape(int64_t S);
  // The same without a host wait, for a training step that streams its samples: the share is
  // written into pinned host buffers (appended to `staging`) and copied to the device on the
  // copy stream, and the compute stream waits for the copy. The host may write the staging
  // buffers only once, so the caller keeps them until it next waits for the device.
  absl::StatusOr<DeviceSample> UploadSampleAsync(const int32_t* inputs, const int32_t* labels,
                                                 int64_t S, const DocumentMask& docs,
                                                 std::vector<Buffer>* staging);
  // Forward and backward over an uploaded share: gradients of the summed loss times
  // `grad_scale` are added to the rank's gradient shards, and the share's loss sum is written
  // into `loss_sum` (f32, one element, on the device). Only enqueues work: the host never
  // waits for the device in here.
  absl::Status ForwardBackward(const DeviceSample& sample, float grad_scale,
                               const Tensor& loss_sum);
  // Both, then reads the loss sum back (the host waits for the work): for tests and tools.
  absl::StatusOr<LossSum> ForwardBackward(const int32_t* inputs, const int32_t* labels, int64_t S,
                                          float grad_scale, const DocumentMask& docs = {});
  // The forward alone, for evaluation: the same schedule (FSDP gathers, Ulysses / UPipe
  // attention, MLP and loss tiles) up to the share's loss sum, written into `loss_sum` as
  // ForwardBackward does. No gradient is computed or touched, nothing is saved for a backward,
  // and the weights are only read. Only enqueues work.
  absl::Status Forward(const DeviceSample& sample, const Tensor& loss_sum);
  // The same, and also writes into `hits` (f32, one element, on the device) how many of the
  // share's labelled tokens are the argmax of their logits (Ops::LabelIsArgmax): the passkey
  // eval's teacher-forced score, with labels only at the answer's positions.
  absl::Status Forward(const DeviceSample& sample, const Tensor& loss_sum, const Tensor& hits);

 private:
  LlamaModel(const LlamaConfig& cfg, Ops* ops, Allocator* alloc, Options opts)
      : cfg_(cfg),
        layout_(cfg),
        ops_(ops),
        alloc_(alloc),
        opts_(opts),
        schedule_(Schedule(cfg, opts)) {}
  // Which block inputs a training step saves and how it regrows the others (every input saved
  // under RecomputePolicy::kNone).
  static RecomputeSchedule Schedule(const LlamaConfig& cfg, const Options& opts);
  // Whether block l keeps its attention's O and LSE for the backward (kAttentionAware, within
  // attention_aware_blocks).
  bool KeepsAttention(int64_t l) const;
  // The blocks' context for a sample of s tokens on this rank; `window`: the sliding window of
  // the blocks that use it (LlamaConfig::LayerWindow), 0 for full causal.
  BlockContext Context(int64_t s, const DocumentMask& docs, int64_t window) const;
  // The pieces of ForwardBackward and Forward (llama.cc). A Step is one step's state between
  // them: the context, the activations and what a training step's forward saves for its backward.
  struct Step;
  // INVALID_ARGUMENT unless the share has as many labels as token ids, and some.
  absl::Status CheckShare(const DeviceSample& sample) const;
  // step->x = the embedding of the share's ids (the first block's input).
  absl::Status Embed(const DeviceSample& sample, Step* step);
  // The blocks' forward, step->x becoming the last block's output; a training step saves what
  // its recompute policy keeps (evaluation saves nothing).
  absl::Status BlocksForward(Step* step);
  // The backward from dx (the loss head's gradient of the last block's output, [s, d]) through
  // every block to the embedding, each unit's gradient reduce-scattered as it completes.
  absl::Status Backward(Step* step, const Tensor& ids, const Tensor& dx);
  // Block l's saved inputs for its backward: taken from the store, or regrown from the nearest
  // held input below it as the schedule says (the regrown ones wait in `regrown`).
  absl::StatusOr<SavedInputs> TakeSaved(Step* step, int64_t l, std::vector<SavedInputs>* regrown);
  // Runs blocks [from, to) forward from the held input of `from` into regrown[to].
  absl::Status Regrow(Step* step, int64_t from, int64_t to, std::vector<SavedInputs>* regrown);
  // Checks a whole sample: S splits over the group, token ids in the vocabulary, documents inside
  // it.
  absl::Status CheckSample(const int32_t* inputs, int64_t S, const DocumentMask& docs) const;
  // This rank's share of s tokens on the device, uploaded from `ids` and `labels` (s each; nullptr
  // where the device reads no host memory: UploadSampleShape).
  absl::StatusOr<DeviceSample> UploadShare(int64_t s, const int32_t* ids, const int32_t* labels);
  // Final norm, LM head and cross-entropy over token tiles, fused with their backward: writes
  // dx [s, d], adds the head's (and tied embedding's) gradients, writes the loss sum into
  // `loss_sum` (device). With `dx` empty only the loss sum (evaluation); with `hits` given, the
  // count of labels that are their row's argmax too.
  absl::Status LossHead(const Tensor& x, const Tensor& labels, float grad_scale, const Tensor& dx,
                        const Tensor& loss_sum, const Tensor& hits = Tensor());

  LlamaConfig cfg_;
  ParamLayout layout_;
  Ops* ops_;
  Allocator* alloc_;
  Options opts_;
  RecomputeSchedule schedule_;
  Comm* world_ = nullptr;
  Comm* sp_ = nullptr;
  // With a ring: this rank's Ulysses group and its ring (sub-communicators of sp_); else the
  // Ulysses group is sp_ itself.
  std::unique_ptr<Comm> ulysses_, ring_;
  HeadPlan plan_;
  std::unique_ptr<ParamStore> params_;
  Buffer inv_freq_;
  BlockRunner direct_;
  BlockRunner* blocks_ = &direct_;
};

}  // namespace ithaca
