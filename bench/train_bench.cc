// Full training steps (forward, backward, AdamW) of a preset model on one GPU, with random
// weights and random tokens, at each requested sequence length. One JSON line per S: tok/s,
// model TFLOPS (docs/benchmarks.md's convention, ModelFlopsPerToken), step time (CUDA events,
// median of the timed steps after a warm-up step), measured peak bytes per tier next to the
// planner's prediction for the same options (PlanMemory), the loss, and a per-op device-time
// profile of the last step.
//
// --probe W is the memory probe (docs/benchmarks.md): one step per S with attention
// limited to a causal window of W keys (CudaOps::Options::probe_window) and every buffer, copy
// and collective at full size. Its lines say "mode": "memory-probe" and carry no throughput;
// they add the device memory growth per extra token against the previous S.
// --plan_only prints the planner's lines without touching a GPU (to choose settings).
// --optimizer_offload keeps the optimizer's state on the host (memory.optimizer_offload); the
// line then also says how long the CPU update took and how long the device waited for it, and
// how long the start-up (model, random init, optimizer state) took, and where (startup_breakdown,
// the trainer's start-up line). --param_offload (with --optimizer_offload) keeps the bf16 working
// copy on the host too (memory.param_offload).
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/model_flags.h"
#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/model/config.h"
#include "engine/model/weights.h"
#include "engine/plan/budgets.h"
#include "engine/plan/planner.h"
#include "engine/schedule/llama.h"
#include "engine/train/optimizer.h"
#include "engine/train/passkey.h"
#include "engine/train/trainer.h"
#include "engine/core/units.h"

ABSL_FLAG(std::string, model, "llama-3.2-1b", "model preset");
ABSL_FLAG(std::string, seq_lens, "65536,131072", "comma-separated sequence lengths S");
ABSL_FLAG(int, steps, 2, "timed steps per S (median reported), after --warmup steps");
ABSL_FLAG(int, warmup, 1, "untimed warm-up steps per S (cuDNN plan choice happens in the first)");
ABSL_FLAG(int64_t, probe, 0, "memory probe: attention window W (0: a real, timed step)");
ABSL_FLAG(bool, plan_only, false, "print the planner's prediction only (no GPU)");
ABSL_FLAG(bool, profile, true, "per-op device time of the last timed step (CUDA events)");
ABSL_FLAG(bool, profile_gemm_shapes, false,
          "with --profile: one row per GEMM shape (m×n×k, layout, accumulation) instead of one "
          "\"gemm\" row");
ABSL_FLAG(std::string, tag, "", "free-form label copied into each line");
ABSL_FLAG(int, gemm_heuristic, -1,
          "cuBLASLt's algorithm per GEMM shape: -1 the fastest of its first few, timed on the "
          "warm-up's calls (training's choice); N always its N-th (0: its first)");
ABSL_FLAG(int64_t, doc_len, 0,
          "packed documents of this many tokens, document-masked (0: one causal sequence); "
          "model TFLOPS then count only the attention computed");

ABSL_FLAG(std::string, attention_forward, "auto",
          "kernels.attention_forward: auto | cudnn | hopper | flash (the planner follows it)");
ABSL_FLAG(std::string, attention_backward, "auto", "kernels.attention_backward, as above");
ABSL_FLAG(int64_t, passkey_samples, 0,
          "> 0: after the training steps of each S, also time the passkey eval ([eval.passkey]) "
          "at length S with this many samples per depth, and print a line of mode \"passkey\" "
          "beside the step's (byte-level prompts: a preset's random weights have no tokenizer)");
ABSL_FLAG(std::string, passkey_depths, "0,0.5,1", "eval.passkey.depths for --passkey_samples");

