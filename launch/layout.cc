#include "launch/layout.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ithaca {

std::string DefaultStateDir() {
  if (const char* h = std::getenv(kEnvHome); h && *h) return h;
  const char* home = std::getenv("HOME");
  return absl::StrCat(home && *home ? home : "/tmp", "/.ithaca");
}

std::string StateLockPath(const std::string& state_dir) { return state_dir + "/ithacad.lock"; }

std::string DaemonAddrFilePath(const std::string& state_dir) { return state_dir + "/ithacad.addr"; }

std::string JobStorePath(const std::string& state_dir) { return state_dir + "/jobs.db"; }

std::string WorkerSocketDir(const std::string& state_dir) { return state_dir + "/run"; }

std::string WorkerSocketPath(const std::string& socket_dir) { return socket_dir + "/worker.sock"; }

std::string JobDirsPath(const std::string& state_dir) { return state_dir + "/jobs"; }

std::string JobDirPath(const std::string& state_dir, const std::string& id) {
  return absl::StrCat(JobDirsPath(state_dir), "/", id);
}

std::string JobIdForSeq(int64_t seq) { return absl::StrCat("job-", seq); }

bool ParseJobSeq(const std::string& name, int64_t* seq) {
  return name.rfind("job-", 0) == 0 && absl::SimpleAtoi(name.substr(4), seq);
}

std::string RankLogPath(const std::string& job_dir, int rank) {
  return absl::StrCat(job_dir, "/rank-", rank, ".log");
}

std::string AdoptionRecordPath(const std::string& job_dir) { return job_dir + "/workers.adopt"; }

std::string JobDaemonAddrPath(const std::string& job_dir) { return job_dir + "/daemon.addr"; }

std::string SlurmScriptPath(const std::string& job_dir) { return job_dir + "/slurm.sbatch"; }

std::string SlurmOutputPattern(const std::string& job_dir) { return job_dir + "/slurm-%j.out"; }

std::string SlurmOutputPath(const std::string& job_dir, const std::string& slurm_id) {
  return absl::StrCat(job_dir, "/slurm-", slurm_id, ".out");
}

std::string RendezvousDirPath(const std::string& job_dir, int64_t launch_micros) {
  return absl::StrCat(job_dir, "/rendezvous-", launch_micros);
}

}  // namespace ithaca
