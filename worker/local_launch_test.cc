// LaunchLocal with real processes (as the worker's launcher uses it): output routing, the
// first failure stopping the others, SIGTERM escalating to SIGKILL, signal forwarding, children
// dying with the launcher, ranks that really connect (this binary re-run as a rank: bootstrap +
// Gloo), and several nodes on this machine meeting at a TCP rendezvous.
#include "worker/local_launch.h"

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
#include "engine/comm/bootstrap.h"
#include "engine/comm/testing/multiprocess.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using Clock = std::chrono::steady_clock;
using testing::TempDir;
using testing::WaitFor;

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

std::vector<pid_t> ReadPids(const std::string& dir, int n) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r)
    pids.push_back(std::atoi(ReadFile(absl::StrCat(dir, "/pid", r)).c_str()));
  return pids;
}

// A rank that writes its pid to $OUT/pid$RANK (whole, by a rename) and then sleeps.
constexpr char kPidThenSleep[] =
    "echo $$ > $OUT/pid$ITHACA_RANK.tmp && mv $OUT/pid$ITHACA_RANK.tmp "
    "$OUT/pid$ITHACA_RANK; exec sleep 30";

// Whether ranks 0 and 1 have written their pid files within 5 s.
bool TwoPidsWritten(const std::string& dir) {
  return WaitFor(
      [&] {
        return std::filesystem::exists(dir + "/pid0") && std::filesystem::exists(dir + "/pid1");
      },
      5);
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
    EXPECT_TRUE(report.ranks[r].end.signaled) << report.ranks[r].ToString();
    EXPECT_EQ(report.ranks[r].end.code, SIGTERM) << report.ranks[r].ToString();
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
  // Only the rank that was killed is reported killed: rank 1, which the launcher itself killed
  // after the grace, is not.
  std::vector<std::pair<int, int>> killed;
  o.on_rank_killed = [&](int rank, const WorkerEnd& end) {
    EXPECT_TRUE(end.signaled);
    killed.emplace_back(rank, end.code);
  };
  LaunchReport report;
  const auto start = Clock::now();
  absl::Status st = LaunchLocal(o, &report);
  EXPECT_LT(Since(start), 4);
  EXPECT_TRUE(absl::StrContains(st.message(), "rank 0 killed by SIGKILL")) << st;
  EXPECT_EQ(report.ExitCode(), 128 + SIGKILL);
  EXPECT_TRUE(report.ranks[1].end.signaled) << report.ranks[1].ToString();
  EXPECT_EQ(report.ranks[1].end.code, SIGKILL) << report.ranks[1].ToString();
  EXPECT_EQ(killed, (std::vector<std::pair<int, int>>{{0, SIGKILL}}));
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
  EXPECT_EQ(ReadFile(RankLogPath(dir.path(), 1)), "hello from 1\noops 1\ntail 1");
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
  absl::Status missing = LaunchLocal(o);
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition) << missing;
  EXPECT_TRUE(absl::StrContains(missing.message(), "/no/such/binary")) << missing;
}

