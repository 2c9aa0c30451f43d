// CudaOps: shape/dtype validation (ITHACA_CHECK: a mismatch is a bug) around the launchers in
// kernels.h, rmsnorm.h, gemm.h and cudnn_attention.h.
#include "engine/backend/cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/cuda_ops_internal.h"
#include "engine/backend/cuda/cudnn_attention.h"
#include "engine/backend/cuda/gemm.h"
#include "engine/backend/cuda/kernels.h"
#include "engine/backend/cuda/peak_flops.h"
#include "engine/backend/cuda/rmsnorm.h"
#include "engine/backend/op_checks.h"

namespace ithaca {

using namespace cuda_ops_internal;  // NOLINT: the checks and views every op uses

namespace {

// Host-side conversion between the three dtypes (f32 <-> bf16; i32 only to i32).
void HostConvert(const void* src, DType sd, void* dst, DType dd, int64_t n, const char* op) {
  if (sd == dd) {
    std::memcpy(dst, src, static_cast<size_t>(n) * DTypeSize(sd));
  } else if (sd == DType::kF32 && dd == DType::kBF16) {
    const float* s = static_cast<const float*>(src);
    bf16* d = static_cast<bf16*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = FloatToBf16(s[i]);
  } else if (sd == DType::kBF16 && dd == DType::kF32) {
    const bf16* s = static_cast<const bf16*>(src);
    float* d = static_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = Bf16ToFloat(s[i]);
  } else {
    ITHACA_CHECK(false, "CudaOps::", op, ": cannot convert ", DTypeName(sd), " to ", DTypeName(dd));
  }
}

bool OnHost(const void* p) {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return true;
  }
  return a.type == cudaMemoryTypeHost || a.type == cudaMemoryTypeUnregistered;
}

}  // namespace

cudaEvent_t CudaOps::PoolEvent() {
  if (free_events_.empty()) {
    cudaEvent_t e;
    cudaCheck(cudaEventCreate(&e));
    return e;
  }
  cudaEvent_t e = free_events_.back();
  free_events_.pop_back();
  return e;
}

std::vector<CudaOps::ProfileRow> CudaOps::TakeProfile() {
  cudaCheck(cudaStreamSynchronize(compute_));
  std::map<std::string, ProfileRow> rows;
  for (const Span& sp : spans_) {
    float ms = 0;
    cudaCheck(cudaEventElapsedTime(&ms, sp.a, sp.b));
    ProfileRow& r = rows[sp.op];
    r.op = sp.op;
    r.ms += ms;
    r.calls += 1;
    free_events_.push_back(sp.a);
    free_events_.push_back(sp.b);
  }
  spans_.clear();
  std::vector<ProfileRow> out;
  for (auto& [name, r] : rows) out.push_back(r);
  std::sort(out.begin(), out.end(),
            [](const ProfileRow& x, const ProfileRow& y) { return x.ms > y.ms; });
  return out;
}

int64_t CudaOps::attention_workspace_bytes() const { return cudnn_->workspace_bytes(); }

