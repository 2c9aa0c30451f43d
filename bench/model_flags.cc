#include "bench/model_flags.h"

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/backend/cuda/hopper_attention.h"
#include "engine/core/status.h"
#include "engine/model/config.h"
#include "engine/model/weights.h"
#include "engine/schedule/spec_options.h"

namespace ithaca {

bool AbslParseFlag(absl::string_view text, RecomputePolicy* policy, std::string* error) {
  const std::optional<RecomputePolicy> p =
      RecomputePolicyFromName(std::string_view(text.data(), text.size()));
  if (!p) {
    *error = "one of none, full, attention-aware or auto";
    return false;
  }
  *policy = *p;
  return true;
}

std::string AbslUnparseFlag(RecomputePolicy policy) { return RecomputePolicyName(policy); }

}  // namespace ithaca

ABSL_FLAG(ithaca::RecomputePolicy, recompute, ithaca::RecomputePolicy::kFull,
          "what each block keeps for its backward (memory.recompute): none | full | "
          "attention-aware | auto (the planner's choice: --planner_settings)");
ABSL_FLAG(int64_t, attention_aware_blocks, -1,
          "under attention-aware, how many of the last blocks keep O and LSE (-1: all)");
ABSL_FLAG(int64_t, tile_tokens, 0, "MLP tile (0: the model's default)");
ABSL_FLAG(int64_t, loss_tile_tokens, 0, "loss tile (0: the model's default)");
ABSL_FLAG(int64_t, head_chunk, 0, "UPipe query heads per stage (0: all heads)");
ABSL_FLAG(int64_t, ring, 0, "r of --sp = u x r: ring attention across Ulysses groups (0: auto)");
ABSL_FLAG(bool, offload, false, "offload saved block data to pinned host memory");
ABSL_FLAG(int64_t, offload_keep_last, 0, "blocks whose saved data stays on the device");
ABSL_FLAG(int64_t, recompute_interval, 1, "save every k-th block's input (the others regrow)");
ABSL_FLAG(int64_t, saved_block_inputs, 0,
          "> 0: hold at most this many block inputs at once, with the fewest regrowing forwards "
          "(memory.saved_block_inputs); 0: --recompute_interval decides");
ABSL_FLAG(bool, prefetch, true, "bring block l-1's saved data back during block l's backward");
ABSL_FLAG(bool, fsdp, true, "shard parameters over the ranks (parallel.fsdp)");
ABSL_FLAG(bool, overlap, true, "collectives under compute (memory.overlap)");
ABSL_FLAG(bool, optimizer_offload, false,
          "f32 master weights and Adam m, v in pinned host memory, updated by the CPU AdamW "
          "(memory.optimizer_offload)");
ABSL_FLAG(bool, overlap_update, true,
          "with --optimizer_offload: each step's CPU update under the next forward, unit by unit "
          "(memory.overlap_update); false: between the steps");
ABSL_FLAG(std::string, qk_norm, "",
          "false: the preset without its per-head q/k RMSNorm (Qwen3), to measure what the norm "
          "costs; empty: as the preset has it");
ABSL_FLAG(std::string, qkv_bias, "",
          "false: the preset without its q/k/v biases (Qwen2), to measure what they cost; empty: "
          "as the preset has it");
ABSL_FLAG(std::string, window_layers, "",
          "W,FROM: a Qwen2/Qwen3 preset with use_sliding_window, a window of W keys on the "
          "layers from FROM (max_window_layers) on; empty: as the preset has it (none)");
ABSL_FLAG(
    int64_t, layers, 0,
    "> 0: only the preset's first N decoder layers (every layer is the same work, so a "
    "step at a length too long to time whole is timed on fewer layers; bench/project_layers.py "
    "scales it); 0: all");
ABSL_FLAG(int64_t, lora_rank, 0,
          "> 0: LoRA adapters of this rank on a frozen base (the spec's [lora]); 0: every weight "
          "trained");
ABSL_FLAG(double, lora_alpha, 32, "with --lora_rank: lora.alpha (the scale is alpha / rank)");
ABSL_FLAG(std::string, lora_targets, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
          "with --lora_rank: lora.targets, comma-separated");
ABSL_FLAG(bool, param_offload, false,
          "the bf16 working copy in pinned host memory too, uploaded a unit ahead of use "
          "(memory.param_offload; needs --optimizer_offload)");

namespace ithaca {
namespace bench {

namespace {

// An extra's override: "" keeps the preset's `on`, "false" turns it off; turning on what the
// preset lacks is an error (that would be another model, not an ablation).
absl::Status Override(const std::string& flag, const char* name, bool* on) {
  if (flag.empty() || flag == "true") {
    if (flag == "true" && !*on) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "=true: the preset has none (the flag only turns it off)"));
    }
    return absl::OkStatus();
  }
  if (flag != "false") {
    return absl::InvalidArgumentError(absl::StrCat("--", name, "=", flag, ": true or false"));
  }
  *on = false;
  return absl::OkStatus();
}

}  // namespace

