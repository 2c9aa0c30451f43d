// Writes a random tiny Llama (config.json + model.safetensors), one sample, and Ithaca's CPU loss
// and parameter gradients, so llama_reference.py can check them against PyTorch.
//
//   dump_model_grads --out DIR [--untied] [--seq N] [--tile N] [--head-chunk U] [--offload]
//                    [--recompute none|full|attention-aware] [--docs 0,A,B,...]
//                    [--family llama|qwen2|qwen3|mistral] [--window W] [--rope linear|yarn]
// --docs packs the sample: documents start at the given positions (attention and RoPE restart
// at each, the label crossing into the next document is ignored). --family makes the tiny model
// one of that family: qwen2 with q/k/v biases, qwen3 with q/k norms and a head_dim of 24 (not
// hidden / heads), mistral with a sliding window of --window keys (default 5). --rope replaces
// llama3 rope_scaling with linear (factor 4) or yarn (factor 4 over an original 16 positions).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <optional>
#include <string>

#include "absl/strings/str_split.h"
#include "engine/backend/cpu/cpu_ops.h"
#include "engine/core/file_util.h"
#include "engine/model/weights.h"
#include "engine/schedule/llama.h"

namespace ithaca {
namespace {

absl::Status Run(int argc, char** argv) {
  std::string out, recompute = "full";
  bool untied = false, offload = false;
  int64_t seq = 37, tile = 8, head_chunk = 0;
  // Under attention-aware, the last N blocks keep O and LSE (-1: all); under offload, the last N
  // blocks' saved data stays on the device (the split auto plans where neither side holds all).
  int64_t aware_blocks = -1, offload_keep_last = 0;
  DocumentMask docs;
  std::string family = "llama", rope;
  int64_t window = 5;
  int64_t window_from = -1;  // Qwen2/Qwen3: the window (--window) from this layer on; -1: none
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--out")
      out = next();
    else if (a == "--untied")
      untied = true;
    else if (a == "--seq")
      seq = std::stoll(next());
    else if (a == "--tile")
      tile = std::stoll(next());
    else if (a == "--recompute")
      recompute = next();
    else if (a == "--head-chunk")
      head_chunk = std::stoll(next());
    else if (a == "--offload")
      offload = true;
    else if (a == "--aware-blocks")
      aware_blocks = std::stoll(next());
    else if (a == "--offload-keep-last")
      offload_keep_last = std::stoll(next());
    else if (a == "--family")
      family = next();
    else if (a == "--window")
      window = std::stoll(next());
    else if (a == "--window-from")
      window_from = std::stoll(next());
    else if (a == "--rope")
      rope = next();
    else if (a == "--docs")
      for (const absl::string_view d : absl::StrSplit(next(), ',')) {
        docs.starts.push_back(std::stoll(std::string(d)));
      }
    else
      return absl::InvalidArgumentError("unknown flag " + a);
  }
  if (out.empty()) return absl::InvalidArgumentError("--out is required");
  ASSIGN_OR_RETURN(LlamaConfig cfg, PresetConfig("tiny"));
  cfg.tie_word_embeddings = !untied;
  // Short original context so rope_scaling's low, medium and high frequency bands all occur.
  cfg.rope.original_max_position = 16;
  if (family == "qwen2") {
    cfg.family = ModelFamily::kQwen2;
    cfg.qkv_bias = true;
  } else if (family == "qwen3") {
    cfg.family = ModelFamily::kQwen3;
    cfg.qk_norm = true;
    cfg.head_dim = 24;
    cfg.rope.head_dim = 24;
  } else if (family == "mistral" && window_from >= 0) {
    return absl::InvalidArgumentError("--window-from is Qwen2/Qwen3's (max_window_layers)");
  } else if (family == "mistral") {
    cfg.family = ModelFamily::kMistral;
    cfg.sliding_window = window;
  } else if (family != "llama") {
    return absl::InvalidArgumentError("unknown --family " + family);
  }
  if (window_from >= 0 && (family == "qwen2" || family == "qwen3")) {  // use_sliding_window
    cfg.sliding_window = window;
    cfg.window_first_layer = window_from;
  }
  if (rope == "linear") {
    cfg.rope.type = RopeType::kLinear;
    cfg.rope.factor = 4.0;
  } else if (rope == "yarn") {
    cfg.rope.type = RopeType::kYarn;
    cfg.rope.factor = 4.0;
    cfg.rope.attention_factor = 0.1 * std::log(4.0) + 1.0;
  } else if (!rope.empty()) {
    return absl::InvalidArgumentError("unknown --rope " + rope);
  }

