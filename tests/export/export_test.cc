// The inference export: what a job's checkpoint.export and ExportCheckpoint write (complete
// transformers layout, shards behind an index, tokenizer files), that the bf16 export scores
// within 1e-2 of the f32 checkpoint and the f32 export identically, and that bad input is a
// clear error that leaves nothing behind.
#include "engine/checkpoint/export.h"

#include <dirent.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/core/file_util.h"
#include "engine/model/config.h"
#include "engine/model/params.h"
#include "engine/model/safetensors.h"
#include "engine/checkpoint/checkpoint.h"
#include "tests/export/export_testing.h"
#include "engine/checkpoint/model_loss.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/token_file.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using Json = nlohmann::json;

std::string TmpDir(const std::string& name) {
  std::string d = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  EXPECT_TRUE(MakeDirs(d).ok());
  return d;
}

std::set<std::string> List(const std::string& dir) {
  std::set<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.insert(n);
  }
  closedir(d);
  return names;
}

Json ReadJson(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? Json::parse(*text) : Json();
}

// One short training run shared by the tests (the trainer exports it as bf16 at its end).
class ExportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<TinyJob> job =
        TrainTinyJob(TmpDir("job"), "engine/data/testdata/tiny_corpus.txt", 8, "bf16");
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = new TinyJob(*job);
  }
  static void TearDownTestSuite() { delete job_; }

  // The checkpoint's step directory.
  static std::string Step() {
    absl::StatusOr<std::string> step = FindCheckpoint(job_->checkpoint_dir);
    EXPECT_TRUE(step.ok()) << step.status();
    return step.ok() ? *step : "";
  }

  // 200 tokens of the training text.
  static std::vector<int32_t> Ids() {
    std::string text = *ReadFileToString("engine/data/testdata/tiny_corpus.txt");
    std::vector<uint32_t> tokens = ByteTokenize(text.substr(0, 199));
    return std::vector<int32_t>(tokens.begin(), tokens.end());
  }

  static TinyJob* job_;
};
TinyJob* ExportTest::job_ = nullptr;

TEST_F(ExportTest, TheJobsExportIsATransformersDirectory) {
  const std::string out = Trainer::ExportDir([] {
    JobSpec s;
    s.checkpoint.dir = job_->checkpoint_dir;
    return s;
  }());
  EXPECT_EQ(out, job_->checkpoint_dir + "/export");
  EXPECT_EQ(List(out), (std::set<std::string>{"config.json", "generation_config.json",
                                              "model.safetensors", "special_tokens_map.json",
                                              "tokenizer.json", "tokenizer_config.json"}));
  // Nothing else next to it: the step directory and the export.
  EXPECT_EQ(List(job_->checkpoint_dir),
            (std::set<std::string>{"export", Step().substr(Step().rfind('/') + 1)}));
  const Json cfg = ReadJson(out + "/config.json");
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["architectures"], Json::array({"LlamaForCausalLM"}));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "generation_config.json"}) {
    EXPECT_EQ(*ReadFileToString(out + "/" + f), *ReadFileToString(job_->model_dir + "/" + f)) << f;
  }
  auto reader = SafetensorsReader::Open(out);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (const std::string& name : (*reader)->Names()) {
    EXPECT_EQ((*reader)->Info(name)->dtype, DType::kBF16) << name;
  }
}

// A model trained past its config's context is exported as one that serves that length; RoPE
// comes from the checkpoint's config.json (what [model.rope] made it), untouched.
TEST_F(ExportTest, MaxPositionEmbeddingsIsRaisedToTheTrainedLength) {
  const Json saved = ReadJson(Step() + "/model/config.json");
  const int64_t context = saved["max_position_embeddings"].get<int64_t>();
  ExportOptions options;
  options.dtype = DType::kF32;
  options.trained_seq_len = 4 * context;
  const std::string longer = TmpDir("longer") + "/model";
  ASSERT_TRUE(ExportCheckpoint(Step(), longer, options).ok());
  const Json cfg = ReadJson(longer + "/config.json");
  EXPECT_EQ(cfg["max_position_embeddings"], 4 * context);
  EXPECT_EQ(cfg["rope_theta"], saved["rope_theta"]);
  EXPECT_EQ(cfg["rope_scaling"], saved["rope_scaling"]);
  // Never lowered: a shorter run keeps the model's context.
  options.trained_seq_len = context / 2;
  const std::string shorter = TmpDir("shorter") + "/model";
  ASSERT_TRUE(ExportCheckpoint(Step(), shorter, options).ok());
  EXPECT_EQ(ReadJson(shorter + "/config.json")["max_position_embeddings"], context);
}

