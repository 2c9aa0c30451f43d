// The training loop end to end on the CPU backend: loss goes down, resume equals an
// uninterrupted run, and bad data or a corrupt checkpoint give clear errors.
#include "engine/train/trainer.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/backend/cpu/cpu_ops.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/export.h"
#include "engine/checkpoint/model_loss.h"
#include "engine/core/file_util.h"
#include "engine/model/lora_adapter.h"
#include "engine/model/weights.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/plan/planner.h"
#include "engine/plan/resolve.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

std::string TmpDir(const std::string& name) {
  std::string d = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  EXPECT_TRUE(MakeDirs(d).ok());
  return d;
}

std::string CorpusTokens(const std::string& dir) {
  auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
  EXPECT_TRUE(text.ok()) << text.status();
  const std::string path = dir + "/corpus.tok";
  EXPECT_TRUE(WriteTokenFile(path, ByteTokenize(*text), kByteVocab).ok());
  return path;
}

JobSpec SmallSpec(const std::string& dir) {
  JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.path = CorpusTokens(dir);
  spec.data.seq_len = 64;
  spec.training.steps = 40;
  spec.training.lr = 3e-3;
  spec.training.min_lr = 3e-4;
  spec.training.warmup_steps = 3;
  spec.memory.tile_tokens = 16;
  return spec;
}

// What the workers get: the spec resolved on a node with 64 GiB of host memory.
JobSpec Resolved(const JobSpec& spec) {
  NodeResources node;
  node.host_memory_bytes = int64_t{64} << 30;
  node.ranks_on_host = static_cast<int>(spec.parallel.world);
  absl::StatusOr<ResolvedJob> job = ResolveJob(spec, node);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? job->spec : spec;
}

