// Jobs with a real (in-memory) store and real worker processes: what a client sees when the
// supervisor runs, cancels and loses jobs.
#include "server/jobs.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "engine/spec/job_spec.h"
#include "server/services.h"
#include "server/test_workers.h"

namespace ithaca {
namespace {

// A CPU job of `world` ranks whose data file is a real token file.
v1::SubmitJobRequest Submission(int world) {
  WriteCorpus(TmpDir() + "/corpus.tok");
  v1::SubmitJobRequest r;
  r.set_spec_toml(
      absl::StrCat("name = \"t\"\nbackend = \"cpu\"\n[model]\npreset = \"tiny\"\n",
                   "[data]\npath = \"corpus.tok\"\nseq_len = 64\n[training]\nsteps = 3\n",
                   "[parallel]\nworld = ", world, "\n"));
  r.set_source("job.toml");
  r.set_base_dir(TmpDir());
  return r;
}

Jobs::Options CpuJobs(const std::string& name, int slots, const std::string& worker) {
  Jobs::Options o;
  o.state_dir = TmpDir() + "/" + name;
  o.node.host_memory_bytes = int64_t{16} << 30;
  for (int i = 0; i < slots; ++i) {
    o.node.devices.push_back({i, "", "cpu slot", o.node.host_memory_bytes});
  }
  o.supervisor.worker_binary = worker;
  o.supervisor.worker_socket = o.state_dir + "/worker.sock";
  o.supervisor.grace_period = absl::Seconds(2);
  o.supervisor.poll_interval = absl::Milliseconds(10);
  return o;
}

// Polls the store until the job is in `state` (or 20 s pass); returns the last record.
v1::Job WaitFor(Jobs& jobs, const std::string& id, JobState state) {
  v1::Job job;
  for (absl::Time end = absl::Now() + absl::Seconds(20); absl::Now() < end;) {
    absl::StatusOr<v1::Job> now = jobs.Get(id);
    if (now.ok()) job = *now;
    if (job.state() == state) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return job;
}

TEST(JobsTest, AJobWhoseWorkerExitsNonZeroEndsFailedAndItsStreamSaysSo) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("false", 2, "/bin/false"), store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  absl::StatusOr<v1::Job> job = jobs.Submit(Submission(1));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_QUEUED);

  v1::Job failed = WaitFor(jobs, job->id(), v1::JOB_STATE_FAILED);
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.reason(), "rank 0 exited with code 1 (error)");
  EXPECT_EQ(failed.failed_rank(), 0);
  std::vector<JobState> path;
  for (const v1::StateTransition& t : failed.transitions()) path.push_back(t.to());
  EXPECT_EQ(path, (std::vector<JobState>{v1::JOB_STATE_QUEUED, v1::JOB_STATE_STARTING,
                                         v1::JOB_STATE_FAILED}));

  absl::StatusOr<std::shared_ptr<EventLog>> events = jobs.Events(job->id());
  ASSERT_TRUE(events.ok());
  bool closed = false;
  std::vector<v1::JobEvent> all = (*events)->WaitAfter(0, absl::Seconds(1), &closed);
  EXPECT_TRUE(closed);
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.back().state().to(), v1::JOB_STATE_FAILED);
  // The slots are free again.
  v1::NodeInfo node = jobs.NodeInfo();
  EXPECT_EQ(node.free_slots(), 2);
  EXPECT_EQ(node.jobs_running(), 0);
}

