// CudaOps: rotary embedding and attention, with the documents of packed samples (DocumentMask):
// cuDNN's fused attention (ragged when there are documents) or the own flash kernel, and at long
// S the own Hopper forward and backward kernels.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_ops_internal.h"
#include "engine/backend/cuda/cudnn_attention.h"
#include "engine/backend/cuda/hopper_attention.h"

namespace ithaca {

using namespace cuda_ops_internal;  // NOLINT: the checks and views every op uses

namespace {

// Validates a DocumentMask against a sequence of s tokens (s < 0: any length).
void CheckDocuments(const DocumentMask& docs, int64_t s, const char* op) {
  ITHACA_CHECK(docs.window >= 0, "CudaOps::", op, ": a sliding window of ", docs.window, " keys");
  if (docs.trivial()) return;
  ITHACA_CHECK(docs.starts[0] == 0, "CudaOps::", op, ": the first document starts at ",
               docs.starts[0], ", not 0");
  for (size_t i = 1; i < docs.starts.size(); ++i) {
    ITHACA_CHECK(docs.starts[i] > docs.starts[i - 1], "CudaOps::", op, ": document ", i,
                 " starts at ", docs.starts[i], ", not after ", docs.starts[i - 1]);
  }
  ITHACA_CHECK(s < 0 || docs.starts.back() < s, "CudaOps::", op, ": document ",
               docs.starts.size() - 1, " starts at ", docs.starts.back(), ", past the ", s,
               " tokens");
}

// Powers of two: the ragged graphs are built per (batch, max_len) bucket, not per layout.
int64_t Bucket(int64_t n) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return b;
}

constexpr size_t kMaxDocumentEntries = 32;

// The documents of the tokens [pos0, pos0 + n) of a sample, in their own coordinates (the first
// starts at 0): a diagonal chunk of ring attention as the whole-sequence kernels see it.
DocumentMask DocumentsOf(const DocumentMask& docs, int64_t pos0, int64_t n) {
  DocumentMask local{{}, docs.window};
  if (docs.trivial()) return local;
  local.starts.push_back(0);
  for (int64_t st : docs.starts) {
    if (st > pos0 && st < pos0 + n) local.starts.push_back(st - pos0);
  }
  if (local.starts.size() == 1) local.starts.clear();
  return local;
}

// Validates a chunk's q [Sq, Hq, D], k, v [Sk, Hkv, D] (bf16), lse f32 [Hq, Sq] and positions.
void CheckChunk(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                int64_t q_pos0, int64_t k_pos0, const char* op) {
  CheckAttention(q, k, v, lse, op, /*chunk=*/true);
  ITHACA_CHECK(q_pos0 >= 0 && k_pos0 >= 0, "CudaOps::", op, ": positions ", q_pos0, ", ", k_pos0);
}

}  // namespace