std::vector<double> Losses(Trainer& t, int64_t stop = 0) {
  std::vector<double> out;
  absl::Status st = t.Run([&](const StepReport& r) { out.push_back(r.loss); }, stop);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

TEST(TrainerTest, LossGoesDownOnText) {
  const std::string dir = TmpDir("loss_down");
  JobSpec spec = SmallSpec(dir);
  CpuOps ops;
  HostAllocator alloc;
  auto t = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<double> losses = Losses(**t);
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_NEAR(losses[0], std::log(258.0), 0.3) << "a random init starts near uniform";
  double tail = 0;
  for (int i = 35; i < 40; ++i) tail += losses[i] / 5;
  EXPECT_LT(tail, losses[0] - 1.5) << "first " << losses[0] << " last five " << tail;
}

// An 8-step run of `spec` into `checkpoint_dir`, checkpointed at step 4, "crashed" after step 5
// and resumed: its losses are `straight`'s and its final weights `uninterrupted`'s, bit for bit.
void ExpectAnInterruptedRunResumesExactly(JobSpec spec, const std::string& checkpoint_dir,
                                          const std::vector<double>& straight,
                                          Trainer& uninterrupted, CpuOps* ops,
                                          HostAllocator* alloc) {
  ASSERT_EQ(spec.training.steps, 8);
  ASSERT_EQ(straight.size(), 8u);
  spec.checkpoint.dir = checkpoint_dir;
  spec.checkpoint.every = 4;
  auto b1 = Trainer::Create(Resolved(spec), ops, alloc);
  ASSERT_TRUE(b1.ok()) << b1.status();
  std::vector<double> first = Losses(**b1, /*stop=*/5);  // checkpoint at 4, then "crash" after 5
  ASSERT_EQ(first.size(), 5u);
  b1->reset();
  auto b2 = Trainer::Create(Resolved(spec), ops, alloc);
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ((*b2)->state().step, 4);
  std::vector<double> rest = Losses(**b2);
  ASSERT_EQ(rest.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(first[i], straight[i]) << "step " << i + 1;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(rest[i], straight[4 + i]) << "step " << 5 + i;

  // The final weights agree too.
  for (int u = 0; u < uninterrupted.model()->layout().num_units(); ++u) {
    const Tensor& x = uninterrupted.model()->params().working_shard(u);
    const Tensor& y = (*b2)->model()->params().working_shard(u);
    ASSERT_EQ(0, std::memcmp(x.data, y.data, x.bytes())) << "unit " << u;
  }
}

TEST(TrainerTest, ResumeEqualsUninterruptedRun) {
  const std::string dir = TmpDir("resume");
  JobSpec spec = SmallSpec(dir);
  spec.training.steps = 8;
  spec.training.grad_accum = 2;
  spec.memory.recompute = RecomputePolicy::kNone;
  CpuOps ops;
  HostAllocator alloc;

  spec.checkpoint.dir = dir + "/straight";
  auto a = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<double> straight = Losses(**a);
  ExpectAnInterruptedRunResumesExactly(spec, dir + "/interrupted", straight, **a, &ops, &alloc);
}

// [lora]: only the adapters train (the base stays its random init, bit for bit), a run
// interrupted and resumed from its checkpoint (adapters and their Adam state) equals the
// uninterrupted one, the checkpoint holds the adapters alone, and the export is a PEFT adapter
// that a new run starts from (lora.init) with the trained adapters.
TEST(TrainerTest, LoraTrainsTheAdaptersResumesExactlyAndExportsPeft) {
  const std::string dir = TmpDir("lora");
  JobSpec spec = SmallSpec(dir);
  spec.training.steps = 8;
  spec.training.grad_accum = 2;
  spec.memory.recompute = RecomputePolicy::kFull;
  spec.memory.head_chunk = 1;
  spec.lora.rank = 4;
  spec.lora.alpha = 16;
  spec.lora.targets = {"q_proj", "v_proj", "o_proj", "down_proj"};
  spec.checkpoint.export_dtype = "f32";
  CpuOps ops;
  HostAllocator alloc;

  spec.checkpoint.dir = dir + "/straight";
  auto a = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(a.ok()) << a.status();
  const ParamLayout& layout = (*a)->model()->layout();
  ASSERT_TRUE(layout.has_lora());
  std::vector<double> straight;
  int64_t trainable = 0, parameters = 0;
  ASSERT_TRUE((*a)->Run([&](const StepReport& r) {
                    straight.push_back(r.loss);
                    trainable = r.trainable_parameters;
                    parameters = r.parameters;
                  })
                  .ok());
  ASSERT_EQ(straight.size(), 8u);
  EXPECT_LT(straight[7], straight[0] - 0.1) << "the adapters learn";
  // The step reports what trains: 4 x (A + B) of rank 4 per layer, of the whole model's.
  EXPECT_EQ(trainable, layout.trainable_numel());
  EXPECT_EQ(parameters, layout.total_numel());
  {
    const LlamaConfig& mc = (*a)->model()->config();
    const int64_t q = mc.num_attention_heads * mc.head_dim;
    const int64_t kv = mc.num_key_value_heads * mc.head_dim;
    const int64_t h = mc.hidden_size, f = mc.intermediate_size;
    EXPECT_EQ(trainable, mc.num_hidden_layers * 4 * ((h + q) + (h + kv) + (q + h) + (f + h)));
  }

  // The base: its random init, to the bit.
  for (int u = 0; u < layout.num_units(); ++u) {
    if (layout.units()[u].trainable) continue;
    const std::vector<float> init = RandomUnitWeights(layout, u, spec.training.seed);
    const Tensor& now = (*a)->model()->params().working_shard(u);
    ASSERT_EQ(0, std::memcmp(now.data, init.data(), now.bytes())) << layout.units()[u].name;
  }

  ExpectAnInterruptedRunResumesExactly(spec, dir + "/interrupted", straight, **a, &ops, &alloc);

  // The checkpoint's weights are the adapters: 4 targets x 2 tensors x the layers.
  auto latest = LatestCheckpoint(dir + "/straight");
  ASSERT_TRUE(latest.ok()) << latest.status();
  auto saved = SafetensorsReader::Open(*latest + "/model");
  ASSERT_TRUE(saved.ok()) << saved.status();
  const std::vector<std::string> names = (*saved)->Names();
  EXPECT_EQ(names.size(), 8u * (*a)->model()->config().num_hidden_layers);
  for (const std::string& n : names) EXPECT_NE(n.find(".lora_"), std::string::npos) << n;

  // The export: a PEFT directory with the trained adapters, which a new run starts from.
  const std::string peft = dir + "/straight/export";
  auto config = ReadFileToString(peft + "/adapter_config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  const nlohmann::json j = nlohmann::json::parse(*config);
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["r"], 4);
  EXPECT_EQ(j["lora_alpha"], 16.0);
  EXPECT_EQ(j["target_modules"],
            (std::vector<std::string>{"q_proj", "v_proj", "o_proj", "down_proj"}));
  auto adapter = SafetensorsReader::Open(peft + "/adapter_model.safetensors");
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ((*adapter)->Names().size(), names.size());
  // ithaca-export's path, from the checkpoint alone (its state.json says the [lora]): the same
  // adapter, byte for byte, and the same adapter_config.json but for the base's name.
  {
    ExportOptions alone;
    alone.peft_base_model = "base";
    ASSERT_TRUE(ExportCheckpoint(*latest, dir + "/cli", alone).ok());
    auto ours = ReadFileToString(dir + "/cli/adapter_model.safetensors");
    auto trainers = ReadFileToString(peft + "/adapter_model.safetensors");
    ASSERT_TRUE(ours.ok() && trainers.ok());
    EXPECT_TRUE(*ours == *trainers) << "the adapter differs from the trainer's export";
    auto cli_config = ReadFileToString(dir + "/cli/adapter_config.json");
    ASSERT_TRUE(cli_config.ok()) << cli_config.status();
    nlohmann::json c = nlohmann::json::parse(*cli_config);
    EXPECT_EQ(c["base_model_name_or_path"], "base");
    c["base_model_name_or_path"] = j["base_model_name_or_path"];
    EXPECT_EQ(c, j);
  }

  JobSpec next = spec;
  next.checkpoint = JobSpec::Checkpoint();
  next.lora.init = peft;
  next.training.steps = 1;
  auto c = Trainer::Create(Resolved(next), &ops, &alloc);
  ASSERT_TRUE(c.ok()) << c.status();
  for (int l = 0; l < (*a)->model()->config().num_hidden_layers; ++l) {
    const int u = layout.lora_unit(l);
    const Tensor& x = (*a)->model()->params().working_shard(u);
    const Tensor& y = (*c)->model()->params().working_shard(u);
    ASSERT_EQ(0, std::memcmp(x.data, y.data, x.bytes())) << "adapters of layer " << l;
  }
  // An adapter of another rank is refused, naming the key.
  next.lora.rank = 8;
  auto d = Trainer::Create(Resolved(next), &ops, &alloc);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(std::string(d.status().message()).find("r must be lora.rank (8)"), std::string::npos)
      << d.status();
  // A new phase from the LoRA run's checkpoint (adapters alone) is refused, saying what to start
  // from instead, with or without [lora] (not a "missing tensor" of the base).
  for (bool with_lora : {false, true}) {
    JobSpec phase = spec;
    phase.checkpoint = JobSpec::Checkpoint();
    phase.init.from = dir + "/straight";
    if (!with_lora) phase.lora = JobSpec::Lora();
    auto e = Trainer::Create(Resolved(phase), &ops, &alloc);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
    EXPECT_NE(std::string(e.status().message())
                  .find("init.from: " + dir + "/straight holds a LoRA run's adapters alone"),
              std::string::npos)
        << e.status();
  }
}

// lora.merge_on_export: the export is the base (model.weights) with every targeted weight
// + alpha / rank · B A, in the existing export format, and the PEFT adapter beside it: the merged
// model's loss is the base-plus-adapter's.
TEST(TrainerTest, LoraMergeOnExportIsTheBasePlusTheAdapter) {
  const std::string dir = TmpDir("lora_merge");
  auto cfg = PresetConfig("tiny");
  ASSERT_TRUE(cfg.ok());
  const ParamLayout base_layout(*cfg);
  const HostWeights base = RandomWeights(base_layout, 5);
  std::vector<const float*> ptrs;
  for (const auto& u : base) ptrs.push_back(u.data());
  ASSERT_TRUE(
      WriteHfCheckpoint(dir + "/base", *cfg, base_layout, ptrs, DType::kF32, int64_t{1} << 40)
          .ok());
  JobSpec spec = SmallSpec(dir);
  spec.model.weights = dir + "/base";
  spec.training.steps = 6;
  spec.training.lr = 1e-2;
  spec.lora.rank = 2;
  spec.lora.alpha = 6;
  spec.lora.targets = {"k_proj", "o_proj", "gate_proj", "down_proj"};
  spec.lora.merge_on_export = true;
  spec.checkpoint.dir = dir + "/run";
  spec.checkpoint.export_dtype = "f32";
  CpuOps ops;
  HostAllocator alloc;
  auto t = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(Losses(**t).size(), 6u);
  std::vector<int32_t> ids;
  for (int i = 0; i < 50; ++i) ids.push_back((i * 37 + 11) % 256);
  auto merged = ComputeModelLoss(dir + "/run/export", ids);
  auto adapted = ComputeModelLoss(dir + "/base", ids, dir + "/run/export-adapter");
  auto plain = ComputeModelLoss(dir + "/base", ids);
  ASSERT_TRUE(merged.ok()) << merged.status();
  ASSERT_TRUE(adapted.ok()) << adapted.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_NEAR(merged->loss, adapted->loss, 1e-5);
  EXPECT_GT(std::abs(merged->loss - plain->loss), 2e-4) << "the adapters moved";

  // ithaca-export's path from the checkpoint alone: merged into the base, the trainer's merged
  // export byte for byte.
  auto latest = LatestCheckpoint(dir + "/run");
  ASSERT_TRUE(latest.ok()) << latest.status();
  ExportOptions into_base;
  into_base.dtype = DType::kF32;
  into_base.lora_base = dir + "/base";
  ASSERT_TRUE(ExportCheckpoint(*latest, dir + "/cli-merged", into_base).ok());
  for (const char* file : {"model.safetensors", "config.json"}) {
    auto ours = ReadFileToString(dir + "/cli-merged/" + file);
    auto trainers = ReadFileToString(dir + "/run/export/" + file);
    ASSERT_TRUE(ours.ok() && trainers.ok()) << file;
    EXPECT_TRUE(*ours == *trainers) << file << " differs from the trainer's merged export";
  }

  // A new phase: [init] from the base's model directory with [lora] init the exported adapter
  // starts from both: the base's weights and the trained adapters, bit for bit.
  JobSpec next = SmallSpec(dir);
  next.init.from = dir + "/base";
  next.lora = spec.lora;
  next.lora.merge_on_export = false;
  next.lora.init = dir + "/run/export-adapter";
  next.checkpoint.dir = dir + "/phase2";
  next.training.steps = 1;
  auto phase = Trainer::Create(Resolved(next), &ops, &alloc);
  ASSERT_TRUE(phase.ok()) << phase.status();
  const ParamLayout& layout = (*t)->model()->layout();
  for (int u = 0; u < layout.num_units(); ++u) {
    const Tensor& now = (*phase)->model()->params().working_shard(u);
    const void* want = layout.units()[u].trainable ? (*t)->model()->params().working_shard(u).data
                                                   : static_cast<const void*>(base[u].data());
    EXPECT_EQ(0, std::memcmp(now.data, want, now.bytes())) << layout.units()[u].name;
  }
}

// data.weights: a mix of two sources (the corpus's halves) trains, and a run interrupted and
// resumed from its checkpoint (its data position) sees the same samples: the same losses.
TEST(TrainerTest, AWeightedMixResumesExactly) {
  const std::string dir = TmpDir("mix");
  auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
  ASSERT_TRUE(text.ok());
  const size_t half = text->size() / 2;
  ASSERT_TRUE(WriteTokenFile(dir + "/a.tok", ByteTokenize(text->substr(0, half)), kByteVocab).ok());
  ASSERT_TRUE(WriteTokenFile(dir + "/b.tok", ByteTokenize(text->substr(half)), kByteVocab).ok());
  JobSpec spec = SmallSpec(dir);
  spec.data.path = "{" + dir + "/a.tok," + dir + "/b.tok}";
  spec.data.weights = {3, 1};
  spec.training.steps = 8;
  spec.memory.recompute = RecomputePolicy::kNone;
  CpuOps ops;
  HostAllocator alloc;
  spec.checkpoint.dir = dir + "/straight";
  auto a = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<double> straight = Losses(**a);
  ASSERT_EQ(straight.size(), 8u);
  // Not the unmixed run: the mix changes what is trained on.
  JobSpec plain = SmallSpec(dir);
  plain.data.path = dir + "/a.tok";
  plain.training.steps = 8;
  plain.memory.recompute = RecomputePolicy::kNone;
  auto p = Trainer::Create(Resolved(plain), &ops, &alloc);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NE(Losses(**p), straight);

  spec.checkpoint.dir = dir + "/interrupted";
  spec.checkpoint.every = 3;
  auto b1 = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(b1.ok()) << b1.status();
  std::vector<double> first = Losses(**b1, /*stop=*/4);  // checkpoint at 3, "crash" after 4
  b1->reset();
  auto b2 = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ((*b2)->state().step, 3);
  std::vector<double> rest = Losses(**b2);
  ASSERT_EQ(rest.size(), 5u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(first[i], straight[i]) << "step " << i + 1;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(rest[i], straight[3 + i]) << "step " << 4 + i;
}

// Resubmitting a spec whose checkpoint.dir holds its finished run trained nothing and
// succeeded; now it is an error that says so and what to change. A relaunch of the same run
// (the same run id, as ithacad's workers pass) may still resume there, and raising
// training.steps continues without the learning-rate jump a re-derived cosine had.
TEST(TrainerTest, FinishedRunIsRefusedAndRaisingStepsKeepsTheSchedule) {
  const std::string dir = TmpDir("finished");
  JobSpec spec = SmallSpec(dir);
  spec.training.steps = 6;
  spec.memory.recompute = RecomputePolicy::kNone;
  spec.checkpoint.dir = dir + "/checkpoints";
  CpuOps ops;
  HostAllocator alloc;
  std::vector<double> lrs;
  auto record = [&](const StepReport& r) { lrs.push_back(r.lr); };
  {
    auto t = Trainer::Create(Resolved(spec), &ops, &alloc, nullptr, "run-a");
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE((*t)->Run(record).ok());
  }
  ASSERT_EQ(lrs.size(), 6u);
  EXPECT_DOUBLE_EQ(lrs.back(), spec.training.min_lr);

  for (const std::string run_id : {"", "run-b"}) {
    auto again = Trainer::Create(Resolved(spec), &ops, &alloc, nullptr, run_id);
    ASSERT_FALSE(again.ok()) << "run id \"" << run_id << "\"";
    EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string msg(again.status().message());
    EXPECT_NE(msg.find("holds a finished run"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step 6 of training.steps = 6"), std::string::npos) << msg;
    EXPECT_NE(msg.find("raise training.steps"), std::string::npos) << msg;
  }
  {
    auto relaunch = Trainer::Create(Resolved(spec), &ops, &alloc, nullptr, "run-a");
    ASSERT_TRUE(relaunch.ok()) << relaunch.status();
    EXPECT_EQ((*relaunch)->state().step, 6);
  }
  // Lowering the steps below the checkpoint is refused too.
  JobSpec shorter = spec;
  shorter.training.steps = 4;
  auto past = Trainer::Create(Resolved(shorter), &ops, &alloc, nullptr, "run-a");
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("past this one's end"), std::string::npos)
      << past.status();

  JobSpec longer = spec;
  longer.training.steps = 10;
  auto more = Trainer::Create(Resolved(longer), &ops, &alloc, nullptr, "run-c");
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ((*more)->state().step, 6);
  lrs.clear();
  ASSERT_TRUE((*more)->Run(record).ok());
  ASSERT_EQ(lrs.size(), 4u);
  // The cosine ended at min_lr: it stays there (re-derived for 10 steps, step 7 would be far
  // above it).
  for (double lr : lrs) EXPECT_DOUBLE_EQ(lr, spec.training.min_lr);
}

// A new phase ([init] from): the weights of the run before, and nothing else of it: step 1 comes
// first, at the warmup's first rate, with the data from its start; the RoPE may change there
// while a plain resume with another RoPE is refused.
TEST(TrainerTest, InitFromStartsANewRunFromTheWeightsOnly) {
  const std::string dir = TmpDir("init_from");
  JobSpec first = SmallSpec(dir);
  first.training.steps = 4;
  first.memory.recompute = RecomputePolicy::kNone;
  first.checkpoint.dir = dir + "/phase1";
  CpuOps ops;
  HostAllocator alloc;
  HostWeights trained;
  {
    auto t = Trainer::Create(Resolved(first), &ops, &alloc, nullptr, "phase-1");
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE((*t)->Run().ok());
    absl::StatusOr<HostWeights> w = (*t)->GatherMasterWeights();
    ASSERT_TRUE(w.ok()) << w.status();
    trained = *w;
  }
  JobSpec second = first;
  second.checkpoint.dir = dir + "/phase2";
  second.init.from = first.checkpoint.dir;
  second.model.rope.theta = 40000;
  second.training.steps = 2;
  std::vector<StepReport> reports;
  {
    auto t = Trainer::Create(Resolved(second), &ops, &alloc, nullptr, "phase-2");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->state().step, 0);
    EXPECT_EQ((*t)->state().data_position, 0);
    absl::StatusOr<HostWeights> w = (*t)->GatherMasterWeights();
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(*w, trained) << "phase 1's final weights";
    ASSERT_TRUE((*t)->Run([&](const StepReport& r) { reports.push_back(r); }).ok());
  }
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].step, 1);
  EXPECT_DOUBLE_EQ(reports[0].lr, first.training.lr / first.training.warmup_steps);
  // Relaunched (a retry), the phase resumes its own checkpoint; another run may not start a
  // phase into it, and a plain resume of phase 1 with phase 2's RoPE is refused.
  auto relaunch = Trainer::Create(Resolved(second), &ops, &alloc, nullptr, "phase-2");
  ASSERT_TRUE(relaunch.ok()) << relaunch.status();
  EXPECT_EQ((*relaunch)->state().step, 2);
  auto other = Trainer::Create(Resolved(second), &ops, &alloc, nullptr, "phase-2b");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("already holds run \"phase-2\", at step 2"),
            std::string::npos)
      << other.status();
  JobSpec resume = first;
  resume.training.steps = 6;
  resume.model.rope.theta = 40000;
  auto changed = Trainer::Create(Resolved(resume), &ops, &alloc, nullptr, "phase-1");
  ASSERT_FALSE(changed.ok());
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(changed.status().message().find("a resume keeps the run's RoPE"), std::string::npos)
      << changed.status();
  // A missing source is named.
  JobSpec missing = second;
  missing.checkpoint.dir = dir + "/phase3";
  missing.init.from = dir + "/nowhere";
  auto none = Trainer::Create(Resolved(missing), &ops, &alloc, nullptr, "phase-3");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("init.from: " + dir + "/nowhere: no such directory"),
            std::string::npos)
      << none.status();
}

