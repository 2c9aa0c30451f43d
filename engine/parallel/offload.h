// BlockInputStore: the data each block saves for its backward (its input x, and with
// attention-aware recompute its attention output O and LSE), kept on the device
// (block_inputs tier) or offloaded to the host pool (host_block_inputs tier) right after the
// block's forward, then brought back one block ahead of its backward (docs/schedules.md).
//
// Transfers run on the backend's copy stream (Ops::CopyAsync), overlapping compute. A copy's
// source and destination both stay allocated until the compute stream has waited on its fence:
// an offloaded block's device buffers until the next Put (one block of compute later), a
// prefetched block's host buffers until Take.
#pragma once

#include <vector>

#include "engine/backend/ops.h"
#include "engine/memory/allocator.h"

namespace ithaca {

struct SavedInputs {
  Buffer x, o, lse;  // o and lse are empty unless the recompute policy is attention-aware
};

class BlockInputStore {
 public:
  // Blocks [num_blocks − keep_last, num_blocks) stay on the device even when offloading.
  BlockInputStore(Ops* ops, Allocator* alloc, int num_blocks, bool offload, int keep_last)
      : ops_(ops), alloc_(alloc), offload_(offload), keep_last_(keep_last), blocks_(num_blocks) {}
  // Orders the compute stream after every copy still in flight before their buffers are freed.
  ~BlockInputStore();
  BlockInputStore(const BlockInputStore&) = delete;
  BlockInputStore& operator=(const BlockInputStore&) = delete;

  // Takes block l's saved data (device buffers); offloaded blocks start their copy to the host.
  absl::Status Put(int l, SavedInputs saved);
  // Starts bringing block l's data back to the device (a no-op when it is there already).
  absl::Status Prefetch(int l);
  // Block l's data on the device, ready for the ops enqueued next; the store forgets it.
  absl::StatusOr<SavedInputs> Take(int l);
  // Block l's input on the device while the store keeps it: `copy` is a device copy of an
  // offloaded input (the host copy stays), else `copy` is empty and the resident input is
  // returned. For regrowing the blocks after it without holding it on the device twice.
  absl::StatusOr<Tensor> PeekInput(int l, Buffer* copy);
  bool offloaded(int l) const {
    return offload_ && l < static_cast<int>(blocks_.size()) - keep_last_;
  }

 private:
  struct Slot {
    SavedInputs device;
    SavedInputs host;
    SavedInputs source;  // the source of the copy in flight (device or host buffers)
    Ops::Fence fence;    // that copy's end (covers the slot's earlier copies)
  };
  // Moves `from` into slot.source and starts copying each of its buffers into a new `tier`
  // buffer of `to`.
  absl::Status Start(SavedInputs from, SavedInputs& to, Tier tier, Slot& slot);
  // Later compute work waits for the slot's copy; then its source is freed.
  void Settle(Slot& slot);
  // Settles the device→host copies Put started.
  void SettleOffloads();

  Ops* ops_;
  Allocator* alloc_;
  bool offload_;
  int keep_last_;
  std::vector<Slot> blocks_;
  std::vector<int> offloading_;  // blocks whose device→host copy is not settled yet
};

}  // namespace ithaca
