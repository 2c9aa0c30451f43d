// Checkpoints saved and loaded by every rank at once (Gloo ranks as processes): a rank holds
// only its share of the state on the host, a checkpoint saved at one world loads at another
// with each rank reading just its FSDP slices, and a damaged file is DATA_LOSS naming it on
// every rank, whichever rank verified it.
#include "engine/train/optimizer_checkpoint.h"

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/comm/bootstrap.h"
#include "engine/comm/testing/multiprocess.h"
#include "engine/core/file_util.h"
#include "engine/model/lora_adapter.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

LlamaConfig Config() { return *PresetConfig("tiny"); }

int64_t StateBytes() {
  int64_t bytes = 0;
  const ParamLayout layout(Config());
  for (const ParamUnit& u : layout.units()) bytes += 3 * 4 * u.numel;
  return bytes;
}

// One rank: its communicator, the CPU backend and the tiny model sharded over the world.
struct RankModel {
  std::unique_ptr<Comm> comm;
  CpuOps ops;
  HostAllocator alloc;
  std::unique_ptr<LlamaModel> model;
};

absl::StatusOr<std::unique_ptr<RankModel>> MakeRank(int rank, int world,
                                                    const std::string& rendezvous) {
  auto r = std::make_unique<RankModel>();
  RankInfo info;
  info.rank = rank;
  info.world = world;
  info.rendezvous = rendezvous;
  ASSIGN_OR_RETURN(r->comm, ConnectComm(info, Device::kCpu, /*timeout_s=*/60));
  LlamaModel::Options mo;
  mo.fsdp = true;
  ASSIGN_OR_RETURN(r->model, LlamaModel::Create(Config(), &r->ops, &r->alloc, mo, r->comm.get()));
  return r;
}

// Random weights, then one AdamW step on a random sample, so that m and v are not zero.
absl::StatusOr<std::unique_ptr<Optimizer>> TrainedOneStep(LlamaModel* model) {
  JobSpec::Training hp;
  const ParamLayout& layout = model->layout();
  auto init = [&](int u) -> absl::StatusOr<std::vector<float>> {
    return RandomUnitWeights(layout, u, 99);
  };
  ASSIGN_OR_RETURN(auto opt, Optimizer::Create(model, init, hp));
  std::mt19937 rng(5);  // the same sample on every rank
  const int64_t S = 32;
  std::vector<int32_t> inputs(S), labels(S);
  for (int64_t i = 0; i < S; ++i) {
    inputs[i] = static_cast<int32_t>(rng() % 256);
    labels[i] = static_cast<int32_t>(rng() % 256);
  }
  model->params().ZeroGrads();
  RETURN_IF_ERROR(model->ForwardBackward(inputs.data(), labels.data(), S, 1.f / S).status());
  RETURN_IF_ERROR(model->params().FinishGradients());
  RETURN_IF_ERROR(opt->Step(1, 1e-3).status());
  return opt;
}

// The master weights an optimizer holds, gathered (collective), as the bytes of master.f32.
absl::StatusOr<std::string> MasterBytes(const Optimizer& opt) {
  ASSIGN_OR_RETURN(HostWeights master, opt.GatherMasterWeights());
  std::string bytes;
  for (const auto& unit : master) {
    bytes.append(reinterpret_cast<const char*>(unit.data()), unit.size() * 4);
  }
  return bytes;
}

class DistributedCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    // Saved once at world 2; every test loads it (or a copy).
    const std::string rendezvous = dir_->path() + "/rv-save";
    ASSERT_TRUE(MakeDirs(rendezvous).ok());
    const std::string out = dir_->path();
    auto outcomes = testing::RunRanks(2, [&](int rank) -> absl::Status {
      ASSIGN_OR_RETURN(auto r, MakeRank(rank, 2, "file:" + rendezvous));
      ASSIGN_OR_RETURN(auto opt, TrainedOneStep(r->model.get()));
      TrainState state{1, 8, 256};
      ASSIGN_OR_RETURN(CheckpointSaveReport saved,
                       SaveCheckpointTogether(out + "/checkpoints", r->model.get(), *opt, state,
                                              r->comm.get(), /*keep=*/1));
      RANK_CHECK(saved.rank_bytes > 0);
      RANK_CHECK(rank != 0 || saved.bytes > saved.rank_bytes);
      // What it held, for the test to add up; and the whole master weights, to compare with.
      RETURN_IF_ERROR(WriteFileAtomic(absl::StrCat(out, "/host-bytes-", rank),
                                      std::to_string(saved.host_bytes)));
      ASSIGN_OR_RETURN(std::string bytes, MasterBytes(*opt));  // collective
      if (rank == 0) RETURN_IF_ERROR(WriteFileAtomic(out + "/master.f32", bytes));
      return absl::OkStatus();
    });
    ASSERT_EQ(testing::Failures(outcomes), "");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string Checkpoint() { return dir_->path() + "/checkpoints/step-00000001"; }
  static std::string Rendezvous(const std::string& name) {
    const std::string d = dir_->path() + "/rv-" + name;
    EXPECT_TRUE(MakeDirs(d).ok());
    return "file:" + d;
  }

  static testing::TempDir* dir_;
};

testing::TempDir* DistributedCheckpointTest::dir_ = nullptr;

// Each of the two ranks held its share of the state, not all of it: together exactly the state,
// every tensor once.
// Each rank writes its tensors to their files as the units arrive: it holds one unit's tensors
// of one kind (master, m or v) and what waits for its writer thread, a bound independent of the
// model's size (for this tiny model it allows the whole share).
TEST_F(DistributedCheckpointTest, EachRankHoldsOneUnitAtATimeToSave) {
  const ParamLayout layout(Config());
  int64_t largest_unit = 0;
  for (const ParamUnit& u : layout.units()) largest_unit = std::max(largest_unit, 4 * u.numel);
  for (int r = 0; r < 2; ++r) {
    auto text = ReadFileToString(absl::StrCat(dir_->path(), "/host-bytes-", r));
    ASSERT_TRUE(text.ok()) << text.status();
    const int64_t held = std::stoll(*text);
    std::printf("rank %d of 2 held at most %lld bytes at once of %lld bytes of state\n", r,
                static_cast<long long>(held), static_cast<long long>(StateBytes()));
    EXPECT_GE(held, 4 * 10) << "rank " << r;  // at least a tensor
    EXPECT_LE(held, largest_unit + std::min(kCheckpointWriteQueueBytes, StateBytes()))
        << "rank " << r;
  }
  EXPECT_TRUE(VerifyCheckpoint(Checkpoint()).ok());
}

