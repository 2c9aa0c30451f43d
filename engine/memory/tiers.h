// Memory tiers: every allocation is tagged with one, and every memory figure is per tier.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ithaca {

enum class Tier : uint8_t {
  kParams,       // bf16 working copy + gathered layer
  kGrads,        // gradient shards and a layer's full gradient
  kOptimizer,    // fp32 master weights, Adam m and v
  kAttention,    // Q/K/V/O/LSE, their all-to-all buffers, dQ/dK/dV
  kActivations,  // every other transient buffer
  // Block data saved in the forward for the backward, still on the device: each saved block's
  // input (memory.recompute), and its O and LSE under "attention-aware".
  kBlockInputs,
  kComm,       // collective staging
  kWorkspace,  // library workspaces (cuBLAS, cuDNN)
  // The same saved block data moved to pinned host memory (memory.offload).
  kHostBlockInputs,
  // Pinned host memory holding the optimizer's state under optimizer offload: f32 master
  // weights, Adam m and v, and the staging of a few units' gradients and working copies.
  kHostOptimizer,
  // Pinned host memory holding the bf16 working copy (this rank's shards) under
  // memory.param_offload; the device holds only the units being used and prefetched (params).
  kHostParams,
};
inline constexpr int kNumTiers = 11;

const char* TierName(Tier t);
inline bool IsDeviceTier(Tier t) {
  return t != Tier::kHostBlockInputs && t != Tier::kHostOptimizer && t != Tier::kHostParams;
}

// Current and peak bytes per tier. Thread-safe; cheap enough to call on every allocation.
class MemoryTracker {
 public:
  void OnAlloc(Tier t, size_t bytes);
  void OnFree(Tier t, size_t bytes);

  int64_t current(Tier t) const { return current_[Idx(t)].load(); }
  int64_t peak(Tier t) const { return peak_[Idx(t)].load(); }
  // Sum over device tiers now, and the highest that sum has been (not the sum of peaks).
  int64_t device_current() const { return device_current_.load(); }
  int64_t device_peak() const { return device_peak_.load(); }
  // Each tier's bytes at the moment the device total was highest (what the peak is made of).
  int64_t at_device_peak(Tier t) const { return at_peak_[Idx(t)].load(); }
  // Starts a new measurement window: peaks drop to the current values.
  void ResetPeaks();

 private:
  static int Idx(Tier t) { return static_cast<int>(t); }
  std::array<std::atomic<int64_t>, kNumTiers> current_{};
  std::array<std::atomic<int64_t>, kNumTiers> peak_{};
  std::atomic<int64_t> device_current_{0};
  std::atomic<int64_t> device_peak_{0};
  std::array<std::atomic<int64_t>, kNumTiers> at_peak_{};
  void SnapshotPeak();
};

}  // namespace ithaca