TEST(LocalLauncherTest, ACommandThatCannotBeExecutedExits127) {
  TempDir dir;
  // Executable, but no program: execve fails with ENOEXEC in the rank.
  const std::string path = dir.path() + "/not-a-program";
  std::ofstream(path) << "\x01\x02 not a program\n";
  ASSERT_EQ(chmod(path.c_str(), 0755), 0);
  LaunchOptions o;
  o.argv = {path};
  o.nproc = 2;
  o.temp_dir = dir.path();
  o.log_dir = dir.path();
  const int err_fd = open((dir.path() + "/stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(err_fd, 0);
  o.err_fd = err_fd;
  LaunchReport report;
  EXPECT_EQ(LaunchLocal(o, &report).code(), absl::StatusCode::kAborted);
  close(err_fd);
  EXPECT_EQ(report.ExitCode(), 127);
  EXPECT_TRUE(absl::StrContains(report.ranks[report.first_failure].ToString(),
                                "exited with code 127 (could not start)"))
      << report.ranks[report.first_failure].ToString();
  // The first rank to fail said why: rank 0 on the launcher's stderr, rank 1 in its log (the
  // other may have been stopped before it got that far).
  const std::string said = report.first_failure == 0 ? ReadFile(dir.path() + "/stderr")
                                                     : ReadFile(RankLogPath(dir.path(), 1));
  EXPECT_TRUE(absl::StrContains(said, "exec failed")) << said;
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
  LaunchOptions o = Sh(kPidThenSleep, 2, dir.path());
  pid_t launcher = ForkLauncher(o, dir.path() + "/status");
  ASSERT_TRUE(TwoPidsWritten(dir.path()));
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

// SIGUSR1 (Slurm's --signal warning, a drain) with forward_drain: forwarded to the ranks, whose
// drained exit (kExitDrained, after their checkpoint) is no failure; the launcher exits 0.
TEST(LocalLauncherTest, ForwardsADrainAndADrainedExitIsNoFailure) {
  TempDir dir;
  // Each rank does what a daemon rank does: it starts with SIGUSR1 blocked (it says so in
  // blocked$RANK), takes it, unblocks it, and exits 6 (drained) on it.
  LaunchOptions o = Sh("", 2, dir.path());
  o.argv = {"python3", "-c",
            "import os, signal, sys, time\n"
            "out, rank = os.environ['OUT'], os.environ['ITHACA_RANK']\n"
            "blk = [l for l in open('/proc/self/status') if l.startswith('SigBlk:')][0]\n"
            "open(f'{out}/blocked{rank}', 'w').write(str(int(blk.split()[1], 16) >> 9 & 1))\n"
            "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(6))\n"
            "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})\n"
            "open(f'{out}/pid{rank}.tmp', 'w').write(str(os.getpid()))\n"
            "os.rename(f'{out}/pid{rank}.tmp', f'{out}/pid{rank}')\n"
            "while True: time.sleep(0.05)\n"};
  o.forward_drain = true;
  pid_t launcher = ForkLauncher(o, dir.path() + "/status");
  ASSERT_TRUE(TwoPidsWritten(dir.path()));
  kill(launcher, SIGUSR1);  // to the launcher only: it forwards it
  int status = 0;
  ASSERT_TRUE(WaitFor([&] { return waitpid(launcher, &status, WNOHANG) == launcher; }, 5))
      << "the launcher did not stop";
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(ReadFile(dir.path() + "/status"), "OK");
  for (pid_t pid : ReadPids(dir.path(), 2)) EXPECT_TRUE(ProcessGone(pid)) << pid;
  EXPECT_EQ(ReadFile(dir.path() + "/blocked0"), "1");
  EXPECT_EQ(ReadFile(dir.path() + "/blocked1"), "1");

  // Without forward_drain a rank's exit 6 is a failure like any other.
  TempDir dir2;
  LaunchOptions plain = Sh("exit 6", 1, dir2.path());
  LaunchReport report;
  EXPECT_EQ(LaunchLocal(plain, &report).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(report.first_failure, 0);
  EXPECT_FALSE(report.drained);
}

TEST(LocalLauncherTest, RanksDieWithTheLauncher) {
  TempDir dir;
  LaunchOptions o = Sh(kPidThenSleep, 2, dir.path());
  pid_t launcher = ForkLauncher(o, dir.path() + "/status");
  ASSERT_TRUE(TwoPidsWritten(dir.path()));
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
  if (role == "loop") {  // steps until stopped; a pid file says it is running
    const std::string out = std::getenv("OUT");
    std::ofstream(absl::StrCat(out, "/pid", info->rank, ".tmp")) << getpid();
    std::filesystem::rename(absl::StrCat(out, "/pid", info->rank, ".tmp"),
                            absl::StrCat(out, "/pid", info->rank));
    for (int step = 0; step < 3000; ++step) {
      float x = 1;
      absl::Status st = (*comm)->AllReduce(Tensor(&x, DType::kF32, {1}));
      if (!st.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", info->rank, st.ToString().c_str());
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return 0;
  }
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
  EXPECT_TRUE(st.ok()) << st << "\n" << ReadFile(RankLogPath(dir.path(), 1));
  EXPECT_EQ(ReadFile(RankLogPath(dir.path(), 3)), "rank 3 sum 10\n");
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

// ---- Several nodes on this machine: one launcher per "node", meeting at a TCP rendezvous.

LaunchOptions Node(const std::string& role, int node, int port, const std::string& dir) {
  LaunchOptions o = SelfAsRanks(role, 2, dir);
  o.env.emplace_back("OUT", dir);
  o.nnodes = 2;
  o.node_rank = node;
  o.rendezvous = absl::StrCat("tcp:127.0.0.1:", port);
  o.rendezvous_timeout_s = 20;
  return o;
}

// The exit status of a forked launcher, or -1 when it did not end within `seconds`.
int WaitLauncher(pid_t pid, double seconds) {
  int status = 0;
  if (!WaitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, seconds)) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(MultiNodeLauncherTest, TwoNodesOfTwoRanksAreOneWorldOfFour) {
  TempDir dir;
  const int port = testing::FreeLoopbackPort();
  pid_t node1 = ForkLauncher(Node("ok", 1, port, dir.path()), dir.path() + "/status1");
  absl::Status st = LaunchLocal(Node("ok", 0, port, dir.path()));
  EXPECT_TRUE(st.ok()) << st << "\n" << ReadFile(RankLogPath(dir.path(), 3));
  EXPECT_EQ(WaitLauncher(node1, 20), 0) << ReadFile(dir.path() + "/status1");
  EXPECT_EQ(ReadFile(dir.path() + "/status1"), "OK");
  // Global ranks 1 and 3 (the second rank of each node) log to their files: 1+2+3+4 = 10.
  EXPECT_EQ(ReadFile(RankLogPath(dir.path(), 1)), "rank 1 sum 10\n");
  EXPECT_EQ(ReadFile(RankLogPath(dir.path(), 3)), "rank 3 sum 10\n");
}

TEST(MultiNodeLauncherTest, ARankFailingOnOneNodeStopsBothNamingIt) {
  TempDir dir;
  const int port = testing::FreeLoopbackPort();
  pid_t node1 = ForkLauncher(Node("fail", 1, port, dir.path()), dir.path() + "/status1");
  LaunchReport report;
  absl::Status st = LaunchLocal(Node("fail", 0, port, dir.path()), &report);
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_TRUE(absl::StartsWith(st.message(), "node 1 (")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "rank 2 exited with code 3")) << st;
  EXPECT_EQ(report.ExitCode(), 1);
  EXPECT_EQ(WaitLauncher(node1, 20), 3);
  const std::string status1 = ReadFile(dir.path() + "/status1");
  EXPECT_TRUE(absl::StrContains(status1, "node 1 (")) << status1;
  EXPECT_TRUE(absl::StrContains(status1, "rank 2 exited with code 3")) << status1;
}

// Kills one node's launcher mid-step (its ranks die with it); the other node's launcher must
// fail, naming the node that vanished, and no rank may be left running.
void KillANode(int victim) {
  TempDir dir;
  const int port = testing::FreeLoopbackPort();
  pid_t launchers[2];
  for (int node = 0; node < 2; ++node) {
    launchers[node] = ForkLauncher(Node("loop", node, port, dir.path()),
                                   absl::StrCat(dir.path(), "/status", node));
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int r = 0; r < 4; ++r) {
          if (!std::filesystem::exists(absl::StrCat(dir.path(), "/pid", r))) return false;
        }
        return true;
      },
      20))
      << "the ranks did not start";
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // mid-step
  kill(launchers[victim], SIGKILL);
  waitpid(launchers[victim], nullptr, 0);
  const int survivor = 1 - victim;
  EXPECT_EQ(WaitLauncher(launchers[survivor], 15), 1);
  const std::string status = ReadFile(absl::StrCat(dir.path(), "/status", survivor));
  std::printf("node %d's launcher: %s\n", survivor, status.c_str());
  EXPECT_TRUE(absl::StartsWith(status, "ABORTED")) << status;
  EXPECT_TRUE(absl::StrContains(status, absl::StrCat("node ", victim))) << status;
  EXPECT_TRUE(absl::StrContains(status, victim == 0 ? "vanished" : "lost its connection"))
      << status;
  for (pid_t pid : ReadPids(dir.path(), 4)) {
    EXPECT_TRUE(WaitFor([&] { return ProcessGone(pid); }, 5)) << "rank pid " << pid << " survived";
  }
}

TEST(MultiNodeLauncherTest, ANodeKilledMidStepIsNamed) { KillANode(1); }

TEST(MultiNodeLauncherTest, TheRendezvousNodeKilledMidStepIsNamed) { KillANode(0); }

// A node told to stop (SIGTERM, as Kubernetes stops a pod) stops the others, naming it.
TEST(MultiNodeLauncherTest, ANodeStoppedBySigtermIsNamed) {
  TempDir dir;
  const int port = testing::FreeLoopbackPort();
  pid_t launchers[2];
  for (int node = 0; node < 2; ++node) {
    launchers[node] = ForkLauncher(Node("loop", node, port, dir.path()),
                                   absl::StrCat(dir.path(), "/status", node));
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int r = 0; r < 4; ++r) {
          if (!std::filesystem::exists(absl::StrCat(dir.path(), "/pid", r))) return false;
        }
        return true;
      },
      20));
  kill(launchers[1], SIGTERM);
  EXPECT_EQ(WaitLauncher(launchers[1], 15), 128 + SIGTERM);
  EXPECT_EQ(WaitLauncher(launchers[0], 15), 1);
  const std::string status = ReadFile(dir.path() + "/status0");
  EXPECT_TRUE(absl::StrContains(status, "node 1 (")) << status;
  EXPECT_TRUE(absl::StrContains(status, "received SIGTERM")) << status;
}

TEST(MultiNodeLauncherTest, ANodeThatNeverJoinsIsNamed) {
  TempDir dir;
  LaunchOptions o = Node("ok", 0, testing::FreeLoopbackPort(), dir.path());
  o.rendezvous_timeout_s = 1;
  const auto start = Clock::now();
  absl::Status st = LaunchLocal(o);
  EXPECT_LT(Since(start), 8);
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
  EXPECT_TRUE(absl::StartsWith(st.message(), "node 1 did not join")) << st;
}

TEST(MultiNodeLauncherTest, BadNodeOptions) {
  LaunchOptions o = Sh("true", 1, "/tmp");
  o.nnodes = 2;
  EXPECT_EQ(LaunchLocal(o).code(), absl::StatusCode::kInvalidArgument);  // no rendezvous
  o.rendezvous = "tcp:127.0.0.1:1";
  o.node_rank = 2;
  EXPECT_EQ(LaunchLocal(o).code(), absl::StatusCode::kInvalidArgument);
  o.node_rank = 1;
  o.rendezvous = "file:/tmp";
  EXPECT_EQ(LaunchLocal(o).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  if (const char* role = std::getenv("ITHACA_LAUNCHER_TEST_ROLE")) return ithaca::RankMain(role);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
