// The Supervisor with real worker processes (shell scripts and /bin/false started through the
// launcher) and an owner that records what it is told.
#include "server/supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "server/services.h"
#include "server/test_workers.h"
#include "launch/worker_contract.h"

namespace ithaca {
namespace {

Node CpuNode(int slots) {
  Node n;
  n.host_memory_bytes = int64_t{16} << 30;
  for (int i = 0; i < slots; ++i) n.devices.push_back({i, "", "cpu slot", n.host_memory_bytes});
  return n;
}

struct Ended {
  JobState outcome;
  std::string reason;
  std::optional<int> failed_rank;
  bool retryable = false;
};

// Hands out the orders it is given and records every report, in order.
class RecordingOwner : public JobOwner {
 public:
  void Queue(const std::string& id, int world, const std::string& spec = "") {
    std::lock_guard<std::mutex> lock(mu_);
    LaunchOrder o{id, spec.empty() ? "spec of " + id : spec, TmpDir() + "/jobs/" + id, {}};
    for (int r = 0; r < world; ++r) o.slots.push_back(r);
    pending_.push_back(o);
  }

  std::vector<LaunchOrder> TakeLaunches() override {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(pending_, {});
  }
  void OnLaunched(const std::string& id, const std::vector<int>& slots, int pgid,
                  const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    pgids_[id] = pgid;
    states_[id].push_back(v1::JOB_STATE_STARTING);
    cv_.notify_all();
  }
  absl::StatusOr<v1::Job> OnStateChange(const std::string& id, JobState to,
                                        const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    states_[id].push_back(to);
    v1::Job job;
    job.set_id(id);
    job.set_state(to);
    job.set_reason(reason);
    return job;
  }
  absl::Status OnStep(const std::string& id, const v1::StepReport& step) override {
    absl::SleepFor(step_delay);  // a store write that waits on a slow disk
    std::lock_guard<std::mutex> lock(mu_);
    if (failing_steps > 0) {  // a full state disk
      --failing_steps;
      return absl::InternalError("job store: database or disk is full");
    }
    steps_[id].push_back(step.step());
    return absl::OkStatus();
  }
  absl::Status OnEval(const std::string& id, const v1::EvalReport& eval) override {
    std::lock_guard<std::mutex> lock(mu_);
    evals_[id].push_back(eval.step());
    return absl::OkStatus();
  }
  void OnLogLines(const std::string& id, int rank, std::vector<std::string> lines) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::string& l : lines) logs_[id].push_back(absl::StrCat(rank, ": ", l));
  }
  void OnEnded(const std::string& id, JobState outcome, const std::string& reason,
               std::optional<int> failed_rank, bool retryable) override {
    std::lock_guard<std::mutex> lock(mu_);
    ended_[id] = Ended{outcome, reason, failed_rank, retryable};
    cv_.notify_all();
  }

  // The job's process group once launched; 0 when that takes longer than `timeout`.
  int WaitLaunched(const std::string& id, absl::Duration timeout = absl::Seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return pgids_.count(id) > 0; });
    return pgids_.count(id) ? pgids_[id] : 0;
  }
  std::optional<Ended> WaitEnded(const std::string& id) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(20), [&] { return ended_.count(id) > 0; });
    if (!ended_.count(id)) return std::nullopt;
    return ended_[id];
  }
  std::optional<Ended> EndedNow(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ended_.count(id)) return std::nullopt;
    return ended_[id];
  }
  std::vector<JobState> States(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return states_[id];
  }
  std::vector<std::string> Logs(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return logs_[id];
  }
  std::vector<int64_t> Steps(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_[id];
  }
  std::vector<int64_t> Evals(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return evals_[id];
  }

  absl::Duration step_delay;  // set before the first report
  int failing_steps = 0;      // this many next OnStep calls fail

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<LaunchOrder> pending_;
  std::map<std::string, int> pgids_;
  std::map<std::string, std::vector<JobState>> states_;
  std::map<std::string, std::vector<int64_t>> steps_;
  std::map<std::string, std::vector<int64_t>> evals_;
  std::map<std::string, std::vector<std::string>> logs_;
  std::map<std::string, Ended> ended_;
};

