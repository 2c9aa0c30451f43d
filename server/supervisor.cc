#include "server/supervisor.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/core/file_util.h"
#include "engine/spec/job_spec.h"
#include "server/auth.h"
#include "server/local_cluster.h"
#include "server/slurm_cluster.h"
#include "launch/exit_codes.h"
#include "launch/layout.h"
#include "launch/worker_contract.h"

namespace ithaca {

namespace {

std::unique_ptr<Cluster> MakeCluster(const Supervisor::Options& o, const Node& node) {
  if (o.slurm) {
    SlurmCluster::Options s;
    s.slurm = *o.slurm;
    s.worker_binary = o.worker_binary;
    s.worker_address = o.worker_address;
    s.worker_token_file = o.worker_token_file;
    s.worker_ca_file = o.worker_ca_file;
    s.gpus = node.gpu;
    s.poll_interval = o.cluster_poll_interval;
    s.verdict_wait = o.cluster_verdict_wait;
    s.start_timeout = o.start_timeout;
    s.grace_period = o.grace_period;
    return std::make_unique<SlurmCluster>(std::move(s));
  }
  LocalCluster::Options l;
  l.worker_binary = o.worker_binary;
  l.worker_socket = o.worker_socket;
  l.run_as = o.run_as;
  l.grace_period = o.grace_period;
  return std::make_unique<LocalCluster>(std::move(l), node);
}

// Whether a job's ranks run on GPUs (a stored spec always parses; one that does not is not).
bool SpecRunsOnCuda(const std::string& spec_toml) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(spec_toml);
  return spec.ok() && spec->backend == "cuda";
}

}  // namespace

Supervisor::Supervisor(Options options, Node node, JobOwner* owner, Metrics* metrics)
    : options_(std::move(options)),
      node_(std::move(node)),
      owner_(owner),
      metrics_(metrics),
      cluster_(MakeCluster(options_, node_)) {}

Supervisor::~Supervisor() { Shutdown("daemon stopped"); }

void Supervisor::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Supervisor::Wake() {
  // Taking the lock first means the thread is waiting (not half-way through a tick that already
  // asked for launches), so this wake-up is not lost.
  MutexLock lock(&mu_);
  wake_.SignalAll();
}

int Supervisor::running_jobs() {
  MutexLock lock(&mu_);
  return static_cast<int>(active_.size());
}

Supervisor::ClusterJobs Supervisor::cluster_jobs() {
  if (!cluster_->Schedules()) return {};  // a node's own jobs are all running
  MutexLock lock(&mu_);
  ClusterJobs c;
  for (const auto& [id, job] : active_) {
    ++(cluster_->Started(*job) ? c.running : c.pending);
  }
  return c;
}