// submit --after: the job waits, queued with a free slot beside it, and is cancelled saying why
// when the job it waits for is cancelled or fails (Slurm's afterok); an unknown job, or one
// that already ended badly, is refused at submit.
TEST(JobsTest, AJobAfterAnotherWaitsAndIsCancelledWhenThatOneIsCancelled) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("after", 2, Script("sleep.sh", "exec sleep 30")), store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  absl::StatusOr<v1::Job> parent = jobs.Submit(Submission(1));
  ASSERT_TRUE(parent.ok()) << parent.status();
  v1::SubmitJobRequest after = Submission(1);
  after.set_after(parent->id());
  absl::StatusOr<v1::Job> child = jobs.Submit(after);
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(child->after(), parent->id());
  EXPECT_NE(child->reason().find("waits for " + parent->id() + " to succeed (--after)"),
            std::string::npos)
      << child->reason();
  v1::SubmitJobRequest grand = Submission(1);
  grand.set_after(child->id());
  absl::StatusOr<v1::Job> grandchild = jobs.Submit(grand);
  ASSERT_TRUE(grandchild.ok()) << grandchild.status();
  ASSERT_EQ(WaitFor(jobs, parent->id(), v1::JOB_STATE_STARTING).state(), v1::JOB_STATE_STARTING);
  absl::SleepFor(absl::Milliseconds(300));  // a free slot, and still it waits
  EXPECT_EQ(jobs.Get(child->id())->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(jobs.NodeInfo().free_slots(), 1);

  ASSERT_TRUE(jobs.Cancel(parent->id(), "").ok());
  v1::Job cancelled = WaitFor(jobs, child->id(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled.reason(), "job " + parent->id() +
                                    " it waited for (--after) ended cancelled: cancelled by the "
                                    "user");
  v1::Job chained = WaitFor(jobs, grandchild->id(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(chained.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(chained.reason(), "job " + child->id() +
                                  " it waited for (--after) ended cancelled; the chain's first "
                                  "job " +
                                  parent->id() + " ended cancelled: cancelled by the user");

  v1::SubmitJobRequest unknown = Submission(1);
  unknown.set_after("job-99");
  absl::StatusOr<v1::Job> refused = jobs.Submit(unknown);
  EXPECT_TRUE(absl::IsNotFound(refused.status())) << refused.status();
  EXPECT_EQ(refused.status().message(), "after: no job \"job-99\" (`ithaca list` shows the ids)");
  v1::SubmitJobRequest late = Submission(1);
  late.set_after(parent->id());
  refused = jobs.Submit(late);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_TRUE(absl::StartsWith(refused.status().message(),
                               "after: job " + parent->id() + " already ended cancelled"))
      << refused.status();
  // Cancelling a waiting job itself works too.
  v1::SubmitJobRequest again = Submission(1);
  absl::StatusOr<v1::Job> runs = jobs.Submit(again);
  ASSERT_TRUE(runs.ok());
  again.set_after(runs->id());
  absl::StatusOr<v1::Job> waits = jobs.Submit(again);
  ASSERT_TRUE(waits.ok()) << waits.status();
  absl::StatusOr<v1::Job> gone = jobs.Cancel(waits->id(), "");
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_EQ(gone->state(), v1::JOB_STATE_CANCELLED);
  jobs.Shutdown("test over");
}

// A chain cancel named each job's reason inside the next one's, cut at 4 KiB, so that the cause
// was lost down a long chain (issue 53): the chain's first job and its reason are named once,
// whatever the chain's length.
TEST(JobsTest, AChainCancelNamesItsFirstJobAndReasonOnce) {
  const std::string cause = "preempted: " + std::string(900, 'x');
  std::string reason = cause;
  for (int i = 1; i <= 1000; ++i) {
    reason = ChainedCancelReason(absl::StrCat("job-", i),
                                 i == 1 ? v1::JOB_STATE_FAILED : v1::JOB_STATE_CANCELLED, reason);
  }
  EXPECT_EQ(reason,
            "job job-1000 it waited for (--after) ended cancelled; the chain's first job "
            "job-1 ended failed: " +
                cause);
}

TEST(JobsTest, AJobAfterAnotherIsCancelledWhenThatOneFails) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("after_fail", 2, Script("fail_late.sh", "sleep 1; exit 1")), store->get(),
            &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  absl::StatusOr<v1::Job> parent = jobs.Submit(Submission(1));
  ASSERT_TRUE(parent.ok()) << parent.status();
  v1::SubmitJobRequest after = Submission(1);
  after.set_after(parent->id());
  absl::StatusOr<v1::Job> child = jobs.Submit(after);
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_EQ(WaitFor(jobs, parent->id(), v1::JOB_STATE_FAILED).state(), v1::JOB_STATE_FAILED);
  v1::Job cancelled = WaitFor(jobs, child->id(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(absl::StartsWith(cancelled.reason(),
                               "job " + parent->id() + " it waited for (--after) ended failed: "))
      << cancelled.reason();
  // It never started.
  for (const v1::StateTransition& t : cancelled.transitions()) {
    EXPECT_NE(t.to(), v1::JOB_STATE_STARTING);
  }
}

TEST(JobsTest, CancelTakesAQueuedJobOffTheQueueAndStopsARunningOne) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("cancel", 2, Script("sleep.sh", "exec sleep 30")), store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  absl::StatusOr<v1::Job> first = jobs.Submit(Submission(2));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(WaitFor(jobs, first->id(), v1::JOB_STATE_STARTING).state(), v1::JOB_STATE_STARTING);
  absl::StatusOr<v1::Job> second = jobs.Submit(Submission(1));  // waits: no free slot
  ASSERT_TRUE(second.ok()) << second.status();

  v1::NodeInfo node = jobs.NodeInfo();
  EXPECT_EQ(node.jobs_running(), 1);
  EXPECT_EQ(node.jobs_queued(), 1);
  EXPECT_EQ(node.free_slots(), 0);
  EXPECT_EQ(node.devices(1).job_id(), first->id());

  absl::StatusOr<v1::Job> dequeued = jobs.Cancel(second->id(), "");
  ASSERT_TRUE(dequeued.ok()) << dequeued.status();
  EXPECT_EQ(dequeued->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(dequeued->reason(), "cancelled by the user");

  absl::StatusOr<v1::Job> stopping = jobs.Cancel(first->id(), "enough");
  ASSERT_TRUE(stopping.ok()) << stopping.status();
  EXPECT_EQ(stopping->state(), v1::JOB_STATE_CANCELLING);
  v1::Job cancelled = WaitFor(jobs, first->id(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled.state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled.reason(), "enough");
  EXPECT_TRUE(absl::IsFailedPrecondition(jobs.Cancel(first->id(), "").status()));
}

// Issue 43 N10: a drain whose caller went away (its client cancelled the call) stops waiting at
// once instead of holding a daemon thread until the job stops or the timeout passes; the job it
// could not drain is listed.
TEST(JobsTest, AnAbandonedDrainStopsWaiting) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("abandoned-drain", 2, Script("sleep-drain.sh", "exec sleep 30")), store->get(),
            &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  absl::StatusOr<v1::Job> job = jobs.Submit(Submission(1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(WaitFor(jobs, job->id(), v1::JOB_STATE_STARTING).state(), v1::JOB_STATE_STARTING);
  const absl::Time start = absl::Now();
  const v1::DrainResponse r = jobs.DrainNode(
      /*undo=*/false, absl::Seconds(60),
      [start] { return absl::Now() - start > absl::Milliseconds(300); });
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_TRUE(r.scheduling_paused());
  ASSERT_EQ(r.still_running_size(), 1);
  EXPECT_EQ(r.still_running(0), job->id());
  EXPECT_TRUE(jobs.Cancel(job->id(), "").ok());
}

// `ithaca delete`: a live job is refused (naming cancel); an ended one disappears from the store,
// its history and its log directory go, its checkpoint.dir stays, and its id is not reused.
TEST(JobsTest, DeleteForgetsAnEndedJobKeepsItsCheckpointsAndNeverReusesItsId) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("delete", 1, Script("sleep_del.sh", "echo hello; exec sleep 30")), store->get(),
            &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  const std::string ckpt = TmpDir() + "/delete-ckpt";
  mkdir(ckpt.c_str(), 0755);
  std::ofstream(ckpt + "/user-file") << "mine";
  v1::SubmitJobRequest request = Submission(1);
  request.set_spec_toml(request.spec_toml() + "[checkpoint]\ndir = \"" + ckpt + "\"\n");
  absl::StatusOr<v1::Job> job = jobs.Submit(request);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->id(), "job-1");
  ASSERT_EQ(WaitFor(jobs, job->id(), v1::JOB_STATE_STARTING).state(), v1::JOB_STATE_STARTING);

  absl::StatusOr<v1::Job> live = jobs.Delete(job->id());
  ASSERT_TRUE(absl::IsFailedPrecondition(live.status())) << live.status();
  EXPECT_NE(live.status().message().find("ithaca cancel job-1"), std::string::npos)
      << live.status();

  ASSERT_TRUE(jobs.Cancel(job->id(), "").ok());
  ASSERT_EQ(WaitFor(jobs, job->id(), v1::JOB_STATE_CANCELLED).state(), v1::JOB_STATE_CANCELLED);
  struct stat st;
  ASSERT_EQ(stat(job->log_dir().c_str(), &st), 0) << job->log_dir();

  absl::StatusOr<v1::Job> deleted = jobs.Delete(job->id());
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_TRUE(absl::IsNotFound(jobs.Get(job->id()).status()));
  EXPECT_TRUE(absl::IsNotFound(jobs.History(job->id()).status()));
  EXPECT_TRUE(absl::IsNotFound(jobs.Events(job->id()).status()));
  EXPECT_TRUE(absl::IsNotFound(jobs.Delete(job->id()).status())) << "deleted once";
  EXPECT_TRUE(jobs.List(v1::ListJobsRequest())->jobs().empty());
  EXPECT_NE(stat(job->log_dir().c_str(), &st), 0) << "the rank logs are gone";
  EXPECT_EQ(stat((ckpt + "/user-file").c_str(), &st), 0) << "checkpoint.dir is the user's";

  absl::StatusOr<v1::Job> next = jobs.Submit(Submission(1));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->id(), "job-2") << "a deleted job's id is never given out again";
  ASSERT_TRUE(jobs.Cancel(next->id(), "").ok());
  WaitFor(jobs, next->id(), v1::JOB_STATE_CANCELLED);
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_mode & 07777 : 0;
}

// Nothing under the state directory is readable by other users (issue 53 N11: jobs/ and the rank
// logs were 0755/0644, so any local user listed the job ids and read every log): jobs/, a job's
// directory and its rendezvous directory are 0700, its rank logs 0600, and what an older daemon
// left readable is made so when the daemon starts.
TEST(JobsTest, AJobsFilesAreTheDaemonsUsersAlone) {
  Jobs::Options o = CpuJobs("private", 1, Script("sleep_private.sh", "echo hello; exec sleep 30"));
  const std::string jobs_dir = o.state_dir + "/jobs";
  const std::string old = jobs_dir + "/job-9";
  ASSERT_EQ(system(("mkdir -p " + old).c_str()), 0);
  std::ofstream(old + "/rank-0.log") << "an older daemon's log\n";
  for (const auto& [path, mode] :
       {std::pair<std::string, mode_t>{jobs_dir, 0755}, {old, 0755}, {old + "/rank-0.log", 0644}}) {
    ASSERT_EQ(chmod(path.c_str(), mode), 0) << path;
  }
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(o, store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  EXPECT_EQ(ModeOf(jobs_dir), 0700u);
  EXPECT_EQ(ModeOf(old), 0700u);
  EXPECT_EQ(ModeOf(old + "/rank-0.log"), 0600u);

  absl::StatusOr<v1::Job> job = jobs.Submit(Submission(1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(WaitFor(jobs, job->id(), v1::JOB_STATE_STARTING).state(), v1::JOB_STATE_STARTING);
  const std::string log = job->log_dir() + "/rank-0.log";
  for (absl::Time end = absl::Now() + absl::Seconds(10); ModeOf(log) == 0 && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(ModeOf(job->log_dir()), 0700u);
  EXPECT_EQ(ModeOf(log), 0600u);
  int rendezvous = 0;
  if (DIR* d = opendir(job->log_dir().c_str())) {
    while (dirent* e = readdir(d)) {
      if (absl::StartsWith(e->d_name, "rendezvous-")) {
        ++rendezvous;
        EXPECT_EQ(ModeOf(job->log_dir() + "/" + e->d_name), 0700u) << e->d_name;
      }
    }
    closedir(d);
  }
  EXPECT_EQ(rendezvous, 1);
  ASSERT_TRUE(jobs.Cancel(job->id(), "").ok());
  WaitFor(jobs, job->id(), v1::JOB_STATE_CANCELLED);
}

TEST(JobsTest, ACancelReasonIsBounded) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("cancel_reason", 1, Script("sleep.sh", "exec sleep 30")), store->get(),
            &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  absl::StatusOr<v1::Job> first = jobs.Submit(Submission(1));
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<v1::Job> queued = jobs.Submit(Submission(1));
  ASSERT_TRUE(queued.ok()) << queued.status();
  absl::StatusOr<v1::Job> refused = jobs.Cancel(queued->id(), std::string(1500000, 'r'));
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("reason: at most 4096 bytes, got 1500000"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(jobs.Get(queued->id())->state(), v1::JOB_STATE_QUEUED) << "not cancelled";
  absl::StatusOr<v1::Job> cancelled = jobs.Cancel(queued->id(), std::string(4096, 'r'));
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->reason().size(), 4096u);
}

// Two live jobs never share a checkpoint.dir (however it is spelled); once the first ended, the
// directory is free again.
TEST(JobsTest, TwoLiveJobsCannotShareACheckpointDir) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("ckpt_dir", 1, Script("sleep.sh", "exec sleep 30")), store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  auto with_dir = [](const std::string& dir) {
    v1::SubmitJobRequest r = Submission(1);
    r.set_spec_toml(r.spec_toml() + "[checkpoint]\ndir = \"" + dir + "\"\n");
    return r;
  };
  absl::StatusOr<v1::Job> first = jobs.Submit(with_dir("ckpt/shared"));
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<v1::Job> second = jobs.Submit(with_dir("ckpt/../ckpt/shared/"));
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_NE(second.status().message().find("checkpoint directory of " + first->id()),
            std::string::npos)
      << second.status();
  absl::StatusOr<v1::Job> other = jobs.Submit(with_dir("ckpt/other"));
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(jobs.Cancel(first->id(), "").ok());
  WaitFor(jobs, first->id(), v1::JOB_STATE_CANCELLED);
  absl::StatusOr<v1::Job> third = jobs.Submit(with_dir("ckpt/shared"));
  EXPECT_TRUE(third.ok()) << third.status();
}

// The planning bound is the operator's (ithacad --max-plan-seconds): a plan the default bound
// answers runs past a tiny one, DEADLINE_EXCEEDED naming the length and model (issue 54 F1).
TEST(JobsTest, ThePlanningBoundIsTheOperators) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  v1::PlanJobRequest p;
  p.set_spec_toml(Submission(1).spec_toml());
  p.set_source("job.toml");
  p.set_base_dir(TmpDir());
  p.add_overrides("model.preset=\"llama-3.2-1b\"");
  p.add_overrides("data.seq_len=65536");
  Jobs roomy(CpuJobs("bound-default", 1, "/bin/true"), store->get(), &metrics);
  EXPECT_TRUE(roomy.Plan(p).ok());
  Jobs::Options tight = CpuJobs("bound-tight", 1, "/bin/true");
  tight.max_plan_time = absl::Milliseconds(1);
  Jobs hurried(tight, store->get(), &metrics);
  absl::StatusOr<v1::PlanJobResponse> plan = hurried.Plan(p);
  EXPECT_TRUE(absl::IsDeadlineExceeded(plan.status())) << plan.status();
  EXPECT_NE(plan.status().message().find("planning data.seq_len = 65536 for llama-3.2-1b"),
            std::string::npos)
      << plan.status();
}

// The clients' --set travels as the request's overrides and ithacad applies them (one
// implementation, engine/spec/overrides.h): the stored spec has them, Plan sees them, and an error
// names the override or the user's own line.
TEST(JobsTest, OverridesAreAppliedByTheDaemon) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("overrides", 1, Script("sleep.sh", "exec sleep 30")), store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  v1::SubmitJobRequest r = Submission(1);
  r.add_overrides("training.steps=7");
  r.add_overrides("name=sweep-7");
  absl::StatusOr<v1::Job> job = jobs.Submit(r);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->name(), "sweep-7");
  EXPECT_NE(job->spec_toml().find("steps = 7"), std::string::npos) << job->spec_toml();

  v1::PlanJobRequest p;
  p.set_spec_toml(r.spec_toml());
  p.set_source("job.toml");
  p.set_base_dir(r.base_dir());
  p.add_overrides("data.seq_len=128");
  absl::StatusOr<v1::PlanJobResponse> plan = jobs.Plan(p);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->spec().seq_len(), 128);

  v1::SubmitJobRequest typo = Submission(1);
  typo.add_overrides("training.stepz=3");
  absl::StatusOr<v1::Job> refused = jobs.Submit(typo);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("(from --set training.stepz=3)"), std::string::npos)
      << refused.status();
  // A key of the user's file: its line there (the rewritten text's lines differ).
  v1::SubmitJobRequest bad = Submission(1);
  bad.set_spec_toml(
      "# comment\n\n" +
      absl::StrReplaceAll(bad.spec_toml(), {{"steps = 3\n", "steps = 3\nlr = -1.0\n"}}));
  bad.add_overrides("name=x");
  refused = jobs.Submit(bad);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("training.lr: "), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("(line 12)"), std::string::npos) << refused.status();
  // A renamed key (issue 30), from --set or the file, is refused naming the new one.
  v1::SubmitJobRequest renamed = Submission(1);
  renamed.add_overrides("memory.checkpoint=full");
  refused = jobs.Submit(renamed);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find(
                "memory.checkpoint: renamed key (from --set memory.checkpoint=full); did you mean "
                "memory.recompute?"),
            std::string::npos)
      << refused.status();
  renamed = Submission(1);
  renamed.set_spec_toml(renamed.spec_toml() + "[memory]\ncheckpoint_interval = 2\n");
  refused = jobs.Submit(renamed);
  EXPECT_NE(refused.status().message().find("did you mean memory.recompute_interval?"),
            std::string::npos)
      << refused.status();
  renamed = Submission(1);
  renamed.add_overrides("memory.recompute=attention-aware");
  renamed.add_overrides("memory.recompute_interval=2");
  job = jobs.Submit(renamed);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_NE(job->spec_toml().find("\nrecompute = \"attention-aware\"\n"), std::string::npos)
      << job->spec_toml();
  EXPECT_NE(job->spec_toml().find("\nrecompute_interval = 2\n"), std::string::npos)
      << job->spec_toml();
  v1::SubmitJobRequest no_eq = Submission(1);
  no_eq.add_overrides("steps");
  refused = jobs.Submit(no_eq);
  EXPECT_NE(refused.status().message().find("--set steps: expected KEY=VALUE"), std::string::npos)
      << refused.status();
}