namespace ithaca {
namespace {

bench::Json TierJson(const std::array<int64_t, kNumTiers>& v) {
  bench::Json j;
  for (int i = 0; i < kNumTiers; ++i) j.Int(TierName(static_cast<Tier>(i)), v[i]);
  return j;
}

// What the previous S of a probe measured, for the growth per token.
struct Previous {
  int64_t S = 0, device_peak = 0, device_reserved = 0;
};

// The passkey eval at length S on the model as it is (PasskeyEval, engine/train/passkey.h: the
// step's schedule, forward only, labels at the key), timed against the training step's median
// `step_s`; its memory peak is measured on its own.
absl::Status RunPasskey(LlamaModel* model, int64_t S, const std::string& device, double step_s,
                        CudaAllocator* alloc) {
  JobSpec spec;
  spec.data.seq_len = S;
  spec.eval.passkey.lengths = {S};
  spec.eval.passkey.depths.clear();
  for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_passkey_depths), ',')) {
    spec.eval.passkey.depths.push_back(std::stod(std::string(d)));
  }
  spec.eval.passkey.samples = absl::GetFlag(FLAGS_passkey_samples);
  ASSIGN_OR_RETURN(std::unique_ptr<PasskeyEval> eval,
                   PasskeyEval::Create(spec, model, nullptr, 1, 0, MakeByteTokenizer()));
  model->ops()->Synchronize();
  alloc->tracker().ResetPeaks();
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::vector<PasskeyResult> results, eval->Run());
  model->ops()->Synchronize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t prompts = spec.eval.passkey.samples * static_cast<int64_t>(results.size());
  std::string points = "[";
  for (size_t i = 0; i < results.size(); ++i) {
    absl::StrAppendFormat(&points,
                          "%s{\"depth\": %g, \"accuracy\": %g, \"logprob\": %.4f, "
                          "\"seconds\": %.4f}",
                          i ? ", " : "", results[i].depth, results[i].accuracy, results[i].logprob,
                          results[i].seconds);
  }
  points += "]";
  const double per_prompt = seconds / static_cast<double>(prompts);
  bench::Json line;
  line.Str("bench", "train")
      .Str("mode", "passkey")
      .Str("date", bench::Today())
      .Str("device", device)
      .Str("model", absl::GetFlag(FLAGS_model))
      .Int("S", S)
      .Int("world", 1)
      .Int("samples_per_depth", spec.eval.passkey.samples)
      .Int("prompts", prompts)
      .Obj("techniques", bench::Techniques(bench::ModelOptions(), "n/a"))
      .Num("eval_s", seconds)
      .Num("s_per_prompt", per_prompt)
      .Num("prompt_tok_per_s", static_cast<double>(S) / per_prompt)
      .Num("train_step_s", step_s);
  if (step_s > 0) line.Num("prompt_vs_train_step", per_prompt / step_s);
  if (!absl::GetFlag(FLAGS_tag).empty()) line.Str("tag", absl::GetFlag(FLAGS_tag));
  line.Int("device_peak_bytes", alloc->tracker().device_peak()).Raw("points", points).Print();
  return absl::OkStatus();
}