int Supervisor::KillStrayWorkers(int pgid, const std::string& job_id) {
  int killed = 0;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return 0;
  const std::string want = absl::StrCat(kEnvJobId, "=", job_id);
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

int Supervisor::Drain(const std::vector<std::string>& job_ids, absl::Duration timeout,
                      const std::function<bool()>& cancelled) {
  MutexLock lock(&mu_);
  std::vector<std::string> draining;
  for (const std::string& id : job_ids) {
    auto it = active_.find(id);
    if (it == active_.end() || it->second->ending || !it->second->running) continue;
    SupervisedJob& job = *it->second;
    if (absl::Status sent = cluster_->Drain(job); !sent.ok()) {
      std::fprintf(stderr, "ithacad: drain job %s: %s\n", id.c_str(),
                   std::string(sent.message()).c_str());
      continue;
    }
    job.draining = true;
    draining.push_back(id);
  }
  auto stopped = [&] {
    mu_.AssertHeld();
    for (const std::string& id : draining) {
      if (active_.count(id) > 0) return false;
    }
    return true;
  };
  // In slices, so that a caller gone (an abandoned `ithaca drain`) frees its thread at once
  // (issue 43 N10).
  const absl::Time deadline = absl::Now() + timeout;
  while (!stopped() && absl::Now() < deadline && !(cancelled && cancelled())) {
    const absl::Duration slice = std::min(absl::Milliseconds(100), deadline - absl::Now());
    wake_.WaitFor(&mu_, slice);
  }
  int drained = 0;
  for (const std::string& id : draining) drained += active_.count(id) == 0 ? 1 : 0;
  return drained;
}

int Supervisor::Detach() {
  MutexLock lock(&mu_);
  if (stop_) return 0;
  shutting_down_ = true;
  stop_ = true;
  detached_ = true;
  // Log lines up to now reach the event logs; what follows, the next daemon reads.
  for (auto& [id, job] : active_) TailLogsLocked(*job, false);
  const int left = static_cast<int>(active_.size());
  wake_.SignalAll();
  lock.Release();
  if (thread_.joinable()) thread_.join();
  return left;
}

void Supervisor::Adopt(const AdoptOrder& order) {
  MutexLock lock(&mu_);
  auto a = std::make_unique<SupervisedJob>();
  a->id = order.job_id;
  a->spec_toml = order.spec_toml;
  a->cuda = SpecRunsOnCuda(order.spec_toml);
  a->log_dir = order.log_dir;
  a->rendezvous = order.record.rendezvous;
  a->secret = order.record.secret;
  a->launched = absl::Now();  // the ranks have start_timeout to re-attach
  a->running = order.running;
  for (size_t r = 0; r < order.record.pids.size(); ++r) {
    SupervisedRank rank;
    rank.slot = order.record.slots[r];
    rank.adopted = true;
    if (r < order.last_steps.size()) rank.last_step = order.last_steps[r];
    rank.log = std::make_unique<LogTail>(RankLogPath(a->log_dir, static_cast<int>(r)));
    rank.log->SkipToEnd();
    a->ranks.push_back(std::move(rank));
  }
  cluster_->Adopt(order, *a);
  active_[a->id] = std::move(a);
}

void Supervisor::Shutdown(const std::string& reason) {
  MutexLock lock(&mu_);
  if (stop_) return;
  shutting_down_ = true;
  for (auto& [id, job] : active_) {
    if (!job->ending) EndLocked(*job, v1::JOB_STATE_FAILED, reason, std::nullopt, false);
  }
  wake_.SignalAll();
  // The loop finalizes jobs as their workers exit; SIGKILL follows the grace period.
  const absl::Time deadline = absl::Now() + options_.grace_period + absl::Seconds(5);
  while (!active_.empty() && thread_.joinable() && absl::Now() < deadline) {
    wake_.WaitUntil(&mu_, deadline);
  }
  stop_ = true;
  wake_.SignalAll();
  lock.Release();
  if (thread_.joinable()) thread_.join();
  // Anything that survived (should be nothing): kill it outright.
  MutexLock relock(&mu_);
  for (auto& [id, job] : active_) cluster_->Kill(*job);
}

absl::StatusOr<std::optional<v1::Job>> Supervisor::Cancel(const std::string& job_id,
                                                          const std::string& reason) {
  MutexLock lock(&mu_);
  auto it = active_.find(job_id);
  if (it == active_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no workers"));
  }
  SupervisedJob& a = *it->second;
  // Ranks that exited since the last look decide first: a job whose ranks all finished is
  // SUCCEEDED, not turned CANCELLED by a cancel that arrives during its teardown.
  SuperviseLocked(a, absl::Now());
  if (a.ending) {
    wake_.SignalAll();
    return std::nullopt;  // already failing or finishing: its outcome stands
  }
  ASSIGN_OR_RETURN(v1::Job cancelling,
                   owner_->OnStateChange(job_id, v1::JOB_STATE_CANCELLING, reason));
  EndLocked(a, v1::JOB_STATE_CANCELLED, reason, std::nullopt, /*sigkill_now=*/false);
  wake_.SignalAll();
  return cancelling;
}

void Supervisor::Loop() {
  absl::Time last_tail = absl::InfinitePast();
  absl::Time last_pass = absl::Now();
  MutexLock lock(&mu_);
  while (!stop_) {
    if (!shutting_down_) {
      for (const LaunchOrder& order : owner_->TakeLaunches()) LaunchLocked(order);
    }
    const absl::Duration squeue_took = cluster_->Poll(mu_, active_);
    const absl::Time now = absl::Now();
    ForgiveStallLocked(now, now - last_pass - squeue_took);
    last_pass = now;
    const bool tail = now - last_tail > absl::Milliseconds(200);
    if (tail) last_tail = now;
    std::vector<std::string> done;
    for (auto& [id, job] : active_) {
      SuperviseLocked(*job, now);
      if (tail) TailLogsLocked(*job, false);
      const bool all_exited =
          std::all_of(job->ranks.begin(), job->ranks.end(),
                      [](const SupervisedRank& r) { return r.exit.has_value(); });
      // (A Slurm job whose ranks all ended may still wait for Slurm's word on why.)
      if (all_exited && (job->ending || cluster_->RanksEndTheJob())) done.push_back(id);
    }
    for (const std::string& id : done) {
      FinalizeLocked(*active_[id]);
      active_.erase(id);
    }
    if (!done.empty()) wake_.SignalAll();  // Shutdown waits for active_ to drain
    wake_.WaitFor(&mu_, options_.poll_interval);
  }
}

void Supervisor::LaunchLocked(const LaunchOrder& order) {
  auto a = std::make_unique<SupervisedJob>();
  a->id = order.job_id;
  a->spec_toml = order.spec_toml;
  a->cuda = SpecRunsOnCuda(order.spec_toml);
  a->log_dir = order.log_dir;
  absl::StatusOr<Cluster::Launched> launched = cluster_->Launch(order, *a);
  if (!launched.ok()) {
    owner_->OnEnded(a->id, v1::JOB_STATE_FAILED,
                    absl::StrCat("launch failed: ", launched.status().message()), std::nullopt,
                    /*retryable=*/false);
    return;
  }
  if (!launched->cluster_job.empty()) owner_->OnClusterJob(a->id, launched->cluster_job);
  owner_->OnLaunched(a->id, order.slots, launched->pgid, launched->reason);
  active_[a->id] = std::move(a);
}

void Supervisor::EndLocked(SupervisedJob& job, JobState outcome, const std::string& reason,
                           std::optional<int> failed_rank, bool sigkill_now) {
  job.ending = true;
  job.outcome = outcome;
  job.reason = reason;
  job.failed_rank = failed_rank;
  cluster_->Stop(job, outcome, sigkill_now);
}

void Supervisor::ForgiveStallLocked(absl::Time now, absl::Duration since_last_pass) {
  // The ranks' silence is judged only over time this daemon was listening. When the pass comes
  // late (the lock was held through a slow store write, the daemon got no CPU), heartbeats
  // queued behind it were not yet taken: the time beyond the poll interval is not the ranks'.
  const absl::Duration stalled = since_last_pass - options_.poll_interval;
  if (stalled < kStallForgiven || active_.empty()) return;
  std::printf(
      "ithacad: the supervisor was held up %s; the ranks' heartbeat and start clocks "
      "skip it\n",
      absl::FormatDuration(absl::Trunc(stalled, absl::Milliseconds(1))).c_str());
  std::fflush(stdout);
  for (auto& [id, job] : active_) {
    job->launched = std::min(now, job->launched + stalled);
    for (SupervisedRank& rank : job->ranks) {
      rank.last_heartbeat = std::min(now, rank.last_heartbeat + stalled);
    }
  }
}

void Supervisor::SuperviseLocked(SupervisedJob& job, absl::Time now) {
  // Every rank that ended since the last look, before naming one: when a rank dies, its peers
  // fail soon after on the broken connection, and one look may find them all ended. The cause
  // is a rank ended by a signal (killed, crashed) over one that exited with an error, else the
  // lowest failed rank.
  std::optional<size_t> culprit;
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    SupervisedRank& rank = job.ranks[r];
    if (rank.exit) continue;
    rank.exit = cluster_->RankEnd(job, rank, now);
    if (!rank.exit) continue;
    metrics_->OnWorkerExit(rank.exit->Reason());
    // Drained is not a failure when Drain asked for it, or the cluster did (Slurm's warning).
    const bool drained = rank.exit->drained() && (job.draining || cluster_->DrainedByCluster(job));
    const bool ok = rank.exit->ok() || drained;
    if (!ok && (!culprit || (rank.exit->signaled && !job.ranks[*culprit].exit->signaled))) {
      culprit = r;
    }
  }
  if (!job.ending) {
    ClusterVerdict verdict;
    switch (cluster_->Judge(job, &culprit, now, &verdict)) {
      case Cluster::Judgement::kRanksDecide:
        break;
      case Cluster::Judgement::kWait:
        return;
      case Cluster::Judgement::kDecided:
        if (verdict.cancelling_first &&
            !owner_->OnStateChange(job.id, v1::JOB_STATE_CANCELLING, verdict.reason).ok()) {
          return;  // the owner refused the change: look again next time
        }
        EndLocked(job, verdict.outcome, verdict.reason, std::nullopt, false);
        job.retryable = verdict.retryable;
        return;
    }
  }
  if (culprit && !job.ending) {
    const SupervisedRank& rank = job.ranks[*culprit];
    TailLogsLocked(job, true);
    std::string reason =
        rank.vanished
            ? cluster_->VanishedReason(job, *culprit)
            : absl::StrCat("rank ", *culprit, rank.node.empty() ? "" : " (node " + rank.node + ")",
                           " ", rank.exit->Describe());
    if (!rank.last_error.empty()) absl::StrAppend(&reason, ": ", rank.last_error);
    EndLocked(job, v1::JOB_STATE_FAILED, reason, static_cast<int>(*culprit), /*sigkill_now=*/true);
    job.retryable = rank.vanished || rank.exit->Retryable();
  }
  if (job.ending) {
    if (!job.killed && now >= job.kill_deadline) cluster_->Kill(job);
    return;
  }
  const bool all_ok = std::all_of(job.ranks.begin(), job.ranks.end(), [](const SupervisedRank& x) {
    return x.exit && !x.exit->signaled && x.exit->code == 0;
  });
  const bool all_drained = std::all_of(
      job.ranks.begin(), job.ranks.end(),
      [&](const SupervisedRank& x) { return x.exit && (x.exit->drained() || x.exit->ok()); });
  if (job.draining && all_drained && !all_ok) {
    EndLocked(job, v1::JOB_STATE_QUEUED,
              "drained by ithacad: checkpointed and stopped; it resumes from that checkpoint "
              "when a daemon runs it again",
              std::nullopt, false);
    return;
  }
  if (all_ok) {
    EndLocked(job, v1::JOB_STATE_SUCCEEDED,
              absl::StrCat("all ", job.ranks.size(), " ranks finished"), std::nullopt, false);
    return;
  }
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    const SupervisedRank& rank = job.ranks[r];
    if (rank.exit) continue;
    if (rank.registered && now - rank.last_heartbeat > options_.heartbeat_timeout) {
      metrics_->OnWorkerExit("heartbeat_timeout");
      EndLocked(job, v1::JOB_STATE_FAILED,
                absl::StrCat("rank ", r, " (pid ", rank.pid, ") stopped heart-beating: none for ",
                             absl::FormatDuration(now - rank.last_heartbeat)),
                static_cast<int>(r), true);
      job.retryable = true;  // a hung rank, a lost node
      return;
    }
    // A Slurm job's ranks have start_timeout once Slurm runs the job (SlurmCluster::Judge judges
    // a job that stays PENDING).
    if (!rank.registered && cluster_->Started(job) && now - job.launched > options_.start_timeout) {
      const std::string says = cluster_->Says(job);  // reads Slurm's output file: once
      EndLocked(job, v1::JOB_STATE_FAILED,
                absl::StrCat("rank ", r, rank.remote ? "" : absl::StrCat(" (pid ", rank.pid, ")"),
                             " did not ",
                             rank.adopted ? "re-attach after the daemon restart" : "register",
                             " within ", absl::FormatDuration(options_.start_timeout),
                             says.empty() ? "" : "; " + says),
                static_cast<int>(r), true);
      job.retryable = true;
      return;
    }
  }
}