// One phase's checkpoint, two steps in, and a way to write a file's bytes.
std::string PhaseOneCheckpoint(const std::string& dir, JobSpec* first, CpuOps* ops,
                               HostAllocator* alloc) {
  *first = SmallSpec(dir);
  first->training.steps = 2;
  first->checkpoint.dir = dir + "/phase1";
  auto t = Trainer::Create(Resolved(*first), ops, alloc, nullptr, "phase-1");
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return "";
  EXPECT_TRUE((*t)->Run().ok());
  absl::StatusOr<std::string> step = LatestCheckpoint(first->checkpoint.dir);
  EXPECT_TRUE(step.ok()) << step.status();
  return step.ok() ? *step : "";
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
}

// Rewrites the manifest of checkpoint step `step` without its entry for model/model.safetensors
// (model/config.json still listed); returns the manifest's path.
std::string UnlistTheWeightsFile(const std::string& step) {
  const std::string manifest_path = step + "/manifest.json";
  absl::StatusOr<std::string> text = ReadFileToString(manifest_path);
  EXPECT_TRUE(text.ok()) << text.status();
  nlohmann::json manifest = nlohmann::json::parse(text.ok() ? *text : "{}");
  nlohmann::json kept = nlohmann::json::array();
  for (const nlohmann::json& f : manifest["files"]) {
    if (f["path"] != "model/model.safetensors") kept.push_back(f);
  }
  EXPECT_EQ(kept.size() + 1, manifest["files"].size());
  manifest["files"] = kept;
  WriteBytes(manifest_path, manifest.dump());
  return manifest_path;
}