CudaOps::CudaOps(const Options& opts) : opts_(opts) {
  ITHACA_CHECK(opts_.alloc != nullptr, "CudaOps needs an allocator");
  cudaCheck(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
  cudaCheck(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  cudaCheck(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking));
  cudaCheck(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
  // An allocator too small for these is an error in status() (MakeCudaBackend returns it), not
  // an abort; the GEMMs then run without a workspace.
  auto ws = Buffer::Make(opts_.alloc, DType::kBF16,
                         {static_cast<int64_t>(opts_.gemm_workspace_bytes / 2)}, Tier::kWorkspace);
  if (ws.ok()) {
    gemm_workspace_ = std::move(*ws);
  } else {
    Fail(absl::Status(ws.status().code(),
                      absl::StrCat("CudaOps: the GEMM workspace (", opts_.gemm_workspace_bytes,
                                   " bytes): ", ws.status().message())));
  }
  auto partials =
      Buffer::Make(opts_.alloc, DType::kF32, {2 * cuda::kMaxReduceBlocks}, Tier::kWorkspace);
  if (partials.ok()) {
    partials_ = std::move(*partials);
  } else {
    Fail(absl::Status(partials.status().code(), absl::StrCat("CudaOps: the reduction scratch: ",
                                                             partials.status().message())));
  }
  cudaCheck(cudaHostAlloc(reinterpret_cast<void**>(&host_partials_),
                          sizeof(double) * cuda::kMaxReduceBlocks, cudaHostAllocDefault));
  static_assert(cuda::kGemmTimed == -1, "Options::gemm_heuristic's default");
  gemm_ = std::make_unique<cuda::LtGemm>(compute_, gemm_workspace_.tensor().data,
                                         gemm_workspace_.tensor().bytes(), opts_.gemm_heuristic);
  cudnn_ = std::make_unique<cuda::CudnnAttention>(compute_, opts_.alloc, opts_.cudnn);
  int device = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    peak_flops_ = PeakBf16Flops(prop.name);
  }
}

CudaOps::~CudaOps() {
  for (cudaStream_t s : {compute_, copy_, comm_}) {
    if (s) cudaStreamSynchronize(s);
  }
  for (const InFlight& c : copies_) cudaEventDestroy(c.done);
  for (cudaEvent_t e : free_fences_) cudaEventDestroy(e);
  if (compute_mark_) cudaEventDestroy(compute_mark_);
  for (const Span& sp : spans_) {
    cudaEventDestroy(sp.a);
    cudaEventDestroy(sp.b);
  }
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  cudnn_.reset();
  gemm_.reset();
  gemm_workspace_.Reset();
  partials_.Reset();
  if (host_partials_) cudaFreeHost(host_partials_);
  for (cudaStream_t s : {compute_, copy_, comm_}) {
    if (s) cudaStreamDestroy(s);
  }
}

cudaStream_t CudaOps::stream(Stream s) const {
  switch (s) {
    case Stream::kCompute:
      return compute_;
    case Stream::kCopy:
      return copy_;
    case Stream::kComm:
      return comm_;
  }
  return compute_;
}

cudaEvent_t CudaOps::Record(Stream s) const {
  cudaEvent_t e;
  cudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  cudaCheck(cudaEventRecord(e, stream(s)));
  return e;
}

void CudaOps::Wait(Stream s, cudaEvent_t event) const {
  cudaCheck(cudaStreamWaitEvent(stream(s), event, 0));
}

void CudaOps::Synchronize() const {
  for (cudaStream_t s : {compute_, copy_, comm_}) cudaCheck(cudaStreamSynchronize(s));
}

// ---- Asynchronous transfers.

Ops::Fence CudaOps::CopyAsync(const Tensor& src, const Tensor& dst) {
  return IssueCopy(src, dst, /*after_compute=*/true);
}

Ops::Fence CudaOps::CopyAsyncUnordered(const Tensor& src, const Tensor& dst) {
  return IssueCopy(src, dst, /*after_compute=*/false);
}

Ops::Fence CudaOps::IssueCopy(const Tensor& src, const Tensor& dst, bool after_compute) {
  CheckData(src, "CopyAsync", "src");
  CheckData(dst, "CopyAsync", "dst");
  kCheck.Numel(dst, src.numel(), "CopyAsync", "dst");
  ITHACA_CHECK(src.dtype == dst.dtype, "CudaOps::CopyAsync: ", src.DebugString(), " to ",
               dst.DebugString(), ": dtypes differ");
  // src may have just been written on the compute stream, and dst's memory just freed there
  // (the caching allocator orders reuse on the compute stream): start after both (unless the
  // caller knows neither is the case: CopyAsyncUnordered).
  if (after_compute) {
    cudaCheck(cudaEventRecord(compute_mark_, compute_));
    cudaCheck(cudaStreamWaitEvent(copy_, compute_mark_, 0));
  }
  cudaCheck(cudaMemcpyAsync(dst.data, src.data, src.bytes(), cudaMemcpyDefault, copy_));
  cudaEvent_t done;
  if (free_fences_.empty()) {
    cudaCheck(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  } else {
    done = free_fences_.back();
    free_fences_.pop_back();
  }
  cudaCheck(cudaEventRecord(done, copy_));
  copies_.push_back({++last_ticket_, done});
  return Fence{last_ticket_};
}

void CudaOps::WaitFence(Fence fence) {
  ITHACA_CHECK(fence.ticket <= last_ticket_, "CudaOps::WaitFence: unknown fence ", fence.ticket);
  if (fence.ticket <= waited_ticket_) return;  // passed, or covered by a later fence
  Scope scope(this, "wait_copy");  // when profiling: how long compute stalls on the copy
  // The copy stream runs in issue order: waiting on this copy covers the older ones too, whose
  // events go back to the pool with it.
  while (!copies_.empty() && copies_.front().ticket <= fence.ticket) {
    const InFlight c = copies_.front();
    copies_.pop_front();
    if (c.ticket == fence.ticket) cudaCheck(cudaStreamWaitEvent(compute_, c.done, 0));
    free_fences_.push_back(c.done);
  }
  waited_ticket_ = fence.ticket;
}

void CudaOps::HostWaitFence(Fence fence) {
  ITHACA_CHECK(fence.ticket <= last_ticket_, "CudaOps::HostWaitFence: unknown fence ",
               fence.ticket);
  if (!fence.pending()) return;
  for (const InFlight& c : copies_) {
    if (c.ticket >= fence.ticket) {
      cudaCheck(cudaEventSynchronize(c.done));
      return;
    }
  }
  // A WaitFence already covered it (its event went back to the pool): the compute stream waits
  // for the copy, so the compute stream's end is after it.
  cudaCheck(cudaStreamSynchronize(compute_));
}

// ---- Memory movement and elementwise.

void CudaOps::Fill(const Tensor& x, float value) {
  Scope scope(this, "fill");
  CheckData(x, "Fill", "x");
  cuda::Fill(x.data, Et(x.dtype), x.numel(), value, compute_);
}

void CudaOps::Copy(const Tensor& src, const Tensor& dst) {
  // Offload traffic (one side pinned host) is told apart from device copies and conversions.
  const char* kind = !opts_.profile           ? "copy"
                     : OnHost(src.data)       ? "copy_h2d"
                     : OnHost(dst.data)       ? "copy_d2h"
                     : src.dtype == dst.dtype ? "copy_d2d"
                                              : "convert";
  Scope scope(this, kind);
  CheckData(src, "Copy", "src");
  CheckData(dst, "Copy", "dst");
  kCheck.Numel(dst, src.numel(), "Copy", "dst");
  ITHACA_CHECK(src.dtype == dst.dtype || (src.dtype != DType::kI32 && dst.dtype != DType::kI32),
               "CudaOps::Copy: cannot convert ", src.DebugString(), " to ", dst.DebugString());
  // Equal dtypes are a cudaMemcpyAsync with cudaMemcpyDefault, so either side may be pinned host
  // memory (offload).
  cuda::Convert(src.data, Et(src.dtype), dst.data, Et(dst.dtype), src.numel(), compute_);
}

void CudaOps::Copy2D(const Tensor& src, int64_t src_stride, const Tensor& dst, int64_t dst_stride,
                     int64_t rows, int64_t cols) {
  Scope scope(this, "copy2d");
  CheckData(src, "Copy2D", "src");
  CheckData(dst, "Copy2D", "dst");
  kCheck.Copy2D(src, src_stride, dst, dst_stride, rows, cols);
  if (rows == 0 || cols == 0) return;
  const size_t esz = DTypeSize(src.dtype);
  cudaCheck(cudaMemcpy2DAsync(dst.data, dst_stride * esz, src.data, src_stride * esz, cols * esz,
                              rows, cudaMemcpyDefault, compute_));
}

void CudaOps::Upload(const void* host, DType host_dtype, const Tensor& dst) {
  Scope scope(this, "upload");
  CheckData(dst, "Upload", "dst");
  const int64_t n = dst.numel();
  if (n == 0) return;
  ITHACA_CHECK(host != nullptr, "CudaOps::Upload: null host pointer");
  if (host_dtype == dst.dtype) {
    cudaCheck(cudaMemcpyAsync(dst.data, host, dst.bytes(), cudaMemcpyHostToDevice, compute_));
  } else {
    std::vector<char> staged(dst.bytes());
    HostConvert(host, host_dtype, staged.data(), dst.dtype, n, "Upload");
    cudaCheck(
        cudaMemcpyAsync(dst.data, staged.data(), dst.bytes(), cudaMemcpyHostToDevice, compute_));
    cudaCheck(cudaStreamSynchronize(compute_));  // `staged` dies here
    return;
  }
  cudaCheck(cudaStreamSynchronize(compute_));
}

void CudaOps::Download(const Tensor& src, void* host, DType host_dtype) {
  Scope scope(this, "download");
  CheckData(src, "Download", "src");
  const int64_t n = src.numel();
  if (n == 0) return;
  ITHACA_CHECK(host != nullptr, "CudaOps::Download: null host pointer");
  if (host_dtype == src.dtype) {
    cudaCheck(cudaMemcpyAsync(host, src.data, src.bytes(), cudaMemcpyDeviceToHost, compute_));
    cudaCheck(cudaStreamSynchronize(compute_));
    return;
  }
  std::vector<char> staged(src.bytes());
  cudaCheck(
      cudaMemcpyAsync(staged.data(), src.data, src.bytes(), cudaMemcpyDeviceToHost, compute_));
  cudaCheck(cudaStreamSynchronize(compute_));
  HostConvert(staged.data(), src.dtype, host, host_dtype, n, "Download");
}

void CudaOps::Axpy(float alpha, const Tensor& x, const Tensor& y) {
  Scope scope(this, "axpy");
  CheckDType(y, DType::kF32, "Axpy", "y");
  CheckFloat(x, "Axpy", "x");
  kCheck.Numel(x, y.numel(), "Axpy", "x");
  cuda::Axpy(alpha, x.data, Et(x.dtype), y.f32(), y.numel(), compute_);
}

double CudaOps::Reduce(const Tensor& x, bool squares, const char* op) {
  Scope scope(this, "reduce");
  CheckData(x, op, "x");
  if (x.numel() == 0) return 0.0;
  double* partials = static_cast<double*>(partials_.tensor().data);
  const int blocks =
      cuda::ReducePartials(x.data, Et(x.dtype), x.numel(), squares, partials, compute_);
  cudaCheck(cudaMemcpyAsync(host_partials_, partials, sizeof(double) * blocks,
                            cudaMemcpyDeviceToHost, compute_));
  cudaCheck(cudaStreamSynchronize(compute_));
  double total = 0.0;
  for (int i = 0; i < blocks; ++i) total += host_partials_[i];
  return total;
}

double CudaOps::SumSquares(const Tensor& x) { return Reduce(x, true, "SumSquares"); }
double CudaOps::Sum(const Tensor& x) { return Reduce(x, false, "Sum"); }

// Reduce's two kernels with the partials finished on the device: nothing waits. The partials
// scratch is reused in stream order.
void CudaOps::ReduceInto(const Tensor& x, bool squares, const Tensor& out, const char* op) {
  Scope scope(this, "reduce");
  CheckData(x, op, "x");
  CheckDType(out, DType::kF32, op, "out");
  kCheck.Numel(out, 1, op, "out");
  if (x.numel() == 0) {
    cuda::Fill(out.data, ElemType::kF32, 1, 0.f, compute_);
    return;
  }
  double* partials = static_cast<double*>(partials_.tensor().data);
  const int blocks =
      cuda::ReducePartials(x.data, Et(x.dtype), x.numel(), squares, partials, compute_);
  cuda::FinishReduce(partials, blocks, out.f32(), compute_);
}

void CudaOps::SumSquaresInto(const Tensor& x, const Tensor& out) {
  ReduceInto(x, true, out, "SumSquaresInto");
}
void CudaOps::SumInto(const Tensor& x, const Tensor& out) { ReduceInto(x, false, out, "SumInto"); }

// ---- Linear algebra.

void CudaOps::Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                   float alpha, float beta) {
  RunGemm(a, trans_a, b, trans_b, nullptr, c, alpha, beta, "Gemm");
}

// The bias rides in cuBLASLt's epilogue (LtGemm::Run), so it reads c once, as Gemm does.
void CudaOps::GemmBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                       const Tensor& bias, const Tensor& c, float alpha, float beta) {
  CheckDType(bias, DType::kBF16, "GemmBias", "bias");
  CheckDType(c, DType::kBF16, "GemmBias", "c");
  ITHACA_CHECK(!Overlap(c, bias), "CudaOps::GemmBias: c overlaps the bias");
  RunGemm(a, trans_a, b, trans_b, &bias, c, alpha, beta, "GemmBias");
}

