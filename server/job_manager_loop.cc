// JobManager's supervision thread: launches scheduled jobs, reaps and judges workers, enforces
// heartbeats and grace periods, tails logs, and recovers after a restart.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/core/file_util.h"
#include "engine/train/checkpoint.h"
#include "engine/train/job_spec.h"
#include "server/job_manager.h"

namespace ithaca {
namespace {

// Kills processes of `pgid` that are ithaca-workers of `job_id` (left by a daemon that died).
// The environment check keeps a reused process-group id from hitting anything else.
int KillStrayWorkers(int pgid, const std::string& job_id) {
  int killed = 0;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return 0;
  const std::string want = absl::StrCat("ITHACA_JOB_ID=", job_id);
  while (dirent* d = readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(d->d_name, &pid)) continue;
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string line;
    std::getline(stat, line);
    // Fields after the parenthesized command: state ppid pgrp ...
    size_t close_paren = line.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::vector<std::string> f = absl::StrSplit(line.substr(close_paren + 2), ' ');
    int pgrp = 0;
    if (f.size() < 3 || !absl::SimpleAtoi(f[2], &pgrp) || pgrp != pgid) continue;
    std::ifstream env(absl::StrCat("/proc/", pid, "/environ"), std::ios::binary);
    std::string var;
    while (std::getline(env, var, '\0')) {
      if (var == want) {
        kill(pid, SIGKILL);
        ++killed;
        break;
      }
    }
  }
  closedir(proc);
  return killed;
}

}  // namespace

absl::Status JobManager::Start() {
  RETURN_IF_ERROR(MakeDirs(options_.state_dir + "/jobs"));
  RETURN_IF_ERROR(Recover());
  RefreshJobCounts();
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

namespace {

// The newest checkpoint of a job whose spec asks to resume from one; "" when there is none.
std::string ResumableCheckpoint(const v1::Job& job) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(job.spec_toml(), "job.toml");
  if (!spec.ok() || !spec->checkpoint.resume || spec->checkpoint.dir.empty()) return "";
  absl::StatusOr<std::string> latest = LatestCheckpoint(spec->checkpoint.dir);
  return latest.ok() ? *latest : "";
}

}  // namespace

absl::Status JobManager::Recover() {
  ASSIGN_OR_RETURN(
      std::vector<v1::Job> left,
      store_->List({v1::JOB_STATE_STARTING, v1::JOB_STATE_RUNNING, v1::JOB_STATE_CANCELLING}, 0));
  for (const v1::Job& job : left) {
    ASSIGN_OR_RETURN(int pgid, store_->ProcessGroup(job.id()));
    const int killed = pgid > 0 ? KillStrayWorkers(pgid, job.id()) : 0;
    const std::string stray = killed > 0 ? absl::StrCat("; killed ", killed, " stray workers")
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
  std::lock_guard<std::mutex> lock(mu_);
  for (const v1::Job& job : queued) {
    absl::Status st = scheduler_.Enqueue(job.id(), job.spec().world());
    if (!st.ok()) {
      ASSIGN_OR_RETURN(
          v1::Job j, store_->Transition(job.id(), v1::JOB_STATE_FAILED, std::string(st.message())));
    }
  }
  return absl::OkStatus();
}

void JobManager::Shutdown(const std::string& reason) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) return;
  shutting_down_ = true;
  for (auto& [id, job] : active_) {
    if (!job->ending) EndLocked(*job, v1::JOB_STATE_FAILED, reason, std::nullopt, false);
  }
  wake_.notify_all();
  // The loop finalizes jobs as their workers exit; SIGKILL follows the grace period.
  wake_.wait_for(lock, absl::ToChronoNanoseconds(options_.grace_period + absl::Seconds(5)),
                 [this] { return active_.empty() || !thread_.joinable(); });
  stop_ = true;
  for (auto& [id, log] : events_) log->Close();
  wake_.notify_all();
  lock.unlock();
  if (thread_.joinable()) thread_.join();
  // Anything that survived (should be nothing): kill it outright.
  for (auto& [id, job] : active_) Launcher::SignalGroup(job->pgid, SIGKILL);
}

