// The launcher with real processes, as ithacad uses it (Launcher::Launch): one process group,
// the rank environment, log files, running as another user, exits and their descriptions.
// LaunchLocal's supervision is tested in worker/local_launch_test.cc.
#include "launch/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/comm/testing/multiprocess.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using testing::TempDir;
using testing::WaitFor;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Polls every pid until it has ended.
std::vector<WorkerEnd> WaitAll(const WorkerGroup& group, double seconds) {
  std::vector<std::optional<WorkerEnd>> ends(group.pids.size());
  WaitFor(
      [&] {
        bool all = true;
        for (size_t r = 0; r < ends.size(); ++r) {
          if (!ends[r]) ends[r] = Launcher::Poll(group.pids[r]);
          all &= ends[r].has_value();
        }
        return all;
      },
      seconds);
  std::vector<WorkerEnd> out;
  for (const auto& e : ends) {
    EXPECT_TRUE(e.has_value()) << "a rank still runs";
    out.push_back(e.value_or(WorkerEnd{true, 0}));
  }
  return out;
}

TEST(LauncherTest, RanksShareAGroupAndAppendToTheirLogs) {
  TempDir dir;
  LaunchSpec spec;
  spec.argv = {"sh", "-c",
               "echo rank $ITHACA_RANK of $ITHACA_WORLD_SIZE gpu $ITHACA_GPU $ITHACA_RENDEZVOUS "
               "$EXTRA omp $OMP_NUM_THREADS; read x || echo no input; exit $ITHACA_RANK"};
  spec.gpus = {4, 6};
  spec.rendezvous = "file:/somewhere";
  spec.env = {{"EXTRA", "extra"}, {"OMP_NUM_THREADS", "3"}};
  for (int r = 0; r < 2; ++r) spec.outputs.push_back({RankLogPath(dir.path(), r)});
  std::ofstream(RankLogPath(dir.path(), 0)) << "before\n";
  auto group = Launcher::Launch(spec);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->pids.size(), 2u);
  EXPECT_EQ(group->pgid, group->pids[0]);
  for (pid_t pid : group->pids) EXPECT_EQ(getpgid(pid), group->pgid) << pid;  // not reaped yet
  const std::vector<WorkerEnd> ends = WaitAll(*group, 10);
  EXPECT_TRUE(ends[0].ok()) << ends[0].Describe();
  EXPECT_EQ(ends[1].Describe(), "exited with code 1 (error)");
  EXPECT_EQ(ends[1].Reason(), "error");
  EXPECT_EQ(ReadFile(RankLogPath(dir.path(), 0)),
            "before\nrank 0 of 2 gpu 4 file:/somewhere extra omp 3\nno input\n");
  EXPECT_EQ(ReadFile(RankLogPath(dir.path(), 1)),
            "rank 1 of 2 gpu 6 file:/somewhere extra omp 3\nno input\n");
}

TEST(LauncherTest, LookUpRunAs) {
  EXPECT_EQ(LookUpRunAs("root").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LookUpRunAs("0").status().code(), absl::StatusCode::kInvalidArgument);
  auto missing = LookUpRunAs("no-such-user-ithaca");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "no-such-user-ithaca"));
  auto nobody = LookUpRunAs("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  EXPECT_NE(nobody->uid, 0u);
  auto by_uid = LookUpRunAs(std::to_string(nobody->uid));
  ASSERT_TRUE(by_uid.ok()) << by_uid.status();
  EXPECT_EQ(by_uid->name, nobody->name);
}

// Needs root to change users: elsewhere the launch of a run_as rank must fail in the rank
// (setgroups refused), never run it as the launcher's user.
TEST(LauncherTest, RanksRunAsTheGivenUser) {
  TempDir dir;
  chmod(dir.path().c_str(), 0755);
  auto nobody = LookUpRunAs("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  LaunchSpec spec;
  spec.argv = {"sh", "-c", "echo $(id -u) $(id -g) $(id -G) $HOME $USER"};
  spec.gpus = {0};
  spec.run_as = *nobody;
  spec.outputs.push_back({RankLogPath(dir.path(), 0)});
  auto group = Launcher::Launch(spec);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<WorkerEnd> ends = WaitAll(*group, 10);
  const std::string log = ReadFile(RankLogPath(dir.path(), 0));
  if (geteuid() != 0) {
    EXPECT_EQ(ends[0].code, 127) << log;
    EXPECT_TRUE(absl::StrContains(log, "launcher: setgroups failed")) << log;
    return;
  }
  EXPECT_TRUE(ends[0].ok()) << ends[0].Describe() << log;
  std::string groups;
  for (gid_t g : nobody->groups) absl::StrAppend(&groups, groups.empty() ? "" : " ", g);
  EXPECT_EQ(log, absl::StrCat(nobody->uid, " ", nobody->gid, " ", groups, " ", nobody->home, " ",
                              nobody->name, "\n"));
}

TEST(LauncherTest, RanksShareTheCoresUnlessToldOtherwise) {
  TempDir dir;
  const char* saved = std::getenv("OMP_NUM_THREADS");
  const std::string saved_value = saved ? saved : "";
  unsetenv("OMP_NUM_THREADS");
  LaunchSpec spec;
  spec.argv = {"sh", "-c", "echo $OMP_NUM_THREADS"};
  spec.gpus = {0, 1};
  for (int r = 0; r < 2; ++r) spec.outputs.push_back({RankLogPath(dir.path(), r)});
  auto group = Launcher::Launch(spec);
  if (saved) setenv("OMP_NUM_THREADS", saved_value.c_str(), 1);
  ASSERT_TRUE(group.ok()) << group.status();
  WaitAll(*group, 10);
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  EXPECT_EQ(ReadFile(RankLogPath(dir.path(), 1)), absl::StrCat(std::max(1L, cores / 2), "\n"));
}

TEST(LauncherTest, SignalGroupReachesEveryRank) {
  LaunchSpec spec;
  spec.argv = {"sh", "-c", "exec sleep 30"};
  spec.gpus = {0, 1, 2};
  auto group = Launcher::Launch(spec);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_TRUE(Launcher::GroupAlive(group->pgid));
  EXPECT_FALSE(Launcher::Poll(group->pids[1]).has_value()) << "still running";
  ASSERT_TRUE(Launcher::SignalGroup(group->pgid, SIGTERM));
  for (const WorkerEnd& e : WaitAll(*group, 10)) {
    EXPECT_EQ(e.Describe(), "killed by SIGTERM (signal 15)");
    EXPECT_EQ(e.Reason(), "signal");
    EXPECT_EQ(e.ShellCode(), 128 + SIGTERM);
  }
  EXPECT_FALSE(Launcher::GroupAlive(group->pgid));
}

TEST(LauncherTest, BadSpecs) {
  LaunchSpec spec;
  spec.gpus = {0};
  EXPECT_EQ(Launcher::Launch(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.argv = {"true"};
  spec.gpus = {};
  EXPECT_EQ(Launcher::Launch(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.gpus = {0, 1};
  spec.outputs = {RankOutput()};
  EXPECT_EQ(Launcher::Launch(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.outputs = {};
  spec.argv = {"/no/such/ithaca-worker"};
  auto missing = Launcher::Launch(spec);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition) << missing.status();
  spec.argv = {"true"};
  spec.outputs = {{"/no/such/dir/rank-0.log"}, {"/no/such/dir/rank-1.log"}};
  EXPECT_EQ(Launcher::Launch(spec).status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace ithaca