// A job across nodes needs a daemon on a cluster: a daemon of one node refuses it at submission,
// naming the key and the flag, rather than queueing what it can never run. The ranks per node
// are what must fit the node.
TEST(JobsTest, AJobAcrossNodesIsRefusedWithoutTheClusterAndFitsPerNode) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("nodes", 2, Script("sleep.sh", "exec sleep 30")), store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  v1::SubmitJobRequest r = Submission(4);
  r.set_spec_toml(r.spec_toml() + "[slurm]\nnodes = 2\n");
  absl::StatusOr<v1::Job> refused = jobs.Submit(r);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("slurm.nodes = 2: this ithacad runs jobs on its own "
                                            "node only; a job across nodes needs ithacad "
                                            "--cluster slurm"),
            std::string::npos)
      << refused.status();
  // One node of 2 slots: 4 ranks do not fit, with or without [slurm].
  absl::StatusOr<v1::Job> too_big = jobs.Submit(Submission(4));
  EXPECT_NE(too_big.status().message().find("the job needs 4 ranks; this node has 2"),
            std::string::npos)
      << too_big.status();
}

// ListJobs answers a page at a time, however many jobs the store holds, and the pages together
// are every job once, newest first.
TEST(JobsTest, ListJobsPages) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("pages", 1, "/bin/false"), store->get(), &metrics);
  for (int i = 0; i < 250; ++i) {
    v1::Job j;
    j.set_name("j");
    ASSERT_TRUE((*store)->Create(j, "submitted").ok());
  }
  v1::ListJobsRequest request;
  absl::StatusOr<v1::ListJobsResponse> page = jobs.List(request);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs_size(), Jobs::kDefaultListLimit) << "limit 0 is a page, not everything";
  EXPECT_EQ(page->jobs(0).id(), "job-250");
  std::vector<std::string> ids;
  request.set_limit(70);
  do {
    page = jobs.List(request);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->jobs_size(), 70);
    for (const v1::Job& j : page->jobs()) ids.push_back(j.id());
    request.set_page_token(page->next_page_token());
  } while (!request.page_token().empty());
  ASSERT_EQ(ids.size(), 250u);
  EXPECT_EQ(ids.front(), "job-250");
  EXPECT_EQ(ids.back(), "job-1");
  request.set_page_token("not-a-token");
  EXPECT_TRUE(absl::IsInvalidArgument(jobs.List(request).status()));
  request.clear_page_token();
  request.set_limit(1000000);
  EXPECT_EQ(jobs.List(request)->jobs_size(), 250);
}

