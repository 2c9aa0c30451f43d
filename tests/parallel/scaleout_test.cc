// Scale-out on the CPU, with the real launcher and real rank processes over Gloo:
// - two "nodes" of two ranks each, meeting at node 0's TCP rendezvous, train exactly as one node
//   of four ranks does (the same losses and weights, bit for bit);
// - a checkpoint saved at one world size (each rank writing its share) resumes at another
//   (2 -> 1, 1 -> 2, 4 -> 2, 2 -> 4; each rank holding and reading only its share) with the losses
//   and weights of a run that never stopped, also across ring attention's layouts (Ulysses x ring
//   <-> data parallel).
// (A node killed mid-step is launch/launcher_test's MultiNodeLauncherTest.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/comm/testing/multiprocess.h"
#include "engine/core/file_util.h"
#include "engine/model/config.h"
#include "engine/model/safetensors.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/token_file.h"
#include "gtest/gtest.h"
#include "worker/local_launch.h"

namespace ithaca {
namespace {

class ScaleOutTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                           "/scaleout");
    ASSERT_TRUE(MakeDirs(*dir_).ok());
    auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
    ASSERT_TRUE(text.ok()) << text.status();
    ASSERT_TRUE(WriteTokenFile(*dir_ + "/corpus.tok", ByteTokenize(*text), kByteVocab).ok());
    LlamaConfig cfg = *PresetConfig("tiny");
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.num_hidden_layers = 2;
    cfg.head_dim = 8;
    cfg.rope.head_dim = 8;
    ASSERT_TRUE(WriteFileAtomic(*dir_ + "/config.json", ConfigToJson(cfg)).ok());
  }

  static LaunchOptions Options(const std::string& out, int nproc, std::vector<std::string> args) {
    LaunchOptions o;
    o.argv = {"tests/parallel/scaleout_rank",
              "--out",
              out,
              "--config",
              *dir_ + "/config.json",
              "--data",
              *dir_ + "/corpus.tok",
              "--global-batch",
              "4"};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.nproc = nproc;
    // One thread per rank, whatever the machine: the arithmetic must not depend on it.
    o.env = {{"OMP_NUM_THREADS", "1"}};
    o.temp_dir = *dir_;
    o.grace_period_s = 2;
    return o;
  }

  // `nproc` ranks on one "node"; the file rank 0 wrote.
  static std::string Run(const std::string& name, int nproc, std::vector<std::string> args) {
    const std::string out = absl::StrCat(*dir_, "/", name, ".safetensors");
    absl::Status st = LaunchLocal(Options(out, nproc, args));
    EXPECT_TRUE(st.ok()) << name << ": " << st;
    return out;
  }

  // Two "nodes" of `nproc` ranks each: node 1's launcher in a child process, node 0's here.
  static std::string RunTwoNodes(const std::string& name, int nproc,
                                 std::vector<std::string> args) {
    const std::string out = absl::StrCat(*dir_, "/", name, ".safetensors");
    const std::string rendezvous = absl::StrCat("tcp:127.0.0.1:", testing::FreeLoopbackPort());
    LaunchOptions o = Options(out, nproc, args);
    o.nnodes = 2;
    o.rendezvous = rendezvous;
    o.rendezvous_timeout_s = 60;
    const pid_t node1 = fork();
    if (node1 == 0) {
      LaunchOptions mine = o;
      mine.node_rank = 1;
      LaunchReport report;
      absl::Status st = LaunchLocal(mine, &report);
      if (!st.ok()) std::fprintf(stderr, "node 1: %s\n", st.ToString().c_str());
      _exit(st.ok() ? 0 : 1);
    }
    absl::Status st = LaunchLocal(o);
    EXPECT_TRUE(st.ok()) << name << " (node 0): " << st;
    int status = 0;
    waitpid(node1, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << name << ": node 1 failed";
    return out;
  }

  static std::vector<float> Read(const SafetensorsReader& r, const std::string& name) {
    auto info = r.Info(name);
    EXPECT_TRUE(info.ok()) << info.status();
    if (!info.ok()) return {};
    std::vector<float> v(NumElements(info->shape));
    EXPECT_TRUE(r.Read(name, info->shape, DType::kF32, v.data()).ok());
    return v;
  }

  // `got`'s losses are the last of `want`'s, and the final weights agree to `tol` (relative to
  // the largest weight; 0: bit for bit).
  static void Compare(const std::string& want_path, const std::string& got_path, double tol) {
    auto want = SafetensorsReader::Open(want_path);
    auto got = SafetensorsReader::Open(got_path);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    const std::vector<float> want_losses = Read(**want, "losses");
    const std::vector<float> got_losses = Read(**got, "losses");
    const std::vector<float> got_steps = Read(**got, "steps");
    ASSERT_FALSE(got_losses.empty());
    ASSERT_LE(got_losses.size(), want_losses.size());
    const size_t skip = want_losses.size() - got_losses.size();
    for (size_t i = 0; i < got_losses.size(); ++i) {
      EXPECT_EQ(got_steps[i], static_cast<float>(skip + i + 1)) << got_path;
      EXPECT_NEAR(got_losses[i], want_losses[skip + i], tol * std::abs(want_losses[skip + i]))
          << got_path << " step " << skip + i + 1;
    }
    int checked = 0;
    for (const std::string& name : (*want)->Names()) {
      if (name.rfind("param.", 0) != 0) continue;
      const std::vector<float> x = Read(**want, name), y = Read(**got, name);
      ASSERT_EQ(x.size(), y.size()) << name;
      double scale = 0, err = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        scale = std::max(scale, std::abs(double(x[i])));
        err = std::max(err, std::abs(double(x[i]) - y[i]));
      }
      EXPECT_LE(err, tol * scale) << got_path << ": " << name;
      ++checked;
    }
    EXPECT_GT(checked, 10);
  }

  static std::string* dir_;
};