TEST_F(ExportTest, ShardsAreIndexedAndCoverEveryTensor) {
  const std::string out = TmpDir("sharded") + "/model";
  ExportOptions options;
  options.dtype = DType::kBF16;
  options.max_shard_bytes = 40 << 10;  // the tiny model is a few hundred KiB: several shards
  options.source_model_dir = job_->model_dir;
  absl::Status st = ExportCheckpoint(Step(), out, options);
  ASSERT_TRUE(st.ok()) << st;

  auto source = SafetensorsReader::Open(Step() + "/model");
  ASSERT_TRUE(source.ok()) << source.status();
  const Json index = ReadJson(out + "/model.safetensors.index.json");
  const Json& map = index["weight_map"];
  std::set<std::string> shards;
  int64_t total = 0;
  for (const std::string& name : (*source)->Names()) {
    ASSERT_TRUE(map.contains(name)) << name << " missing from the index";
    shards.insert(map[name].get<std::string>());
    auto info = (*source)->Info(name);
    total += NumElements(info->shape) * 2;
  }
  EXPECT_EQ(map.size(), (*source)->Names().size());
  EXPECT_GE(shards.size(), 3u);
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
  std::set<std::string> expected = {
      "config.json",           "model.safetensors.index.json", "tokenizer.json",
      "tokenizer_config.json", "special_tokens_map.json",      "generation_config.json"};
  expected.insert(shards.begin(), shards.end());
  EXPECT_EQ(List(out), expected);
  for (const std::string& s : shards) {
    EXPECT_NE(s.find("-of-"), std::string::npos) << s;
    auto shard = SafetensorsReader::Open(out + "/" + s);
    ASSERT_TRUE(shard.ok()) << shard.status();
    for (const std::string& name : (*shard)->Names()) EXPECT_EQ(map[name], s) << name;
  }
  EXPECT_EQ(ReadJson(out + "/config.json")["torch_dtype"], "bfloat16");
  EXPECT_EQ(List(out.substr(0, out.rfind('/'))), std::set<std::string>{"model"});
}

TEST_F(ExportTest, Bf16ScoresCloseToTheCheckpointAndF32Identically) {
  const std::string dir = TmpDir("losses");
  ExportOptions f32;
  f32.dtype = DType::kF32;
  ASSERT_TRUE(ExportCheckpoint(Step(), dir + "/f32", f32).ok());
  EXPECT_EQ(ReadJson(dir + "/f32/config.json")["torch_dtype"], "float32");

  const std::vector<int32_t> ids = Ids();
  auto reference = ComputeModelLoss(Step() + "/model", ids);
  auto bf16 = ComputeModelLoss(job_->checkpoint_dir + "/export", ids);
  auto same = ComputeModelLoss(dir + "/f32", ids);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(reference->tokens, static_cast<int64_t>(ids.size()) - 1);
  std::printf("checkpoint %.9f, bf16 export %.9f, f32 export %.9f\n", reference->loss, bf16->loss,
              same->loss);
  EXPECT_EQ(same->loss, reference->loss);
  EXPECT_NEAR(bf16->loss, reference->loss, 1e-2 * reference->loss);
  EXPECT_NE(bf16->loss, reference->loss) << "the bf16 export should round the weights";
  // Trained, not random: well below the uniform loss log(258).
  EXPECT_LT(reference->loss, std::log(258.0) - 0.5);
}

