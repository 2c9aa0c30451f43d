// The planner against the allocator: a real CPU step's measured per-tier peaks equal the plan's,
// the attention tier shrinks with the head chunk, offload moves the saved block inputs to the host,
// and the Llama-3-8B / 8 GPU / 3M-token plan has the shape of docs/benchmarks.md.
#include "engine/plan/planner.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/cpu_ops.h"
#include "engine/model/weights.h"
#include "engine/train/optimizer.h"
#include "gtest/gtest.h"
#include "engine/core/units.h"

namespace ithaca {
namespace {

LlamaConfig Tiny() {
  LlamaConfig cfg = *PresetConfig("tiny");
  cfg.num_attention_heads = 8;
  cfg.num_key_value_heads = 2;
  cfg.head_dim = 8;
  cfg.rope.head_dim = 8;
  cfg.num_hidden_layers = 3;
  return cfg;
}

// Peaks measured by really running one step with these options on the CPU backend.
MemoryTracker* Measure(const LlamaConfig& cfg, const LlamaModel::Options& opts, int64_t S,
                       HostAllocator* alloc, const DocumentMask& docs = {},
                       bool optimizer_offload = false) {
  CpuOps ops;
  auto model = LlamaModel::Create(cfg, &ops, alloc, opts);
  EXPECT_TRUE(model.ok()) << model.status();
  const ParamLayout& layout = (*model)->layout();
  JobSpec::Training hp;
  auto opt = Optimizer::Create(
      model->get(),
      [&](int u) -> absl::StatusOr<std::vector<float>> { return RandomUnitWeights(layout, u, 1); },
      hp, optimizer_offload);
  EXPECT_TRUE(opt.ok()) << opt.status();
  std::vector<int32_t> tokens(S);
  for (int64_t i = 0; i < S; ++i) tokens[i] = (i * 7) % cfg.vocab_size;
  auto loss = (*model)->ForwardBackward(tokens.data(), tokens.data(), S, 1.f / S, docs);
  EXPECT_TRUE(loss.ok()) << loss.status();
  return &alloc->tracker();
}

void ExpectPlanMatches(const LlamaModel::Options& opts, int64_t S,
                       const LlamaConfig& cfg = Tiny()) {
  HostAllocator alloc;
  const MemoryTracker* measured = Measure(cfg, opts, S, &alloc);
  PlanRequest req;
  req.cfg = cfg;
  req.seq_len = S;
  req.opts = opts;
  auto plan = PlanMemory(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int i = 0; i < kNumTiers; ++i) {
    const double m = measured->peak(static_cast<Tier>(i)), p = plan->peak[i];
    EXPECT_NEAR(p, m, 0.05 * m + 1) << TierName(static_cast<Tier>(i));
  }
  EXPECT_NEAR(plan->device_peak, measured->device_peak(), 0.05 * measured->device_peak());
}

TEST(PlannerTest, MatchesTheAllocatorForEveryTechnique) {
  LlamaModel::Options o;
  o.recompute = RecomputePolicy::kNone;
  ExpectPlanMatches(o, 64);
  o.recompute = RecomputePolicy::kFull;
  o.tile_tokens = 16;
  ExpectPlanMatches(o, 64);
  o.recompute = RecomputePolicy::kAttentionAware;
  o.head_chunk = 2;
  ExpectPlanMatches(o, 96);
  o.offload = true;
  o.offload_keep_last = 1;
  ExpectPlanMatches(o, 96);
}

// Qwen2's biases and Qwen3's q/k norms (with their scratch in the attention passes) and
// Mistral's window: the plan still matches the allocator, and the parameter tiers hold exactly
// the family's extra parameters.
TEST(PlannerTest, FamiliesMatchTheAllocatorAndCountTheirParameters) {
  LlamaConfig qwen2 = Tiny(), qwen3 = Tiny(), mistral = Tiny();
  qwen2.family = ModelFamily::kQwen2;
  qwen2.qkv_bias = true;
  qwen3.family = ModelFamily::kQwen3;
  qwen3.qk_norm = true;
  qwen3.head_dim = qwen3.rope.head_dim = 12;
  qwen3.rope.type = RopeType::kYarn;
  qwen3.rope.attention_factor = 1.1;
  mistral.family = ModelFamily::kMistral;
  mistral.sliding_window = 16;
  LlamaModel::Options o;
  o.recompute = RecomputePolicy::kAttentionAware;
  o.head_chunk = 2;
  o.tile_tokens = 16;
  for (const LlamaConfig& cfg : {qwen2, qwen3, mistral}) {
    SCOPED_TRACE(ModelTypeName(cfg.family));
    ExpectPlanMatches(o, 64, cfg);
  }
  auto params = [&](const LlamaConfig& cfg) {
    PlanRequest req;
    req.cfg = cfg;
    req.seq_len = 64;
    req.opts = o;
    return PlanMemory(req)->peak[static_cast<int>(Tier::kParams)];
  };
  const int64_t llama = params(Tiny());
  const int64_t biases = (8 + 2 * 2) * 8 * 3;  // (Hq + 2 Hkv) · D per layer, 3 layers
  // f32 working weights on the CPU: 4 bytes each.
  EXPECT_EQ(params(qwen2) - llama, 4 * biases);
  EXPECT_EQ(params(mistral), llama);
  EXPECT_EQ(qwen2.NumParameters() - Tiny().NumParameters(), biases);
}

// Qwen2's window on some layers with "auto" kernels per shape (train_bench): at 128K and head_dim
// 128 the full layers' backward is the own Hopper kernel and the windowed layers' cuDNN's band,
// and each keeps its workspace, so the backward needs both (measured on the H200 at 2.469 GB,
// bench/results/2026-12-02-s12-train-qwen2-window-layers.jsonl); with one kernel named, one.
TEST(PlannerTest, APassOnTwoKernelsNeedsBothWorkspaces) {
  PlanRequest req;
  req.cfg = *PresetConfig("qwen2.5-1.5b");
  req.cfg.sliding_window = 4096;
  req.cfg.window_first_layer = 14;
  req.seq_len = 131072;
  req.device = Device::kCuda;
  req.act = DType::kBF16;
  req.opts.recompute = RecomputePolicy::kAttentionAware;
  req.opts.tile_tokens = 16384;
  const int64_t heads = req.cfg.num_attention_heads;
  const AttentionShape full{req.seq_len, 128, false, 0}, windowed{req.seq_len, 128, false, 4096};
  ASSERT_EQ(ChooseAttention(AttentionPass::kBackward, full, AttentionKernel::kAuto).kernel,
            AttentionKernel::kHopper);
  ASSERT_EQ(ChooseAttention(AttentionPass::kBackward, windowed, AttentionKernel::kAuto).kernel,
            AttentionKernel::kCudnn);
  const int64_t hopper =
      AttentionWorkspaceBytes(AttentionKernel::kHopper, AttentionPass::kBackward, full, heads);
  const int64_t cudnn =
      AttentionWorkspaceBytes(AttentionKernel::kCudnn, AttentionPass::kBackward, windowed, heads);
  auto plan = PlanMemory(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->workspace, (int64_t{32} << 20) + hopper + cudnn);
  EXPECT_NEAR(double(plan->workspace), 2469398848.0, 0.01 * 2469398848.0);  // the H200's
  req.attention_backward = AttentionKernel::kHopper;  // one kernel for both shapes
  plan = PlanMemory(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->workspace, (int64_t{32} << 20) + hopper);
}

int64_t AttentionPeak(int64_t head_chunk, bool measured) {
  LlamaModel::Options o;
  o.recompute = RecomputePolicy::kFull;
  o.head_chunk = head_chunk;
  if (measured) {
    HostAllocator alloc;
    return Measure(Tiny(), o, 128, &alloc)->peak(Tier::kAttention);
  }
  PlanRequest req;
  req.cfg = Tiny();
  req.seq_len = 128;
  req.opts = o;
  return PlanMemory(req)->peak[static_cast<int>(Tier::kAttention)];
}

TEST(PlannerTest, AttentionTierShrinksWithHeadChunk) {
  int64_t prev_plan = 0, prev_meas = 0;
  for (int64_t chunk : {8, 4, 2, 1}) {
    const int64_t plan = AttentionPeak(chunk, false), meas = AttentionPeak(chunk, true);
    EXPECT_NEAR(plan, meas, 0.05 * meas) << "head_chunk " << chunk;
    if (prev_plan) {
      EXPECT_LT(plan, prev_plan) << "head_chunk " << chunk;
      EXPECT_LT(meas, prev_meas) << "head_chunk " << chunk;
    }
    prev_plan = plan;
    prev_meas = meas;
  }
}

TEST(PlannerTest, OffloadMovesCheckpointsToTheHost) {
  LlamaModel::Options o;
  o.recompute = RecomputePolicy::kAttentionAware;
  HostAllocator a1, a2;
  const int64_t on_device = Measure(Tiny(), o, 96, &a1)->peak(Tier::kBlockInputs);
  o.offload = true;
  const MemoryTracker* off = Measure(Tiny(), o, 96, &a2);
  EXPECT_GT(off->peak(Tier::kHostBlockInputs), 0);
  // At most two blocks' saved data are on the device at once (the one in backward and the one
  // prefetched), instead of all three.
  EXPECT_LT(off->peak(Tier::kBlockInputs), on_device);
  EXPECT_GE(off->peak(Tier::kHostBlockInputs), on_device / 3);
}

TEST(PlannerTest, Llama8BOnEightGpusAt3MTokensHasTheShapeOfTheReference) {
  JobSpec spec;
  spec.backend = "cuda";
  spec.model.preset = "llama-3-8b";
  spec.data.seq_len = 3 * 1024 * 1024;
  spec.parallel.world = 8;
  spec.parallel.sp = 8;
  spec.memory.recompute = RecomputePolicy::kFull;
  spec.memory.offload = OffloadChoice::kOn;
  spec.memory.tile_tokens = 8192;
  spec.memory.head_chunk = 32;                // plain Ulysses: all heads in one stage
  spec.memory.overlap = OffloadChoice::kOff;  // the reference schedule: every collective blocking
  auto ulysses = PlanJob(spec, int64_t{80} << 30);
  ASSERT_TRUE(ulysses.ok()) << ulysses.status();
  spec.memory.head_chunk = 8;  // UPipe: one head per rank per stage
  auto upipe = PlanJob(spec, int64_t{80} << 30);
  ASSERT_TRUE(upipe.ok()) << upipe.status();
  std::printf("Ulysses:\n%sUPipe:\n%s", FormatPlan(*ulysses).c_str(), FormatPlan(*upipe).c_str());
  auto gib = [](const MemoryPlan& p, Tier t) { return p.peak[static_cast<int>(t)] / kGiB; };
  // Model states: 16 bytes per parameter over 8 ranks ≈ 15 GiB (docs/benchmarks.md: 15.4 GiB).
  const double model =
      gib(*upipe, Tier::kParams) + gib(*upipe, Tier::kGrads) + gib(*upipe, Tier::kOptimizer);
  EXPECT_GT(model, 14.0);
  EXPECT_LT(model, 20.0);
  // UPipe shrinks attention well below plain Ulysses (reference: 37.5 → 19.5 GiB).
  EXPECT_LT(gib(*upipe, Tier::kAttention), 0.7 * gib(*ulysses, Tier::kAttention));
  EXPECT_GT(gib(*ulysses, Tier::kAttention), 15.0);
  EXPECT_TRUE(upipe->fits) << upipe->verdict;

  // Overlap costs UPipe a second set of stage buffers (forward: 3 [S, u, D] buffers become 7;
  // backward: 5 become 15), still well below plain Ulysses, and the grads tier one full-size
  // f32 block unit (the reduction left in flight).
  spec.memory.overlap = OffloadChoice::kOn;
  auto overlapped = PlanJob(spec, int64_t{80} << 30);
  ASSERT_TRUE(overlapped.ok()) << overlapped.status();
  std::printf("UPipe with overlap:\n%s", FormatPlan(*overlapped).c_str());
  const double stage_gib = 3.0 * 1024 * 1024 * 1 * 128 * 2 / kGiB;  // [S, u = 1, D] in bf16
  EXPECT_GT(gib(*overlapped, Tier::kAttention), gib(*upipe, Tier::kAttention) + 5 * stage_gib);
  EXPECT_LT(gib(*overlapped, Tier::kAttention), gib(*ulysses, Tier::kAttention));
  const double unit_gib = 218.1e6 * 4 / kGiB;  // one Llama-3-8B block, f32
  EXPECT_NEAR(gib(*overlapped, Tier::kGrads), gib(*upipe, Tier::kGrads) + unit_gib, 0.1);
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// The memory bars of docs/benchmarks.md as the planner sees them: Llama-3.2-1B at 3M tokens on one
// H200 (139 GiB) with a 128 GiB host, and GPU memory growing by at most 20 KB per extra token.
TEST(PlannerTest, Llama1BAt3MTokensFitsOneH200AndGrowsUnder20KBPerToken) {
  JobSpec spec;
  spec.backend = "cuda";
  spec.model.preset = "llama-3.2-1b";
  spec.memory.recompute = RecomputePolicy::kFull;
  spec.memory.offload = OffloadChoice::kOn;
  spec.memory.prefetch = OffloadChoice::kOff;
  spec.memory.recompute_interval = 2;
  spec.memory.head_chunk = 1;
  spec.memory.tile_tokens = 8192;
  auto plan_at = [&](int64_t tokens) {
    spec.data.seq_len = tokens;
    auto p = PlanJob(spec, int64_t{139} << 30, int64_t{120} << 30);
    EXPECT_TRUE(p.ok()) << p.status();
    return *p;
  };
  const MemoryPlan at2m = plan_at(int64_t{2} << 20), at3m = plan_at(int64_t{3} << 20);
  std::printf("Llama-3.2-1B at 3M tokens:\n%s", FormatPlan(at3m).c_str());
  EXPECT_TRUE(at3m.fits) << at3m.verdict;
  const double per_token = double(at3m.device_total() - at2m.device_total()) / (1 << 20);
  std::printf("GPU memory growth: %.1f KiB per token\n", per_token / 1024);
  EXPECT_LE(per_token, 20 * 1024);
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// "auto" resolves to the fastest settings that fit: everything at full width when memory is
// plentiful, head stages / offload / sparser saved block inputs as the budget tightens.
// Packed documents shrink the attention's work, not its memory: every buffer is sized by S, so
// a step over many documents peaks exactly where one over a single document does, and the plan
// (which knows nothing of documents) holds for both.
TEST(PlannerTest, DocumentMasksChangeNoMemory) {
  const LlamaConfig cfg = Tiny();
  LlamaModel::Options opts;
  opts.recompute = RecomputePolicy::kAttentionAware;
  opts.head_chunk = 2;
  const int64_t S = 96;
  HostAllocator one, many;
  const MemoryTracker* a = Measure(cfg, opts, S, &one);
  const MemoryTracker* b = Measure(cfg, opts, S, &many, DocumentMask{{0, 1, 30, 31, 64}});
  for (int i = 0; i < kNumTiers; ++i) {
    EXPECT_EQ(b->peak(static_cast<Tier>(i)), a->peak(static_cast<Tier>(i)))
        << TierName(static_cast<Tier>(i));
  }
  EXPECT_EQ(b->device_peak(), a->device_peak());
}

// On CUDA, cuDNN's ragged (document-masked) attention backward needs a larger workspace: the
// plan adds what the H200 measured (3,238,011,008 bytes at 128K tokens, 12,952,019,072 at 512K,
// 32 heads of 64: bench/results/2026-12-01-s2-train-packed-llama-3.2-1b.jsonl) instead of the
// causal 8 bytes per element.
TEST(PlannerTest, DocumentMasksWidenCudnnsWorkspaceOnly) {
  for (auto [S, measured] : {std::pair<int64_t, int64_t>{131072, 3238011008},
                             std::pair<int64_t, int64_t>{524288, 12952019072}}) {
    PlanRequest req;
    req.cfg = *PresetConfig("llama-3.2-1b");
    req.seq_len = S;
    req.device = Device::kCuda;
    req.act = DType::kBF16;
    req.opts.recompute = RecomputePolicy::kAttentionAware;
    req.opts.head_chunk = 32;
    req.opts.tile_tokens = 16384;
    req.attention_forward = req.attention_backward = AttentionKernel::kCudnn;
    auto causal = PlanMemory(req);
    req.document_mask = true;
    auto packed = PlanMemory(req);
    ASSERT_TRUE(causal.ok() && packed.ok());
    const int64_t cublas = int64_t{32} << 20;
    EXPECT_NEAR(double(packed->workspace - cublas), double(measured), 0.01 * measured) << S;
    EXPECT_EQ(packed->workspace - causal->workspace, 4 * S * 32 * 64 + 4 * S * 32) << S;
    EXPECT_EQ(packed->device_peak, causal->device_peak) << "the engine's buffers are the same";
  }
}

// The workspace follows the kernels that run: with "auto" at 128K (head_dim 64) packed samples
// run the own Hopper forward (no workspace) and backward, whose 4·(D + 2) bytes per token and
// head (S_pad = S here) and the rows' bounds it is; not cuDNN's ragged backward's 12·D + 4.
// (Measured on the H200, train_bench 128K of 8K documents: device peak 45,953,494,556 bytes, this
// plan 45,953,486,980; bench/results/2026-12-02-kernels-*.)
TEST(PlannerTest, TheWorkspaceFollowsTheChosenKernels) {
  const int64_t S = 131072, cublas = int64_t{32} << 20;
  PlanRequest req;
  req.cfg = *PresetConfig("llama-3.2-1b");
  req.seq_len = S;
  req.device = Device::kCuda;
  req.act = DType::kBF16;
  req.opts.recompute = RecomputePolicy::kAttentionAware;
  req.opts.head_chunk = 32;
  req.opts.tile_tokens = 16384;
  req.document_mask = true;
  auto hopper = PlanMemory(req);
  ASSERT_TRUE(hopper.ok()) << hopper.status();
  EXPECT_EQ(hopper->workspace - cublas, 4 * 32 * S * (64 + 2) + 8 * S);
  // Both passes on the Hopper kernels: the same (the forward needs none).
  req.attention_forward = AttentionKernel::kHopper;
  auto mixed = PlanMemory(req);
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->workspace, hopper->workspace);
  req.attention_backward = AttentionKernel::kCudnn;
  auto cudnn = PlanMemory(req);
  ASSERT_TRUE(cudnn.ok());
  EXPECT_EQ(cudnn->workspace - cublas, 12 * S * 32 * 64 + 4 * S * 32);
  EXPECT_EQ(hopper->device_peak, cudnn->device_peak) << "the engine's buffers are the same";
  // PlanJob reads the kernels from the spec.
  JobSpec spec;
  spec.backend = "cuda";
  spec.model.preset = "llama-3.2-1b";
  spec.data.seq_len = S;
  spec.data.document_mask = true;
  spec.memory.head_chunk = 32;
  spec.memory.tile_tokens = 16384;
  spec.memory.recompute = RecomputePolicy::kAttentionAware;
  auto job = PlanJob(spec, int64_t{1} << 40, int64_t{1} << 40);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->workspace, hopper->workspace);
  spec.kernels.attention_backward = "cudnn";
  spec.kernels.attention_forward = "cudnn";
  job = PlanJob(spec, int64_t{1} << 40, int64_t{1} << 40);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->workspace, cudnn->workspace);
  spec.kernels.attention_backward = "own";
  EXPECT_FALSE(PlanJob(spec, int64_t{1} << 40, int64_t{1} << 40).ok());
}

TEST(PlannerTest, AutoPicksTheFastestSettingsThatFit) {
  JobSpec spec;
  spec.backend = "cuda";
  spec.model.preset = "llama-3.2-1b";
  spec.data.seq_len = 1 << 20;
  spec.memory.recompute = RecomputePolicy::kFull;
  auto roomy = PlanJob(spec, int64_t{1} << 40, int64_t{1} << 40);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  EXPECT_TRUE(roomy->fits);
  EXPECT_EQ(roomy->head_chunk, 32);
  EXPECT_FALSE(roomy->offload);
  int64_t previous = roomy->device_total();
  for (int64_t gib : {80, 50, 40}) {
    auto tight = PlanJob(spec, gib << 30, int64_t{100} << 30);
    ASSERT_TRUE(tight.ok()) << tight.status();
    EXPECT_TRUE(tight->fits) << gib << " GiB: " << tight->verdict;
    EXPECT_LE(tight->device_total(), gib << 30);
    EXPECT_LE(tight->device_total(), previous);
    previous = tight->device_total();
  }
  auto impossible = PlanJob(spec, int64_t{10} << 30, int64_t{100} << 30);
  ASSERT_TRUE(impossible.ok());
  EXPECT_FALSE(impossible->fits);
  EXPECT_NE(impossible->verdict.find("GiB of GPU memory"), std::string::npos);
}

// The predicted step counts every sample of the step: data.micro_batch samples in each of
// training.grad_accum micro-steps, each its own forward/backward (Trainer::TrainStep), then one
// update (issue 54 U1: 1, 4 and 16 samples were all predicted at one sample's time).
TEST(PlannerTest, ThePredictedStepCountsEverySampleOfTheStep) {
  JobSpec spec;
  spec.backend = "cuda";
  spec.model.preset = "llama-3.2-1b";
  spec.data.seq_len = 8192;
  spec.memory.recompute = RecomputePolicy::kFull;
  spec.memory.head_chunk = 32;
  spec.memory.tile_tokens = 8192;
  auto one = PlanJob(spec, int64_t{1} << 40, int64_t{1} << 40);
  ASSERT_TRUE(one.ok()) << one.status();
  const StepPrediction& p1 = one->predicted;
  ASSERT_GT(p1.forward_backward_s, 0);
  ASSERT_GT(p1.update_s, 0);
  EXPECT_NEAR(p1.step_s, p1.forward_backward_s + p1.update_s, 1e-9);
  for (auto [micro_batch, grad_accum] :
       {std::pair<int64_t, int64_t>{4, 1}, {16, 1}, {1, 4}, {4, 2}}) {
    SCOPED_TRACE(absl::StrCat(micro_batch, " x ", grad_accum));
    JobSpec more = spec;
    more.data.micro_batch = micro_batch;
    more.training.grad_accum = grad_accum;
    auto plan = PlanJob(more, int64_t{1} << 40, int64_t{1} << 40);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const StepPrediction& p = plan->predicted;
    const double samples = double(micro_batch * grad_accum);
    EXPECT_NEAR(p.step_s, samples * p1.forward_backward_s + p1.update_s, 1e-9 * p.step_s);
    // The tokens of every sample: the same tokens per second at worst, more as the update is
    // shared by more samples.
    EXPECT_NEAR(p.tok_per_s, samples * 8192 / p.step_s, 1e-6 * p.tok_per_s);
    EXPECT_GT(p.tok_per_s, p1.tok_per_s);
  }
}

// Where the time goes (issue 56): the forwards a plan runs again are counted apart. Saving every
// input regrows nothing; saving every 2nd regrows half the blocks once, the same work as half the
// first forwards; attention-aware recompute reruns less than full recompute (not attention).
TEST(PlannerTest, ThePredictionCountsTheForwardsRunAgain) {
  JobSpec spec;
  spec.backend = "cuda";
  spec.model.preset = "llama-3.2-1b";  // 16 blocks
  spec.data.seq_len = 8192;
  spec.memory.recompute = RecomputePolicy::kFull;
  spec.memory.head_chunk = 32;
  spec.memory.tile_tokens = 8192;
  spec.memory.recompute_interval = 1;
  auto plan = [&](const JobSpec& s) {
    auto p = PlanJob(s, int64_t{1} << 40, int64_t{1} << 40);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? p->predicted : StepPrediction{};
  };
  const StepPrediction every = plan(spec);
  ASSERT_GT(every.forward_s, 0);
  EXPECT_EQ(every.regrow_s, 0);
  EXPECT_GT(every.recompute_s, 0);
  EXPECT_LT(every.forward_s + every.recompute_s, every.forward_backward_s);
  JobSpec half = spec;
  half.memory.recompute_interval = 2;
  const StepPrediction p2 = plan(half);
  EXPECT_NEAR(p2.regrow_s, every.forward_s / 2, 1e-9 * every.forward_s);
  EXPECT_NEAR(p2.forward_backward_s, every.forward_backward_s + p2.regrow_s,
              1e-6 * p2.forward_backward_s);
  JobSpec aware = spec;
  aware.memory.recompute = RecomputePolicy::kAttentionAware;
  const StepPrediction pa = plan(aware);
  EXPECT_EQ(pa.regrow_s, 0);
  EXPECT_GT(pa.recompute_s, 0);
  EXPECT_LT(pa.recompute_s, every.recompute_s - 0.5 * every.attention_s / 3);
}

// [lora] in the plan: the frozen base has no gradient and no optimizer state (those tiers hold
// the adapters' alone), its working copy is the same, and the predicted step is shorter (no
// base weight-gradient GEMMs, an update of the adapters only), by the replay of the schedule.
TEST(PlannerTest, LoraPlansNoBaseGradientsOrOptimizerStateAndAShorterStep) {
  JobSpec spec;
  spec.backend = "cuda";
  spec.model.preset = "llama-3-8b";
  spec.data.seq_len = 32768;
  spec.memory.recompute = RecomputePolicy::kFull;
  spec.memory.head_chunk = 32;
  spec.memory.tile_tokens = 8192;
  spec.memory.optimizer_offload = OffloadChoice::kOff;
  spec.memory.param_offload = OffloadChoice::kOff;
  auto full = PlanJob(spec, int64_t{1} << 40, int64_t{1} << 40);
  ASSERT_TRUE(full.ok()) << full.status();
  spec.lora.rank = 16;
  spec.lora.alpha = 32;
  spec.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  auto lora = PlanJob(spec, int64_t{1} << 40, int64_t{1} << 40);
  ASSERT_TRUE(lora.ok()) << lora.status();
  std::printf("full:\n%sLoRA:\n%s", FormatPlan(*full).c_str(), FormatPlan(*lora).c_str());
  auto peak = [](const MemoryPlan& p, Tier t) { return double(p.peak[static_cast<int>(t)]); };
  // Llama-3-8B's rank-16 adapters on all seven linears: 42M parameters, 12 bytes each of state.
  const double adapters =
      32 * 16.0 * (2 * 4096 + 2 * (4096 + 1024) + (4096 + 4096) + 3 * (4096 + 14336));
  EXPECT_NEAR(peak(*lora, Tier::kOptimizer), 12 * adapters, 0.01 * 12 * adapters);
  EXPECT_GT(peak(*full, Tier::kOptimizer), 100 * peak(*lora, Tier::kOptimizer));
  EXPECT_LT(peak(*lora, Tier::kGrads), 0.05 * peak(*full, Tier::kGrads));
  // The working copy: the base's bf16 plus the adapters'.
  EXPECT_NEAR(peak(*lora, Tier::kParams), peak(*full, Tier::kParams) + 2 * adapters,
              0.02 * peak(*full, Tier::kParams));
  ASSERT_GT(full->predicted.step_s, 0);
  EXPECT_LT(lora->predicted.update_s, 0.05 * full->predicted.update_s);
  EXPECT_LT(lora->predicted.forward_backward_s, 0.95 * full->predicted.forward_backward_s);
}

// How block data is kept is the planner's to choose only where the spec leaves it "auto": an
// explicit memory.offload = false is never planned as offload on (issue 54 U3), nor an explicit
// overlap = true as overlap off.
TEST(PlannerTest, AKeepingKeyTheUserSetIsEveryPlansValue) {
  const std::string toml =
      "backend = \"cuda\"\n[model]\npreset = \"llama-3.2-1b\"\n[data]\npath = \"d\"\n"
      "seq_len = 1048576\n[memory]\nrecompute = \"full\"\n";
  absl::StatusOr<JobSpec> free = ParseJobSpec(toml);
  ASSERT_TRUE(free.ok()) << free.status();
  // A GPU budget at which the planner, left free, offloads.
  int64_t budget = 0;
  for (int64_t gib : {40, 32, 24, 16}) {
    auto p = PlanJob(*free, gib << 30, int64_t{100} << 30);
    ASSERT_TRUE(p.ok()) << p.status();
    if (p->fits && p->offload) {
      budget = gib << 30;
      break;
    }
  }
  ASSERT_GT(budget, 0) << "no budget made the free plan offload";
  for (const std::string set : {"offload = false\n", "offload = false\noverlap = true\n",
                                "recompute_interval = 1\nprefetch = true\n"}) {
    SCOPED_TRACE(set);
    absl::StatusOr<JobSpec> spec = ParseJobSpec(toml + set);
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto p = PlanJob(*spec, budget, int64_t{100} << 30);
    ASSERT_TRUE(p.ok()) << p.status();
    auto has = [&](const char* key) { return set.find(key) != std::string::npos; };
    if (has("offload = false")) {
      EXPECT_FALSE(p->offload);
    }
    if (has("overlap = true")) {
      EXPECT_TRUE(p->overlap);
    }
    if (has("prefetch = true")) {
      EXPECT_TRUE(p->prefetch);
    }
    if (has("recompute_interval = 1")) {
      EXPECT_EQ(p->recompute_interval, 1);
    }
  }
}

// `ithaca plan --max-seq-len` asks only whether a length fits (PlanLimits::first_fit): the
// answer must be the full search's, over budgets from roomy to impossible, with every auto
// setting free.
TEST(PlannerTest, FirstFitSaysWhatTheFullSearchSays) {
  JobSpec spec;
  spec.backend = "cuda";
  spec.model.preset = "llama-3.2-1b";
  spec.data.seq_len = 1 << 17;
  spec.memory.recompute = RecomputePolicy::kAuto;
  spec.memory.optimizer_offload = OffloadChoice::kAuto;
  PlanLimits first_fit;
  first_fit.first_fit = true;
  int fitting = 0;
  for (int64_t gib : {80, 12, 9, 8, 6, 4}) {
    for (int64_t host_gib : {4, 64}) {
      auto full = PlanJob(spec, gib << 30, host_gib << 30);
      auto quick = PlanJob(spec, gib << 30, host_gib << 30, first_fit);
      ASSERT_TRUE(full.ok()) << full.status();
      ASSERT_TRUE(quick.ok()) << quick.status();
      EXPECT_EQ(quick->fits, full->fits) << gib << " GiB, host " << host_gib
                                         << " GiB: " << quick->verdict << " / " << full->verdict;
      EXPECT_EQ(quick->predicted.step_s, 0);  // no step-time prediction
      if (quick->fits) {
        EXPECT_LE(quick->device_total(), gib << 30);
        EXPECT_LE(quick->host_total(), host_gib << 30);
      }
      fitting += full->fits;
    }
  }
  EXPECT_GT(fitting, 2);  // the sweep crosses the boundary both ways
  EXPECT_LT(fitting, 10);
}

// A FitMemo shared by first-fit plans of one job at several lengths skips what a shorter length
// already found too big, and answers as the plans without it do.
TEST(PlannerTest, AFitMemoAnswersAsPlansWithoutIt) {
  JobSpec spec;
  spec.backend = "cuda";
  spec.model.preset = "llama-3.2-1b";
  spec.memory.optimizer_offload = OffloadChoice::kAuto;
  FitMemo memo;
  PlanLimits with_memo, without;
  with_memo.first_fit = without.first_fit = true;
  with_memo.fit_memo = &memo;
  int fitting = 0;
  for (int64_t len : {int64_t{1} << 16, int64_t{3} << 18, int64_t{1} << 20, int64_t{3} << 19,
                      int64_t{1} << 19, int64_t{5} << 18, int64_t{1} << 21}) {
    spec.data.seq_len = len;
    auto a = PlanJob(spec, int64_t{24} << 30, int64_t{32} << 30, with_memo);
    auto b = PlanJob(spec, int64_t{24} << 30, int64_t{32} << 30, without);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->fits, b->fits) << len;
    fitting += b->fits;
  }
  EXPECT_GT(fitting, 0);
  EXPECT_LT(fitting, 7);
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// The longest contexts to probe on two H200s (139 GiB each, 256 GiB of host memory shared by the
// two ranks): Llama-3-8B at 2M tokens and Llama-3.2-1B at 8M, with FSDP + Ulysses over both GPUs,
// full recompute, saved block inputs offloaded to the host, sequence tiles and one head per rank
// per UPipe stage.
TEST(PlannerTest, LongestContextsOnTwoH200sFit) {
  for (auto [preset, tokens] :
       {std::pair<const char*, int64_t>{"llama-3-8b", int64_t{2} << 20},
        std::pair<const char*, int64_t>{"llama-3.2-1b", int64_t{8} << 20}}) {
    JobSpec spec;
    spec.backend = "cuda";
    spec.model.preset = preset;
    spec.data.seq_len = tokens;
    spec.parallel.world = 2;
    spec.parallel.sp = 2;
    spec.memory.recompute = RecomputePolicy::kFull;
    spec.memory.offload = OffloadChoice::kOn;
    spec.memory.prefetch = OffloadChoice::kOff;
    spec.memory.tile_tokens = 8192;
    spec.memory.head_chunk = 2;
    spec.memory.recompute_interval = 4;
    spec.memory.overlap = OffloadChoice::kOff;
    auto plan = PlanJob(spec, int64_t{139} << 30, int64_t{128} << 30);
    ASSERT_TRUE(plan.ok()) << preset << ": " << plan.status();
    std::printf("%s at %lld tokens on 2 GPUs:\n%s", preset, static_cast<long long>(tokens),
                FormatPlan(*plan).c_str());
    EXPECT_TRUE(plan->fits) << preset << ": " << plan->verdict;
  }
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// Optimizer offload: the host_optimizer tier the plan counts is what the optimizer allocates
// (12 bytes per parameter and two pieces' staging), and the device's optimizer tier is empty.
TEST(PlannerTest, OptimizerOffloadMovesTheStateToTheHostTier) {
  const LlamaConfig cfg = Tiny();
  LlamaModel::Options opts;
  opts.tile_tokens = 16;
  HostAllocator alloc;
  const MemoryTracker* measured = Measure(cfg, opts, 64, &alloc, {}, /*optimizer_offload=*/true);
  PlanRequest req;
  req.cfg = cfg;
  req.seq_len = 64;
  req.opts = opts;
  req.optimizer_offload = true;
  auto plan = PlanMemory(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (int i = 0; i < kNumTiers; ++i) {
    EXPECT_EQ(plan->peak[i], measured->peak(static_cast<Tier>(i))) << TierName(Tier(i));
  }
  EXPECT_EQ(plan->peak[static_cast<int>(Tier::kOptimizer)], 0);
  const int64_t params = ParamLayout(cfg).total_numel();
  EXPECT_GT(plan->peak[static_cast<int>(Tier::kHostOptimizer)], 12 * params);
  EXPECT_EQ(plan->host_total(), plan->peak[static_cast<int>(Tier::kHostOptimizer)]);
  EXPECT_NE(FormatPlan(*plan).find("optimizer_offload on"), std::string::npos);
}

// "auto" keeps the state on the device wherever some way of keeping it there fits, and moves it
// to the host only where none does: Llama-3.2-1B at 64K and Llama-3-8B at 32K fit one H200 as
// they are; Llama-3-8B at 128K fits only with its 96 GB of master weights and moments on the
// host (the device host's 125 GiB, 85% of it for the job).
TEST(PlannerTest, AutoOffloadsTheOptimizerOnlyWhereItDoesNotFit) {
  const int64_t gpu = int64_t{137} << 30, host = int64_t(0.85 * double(int64_t{125} << 30));
  auto plan_for = [&](const char* preset, int64_t tokens, OffloadChoice choice) {
    JobSpec spec;
    spec.backend = "cuda";
    spec.model.preset = preset;
    spec.data.seq_len = tokens;
    spec.memory.recompute = RecomputePolicy::kFull;
    spec.memory.optimizer_offload = choice;
    auto p = PlanJob(spec, gpu, host);
    EXPECT_TRUE(p.ok()) << p.status();
    return *p;
  };
  const MemoryPlan small = plan_for("llama-3.2-1b", 64 << 10, OffloadChoice::kAuto);
  EXPECT_TRUE(small.fits) << small.verdict;
  EXPECT_FALSE(small.optimizer_offload);
  EXPECT_GT(small.peak[static_cast<int>(Tier::kOptimizer)], 0);
  const MemoryPlan short8b = plan_for("llama-3-8b", 32 << 10, OffloadChoice::kAuto);
  EXPECT_TRUE(short8b.fits) << short8b.verdict;
  EXPECT_FALSE(short8b.optimizer_offload);

  const MemoryPlan on_device = plan_for("llama-3-8b", 128 << 10, OffloadChoice::kOff);
  EXPECT_FALSE(on_device.fits);
  const MemoryPlan chosen = plan_for("llama-3-8b", 128 << 10, OffloadChoice::kAuto);
  std::printf("Llama-3-8B at 128K on one H200, optimizer_offload auto:\n%s",
              FormatPlan(chosen).c_str());
  EXPECT_TRUE(chosen.fits) << chosen.verdict;
  EXPECT_TRUE(chosen.optimizer_offload);
  EXPECT_EQ(chosen.peak[static_cast<int>(Tier::kOptimizer)], 0);
  const double host_gib = chosen.peak[static_cast<int>(Tier::kHostOptimizer)] / kGiB;
  EXPECT_GT(host_gib, 89.0);  // 12 bytes x 8.03e9 parameters = 89.8 GiB, plus 192 MiB of staging
  EXPECT_LT(host_gib, 90.2);
}

// memory.param_offload "auto" moves the working copy to the host only where the optimizer's state
// there is not enough: Llama-3-8B at 128K on one H200 keeps it on the device; on a 40 GiB GPU
// (its 30 GiB of f32 gradients and 15 GiB of bf16 weights alone overfill it) only both on the host
// fit, and the plan counts the working copy in host_params (2 bytes per parameter) and on the
// device only the units in use.
TEST(PlannerTest, AutoOffloadsTheParametersOnlyWhereTheOptimizerIsNotEnough) {
  auto plan_for = [&](int64_t tokens, int64_t gpu_gib, OffloadChoice params) {
    JobSpec spec;
    spec.backend = "cuda";
    spec.model.preset = "llama-3-8b";
    spec.data.seq_len = tokens;
    spec.memory.recompute = RecomputePolicy::kFull;
    spec.memory.optimizer_offload = OffloadChoice::kAuto;
    spec.memory.param_offload = params;
    auto p = PlanJob(spec, gpu_gib << 30, int64_t{200} << 30);
    EXPECT_TRUE(p.ok()) << p.status();
    return *p;
  };
  const MemoryPlan h200 = plan_for(128 << 10, 137, OffloadChoice::kAuto);
  EXPECT_TRUE(h200.fits) << h200.verdict;
  EXPECT_TRUE(h200.optimizer_offload);
  EXPECT_FALSE(h200.param_offload);
  EXPECT_EQ(h200.peak[static_cast<int>(Tier::kHostParams)], 0);

  EXPECT_FALSE(plan_for(16 << 10, 40, OffloadChoice::kOff).fits);
  const MemoryPlan small = plan_for(16 << 10, 40, OffloadChoice::kAuto);
  std::printf("Llama-3-8B at 16K on a 40 GiB GPU, both offloads auto:\n%s",
              FormatPlan(small).c_str());
  EXPECT_TRUE(small.fits) << small.verdict;
  EXPECT_TRUE(small.optimizer_offload);
  EXPECT_TRUE(small.param_offload);
  const double host_params_gib = small.peak[static_cast<int>(Tier::kHostParams)] / kGiB;
  EXPECT_GT(host_params_gib, 14.9);  // 2 bytes x 8.03e9 parameters = 14.96 GiB
  EXPECT_LT(host_params_gib, 15.0);
  // On the device: a few units (the embedding and head, 2 x 1.96 GiB, and two blocks of 0.41).
  EXPECT_LT(small.peak[static_cast<int>(Tier::kParams)] / kGiB, 5.0);
  EXPECT_NE(FormatPlan(small).find("param_offload on"), std::string::npos);
}

// A plan over the host budget does not fit, and says which host tier holds how many bytes.
TEST(PlannerTest, OverTheHostBudgetNamesTheTierAndTheBytes) {
  JobSpec spec;
  spec.backend = "cuda";
  spec.model.preset = "llama-3-8b";
  spec.data.seq_len = 128 << 10;
  spec.memory.recompute = RecomputePolicy::kFull;
  spec.memory.head_chunk = 8;
  spec.memory.tile_tokens = 8192;
  spec.memory.optimizer_offload = OffloadChoice::kOn;
  spec.memory.offload = OffloadChoice::kOff;
  auto p = PlanJob(spec, int64_t{137} << 30, int64_t{64} << 30);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->fits);
  EXPECT_NE(p->verdict.find("of pinned host memory per rank (host_optimizer "), std::string::npos)
      << p->verdict;
  EXPECT_NE(
      p->verdict.find(absl::StrCat(p->peak[static_cast<int>(Tier::kHostOptimizer)], " bytes)")),
      std::string::npos)
      << p->verdict;
  EXPECT_NE(p->verdict.find("budget 64.00 GiB"), std::string::npos) << p->verdict;
  // With the working copy there too, at a budget the optimizer's state alone fits: the verdict
  // names both tiers.
  spec.memory.param_offload = OffloadChoice::kOn;
  spec.memory.offload = OffloadChoice::kOff;
  spec.memory.recompute = RecomputePolicy::kNone;
  spec.data.seq_len = 4096;
  p = PlanJob(spec, int64_t{137} << 30, int64_t{95} << 30);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->fits);
  EXPECT_NE(p->verdict.find(absl::StrCat(
                "host_params ", HumanBytes(p->peak[static_cast<int>(Tier::kHostParams)]), " (",
                p->peak[static_cast<int>(Tier::kHostParams)], " bytes)")),
            std::string::npos)
      << p->verdict;
  EXPECT_NE(p->verdict.find("budget 95.00 GiB"), std::string::npos) << p->verdict;
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// Issue 31's bar: Llama-3-8B at 1.2M tokens on one H200 (the budget the device's allocator
// gives, 137.8 GiB) with the optimizer's state and the working copy on a 125 GiB host (85 %:
// 106 GiB), holding at most 6 block inputs at once (recompute_schedule.h), head stages of 4 and
// tiles of 2K. Every 6th block's input saved instead holds 10 and does not fit.
TEST(PlannerTest, Llama8BAt1Point2MTokensFitsOneH200WithTheStateOnTheHost) {
  JobSpec spec;
  spec.backend = "cuda";
  spec.model.preset = "llama-3-8b";
  spec.data.seq_len = 1228800;
  spec.memory.recompute = RecomputePolicy::kFull;
  spec.memory.head_chunk = 4;
  spec.memory.tile_tokens = 2048;
  spec.memory.optimizer_offload = OffloadChoice::kOn;
  spec.memory.param_offload = OffloadChoice::kOn;
  const int64_t gpu = 147962396672, host = int64_t{106} << 30;
  spec.memory.saved_block_inputs = 6;
  auto six = PlanJob(spec, gpu, host);
  ASSERT_TRUE(six.ok()) << six.status();
  std::printf("Llama-3-8B at 1.2M tokens, at most 6 block inputs:\n%s", FormatPlan(*six).c_str());
  EXPECT_TRUE(six->fits) << six->verdict;
  EXPECT_EQ(six->saved_block_inputs, 6);
  // A property rather than the figures above: with every setting the plan chose pinned, it fits
  // at the budgets it predicts, and not a byte below either.
  JobSpec pinned = spec;
  auto choice = [](bool on) { return on ? OffloadChoice::kOn : OffloadChoice::kOff; };
  pinned.memory.offload = choice(six->offload);
  pinned.memory.prefetch = choice(six->prefetch);
  pinned.memory.overlap = choice(six->overlap);
  auto at_predicted = PlanJob(pinned, six->device_total(), six->host_total());
  ASSERT_TRUE(at_predicted.ok()) << at_predicted.status();
  EXPECT_TRUE(at_predicted->fits) << at_predicted->verdict;
  EXPECT_EQ(at_predicted->device_total(), six->device_total());
  EXPECT_EQ(at_predicted->host_total(), six->host_total());
  auto gpu_below = PlanJob(pinned, six->device_total() - 1, six->host_total());
  ASSERT_TRUE(gpu_below.ok()) << gpu_below.status();
  EXPECT_FALSE(gpu_below->fits);
  auto host_below = PlanJob(pinned, six->device_total(), six->host_total() - 1);
  ASSERT_TRUE(host_below.ok()) << host_below.status();
  EXPECT_FALSE(host_below->fits);
  spec.memory.saved_block_inputs = 0;
  spec.memory.recompute_interval = 6;
  auto every6 = PlanJob(spec, gpu, host);
  ASSERT_TRUE(every6.ok()) << every6.status();
  EXPECT_FALSE(every6->fits);
  // The inputs held and the running block's output.
  const int64_t input = spec.data.seq_len * 4096 * 2;  // one block input, bf16
  EXPECT_EQ(every6->peak[static_cast<int>(Tier::kBlockInputs)], 10 * input);
  EXPECT_EQ(six->peak[static_cast<int>(Tier::kBlockInputs)], 7 * input);

  // Left to choose, the planner finds a way too: the fewest regrowing forwards that fit.
  spec.memory.recompute_interval = 0;  // "auto"
  spec.memory.head_chunk = 0;
  spec.memory.tile_tokens = 0;
  auto chosen = PlanJob(spec, gpu, host);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  std::printf("Llama-3-8B at 1.2M tokens, the planner's choice:\n%s", FormatPlan(*chosen).c_str());
  EXPECT_TRUE(chosen->fits) << chosen->verdict;
  EXPECT_GE(chosen->saved_block_inputs, 6);
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// Issue 54 F1: block tapes (block_tape.h) replay identical blocks from the first one's record.
// The plan is the full replay's, field for field (the predicted seconds to the last bit), on
// models with one kind of block and with two (Qwen2's full then windowed layers), under every
// way of keeping block data, offload, attention-aware recompute, a ring and LoRA; and most
// block calls of a long model are replayed, not run.
TEST(PlannerTest, BlockTapesPlanExactlyAsTheFullReplay) {
  struct Case {
    std::string name;
    LlamaConfig cfg;
    int64_t world, sp, seq_len;
    LlamaModel::Options opts;
    bool optimizer_offload = false;
    bool timed = true;  // false: first-fit's replays, which predict no step
  };
  const LlamaConfig l8b = *PresetConfig("llama-3-8b");
  LlamaConfig qwen = l8b;  // full layers, then windowed ones (Qwen2's max_window_layers)
  qwen.family = ModelFamily::kQwen2;
  qwen.qkv_bias = true;
  qwen.num_hidden_layers = 12;
  qwen.sliding_window = 32768;
  qwen.window_first_layer = 5;
  LlamaConfig mistral = l8b;
  mistral.family = ModelFamily::kMistral;
  mistral.num_hidden_layers = 10;
  mistral.sliding_window = 4096;
  LlamaConfig lora = l8b;
  lora.num_hidden_layers = 8;
  lora.lora.rank = 16;
  lora.lora.alpha = 32;
  for (int t = 0; t < kNumLoraTargets; ++t) lora.lora.targets[t] = true;
  std::vector<Case> cases;
  auto add = [&](std::string name, const LlamaConfig& cfg, int64_t world, int64_t sp,
                 int64_t seq_len, auto set) {
    Case c{std::move(name), cfg, world, sp, seq_len, {}};
    c.opts.tile_tokens = 8192;
    set(c);
    cases.push_back(c);
  };
  const int64_t M = 1 << 20;
  add("full, overlap", l8b, 8, 8, M, [](Case&) {});
  add("full, UPipe stages, overlap", l8b, 8, 8, M, [](Case& c) { c.opts.head_chunk = 8; });
  add("none", l8b, 8, 8, M / 4, [](Case& c) { c.opts.recompute = RecomputePolicy::kNone; });
  add("attention-aware", l8b, 8, 8, M,
      [](Case& c) { c.opts.recompute = RecomputePolicy::kAttentionAware; });
  add("attention-aware on the last 11, offload, prefetch", l8b, 8, 8, 5 * M, [](Case& c) {
    c.opts.recompute = RecomputePolicy::kAttentionAware;
    c.opts.attention_aware_blocks = 11;
    c.opts.offload = true;
    c.opts.head_chunk = 16;
  });
  add("offload without prefetch, every 4th input", l8b, 8, 8, M, [](Case& c) {
    c.opts.offload = true;
    c.opts.prefetch = false;
    c.opts.recompute_interval = 4;
    c.opts.overlap = false;
  });
  add("at most 3 saved inputs", l8b, 8, 8, M, [](Case& c) { c.opts.saved_block_inputs = 3; });
  add("state on the host", l8b, 8, 8, M, [](Case& c) {
    c.opts.param_offload = true;
    c.optimizer_offload = true;
    c.opts.offload = true;
    c.opts.offload_keep_last = 2;
  });
  add("ring 2 x ulysses 4", l8b, 8, 8, M, [](Case& c) { c.opts.ring = 2; });
  add("ring 4, attention-aware, offload", l8b, 8, 8, M, [](Case& c) {
    c.opts.ring = 4;
    c.opts.recompute = RecomputePolicy::kAttentionAware;
    c.opts.offload = true;
  });
  add("Qwen2 full then windowed", qwen, 4, 4, M / 2, [](Case& c) {
    c.opts.recompute = RecomputePolicy::kAttentionAware;
    c.opts.attention_aware_blocks = 4;
  });
  add("Mistral windowed, every 2nd input", mistral, 2, 2, M / 4,
      [](Case& c) { c.opts.recompute_interval = 2; });
  add("LoRA", lora, 8, 8, M, [](Case& c) { c.opts.offload = true; });
  add("untimed (first fit), offload", l8b, 8, 8, M, [](Case& c) {
    c.timed = false;
    c.opts.offload = true;
  });
  add("one rank, untimed on the CPU", Tiny(), 1, 1, 4096, [](Case&) {});
  const RateTable& h100 = DefaultRateTable(Device::kCuda, "NVIDIA H100 80GB HBM3");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PlanRequest req;
    req.cfg = c.cfg;
    req.world = c.world;
    req.sp = c.sp;
    req.seq_len = c.seq_len;
    req.opts = c.opts;
    req.optimizer_offload = c.optimizer_offload;
    const bool cpu = c.world == 1;
    req.device = cpu ? Device::kCpu : Device::kCuda;
    req.act = cpu ? DType::kF32 : DType::kBF16;
    req.rates = cpu || !c.timed ? nullptr : &h100;
    req.link = *LinkPreset(cpu ? "zero" : "h200-sxm");
    std::set<GemmShape> fast_gemms, full_gemms;
    req.gemm_log = &fast_gemms;
    auto fast = PlanMemory(req);
    req.block_tapes = false;
    req.gemm_log = &full_gemms;
    auto full = PlanMemory(req);
    ASSERT_TRUE(fast.ok()) << fast.status();
    ASSERT_TRUE(full.ok()) << full.status();
    EXPECT_EQ(full->block_calls_replayed, 0);
    // Every block but one of each kind is replayed in each pass.
    EXPECT_GE(fast->block_calls_replayed, c.cfg.num_hidden_layers - 3);
    for (int i = 0; i < kNumTiers; ++i) {
      EXPECT_EQ(fast->peak[i], full->peak[i]) << TierName(static_cast<Tier>(i));
      EXPECT_EQ(fast->at_peak[i], full->at_peak[i]) << TierName(static_cast<Tier>(i));
    }
    EXPECT_EQ(fast->device_peak, full->device_peak);
    EXPECT_EQ(fast->device_reserved, full->device_reserved);
    EXPECT_EQ(fast->workspace, full->workspace);
    const StepPrediction &f = fast->predicted, &r = full->predicted;
    EXPECT_EQ(f.step_s, r.step_s);
    EXPECT_EQ(f.forward_backward_s, r.forward_backward_s);
    EXPECT_EQ(f.update_s, r.update_s);
    EXPECT_EQ(f.gemm_s, r.gemm_s);
    EXPECT_EQ(f.attention_s, r.attention_s);
    EXPECT_EQ(f.elementwise_s, r.elementwise_s);
    EXPECT_EQ(f.transfer_s, r.transfer_s);
    EXPECT_EQ(f.collective_s, r.collective_s);
    EXPECT_EQ(f.waited_s, r.waited_s);
    EXPECT_EQ(f.forward_s, r.forward_s);
    EXPECT_EQ(f.regrow_s, r.regrow_s);
    EXPECT_EQ(f.recompute_s, r.recompute_s);
    EXPECT_EQ(FormatPlan(*fast), FormatPlan(*full));
    EXPECT_EQ(fast_gemms, full_gemms);
    if (req.rates != nullptr) {
      EXPECT_GT(r.step_s, 0);
    }
  }
}

}  // namespace
}  // namespace ithaca
