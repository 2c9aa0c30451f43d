// ithaca-worker's command line: the lines built for ranks and node launchers parse back to what
// they say, and the parser refuses what no mode takes.
#include "launch/worker_command.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ithaca {
namespace {

// The parse of a built command line (its program name dropped).
absl::StatusOr<WorkerCommand> ParseBuilt(const std::vector<std::string>& argv) {
  return ParseWorkerCommand(std::vector<std::string>(argv.begin() + 1, argv.end()));
}

// The error message of a parse that must fail.
std::string Error(const std::vector<std::string>& args) {
  absl::StatusOr<WorkerCommand> c = ParseWorkerCommand(args);
  EXPECT_FALSE(c.ok());
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(c.status().message());
}

TEST(WorkerCommandTest, DaemonRankLineParsesBack) {
  absl::StatusOr<WorkerCommand> c = ParseBuilt(DaemonRankArgs("w", "/run/ithaca.sock", "j7"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mode, WorkerMode::kDaemon);
  EXPECT_EQ(c->target, "/run/ithaca.sock");
  EXPECT_EQ(c->job_id, "j7");
  EXPECT_FALSE(c->launcher);
}

TEST(WorkerCommandTest, StandaloneRankLineParsesBack) {
  absl::StatusOr<WorkerCommand> c = ParseBuilt(StandaloneRankArgs("w", "job.toml"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mode, WorkerMode::kStandalone);
  EXPECT_EQ(c->target, "job.toml");
  EXPECT_FALSE(c->launcher);
}

TEST(WorkerCommandTest, NodeLauncherLineParsesBack) {
  absl::StatusOr<WorkerCommand> c = ParseBuilt(WorkerNodeArgs(
      {"w", "10.0.0.1:7070", "j7", "4", "/state/jobs/j7", "2", "1", "tcp:10.0.0.1:29500"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mode, WorkerMode::kDaemon);
  EXPECT_TRUE(c->launcher);
  EXPECT_EQ(c->target, "10.0.0.1:7070");
  EXPECT_EQ(c->job_id, "j7");
  EXPECT_EQ(c->nproc, 4);
  EXPECT_EQ(c->log_dir, "/state/jobs/j7");
  EXPECT_EQ(c->nnodes, 2);
  EXPECT_EQ(c->node_rank, 1);
  EXPECT_EQ(c->rendezvous, "tcp:10.0.0.1:29500");
}

TEST(WorkerCommandTest, NodeLauncherLineKeepsShellWords) {
  const std::vector<std::string> argv = WorkerNodeArgs(
      {"\"$0\"", "\"$1\"", "\"$2\"", "\"$3\"", "\"$4\"", "\"$N\"", "\"$R\"", "\"tcp:$H:$5\""});
  EXPECT_EQ(argv,
            (std::vector<std::string>{"\"$0\"", "--daemon", "\"$1\"", "--job", "\"$2\"", "--nproc",
                                      "\"$3\"", "--log-dir", "\"$4\"", "--nnodes", "\"$N\"",
                                      "--node-rank", "\"$R\"", "--rendezvous", "\"tcp:$H:$5\""}));
}

TEST(WorkerCommandTest, StandaloneLauncherFlagsInAnyOrder) {
  absl::StatusOr<WorkerCommand> c = ParseWorkerCommand(
      {"--nproc", "8", "--standalone", "job.toml", "--node-rank", "1", "--nnodes", "2"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mode, WorkerMode::kStandalone);
  EXPECT_TRUE(c->launcher);
  EXPECT_EQ(c->nproc, 8);
  EXPECT_EQ(c->nnodes, 2);
  EXPECT_EQ(c->node_rank, 1);
  // One launcher flag is enough to launch (one rank by default).
  c = ParseWorkerCommand({"--standalone", "job.toml", "--nnodes", "2"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->launcher);
  EXPECT_EQ(c->nproc, 1);
}

TEST(WorkerCommandTest, RehearseFlags) {
  absl::StatusOr<WorkerCommand> c =
      ParseWorkerCommand({"--rehearse", "job.toml", "--rank", "3", "--nodes", "2", "--link", "zero",
                          "--device-memory-gib", "80", "--node-host-gib", "1024.5"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mode, WorkerMode::kRehearse);
  EXPECT_EQ(c->rank, 3);
  EXPECT_EQ(c->nodes, 2);
  EXPECT_EQ(c->link, "zero");
  EXPECT_EQ(c->device_memory_gib, 80);
  EXPECT_EQ(c->node_host_gib, 1024.5);
  EXPECT_FALSE(c->launcher);
  c = ParseWorkerCommand({"--rehearse", "job.toml"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rank, -1);  // unset: the rehearsal's defaults
  EXPECT_EQ(c->nodes, -1);
}

TEST(WorkerCommandTest, PlanAndLibraries) {
  absl::StatusOr<WorkerCommand> c = ParseWorkerCommand({"--plan", "job.toml"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mode, WorkerMode::kPlan);
  EXPECT_EQ(c->target, "job.toml");
  c = ParseWorkerCommand({"--libraries"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mode, WorkerMode::kLibraries);
}

TEST(WorkerCommandTest, DaemonRefusesUnknownFlags) {
  EXPECT_EQ(Error({"--daemon", "s", "--job", "j", "--jobs", "2"}), "unknown flag --jobs");
  EXPECT_EQ(Error({"--daemon", "s", "--job", "j", "stray"}), "unknown flag stray");
  EXPECT_EQ(Error({"--daemon", "s", "--job", "j", "--rank", "1"}),
            "--rank: not a flag of --daemon");
  EXPECT_EQ(Error({"--daemon", "s", "--job"}), "--job: needs a value");
  EXPECT_EQ(Error({"--daemon", "s", "--job", "a", "--job", "b"}), "--job: given twice");
  EXPECT_NE(Error({"--daemon", "s", "--job", "j", "--nnodes", "2"}).find("give --nproc N"),
            std::string::npos);
}

TEST(WorkerCommandTest, RefusesWhatNoModeTakes) {
  EXPECT_EQ(Error({}),
            "no mode: expected --standalone, --daemon, --plan, --rehearse or --libraries");
  EXPECT_EQ(Error({"--help"}), "unknown flag --help");
  EXPECT_EQ(Error({"--standalone", "a.toml", "--plan", "b.toml"}),
            "--standalone and --plan: one mode at a time");
  EXPECT_EQ(Error({"--standalone", "a.toml", "--log-dir", "d"}),
            "--log-dir: not a flag of --standalone");
  EXPECT_EQ(Error({"--plan", "a.toml", "--nproc", "2"}), "--nproc: not a flag of --plan");
  EXPECT_EQ(Error({"--libraries", "x"}), "unknown flag x");
  EXPECT_EQ(Error({"--standalone"}), "--standalone: needs a value");
}

TEST(WorkerCommandTest, NumbersInRange) {
  EXPECT_EQ(Error({"--standalone", "a.toml", "--nproc", "0"}),
            "--nproc 0: expected a number from 1 to 4096");
  EXPECT_EQ(Error({"--standalone", "a.toml", "--nproc", "4097"}),
            "--nproc 4097: expected a number from 1 to 4096");
  EXPECT_EQ(Error({"--standalone", "a.toml", "--node-rank", "x"}),
            "--node-rank x: expected a number from 0 to 4096");
  EXPECT_EQ(Error({"--rehearse", "a.toml", "--device-memory-gib", "0"}),
            "--device-memory-gib 0: expected GiB, a number above 0");
  EXPECT_EQ(Error({"--rehearse", "a.toml", "--node-host-gib", "nan"}),
            "--node-host-gib nan: expected GiB, a number above 0");
  absl::StatusOr<WorkerCommand> c =
      ParseWorkerCommand({"--standalone", "a.toml", "--node-rank", "0"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node_rank, 0);
}

}  // namespace
}  // namespace ithaca