AttentionKernel CudaOps::KernelFor(AttentionPass pass, int64_t s, int64_t hq, int64_t hkv,
                                   int64_t d, const void* q, const void* k, const void* v,
                                   const void* o, const void* dout, const float* lse,
                                   const void* dq, const void* dk, const void* dv,
                                   const DocumentMask& docs) {
  const bool backward = pass == AttentionPass::kBackward;
  const char* name = backward ? "backward" : "forward";
  const AttentionShape shape{s, d, !docs.trivial(), docs.window};
  AttentionChoice choice =
      ChooseAttention(pass, shape, backward ? opts_.attention_backward : opts_.attention_forward);
  if (opts_.probe_window > 0) {
    // The memory probe's window: the own Hopper kernels' (their workspace is the dQ accumulator
    // the planner counts); cuDNN's causal band where they do not run (below), never "flash".
    ITHACA_CHECK(choice.kernel != AttentionKernel::kFlash,
                 "CudaOps: the memory probe's attention window needs the Hopper kernels or cuDNN, "
                 "not \"flash\"");
    choice = {AttentionKernel::kHopper, "the memory probe's window"};
  }
  if (choice.kernel == AttentionKernel::kHopper) {
    const char* unsupported =
        !cuda::HopperAttentionBuilt() ? "built without CUTLASS"
        : !cuda::HopperAttentionDeviceSupported()
            ? "the GPU is not compute capability 9.0"
            : cuda::HopperAttentionUnsupported(s, hq, hkv, d, q, k, v, o, lse);
    if (unsupported == nullptr && backward) {
      unsupported = cuda::HopperAttentionUnsupported(s, hq, hkv, d, dout, dq, dk, dv, nullptr);
    }
    if (unsupported != nullptr) {
      choice = {AttentionKernel::kCudnn,
                absl::StrCat(choice.why, "; but the Hopper kernel does not run it (", unsupported,
                             "): cuDNN instead")};
    }
  }
  // A model's sliding window (Mistral's): the Hopper kernels or cuDNN's causal band, each where
  // it computes the window right.
  const char* refused = AttentionKernelRefuses(choice.kernel, pass, shape);
  ITHACA_CHECK(refused == nullptr, "CudaOps: attention ", name, " with a sliding window of ",
               docs.window, " keys on \"", AttentionKernelName(choice.kernel), "\" (", choice.why,
               "): ", refused);
  if (choice_logged_.insert({backward ? 1 : 0, s, hq, hkv, d, docs.trivial() ? 0 : 1, docs.window})
          .second) {
    const std::string window = docs.window > 0 ? absl::StrCat(" window ", docs.window) : "";
    std::fprintf(stderr, "CudaOps: attention %s S %lld Hq %lld Hkv %lld D %lld%s%s: %s (%s)\n",
                 name, static_cast<long long>(s), static_cast<long long>(hq),
                 static_cast<long long>(hkv), static_cast<long long>(d),
                 docs.trivial() ? "" : " with documents", window.c_str(),
                 AttentionKernelName(choice.kernel), choice.why.c_str());
  }
  return choice.kernel;
}

const void* CudaOps::DocumentIndex(const std::vector<int64_t>& key,
                                   const std::vector<int64_t>& values, int64_t int32_prefix) {
  auto it = documents_.find(key);
  if (it == documents_.end()) {
    if (documents_.size() >= kMaxDocumentEntries) {
      // Freed memory is handed out again only to later work on the stream: no wait here.
      auto oldest = documents_.begin();
      for (auto e = documents_.begin(); e != documents_.end(); ++e) {
        if (e->second.last_use < oldest->second.last_use) oldest = e;
      }
      documents_.erase(oldest);
    }
    const int64_t n64 = static_cast<int64_t>(values.size()) - int32_prefix;
    const int64_t front = (int32_prefix + 1) / 2;  // int64 slots the int32 prefix takes
    auto buf = Buffer::Make(opts_.alloc, DType::kI32, {2 * (front + n64)}, Tier::kAttention);
    if (!buf.ok()) {
      Fail(absl::Status(buf.status().code(), absl::StrCat("the document index of ", values.size(),
                                                          " entries: ", buf.status().message())));
      return nullptr;
    }
    char* base = static_cast<char*>(buf->tensor().data);
    if (int32_prefix > 0) cuda::WriteIndices(values.data(), int32_prefix, base, true, compute_);
    if (n64 > 0) {
      cuda::WriteIndices(values.data() + int32_prefix, n64, base + front * 8, false, compute_);
    }
    it = documents_.emplace(key, DocumentEntry{std::move(*buf), 0}).first;
  }
  it->second.last_use = ++document_clock_;
  return it->second.buf.tensor().data;
}

const int64_t* CudaOps::DeviceStarts(const DocumentMask& docs, int64_t s, const char* op) {
  CheckDocuments(docs, s, op);
  std::vector<int64_t> key = {0};
  key.insert(key.end(), docs.starts.begin(), docs.starts.end());
  return static_cast<const int64_t*>(DocumentIndex(key, docs.starts, 0));
}

