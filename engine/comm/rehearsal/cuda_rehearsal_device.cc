// The rehearsal's device on a GPU: each collective's copies and its hold on the comm stream,
// ordered with the compute stream by events exactly as NcclComm orders NCCL's collectives (the
// comm stream first waits for the work issued so far on the compute stream; the compute stream
// waits for the collective at once, or, for an issued one, at Issued::Wait). Before UseStreams
// it runs on the legacy default stream and waits for each collective, like NcclComm's default.
#include <cuda_runtime.h>

#include <cmath>
#include <map>
#include <mutex>
#include <vector>

#include "engine/comm/rehearsal/hold.h"
#include "engine/comm/rehearsal_comm.h"

namespace ithaca {
namespace {

absl::Status CudaError(const char* what, cudaError_t err) {
  return absl::InternalError(
      absl::StrCat("rehearsal: ", what, ": CUDA error: ", cudaGetErrorString(err)));
}

class CudaDevice final : public RehearsalDevice {
 public:
  ~CudaDevice() override {
    if (stream_ != nullptr || compute_ != nullptr) cudaStreamSynchronize(stream_);
    for (auto& [id, e] : issued_) cudaEventDestroy(e);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (inputs_ready_ != nullptr) cudaEventDestroy(inputs_ready_);
    if (slot_ != nullptr) cudaFree(slot_);
  }

  absl::Status Init() {
    cudaError_t err = cudaMalloc(&slot_, sizeof(uint64_t));
    if (err == cudaSuccess) err = cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError("init", err);
    return absl::OkStatus();
  }

  Device device() const override { return Device::kCuda; }

  void UseStreams(const DeviceStreams& streams) override {
    if (streams.comm == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    stream_ = static_cast<cudaStream_t>(streams.comm);
    compute_ = static_cast<cudaStream_t>(streams.compute);
  }

  absl::StatusOr<int64_t> Run(const std::vector<Copy>& copies, double hold_s,
                              bool deferred) override {
    std::lock_guard<std::mutex> lock(mu_);
    const bool ordered = compute_ != nullptr && compute_ != stream_;
    cudaError_t err = cudaSuccess;
    if (ordered) {
      // The inputs are written, and the buffers' memory last used, on the compute stream.
      err = cudaEventRecord(inputs_ready_, compute_);
      if (err == cudaSuccess) err = cudaStreamWaitEvent(stream_, inputs_ready_, 0);
    }
    const uint64_t hold_ns = hold_s > 0 ? static_cast<uint64_t>(std::llround(hold_s * 1e9)) : 0;
    if (err == cudaSuccess && hold_ns > 0) err = LaunchRehearsalStamp(stream_, slot_);
    for (const Copy& c : copies) {
      if (err != cudaSuccess) break;
      if (c.bytes == 0 || c.dst == c.src) continue;
      err = cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, stream_);
    }
    if (err == cudaSuccess && hold_ns > 0) err = LaunchRehearsalHold(stream_, slot_, hold_ns);
    if (err != cudaSuccess) return CudaError("collective", err);
    if (!ordered) {
      err = cudaStreamSynchronize(stream_);
      if (err != cudaSuccess) return CudaError("collective", err);
      return 0;
    }
    cudaEvent_t done = nullptr;
    RETURN_IF_ERROR(NewEvent(&done));
    err = cudaEventRecord(done, stream_);
    if (err == cudaSuccess && deferred) {
      const int64_t id = next_ticket_++;
      issued_[id] = done;
      return id;
    }
    // Compute work enqueued from now on reads the outputs, or reuses the buffers' memory.
    if (err == cudaSuccess) err = cudaStreamWaitEvent(compute_, done, 0);
    free_events_.push_back(done);
    if (err != cudaSuccess) return CudaError("collective", err);
    return 0;
  }

  absl::Status Wait(int64_t ticket) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = issued_.find(ticket);
    if (it == issued_.end()) return absl::OkStatus();
    const cudaEvent_t done = it->second;
    issued_.erase(it);
    const cudaError_t err = cudaStreamWaitEvent(compute_, done, 0);
    free_events_.push_back(done);
    if (err != cudaSuccess) return CudaError("wait", err);
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    std::lock_guard<std::mutex> lock(mu_);
    const cudaError_t err = cudaStreamSynchronize(stream_);
    if (err != cudaSuccess) return CudaError("synchronize", err);
    return absl::OkStatus();
  }

 private:
  absl::Status NewEvent(cudaEvent_t* e) {
    if (!free_events_.empty()) {
      *e = free_events_.back();
      free_events_.pop_back();
      return absl::OkStatus();
    }
    const cudaError_t err = cudaEventCreateWithFlags(e, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError("event", err);
    return absl::OkStatus();
  }

  std::mutex mu_;
  cudaStream_t stream_ = nullptr;   // the comm stream (nullptr: the legacy default stream)
  cudaStream_t compute_ = nullptr;  // the stream producing inputs and consuming outputs
  uint64_t* slot_ = nullptr;        // the stamp of the collective the comm stream is in
  cudaEvent_t inputs_ready_ = nullptr;
  std::map<int64_t, cudaEvent_t> issued_;  // deferred collectives' completion, until Wait
  std::vector<cudaEvent_t> free_events_;
  int64_t next_ticket_ = 1;
};

}  // namespace

absl::StatusOr<std::shared_ptr<RehearsalDevice>> MakeCudaRehearsalDevice() {
  auto d = std::make_shared<CudaDevice>();
  RETURN_IF_ERROR(d->Init());
  return std::shared_ptr<RehearsalDevice>(std::move(d));
}

}  // namespace ithaca
