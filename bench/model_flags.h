// The memory and schedule flags every training benchmark takes (train_bench, parallel_bench),
// defined once: --recompute, --tile_tokens, --loss_tile_tokens, --head_chunk, --offload,
// --offload_keep_last, --recompute_interval, --prefetch, --fsdp, --overlap and
// --optimizer_offload, the ablations --qk_norm and --qkv_bias, --window_layers, and LoRA
// (--lora_rank, --lora_alpha, --lora_targets).
#pragma once

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bench/bench_util.h"
#include "engine/plan/planner.h"
#include "engine/schedule/llama.h"
#include "engine/spec/recompute_policy.h"
#include "engine/train/optimizer.h"

namespace ithaca {
// --recompute takes the spec's names (recompute_policy.h); any other is refused when parsed.
bool AbslParseFlag(absl::string_view text, RecomputePolicy* policy, std::string* error);
std::string AbslUnparseFlag(RecomputePolicy policy);
}  // namespace ithaca

ABSL_DECLARE_FLAG(ithaca::RecomputePolicy, recompute);
ABSL_DECLARE_FLAG(int64_t, attention_aware_blocks);
ABSL_DECLARE_FLAG(bool, optimizer_offload);
ABSL_DECLARE_FLAG(bool, param_offload);
ABSL_DECLARE_FLAG(bool, overlap_update);
ABSL_DECLARE_FLAG(int64_t, layers);

namespace ithaca {
namespace bench {

// The spec's [lora] from --lora_rank, --lora_alpha and --lora_targets (rank 0: none).
JobSpec::Lora LoraSpec();
// The preset `preset` with --lora_rank's adapters, --layers and the --qk_norm / --qkv_bias
// ablations applied (either may turn its extra off; a Qwen left with neither runs as the Llama
// family on the same shapes).
absl::StatusOr<LlamaConfig> BenchConfig(const std::string& preset);
// The spec the flags describe: its memory section, parallel.ring and parallel.fsdp, and [lora].
JobSpec BenchSpec();
// LlamaModel's options from the flags: BenchSpec() through ModelOptionsFromSpec, the trainer's
// own function, with --loss_tile_tokens.
LlamaModel::Options ModelOptions();
// Sets the memory flags (head_chunk, tile_tokens, offload, offload_keep_last, prefetch,
// recompute_interval, saved_block_inputs, overlap, optimizer_offload, param_offload) to a resolved
// spec's, so that ModelOptions, Techniques and RandomOptimizer follow them.
void SetMemoryFlags(const JobSpec::Memory& m);
// The "techniques" object of a result line: the options and the attention implementation used.
Json Techniques(const LlamaModel::Options& mo, const std::string& attention);
// The memory probe (--probe W > 0) runs its window on the own Hopper kernels both ways where
// they run (`hopper_runs`: built, on a compute capability 9.0 GPU; head_dim 64 or 128), else on
// cuDNN's causal band (CudaOps::Options::probe_window), whatever "auto" would choose for a real
// step: its plan takes those kernels, so the planner counts the workspace of what runs.
void PlanProbeKernels(int64_t probe_window, bool hopper_runs, PlanRequest* req);
// Whether the own Hopper attention kernels run on this process's GPU (built with CUTLASS, compute
// capability 9.0).
bool HopperAttentionRunsHere();
// The benchmarks' optimizer: random weights (seed 1234, the same on every rank and run) and the
// default hyper-parameters `hp`; its state on the host with --optimizer_offload.
absl::StatusOr<std::unique_ptr<Optimizer>> RandomOptimizer(LlamaModel* model,
                                                           const JobSpec::Training& hp);

// The step-time model's prediction for `plan` beside a measured step (`step_s`, 0: none) in a
// result line: predicted_step_s, its relative error, and where the time goes.
void AddPrediction(const MemoryPlan& plan, double step_s, Json* line);

}  // namespace bench
}  // namespace ithaca
