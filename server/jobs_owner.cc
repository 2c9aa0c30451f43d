// Jobs as the supervisor's JobOwner (supervisor.h): it hands out launches in queue order and
// records what happens to them (launched, running, steps, evals, logs, the end), restarting a
// failed job its retry policy allows and resolving the jobs that wait for it (--after).
#include "server/jobs.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/spec/job_spec.h"
#include "google/protobuf/util/time_util.h"

namespace ithaca {

using google::protobuf::util::TimeUtil;

namespace {

constexpr char kRestartReason[] = "restart ";

}  // namespace

std::vector<LaunchOrder> Jobs::TakeLaunches() {
  MutexLock lock(&mu_);
  if (shutting_down_) return {};      // draining or stopping: queued jobs wait for the next daemon
  if (scheduling_paused_) return {};  // `ithaca drain`: queued jobs wait for the undo
  // Restarted jobs whose backoff is over join the queue (at its end, as a new submission).
  const absl::Time now = absl::Now();
  for (auto it = backing_off_.begin(); it != backing_off_.end();) {
    if (it->second.due > now) {
      ++it;
      continue;
    }
    absl::Status queued = scheduler_.Enqueue(it->first, it->second.world);
    if (!queued.ok()) {
      auto failed =
          store_->Transition(it->first, v1::JOB_STATE_FAILED, std::string(queued.message()));
      if (failed.ok()) PublishState(it->first, *failed);
    }
    it = backing_off_.erase(it);
  }
  std::vector<LaunchOrder> orders;
  for (const Scheduler::Assignment& a : scheduler_.Schedule()) {
    absl::StatusOr<v1::Job> job = store_->Get(a.job_id);
    if (!job.ok()) {
      scheduler_.Release(a.job_id);
      continue;
    }
    orders.push_back({job->id(), job->spec_toml(), job->log_dir(), a.slots});
  }
  return orders;
}

void Jobs::OnClusterJob(const std::string& job_id, const std::string& cluster_job) {
  MutexLock lock(&mu_);
  store_->SetClusterJob(job_id, cluster_job).IgnoreError();
}

void Jobs::OnLaunched(const std::string& job_id, const std::vector<int>& slots, int pgid,
                      const std::string& reason) {
  MutexLock lock(&mu_);
  store_->SetLaunch(job_id, slots, pgid).IgnoreError();
  auto starting = store_->Transition(job_id, v1::JOB_STATE_STARTING, reason);
  if (starting.ok()) {
    PublishState(job_id, *starting);
    // Queue wait: since the job last entered the queue (its submission, or a daemon restart
    // that queued it again to resume), or since the job it waited for (--after) succeeded when
    // that came later: waiting for another job is not waiting for slots.
    int64_t queued_ms = TimeUtil::TimestampToMilliseconds(starting->created_at());
    for (const v1::StateTransition& t : starting->transitions()) {
      if (t.to() == v1::JOB_STATE_QUEUED) queued_ms = TimeUtil::TimestampToMilliseconds(t.time());
    }
    if (!starting->after().empty()) {
      absl::StatusOr<v1::Job> parent = store_->Get(starting->after());
      if (parent.ok()) {
        for (const v1::StateTransition& t : parent->transitions()) {
          if (t.to() == v1::JOB_STATE_SUCCEEDED) {
            queued_ms = std::max(queued_ms, TimeUtil::TimestampToMilliseconds(t.time()));
          }
        }
      }
    }
    const int64_t waited_ms = TimeUtil::TimestampToMilliseconds(starting->updated_at()) - queued_ms;
    metrics_->OnJobStarted(std::max<int64_t>(waited_ms, 0) / 1000.0);
  }
}

absl::StatusOr<v1::Job> Jobs::OnStateChange(const std::string& job_id, JobState to,
                                            const std::string& reason) {
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(v1::Job job, store_->Transition(job_id, to, reason));
  PublishState(job_id, job);
  return job;
}

absl::Status Jobs::OnStep(const std::string& job_id, const v1::StepReport& step) {
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(store_->RecordStep(job_id, step));
  v1::JobEvent e;
  *e.mutable_step() = step;
  EventsLocked(job_id)->Append(std::move(e));
  return absl::OkStatus();
}

absl::Status Jobs::OnEval(const std::string& job_id, const v1::EvalReport& eval) {
  MutexLock lock(&mu_);
  RETURN_IF_ERROR(store_->RecordEval(job_id, eval));
  v1::JobEvent e;
  *e.mutable_eval() = eval;
  EventsLocked(job_id)->Append(std::move(e));
  return absl::OkStatus();
}

void Jobs::OnLogLines(const std::string& job_id, int rank, std::vector<std::string> lines) {
  MutexLock lock(&mu_);
  std::shared_ptr<EventLog> events = EventsLocked(job_id);
  for (std::string& line : lines) {
    v1::JobEvent e;
    e.mutable_log()->set_rank(rank);
    e.mutable_log()->set_text(std::move(line));
    events->Append(std::move(e));
  }
}

bool Jobs::RestartLocked(const std::string& job_id, const std::string& reason) {
  absl::StatusOr<v1::Job> job = store_->Get(job_id);
  if (!job.ok() || shutting_down_) return false;
  absl::StatusOr<JobSpec> spec = ParseJobSpec(job->spec_toml(), "job " + job_id);
  if (!spec.ok()) return false;
  const int restarts = job->restarts();
  if (restarts >= spec->retry.max_restarts) return false;
  const double backoff = spec->retry.backoff_seconds;
  const std::string checkpoint = ResumableCheckpoint(*job);
  auto queued = store_->Transition(
      job_id, v1::JOB_STATE_QUEUED,
      absl::StrCat(kRestartReason, restarts + 1, " of ", spec->retry.max_restarts, " in ", backoff,
                   " s, ", checkpoint.empty() ? "from the start" : "from " + checkpoint,
                   "; after: ", reason),  // which names the rank: failed_rank is for FAILED
      std::nullopt, /*restart=*/true);
  if (!queued.ok()) return false;
  PublishState(job_id, *queued);
  backing_off_[job_id] = {absl::Now() + absl::Seconds(backoff),
                          static_cast<int>(spec->parallel.world)};
  metrics_->OnJobRestarted();
  return true;
}

void Jobs::OnEnded(const std::string& job_id, JobState outcome, const std::string& reason,
                   std::optional<int> failed_rank, bool retryable) {
  {
    MutexLock lock(&mu_);
    scheduler_.Release(job_id);
    // Its [retry] policy may queue it again: the event stream goes on.
    if (retryable && RestartLocked(job_id, reason)) return;
    // Drained (`ithaca drain`, or Slurm's warning before a time limit or a preemption): it
    // checkpointed and stopped, and joins the queue again to resume from that checkpoint, with
    // no restart counted. A daemon that is stopping leaves it queued for the next one.
    if (outcome == v1::JOB_STATE_QUEUED && !shutting_down_) {
      absl::StatusOr<v1::Job> queued = store_->Transition(job_id, outcome, reason);
      if (queued.ok()) {
        PublishState(job_id, *queued);
        absl::StatusOr<JobSpec> spec = ParseJobSpec(queued->spec_toml(), "job " + job_id);
        backing_off_[job_id] = {absl::Now(),
                                spec.ok() ? static_cast<int>(spec->parallel.world) : 1};
        return;
      }
      std::fprintf(stderr, "ithacad: %s\n", queued.status().ToString().c_str());
    }
    auto done = store_->Transition(job_id, outcome, reason, failed_rank);
    if (!done.ok()) {
      std::fprintf(stderr, "ithacad: %s\n", done.status().ToString().c_str());
    } else {
      PublishState(job_id, *done);
    }
    EndEventsLocked(job_id);
    ReleaseCheckpointDirLocked(job_id);
    if (done.ok()) ResolveDependentsLocked(job_id, done->state(), done->reason());
  }
  // A job that waited for this one may start: the supervisor's loop, which called this, takes
  // the launches on its next pass.
  RefreshJobCounts();
}

namespace {

constexpr char kWaitedFor[] = " it waited for (--after) ended ";
constexpr char kChainFirst[] = "; the chain's first job ";

}  // namespace

std::string ChainedCancelReason(const std::string& parent, JobState outcome,
                                const std::string& reason) {
  const std::string head = absl::StrCat("job ", parent, kWaitedFor, JobStateLabel(outcome));
  // The chain's first job and its reason, from the parent's reason: named there already when
  // the parent was cancelled further down a chain, or the parent's own when the parent was
  // cancelled for its first job ("job R it waited for (--after) ended X: r").
  if (const size_t first = reason.find(kChainFirst); first != std::string::npos) {
    return absl::StrCat(head, reason.substr(first));
  }
  if (absl::StartsWith(reason, "job ")) {
    if (const size_t waited = reason.find(kWaitedFor); waited != std::string::npos) {
      return absl::StrCat(head, kChainFirst, reason.substr(4, waited - 4), " ended ",
                          reason.substr(waited + std::strlen(kWaitedFor)));
    }
  }
  return absl::StrCat(head, reason.empty() ? "" : ": ", reason.substr(0, 1024));
}

void Jobs::ResolveDependentsLocked(const std::string& parent, JobState outcome,
                                   const std::string& reason) {
  if (!IsTerminal(outcome)) return;
  std::vector<std::string> children;
  for (const auto& [child, waits_for] : waiting_) {
    if (waits_for == parent) children.push_back(child);
  }
  for (const std::string& child : children) {
    waiting_.erase(child);
    absl::StatusOr<v1::Job> job = store_->Get(child);
    if (!job.ok() || job->state() != v1::JOB_STATE_QUEUED) continue;
    if (outcome == v1::JOB_STATE_SUCCEEDED) {
      absl::Status queued = scheduler_.Enqueue(child, job->spec().world());
      if (!queued.ok()) {
        auto failed =
            store_->Transition(child, v1::JOB_STATE_FAILED, std::string(queued.message()));
        if (failed.ok()) PublishState(child, *failed);
        EndEventsLocked(child);
        ReleaseCheckpointDirLocked(child);
        ResolveDependentsLocked(child, v1::JOB_STATE_FAILED, std::string(queued.message()));
      }
      continue;
    }
    const std::string why = ChainedCancelReason(parent, outcome, reason);
    auto cancelled = store_->Transition(child, v1::JOB_STATE_CANCELLED, why);
    if (cancelled.ok()) PublishState(child, *cancelled);
    EndEventsLocked(child);
    ReleaseCheckpointDirLocked(child);
    ResolveDependentsLocked(child, v1::JOB_STATE_CANCELLED, why);
  }
}

}  // namespace ithaca
