// RMSNorm on the GPU against the CPU oracle (tagged gpu; skips where there is no GPU). The shapes
// cover every team size of the vector path (d from 8 to 16384, rows not multiples of the rows per
// block, more rows than one wave of backward blocks) and the scalar fallback (d % 8 != 0, and an
// aligned d on views that are not 16-byte aligned).
#include "engine/backend/cuda/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/core/dtype.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Normal(mean, sigma) values rounded to bf16 (so both sides see the same numbers), and their bits.
std::vector<float> RandnBf16(int64_t n, uint32_t seed, float mean = 0.f, float sigma = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = Bf16ToFloat(FloatToBf16(dist(rng)));
  return v;
}
std::vector<uint16_t> Bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = FloatToBf16(v[i]).bits;
  return b;
}

// A device copy of `host` starting `offset` elements into its allocation (offset 1 makes it
// 2-byte but not 16-byte aligned). Freed with the object.
template <typename T>
class DeviceArray {
 public:
  DeviceArray(const std::vector<T>& host, int offset) {
    cudaCheck(cudaMalloc(&base_, (host.size() + 8) * sizeof(T)));
    ptr_ = base_ + offset;
    cudaCheck(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    n_ = host.size();
  }
  ~DeviceArray() { cudaFree(base_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return ptr_; }
  std::vector<T> ToHost() const {
    std::vector<T> h(n_);
    cudaCheck(cudaMemcpy(h.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* base_ = nullptr;
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

std::vector<float> Floats(const std::vector<uint16_t>& bits) {
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = Bf16ToFloat(bf16{bits[i]});
  return f;
}

// max over i of |got − want| / (|want| + floor): bf16 outputs round to 2^-9 relative.
double MaxRelErr(const std::vector<float>& got, const std::vector<float>& want, double floor) {
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    m = std::max(m, std::abs(double(got[i]) - want[i]) / (std::abs(want[i]) + floor));
  }
  return m;
}

struct Shape2 {
  int64_t rows, d;
  int offset;  // elements: 1 forces the scalar path on a d % 8 == 0 shape
};

class CudaRmsNormTest : public ::testing::TestWithParam<Shape2> {};

TEST_P(CudaRmsNormTest, ForwardAndAccumulatingBackwardMatchCpuOracle) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA GPU on this machine: GPU test skipped";
  const auto [rows, d, offset] = GetParam();
  const std::vector<float> x = RandnBf16(rows * d, 1), w = RandnBf16(d, 2, 1.f, 0.1f);
  const std::vector<float> g = RandnBf16(rows * d, 3), dx0 = RandnBf16(rows * d, 4);
  const std::vector<float> dw0 = RandnBf16(d, 5);  // f32, nonzero: dw is accumulated

  DeviceArray<uint16_t> dev_x(Bits(x), offset), dev_w(Bits(w), offset), dev_g(Bits(g), offset);
  DeviceArray<uint16_t> dev_out(std::vector<uint16_t>(x.size(), 0x7fc0), offset);  // NaN
  DeviceArray<uint16_t> dev_dx(Bits(dx0), offset);
  DeviceArray<float> dev_rstd(std::vector<float>(rows, NAN), 0), dev_dw(dw0, 0);
  cuda::RmsNormForward(dev_x.get(), dev_w.get(), 1e-5f, rows, d, dev_out.get(), dev_rstd.get(),
                       nullptr);
  cuda::RmsNormBackward(dev_x.get(), dev_w.get(), dev_rstd.get(), dev_g.get(), rows, d,
                        dev_dx.get(), dev_dw.get(), nullptr);
  cudaCheck(cudaDeviceSynchronize());

  CpuOps cpu;
  std::vector<float> xc = x, wc = w, gc = g, out(x.size()), rstd(rows), dx = dx0, dw = dw0;
  const Tensor tx(xc.data(), DType::kF32, {rows, d}), tw(wc.data(), DType::kF32, {d});
  const Tensor trstd(rstd.data(), DType::kF32, {rows});
  cpu.RmsNorm(tx, tw, 1e-5f, Tensor(out.data(), DType::kF32, {rows, d}), trstd);
  cpu.RmsNormBackward(tx, tw, trstd, Tensor(gc.data(), DType::kF32, {rows, d}),
                      Tensor(dx.data(), DType::kF32, {rows, d}),
                      Tensor(dw.data(), DType::kF32, {d}));

  const std::vector<float> got_rstd = dev_rstd.ToHost();
  for (int64_t r = 0; r < rows; ++r) ASSERT_NEAR(got_rstd[r], rstd[r], 1e-4f * rstd[r]) << r;
  EXPECT_LT(MaxRelErr(Floats(dev_out.ToHost()), out, 1e-2), 1.6e-2) << "out: bf16 rounding";
  EXPECT_LT(MaxRelErr(Floats(dev_dx.ToHost()), dx, 1e-2), 1.6e-2) << "dx (+= on a nonzero dx)";
  double dw_scale = 0;
  for (float v : dw) dw_scale = std::max(dw_scale, double(std::abs(v)));
  EXPECT_LT(MaxRelErr(dev_dw.ToHost(), dw, dw_scale), 1e-5) << "dw (+= in f32)";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaRmsNormTest,
    ::testing::Values(Shape2{37, 1000, 0},    // one warp a row, 4 vectors a thread
                      Shape2{3001, 2048, 0},  // the engine's d; more rows than a backward wave
                      Shape2{13, 4096, 0},    // teams of several warps, 2 rows a block
                      Shape2{5, 8192, 0},     // a team per block: one dw atomic per thread
                      Shape2{3, 16384, 0},    // the largest backward team (512 threads)
                      Shape2{50, 64, 0},      // the tiny test model: 8 lanes of 32 busy
                      Shape2{1, 8, 0},        // one vector
                      Shape2{301, 2050, 0},   // scalar: d % 8 != 0
                      Shape2{37, 1000, 1},    // scalar: views not 16-byte aligned
                      Shape2{600, 3, 0}),     // scalar: d smaller than a warp
    [](const ::testing::TestParamInfo<Shape2>& info) {
      return "rows" + std::to_string(info.param.rows) + "_d" + std::to_string(info.param.d) +
             (info.param.offset ? "_unaligned" : "");
    });

}  // namespace
}  // namespace ithaca