JobSpec::Lora LoraSpec() {
  JobSpec::Lora l;
  l.rank = absl::GetFlag(FLAGS_lora_rank);
  if (l.rank > 0) {
    l.alpha = absl::GetFlag(FLAGS_lora_alpha);
    l.targets = absl::StrSplit(absl::GetFlag(FLAGS_lora_targets), ',', absl::SkipEmpty());
  }
  return l;
}

absl::StatusOr<LlamaConfig> BenchConfig(const std::string& preset) {
  // The preset with --lora_rank's adapters, through the trainer's own spec -> config function.
  JobSpec spec;
  spec.model.preset = preset;
  spec.lora = LoraSpec();
  ASSIGN_OR_RETURN(LlamaConfig cfg, ResolveModelConfig(spec));
  RETURN_IF_ERROR(Override(absl::GetFlag(FLAGS_qk_norm), "qk_norm", &cfg.qk_norm));
  RETURN_IF_ERROR(Override(absl::GetFlag(FLAGS_qkv_bias), "qkv_bias", &cfg.qkv_bias));
  // ValidateConfig ties the extras to the family: a Qwen without its extra is Llama's math on
  // the same shapes.
  const bool qwen = cfg.family == ModelFamily::kQwen2 || cfg.family == ModelFamily::kQwen3;
  if (qwen && !cfg.qk_norm && !cfg.qkv_bias) cfg.family = ModelFamily::kLlama;
  const int64_t layers = absl::GetFlag(FLAGS_layers);
  if (layers < 0 || layers > cfg.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("--layers=", layers, ": from 0 to the ",
                                                   cfg.num_hidden_layers, " of ", preset));
  }
  if (layers > 0) cfg.num_hidden_layers = layers;
  const std::string window = absl::GetFlag(FLAGS_window_layers);
  if (!window.empty()) {
    const std::vector<std::string> parts = absl::StrSplit(window, ',');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &cfg.sliding_window) ||
        !absl::SimpleAtoi(parts[1], &cfg.window_first_layer)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--window_layers=", window, ": expected W,FROM (e.g. 4096,14)"));
    }
    if (cfg.family != ModelFamily::kQwen2 && cfg.family != ModelFamily::kQwen3) {
      return absl::InvalidArgumentError(
          "--window_layers: Qwen2/Qwen3 presets only, with their "
          "extras (use_sliding_window is theirs)");
    }
    RETURN_IF_ERROR(ValidateConfig(cfg));
  }
  return cfg;
}

JobSpec BenchSpec() {
  JobSpec spec;
  const auto on_off = [](bool on) { return on ? OffloadChoice::kOn : OffloadChoice::kOff; };
  JobSpec::Memory& m = spec.memory;
  m.recompute = absl::GetFlag(FLAGS_recompute);
  m.attention_aware_blocks = absl::GetFlag(FLAGS_attention_aware_blocks);
  m.tile_tokens = absl::GetFlag(FLAGS_tile_tokens);
  m.head_chunk = absl::GetFlag(FLAGS_head_chunk);
  m.offload = on_off(absl::GetFlag(FLAGS_offload));
  m.offload_keep_last = absl::GetFlag(FLAGS_offload_keep_last);
  m.prefetch = on_off(absl::GetFlag(FLAGS_prefetch));
  m.recompute_interval = absl::GetFlag(FLAGS_recompute_interval);
  m.saved_block_inputs = absl::GetFlag(FLAGS_saved_block_inputs);
  m.overlap = on_off(absl::GetFlag(FLAGS_overlap));
  m.optimizer_offload = on_off(absl::GetFlag(FLAGS_optimizer_offload));
  m.param_offload = on_off(absl::GetFlag(FLAGS_param_offload));
  m.overlap_update = absl::GetFlag(FLAGS_overlap_update);
  spec.parallel.ring = absl::GetFlag(FLAGS_ring);
  spec.parallel.fsdp = absl::GetFlag(FLAGS_fsdp);
  spec.lora = LoraSpec();
  return spec;
}

LlamaModel::Options ModelOptions() {
  // The trainer's own spec -> options function; the loss tile is the benches' alone.
  LlamaModel::Options mo = ModelOptionsFromSpec(BenchSpec());
  mo.loss_tile_tokens = absl::GetFlag(FLAGS_loss_tile_tokens);
  // A mix resolved for the whole model, run on --layers of it: those are its last blocks.
  const int64_t layers = absl::GetFlag(FLAGS_layers);
  if (layers > 0 && mo.attention_aware_blocks > layers) mo.attention_aware_blocks = -1;
  return mo;
}