void Supervisor::TailLogsLocked(SupervisedJob& job, bool flush) {
  for (size_t r = 0; r < job.ranks.size(); ++r) {
    std::vector<std::string> lines = job.ranks[r].log->ReadLines(flush);
    if (!lines.empty()) owner_->OnLogLines(job.id, static_cast<int>(r), std::move(lines));
  }
}

void Supervisor::FinalizeLocked(SupervisedJob& job) {
  cluster_->Kill(job);  // anything a worker may have started
  TailLogsLocked(job, true);
  if (!job.ending) {  // cannot happen: all exited means an outcome was decided
    job.outcome = v1::JOB_STATE_FAILED;
    job.reason = "workers exited";
  }
  if (!job.unstored_steps.empty()) {
    absl::StrAppend(&job.reason, "; its history lacks ", job.unstored_steps.size(),
                    " step report(s) that could not be stored (", job.unstored_error, ")");
  }
  // The job's live gauges go before its end is stored: whoever sees the end (a watch, a status)
  // and then reads /metrics finds them gone.
  metrics_->OnJobFinished(job.id);
  owner_->OnEnded(job.id, job.outcome, job.reason, job.failed_rank,
                  job.outcome == v1::JOB_STATE_FAILED && job.retryable);
}

absl::StatusOr<SupervisedJob*> Supervisor::ActiveLocked(const std::string& job_id, int rank) {
  // Detached: the next daemon takes the workers' calls (a rank that finishes meanwhile waits to
  // tell it so), and this one must not record anything more.
  if (detached_) return absl::UnavailableError("ithacad is stopping; its successor takes over");
  auto it = active_.find(job_id);
  if (it == active_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no running workers"));
  }
  SupervisedJob* a = it->second.get();
  if (rank < 0 || rank >= static_cast<int>(a->ranks.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside the job's world of ", a->ranks.size()));
  }
  return a;
}

absl::StatusOr<v1::RegisterResponse> Supervisor::Register(const v1::RegisterRequest& request) {
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SupervisedJob * a, ActiveLocked(request.job_id(), request.rank()));
  SupervisedRank& r = a->ranks[request.rank()];
  if (a->ending) {
    return absl::FailedPreconditionError(absl::StrCat("job ", a->id, " is ending: ", a->reason));
  }
  if (r.remote && (r.pid == 0 || !r.registered) &&
      ConstantTimeEquals(request.secret(), a->secret)) {
    r.pid = request.pid();  // a rank on another node: its pid is known from its registration
    r.node = request.node();
  }
  if (request.pid() != r.pid) {
    return absl::PermissionDeniedError(absl::StrCat("rank ", request.rank(), " of ", a->id,
                                                    " is pid ", r.pid, ", not ", request.pid()));
  }
  if (request.secret() != a->secret) {
    return absl::PermissionDeniedError(
        absl::StrCat("rank ", request.rank(), " of ", a->id, ": wrong job secret"));
  }
  if (request.reattach() && !r.registered) {
    std::printf("ithacad: job %s rank %d (pid %d) re-attached\n", a->id.c_str(), request.rank(),
                r.pid);
    std::fflush(stdout);
  }
  r.registered = true;
  r.last_heartbeat = absl::Now();
  const bool all = std::all_of(a->ranks.begin(), a->ranks.end(),
                               [](const SupervisedRank& x) { return x.registered; });
  if (all && !a->running) {
    a->running = true;
    const std::string where = cluster_->RunningWhere(*a);
    RETURN_IF_ERROR(
        owner_
            ->OnStateChange(a->id, v1::JOB_STATE_RUNNING,
                            absl::StrCat("all ", a->ranks.size(), " ranks registered", where))
            .status());
  }
  v1::RegisterResponse response;
  response.set_spec_toml(a->spec_toml);
  response.set_world_size(static_cast<int32_t>(a->ranks.size()));
  response.set_rendezvous(a->rendezvous);
  response.set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  response.set_gpu(r.slot);
  response.set_daemon_lost_timeout_ms(
      static_cast<int32_t>(absl::ToInt64Milliseconds(options_.daemon_lost_timeout)));
  return response;
}