absl::Status RunOne(const LlamaConfig& cfg, int64_t S, const std::string& device, Previous* prev) {
  const LlamaModel::Options mo = bench::ModelOptions();
  const int64_t probe = absl::GetFlag(FLAGS_probe);
  PlanRequest req;
  req.cfg = cfg;
  req.seq_len = S;
  req.document_mask = absl::GetFlag(FLAGS_doc_len) > 0;
  req.opts = mo;
  req.optimizer_offload = absl::GetFlag(FLAGS_optimizer_offload);
  req.device = Device::kCuda;
  req.act = DType::kBF16;
  ASSIGN_OR_RETURN(req.attention_forward,
                   ParseAttentionKernel(absl::GetFlag(FLAGS_attention_forward)));
  ASSIGN_OR_RETURN(req.attention_backward,
                   ParseAttentionKernel(absl::GetFlag(FLAGS_attention_backward)));
  bench::PlanProbeKernels(probe, bench::HopperAttentionRunsHere(), &req);
  ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(req));
  bench::Json planned;
  planned.Obj("peak_bytes", TierJson(plan.peak))
      .Int("device_peak_bytes", plan.device_peak)
      .Int("fixed_workspace_bytes", plan.workspace)
      .Int("device_total_bytes", plan.device_total())
      .Int("device_reserved_bytes", plan.device_reserved)
      .Int("host_total_bytes", plan.host_total());
  // The budget a job on this GPU would get (the same rule as admission and the workers).
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    JobSpec job;
    job.backend = "cuda";
    const RankBudgets budgets =
        BudgetsFor(job, LocalNodeResources(static_cast<int64_t>(total_bytes), 1));
    planned.Int("gpu_budget_bytes", budgets.gpu_bytes)
        .Bool("fits_budget", plan.device_total() <= budgets.gpu_bytes);
  }
  if (absl::GetFlag(FLAGS_plan_only)) {
    bench::Json()
        .Str("bench", "train")
        .Str("mode", "plan-only")
        .Str("model", absl::GetFlag(FLAGS_model))
        .Bool("qk_norm", cfg.qk_norm)
        .Bool("qkv_bias", cfg.qkv_bias)
        .Int("sliding_window", cfg.sliding_window)
        .Int("window_first_layer", cfg.window_first_layer)
        .Int("S", S)
        .Obj("techniques", bench::Techniques(mo, "n/a"))
        .Obj("planner", planned)
        .Num("device_total_gib", plan.device_total() / kGiB)
        .Num("host_gib", plan.host_total() / kGiB)
        .Print();
    return absl::OkStatus();
  }

  const auto start = std::chrono::steady_clock::now();
  CudaAllocator alloc;
  CudaOps::Options o;
  o.alloc = &alloc;
  o.probe_window = probe;
  o.attention_forward = req.attention_forward;
  o.attention_backward = req.attention_backward;
  o.profile_gemm_shapes = absl::GetFlag(FLAGS_profile_gemm_shapes);
  o.gemm_heuristic = absl::GetFlag(FLAGS_gemm_heuristic);
  CudaOps ops(o);
  ASSIGN_OR_RETURN(auto model, LlamaModel::Create(cfg, &ops, &alloc, mo));
  ops.Synchronize();
  StartupReport startup;
  startup.model_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  JobSpec::Training hp;
  ASSIGN_OR_RETURN(auto opt, bench::RandomOptimizer(model.get(), hp));
  ops.Synchronize();
  const double startup_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  startup.total_s = startup_s;
  startup.optimizer = opt->startup();
  std::fprintf(stderr, "%s\n", FormatStartupLine(startup).c_str());
  bench::Json startup_json;
  startup_json.Num("model_s", startup.model_s)
      .Num("allocate_s", startup.optimizer.allocate_s)
      .Int("pinned_host_bytes", startup.optimizer.host_bytes)
      .Num("init_s", startup.optimizer.init_s)
      .Num("place_s", startup.optimizer.place_s)
      .Num("working_copy_s", startup.optimizer.working_copy_s);
  std::mt19937 gen(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.vocab_size - 1));
  std::vector<int32_t> inputs(S), labels(S);
  // data.document_mask as the trainer applies it: attention and RoPE within each document, and
  // a document's last token predicts nothing.
  DocumentMask docs;
  if (const int64_t n = absl::GetFlag(FLAGS_doc_len); n > 0) {
    for (int64_t t = 0; t < S; t += n) docs.starts.push_back(t);
  }
  const double flops_per_sample = ModelFlopsPerSample(cfg, S, docs.starts);

  // A probe is one step: its time is not a measurement.
  const int warmup = probe > 0 ? 0 : absl::GetFlag(FLAGS_warmup);
  const int timed = probe > 0 ? 1 : absl::GetFlag(FLAGS_steps);
  std::vector<double> step_s;
  Optimizer::StepResult last_update;
  std::vector<CudaOps::ProfileRow> profile;
  double loss = 0;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int step = 0; step < warmup + timed; ++step) {
    for (int64_t i = 0; i < S; ++i) inputs[i] = tok(gen);
    for (int64_t i = 0; i + 1 < S; ++i) labels[i] = inputs[i + 1];
    labels[S - 1] = tok(gen);
    for (size_t d = 1; d < docs.starts.size(); ++d) labels[docs.starts[d] - 1] = -1;
    const bool last = step + 1 == warmup + timed;
    ops.set_profile(last && absl::GetFlag(FLAGS_profile));
    ops.Synchronize();
    alloc.tracker().ResetPeaks();
    cudaEventRecord(a, ops.stream());
    model->params().ZeroGrads();
    ASSIGN_OR_RETURN(LossSum l, model->ForwardBackward(inputs.data(), labels.data(), S,
                                                       1.f / static_cast<float>(S), docs));
    ASSIGN_OR_RETURN(Optimizer::StepResult r, opt->Step(step + 1, hp.lr));
    // With --overlap_update the previous step's update ran under this step's forward.
    const Optimizer::UpdateTimes ran = opt->TakeUpdateTimes();
    if (r.cpu_update_seconds > 0) {
      last_update = r;
    } else if (ran.cpu_seconds > 0) {
      last_update.cpu_update_seconds = ran.cpu_seconds;
      last_update.device_wait_seconds = ran.device_wait_seconds;
    }
    cudaEventRecord(b, ops.stream());
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    loss = l.loss_sum / static_cast<double>(l.tokens);
    std::fprintf(stderr, "S %lld step %d: %.3f s, loss %.4f%s\n", static_cast<long long>(S), step,
                 ms / 1e3, loss, probe > 0 ? " (memory probe: not a throughput figure)" : "");
    if (step >= warmup) step_s.push_back(ms / 1e3);
    if (last && absl::GetFlag(FLAGS_profile)) profile = ops.TakeProfile();
  }
  ops.set_profile(false);
  cudaEventDestroy(a);
  cudaEventDestroy(b);

  const MemoryTracker& mt = alloc.tracker();
  std::array<int64_t, kNumTiers> measured{};
  for (int i = 0; i < kNumTiers; ++i) measured[i] = mt.peak(static_cast<Tier>(i));
  const CudaAllocator::Stats st = alloc.stats();
  // Planner error per tier, relative to the measurement (bar: within 5%).
  bench::Json err;
  for (int i = 0; i < kNumTiers; ++i) {
    if (measured[i] > 0) {
      err.Num(TierName(static_cast<Tier>(i)),
              double(plan.peak[i] - measured[i]) / double(measured[i]));
    }
  }
  const int64_t device_measured = mt.device_peak();
  err.Num("device_peak", double(plan.device_total() - device_measured) / double(device_measured));
  // What the allocator holds (its cached size classes included), and the whole process as the
  // device sees it (with the CUDA context and the libraries' own memory on top).
  const CudaAllocator::Stats held = alloc.stats();
  err.Num("device_reserved",
          double(plan.device_reserved - held.device_reserved) / double(held.device_reserved));
  const int64_t process_used = bench::DeviceUsedBytes();
  if (process_used > 0) {
    err.Num("process", double(plan.device_total() - process_used) / double(process_used));
    err.Num("process_from_reserved",
            double(plan.device_reserved - process_used) / double(process_used));
  }
  bench::Json workspaces;
  workspaces.Int("cudnn_attention", ops.attention_workspace_bytes())
      .Int("cublaslt", ops.gemm_workspace_bytes());

  bench::Json line;
  line.Str("bench", "train")
      .Str("mode", probe > 0 ? "memory-probe" : "throughput")
      .Str("date", bench::Today())
      .Str("device", device)
      .Str("model", absl::GetFlag(FLAGS_model))
      .Bool("qk_norm", cfg.qk_norm)
      .Bool("qkv_bias", cfg.qkv_bias)
      .Int("sliding_window", cfg.sliding_window)
      .Int("window_first_layer", cfg.window_first_layer)
      .Int("S", S)
      .Int("world", 1)
      .Int("doc_len", absl::GetFlag(FLAGS_doc_len))
      .Str("attention_forward", absl::GetFlag(FLAGS_attention_forward))
      .Str("attention_backward", absl::GetFlag(FLAGS_attention_backward))
      .Int("gemm_heuristic", absl::GetFlag(FLAGS_gemm_heuristic))
      .Obj("techniques", bench::Techniques(mo, ops.last_attention_impl()));
  if (!absl::GetFlag(FLAGS_tag).empty()) line.Str("tag", absl::GetFlag(FLAGS_tag));
  if (probe > 0) {
    line.Int("probe_window", probe);
  } else {
    const double t = bench::Median(step_s);
    const double tok_s = static_cast<double>(S) / t;
    const double tflops = flops_per_sample / t / 1e12;
    std::string steps_json = "[";
    for (size_t i = 0; i < step_s.size(); ++i)
      absl::StrAppendFormat(&steps_json, "%s%.4f", i ? ", " : "", step_s[i]);
    steps_json += "]";
    line.Num("tok_per_s", tok_s).Num("model_tflops", tflops);
    // MFU against the device's own peak (Ops::PeakFlops); left out where it is not known.
    if (ops.PeakFlops() > 0) line.Num("mfu", tflops * 1e12 / ops.PeakFlops());
    line.Num("step_s", t).Raw("step_times_s", steps_json);
  }
  line.Num("startup_s", startup_s).Obj("startup_breakdown", startup_json);
  if (absl::GetFlag(FLAGS_optimizer_offload)) {
    // The last step's CPU AdamW and the device's wait for the host update (Optimizer::StepResult).
    line.Num("cpu_update_s", last_update.cpu_update_seconds)
        .Num("device_wait_s", last_update.device_wait_seconds);
  }
  line.Obj("peak_bytes", TierJson(measured))
      .Int("device_peak_bytes", device_measured)
      .Int("device_reserved_bytes", st.device_reserved)
      .Int("process_device_used_bytes", process_used)
      .Int("host_reserved_bytes", st.host_reserved)
      .Num("device_fragmentation", st.device_reserved > 0
                                       ? 1.0 - double(device_measured) / double(st.device_reserved)
                                       : 0.0)
      .Obj("library_workspace_bytes", workspaces)
      .Obj("planner", planned)
      .Obj("planner_rel_error", err);
  if (probe > 0 && prev->S > 0 && S > prev->S) {
    line.Num("device_peak_growth_bytes_per_token",
             double(device_measured - prev->device_peak) / double(S - prev->S))
        .Num("device_reserved_growth_bytes_per_token",
             double(st.device_reserved - prev->device_reserved) / double(S - prev->S))
        .Int("growth_vs_S", prev->S);
  }
  if (!profile.empty()) {
    // Only the last step is profiled; the rows are device time per op kind in ms.
    bench::Json prof;
    double busy = 0;
    for (const auto& r : profile) {
      prof.Raw(r.op, absl::StrFormat("[%.1f, %lld]", r.ms, static_cast<long long>(r.calls)));
      busy += r.ms;
    }
    line.Obj("profile_ms_calls", prof).Num("profile_busy_ms", busy);
    if (!step_s.empty()) line.Num("profile_idle_ms", step_s.back() * 1e3 - busy);
  }
  line.Num("loss", loss).Print();
  if (absl::GetFlag(FLAGS_passkey_samples) > 0 && probe == 0) {
    RETURN_IF_ERROR(
        RunPasskey(model.get(), S, device, step_s.empty() ? 0 : bench::Median(step_s), &alloc));
  }
  prev->S = S;
  prev->device_peak = device_measured;
  prev->device_reserved = st.device_reserved;
  return absl::OkStatus();
}

int Main() {
  auto cfg = bench::BenchConfig(absl::GetFlag(FLAGS_model));
  if (!cfg.ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().ToString().c_str());
    return 2;
  }
  const std::string device = absl::GetFlag(FLAGS_plan_only) ? "none" : bench::DeviceName();
  Previous prev;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_seq_lens), ',')) {
    absl::Status st = RunOne(*cfg, std::stoll(std::string(s)), device, &prev);
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