void CudaOps::Rope(const Tensor& x, int64_t pos0, const Tensor& inv_freq, bool inverse,
                   const DocumentMask& docs) {
  Scope scope(this, "rope");
  CheckDType(x, DType::kBF16, "Rope", "x");
  CheckDType(inv_freq, DType::kF32, "Rope", "inv_freq");
  ITHACA_CHECK(x.rank() == 3 && x.dim(2) % 2 == 0, "CudaOps::Rope: x is ", x.DebugString(),
               ", expected [T, H, D] with D even");
  kCheck.Shape(inv_freq, {x.dim(2) / 2}, "Rope", "inv_freq");
  ITHACA_CHECK(pos0 >= 0, "CudaOps::Rope: negative pos0 ", pos0);
  if (docs.trivial()) {
    cuda::Rope(BfMut(x), x.dim(0), x.dim(1), x.dim(2), pos0, inv_freq.f32(), inverse, nullptr, 0,
               compute_);
    return;
  }
  const int64_t* starts = DeviceStarts(docs, -1, "Rope");
  if (starts == nullptr) return;  // status() says why
  cuda::Rope(BfMut(x), x.dim(0), x.dim(1), x.dim(2), pos0, inv_freq.f32(), inverse, starts,
             static_cast<int64_t>(docs.starts.size()), compute_);
}

void CudaOps::Fail(absl::Status st) {
  if (error_.ok()) error_ = std::move(st);
}

int64_t CudaOps::AttentionWindow(const DocumentMask& docs) const {
  return docs.window > 0 ? docs.window : opts_.probe_window;
}

bool CudaOps::RunCudnn(int64_t s, int64_t hq, int64_t hkv, int64_t d, bool backward, const void* q,
                       const void* k, const void* v, const void* o, const void* dout,
                       const void* lse, void* dq, void* dk, void* dv, const DocumentMask& docs) {
  ITHACA_CHECK(opts_.probe_window == 0 || docs.trivial(),
               "CudaOps: the memory probe's attention window takes no document mask");
  ITHACA_CHECK(opts_.probe_window == 0 || docs.window == 0,
               "CudaOps: the memory probe's attention window and a model's sliding window");
  const cuda::AttentionShape sh{s, hq, hkv, d, AttentionWindow(docs)};
  absl::Status st =
      !docs.trivial()
          ? CudnnDocuments(s, hq, hkv, d, backward, q, k, v, o, dout, lse, dq, dk, dv, docs)
      : backward
          ? cudnn_->Backward(sh, q, k, v, o, dout, static_cast<const float*>(lse), dq, dk, dv)
          : cudnn_->Forward(sh, q, k, v, const_cast<void*>(o),
                            static_cast<float*>(const_cast<void*>(lse)));
  if (st.ok()) {
    last_attention_ = "cudnn";
    return true;
  }
  // No fallback for these: the step fails with the reason (Ops::status()).
  const char* pass = backward ? "backward" : "forward";
  if (opts_.probe_window > 0) {
    Fail(absl::Status(st.code(),
                      absl::StrCat("attention ", pass, " at S ", s,
                                   ": cuDNN's window for the memory probe: ", st.message())));
    return true;
  }
  if (docs.window > 0) {
    Fail(absl::Status(
        st.code(), absl::StrCat("attention ", pass, " at S ", s, ": cuDNN's sliding window of ",
                                docs.window, " keys (the flash kernel has none): ", st.message())));
    return true;
  }
  if (!cuda::FlashAttentionSupports(d)) {
    Fail(absl::Status(st.code(), absl::StrCat("attention ", pass, " at S ", s,
                                              ": cuDNN failed and the flash kernel takes no "
                                              "head_dim ",
                                              d, ": ", st.message())));
    return true;
  }
  if (!cudnn_warned_) {
    std::fprintf(stderr, "CudaOps: cuDNN attention unavailable (%s); using the flash kernel\n",
                 st.ToString().c_str());
    cudnn_warned_ = true;
  }
  return false;
}

