#include "engine/parallel/offload.h"

#include <utility>

namespace ithaca {

BlockInputStore::~BlockInputStore() {
  for (Slot& s : blocks_) Settle(s);
}

absl::Status BlockInputStore::Start(SavedInputs from, SavedInputs& to, Tier tier, Slot& slot) {
  Settle(slot);  // the slot's previous copy, if any, before its source is replaced
  slot.source = std::move(from);
  for (auto [src, dst] : {std::pair{&slot.source.x, &to.x}, std::pair{&slot.source.o, &to.o},
                          std::pair{&slot.source.lse, &to.lse}}) {
    if (src->empty()) continue;
    const Tensor& t = src->tensor();
    ASSIGN_OR_RETURN(*dst, Buffer::Make(alloc_, t.dtype, t.shape, tier));
    slot.fence = ops_->CopyAsync(t, dst->tensor());
  }
  return absl::OkStatus();
}

void BlockInputStore::Settle(Slot& slot) {
  if (slot.fence.pending()) ops_->WaitFence(slot.fence);
  slot.fence = Ops::Fence{};
  slot.source = SavedInputs{};
}

void BlockInputStore::SettleOffloads() {
  for (int l : offloading_) Settle(blocks_[l]);
  offloading_.clear();
}

absl::Status BlockInputStore::Put(int l, SavedInputs saved) {
  // The previous offload has had this block's forward to finish in; its device buffers go now.
  SettleOffloads();
  Slot& s = blocks_[l];
  if (!offloaded(l)) {
    s.device = std::move(saved);
    return absl::OkStatus();
  }
  offloading_.push_back(l);
  return Start(std::move(saved), s.host, Tier::kHostBlockInputs, s);
}

absl::Status BlockInputStore::Prefetch(int l) {
  if (l < 0) return absl::OkStatus();
  SettleOffloads();  // the host copy must be complete before it is read back
  Slot& s = blocks_[l];
  if (s.host.x.empty()) return absl::OkStatus();  // on the device, or on its way
  return Start(std::move(s.host), s.device, Tier::kBlockInputs, s);
}

absl::StatusOr<Tensor> BlockInputStore::PeekInput(int l, Buffer* copy) {
  SettleOffloads();
  Slot& s = blocks_[l];
  Settle(s);  // a prefetch in flight
  if (!s.device.x.empty()) return s.device.x.tensor();
  const Tensor& host = s.host.x.tensor();
  ASSIGN_OR_RETURN(*copy, Buffer::Make(alloc_, host.dtype, host.shape, Tier::kBlockInputs));
  ops_->WaitFence(ops_->CopyAsync(host, copy->tensor()));  // needed right away
  return copy->tensor();
}

absl::StatusOr<SavedInputs> BlockInputStore::Take(int l) {
  RETURN_IF_ERROR(Prefetch(l));
  Slot& s = blocks_[l];
  Settle(s);
  return std::move(s.device);
}

}  // namespace ithaca
