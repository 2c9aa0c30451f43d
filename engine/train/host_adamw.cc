#include "engine/train/host_adamw.h"

#include <sched.h>

#include <algorithm>
#include <cmath>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ITHACA_HOST_ADAMW_AVX2 1
#endif

namespace ithaca {

namespace {

// The cores this process may run on: its affinity (a launcher or a rehearsal may give each rank
// its share of the node), else every core.
int UsableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

HostThreadPool::HostThreadPool(int threads) {
  if (threads <= 0) threads = UsableCores();
  for (int i = 0; i + 1 < threads; ++i) workers_.emplace_back([this, i] { Work(i); });
}

HostThreadPool::~HostThreadPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void HostThreadPool::Work(int index) {
  uint64_t seen = 0;
  for (;;) {
    std::pair<int64_t, int64_t> piece;
    const std::function<void(int64_t, int64_t)>* fn;
    {
      std::unique_lock<std::mutex> l(mu_);
      start_.wait(l, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (static_cast<size_t>(index) + 1 >= pieces_.size()) continue;  // no piece this time
      piece = pieces_[index + 1];
      fn = fn_;
    }
    (*fn)(piece.first, piece.second);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void HostThreadPool::ParallelFor(int64_t n, int64_t grain,
                                 const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t grains = (n + grain - 1) / grain;
  const int64_t parts = std::min<int64_t>(size(), grains);
  if (parts <= 1 || n < 2 * grain) {
    fn(0, n);
    return;
  }
  const int64_t per = (grains + parts - 1) / parts * grain;
  std::pair<int64_t, int64_t> mine;
  {
    std::lock_guard<std::mutex> l(mu_);
    pieces_.clear();
    for (int64_t b = 0; b < n; b += per) pieces_.push_back({b, std::min(n, b + per)});
    fn_ = &fn;
    pending_ = static_cast<int>(pieces_.size()) - 1;
    mine = pieces_[0];
    ++generation_;
  }
  start_.notify_all();
  fn(mine.first, mine.second);
  std::unique_lock<std::mutex> l(mu_);
  done_.wait(l, [&] { return pending_ == 0; });
}

namespace {

// The constants of one update, computed as cpu::AdamW computes them.
struct Coefficients {
  float decay, b1, b2, one_minus_b1, one_minus_b2, step_size, inv_sqrt_bc2, eps, scale;
};

Coefficients CoefficientsFor(const AdamWParams& p) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  Coefficients c;
  c.decay = 1.f - p.lr * p.weight_decay;
  c.b1 = p.beta1;
  c.b2 = p.beta2;
  c.one_minus_b1 = 1.f - p.beta1;
  c.one_minus_b2 = 1.f - p.beta2;
  c.step_size = static_cast<float>(static_cast<double>(p.lr) / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.eps = p.eps;
  c.scale = p.grad_scale;
  return c;
}

void ScalarRange(const HostAdamWSpan& s, const Coefficients& c, int64_t begin, int64_t end) {
  uint16_t* bf = s.working_dtype == DType::kBF16 ? static_cast<uint16_t*>(s.working) : nullptr;
  float* f32 = s.working_dtype == DType::kF32 ? static_cast<float*>(s.working) : nullptr;
  for (int64_t i = begin; i < end; ++i) {
    const float g = s.grad[i] * c.scale;
    float w = s.master[i] * c.decay;
    const float mi = c.b1 * s.m[i] + c.one_minus_b1 * g;
    const float vi = c.b2 * s.v[i] + c.one_minus_b2 * g * g;
    w -= c.step_size * mi / (std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps);
    s.m[i] = mi;
    s.v[i] = vi;
    s.master[i] = w;
    if (bf != nullptr) bf[i] = FloatToBf16(w).bits;
    if (f32 != nullptr) f32[i] = w;
  }
}

#ifdef ITHACA_HOST_ADAMW_AVX2
// The scalar loop's operations, 8 lanes at a time (multiplies and adds kept apart: no FMA).
__attribute__((target("avx2"))) void Avx2Range(const HostAdamWSpan& s, const Coefficients& c,
                                               int64_t begin, int64_t end) {
  uint16_t* bf = s.working_dtype == DType::kBF16 ? static_cast<uint16_t*>(s.working) : nullptr;
  float* f32 = s.working_dtype == DType::kF32 ? static_cast<float*>(s.working) : nullptr;
  const __m256 decay = _mm256_set1_ps(c.decay), b1 = _mm256_set1_ps(c.b1),
               b2 = _mm256_set1_ps(c.b2), omb1 = _mm256_set1_ps(c.one_minus_b1),
               omb2 = _mm256_set1_ps(c.one_minus_b2), step = _mm256_set1_ps(c.step_size),
               inv = _mm256_set1_ps(c.inv_sqrt_bc2), eps = _mm256_set1_ps(c.eps),
               scale = _mm256_set1_ps(c.scale);
  const __m256i one = _mm256_set1_epi32(1), round = _mm256_set1_epi32(0x7fff),
                quiet = _mm256_set1_epi32(0x40);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(s.grad + i), scale);
    __m256 w = _mm256_mul_ps(_mm256_loadu_ps(s.master + i), decay);
    const __m256 mi =
        _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(s.m + i)), _mm256_mul_ps(omb1, g));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(s.v + i)),
                                    _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    const __m256 den = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), inv), eps);
    w = _mm256_sub_ps(w, _mm256_div_ps(_mm256_mul_ps(step, mi), den));
    _mm256_storeu_ps(s.m + i, mi);
    _mm256_storeu_ps(s.v + i, vi);
    _mm256_storeu_ps(s.master + i, w);
    if (bf != nullptr) {
      // FloatToBf16 on 8 lanes: round to nearest even, NaN kept quiet.
      const __m256i u = _mm256_castps_si256(w);
      const __m256i high = _mm256_srli_epi32(u, 16);
      __m256i r = _mm256_srli_epi32(
          _mm256_add_epi32(_mm256_add_epi32(u, round), _mm256_and_si256(high, one)), 16);
      const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(w, w, _CMP_UNORD_Q));
      r = _mm256_blendv_epi8(r, _mm256_or_si256(high, quiet), nan);
      // 8 × u32 (each < 2^16) → 8 × u16: pack within the 128-bit lanes, then join them.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(bf + i), _mm256_castsi256_si128(packed));
    }
    if (f32 != nullptr) _mm256_storeu_ps(f32 + i, w);
  }
  ScalarRange(s, c, i, end);
}
#endif

}  // namespace

bool HostAdamWVectorized() {
#ifdef ITHACA_HOST_ADAMW_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}

void HostAdamWRange(const HostAdamWSpan& s, const AdamWParams& p, int64_t begin, int64_t end,
                    bool vectorized) {
  const Coefficients c = CoefficientsFor(p);
#ifdef ITHACA_HOST_ADAMW_AVX2
  if (vectorized && HostAdamWVectorized()) {
    Avx2Range(s, c, begin, end);
    return;
  }
#endif
  (void)vectorized;
  ScalarRange(s, c, begin, end);
}

void HostAdamW(const HostAdamWSpan& s, const AdamWParams& p, HostThreadPool* pool) {
  // 64 KiB of f32 per piece at least: a thread's start costs more than a smaller piece's work.
  constexpr int64_t kGrain = 16384;
  if (pool == nullptr) {
    HostAdamWRange(s, p, 0, s.n);
    return;
  }
  pool->ParallelFor(s.n, kGrain,
                    [&](int64_t begin, int64_t end) { HostAdamWRange(s, p, begin, end); });
}

}  // namespace ithaca