void CudaOps::RunGemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                      const Tensor* bias, const Tensor& c, float alpha, float beta,
                      const char* op) {
  CheckDType(a, DType::kBF16, op, "a");
  CheckDType(b, DType::kBF16, op, "b");
  CheckFloat(c, op, "c");
  const OpChecks::Dims2 da = kCheck.View2D(a, op, "a"), db = kCheck.View2D(b, op, "b"),
                        dc = kCheck.View2D(c, op, "c");
  const int64_t m = trans_a ? da.cols : da.rows, k = trans_a ? da.rows : da.cols;
  const int64_t kb = trans_b ? db.cols : db.rows, n = trans_b ? db.rows : db.cols;
  ITHACA_CHECK(k == kb && dc.rows == m && dc.cols == n, "CudaOps::", op, ": op(a) ", m, "x", k,
               " (a ", a.DebugString(), trans_a ? "ᵀ" : "", ") times op(b) ", kb, "x", n, " (b ",
               b.DebugString(), trans_b ? "ᵀ" : "", ") does not fit c ", c.DebugString());
  ITHACA_CHECK(!Overlap(c, a) && !Overlap(c, b), "CudaOps::", op, ": c overlaps an input");
  if (bias) kCheck.Numel(*bias, n, op, "bias");
  const char* row = "gemm";
  if (opts_.profile && opts_.profile_gemm_shapes) {
    // m×n×k, a and b as used (N plain, T transposed), and what c receives: "=" (beta 0) or
    // "+=", "f32" for an f32 c, "+bias" with the epilogue.
    row = span_names_
              .insert(absl::StrFormat("gemm %dx%dx%d %c%c %s%s%s", m, n, k, trans_a ? 'T' : 'N',
                                      trans_b ? 'T' : 'N', c.dtype == DType::kF32 ? "f32" : "bf16",
                                      beta == 0.f ? "=" : "+=", bias ? "+bias" : ""))
              .first->c_str();
  }
  Scope scope(this, row);
  gemm_->Run(a.data, da.cols, trans_a, b.data, db.cols, trans_b, c.data, dc.cols,
             c.dtype == DType::kF32, m, n, k, alpha, beta, bias ? bias->data : nullptr);
}

