#include "engine/core/ranks_per_host.h"
#include "server/slurm_cluster.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "engine/core/file_util.h"
#include "engine/spec/job_spec.h"
#include "daemon_link/connection.h"
#include "launch/layout.h"
#include "launch/worker_contract.h"
#include "server/log_files.h"

namespace ithaca {
namespace {

// What the daemon keeps of a job that Slurm runs.
struct SlurmJob : ClusterJobState {
  std::string id;  // Slurm's job id
  // Slurm's newest answer, when it was asked, and whether it has been RUNNING (its ranks'
  // start timeout counts from then).
  SlurmJobState state;
  absl::Time polled = absl::InfinitePast();
  bool running = false;
  // A rank stopped drained without Drain asking: Slurm's warning signal before its time limit
  // or on preemption. Once Slurm's job has ended, `warning_cause` holds why Slurm sent it.
  bool warned = false;
  int signal_grace_s = 0;  // the job's effective --signal grace
  std::string warning_cause;
  absl::Time drained_since = absl::InfiniteFuture();  // every rank had stopped drained
  // A rank's end that waits for Slurm's state to say why (Options::verdict_wait).
  std::optional<int> deferred_culprit;
  absl::Time deferred_since;
};

SlurmJob& Of(SupervisedJob& job) { return static_cast<SlurmJob&>(*job.cluster); }
const SlurmJob& Of(const SupervisedJob& job) { return static_cast<const SlurmJob&>(*job.cluster); }

// The job's --signal grace: its spec's [slurm] signal_grace, else the daemon's default.
int SignalGrace(const JobSpec& spec, const SlurmDefaults& d) {
  return spec.slurm.signal_grace > 0 ? static_cast<int>(spec.slurm.signal_grace) : d.signal_grace_s;
}

}  // namespace

absl::StatusOr<Cluster::Launched> SlurmCluster::Launch(const LaunchOrder& order,
                                                       SupervisedJob& job) {
  job.rendezvous = "tcp: node 0 of the Slurm job";
  ASSIGN_OR_RETURN(JobSpec spec, ParseJobSpec(order.spec_toml, "job " + job.id));
  ASSIGN_OR_RETURN(job.secret, NewJobSecret());
  auto slurm = std::make_unique<SlurmJob>();
  const int nodes = static_cast<int>(spec.slurm.nodes);
  const int per_node = RanksPerHost(static_cast<int64_t>(order.slots.size()), nodes);
  SlurmSubmission sub;
  sub.job_id = job.id;
  sub.log_dir = job.log_dir;
  sub.worker_binary = options_.worker_binary;
  sub.daemon_address = options_.worker_address;
  sub.nodes = nodes;
  sub.ranks_per_node = per_node;
  sub.gpus = options_.gpus;
  sub.partition = spec.slurm.partition;
  sub.account = spec.slurm.account;
  sub.time_limit = spec.slurm.time_limit;
  sub.constraint = spec.slurm.constraint;
  sub.signal_grace_s = static_cast<int>(spec.slurm.signal_grace);
  slurm->signal_grace_s = SignalGrace(spec, options_.slurm);
  sub.env = {{kEnvJobId, job.id}, {kEnvJobSecret, job.secret}};
  if (!options_.worker_token_file.empty()) {
    sub.env.emplace_back(kEnvTokenFile, options_.worker_token_file);
  }
  if (!options_.worker_ca_file.empty()) sub.env.emplace_back(kEnvCa, options_.worker_ca_file);
  RETURN_IF_ERROR(MakeJobsDir(job.log_dir, std::nullopt));  // the ranks run as this daemon's user
  // Where the ranks find this daemon if it restarts elsewhere (another port or host).
  sub.env.emplace_back(kEnvDaemonAddrFile, JobDaemonAddrPath(job.log_dir));
  RETURN_IF_ERROR(WriteFileAtomic(JobDaemonAddrPath(job.log_dir), options_.worker_address + "\n"));
  // The secret first: a daemon that dies from here on finds it for the ranks' re-attach.
  AdoptionRecord record{job.id,         job.secret,  0,
                        job.rendezvous, order.slots, std::vector<pid_t>(order.slots.size(), 0)};
  RETURN_IF_ERROR(WriteAdoptionRecord(job.log_dir, record));
  ASSIGN_OR_RETURN(slurm->id, SlurmSubmit(sub, options_.slurm));
  job.launched = absl::Now();
  for (size_t r = 0; r < order.slots.size(); ++r) {
    SupervisedRank rank;
    rank.remote = true;
    rank.slot = static_cast<int>(r) % per_node;  // its GPU (or CPU slot) on its node
    rank.log = std::make_unique<LogTail>(RankLogPath(job.log_dir, static_cast<int>(r)));
    job.ranks.push_back(std::move(rank));
  }
  Launched launched;
  launched.reason = absl::StrCat("submitted to Slurm as job ", slurm->id, ": ", nodes,
                                 nodes == 1 ? " node x " : " nodes x ", per_node,
                                 per_node == 1 ? " rank" : " ranks");
  launched.cluster_job = "slurm:" + slurm->id;
  job.cluster = std::move(slurm);
  return launched;
}

void SlurmCluster::Adopt(const AdoptOrder& order, SupervisedJob& job) {
  auto slurm = std::make_unique<SlurmJob>();
  slurm->id = order.slurm_id;
  slurm->running = !order.slurm_id.empty() && order.running;
  absl::StatusOr<JobSpec> spec = ParseJobSpec(order.spec_toml, "job " + order.job_id);
  slurm->signal_grace_s =
      spec.ok() ? SignalGrace(*spec, options_.slurm) : options_.slurm.signal_grace_s;
  job.cluster = std::move(slurm);
  for (SupervisedRank& rank : job.ranks) rank.remote = true;
  // The ranks read it before each re-attach: this daemon may listen elsewhere than the last.
  absl::Status wrote =
      WriteFileAtomic(JobDaemonAddrPath(job.log_dir), options_.worker_address + "\n");
  if (!wrote.ok()) {
    std::fprintf(stderr, "ithacad: job %s: %s\n", job.id.c_str(),
                 std::string(wrote.message()).c_str());
  }
}

absl::Duration SlurmCluster::Poll(Mutex& mu, SupervisedJobs& jobs) {
  const absl::Time now = absl::Now();
  std::vector<std::pair<std::string, std::string>> due;  // (job id, Slurm job id)
  std::vector<int> cause_grace;  // > 0: also ask why Slurm warned the job, with this grace
  for (auto& [id, job] : jobs) {
    const SlurmJob& s = Of(*job);
    if (now - s.polled >= options_.poll_interval) {
      due.emplace_back(id, s.id);
      cause_grace.push_back(s.warned && s.warning_cause.empty() && s.state.Terminal()
                                ? std::max(s.signal_grace_s, 1)
                                : 0);
    }
  }
  if (due.empty()) return absl::ZeroDuration();
  std::vector<absl::StatusOr<SlurmJobState>> answers;
  std::vector<std::string> causes(due.size());
  const absl::Time unlocked_at = absl::Now();
  mu.Unlock();  // squeue takes tens of milliseconds: the workers' calls go on meanwhile
  for (size_t i = 0; i < due.size(); ++i) {
    answers.push_back(SlurmQuery(due[i].second, options_.slurm));
    if (cause_grace[i] > 0) {
      absl::StatusOr<std::string> cause =
          SlurmWarningCause(due[i].second, cause_grace[i], options_.slurm);
      causes[i] = cause.ok() ? *cause : std::string(cause.status().message());
    }
  }
  const absl::Duration unlocked_for = absl::Now() - unlocked_at;
  mu.Lock();
  for (size_t i = 0; i < due.size(); ++i) {
    auto it = jobs.find(due[i].first);
    if (it == jobs.end() || Of(*it->second).id != due[i].second) continue;
    SupervisedJob& job = *it->second;
    SlurmJob& s = Of(job);
    s.polled = absl::Now();
    if (!causes[i].empty()) s.warning_cause = causes[i];
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
    if (st.state != s.state.state) {
      std::printf("ithacad: job %s: Slurm job %s %s\n", job.id.c_str(), s.id.c_str(),
                  st.ToString().c_str());
      std::fflush(stdout);
    }
    s.state = st;
    if (!s.running && st.state == "RUNNING") {
      s.running = true;
      if (!job.running) job.launched = s.polled;  // the ranks' start timeout from here
    }
  }
  return unlocked_for;
}

std::optional<WorkerEnd> SlurmCluster::RankEnd(const SupervisedJob& job, SupervisedRank& rank,
                                               absl::Time now) {
  if (rank.announced_exit) return *rank.announced_exit;
  // The Slurm job is over (or, once stopping, Slurm never said so) and the rank said nothing.
  if (Of(job).state.Terminal() || (job.ending && now > job.kill_deadline)) {
    rank.vanished = true;
    return WorkerEnd{true, SIGKILL};
  }
  return std::nullopt;
}

bool SlurmCluster::DrainedByCluster(SupervisedJob& job) {
  Of(job).warned = true;  // Slurm's warning reached the rank
  return true;
}

Cluster::Judgement SlurmCluster::Judge(SupervisedJob& job, std::optional<size_t>* culprit,
                                       absl::Time now, ClusterVerdict* verdict) {
  SlurmJob& s = Of(job);
  if (!*culprit && (job.draining || s.warned)) {
    const Judgement drained = DrainedJudgement(job, now, verdict);
    if (drained != Judgement::kRanksDecide) return drained;
  }
  if (std::optional<ClusterVerdict> v = SlurmVerdict(job, now)) {
    *verdict = *v;
    return Judgement::kDecided;
  }
  // A rank's end may be Slurm's doing (scancel, a time limit, preemption, a lost node: SIGTERM
  // to one node's launcher, and the other nodes' ranks fail on the broken collective): Slurm's
  // state says so a moment later, and is the better reason. Until it does (or the wait is
  // over), no rank's end decides the job.
  if (*culprit && !s.deferred_culprit && !job.ranks[**culprit].vanished) {
    s.deferred_culprit = static_cast<int>(**culprit);
    s.deferred_since = now;
    s.polled = absl::InfinitePast();
  }
  if (s.deferred_culprit) {
    if (s.state.Terminal() || now - s.deferred_since > options_.verdict_wait) {
      // The cause: a rank its node's launcher saw killed, else one gone without a word, over
      // the first one that reported an error (often a peer's broken collective).
      *culprit = static_cast<size_t>(*s.deferred_culprit);
      std::optional<size_t> killed, gone;
      for (size_t r = 0; r < job.ranks.size(); ++r) {
        const SupervisedRank& x = job.ranks[r];
        if (!x.exit || !x.exit->signaled) continue;
        std::optional<size_t>& first = x.vanished ? gone : killed;
        if (!first) first = r;
      }
      if (killed || gone) *culprit = killed ? *killed : *gone;
    } else {
      culprit->reset();
    }
  }
  return Judgement::kRanksDecide;
}

Cluster::Judgement SlurmCluster::DrainedJudgement(SupervisedJob& job, absl::Time now,
                                                  ClusterVerdict* verdict) {
  SlurmJob& s = Of(job);
  const bool all_drained = std::all_of(
      job.ranks.begin(), job.ranks.end(),
      [](const SupervisedRank& x) { return x.exit && (x.exit->drained() || x.exit->ok()); });
  const bool any_drained =
      std::any_of(job.ranks.begin(), job.ranks.end(),
                  [](const SupervisedRank& x) { return x.exit && x.exit->drained(); });
  if (!all_drained || !any_drained) return Judgement::kRanksDecide;
  if (s.drained_since == absl::InfiniteFuture()) {
    s.drained_since = now;
    s.polled = absl::InfinitePast();  // ask Slurm now
  }
  // Slurm's end of the job (and, for its own warning, why it sent it) is the better reason; it
  // comes within a poll or two of the ranks' exits.
  const bool waited = now - s.drained_since > options_.verdict_wait;
  if (!waited && (!s.state.Terminal() || (s.warned && s.warning_cause.empty()))) {
    return Judgement::kWait;  // decided: no rank's end fails it; Slurm's word finishes it
  }
  verdict->outcome = v1::JOB_STATE_QUEUED;
  if (job.draining) {
    verdict->reason = absl::StrCat("drained by ithacad: checkpointed and stopped; ", Says(job),
                                   "; it resumes from that checkpoint when it runs again");
  } else {
    verdict->reason = absl::StrCat(
        "Slurm's warning (SIGUSR1): ", s.warning_cause.empty() ? "cause unknown" : s.warning_cause,
        "; checkpointed and stopped, queued again to resume from "
        "that checkpoint (not a failure: no restart counted); ",
        Says(job));
  }
  return Judgement::kDecided;
}

std::optional<ClusterVerdict> SlurmCluster::SlurmVerdict(const SupervisedJob& job,
                                                         absl::Time now) const {
  const SlurmJob& s = Of(job);
  const std::string& state = s.state.state;
  ClusterVerdict v;
  if (state == "PENDING" && now - job.launched > options_.start_timeout) {
    // Waiting for its turn (Resources, Priority) is Slurm's business; waiting for a node that
    // is down or not responding may be forever.
    const std::string& why = s.state.reason;
    if (absl::StrContains(why, "ReqNodeNotAvail") || absl::StrContains(why, "NodeDown") ||
        absl::StrContains(why, "Nodes_required") || absl::StrContains(why, "PartitionNodeLimit") ||
        absl::StrContains(why, "BadConstraints") || absl::StrContains(why, "PartitionDown")) {
      v.reason = absl::StrCat("Slurm job ", s.id, " is still PENDING after ",
                              absl::FormatDuration(now - job.launched), " (reason ", why,
                              "): a node it needs is down or not responding (see sinfo -R)");
      v.retryable = true;
      return v;
    }
    return std::nullopt;
  }
  if (!s.state.Terminal()) return std::nullopt;
  if (state == "CANCELLED") {
    v.outcome = v1::JOB_STATE_CANCELLED;
    v.reason = absl::StrCat("cancelled in Slurm: ", Says(job));
    v.cancelling_first = true;
    return v;
  }
  for (const char* lost : {"NODE_FAIL", "TIMEOUT", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}) {
    if (state == lost) {
      v.reason = Says(job);
      v.retryable = true;  // a lost node, a time limit, preemption: another attempt may pass
      return v;
    }
  }
  return std::nullopt;  // COMPLETED, FAILED, ...: the ranks' own ends say more
}

bool SlurmCluster::Started(const SupervisedJob& job) const { return Of(job).running; }

void SlurmCluster::Stop(SupervisedJob& job, JobState outcome, bool now) {
  SlurmJob& s = Of(job);
  // Slurm stops its tasks (SIGTERM to each step, SIGKILL after its KillWait); the ranks'
  // announced exits, or the job's end in squeue, finish the job here.
  if ((outcome == v1::JOB_STATE_FAILED || outcome == v1::JOB_STATE_CANCELLED) &&
      !s.state.Terminal()) {
    absl::Status cancelled = SlurmCancel(s.id, 0, options_.slurm);
    if (!cancelled.ok()) {
      std::fprintf(stderr, "ithacad: job %s: %s\n", job.id.c_str(),
                   std::string(cancelled.message()).c_str());
    }
  }
  job.killed = true;
  job.kill_deadline = absl::Now() + options_.grace_period + absl::Seconds(60);
  s.polled = absl::InfinitePast();  // look again now
}

void SlurmCluster::Kill(SupervisedJob& job) {}  // nothing of it runs here; Stop asked Slurm

absl::Status SlurmCluster::Drain(SupervisedJob& job) {
  // A Slurm job's ranks are on its nodes: Slurm signals them, as its own warning does.
  return SlurmCancel(Of(job).id, SIGUSR1, options_.slurm);
}

std::string SlurmCluster::Says(const SupervisedJob& job) const {
  const SlurmJob& s = Of(job);
  std::string says = absl::StrCat("Slurm job ", s.id, " ", s.state.ToString());
  const std::string errors = SlurmOutputErrors(job.log_dir, s.id);
  if (!errors.empty()) absl::StrAppend(&says, ": ", errors);
  return says;
}

std::string SlurmCluster::VanishedReason(const SupervisedJob& job, size_t rank) const {
  // "ranks 2, 3": the ranks of the job that never registered.
  std::vector<int> missing;
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    if (!job.ranks[r].registered && !job.ranks[r].adopted) missing.push_back(static_cast<int>(r));
  }
  const SupervisedRank& x = job.ranks[rank];
  return absl::StrCat(
      missing.empty() ? absl::StrCat("rank ", rank, x.node.empty() ? "" : " (node " + x.node + ")",
                                     " did not report its end")
                      : absl::StrCat(missing.size() == 1 ? "rank " : "ranks ",
                                     absl::StrJoin(missing, ", "), " never started"),
      " before the Slurm job ended: ", Says(job));
}

std::string SlurmCluster::RunningWhere(const SupervisedJob& job) const {
  // "ranks 0-1 on n1, 2-3 on n2": the nodes the job runs on, in its history.
  std::vector<std::string> parts;
  for (size_t i = 0; i < job.ranks.size();) {
    size_t j = i;
    while (j + 1 < job.ranks.size() && job.ranks[j + 1].node == job.ranks[i].node) ++j;
    parts.push_back(absl::StrCat(i == j ? std::to_string(i) : absl::StrCat(i, "-", j), " on ",
                                 job.ranks[i].node.empty() ? "?" : job.ranks[i].node));
    i = j + 1;
  }
  return absl::StrCat(" (Slurm job ", Of(job).id, ": ranks ", absl::StrJoin(parts, ", "), ")");
}

}  // namespace ithaca
