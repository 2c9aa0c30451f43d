// Row-major GEMM on cuBLASLt: bf16 operands, f32 compute, C bf16 or f32 with beta accumulate.
// Algorithms are chosen per (shape, layout, alignment) and cached.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

namespace ithaca {
namespace cuda {

// LtGemm's `heuristic` that chooses per shape by timing (see LtGemm).
constexpr int kGemmTimed = -1;

class LtGemm {
 public:
  // How many of cuBLASLt's ranked algorithms kGemmTimed tries, and how many calls each.
  static constexpr int kTimedCandidates = 4;
  static constexpr int kTimedCallsEach = 3;

  // `workspace` (device, `workspace_bytes`) stays owned by the caller and outlives this object.
  // `heuristic`: which of cuBLASLt's ranked algorithms a shape runs.
  // - kGemmTimed: a shape's first kTimedCandidates · kTimedCallsEach calls run the first
  //   kTimedCandidates algorithms in turn, each call timed with CUDA events; from then on the
  //   shape runs the one with the shortest time. Every call is a real call (any algorithm gives
  //   the product, up to rounding), so accumulating GEMMs (beta 1) are timed too, and nothing
  //   runs twice. cuBLASLt's first choice is not always its fastest: at the MLP's
  //   4096×8192×2048 its third was 6 % faster on an H200.
  // - N >= 0: always the N-th (0: cuBLASLt's first); a shape with no more than N runs on
  //   cublasGemmEx. gemm_bench times each.
  LtGemm(cudaStream_t stream, void* workspace, size_t workspace_bytes, int heuristic = kGemmTimed);
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
  // One timed call of a candidate (kGemmTimed), read once its events have completed.
  struct Trial {
    int candidate;
    cudaEvent_t start, stop;
  };
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    // The algorithms this shape may run, in cuBLASLt's rank order: the first
    // kTimedCandidates (kGemmTimed) or the chosen one alone. Empty: no Lt algorithm,
    // cublasGemmEx runs it instead.
    std::vector<cublasLtMatmulAlgo_t> algos;
    // kGemmTimed: each candidate's shortest time so far (ms; < 0 none yet), the calls made and
    // the trials not yet read; `chosen` indexes `algos` once the timing is done.
    std::vector<float> best_ms;
    int calls = 0;
    std::vector<Trial> trials;
    int chosen = -1;
  };
  // m, n, k, lda, ldb, ldc, trans_a, trans_b, c_f32, the three alignments, and the bias
  // epilogue's (0: none).
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool,
                         int, int, int, int>;
  Plan* GetPlan(const Key& key);
  // The index into p->algos this call runs, and whether it is a timed trial (kGemmTimed).
  int NextAlgo(const Key& key, Plan* p, bool* timed);
  // Reads p's completed trials (all of them, waiting, with `wait`).
  static void ReadTrials(Plan* p, bool wait);
  // Drops candidate i (cuBLASLt refused the call with it).
  static void DropCandidate(Plan* p, int i);

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
