#include "worker/standalone.h"

#include <cstdio>

#include "engine/plan/planner.h"
#include "engine/runtime/rank.h"
#include "engine/train/job_spec.h"

namespace ithaca {

absl::Status RunStandalone(const std::string& spec_path) {
  ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec(spec_path));
  // Started by a launcher as one of several ranks, or alone.
  ASSIGN_OR_RETURN(RankInfo info, RankInfoOrAlone());
  if (info.world != spec.parallel.world) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec_path, ": parallel.world: the job asks for ", spec.parallel.world, " ranks but ",
        info.world, " were started (use --nproc ", spec.parallel.world, ")"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Rank> rank, Rank::Create(spec, info));
  if (info.rank == 0) {
    std::printf(
        "job %s: %s, %lld tokens per sample, %lld steps, %d rank(s) (sp %lld), backend "
        "%s\n",
        spec.name.c_str(),
        spec.model.config.empty() ? spec.model.preset.c_str() : spec.model.config.c_str(),
        static_cast<long long>(spec.data.seq_len), static_cast<long long>(spec.training.steps),
        info.world, static_cast<long long>(spec.parallel.sp), spec.backend.c_str());
    std::fflush(stdout);
  }
  RETURN_IF_ERROR(rank->trainer().Run());
  if (info.rank == 0 && !spec.checkpoint.dir.empty()) {
    ASSIGN_OR_RETURN(std::string latest, LatestCheckpoint(spec.checkpoint.dir));
    std::printf("checkpoint: %s\n", latest.c_str());
  }
  return absl::OkStatus();
}

absl::Status PrintPlan(const std::string& spec_path) {
  ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec(spec_path));
  ASSIGN_OR_RETURN(MemoryPlan plan, PlanJob(spec));
  std::printf("memory plan for %s (per rank; world %lld, sp %lld, %lld tokens)\n%s",
              spec_path.c_str(), static_cast<long long>(spec.parallel.world),
              static_cast<long long>(spec.parallel.sp), static_cast<long long>(spec.data.seq_len),
              FormatPlan(plan).c_str());
  if (!plan.fits) return absl::FailedPreconditionError(plan.verdict);
  return absl::OkStatus();
}

}  // namespace ithaca
