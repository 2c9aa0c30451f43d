#include "server/admission.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

namespace ithaca {
namespace {

// A spec whose data file exists (any file will do: admission checks presence, not format).
std::string Dir() {
  const char* t = std::getenv("TEST_TMPDIR");
  static const std::string dir = [&] {
    std::string d = t ? t : "/tmp";
    std::ofstream(d + "/corpus.tok") << "x";
    return d;
  }();
  return dir;
}

std::string Spec(const std::string& extra = "", const std::string& parallel = "") {
  return "name = \"t\"\nbackend = \"cpu\"\n" + extra + "[model]\npreset = \"tiny\"\n" +
         "[data]\npath = \"corpus.tok\"\nseq_len = 64\n[training]\nsteps = 3\n" + parallel;
}

Node CpuNode(int slots, int64_t host_bytes) {
  Node n;
  n.host_memory_bytes = host_bytes;
  for (int i = 0; i < slots; ++i) n.devices.push_back({i, "", "cpu slot", host_bytes});
  return n;
}

TEST(AdmissionTest, AcceptsAGoodSpecAndResolvesPathsAgainstBaseDir) {
  auto a = ParseSubmission(Spec(), "job.toml", Dir());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->spec.data.path, Dir() + "/corpus.tok");
  EXPECT_EQ(a->summary.model(), "tiny");
  EXPECT_EQ(a->summary.parameters(), a->config.NumParameters());
  EXPECT_GT(a->summary.parameters(), 0);
  // The canonical TOML parses back to the same spec.
  auto back = ParseJobSpec(a->toml);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data.path, a->spec.data.path);
  EXPECT_TRUE(CheckFits(*a, CpuNode(8, int64_t{16} << 30)).ok());
}

TEST(AdmissionTest, DataPathMayBeAGlob) {
  std::string toml = Spec();
  toml.replace(toml.find("\"corpus.tok\""), 12, "\"corp*.tok\"");
  auto a = ParseSubmission(toml, "job.toml", Dir());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->spec.data.path, Dir() + "/corp*.tok");
  toml.replace(toml.find("\"corp*.tok\""), 11, "\"none-*.tok\"");
  a = ParseSubmission(toml, "job.toml", Dir());
  ASSERT_FALSE(a.ok());
  EXPECT_NE(
      a.status().message().find("data.path: " + Dir() + "/none-*.tok: the pattern matches no file"),
      std::string::npos)
      << a.status();
}

// A sequence of `n` tokens in place of the spec's 64.
std::string WithSeqLen(std::string toml, int n) {
  const size_t at = toml.find("seq_len = 64");
  return toml.replace(at, 12, "seq_len = " + std::to_string(n));
}

TEST(AdmissionTest, BadSpecsNameTheKey) {
  struct Case {
    std::string toml, key;
  };
  std::vector<Case> cases = {
      {Spec("colour = \"red\"\n"), "colour"},
      {Spec("", "[parallel]\nworld = 3\nsp = 3\n"), "parallel.sp"},  // 4 heads
      {Spec("", "[parallel]\nworld = 0\n"), "parallel.world"},
      {"name = \"t\"\n[model]\npreset = \"huge\"\n[data]\npath = \"corpus.tok\"\n", "model.preset"},
      {"name = \"t\"\n[data]\npath = \"missing.tok\"\n", "data.path"},
      {Spec("", "[training.extra]\n"), "training"},
      {WithSeqLen(Spec("", "[parallel]\nworld = 2\nsp = 2\n"), 63), "data.seq_len"},
      {Spec("", "[parallel]\nworld = 2\nsp = 2\n[memory]\nhead_chunk = 3\n"), "memory.head_chunk"},
  };
  for (const Case& c : cases) {
    auto a = ParseSubmission(c.toml, "job.toml", Dir());
    ASSERT_FALSE(a.ok()) << c.toml;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
    EXPECT_NE(a.status().message().find(c.key), std::string::npos) << a.status();
  }
  EXPECT_EQ(ParseSubmission(Spec(), "job.toml", "relative/dir").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AdmissionTest, ModelThatDoesNotFitIsRejectedWithTheNumbers) {
  std::string toml =
      "name = \"big\"\n[model]\npreset = \"llama-3-8b\"\n"
      "[data]\npath = \"corpus.tok\"\nseq_len = 64\n";
  auto a = ParseSubmission(toml, "job.toml", Dir());
  ASSERT_TRUE(a.ok()) << a.status();
  const Node node = CpuNode(8, int64_t{24} << 30);
  v1::MemoryPlan plan = EstimateMemory(*a, node);
  EXPECT_FALSE(plan.fits());
  // f32 params + grads and the f32 master + Adam m, v (20 bytes per parameter on one CPU rank),
  // plus the step's activations, which the planner counts too.
  EXPECT_GT(plan.per_rank_bytes(), a->config.NumParameters() * 20);
  EXPECT_LT(plan.per_rank_bytes(), a->config.NumParameters() * 24);
  EXPECT_EQ(plan.budget_bytes(), int64_t{24} << 30);
  absl::Status st = CheckFits(*a, node);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("GiB per rank"), std::string::npos) << st;
  // Sharded over 8 ranks with a large host budget it fits.
  auto sharded = ParseSubmission(toml +
                                     "[parallel]\nworld = 8\nsp = 8\n[memory]\n"
                                     "host_budget_gib = 1000\n",
                                 "job.toml", Dir());
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  const int64_t sharded_bytes = EstimateMemory(*sharded, node).per_rank_bytes();
  EXPECT_GT(sharded_bytes, a->config.NumParameters() * 20 / 8);
  // Plus the gathered units and their full-size gradients (the f32 embedding is 2 GiB).
  EXPECT_LT(sharded_bytes, a->config.NumParameters() * 28 / 8);
  EXPECT_TRUE(CheckFits(*sharded, node).ok());
}

TEST(AdmissionTest, NodeLimits) {
  auto a = ParseSubmission(Spec("", "[parallel]\nworld = 4\nsp = 2\n"), "job.toml", Dir());
  ASSERT_TRUE(a.ok()) << a.status();
  absl::Status st = CheckFits(*a, CpuNode(2, int64_t{16} << 30));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("parallel.world"), std::string::npos);
  auto cuda = ParseSubmission("backend = \"cuda\"\n" + Spec().substr(Spec().find("[model]")),
                              "job.toml", Dir());
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_NE(CheckFits(*cuda, CpuNode(2, int64_t{16} << 30)).message().find("backend"),
            std::string::npos);
}

}  // namespace
}  // namespace ithaca
