// RMSNorm on the GPU against the CPU oracle (tagged gpu; skips where there is no GPU).
#include "engine/backend/cuda/rmsnorm.h"

#include <cmath>
#include <random>
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

TEST(CudaRmsNormTest, MatchesCpuOracleWithinBf16Tolerance) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA GPU on this machine: GPU test skipped";
  const int64_t rows = 37, d = 1000;  // not multiples of the block size
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> x(rows * d), w(d);
  for (float& v : x) v = Bf16ToFloat(FloatToBf16(n(rng)));
  for (float& v : w) v = Bf16ToFloat(FloatToBf16(1.f + 0.1f * n(rng)));
  std::vector<uint16_t> xb(x.size()), wb(w.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = FloatToBf16(x[i]).bits;
  for (size_t i = 0; i < w.size(); ++i) wb[i] = FloatToBf16(w[i]).bits;

  uint16_t *dx, *dw, *dout;
  float* drstd;
  cudaCheck(cudaMalloc(&dx, xb.size() * 2));
  cudaCheck(cudaMalloc(&dw, wb.size() * 2));
  cudaCheck(cudaMalloc(&dout, xb.size() * 2));
  cudaCheck(cudaMalloc(&drstd, rows * 4));
  cudaCheck(cudaMemcpy(dx, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
  cudaCheck(cudaMemcpy(dw, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice));
  cuda::RmsNormForward(dx, dw, 1e-5f, rows, d, dout, drstd, nullptr);
  std::vector<uint16_t> out(xb.size());
  std::vector<float> rstd(rows);
  cudaCheck(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost));
  cudaCheck(cudaMemcpy(rstd.data(), drstd, rows * 4, cudaMemcpyDeviceToHost));

  CpuOps cpu;
  std::vector<float> ref(x.size()), ref_rstd(rows);
  cpu.RmsNorm(Tensor(x.data(), DType::kF32, {rows, d}), Tensor(w.data(), DType::kF32, {d}), 1e-5f,
              Tensor(ref.data(), DType::kF32, {rows, d}),
              Tensor(ref_rstd.data(), DType::kF32, {rows}));
  for (int64_t r = 0; r < rows; ++r) EXPECT_NEAR(rstd[r], ref_rstd[r], 1e-4f * ref_rstd[r]);
  double max_err = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    max_err = std::max(max_err, std::abs(double(Bf16ToFloat(bf16{out[i]})) - ref[i]) /
                                    (std::abs(ref[i]) + 1e-2));
  EXPECT_LT(max_err, 1.6e-2) << "bf16 output rounding is 2^-8 relative";
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dout);
  cudaFree(drstd);
}

}  // namespace
}  // namespace ithaca