// ---- Layers.

void CudaOps::Embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  Scope scope(this, "embedding");
  CheckDType(ids, DType::kI32, "Embedding", "ids");
  CheckDType(table, DType::kBF16, "Embedding", "table");
  CheckDType(out, DType::kBF16, "Embedding", "out");
  ITHACA_CHECK(table.rank() == 2, "CudaOps::Embedding: table is ", table.DebugString());
  const int64_t tokens = ids.numel(), d = table.dim(1);
  kCheck.Shape(out, {tokens, d}, "Embedding", "out");
  cuda::EmbeddingForward(ids.i32(), tokens, Bf(table), table.dim(0), d, BfMut(out), compute_);
}

void CudaOps::EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  Scope scope(this, "embedding_bwd");
  CheckDType(ids, DType::kI32, "EmbeddingBackward", "ids");
  CheckDType(dout, DType::kBF16, "EmbeddingBackward", "dout");
  CheckFloat(dtable, "EmbeddingBackward", "dtable");
  ITHACA_CHECK(dtable.rank() == 2, "CudaOps::EmbeddingBackward: dtable is ", dtable.DebugString());
  const int64_t tokens = ids.numel(), d = dtable.dim(1);
  kCheck.Shape(dout, {tokens, d}, "EmbeddingBackward", "dout");
  cuda::EmbeddingBackward(ids.i32(), tokens, Bf(dout), dtable.dim(0), d, dtable.data,
                          Et(dtable.dtype), compute_);
}

