// The CPU AdamW of optimizer offload (memory.optimizer_offload): one fused pass over host memory
// that reads the f32 master weights, Adam m and v and the f32 gradient, and writes master, m, v
// and the working copy (bf16 or f32) that goes back to the device.
//
// It computes exactly what cpu::AdamW (engine/backend/cpu/kernels.h) and the CUDA AdamW kernel
// (engine/backend/cuda/adamw.cu) compute: the same f32 operations in the same order, no fused
// multiply-add (this file is built with -ffp-contract=off; the AVX2 path uses no FMA), IEEE
// square root and division, bf16 rounded to nearest even. So optimizer state on the host gives
// the same weights, bit for bit, as optimizer state on the device.
//
// It is memory-bound (30 bytes per parameter with a bf16 working copy: 16 read, 14 written), so
// it runs on every core of the host (HostThreadPool), 8 elements per AVX2 instruction where the
// CPU has AVX2 (a scalar loop elsewhere and for the tails).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/backend/ops.h"
#include "engine/core/dtype.h"

namespace ithaca {

// A fixed set of worker threads for data-parallel loops over host memory.
class HostThreadPool {
 public:
  // `threads` <= 0: one per core this process may run on (its CPU affinity).
  explicit HostThreadPool(int threads = 0);
  ~HostThreadPool();
  HostThreadPool(const HostThreadPool&) = delete;
  HostThreadPool& operator=(const HostThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }  // with the caller
  // Runs fn(begin, end) over [0, n) cut into at most size() contiguous pieces whose bounds are
  // multiples of `grain` (but the last), and returns when every piece is done. The calling
  // thread runs one piece; ranges shorter than 2·grain run on the caller alone. Not reentrant:
  // one ParallelFor at a time.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void Work(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  std::vector<std::pair<int64_t, int64_t>> pieces_;  // piece i + 1 is worker i's
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

// One contiguous run of elements to update: master, m, v (f32) and grad (f32) of n elements,
// and the working copy (n elements of `working_dtype`, kF32 or kBF16; nullptr: none).
struct HostAdamWSpan {
  float* master = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  void* working = nullptr;
  DType working_dtype = DType::kBF16;
  int64_t n = 0;
};

// The update of `s` with `p` (p.step is 1-based), on the pool's threads (nullptr: the caller's
// thread alone).
void HostAdamW(const HostAdamWSpan& s, const AdamWParams& p, HostThreadPool* pool);

// Elements [begin, end) of `s` on the calling thread; `vectorized` false forces the scalar loop
// (tests compare the two).
void HostAdamWRange(const HostAdamWSpan& s, const AdamWParams& p, int64_t begin, int64_t end,
                    bool vectorized = true);

// Optimizer offload stages gradients and working copies through two host buffers of at most
// this many elements each (64 MiB of f32): the unit of the host pipeline
// (engine/train/optimizer.h), which the planner counts (engine/plan).
inline constexpr int64_t kHostStageElements = int64_t{16} << 20;

// Whether this CPU runs the AVX2 loop.
bool HostAdamWVectorized();

}  // namespace ithaca
