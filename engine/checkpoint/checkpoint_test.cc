// Checkpoints survive kill -9 at any point of a save or a prune, never follow symbolic links when
// deleting, clean up after killed saves, and refuse to load a damaged file.
#include "engine/checkpoint/checkpoint.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <tuple>

#include "engine/core/file_util.h"
#include "engine/model/config.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

std::string FreshDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  std::string d = std::string(root ? root : "/tmp") + "/" + name;
  EXPECT_TRUE(RemoveTreeNoFollow(d).ok());
  EXPECT_TRUE(MakeDirs(d).ok());
  return d;
}

// Every value of a step's state is derived from the step, so a loaded checkpoint can be checked
// against the step it claims to be.
OptimizerShards StateFor(const ParamLayout& layout, int64_t step) {
  OptimizerShards s;
  for (const ParamUnit& u : layout.units()) {
    s.master.emplace_back(u.numel, 0.25f * step);
    s.m.emplace_back(u.numel, 1.0f * step);
    s.v.emplace_back(u.numel, 2.0f * step);
  }
  return s;
}

TrainState TrainStateFor(int64_t step) { return {step, 10 * step, 100 * step}; }

struct Fixture {
  LlamaConfig cfg = *PresetConfig("tiny");
  ParamLayout layout{cfg};
  absl::Status Save(const std::string& dir, int64_t step, int64_t keep = 2) const {
    return SaveCheckpoint(dir, cfg, layout, StateOfWholeUnits(layout, StateFor(layout, step)),
                          TrainStateFor(step), keep);
  }
  // The newest checkpoint loads, verifies and holds exactly its step's values.
  void ExpectLatestIsWhole(const std::string& dir, int64_t min_step) const {
    absl::StatusOr<std::string> latest = LatestCheckpoint(dir);
    ASSERT_TRUE(latest.ok()) << latest.status();
    absl::StatusOr<LoadedCheckpoint> ck = LoadCheckpoint(*latest, layout);
    ASSERT_TRUE(ck.ok()) << ck.status();
    const int64_t step = ck->state.step;
    EXPECT_GE(step, min_step);
    EXPECT_EQ(ck->state.data_position, 10 * step);
    EXPECT_EQ(ck->state.tokens, 100 * step);
    const OptimizerShards want = StateFor(layout, step);
    EXPECT_EQ(ck->optimizer.master, want.master);
    EXPECT_EQ(ck->optimizer.m, want.m);
    EXPECT_EQ(ck->optimizer.v, want.v);
  }
};

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(CheckpointTest, SavesKeepsNewestAndLoads) {
  Fixture f;
  const std::string dir = FreshDir("keep");
  for (int64_t step = 1; step <= 4; ++step) ASSERT_TRUE(f.Save(dir, step).ok());
  EXPECT_EQ(Entries(dir), (std::vector<std::string>{"step-00000003", "step-00000004"}));
  f.ExpectLatestIsWhole(dir, 4);
}

TEST(CheckpointTest, KillAtRandomPointsDuringSaveAndPruneAlwaysLeavesAWholeCheckpoint) {
  Fixture f;
  // How long one save (with its prune) takes here, to spread the kills over whole saves.
  const std::string probe = FreshDir("kill-probe");
  ASSERT_TRUE(f.Save(probe, 1).ok());
  ASSERT_TRUE(f.Save(probe, 2).ok());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(f.Save(probe, 3).ok());
  const double save_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();

  std::mt19937_64 rng(20261201);
  int killed_mid_save = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const std::string dir = FreshDir("kill-" + std::to_string(trial));
    ASSERT_TRUE(f.Save(dir, 1).ok());
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the "worker": saves step after step until killed
      for (int64_t step = 2;; ++step) {
        if (!f.Save(dir, step).ok()) _exit(3);
      }
    }
    // Kill somewhere in the first few saves: before, inside, or between them.
    const double delay_us = std::uniform_real_distribution<double>(0, 4 * save_us)(rng);
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(delay_us)));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saver exited by itself with " << status;
    for (const std::string& e : Entries(dir)) killed_mid_save += e[0] == '.';
    SCOPED_TRACE("trial " + std::to_string(trial) + ", killed after " + std::to_string(delay_us) +
                 " us");
    f.ExpectLatestIsWhole(dir, 1);
    // The next save removes what the killed one left behind, and the result is whole too.
    ASSERT_TRUE(f.Save(dir, 1000).ok());
    for (const std::string& e : Entries(dir)) EXPECT_NE(e[0], '.') << e << " left behind";
    f.ExpectLatestIsWhole(dir, 1000);
  }
  // Not an assertion on timing: says whether the kills really landed inside saves.
  std::printf("%d of 20 kills left temporary or trash directories behind\n", killed_mid_save);
}