// What a step whose manifest leaves the weights out is refused with.
std::string UnlistedWeightsMessage(const std::string& manifest_path) {
  return manifest_path +
         ": does not list model/model.safetensors, which its tensors are read from: not a "
         "whole checkpoint";
}

// A step's manifest lists every file its weights are read from, or those would be loaded
// unverified: a manifest that leaves model/model.safetensors out (model/config.json still
// listed) is refused, naming the file (issue 53 N17).
TEST(TrainerTest, AManifestThatLeavesAWeightsFileOutIsRefusedNamingIt) {
  const std::string dir = TmpDir("manifest_unlisted");
  JobSpec first;
  CpuOps ops;
  HostAllocator alloc;
  const std::string step = PhaseOneCheckpoint(dir, &first, &ops, &alloc);
  ASSERT_FALSE(step.empty());
  const std::string manifest_path = UnlistTheWeightsFile(step);
  JobSpec resume = first;
  resume.training.steps = 3;
  auto resumed = Trainer::Create(Resolved(resume), &ops, &alloc, nullptr, "phase-1");
  ASSERT_FALSE(resumed.ok());
  EXPECT_EQ(resumed.status().code(), absl::StatusCode::kDataLoss) << resumed.status();
  EXPECT_EQ(resumed.status().message(), UnlistedWeightsMessage(manifest_path));
}

