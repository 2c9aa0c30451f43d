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

#include "engine/core/device_streams.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace ithaca {

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
};

}  // namespace ithaca
