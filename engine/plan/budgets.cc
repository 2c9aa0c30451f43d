#include "engine/plan/budgets.h"
#include "engine/core/units.h"

#include <unistd.h>

#include <algorithm>

namespace ithaca {
RankBudgets BudgetsFor(const JobSpec& spec, const NodeResources& node) {
  RankBudgets b;
  const int ranks = std::max(1, node.ranks_on_host);
  if (spec.memory.host_budget_gib > 0) {
    b.host_bytes = static_cast<int64_t>(spec.memory.host_budget_gib * kGiB);
    b.host_source = "memory.host_budget_gib";
  } else {
    b.host_bytes =
        static_cast<int64_t>(kHostMemoryFraction * double(node.host_memory_bytes)) / ranks;
    b.host_source = absl::StrFormat("%.0f%% of host memory / %d rank%s", 100 * kHostMemoryFraction,
                                    ranks, ranks == 1 ? "" : "s");
  }
  if (spec.memory.gpu_budget_gib > 0) {
    b.gpu_bytes = static_cast<int64_t>(spec.memory.gpu_budget_gib * kGiB);
    b.gpu_source = "memory.gpu_budget_gib";
  } else if (spec.backend == "cuda") {
    b.gpu_bytes = std::max<int64_t>(0, node.device_memory_bytes - kCudaReserveBytes);
    b.gpu_source = "GPU memory less 2 GiB for the CUDA context";
  } else {
    b.gpu_bytes = b.host_bytes;
    b.gpu_source = b.host_source;
  }
  return b;
}

NodeResources LocalNodeResources(int64_t device_memory_bytes, int ranks_on_host) {
  NodeResources n;
  n.device_memory_bytes = device_memory_bytes;
  n.host_memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  n.ranks_on_host = ranks_on_host;
  return n;
}

}  // namespace ithaca
