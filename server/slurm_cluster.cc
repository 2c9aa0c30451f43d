// The Supervisor's Slurm side (ithacad --cluster slurm): a job goes to Slurm as one batch job
// instead of being forked here, and squeue's answers, polled without the lock held, decide
// what the ranks' own ends cannot (a job Slurm cancelled, kept PENDING or warned).
#include "server/supervisor.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/core/file_util.h"
#include "engine/spec/job_spec.h"
#include "server/auth.h"
#include "launch/connection.h"
#include "launch/exit_codes.h"
#include "launch/layout.h"
#include "launch/worker_contract.h"

namespace ithaca {

absl::Duration Supervisor::PollSlurm() {
  const absl::Time now = absl::Now();
  std::vector<std::pair<std::string, std::string>> due;  // (job id, Slurm job id)
  std::vector<int> cause_grace;  // > 0: also ask why Slurm warned the job, with this grace
  for (auto& [id, job] : active_) {
    if (!job->slurm_id.empty() && now - job->slurm_polled >= options_.cluster_poll_interval) {
      due.emplace_back(id, job->slurm_id);
      cause_grace.push_back(job->slurm_warned && job->warning_cause.empty() && job->slurm.Terminal()
                                ? std::max(job->signal_grace_s, 1)
                                : 0);
    }
  }
  if (due.empty()) return absl::ZeroDuration();
  std::vector<absl::StatusOr<SlurmJobState>> answers;
  std::vector<std::string> causes(due.size());
  const absl::Time unlocked_at = absl::Now();
  mu_.Unlock();  // squeue takes tens of milliseconds: the workers' calls go on meanwhile
  for (size_t i = 0; i < due.size(); ++i) {
    answers.push_back(SlurmQuery(due[i].second, *options_.slurm));
    if (cause_grace[i] > 0) {
      absl::StatusOr<std::string> cause =
          SlurmWarningCause(due[i].second, cause_grace[i], *options_.slurm);
      causes[i] = cause.ok() ? *cause : std::string(cause.status().message());
    }
  }
  const absl::Duration unlocked_for = absl::Now() - unlocked_at;
  mu_.Lock();
  for (size_t i = 0; i < due.size(); ++i) {
    auto it = active_.find(due[i].first);
    if (it == active_.end() || it->second->slurm_id != due[i].second) continue;
    Active& job = *it->second;
    job.slurm_polled = absl::Now();
    if (!causes[i].empty()) job.warning_cause = causes[i];
    if (!answers[i].ok()) {
      std::fprintf(stderr, "ithacad: job %s: %s\n", job.id.c_str(),
                   std::string(answers[i].status().message()).c_str());
      continue;  // Slurm did not answer: its last answer stands
    }
    SlurmJobState st = *answers[i];
    if (!st.known) {  // squeue forgot it and there is no accounting: it ended, how is lost
      st.known = true;
      st.state = "GONE";
      st.reason = "Slurm no longer knows the job";
    }
    if (st.state != job.slurm.state) {
      std::printf("ithacad: job %s: Slurm job %s %s\n", job.id.c_str(), job.slurm_id.c_str(),
                  st.ToString().c_str());
      std::fflush(stdout);
    }
    job.slurm = st;
    if (!job.slurm_running && st.state == "RUNNING") {
      job.slurm_running = true;
      if (!job.running) job.launched = job.slurm_polled;  // the ranks' start timeout from here
    }
  }
  return unlocked_for;
}

void Supervisor::LaunchSlurmLocked(const LaunchOrder& order) {
  auto a = std::make_unique<Active>();
  a->id = order.job_id;
  a->spec_toml = order.spec_toml;
  a->log_dir = order.log_dir;
  a->rendezvous = "tcp: node 0 of the Slurm job";
  auto fail = [&](const std::string& what) {
    owner_->OnEnded(a->id, v1::JOB_STATE_FAILED, absl::StrCat("launch failed: ", what),
                    std::nullopt, /*retryable=*/false);
  };
  absl::StatusOr<JobSpec> spec = ParseJobSpec(order.spec_toml, "job " + a->id);
  if (!spec.ok()) return fail(std::string(spec.status().message()));
  absl::StatusOr<std::string> secret = NewJobSecret();
  if (!secret.ok()) return fail(std::string(secret.status().message()));
  a->secret = *secret;
  const int nodes = static_cast<int>(spec->slurm.nodes);
  const int per_node = static_cast<int>(order.slots.size()) / nodes;
  SlurmSubmission sub;
  sub.job_id = a->id;
  sub.log_dir = a->log_dir;
  sub.worker_binary = options_.worker_binary;
  sub.daemon_address = options_.worker_address;
  sub.nodes = nodes;
  sub.ranks_per_node = per_node;
  sub.gpus = node_.gpu;
  sub.partition = spec->slurm.partition;
  sub.account = spec->slurm.account;
  sub.time_limit = spec->slurm.time_limit;
  sub.constraint = spec->slurm.constraint;
  sub.signal_grace_s = static_cast<int>(spec->slurm.signal_grace);
  a->signal_grace_s = sub.signal_grace_s > 0 ? sub.signal_grace_s : options_.slurm->signal_grace_s;
  sub.env = {{kEnvJobId, a->id}, {kEnvJobSecret, a->secret}};
  if (!options_.worker_token_file.empty()) {
    sub.env.emplace_back(kEnvTokenFile, options_.worker_token_file);
  }
  if (!options_.worker_ca_file.empty()) sub.env.emplace_back(kEnvCa, options_.worker_ca_file);
  if (absl::Status made = MakeDirs(a->log_dir); !made.ok())
    return fail(std::string(made.message()));
  // Where the ranks find this daemon if it restarts elsewhere (another port or host).
  sub.env.emplace_back(kEnvDaemonAddrFile, JobDaemonAddrPath(a->log_dir));
  if (absl::Status wrote =
          WriteFileAtomic(JobDaemonAddrPath(a->log_dir), options_.worker_address + "\n");
      !wrote.ok()) {
    return fail(std::string(wrote.message()));
  }
  // The secret first: a daemon that dies from here on finds it for the ranks' re-attach.
  AdoptionRecord record{a->id,         a->secret,   0,
                        a->rendezvous, order.slots, std::vector<pid_t>(order.slots.size(), 0)};
  if (absl::Status wrote = WriteAdoptionRecord(a->log_dir, record); !wrote.ok()) {
    return fail(std::string(wrote.message()));
  }
  absl::StatusOr<std::string> slurm_id = SlurmSubmit(sub, *options_.slurm);
  if (!slurm_id.ok()) return fail(std::string(slurm_id.status().message()));
  a->slurm_id = *slurm_id;
  a->launched = absl::Now();
  owner_->OnClusterJob(a->id, "slurm:" + a->slurm_id);
  for (size_t r = 0; r < order.slots.size(); ++r) {
    Rank rank;
    rank.remote = true;
    rank.slot = static_cast<int>(r) % per_node;  // its GPU (or CPU slot) on its node
    rank.log = std::make_unique<LogTail>(RankLogPath(a->log_dir, static_cast<int>(r)));
    a->ranks.push_back(std::move(rank));
  }
  owner_->OnLaunched(a->id, order.slots, 0,
                     absl::StrCat("submitted to Slurm as job ", a->slurm_id, ": ", nodes,
                                  nodes == 1 ? " node x " : " nodes x ", per_node,
                                  per_node == 1 ? " rank" : " ranks"));
  active_[a->id] = std::move(a);
}

std::string Supervisor::SlurmSaysLocked(const Active& job) const {
  std::string s = absl::StrCat("Slurm job ", job.slurm_id, " ", job.slurm.ToString());
  const std::string errors = SlurmOutputErrors(job.log_dir, job.slurm_id);
  if (!errors.empty()) absl::StrAppend(&s, ": ", errors);
  return s;
}

bool Supervisor::SlurmDrainedLocked(Active& job, absl::Time now) {
  const bool all_drained = std::all_of(job.ranks.begin(), job.ranks.end(), [](const Rank& x) {
    return x.exit && (x.exit->drained() || x.exit->ok());
  });
  const bool any_drained = std::any_of(job.ranks.begin(), job.ranks.end(),
                                       [](const Rank& x) { return x.exit && x.exit->drained(); });
  if (!all_drained || !any_drained) return false;
  if (job.drained_since == absl::InfiniteFuture()) {
    job.drained_since = now;
    job.slurm_polled = absl::InfinitePast();  // ask Slurm now
  }
  // Slurm's end of the job (and, for its own warning, why it sent it) is the better reason; it
  // comes within a poll or two of the ranks' exits.
  const bool waited = now - job.drained_since > options_.cluster_verdict_wait;
  if (!waited && (!job.slurm.Terminal() || (job.slurm_warned && job.warning_cause.empty()))) {
    return true;  // decided: no rank's end fails it; Slurm's word finishes it
  }
  std::string reason;
  if (job.draining) {
    reason = absl::StrCat("drained by ithacad: checkpointed and stopped; ", SlurmSaysLocked(job),
                          "; it resumes from that checkpoint when it runs again");
  } else {
    reason = absl::StrCat("Slurm's warning (SIGUSR1): ",
                          job.warning_cause.empty() ? "cause unknown" : job.warning_cause,
                          "; checkpointed and stopped, queued again to resume from that "
                          "checkpoint (not a failure: no restart counted); ",
                          SlurmSaysLocked(job));
  }
  EndLocked(job, v1::JOB_STATE_QUEUED, reason, std::nullopt, false);
  return true;
}

bool Supervisor::SlurmVerdictLocked(Active& job, absl::Time now) {
  const std::string& state = job.slurm.state;
  if (state == "PENDING" && now - job.launched > options_.start_timeout) {
    // Waiting for its turn (Resources, Priority) is Slurm's business; waiting for a node that
    // is down or not responding may be forever.
    const std::string& why = job.slurm.reason;
    if (absl::StrContains(why, "ReqNodeNotAvail") || absl::StrContains(why, "NodeDown") ||
        absl::StrContains(why, "Nodes_required") || absl::StrContains(why, "PartitionNodeLimit") ||
        absl::StrContains(why, "BadConstraints") || absl::StrContains(why, "PartitionDown")) {
      EndLocked(job, v1::JOB_STATE_FAILED,
                absl::StrCat("Slurm job ", job.slurm_id, " is still PENDING after ",
                             absl::FormatDuration(now - job.launched), " (reason ", why,
                             "): a node it needs is down or not responding (see sinfo -R)"),
                std::nullopt, false);
      job.retryable = true;
      return true;
    }
    return false;
  }
  if (!job.slurm.Terminal()) return false;
  if (state == "CANCELLED") {
    const std::string reason = absl::StrCat("cancelled in Slurm: ", SlurmSaysLocked(job));
    if (owner_->OnStateChange(job.id, v1::JOB_STATE_CANCELLING, reason).ok()) {
      EndLocked(job, v1::JOB_STATE_CANCELLED, reason, std::nullopt, false);
      return true;
    }
    return false;
  }
  for (const char* lost : {"NODE_FAIL", "TIMEOUT", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}) {
    if (state == lost) {
      EndLocked(job, v1::JOB_STATE_FAILED, SlurmSaysLocked(job), std::nullopt, false);
      job.retryable = true;  // a lost node, a time limit, preemption: another attempt may pass
      return true;
    }
  }
  return false;  // COMPLETED, FAILED, ...: the ranks' own ends say more
}

}  // namespace ithaca