// Ended jobs' event logs leave the daemon's memory once kEndedEventLogsKept newer jobs ended
// (their history stays in the store); a watcher that comes later still gets the final state.
TEST(JobsTest, EndedJobsEventLogsAreDropped) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("events", 1, "/bin/false"), store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  absl::StatusOr<v1::Job> job = jobs.Submit(Submission(1));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<std::shared_ptr<EventLog>> live = jobs.Events(job->id());
  ASSERT_TRUE(live.ok());
  std::weak_ptr<EventLog> weak = *live;
  live->reset();
  ASSERT_EQ(WaitFor(jobs, job->id(), v1::JOB_STATE_FAILED).state(), v1::JOB_STATE_FAILED);
  EXPECT_FALSE(weak.expired()) << "a recently ended job's stream is kept for resuming watchers";
  for (size_t i = 0; i < Jobs::kEndedEventLogsKept; ++i) {
    absl::StatusOr<v1::Job> next = jobs.Submit(Submission(1));
    ASSERT_TRUE(next.ok()) << next.status();
    ASSERT_EQ(WaitFor(jobs, next->id(), v1::JOB_STATE_FAILED).state(), v1::JOB_STATE_FAILED);
  }
  // The store says FAILED a moment before OnEnded retires the job's log (under the daemon's
  // lock, after the transition): give the last job that moment.
  for (int i = 0; i < 500 && !weak.expired(); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(weak.expired()) << "an old ended job's log is still held";
  absl::StatusOr<std::shared_ptr<EventLog>> later = jobs.Events(job->id());
  ASSERT_TRUE(later.ok());
  bool closed = false;
  std::vector<v1::JobEvent> events = (*later)->WaitAfter(0, absl::Seconds(1), &closed);
  EXPECT_TRUE(closed);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].state().to(), v1::JOB_STATE_FAILED);
  weak = *later;
  later->reset();
  EXPECT_TRUE(weak.expired()) << "a late watcher's log is not kept either";
}

