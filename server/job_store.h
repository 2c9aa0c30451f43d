// JobStore: every job, every state transition (time and reason) and each rank's newest step
// report, in SQLite, so `ithaca status` survives a daemon restart. Thread-safe.
//
// Schema (versioned with PRAGMA user_version; a newer file is refused, an older one migrated):
//   jobs(id, seq, name, state, reason, failed_rank, created_ms, updated_ms, slots, pgid, record)
//   transitions(job_id, seq, from_state, to_state, time_ms, reason)
//   last_steps(job_id, rank, report)
//   history(job_id, kind, rank, step, time_ms, report)   (version 2)
//   jobs.cluster_job: the cluster's id of the job's current attempt, "slurm:ID" (version 3)
//   next_job(seq)   one row: the next job's number; only grows (version 4)
//   jobs.after_job: the job it waits for (submit --after; Job.after), "" for none (version 5)
// `record` and `report` are serialized protos (v1.Job without its mutable fields, v1.StepReport;
// in history a v1.StepReport or, kind 1, a v1.EvalReport; Job.last_eval is the newest of those).
// A record's spec_toml is served through UpgradeStoredSpec (engine/spec): the spec keys an older
// ithacad wrote read under today's names.
#pragma once

#include <map>
#include <memory>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/core/mutex.h"
#include "engine/core/status.h"
#include "engine/spec/job_spec.h"
#include "ithaca/v1/job.pb.h"
#include "server/job_state.h"

struct sqlite3;

namespace ithaca {

class JobStore {
 public:
  static constexpr int kSchemaVersion = 6;
  // The step history keeps rank 0's every step up to kHistoryDenseSteps, then every
  // kHistoryEvery-th, and the other ranks' every kHistoryEvery-th (and every rank's last step):
  // a million-step job keeps ~100k rows per rank 0, not a million.
  static constexpr int64_t kHistoryDenseSteps = 10000;
  static constexpr int64_t kHistoryEvery = 10;
  // A reason (of a job's state, of each transition) is kept to this many bytes, valid UTF-8:
  // one record must always fit in a reply, whatever a client or a failure message quoted. Also
  // applied when reading, so a store written by an older ithacad serves bounded records.
  static constexpr size_t kMaxReasonBytes = 4096;
  // One job record (GetJob, each of a ListJobs page's, WatchJob's snapshot) is at most this large,
  // well inside gRPC's 4 MiB: an evaluation keeps at most kMaxEvalPasskeyResults passkey points
  // (the most a spec can ask for; ithacad refuses a report that holds more than its own spec's,
  // Supervisor::ReportEval), and a record still too large, as an older ithacad may have stored
  // it, is served without its evaluation's points and then without the other ranks' newest steps,
  // so list and status degrade and never fail (issue 53 R3). Also applied to the history's rows.
  static constexpr size_t kMaxJobRecordBytes = size_t{1} << 20;
  static constexpr int kMaxEvalPasskeyResults =
      static_cast<int>(kMaxPasskeyPoints * kMaxPasskeyPoints);

  struct Options {
    std::string path;  // a file, or ":memory:"
    // A directory whose `job-N` entries (the jobs' log directories) also count when numbering
    // a new job, so ids never go back, even when the database was emptied or replaced.
    std::string job_dirs;
  };
  // Refuses (FAILED_PRECONDITION naming the file) a database that fails PRAGMA quick_check, so
  // a damaged store never serves. Transitions are written with synchronous=FULL.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const Options& options);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Stores a new job in QUEUED with the next id ("job-1", "job-2", ...); `job` gives the name,
  // spec and log_dir (log_dir may contain "{id}", replaced by the id).
  absl::StatusOr<v1::Job> Create(const v1::Job& job, const std::string& reason);
  absl::StatusOr<v1::Job> Get(const std::string& id);
  // Removes an ended job's rows (record, transitions, newest steps, history). Its id is never
  // handed out again. NOT_FOUND for an unknown id, FAILED_PRECONDITION for a job not ended.
  absl::Status Delete(const std::string& id);
  // Newest first; `states` empty means all; `limit` 0 means no limit; `before_seq` > 0: only
  // jobs numbered below it (job-N is number N), for paging.
  absl::StatusOr<std::vector<v1::Job>> List(const std::vector<JobState>& states, int limit,
                                            int64_t before_seq = 0);

  // Moves a job to `to`, recording the time and reason. FAILED_PRECONDITION when the state
  // machine does not allow it (for example out of a terminal state). `restart`: its [retry]
  // policy queues it again (Job.restarts counts these). A job keeps its first
  // kKeptFirstTransitions transitions and its newest, kMaxTransitions in all (restarts, drains
  // and requeues are unbounded over a job's life); Job.transitions_omitted counts the others.
  static constexpr int64_t kKeptFirstTransitions = 16;
  static constexpr int64_t kMaxTransitions = 200;
  absl::StatusOr<v1::Job> Transition(const std::string& id, JobState to, const std::string& reason,
                                     std::optional<int> failed_rank = std::nullopt,
                                     bool restart = false);
  // The slots and process group a job's workers run in (pgid 0: none).
  absl::Status SetLaunch(const std::string& id, const std::vector<int>& slots, int pgid);
  absl::StatusOr<int> ProcessGroup(const std::string& id);
  // The cluster's id of the job's current attempt ("slurm:1234"; Job.cluster_job): what a
  // restarted daemon re-attaches to.
  absl::Status SetClusterJob(const std::string& id, const std::string& cluster_job);
  // Keeps `report` as rank report.rank()'s newest step, and in the job's history (sampled as
  // kHistoryEvery says). A step at or before the rank's newest is one run again (a retry):
  // the history keeps the last run of each step, dropping the rank's rows from that step on.
  absl::Status RecordStep(const std::string& id, const v1::StepReport& report);
  // Adds an evaluation to the job's history (every one is kept).
  absl::Status RecordEval(const std::string& id, const v1::EvalReport& report);
  // The job's history, oldest first: events carrying `step` or `eval`, with their time.
  absl::StatusOr<std::vector<v1::JobEvent>> History(const std::string& id);
  absl::StatusOr<std::map<JobState, int64_t>> CountByState();

  // UNAVAILABLE naming the file when the database file was removed or replaced since Open (its
  // state directory deleted under the daemon): writes would go to a file nobody will read.
  // Every write checks it; the daemon's health check polls it.
  absl::Status CheckIntact() const;

 private:
  JobStore(sqlite3* db, Options options) : db_(db), options_(std::move(options)) {}
  absl::Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CreateInitialSchema() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exec(const std::string& sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `body` in one write transaction: committed when it succeeds, rolled back when it fails.
  absl::Status InWriteTransaction(const std::function<absl::Status()>& body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<v1::Job> GetLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // One connection, used by one caller at a time.
  Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
  Options options_;
  // The database file's identity at Open (0: in memory).
  uint64_t dev_ = 0, ino_ = 0;
  // One past the largest job-N directory in options_.job_dirs at Open.
  int64_t first_free_dir_seq_ = 1;
};

}  // namespace ithaca
