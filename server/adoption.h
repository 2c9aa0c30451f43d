// Adoption: how a restarted ithacad takes over the workers of a job that a previous daemon
// launched. Workers do not die with the daemon (their own process group, no death signal); at
// launch the supervisor writes the job's adoption record (which processes, on which slots, with
// which secret) into the job's directory, and a daemon starting on the same state directory
// reads it back, checks that those processes are still the job's workers, and supervises them
// again. The workers keep training meanwhile and re-attach to the worker socket with their job
// id, rank, pid and the job's secret (worker/daemon_mode.cc).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

struct AdoptionRecord {
  std::string job_id;
  std::string secret;       // ITHACA_JOB_SECRET of every rank
  pid_t pgid = 0;           // the launch's process group
  std::string rendezvous;   // what Register answered
  std::vector<int> slots;   // slots[rank]
  std::vector<pid_t> pids;  // pids[rank]
};

// The record is launch/layout.h's AdoptionRecordPath (mode 600: it holds the secret).
absl::Status WriteAdoptionRecord(const std::string& log_dir, const AdoptionRecord& record);
// NOT_FOUND when the job has none (launched by a daemon from before adoption, or never
// launched); DATA_LOSS naming the line when it cannot be read.
absl::StatusOr<AdoptionRecord> ReadAdoptionRecord(const std::string& log_dir);

// 32 random bytes from /dev/urandom, as hex.
absl::StatusOr<std::string> NewJobSecret();

// True while `pid` is a live (not zombie) process whose environment says it is a worker of
// `job_id` launched with `secret`: a pid reused by anything else (another daemon's job of the
// same id included) does not count.
bool IsWorkerOf(pid_t pid, const std::string& job_id, const std::string& secret);

}  // namespace ithaca