// A worker whose error names a file in Latin-1: its logs and the watch stream reach a gRPC
// client (valid UTF-8, U+FFFD for the bad byte) and end, instead of failing to parse there.
TEST(JobsTest, NonUtf8WorkerOutputReachesClients) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(
      CpuJobs("latin1", 1, Script("latin1.sh", "printf 'data/caf\\351.tok: bad\\n' >&2; exit 2")),
      store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  absl::StatusOr<v1::Job> job = jobs.Submit(Submission(1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(WaitFor(jobs, job->id(), v1::JOB_STATE_FAILED).state(), v1::JOB_STATE_FAILED);

  JobServiceImpl service(&jobs);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  auto stub = v1::JobService::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
  const std::string fffd = "\xEF\xBF\xBD";
  {
    grpc::ClientContext ctx;
    v1::GetJobRequest req;
    req.set_id(job->id());
    v1::Job got;
    ASSERT_TRUE(stub->GetJob(&ctx, req, &got).ok());
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ReadLogsRequest req;
    req.set_id(job->id());
    auto reader = stub->ReadLogs(&ctx, req);
    std::string all;
    v1::LogLine line;
    while (reader->Read(&line)) all += line.text() + "\n";
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_NE(all.find("caf" + fffd + ".tok: bad"), std::string::npos) << all;
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::WatchJobRequest req;
    req.set_id(job->id());
    req.set_include_logs(true);
    auto reader = stub->WatchJob(&ctx, req);
    v1::JobEvent e;
    JobState last = v1::JOB_STATE_UNSPECIFIED;
    while (reader->Read(&e)) {
      if (e.has_state()) last = e.state().to();
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(last, v1::JOB_STATE_FAILED);
  }
  server->Shutdown();
}

// A job the previous ithacad stored, with the spec keys of then (memory.checkpoint, now
// memory.recompute: issue 30), is recovered by a daemon of today: it is queued and launched, and
// its stored [retry] policy, read from that spec, restarts it when its worker fails.
TEST(JobsTest, AJobStoredWithRenamedKeysIsRecoveredAndItsSpecStillRead) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  v1::Job old;
  old.set_name("old");
  old.set_spec_toml(absl::StrCat(
      "name = \"old\"\nbackend = \"cpu\"\n[model]\npreset = \"tiny\"\n[data]\npath = \"",
      WriteCorpus(TmpDir() + "/corpus.tok"),
      "\"\nseq_len = 64\n[training]\nsteps = 3\n[memory]\ncheckpoint = \"attention-aware\"\n"
      "checkpoint_interval = 2\n[retry]\nmax_restarts = 1\nbackoff_seconds = 0.0\n"));
  ASSERT_FALSE(ParseJobSpec(old.spec_toml()).ok());  // what today's parser alone says
  old.mutable_spec()->set_world(1);
  old.set_log_dir(TmpDir() + "/renamed/jobs/{id}");
  absl::StatusOr<v1::Job> stored = (*store)->Create(old, "submitted (previous ithacad)");
  ASSERT_TRUE(stored.ok()) << stored.status();

  Metrics metrics;
  Jobs jobs(CpuJobs("renamed", 1, "/bin/false"), store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());  // Recover: queued again
  v1::Job failed = WaitFor(jobs, stored->id(), v1::JOB_STATE_FAILED);
  ASSERT_EQ(failed.state(), v1::JOB_STATE_FAILED) << failed.reason();
  // Two attempts: the retry policy came from the stored spec (an unreadable one restarts none).
  std::vector<std::string> restarts;
  for (const v1::StateTransition& t : failed.transitions()) {
    if (absl::StartsWith(t.reason(), "restart ")) restarts.push_back(t.reason());
  }
  ASSERT_EQ(restarts.size(), 1u) << failed.DebugString();
  EXPECT_TRUE(absl::StartsWith(restarts[0], "restart 1 of 1")) << restarts[0];
  EXPECT_EQ(failed.reason(), "rank 0 exited with code 1 (error)");
  // `status` shows the spec under today's names.
  absl::StatusOr<JobSpec> spec = ParseJobSpec(failed.spec_toml());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->memory.recompute, RecomputePolicy::kAttentionAware);
  EXPECT_EQ(spec->memory.recompute_interval, 2);
}

TEST(JobsTest, ShutdownFailsRunningJobsKeepsQueuedOnesAndRefusesSubmissions) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("shutdown", 1, Script("sleep.sh", "exec sleep 30")), store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  absl::StatusOr<v1::Job> running = jobs.Submit(Submission(1));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_EQ(WaitFor(jobs, running->id(), v1::JOB_STATE_STARTING).state(), v1::JOB_STATE_STARTING);
  absl::StatusOr<v1::Job> queued = jobs.Submit(Submission(1));
  ASSERT_TRUE(queued.ok()) << queued.status();

  jobs.Shutdown("daemon shut down (test)");
  absl::StatusOr<v1::Job> ended = jobs.Get(running->id());
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(ended->reason(), "daemon shut down (test)");
  EXPECT_EQ(jobs.Get(queued->id())->state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(absl::IsUnavailable(jobs.Submit(Submission(1)).status()));
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// Issue 43 N5: a client that gave up while its job was admitted gets no job. The last look at
// `cancelled` is just before the job is stored: a client gone by then leaves nothing behind.
TEST(JobsTest, AClientGoneBeforeTheJobIsStoredGetsNone) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  Jobs jobs(CpuJobs("gone", 2, "/bin/false"), store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  // How often admission asks, for this spec, when the client stays.
  int asked = 0;
  absl::StatusOr<v1::Job> stays = jobs.Submit(Submission(1), [&] { return ++asked < 0; });
  ASSERT_TRUE(stays.ok()) << stays.status();
  ASSERT_GT(asked, 0);
  const size_t before = jobs.List({})->jobs_size();
  // The same submission whose client is gone at the last question only.
  int n = 0;
  const int last = asked;
  absl::StatusOr<v1::Job> gone = jobs.Submit(Submission(1), [&] { return ++n >= last; });
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kCancelled) << gone.status();
  EXPECT_EQ(jobs.List({})->jobs_size(), before) << "a job was stored for a client that left";
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// A job being cancelled needs no second cancel: deleting it says to wait for its end. Its worker
// ignores SIGTERM, so it stays CANCELLING until the grace period's SIGKILL (2 s here).
TEST(JobsTest, DeletingACancellingJobSaysToWait) {
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  Metrics metrics;
  // The marker says the trap is set: a SIGTERM before it would end the job at once.
  const std::string trapped = TmpDir() + "/stubborn.trapped";
  unlink(trapped.c_str());
  Jobs jobs(CpuJobs("delete_cancelling", 1,
                    Script("stubborn.sh", "trap '' TERM; touch " + trapped + "; exec sleep 30")),
            store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  absl::StatusOr<v1::Job> job = jobs.Submit(Submission(1));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(WaitFor(jobs, job->id(), v1::JOB_STATE_STARTING).state(), v1::JOB_STATE_STARTING);
  for (int i = 0; i < 2000 && access(trapped.c_str(), F_OK) != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(access(trapped.c_str(), F_OK), 0) << "the worker never set its trap";
  absl::StatusOr<v1::Job> cancelling = jobs.Cancel(job->id(), "");
  ASSERT_TRUE(cancelling.ok()) << cancelling.status();
  ASSERT_EQ(cancelling->state(), v1::JOB_STATE_CANCELLING);
  absl::StatusOr<v1::Job> early = jobs.Delete(job->id());
  ASSERT_TRUE(absl::IsFailedPrecondition(early.status())) << early.status();
  EXPECT_NE(early.status().message().find("ithaca wait " + job->id()), std::string::npos)
      << early.status();
  EXPECT_EQ(early.status().message().find("cancel it first"), std::string::npos) << early.status();
  ASSERT_EQ(WaitFor(jobs, job->id(), v1::JOB_STATE_CANCELLED).state(), v1::JOB_STATE_CANCELLED);
}

}  // namespace
}  // namespace ithaca