absl::Status CudaOps::CudnnDocuments(int64_t s, int64_t hq, int64_t hkv, int64_t d, bool backward,
                                     const void* q, const void* k, const void* v, const void* o,
                                     const void* dout, const void* lse, void* dq, void* dk,
                                     void* dv, const DocumentMask& docs) {
  const int64_t n = static_cast<int64_t>(docs.starts.size());
  int64_t longest = 0;
  for (int64_t i = 0; i < n; ++i) {
    longest = std::max(longest, (i + 1 < n ? docs.starts[i + 1] : s) - docs.starts[i]);
  }
  cuda::AttentionShape sh{s, hq, hkv, d, docs.window};  // a window bands each document
  sh.batch = Bucket(n);
  sh.max_len = std::min(s, Bucket(longest));
  // Sequence lengths (int32), then the element offsets of each sequence in q, k and the stats;
  // the unused sequences of the bucket are empty and sit at the end.
  const int64_t b = sh.batch;
  std::vector<int64_t> values(static_cast<size_t>(b + 3 * (b + 1)));
  for (int64_t i = 0; i <= b; ++i) {
    const int64_t start = i < n ? docs.starts[i] : s;
    if (i < b) values[i] = (i + 1 < n ? docs.starts[i + 1] : s) - start;
    if (i >= n && i < b) values[i] = 0;
    values[b + i] = start * hq * d;
    values[b + (b + 1) + i] = start * hkv * d;
    values[b + 2 * (b + 1) + i] = start * hq;
  }
  std::vector<int64_t> key = {1, s, hq, hkv, d, b};
  key.insert(key.end(), docs.starts.begin(), docs.starts.end());
  const char* base = static_cast<const char*>(DocumentIndex(key, values, b));
  if (base == nullptr) return status();
  const int64_t* offsets = reinterpret_cast<const int64_t*>(base + (b + 1) / 2 * 8);
  cuda::RaggedIndex ragged;
  ragged.seq_len = reinterpret_cast<const int32_t*>(base);
  ragged.q_offset = offsets;
  ragged.kv_offset = offsets + (b + 1);
  ragged.stats_offset = offsets + 2 * (b + 1);
  // cuDNN's ragged stats are token-major [S, Hq]; the engine's LSE is [Hq, S].
  ASSIGN_OR_RETURN(Buffer stats, Buffer::Make(opts_.alloc, DType::kF32, {s, hq}, Tier::kAttention));
  float* st = stats.tensor().f32();
  if (backward) {
    cuda::TransposeF32(static_cast<const float*>(lse), hq, s, st, compute_);
    return cudnn_->Backward(sh, q, k, v, o, dout, st, dq, dk, dv, &ragged);
  }
  RETURN_IF_ERROR(cudnn_->Forward(sh, q, k, v, const_cast<void*>(o), st, &ragged));
  cuda::TransposeF32(st, s, hq, static_cast<float*>(const_cast<void*>(lse)), compute_);
  return absl::OkStatus();
}

