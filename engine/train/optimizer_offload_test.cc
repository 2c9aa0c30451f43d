// Optimizer state on the host (memory.optimizer_offload) on the CPU backend, which runs the same
// code paths as CUDA (the staging buffers, the per-unit order, the CPU AdamW): the same losses
// and the same weights, bit for bit, as the on-device optimizer, with clipping that engages,
// weight decay and gradient accumulation; checkpoints saved with it resume without it and the
// other way round, exactly; its state is counted in the host_optimizer tier, not the device's.
#include <cstring>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/core/file_util.h"
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

JobSpec SmallSpec(const std::string& dir, bool offload) {
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
  spec.memory.checkpoint = CheckpointPolicy::kNone;
  spec.memory.optimizer_offload = offload ? OffloadChoice::kOn : OffloadChoice::kOff;
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
  EXPECT_GT(r.device_wait_seconds, 0);
  EXPECT_GT(r.cpu_update_seconds, 0);
  EXPECT_LE(r.cpu_update_seconds, r.device_wait_seconds);
  const std::string line = FormatStepLine(r);
  EXPECT_NE(line.find(" | cpu adamw "), std::string::npos) << line;
  EXPECT_NE(line.find("host_optimizer "), std::string::npos) << line;
  EXPECT_EQ(FormatStepLine(b.reports.back()).find("cpu adamw"), std::string::npos);
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

}  // namespace
}  // namespace ithaca
