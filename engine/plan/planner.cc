#include "engine/core/ranks_per_host.h"
#include "engine/plan/planner.h"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "engine/plan/block_tape.h"
#include "engine/plan/meta.h"
#include "engine/schedule/spec_options.h"
#include "engine/train/host_adamw.h"
#include "engine/spec/validate.h"
#include "engine/core/units.h"

namespace ithaca {
namespace {

// Workspaces the CUDA backend allocates itself: cuBLASLt's fixed 32 MiB, and the attention
// kernels' of the pass that needs more, for the kernels that run (ChooseAttention, as admission
// resolves them): cuDNN's backward measured on an H200 at 8 bytes per (token × head × head_dim)
// of a stage's query heads (2.16 GB for 32 heads of 64 at 128K tokens), 12 document-masked
// (ragged; 3.24 GB there, 12.95 GB at 512K) plus the f32 [S, heads] statistics CudaOps converts
// the ragged LSE through; the own Hopper backward 4·(D + 2) per (token × head) (1.1 GB at
// 128K). AttentionWorkspaceBytes (engine/backend/attention_choice.h) holds the figures.
//
// A model with full and windowed layers (Qwen2/Qwen3's use_sliding_window) may run a pass on two
// kernels when it is "auto" per shape (train_bench; a job's spec names one kernel per pass): each
// keeps its own workspace, so that pass needs the sum of its kernels' (measured on the H200:
// Qwen2.5-1.5B at 128K, the own backward's 0.82 GB and cuDNN's windowed 1.62 GB held together).
int64_t CudaWorkspaceBytes(const PlanRequest& req, const HeadPlan& heads) {
  const std::vector<AttentionShape> shapes =
      ModelAttentionShapes(req.cfg, req.seq_len, req.document_mask);
  int64_t attention = 0;
  for (auto [pass, asked] : {std::pair{AttentionPass::kForward, req.attention_forward},
                             std::pair{AttentionPass::kBackward, req.attention_backward}}) {
    std::map<AttentionKernel, int64_t> per_kernel;  // the largest use of each kernel that runs
    for (const AttentionShape& shape : shapes) {
      const AttentionKernel kernel = ChooseAttention(pass, shape, asked).kernel;
      per_kernel[kernel] =
          std::max(per_kernel[kernel], AttentionWorkspaceBytes(kernel, pass, shape, heads.u));
    }
    int64_t sum = 0;
    for (const auto& [kernel, bytes] : per_kernel) sum += bytes;
    attention = std::max(attention, sum);
  }
  return (int64_t{32} << 20) + attention;
}

std::vector<int64_t> HeadChunkCandidates(const LlamaConfig& cfg, int64_t sp) {
  std::vector<int64_t> out;
  for (int64_t u = cfg.num_attention_heads; u >= sp; --u) {
    if (MakeHeadPlan(cfg, sp, u).ok()) out.push_back(u);
  }
  return out;
}

std::vector<int64_t> TileCandidates(int64_t s) {
  std::vector<int64_t> out;
  // Below ~2K tokens a tile saves little (its [T, F] buffers are already small next to the
  // [s, d] ones) and costs GEMM efficiency.
  for (int64_t t : {int64_t{16384}, int64_t{8192}, int64_t{4096}, int64_t{2048}}) {
    if (t < s) out.push_back(t);
  }
  out.insert(out.begin(), std::min<int64_t>(s, 16384));
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// `device`: the backend's; on the CPU the "device" is the rank's share of the host's memory.
void Judge(MemoryPlan* p, Device device) {
  p->fits = true;
  p->verdict = "fits";
  const int64_t host = p->host_total();
  if (p->gpu_budget > 0 && p->device_total() > p->gpu_budget) {
    p->fits = false;
    p->verdict = absl::StrCat("needs ", HumanBytes(p->device_total()),
                              device == Device::kCuda
                                  ? " of GPU memory per rank, budget "
                                  : " of memory per rank (the CPU backend's share of the host), "
                                    "budget ",
                              HumanBytes(p->gpu_budget));
  } else if (p->host_budget > 0 && host > p->host_budget) {
    // Name each host tier that holds anything, with its bytes.
    std::string tiers;
    for (int i = 0; i < kNumTiers; ++i) {
      if (IsDeviceTier(static_cast<Tier>(i)) || p->peak[i] == 0) continue;
      absl::StrAppend(&tiers, tiers.empty() ? "" : ", ", TierName(static_cast<Tier>(i)), " ",
                      HumanBytes(p->peak[i]), " (", p->peak[i], " bytes)");
    }
    p->fits = false;
    p->verdict = absl::StrCat("needs ", HumanBytes(host), " of pinned host memory per rank (",
                              tiers, "), budget ", HumanBytes(p->host_budget));
  }
}

// The step around one replayed forward/backward (`clock`): one per sample of the step
// (req.samples), then the update.
// On the device AdamW streams the shards (one elementwise pass, plus the gradient norm's);
// under optimizer offload the CPU AdamW runs on the host while gradients go down and working
// copies up, and with overlap_update it runs under the next step's forward, unit by unit
// ahead of the forward's reads: only the first unit's update and what outlasts the forward
// are exposed (the forward is taken as a third of the forward/backward).
// Counts each block call's compute under its part of the step (StepClock::Phase), running it
// with `inner` (the block tapes, or the blocks themselves).
class PhaseRunner final : public BlockRunner {
 public:
  using Phase = StepClock::Phase;
  PhaseRunner(BlockRunner* inner, StepClock* clock) : inner_(inner), clock_(clock) {}
  absl::Status Forward(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                       const Tensor& y, BlockSaved* saved, bool keep_attention_output,
                       bool keep_mlp_input) override {
    return In(Phase::kForward, [&] {
      return inner_->Forward(c, w, x, y, saved, keep_attention_output, keep_mlp_input);
    });
  }
  absl::Status Regrow(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                      const Tensor& y, BlockSaved* saved, bool keep_attention_output) override {
    return In(Phase::kRegrow,
              [&] { return inner_->Regrow(c, w, x, y, saved, keep_attention_output); });
  }
  absl::Status Recompute(const BlockContext& c, const BlockWeights& w, const Tensor& x,
                         BlockSaved* saved) override {
    return In(Phase::kRecompute, [&] { return inner_->Recompute(c, w, x, saved); });
  }
  absl::Status Backward(const BlockContext& c, const BlockWeights& w, const BlockWeights& g,
                        const Tensor& x, BlockSaved* saved, const Tensor& dy) override {
    return In(Phase::kBackward, [&] { return inner_->Backward(c, w, g, x, saved, dy); });
  }

 private:
  template <typename Run>
  absl::Status In(Phase phase, Run run) {
    clock_->set_phase(phase);
    absl::Status st = run();
    clock_->set_phase(Phase::kOther);
    return st;
  }
  BlockRunner* inner_;
  StepClock* clock_;
};

StepPrediction PredictStep(const PlanRequest& req, const StepClock& clock, ParamStore& ps) {
  const RateTable& t = *req.rates;
  StepPrediction out;
  out.rates = t.device;
  out.rates_note = t.note;
  out.forward_backward_s = clock.end();
  out.gemm_s = clock.busy(StepClock::Work::kGemm);
  out.attention_s = clock.busy(StepClock::Work::kAttention);
  out.elementwise_s = clock.busy(StepClock::Work::kElementwise);
  out.transfer_s = clock.busy(StepClock::Work::kTransfer);
  out.collective_s = clock.busy(StepClock::Work::kCollective);
  out.waited_s = clock.waited();
  out.forward_s = clock.computed_in(StepClock::Phase::kForward);
  out.regrow_s = clock.computed_in(StepClock::Phase::kRegrow);
  out.recompute_s = clock.computed_in(StepClock::Phase::kRecompute);
  // What is trained: every unit, or with LoRA the adapters' alone (a frozen unit has no
  // gradient and no optimizer state).
  int64_t params = 0, first = -1;
  for (int u = 0; u < ps.num_units(); ++u) {
    if (!ps.trainable(u)) continue;
    params += ps.shard_numel(u);
    if (first < 0) first = ps.shard_numel(u);
  }
  first = std::max<int64_t>(first, 0);
  const int64_t act = DTypeSize(req.act);
  // The gradient norm reads every gradient shard once (f32), whatever the update does.
  double update = ElementwiseSeconds(t, ElementwiseOp::kReduce, 4 * params);
  if (!req.optimizer_offload) {
    update += ElementwiseSeconds(t, ElementwiseOp::kAdamW, params * (6 * 4 + 4 + act));
  } else {
    const double host = double(params) / std::max(1.0, t.host_adamw_params_per_s);
    const double bus = TransferSeconds(t, false, 4 * params) +
                       (req.opts.param_offload ? 0 : TransferSeconds(t, true, act * params));
    const double cpu = std::max(host, bus);
    // Under the next forward only where that forward runs elsewhere: on the CPU backend the
    // update and the "device" share the cores.
    if (req.overlap_update && req.device == Device::kCuda) {
      const double head = cpu * double(first) / double(std::max<int64_t>(1, params));
      update += head + std::max(0.0, cpu - head - out.forward_backward_s / 3);
    } else {
      update += cpu;
    }
  }
  out.update_s = update;
  out.samples = std::max<int64_t>(1, req.samples);
  const double samples = double(out.samples);
  out.step_s = samples * out.forward_backward_s + update;
  const double tokens =
      double(req.world / std::max<int64_t>(1, req.sp)) * samples * double(req.seq_len);
  out.tok_per_s = out.step_s > 0 ? tokens / out.step_s : 0;
  return out;
}

}  // namespace

std::vector<AttentionShape> ModelAttentionShapes(const LlamaConfig& cfg, int64_t seq_len,
                                                 bool documents) {
  std::vector<AttentionShape> shapes;
  if (cfg.sliding_window == 0 || cfg.window_first_layer > 0) {
    shapes.push_back({seq_len, cfg.head_dim, documents, 0});
  }
  if (cfg.sliding_window > 0) {
    shapes.push_back({seq_len, cfg.head_dim, documents, cfg.sliding_window});
  }
  return shapes;
}

int64_t MemoryPlan::host_total() const {
  int64_t total = 0;
  for (int i = 0; i < kNumTiers; ++i) {
    if (!IsDeviceTier(static_cast<Tier>(i))) total += peak[i];
  }
  return total;
}

absl::StatusOr<MemoryPlan> PlanMemory(const PlanRequest& req) {
  MetaOps ops(req.device, req.act);
  MetaAllocator alloc(req.device, req.limits);
  // Rank 0's view: its shards are full-size (padding sits on the last rank).
  MetaComm world(0, static_cast<int>(req.world));
  MetaComm sp(0, static_cast<int>(req.sp));
  world.set_splits({{static_cast<int>(req.sp), 1}});
  // With a ring the model splits its group again: Ulysses groups of u, then rings of r.
  ASSIGN_OR_RETURN(const int64_t ring,
                   RingFor(req.cfg, req.sp, req.opts.ring, req.opts.head_chunk));
  const int u = static_cast<int>(req.sp / ring);
  sp.set_splits({{u, 1}, {static_cast<int>(ring), u}});
  StepClock clock;
  if (req.rates != nullptr) {
    for (MetaComm* c : {&world, &sp}) c->set_timing(&req.link, req.ranks_per_node, &clock);
  }
  ASSIGN_OR_RETURN(
      auto model, LlamaModel::Create(req.cfg, &ops, &alloc, req.opts,
                                     req.world > 1 ? &world : nullptr, req.sp > 1 ? &sp : nullptr));
  BlockTapes tapes(&alloc, req.rates != nullptr ? &clock : nullptr);
  BlockRunner blocks;  // the blocks themselves
  PhaseRunner phases(req.block_tapes ? static_cast<BlockRunner*>(&tapes) : &blocks, &clock);
  model->set_block_runner(&phases);
  // The optimizer's f32 master, m and v for every shard, and under optimizer offload two pieces'
  // gradient and working-copy staging (as Optimizer::Allocate allocates them). The working copy
  // itself is the model's (ParamStore: host_params under param_offload).
  std::vector<Buffer> optimizer;
  ParamStore& ps = model->params();
  const Tier tier = req.optimizer_offload ? Tier::kHostOptimizer : Tier::kOptimizer;
  int64_t largest = 0;
  for (int u = 0; u < ps.num_units(); ++u) {
    if (!ps.trainable(u)) continue;  // frozen (LoRA's base): no optimizer state
    largest = std::max(largest, std::min(ps.shard_numel(u), kHostStageElements));
    for (int k = 0; k < 3; ++k) {
      ASSIGN_OR_RETURN(Buffer b, Buffer::Make(&alloc, DType::kF32, {ps.shard_numel(u)}, tier));
      optimizer.push_back(std::move(b));
    }
  }
  if (req.optimizer_offload) {
    for (int k = 0; k < 2; ++k) {
      // The gradient's, and the working copy's unless the CPU writes that in place (on the
      // host already: param_offload).
      for (int kind = 0; kind < (req.opts.param_offload ? 1 : 2); ++kind) {
        const DType d = kind == 0 ? DType::kF32 : req.act;
        ASSIGN_OR_RETURN(Buffer b, Buffer::Make(&alloc, d, {largest}, tier));
        optimizer.push_back(std::move(b));
      }
    }
  }
  if (req.rates != nullptr) ops.set_timing(req.rates, &clock);
  if (req.gemm_log != nullptr) ops.set_gemm_log(req.gemm_log);
  // The sample is its shape only: the meta device reads no tokens, so the replay holds none
  // (LlamaModel::ForwardBackward's upload, step and read-back of the loss, without the S-token
  // host arrays).
  ASSIGN_OR_RETURN(DeviceSample sample, model->UploadSampleShape(req.seq_len));
  ASSIGN_OR_RETURN(Buffer loss_sum, Buffer::Make(&alloc, DType::kF32, {1}, Tier::kActivations));
  RETURN_IF_ERROR(model->ForwardBackward(sample, 1.f, loss_sum.tensor()));
  float loss = 0;
  ops.Download(loss_sum.tensor(), &loss, DType::kF32);
  MemoryPlan p;
  if (req.rates != nullptr) p.predicted = PredictStep(req, clock, ps);
  p.block_calls_replayed = tapes.replayed();
  const MemoryTracker& t = alloc.tracker();
  for (int i = 0; i < kNumTiers; ++i) {
    p.peak[i] = t.peak(static_cast<Tier>(i));
    p.at_peak[i] = t.at_device_peak(static_cast<Tier>(i));
  }
  p.device_peak = t.device_peak();
  p.workspace = req.device == Device::kCuda ? CudaWorkspaceBytes(req, model->head_plan()) : 0;
  p.peak[static_cast<int>(Tier::kWorkspace)] += p.workspace;
  p.device_reserved = alloc.device_reserved() + p.workspace;
  p.head_chunk = req.opts.head_chunk > 0 ? req.opts.head_chunk : req.cfg.num_attention_heads;
  p.tile_tokens = req.opts.tile_tokens;
  p.offload = req.opts.offload;
  p.offload_keep_last = req.opts.offload ? req.opts.offload_keep_last : 0;
  p.prefetch = req.opts.prefetch;
  p.recompute_interval = req.opts.recompute_interval;
  p.saved_block_inputs = req.opts.saved_block_inputs;
  p.overlap = req.opts.overlap;
  p.optimizer_offload = req.optimizer_offload;
  p.param_offload = req.opts.param_offload;
  p.recompute = req.opts.recompute;
  p.attention_aware_blocks =
      req.opts.recompute == RecomputePolicy::kAttentionAware ? req.opts.attention_aware_blocks : -1;
  return p;
}

bool FitMemo::KnownNotToFit(const std::string& config, int64_t seq_len) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fails_from_.find(config);
  return it != fails_from_.end() && it->second <= seq_len;
}

void FitMemo::RecordNotFit(const std::string& config, int64_t seq_len) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, added] = fails_from_.emplace(config, seq_len);
  if (!added) it->second = std::min(it->second, seq_len);
}