void CudaOps::Attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const DocumentMask& docs) {
  Scope scope(this, "attention_fwd");
  CheckAttention(q, k, v, lse, "Attention");
  CheckDType(out, DType::kBF16, "Attention", "out");
  kCheck.Shape(out, q.shape, "Attention", "out");
  const int64_t s = q.dim(0), hq = q.dim(1), hkv = k.dim(1), d = q.dim(2);
  if (s == 0) return;
  CheckDocuments(docs, s, "Attention");
  const AttentionKernel kernel =
      KernelFor(AttentionPass::kForward, s, hq, hkv, d, q.data, k.data, v.data, out.data, nullptr,
                lse.f32(), nullptr, nullptr, nullptr, docs);
  if (kernel == AttentionKernel::kHopper) {
    const int64_t ndocs = docs.trivial() ? 0 : static_cast<int64_t>(docs.starts.size());
    const cudaError_t err = cuda::HopperAttentionForward(
        Bf(q), Bf(k), Bf(v), s, hq, hkv, d, BfMut(out), lse.f32(), compute_, /*cluster=*/0,
        ndocs > 0 ? DeviceStarts(docs, s, "Attention") : nullptr, ndocs, AttentionWindow(docs));
    if (err != cudaSuccess) {
      Fail(absl::InternalError(
          absl::StrCat("attention forward at S ", s,
                       ": the Hopper kernel did not launch: ", cudaGetErrorString(err))));
    }
    last_attention_ = "hopper";
    return;
  }
  if (kernel == AttentionKernel::kCudnn &&
      RunCudnn(s, hq, hkv, d, false, q.data, k.data, v.data, out.data, nullptr, lse.data, nullptr,
               nullptr, nullptr, docs)) {
    return;
  }
  ITHACA_CHECK(cuda::FlashAttentionSupports(d), "CudaOps::Attention: head_dim ", d,
               " unsupported by the flash kernel");
  const int64_t ndocs = docs.trivial() ? 0 : static_cast<int64_t>(docs.starts.size());
  const int64_t* starts = ndocs > 0 ? DeviceStarts(docs, s, "Attention") : nullptr;
  if (ndocs > 0 && starts == nullptr) return;  // status() says why
  cuda::FlashAttentionForward(Bf(q), Bf(k), Bf(v), s, hq, hkv, d, BfMut(out), lse.f32(), starts,
                              ndocs, compute_);
  last_attention_ = "flash";
}

void CudaOps::AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& out, const Tensor& dout, const Tensor& lse,
                                const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                const DocumentMask& docs) {
  Scope scope(this, "attention_bwd");
  const char* op = "AttentionBackward";
  CheckAttention(q, k, v, lse, op);
  for (const Tensor* t : {&out, &dout, &dq}) {
    CheckDType(*t, DType::kBF16, op, "operand");
    kCheck.Shape(*t, q.shape, op, "operand");
  }
  for (const Tensor* t : {&dk, &dv}) {
    CheckDType(*t, DType::kBF16, op, "dk/dv");
    kCheck.Shape(*t, k.shape, op, "dk/dv");
  }
  const int64_t s = q.dim(0), hq = q.dim(1), hkv = k.dim(1), d = q.dim(2);
  if (s == 0) return;
  CheckDocuments(docs, s, op);
  const AttentionKernel kernel =
      KernelFor(AttentionPass::kBackward, s, hq, hkv, d, q.data, k.data, v.data, out.data,
                dout.data, lse.f32(), dq.data, dk.data, dv.data, docs);
  if (kernel == AttentionKernel::kHopper) {
    // The dQ accumulator and the padded LSE/Dsum rows, for this call only (the allocator hands
    // the block to later work on the stream only); the planner's workspace rule covers it.
    const int64_t bytes = cuda::HopperAttentionBackwardWorkspace(s, hq, hkv, d);
    auto ws = Buffer::Make(opts_.alloc, DType::kF32, {(bytes + 3) / 4}, Tier::kWorkspace);
    if (!ws.ok()) {
      Fail(absl::Status(ws.status().code(),
                        absl::StrCat("attention backward at S ", s, ": the Hopper kernel's ", bytes,
                                     "-byte workspace: ", ws.status().message())));
      return;
    }
    const int64_t ndocs = docs.trivial() ? 0 : static_cast<int64_t>(docs.starts.size());
    const cudaError_t err = cuda::HopperAttentionBackward(
        Bf(q), Bf(k), Bf(v), Bf(out), Bf(dout), lse.f32(), s, hq, hkv, d, BfMut(dq), BfMut(dk),
        BfMut(dv), ws->tensor().data, static_cast<int64_t>(ws->tensor().bytes()), compute_,
        ndocs > 0 ? DeviceStarts(docs, s, op) : nullptr, ndocs, AttentionWindow(docs));
    if (err != cudaSuccess) {
      Fail(absl::InternalError(
          absl::StrCat("attention backward at S ", s,
                       ": the Hopper kernel did not launch: ", cudaGetErrorString(err))));
    }
    last_attention_ = "hopper";
    return;
  }
  if (kernel == AttentionKernel::kCudnn &&
      RunCudnn(s, hq, hkv, d, true, q.data, k.data, v.data, out.data, dout.data, lse.data, dq.data,
               dk.data, dv.data, docs)) {
    return;
  }
  ITHACA_CHECK(cuda::FlashAttentionSupports(d), "CudaOps::AttentionBackward: head_dim ", d,
               " unsupported by the flash kernel");
  auto delta = Buffer::Make(opts_.alloc, DType::kF32, {hq, s}, Tier::kAttention);
  if (!delta.ok()) {
    Fail(absl::Status(delta.status().code(),
                      absl::StrCat("attention backward at S ", s,
                                   ": the flash kernel's row sums: ", delta.status().message())));
    return;
  }
  const int64_t ndocs = docs.trivial() ? 0 : static_cast<int64_t>(docs.starts.size());
  const int64_t* starts = ndocs > 0 ? DeviceStarts(docs, s, op) : nullptr;
  if (ndocs > 0 && starts == nullptr) return;  // status() says why
  cuda::FlashAttentionBackward(Bf(q), Bf(k), Bf(v), Bf(out), Bf(dout), lse.f32(), s, hq, hkv, d,
                               delta->tensor().f32(), BfMut(dq), BfMut(dk), BfMut(dv), starts,
                               ndocs, compute_);
  last_attention_ = "flash";
}