TEST(CheckpointTest, PruningNeverFollowsSymlinks) {
  Fixture f;
  const std::string dir = FreshDir("links");
  const std::string victim = FreshDir("links-victim");
  ASSERT_TRUE(WriteFileAtomic(victim + "/precious.txt", "keep me\n").ok());
  ASSERT_TRUE(f.Save(dir, 1).ok());
  // Links to the victim tree inside the checkpoint, and a whole step directory that is a link.
  ASSERT_EQ(symlink(victim.c_str(), (dir + "/step-00000001/model/evil-dir").c_str()), 0);
  ASSERT_EQ(symlink((victim + "/precious.txt").c_str(), (dir + "/step-00000001/evil-file").c_str()),
            0);
  const std::string linked_step = FreshDir("links-step");
  ASSERT_TRUE(f.Save(linked_step, 2).ok());
  ASSERT_EQ(symlink((linked_step + "/step-00000002").c_str(), (dir + "/step-00000002").c_str()), 0);
  for (int64_t step = 3; step <= 5; ++step) ASSERT_TRUE(f.Save(dir, step).ok());
  EXPECT_EQ(Entries(dir), (std::vector<std::string>{"step-00000004", "step-00000005"}));
  EXPECT_TRUE(PathExists(victim + "/precious.txt"));
  EXPECT_TRUE(PathExists(linked_step + "/step-00000002/manifest.json"));
}

