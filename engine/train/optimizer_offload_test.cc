// Optimizer state on the host (memory.optimizer_offload) on the CPU backend, which runs the same
// code paths as CUDA (the staging buffers, the per-unit order, the CPU AdamW): the same losses
// and the same weights, bit for bit, as the on-device optimizer, with clipping that engages,
// weight decay and gradient accumulation; checkpoints saved with it resume without it and the
// other way round, exactly; its state is counted in the host_optimizer tier, not the device's.
#include <algorithm>
#include <cstring>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/core/file_util.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/plan/resolve.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

std::string TmpDir(const std::string& name) {
  std::string d = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  EXPECT_TRUE(MakeDirs(d).ok());
  return d;
}

JobSpec SmallSpec(const std::string& dir, bool offload, bool params = false) {
  auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
  EXPECT_TRUE(text.ok()) << text.status();
  JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.path = dir + "/corpus.tok";
  EXPECT_TRUE(WriteTokenFile(spec.data.path, ByteTokenize(*text), kByteVocab).ok());
  spec.data.seq_len = 64;
  spec.training.steps = 5;
  spec.training.lr = 1e-2;
  spec.training.min_lr = 1e-3;
  spec.training.warmup_steps = 1;
  spec.training.weight_decay = 0.1;
  spec.training.grad_clip = 0.3;  // small enough that every step clips
  spec.training.grad_accum = 2;
  spec.memory.tile_tokens = 16;
  spec.memory.recompute = RecomputePolicy::kNone;
  spec.memory.optimizer_offload = offload ? OffloadChoice::kOn : OffloadChoice::kOff;
  spec.memory.param_offload = params ? OffloadChoice::kOn : OffloadChoice::kOff;
  NodeResources node;
  node.host_memory_bytes = int64_t{64} << 30;
  absl::StatusOr<ResolvedJob> job = ResolveJob(spec, node);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? job->spec : spec;
}

struct Outcome {
  std::vector<StepReport> reports;
  HostWeights master;
  std::vector<std::vector<char>> working;
};

Outcome Train(Trainer& t, int64_t stop = 0) {
  Outcome r;
  absl::Status st = t.Run([&](const StepReport& s) { r.reports.push_back(s); }, stop);
  EXPECT_TRUE(st.ok()) << st;
  auto master = t.GatherMasterWeights();
  EXPECT_TRUE(master.ok()) << master.status();
  if (master.ok()) r.master = *master;
  ParamStore& ps = t.model()->params();
  for (int u = 0; u < ps.num_units(); ++u) {
    const Tensor& w = ps.working_shard(u);
    r.working.emplace_back(static_cast<const char*>(w.data),
                           static_cast<const char*>(w.data) + w.bytes());
  }
  return r;
}

void ExpectSameWeights(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.master.size(), b.master.size());
  for (size_t u = 0; u < a.master.size(); ++u) {
    ASSERT_EQ(a.master[u].size(), b.master[u].size());
    EXPECT_EQ(0, std::memcmp(a.master[u].data(), b.master[u].data(), a.master[u].size() * 4))
        << "master weights of unit " << u;
    EXPECT_EQ(a.working[u], b.working[u]) << "working copy of unit " << u;
  }
}

