// For the distributed evaluation tests: one rank of an evaluation-only job on the CPU, resolved
// as admission resolves it (a 64 GiB host shared by the job's ranks) and run by the Trainer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/comm/bootstrap.h"
#include "engine/plan/resolve.h"
#include "engine/train/trainer.h"

namespace ithaca {
namespace testing {

// Rank `rank` of spec.parallel.world (one process: no communicator) meeting the others at
// `rendezvous`; the evaluation reports its Trainer made.
inline absl::StatusOr<std::vector<EvalReport>> EvaluateRank(const JobSpec& spec, int rank,
                                                            const std::string& rendezvous) {
  const int world = static_cast<int>(spec.parallel.world);
  std::unique_ptr<Comm> comm;
  if (world > 1) {
    RankInfo info;
    info.rank = rank;
    info.world = world;
    info.rendezvous = rendezvous;
    ASSIGN_OR_RETURN(comm, ConnectComm(info, Device::kCpu, /*timeout_s=*/60));
  }
  NodeResources node;
  node.host_memory_bytes = int64_t{64} << 30;
  node.ranks_on_host = world;
  ASSIGN_OR_RETURN(ResolvedJob job, ResolveJob(spec, node));
  ASSIGN_OR_RETURN(JobSpec resolved, ParseJobSpec(job.toml, "resolved.toml"));
  CpuOps ops;
  HostAllocator alloc;
  ASSIGN_OR_RETURN(auto trainer, Trainer::Create(resolved, &ops, &alloc, comm.get()));
  std::vector<EvalReport> evals;
  RETURN_IF_ERROR(trainer->Run(nullptr, 0, [&](const EvalReport& r) { evals.push_back(r); }));
  return evals;
}

}  // namespace testing
}  // namespace ithaca
