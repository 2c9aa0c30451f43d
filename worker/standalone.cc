#include "worker/standalone.h"

#include <cstdio>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/memory/allocator.h"
#include "engine/train/job_spec.h"
#include "engine/train/trainer.h"

namespace ithaca {

absl::Status RunStandalone(const std::string& spec_path) {
  ASSIGN_OR_RETURN(JobSpec spec, LoadJobSpec(spec_path));
  if (spec.backend != "cpu") {
    return absl::FailedPreconditionError(
        absl::StrCat(spec_path, ": backend: \"", spec.backend,
                     "\" is not available in this build; use backend = \"cpu\""));
  }
  if (spec.parallel.world != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(spec_path, ": parallel.world: ", spec.parallel.world,
                     " ranks need the distributed engine; this build runs world = 1"));
  }
  CpuOps ops;
  HostAllocator alloc;
  ASSIGN_OR_RETURN(auto trainer, Trainer::Create(spec, &ops, &alloc));
  std::printf("job %s: %s, %lld tokens per sample, %lld steps, backend %s\n", spec.name.c_str(),
              spec.model.config.empty() ? spec.model.preset.c_str() : spec.model.config.c_str(),
              static_cast<long long>(spec.data.seq_len),
              static_cast<long long>(spec.training.steps), spec.backend.c_str());
  std::fflush(stdout);
  RETURN_IF_ERROR(trainer->Run());
  if (!spec.checkpoint.dir.empty()) {
    ASSIGN_OR_RETURN(std::string latest, LatestCheckpoint(spec.checkpoint.dir));
    std::printf("checkpoint: %s\n", latest.c_str());
  }
  return absl::OkStatus();
}

}  // namespace ithaca