// A new phase starts from a checkpoint's weights only when they match its manifest, as a resume
// does (issue 53 R2: damaged weights were trained on, to a loss of 0 and then NaN), whether
// init.from names the checkpoint.dir, the step or the step's model/, and only when the manifest
// lists them.
TEST(TrainerTest, InitFromADamagedOrUnlistedStepIsRefusedNamingTheFile) {
  const std::string dir = TmpDir("init_damaged");
  JobSpec first;
  CpuOps ops;
  HostAllocator alloc;
  const std::string step = PhaseOneCheckpoint(dir, &first, &ops, &alloc);
  ASSERT_FALSE(step.empty());
  const std::string weights = step + "/model/model.safetensors";
  absl::StatusOr<std::string> good = ReadFileToString(weights);
  ASSERT_TRUE(good.ok()) << good.status();
  int phase = 0;
  auto start_phase = [&](const std::string& from) {
    JobSpec next = first;
    next.checkpoint.dir = dir + "/phase2-" + std::to_string(++phase);
    next.init.from = from;
    return Trainer::Create(Resolved(next), &ops, &alloc, nullptr, "phase-2").status();
  };
  // The same size, NaNs in place of the last weights.
  std::string damaged = *good;
  for (size_t i = damaged.size() - 64; i < damaged.size(); ++i) damaged[i] = '\xff';
  WriteBytes(weights, damaged);
  for (const std::string& from : {first.checkpoint.dir, step, step + "/model"}) {
    absl::Status st = start_phase(from);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << from << ": " << st;
    EXPECT_EQ(st.message(), weights + ": not the checksum the manifest says: corrupt") << from;
  }
  WriteBytes(weights, *good);
  EXPECT_TRUE(start_phase(first.checkpoint.dir).ok());
  // A manifest that does not list the weights file.
  const std::string manifest_path = UnlistTheWeightsFile(step);
  absl::Status unlisted = start_phase(step + "/model");
  EXPECT_EQ(unlisted.code(), absl::StatusCode::kDataLoss) << unlisted;
  EXPECT_EQ(unlisted.message(), UnlistedWeightsMessage(manifest_path));
}

// [init] from a Hugging Face directory read its weights whatever its config.json said: a model
// with another rms_norm_eps (the same tensors' shapes) trained on silently (issue 53). A new
// phase starts from the job's own model, named with both values otherwise.
TEST(TrainerTest, InitFromAnotherModelsConfigIsRefusedNamingBothValues) {
  const std::string dir = TmpDir("init_config");
  JobSpec first;
  CpuOps ops;
  HostAllocator alloc;
  const std::string step = PhaseOneCheckpoint(dir, &first, &ops, &alloc);
  ASSERT_FALSE(step.empty());
  const std::string hf = dir + "/hf";
  ASSERT_TRUE(MakeDirs(hf).ok());
  for (const char* name : {"model.safetensors", "config.json"}) {
    absl::StatusOr<std::string> bytes = ReadFileToString(step + "/model/" + name);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    WriteBytes(hf + "/" + name, *bytes);
  }
  int phase = 0;
  auto start_phase = [&]() {
    JobSpec next = first;
    next.checkpoint.dir = dir + "/phase2-" + std::to_string(++phase);
    next.init.from = hf;
    return Trainer::Create(Resolved(next), &ops, &alloc, nullptr, "phase-2").status();
  };
  EXPECT_TRUE(start_phase().ok());
  absl::StatusOr<std::string> text = ReadFileToString(hf + "/config.json");
  ASSERT_TRUE(text.ok()) << text.status();
  nlohmann::json config = nlohmann::json::parse(*text);
  ASSERT_EQ(config["rms_norm_eps"], 1e-5);
  config["rms_norm_eps"] = 1e-6;
  WriteBytes(hf + "/config.json", config.dump());
  absl::Status other = start_phase();
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition) << other;
  EXPECT_EQ(
      other.message().rfind(
          "init.from: " + hf + "/config.json has rms_norm_eps 1e-06, the job's model 1e-05: ", 0),
      0u)
      << other;
}

TEST(TrainerTest, DataTooShortForOneSampleIsAClearError) {
  const std::string dir = TmpDir("short");
  JobSpec spec = SmallSpec(dir);
  spec.data.path = dir + "/short.tok";
  ASSERT_TRUE(WriteTokenFile(spec.data.path, {1, 2, 3}, kByteVocab).ok());
  CpuOps ops;
  HostAllocator alloc;
  auto t = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("short.tok"), std::string::npos) << t.status();
}

// SFT data: each sentence of the corpus a document (BOS and its bytes), its first half a prompt
// (loss mask 0) and the rest a completion (mask 1); `all_masked` masks every token.
std::string SftTokens(const std::string& dir, bool all_masked = false) {
  auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
  EXPECT_TRUE(text.ok()) << text.status();
  std::vector<uint32_t> tokens;
  TokenFileMeta meta = ByteTokenMeta(tokens);
  for (const absl::string_view line :
       absl::StrSplit(*text, absl::ByAnyChar(".\n"), absl::SkipWhitespace())) {
    const size_t a = tokens.size(), n = line.size() + 1;
    meta.doc_starts.push_back(a);
    tokens.push_back(kByteBos);
    for (const char c : line) tokens.push_back(static_cast<unsigned char>(c));
    meta.loss_mask.resize(a + n, 0);
    for (size_t i = a + n / 2; i < a + n && !all_masked; ++i) meta.loss_mask[i] = 1;
  }
  const std::string path = dir + (all_masked ? "/masked.tok" : "/sft.tok");
  EXPECT_TRUE(WriteTokenFileV2(path, tokens, meta).ok());
  return path;
}

// data.document_mask and data.loss_mask through the trainer: the step's loss is the mean over
// the trained labels of all its micro-steps (the model run on the same samples says what it
// must be), and training on them lowers it.
TEST(TrainerTest, PackedSftStepIsTheMeanOverTrainedLabels) {
  const std::string dir = TmpDir("sft");
  JobSpec spec = SmallSpec(dir);
  spec.data.path = SftTokens(dir);
  spec.data.document_mask = true;
  spec.data.loss_mask = true;
  spec.data.shuffle = false;
  spec.data.seq_len = 128;
  spec.training.grad_accum = 2;
  spec.training.steps = 8;
  CpuOps ops;
  HostAllocator alloc;
  auto t = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(t.ok()) << t.status();

  // The first step's samples through the model directly.
  auto file = TokenFile::Open(spec.data.path);
  ASSERT_TRUE(file.ok());
  DataOptions o;
  o.shuffle = false;
  o.document_mask = o.loss_mask = true;
  auto data = DataLoader::Create(std::move(*file), spec.data.seq_len, kByteVocab, o);
  ASSERT_TRUE(data.ok()) << data.status();
  const int64_t S = spec.data.seq_len;
  std::vector<int32_t> in(S), lab(S);
  double loss_sum = 0;
  int64_t counted = 0, documents = 0;
  for (int k = 0; k < 2; ++k) {
    (*data)->Next(in.data(), lab.data());
    DocumentMask docs{(*data)->sample_doc_starts()};
    if (docs.starts.empty() || docs.starts[0] != 0) docs.starts.insert(docs.starts.begin(), 0);
    documents += static_cast<int64_t>(docs.starts.size());
    auto l = (*t)->model()->ForwardBackward(in.data(), lab.data(), S, 1.f, docs);
    ASSERT_TRUE(l.ok()) << l.status();
    loss_sum += l->loss_sum;
    counted += l->tokens;
  }
  EXPECT_GT(documents, 3) << "the samples should pack several documents";
  EXPECT_LT(counted, 2 * S * 3 / 4) << "about half the labels are prompts";

  std::vector<StepReport> reports;
  absl::Status st = (*t)->Run([&](const StepReport& r) { reports.push_back(r); });
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(reports.size(), 8u);
  EXPECT_EQ(reports[0].loss_tokens, counted);
  EXPECT_EQ(reports[0].tokens, 2 * S);
  EXPECT_NEAR(reports[0].loss, loss_sum / counted, 1e-4);
  EXPECT_LT(reports.back().loss, reports[0].loss - 0.3);
}

