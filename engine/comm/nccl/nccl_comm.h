// NcclComm: Comm over NCCL for GPU ranks (one process per GPU).
//
// Collectives are enqueued on the communicator's CUDA stream. With a compute stream set (the
// backend's), each one is ordered with it by events: the comm stream first waits for the work
// enqueued so far on the compute stream (the producers of the inputs, and earlier users of the
// buffers' memory), and work enqueued on the compute stream afterwards waits for the collective.
// A result is then usable by later compute work, and a buffer may go back to the
// compute-stream-ordered caching allocator, as soon as the call returns, without a host wait.
//
// The communicator runs in NCCL's non-blocking mode so that no NCCL call can hang the host: every
// wait polls ncclCommGetAsyncError and the collectives' events against the timeout, and a
// communicator that errs or times out is aborted (ncclCommAbort), its error returned and every
// later call failing with it. A collective's timeout runs from when the comm stream reaches it,
// so long compute before it is not a timeout. With `synchronous` (the default) each collective
// also waits for its completion before it returns, like Gloo. Without it, collectives return
// once enqueued, Synchronize() waits, and a watchdog thread aborts the communicator when one
// runs past the timeout, which also ends the kernels a blocked compute stream waits for, so the
// failure surfaces as the next call's error rather than a hang.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/comm.h"

namespace ithaca {

struct NcclOptions {
  // Bound on joining and on each wait: a dead or stuck peer gives an error, not a hang.
  double timeout_s = 60;
  // Wait for each collective to complete before returning (see above).
  bool synchronous = true;
  // The stream collectives are enqueued on; nullptr is the legacy default stream.
  cudaStream_t stream = nullptr;
  // The stream that produces the inputs and consumes the outputs (see above); nullptr, or
  // `stream` itself: the caller orders the collectives.
  cudaStream_t compute_stream = nullptr;
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
  // ncclSend and ncclRecv in one group (so a ring whose ranks all send first cannot deadlock);
  // dst == src == rank is NCCL's send to itself, a copy on the comm stream.
  absl::Status SendRecv(const Tensor& send, int dst, const Tensor& recv, int src) override;
  // Issue-now forms (Comm). With a compute stream set and asynchronous mode, the compute stream
  // waits for them only at Issued::Wait (an event on the comm stream); otherwise they are the
  // blocking forms.
  absl::StatusOr<Issued> IssueAllGather(const Tensor& in, const Tensor& out) override;
  absl::StatusOr<Issued> IssueReduceScatter(const Tensor& in, const Tensor& out) override;
  absl::StatusOr<Issued> IssueAllToAll(const Tensor& in, const Tensor& out) override;
  absl::StatusOr<Issued> IssueSendRecv(const Tensor& send, int dst, const Tensor& recv,
                                       int src) override;
  // Always waits for completion (it is a host-side barrier).
  absl::Status Barrier() override;
  absl::Status Synchronize() override;
  // ncclCommSplit. A negative color takes this rank out of every group (NCCL_SPLIT_NOCOLOR)
  // and returns INVALID_ARGUMENT here; the other ranks still get their groups.
  absl::StatusOr<std::unique_ptr<Comm>> Split(int color, int key) override;

  // Later collectives go on `stream`, ordered with `compute_stream` as NcclOptions says (for
  // nullptr, by the caller). Sub-communicators split off afterwards inherit both.
  void SetStreams(cudaStream_t stream, cudaStream_t compute_stream = nullptr);
  void set_synchronous(bool on);
  // SetStreams(streams.comm, streams.compute) and asynchronous mode, when streams.comm is set.
  void UseStreams(const DeviceStreams& streams) override;
  cudaStream_t stream() const { return options_.stream; }
  absl::Status health() const;

 protected:
  absl::Status WaitIssued(int64_t id) override;

 private:
  // A collective enqueued and not yet seen complete.
  struct InFlight {
    const char* op;
    cudaEvent_t started, done;  // on the comm stream, before and after the collective
    bool running = false;       // `started` was seen complete: the timeout runs from then
    std::chrono::steady_clock::time_point deadline;
  };

  NcclComm(ncclComm_t comm, int rank, int size, int device, const NcclOptions& options);
  absl::Status Init();
  std::string Name() const;
  bool Ordered() const;
  // The Issue* forms after their argument checks (takes mu_): Run, deferred, unless the
  // collective moves nothing.
  absl::StatusOr<Issued> Issue(const char* op, int64_t numel,
                               const std::function<ncclResult_t()>& enqueue);
  // The rest expect mu_ held.
  // Enqueues one collective (`enqueue` makes the NCCL call) between its events, ordered with the
  // compute stream; when `wait`, returns once it has completed. With `deferred` (and a compute
  // stream to order with, in asynchronous mode), the compute stream does not wait for it yet:
  // *deferred becomes the Issued whose Wait makes it.
  absl::Status Run(const char* op, bool wait, const std::function<ncclResult_t()>& enqueue,
                   Issued* deferred = nullptr);
  // Polls until the communicator has no operation in progress; aborts it on error or timeout.
  absl::Status WaitReady(const char* op);
  // Forgets completed collectives; aborts on an NCCL error or when the oldest collective has
  // run past the timeout. True when none is left in flight.
  absl::StatusOr<bool> Poll();
  // Polls until every collective enqueued so far has completed.
  absl::Status WaitDone();
  absl::Status Abort(absl::StatusCode code, const std::string& message);
  absl::Status Usable(const char* op) const;
  cudaEvent_t NewEvent();
  // The watchdog thread (asynchronous mode): Poll while collectives are in flight.
  void Watch();

  ncclComm_t comm_ = nullptr;
  int rank_;
  int size_;
  int device_;
  NcclOptions options_;
  void* barrier_word_ = nullptr;  // one device float the barrier all-reduces

  // Shared with the watchdog thread.
  mutable std::mutex mu_;
  absl::Status broken_;
  std::deque<InFlight> in_flight_;  // oldest first
  std::vector<cudaEvent_t> free_events_;
  cudaEvent_t inputs_ready_ = nullptr;  // recorded on the compute stream before a collective
  // Issued collectives not waited for yet: their completion events (on the comm stream), owned
  // here until the wait, so that recycling never hands one to a later collective.
  std::map<int64_t, cudaEvent_t> issued_;
  int64_t next_issued_ = 1;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace ithaca
