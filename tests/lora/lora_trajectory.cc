// A LoRA fine-tune of a random tiny Llama on the CPU, for lora_reference.py to check against
// PyTorch: writes the base model, a PEFT adapter to start from (B not zero, so every adapter
// matters from the first step), each step's sample, and then trains `--steps` AdamW steps of the
// adapters through LlamaModel and Optimizer (the trainer's pieces), starting from those files as
// the trainer does (ReadUnitWeightsInto, OpenPeftAdapter). Writes every step's loss and gradient
// norm, and the final adapters as a PEFT directory. Fails when a base weight changed by a bit.
//
//   lora_trajectory --out DIR [--steps N] [--seq N] [--tile N] [--head-chunk U]
//                   [--recompute none|full|attention-aware]
#include <cstdio>
#include <cstring>
#include <random>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/cpu_ops.h"
#include "engine/core/file_util.h"
#include "engine/model/lora_adapter.h"
#include "engine/model/weights.h"
#include "engine/schedule/llama.h"
#include "engine/train/optimizer.h"

namespace ithaca {
namespace {

absl::Status Run(int argc, char** argv) {
  std::string out, recompute = "full";
  int64_t steps = 20, seq = 33, tile = 8, head_chunk = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--out") {
      out = next();
    } else if (a == "--steps") {
      steps = std::stoll(next());
    } else if (a == "--seq") {
      seq = std::stoll(next());
    } else if (a == "--tile") {
      tile = std::stoll(next());
    } else if (a == "--head-chunk") {
      head_chunk = std::stoll(next());
    } else if (a == "--recompute") {
      recompute = next();
    } else {
      return absl::InvalidArgumentError("unknown flag " + a);
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("--out is required");

  // The base, random (larger than the usual 0.02, so the adapters' gradients are well above
  // rounding), written as a Hugging Face model.
  ASSIGN_OR_RETURN(const LlamaConfig base_cfg, PresetConfig("tiny"));
  const ParamLayout base_layout(base_cfg);
  HostWeights base = RandomWeights(base_layout, 7);
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.f, 0.1f);
  std::vector<const float*> base_ptrs;
  for (size_t u = 0; u < base.size(); ++u) {
    for (const ParamEntry& e : base_layout.units()[u].entries) {
      float* p = base[u].data() + e.offset;
      for (int64_t i = 0; i < NumElements(e.shape); ++i) {
        p[i] = e.is_matrix ? p[i] * 5.f : 1.f + noise(rng);
      }
    }
    base_ptrs.push_back(base[u].data());
  }
  RETURN_IF_ERROR(WriteHfCheckpoint(out + "/model", base_cfg, base_layout, base_ptrs, DType::kF32,
                                    int64_t{1} << 40));

  // The adapter to start from: PEFT's init for A, and B drawn too (PEFT's is zero).
  LlamaConfig cfg = base_cfg;
  cfg.lora.rank = 4;
  cfg.lora.alpha = 8;
  for (bool& t : cfg.lora.targets) t = true;
  const ParamLayout layout(cfg);
  HostWeights start(layout.num_units());
  std::vector<const float*> start_ptrs(layout.num_units(), nullptr);
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const int u = layout.lora_unit(l);
    start[u].resize(layout.units()[u].numel);
    LoraInitUnitInto(layout, u, 11, start[u].data());
    for (size_t i = 1; i < layout.units()[u].entries.size(); i += 2) {
      const ParamEntry& e = layout.units()[u].entries[i];
      for (int64_t j = 0; j < NumElements(e.shape); ++j) start[u][e.offset + j] = noise(rng);
    }
    start_ptrs[u] = start[u].data();
  }
  RETURN_IF_ERROR(WritePeftAdapter(out + "/adapter_start", cfg, layout, start_ptrs, "tiny"));

  CpuOps ops;
  HostAllocator alloc;
  LlamaModel::Options opts;
  const std::optional<RecomputePolicy> policy = RecomputePolicyFromName(recompute);
  if (!policy) return absl::InvalidArgumentError("--recompute=" + recompute + ": unknown policy");
  opts.recompute = *policy;
  opts.head_chunk = head_chunk;
  opts.tile_tokens = tile;
  opts.loss_tile_tokens = tile;
  ASSIGN_OR_RETURN(auto model, LlamaModel::Create(cfg, &ops, &alloc, opts));
  JobSpec::Training hp;
  hp.weight_decay = 0.1;
  hp.grad_clip = 1.0;
  ASSIGN_OR_RETURN(auto model_reader, SafetensorsReader::Open(out + "/model/model.safetensors"));
  ASSIGN_OR_RETURN(auto adapter, OpenPeftAdapter(out + "/adapter_start", cfg.lora));
  auto fill = [&](int u, float* to) -> absl::Status {
    if (layout.units()[u].trainable) return ReadPeftUnitInto(layout, *adapter, u, to);
    return ReadUnitWeightsInto(layout, *model_reader, u, to);
  };
  ASSIGN_OR_RETURN(auto optimizer, Optimizer::CreateFilled(model.get(), fill, hp));

  std::uniform_int_distribution<int> tok(0, static_cast<int>(cfg.vocab_size) - 1);
  std::vector<float> samples, losses, norms;
  const double lr = 1e-2;
  ParamStore& ps = model->params();
  for (int64_t step = 1; step <= steps; ++step) {
    std::vector<int32_t> inputs(seq), labels(seq);
    for (int64_t i = 0; i < seq; ++i) inputs[i] = tok(rng);
    for (int64_t i = 0; i < seq; ++i) labels[i] = i + 1 < seq ? inputs[i + 1] : -1;
    for (int32_t v : inputs) samples.push_back(static_cast<float>(v));
    ps.ZeroGrads();
    ASSIGN_OR_RETURN(LossSum loss,
                     model->ForwardBackward(inputs.data(), labels.data(), seq, 1.f / (seq - 1)));
    RETURN_IF_ERROR(ps.FinishGradients());
    ASSIGN_OR_RETURN(Optimizer::StepResult r, optimizer->Step(step, lr));
    losses.push_back(static_cast<float>(loss.loss_sum / loss.tokens));
    norms.push_back(static_cast<float>(r.grad_norm));
    std::printf("step %lld loss %.6f grad_norm %.6f\n", static_cast<long long>(step), losses.back(),
                norms.back());
  }

  // The base, bit for bit.
  for (int u = 0; u < layout.num_units(); ++u) {
    if (layout.units()[u].trainable) continue;
    std::vector<float> now(layout.units()[u].numel);
    ops.Download(ps.working_shard(u), now.data(), DType::kF32);
    if (std::memcmp(now.data(), base[u].data(), now.size() * sizeof(float)) != 0) {
      return absl::InternalError(
          absl::StrCat("base unit ", layout.units()[u].name, " changed in training"));
    }
  }
  ASSIGN_OR_RETURN(HostWeights trained, optimizer->GatherMasterWeights());
  std::vector<const float*> trained_ptrs;
  for (const auto& unit : trained) trained_ptrs.push_back(unit.data());
  RETURN_IF_ERROR(WritePeftAdapter(out + "/adapter_trained", cfg, layout, trained_ptrs, "tiny"));
  SafetensorsWriter run;
  run.Add("samples", DType::kF32, {steps, seq}, samples.data(), DType::kF32);
  run.Add("losses", DType::kF32, {steps}, losses.data(), DType::kF32);
  run.Add("grad_norms", DType::kF32, {steps}, norms.data(), DType::kF32);
  return run.WriteFile(out + "/run.safetensors");
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::Status st = ithaca::Run(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "lora_trajectory: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
