// CheckpointStore: the data each block saves for its backward (its input x, and with
// attention-aware checkpointing its attention output O and LSE), kept on the device
// (checkpoints tier) or offloaded to the host pool (host_offload tier) right after the block's
// forward, then brought back one block ahead of its backward (ALGORITHMS.md §4).
#pragma once

#include <vector>

#include "engine/backend/ops.h"
#include "engine/memory/allocator.h"

namespace ithaca {

struct SavedInputs {
  Buffer x, o, lse;  // o and lse are empty unless checkpointing is attention-aware
};

class CheckpointStore {
 public:
  // Blocks [num_blocks − keep_last, num_blocks) stay on the device even when offloading.
  CheckpointStore(Ops* ops, Allocator* alloc, int num_blocks, bool offload, int keep_last)
      : ops_(ops), alloc_(alloc), offload_(offload), keep_last_(keep_last), blocks_(num_blocks) {}

  // Takes block l's saved data (device buffers); offloaded blocks go to the host now.
  absl::Status Put(int l, SavedInputs saved);
  // Starts bringing block l's data back to the device (a no-op when it is there already).
  absl::Status Prefetch(int l);
  // Block l's data on the device; the store forgets it.
  absl::StatusOr<SavedInputs> Take(int l);
  // Block l's input on the device while the store keeps it: `copy` is a device copy of an
  // offloaded input (the host copy stays), else `copy` is empty and the resident input is
  // returned. For regrowing the blocks after it without holding it on the device twice.
  absl::StatusOr<Tensor> PeekInput(int l, Buffer* copy);
  bool offloaded(int l) const { return offload_ && l < static_cast<int>(blocks_.size()) - keep_last_; }

 private:
  struct Slot {
    SavedInputs device;
    SavedInputs host;
  };
  absl::Status Move(Buffer& from, Buffer& to, Tier tier);

  Ops* ops_;
  Allocator* alloc_;
  bool offload_;
  int keep_last_;
  std::vector<Slot> blocks_;
};

}  // namespace ithaca
