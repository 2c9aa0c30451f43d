// CudaOps: the CUDA backend of Ops (engine/backend/ops.h) for Hopper. Activations are bf16,
// accumulation f32; GEMMs run on cuBLASLt, attention on cuDNN's fused flash attention or the own
// Hopper kernels (hopper_attention.h), as ChooseAttention (engine/backend/attention_choice.h)
// decides, with the own flash kernel where cuDNN has no engine. All work is enqueued on one compute
// stream owned here; copy and comm streams and events are provided for the overlap schedules
// (docs/schedules.md).
#pragma once

#include <cuda_runtime.h>

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/backend/attention_choice.h"
#include "engine/backend/cuda/cudnn_attention.h"
#include "engine/backend/ops.h"
#include "engine/core/status.h"
#include "engine/memory/allocator.h"

namespace ithaca {
namespace cuda {
class LtGemm;
}  // namespace cuda

class CudaOps : public Ops {
 public:
  struct Options {
    // Workspaces (cuBLASLt, cuDNN: Tier::kWorkspace) and attention scratch come from here. Must
    // outlive the CudaOps.
    Allocator* alloc = nullptr;
    // Each pass's kernel, as the job spec names it ([kernels]); kAuto: ChooseAttention's measured
    // table per shape (attention_choice.h). Where the GPU or the pointers do not allow the Hopper
    // kernel it runs cuDNN; where cuDNN has no engine for a shape, the flash kernel (both logged
    // once). Either backward reads the O and LSE of either forward.
    AttentionKernel attention_forward = AttentionKernel::kAuto;
    AttentionKernel attention_backward = AttentionKernel::kAuto;
    size_t gemm_workspace_bytes = size_t{32} << 20;
    // Which of cuBLASLt's ranked algorithms each GEMM shape runs (LtGemm): -1
    // (cuda::kGemmTimed), the fastest of its first few as timed on the shape's first calls; N,
    // always the N-th (gemm_bench, train_bench --gemm_heuristic).
    int gemm_heuristic = -1;
    // > 0: the memory probe (docs/benchmarks.md). Attention forward and backward
    // let each query see only its `probe_window` latest keys (the own Hopper kernels' window, or
    // cuDNN's causal band where they do not run), so a step at
    // millions of tokens costs linear time; every buffer, copy and collective keeps its real
    // size, but the step's results are not the model's. Never quote throughput from it.
    int64_t probe_window = 0;
    // Times every op with CUDA events on the compute stream (TakeProfile).
    bool profile = false;
    // With profile: one row per GEMM shape ("gemm m×n×k NT f32+=", see RunGemm) instead of one
    // "gemm" row, to see which of the step's GEMMs fall short of the device's peak.
    bool profile_gemm_shapes = false;
    // For measuring cuDNN's attention plans (attention_bench); the defaults are training's.
    cuda::CudnnTuning cudnn;
  };
  explicit CudaOps(const Options& opts);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  Device device() const override { return Device::kCuda; }
  DType act_dtype() const override { return DType::kBF16; }
  // From the device's name (peak_flops.h), looked up once.
  double PeakFlops() const override { return peak_flops_; }
  // The compute and comm streams below.
  DeviceStreams streams() const override { return {compute_, comm_}; }

  // ---- Streams and events (for offload, prefetch and collectives).
  enum class Stream { kCompute, kCopy, kComm };
  cudaStream_t stream(Stream s = Stream::kCompute) const;
  // A new event (owned by the caller: cudaEventDestroy), recorded on `s` now.
  cudaEvent_t Record(Stream s) const;
  // Later work on `s` waits for `event`.
  void Wait(Stream s, cudaEvent_t event) const;
  // Blocks the host until the compute, copy and comm streams are idle.
  void Synchronize() const override;

  void Fill(const Tensor& x, float value) override;
  void Copy(const Tensor& src, const Tensor& dst) override;
  void Copy2D(const Tensor& src, int64_t src_stride, const Tensor& dst, int64_t dst_stride,
              int64_t rows, int64_t cols) override;
  // On the copy stream, after an event from the compute stream; WaitFence has the compute
  // stream wait on the copy's event.
  Fence CopyAsync(const Tensor& src, const Tensor& dst) override;
  Fence CopyAsyncUnordered(const Tensor& src, const Tensor& dst) override;
  void WaitFence(Fence fence) override;
  // cudaEventSynchronize on the copy's event (or on a later copy's: copies complete in order).
  void HostWaitFence(Fence fence) override;
  // Both return once the host buffer may be reused or read (they synchronize the stream).
  void Upload(const void* host, DType host_dtype, const Tensor& dst) override;
  void Download(const Tensor& src, void* host, DType host_dtype) override;
  void Axpy(float alpha, const Tensor& x, const Tensor& y) override;
  double SumSquares(const Tensor& x) override;
  double Sum(const Tensor& x) override;
  void SumSquaresInto(const Tensor& x, const Tensor& out) override;
  void SumInto(const Tensor& x, const Tensor& out) override;