std::string* ScaleOutTest::dir_ = nullptr;

TEST_F(ScaleOutTest, TwoNodesOfTwoRanksEqualOneNodeOfFour) {
  const std::string one_node = Run("one_node_of_four", 4, {"--steps", "3"});
  const std::string two_nodes = RunTwoNodes("two_nodes_of_two", 2, {"--steps", "3"});
  Compare(one_node, two_nodes, /*tol=*/0);
}

// Saved at world `from` after 2 of 4 steps, resumed at world `to`: steps 3 and 4 as if the run
// had never stopped (to fp32 rounding: reductions over other worlds add in another order).
TEST_F(ScaleOutTest, ACheckpointResumesAtAnotherWorldSize) {
  const std::string reference = Run("reference_w2", 2, {"--steps", "4"});
  for (auto [from, to] : {std::pair{2, 1}, {1, 2}, {4, 2}, {2, 4}}) {
    const std::string name = absl::StrCat("resume_", from, "_to_", to);
    const std::string checkpoints = absl::StrCat(*dir_, "/", name, "_checkpoints");
    Run(name + "_first", from,
        {"--steps", "4", "--checkpoint-dir", checkpoints, "--every", "2", "--stop-at", "2"});
    // Every rank wrote its share: one weights file per rank.
    const std::string ck = checkpoints + "/step-00000002/model";
    EXPECT_TRUE(from == 1 ? PathExists(ck + "/model.safetensors")
                          : PathExists(absl::StrCat(ck, "/model-0000", from, "-of-0000", from,
                                                    ".safetensors")))
        << name;
    const std::string resumed =
        Run(name, to, {"--steps", "4", "--checkpoint-dir", checkpoints, "--every", "2"});
    Compare(reference, resumed, /*tol=*/2e-4);
  }
}

// The same across ring attention's layout (issue 51): a run of Ulysses 2 x ring 2 over four
// ranks saved after 2 steps resumes as data parallelism over two ranks (and over one), and a
// data-parallel run resumes as Ulysses x ring, each as if the run had never stopped.
TEST_F(ScaleOutTest, ACheckpointResumesAcrossRingLayouts) {
  const std::string reference = Run("reference_ring_w2", 2, {"--steps", "4"});
  const std::vector<std::string> ring = {"--sp", "4", "--ring", "2"};
  struct Case {
    const char* name;
    int from;
    std::vector<std::string> from_args;
    int to;
    std::vector<std::string> to_args;
  };
  for (const Case& c : {Case{"ring_4_to_dp_2", 4, ring, 2, {}}, Case{"ring_4_to_1", 4, ring, 1, {}},
                        Case{"dp_2_to_ring_4", 2, {}, 4, ring}}) {
    const std::string checkpoints = absl::StrCat(*dir_, "/", c.name, "_checkpoints");
    std::vector<std::string> first = {"--steps", "4", "--checkpoint-dir", checkpoints,
                                      "--every", "2", "--stop-at",        "2"};
    first.insert(first.end(), c.from_args.begin(), c.from_args.end());
    Run(absl::StrCat(c.name, "_first"), c.from, first);
    std::vector<std::string> second = {"--steps",   "4",       "--checkpoint-dir",
                                       checkpoints, "--every", "2"};
    second.insert(second.end(), c.to_args.begin(), c.to_args.end());
    const std::string resumed = Run(c.name, c.to, second);
    // The ring merges attention's pieces by their log-sum-exp: fp32 sums in another order than
    // one rank's, which two Adam steps at lr 1e-2 grow to ~2e-4 of the largest weight.
    Compare(reference, resumed, /*tol=*/5e-4);
  }
}

}  // namespace
}  // namespace ithaca