// A weighted mix of a pretraining source (every label trained) and an SFT source (its loss mask
// decides), data.source_loss_mask = [false, true]: each source's loss in the step report is the
// loss the model computes on that source's sample alone, read through a loader of that source
// alone, and the step's loss is the mean over both sources' trained labels.
TEST(TrainerTest, MixOfPretrainingAndSftReportsEachSourcesLoss) {
  const std::string dir = TmpDir("mix_sft");
  JobSpec spec = SmallSpec(dir);
  const std::string plain = spec.data.path, sft = SftTokens(dir);
  spec.data.path = "{" + plain + "," + sft + "}";
  spec.data.weights = {1, 1};
  spec.data.source_loss_mask = {false, true};
  spec.data.shuffle = false;
  spec.data.seq_len = 128;
  spec.training.grad_accum = 2;
  spec.training.steps = 3;
  CpuOps ops;
  HostAllocator alloc;
  auto t = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(t.ok()) << t.status();

  // The first step serves source 1's first window, then source 2's (the [1, 1] interleave):
  // each read alone, with its own mask, and run through the model at the step's weights.
  const int64_t S = spec.data.seq_len;
  LossSum alone[2];
  for (int source = 0; source < 2; ++source) {
    auto file = TokenFile::Open(source == 0 ? plain : sft);
    ASSERT_TRUE(file.ok()) << file.status();
    DataOptions o;
    o.shuffle = false;
    o.loss_mask = source == 1;
    auto data = DataLoader::Create(std::move(*file), S, kByteVocab, o);
    ASSERT_TRUE(data.ok()) << data.status();
    std::vector<int32_t> in(S), lab(S);
    (*data)->Next(in.data(), lab.data());
    auto l = (*t)->model()->ForwardBackward(in.data(), lab.data(), S, 1.f);
    ASSERT_TRUE(l.ok()) << l.status();
    alone[source] = *l;
  }
  EXPECT_EQ(alone[0].tokens, S) << "the pretraining source trains every label";
  EXPECT_GT(alone[1].tokens, 0);
  EXPECT_LT(alone[1].tokens, S * 3 / 4) << "the SFT source trains only its completions";

  std::vector<StepReport> reports;
  absl::Status st = (*t)->Run([&](const StepReport& r) { reports.push_back(r); });
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(reports.size(), 3u);
  const StepReport& r = reports[0];
  ASSERT_EQ(r.sources.size(), 2u);
  for (int source = 0; source < 2; ++source) {
    SCOPED_TRACE(source);
    const SourceStats& got = r.sources[source];
    EXPECT_EQ(got.path, source == 0 ? plain : sft);
    EXPECT_EQ(got.samples, 1);
    EXPECT_EQ(got.tokens, S);
    EXPECT_EQ(got.loss_tokens, alone[source].tokens);
    EXPECT_NEAR(got.loss, alone[source].loss_sum / alone[source].tokens, 1e-4);
  }
  EXPECT_EQ(r.loss_tokens, alone[0].tokens + alone[1].tokens);
  EXPECT_NEAR(r.loss, (alone[0].loss_sum + alone[1].loss_sum) / (alone[0].tokens + alone[1].tokens),
              1e-4);
  // The step line and the TensorBoard scalars carry the same figures.
  const std::string line = FormatStepLine(r);
  EXPECT_NE(line.find(absl::StrFormat("| source 1: 1 sample loss %.4f, source 2: 1 sample loss "
                                      "%.4f |",
                                      r.sources[0].loss, r.sources[1].loss)),
            std::string::npos)
      << line;
  std::map<std::string, double> scalars;
  for (const auto& [tag, value] : TensorBoardScalars(r)) scalars[tag] = value;
  EXPECT_EQ(scalars["source/1/samples"], 1);
  EXPECT_EQ(scalars["source/2/tokens"], S);
  EXPECT_DOUBLE_EQ(scalars["source/2/loss"], r.sources[1].loss);
  // Without a mix, no sources.
  EXPECT_TRUE(FormatStepLine(StepReport()).find("source") == std::string::npos);
}

TEST(TrainerTest, AStepWhoseLabelsAreAllMaskedIsAClearError) {
  const std::string dir = TmpDir("all_masked");
  JobSpec spec = SmallSpec(dir);
  spec.data.path = SftTokens(dir, /*all_masked=*/true);
  spec.data.loss_mask = true;
  CpuOps ops;
  HostAllocator alloc;
  auto t = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::Status st = (*t)->Run();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("data.loss_mask: the 1 samples of step 1 (from data position 0) "
                              "have no trained token"),
            std::string::npos)
      << st;
}

