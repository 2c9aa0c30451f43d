// Ithaca's step-0 loss on checkpoints written by transformers equals the loss transformers
// computed on them (in float64), within 1e-5 relative. Each directory under models/ holds what
// make_golden.py saved: config.json in one of the two dialects, the weights (one file, or
// shards behind model.safetensors.index.json) and golden.json (token ids, labels, the loss).
// The checkpoint is loaded the way a job spec's model.config / model.weights are.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/core/file_util.h"
#include "engine/memory/allocator.h"
#include "engine/model/config.h"
#include "engine/schedule/llama.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"

namespace ithaca {
namespace {

using Json = nlohmann::json;

constexpr double kRelativeTolerance = 1e-5;

std::string FixtureDir(const std::string& name) {
  return std::string(std::getenv("TEST_SRCDIR")) + "/ithaca/tests/golden/models/" + name;
}

struct Golden {
  std::vector<int32_t> inputs;
  std::vector<int32_t> labels;  // shifted: labels[i] is the target after inputs[i]; < 0 ignored
  double loss = 0;
};

// golden.json keeps transformers' convention: labels aligned with input_ids (the model shifts
// them) and -100 for ignored positions.
absl::StatusOr<Golden> ReadGolden(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/golden.json"));
  const Json j = Json::parse(text);
  Golden g;
  const std::vector<int64_t> ids = j.at("input_ids").get<std::vector<int64_t>>();
  const std::vector<int64_t> hf_labels = j.at("labels").get<std::vector<int64_t>>();
  if (ids.size() != hf_labels.size() || ids.size() < 2) {
    return absl::InvalidArgumentError(dir + "/golden.json: input_ids and labels differ in length");
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    g.inputs.push_back(static_cast<int32_t>(ids[i]));
    g.labels.push_back(i + 1 < ids.size() ? static_cast<int32_t>(hf_labels[i + 1]) : -1);
  }
  for (int32_t& l : g.labels) l = l < 0 ? -1 : l;
  g.loss = j.at("loss").get<double>();
  return g;
}

// The mean cross-entropy over the labelled tokens of one sample, computed by LlamaModel on the
// CPU backend (f32) with `cfg` and the checkpoint's weights.
absl::StatusOr<double> IthacaLoss(const LlamaConfig& cfg, const SafetensorsReader& reader,
                                  const Golden& g) {
  CpuOps ops;
  HostAllocator alloc;
  ASSIGN_OR_RETURN(auto model, LlamaModel::Create(cfg, &ops, &alloc, LlamaModel::Options()));
  for (int u = 0; u < model->layout().num_units(); ++u) {
    ASSIGN_OR_RETURN(std::vector<float> w, ReadUnitWeights(model->layout(), reader, u));
    ops.Upload(w.data(), DType::kF32, model->params().working_shard(u));
  }
  ASSIGN_OR_RETURN(LossSum sum, model->ForwardBackward(g.inputs.data(), g.labels.data(),
                                                       static_cast<int64_t>(g.inputs.size()), 1.f));
  if (sum.tokens == 0) return absl::InternalError("no labelled tokens");
  return sum.loss_sum / static_cast<double>(sum.tokens);
}

struct Fixture {
  const char* name;
  bool sharded;  // weights behind model.safetensors.index.json
};

// Every directory make_golden.py writes; see README.md for what each covers.
constexpr Fixture kFixtures[] = {
    {"hub_gqa_tied_llama3", false},
    {"v5_gqa_untied_llama3", false},
    {"v5_mha_untied_default", false},
    {"hub_mha_tied_default_head_dim", false},
    {"v5_gqa_untied_llama3_bf16_sharded", true},
};

TEST(GoldenLossTest, StepZeroLossMatchesTransformers) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(f.name);
    const std::string dir = FixtureDir(f.name);
    EXPECT_EQ(PathExists(dir + "/model.safetensors.index.json"), f.sharded);
    auto cfg = LoadConfigJson(dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    auto reader = SafetensorsReader::Open(dir);
    ASSERT_TRUE(reader.ok()) << reader.status();
    auto golden = ReadGolden(dir);
    ASSERT_TRUE(golden.ok()) << golden.status();

    auto loss = IthacaLoss(*cfg, **reader, *golden);
    ASSERT_TRUE(loss.ok()) << loss.status();
    std::printf("%s: Ithaca %.9f, transformers %.9f, relative difference %.2e\n", f.name, *loss,
                golden->loss, std::fabs(*loss - golden->loss) / golden->loss);
    EXPECT_NEAR(*loss, golden->loss, kRelativeTolerance * golden->loss)
        << "Ithaca " << *loss << ", transformers " << golden->loss;
  }
}

// The failure the fixtures guard against: a config whose RoPE settings are dropped (theta back
// to 10000, no llama3 scaling) trains another model. Its loss must miss the golden one by far
// more than the tolerance, or the test above could not catch it.
TEST(GoldenLossTest, DroppingTheRopeSettingsMissesTheGoldenLoss) {
  int checked = 0;
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(f.name);
    const std::string dir = FixtureDir(f.name);
    auto cfg = LoadConfigJson(dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    if ((cfg->rope.type != RopeType::kLlama3) && cfg->rope_theta == 10000.0) continue;
    auto reader = SafetensorsReader::Open(dir);
    ASSERT_TRUE(reader.ok()) << reader.status();
    auto golden = ReadGolden(dir);
    ASSERT_TRUE(golden.ok()) << golden.status();

    LlamaConfig wrong = *cfg;
    wrong.rope_theta = wrong.rope.theta = 10000.0;
    wrong.rope.type = RopeType::kDefault;
    auto loss = IthacaLoss(wrong, **reader, *golden);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_GT(std::fabs(*loss - golden->loss), 100 * kRelativeTolerance * golden->loss)
        << "loss with default RoPE " << *loss << ", golden " << golden->loss;
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

}  // namespace
}  // namespace ithaca