  CpuOps ops;
  HostAllocator alloc;
  LlamaModel::Options opts;
  const std::optional<RecomputePolicy> policy = RecomputePolicyFromName(recompute);
  if (!policy) return absl::InvalidArgumentError("--recompute=" + recompute + ": unknown policy");
  opts.recompute = *policy;
  opts.head_chunk = head_chunk;
  opts.offload = offload;
  opts.offload_keep_last = offload_keep_last;
  opts.attention_aware_blocks = aware_blocks;
  opts.tile_tokens = tile;
  opts.loss_tile_tokens = tile - 3;
  ASSIGN_OR_RETURN(auto model, LlamaModel::Create(cfg, &ops, &alloc, opts));
  // Larger than the usual 0.02 so gradients are well above rounding noise.
  HostWeights w = RandomWeights(model->layout(), 7);
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.f, 0.1f);
  for (size_t u = 0; u < w.size(); ++u) {
    for (const ParamEntry& e : model->layout().units()[u].entries) {
      float* p = w[u].data() + e.offset;
      for (int64_t i = 0; i < NumElements(e.shape); ++i)
        p[i] = e.is_matrix ? p[i] * 5.f : e.is_bias ? 3.f * noise(rng) : 1.f + noise(rng);
    }
  }
  std::vector<const float*> ptrs;
  for (size_t u = 0; u < w.size(); ++u) {
    ops.Upload(w[u].data(), DType::kF32, model->params().working_shard(u));
    ptrs.push_back(w[u].data());
  }
  RETURN_IF_ERROR(
      WriteHfCheckpoint(out + "/model", cfg, model->layout(), ptrs, DType::kF32, int64_t{1} << 40));

  std::vector<int32_t> inputs(seq), labels(seq);
  std::uniform_int_distribution<int> tok(0, cfg.vocab_size - 1);
  for (int64_t i = 0; i < seq; ++i) inputs[i] = tok(rng);
  for (int64_t i = 0; i < seq; ++i) labels[i] = i + 1 < seq ? inputs[i + 1] : -1;
  labels[seq / 2] = -1;  // an ignored label in the middle
  for (size_t d = 1; d < docs.starts.size(); ++d) labels[docs.starts[d] - 1] = -1;
  const int64_t labelled =
      std::count_if(labels.begin(), labels.end(), [](int v) { return v >= 0; });
  ASSIGN_OR_RETURN(LossSum loss,
                   model->ForwardBackward(inputs.data(), labels.data(), seq, 1.f / labelled, docs));
  if (loss.tokens != labelled) return absl::InternalError("token count mismatch");

  SafetensorsWriter grads;
  std::vector<float> loss_v = {static_cast<float>(loss.loss_sum / loss.tokens)};
  std::vector<float> in_f(inputs.begin(), inputs.end()), lab_f(labels.begin(), labels.end());
  grads.Add("loss", DType::kF32, {1}, loss_v.data(), DType::kF32);
  grads.Add("inputs", DType::kF32, {seq}, in_f.data(), DType::kF32);
  grads.Add("labels", DType::kF32, {seq}, lab_f.data(), DType::kF32);
  std::vector<float> docs_f(docs.starts.begin(), docs.starts.end());
  if (!docs_f.empty()) {
    grads.Add("doc_starts", DType::kF32, {static_cast<int64_t>(docs_f.size())}, docs_f.data(),
              DType::kF32);
  }
  std::vector<std::vector<float>> host(w.size());
  for (size_t u = 0; u < w.size(); ++u) {
    const ParamUnit& unit = model->layout().units()[u];
    host[u].resize(unit.numel);
    ops.Download(model->params().grad_shard(u), host[u].data(), DType::kF32);
    for (const ParamEntry& e : unit.entries)
      grads.Add(e.hf_name, DType::kF32, e.shape, host[u].data() + e.offset, DType::kF32);
  }
  RETURN_IF_ERROR(grads.WriteFile(out + "/grads.safetensors"));
  std::printf("loss %.6f over %lld tokens\n", loss_v[0], static_cast<long long>(loss.tokens));
  return absl::OkStatus();
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::Status st = ithaca::Run(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "dump_model_grads: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