Supervisor::Options WithWorker(const std::string& binary) {
  Supervisor::Options o;
  o.worker_binary = binary;
  o.worker_socket = TmpDir() + "/unused.sock";
  o.grace_period = absl::Seconds(2);
  o.poll_interval = absl::Milliseconds(10);
  return o;
}

TEST(SupervisorTest, AWorkerThatExitsNonZeroFailsItsJob) {
  RecordingOwner owner;
  Metrics metrics;
  Supervisor supervisor(WithWorker("/bin/false"), CpuNode(2), &owner, &metrics);
  supervisor.Start();
  owner.Queue("job-false", 1);
  supervisor.Wake();
  std::optional<Ended> end = owner.WaitEnded("job-false");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_FAILED);
  EXPECT_EQ(end->reason, "rank 0 exited with code 1 (error)");
  EXPECT_EQ(end->failed_rank, 0);
  EXPECT_TRUE(end->retryable);  // an error need not repeat
  EXPECT_EQ(owner.States("job-false"), std::vector<JobState>{v1::JOB_STATE_STARTING});
  EXPECT_EQ(supervisor.running_jobs(), 0);
  EXPECT_NE(metrics.Render().find("ithaca_worker_exits_total{reason=\"error\"} 1"),
            std::string::npos)
      << metrics.Render();
}

// A cancel that arrives after every rank exited 0, before the supervisor looked again, does not
// turn the finished job into CANCELLED.
TEST(SupervisorTest, ACancelDuringAFinishedJobsTeardownLeavesItSucceeded) {
  RecordingOwner owner;
  Metrics metrics;
  Supervisor::Options o = WithWorker("/bin/true");
  o.poll_interval = absl::Seconds(30);  // the loop does not look again by itself
  Supervisor supervisor(o, CpuNode(2), &owner, &metrics);
  supervisor.Start();
  owner.Queue("job-done", 2);
  supervisor.Wake();
  ASSERT_GT(owner.WaitLaunched("job-done"), 0);
  absl::SleepFor(absl::Milliseconds(500));  // both ranks have exited 0 by now
  absl::StatusOr<std::optional<v1::Job>> cancel = supervisor.Cancel("job-done", "too late");
  // NOT_FOUND when the supervisor already saw the exits and let the job go; else no cancel.
  if (cancel.ok()) {
    EXPECT_FALSE(cancel->has_value()) << "the job was finishing";
  } else {
    EXPECT_TRUE(absl::IsNotFound(cancel.status())) << cancel.status();
  }
  std::optional<Ended> end = owner.WaitEnded("job-done");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_SUCCEEDED) << end->reason;
  supervisor.Shutdown("test over");
}

TEST(SupervisorTest, OneFailedRankKillsTheOthersAndIsNamedWithItsLastLines) {
  RecordingOwner owner;
  Metrics metrics;
  const std::string worker = Script("rank1_fails.sh",
                                    "if [ \"$ITHACA_RANK\" = 1 ]; then\n"
                                    "  echo 'rank one ran out' >&2; exit 3\n"
                                    "fi\n"
                                    "exec sleep 30");
  Supervisor supervisor(WithWorker(worker), CpuNode(2), &owner, &metrics);
  supervisor.Start();
  owner.Queue("job-two", 2);
  supervisor.Wake();
  const absl::Time start = absl::Now();
  std::optional<Ended> end = owner.WaitEnded("job-two");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_FAILED);
  EXPECT_EQ(end->reason, "rank 1 exited with code 3 (out of memory)");
  EXPECT_EQ(end->failed_rank, 1);
  EXPECT_FALSE(end->retryable);  // out of memory by plan: it would again
  // Rank 0 was killed at once (not after its 30 s sleep, nor the grace period).
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  const std::vector<std::string> logs = owner.Logs("job-two");
  EXPECT_NE(std::find(logs.begin(), logs.end(), "1: rank one ran out"), logs.end());
}