void CudaOps::RmsNorm(const Tensor& x, const Tensor& w, float eps, const Tensor& out,
                      const Tensor& rstd) {
  Scope scope(this, "rmsnorm");
  CheckDType(x, DType::kBF16, "RmsNorm", "x");
  CheckDType(w, DType::kBF16, "RmsNorm", "w");
  CheckDType(out, DType::kBF16, "RmsNorm", "out");
  CheckDType(rstd, DType::kF32, "RmsNorm", "rstd");
  const OpChecks::Dims2 d2 = kCheck.View2D(x, "RmsNorm", "x");
  kCheck.Shape(w, {d2.cols}, "RmsNorm", "w");
  kCheck.Shape(out, x.shape, "RmsNorm", "out");
  kCheck.Numel(rstd, d2.rows, "RmsNorm", "rstd");
  cuda::RmsNormForward(Bf(x), Bf(w), eps, d2.rows, d2.cols, BfMut(out), rstd.f32(), compute_);
}

void CudaOps::RmsNormBackward(const Tensor& x, const Tensor& w, const Tensor& rstd,
                              const Tensor& dout, const Tensor& dx, const Tensor& dw) {
  Scope scope(this, "rmsnorm_bwd");
  const char* op = "RmsNormBackward";
  CheckDType(x, DType::kBF16, op, "x");
  CheckDType(w, DType::kBF16, op, "w");
  CheckDType(rstd, DType::kF32, op, "rstd");
  CheckDType(dout, DType::kBF16, op, "dout");
  CheckDType(dx, DType::kBF16, op, "dx");
  CheckDType(dw, DType::kF32, op, "dw");
  const OpChecks::Dims2 d2 = kCheck.View2D(x, op, "x");
  kCheck.Shape(w, {d2.cols}, op, "w");
  kCheck.Shape(dw, {d2.cols}, op, "dw");
  kCheck.Numel(rstd, d2.rows, op, "rstd");
  kCheck.Shape(dout, x.shape, op, "dout");
  kCheck.Shape(dx, x.shape, op, "dx");
  cuda::RmsNormBackward(Bf(x), Bf(w), rstd.f32(), Bf(dout), d2.rows, d2.cols, BfMut(dx), dw.f32(),
                        compute_);
}

