// What CudaOps' translation units share (cuda_ops.cc, cuda_ops_attention.cc): argument checks,
// bf16 views of tensors and the profiling scope. Private to the backend.
#pragma once

#include <cstdint>

#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/kernels.h"
#include "engine/backend/op_checks.h"

namespace ithaca {
namespace cuda_ops_internal {

constexpr OpChecks kCheck("CudaOps");

using cuda::ElemType;

inline ElemType Et(DType t) { return static_cast<ElemType>(static_cast<int>(t)); }

inline void CheckData(const Tensor& t, const char* op, const char* name) {
  ITHACA_CHECK(t.data != nullptr || t.numel() == 0, "CudaOps::", op, ": ", name, " has no data");
}

inline void CheckDType(const Tensor& t, DType want, const char* op, const char* name) {
  CheckData(t, op, name);
  kCheck.DTypeIs(t, want, op, name);
}

inline void CheckFloat(const Tensor& t, const char* op, const char* name) {
  CheckData(t, op, name);
  ITHACA_CHECK(t.dtype != DType::kI32, "CudaOps::", op, ": ", name, " is ", t.DebugString(),
               ", expected f32 or bf16");
}

inline const uint16_t* Bf(const Tensor& t) { return static_cast<const uint16_t*>(t.data); }
inline uint16_t* BfMut(const Tensor& t) { return static_cast<uint16_t*>(t.data); }

// A chunk (`chunk`, ring attention's) may have another number of keys than queries.
inline void CheckAttention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                           const char* op, bool chunk = false) {
  CheckDType(q, DType::kBF16, op, "q");
  CheckDType(k, DType::kBF16, op, "k");
  CheckDType(v, DType::kBF16, op, "v");
  CheckDType(lse, DType::kF32, op, "lse");
  ITHACA_CHECK(q.rank() == 3 && k.rank() == 3, "CudaOps::", op, ": q ", q.DebugString(), " and k ",
               k.DebugString(), " must be [S, H, D]");
  const int64_t s = q.dim(0), hq = q.dim(1), d = q.dim(2), hkv = k.dim(1);
  ITHACA_CHECK(d > 0 && hkv > 0 && hq % hkv == 0 && (chunk || k.dim(0) == s) && k.dim(2) == d,
               "CudaOps::", op, ": q ", q.DebugString(), " and k ", k.DebugString(),
               " are not a GQA pair");
  kCheck.Shape(v, k.shape, op, "v");
  kCheck.Shape(lse, {hq, s}, op, "lse");
}

}  // namespace cuda_ops_internal

// Brackets one op with events on the compute stream when profiling; free otherwise.
class CudaOps::Scope {
 public:
  Scope(CudaOps* ops, const char* op) : ops_(ops->opts_.profile ? ops : nullptr) {
    if (!ops_) return;
    span_ = Span{op, ops_->PoolEvent(), ops_->PoolEvent()};
    cudaCheck(cudaEventRecord(span_.a, ops_->compute_));
  }
  ~Scope() {
    if (!ops_) return;
    cudaCheck(cudaEventRecord(span_.b, ops_->compute_));
    ops_->spans_.push_back(span_);
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  CudaOps* ops_;
  Span span_{};
};

}  // namespace ithaca
