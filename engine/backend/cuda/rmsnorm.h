// RMSNorm on the GPU: bf16 in and out, f32 accumulation, f32 rstd per row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ithaca {
namespace cuda {

// Both run 16-byte vector accesses with the row in registers where d % 8 == 0 and every pointer is
// 16-byte aligned, and a scalar kernel otherwise. Elementwise aliasing (out == x, dx == dout) is
// safe: each element is read before the thread that reads it writes it.

// out[r] = x[r] · rstd[r] · w, rstd[r] = 1 / sqrt(mean(x[r]²) + eps), for rows × d.
// x, w, out: bf16 (raw uint16_t bits); rstd: f32.
void RmsNormForward(const uint16_t* x, const uint16_t* w, float eps, int64_t rows, int64_t d,
                    uint16_t* out, float* rstd, cudaStream_t stream);

// dx[r] += rstd[r] · (dout[r] ⊙ w − x[r] · rstd[r]² / d · Σ dout[r] ⊙ w ⊙ x[r]) (bf16,
// accumulated); dw += Σ_r dout[r] ⊙ x[r] · rstd[r] (f32, accumulated). d at most 16384 on the
// vector path, 12288 on the scalar one.
void RmsNormBackward(const uint16_t* x, const uint16_t* w, const float* rstd, const uint16_t* dout,
                     int64_t rows, int64_t d, uint16_t* dx, float* dw, cudaStream_t stream);

// The backward of a norm whose rstd was not kept (the per-head q/k norms): rstd[r] remade from
// x[r] with eps (as RmsNormForward computes it), and `grad` holds dout on entry and dx on return
// (written, not accumulated); dw accumulated as above. Same paths and limits.
void RmsNormBackwardInPlace(const uint16_t* x, const uint16_t* w, float eps, uint16_t* grad,
                            int64_t rows, int64_t d, float* dw, cudaStream_t stream);

}  // namespace cuda
}  // namespace ithaca