std::pair<int, std::string> Supervisor::MetricsDevice(const SupervisedJob& a,
                                                      const SupervisedRank& r) const {
  if (r.remote) {
    // Another node's slot: a GPU when the job runs on CUDA.
    return {a.cuda ? r.slot : Metrics::kCpuSlot, ""};
  }
  if (!node_.gpu) return {Metrics::kCpuSlot, ""};  // a CPU slot is no GPU
  const NodeDevice& dev = node_.devices[r.slot];
  return {dev.index, dev.uuid};
}

absl::Status Supervisor::ReportStep(const v1::ReportStepRequest& request) {
  MutexLock lock(&mu_);
  const v1::StepReport& step = request.step();
  ASSIGN_OR_RETURN(SupervisedJob * a, ActiveLocked(request.job_id(), step.rank()));
  SupervisedRank& r = a->ranks[step.rank()];
  r.last_heartbeat = absl::Now();
  if (step.step() <= r.last_step) return absl::OkStatus();  // re-sent after a daemon restart
  v1::StepReport report = step;
  if (r.remote) report.set_node(r.node);
  // A store that cannot take the report (its disk full): the rank keeps it and sends it again
  // (RESOURCE_EXHAUSTED, worker/daemon_mode.cc), and until then it is counted as a gap.
  const std::pair<int, int64_t> key{step.rank(), step.step()};
  if (absl::Status stored = owner_->OnStep(a->id, report); !stored.ok()) {
    if (a->unstored_steps.empty()) a->unstored_error = std::string(stored.message());
    a->unstored_steps.insert(key);
    return absl::ResourceExhaustedError(absl::StrCat("ithacad could not store step ", step.step(),
                                                     " of rank ", step.rank(), " (",
                                                     stored.message(), "); send it again"));
  }
  a->unstored_steps.erase(key);
  const auto [gpu, uuid] = MetricsDevice(*a, r);
  metrics_->OnStep(a->id, step.rank(), gpu, uuid, report);
  r.last_step = step.step();
  return absl::OkStatus();
}

