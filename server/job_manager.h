// JobManager: the daemon's logic, behind thin gRPC handlers (job_service.cc, worker_service.cc).
// It admits jobs (admission.h), stores them (job_store.h), queues them (scheduler.h), launches
// their workers (launcher.h) from its own long-lived thread, and supervises them: a worker that
// exits non-zero or stops heart-beating fails the job naming the rank, and the job's other
// workers are killed; cancel sends SIGTERM, then SIGKILL after the grace period. A job reaches
// its terminal state only once all its workers are gone. After a restart, jobs that were running
// are marked FAILED ("daemon restarted") and stray workers killed; queued jobs are queued again.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "ithaca/v1/job.pb.h"
#include "ithaca/v1/worker.pb.h"
#include "server/admission.h"
#include "server/event_log.h"
#include "server/job_store.h"
#include "server/log_files.h"
#include "server/metrics.h"
#include "server/node.h"
#include "server/scheduler.h"
#include "worker/launcher.h"

namespace ithaca {

class JobManager {
 public:
  struct Options {
    std::string state_dir;      // jobs/<id>/ (logs, rendezvous) lives here
    std::string worker_binary;  // ithaca-worker
    std::string worker_socket;  // the WorkerService unix socket the workers dial
    Node node;
    absl::Duration heartbeat_timeout = absl::Seconds(30);
    absl::Duration start_timeout = absl::Seconds(120);  // launch → every rank registered
    absl::Duration grace_period = absl::Seconds(10);    // SIGTERM → SIGKILL on cancel
    int heartbeat_interval_ms = 1000;                   // told to workers at Register
    absl::Duration poll_interval = absl::Milliseconds(50);
    std::string metrics_address;  // for GetNode
  };

  JobManager(Options options, JobStore* store, Metrics* metrics);
  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // Recovers from a previous run (see above) and starts the supervision thread.
  absl::Status Start();
  // Stops every running job (FAILED, `reason`), waits for its workers, stops the thread. Queued
  // jobs stay queued for the next start. New submissions get UNAVAILABLE from now on.
  void Shutdown(const std::string& reason);

  // JobService.
  absl::StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::PlanJobResponse> Plan(const v1::PlanJobRequest& request);
  absl::StatusOr<v1::Job> Get(const std::string& id);
  absl::StatusOr<std::vector<v1::Job>> List(const v1::ListJobsRequest& request);
  absl::StatusOr<v1::Job> Cancel(const std::string& id, const std::string& reason);
  // The job's event stream; for a job that ended before this daemon started, a closed log
  // holding its final state change.
  absl::StatusOr<std::shared_ptr<EventLog>> Events(const std::string& id);
  v1::NodeInfo NodeInfo();
  void RefreshJobCounts();  // ithaca_jobs{state} from the store

  // WorkerService.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  absl::Status ReportStep(const v1::ReportStepRequest& request);
  absl::Status Heartbeat(const v1::HeartbeatRequest& request);
  absl::Status Log(const v1::LogRequest& request);

  const Options& options() const { return options_; }

 private:
  struct Rank {
    int pid = 0;
    int slot = 0;
    bool registered = false;
    absl::Time last_heartbeat;
    std::optional<WorkerEnd> exit;
    std::string last_error;  // newest ERROR line the worker sent
    std::unique_ptr<LogTail> log;
  };
  struct Active {
    std::string id;
    std::string spec_toml;
    std::string rendezvous;
    std::string log_dir;
    std::vector<Rank> ranks;
    int pgid = 0;
    absl::Time launched;
    bool running = false;  // every rank registered
    // Once the outcome is decided the job is "ending": its workers are being stopped.
    bool ending = false;
    JobState outcome = v1::JOB_STATE_UNSPECIFIED;
    std::string reason;
    std::optional<int> failed_rank;
    absl::Time kill_deadline;
    bool killed = false;  // SIGKILL sent
  };

  // job_manager_loop.cc: the supervision thread.
  void Loop();
  void Tick();
  void LaunchLocked(const Scheduler::Assignment& a);
  void SuperviseLocked(Active& job, absl::Time now);
  void EndLocked(Active& job, JobState outcome, const std::string& reason,
                 std::optional<int> failed_rank, bool sigkill_now);
  void FinalizeLocked(Active& job);
  void TailLogsLocked(Active& job, bool flush);
  absl::Status Recover();

  void PublishState(const std::string& id, const v1::Job& job);
  std::shared_ptr<EventLog> EventsLocked(const std::string& id);
  absl::StatusOr<Active*> ActiveLocked(const std::string& job_id, int rank);

  Options options_;
  JobStore* store_;
  Metrics* metrics_;

  std::mutex mu_;
  std::condition_variable wake_;
  Scheduler scheduler_;
  std::map<std::string, std::unique_ptr<Active>> active_;
  std::map<std::string, std::shared_ptr<EventLog>> events_;
  bool shutting_down_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ithaca