// A rank that dies takes its peers down with it (they exit with an error on the broken
// connection). When one look finds them all ended, the rank ended by a signal is named, not the
// lowest: here rank 1 is killed and rank 0 exits with an error right after, both before the
// supervisor's next look.
TEST(SupervisorTest, TheKilledRankIsNamedOverPeersThatFailedAfterIt) {
  RecordingOwner owner;
  Metrics metrics;
  const std::string worker = Script("rank1_killed.sh",
                                    "if [ \"$ITHACA_RANK\" = 1 ]; then kill -9 $$; fi\n"
                                    "sleep 0.3; exit 1");
  Supervisor::Options options = WithWorker(worker);
  options.poll_interval = absl::Seconds(2);
  Supervisor supervisor(options, CpuNode(2), &owner, &metrics);
  supervisor.Start();
  owner.Queue("job-killed", 2);
  supervisor.Wake();
  std::optional<Ended> end = owner.WaitEnded("job-killed");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_FAILED);
  EXPECT_EQ(end->failed_rank, 1) << end->reason;
  EXPECT_EQ(end->reason.rfind("rank 1 ", 0), 0u) << end->reason;
  EXPECT_TRUE(end->retryable);
}

TEST(SupervisorTest, CancelStopsTheWorkersThenReportsCancelled) {
  RecordingOwner owner;
  Metrics metrics;
  Supervisor supervisor(WithWorker(Script("sleeper.sh", "exec sleep 30")), CpuNode(1), &owner,
                        &metrics);
  supervisor.Start();
  EXPECT_TRUE(absl::IsNotFound(supervisor.Cancel("job-none", "no such job").status()));
  owner.Queue("job-c", 1);
  supervisor.Wake();
  const int pgid = owner.WaitLaunched("job-c");
  ASSERT_GT(pgid, 0);
  EXPECT_EQ(supervisor.running_jobs(), 1);
  absl::StatusOr<std::optional<v1::Job>> cancelling = supervisor.Cancel("job-c", "changed my mind");
  ASSERT_TRUE(cancelling.ok()) << cancelling.status();
  ASSERT_TRUE(cancelling->has_value());
  EXPECT_EQ((*cancelling)->state(), v1::JOB_STATE_CANCELLING);
  // A second cancel changes nothing: while the job is ending its outcome stands (no value);
  // once its workers are reaped (a SIGTERMed `sleep` can go that fast) the supervisor no longer
  // has it (NotFound, which the daemon answers from the store).
  absl::StatusOr<std::optional<v1::Job>> again = supervisor.Cancel("job-c", "again");
  if (again.ok()) {
    EXPECT_FALSE(again->has_value());
  } else {
    EXPECT_TRUE(absl::IsNotFound(again.status())) << again.status();
  }
  std::optional<Ended> end = owner.WaitEnded("job-c");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(end->reason, "changed my mind");
  EXPECT_FALSE(end->failed_rank.has_value());
  EXPECT_EQ(owner.States("job-c"),
            (std::vector<JobState>{v1::JOB_STATE_STARTING, v1::JOB_STATE_CANCELLING}));
  EXPECT_FALSE(Launcher::GroupAlive(pgid));
}

