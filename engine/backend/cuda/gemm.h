// Row-major GEMM on cuBLASLt: bf16 operands, f32 compute, C bf16 or f32 with beta accumulate.
// Algorithms are chosen once per (shape, layout, alignment) and cached.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace ithaca {
namespace cuda {

class LtGemm {
 public:
  // `workspace` (device, `workspace_bytes`) stays owned by the caller and outlives this object.
  // `heuristic`: which of cuBLASLt's ranked algorithms for a shape runs (0: the first); a shape
  // with no more than that many runs on cublasGemmEx.
  LtGemm(cudaStream_t stream, void* workspace, size_t workspace_bytes, int heuristic = 0);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Row-major c[m, n] = alpha · op(a) · op(b) + beta · c, op(x) = xᵀ when trans_x.
  // a: [m, k] (or [k, m] when trans_a), leading dimension lda (its row length); b likewise
  // [k, n] (or [n, k]) with ldb; c [m, n] with ldc. a, b bf16; c bf16 (c_f32 false) or f32.
  // `bias` (bf16 [n], c bf16), when not null, is added to every row of c after alpha and beta,
  // in the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS); where that cannot run (a bias aligned to
  // less than 16 bytes, no Lt kernel with the epilogue for the layout, or one that refuses the
  // call) the plain GEMM runs and a kernel of its own adds the bias.
  void Run(const void* a, int64_t lda, bool trans_a, const void* b, int64_t ldb, bool trans_b,
           void* c, int64_t ldc, bool c_f32, int64_t m, int64_t n, int64_t k, float alpha,
           float beta, const void* bias = nullptr);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulAlgo_t algo;
    bool ok = false;  // false: no Lt algorithm; cublasGemmEx runs it instead
  };
  // m, n, k, lda, ldb, ldc, trans_a, trans_b, c_f32, the three alignments, and the bias
  // epilogue's (0: none).
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool,
                         int, int, int, int>;
  Plan* GetPlan(const Key& key);

  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  int heuristic_;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::map<Key, Plan> plans_;
};

}  // namespace cuda
}  // namespace ithaca
