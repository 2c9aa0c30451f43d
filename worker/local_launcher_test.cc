// LocalLauncher with real processes: the rank environment, output routing, the first failure
// stopping the others, SIGTERM escalating to SIGKILL, signal forwarding, children dying with the
// launcher, and ranks that really connect (this binary re-run as a rank: bootstrap + Gloo).
#include "worker/local_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "engine/comm/bootstrap.h"
#include "engine/comm/testing/multiprocess.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using Clock = std::chrono::steady_clock;
using testing::TempDir;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Gone, or a zombie nobody has reaped yet: either way no longer running.
bool ProcessGone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  size_t paren = stat.rfind(')');
  return paren == std::string::npos || stat.size() < paren + 3 || stat[paren + 2] == 'Z';
}

bool WaitFor(const std::function<bool()>& cond, double seconds) {
  const auto start = Clock::now();
  while (!cond()) {
    if (Since(start) > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

std::vector<pid_t> ReadPids(const std::string& dir, int n) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r)
    pids.push_back(std::atoi(ReadFile(absl::StrCat(dir, "/pid", r)).c_str()));
  return pids;
}

LaunchOptions Sh(const std::string& script, int nproc, const std::string& dir) {
  LaunchOptions o;
  o.argv = {"sh", "-c", script};
  o.nproc = nproc;
  o.env = {{"OUT", dir}};
  o.temp_dir = dir;
  o.grace_period_s = 2;
  return o;
}

TEST(LocalLauncherTest, EachRankGetsItsEnvironment) {
  TempDir dir;
  LaunchOptions o =
      Sh("test -d \"${ITHACA_RENDEZVOUS#file:}\" || exit 9; "
         "echo \"$ITHACA_RANK $ITHACA_WORLD_SIZE $ITHACA_GPU $ITHACA_RENDEZVOUS\" > "
         "$OUT/r$ITHACA_RANK",
         3, dir.path());
  o.gpus = {5, 6, 7};
  LaunchReport report;
  ASSERT_TRUE(LaunchLocal(o, &report).ok());
  EXPECT_EQ(report.ExitCode(), 0);
  std::string rdzv;
  for (int r = 0; r < 3; ++r) {
    std::istringstream line(ReadFile(absl::StrCat(dir.path(), "/r", r)));
    int rank, world, gpu;
    std::string rendezvous;
    line >> rank >> world >> gpu >> rendezvous;
    EXPECT_EQ(rank, r);
    EXPECT_EQ(world, 3);
    EXPECT_EQ(gpu, 5 + r);
    if (r == 0) rdzv = rendezvous;
    EXPECT_EQ(rendezvous, rdzv);  // one rendezvous for all
  }
  ASSERT_TRUE(absl::StartsWith(rdzv, "file:" + dir.path() + "/ithaca-rdzv-")) << rdzv;
  EXPECT_FALSE(std::filesystem::exists(rdzv.substr(5))) << "rendezvous directory not removed";
}

TEST(LocalLauncherTest, FirstFailureStopsTheOthers) {
  TempDir dir;
  LaunchOptions o =
      Sh("echo $$ > $OUT/pid$ITHACA_RANK; "
         "if [ $ITHACA_RANK = 1 ]; then sleep 0.3; exit 3; fi; exec sleep 30",
         3, dir.path());
  LaunchReport report;
  const auto start = Clock::now();
  absl::Status st = LaunchLocal(o, &report);
  EXPECT_LT(Since(start), 5);
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "rank 1 exited with code 3")) << st;
  EXPECT_EQ(report.first_failure, 1);
  EXPECT_EQ(report.ExitCode(), 3);
  for (int r : {0, 2}) {
    EXPECT_TRUE(report.ranks[r].stopped_by_launcher);
    EXPECT_EQ(report.ranks[r].signal, SIGTERM) << report.ranks[r].ToString();
  }
  for (pid_t pid : ReadPids(dir.path(), 3)) {
    ASSERT_GT(pid, 0);
    EXPECT_TRUE(ProcessGone(pid)) << "pid " << pid << " still running";
  }
}

