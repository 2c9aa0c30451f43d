// What ithacad hands Slurm (the batch script) and reads back from it (the batch output's
// errors), and the one way it runs Slurm's commands. The real Slurm is tests/slurm's.
#include "server/slurm.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/time/clock.h"

namespace ithaca {
namespace {

std::string TmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

TEST(SlurmTest, TheBatchScriptRunsOneLauncherPerNodeWithTheJobsKeysOverTheDefaults) {
  SlurmSubmission s;
  s.job_id = "job-7";
  s.log_dir = "/state/jobs/job-7";
  s.worker_binary = "/opt/it's/ithaca-worker";
  s.daemon_address = "head:50051";
  s.nodes = 2;
  s.ranks_per_node = 8;
  s.gpus = true;
  s.partition = "h100";
  SlurmDefaults d;
  d.partition = "default-partition";
  d.account = "proj";
  d.time_limit = "1-00:00:00";
  const std::string script = SlurmBatchScript(s, d);
  for (const char* line :
       {"#SBATCH --job-name=ithaca-job-7\n", "#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=1\n",
        "#SBATCH --gpus-per-node=8\n", "#SBATCH --partition=h100\n", "#SBATCH --account=proj\n",
        "#SBATCH --time=1-00:00:00\n", "#SBATCH --no-requeue\n",
        "#SBATCH --output=/state/jobs/job-7/slurm-%j.out\n",
        "--node-rank \"$SLURM_NODEID\" --rendezvous \"tcp:$SLURM_LAUNCH_NODE_IPADDR:$5\"'",
        "'/opt/it'\\''s/ithaca-worker' 'head:50051' 'job-7' 8 '/state/jobs/job-7' \"$port\"\n"}) {
    EXPECT_TRUE(absl::StrContains(script, line)) << line << "\nnot in:\n" << script;
  }
  EXPECT_FALSE(absl::StrContains(script, "default-partition"));
  EXPECT_FALSE(absl::StrContains(script, "--constraint"));  // neither the job nor ithacad set one
  s.gpus = false;
  EXPECT_FALSE(absl::StrContains(SlurmBatchScript(s, d), "--gpus-per-node"));
}

// Slurm's warning before the time limit and on preemption: the daemon's grace unless the job's
// [slurm] signal_grace says otherwise; none with a grace of 0.
TEST(SlurmTest, TheBatchScriptAsksForTheWarningSignal) {
  SlurmSubmission s;
  s.job_id = "job-1";
  s.log_dir = "/state/jobs/job-1";
  SlurmDefaults d;
  EXPECT_TRUE(absl::StrContains(SlurmBatchScript(s, d), "#SBATCH --signal=USR1@120\n"));
  s.signal_grace_s = 45;
  EXPECT_TRUE(absl::StrContains(SlurmBatchScript(s, d), "#SBATCH --signal=USR1@45\n"));
  s.signal_grace_s = 0;
  d.signal_grace_s = 0;
  EXPECT_FALSE(absl::StrContains(SlurmBatchScript(s, d), "--signal"));
}

TEST(SlurmTest, DurationsAreReadAsSqueuePrintsThem) {
  EXPECT_EQ(SlurmDurationSeconds("0:07"), 7);
  EXPECT_EQ(SlurmDurationSeconds("10:00"), 600);
  EXPECT_EQ(SlurmDurationSeconds("1:02:03"), 3723);
  EXPECT_EQ(SlurmDurationSeconds("2-01:00:00"), 2 * 86400 + 3600);
  EXPECT_EQ(SlurmDurationSeconds("UNLIMITED"), -1);
  EXPECT_EQ(SlurmDurationSeconds("INVALID"), -1);
}

TEST(SlurmTest, NodeStatesAreCountedAsSinfoPrintsThem) {
  SlurmClusterState s;
  for (const char* state : {"idle", "idle~", "mixed", "allocated", "completing", "mixed-", "down*",
                            "idle*", "drained", "draining", "maint", "fail"}) {
    CountSlurmNodeState(state, &s);
  }
  EXPECT_EQ(s.nodes, 12);
  EXPECT_EQ(s.idle, 2);
  EXPECT_EQ(s.busy, 4);
  EXPECT_EQ(s.unavailable, 6);  // down*, idle* (not responding), drained, draining, maint, fail
}

TEST(SlurmTest, TheBatchOutputsErrorsNameTheFailedNodeFirst) {
  const std::string dir = TmpDir();
  std::ofstream(dir + "/slurm-12.out")
      << "rank 2/4: job job-4 (tiny)\n"
         "srun: error: Task launch for StepId=12.0 failed on node n2: Communication connection "
         "failure\n"
         "srun: error: Application launch failed: Communication connection failure\n"
         "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
         "slurmstepd-n1: error: *** STEP 12.0 ON n1 CANCELLED AT 2026-12-02T01:25:39 ***\n"
         "srun: error: n1: task 0: Killed\n";
  EXPECT_EQ(SlurmOutputErrors(dir, "12"),
            "srun: error: Task launch for StepId=12.0 failed on node n2: Communication connection "
            "failure; slurmstepd-n1: error: *** STEP 12.0 ON n1 CANCELLED AT "
            "2026-12-02T01:25:39 ***; srun: error: n1: task 0: Killed");
  EXPECT_EQ(SlurmOutputErrors(dir, "13"), "");  // no output (yet)
}

TEST(SlurmTest, StatesAreActiveOrTerminal) {
  for (const char* s : {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"}) {
    SlurmJobState st{true, s};
    EXPECT_TRUE(st.Active()) << s;
    EXPECT_FALSE(st.Terminal()) << s;
  }
  for (const char* s : {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                        "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"}) {
    SlurmJobState st{true, s};
    EXPECT_TRUE(st.Terminal()) << s;
  }
  EXPECT_FALSE(SlurmJobState{}.Terminal());  // unknown is not an end
  EXPECT_EQ((SlurmJobState{true, "CANCELLED", "None", "n[1-2]"}.ToString()), "CANCELLED on n[1-2]");
  EXPECT_EQ((SlurmJobState{true, "PENDING", "Resources", ""}.ToString()),
            "PENDING (reason Resources)");
}

TEST(SlurmTest, RunCommandGivesOutputAndExitCodeAndStopsAtItsTimeout) {
  absl::StatusOr<CommandResult> r = RunCommand({"sh", "-c", "echo out $X; echo err >&2; exit 3"},
                                               {{"X", "x1"}}, absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->out, "out x1\n");
  EXPECT_EQ(r->err, "err\n");
  const absl::Time start = absl::Now();
  r = RunCommand({"sleep", "30"}, {}, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(
      absl::IsNotFound(RunCommand({"no-such-command-ithaca"}, {}, absl::Seconds(5)).status()));
}

}  // namespace
}  // namespace ithaca