std::string FitMemo::LastFit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_fit_;
}

void FitMemo::RecordFit(const std::string& config) {
  std::lock_guard<std::mutex> lock(mu_);
  last_fit_ = config;
}

absl::StatusOr<MemoryPlan> PlanJob(const JobSpec& spec, int64_t gpu_budget, int64_t host_budget,
                                   const PlanLimits& limits, const PlanHardware& hardware) {
  ASSIGN_OR_RETURN(LlamaConfig cfg, ResolveModelConfig(spec));
  if (gpu_budget == 0) gpu_budget = static_cast<int64_t>(spec.memory.gpu_budget_gib * kGiB);
  if (host_budget == 0) host_budget = static_cast<int64_t>(spec.memory.host_budget_gib * kGiB);
  PlanRequest req;
  req.cfg = cfg;
  req.world = spec.parallel.world;
  req.sp = spec.parallel.sp;
  req.seq_len = spec.data.seq_len;
  req.document_mask = spec.data.document_mask;
  for (auto [name, kernel] :
       {std::pair{&spec.kernels.attention_forward, &req.attention_forward},
        std::pair{&spec.kernels.attention_backward, &req.attention_backward}}) {
    ASSIGN_OR_RETURN(*kernel, ParseAttentionKernel(*name));
  }
  req.device = spec.backend == "cuda" ? Device::kCuda : Device::kCpu;
  req.limits = limits;
  const std::string dtype =
      spec.model.dtype == "auto" ? BackendDtype(spec.backend) : spec.model.dtype;
  req.act = dtype == "bf16" ? DType::kBF16 : DType::kF32;
  req.opts = ModelOptionsFromSpec(spec);
  req.rates = limits.first_fit            ? nullptr
              : hardware.rates != nullptr ? hardware.rates
                                          : &DefaultRateTable(req.device, hardware.gpu_name);
  if (!hardware.link.name.empty()) {
    req.link = hardware.link;
  } else {
    ASSIGN_OR_RETURN(req.link, LinkPreset(req.device == Device::kCuda ? "h200-sxm" : "zero"));
  }
  req.ranks_per_node = hardware.ranks_per_node > 0
                           ? hardware.ranks_per_node
                           : RanksPerHost(spec.parallel.world, spec.slurm.nodes);
  req.samples = spec.training.grad_accum * spec.data.micro_batch;
  req.overlap_update = spec.memory.overlap_update;
  // UPipe's stages split the heads of one Ulysses group (u of sp = u x ring).
  ASSIGN_OR_RETURN(const int64_t ring,
                   RingFor(cfg, spec.parallel.sp, spec.parallel.ring, spec.memory.head_chunk));
  const int64_t s = SequenceShare(spec.data.seq_len, std::max<int64_t>(1, spec.parallel.sp), ring);
  const int64_t L = cfg.num_hidden_layers;

  const std::vector<int64_t> chunks = spec.memory.head_chunk > 0
                                          ? std::vector<int64_t>{spec.memory.head_chunk}
                                          : HeadChunkCandidates(cfg, spec.parallel.sp / ring);
  const std::vector<int64_t> tiles = spec.memory.tile_tokens > 0
                                         ? std::vector<int64_t>{spec.memory.tile_tokens}
                                         : TileCandidates(s);
  // The recompute policies to try: the spec's, or under "auto" none, attention-aware (on as
  // many of the last blocks as fit, the others full) and full.
  const JobSpec::Memory& m = spec.memory;
  const bool auto_policy = m.recompute == RecomputePolicy::kAuto;
  std::vector<RecomputePolicy> policies =
      auto_policy
          ? std::vector<RecomputePolicy>{RecomputePolicy::kNone, RecomputePolicy::kAttentionAware,
                                         RecomputePolicy::kFull}
          : std::vector<RecomputePolicy>{m.recompute};
  // Whether anything fits: full recompute holds the least of the three (on the device and on the
  // host), so under "auto" when it does not fit, nothing does.
  if (limits.first_fit && auto_policy) policies = {RecomputePolicy::kFull};
  // How saved block data is kept and communication overlapped: the spec's own choice (an
  // "auto" offload off, prefetch and overlap on, every block's input saved), then the same
  // without overlap, then offload with prefetch, offload without it, and saving only every 2nd,
  // 4th or 8th block's input (all without overlap: its buffers are the first to give up); last,
  // on the device alone, holding at most 8, 6, 5, 4, 3 or 2 block inputs at once (each fewer costs
  // more regrowing forwards): where the host has no room for them either. Only the keys left
  // "auto" are changed: a value the user set is every plan's (issue 54 U3).
  struct Keep {
    bool offload, prefetch;
    int64_t interval;
    bool overlap;
    int64_t saved = 0;
    int64_t keep_last = 0;  // under offload: the last blocks whose saved data stays on the device
    bool operator==(const Keep& o) const {
      return offload == o.offload && prefetch == o.prefetch && interval == o.interval &&
             overlap == o.overlap && saved == o.saved && keep_last == o.keep_last;
    }
  };
  auto free_or = [](OffloadChoice c, bool v) {
    return c == OffloadChoice::kAuto || (c == OffloadChoice::kOn) == v;
  };
  const bool prefetch0 = m.prefetch != OffloadChoice::kOff;
  const bool auto_keep_last = m.offload_keep_last < 0;
  // The splits between device and host auto tries: the last L/2, L/2 - L/16, ... blocks' data
  // kept on the device (most first).
  std::vector<int64_t> splits;
  for (int64_t kept = L / 2, step = std::max<int64_t>(1, L / 16); kept > 0; kept -= step) {
    splits.push_back(kept);
  }
  const int64_t keep_last0 = auto_keep_last ? 0 : m.offload_keep_last;
  const Keep spec_way = {m.offload == OffloadChoice::kOn,
                         prefetch0,
                         m.recompute_interval > 0 ? m.recompute_interval : 1,
                         m.overlap != OffloadChoice::kOff,
                         m.saved_block_inputs,
                         keep_last0};
  auto allowed = [&](const Keep& k) {
    return free_or(m.offload, k.offload) && (!k.offload || free_or(m.prefetch, k.prefetch)) &&
           free_or(m.overlap, k.overlap) &&
           (m.recompute_interval == 0 || m.recompute_interval == k.interval) &&
           (k.saved == m.saved_block_inputs ||
            (m.saved_block_inputs == 0 && m.recompute_interval == 0)) &&
           (auto_keep_last || k.keep_last == m.offload_keep_last);
  };
  auto keeps_for = [&](RecomputePolicy policy) {
    std::vector<Keep> candidates = {spec_way, spec_way};
    candidates[1].overlap = false;
    if (policy != RecomputePolicy::kNone) {
      for (Keep k : {Keep{true, true, 1, true}, Keep{true, true, 1, false},
                     Keep{true, false, 1, false}, Keep{true, false, 2, false},
                     Keep{true, false, 4, false}, Keep{true, false, 8, false}}) {
        // Where the host cannot hold every block's input, the device's room beside it: the
        // last blocks' data kept there (L/2 down to L/16 of them, in steps of L/16) saves
        // every input before any is saved only every k-th block. Tried ahead of keeping none
        // (more device memory, fewer forwards run again), under prefetch without overlap:
        // overlap's buffers are the first to give up, and without prefetch each block's
        // input arrives late.
        if (auto_keep_last && k.interval == 1 && k.prefetch && !k.overlap) {
          for (int64_t kept : splits) {
            Keep split = k;
            split.keep_last = kept;
            candidates.push_back(split);
          }
        }
        k.keep_last = keep_last0;
        candidates.push_back(k);
      }
      for (int64_t n : {8, 6, 5, 4, 3, 2}) {
        if (n < L) candidates.push_back({false, prefetch0, 1, false, n, keep_last0});
      }
    }
    std::vector<Keep> keeps = {spec_way};
    for (const Keep& k : candidates) {
      if (allowed(k) && std::find(keeps.begin(), keeps.end(), k) == keeps.end()) {
        keeps.push_back(k);
      }
    }
    if (limits.first_fit) {
      // Whether anything fits: overlap and prefetch only add buffers to a way of keeping block
      // data that is also tried without them (and the splits between device and host are
      // tried under prefetch alone).
      keeps.erase(
          std::remove_if(keeps.begin() + 1, keeps.end(),
                         [](const Keep& k) { return k.overlap || (k.offload && k.prefetch); }),
          keeps.end());
    }
    return keeps;
  };

  absl::StatusOr<MemoryPlan> smallest = absl::InvalidArgumentError("no configuration planned");
  auto plan = [&](const Keep& keep, int64_t chunk, int64_t tile) -> absl::StatusOr<MemoryPlan> {
    req.opts.head_chunk = chunk;
    req.opts.tile_tokens = tile;
    req.opts.offload = keep.offload;
    req.opts.prefetch = keep.prefetch;
    req.opts.recompute_interval = keep.interval;
    req.opts.saved_block_inputs = keep.saved;
    req.opts.overlap = keep.overlap;
    req.opts.offload_keep_last = keep.keep_last;  // (read only under offload)
    ASSIGN_OR_RETURN(MemoryPlan p, PlanMemory(req));
    p.gpu_budget = gpu_budget;
    p.host_budget = host_budget;
    Judge(&p, req.device);
    if (!smallest.ok() || p.device_total() < smallest->device_total()) smallest = p;
    return p;
  };
  // The optimizer's state on the device, on the host, and the working copy there too, as the
  // spec allows ("auto": each way).
  auto choices = [](OffloadChoice c) {
    return c == OffloadChoice::kAuto ? std::vector<bool>{false, true}
                                     : std::vector<bool>{c == OffloadChoice::kOn};
  };
  std::vector<std::pair<bool, bool>> offloads;  // (optimizer, params)
  for (bool opt : choices(m.optimizer_offload)) {
    for (bool params : choices(m.param_offload)) {
      if (!params || opt) offloads.push_back({opt, params});
    }
  }
  if (offloads.empty()) {
    return absl::InvalidArgumentError(
        "memory.param_offload = true needs memory.optimizer_offload = true (or \"auto\")");
  }
  // Whether anything fits: the state on the host first (it frees the most device memory).
  if (limits.first_fit) std::reverse(offloads.begin(), offloads.end());
  // State moves to the host only where that is predicted faster by PlanCost's margin, or is the
  // only way that fits.
  std::optional<MemoryPlan> best;
  auto consider = [&](const MemoryPlan& p) {
    if (!best || PlanCost(p) < PlanCost(*best)) best = p;
  };
  // A first-fit configuration, as FitMemo keeps it.
  auto config_key = [&](RecomputePolicy policy, const Keep& keep) {
    return absl::StrCat(int(policy), "/", keep.offload, keep.prefetch, keep.overlap, "/",
                        keep.interval, "/", keep.saved, "/", keep.keep_last, "/",
                        req.optimizer_offload, req.opts.param_offload, "/",
                        req.opts.attention_aware_blocks, "/", chunks.back(), "/", tiles.back());
  };
  if (limits.first_fit && limits.fit_memo != nullptr) {
    // The configuration that fit the last length asked first: when it fits, one replay answers.
    const std::string last = limits.fit_memo->LastFit();
    for (auto [offload, params] : offloads) {
      req.optimizer_offload = offload;
      req.opts.param_offload = params;
      for (RecomputePolicy policy : policies) {
        req.opts.recompute = policy;
        if (policy == RecomputePolicy::kAttentionAware) {
          if (auto_policy) continue;  // first-fit searches only full under "auto"
          req.opts.attention_aware_blocks = m.attention_aware_blocks;  // as the search below
        }
        for (const Keep& keep : keeps_for(policy)) {
          if (last.empty() || config_key(policy, keep) != last) continue;
          ASSIGN_OR_RETURN(MemoryPlan p, plan(keep, chunks.back(), tiles.back()));
          if (p.fits) return p;
        }
      }
    }
  }
  for (auto [offload, params] : offloads) {
    req.optimizer_offload = offload;
    req.opts.param_offload = params;
    for (RecomputePolicy policy : policies) {
      req.opts.recompute = policy;
      std::optional<bool> some_split_may_fit;
      for (const Keep& keep : keeps_for(policy)) {
        if (keep.offload && keep.keep_last > 0 && auto_keep_last) {
          // The splits between device and host: the one keeping the fewest blocks on the
          // device needs the least device memory of them, the one keeping the most the least
          // host memory. Where the first's most frugal settings do not fit the device or the
          // second's do not fit the host, no split fits: two replays instead of one a split (at
          // millions of tokens a replay takes up to a second).
          if (!some_split_may_fit) {
            if (policy == RecomputePolicy::kAttentionAware) {
              req.opts.attention_aware_blocks = auto_policy ? 0 : m.attention_aware_blocks;
            }
            Keep fewest = keep, most = keep;
            fewest.keep_last = splits.back();
            most.keep_last = splits.front();
            ASSIGN_OR_RETURN(MemoryPlan f, plan(fewest, chunks.back(), tiles.back()));
            ASSIGN_OR_RETURN(MemoryPlan h, plan(most, chunks.back(), tiles.back()));
            some_split_may_fit = (f.gpu_budget <= 0 || f.device_total() <= f.gpu_budget) &&
                                 (h.host_budget <= 0 || h.host_total() <= h.host_budget);
          }
          if (!*some_split_may_fit) continue;
        }
        // Smaller stages and tiles never need more memory: when the most frugal settings do not
        // fit, no others with this way of keeping block data do.
        if (policy == RecomputePolicy::kAttentionAware && auto_policy) {
          // As many attention-aware blocks as fit (memory grows with them), the last ones.
          req.opts.attention_aware_blocks = 0;
          ASSIGN_OR_RETURN(MemoryPlan none_kept, plan(keep, chunks.back(), tiles.back()));
          if (!none_kept.fits) continue;
          int64_t lo = 0, hi = L;  // lo fits
          while (lo < hi) {
            const int64_t mid = (lo + hi + 1) / 2;
            req.opts.attention_aware_blocks = mid;
            ASSIGN_OR_RETURN(MemoryPlan p, plan(keep, chunks.back(), tiles.back()));
            if (p.fits) {
              lo = mid;
            } else {
              hi = mid - 1;
            }
          }
          if (lo == 0) continue;  // that is full recompute, tried on its own
          req.opts.attention_aware_blocks = lo == L ? -1 : lo;
        } else {
          if (policy == RecomputePolicy::kAttentionAware) {
            req.opts.attention_aware_blocks = m.attention_aware_blocks;
          }
          // A configuration an earlier, shorter first-fit plan found too big is too big here.
          const std::string config = config_key(policy, keep);
          if (limits.fit_memo != nullptr && limits.fit_memo->KnownNotToFit(config, req.seq_len)) {
            continue;
          }
          ASSIGN_OR_RETURN(MemoryPlan frugal, plan(keep, chunks.back(), tiles.back()));
          if (!frugal.fits && limits.fit_memo != nullptr) {
            limits.fit_memo->RecordNotFit(config, req.seq_len);
          }
          if (!frugal.fits) continue;
          if (limits.first_fit) {
            if (limits.fit_memo != nullptr) limits.fit_memo->RecordFit(config);
            return frugal;
          }
        }
        // The largest head stage, then tile, that fits this way of keeping block data: smaller
        // stages and tiles never need more memory, so each is a binary search (the frugal
        // corner fits).
        auto first_fit = [&](size_t n, auto fits_at) -> absl::StatusOr<size_t> {
          size_t lo = 0, hi = n - 1;  // the answer is in [lo, hi]; n - 1 fits
          while (lo < hi) {
            const size_t mid = (lo + hi) / 2;
            ASSIGN_OR_RETURN(bool fits, fits_at(mid));
            if (fits) {
              hi = mid;
            } else {
              lo = mid + 1;
            }
          }
          return lo;
        };
        ASSIGN_OR_RETURN(size_t c, first_fit(chunks.size(), [&](size_t i) -> absl::StatusOr<bool> {
                           ASSIGN_OR_RETURN(MemoryPlan p, plan(keep, chunks[i], tiles.back()));
                           return p.fits;
                         }));
        ASSIGN_OR_RETURN(size_t t, first_fit(tiles.size(), [&](size_t i) -> absl::StatusOr<bool> {
                           ASSIGN_OR_RETURN(MemoryPlan p, plan(keep, chunks[c], tiles[i]));
                           return p.fits;
                         }));
        ASSIGN_OR_RETURN(MemoryPlan p, plan(keep, chunks[c], tiles[t]));
        if (p.fits) consider(p);
        // The ways after this one keep block data more cheaply in memory and dearly in time;
        // with nothing left to gain in stage, tile or attention-aware blocks, none is faster.
        const bool whole =
            c == 0 && t == 0 &&
            (policy != RecomputePolicy::kAttentionAware || req.opts.attention_aware_blocks < 0);
        if (p.fits && whole) break;
      }
    }
  }
  if (best) return *best;
  if (!smallest.ok() && limits.fit_memo != nullptr) {
    // Every configuration was known too big from a shorter length: no replay was needed.
    MemoryPlan p;
    p.gpu_budget = gpu_budget;
    p.host_budget = host_budget;
    p.fits = false;
    p.verdict = "no configuration fits: each was too big at a shorter data.seq_len already";
    return p;
  }
  return smallest;
}

double PlanCost(const MemoryPlan& p) {
  constexpr double kOffloadGain = 0.03;  // per tier moved
  const int moved = int(p.optimizer_offload) + int(p.param_offload);
  return p.predicted.step_s * (1 + kOffloadGain * moved);
}

}  // namespace ithaca
