#include "engine/parallel/offload.h"

namespace ithaca {

absl::Status CheckpointStore::Move(Buffer& from, Buffer& to, Tier tier) {
  if (from.empty()) return absl::OkStatus();
  const Tensor& t = from.tensor();
  ASSIGN_OR_RETURN(to, Buffer::Make(alloc_, t.dtype, t.shape, tier));
  ops_->Copy(t, to.tensor());
  from.Reset();
  return absl::OkStatus();
}

absl::Status CheckpointStore::Put(int l, SavedInputs saved) {
  Slot& s = blocks_[l];
  s.device = std::move(saved);
  if (!offloaded(l)) return absl::OkStatus();
  RETURN_IF_ERROR(Move(s.device.x, s.host.x, Tier::kHostOffload));
  RETURN_IF_ERROR(Move(s.device.o, s.host.o, Tier::kHostOffload));
  return Move(s.device.lse, s.host.lse, Tier::kHostOffload);
}

absl::Status CheckpointStore::Prefetch(int l) {
  if (l < 0) return absl::OkStatus();
  Slot& s = blocks_[l];
  RETURN_IF_ERROR(Move(s.host.x, s.device.x, Tier::kCheckpoints));
  RETURN_IF_ERROR(Move(s.host.o, s.device.o, Tier::kCheckpoints));
  return Move(s.host.lse, s.device.lse, Tier::kCheckpoints);
}

absl::StatusOr<Tensor> CheckpointStore::PeekInput(int l, Buffer* copy) {
  Slot& s = blocks_[l];
  if (!s.device.x.empty()) return s.device.x.tensor();
  const Tensor& host = s.host.x.tensor();
  ASSIGN_OR_RETURN(*copy, Buffer::Make(alloc_, host.dtype, host.shape, Tier::kCheckpoints));
  ops_->Copy(host, copy->tensor());
  return copy->tensor();
}

absl::StatusOr<SavedInputs> CheckpointStore::Take(int l) {
  RETURN_IF_ERROR(Prefetch(l));
  return std::move(blocks_[l].device);
}

}  // namespace ithaca