TEST(OptimizerOffloadTest, SameLossesAndWeightsAsOnTheDevice) {
  const std::string dir = TmpDir("offload_same");
  // Pieces of 1000 elements: every unit is many pieces, cut inside entries (a norm weight and a
  // matrix share pieces) at no multiple of the vector width.
  Optimizer::SetHostStageElementsForTesting(1000);
  CpuOps ops;
  HostAllocator on_alloc, off_alloc;
  auto on = Trainer::Create(SmallSpec(dir, true), &ops, &on_alloc);
  ASSERT_TRUE(on.ok()) << on.status();
  auto off = Trainer::Create(SmallSpec(dir, false), &ops, &off_alloc);
  ASSERT_TRUE(off.ok()) << off.status();
  const Outcome a = Train(**on), b = Train(**off);
  ASSERT_EQ(a.reports.size(), 5u);
  ASSERT_EQ(b.reports.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(a.reports[i].loss, b.reports[i].loss) << "step " << i + 1;
    EXPECT_EQ(a.reports[i].grad_norm, b.reports[i].grad_norm) << "step " << i + 1;
    EXPECT_GT(b.reports[i].grad_norm, 0.3) << "clipping engages at step " << i + 1;
  }
  ExpectSameWeights(a, b);
  // The update between the steps (memory.overlap_update false) instead of under the next
  // forward: the same bits.
  JobSpec between = SmallSpec(TmpDir("offload_between"), true);
  between.memory.overlap_update = false;
  HostAllocator between_alloc;
  auto sync = Trainer::Create(between, &ops, &between_alloc);
  ASSERT_TRUE(sync.ok()) << sync.status();
  const Outcome c = Train(**sync);
  ASSERT_EQ(c.reports.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(c.reports[i].loss, b.reports[i].loss) << "step " << i + 1;
  ExpectSameWeights(c, b);
  EXPECT_GT(c.reports.back().cpu_update_seconds, 0);
  EXPECT_LE(c.reports.back().cpu_update_seconds, c.reports.back().device_wait_seconds);
  // And training moved the weights: equal because both updated them the same way.
  auto fresh = Trainer::Create(SmallSpec(TmpDir("offload_fresh"), false), &ops, &off_alloc);
  ASSERT_TRUE(fresh.ok());
  auto init = (*fresh)->GatherMasterWeights();
  ASSERT_TRUE(init.ok());
  EXPECT_NE(0, std::memcmp((*init)[1].data(), a.master[1].data(), a.master[1].size() * 4));

  // Where the state lives: 12 bytes per parameter on the host (plus two units of staging), none
  // in the device's optimizer tier; the step line says what the CPU update took.
  const StepReport& r = a.reports.back();
  const int64_t params = (*on)->model()->layout().total_numel();
  EXPECT_EQ(r.mem_peak[static_cast<int>(Tier::kOptimizer)], 0);
  EXPECT_GE(r.mem_peak[static_cast<int>(Tier::kHostOptimizer)], 12 * params);
  EXPECT_LE(r.mem_peak[static_cast<int>(Tier::kHostOptimizer)], 20 * params);
  EXPECT_EQ(b.reports.back().mem_peak[static_cast<int>(Tier::kOptimizer)], 12 * params);
  EXPECT_EQ(b.reports.back().mem_peak[static_cast<int>(Tier::kHostOptimizer)], 0);
  // Under the next forward: step 1's line has no update to report; the later ones report the
  // update of the step before, and the first unit's part of it the device waited for.
  EXPECT_EQ(a.reports[0].cpu_update_seconds, 0);
  EXPECT_GT(r.device_wait_seconds, 0);
  EXPECT_GT(r.cpu_update_seconds, 0);
  const std::string line = FormatStepLine(r);
  EXPECT_NE(line.find(" | cpu adamw "), std::string::npos) << line;
  EXPECT_NE(line.find("host_optimizer "), std::string::npos) << line;
  EXPECT_EQ(FormatStepLine(b.reports.back()).find("cpu adamw"), std::string::npos);
  // The start-up line says where the time before step 1 went, and what was pinned.
  const StartupReport& up = (*on)->startup();
  EXPECT_EQ(up.optimizer.host_bytes, 12 * params);
  EXPECT_GT(up.total_s, 0);
  EXPECT_GE(up.total_s, up.model_s + up.optimizer.allocate_s + up.optimizer.init_s +
                            up.optimizer.place_s + up.optimizer.working_copy_s);
  const std::string startup = FormatStartupLine(up);
  EXPECT_EQ(startup.rfind("start-up ", 0), 0u) << startup;
  EXPECT_NE(startup.find("optimizer state allocated "), std::string::npos) << startup;
  EXPECT_NE(startup.find(absl::StrFormat(" (pinned host %.1f GB)", 12 * params / 1e9)),
            std::string::npos)
      << startup;
  EXPECT_EQ(FormatStartupLine((*off)->startup()).find("pinned host"), std::string::npos);
  Optimizer::SetHostStageElementsForTesting(0);
}

// A checkpoint saved from host state resumes into device state and the other way round: the
// same losses and final weights as an uninterrupted run.
TEST(OptimizerOffloadTest, CheckpointsResumeAcrossTheSwitchExactly) {
  CpuOps ops;
  HostAllocator alloc;
  const std::string base = TmpDir("offload_ckpt");
  Outcome straight;
  {
    JobSpec spec = SmallSpec(base, false);
    auto t = Trainer::Create(spec, &ops, &alloc);
    ASSERT_TRUE(t.ok()) << t.status();
    straight = Train(**t);
  }
  for (bool saved_on_host : {true, false}) {
    SCOPED_TRACE(saved_on_host ? "saved with offload, resumed without"
                               : "saved without offload, resumed with");
    const std::string dir = TmpDir(saved_on_host ? "offload_ckpt_on_off" : "offload_ckpt_off_on");
    JobSpec first = SmallSpec(dir, saved_on_host);
    first.checkpoint.dir = dir + "/ckpt";
    first.checkpoint.every = 2;
    {
      auto t = Trainer::Create(first, &ops, &alloc);
      ASSERT_TRUE(t.ok()) << t.status();
      Outcome part = Train(**t, /*stop=*/3);  // checkpoint at 2, then "crash" after 3
      ASSERT_EQ(part.reports.size(), 3u);
    }
    JobSpec second = SmallSpec(dir, !saved_on_host);
    second.checkpoint = first.checkpoint;
    auto t = Trainer::Create(second, &ops, &alloc);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ((*t)->state().step, 2);
    Outcome rest = Train(**t);
    ASSERT_EQ(rest.reports.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(rest.reports[i].loss, straight.reports[2 + i].loss) << "step " << 3 + i;
    }
    ExpectSameWeights(rest, straight);
  }
}

// The working copy on the host too (memory.param_offload): every unit streams to the device
// when its lease starts and the CPU AdamW writes the host copy in place; the same losses and
// weights, bit for bit, as with everything on the device. The device's params tier holds only
// the units in use: at most two blocks (the current and the next) and the embedding and head
// (which the loss reads), never the whole model at once.
TEST(OptimizerOffloadTest, ParamOffloadChangesNoBit) {
  const std::string dir = TmpDir("param_offload_same");
  Optimizer::SetHostStageElementsForTesting(1000);
  CpuOps ops;
  HostAllocator on_alloc, off_alloc;
  auto on = Trainer::Create(SmallSpec(dir, true, true), &ops, &on_alloc);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE((*on)->model()->params().host_params());
  auto off = Trainer::Create(SmallSpec(dir, false), &ops, &off_alloc);
  ASSERT_TRUE(off.ok()) << off.status();
  const Outcome a = Train(**on), b = Train(**off);
  ASSERT_EQ(a.reports.size(), 5u);
  ASSERT_EQ(b.reports.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(a.reports[i].loss, b.reports[i].loss) << "step " << i + 1;
    EXPECT_EQ(a.reports[i].grad_norm, b.reports[i].grad_norm) << "step " << i + 1;
  }
  ExpectSameWeights(a, b);
  const StepReport& r = a.reports.back();
  const ParamLayout& layout = (*on)->model()->layout();
  const int64_t params = layout.total_numel();
  int64_t block = 0;
  for (int l = 0; l < (*on)->model()->config().num_hidden_layers; ++l) {
    block = std::max(block, layout.units()[layout.block_unit(l)].numel);
  }
  const int64_t ends =
      layout.units()[layout.embed_unit()].numel + layout.units()[layout.head_unit()].numel;
  const int64_t act = 4;  // the CPU computes in f32
  EXPECT_EQ(r.mem_peak[static_cast<int>(Tier::kHostParams)], act * params);
  EXPECT_GT(r.mem_peak[static_cast<int>(Tier::kParams)], 0);
  EXPECT_LE(r.mem_peak[static_cast<int>(Tier::kParams)], act * (ends + 2 * block));
  EXPECT_LT(r.mem_peak[static_cast<int>(Tier::kParams)], act * params);
  EXPECT_EQ(b.reports.back().mem_peak[static_cast<int>(Tier::kParams)], act * params);
  EXPECT_EQ(b.reports.back().mem_peak[static_cast<int>(Tier::kHostParams)], 0);
  EXPECT_NE(FormatStepLine(r).find("host_params "), std::string::npos) << FormatStepLine(r);
  Optimizer::SetHostStageElementsForTesting(0);
}

// Checkpoints saved with the working copy on the host resume without it and the other way
// round, exactly.
TEST(OptimizerOffloadTest, ParamOffloadCheckpointsResumeWithoutIt) {
  CpuOps ops;
  HostAllocator alloc;
  const std::string base = TmpDir("param_offload_ckpt");
  Outcome straight;
  {
    auto t = Trainer::Create(SmallSpec(base, false), &ops, &alloc);
    ASSERT_TRUE(t.ok()) << t.status();
    straight = Train(**t);
  }
  for (bool saved_with : {true, false}) {
    SCOPED_TRACE(saved_with ? "saved with param offload, resumed without"
                            : "saved without, resumed with param offload");
    const std::string dir = TmpDir(saved_with ? "param_ckpt_on_off" : "param_ckpt_off_on");
    JobSpec first = SmallSpec(dir, saved_with, saved_with);
    first.checkpoint.dir = dir + "/ckpt";
    first.checkpoint.every = 2;
    {
      auto t = Trainer::Create(first, &ops, &alloc);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_EQ(Train(**t, /*stop=*/3).reports.size(), 3u);
    }
    JobSpec second = SmallSpec(dir, !saved_with, !saved_with);
    second.checkpoint = first.checkpoint;
    auto t = Trainer::Create(second, &ops, &alloc);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ((*t)->state().step, 2);
    Outcome rest = Train(**t);
    ASSERT_EQ(rest.reports.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(rest.reports[i].loss, straight.reports[2 + i].loss) << "step " << 3 + i;
    }
    ExpectSameWeights(rest, straight);
  }
}

// The working copy on the host without the optimizer's state there is refused, naming both keys.
TEST(OptimizerOffloadTest, ParamOffloadNeedsOptimizerOffload) {
  const std::string dir = TmpDir("param_offload_alone");
  auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
  ASSERT_TRUE(text.ok());
  JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.path = dir + "/corpus.tok";
  ASSERT_TRUE(WriteTokenFile(spec.data.path, ByteTokenize(*text), kByteVocab).ok());
  spec.data.seq_len = 64;
  spec.memory.param_offload = OffloadChoice::kOn;
  spec.memory.optimizer_offload = OffloadChoice::kOff;
  NodeResources node;
  node.host_memory_bytes = int64_t{64} << 30;
  absl::StatusOr<ResolvedJob> job = ResolveJob(spec, node);
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("memory.param_offload = true needs "
                                        "memory.optimizer_offload = true"),
            std::string::npos)
      << job.status();
  // "auto" for the optimizer is enough: the planner puts both on the host.
  spec.memory.optimizer_offload = OffloadChoice::kAuto;
  job = ResolveJob(spec, node);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec.memory.optimizer_offload, OffloadChoice::kOn);
  EXPECT_EQ(job->spec.memory.param_offload, OffloadChoice::kOn);
}