void CudaOps::RmsNormBackwardInPlace(const Tensor& x, const Tensor& w, float eps,
                                     const Tensor& grad, const Tensor& dw) {
  Scope scope(this, "rmsnorm_bwd");
  const char* op = "RmsNormBackwardInPlace";
  CheckDType(x, DType::kBF16, op, "x");
  CheckDType(w, DType::kBF16, op, "w");
  CheckDType(grad, DType::kBF16, op, "grad");
  CheckDType(dw, DType::kF32, op, "dw");
  const OpChecks::Dims2 d2 = kCheck.View2D(x, op, "x");
  kCheck.Shape(w, {d2.cols}, op, "w");
  kCheck.Shape(dw, {d2.cols}, op, "dw");
  kCheck.Shape(grad, x.shape, op, "grad");
  ITHACA_CHECK(!Overlap(grad, x), "CudaOps::", op, ": grad overlaps x");
  cuda::RmsNormBackwardInPlace(Bf(x), Bf(w), eps, BfMut(grad), d2.rows, d2.cols, dw.f32(),
                               compute_);
}

void CudaOps::SwiGLU(const Tensor& gate, const Tensor& up, const Tensor& out) {
  Scope scope(this, "swiglu");
  CheckDType(gate, DType::kBF16, "SwiGLU", "gate");
  CheckDType(up, DType::kBF16, "SwiGLU", "up");
  CheckDType(out, DType::kBF16, "SwiGLU", "out");
  kCheck.Shape(up, gate.shape, "SwiGLU", "up");
  kCheck.Shape(out, gate.shape, "SwiGLU", "out");
  cuda::SwiGLUForward(Bf(gate), Bf(up), BfMut(out), gate.numel(), compute_);
}