// data.path as a glob over shards, and a model directory whose tokenizer.json decides which token
// files it accepts.
TEST(TrainerTest, GlobOfShardsAndTheModelDirectorysTokenizer) {
  const std::string dir = TmpDir("shards");
  auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
  ASSERT_TRUE(text.ok());
  std::vector<uint32_t> tokens = ByteTokenize(*text);
  const size_t half = tokens.size() / 2;
  std::vector<uint32_t> a(tokens.begin(), tokens.begin() + half),
      b(tokens.begin() + half, tokens.end());
  ASSERT_TRUE(WriteTokenFileV2(dir + "/train-00000.tok", a, ByteTokenMeta(a)).ok());
  ASSERT_TRUE(WriteTokenFileV2(dir + "/train-00001.tok", b, ByteTokenMeta(b)).ok());
  JobSpec spec = SmallSpec(dir);
  spec.data.path = dir + "/train-*.tok";
  spec.training.steps = 2;
  CpuOps ops;
  HostAllocator alloc;
  auto t = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(Losses(**t).size(), 2u);

  // The model directory: the tiny preset's config.json beside the BPE fixture's tokenizer.json.
  const std::string model = TmpDir("shards/model");
  auto cfg = PresetConfig("tiny");
  ASSERT_TRUE(cfg.ok());
  ASSERT_TRUE(WriteFileAtomic(model + "/config.json", ConfigToJson(*cfg)).ok());
  auto tokenizer = ReadFileToString("engine/data/testdata/bpe/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok());
  ASSERT_TRUE(WriteFileAtomic(model + "/tokenizer.json", *tokenizer).ok());
  spec.model.config = model + "/config.json";
  EXPECT_EQ(ModelTokenizerJson(spec), model + "/tokenizer.json");

  // Made with another tokenizer (a fingerprint that is not the model's): rejected, naming both.
  TokenFileMeta other = ByteTokenMeta(a);
  other.fingerprint[0] = 1;
  ASSERT_TRUE(WriteTokenFileV2(dir + "/other.tok", a, other).ok());
  spec.data.path = dir + "/other.tok";
  t = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  std::string msg(t.status().message());
  EXPECT_NE(msg.find(dir + "/other.tok: tokenized with tokenizer sha256 01"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("the model's tokenizer " + model + "/tokenizer.json has sha256"),
            std::string::npos)
      << msg;

  // Made with the model's tokenizer: accepted.
  auto fp = Sha256File(model + "/tokenizer.json");
  ASSERT_TRUE(fp.ok());
  other.fingerprint = *fp;
  ASSERT_TRUE(WriteTokenFileV2(dir + "/same.tok", a, other).ok());
  spec.data.path = dir + "/same.tok";
  t = Trainer::Create(Resolved(spec), &ops, &alloc);
  EXPECT_TRUE(t.ok()) << t.status();

  spec.data.path = dir + "/nothing-*.tok";
  t = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("nothing-*.tok: the pattern matches no file"),
            std::string::npos)
      << t.status();
}

TEST(TrainerTest, CorruptCheckpointIsAClearErrorAndNotOverwritten) {
  const std::string dir = TmpDir("corrupt");
  JobSpec spec = SmallSpec(dir);
  spec.training.steps = 2;
  spec.checkpoint.dir = dir + "/ck";
  CpuOps ops;
  HostAllocator alloc;
  {
    auto t = Trainer::Create(Resolved(spec), &ops, &alloc);
    ASSERT_TRUE(t.ok()) << t.status();
    Losses(**t);
  }
  auto latest = LatestCheckpoint(spec.checkpoint.dir);
  ASSERT_TRUE(latest.ok());
  const std::string opt = *latest + "/optimizer.safetensors";
  auto bytes = ReadFileToString(opt);
  ASSERT_TRUE(bytes.ok());
  {
    std::ofstream out(opt, std::ios::binary | std::ios::trunc);
    out.write(bytes->data(), bytes->size() / 2);  // truncated
  }
  spec.training.steps = 3;  // a continuation (at 2 of 2 the run is finished: another error)
  auto t = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("optimizer.safetensors"), std::string::npos) << t.status();
  EXPECT_TRUE(PathExists(opt)) << "the bad checkpoint is left for inspection";
}

TEST(StepLineTest, HasTheStableFields) {
  StepReport r;
  r.step = 12;
  r.total_steps = 100;
  r.loss = 3.214;
  r.tokens_per_second = 472.5;
  r.model_tflops = 401.2;
  r.mfu = 0.406;
  r.seconds = 41.3;
  r.mem_peak[static_cast<int>(Tier::kParams)] = int64_t{15} << 30;
  r.mem_device_peak = int64_t{68} << 30;
  const std::string line = FormatStepLine(r);
  EXPECT_EQ(line.rfind("step 12/100 | loss 3.2140 | tok/s/gpu 472.5 | tflops 401.2 | "
                       "mfu 40.6% | mem 68.0 GiB (params 15.0 ",
                       0),
            0u)
      << line;
  EXPECT_NE(line.find("| 41.30 s"), std::string::npos) << line;
  // A backend that does not know its peak FLOP/s reports no MFU; the other fields stay.
  r.mfu = 0;
  EXPECT_EQ(FormatStepLine(r).rfind("step 12/100 | loss 3.2140 | tok/s/gpu 472.5 | tflops 401.2 | "
                                    "mem 68.0 GiB (params 15.0 ",
                                    0),
            0u)
      << FormatStepLine(r);
}

TEST(StepLineTest, NoMfuOnTheCpu) {
  const std::string dir = TmpDir("mfu");
  JobSpec spec = SmallSpec(dir);
  spec.training.steps = 1;
  CpuOps ops;
  HostAllocator alloc;
  auto t = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(t.ok()) << t.status();
  StepReport last;
  ASSERT_TRUE((*t)->Run([&](const StepReport& r) { last = r; }).ok());
  EXPECT_GT(last.model_tflops, 0);
  EXPECT_EQ(last.mfu, 0) << "the CPU has no peak FLOP/s to divide by";
  EXPECT_EQ(FormatStepLine(last).find("mfu"), std::string::npos) << FormatStepLine(last);
}

TEST(StepLineTest, TheStepThatSavedReportsTheSaveTime) {
  const std::string dir = TmpDir("ck_time");
  JobSpec spec = SmallSpec(dir);
  spec.training.steps = 4;
  spec.checkpoint.dir = dir + "/ck";
  spec.checkpoint.every = 2;
  CpuOps ops;
  HostAllocator alloc;
  auto t = Trainer::Create(Resolved(spec), &ops, &alloc);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<StepReport> reports;
  ASSERT_TRUE((*t)->Run([&](const StepReport& r) { reports.push_back(r); }).ok());
  ASSERT_EQ(reports.size(), 4u);
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  // One rank alone writes the whole state (f32 master, m, v), holding one unit's tensors of one
  // kind at a time on the host: the largest unit's f32 values.
  int64_t largest_unit = 0;
  for (const ParamUnit& u : (*t)->model()->layout().units()) {
    largest_unit = std::max(largest_unit, 4 * u.numel);
  }
  for (const StepReport& r : reports) {
    if (r.step % 2 == 0) {
      EXPECT_GT(r.checkpoint_seconds, 0) << r.step;
      EXPECT_NEAR(r.checkpoint_time_unix, now, 60) << r.step;
      // ... plus what waited for the writer thread (here the state is far under its 2 GiB).
      EXPECT_GE(r.checkpoint_host_bytes, largest_unit) << r.step;
      EXPECT_LE(r.checkpoint_host_bytes,
                largest_unit + 3 * 4 * (*t)->model()->layout().total_numel())
          << r.step;
    } else {
      EXPECT_EQ(r.checkpoint_seconds, 0) << r.step;
      EXPECT_EQ(r.checkpoint_time_unix, 0) << r.step;
      EXPECT_EQ(r.checkpoint_host_bytes, 0) << r.step;
    }
  }
}

