#include "engine/core/ranks_per_host.h"
#include "engine/core/units.h"
#include "worker/standalone.h"

#include <cstdio>

#include "engine/plan/planner.h"
#include "engine/runtime/rank.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/plan/budgets.h"
#include "engine/spec/job_spec.h"
#include "engine/plan/resolve.h"
#include "engine/checkpoint/checkpoint.h"

namespace ithaca {
namespace {

// Resolves the spec as admission resolves a submitted job (the same ResolveJob and budget
// rule), against this host: its memory, `device_bytes` of GPU memory, `ranks` ranks.
absl::StatusOr<ResolvedJob> ResolveHere(const std::string& spec_path, const JobSpec& spec,
                                        int64_t device_bytes, int ranks) {
  absl::StatusOr<ResolvedJob> job = ResolveJob(spec, LocalNodeResources(device_bytes, ranks));
  if (!job.ok()) {
    return absl::Status(job.status().code(), absl::StrCat(spec_path, ": ", job.status().message()));
  }
  return job;
}

}  // namespace

absl::Status RunStandalone(const std::string& spec_path) {
  ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec(spec_path));
  // Started by a launcher as one of several ranks, or alone.
  ASSIGN_OR_RETURN(RankInfo info, RankInfoOrAlone());
  if (info.world != spec.parallel.world) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec_path, ": parallel.world: the job asks for ", spec.parallel.world, " ranks but ",
        info.world, " were started (use --nproc ", spec.parallel.world, ")"));
  }
  absl::StatusOr<std::unique_ptr<Rank>> created = Rank::Create(spec, info);
  if (!created.ok()) {
    return absl::Status(created.status().code(),
                        absl::StrCat(spec_path, ": ", created.status().message()));
  }
  std::unique_ptr<Rank> rank = std::move(*created);
  spec = rank->spec();
  if (info.rank == 0) {
    std::printf(
        "job %s: %s, %lld tokens per sample, %lld steps, %d rank(s) (sp %lld), backend "
        "%s%s%s\n%s\n",
        spec.name.c_str(),
        spec.model.config.empty() ? spec.model.preset.c_str() : spec.model.config.c_str(),
        static_cast<long long>(spec.data.seq_len), static_cast<long long>(spec.training.steps),
        info.world, static_cast<long long>(spec.parallel.sp), spec.backend.c_str(),
        rank->libraries().empty() ? "" : " with ", rank->libraries().c_str(),
        rank->resolution().c_str());
    std::fflush(stdout);
  }
  RETURN_IF_ERROR(rank->trainer().Run());
  if (info.rank == 0 && !spec.checkpoint.dir.empty()) {
    ASSIGN_OR_RETURN(std::string latest, LatestCheckpoint(spec.checkpoint.dir));
    std::printf("checkpoint: %s\n", latest.c_str());
  }
  return absl::OkStatus();
}

absl::Status RunRehearsal(const std::string& spec_path, const RehearsalArgs& args) {
  ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec(spec_path));
  const int world = static_cast<int>(spec.parallel.world);
  if (args.rank < 0 || args.rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank ", args.rank, ": not a rank of the ", world, " of parallel.world"));
  }
  if (args.nodes < 1 || world % args.nodes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nodes ", args.nodes, ": must divide parallel.world (", world, ")"));
  }
  RankRehearsal rehearsal;
  rehearsal.nodes = args.nodes;
  ASSIGN_OR_RETURN(rehearsal.link, ParseLinkModel(args.link));
  rehearsal.node.device_memory_bytes =
      args.device_memory_gib > 0 ? static_cast<int64_t>(args.device_memory_gib * kGiB)
                                 : (spec.backend == "cuda" ? CudaDeviceMemoryBytes(0) : 0);
  rehearsal.node.host_memory_bytes = static_cast<int64_t>(args.node_host_gib * kGiB);
  rehearsal.node.ranks_on_host = RanksPerHost(world, args.nodes);
  RankInfo info;
  info.rank = args.rank;
  info.world = world;
  info.local_world = RanksPerHost(world, args.nodes);
  info.gpu = 0;
  RankOptions options;
  options.rehearsal = rehearsal;
  // The values mean nothing: nothing of them is kept.
  spec.checkpoint.dir.clear();
  spec.metrics.tensorboard = false;
  absl::StatusOr<std::unique_ptr<Rank>> created = Rank::Create(spec, info, options);
  if (!created.ok()) {
    return absl::Status(created.status().code(),
                        absl::StrCat(spec_path, ": ", created.status().message()));
  }
  std::unique_ptr<Rank> rank = std::move(*created);
  const RankBudgets budgets = BudgetsFor(rank->spec(), rehearsal.node);
  std::printf(
      "rehearsal of rank %d of %d (sp %lld) on %d node(s) of %d ranks, link %s; the node: GPU "
      "%.1f GiB, host %.0f GiB (this rank's share %.1f GiB)\n%s\n",
      args.rank, world, static_cast<long long>(rank->spec().parallel.sp), args.nodes,
      RanksPerHost(world, args.nodes), LinkModelText(rehearsal.link).c_str(),
      rehearsal.node.device_memory_bytes / kGiB, args.node_host_gib, budgets.host_bytes / kGiB,
      rank->resolution().c_str());
  std::fflush(stdout);
  // The trainer prints rank 0's lines; any other rank's are printed here.
  return rank->trainer().Run([&](const StepReport& r) {
    if (args.rank != 0) std::printf("%s\n", FormatStepLine(r).c_str());
  });
}

absl::Status PrintPlan(const std::string& spec_path) {
  ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec(spec_path));
  const int64_t device_bytes = spec.backend == "cuda" ? CudaDeviceMemoryBytes(0) : 0;
  ASSIGN_OR_RETURN(ResolvedJob job, ResolveHere(spec_path, spec, device_bytes,
                                                static_cast<int>(spec.parallel.world)));
  std::printf("memory plan for %s (per rank; world %lld, sp %lld, %lld tokens, %s)\n%s",
              spec_path.c_str(), static_cast<long long>(spec.parallel.world),
              static_cast<long long>(spec.parallel.sp), static_cast<long long>(spec.data.seq_len),
              job.spec.model.dtype.c_str(), FormatPlan(job.plan).c_str());
  return RequireFits(job);
}

}  // namespace ithaca