void JobManager::Loop() {
  absl::Time last_tail = absl::InfinitePast();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const absl::Time now = absl::Now();
    if (!shutting_down_) {
      for (const Scheduler::Assignment& a : scheduler_.Schedule()) LaunchLocked(a);
    }
    const bool tail = now - last_tail > absl::Milliseconds(200);
    if (tail) last_tail = now;
    std::vector<std::string> done;
    for (auto& [id, job] : active_) {
      SuperviseLocked(*job, now);
      if (tail) TailLogsLocked(*job, false);
      const bool all_exited = std::all_of(job->ranks.begin(), job->ranks.end(),
                                          [](const Rank& r) { return r.exit.has_value(); });
      if (all_exited) done.push_back(id);
    }
    for (const std::string& id : done) {
      FinalizeLocked(*active_[id]);
      active_.erase(id);
    }
    if (!done.empty()) wake_.notify_all();  // Shutdown waits for active_ to drain
    wake_.wait_for(lock, absl::ToChronoNanoseconds(options_.poll_interval));
  }
}

void JobManager::LaunchLocked(const Scheduler::Assignment& assignment) {
  auto job_or = store_->Get(assignment.job_id);
  if (!job_or.ok()) {
    scheduler_.Release(assignment.job_id);
    return;
  }
  const v1::Job& job = *job_or;
  auto a = std::make_unique<Active>();
  a->id = job.id();
  a->spec_toml = job.spec_toml();
  a->log_dir = job.log_dir();
  // A fresh Gloo FileStore directory for every launch (a job resumed after a daemon restart is
  // launched again, and a store refuses keys that already exist).
  const std::string rdv_dir =
      absl::StrCat(a->log_dir, "/rendezvous-", absl::ToUnixMicros(absl::Now()));
  a->rendezvous = "file:" + rdv_dir;
  LaunchSpec l;
  l.argv = {options_.worker_binary, "--daemon", options_.worker_socket, "--job", a->id};
  l.gpus = assignment.slots;
  l.rendezvous = a->rendezvous;
  l.env = {{"ITHACA_DAEMON_SOCKET", options_.worker_socket}, {"ITHACA_JOB_ID", a->id}};
  for (size_t r = 0; r < assignment.slots.size(); ++r) {
    l.outputs.push_back({Launcher::RankLogPath(a->log_dir, static_cast<int>(r))});
  }
  absl::Status st = MakeDirs(rdv_dir);
  absl::StatusOr<WorkerGroup> group =
      st.ok() ? Launcher::Launch(l) : absl::StatusOr<WorkerGroup>(st);
  if (!group.ok()) {
    scheduler_.Release(a->id);
    auto failed = store_->Transition(a->id, v1::JOB_STATE_FAILED,
                                     absl::StrCat("launch failed: ", group.status().message()));
    if (failed.ok()) PublishState(a->id, *failed);
    EventsLocked(a->id)->Close();
    return;
  }
  a->pgid = group->pgid;
  a->launched = absl::Now();
  for (size_t r = 0; r < group->pids.size(); ++r) {
    Rank rank;
    rank.pid = group->pids[r];
    rank.slot = assignment.slots[r];
    rank.log = std::make_unique<LogTail>(Launcher::RankLogPath(a->log_dir, static_cast<int>(r)));
    a->ranks.push_back(std::move(rank));
  }
  store_->SetLaunch(a->id, assignment.slots, a->pgid).IgnoreError();
  auto starting = store_->Transition(
      a->id, v1::JOB_STATE_STARTING,
      absl::StrCat("launched ", a->ranks.size(),
                   a->ranks.size() > 1 ? " workers on " : " worker on ",
                   options_.node.gpu ? "GPU" : "slot", a->ranks.size() > 1 ? "s " : " ",
                   absl::StrJoin(assignment.slots, ",")));
  if (starting.ok()) PublishState(a->id, *starting);
  active_[a->id] = std::move(a);
}

