#include "engine/comm/rehearsal/rehearsal_device.h"

namespace ithaca {

// cuda_rehearsal_device.cc, or its stub in a build without CUDA.
absl::StatusOr<std::shared_ptr<RehearsalDevice>> MakeCudaRehearsalDevice();

absl::StatusOr<std::shared_ptr<RehearsalDevice>> MakeRehearsalDevice(Device device) {
  if (device == Device::kCuda) return MakeCudaRehearsalDevice();
  return HostRehearsalDevice();
}

absl::StatusOr<std::unique_ptr<RehearsalComm>> MakeRehearsalComm(int rank,
                                                                 const RehearsalLayout& layout,
                                                                 Device device) {
  ASSIGN_OR_RETURN(std::shared_ptr<RehearsalDevice> d, MakeRehearsalDevice(device));
  return RehearsalComm::Create(rank, layout, std::move(d));
}

}  // namespace ithaca
