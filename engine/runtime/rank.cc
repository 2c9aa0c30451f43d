#include "engine/core/units.h"
#include "engine/runtime/rank.h"

#include "engine/comm/rehearsal/rehearsal_device.h"
#include "engine/parallel/upipe.h"
#include "engine/plan/budgets.h"
#include "engine/plan/resolve.h"

namespace ithaca {

absl::StatusOr<RankInfo> RankInfoOrAlone() {
  absl::StatusOr<RankInfo> info = RankInfoFromEnvironment();
  if (absl::IsNotFound(info.status())) return RankInfo();
  return info;
}

NodeResources RankNode(const RankInfo& info, int64_t device_bytes) {
  // The host's memory is shared by this node's ranks only, not by the whole job's.
  return LocalNodeResources(device_bytes, info.local_world > 0 ? info.local_world : info.world);
}

absl::StatusOr<std::unique_ptr<RehearsalComm>> ConnectRehearsal(const RankInfo& info, int sp,
                                                                int ring,
                                                                const RankRehearsal& rehearsal,
                                                                const Backend& backend) {
  RehearsalLayout layout;
  layout.world = info.world;
  layout.nodes = rehearsal.nodes;
  layout.link = rehearsal.link;
  layout.split = [sp](int r) { return UlyssesSplit(r, sp); };
  if (ring > 1) {
    const int u = sp / ring;
    layout.group_splits = {[u](int i) { return UlyssesGroupSplit(i, u); },
                           [u](int i) { return RingSplit(i, u); }};
  }
  ASSIGN_OR_RETURN(std::unique_ptr<RehearsalComm> comm,
                   MakeRehearsalComm(info.rank, layout, backend.device()));
  // Before the trainer (or a bench) splits it: the groups inherit the streams.
  comm->UseStreams(backend.ops->streams());
  return comm;
}

void CapAtRehearsedGpu(const NodeResources& node, JobSpec* spec) {
  if (spec->memory.gpu_budget_gib > 0 || node.device_memory_bytes <= 0) return;
  spec->memory.gpu_budget_gib = static_cast<double>(BudgetsFor(*spec, node).gpu_bytes) / kGiB;
}

absl::StatusOr<std::unique_ptr<Rank>> Rank::Create(JobSpec spec, const RankInfo& info,
                                                   const RankOptions& options) {
  if (spec.parallel.world != info.world) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.world: the job asks for ",
                                                   spec.parallel.world, " ranks but ", info.world,
                                                   " were started"));
  }
  std::unique_ptr<Rank> rank(new Rank());
  rank->info_ = info;
  const RankRehearsal* rehearsal = options.rehearsal ? &*options.rehearsal : nullptr;
  if (rehearsal != nullptr) CapAtRehearsedGpu(rehearsal->node, &spec);
  // A spec admitted by ithacad arrives resolved and runs as it is. Any other (standalone, a
  // test) is resolved here, against this host (or the rehearsed node), by the rule admission
  // uses (engine/plan/resolve.h), before the backend is made: the backend is made from the
  // resolved spec (its attention kernels, its GPU budget), as a daemon job's is.
  if (!CheckResolved(spec).ok()) {
    NodeResources node;
    if (rehearsal != nullptr) {
      node = rehearsal->node;
    } else {
      ASSIGN_OR_RETURN(const int64_t device_bytes, DeviceMemoryBytes(spec, info.gpu));
      node = RankNode(info, device_bytes);
    }
    ASSIGN_OR_RETURN(ResolvedJob job, ResolveJob(spec, node));
    RETURN_IF_ERROR(RequireFits(job));
    rank->resolution_ = ResolutionLine(job);
    spec = std::move(job.spec);
  }
  ASSIGN_OR_RETURN(rank->backend_, options.make_backend ? options.make_backend(spec, info.gpu)
                                                        : MakeBackend(spec, info.gpu));
  rank->spec_ = std::move(spec);
  if (rehearsal != nullptr && info.world > 1) {
    ASSIGN_OR_RETURN(rank->comm_, ConnectRehearsal(info, static_cast<int>(rank->spec_.parallel.sp),
                                                   static_cast<int>(rank->spec_.parallel.ring),
                                                   *rehearsal, rank->backend_));
  } else if (info.world > 1) {
    ASSIGN_OR_RETURN(rank->comm_,
                     ConnectComm(info, rank->backend_.device(), options.comm_timeout_s));
    // Before the trainer splits the communicator: its sub-communicators inherit the streams.
    rank->comm_->UseStreams(rank->backend_.ops->streams());
  }
  ASSIGN_OR_RETURN(rank->trainer_,
                   Trainer::Create(rank->spec_, rank->backend_.ops.get(),
                                   rank->backend_.alloc.get(), rank->comm_.get(), options.run_id));
  return rank;
}

Rank::~Rank() = default;

}  // namespace ithaca