void CudaOps::SwiGLUBackward(const Tensor& gate, const Tensor& up, const Tensor& dout,
                             const Tensor& dgate, const Tensor& dup) {
  Scope scope(this, "swiglu_bwd");
  const char* op = "SwiGLUBackward";
  for (const Tensor* t : {&gate, &up, &dout, &dgate, &dup}) {
    CheckDType(*t, DType::kBF16, op, "operand");
    kCheck.Shape(*t, gate.shape, op, "operand");
  }
  cuda::SwiGLUBackward(Bf(gate), Bf(up), Bf(dout), BfMut(dgate), BfMut(dup), gate.numel(),
                       compute_);
}

void CudaOps::CrossEntropy(const Tensor& logits, const Tensor& labels, const Tensor& losses,
                           const Tensor& dlogits, float grad_scale) {
  Scope scope(this, "cross_entropy");
  const char* op = "CrossEntropy";
  CheckFloat(logits, op, "logits");
  CheckDType(labels, DType::kI32, op, "labels");
  CheckDType(losses, DType::kF32, op, "losses");
  CheckDType(dlogits, logits.dtype, op, "dlogits");
  ITHACA_CHECK(logits.rank() == 2, "CudaOps::", op, ": logits is ", logits.DebugString(),
               ", expected [T, V]");
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  kCheck.Shape(labels, {tokens}, op, "labels");
  kCheck.Shape(losses, {tokens}, op, "losses");
  kCheck.Shape(dlogits, logits.shape, op, "dlogits");
  cuda::CrossEntropy(logits.data, Et(logits.dtype), labels.i32(), tokens, vocab, losses.f32(),
                     dlogits.data, grad_scale, compute_);
}

void CudaOps::LabelIsArgmax(const Tensor& logits, const Tensor& labels, const Tensor& hits) {
  Scope scope(this, "label_is_argmax");
  const char* op = "LabelIsArgmax";
  CheckFloat(logits, op, "logits");
  CheckDType(labels, DType::kI32, op, "labels");
  CheckDType(hits, DType::kF32, op, "hits");
  ITHACA_CHECK(logits.rank() == 2, "CudaOps::", op, ": logits is ", logits.DebugString(),
               ", expected [T, V]");
  const int64_t tokens = logits.dim(0), vocab = logits.dim(1);
  ITHACA_CHECK(vocab < (int64_t{1} << 24), "CudaOps::", op, ": vocabulary of ", vocab,
               " is over 2^24");
  kCheck.Shape(labels, {tokens}, op, "labels");
  kCheck.Shape(hits, {tokens}, op, "hits");
  cuda::LabelIsArgmax(logits.data, Et(logits.dtype), labels.i32(), tokens, vocab, hits.f32(),
                      compute_);
}

void CudaOps::AdamW(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                    const Tensor& working, const AdamWParams& p) {
  Scope scope(this, "adamw");
  const char* op = "AdamW";
  CheckDType(master, DType::kF32, op, "master");
  CheckDType(m, DType::kF32, op, "m");
  CheckDType(v, DType::kF32, op, "v");
  CheckFloat(grad, op, "grad");
  const int64_t n = master.numel();
  for (const Tensor* t : {&grad, &m, &v}) kCheck.Numel(*t, n, op, "operand");
  ITHACA_CHECK(p.step >= 1, "CudaOps::", op, ": step ", p.step, " is not 1-based");
  const bool has_working = working.data != nullptr;
  if (has_working) {
    CheckFloat(working, op, "working");
    kCheck.Numel(working, n, op, "working");
  }
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  cuda::AdamWArgs a;
  a.lr = p.lr;
  a.beta1 = p.beta1;
  a.beta2 = p.beta2;
  a.eps = p.eps;
  a.weight_decay = p.weight_decay;
  a.grad_scale = p.grad_scale;
  a.step_size = static_cast<float>(static_cast<double>(p.lr) / bc1);
  a.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  cuda::AdamW(master.f32(), grad.data, Et(grad.dtype), m.f32(), v.f32(),
              has_working ? working.data : nullptr,
              has_working ? Et(working.dtype) : ElemType::kBF16, n, a, compute_);
}

}  // namespace ithaca