TEST(CheckpointTest, StaleTemporariesAndTrashAreRemoved) {
  Fixture f;
  const std::string dir = FreshDir("stale");
  ASSERT_TRUE(MakeDirs(dir + "/.step-00000009.tmp.12345/model").ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/.step-00000009.tmp.12345/model/x", "partial").ok());
  ASSERT_TRUE(MakeDirs(dir + "/.trash-step-00000003.999").ok());
  ASSERT_TRUE(RemoveStaleCheckpointFiles(dir).ok());
  EXPECT_TRUE(Entries(dir).empty());
  ASSERT_TRUE(MakeDirs(dir + "/.step-00000009.tmp.12345").ok());
  ASSERT_TRUE(f.Save(dir, 1).ok());
  EXPECT_EQ(Entries(dir), (std::vector<std::string>{"step-00000001"}));
}

// Two runs saving into one directory (issue: one deleted the other's temporary save, and that
// job failed): each run's temporary has a name of its own, and a live save is locked, so the
// other run's clean-up leaves it alone; once that save is over, it is stale and goes.
TEST(CheckpointTest, ALiveSaveOfAnotherRunIsNotRemovedAsStale) {
  Fixture f;
  const std::string dir = FreshDir("two_runs");
  TrainState a = TrainStateFor(4), b = TrainStateFor(4);
  a.run_id = "ithacad /state/worker.sock job-1";
  b.run_id = "ithacad /state/worker.sock job-2";
  EXPECT_NE(CheckpointTempPath(dir, a), CheckpointTempPath(dir, b));
  EXPECT_EQ(CheckpointTempPath(dir, TrainStateFor(4)), dir + "/.step-00000004.tmp.save");
  {
    absl::StatusOr<CheckpointSaveLock> live = BeginCheckpoint(dir, a);  // job-1 is saving
    ASSERT_TRUE(live.ok()) << live.status();
    ASSERT_TRUE(WriteFileAtomic(CheckpointTempPath(dir, a) + "/partial", "x").ok());
    // job-2 begins and commits a save of its own meanwhile.
    ASSERT_TRUE(SaveCheckpoint(dir, f.cfg, f.layout,
                               StateOfWholeUnits(f.layout, StateFor(f.layout, 4)), b, 3)
                    .ok());
    EXPECT_TRUE(PathExists(CheckpointTempPath(dir, a) + "/partial")) << "job-1's live save";
    ASSERT_TRUE(RemoveStaleCheckpointFiles(dir).ok());
    EXPECT_TRUE(PathExists(CheckpointTempPath(dir, a) + "/partial")) << "job-1's live save";
  }
  // job-1 died: its temporary is stale now.
  ASSERT_TRUE(RemoveStaleCheckpointFiles(dir).ok());
  EXPECT_EQ(Entries(dir), (std::vector<std::string>{"step-00000004"}));
}

TEST(CheckpointTest, ADamagedFileIsDataLossNamingIt) {
  Fixture f;
  const std::string dir = FreshDir("damaged");
  ASSERT_TRUE(f.Save(dir, 1).ok());
  const std::string ck = dir + "/step-00000001";
  const std::string opt = ck + "/optimizer.safetensors";
  {  // flip one byte in the middle
    std::fstream file(opt, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(0, std::ios::end);
    const std::streamoff mid = file.tellg() / 2;
    file.seekg(mid);
    char c = 0;
    file.read(&c, 1);
    c ^= 0x5a;
    file.seekp(mid);
    file.write(&c, 1);
  }
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(ck, f.layout);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(loaded.status().message().find(
                "optimizer.safetensors: not the checksum the manifest says: corrupt"),
            std::string::npos)
      << loaded.status();

  ASSERT_TRUE(f.Save(dir, 2).ok());
  ASSERT_EQ(truncate((dir + "/step-00000002/state.json").c_str(), 3), 0);
  loaded = LoadCheckpoint(dir + "/step-00000002", f.layout);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("state.json: not the size the manifest says"),
            std::string::npos)
      << loaded.status();
  // No fact about the file reaches the reason: neither its size nor its checksum.
  EXPECT_EQ(loaded.status().message().find(" 3 "), std::string::npos) << loaded.status();

  // Without its manifest a step directory is not a checkpoint at all.
  ASSERT_EQ(unlink((dir + "/step-00000002/manifest.json").c_str()), 0);
  EXPECT_EQ(*LatestCheckpoint(dir), ck);
}

// A state.json whose counts are negative (damaged or forged) is data loss naming the field,
// not an abort in the trainer (issue 43 N8).
// Issue 43 N17: a manifest that lists nothing (or leaves out a part) verified nothing, and a
// resume loaded whatever the step held. Each part a checkpoint has must be listed.
// A step whose directory (or any entry) is a symbolic link is refused before anything is read
// through it, and the reason says nothing of the file it leads to (issue 43 N6).
TEST(CheckpointTest, AResumeFollowsNoLinkInAStep) {
  Fixture f;
  const std::string dir = FreshDir("links");
  ASSERT_TRUE(f.Save(dir, 1).ok());
  const std::string ck = dir + "/step-00000001";
  // A secret outside the checkpoint, and a manifest that lists it through a linked directory.
  const std::string outside = FreshDir("links-outside");
  { std::ofstream(outside + "/secret") << "0123456789"; }
  ASSERT_EQ(rename((ck + "/model").c_str(), (dir + "/real-model").c_str()), 0);
  ASSERT_EQ(symlink(outside.c_str(), (ck + "/model").c_str()), 0);
  for (auto load :
       {+[](const std::string&p, const ParamLayout&l) { return LoadCheckpoint(p, l).status(); },
        +[](const std::string&p, const ParamLayout&) { return VerifyCheckpoint(p); }}) {
    const absl::Status st = load(ck, f.layout);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_NE(st.message().find(ck + "/model: a symbolic link"), std::string::npos) << st;
    EXPECT_EQ(st.message().find("secret"), std::string::npos) << st;
  }
  // The step directory itself a link: refused too.
  ASSERT_EQ(unlink((ck + "/model").c_str()), 0);
  ASSERT_EQ(rename((dir + "/real-model").c_str(), (ck + "/model").c_str()), 0);
  ASSERT_TRUE(LoadCheckpoint(ck, f.layout).ok());  // whole again
  ASSERT_EQ(symlink(ck.c_str(), (dir + "/step-00000009").c_str()), 0);
  const absl::Status st = VerifyCheckpoint(dir + "/step-00000009");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("links are not followed"), std::string::npos) << st;
}

