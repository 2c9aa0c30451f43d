// SelfComm: the communicator of a single-rank run (size 1, rank 0). Every collective is a copy
// or nothing, so single-rank jobs run the same schedule code with no library underneath.
#pragma once

#include <memory>

#include "engine/comm/comm.h"

namespace ithaca {

// Host (CPU) tensors only: CUDA single-rank runs use NcclComm with one rank, which keeps the
// copies ordered on the communicator's stream.
class SelfComm final : public Comm {
 public:
  SelfComm() = default;

  int rank() const override { return 0; }
  int size() const override { return 1; }

  absl::Status AllGather(const Tensor& in, const Tensor& out) override;
  absl::Status ReduceScatter(const Tensor& in, const Tensor& out) override;
  absl::Status AllToAll(const Tensor& in, const Tensor& out) override;
  absl::Status AllReduce(const Tensor& x) override;
  absl::Status Broadcast(const Tensor& x, int root) override;
  absl::Status Barrier() override;
  // dst == src == 0: a copy; any other peer is not a rank of this communicator.
  absl::Status SendRecv(const Tensor& send, int dst, const Tensor& recv, int src) override;
  // Negative colors are rejected (as in every backend); otherwise another SelfComm.
  absl::StatusOr<std::unique_ptr<Comm>> Split(int color, int key) override;
};

}  // namespace ithaca
