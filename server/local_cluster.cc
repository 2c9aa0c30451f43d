#include "server/local_cluster.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "engine/core/file_util.h"
#include "launch/layout.h"
#include "launch/worker_command.h"
#include "launch/worker_contract.h"
#include "server/log_files.h"

namespace ithaca {
namespace {

// A local job's process group.
struct LocalJob : ClusterJobState {
  int pgid = 0;
};

int Pgid(const SupervisedJob& job) {
  const auto* local = dynamic_cast<const LocalJob*>(job.cluster.get());
  return local != nullptr ? local->pgid : 0;
}

}  // namespace

absl::StatusOr<Cluster::Launched> LocalCluster::Launch(const LaunchOrder& order,
                                                       SupervisedJob& job) {
  // A fresh Gloo FileStore directory for every launch (a job resumed after a daemon restart is
  // launched again, and a store refuses keys that already exist).
  const std::string rdv_dir = RendezvousDirPath(job.log_dir, absl::ToUnixMicros(absl::Now()));
  job.rendezvous = "file:" + rdv_dir;
  ASSIGN_OR_RETURN(job.secret, NewJobSecret());
  LaunchSpec l;
  l.argv = DaemonRankArgs(options_.worker_binary, options_.worker_socket, job.id);
  l.gpus = order.slots;
  l.rendezvous = job.rendezvous;
  l.env = {
      {kEnvDaemonSocket, options_.worker_socket}, {kEnvJobId, job.id}, {kEnvJobSecret, job.secret}};
  l.die_with_launcher = false;    // a daemon restart must not cost the job (adoption.h)
  l.drain_signal_blocked = true;  // Drain's SIGUSR1 waits for a rank that is still starting
  for (size_t r = 0; r < order.slots.size(); ++r) {
    l.outputs.push_back({RankLogPath(job.log_dir, static_cast<int>(r))});
  }
  l.run_as = options_.run_as;
  // The job's directory is the daemon's; the rendezvous directory in it the workers' alone.
  RETURN_IF_ERROR(MakeJobsDir(job.log_dir, options_.run_as));
  if (mkdir(rdv_dir.c_str(), 0700) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("mkdir ", rdv_dir, ": ", strerror(errno)));
  }
  if (options_.run_as && chown(rdv_dir.c_str(), options_.run_as->uid, options_.run_as->gid) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("chown ", rdv_dir, " to ", options_.run_as->name, ": ", strerror(errno)));
  }
  ASSIGN_OR_RETURN(WorkerGroup group, Launcher::Launch(l));
  job.launched = absl::Now();
  // Written before the job counts as launched: a daemon that dies from here on leaves a job
  // the next one can adopt.
  AdoptionRecord record{job.id, job.secret, group.pgid, job.rendezvous, order.slots, group.pids};
  if (absl::Status wrote = WriteAdoptionRecord(job.log_dir, record); !wrote.ok()) {
    Launcher::SignalGroup(group.pgid, SIGKILL);
    for (pid_t pid : group.pids) {
      while (!Launcher::Poll(pid)) absl::SleepFor(absl::Milliseconds(1));
    }
    return wrote;
  }
  auto local = std::make_unique<LocalJob>();
  local->pgid = group.pgid;
  job.cluster = std::move(local);
  for (size_t r = 0; r < group.pids.size(); ++r) {
    SupervisedRank rank;
    rank.pid = group.pids[r];
    rank.slot = order.slots[r];
    rank.log = std::make_unique<LogTail>(RankLogPath(job.log_dir, static_cast<int>(r)));
    job.ranks.push_back(std::move(rank));
  }
  Launched launched;
  const size_t n = job.ranks.size();
  launched.reason =
      absl::StrCat("launched ", n, n > 1 ? " workers on " : " worker on ",
                   node_.gpu ? "GPU" : "slot", n > 1 ? "s " : " ", absl::StrJoin(order.slots, ","));
  launched.pgid = group.pgid;
  return launched;
}

void LocalCluster::Adopt(const AdoptOrder& order, SupervisedJob& job) {
  auto local = std::make_unique<LocalJob>();
  local->pgid = order.record.pgid;
  job.cluster = std::move(local);
  for (size_t r = 0; r < order.record.pids.size(); ++r) job.ranks[r].pid = order.record.pids[r];
}

std::optional<WorkerEnd> LocalCluster::RankEnd(const SupervisedJob& job, SupervisedRank& rank,
                                               absl::Time now) {
  if (!rank.adopted) return Launcher::Poll(rank.pid);
  if (IsWorkerOf(rank.pid, job.id, job.secret)) return std::nullopt;
  if (rank.announced_exit) return *rank.announced_exit;
  rank.vanished = true;  // killed, or crashed before it could say why
  return WorkerEnd{true, SIGKILL};
}

void LocalCluster::Stop(SupervisedJob& job, JobState outcome, bool now) {
  if (now) {
    Kill(job);
  } else {
    Launcher::SignalGroup(Pgid(job), SIGTERM);
    job.kill_deadline = absl::Now() + options_.grace_period;
  }
}

void LocalCluster::Kill(SupervisedJob& job) {
  Launcher::SignalGroup(Pgid(job), SIGKILL);
  job.killed = true;
}

absl::Status LocalCluster::Drain(SupervisedJob& job) {
  Launcher::SignalGroup(Pgid(job), SIGUSR1);
  return absl::OkStatus();
}

std::string LocalCluster::VanishedReason(const SupervisedJob& job, size_t rank) const {
  return absl::StrCat("rank ", rank, " (pid ", job.ranks[rank].pid,
                      ", adopted after a daemon restart) is gone; its exit status is unknown");
}

}  // namespace ithaca