TEST(CheckpointTest, AManifestMustListEveryPart) {
  Fixture f;
  const std::string dir = FreshDir("manifest");
  ASSERT_TRUE(f.Save(dir, 1).ok());
  const std::string ck = dir + "/step-00000001";
  ASSERT_TRUE(VerifyCheckpoint(ck).ok());
  auto write = [&](const std::string& files) {
    ASSERT_TRUE(WriteFileAtomic(ck + "/manifest.json",
                                "{\"format\": \"ithaca-manifest-v1\", \"files\": [" + files + "]}")
                    .ok());
  };
  write("");
  absl::Status verified = VerifyCheckpoint(ck);
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss) << verified;
  EXPECT_NE(verified.message().find("does not list state.json"), std::string::npos) << verified;
  // state.json and the weights, but not the optimizer's state.
  write(
      "{\"path\": \"state.json\", \"bytes\": 1, \"crc32\": 1}, "
      "{\"path\": \"model/model.safetensors\", \"bytes\": 1, \"crc32\": 1}");
  verified = VerifyCheckpoint(ck);
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss) << verified;
  EXPECT_NE(verified.message().find("does not list the optimizer's state"), std::string::npos)
      << verified;
}

TEST(CheckpointTest, NegativeCountsInTheStateAreDataLoss) {
  const std::string dir = FreshDir("negative");
  for (const char* field : {"step", "data_position", "tokens", "schedule_steps"}) {
    std::string js = "{\"step\": 3, \"data_position\": 4, \"tokens\": 5, \"schedule_steps\": 9}";
    js.replace(js.find(field) + std::string(field).size() + 3, 1, "-5");
    ASSERT_TRUE(WriteFileAtomic(dir + "/state.json", js).ok());
    absl::StatusOr<TrainState> st = ReadCheckpointState(dir);
    ASSERT_FALSE(st.ok()) << js;
    EXPECT_EQ(st.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(st.status().message().find(absl::StrCat(field, " is -5")), std::string::npos)
        << st.status();
  }
  ASSERT_TRUE(WriteFileAtomic(dir + "/state.json",
                              "{\"step\": 3, \"data_position\": 4, "
                              "\"tokens\": \"many\"}")
                  .ok());
  EXPECT_TRUE(ReadCheckpointState(dir).ok());  // a field of the wrong type is ignored, not a crash
  // A state.json past its bound is refused before it is read.
  ASSERT_EQ(truncate((dir + "/state.json").c_str(), (int64_t{17} << 20)), 0);
  absl::StatusOr<TrainState> big = ReadCheckpointState(dir);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("more than the"), std::string::npos) << big.status();
}

// state.json's "lora" (what ithaca-export needs of a LoRA run): read back as written, and a
// damaged one is data loss naming the key, never a run without adapters.
TEST(CheckpointTest, TheStateRecordsTheRunsLora) {
  const std::string dir = FreshDir("lora_state");
  const std::string head = "{\"step\": 3, \"data_position\": 4";
  ASSERT_TRUE(WriteFileAtomic(dir + "/state.json",
                              head + ", \"lora\": {\"r\": 8, \"lora_alpha\": 16.5, "
                                     "\"target_modules\": [\"q_proj\", \"down_proj\"]}}")
                  .ok());
  absl::StatusOr<TrainState> st = ReadCheckpointState(dir);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->lora.rank, 8);
  EXPECT_EQ(st->lora.alpha, 16.5);
  for (int t = 0; t < kNumLoraTargets; ++t) {
    EXPECT_EQ(st->lora.targets[t], t == kLoraQ || t == kLoraDown) << LoraTargetName(t);
  }
  ASSERT_TRUE(WriteFileAtomic(dir + "/state.json", head + "}").ok());
  st = ReadCheckpointState(dir);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_FALSE(st->lora.enabled());
  for (const auto& [lora, what] : std::vector<std::pair<std::string, std::string>>{
           {"[]", "an integer r > 0"},
           {"{\"r\": 0, \"lora_alpha\": 1, \"target_modules\": [\"q_proj\"]}", "r > 0"},
           {"{\"r\": 4, \"target_modules\": [\"q_proj\"]}", "lora_alpha > 0"},
           {"{\"r\": 4, \"lora_alpha\": 1, \"target_modules\": []}", "target_modules"},
           {"{\"r\": 4, \"lora_alpha\": 1, \"target_modules\": [\"qproj\"]}",
            "\"qproj\" is no target"}}) {
    ASSERT_TRUE(WriteFileAtomic(dir + "/state.json", head + ", \"lora\": " + lora + "}").ok());
    st = ReadCheckpointState(dir);
    ASSERT_FALSE(st.ok()) << lora;
    EXPECT_EQ(st.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(st.status().message().find("lora: "), std::string::npos) << st.status();
    EXPECT_NE(st.status().message().find(what), std::string::npos) << st.status();
  }
}

