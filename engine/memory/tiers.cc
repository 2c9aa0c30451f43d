#include "engine/memory/tiers.h"

namespace ithaca {
namespace {

const char* const kNames[kNumTiers] = {
    "params", "grads",     "optimizer",         "attention",      "activations", "block_inputs",
    "comm",   "workspace", "host_block_inputs", "host_optimizer", "host_params"};

void RaiseTo(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load();
  while (value > seen && !peak.compare_exchange_weak(seen, value)) {
  }
}

}  // namespace

const char* TierName(Tier t) { return kNames[static_cast<int>(t)]; }

void MemoryTracker::OnAlloc(Tier t, size_t bytes) {
  int64_t now = current_[Idx(t)].fetch_add(bytes) + bytes;
  RaiseTo(peak_[Idx(t)], now);
  if (IsDeviceTier(t)) {
    const int64_t total = device_current_.fetch_add(bytes) + bytes;
    if (total > device_peak_.load()) {
      RaiseTo(device_peak_, total);
      SnapshotPeak();
    }
  }
}

void MemoryTracker::SnapshotPeak() {
  for (int i = 0; i < kNumTiers; ++i) at_peak_[i].store(current_[i].load());
}

void MemoryTracker::OnFree(Tier t, size_t bytes) {
  current_[Idx(t)].fetch_sub(bytes);
  if (IsDeviceTier(t)) device_current_.fetch_sub(bytes);
}

void MemoryTracker::ResetPeaks() {
  for (int i = 0; i < kNumTiers; ++i) peak_[i].store(current_[i].load());
  device_peak_.store(device_current_.load());
  SnapshotPeak();
}

}  // namespace ithaca
