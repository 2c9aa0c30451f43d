// Standalone mode: `ithaca-worker --standalone job.toml` trains without a daemon, as one rank or
// as one of the ranks a local launcher started (ITHACA_RANK etc. in the environment).
#pragma once

#include <string>

#include "engine/core/status.h"

namespace ithaca {

// The spec is resolved here (engine/plan/resolve.h ResolveJob) against this host, as admission
// would resolve it against the daemon's node.
absl::Status RunStandalone(const std::string& spec_path);

// `ithaca-worker --rehearse job.toml`: one rank of the job, alone on this machine's GPU (or its
// CPU), its collectives local copies held for a link model's time (engine/comm/rehearsal_comm.h,
// docs/rehearsal.md). The spec resolves against the rehearsed node, not this one. Trains the
// job's steps on its data and prints the rank's step lines: its memory per tier and the tok/s
// per GPU the job would reach. Checkpoints, TensorBoard and the values are off: a rehearsal
// measures memory and time, not learning.
struct RehearsalArgs {
  int rank = 0;
  int nodes = 1;                  // the job's nodes (parallel.world / nodes ranks on each)
  std::string link = "h200-sxm";  // engine/comm/link_model.h ParseLinkModel
  double device_memory_gib = 0;   // the rehearsed GPU's memory; 0: this GPU's
  double node_host_gib = 2048;    // one rehearsed node's host memory
};
absl::Status RunRehearsal(const std::string& spec_path, const RehearsalArgs& args);

// `ithaca-worker --plan job.toml`: resolves the spec against this host and prints the memory
// plan per tier; FAILED_PRECONDITION when it does not fit the budgets.
absl::Status PrintPlan(const std::string& spec_path);

}  // namespace ithaca