TEST(SupervisorTest, RegisterChecksThePidAndAWorkerThatGoesSilentFailsItsJob) {
  RecordingOwner owner;
  Metrics metrics;
  Supervisor::Options o = WithWorker(Script("silent.sh", "exec sleep 30"));
  o.heartbeat_timeout = absl::Seconds(1);
  o.heartbeat_interval_ms = 77;
  Supervisor supervisor(o, CpuNode(1), &owner, &metrics);
  supervisor.Start();
  owner.Queue("job-r", 1);
  supervisor.Wake();
  const int pgid = owner.WaitLaunched("job-r");  // rank 0 founds the group: pgid is its pid
  ASSERT_GT(pgid, 0);

  v1::RegisterRequest request;
  request.set_job_id("job-r");
  request.set_rank(0);
  request.set_pid(pgid + 1);
  EXPECT_TRUE(absl::IsPermissionDenied(supervisor.Register(request).status()));
  request.set_rank(1);
  EXPECT_TRUE(absl::IsInvalidArgument(supervisor.Register(request).status()));
  request.set_rank(0);
  request.set_pid(pgid);
  // The job's secret, which the launch gave its workers and wrote into the adoption record.
  EXPECT_TRUE(absl::IsPermissionDenied(supervisor.Register(request).status()));
  absl::StatusOr<AdoptionRecord> record = ReadAdoptionRecord(TmpDir() + "/jobs/job-r");
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->pids, std::vector<pid_t>{pgid});
  request.set_secret(record->secret);
  absl::StatusOr<v1::RegisterResponse> registered = supervisor.Register(request);
  ASSERT_TRUE(registered.ok()) << registered.status();
  EXPECT_EQ(registered->spec_toml(), "spec of job-r");
  EXPECT_EQ(registered->world_size(), 1);
  EXPECT_EQ(registered->heartbeat_interval_ms(), 77);
  EXPECT_TRUE(absl::StartsWith(registered->rendezvous(), "file:" + TmpDir() + "/jobs/job-r/"));
  EXPECT_EQ(owner.States("job-r"),
            (std::vector<JobState>{v1::JOB_STATE_STARTING, v1::JOB_STATE_RUNNING}));

  v1::ReportStepRequest step;
  step.set_job_id("job-r");
  step.mutable_step()->set_rank(0);
  step.mutable_step()->set_step(5);
  ASSERT_TRUE(supervisor.ReportStep(step).ok());
  EXPECT_EQ(owner.Steps("job-r"), std::vector<int64_t>{5});
  v1::ReportEvalRequest eval;
  eval.set_job_id("job-r");
  eval.mutable_eval()->set_rank(0);
  eval.mutable_eval()->set_step(5);
  eval.mutable_eval()->set_loss(2.75);
  ASSERT_TRUE(supervisor.ReportEval(eval).ok());
  EXPECT_EQ(owner.Evals("job-r"), std::vector<int64_t>{5});
  const std::string text = metrics.Render();
  // A CPU node's slot is no GPU: the rank's series carry no gpu (or UUID) label.
  EXPECT_NE(text.find("ithaca_eval_loss{job_id=\"job-r\",rank=\"0\"} 2.75"), std::string::npos)
      << text;
  EXPECT_NE(text.find("ithaca_train_step{job_id=\"job-r\",rank=\"0\"} 5"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("gpu="), std::string::npos) << text;
  EXPECT_EQ(text.find("UUID="), std::string::npos) << text;
  eval.mutable_eval()->set_rank(3);  // no such rank
  EXPECT_FALSE(supervisor.ReportEval(eval).ok());

  // No heartbeat follows.
  std::optional<Ended> end = owner.WaitEnded("job-r");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_FAILED);
  EXPECT_TRUE(
      absl::StartsWith(end->reason, absl::StrCat("rank 0 (pid ", pgid, ") stopped heart-beating")))
      << end->reason;
  v1::HeartbeatRequest late;
  late.set_job_id("job-r");
  EXPECT_TRUE(absl::IsNotFound(supervisor.Heartbeat(late)));
}

// The daemon, not the rank, was silent: a step report whose store write took 2.5 s held the
// supervisor's lock, so nothing heard the rank (timeout 1 s) meanwhile. That time is not held
// against it; silence after it still is.
TEST(SupervisorTest, ADaemonThatStalledDoesNotBlameItsRanks) {
  RecordingOwner owner;
  Metrics metrics;
  Supervisor::Options o = WithWorker(Script("quiet.sh", "exec sleep 30"));
  o.heartbeat_timeout = absl::Seconds(1);
  Supervisor supervisor(o, CpuNode(1), &owner, &metrics);
  supervisor.Start();
  owner.Queue("job-stall", 1);
  supervisor.Wake();
  const int pgid = owner.WaitLaunched("job-stall");
  ASSERT_GT(pgid, 0);
  absl::StatusOr<AdoptionRecord> record = ReadAdoptionRecord(TmpDir() + "/jobs/job-stall");
  ASSERT_TRUE(record.ok()) << record.status();
  v1::RegisterRequest request;
  request.set_job_id("job-stall");
  request.set_rank(0);
  request.set_pid(pgid);
  request.set_secret(record->secret);
  ASSERT_TRUE(supervisor.Register(request).ok());

  owner.step_delay = absl::Milliseconds(2500);
  v1::ReportStepRequest step;
  step.set_job_id("job-stall");
  step.mutable_step()->set_rank(0);
  step.mutable_step()->set_step(1);
  ASSERT_TRUE(supervisor.ReportStep(step).ok());
  absl::SleepFor(absl::Milliseconds(400));  // many passes, no heartbeat
  EXPECT_FALSE(owner.EndedNow("job-stall").has_value()) << owner.EndedNow("job-stall")->reason;
  v1::HeartbeatRequest beat;
  beat.set_job_id("job-stall");
  beat.set_rank(0);
  EXPECT_TRUE(supervisor.Heartbeat(beat).ok());

  std::optional<Ended> end = owner.WaitEnded("job-stall");  // then it goes silent for real
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(end->reason, "stopped heart-beating")) << end->reason;
}

