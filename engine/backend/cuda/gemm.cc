// LtGemm: row-major GEMMs through cuBLASLt's column-major API.
//
// A row-major [r, c] matrix is the column-major [c, r] matrix with the same bytes, so
// row-major C = op(A)·op(B) is computed as column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's first
// operand is b and its second a, with the transpose flags kept.
#include "engine/backend/cuda/gemm.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels.h"

#define cublasCheck(call) ::ithaca::cuda::CublasCheckImpl((call), #call, __FILE__, __LINE__)

namespace ithaca {
namespace cuda {

inline void CublasCheckImpl(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s:%d: cuBLAS error %d in %s\n", file, line, static_cast<int>(s), what);
    std::abort();
  }
}

namespace {

// The bias alignment below which Run does not ask for the epilogue (16 bytes: one vector of 8
// bf16). The projections' biases are slices at whole heads (head_dim · 2 bytes), well above.
constexpr int kBiasAlignment = 16;

// Largest power of two (up to 256) dividing the address: cuBLASLt picks kernels by alignment.
int Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

}  // namespace

LtGemm::LtGemm(cudaStream_t stream, void* workspace, size_t workspace_bytes, int heuristic)
    : stream_(stream),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      heuristic_(heuristic) {
  cublasCheck(cublasLtCreate(&lt_));
  cublasCheck(cublasCreate(&blas_));
  cublasCheck(cublasSetStream(blas_, stream_));
  cublasCheck(cublasSetWorkspace(blas_, workspace_, workspace_bytes_));
}

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) {
    for (const Trial& t : p.trials) {
      cudaEventDestroy(t.start);
      cudaEventDestroy(t.stop);
    }
    if (p.la) cublasLtMatrixLayoutDestroy(p.la);
    if (p.lb) cublasLtMatrixLayoutDestroy(p.lb);
    if (p.lc) cublasLtMatrixLayoutDestroy(p.lc);
    if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  }
  if (blas_) cublasDestroy(blas_);
  if (lt_) cublasLtDestroy(lt_);
}

LtGemm::Plan* LtGemm::GetPlan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return &it->second;
  const auto [m, n, k, lda, ldb, ldc, trans_a, trans_b, c_f32, al_a, al_b, al_c, al_bias] = key;
  Plan p;
  cublasCheck(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Lt's first operand is b, its second a (see the file comment).
  const cublasOperation_t op1 = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op2 = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasCheck(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op1, sizeof(op1)));
  cublasCheck(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op2, sizeof(op2)));
  if (al_bias > 0) {
    // Column-major D is [n, m]: a bias of length n (D's rows) broadcast over its m columns, i.e.
    // row-major c's every row. The pointer is set per call (Run).
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                               sizeof(epilogue)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                               &bias_type, sizeof(bias_type)));
  }
  // Stored (pre-op) column-major shapes: b is [n, k] (or [k, n]), a is [k, m] (or [m, k]).
  cublasCheck(
      cublasLtMatrixLayoutCreate(&p.la, CUDA_R_16BF, trans_b ? k : n, trans_b ? n : k, ldb));
  cublasCheck(
      cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_16BF, trans_a ? m : k, trans_a ? k : m, lda));
  cublasCheck(cublasLtMatrixLayoutCreate(&p.lc, c_f32 ? CUDA_R_32F : CUDA_R_16BF, n, m, ldc));
  cublasLtMatmulPreference_t pref;
  cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &workspace_bytes_, sizeof(workspace_bytes_)));
  const uint32_t a1 = al_b, a2 = al_a, a3 = al_c;
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                   &a1, sizeof(a1)));
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                   &a2, sizeof(a2)));
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                   &a3, sizeof(a3)));
  cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                   &a3, sizeof(a3)));
  const int wanted = heuristic_ == kGemmTimed ? kTimedCandidates : heuristic_ + 1;
  std::vector<cublasLtMatmulHeuristicResult_t> results(wanted);
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, p.desc, p.la, p.lb, p.lc, p.lc,
                                                           pref, wanted, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_SUCCESS && heuristic_ == kGemmTimed) {
    for (int i = 0; i < found; ++i) p.algos.push_back(results[i].algo);
    p.best_ms.assign(p.algos.size(), -1.f);
    if (p.algos.size() <= 1) p.chosen = 0;  // nothing to choose between
  } else if (st == CUBLAS_STATUS_SUCCESS && found > heuristic_) {
    p.algos.push_back(results[heuristic_].algo);
    p.chosen = 0;
  }
  return &plans_.emplace(key, std::move(p)).first->second;
}

void LtGemm::ReadTrials(Plan* p, bool wait) {
  size_t kept = 0;
  for (const Trial& t : p->trials) {
    const cudaError_t done = wait ? cudaEventSynchronize(t.stop) : cudaEventQuery(t.stop);
    if (done == cudaErrorNotReady) {  // read at a later call
      p->trials[kept++] = t;
      continue;
    }
    cudaCheck(done);
    float ms = 0;
    cudaCheck(cudaEventElapsedTime(&ms, t.start, t.stop));
    float& best = p->best_ms[t.candidate];
    if (best < 0 || ms < best) best = ms;
    cudaCheck(cudaEventDestroy(t.start));
    cudaCheck(cudaEventDestroy(t.stop));
  }
  p->trials.resize(kept);
}

void LtGemm::DropCandidate(Plan* p, int i) {
  ReadTrials(p, /*wait=*/true);  // the trials' indices move with the erase
  p->algos.erase(p->algos.begin() + i);
  p->best_ms.erase(p->best_ms.begin() + i);
  if (p->chosen >= 0) p->chosen = 0;  // a fixed algorithm refused: the fallback runs
  if (p->algos.size() == 1) p->chosen = 0;
}