bool CudaOps::RunCudnnFull(int64_t sq, int64_t sk, int64_t q_pos0, int64_t k_pos0, int64_t hq,
                           int64_t hkv, int64_t d, bool backward, const void* q, const void* k,
                           const void* v, const void* o, const void* dout, const void* lse,
                           void* dq, void* dk, void* dv, const DocumentMask& docs) {
  const AttentionKernel forced = backward ? opts_.attention_backward : opts_.attention_forward;
  if (k_pos0 + sk > q_pos0 || forced == AttentionKernel::kFlash) return false;
  // What the piece's queries see is one dense rectangle (VisiblePieceRectangle): its first nq
  // queries against its keys from k0 on. Where a window cuts into it, the flash kernel runs.
  const PieceRectangle r = VisiblePieceRectangle(docs, sq, sk, q_pos0, k_pos0);
  if (!r.dense) return false;
  const int64_t nq = r.queries, k0 = r.first_key, nk = sk - k0;
  const int64_t q_row = hq * d, kv_row = hkv * d;  // elements of a token's row
  auto bf16_at = [](const void* p, int64_t elems) {
    return static_cast<char*>(const_cast<void*>(p)) + elems * 2;
  };
  // Outside the rectangle: out 0 and lse −inf (nothing seen), and no gradient.
  if (!backward && nq < sq) {
    cuda::Fill(bf16_at(o, nq * q_row), Et(DType::kBF16), (sq - nq) * q_row, 0.f, compute_);
    float* l = static_cast<float*>(const_cast<void*>(lse));
    for (int64_t h = 0; h < hq; ++h) {
      cuda::Fill(l + h * sq + nq, Et(DType::kF32), sq - nq, -INFINITY, compute_);
    }
  }
  if (backward && nq < sq) {
    cuda::Fill(bf16_at(dq, nq * q_row), Et(DType::kBF16), (sq - nq) * q_row, 0.f, compute_);
  }
  if (backward && k0 > 0) {
    cuda::Fill(dk, Et(DType::kBF16), k0 * kv_row, 0.f, compute_);
    cuda::Fill(dv, Et(DType::kBF16), k0 * kv_row, 0.f, compute_);
  }
  if (nq == 0 || nk == 0) {
    last_attention_ = "none";
    return true;
  }
  cuda::AttentionShape sh{nq, hq, hkv, d};
  sh.causal = false;
  if (nk != nq) sh.s_kv = nk;
  const float* lse_in = static_cast<const float*>(lse);
  std::optional<Buffer> packed;
  if (nq != sq && !backward) sh.lse_stride = sq;  // the forward writes the rows in place
  if (nq != sq && backward) {
    // cuDNN's backward (before 9.26) reads only packed stats: the rectangle's LSE rows, [hq, nq],
    // gathered into a scratch no larger than the flash kernel's row sums.
    auto buf = Buffer::Make(opts_.alloc, DType::kF32, {hq, nq}, Tier::kAttention);
    if (!buf.ok()) return false;  // the flash kernel, which needs no such copy, runs it
    packed.emplace(*std::move(buf));
    cudaCheck(cudaMemcpy2DAsync(packed->tensor().f32(), nq * sizeof(float), lse_in,
                                sq * sizeof(float), nq * sizeof(float), hq,
                                cudaMemcpyDeviceToDevice, compute_));
    lse_in = packed->tensor().f32();
  }
  const void *kr = bf16_at(k, k0 * kv_row), *vr = bf16_at(v, k0 * kv_row);
  const absl::Status st = backward
                              ? cudnn_->Backward(sh, q, kr, vr, o, dout, lse_in, dq,
                                                 bf16_at(dk, k0 * kv_row), bf16_at(dv, k0 * kv_row))
                              : cudnn_->Forward(sh, q, kr, vr, const_cast<void*>(o),
                                                static_cast<float*>(const_cast<void*>(lse)));
  if (st.ok()) {
    last_attention_ = "cudnn";
    return true;
  }
  if (!cudnn_full_warned_) {
    cudnn_full_warned_ = true;
    std::fprintf(stderr,
                 "CudaOps: cuDNN has no engine for a ring piece of %lld x %lld tokens without the "
                 "causal mask (%s); the flash kernel runs it\n",
                 static_cast<long long>(nq), static_cast<long long>(nk),
                 std::string(st.message()).c_str());
  }
  return false;
}