// An evaluation report is bounded by its job's spec (issue 53 R3: one of 127,097 passkey points,
// sent with the job's secret, was stored whole and made list, status and watch fail for every
// client): at most one point per [eval.passkey] length and depth, each one of them; anything else
// is refused whole and reaches neither the store nor the watchers.
TEST(SupervisorTest, AnEvalReportIsBoundedByItsJobsSpec) {
  RecordingOwner owner;
  Metrics metrics;
  Supervisor supervisor(WithWorker(Script("evals.sh", "exec sleep 30")), CpuNode(1), &owner,
                        &metrics);
  supervisor.Start();
  owner.Queue("job-pk", 1,
              "name = \"t\"\nbackend = \"cpu\"\n[model]\npreset = \"tiny\"\n[data]\n"
              "path = \"/data/corpus.tok\"\nseq_len = 128\n[training]\nsteps = 3\n"
              "[eval.passkey]\nlengths = [64, 128]\ndepths = [0.0, 0.5]\n");
  supervisor.Wake();
  const int pgid = owner.WaitLaunched("job-pk");
  ASSERT_GT(pgid, 0);
  absl::StatusOr<AdoptionRecord> record = ReadAdoptionRecord(TmpDir() + "/jobs/job-pk");
  ASSERT_TRUE(record.ok()) << record.status();
  v1::RegisterRequest request;
  request.set_job_id("job-pk");
  request.set_rank(0);
  request.set_pid(pgid);
  request.set_secret(record->secret);
  ASSERT_TRUE(supervisor.Register(request).ok());
  auto report = [&](int64_t step, int points, int64_t length) {
    v1::ReportEvalRequest eval;
    eval.set_job_id("job-pk");
    eval.mutable_eval()->set_step(step);
    for (int i = 0; i < points; ++i) {
      v1::PasskeyResult* p = eval.mutable_eval()->add_passkey();
      p->set_length(i % 2 == 0 ? 64 : length);
      p->set_depth(i / 2 % 2 == 0 ? 0.0 : 0.5);
    }
    return supervisor.ReportEval(eval);
  };
  ASSERT_TRUE(report(1, 4, 128).ok());
  const absl::Status many = report(2, 127097, 128);
  EXPECT_EQ(many.code(), absl::StatusCode::kInvalidArgument) << many;
  EXPECT_EQ(many.message(),
            "ReportEval: 127097 passkey results, but the job's [eval.passkey] has 2 lengths x 2 "
            "depths = 4 points");
  EXPECT_EQ(report(3, 5, 128).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status other = report(4, 2, 96);
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument) << other;
  EXPECT_NE(other.message().find("length 96, depth 0"), std::string::npos) << other;
  // Position buckets the spec does not ask for (it has no eval.position_buckets).
  v1::ReportEvalRequest positions;
  positions.set_job_id("job-pk");
  positions.mutable_eval()->set_step(5);
  positions.mutable_eval()->add_positions()->set_end(128);
  const absl::Status buckets = supervisor.ReportEval(positions);
  EXPECT_EQ(buckets.code(), absl::StatusCode::kInvalidArgument) << buckets;
  EXPECT_EQ(buckets.message(),
            "ReportEval: 1 position buckets, but the job's eval.position_buckets makes 0");
  EXPECT_EQ(owner.Evals("job-pk"), std::vector<int64_t>{1}) << "only the bounded report is kept";
  supervisor.Shutdown("test over");
}

