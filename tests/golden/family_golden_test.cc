// Qwen3, Qwen2, Mistral and linear / yarn RoPE against transformers itself: each directory
// models/family_* holds what make_family_golden.py saved (config.json in one of the two
// dialects, model.safetensors), golden.json (token ids, labels, transformers' float64 loss) and
// grads.safetensors (transformers' float64 gradient of that loss for every parameter). Ithaca's
// step-0 loss (CPU, f32) must be within 1e-5 relative and every gradient within 2e-4 of its
// tensor's largest entry; the loss without the fixture's feature (no window, no rope scaling)
// must be far from the golden one, so the check can fail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/core/file_util.h"
#include "engine/memory/allocator.h"
#include "engine/model/config.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "engine/schedule/llama.h"

namespace ithaca {
namespace {

using Json = nlohmann::json;

std::string FixtureDir(const std::string& name) {
  return std::string(std::getenv("TEST_SRCDIR")) + "/ithaca/tests/golden/models/" + name;
}

// Every directory make_family_golden.py writes, and the model family it must parse to.
struct Fixture {
  const char* name;
  ModelFamily family;
  RopeType rope;
};
constexpr Fixture kFixtures[] = {
    {"family_qwen3_hub_tied", ModelFamily::kQwen3, RopeType::kDefault},
    {"family_qwen3_v5_yarn", ModelFamily::kQwen3, RopeType::kYarn},
    {"family_qwen2_hub_tied", ModelFamily::kQwen2, RopeType::kDefault},
    {"family_qwen2_v5_linear", ModelFamily::kQwen2, RopeType::kLinear},
    {"family_qwen2_hub_window_layers", ModelFamily::kQwen2, RopeType::kDefault},
    {"family_qwen3_v5_window_layers", ModelFamily::kQwen3, RopeType::kDefault},
    {"family_mistral_v5_window", ModelFamily::kMistral, RopeType::kDefault},
    {"family_mistral_hub_nowindow", ModelFamily::kMistral, RopeType::kDefault},
    {"family_llama_hub_linear", ModelFamily::kLlama, RopeType::kLinear},
    {"family_llama_v5_yarn_explicit", ModelFamily::kLlama, RopeType::kYarn},
};

struct Golden {
  std::vector<int32_t> inputs, labels;  // labels shifted; < 0 ignored
  double loss = 0;
};

absl::StatusOr<Golden> ReadGolden(const std::string& dir) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(dir + "/golden.json"));
  const Json j = Json::parse(text);
  const std::vector<int64_t> ids = j.at("input_ids").get<std::vector<int64_t>>();
  const std::vector<int64_t> hf = j.at("labels").get<std::vector<int64_t>>();
  Golden g;
  for (size_t i = 0; i < ids.size(); ++i) {
    g.inputs.push_back(static_cast<int32_t>(ids[i]));
    g.labels.push_back(i + 1 < ids.size() && hf[i + 1] >= 0 ? static_cast<int32_t>(hf[i + 1]) : -1);
  }
  g.loss = j.at("loss").get<double>();
  return g;
}

struct Result {
  double loss = 0;
  HostWeights grads;  // one f32 vector per unit
};

absl::StatusOr<Result> RunStep(const LlamaConfig& cfg, const SafetensorsReader& reader,
                               const Golden& g) {
  CpuOps ops;
  HostAllocator alloc;
  ASSIGN_OR_RETURN(auto model, LlamaModel::Create(cfg, &ops, &alloc, LlamaModel::Options()));
  const ParamLayout& layout = model->layout();
  for (int u = 0; u < layout.num_units(); ++u) {
    ASSIGN_OR_RETURN(std::vector<float> w, ReadUnitWeights(layout, reader, u));
    ops.Upload(w.data(), DType::kF32, model->params().working_shard(u));
  }
  int64_t labelled = 0;
  for (int32_t l : g.labels) labelled += l >= 0;
  ASSIGN_OR_RETURN(LossSum sum,
                   model->ForwardBackward(g.inputs.data(), g.labels.data(),
                                          static_cast<int64_t>(g.inputs.size()), 1.f / labelled));
  Result r;
  r.loss = sum.loss_sum / static_cast<double>(sum.tokens);
  for (int u = 0; u < layout.num_units(); ++u) {
    r.grads.emplace_back(layout.units()[u].numel);
    ops.Download(model->params().grad_shard(u), r.grads.back().data(), DType::kF32);
  }
  return r;
}