TEST(LocalLauncherTest, SignalledRankAndSigkillAfterGrace) {
  TempDir dir;
  // Rank 0 is killed by a signal; rank 1 ignores SIGTERM (exec keeps it ignored) and must be
  // killed once the grace period is over.
  LaunchOptions o =
      Sh("if [ $ITHACA_RANK = 0 ]; then sleep 0.3; kill -9 $$; fi; trap '' TERM; exec sleep 30", 2,
         dir.path());
  o.grace_period_s = 0.5;
  LaunchReport report;
  const auto start = Clock::now();
  absl::Status st = LaunchLocal(o, &report);
  EXPECT_LT(Since(start), 4);
  EXPECT_TRUE(absl::StrContains(st.message(), "rank 0 killed by SIGKILL")) << st;
  EXPECT_EQ(report.ExitCode(), 128 + SIGKILL);
  EXPECT_EQ(report.ranks[1].signal, SIGKILL) << report.ranks[1].ToString();
}

TEST(LocalLauncherTest, OutputIsPrefixedOrLogged) {
  TempDir dir;
  const std::string out = dir.path() + "/out", err = dir.path() + "/err";
  int out_fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int err_fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  LaunchOptions o =
      Sh("echo hello from $ITHACA_RANK; echo oops $ITHACA_RANK >&2; printf 'tail %s' $ITHACA_RANK",
         3, dir.path());
  o.out_fd = out_fd;
  o.err_fd = err_fd;
  ASSERT_TRUE(LaunchLocal(o).ok());
  std::string text = ReadFile(out);
  EXPECT_TRUE(absl::StartsWith(text, "hello from 0\n") ||
              absl::StrContains(text, "\nhello from 0\n"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "[rank 1] hello from 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "[rank 2] tail 2\n")) << text;
  EXPECT_TRUE(absl::StrContains(ReadFile(err), "[rank 2] oops 2\n")) << ReadFile(err);

  // With a log directory, ranks > 0 write there; rank 0 still passes through.
  ASSERT_EQ(ftruncate(out_fd, 0), 0);
  lseek(out_fd, 0, SEEK_SET);
  o.log_dir = dir.path();
  ASSERT_TRUE(LaunchLocal(o).ok());
  EXPECT_FALSE(absl::StrContains(ReadFile(out), "rank 1")) << ReadFile(out);
  EXPECT_EQ(ReadFile(dir.path() + "/rank_1.log"), "hello from 1\noops 1\ntail 1");
  close(out_fd);
  close(err_fd);
}

TEST(LocalLauncherTest, BadOptions) {
  LaunchOptions o;
  EXPECT_EQ(LaunchLocal(o).code(), absl::StatusCode::kInvalidArgument);
  o.argv = {"true"};
  o.nproc = 0;
  EXPECT_EQ(LaunchLocal(o).code(), absl::StatusCode::kInvalidArgument);
  o.nproc = 2;
  o.gpus = {0};
  EXPECT_EQ(LaunchLocal(o).code(), absl::StatusCode::kInvalidArgument);
  o.gpus = {};
  o.argv = {"no-such-command-ithaca"};
  EXPECT_EQ(LaunchLocal(o).code(), absl::StatusCode::kNotFound);
  o.argv = {"/no/such/binary"};
  LaunchReport report;
  EXPECT_FALSE(LaunchLocal(o, &report).ok());
  EXPECT_EQ(report.ExitCode(), 127);
}

// Runs LaunchLocal in a forked "launcher" process; returns its pid.
pid_t ForkLauncher(const LaunchOptions& o, const std::string& status_file) {
  pid_t pid = fork();
  if (pid == 0) {
    LaunchReport report;
    absl::Status st = LaunchLocal(o, &report);
    std::ofstream(status_file) << st.ToString();
    _exit(report.ExitCode());
  }
  return pid;
}

TEST(LocalLauncherTest, ForwardsSigterm) {
  TempDir dir;
  LaunchOptions o =
      Sh("echo $$ > $OUT/pid$ITHACA_RANK.tmp && mv $OUT/pid$ITHACA_RANK.tmp "
         "$OUT/pid$ITHACA_RANK; exec sleep 30",
         2, dir.path());
  pid_t launcher = ForkLauncher(o, dir.path() + "/status");
  ASSERT_TRUE(WaitFor(
      [&] {
        return std::filesystem::exists(dir.path() + "/pid0") &&
               std::filesystem::exists(dir.path() + "/pid1");
      },
      5));
  kill(launcher, SIGTERM);
  int status = 0;
  ASSERT_TRUE(WaitFor([&] { return waitpid(launcher, &status, WNOHANG) == launcher; }, 5))
      << "the launcher did not stop";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  EXPECT_TRUE(absl::StartsWith(ReadFile(dir.path() + "/status"), "CANCELLED"))
      << ReadFile(dir.path() + "/status");
  for (pid_t pid : ReadPids(dir.path(), 2)) EXPECT_TRUE(ProcessGone(pid)) << pid;
}

TEST(LocalLauncherTest, RanksDieWithTheLauncher) {
  TempDir dir;
  LaunchOptions o =
      Sh("echo $$ > $OUT/pid$ITHACA_RANK.tmp && mv $OUT/pid$ITHACA_RANK.tmp "
         "$OUT/pid$ITHACA_RANK; exec sleep 30",
         2, dir.path());
  pid_t launcher = ForkLauncher(o, dir.path() + "/status");
  ASSERT_TRUE(WaitFor(
      [&] {
        return std::filesystem::exists(dir.path() + "/pid0") &&
               std::filesystem::exists(dir.path() + "/pid1");
      },
      5));
  kill(launcher, SIGKILL);  // no chance to clean up: PR_SET_PDEATHSIG must do it
  waitpid(launcher, nullptr, 0);
  for (pid_t pid : ReadPids(dir.path(), 2)) {
    EXPECT_TRUE(WaitFor([&] { return ProcessGone(pid); }, 3)) << "rank pid " << pid << " survived";
  }
}

// This binary, re-run by the launcher as a rank (ITHACA_LAUNCHER_TEST_ROLE set): joins through
// the environment and checks a collective. With ROLE=fail, rank 2 exits with 3 once connected.
int RankMain(const std::string& role) {
  auto info = RankInfoFromEnvironment();
  if (!info.ok()) {
    std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
    return 1;
  }
  auto comm = ConnectComm(*info, Device::kCpu, 10);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  if (role == "fail" && info->rank == 2) return 3;
  float x = static_cast<float>(info->rank + 1);
  absl::Status st = (*comm)->AllReduce(Tensor(&x, DType::kF32, {1}));
  const float want = info->world * (info->world + 1) / 2.0f;
  if (!st.ok() || x != want) {
    std::fprintf(stderr, "rank %d: %s, sum %g (want %g)\n", info->rank, st.ToString().c_str(), x,
                 want);
    return 1;
  }
  std::printf("rank %d sum %g\n", info->rank, x);
  return 0;
}

LaunchOptions SelfAsRanks(const std::string& role, int nproc, const std::string& dir) {
  LaunchOptions o;
  o.argv = {std::filesystem::read_symlink("/proc/self/exe").string()};
  o.nproc = nproc;
  o.env = {{"ITHACA_LAUNCHER_TEST_ROLE", role}};
  o.temp_dir = dir;
  o.log_dir = dir;
  o.grace_period_s = 2;
  return o;
}

TEST(LocalLauncherTest, RanksConnectThroughTheRendezvous) {
  TempDir dir;
  absl::Status st = LaunchLocal(SelfAsRanks("ok", 4, dir.path()));
  EXPECT_TRUE(st.ok()) << st << "\n" << ReadFile(dir.path() + "/rank_1.log");
  EXPECT_EQ(ReadFile(dir.path() + "/rank_3.log"), "rank 3 sum 10\n");
}

TEST(LocalLauncherTest, ARankThatDiesIsNamed) {
  TempDir dir;
  LaunchReport report;
  const auto start = Clock::now();
  absl::Status st = LaunchLocal(SelfAsRanks("fail", 4, dir.path()), &report);
  EXPECT_LT(Since(start), 8);
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(absl::StartsWith(st.message(), "rank 2 exited with code 3")) << st;
  EXPECT_EQ(report.ExitCode(), 3);
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  if (const char* role = std::getenv("ITHACA_LAUNCHER_TEST_ROLE")) return ithaca::RankMain(role);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
