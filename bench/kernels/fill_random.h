// Random device tensors for the kernel benchmarks, without uploading gigabytes from the host.
#pragma once

#include <algorithm>
#include <random>
#include <vector>

#include "engine/backend/cuda/cuda_ops.h"

namespace ithaca {
namespace bench {

// Fills t with a random normal pattern: one random block uploaded once, copied along the tensor
// (its prime length keeps the repeats out of step with any [rows, heads, dim] structure).
inline void FillRandom(CudaOps& ops, Allocator* alloc, const Tensor& t, uint64_t seed) {
  constexpr int64_t kBlock = 4194301;
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t n = std::min<int64_t>(kBlock, t.numel());
  std::vector<float> host(n);
  for (float& x : host) x = dist(gen);
  auto block = Buffer::Make(alloc, t.dtype, {n}, Tier::kActivations);
  ITHACA_CHECK(block.ok(), "allocation: ", block.status().ToString());
  ops.Upload(host.data(), DType::kF32, block->tensor());
  for (int64_t off = 0; off < t.numel(); off += n) {
    const int64_t len = std::min(n, t.numel() - off);
    ops.Copy(block->tensor().Slice(0, {len}), t.Slice(off, {len}));
  }
  ops.Synchronize();
}

}  // namespace bench
}  // namespace ithaca