TEST(FamilyGoldenTest, LossAndEveryGradientMatchTransformers) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(f.name);
    const std::string dir = FixtureDir(f.name);
    auto cfg = LoadConfigJson(dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    EXPECT_EQ(ModelTypeName(cfg->family), std::string(ModelTypeName(f.family)));
    EXPECT_EQ(RopeTypeName(cfg->rope.type), std::string(RopeTypeName(f.rope)));
    auto reader = SafetensorsReader::Open(dir + "/model.safetensors");
    ASSERT_TRUE(reader.ok()) << reader.status();
    auto want = SafetensorsReader::Open(dir + "/grads.safetensors");
    ASSERT_TRUE(want.ok()) << want.status();
    auto golden = ReadGolden(dir);
    ASSERT_TRUE(golden.ok()) << golden.status();
    auto got = RunStep(*cfg, **reader, *golden);
    ASSERT_TRUE(got.ok()) << got.status();
    std::printf("%s: Ithaca %.9f, transformers %.9f\n", f.name, got->loss, golden->loss);
    EXPECT_NEAR(got->loss, golden->loss, 1e-5 * golden->loss);

    const ParamLayout layout(*cfg);
    int checked = 0;
    for (int u = 0; u < layout.num_units(); ++u) {
      for (const ParamEntry& e : layout.units()[u].entries) {
        std::vector<float> ref(NumElements(e.shape));
        ASSERT_TRUE((*want)->Read(e.hf_name, e.shape, DType::kF32, ref.data()).ok()) << e.hf_name;
        double scale = 0, err = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          scale = std::max(scale, std::fabs(double(ref[i])));
          err = std::max(err, std::fabs(double(ref[i]) - got->grads[u][e.offset + i]));
        }
        EXPECT_GT(scale, 0) << e.hf_name;
        EXPECT_LE(err, 2e-4 * scale + 1e-7) << e.hf_name << " max|ref| " << scale;
        ++checked;
      }
    }
    EXPECT_EQ(checked, static_cast<int>((*want)->Names().size()));
  }
}

// Without the fixture's feature the same weights give another loss, by far more than the
// tolerance: the window dropped (Mistral, Qwen2/Qwen3's window layers, which also differ from a
// window on every layer) or the rope scaling dropped (linear, yarn).
TEST(FamilyGoldenTest, DroppingTheFeatureMissesTheGoldenLoss) {
  int checked = 0;
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(f.name);
    const std::string dir = FixtureDir(f.name);
    auto cfg = LoadConfigJson(dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    auto reader = SafetensorsReader::Open(dir + "/model.safetensors");
    ASSERT_TRUE(reader.ok()) << reader.status();
    auto golden = ReadGolden(dir);
    ASSERT_TRUE(golden.ok()) << golden.status();
    // 1e-4 of the loss: ten times the golden tolerance (Qwen2 linear moves it by 8.7e-4).
    auto expect_missed = [&](const LlamaConfig& other) {
      auto got = RunStep(other, **reader, *golden);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_GT(std::fabs(got->loss - golden->loss), 1e-4 * golden->loss) << got->loss;
    };
    LlamaConfig wrong = *cfg;
    if (cfg->sliding_window > 0 && cfg->window_first_layer > 0) {
      // Qwen2/Qwen3's window on some layers: on every layer is not it either.
      LlamaConfig everywhere = *cfg;
      everywhere.window_first_layer = 0;
      expect_missed(everywhere);
      wrong.sliding_window = 0;
      wrong.window_first_layer = 0;
    } else if (cfg->sliding_window > 0) {
      wrong.sliding_window = 0;
    } else if (cfg->rope.type != RopeType::kDefault) {
      wrong.rope.type = RopeType::kDefault;
    } else {
      continue;
    }
    expect_missed(wrong);
    ++checked;
  }
  EXPECT_EQ(checked, 7);
}

}  // namespace
}  // namespace ithaca
