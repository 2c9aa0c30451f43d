// Rank: one rank of a training job, set up the same way wherever it runs (ithaca-worker's
// standalone and daemon modes, the distributed tests): the backend the spec names, on this
// rank's GPU; the memory budgets the spec leaves to the machine; the communicator of the job's
// ranks, its collectives ordered with the backend's streams; and the Trainer.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/backend/ops.h"
#include "engine/comm/bootstrap.h"
#include "engine/comm/comm.h"
#include "engine/comm/rehearsal_comm.h"
#include "engine/core/status.h"
#include "engine/memory/allocator.h"
#include "engine/plan/budgets.h"
#include "engine/runtime/backend.h"
#include "engine/spec/job_spec.h"
#include "engine/train/trainer.h"

namespace ithaca {

// A rehearsal (engine/comm/rehearsal_comm.h, docs/rehearsal.md): this process runs rank
// info.rank of a job of info.world ranks alone on its one device. The collectives are local
// copies of the real sizes, each holding the comm stream for the link model's time; memory,
// compute and overlap are the rank's, the values are not.
struct RankRehearsal {
  int nodes = 1;  // the job's nodes; info.world / nodes ranks on each, consecutive
  LinkModel link;
  // One node of the cluster rehearsed: its GPU's memory, its host and its ranks (world / nodes).
  // An unresolved spec resolves against it, and the allocator is capped at its GPU budget (a
  // rehearsal of 80 GB GPUs on a larger one holds to 80 GB).
  NodeResources node;
};

struct RankOptions {
  // Bounds joining the communicator and every collective: a dead peer is an error, not a hang.
  double comm_timeout_s = 120;
  // Names the run in its checkpoints (Trainer::Create): ithacad's workers pass the daemon and
  // the job, so a relaunch of the job may resume at its last step.
  std::string run_id;
  // Set: rehearse (info.gpu is the device to run on, usually 0).
  std::optional<RankRehearsal> rehearsal;
  // Makes the rank's backend from its resolved spec (MakeBackend; a test may watch it).
  std::function<absl::StatusOr<Backend>(const JobSpec& spec, int gpu)> make_backend;
};

// The communicator of a rehearsed rank (info.rank of info.world, on the backend's device and
// streams), splitting as the Trainer splits (UlyssesSplit with `sp`) and, with a ring (`ring` > 1
// of sp = u x ring), as the model splits its group (UlyssesGroupSplit, then RingSplit). The one
// set-up of Rank::Create and the benches.
absl::StatusOr<std::unique_ptr<RehearsalComm>> ConnectRehearsal(const RankInfo& info, int sp,
                                                                int ring,
                                                                const RankRehearsal& rehearsal,
                                                                const Backend& backend);

// Caps a rehearsal's allocator at the rehearsed GPU's budget (BudgetsFor's rule on `node`) by
// setting memory.gpu_budget_gib, unless the spec sets it or the node's GPU is unknown: a
// rehearsal of 80 GB GPUs on a larger one holds to 80 GB.
void CapAtRehearsedGpu(const NodeResources& node, JobSpec* spec);

// This process's identity: from the ITHACA_* variables when a launcher started it as a rank
// (RankInfoFromEnvironment), else rank 0 of a world of 1.
absl::StatusOr<RankInfo> RankInfoOrAlone();

// The machine a rank resolves an unresolved spec against: this host, shared by the job's ranks
// on it (info.local_world; a 2-node x 8 job's rank shares its host with 8 ranks, not 16).
NodeResources RankNode(const RankInfo& info, int64_t device_bytes);

class Rank {
 public:
  // INVALID_ARGUMENT naming parallel.world when the spec asks for another number of ranks than
  // info.world; FAILED_PRECONDITION when an unresolved spec does not fit this host; MakeBackend's,
  // ResolveJob's, ConnectComm's and Trainer::Create's errors otherwise. A world of
  // one rank has no communicator.
  static absl::StatusOr<std::unique_ptr<Rank>> Create(JobSpec spec, const RankInfo& info,
                                                      const RankOptions& options = {});
  ~Rank();
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;

  const RankInfo& info() const { return info_; }
  // The spec the trainer runs: the one given when it was already resolved (ithacad resolves
  // every job at admission), else the one resolved against this host.
  const JobSpec& spec() const { return spec_; }
  // What resolving decided (ResolutionLine), or empty when the spec came resolved.
  const std::string& resolution() const { return resolution_; }
  Trainer& trainer() { return *trainer_; }
  // The job's communicator; nullptr for a rank alone.
  Comm* comm() { return comm_.get(); }
  Ops& ops() { return *backend_.ops; }
  // The cuDNN and NCCL versions loaded and built against; empty on the CPU.
  const std::string& libraries() const { return backend_.libraries; }
  Allocator& alloc() { return *backend_.alloc; }

 private:
  Rank() = default;

  RankInfo info_;
  JobSpec spec_;
  std::string resolution_;
  // Destroyed in reverse order: the trainer uses the communicator and the backend, and the
  // communicator's collectives run on the backend's streams.
  Backend backend_;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<Trainer> trainer_;
};

}  // namespace ithaca
