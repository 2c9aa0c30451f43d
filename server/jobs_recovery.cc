// Jobs across a daemon's stop and start: drain (checkpoint and stop), detach (leave the workers
// running for the next daemon), shutdown, and Recover, which adopts the running jobs a previous
// daemon left, or queues them again from their newest checkpoint.
#include "server/jobs.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/match.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/spec/job_spec.h"

namespace ithaca {

std::vector<std::string> Jobs::ResumableRunningLocked(std::vector<std::string>* others,
                                                      JobState state) {
  std::vector<std::string> resumable;
  absl::StatusOr<std::vector<v1::Job>> running = store_->List({state}, 0);
  for (const v1::Job& job : running.ok() ? *running : std::vector<v1::Job>()) {
    absl::StatusOr<JobSpec> spec = ParseJobSpec(job.spec_toml(), "job " + job.id());
    if (spec.ok() && spec->checkpoint.resume && !spec->checkpoint.dir.empty()) {
      resumable.push_back(job.id());
    } else if (others != nullptr) {
      others->push_back(job.id());
    }
  }
  return resumable;
}

int Jobs::Drain(absl::Duration timeout) {
  std::vector<std::string> resumable;
  {
    MutexLock lock(&mu_);
    shutting_down_ = true;  // no new submissions, no new launches
    resumable = ResumableRunningLocked(nullptr);
  }
  return supervisor_.Drain(resumable, timeout);
}

v1::DrainResponse Jobs::DrainNode(bool undo, absl::Duration timeout,
                                  std::function<bool()> cancelled) {
  v1::DrainResponse response;
  std::vector<std::string> resumable, others, starting;
  const absl::Time deadline = absl::Now() + timeout;
  {
    MutexLock lock(&mu_);
    scheduling_paused_ = !undo;
    if (!undo) {
      resumable = ResumableRunningLocked(&others);
      // Jobs still starting (under Slurm: pending) would run on while scheduling is paused
      // (issue 43 N9): drained too, once they run, within the same timeout.
      starting = ResumableRunningLocked(&others, v1::JOB_STATE_STARTING);
    }
  }
  auto gone = [&] { return cancelled && cancelled(); };
  while (!starting.empty() && absl::Now() < deadline && !gone()) {
    std::vector<std::string> still;
    for (const std::string& id : starting) {
      absl::StatusOr<v1::Job> job = Get(id);
      if (!job.ok() || IsTerminal(job->state())) continue;
      if (job->state() == v1::JOB_STATE_RUNNING) {
        resumable.push_back(id);
      } else {
        still.push_back(id);
      }
    }
    starting = std::move(still);
    if (!starting.empty()) absl::SleepFor(absl::Milliseconds(100));
  }
  // Not running by the deadline: listed, not silently left out.
  others.insert(others.end(), starting.begin(), starting.end());
  std::printf("ithacad: scheduling %s\n", undo ? "resumed (drain undone)" : "paused (drain)");
  std::fflush(stdout);
  if (undo) {
    supervisor_.Wake();  // the queue starts now
  } else {
    // The supervisor reports each drained job QUEUED (OnEnded), which queues it again: it waits
    // there, as every queued job does, for the undo.
    supervisor_.Drain(resumable, std::max(absl::ZeroDuration(), deadline - absl::Now()), cancelled);
  }
  MutexLock lock(&mu_);
  for (const std::string& id : resumable) {
    absl::StatusOr<v1::Job> job = store_->Get(id);
    if (job.ok() && job->state() == v1::JOB_STATE_QUEUED) {
      response.add_drained(id);
    } else {
      others.push_back(id);
    }
  }
  for (const std::string& id : others) response.add_still_running(id);
  response.set_scheduling_paused(scheduling_paused_);
  return response;
}

int Jobs::Detach() {
  {
    MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  const int left = supervisor_.Detach();
  MutexLock lock(&mu_);
  for (auto& [id, log] : events_) log->Close();
  return left;
}

void Jobs::Shutdown(const std::string& reason) {
  {
    MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  supervisor_.Shutdown(reason);
  MutexLock lock(&mu_);
  for (auto& [id, log] : events_) log->Close();
}

std::string Jobs::ResumableCheckpoint(const v1::Job& job) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(job.spec_toml(), "job.toml");
  if (!spec.ok() || !spec->checkpoint.resume || spec->checkpoint.dir.empty()) return "";
  absl::StatusOr<std::string> latest = LatestCheckpoint(spec->checkpoint.dir);
  return latest.ok() ? *latest : "";
}

std::optional<AdoptOrder> Jobs::AdoptableLocked(const v1::Job& job, std::string* why_not) {
  absl::StatusOr<AdoptionRecord> record = ReadAdoptionRecord(job.log_dir());
  if (!record.ok() || record->job_id != job.id()) return std::nullopt;
  std::string slurm_id;
  if (absl::StartsWith(job.cluster_job(), kSlurmPrefix)) {
    // A Slurm job: Slurm says whether it still runs; its ranks re-attach over TCP.
    slurm_id = job.cluster_job().substr(strlen(kSlurmPrefix));
    if (!options_.supervisor.slurm) {
      *why_not = absl::StrCat("; Slurm job ", slurm_id,
                              " left to Slurm (this ithacad runs "
                              "without --cluster slurm)");
      return std::nullopt;
    }
    absl::StatusOr<SlurmJobState> st = SlurmQuery(slurm_id, *options_.supervisor.slurm);
    if (!st.ok() || !st->Active()) {
      *why_not = absl::StrCat("; Slurm job ", slurm_id, " ",
                              st.ok() ? st->ToString() : std::string(st.status().message()));
      return std::nullopt;
    }
    if (job.state() == v1::JOB_STATE_CANCELLING) {
      SlurmCancel(slurm_id, 0, *options_.supervisor.slurm).IgnoreError();
      *why_not = absl::StrCat("; scancel of Slurm job ", slurm_id);
      return std::nullopt;
    }
    std::printf("ithacad: adopting job %s (%s): Slurm job %s is %s\n", job.id().c_str(),
                JobStateLabel(job.state()).c_str(), slurm_id.c_str(), st->ToString().c_str());
  } else if (options_.supervisor.slurm) {
    // Workers a daemon without --cluster slurm started here: this one runs jobs through Slurm
    // only, so they are not adopted (Recover stops them and resumes or fails the job).
    *why_not =
        "; its workers were started on this node, and this ithacad runs with --cluster slurm";
    return std::nullopt;
  } else {
    if (job.state() == v1::JOB_STATE_CANCELLING) return std::nullopt;  // finish the cancel
    int alive = 0;
    for (pid_t pid : record->pids) alive += IsWorkerOf(pid, job.id(), record->secret) ? 1 : 0;
    if (alive == 0) return std::nullopt;  // really gone: resumed or failed by Recover
    std::printf("ithacad: adopting job %s (%s): %d of %zu workers still run\n", job.id().c_str(),
                JobStateLabel(job.state()).c_str(), alive, record->pids.size());
  }
  if (!scheduler_.Reserve(job.id(), record->slots).ok()) return std::nullopt;
  std::fflush(stdout);
  AdoptOrder order{job.id(), job.spec_toml(), job.log_dir(), *std::move(record),
                   job.state() == v1::JOB_STATE_RUNNING};
  order.slurm_id = slurm_id;
  // From the history, not the job's last_steps: a daemon killed inside RecordStep may have
  // written the one and not the other, and the report the rank re-sends must reach the history.
  order.last_steps.assign(order.record.pids.size(), 0);
  absl::StatusOr<std::vector<v1::JobEvent>> history = store_->History(job.id());
  for (const v1::JobEvent& e : history.ok() ? *history : std::vector<v1::JobEvent>()) {
    const int rank = e.step().rank();
    if (e.has_step() && rank >= 0 && rank < static_cast<int>(order.last_steps.size())) {
      order.last_steps[rank] = std::max(order.last_steps[rank], e.step().step());
    }
  }
  return order;
}

absl::Status Jobs::Recover() {
  ASSIGN_OR_RETURN(
      std::vector<v1::Job> left,
      store_->List({v1::JOB_STATE_STARTING, v1::JOB_STATE_RUNNING, v1::JOB_STATE_CANCELLING}, 0));
  for (const v1::Job& job : left) {
    // Workers outlive the daemon that launched them: take them over when they still run (the
    // supervisor's thread is not started yet; it rechecks every rank on its first look).
    std::optional<AdoptOrder> adopt;
    std::string why_not;  // a Slurm job's state
    {
      MutexLock lock(&mu_);
      adopt = AdoptableLocked(job, &why_not);
    }
    if (adopt) {
      // The adopted job still writes into its checkpoint.dir: no new job may share it.
      if (!job.spec().checkpoint_dir().empty()) {
        MutexLock lock(&mu_);
        ClaimCheckpointDirLocked(job.spec().checkpoint_dir(), job.id()).IgnoreError();
      }
      supervisor_.Adopt(*adopt);
      continue;
    }
    ASSIGN_OR_RETURN(int pgid, store_->ProcessGroup(job.id()));
    const int killed = pgid > 0 ? Supervisor::KillStrayWorkers(pgid, job.id()) : 0;
    const std::string stray = !why_not.empty() ? why_not
                              : killed > 0     ? absl::StrCat("; killed ", killed, " stray workers")
                                               : "; its workers were gone";
    if (job.state() == v1::JOB_STATE_CANCELLING) {
      ASSIGN_OR_RETURN(v1::Job j, store_->Transition(job.id(), v1::JOB_STATE_CANCELLED,
                                                     "daemon restarted while cancelling" + stray));
    } else if (std::string checkpoint = ResumableCheckpoint(job); !checkpoint.empty()) {
      // The spec asks to resume, and there is a checkpoint: queue the job again; its workers
      // pick the checkpoint up themselves (engine/train/trainer.cc).
      ASSIGN_OR_RETURN(v1::Job j,
                       store_->Transition(job.id(), v1::JOB_STATE_QUEUED,
                                          absl::StrCat("daemon restarted while the job was ",
                                                       JobStateLabel(job.state()), stray,
                                                       "; resuming from ", checkpoint)));
    } else {
      ASSIGN_OR_RETURN(v1::Job j,
                       store_->Transition(job.id(), v1::JOB_STATE_FAILED,
                                          absl::StrCat("daemon restarted while the job was ",
                                                       JobStateLabel(job.state()), stray)));
    }
  }
  ASSIGN_OR_RETURN(std::vector<v1::Job> queued, store_->List({v1::JOB_STATE_QUEUED}, 0));
  std::reverse(queued.begin(), queued.end());  // oldest first
  MutexLock lock(&mu_);
  for (const v1::Job& job : queued) {
    // Waiting for another job (submit --after): by what that job has become meanwhile.
    if (!job.after().empty()) {
      absl::StatusOr<v1::Job> parent = store_->Get(job.after());
      const JobState ps = parent.ok() ? parent->state() : v1::JOB_STATE_CANCELLED;
      if (ps != v1::JOB_STATE_SUCCEEDED) {
        if (!job.spec().checkpoint_dir().empty()) {
          ClaimCheckpointDirLocked(job.spec().checkpoint_dir(), job.id()).IgnoreError();
        }
        waiting_[job.id()] = job.after();
        if (IsTerminal(ps)) {
          ResolveDependentsLocked(job.after(), ps,
                                  parent.ok() ? parent->reason() : "it no longer exists");
        }
        continue;
      }
    }
    absl::Status st = scheduler_.Enqueue(job.id(), job.spec().world());
    if (st.ok() && !job.spec().checkpoint_dir().empty()) {
      st = ClaimCheckpointDirLocked(job.spec().checkpoint_dir(), job.id());
      if (!st.ok()) scheduler_.Remove(job.id());
    }
    if (!st.ok()) {
      ASSIGN_OR_RETURN(
          v1::Job j, store_->Transition(job.id(), v1::JOB_STATE_FAILED, std::string(st.message())));
    }
  }
  return absl::OkStatus();
}

}  // namespace ithaca