// The order of the update under the next forward (memory.overlap_update): in every step after
// the first, each unit's update comes before the forward first reads that unit, and after the
// forward has read the units before it (the embedding is in use before the last block is
// updated): the update is spread through the forward, a unit ahead of it, not run before it.
TEST(OptimizerOffloadTest, UpdateRunsUnitByUnitUnderTheNextForward) {
  for (bool params : {false, true}) {
    SCOPED_TRACE(params ? "param offload" : "optimizer offload");
    CpuOps ops;
    HostAllocator alloc;
    auto t = Trainer::Create(SmallSpec(TmpDir(params ? "order_params" : "order"), true, params),
                             &ops, &alloc);
    ASSERT_TRUE(t.ok()) << t.status();
    ParamStore& ps = (*t)->model()->params();
    std::vector<std::string> log;
    ps.set_trace([&](const std::string& e) { log.push_back(e); });
    int64_t step = 0;
    ASSERT_TRUE((*t)->Run(
                        [&](const StepReport& r) {
                          step = r.step;
                          log.push_back(absl::StrCat("end ", r.step));
                        },
                        /*stop=*/3)
                    .ok());
    ps.set_trace(nullptr);
    ASSERT_EQ(step, 3);
    const int U = ps.num_units();
    // The events of step 2 (between "end 1" and "end 2").
    auto at = [&](const std::string& e) {
      return std::find(log.begin(), log.end(), e) - log.begin();
    };
    const auto from = at("end 1"), to = at("end 2");
    ASSERT_LT(from, to);
    std::vector<int64_t> update(U, -1), first_use(U, -1);
    for (int64_t i = from; i < to; ++i) {
      for (int u = 0; u < U; ++u) {
        if (log[i] == absl::StrCat("update ", u) && update[u] < 0) update[u] = i;
        if (log[i] == absl::StrCat("use ", u) && first_use[u] < 0) first_use[u] = i;
      }
    }
    for (int u = 0; u < U; ++u) {
      ASSERT_GE(update[u], 0) << "unit " << u << " was not updated in step 2";
      ASSERT_GE(first_use[u], 0) << "unit " << u;
      EXPECT_LT(update[u], first_use[u]) << "unit " << u << " read before its update";
      if (u > 0) {
        EXPECT_LT(update[u - 1], update[u]) << "units updated out of order";
      }
    }
    // Not all before the forward: the embedding is in use before the last units are updated.
    EXPECT_LT(first_use[0], update[U - 1]);
    EXPECT_LT(first_use[0], update[1]);
    // Step 1's update is not finished before step 1 ends (it runs in step 2).
    const auto first_update = at("update 0");
    EXPECT_GT(first_update, from);
  }
}

}  // namespace
}  // namespace ithaca