// Qwen3, Qwen2 and a windowed Mistral train, checkpoint and export as their own family: the
// exported config.json names the family's architecture and keys, the family's tensors (q/k
// norms, q/k/v biases) are in the safetensors under their Hugging Face names, and the f32 export
// scores exactly as the checkpoint does.
TEST(FamilyExportTest, EachFamilyExportsAsItself) {
  struct Family {
    const char* name;
    const char* architecture;
    const char* tensor;  // one tensor only this family has ("" for none)
  };
  for (const Family& f :
       {Family{"qwen3", "Qwen3ForCausalLM", "model.layers.1.self_attn.k_norm.weight"},
        Family{"qwen2", "Qwen2ForCausalLM", "model.layers.0.self_attn.v_proj.bias"},
        Family{"mistral", "MistralForCausalLM", ""}}) {
    SCOPED_TRACE(f.name);
    LlamaConfig cfg = *PresetConfig("tiny");
    const std::string name = f.name;
    if (name == "qwen3") {
      cfg.family = ModelFamily::kQwen3;
      cfg.qk_norm = true;
      cfg.head_dim = cfg.rope.head_dim = 24;
    } else if (name == "qwen2") {
      cfg.family = ModelFamily::kQwen2;
      cfg.qkv_bias = true;
    } else {
      cfg.family = ModelFamily::kMistral;
      cfg.sliding_window = 9;
    }
    const std::string dir = TmpDir(std::string("family_") + f.name);
    absl::StatusOr<TinyJob> job =
        TrainTinyJob(dir, "engine/data/testdata/tiny_corpus.txt", 3, "f32", cfg);
    ASSERT_TRUE(job.ok()) << job.status();
    const std::string out = job->checkpoint_dir + "/export";
    const Json j = ReadJson(out + "/config.json");
    EXPECT_EQ(j["model_type"], f.name);
    EXPECT_EQ(j["architectures"], Json::array({f.architecture}));
    if (name == "mistral") {
      EXPECT_EQ(j["sliding_window"], 9);
    }
    auto back = LoadConfigJson(out);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->family, cfg.family);
    EXPECT_EQ(back->qk_norm, cfg.qk_norm);
    EXPECT_EQ(back->qkv_bias, cfg.qkv_bias);
    EXPECT_EQ(back->sliding_window, cfg.sliding_window);
    EXPECT_EQ(back->head_dim, cfg.head_dim);
    auto reader = SafetensorsReader::Open(out);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_EQ(static_cast<int64_t>((*reader)->Names().size()),
              static_cast<int64_t>(ParamLayout(cfg).units().size() - 2) * (cfg.qkv_bias  ? 12
                                                                           : cfg.qk_norm ? 11
                                                                                         : 9) +
                  2);
    if (*f.tensor) {
      EXPECT_TRUE((*reader)->Info(f.tensor).ok()) << f.tensor;
    }
    absl::StatusOr<std::string> step = FindCheckpoint(job->checkpoint_dir);
    ASSERT_TRUE(step.ok()) << step.status();
    std::string text = *ReadFileToString("engine/data/testdata/tiny_corpus.txt");
    std::vector<uint32_t> tokens = ByteTokenize(text.substr(0, 99));
    const std::vector<int32_t> ids(tokens.begin(), tokens.end());
    auto reference = ComputeModelLoss(*step + "/model", ids);
    auto exported = ComputeModelLoss(out, ids);
    ASSERT_TRUE(reference.ok()) << reference.status();
    ASSERT_TRUE(exported.ok()) << exported.status();
    EXPECT_EQ(exported->loss, reference->loss);
  }
}

// A checkpoint saved by several ranks (each writing its share of the files) exports the same
// model: the export reads the shards through their index.
TEST_F(ExportTest, ACheckpointSavedByThreeRanksExportsTheSameModel) {
  const std::string dir = TmpDir("sharded");
  absl::StatusOr<LlamaConfig> cfg = LoadConfigJson(Step() + "/model/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const ParamLayout layout(*cfg);
  absl::StatusOr<LoadedCheckpoint> ck = LoadCheckpoint(Step(), layout);
  ASSERT_TRUE(ck.ok()) << ck.status();
  const std::string saved = dir + "/checkpoints";
  ASSERT_TRUE(BeginCheckpoint(saved, ck->state).ok());
  for (int rank = 0; rank < 3; ++rank) {
    auto wrote = WriteCheckpointShard(saved, *cfg, layout, StateOfWholeUnits(layout, ck->optimizer),
                                      ck->state, rank, 3);
    ASSERT_TRUE(wrote.ok()) << wrote.status();
  }
  ASSERT_TRUE(CommitCheckpoint(saved, ck->state, 3, 1).ok());
  absl::StatusOr<std::string> sharded = FindCheckpoint(saved);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_EQ(List(*sharded + "/model").count("model-00003-of-00003.safetensors"), 1u);

  ExportOptions f32;
  f32.dtype = DType::kF32;
  ASSERT_TRUE(ExportCheckpoint(*sharded, dir + "/export", f32).ok());
  const std::vector<int32_t> ids = Ids();
  auto reference = ComputeModelLoss(Step() + "/model", ids);
  auto exported = ComputeModelLoss(dir + "/export", ids);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->loss, reference->loss);
}

// The daemon's worker runs one step per Run call: the export comes once, after the last, and
// equals ithaca-export's of the same checkpoint.
TEST_F(ExportTest, StepByStepRunsExportAtTheEnd) {
  const std::string dir = TmpDir("step_by_step");
  absl::StatusOr<TinyJob> job =
      TrainTinyJob(dir, "engine/data/testdata/tiny_corpus.txt", 3, "f32", "", /*steps_per_run=*/1);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string exported = job->checkpoint_dir + "/export";
  EXPECT_EQ(ReadJson(exported + "/config.json")["torch_dtype"], "float32");
  ExportOptions f32;
  f32.dtype = DType::kF32;
  f32.source_model_dir = job->model_dir;
  ASSERT_TRUE(ExportCheckpoint(job->checkpoint_dir + "/step-00000003", dir + "/cli", f32).ok());
  EXPECT_EQ(List(exported), List(dir + "/cli"));
  for (const std::string& f : List(exported)) {
    EXPECT_EQ(*ReadFileToString(exported + "/" + f), *ReadFileToString(dir + "/cli/" + f)) << f;
  }
}