// Values that differ by unit and position, so that a tensor read back from the wrong place of a
// sharded checkpoint shows.
OptimizerShards DistinctState(const ParamLayout& layout) {
  OptimizerShards s;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    const int64_t n = layout.units()[u].numel;
    s.master.emplace_back(n);
    s.m.emplace_back(n);
    s.v.emplace_back(n);
    for (int64_t i = 0; i < n; ++i) {
      s.master[u][i] = static_cast<float>(u) + 1e-4f * static_cast<float>(i % 9973);
      s.m[u][i] = -s.master[u][i];
      s.v[u][i] = 2 * s.master[u][i];
    }
  }
  return s;
}

// The tensors of `all` that `keep` names.
OptimizerState Only(const OptimizerState& all, const OptimizerSelection& keep) {
  OptimizerState s;
  for (auto [from, names, to] : {std::tuple{&all.master, &keep.master, &s.master},
                                 {&all.m, &keep.m, &s.m},
                                 {&all.v, &keep.v, &s.v}}) {
    for (const std::string& name : *names) (*to)[name] = from->at(name);
  }
  return s;
}

// Three ranks write their shares at once (threads standing in for rank processes); the result is
// one checkpoint in the Hugging Face sharded layout that loads whole, at any world size.
// A new phase ([init] from) reads the weights of a checkpoint.dir, a step directory or a model
// directory, and refuses a missing or incomplete one naming it.
TEST(PhaseTest, InitWeightsDirFindsTheModelOfEachKindOfPath) {
  Fixture f;
  const std::string dir = FreshDir("init_from");
  for (int64_t step = 1; step <= 2; ++step) ASSERT_TRUE(f.Save(dir, step).ok());
  absl::StatusOr<std::string> newest = InitWeightsDir(dir);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(*newest, dir + "/step-00000002/model");
  absl::StatusOr<std::string> step = InitWeightsDir(dir + "/step-00000001");
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, dir + "/step-00000001/model");
  absl::StatusOr<std::string> model = InitWeightsDir(dir + "/step-00000001/model");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(*model, dir + "/step-00000001/model");

  absl::StatusOr<std::string> missing = InitWeightsDir(dir + "/nope");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  const std::string nope = "init.from: " + dir + "/nope: no such directory";
  EXPECT_EQ(std::string(missing.status().message()).rfind(nope, 0), 0u) << missing.status();
  const std::string empty = FreshDir("init_from_empty");
  absl::StatusOr<std::string> none = InitWeightsDir(empty);
  EXPECT_TRUE(absl::IsNotFound(none.status())) << none.status();
  EXPECT_NE(none.status().message().find("holds no complete checkpoint"), std::string::npos);
  ASSERT_TRUE(RemoveTreeNoFollow(dir + "/step-00000002/manifest.json").ok());
  absl::StatusOr<std::string> torn = InitWeightsDir(dir + "/step-00000002");
  EXPECT_TRUE(absl::IsDataLoss(torn.status())) << torn.status();
}

