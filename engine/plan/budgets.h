// The one rule for how much memory a rank may plan for. Admission, the workers, the benchmarks
// and the tests all take their budgets from BudgetsFor, so a job admitted on a node is resolved
// to the same settings a worker on that node would pick.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/units.h"
#include "engine/spec/job_spec.h"

namespace ithaca {

// What one host offers a job's ranks.
struct NodeResources {
  int64_t device_memory_bytes = 0;  // one GPU's memory (0: no GPU; unused by the CPU backend)
  int64_t host_memory_bytes = 0;    // the host's physical memory
  int ranks_on_host = 1;            // the job's ranks sharing this host
  // The GPUs' name ("NVIDIA H100 80GB HBM3", "h100x8"; "" unknown): which measured rates its
  // plans are predicted with (engine/plan/step_time.h RateTableNameFor).
  std::string gpu_name;
};

// What one rank may use.
struct RankBudgets {
  int64_t gpu_bytes = 0;   // device memory; on the CPU backend, the rank's share of the host
  int64_t host_bytes = 0;  // pinned host memory for offloaded block data
  std::string gpu_source, host_source;  // where each number came from, for messages
};

// GPU memory the engine's allocator cannot have: the CUDA context, the cuBLAS / cuDNN handles
// and NCCL's buffers, which are allocated outside it.
constexpr int64_t kCudaReserveBytes = 2 * kGiBBytes;
// The share of the host's memory a job's ranks may use together; the rest stays with the
// operating system, the page cache and the daemon.
constexpr double kHostMemoryFraction = 0.85;

// GPU: memory.gpu_budget_gib when set, else the device's memory less kCudaReserveBytes. Host:
// memory.host_budget_gib when set, else kHostMemoryFraction of the host's memory divided among
// the ranks on the host. On the CPU backend that share of the host is also the rank's device
// (its "GPU" budget unless memory.gpu_budget_gib is set). A budget comes out 0 only when the
// node does not know the memory it is taken from.
RankBudgets BudgetsFor(const JobSpec& spec, const NodeResources& node);

// This host as a worker process sees it: its physical memory (sysconf), the given GPU memory
// and the job's ranks on this host.
NodeResources LocalNodeResources(int64_t device_memory_bytes, int ranks_on_host);

}  // namespace ithaca
