// NcclComm: Comm over NCCL for GPU ranks (one process per GPU).
//
// Collectives are enqueued on the communicator's CUDA stream. The communicator runs in NCCL's
// non-blocking mode so that no NCCL call can hang the host: every wait polls
// ncclCommGetAsyncError against the timeout, and a communicator that errs or times out is
// aborted (ncclCommAbort), its error returned and every later call failing with it.
// With `synchronous` (the default) each collective also waits for its completion before it
// returns, like Gloo; without it, collectives return once enqueued and Synchronize() waits.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "engine/comm/comm.h"

namespace ithaca {

struct NcclOptions {
  // Bound on joining and on each wait: a dead or stuck peer gives an error, not a hang.
  double timeout_s = 60;
  // Wait for each collective to complete before returning (see above).
  bool synchronous = true;
  // The stream collectives are enqueued on; nullptr is the legacy default stream.
  cudaStream_t stream = nullptr;
};

class NcclComm final : public Comm {
 public:
  // Joins `world` ranks meeting at `rendezvous` ("file:/abs/dir"): rank 0 makes the NCCL unique
  // id and publishes it there, the others wait for it. `gpu` >= 0 is made the current device
  // first (else the current device is used). World 1 needs no rendezvous ("" is accepted).
  static absl::StatusOr<std::unique_ptr<NcclComm>> Create(int rank, int world,
                                                          const std::string& rendezvous, int gpu,
                                                          const NcclOptions& options = {});
  // Joins with a unique id the caller already shared (e.g. handed out by the daemon).
  static absl::StatusOr<std::unique_ptr<NcclComm>> CreateFromId(int rank, int world,
                                                                const ncclUniqueId& id, int gpu,
                                                                const NcclOptions& options = {});
  static absl::StatusOr<ncclUniqueId> NewUniqueId();
  ~NcclComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // bf16, f32 and i32 on CUDA tensors; reductions are sums.
  absl::Status AllGather(const Tensor& in, const Tensor& out) override;
  absl::Status ReduceScatter(const Tensor& in, const Tensor& out) override;
  absl::Status AllToAll(const Tensor& in, const Tensor& out) override;
  absl::Status AllReduce(const Tensor& x) override;
  absl::Status Broadcast(const Tensor& x, int root) override;
  // Always waits for completion (it is a host-side barrier).
  absl::Status Barrier() override;
  absl::Status Synchronize() override;
  // ncclCommSplit. A negative color takes this rank out of every group (NCCL_SPLIT_NOCOLOR)
  // and returns INVALID_ARGUMENT here; the other ranks still get their groups.
  absl::StatusOr<std::unique_ptr<Comm>> Split(int color, int key) override;

  // Later collectives go on `stream` (the caller orders it after the producers of their inputs).
  void SetStream(cudaStream_t stream) { options_.stream = stream; }
  cudaStream_t stream() const { return options_.stream; }
  absl::Status health() const { return broken_; }
  ncclComm_t raw() const { return comm_; }

 private:
  NcclComm(ncclComm_t comm, int rank, int size, int device, const NcclOptions& options);
  absl::Status Init();
  std::string Name() const;
  // Polls until the communicator has no operation in progress; aborts it on error or timeout.
  absl::Status WaitReady(const char* op);
  // After enqueueing `op` (which returned `res`): records completion and, when synchronous,
  // waits for it.
  absl::Status Finish(const char* op, ncclResult_t res, bool wait);
  absl::Status WaitDone(const char* op);
  absl::Status Abort(absl::StatusCode code, const std::string& message);
  absl::Status Usable(const char* op) const;

  ncclComm_t comm_ = nullptr;
  int rank_;
  int size_;
  int device_;
  NcclOptions options_;
  cudaEvent_t done_ = nullptr;  // recorded after the latest collective
  void* barrier_word_ = nullptr;  // one device float the barrier all-reduces
  absl::Status broken_;
};

}  // namespace ithaca