// A step report the store cannot take (its disk full) is refused as RESOURCE_EXHAUSTED, so the
// rank keeps it and sends it again; one never stored is named in the job's reason (issue 43 N13).
TEST(SupervisorTest, AStepTheStoreCannotTakeIsResentOrNamed) {
  RecordingOwner owner;
  Metrics metrics;
  Supervisor supervisor(WithWorker(Script("brief.sh", "sleep 1.5; exit 0")), CpuNode(1), &owner,
                        &metrics);
  supervisor.Start();
  owner.Queue("job-full", 1);
  supervisor.Wake();
  const int pgid = owner.WaitLaunched("job-full");
  ASSERT_GT(pgid, 0);
  absl::StatusOr<AdoptionRecord> record = ReadAdoptionRecord(TmpDir() + "/jobs/job-full");
  ASSERT_TRUE(record.ok()) << record.status();
  v1::RegisterRequest request;
  request.set_job_id("job-full");
  request.set_rank(0);
  request.set_pid(pgid);
  request.set_secret(record->secret);
  ASSERT_TRUE(supervisor.Register(request).ok());
  v1::ReportStepRequest step;
  step.set_job_id("job-full");
  step.mutable_step()->set_rank(0);
  step.mutable_step()->set_step(1);
  owner.failing_steps = 2;
  for (int attempt = 0; attempt < 2; ++attempt) {
    const absl::Status st = supervisor.ReportStep(step);
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "could not store step 1 of rank 0")) << st;
  }
  EXPECT_TRUE(supervisor.ReportStep(step).ok());  // sent again once there is room: stored
  owner.failing_steps = 1;
  step.mutable_step()->set_step(2);
  EXPECT_EQ(supervisor.ReportStep(step).code(), absl::StatusCode::kResourceExhausted);
  std::optional<Ended> end = owner.WaitEnded("job-full");  // the rank exits without resending
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(absl::StrContains(end->reason,
                                "its history lacks 1 step report(s) that could not "
                                "be stored (job store: database or disk is full)"))
      << end->reason;
  EXPECT_EQ(owner.Steps("job-full"), std::vector<int64_t>{1});
}

TEST(SupervisorTest, AWorkerThatNeverRegistersFailsItsJob) {
  RecordingOwner owner;
  Metrics metrics;
  Supervisor::Options o = WithWorker(Script("mute.sh", "exec sleep 30"));
  o.start_timeout = absl::Milliseconds(200);
  Supervisor supervisor(o, CpuNode(1), &owner, &metrics);
  supervisor.Start();
  owner.Queue("job-m", 1);
  supervisor.Wake();
  std::optional<Ended> end = owner.WaitEnded("job-m");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(end->reason, "did not register within 200ms")) << end->reason;
  EXPECT_EQ(end->failed_rank, 0);
}

TEST(SupervisorTest, ALaunchThatFailsEndsTheJobAtOnce) {
  RecordingOwner owner;
  Metrics metrics;
  Supervisor supervisor(WithWorker(TmpDir() + "/no-such-worker"), CpuNode(1), &owner, &metrics);
  supervisor.Start();
  owner.Queue("job-l", 1);
  supervisor.Wake();
  std::optional<Ended> end = owner.WaitEnded("job-l");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StartsWith(
      end->reason, "launch failed: launcher: " + TmpDir() + "/no-such-worker: No such file"))
      << end->reason;
  EXPECT_TRUE(owner.States("job-l").empty());
}

TEST(SupervisorTest, ShutdownFailsRunningJobsBeforeItReturns) {
  RecordingOwner owner;
  Metrics metrics;
  Supervisor supervisor(WithWorker(Script("busy.sh", "exec sleep 30")), CpuNode(1), &owner,
                        &metrics);
  supervisor.Start();
  owner.Queue("job-s", 1);
  supervisor.Wake();
  ASSERT_GT(owner.WaitLaunched("job-s"), 0);
  supervisor.Shutdown("daemon going away");
  std::optional<Ended> end = owner.EndedNow("job-s");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_FAILED);
  EXPECT_EQ(end->reason, "daemon going away");
  // Nothing launches after shutdown.
  owner.Queue("job-after", 1);
  EXPECT_EQ(owner.WaitLaunched("job-after", absl::Milliseconds(300)), 0);
}