// Saved at world 2, loaded at 1, 3 and 4: every rank holds exactly its FSDP slices, with the
// saved values, and reads about its share; the optimizer it resumes holds the saved weights.
TEST_F(DistributedCheckpointTest, LoadsAtOtherWorldsReadingOnlyTheSlices) {
  auto bytes = ReadFileToString(dir_->path() + "/master.f32");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string saved_master = *bytes;
  absl::StatusOr<LoadedCheckpoint> whole = LoadCheckpoint(Checkpoint(), ParamLayout(Config()));
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (int world : {1, 3, 4}) {
    const std::string rendezvous = Rendezvous(absl::StrCat("load-", world));
    auto outcomes = testing::RunRanks(world, [&](int rank) -> absl::Status {
      ASSIGN_OR_RETURN(auto r, MakeRank(rank, world, rendezvous));
      ASSIGN_OR_RETURN(LoadedCheckpoint ck,
                       LoadCheckpointTogether(Checkpoint(), r->model.get(), r->comm.get()));
      RANK_CHECK(ck.state.step == 1 && ck.state.data_position == 8 && ck.saved_world == 2);
      const ParamStore& ps = r->model->params();
      int64_t slices = 0;
      for (int u = 0; u < ps.num_units(); ++u) {
        slices += 3 * 4 * ps.shard_numel(u);
        for (auto [got, want] : {std::pair{&ck.optimizer.master, &whole->optimizer.master},
                                 {&ck.optimizer.m, &whole->optimizer.m},
                                 {&ck.optimizer.v, &whole->optimizer.v}}) {
          RANK_CHECK(static_cast<int64_t>((*got)[u].size()) == ps.shard_numel(u));
          for (int64_t i = 0; i < ps.shard_numel(u); ++i) {
            const int64_t at = ps.shard_begin(u) + i;
            const float expected = at < ps.unit_numel(u) ? (*want)[u][at] : 0.f;
            RANK_CHECK((*got)[u][i] == expected, "unit ", u, " element ", at);
          }
        }
      }
      RANK_CHECK(ck.host_bytes == slices, ck.host_bytes, " != ", slices);
      if (world > 1) {
        RANK_CHECK(ck.host_bytes < StateBytes() * 2 / world, ck.host_bytes);
        RANK_CHECK(ck.read_bytes < StateBytes() * 2 / world, ck.read_bytes);
        RANK_CHECK(ck.verified_bytes < ck.bytes, ck.verified_bytes);
      } else {
        RANK_CHECK(ck.verified_bytes == ck.bytes);
      }
      JobSpec::Training hp;
      ASSIGN_OR_RETURN(auto opt, Optimizer::Resume(r->model.get(), ck.optimizer, hp));
      ASSIGN_OR_RETURN(std::string got, MasterBytes(*opt));  // collective
      RANK_CHECK(got == saved_master, "the resumed master weights differ from the saved ones");
      return absl::OkStatus();
    });
    EXPECT_EQ(testing::Failures(outcomes), "") << "world " << world;
  }
}

// Resumed piecewise (what the trainer does): each unit's slices go straight into the optimizer
// as they are read, the host holding one unit's at a time, and the resumed master weights are
// the saved ones at any world.
TEST_F(DistributedCheckpointTest, ResumesOneUnitAtATime) {
  auto bytes = ReadFileToString(dir_->path() + "/master.f32");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string saved_master = *bytes;
  for (int world : {1, 3}) {
    const std::string rendezvous = Rendezvous(absl::StrCat("resume-each-", world));
    auto outcomes = testing::RunRanks(world, [&](int rank) -> absl::Status {
      ASSIGN_OR_RETURN(auto r, MakeRank(rank, world, rendezvous));
      const ParamStore& ps = r->model->params();
      int64_t largest = 0, units = 0;
      for (int u = 0; u < ps.num_units(); ++u) largest = std::max(largest, 12 * ps.shard_numel(u));
      LoadedCheckpoint ck;
      JobSpec::Training hp;
      ASSIGN_OR_RETURN(
          auto opt, Optimizer::ResumeEach(
                        r->model.get(),
                        [&](const Optimizer::UnitSink& sink) -> absl::Status {
                          auto counting = [&](int u, std::vector<float>&& a, std::vector<float>&& b,
                                              std::vector<float>&& c) {
                            ++units;
                            return sink(u, std::move(a), std::move(b), std::move(c));
                          };
                          ASSIGN_OR_RETURN(ck, LoadCheckpointTogether(Checkpoint(), r->model.get(),
                                                                      r->comm.get(), counting));
                          return absl::OkStatus();
                        },
                        hp));
      RANK_CHECK(units == ps.num_units(), units);
      RANK_CHECK(ck.optimizer.master.empty(), "the slices were also kept");
      RANK_CHECK(ck.host_bytes == largest, ck.host_bytes, " != ", largest);
      ASSIGN_OR_RETURN(std::string got, MasterBytes(*opt));  // collective
      RANK_CHECK(got == saved_master, "the resumed master weights differ from the saved ones");
      return absl::OkStatus();
    });
    EXPECT_EQ(testing::Failures(outcomes), "") << "world " << world;
  }
}