void JobManager::EndLocked(Active& job, JobState outcome, const std::string& reason,
                           std::optional<int> failed_rank, bool sigkill_now) {
  job.ending = true;
  job.outcome = outcome;
  job.reason = reason;
  job.failed_rank = failed_rank;
  if (sigkill_now) {
    Launcher::SignalGroup(job.pgid, SIGKILL);
    job.killed = true;
  } else {
    Launcher::SignalGroup(job.pgid, SIGTERM);
    job.kill_deadline = absl::Now() + options_.grace_period;
  }
}

void JobManager::SuperviseLocked(Active& job, absl::Time now) {
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    Rank& rank = job.ranks[r];
    if (rank.exit) continue;
    rank.exit = Launcher::Poll(rank.pid);
    if (!rank.exit) continue;
    metrics_->OnWorkerExit(rank.exit->Reason());
    const bool ok = !rank.exit->signaled && rank.exit->code == 0;
    if (!ok && !job.ending) {
      TailLogsLocked(job, true);
      std::string reason = absl::StrCat("rank ", r, " ", rank.exit->Describe());
      if (!rank.last_error.empty()) absl::StrAppend(&reason, ": ", rank.last_error);
      EndLocked(job, v1::JOB_STATE_FAILED, reason, static_cast<int>(r), /*sigkill_now=*/true);
    }
  }
  if (job.ending) {
    if (!job.killed && now >= job.kill_deadline) {
      Launcher::SignalGroup(job.pgid, SIGKILL);
      job.killed = true;
    }
    return;
  }
  const bool all_ok = std::all_of(job.ranks.begin(), job.ranks.end(), [](const Rank& x) {
    return x.exit && !x.exit->signaled && x.exit->code == 0;
  });
  if (all_ok) {
    EndLocked(job, v1::JOB_STATE_SUCCEEDED,
              absl::StrCat("all ", job.ranks.size(), " ranks finished"), std::nullopt, false);
    return;
  }
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    const Rank& rank = job.ranks[r];
    if (rank.exit) continue;
    if (rank.registered && now - rank.last_heartbeat > options_.heartbeat_timeout) {
      metrics_->OnWorkerExit("heartbeat_timeout");
      EndLocked(job, v1::JOB_STATE_FAILED,
                absl::StrCat("rank ", r, " (pid ", rank.pid, ") stopped heart-beating: none for ",
                             absl::FormatDuration(now - rank.last_heartbeat)),
                static_cast<int>(r), true);
      return;
    }
    if (!rank.registered && now - job.launched > options_.start_timeout) {
      EndLocked(job, v1::JOB_STATE_FAILED,
                absl::StrCat("rank ", r, " (pid ", rank.pid, ") did not register within ",
                             absl::FormatDuration(options_.start_timeout)),
                static_cast<int>(r), true);
      return;
    }
  }
}

void JobManager::TailLogsLocked(Active& job, bool flush) {
  std::shared_ptr<EventLog> events = EventsLocked(job.id);
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    for (std::string& line : job.ranks[r].log->ReadLines(flush)) {
      v1::JobEvent e;
      e.mutable_log()->set_rank(static_cast<int32_t>(r));
      e.mutable_log()->set_text(std::move(line));
      events->Append(std::move(e));
    }
  }
}

void JobManager::FinalizeLocked(Active& job) {
  Launcher::SignalGroup(job.pgid, SIGKILL);  // anything a worker may have started
  TailLogsLocked(job, true);
  scheduler_.Release(job.id);
  if (!job.ending) {  // cannot happen: all exited means an outcome was decided
    job.outcome = v1::JOB_STATE_FAILED;
    job.reason = "workers exited";
  }
  auto done = store_->Transition(job.id, job.outcome, job.reason, job.failed_rank);
  if (!done.ok()) {
    std::fprintf(stderr, "ithacad: %s\n", done.status().ToString().c_str());
  } else {
    PublishState(job.id, *done);
  }
  EventsLocked(job.id)->Close();
  metrics_->OnJobFinished(job.id);
  RefreshJobCounts();
}

}  // namespace ithaca