TEST_F(ExportTest, FindsTheNewestStepOfACheckpointDir) {
  auto from_job = FindCheckpoint(job_->checkpoint_dir);
  ASSERT_TRUE(from_job.ok()) << from_job.status();
  EXPECT_NE(from_job->find("/step-00000008"), std::string::npos) << *from_job;
  auto from_step = FindCheckpoint(*from_job);
  ASSERT_TRUE(from_step.ok()) << from_step.status();
  EXPECT_EQ(*from_step, *from_job);
}

void ExpectMessageHas(const absl::Status& st, const std::string& part) {
  ASSERT_FALSE(st.ok()) << "expected an error naming " << part;
  EXPECT_NE(std::string(st.message()).find(part), std::string::npos) << st.message();
}

TEST_F(ExportTest, BadInputIsAClearErrorAndLeavesNothing) {
  const std::string dir = TmpDir("bad");

  // A missing checkpoint, and a directory without any.
  ExpectMessageHas(FindCheckpoint(dir + "/nope").status(), dir + "/nope");
  EXPECT_EQ(FindCheckpoint(dir + "/nope").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(MakeDirs(dir + "/empty").ok());
  ExpectMessageHas(FindCheckpoint(dir + "/empty").status(), dir + "/empty");

  // A corrupt manifest: DATA_LOSS naming it, no output, no temporary.
  const std::string broken = dir + "/broken/step-00000004";
  ASSERT_TRUE(MakeDirs(broken + "/model").ok());
  ASSERT_TRUE(WriteFileAtomic(broken + "/manifest.json", "{not json").ok());
  absl::Status st = ExportCheckpoint(broken, dir + "/out/model", ExportOptions());
  ExpectMessageHas(st, broken + "/manifest.json");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(PathExists(dir + "/out/model"));
  EXPECT_TRUE(List(dir + "/out").empty());

  // A weight file that no longer matches its manifest (truncated after the save).
  const std::string copy = dir + "/copy";
  ASSERT_TRUE(MakeDirs(copy + "/model").ok());
  for (const char* f : {"manifest.json", "state.json", "optimizer.safetensors", "model/config.json",
                        "model/model.safetensors"}) {
    ASSERT_TRUE(WriteFileAtomic(copy + "/" + f, *ReadFileToString(Step() + "/" + f)).ok()) << f;
  }
  std::string weights = *ReadFileToString(copy + "/model/model.safetensors");
  ASSERT_TRUE(
      WriteFileAtomic(copy + "/model/model.safetensors", weights.substr(0, weights.size() / 2))
          .ok());
  ExpectMessageHas(ExportCheckpoint(copy, dir + "/out/model", ExportOptions()),
                   copy + "/model/model.safetensors");
  EXPECT_TRUE(List(dir + "/out").empty());

  // --out exists and is not empty: refused, its contents untouched.
  ASSERT_TRUE(MakeDirs(dir + "/taken").ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/taken/mine.txt", "keep me").ok());
  st = ExportCheckpoint(Step(), dir + "/taken", ExportOptions());
  ExpectMessageHas(st, dir + "/taken: exists and is not an empty directory");
  EXPECT_EQ(List(dir + "/taken"), std::set<std::string>{"mine.txt"});
  EXPECT_EQ(*ReadFileToString(dir + "/taken/mine.txt"), "keep me");

  // An empty existing directory is fine (it is replaced).
  ASSERT_TRUE(MakeDirs(dir + "/empty_out").ok());
  ASSERT_TRUE(ExportCheckpoint(Step(), dir + "/empty_out", ExportOptions()).ok());
  EXPECT_TRUE(PathExists(dir + "/empty_out/model.safetensors"));

  // An unknown dtype, and a missing source model directory.
  ExpectMessageHas(ParseExportDType("fp8").status(), "\"fp8\"");
  ExportOptions no_source;
  no_source.source_model_dir = dir + "/no_model";
  ExpectMessageHas(ExportCheckpoint(Step(), dir + "/out/model", no_source), dir + "/no_model");
  EXPECT_TRUE(List(dir + "/out").empty());

  // A failure after the weights are written (a tokenizer.json that is not a file): the
  // temporary directory goes too.
  ASSERT_TRUE(MakeDirs(dir + "/odd_model/tokenizer.json").ok());
  ExportOptions odd;
  odd.source_model_dir = dir + "/odd_model";
  ExpectMessageHas(ExportCheckpoint(Step(), dir + "/out/model", odd),
                   dir + "/odd_model/tokenizer.json");
  EXPECT_TRUE(List(dir + "/out").empty()) << *List(dir + "/out").begin();
}

}  // namespace
}  // namespace ithaca