// A detached supervisor leaves its job's workers running; another one adopts them from the
// adoption record: the rank re-attaches with the job's secret, its step reports go on (a re-sent
// one is not recorded twice), and the exit code it announces before it exits is the outcome.
TEST(SupervisorTest, ADetachedJobIsAdoptedAndEndsWithTheExitItsWorkerAnnounces) {
  const std::string go = TmpDir() + "/adopt-go";
  unlink(go.c_str());
  Supervisor::Options o =
      WithWorker(Script("adoptee.sh", "while [ ! -e " + go + " ]; do sleep 0.05; done; exit 0"));
  RecordingOwner first_owner;
  Metrics metrics;
  int pid = 0;
  {
    Supervisor first(o, CpuNode(1), &first_owner, &metrics);
    first.Start();
    first_owner.Queue("job-a", 1);
    first.Wake();
    pid = first_owner.WaitLaunched("job-a");
    ASSERT_GT(pid, 0);
    EXPECT_EQ(first.Detach(), 1);
  }  // destroyed: the worker must survive it
  absl::SleepFor(absl::Milliseconds(200));
  absl::StatusOr<AdoptionRecord> record = ReadAdoptionRecord(TmpDir() + "/jobs/job-a");
  ASSERT_TRUE(record.ok()) << record.status();
  ASSERT_TRUE(IsWorkerOf(pid, "job-a", record->secret));
  EXPECT_FALSE(IsWorkerOf(pid, "job-a", "another launch's secret"));
  EXPECT_FALSE(IsWorkerOf(pid, "job-b", record->secret));

  RecordingOwner owner;
  Supervisor second(o, CpuNode(1), &owner, &metrics);
  second.Adopt({"job-a", "spec of job-a", TmpDir() + "/jobs/job-a", *record, /*running=*/true,
                /*last_steps=*/{7}});
  second.Start();
  v1::HeartbeatRequest beat;
  beat.set_job_id("job-a");
  beat.set_rank(0);
  EXPECT_TRUE(absl::IsFailedPrecondition(second.Heartbeat(beat)));  // re-attach first
  v1::RegisterRequest reattach;
  reattach.set_job_id("job-a");
  reattach.set_rank(0);
  reattach.set_pid(pid);
  reattach.set_reattach(true);
  reattach.set_secret("not the secret");
  EXPECT_TRUE(absl::IsPermissionDenied(second.Register(reattach).status()));
  reattach.set_secret(record->secret);
  absl::StatusOr<v1::RegisterResponse> attached = second.Register(reattach);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ(attached->spec_toml(), "spec of job-a");
  EXPECT_EQ(attached->daemon_lost_timeout_ms(), 300000);
  EXPECT_TRUE(second.Heartbeat(beat).ok());
  v1::ReportStepRequest step;
  step.set_job_id("job-a");
  step.mutable_step()->set_rank(0);
  for (int s : {7, 8}) {  // 7 was recorded before the restart
    step.mutable_step()->set_step(s);
    ASSERT_TRUE(second.ReportStep(step).ok());
  }
  EXPECT_EQ(owner.Steps("job-a"), std::vector<int64_t>{8});

  v1::ExitingRequest exiting;
  exiting.set_job_id("job-a");
  exiting.set_rank(0);
  exiting.set_exit_code(0);
  ASSERT_TRUE(second.Exiting(exiting).ok());
  std::ofstream(go) << "go\n";
  std::optional<Ended> end = owner.WaitEnded("job-a");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_SUCCEEDED) << end->reason;
  // Already RUNNING when adopted: no state change is reported again.
  EXPECT_TRUE(owner.States("job-a").empty());
  waitpid(pid, nullptr, 0);  // this test process launched it
}