TEST(PhaseTest, ANewPhaseRefusesACheckpointDirHoldingAnotherRun) {
  Fixture f;
  const std::string dir = FreshDir("init_target");
  EXPECT_TRUE(CheckInitTarget(dir, "").ok());  // empty: a new phase may start here
  EXPECT_TRUE(CheckInitTarget(dir + "/not-yet", "").ok());
  TrainState s = TrainStateFor(3);
  s.run_id = "ithacad /state/worker.sock job-7";
  ASSERT_TRUE(
      SaveCheckpoint(dir, f.cfg, f.layout, StateOfWholeUnits(f.layout, StateFor(f.layout, 3)), s, 2)
          .ok());
  absl::Status other = CheckInitTarget(dir, "ithacad /state/worker.sock job-8");
  EXPECT_TRUE(absl::IsFailedPrecondition(other)) << other;
  EXPECT_NE(other.message().find("already holds the run of job job-7"), std::string::npos) << other;
  EXPECT_NE(other.message().find("at step 3"), std::string::npos) << other;
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckInitTarget(dir, "")));  // a submission
  // The same run relaunched (a retry, a daemon restart) resumes its own checkpoint.
  EXPECT_TRUE(CheckInitTarget(dir, s.run_id).ok());
}

TEST(PhaseTest, AResumeKeepsTheRunsRope) {
  Fixture f;
  const std::string dir = FreshDir("resume_rope");
  ASSERT_TRUE(f.Save(dir, 1).ok());
  const std::string ck = *LatestCheckpoint(dir);
  EXPECT_TRUE(CheckResumeRope(ck, f.cfg).ok());
  LlamaConfig theta = f.cfg;
  theta.rope_theta = theta.rope.theta = 4 * f.cfg.rope_theta;
  absl::Status st = CheckResumeRope(ck, theta);
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_EQ(std::string(st.message()).rfind("model.rope: the job's RoPE (rope_theta 40000", 0), 0u)
      << st;
  EXPECT_NE(st.message().find("was trained with (rope_theta 10000"), std::string::npos) << st;
  EXPECT_NE(st.message().find("[init] from = \"" + dir + "\""), std::string::npos) << st;
  LlamaConfig scaling = f.cfg;
  scaling.rope.factor = 16;
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckResumeRope(ck, scaling)));
}

TEST(ShardedCheckpointTest, RanksWriteTheirSharesInParallel) {
  Fixture f;
  const std::string dir = FreshDir("sharded");
  const OptimizerShards state = DistinctState(f.layout);
  const TrainState ts = TrainStateFor(7);
  ASSERT_TRUE(BeginCheckpoint(dir, ts).ok());
  std::vector<absl::StatusOr<CheckpointWriteReport>> wrote(3, absl::UnknownError("not run"));
  std::vector<std::thread> ranks;
  // Each rank is handed only the tensors it writes, as a save does.
  std::vector<OptimizerState> held;
  for (int r = 0; r < 3; ++r) {
    held.push_back(Only(StateOfWholeUnits(f.layout, state), CheckpointTensorsOf(f.layout, r, 3)));
  }
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back(
        [&, r] { wrote[r] = WriteCheckpointShard(dir, f.cfg, f.layout, held[r], ts, r, 3); });
  }
  for (std::thread& t : ranks) t.join();
  int64_t written = 0;
  for (const auto& w : wrote) {
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_GT(w->bytes, 0);  // every rank wrote a share
    written += w->bytes;
  }
  absl::StatusOr<CheckpointWriteReport> commit = CommitCheckpoint(dir, ts, 3, 2);
  ASSERT_TRUE(commit.ok()) << commit.status();
  EXPECT_GT(commit->bytes, written);  // plus config, indexes, state

  const std::string ck = dir + "/step-00000007";
  EXPECT_TRUE(PathExists(ck + "/model/model.safetensors.index.json"));
  EXPECT_TRUE(PathExists(ck + "/model/model-00003-of-00003.safetensors"));
  EXPECT_TRUE(PathExists(ck + "/optimizer/model-00003-of-00003.safetensors"));
  EXPECT_FALSE(PathExists(ck + "/.sums-rank-0.json"));
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(ck, f.layout);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->saved_world, 3);
  EXPECT_EQ(loaded->bytes, commit->bytes);
  EXPECT_EQ(loaded->state.step, 7);
  EXPECT_EQ(loaded->optimizer.master, state.master);
  EXPECT_EQ(loaded->optimizer.m, state.m);
  EXPECT_EQ(loaded->optimizer.v, state.v);

  // The manifest covers the shards: a damaged one is named.
  const std::string shard = ck + "/optimizer/model-00002-of-00003.safetensors";
  {
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-1, std::ios::end);
    file.put('\x7f');
  }
  absl::StatusOr<LoadedCheckpoint> damaged = LoadCheckpoint(ck, f.layout);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
  EXPECT_NE(damaged.status().message().find("model-00002-of-00003.safetensors"), std::string::npos)
      << damaged.status();
}

