// Full training steps (forward, backward, AdamW) of a preset model on one GPU, with random
// weights and random tokens, at each requested sequence length. One JSON line per S: tok/s,
// model TFLOPS (BENCHMARKS.md's convention, ModelFlopsPerToken), step time (CUDA events, median
// of the timed steps after a warm-up step), peak bytes per tier, the loss, and the planner's
// prediction (null until the planner exists).
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/model/config.h"
#include "engine/model/llama.h"
#include "engine/model/weights.h"
#include "engine/train/optimizer.h"
#include "engine/train/trainer.h"

ABSL_FLAG(std::string, model, "llama-3.2-1b", "model preset");
ABSL_FLAG(std::string, seq_lens, "65536,131072", "comma-separated sequence lengths S");
ABSL_FLAG(int, steps, 2, "timed steps per S (median reported), after one warm-up step");
ABSL_FLAG(std::string, checkpoint, "full", "none | full | attention-aware");
ABSL_FLAG(int64_t, tile_tokens, 0, "MLP tile (0: the model's default)");
ABSL_FLAG(bool, offload, false, "offload saved block data to pinned host memory");
ABSL_FLAG(int64_t, head_chunk, 0, "UPipe query heads per stage (0: all heads)");

namespace ithaca {
namespace {

absl::Status RunOne(const LlamaConfig& cfg, int64_t S, const std::string& device) {
  CudaAllocator alloc;
  CudaOps::Options o;
  o.alloc = &alloc;
  CudaOps ops(o);
  LlamaModel::Options mo;
  const std::string policy = absl::GetFlag(FLAGS_checkpoint);
  mo.checkpoint = policy == "none"              ? CheckpointPolicy::kNone
                  : policy == "attention-aware" ? CheckpointPolicy::kAttentionAware
                                                : CheckpointPolicy::kFull;
  mo.tile_tokens = absl::GetFlag(FLAGS_tile_tokens);
  mo.offload = absl::GetFlag(FLAGS_offload);
  mo.head_chunk = absl::GetFlag(FLAGS_head_chunk);
  ASSIGN_OR_RETURN(auto model, LlamaModel::Create(cfg, &ops, &alloc, mo));
  JobSpec::Training hp;
  const ParamLayout& layout = model->layout();
  ASSIGN_OR_RETURN(auto opt, Optimizer::Create(
                                 model.get(),
                                 [&](int unit) -> absl::StatusOr<std::vector<float>> {
                                   return RandomUnitWeights(layout, unit, 1234);
                                 },
                                 hp));
  std::mt19937 gen(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.vocab_size - 1));
  std::vector<int32_t> inputs(S), labels(S);

  const int timed = absl::GetFlag(FLAGS_steps);
  std::vector<double> step_s;
  double loss = 0;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int step = 0; step <= timed; ++step) {  // step 0 is the warm-up
    for (int64_t i = 0; i < S; ++i) inputs[i] = tok(gen);
    for (int64_t i = 0; i + 1 < S; ++i) labels[i] = inputs[i + 1];
    labels[S - 1] = tok(gen);
    ops.Synchronize();
    alloc.tracker().ResetPeaks();
    cudaEventRecord(a, ops.stream());
    model->params().ZeroGrads();
    ASSIGN_OR_RETURN(LossSum l, model->ForwardBackward(inputs.data(), labels.data(), S,
                                                       1.f / static_cast<float>(S)));
    RETURN_IF_ERROR(opt->Step(step + 1, hp.lr).status());
    cudaEventRecord(b, ops.stream());
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    loss = l.loss_sum / static_cast<double>(l.tokens);
    std::fprintf(stderr, "S %lld step %d: %.3f s, loss %.4f\n", static_cast<long long>(S), step,
                 ms / 1e3, loss);
    if (step > 0) step_s.push_back(ms / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  const double t = bench::Median(step_s);
  const double tok_s = static_cast<double>(S) / t;
  const double tflops = tok_s * ModelFlopsPerToken(cfg, S) / 1e12;
  bench::Json tiers;
  const MemoryTracker& mt = alloc.tracker();
  for (int i = 0; i < kNumTiers; ++i) tiers.Int(TierName(static_cast<Tier>(i)), mt.peak(Tier(i)));
  bench::Json techniques;
  techniques.Str("checkpoint", policy)
      .Bool("offload", mo.offload)
      .Int("tile_tokens", mo.tile_tokens)
      .Int("head_chunk", mo.head_chunk)
      .Str("attention", ops.last_attention_impl());
  std::string steps_json = "[";
  for (size_t i = 0; i < step_s.size(); ++i)
    absl::StrAppendFormat(&steps_json, "%s%.4f", i ? ", " : "", step_s[i]);
  steps_json += "]";
  bench::Json()
      .Str("bench", "train")
      .Str("date", "2026-11-29")
      .Str("device", device)
      .Str("model", absl::GetFlag(FLAGS_model))
      .Int("S", S)
      .Int("world", 1)
      .Obj("techniques", techniques)
      .Num("tok_per_s", tok_s)
      .Num("model_tflops", tflops)
      .Num("mfu", tflops / 989.0)
      .Num("step_s", t)
      .Raw("step_times_s", steps_json)
      .Obj("peak_bytes", tiers)
      .Int("device_peak_bytes", mt.device_peak())
      .Int("device_reserved_bytes", alloc.stats().device_reserved)
      .Null("planner_peak_bytes")
      .Num("loss", loss)
      .Print();
  return absl::OkStatus();
}

int Main() {
  auto cfg = PresetConfig(absl::GetFlag(FLAGS_model));
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().ToString().c_str());
    return 2;
  }
  const std::string device = bench::DeviceName();
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_seq_lens), ',')) {
    absl::Status st = RunOne(*cfg, std::stoll(std::string(s)), device);
    if (!st.ok()) {
      std::fprintf(stderr, "S %s: %s\n", std::string(s).c_str(), st.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ithaca::Main();
}
