#include "engine/comm/self_comm.h"

#include <cstring>

#include "engine/comm/comm_checks.h"

namespace ithaca {
namespace {

// In place (same pointer) is allowed for all_gather and reduce_scatter.
void CopyBytes(const Tensor& in, const Tensor& out) {
  if (in.data != out.data && in.bytes() > 0) std::memcpy(out.data, in.data, in.bytes());
}

}  // namespace

absl::Status SelfComm::AllGather(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckAllGather(in, out, 0, 1, Device::kCpu));
  CopyBytes(in, out);
  return absl::OkStatus();
}

absl::Status SelfComm::ReduceScatter(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckReduceScatter(in, out, 0, 1, Device::kCpu));
  CopyBytes(in, out);
  return absl::OkStatus();
}

absl::Status SelfComm::AllToAll(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckAllToAll(in, out, 1, Device::kCpu));
  CopyBytes(in, out);
  return absl::OkStatus();
}

absl::Status SelfComm::AllReduce(const Tensor& x) { return CheckAllReduce(x, Device::kCpu); }

absl::Status SelfComm::Broadcast(const Tensor& x, int root) {
  return CheckBroadcast(x, root, 1, Device::kCpu);
}

absl::Status SelfComm::SendRecv(const Tensor& send, int dst, const Tensor& recv, int src) {
  RETURN_IF_ERROR(CheckSendRecv(send, dst, recv, src, 0, 1, Device::kCpu));
  CopyBytes(send, recv);
  return absl::OkStatus();
}

absl::Status SelfComm::Barrier() { return absl::OkStatus(); }

absl::StatusOr<std::unique_ptr<Comm>> SelfComm::Split(int color, int key) {
  (void)key;
  if (color < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("split: rank 0 passed color ", color, "; colors must be >= 0"));
  }
  return std::unique_ptr<Comm>(new SelfComm());
}

}  // namespace ithaca
