// The ranks that share one host, the one rule everything that places ranks divides by.
#pragma once

#include <algorithm>
#include <cstdint>

namespace ithaca {

// A job's `world` ranks spread evenly over its `nodes` (a Slurm job's slurm.nodes, a
// rehearsal's --nodes; 1 for a job on one node), consecutive ranks on each. Admission, the
// standalone worker, the rehearsal, the planner, the Slurm launch and the benches size host
// budgets and place ranks by it.
inline int RanksPerHost(int64_t world, int64_t nodes) {
  return static_cast<int>(world / std::max<int64_t>(1, nodes));
}

}  // namespace ithaca
