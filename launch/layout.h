// Every name the daemon and its workers give a file or directory on disk, in one place (as
// LevelDB's filename.h). Two directories:
//
//   <state dir>/                 ithacad --state-dir; default $ITHACA_HOME, else ~/.ithaca
//     ithacad.lock               one daemon per state directory (flock)
//     ithacad.addr               grpc=, metrics=, health=, pid= of the daemon serving it
//     jobs.db                    the job store (SQLite)
//     run/worker.sock            the WorkerService unix socket (run/ is 0700)
//     jobs/job-N/                a job's directory (below)
//
//   Nothing in it is readable by other users: files 0600, jobs/ and a job's directory 0700, or
//   0710 with the --worker-user's group (server/log_files.h MakeJobsDir), the state directory
//   0711 (the worker user passes through to its socket and its job's rendezvous directory).
//
//   <job dir>/                   a job's logs and runtime files; never its checkpoints or outputs
//     rendezvous-T/              a launch's Gloo FileStore (the workers' user's, 0700)
//     rank-R.log                 rank R's stdout and stderr (0600)
//     workers.adopt              what a restarted daemon needs to adopt the running ranks
//     daemon.addr                a Slurm job's: the host:port its ranks dial (shared storage)
//     slurm.sbatch, slurm-J.out  a Slurm job's batch script and Slurm's own output
#pragma once

#include <cstdint>
#include <string>

namespace ithaca {

// ---- The state directory.

// The environment variable naming the state directory.
inline constexpr char kEnvHome[] = "ITHACA_HOME";
// $ITHACA_HOME, else $HOME/.ithaca (/tmp/.ithaca without a HOME).
std::string DefaultStateDir();
std::string StateLockPath(const std::string& state_dir);
std::string DaemonAddrFilePath(const std::string& state_dir);
std::string JobStorePath(const std::string& state_dir);
// The worker socket's directory (0700) and the socket in it.
std::string WorkerSocketDir(const std::string& state_dir);
std::string WorkerSocketPath(const std::string& socket_dir);
// Where the job directories are, and the one of job `id` ("job-N").
std::string JobDirsPath(const std::string& state_dir);
std::string JobDirPath(const std::string& state_dir, const std::string& id);

// ---- Job ids, which are also their directories' names.

// "job-7" for 7.
std::string JobIdForSeq(int64_t seq);
// 7 for "job-7"; false for any other name.
bool ParseJobSeq(const std::string& name, int64_t* seq);

// ---- A job's directory.

std::string RankLogPath(const std::string& job_dir, int rank);
std::string AdoptionRecordPath(const std::string& job_dir);
std::string JobDaemonAddrPath(const std::string& job_dir);
std::string SlurmScriptPath(const std::string& job_dir);
// Slurm's --output pattern (%j: the Slurm job id), and the file it names for job `slurm_id`.
std::string SlurmOutputPattern(const std::string& job_dir);
std::string SlurmOutputPath(const std::string& job_dir, const std::string& slurm_id);
// A launch's Gloo FileStore directory, "rendezvous-T" (T: the launch's time in microseconds).
std::string RendezvousDirPath(const std::string& job_dir, int64_t launch_micros);

}  // namespace ithaca
