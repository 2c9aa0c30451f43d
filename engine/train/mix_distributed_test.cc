// A data.weights mix of a pretraining and an SFT source over two Gloo ranks (processes): each
// source's samples, trained labels and loss in the step report are the one-rank run's, on every
// rank, for a data-parallel pair (each replica its own samples: the per-source sums cross the
// replicas) and a Ulysses pair (each rank half of every sample). Every layout runs in forked
// processes, the one-rank reference too (the OpenMP CPU kernels never run in this process).
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/backend/cpu/cpu_ops.h"
#include "engine/comm/bootstrap.h"
#include "engine/comm/testing/multiprocess.h"
#include "engine/core/file_util.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/plan/resolve.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

// The corpus twice: as pretraining data (no mask) and as SFT data, each sentence a document
// whose second half is the completion (loss mask 1).
std::pair<std::string, std::string> WriteSources(const std::string& dir) {
  auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
  EXPECT_TRUE(text.ok()) << text.status();
  const std::vector<uint32_t> plain = ByteTokenize(text.ok() ? *text : "");
  const std::string a = dir + "/plain.tok", b = dir + "/sft.tok";
  EXPECT_TRUE(WriteTokenFileV2(a, plain, ByteTokenMeta(plain)).ok());
  std::vector<uint32_t> tokens;
  TokenFileMeta meta = ByteTokenMeta(tokens);
  for (const absl::string_view line :
       absl::StrSplit(text.ok() ? *text : "", '.', absl::SkipWhitespace())) {
    const size_t at = tokens.size(), n = line.size() + 1;
    meta.doc_starts.push_back(at);
    tokens.push_back(kByteBos);
    for (const char c : line) tokens.push_back(static_cast<unsigned char>(c));
    meta.loss_mask.resize(at + n, 0);
    for (size_t i = at + n / 2; i < at + n; ++i) meta.loss_mask[i] = 1;
  }
  EXPECT_TRUE(WriteTokenFileV2(b, tokens, meta).ok());
  return {a, b};
}

struct Layout {
  int world = 1, sp = 1;
};

// Rank `rank` trains one step of two samples (one of each source) and writes its report's
// figures to out.rank<r>: the step's loss and trained labels, then per source its samples,
// trained labels and loss.
absl::Status TrainOnRank(int rank, const Layout& layout, const std::string& a, const std::string& b,
                         const std::string& rendezvous, const std::string& out) {
  JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.path = "{" + a + "," + b + "}";
  spec.data.weights = {1, 1};
  spec.data.source_loss_mask = {false, true};
  spec.data.shuffle = false;
  spec.data.seq_len = 64;
  spec.training.steps = 1;
  spec.training.warmup_steps = 1;
  spec.memory.tile_tokens = 16;
  spec.memory.recompute = RecomputePolicy::kFull;
  spec.parallel.world = layout.world;
  spec.parallel.sp = layout.sp;
  spec.parallel.fsdp = true;
  const int dp = layout.world / layout.sp;
  spec.training.grad_accum = 2 / dp;  // two samples a step, whatever the layout
  std::unique_ptr<Comm> comm;
  if (layout.world > 1) {
    RankInfo info;
    info.rank = rank;
    info.world = layout.world;
    info.rendezvous = rendezvous;
    ASSIGN_OR_RETURN(comm, ConnectComm(info, Device::kCpu, /*timeout_s=*/60));
  }
  NodeResources node;
  node.host_memory_bytes = int64_t{64} << 30;
  node.ranks_on_host = layout.world;
  ASSIGN_OR_RETURN(ResolvedJob job, ResolveJob(spec, node));
  ASSIGN_OR_RETURN(JobSpec resolved, ParseJobSpec(job.toml, "resolved.toml"));
  CpuOps ops;
  HostAllocator alloc;
  ASSIGN_OR_RETURN(auto trainer, Trainer::Create(resolved, &ops, &alloc, comm.get()));
  std::vector<StepReport> steps;
  RETURN_IF_ERROR(trainer->Run([&](const StepReport& r) { steps.push_back(r); }));
  RANK_CHECK(steps.size() == 1u, steps.size());
  const StepReport& r = steps[0];
  RANK_CHECK(r.sources.size() == 2u, r.sources.size());
  std::string text = absl::StrFormat("%.17g %d", r.loss, r.loss_tokens);
  for (const SourceStats& s : r.sources) {
    absl::StrAppendFormat(&text, " %d %d %.17g", s.samples, s.loss_tokens, s.loss);
  }
  return WriteFileAtomic(absl::StrCat(out, ".rank", rank), text);
}

// Per rank, the figures TrainOnRank wrote.
std::vector<std::vector<double>> TrainLayout(const Layout& layout) {
  testing::TempDir dir;
  const auto [a, b] = WriteSources(dir.path());
  const std::string out = dir.path() + "/result";
  testing::RunOptions opts;
  opts.wall_limit_s = 120;
  const auto outcomes = testing::RunRanks(
      layout.world,
      [&](int rank) { return TrainOnRank(rank, layout, a, b, dir.rendezvous(), out); }, opts);
  EXPECT_EQ(testing::Failures(outcomes), "");
  std::vector<std::vector<double>> ranks;
  for (int rank = 0; rank < layout.world; ++rank) {
    std::ifstream in(absl::StrCat(out, ".rank", rank));
    std::vector<double> v;
    for (double x; in >> x;) v.push_back(x);
    EXPECT_EQ(v.size(), 8u) << "rank " << rank;
    ranks.push_back(v);
  }
  return ranks;
}

TEST(MixDistributedTest, EachSourcesLossIsTheOneRanksOnEveryRank) {
  const auto one = TrainLayout({1, 1});
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(one[0].size(), 8u);
  const std::vector<double>& ref = one[0];
  EXPECT_EQ(ref[1], ref[3] + ref[6]) << "the step's trained labels are its sources'";
  EXPECT_EQ(ref[2], 1);   // one sample of source 1
  EXPECT_EQ(ref[3], 64);  // all of its labels trained
  EXPECT_EQ(ref[5], 1);   // one sample of source 2
  EXPECT_GT(ref[6], 0);
  EXPECT_LT(ref[6], 48) << "the SFT source trains its completions only";
  EXPECT_GT(ref[4], 1);
  EXPECT_GT(ref[7], 1);
  for (const Layout layout : {Layout{2, 1}, Layout{2, 2}}) {
    SCOPED_TRACE(absl::StrFormat("world %d, sp %d", layout.world, layout.sp));
    const auto got = TrainLayout(layout);
    ASSERT_EQ(got.size(), 2u);
    for (const std::vector<double>& v : got) {
      ASSERT_EQ(v.size(), 8u);
      for (const int i : {1, 2, 3, 5, 6}) EXPECT_EQ(v[i], ref[i]) << i;
      for (const int i : {0, 4, 7}) EXPECT_NEAR(v[i], ref[i], 1e-5 * ref[i]) << i;
    }
  }
}

}  // namespace
}  // namespace ithaca