namespace {

// An evaluation report holds a loss per eval.position_buckets bucket or none, and at most one
// passkey point per (length, depth) of the job's
// [eval.passkey], each of them (issue 53 R3: one report of 127,097 points, sent with the job's
// secret, was stored whole and made the job too large for list, status and watch): INVALID_ARGUMENT
// saying which, and nothing of the report is kept. A spec that does not parse allows none.
absl::Status CheckEvalReport(const v1::EvalReport& eval, const std::string& spec_toml) {
  if (eval.passkey_size() == 0 && eval.positions_size() == 0) return absl::OkStatus();
  absl::StatusOr<JobSpec> spec = ParseJobSpec(spec_toml);
  // And a loss per eval.position_buckets bucket, or none.
  const std::vector<int64_t> bounds =
      spec.ok() ? spec->eval.position_buckets : std::vector<int64_t>{};
  const size_t buckets = bounds.empty() ? 0 : bounds.size() + 1;
  if (eval.positions_size() > 0 && static_cast<size_t>(eval.positions_size()) != buckets) {
    return absl::InvalidArgumentError(absl::StrCat("ReportEval: ", eval.positions_size(),
                                                   " position buckets, but the job's "
                                                   "eval.position_buckets makes ",
                                                   buckets));
  }
  const std::vector<int64_t> lengths =
      spec.ok() ? spec->eval.passkey.lengths : std::vector<int64_t>{};
  const std::vector<double> depths = spec.ok() ? spec->eval.passkey.depths : std::vector<double>{};
  const std::vector<int64_t> keys = spec.ok() ? spec->eval.passkey.keys : std::vector<int64_t>{};
  const size_t points = keys.size() * lengths.size() * depths.size();
  if (static_cast<size_t>(eval.passkey_size()) > points) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReportEval: ", eval.passkey_size(), " passkey results, but the job's [eval.passkey] has ",
        keys.size() > 1 ? absl::StrCat(keys.size(), " key counts x ") : "", lengths.size(),
        " lengths x ", depths.size(), " depths = ", points, " points"));
  }
  for (const v1::PasskeyResult& p : eval.passkey()) {
    const int64_t k = std::max<int64_t>(1, p.keys());  // 0: a worker before eval.passkey.keys
    if (std::find(lengths.begin(), lengths.end(), p.length()) == lengths.end() ||
        std::find(depths.begin(), depths.end(), p.depth()) == depths.end() ||
        std::find(keys.begin(), keys.end(), k) == keys.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ReportEval: a passkey result at length ", p.length(), ", depth ", p.depth(), ", ", k,
          " keys, which the job's [eval.passkey] lengths, depths and keys do not list"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Supervisor::ReportEval(const v1::ReportEvalRequest& request) {
  MutexLock lock(&mu_);
  const v1::EvalReport& eval = request.eval();
  ASSIGN_OR_RETURN(SupervisedJob * a, ActiveLocked(request.job_id(), eval.rank()));
  RETURN_IF_ERROR(CheckEvalReport(eval, a->spec_toml));
  SupervisedRank& r = a->ranks[eval.rank()];
  r.last_heartbeat = absl::Now();
  const auto [gpu, uuid] = MetricsDevice(*a, r);
  metrics_->OnEval(a->id, eval.rank(), gpu, uuid, eval);
  return owner_->OnEval(a->id, eval);
}

absl::Status Supervisor::Heartbeat(const v1::HeartbeatRequest& request) {
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SupervisedJob * a, ActiveLocked(request.job_id(), request.rank()));
  if (a->ending) {
    return absl::AbortedError(absl::StrCat("job ", a->id, " is ending: ", a->reason));
  }
  SupervisedRank& r = a->ranks[request.rank()];
  if (!r.registered) {  // adopted, and not re-attached yet: the worker re-attaches on this
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", request.rank(), " of ", a->id, " has not re-attached"));
  }
  r.last_heartbeat = absl::Now();
  return absl::OkStatus();
}

absl::Status Supervisor::Exiting(const v1::ExitingRequest& request) {
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SupervisedJob * a, ActiveLocked(request.job_id(), request.rank()));
  a->ranks[request.rank()].announced_exit = request.signal() != 0
                                                ? WorkerEnd{true, request.signal()}
                                                : WorkerEnd{false, request.exit_code()};
  return absl::OkStatus();
}

absl::Status Supervisor::CheckSecret(const std::string& job_id, const std::string& secret) {
  MutexLock lock(&mu_);
  auto it = active_.find(job_id);
  if (it == active_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " has no running workers"));
  }
  if (secret.empty() || !ConstantTimeEquals(secret, it->second->secret)) {
    return absl::PermissionDeniedError(absl::StrCat("job ", job_id, ": wrong job secret"));
  }
  return absl::OkStatus();
}

absl::Status Supervisor::Log(const v1::LogRequest& request) {
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(SupervisedJob * a, ActiveLocked(request.job_id(), request.rank()));
  // The text also reached the rank's log file through stderr; here it becomes the reason a
  // failure is reported with.
  if (request.level() == "ERROR") a->ranks[request.rank()].last_error = request.text();
  return absl::OkStatus();
}

}  // namespace ithaca