// Ring attention's chunks. A diagonal chunk (the same tokens as queries and keys) is a causal
// sequence of its own: Attention with its documents rebased, on the fast kernels. A chunk whose
// keys all come before its queries is attention without the causal mask on the rectangle its
// queries see (cuDNN; the rest filled), unless a window cuts into that rectangle. Any other goes
// to the flash kernel's span form (kernels.h), which masks by sample position.
void CudaOps::AttentionChunk(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, const DocumentMask& docs, int64_t q_pos0,
                             int64_t k_pos0) {
  const char* op = "AttentionChunk";
  CheckChunk(q, k, v, lse, q_pos0, k_pos0, op);
  CheckDType(out, DType::kBF16, op, "out");
  kCheck.Shape(out, q.shape, op, "out");
  CheckDocuments(docs, -1, op);
  const int64_t sq = q.dim(0), sk = k.dim(0), hq = q.dim(1), hkv = k.dim(1), d = q.dim(2);
  if (q_pos0 == k_pos0 && sq == sk) {
    Attention(q, k, v, out, lse, DocumentsOf(docs, q_pos0, sq));
    return;
  }
  Scope scope(this, "attention_chunk_fwd");
  if (sq == 0) return;
  if (RunCudnnFull(sq, sk, q_pos0, k_pos0, hq, hkv, d, false, q.data, k.data, v.data, out.data,
                   nullptr, lse.data, nullptr, nullptr, nullptr, docs)) {
    return;
  }
  ITHACA_CHECK(cuda::FlashAttentionSupports(d), "CudaOps::", op, ": head_dim ", d,
               " unsupported by the flash kernel");
  const int64_t ndocs = docs.trivial() ? 0 : static_cast<int64_t>(docs.starts.size());
  const int64_t* starts = ndocs > 0 ? DeviceStarts(docs, -1, op) : nullptr;
  if (ndocs > 0 && starts == nullptr) return;  // status() says why
  cuda::FlashAttentionChunkForward(Bf(q), Bf(k), Bf(v),
                                   cuda::FlashSpan{sq, sk, q_pos0, k_pos0, AttentionWindow(docs)},
                                   hq, hkv, d, BfMut(out), lse.f32(), starts, ndocs, compute_);
  last_attention_ = "flash";
}