void SetMemoryFlags(const JobSpec::Memory& m) {
  absl::SetFlag(&FLAGS_recompute, m.recompute);
  absl::SetFlag(&FLAGS_attention_aware_blocks, m.attention_aware_blocks);
  absl::SetFlag(&FLAGS_head_chunk, m.head_chunk);
  absl::SetFlag(&FLAGS_tile_tokens, m.tile_tokens);
  absl::SetFlag(&FLAGS_offload, m.offload == OffloadChoice::kOn);
  absl::SetFlag(&FLAGS_offload_keep_last, m.offload_keep_last);
  absl::SetFlag(&FLAGS_prefetch, m.prefetch != OffloadChoice::kOff);
  absl::SetFlag(&FLAGS_recompute_interval, std::max<int64_t>(1, m.recompute_interval));
  absl::SetFlag(&FLAGS_saved_block_inputs, m.saved_block_inputs);
  absl::SetFlag(&FLAGS_overlap, m.overlap != OffloadChoice::kOff);
  absl::SetFlag(&FLAGS_optimizer_offload, m.optimizer_offload == OffloadChoice::kOn);
  absl::SetFlag(&FLAGS_param_offload, m.param_offload == OffloadChoice::kOn);
}

Json Techniques(const LlamaModel::Options& mo, const std::string& attention) {
  Json t;
  t.Str("recompute", RecomputePolicyName(mo.recompute))
      .Int("attention_aware_blocks", mo.attention_aware_blocks)
      .Bool("fsdp", mo.fsdp)
      .Bool("overlap", mo.overlap)
      .Bool("offload", mo.offload)
      .Int("offload_keep_last", mo.offload_keep_last)
      .Int("tile_tokens", mo.tile_tokens)
      .Int("loss_tile_tokens", mo.loss_tile_tokens)
      .Int("head_chunk", mo.head_chunk)
      .Int("recompute_interval", mo.recompute_interval)
      .Int("saved_block_inputs", mo.saved_block_inputs)
      .Bool("prefetch", mo.prefetch)
      .Bool("optimizer_offload", absl::GetFlag(FLAGS_optimizer_offload))
      .Bool("param_offload", mo.param_offload)
      .Bool("overlap_update", absl::GetFlag(FLAGS_overlap_update))
      .Int("lora_rank", absl::GetFlag(FLAGS_lora_rank))
      .Str("attention", attention);
  return t;
}

bool HopperAttentionRunsHere() {
  return cuda::HopperAttentionBuilt() && cuda::HopperAttentionDeviceSupported();
}

void PlanProbeKernels(int64_t probe_window, bool hopper_runs, PlanRequest* req) {
  if (probe_window <= 0) return;
  const LlamaConfig& c = req->cfg;
  const int64_t d = c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads;
  const AttentionKernel k =
      hopper_runs && (d == 64 || d == 128) ? AttentionKernel::kHopper : AttentionKernel::kCudnn;
  req->attention_forward = req->attention_backward = k;
}

absl::StatusOr<std::unique_ptr<Optimizer>> RandomOptimizer(LlamaModel* model,
                                                           const JobSpec::Training& hp) {
  const ParamLayout& layout = model->layout();
  ASSIGN_OR_RETURN(auto opt, Optimizer::CreateFilled(
                                 model,
                                 [&](int unit, float* out) {
                                   RandomUnitWeightsInto(layout, unit, 1234, out);
                                   return absl::OkStatus();
                                 },
                                 hp, absl::GetFlag(FLAGS_optimizer_offload)));
  opt->set_overlap_update(absl::GetFlag(FLAGS_overlap_update));
  return opt;
}

void AddPrediction(const MemoryPlan& plan, double step_s, Json* line) {
  const StepPrediction& p = plan.predicted;
  if (p.step_s <= 0) return;
  line->Num("predicted_step_s", p.step_s);
  if (step_s > 0) line->Num("predicted_rel_error", (p.step_s - step_s) / step_s);
  line->Num("predicted_forward_backward_s", p.forward_backward_s)
      .Num("predicted_update_s", p.update_s)
      .Num("predicted_gemm_s", p.gemm_s)
      .Num("predicted_attention_s", p.attention_s)
      .Num("predicted_elementwise_s", p.elementwise_s)
      .Num("predicted_transfer_s", p.transfer_s)
      .Num("predicted_forward_s", p.forward_s)
      .Num("predicted_regrow_s", p.regrow_s)
      .Num("predicted_recompute_s", p.recompute_s)
      .Num("predicted_collective_s", p.collective_s)
      .Str("rates", p.rates);
}

}  // namespace bench
}  // namespace ithaca
