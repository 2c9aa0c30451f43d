// CpuOps: the fp32 CPU backend of Ops, the oracle the other backends are checked against.
// "Device" memory is host memory; activations are f32. Kernels live in kernels.h, gemm.h and
// attention.h; this class validates shapes and dtypes (ITHACA_CHECK: a mismatch is a bug) and
// calls their float instantiations.
#pragma once

#include <cstdint>

#include "engine/backend/cpu/attention_blocks.h"
#include "engine/backend/ops.h"

namespace ithaca {

class CpuOps : public Ops {
 public:
  CpuOps() = default;
  // Attention block sizes (tests shrink them to exercise block boundaries).
  explicit CpuOps(cpu::AttentionBlocks blocks) : blocks_(blocks) {}

  Device device() const override { return Device::kCpu; }
  DType act_dtype() const override { return DType::kF32; }
  double PeakFlops() const override { return 0; }

  void Fill(const Tensor& x, float value) override;
  void Copy(const Tensor& src, const Tensor& dst) override;
  void Copy2D(const Tensor& src, int64_t src_stride, const Tensor& dst, int64_t dst_stride,
              int64_t rows, int64_t cols) override;
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

 private:
  cpu::AttentionBlocks blocks_;
};

}  // namespace ithaca