int LtGemm::NextAlgo(const Key& key, Plan* p, bool* timed) {
  *timed = false;
  if (p->chosen >= 0) return p->chosen;
  const int n = static_cast<int>(p->algos.size());
  if (p->calls < n * kTimedCallsEach) {
    ReadTrials(p, /*wait=*/false);
    *timed = true;
    return p->calls++ % n;
  }
  // Every candidate has had its calls: keep the fastest.
  ReadTrials(p, /*wait=*/true);
  p->chosen = 0;
  for (int i = 1; i < n; ++i) {
    if (p->best_ms[i] >= 0 &&
        (p->best_ms[p->chosen] < 0 || p->best_ms[i] < p->best_ms[p->chosen])) {
      p->chosen = i;
    }
  }
  if (p->chosen != 0) {
    const auto [m, nn, k, lda, ldb, ldc, trans_a, trans_b, c_f32, al_a, al_b, al_c, al_bias] = key;
    std::fprintf(stderr,
                 "LtGemm: %lldx%lldx%lld %c%c %s%s: cuBLASLt's algorithm %d, %.3f ms against its "
                 "first's %.3f ms\n",
                 static_cast<long long>(m), static_cast<long long>(nn), static_cast<long long>(k),
                 trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', c_f32 ? "f32" : "bf16",
                 al_bias > 0 ? " +bias" : "", p->chosen + 1, p->best_ms[p->chosen], p->best_ms[0]);
  }
  return p->chosen;
}

void LtGemm::Run(const void* a, int64_t lda, bool trans_a, const void* b, int64_t ldb, bool trans_b,
                 void* c, int64_t ldc, bool c_f32, int64_t m, int64_t n, int64_t k, float alpha,
                 float beta, const void* bias) {
  if (m == 0 || n == 0) return;
  if (bias != nullptr && c_f32) {
    std::fprintf(stderr, "LtGemm: a bias needs a bf16 c\n");
    std::abort();
  }
  if (k == 0) {
    // Nothing to multiply: c = beta · c. Rare (empty tiles); Lt rejects k = 0.
    if (beta == 1.f && bias == nullptr) return;
    std::fprintf(stderr, "LtGemm: k = 0 with beta != 1 or a bias is not supported\n");
    std::abort();
  }
  if (bias != nullptr && Alignment(bias) < kBiasAlignment) {
    // Not asked of the epilogue (on an H200 cuda_ops_test's GemmBias, whose cases include a bias
    // 6 bytes into its buffer, aborted with CUBLAS_STATUS_NOT_SUPPORTED from cublasLtMatmul):
    // the plain GEMM and the bias kernel.
    Run(a, lda, trans_a, b, ldb, trans_b, c, ldc, c_f32, m, n, k, alpha, beta, nullptr);
    AddBiasRows(static_cast<uint16_t*>(c), ldc, m, n, static_cast<const uint16_t*>(bias), stream_);
    return;
  }
  const Key key{m,
                n,
                k,
                lda,
                ldb,
                ldc,
                trans_a,
                trans_b,
                c_f32,
                Alignment(a),
                Alignment(b),
                Alignment(c),
                bias != nullptr ? Alignment(bias) : 0};
  Plan* p = GetPlan(key);
  if (bias != nullptr && !p->algos.empty()) {
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof(bias)));
  }
  while (!p->algos.empty()) {
    bool timed = false;
    const int i = NextAlgo(key, p, &timed);
    Trial t{i, nullptr, nullptr};
    if (timed) {
      cudaCheck(cudaEventCreate(&t.start));
      cudaCheck(cudaEventCreate(&t.stop));
      cudaCheck(cudaEventRecord(t.start, stream_));
    }
    const cublasStatus_t st =
        cublasLtMatmul(lt_, p->desc, &alpha, b, p->la, a, p->lb, &beta, c, p->lc, c, p->lc,
                       &p->algos[i], workspace_, workspace_bytes_, stream_);
    if (timed) {
      cudaCheck(cudaEventRecord(t.stop, stream_));
      if (st == CUBLAS_STATUS_SUCCESS) {
        p->trials.push_back(t);
      } else {
        cudaCheck(cudaEventDestroy(t.start));
        cudaCheck(cudaEventDestroy(t.stop));
      }
    }
    if (st != CUBLAS_STATUS_NOT_SUPPORTED || bias == nullptr) {
      cublasCheck(st);
      return;
    }
    // The algorithm took the layout but not this bias (rejected before launch, so c is
    // untouched): the next candidate, or where none is left the fallback, from now on.
    DropCandidate(p, i);
  }
  if (bias != nullptr) {
    // No Lt kernel with the epilogue for this layout: the plain GEMM, then the bias kernel.
    Run(a, lda, trans_a, b, ldb, trans_b, c, ldc, c_f32, m, n, k, alpha, beta, nullptr);
    AddBiasRows(static_cast<uint16_t*>(c), ldc, m, n, static_cast<const uint16_t*>(bias), stream_);
    return;
  }
  // No Lt kernel for this layout (odd leading dimensions, say): cublasGemmEx takes anything.
  cublasCheck(cublasGemmEx(blas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                           trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n),
                           static_cast<int>(m), static_cast<int>(k), &alpha, b, CUDA_R_16BF,
                           static_cast<int>(ldb), a, CUDA_R_16BF, static_cast<int>(lda), &beta, c,
                           c_f32 ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(ldc),
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace cuda
}  // namespace ithaca