  void Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
            float alpha, float beta) override;
  void GemmBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
                const Tensor& c, float alpha, float beta) override;

  void Embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override;
  void EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) override;
  void RmsNorm(const Tensor& x, const Tensor& w, float eps, const Tensor& out,
               const Tensor& rstd) override;
  void RmsNormBackward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dout,
                       const Tensor& dx, const Tensor& dw) override;
  void RmsNormBackwardInPlace(const Tensor& x, const Tensor& w, float eps, const Tensor& grad,
                              const Tensor& dw) override;
  void Rope(const Tensor& x, int64_t pos0, const Tensor& inv_freq, bool inverse,
            const DocumentMask& docs) override;
  void Attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                 const Tensor& lse, const DocumentMask& docs) override;
  void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                         const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& dk,
                         const Tensor& dv, const DocumentMask& docs) override;
  void AttentionChunk(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                      const Tensor& lse, const DocumentMask& docs, int64_t q_pos0,
                      int64_t k_pos0) override;
  void AttentionChunkBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const Tensor& dout, const Tensor& lse, const Tensor& dq,
                              const Tensor& dk, const Tensor& dv, const DocumentMask& docs,
                              int64_t q_pos0, int64_t k_pos0) override;
  void AttentionMerge(const Tensor& acc, const Tensor& acc_lse, const Tensor& out,
                      const Tensor& lse) override;
  void SwiGLU(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void SwiGLUBackward(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                      const Tensor& dup) override;
  void CrossEntropy(const Tensor& logits, const Tensor& labels, const Tensor& losses,
                    const Tensor& dlogits, float grad_scale) override;
  void LabelIsArgmax(const Tensor& logits, const Tensor& labels, const Tensor& hits) override;
  void AdamW(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
             const Tensor& working, const AdamWParams& p) override;

  absl::Status status() const override { return error_; }

  // Which attention kernel ran last ("cudnn", "hopper" or "flash"), for tests and logs.
  const char* last_attention_impl() const { return last_attention_; }
  // Bytes of cuDNN's attention workspace now held (workspace tier), and cuBLASLt's.
  int64_t attention_workspace_bytes() const;
  int64_t gemm_workspace_bytes() const { return static_cast<int64_t>(opts_.gemm_workspace_bytes); }

  // Device time per op kind since the last call, while Options::profile is set: events around
  // every op on the compute stream, so the rows sum to the stream's busy time and a step's time
  // minus that sum is where the GPU waited for the host. Synchronizes. Sorted by time.
  struct ProfileRow {
    const char* op;
    double ms = 0;
    int64_t calls = 0;
  };
  std::vector<ProfileRow> TakeProfile();
  void set_profile(bool on) { opts_.profile = on; }

 private:
  class Scope;  // records one op's span while profiling
  struct Span {
    const char* op;
    cudaEvent_t a, b;
  };
  cudaEvent_t PoolEvent();
  double Reduce(const Tensor& x, bool squares, const char* op);
  // Gemm and GemmBias (bias null: none) after the shape checks, named `op` in their messages.
  void RunGemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor* bias,
               const Tensor& c, float alpha, float beta, const char* op);
  void ReduceInto(const Tensor& x, bool squares, const Tensor& out, const char* op);
  // The kernel the pass runs: ChooseAttention on the options, then what the GPU and the pointers
  // allow (the Hopper kernel's checks) and the memory probe. Logs the choice and its reason once
  // per shape and pass.
  AttentionKernel KernelFor(AttentionPass pass, int64_t s, int64_t hq, int64_t hkv, int64_t d,
                            const void* q, const void* k, const void* v, const void* o,
                            const void* dout, const float* lse, const void* dq, const void* dk,
                            const void* dv, const DocumentMask& docs);
  // The window every kernel runs: the model's sliding window, else the memory probe's.
  int64_t AttentionWindow(const DocumentMask& docs) const;
  // Runs cuDNN's attention; false (logged once) when cuDNN has no engine for the shape, and the
  // caller runs the flash kernel instead.
  bool RunCudnn(int64_t s, int64_t hq, int64_t hkv, int64_t d, bool backward, const void* q,
                const void* k, const void* v, const void* o, const void* dout, const void* lse,
                void* dq, void* dk, void* dv, const DocumentMask& docs);
  // A ring piece whose keys all come before its queries (StageAttention's off-diagonal pieces):
  // attention without the causal mask on cuDNN, over the rectangle its queries see
  // (VisiblePieceRectangle: with documents, the document that crosses the gap), the rest of its
  // outputs filled. False when the piece does not qualify (a window cuts into the rectangle) or
  // cuDNN has no engine for it (logged once); the caller then runs the flash kernel's span form.
  bool RunCudnnFull(int64_t sq, int64_t sk, int64_t q_pos0, int64_t k_pos0, int64_t hq, int64_t hkv,
                    int64_t d, bool backward, const void* q, const void* k, const void* v,
                    const void* o, const void* dout, const void* lse, void* dq, void* dk, void* dv,
                    const DocumentMask& docs);
  // cuDNN on a packed sample: a ragged batch whose stats go through an [S, Hq] scratch.
  absl::Status CudnnDocuments(int64_t s, int64_t hq, int64_t hkv, int64_t d, bool backward,
                              const void* q, const void* k, const void* v, const void* o,
                              const void* dout, const void* lse, void* dq, void* dk, void* dv,
                              const DocumentMask& docs);
  // Device copies of a packed sample's document metadata, written on first use (kernels whose
  // parameters carry the values: no host wait) and kept for the sample's further calls (each
  // layer's Rope and Attention, forward and backward); the least recently used go first.
  // `key` names the content, `values` are int64, and the first `int32_prefix` of them are
  // stored as int32 in front (cuDNN's sequence lengths). Returns the device base pointer, or
  // nullptr when no memory is left for it (recorded in status()).
  const void* DocumentIndex(const std::vector<int64_t>& key, const std::vector<int64_t>& values,
                            int64_t int32_prefix);
  // The document starts on the device (int64 [n]) for Rope and the own kernel.
  const int64_t* DeviceStarts(const DocumentMask& docs, int64_t s, const char* op);

  // Records a run-time failure (Ops::status()): the first one is kept.
  void Fail(absl::Status st);

  Options opts_;
  absl::Status error_;  // the first run-time failure; OK while there was none
  double peak_flops_ = 0;
  cudaStream_t compute_ = nullptr, copy_ = nullptr, comm_ = nullptr;
  Buffer gemm_workspace_;
  Buffer partials_;                  // f64 per-block sums of Sum / SumSquares
  double* host_partials_ = nullptr;  // pinned
  std::unique_ptr<cuda::LtGemm> gemm_;
  std::unique_ptr<cuda::CudnnAttention> cudnn_;
  const char* last_attention_ = "none";
  bool cudnn_warned_ = false;
  bool cudnn_full_warned_ = false;
  std::set<std::vector<int64_t>> choice_logged_;  // (pass, shape)s whose choice was logged
  std::vector<Span> spans_;
  std::set<std::string> span_names_;  // the GEMM shapes' row names (Span::op points into it)
  struct DocumentEntry {
    Buffer buf;
    uint64_t last_use = 0;
  };
  std::map<std::vector<int64_t>, DocumentEntry> documents_;
  uint64_t document_clock_ = 0;
  std::vector<cudaEvent_t> free_events_;
  // CopyAsync (after_compute) and CopyAsyncUnordered.
  Fence IssueCopy(const Tensor& src, const Tensor& dst, bool after_compute);
  // CopyAsync: the copy stream catches up with the compute stream through `compute_mark_`
  // (re-recorded per copy: a wait takes the event's state when it is enqueued); each copy's end
  // is an event in `copies_`, oldest first, until a WaitFence covers it.
  struct InFlight {
    uint64_t ticket;
    cudaEvent_t done;
  };
  cudaEvent_t compute_mark_ = nullptr;
  std::deque<InFlight> copies_;
  std::vector<cudaEvent_t> free_fences_;
  uint64_t last_ticket_ = 0, waited_ticket_ = 0;
};

}  // namespace ithaca