// A save that cannot write (the checkpoint directory would be under a regular file) fails on
// every rank, naming the path, and quickly: the ranks that cannot open their files still take
// part in every gather, so none waits for a peer until the communicator's timeout.
TEST_F(DistributedCheckpointTest, ASaveThatCannotWriteFailsEveryRankWithoutAHang) {
  const std::string blocker = dir_->path() + "/not-a-directory";
  ASSERT_TRUE(WriteFileAtomic(blocker, "a file").ok());
  const std::string rendezvous = Rendezvous("cannot-write");
  const auto start = std::chrono::steady_clock::now();
  auto outcomes = testing::RunRanks(2, [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(auto r, MakeRank(rank, 2, rendezvous));
    ASSIGN_OR_RETURN(auto opt, TrainedOneStep(r->model.get()));
    absl::StatusOr<CheckpointSaveReport> saved = SaveCheckpointTogether(
        blocker + "/checkpoints", r->model.get(), *opt, TrainState{1, 8, 256}, r->comm.get(), 1);
    RANK_CHECK(!saved.ok(), "the save succeeded");
    RANK_CHECK(saved.status().message().find("not-a-directory") != std::string::npos,
               saved.status().ToString());
    // The communicator is still in step: one more collective goes through.
    RETURN_IF_ERROR(r->comm->Barrier());
    return absl::OkStatus();
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 30) << "a rank waited for a peer (the communicator's timeout is 60 s)";
}

// A save that runs out of disk (RLIMIT_FSIZE stands in for a full disk: writes fail with EFBIG)
// fails on every rank as an I/O error, not "out of memory", and leaves no temporary behind (an
// empty .step-N.tmp.* was left, taking the space a retry needs).
TEST_F(DistributedCheckpointTest, ASaveThatRunsOutOfDiskLeavesNoTemporary) {
  const std::string dir = dir_->path() + "/full-disk";
  const std::string rendezvous = Rendezvous("full-disk");
  auto outcomes = testing::RunRanks(2, [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(auto r, MakeRank(rank, 2, rendezvous));
    ASSIGN_OR_RETURN(auto opt, TrainedOneStep(r->model.get()));
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit small{1024, 1024};
    RANK_CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    absl::StatusOr<CheckpointSaveReport> saved =
        SaveCheckpointTogether(dir, r->model.get(), *opt, TrainState{1, 8, 256}, r->comm.get(), 1);
    RANK_CHECK(!saved.ok(), "the save succeeded");
    RANK_CHECK(!absl::IsResourceExhausted(saved.status()), saved.status().ToString());
    RETURN_IF_ERROR(r->comm->Barrier());
    return absl::OkStatus();
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
  std::vector<std::string> left;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..")
        left.push_back(e->d_name);
    }
    closedir(d);
  }
  EXPECT_TRUE(left.empty()) << left.front();
}

// A file damaged after the save: at world 3 only one rank reads it whole to verify it, yet every
// rank fails with DATA_LOSS naming it.
// A copy of the world-2 checkpoint in dir_/name whose file `victim` has one byte changed.
void CopyWithADamagedFile(const std::string& from, const std::string& copy,
                          const std::string& victim) {
  ASSERT_TRUE(MakeDirs(copy + "/model").ok());
  ASSERT_TRUE(MakeDirs(copy + "/optimizer").ok());
  absl::StatusOr<CheckpointManifest> manifest = ReadCheckpointManifest(from);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  auto text = ReadFileToString(from + "/manifest.json");
  ASSERT_TRUE(text.ok()) << text.status();
  ASSERT_TRUE(WriteFileAtomic(copy + "/manifest.json", *text).ok());
  for (const CheckpointManifest::File& f : manifest->files) {
    auto text = ReadFileToString(from + "/" + f.path);
    ASSERT_TRUE(text.ok()) << text.status();
    ASSERT_TRUE(WriteFileAtomic(copy + "/" + f.path, *text).ok());
  }
  std::fstream file(copy + "/" + victim, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file.good()) << victim << " is not in the checkpoint";
  file.seekp(-5, std::ios::end);
  file.put('\x42');
}

TEST_F(DistributedCheckpointTest, ADamagedFileIsDataLossNamingItOnEveryRank) {
  const std::string copy = dir_->path() + "/damaged";
  const std::string victim = "optimizer/model-00002-of-00002.safetensors";
  CopyWithADamagedFile(Checkpoint(), copy, victim);
  const std::string rendezvous = Rendezvous("damaged");
  auto outcomes = testing::RunRanks(3, [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(auto r, MakeRank(rank, 3, rendezvous));
    absl::StatusOr<LoadedCheckpoint> ck =
        LoadCheckpointTogether(copy, r->model.get(), r->comm.get());
    RANK_CHECK(ck.status().code() == absl::StatusCode::kDataLoss, ck.status().ToString());
    RANK_CHECK(ck.status().message().find(victim) != std::string::npos, ck.status().ToString());
    return absl::OkStatus();
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
}

// A new phase's start ([init] from a step) verifies the step's weights as a resume does: at
// world 3 one rank reads the damaged shard, and every rank fails naming it (issue 53 R2); the
// undamaged step passes on every rank.
TEST_F(DistributedCheckpointTest, ANewPhaseVerifiesTheStepsWeightsOnEveryRank) {
  const std::string copy = dir_->path() + "/damaged-weights";
  const std::string victim = "model/model-00001-of-00002.safetensors";
  CopyWithADamagedFile(Checkpoint(), copy, victim);
  const std::string rendezvous = Rendezvous("damaged-weights");
  auto outcomes = testing::RunRanks(3, [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(auto r, MakeRank(rank, 3, rendezvous));
    for (const std::string& step : {Checkpoint(), copy}) {
      ASSIGN_OR_RETURN(auto reader, SafetensorsReader::Open(step + "/model"));
      absl::Status st =
          VerifyCheckpointWeightsTogether(step, *reader, r->model.get(), r->comm.get());
      if (step == copy) {
        RANK_CHECK(st.code() == absl::StatusCode::kDataLoss, st.ToString());
        RANK_CHECK(st.message().find(copy + "/" + victim) != std::string::npos, st.ToString());
      } else {
        RANK_CHECK(st.ok(), st.ToString());
      }
    }
    return absl::OkStatus();
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
}

// Optimizer state on the host (memory.optimizer_offload), under FSDP: resumed into host state
// at worlds 2 and 3 (each unit's slices copied straight into it), saved again from it (each
// unit gathered through a device copy, one at a time), and that checkpoint holds exactly the
// first one's master weights, m and v.
TEST_F(DistributedCheckpointTest, HostStateResumesAndSavesTheSameState) {
  absl::StatusOr<LoadedCheckpoint> whole = LoadCheckpoint(Checkpoint(), ParamLayout(Config()));
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto bytes = ReadFileToString(dir_->path() + "/master.f32");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string saved_master = *bytes;
  for (int world : {2, 3}) {
    const std::string again = absl::StrCat(dir_->path(), "/host-state-", world);
    const std::string rendezvous = Rendezvous(absl::StrCat("host-state-", world));
    auto outcomes = testing::RunRanks(world, [&](int rank) -> absl::Status {
      ASSIGN_OR_RETURN(auto r, MakeRank(rank, world, rendezvous));
      JobSpec::Training hp;
      ASSIGN_OR_RETURN(ResumedCheckpoint resumed,
                       ResumeCheckpointTogether(Checkpoint(), r->model.get(), r->comm.get(), hp,
                                                /*host_state=*/true));
      RANK_CHECK(resumed.optimizer->host_state());
      RANK_CHECK(r->alloc.tracker().current(Tier::kOptimizer) == 0);
      RANK_CHECK(r->alloc.tracker().current(Tier::kHostOptimizer) > 0);
      ASSIGN_OR_RETURN(std::string got, MasterBytes(*resumed.optimizer));  // collective
      RANK_CHECK(got == saved_master, "the resumed master weights differ from the saved ones");
      TrainState state{1, 8, 256};
      ASSIGN_OR_RETURN(CheckpointSaveReport saved,
                       SaveCheckpointTogether(again, r->model.get(), *resumed.optimizer, state,
                                              r->comm.get(), /*keep=*/1));
      RANK_CHECK(saved.rank_bytes > 0);
      return absl::OkStatus();
    });
    ASSERT_EQ(testing::Failures(outcomes), "") << "world " << world;
    absl::StatusOr<LoadedCheckpoint> back =
        LoadCheckpoint(again + "/step-00000001", ParamLayout(Config()));
    ASSERT_TRUE(back.ok()) << back.status();
    for (auto [got, want, kind] :
         {std::tuple{&back->optimizer.master, &whole->optimizer.master, "master"},
          {&back->optimizer.m, &whole->optimizer.m, "m"},
          {&back->optimizer.v, &whole->optimizer.v, "v"}}) {
      ASSERT_EQ(got->size(), want->size());
      for (size_t u = 0; u < want->size(); ++u) {
        EXPECT_EQ((*got)[u], (*want)[u]) << kind << " of unit " << u << " at world " << world;
      }
    }
  }
}

// [lora]: a checkpoint saved by two FSDP ranks holds the adapters and their Adam state alone, and
// resumes at world 1 and 3 (the frozen base from its source, here the seed) to the same weights;
// the next step from it lands where the saving run's next step did.
TEST(LoraCheckpointTest, ResumesAtAnotherWorldWithTheBaseFromItsSource) {
  testing::TempDir dir;
  LlamaConfig cfg = Config();
  cfg.lora.rank = 4;
  cfg.lora.alpha = 8;
  cfg.lora.targets[kLoraQ] = cfg.lora.targets[kLoraV] = cfg.lora.targets[kLoraDown] = true;
  auto make = [&](int rank, int world,
                  const std::string& name) -> absl::StatusOr<std::unique_ptr<RankModel>> {
    const std::string rv = dir.path() + "/rv-" + name;
    RETURN_IF_ERROR(MakeDirs(rv));
    auto r = std::make_unique<RankModel>();
    RankInfo info;
    info.rank = rank;
    info.world = world;
    info.rendezvous = "file:" + rv;
    ASSIGN_OR_RETURN(r->comm, ConnectComm(info, Device::kCpu, /*timeout_s=*/60));
    LlamaModel::Options mo;
    mo.fsdp = true;
    ASSIGN_OR_RETURN(r->model, LlamaModel::Create(cfg, &r->ops, &r->alloc, mo, r->comm.get()));
    return r;
  };
  const ParamLayout layout(cfg);
  Optimizer::UnitFill base = [&](int u, float* out) {
    RandomUnitWeightsInto(layout, u, 99, out);
    return absl::OkStatus();
  };
  // Every rank runs the same sample at 1 / world of the scale: the reduced gradient is the
  // sample's at any world.
  auto step = [](LlamaModel* model, Optimizer* opt, int64_t n, int world) -> absl::Status {
    std::mt19937 rng(5 + n);  // the same sample on every rank
    const int64_t S = 32;
    std::vector<int32_t> inputs(S), labels(S);
    for (int64_t i = 0; i < S; ++i) {
      inputs[i] = static_cast<int32_t>(rng() % 256);
      labels[i] = static_cast<int32_t>(rng() % 256);
    }
    model->params().ZeroGrads();
    RETURN_IF_ERROR(
        model->ForwardBackward(inputs.data(), labels.data(), S, 1.f / (S * world)).status());
    RETURN_IF_ERROR(model->params().FinishGradients());
    return opt->Step(n, 1e-2).status();
  };
  const std::string out = dir.path();
  auto saved = testing::RunRanks(2, [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(auto r, make(rank, 2, "save"));
    JobSpec::Training hp;
    ASSIGN_OR_RETURN(auto opt, Optimizer::CreateFilled(
                                   r->model.get(),
                                   [&](int u, float* to) -> absl::Status {
                                     if (layout.units()[u].trainable) {
                                       LoraInitUnitInto(layout, u, 7, to);
                                       return absl::OkStatus();
                                     }
                                     return base(u, to);
                                   },
                                   hp));
    RETURN_IF_ERROR(step(r->model.get(), opt.get(), 1, 2));
    RETURN_IF_ERROR(step(r->model.get(), opt.get(), 2, 2));
    TrainState state{2, 8, 256};
    RETURN_IF_ERROR(SaveCheckpointTogether(out + "/checkpoints", r->model.get(), *opt, state,
                                           r->comm.get(), /*keep=*/1)
                        .status());
    ASSIGN_OR_RETURN(std::string at_save, MasterBytes(*opt));
    RETURN_IF_ERROR(step(r->model.get(), opt.get(), 3, 2));
    ASSIGN_OR_RETURN(std::string after, MasterBytes(*opt));
    if (rank == 0) {
      RETURN_IF_ERROR(WriteFileAtomic(out + "/at_save.f32", at_save));
      RETURN_IF_ERROR(WriteFileAtomic(out + "/after.f32", after));
    }
    return absl::OkStatus();
  });
  ASSERT_EQ(testing::Failures(saved), "");
  // The checkpoint: the adapters alone (3 targets x A and B x the layers).
  auto model_files = SafetensorsReader::Open(out + "/checkpoints/step-00000002/model");
  ASSERT_TRUE(model_files.ok()) << model_files.status();
  EXPECT_EQ((*model_files)->Names().size(), 6u * cfg.num_hidden_layers);
  const std::string at_save = *ReadFileToString(out + "/at_save.f32");
  const std::string after = *ReadFileToString(out + "/after.f32");
  for (int world : {1, 3}) {
    auto outcomes = testing::RunRanks(world, [&](int rank) -> absl::Status {
      ASSIGN_OR_RETURN(auto r, make(rank, world, absl::StrCat("resume-", world)));
      JobSpec::Training hp;
      ASSIGN_OR_RETURN(ResumedCheckpoint resumed,
                       ResumeCheckpointTogether(out + "/checkpoints/step-00000002", r->model.get(),
                                                r->comm.get(), hp,
                                                /*host_state=*/false, base));
      ASSIGN_OR_RETURN(std::string got, MasterBytes(*resumed.optimizer));
      RANK_CHECK(got == at_save, "the resumed weights differ from the saved ones");
      RETURN_IF_ERROR(step(r->model.get(), resumed.optimizer.get(), 3, world));
      ASSIGN_OR_RETURN(got, MasterBytes(*resumed.optimizer));
      // Another world sums the gradient in another order: the same step to rounding.
      const float* a = reinterpret_cast<const float*>(got.data());
      const float* b = reinterpret_cast<const float*>(after.data());
      RANK_CHECK(got.size() == after.size());
      double err = 0;
      for (size_t i = 0; i < got.size() / 4; ++i)
        err = std::max(err, double(std::abs(a[i] - b[i])));
      RANK_CHECK(err < 1e-5, "the step after the resume differs by ", err);
      RANK_CHECK(got != at_save, "the step after the resume changed nothing");
      return absl::OkStatus();
    });
    EXPECT_EQ(testing::Failures(outcomes), "") << "world " << world;
  }
}

}  // namespace
}  // namespace ithaca