TEST(ShardedCheckpointTest, ACommitWithoutEveryRanksShareFailsNamingTheRank) {
  Fixture f;
  const std::string dir = FreshDir("sharded_missing");
  const OptimizerState state = StateOfWholeUnits(f.layout, DistinctState(f.layout));
  ASSERT_TRUE(BeginCheckpoint(dir, TrainStateFor(3)).ok());
  for (int r : {0, 2}) {  // rank 1 never writes
    ASSERT_TRUE(WriteCheckpointShard(dir, f.cfg, f.layout, state, TrainStateFor(3), r, 3).ok());
  }
  absl::StatusOr<CheckpointWriteReport> commit = CommitCheckpoint(dir, TrainStateFor(3), 3, 2);
  EXPECT_EQ(commit.status().code(), absl::StatusCode::kDataLoss) << commit.status();
  EXPECT_NE(commit.status().message().find("rank 1 did not finish"), std::string::npos)
      << commit.status();
  EXPECT_TRUE(absl::IsNotFound(LatestCheckpoint(dir).status()));
}

// Who writes what: every tensor of every kind by exactly one rank, and each rank's share about
// 1/world of the state.
TEST(ShardedCheckpointTest, EveryTensorHasOneWriterAndTheSharesAreAboutEqual) {
  for (const char* preset : {"tiny", "llama-3-8b"}) {
    const LlamaConfig cfg = *PresetConfig(preset);
    const ParamLayout layout(cfg);
    int64_t state_bytes = 0;
    for (const ParamUnit& u : layout.units()) state_bytes += 3 * 4 * u.numel;
    for (int world : {1, 2, 3, 4, 8}) {
      SCOPED_TRACE(absl::StrCat(preset, " at world ", world));
      std::map<std::string, int> writers;  // "kind/name" -> how many ranks write it
      for (int r = 0; r < world; ++r) {
        const OptimizerSelection mine = CheckpointTensorsOf(layout, r, world);
        int64_t bytes = 0;
        for (const ParamUnit& u : layout.units()) {
          for (const ParamEntry& e : u.entries) {
            const int64_t n = NumElements(e.shape) * 4;
            bytes += n * (mine.master.count(e.hf_name) + mine.m.count(e.hf_name) +
                          mine.v.count(e.hf_name));
            writers["master/" + e.hf_name] += mine.master.count(e.hf_name);
            writers["m/" + e.hf_name] += mine.m.count(e.hf_name);
            writers["v/" + e.hf_name] += mine.v.count(e.hf_name);
          }
        }
        const double share = static_cast<double>(bytes) / state_bytes;
        std::printf("%s world %d rank %d holds %.3f of the state\n", preset, world, r, share);
        // Whole tensors cannot split evenly; the tiny model's few tensors least of all.
        const double slack = std::string(preset) == "tiny" ? 0.5 : 0.15;
        EXPECT_GT(share, (1 - slack) / world) << "rank " << r;
        EXPECT_LT(share, (1 + slack) / world) << "rank " << r;
      }
      for (const auto& [name, n] : writers) EXPECT_EQ(n, 1) << name;
    }
  }
}

