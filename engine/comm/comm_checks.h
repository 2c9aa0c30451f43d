// Argument checks and host-side helpers shared by every Comm implementation, so Gloo, NCCL and
// SelfComm reject the same misuse with the same message.
#pragma once

#include <cstddef>

#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace ithaca {

// INVALID_ARGUMENT unless `t` is on `device` and (when numel > 0) has data.
absl::Status CheckTensor(const char* op, const char* what, const Tensor& t, Device device);

// Shape and aliasing rules of Comm's collectives (comm.h), for rank `rank` of `size` ranks.
absl::Status CheckAllGather(const Tensor& in, const Tensor& out, int rank, int size, Device device);
absl::Status CheckReduceScatter(const Tensor& in, const Tensor& out, int rank, int size,
                                Device device);
absl::Status CheckAllToAll(const Tensor& in, const Tensor& out, int size, Device device);
absl::Status CheckAllReduce(const Tensor& x, Device device);
absl::Status CheckBroadcast(const Tensor& x, int root, int size, Device device);
absl::Status CheckSendRecv(const Tensor& send, int dst, const Tensor& recv, int src, int rank,
                           int size, Device device);

// True when the byte ranges [a, a + a_bytes) and [b, b + b_bytes) overlap.
bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes);

// dst[i] = Σ_k src[k · n + i] for k = 0, 1, ..., parts - 1, summed in that order (so every rank
// computes bit-identical results). bf16 accumulates in f32 and rounds once; i32 wraps.
void SumChunksInOrder(DType dtype, const void* src, int parts, size_t n, void* dst);

}  // namespace ithaca
