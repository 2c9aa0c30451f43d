// A daemon job's rank as a client of ithacad's WorkerService: it registers, queues its step and
// evaluation reports for a sender thread of its own (so training never waits on the daemon),
// heart-beats from another thread, follows a daemon that restarts, and says how it exits. The
// three threads (the training loop's, the sender, the heartbeat) share its state under the locks
// its members name (tools/check_thread_safety.sh; tools/sanitize.sh tsan runs its test).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>

#include "engine/core/mutex.h"
#include "engine/core/status.h"
#include "ithaca/v1/worker.grpc.pb.h"

namespace ithaca {

struct DaemonWorkerOptions {
  std::string socket;  // --daemon, else $ITHACA_DAEMON_SOCKET
  std::string job_id;  // --job, else $ITHACA_JOB_ID
  int rank = 0;        // $ITHACA_RANK
  int world = 1;       // $ITHACA_WORLD_SIZE
  std::string secret;  // $ITHACA_JOB_SECRET: proves the rank is the job's at (re-)registration
  // $ITHACA_DAEMON_ADDR_FILE (a Slurm job's <job dir>/daemon.addr, on shared storage): where the
  // daemon is now. A rank whose daemon went away reads it before each re-attach, so a daemon
  // restarted on another host or port is found.
  std::string address_file;
};

// A channel to the daemon at `address`. A daemon that restarts binds the same address again:
// the channel reconnects within a second of it. A path (or unix:PATH) is the daemon's worker
// socket on this machine; host:port is its TCP port, for ranks on other nodes (ithacad --cluster
// slurm), reached as clients reach it: TLS when $ITHACA_CA names the CA, the bearer token of
// $ITHACA_TOKEN_FILE (daemon_link/connection.h).
absl::StatusOr<std::shared_ptr<grpc::Channel>> DaemonChannel(const std::string& address);

class DaemonClient {
 public:
  // `stop` is set when the daemon says the job is over or no longer knows it: the training loop
  // stops as if the rank got SIGTERM. It must outlive the client.
  DaemonClient(const DaemonWorkerOptions& o, std::shared_ptr<grpc::Channel> channel,
               std::atomic<bool>* stop);
  // Flushes the reports and stops the heartbeats.
  ~DaemonClient();
  DaemonClient(const DaemonClient&) = delete;
  DaemonClient& operator=(const DaemonClient&) = delete;

  // `reattach`: this rank registered with an earlier daemon, which went away.
  absl::StatusOr<v1::RegisterResponse> Register(bool reattach = false);

  // Queues the step's report; the sender thread delivers reports in order, so the training loop
  // never waits on the daemon.
  void ReportStep(v1::StepReport report);
  // An evaluation's report, in the same queue: the daemon sees it after the step it follows.
  void ReportEval(v1::EvalReport report);
  // Delivers every queued report, then stops the sender (before the rank exits, so the daemon
  // has seen the last step before it sees the exit).
  void FlushReports();

  // Prints `text` on stderr and sends it to the daemon's log of the job.
  void Log(const std::string& level, const std::string& text);
  // The rank's exit code, for a daemon that adopted the rank and cannot waitpid it.
  void Exiting(int code);

  // Heart-beats every `interval_ms`. When the daemon goes away, the rank trains on and
  // re-attaches to the one that comes back (the step reports wait in their queue meanwhile).
  // When the daemon says the job is over, or does not know it, `stop` is set; when none answers
  // for `lost_timeout_ms` (0: ten intervals, at least 10 s), the process exits outright
  // (kExitKilled), even in the middle of a step.
  void StartHeartbeats(int interval_ms, int lost_timeout_ms);
  void StopHeartbeats();

 private:
  using Report = std::variant<v1::StepReport, v1::EvalReport>;

  grpc::Status Beat();
  std::shared_ptr<v1::WorkerService::Stub> stub();
  void FollowDaemon();
  grpc::Status Reattach();
  void Queue(Report report);
  void WaitUnlessAbandoned(absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(report_mu_);
  void SendReports();
  grpc::Status Send(const Report& report);

  const DaemonWorkerOptions o_;
  std::atomic<bool>* const stop_;
  std::string address_;  // the daemon's, as stub_ dials it (heartbeat thread only)
  Mutex stub_mu_;
  std::shared_ptr<v1::WorkerService::Stub> stub_ ABSL_GUARDED_BY(stub_mu_);
  // The report queue, between the training loop and the sender.
  Mutex report_mu_;
  CondVar report_cv_;  // a report queued, the queue closed, or the job disowned
  std::deque<Report> reports_ ABSL_GUARDED_BY(report_mu_);
  bool reports_done_ ABSL_GUARDED_BY(report_mu_) = false;
  // The daemon disowned the job: queued reports are dropped instead of waited on.
  std::atomic<bool> reports_abandoned_{false};
  // A report the daemon could not store is retried this long after the rank's training ended.
  static constexpr std::chrono::seconds kStoreRetry{30};
  std::optional<std::chrono::steady_clock::time_point> store_retry_until_
      ABSL_GUARDED_BY(report_mu_);
  std::thread sender_;  // started (Queue) and joined (FlushReports) by the training loop
  std::thread thread_;  // the heartbeat thread
  Mutex mu_;
  CondVar cv_;  // StopHeartbeats
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// For a node's launcher (ithaca-worker --daemon ADDR --job ID --nproc N): tells the daemon at
// `address` that `rank` of `job_id` was killed by `signal`, with the job's secret from
// $ITHACA_JOB_SECRET. A killed rank cannot say so itself, and without this the daemon, seeing
// the Slurm job end, could not tell the killed rank from the ones its launchers then stopped.
// Best effort: waits at most 5 s, and a daemon that is away misses it.
void ReportKilledRank(const std::string& address, const std::string& job_id, int rank, int signal);

}  // namespace ithaca