// A rank given less than its share fails naming a tensor it should have written.
TEST(ShardedCheckpointTest, ARankWithoutItsTensorsFailsNamingOne) {
  Fixture f;
  const std::string dir = FreshDir("sharded_short");
  const OptimizerState all = StateOfWholeUnits(f.layout, DistinctState(f.layout));
  OptimizerState other = Only(all, CheckpointTensorsOf(f.layout, 0, 2));
  ASSERT_TRUE(BeginCheckpoint(dir, TrainStateFor(5)).ok());
  absl::StatusOr<CheckpointWriteReport> w =
      WriteCheckpointShard(dir, f.cfg, f.layout, other, TrainStateFor(5), /*rank=*/1, 2);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("no data to write"), std::string::npos) << w.status();
  EXPECT_NE(w.status().message().find("tensor '"), std::string::npos) << w.status();
}

// Loading a slice of each unit (an FSDP rank of another world) reads just that slice's values,
// zeros past the unit's end, and holds only the slices.
TEST(ShardedCheckpointTest, SlicesLoadTheirOwnValuesAtAnyWorld) {
  Fixture f;
  const std::string dir = FreshDir("slices");
  const OptimizerShards state = DistinctState(f.layout);
  ASSERT_TRUE(
      SaveCheckpoint(dir, f.cfg, f.layout, StateOfWholeUnits(f.layout, state), TrainStateFor(4), 1)
          .ok());
  const std::string ck = dir + "/step-00000004";
  int64_t state_bytes = 0;
  for (const ParamUnit& u : f.layout.units()) state_bytes += 3 * 4 * u.numel;
  for (int world : {2, 3, 4}) {
    int64_t read = 0;
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " of ", world));
      std::vector<UnitSlice> slices;
      for (const ParamUnit& u : f.layout.units()) {
        const int64_t shard = (u.numel + world - 1) / world;
        slices.push_back({r * shard, shard});
      }
      absl::StatusOr<LoadedCheckpoint> got = LoadCheckpointSlices(ck, f.layout, slices);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->state.step, 4);
      int64_t held = 0;
      for (size_t u = 0; u < slices.size(); ++u) {
        held += 3 * 4 * slices[u].numel;
        for (auto [have, want] : {std::pair{&got->optimizer.master, &state.master},
                                  {&got->optimizer.m, &state.m},
                                  {&got->optimizer.v, &state.v}}) {
          ASSERT_EQ((*have)[u].size(), static_cast<size_t>(slices[u].numel));
          for (int64_t i = 0; i < slices[u].numel; ++i) {
            const int64_t at = slices[u].begin + i;
            const float expected =
                at < static_cast<int64_t>((*want)[u].size()) ? (*want)[u][at] : 0;
            ASSERT_EQ((*have)[u][i], expected) << "unit " << u << " element " << at;
          }
        }
      }
      EXPECT_EQ(got->host_bytes, held);
      EXPECT_LT(got->read_bytes, state_bytes);
      read += got->read_bytes;
    }
    EXPECT_EQ(read, state_bytes) << "the slices of world " << world << " read the state once";
  }
}

// The ranks loading a checkpoint verify about as many bytes each.
TEST(ShardedCheckpointTest, VerifiersGetAboutEqualBytes) {
  CheckpointManifest manifest;
  for (int64_t bytes : {4000, 10, 4000, 3990, 20, 4000, 5, 2000, 2000, 4000}) {
    manifest.files.push_back({"f" + std::to_string(manifest.files.size()), bytes, 0});
    manifest.total_bytes += bytes;
  }
  for (int world : {1, 2, 3, 4}) {
    const std::vector<int> verifier = VerifierOfEachFile(manifest, world);
    ASSERT_EQ(verifier.size(), manifest.files.size());
    std::vector<int64_t> load(world, 0);
    for (size_t i = 0; i < verifier.size(); ++i) {
      ASSERT_GE(verifier[i], 0);
      ASSERT_LT(verifier[i], world);
      load[verifier[i]] += manifest.files[i].bytes;
    }
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    EXPECT_LE(*hi - *lo, 4000) << "world " << world;  // at most one big file apart
    EXPECT_EQ(verifier, VerifierOfEachFile(manifest, world)) << "deterministic";
  }
}

}  // namespace
}  // namespace ithaca
