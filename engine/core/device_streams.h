// The streams of a compute backend that a communicator can be ordered with, as opaque handles so
// that Ops and Comm implementations can meet without knowing each other's types.
#pragma once

namespace ithaca {

struct DeviceStreams {
  // cudaStream_t on CUDA; nullptr where the backend has none (the CPU runs every op in order on
  // the calling thread).
  void* compute = nullptr;  // where the backend's ops run
  void* comm = nullptr;     // reserved for collectives
};

}  // namespace ithaca