void CudaOps::AttentionChunkBackward(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& dout, const Tensor& lse,
                                     const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                     const DocumentMask& docs, int64_t q_pos0, int64_t k_pos0) {
  const char* op = "AttentionChunkBackward";
  CheckChunk(q, k, v, lse, q_pos0, k_pos0, op);
  for (const Tensor* t : {&out, &dout, &dq}) {
    CheckDType(*t, DType::kBF16, op, "out/dout/dq");
    kCheck.Shape(*t, q.shape, op, "out/dout/dq");
  }
  for (const Tensor* t : {&dk, &dv}) {
    CheckDType(*t, DType::kBF16, op, "dk/dv");
    kCheck.Shape(*t, k.shape, op, "dk/dv");
  }
  CheckDocuments(docs, -1, op);
  const int64_t sq = q.dim(0), sk = k.dim(0), hq = q.dim(1), hkv = k.dim(1), d = q.dim(2);
  if (q_pos0 == k_pos0 && sq == sk) {
    AttentionBackward(q, k, v, out, dout, lse, dq, dk, dv, DocumentsOf(docs, q_pos0, sq));
    return;
  }
  Scope scope(this, "attention_chunk_bwd");
  if (sq == 0 && sk == 0) return;
  if (RunCudnnFull(sq, sk, q_pos0, k_pos0, hq, hkv, d, true, q.data, k.data, v.data, out.data,
                   dout.data, lse.data, dq.data, dk.data, dv.data, docs)) {
    return;
  }
  ITHACA_CHECK(cuda::FlashAttentionSupports(d), "CudaOps::", op, ": head_dim ", d,
               " unsupported by the flash kernel");
  auto delta =
      Buffer::Make(opts_.alloc, DType::kF32, {hq, std::max<int64_t>(sq, 1)}, Tier::kAttention);
  if (!delta.ok()) {
    Fail(absl::Status(delta.status().code(),
                      absl::StrCat("attention chunk backward: the flash kernel's row sums: ",
                                   delta.status().message())));
    return;
  }
  const int64_t ndocs = docs.trivial() ? 0 : static_cast<int64_t>(docs.starts.size());
  const int64_t* starts = ndocs > 0 ? DeviceStarts(docs, -1, op) : nullptr;
  if (ndocs > 0 && starts == nullptr) return;  // status() says why
  cuda::FlashAttentionChunkBackward(Bf(q), Bf(k), Bf(v), Bf(out), Bf(dout), lse.f32(),
                                    cuda::FlashSpan{sq, sk, q_pos0, k_pos0, AttentionWindow(docs)},
                                    hq, hkv, d, delta->tensor().f32(), BfMut(dq), BfMut(dk),
                                    BfMut(dv), starts, ndocs, compute_);
  last_attention_ = "flash";
}

void CudaOps::AttentionMerge(const Tensor& acc, const Tensor& acc_lse, const Tensor& out,
                             const Tensor& lse) {
  Scope scope(this, "attention_merge");
  const char* op = "AttentionMerge";
  CheckDType(acc, DType::kF32, op, "acc");
  CheckDType(acc_lse, DType::kF32, op, "acc_lse");
  CheckDType(out, DType::kBF16, op, "out");
  CheckDType(lse, DType::kF32, op, "lse");
  ITHACA_CHECK(acc.rank() == 3, "CudaOps::", op, ": acc is ", acc.DebugString(),
               ", expected [S, H, D]");
  kCheck.Shape(out, acc.shape, op, "out");
  kCheck.Shape(acc_lse, {acc.dim(1), acc.dim(0)}, op, "acc_lse");
  kCheck.Shape(lse, {acc.dim(1), acc.dim(0)}, op, "lse");
  cuda::AttentionMerge(acc.f32(), acc_lse.f32(), Bf(out), lse.f32(), acc.dim(0), acc.dim(1),
                       acc.dim(2), compute_);
}

}  // namespace ithaca
