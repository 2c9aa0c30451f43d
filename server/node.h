// Node: what this machine offers jobs: GPUs (index, UUID, name, memory) or, on a CPU node, a
// number of CPU slots (one rank each), and the host's memory.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include <string>
#include <vector>

namespace ithaca {

struct NodeDevice {
  int index = 0;
  std::string uuid;  // "GPU-…" from nvidia-smi; "" for a CPU slot
  std::string name;
  int64_t memory_bytes = 0;
};

struct Node {
  bool gpu = false;
  std::vector<NodeDevice> devices;  // one per slot
  int64_t host_memory_bytes = 0;
  std::string hostname;
  // On a GPU node: the cuDNN and NCCL loaded and built against (what workers will load).
  std::string libraries;
  int slots() const { return static_cast<int>(devices.size()); }
};

struct NodeOptions {
  static constexpr int kAutoGpus = -1;
  int gpus = 0;               // 0: a CPU node; kAutoGpus: as many as nvidia-smi lists
  int cpu_slots = 8;          // ranks on a CPU node
  double gpu_memory_gib = 0;  // per GPU when nvidia-smi cannot tell; 0: 80 GiB
};

// Queries nvidia-smi for the GPUs' UUIDs, names and memory when gpus > 0 (falls back to
// placeholders when it is missing) or kAutoGpus (a CPU node when it lists none), and the host's
// memory.
Node DetectNode(const NodeOptions& options);

// A node this daemon is not, to plan for (`ithaca plan --hardware`): a preset, "h100x1",
// "h100x8", "h200x1", "h200x8" (H100 SXM 80 GiB, H200 SXM 139.8 GiB as the device reports it;
// 2 TiB of host for 8 GPUs, 256 GiB for one, as DGX/HGX nodes and a cloud's one-GPU machines
// have), or "gpus=N,gpu_gib=G,host_gib=H" (every key needed), or a preset with such overrides
// ("h100x8,host_gib=1024"). INVALID_ARGUMENT naming the part that is wrong.
absl::StatusOr<Node> HardwareNode(const std::string& text);

}  // namespace ithaca
