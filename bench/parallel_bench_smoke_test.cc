// parallel_bench end to end on the CPU backend: two rank processes (Gloo), one Ulysses group of
// two, FSDP, one timed step of the tiny model. Rank 0's JSON line must be there, for the layout
// asked for, with a positive throughput.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

// The value after "key": in a one-line JSON object, as a number; NaN when absent.
double Number(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\": ";
  const size_t at = line.find(k);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(line.c_str() + at + k.size(), nullptr);
}

std::string RunBench(const std::string& flags, int* exit_code) {
  const std::string cmd = "bench/parallel_bench --backend=cpu --model=tiny " + flags;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = pclose(p);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(ParallelBench, World2Sp2OnCpuPrintsPositiveThroughput) {
  for (const char* overlap : {"true", "false"}) {
    SCOPED_TRACE(overlap);
    int code = -1;
    const std::string out =
        RunBench(std::string("--world=2 --sp=2 --seq_lens=256 --steps=1 --warmup=0 --overlap=") +
                     overlap + " --timeline=/tmp/ignored_on_cpu",
                 &code);
    ASSERT_EQ(code, 0) << out;
    // Exactly one line (rank 0's), for S = 256.
    ASSERT_EQ(out.find('\n'), out.size() - 1) << out;
    EXPECT_NE(out.find("\"bench\": \"parallel\""), std::string::npos) << out;
    EXPECT_EQ(Number(out, "world"), 2) << out;
    EXPECT_EQ(Number(out, "sp"), 2) << out;
    EXPECT_EQ(Number(out, "S"), 256) << out;
    EXPECT_NE(out.find(std::string("\"overlap\": ") + overlap), std::string::npos) << out;
    EXPECT_GT(Number(out, "tok_per_s"), 0) << out;
    // Both printed to 6 significant digits.
    EXPECT_NEAR(Number(out, "tok_per_s_per_gpu"), Number(out, "tok_per_s") / 2,
                1e-4 * Number(out, "tok_per_s"))
        << out;
    EXPECT_GT(Number(out, "step_s"), 0) << out;
    // Random weights and tokens: the loss is near ln(vocab) = ln 258 = 5.55.
    EXPECT_GT(Number(out, "loss"), 4.5) << out;
    EXPECT_LT(Number(out, "loss"), 6.5) << out;
  }
}

// One rank of 16 (Ulysses 4 x data parallel 4, on 2 nodes) rehearsed alone on the CPU: its line
// says so, carries the names the docs promise, and its per-tier peaks are the planner's.
TEST(ParallelBench, RehearsesOneRankOfSixteen) {
  int code = -1;
  const std::string out = RunBench(
      "--rehearse --world=16 --sp=4 --nodes=2 --rank=6 --link=h100-sxm,ib_gbps=25 "
      "--seq_lens=256 --steps=1 --warmup=0",
      &code);
  ASSERT_EQ(code, 0) << out;
  ASSERT_EQ(out.find('\n'), out.size() - 1) << out;
  EXPECT_NE(out.find("\"mode\": \"rehearsal\""), std::string::npos) << out;
  EXPECT_EQ(Number(out, "world"), 16) << out;
  EXPECT_EQ(Number(out, "sp"), 4) << out;
  EXPECT_EQ(Number(out, "dp"), 4) << out;
  EXPECT_EQ(Number(out, "nodes"), 2) << out;
  EXPECT_EQ(Number(out, "rank"), 6) << out;
  EXPECT_EQ(Number(out, "ranks_per_node"), 8) << out;
  EXPECT_EQ(Number(out, "ib_gbps"), 25) << out;
  for (const char* key : {"step_s", "compute_s", "comm_exposed_s", "comm_modeled_s",
                          "projected_tok_per_s_per_gpu", "projected_model_tflops_per_gpu",
                          "device_peak_bytes", "planner_device_total_bytes", "host_share_bytes"}) {
    EXPECT_FALSE(std::isnan(Number(out, key))) << key << ": " << out;
  }
  // Every rank of a group runs S/sp tokens: per GPU, S / (sp · step).
  EXPECT_NEAR(Number(out, "projected_tok_per_s_per_gpu"), 256 / 4 / Number(out, "step_s"),
              1e-3 * Number(out, "projected_tok_per_s_per_gpu"))
      << out;
  EXPECT_GT(Number(out, "comm_modeled_s"), 0) << out;
  // The planner replays this very step: its device total is what the allocator measured.
  EXPECT_EQ(Number(out, "planner_device_total_bytes"), Number(out, "device_peak_bytes")) << out;
}

// A rehearsal of fewer decoder layers than the model has says how many it ran, and carries no
// tok/s: its step is not the model's (bench/project_layers.py projects whole steps from it).
TEST(ParallelBench, AOneLayerRehearsalCarriesItsLayersAndNoThroughput) {
  int code = -1;
  const std::string one =
      RunBench("--rehearse --world=4 --sp=4 --layers=1 --seq_lens=256 --steps=1 --warmup=0", &code);
  ASSERT_EQ(code, 0) << one;
  EXPECT_EQ(Number(one, "layers"), 1) << one;
  EXPECT_EQ(Number(one, "model_layers"), 2) << one;  // the tiny preset's
  EXPECT_GT(Number(one, "step_s"), 0) << one;
  for (const char* key : {"projected_tok_per_s_per_gpu", "projected_model_tflops_per_gpu",
                          "tok_per_s", "tok_per_s_per_gpu"}) {
    EXPECT_TRUE(std::isnan(Number(one, key))) << key << ": " << one;
  }
  const std::string whole =
      RunBench("--rehearse --world=4 --sp=4 --seq_lens=256 --steps=1 --warmup=0", &code);
  ASSERT_EQ(code, 0) << whole;
  EXPECT_EQ(Number(whole, "layers"), Number(whole, "model_layers")) << whole;
  EXPECT_GT(Number(whole, "projected_tok_per_s_per_gpu"), 0) << whole;
}

// The planner alone, for a node this machine is not: the settings admission would resolve.
TEST(ParallelBench, PlansTheRehearsedNode) {
  int code = -1;
  const std::string out = RunBench(
      "--plan_only --planner_settings --world=8 --sp=4 --nodes=2 --seq_lens=256,512 "
      "--recompute=attention-aware",
      &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  EXPECT_NE(out.find("\"fits\": true"), std::string::npos) << out;
  EXPECT_GT(Number(out, "device_total_bytes"), 0) << out;
  // A GPU node without a GPU here needs its memory named.
  RunBench(
      "--plan_only --planner_settings --backend=cuda --world=8 --sp=8 --seq_lens=256 "
      "2>/dev/null",
      &code);
  EXPECT_EQ(code, 2);
}

TEST(ParallelBench, RehearsalRefusesARankOutsideTheWorld) {
  int code = -1;
  RunBench("--rehearse --world=4 --sp=4 --rank=4 --seq_lens=256 2>/dev/null", &code);
  EXPECT_NE(code, 0);
  RunBench("--rehearse --world=4 --sp=4 --nodes=3 --seq_lens=256 2>/dev/null", &code);
  EXPECT_NE(code, 0);
  RunBench("--rehearse --world=4 --sp=4 --link=h300 --seq_lens=256 2>/dev/null", &code);
  EXPECT_NE(code, 0);
}

TEST(ParallelBench, RejectsAnSpThatDoesNotDivideTheWorld) {
  int code = -1;
  RunBench("--world=2 --sp=3 --seq_lens=256 --steps=1 --warmup=0 2>/dev/null", &code);
  EXPECT_NE(code, 0);
}

}  // namespace