TEST(ModelFlopsTest, MatchesTheConventionForLlama8B) {
  auto cfg = PresetConfig("llama-3-8b");
  ASSERT_TRUE(cfg.ok());
  // N ≈ 7.50e9 matmul parameters (6.98e9 in blocks + 0.53e9 LM head): 6·N + 6·32·S·4096 at S = 1M.
  const double per_token = ModelFlopsPerToken(*cfg, 1 << 20);
  EXPECT_NEAR(per_token, 6 * 7.50e9 + 6.0 * 32 * (1 << 20) * 4096, 0.01e12);
}

// With packed documents only each document's causal square of attention is computed and
// counted: two halves cost half the attention of one whole sequence; the matmuls are unchanged.
TEST(ModelFlopsTest, DocumentMasksCountOnlyTheAttentionComputed) {
  auto cfg = PresetConfig("llama-3-8b");
  ASSERT_TRUE(cfg.ok());
  const int64_t S = 1 << 20;
  const double whole = ModelFlopsPerSample(*cfg, S, {});
  EXPECT_DOUBLE_EQ(whole, ModelFlopsPerToken(*cfg, S) * S);
  EXPECT_DOUBLE_EQ(ModelFlopsPerSample(*cfg, S, {0}), whole);
  const double attention = 6.0 * 32 * double(S) * double(S) * 4096;
  EXPECT_NEAR(ModelFlopsPerSample(*cfg, S, {0, S / 2}), whole - attention / 2, 1e-9 * whole);
  EXPECT_NEAR(ModelFlopsPerSample(*cfg, S, {0, S / 4}),
              whole - attention + attention * (1.0 / 16 + 9.0 / 16), 1e-9 * whole);
}

// A sliding window computes only the keys each query sees (Mistral at W = 4096, S = 128K: about
// 2W/S of the causal attention); a document shorter than the window is counted whole.
TEST(ModelFlopsTest, ASlidingWindowCountsOnlyTheKeysInside) {
  auto cfg = PresetConfig("mistral-7b-v0.3");
  ASSERT_TRUE(cfg.ok());
  const int64_t S = 131072, W = 4096;
  const double full = ModelFlopsPerSample(*cfg, S, {});
  const double per_pair = 6.0 * cfg->num_hidden_layers * cfg->num_attention_heads * cfg->head_dim;
  cfg->sliding_window = W;
  const double windowed = ModelFlopsPerSample(*cfg, S, {});
  EXPECT_NEAR(full - windowed, per_pair * (double(S) * S - (2.0 * W * S - double(W) * (W - 1))),
              1e-9 * full);
  // Documents of W / 2 tokens: each inside the window, counted as without one.
  std::vector<int64_t> docs;
  for (int64_t at = 0; at < S; at += W / 2) docs.push_back(at);
  cfg->sliding_window = 0;
  const double packed = ModelFlopsPerSample(*cfg, S, docs);
  cfg->sliding_window = W;
  EXPECT_DOUBLE_EQ(ModelFlopsPerSample(*cfg, S, docs), packed);
}

// Qwen2/Qwen3's window on the layers from max_window_layers on: each layer counts with its own.
TEST(ModelFlopsTest, WindowLayersCountTheirWindowAndTheOthersTheirWholeTriangle) {
  auto cfg = PresetConfig("qwen2.5-7b");
  ASSERT_TRUE(cfg.ok());
  const int64_t S = 131072, W = 4096, L = cfg->num_hidden_layers;
  const double full = ModelFlopsPerSample(*cfg, S, {});
  const double per_layer_pair = 6.0 * cfg->num_attention_heads * cfg->head_dim;
  cfg->sliding_window = W;
  cfg->window_first_layer = L - 4;  // the last 4 layers windowed
  EXPECT_NEAR(full - ModelFlopsPerSample(*cfg, S, {}),
              4 * per_layer_pair * (double(S) * S - (2.0 * W * S - double(W) * (W - 1))),
              1e-9 * full);
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// "auto" memory settings come from the planner: under a tight budget the trainer runs with
// smaller head stages / tiles / offload and stays inside it; an impossible budget is an error.
TEST(TrainerTest, AutoSettingsFitTheBudget) {
  const std::string dir = TmpDir("auto");
  JobSpec spec = SmallSpec(dir);
  spec.data.seq_len = 512;
  spec.training.steps = 2;
  spec.memory.tile_tokens = 0;  // auto
  spec.memory.head_chunk = 0;   // auto
  // A named policy, so that only the stages, tiles and offload move.
  spec.memory.recompute = RecomputePolicy::kFull;
  // The fastest settings need more than this; head stages and tiles must shrink.
  PlanRequest fastest;
  fastest.cfg = *PresetConfig("tiny");
  fastest.seq_len = 512;
  fastest.opts.recompute = spec.memory.recompute;
  fastest.opts.tile_tokens = 512;
  auto full = PlanMemory(fastest);
  ASSERT_TRUE(full.ok()) << full.status();
  PlanRequest frugal = fastest;
  frugal.opts.head_chunk = 1;
  frugal.opts.offload = true;
  frugal.opts.prefetch = false;
  auto least = PlanMemory(frugal);
  ASSERT_TRUE(least.ok()) << least.status();
  ASSERT_LT(least->device_total(), full->device_total());
  spec.memory.gpu_budget_gib =
      0.5 * (least->device_total() + full->device_total()) / double(int64_t{1} << 30);
  NodeResources node;
  node.host_memory_bytes = int64_t{64} << 30;
  auto job = ResolveJob(spec, node);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(RequireFits(*job).ok()) << job->plan.verdict;
  CpuOps ops;
  HostAllocator alloc;
  auto t = Trainer::Create(job->spec, &ops, &alloc);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Run().ok());
  EXPECT_LE(alloc.tracker().device_peak(), spec.memory.gpu_budget_gib * (int64_t{1} << 30));

  spec.memory.gpu_budget_gib = 1e-4;  // ~100 KiB: not even the weights fit
  auto none = ResolveJob(spec, node);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->plan.fits);
  absl::Status st = RequireFits(*none);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("does not fit"), std::string::npos) << st;
}

// The trainer runs resolved specs only: what it runs is what admission decided.
TEST(TrainerTest, AnUnresolvedSpecIsRefusedNamingTheKey) {
  const std::string dir = TmpDir("unresolved");
  JobSpec spec = Resolved(SmallSpec(dir));
  CpuOps ops;
  HostAllocator alloc;
  JobSpec unresolved = spec;
  unresolved.memory.head_chunk = 0;
  auto t = Trainer::Create(unresolved, &ops, &alloc);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("memory.head_chunk"), std::string::npos) << t.status();
  JobSpec wrong_dtype = spec;
  wrong_dtype.model.dtype = "bf16";  // the CPU backend computes in f32
  t = Trainer::Create(wrong_dtype, &ops, &alloc);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("model.dtype"), std::string::npos) << t.status();
}

}  // namespace
}  // namespace ithaca
