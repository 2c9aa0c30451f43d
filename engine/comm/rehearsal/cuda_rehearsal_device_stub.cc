// rehearsal_device.cc's GPU half in a build without CUDA.
#include "engine/comm/rehearsal_comm.h"

namespace ithaca {

absl::StatusOr<std::shared_ptr<RehearsalDevice>> MakeCudaRehearsalDevice() {
  return absl::FailedPreconditionError(
      "rehearsal: this binary was built without CUDA; rehearse on backend = \"cpu\" or rebuild "
      "with CUDA");
}

}  // namespace ithaca
