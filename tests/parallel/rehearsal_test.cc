// A rehearsed rank measures what the real rank measures: parallel_rank as 4 real processes over
// Gloo (FSDP, offload of the saved block inputs, UPipe head stages) writes each rank's allocator
// peaks per tier after the first forward/backward and in each of its training steps; the same
// program rehearsing one of those ranks alone (RehearsalComm, engine/comm/rehearsal_comm.h) must
// write exactly the same figures, and the planner's per-rank figures, which parallel_rank puts
// beside them, must be the same in both (and within parallel_rank's own bound of the measured).
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/comm/testing/multiprocess.h"
#include "engine/core/file_util.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/token_file.h"
#include "engine/model/config.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

class RehearsalTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
                           "/rehearsal");
    ASSERT_TRUE(MakeDirs(*dir_).ok());
    auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
    ASSERT_TRUE(text.ok()) << text.status();
    ASSERT_TRUE(WriteTokenFile(*dir_ + "/corpus.tok", ByteTokenize(*text), kByteVocab).ok());
    LlamaConfig cfg = *PresetConfig("tiny");
    cfg.num_attention_heads = 8;
    cfg.num_key_value_heads = 4;
    cfg.num_hidden_layers = 3;
    cfg.head_dim = 8;
    cfg.rope.head_dim = 8;
    ASSERT_TRUE(WriteFileAtomic(*dir_ + "/config.json", ConfigToJson(cfg)).ok());
  }

  static std::vector<std::string> Args(const std::string& name, int sp) {
    return {"tests/parallel/parallel_rank",
            "--out",
            *dir_ + "/" + name + ".safetensors",
            "--peaks",
            *dir_ + "/" + name + ".peaks",
            "--config",
            *dir_ + "/config.json",
            "--data",
            *dir_ + "/corpus.tok",
            "--world",
            "4",
            "--sp",
            std::to_string(sp),
            "--fsdp",
            "1",
            "--recompute",
            "attention-aware",
            "--head-chunk",
            "4",
            "--offload",
            "--tile",
            "16",
            "--seq",
            "64",
            "--steps",
            "2"};
  }

  static void Exec(std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }

  // The real job: `world` processes joined over Gloo.
  static void RunReal(const std::string& name, int sp) {
    testing::TempDir rendezvous;
    auto outcomes =
        testing::RunRanks(4,
                          [&](int rank) -> absl::Status {
                            setenv("ITHACA_RANK", std::to_string(rank).c_str(), 1);
                            setenv("ITHACA_WORLD_SIZE", "4", 1);
                            setenv("ITHACA_RENDEZVOUS", rendezvous.rendezvous().c_str(), 1);
                            Exec(Args(name, sp));
                            return absl::InternalError("exec failed");
                          },
                          {/*wall_limit_s=*/120, {}});
    EXPECT_EQ(testing::Failures(outcomes), "") << name;
  }

  // Rank `rank` of the same job, rehearsed alone.
  static void RunRehearsal(const std::string& name, int sp, int rank) {
    auto outcomes =
        testing::RunRanks(1,
                          [&](int) -> absl::Status {
                            unsetenv("ITHACA_RANK");
                            std::vector<std::string> args = Args(name, sp);
                            args.insert(args.end(), {"--rehearse", "--rank", std::to_string(rank)});
                            Exec(args);
                            return absl::InternalError("exec failed");
                          },
                          {/*wall_limit_s=*/120, {}});
    EXPECT_EQ(testing::Failures(outcomes), "") << name;
  }

  static std::string Read(const std::string& path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

  static void Check(int sp, int rank) {
    const std::string real = absl::StrCat("real_sp", sp),
                      rehearsed = absl::StrCat("rehearsed_sp", sp, "_rank", rank);
    if (!ran_[sp]) {
      RunReal(real, sp);
      ran_[sp] = true;
    }
    RunRehearsal(rehearsed, sp, rank);
    const std::string want = Read(absl::StrCat(*dir_, "/", real, ".peaks.rank", rank));
    const std::string got = Read(absl::StrCat(*dir_, "/", rehearsed, ".peaks.rank", rank));
    // Every tier after the first forward/backward (with the plan), and in both training steps.
    std::istringstream lines(want);
    int fb = 0, steps = 0, nonzero = 0;
    for (std::string line; std::getline(lines, line);) {
      fb += line.rfind("fb ", 0) == 0;
      steps += line.rfind("step", 0) == 0;
      std::istringstream words(line);
      std::string what, tier;
      int64_t measured = 0;
      words >> what >> tier >> measured;
      nonzero += measured > 0;
    }
    EXPECT_GE(fb, 5) << want;
    EXPECT_EQ(steps, 2 * fb) << want;
    EXPECT_GE(nonzero, 10) << want;  // the comm and host tiers among them
    EXPECT_NE(want.find("host_block_inputs"), std::string::npos);
    EXPECT_EQ(got, want) << "sp " << sp << " rank " << rank;
  }

  static std::string* dir_;
  static std::map<int, bool> ran_;
};

std::string* RehearsalTest::dir_ = nullptr;
std::map<int, bool> RehearsalTest::ran_;

TEST_F(RehearsalTest, UlyssesOverFourRanks) { Check(4, 0); }

TEST_F(RehearsalTest, UlyssesTwoByDataParallelTwo) {
  Check(2, 0);
  Check(2, 3);  // another group, another sample
}

}  // namespace
}  // namespace ithaca