// An adopted worker that vanishes without announcing its exit fails the job, naming it.
TEST(SupervisorTest, AnAdoptedWorkerThatVanishesFailsItsJob) {
  Supervisor::Options o = WithWorker(Script("vanishes.sh", "exec sleep 30"));
  RecordingOwner first_owner, owner;
  Metrics metrics;
  int pid = 0;
  {
    Supervisor first(o, CpuNode(1), &first_owner, &metrics);
    first.Start();
    first_owner.Queue("job-v", 1);
    first.Wake();
    pid = first_owner.WaitLaunched("job-v");
    ASSERT_GT(pid, 0);
    first.Detach();
  }
  absl::StatusOr<AdoptionRecord> record = ReadAdoptionRecord(TmpDir() + "/jobs/job-v");
  ASSERT_TRUE(record.ok()) << record.status();
  Supervisor second(o, CpuNode(1), &owner, &metrics);
  second.Adopt({"job-v", "spec", TmpDir() + "/jobs/job-v", *record, true, {}});
  second.Start();
  kill(pid, SIGKILL);
  std::optional<Ended> end = owner.WaitEnded("job-v");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->outcome, v1::JOB_STATE_FAILED);
  EXPECT_EQ(end->failed_rank, 0);
  EXPECT_TRUE(absl::StrContains(end->reason, "adopted after a daemon restart) is gone"))
      << end->reason;
  waitpid(pid, nullptr, 0);
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// The WorkerService on the client port (ithacad --cluster slurm: ranks on other nodes) lets no
// call through without the clients' token and the secret of the job the call names; on the unix
// socket only the token check is absent.
TEST(SupervisorTest, TheTcpWorkerServiceNeedsTheTokenAndTheJobsSecret) {
  RecordingOwner owner;
  Metrics metrics;
  Supervisor supervisor(WithWorker(Script("idle.sh", "exec sleep 30")), CpuNode(1), &owner,
                        &metrics);
  supervisor.Start();
  owner.Queue("job-t", 1);
  supervisor.Wake();
  ASSERT_GT(owner.WaitLaunched("job-t"), 0);
  absl::StatusOr<AdoptionRecord> record = ReadAdoptionRecord(TmpDir() + "/jobs/job-t");
  ASSERT_TRUE(record.ok()) << record.status();

  const std::string token = "0123456789abcdef-token";
  WorkerServiceImpl remote(&supervisor, std::make_shared<Authenticator>(token));
  WorkerServiceImpl local(&supervisor);
  grpc::ServerBuilder rb, lb;
  rb.RegisterService(&remote);
  lb.RegisterService(&local);
  std::unique_ptr<grpc::Server> remote_server = rb.BuildAndStart(),
                                local_server = lb.BuildAndStart();
  ASSERT_TRUE(remote_server && local_server);
  auto remote_stub =
      v1::WorkerService::NewStub(remote_server->InProcessChannel(grpc::ChannelArguments()));
  auto local_stub =
      v1::WorkerService::NewStub(local_server->InProcessChannel(grpc::ChannelArguments()));
  auto beat = [&](v1::WorkerService::Stub* stub, const std::string& bearer,
                  const std::string& secret) {
    grpc::ClientContext ctx;
    if (!bearer.empty()) ctx.AddMetadata("authorization", "Bearer " + bearer);
    if (!secret.empty()) ctx.AddMetadata(kJobSecretMetadata, secret);
    v1::HeartbeatRequest req;
    req.set_job_id("job-t");
    v1::Ack ack;
    return stub->Heartbeat(&ctx, req, &ack).error_code();
  };
  EXPECT_EQ(beat(remote_stub.get(), "", record->secret), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(beat(remote_stub.get(), "wrong-token-0123456789", record->secret),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(beat(remote_stub.get(), token, ""), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(beat(remote_stub.get(), token, record->secret + "0"),
            grpc::StatusCode::PERMISSION_DENIED);
  // Token and secret: the call reaches the supervisor (the rank has not registered yet).
  EXPECT_EQ(beat(remote_stub.get(), token, record->secret), grpc::StatusCode::FAILED_PRECONDITION);
  // The local socket asks for no token, but for the job's secret on every call.
  EXPECT_EQ(beat(local_stub.get(), "", ""), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(beat(local_stub.get(), "", record->secret + "0"), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(beat(local_stub.get(), "", record->secret), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(supervisor.Cancel("job-t", "test over").ok());
  ASSERT_TRUE(owner.WaitEnded("job-t").has_value());
}

}  // namespace
}  // namespace ithaca
