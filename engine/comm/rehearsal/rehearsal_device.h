// The rehearsal communicator of one rank on this process's device (engine/comm/rehearsal_comm.h),
// behind a header without CUDA types: HostRehearsalDevice on the CPU, the CUDA one (copies and
// held time on the comm stream) on a GPU. A build without CUDA answers FAILED_PRECONDITION for
// the GPU.
#pragma once

#include <memory>

#include "engine/comm/rehearsal_comm.h"

namespace ithaca {

// The current CUDA device's rehearsal device (cuda_rehearsal_device.cc), or the host's.
absl::StatusOr<std::shared_ptr<RehearsalDevice>> MakeRehearsalDevice(Device device);

// RehearsalComm::Create on MakeRehearsalDevice(device).
absl::StatusOr<std::unique_ptr<RehearsalComm>> MakeRehearsalComm(int rank,
                                                                 const RehearsalLayout& layout,
                                                                 Device device);

}  // namespace ithaca
