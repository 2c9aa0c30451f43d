// Comm: the collectives every distributed schedule is written against. gloo/ implements it over
// TCP for the CPU backend, nccl/ for GPUs; both run the exact same schedules.
//
// Conventions: every rank of the communicator calls the same collectives in the same order with
// tensors of the same dtype and element count. Tensors live on the backend's device. A peer that
// dies or stops answering gives an error (UNAVAILABLE or DEADLINE_EXCEEDED, naming the peer when
// known) within the communicator's timeout, never a hang. Misuse one rank can see by itself
// (shapes, dtypes, devices, overlapping buffers) is INVALID_ARGUMENT before anything is sent.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "engine/core/device_streams.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace ithaca {

class Comm;

// The arguments a rank passes to Comm::Split.
struct SplitArgs {
  int color = 0;
  int key = 0;
};

// A collective started by one of Comm's Issue* calls and not yet waited for ("issue now, wait at
// first use"). Until Wait, the collective's input must not be written, its output neither read
// nor written, and both must stay allocated. Wait makes the work issued after it (the compute
// stream's kernels on a GPU, the host on a CPU) see the output; its error, if any, is the
// collective's. Destroying an Issued that was not waited for waits (and drops the error: the
// communicator's next call reports it), so an early return never frees a buffer a collective
// still uses.
class Issued {
 public:
  Issued() = default;
  Issued(Comm* comm, int64_t id) : comm_(comm), id_(id) {}
  Issued(Issued&& other) noexcept { *this = std::move(other); }
  Issued& operator=(Issued&& other) noexcept;
  Issued(const Issued&) = delete;
  Issued& operator=(const Issued&) = delete;
  ~Issued() { Wait().IgnoreError(); }

  absl::Status Wait();
  bool pending() const { return comm_ != nullptr; }

 private:
  Comm* comm_ = nullptr;  // nullptr: complete (or never issued)
  int64_t id_ = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // out = the concatenation of every rank's `in`, in rank order; out.numel = size · in.numel.
  // In place when `in` is this rank's slot of `out`; any other overlap is rejected.
  virtual absl::Status AllGather(const Tensor& in, const Tensor& out) = 0;
  // `in` is size equal chunks; rank r receives the sum over ranks of chunk r in `out`.
  // In place when `out` is this rank's chunk of `in`; any other overlap is rejected.
  virtual absl::Status ReduceScatter(const Tensor& in, const Tensor& out) = 0;
  // `in` is size equal chunks; chunk j goes to rank j; out's chunk i is what rank i sent here.
  // `in` and `out` must not overlap.
  virtual absl::Status AllToAll(const Tensor& in, const Tensor& out) = 0;
  // x = Σ over ranks of x, in place.
  virtual absl::Status AllReduce(const Tensor& x) = 0;
  // x = root's x on every rank.
  virtual absl::Status Broadcast(const Tensor& x, int root) = 0;
  virtual absl::Status Barrier() = 0;

  // Point to point, both ways at once: `send` goes to rank `dst` while `recv` is filled with what
  // rank `src` sends here (ring attention's shift: every rank of a ring calls it together, with
  // dst = rank + 1 and src = rank − 1 mod size). `send` and `recv` have the same dtype and element
  // count and must not overlap. dst == src == rank() copies send into recv. Ranks outside the
  // exchange need not call it; a pair that sends one way only is not supported.
  virtual absl::Status SendRecv(const Tensor& send, int dst, const Tensor& recv, int src) = 0;

  // Issue-now forms of the collectives a schedule overlaps with compute (FSDP's gathers and
  // gradient reductions, UPipe's exchanges, the ring's shifts): the collective starts once the work
  // issued so far has produced `in`, and nothing issued later waits for it until the returned
  // Issued's Wait. Every rank issues the same collectives in the same order (as for the blocking
  // forms); waits may come in any order. Backends without an asynchronous path run the blocking
  // form and return an Issued that is already complete.
  virtual absl::StatusOr<Issued> IssueAllGather(const Tensor& in, const Tensor& out) {
    RETURN_IF_ERROR(AllGather(in, out));
    return Issued();
  }
  virtual absl::StatusOr<Issued> IssueReduceScatter(const Tensor& in, const Tensor& out) {
    RETURN_IF_ERROR(ReduceScatter(in, out));
    return Issued();
  }
  virtual absl::StatusOr<Issued> IssueAllToAll(const Tensor& in, const Tensor& out) {
    RETURN_IF_ERROR(AllToAll(in, out));
    return Issued();
  }
  virtual absl::StatusOr<Issued> IssueSendRecv(const Tensor& send, int dst, const Tensor& recv,
                                               int src) {
    RETURN_IF_ERROR(SendRecv(send, dst, recv, src));
    return Issued();
  }

  // Waits until every collective issued so far has completed, or fails within the timeout.
  // Backends whose collectives return only when done (Gloo, SelfComm) have nothing to wait for;
  // NCCL's asynchronous mode needs it before the host reads a result directly (not through the
  // compute stream NCCL is ordered with, whose own synchronization covers it).
  virtual absl::Status Synchronize() { return absl::OkStatus(); }

  // Has later collectives run on the backend's `streams` (Ops::streams()): enqueued on
  // streams.comm, ordered with the work on streams.compute by events, and returning without a
  // host wait, so a training step synchronizes only where it reads a result on the host. Call it
  // before Split: sub-communicators inherit it. Ignored by backends whose collectives complete
  // before returning (Gloo, SelfComm) and when the backend has no streams.
  virtual void UseStreams(const DeviceStreams& /*streams*/) {}

  // A sub-communicator of the ranks that pass the same `color`, ordered by `key` (then rank),
  // like MPI_Comm_split. Every rank of this communicator must call it.
  virtual absl::StatusOr<std::unique_ptr<Comm>> Split(int color, int key) = 0;

 protected:
  friend class Issued;
  // Orders what is issued next after the collective `id` (one an Issue* call returned), once.
  virtual absl::Status WaitIssued(int64_t id) {
    (void)id;
    return absl::OkStatus();
  }
};

inline Issued& Issued::operator=(Issued&& other) noexcept {
  if (this != &other) {
    Wait().IgnoreError();
    comm_ = other.comm_;
    id_ = other.id_;
    other.comm_ = nullptr;
  }
  return *this;
}

inline absl::Status Issued::Wait() {
  if (comm_ == nullptr) return absl::OkStatus();
  Comm* comm = comm_;
  comm_ = nullptr;
  return comm->WaitIssued(id_);
}

}  // namespace ithaca
