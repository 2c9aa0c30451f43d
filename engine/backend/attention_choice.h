// Which kernel runs a pass of attention: the one decision, made in one place (ChooseAttention).
// The job spec names a kernel per pass ([kernels] attention_forward / attention_backward);
// "auto" is resolved at admission by the measured table below, for the job's shape, so the stored
// spec names what runs. CudaOps then runs that kernel where the GPU and the pointers allow it, and
// cuDNN where not (logged once, with the reason). No CUDA here: the planner and the daemon use it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

enum class AttentionKernel {
  kAuto,    // the measured table decides per shape and pass
  kCudnn,   // cuDNN's fused flash attention (ragged for packed documents)
  kHopper,  // the own Hopper (sm_90) kernels, hopper_attention*.cu
  kFlash,   // the own portable flash kernel, flash_attention.cu (any GPU, no cuDNN)
};
const char* AttentionKernelName(AttentionKernel k);  // "auto" | "cudnn" | "hopper" | "flash"
absl::StatusOr<AttentionKernel> ParseAttentionKernel(const std::string& name);
const std::vector<std::string>& AttentionKernelNames();

enum class AttentionPass { kForward, kBackward };

struct AttentionShape {
  int64_t s = 0;  // tokens of the (whole, after Ulysses) sequence
  int64_t head_dim = 0;
  bool documents = false;  // a document mask (packed samples)
  int64_t window = 0;      // a sliding window of this many keys (Mistral's); 0: none
};

// One row of the measured table: from `min_s` tokens on, at `head_dim`, the own Hopper kernel of
// `pass` was measured faster than cuDNN on the H200 (the figures are in attention_choice.cc).
struct HopperRule {
  AttentionPass pass;
  int64_t head_dim;
  int64_t min_s;
  bool documents;  // whether the kernel of this pass was measured faster with a document mask
  bool window;     // ... and with a sliding window
};
const std::vector<HopperRule>& HopperRules();

struct AttentionChoice {
  AttentionKernel kernel;
  std::string why;  // one line for the log: the rule row that decided, or "asked for"
};

// `asked` when it is not kAuto; else the own Hopper kernel where a row of HopperRules() covers
// the shape, or where cuDNN refuses it (AttentionKernelRefuses), cuDNN otherwise. Never kAuto.
AttentionChoice ChooseAttention(AttentionPass pass, const AttentionShape& shape,
                                AttentionKernel asked);

// Why `kernel` cannot compute `pass` of `shape` right, or nullptr: the flash kernel has no
// sliding window; cuDNN's causal band is wrong at a window of one key (its forward disagreed
// with the CPU oracle on the H200, bench/results/2026-12-01-gpu-tests-merged.log). Admission
// (engine/spec/resolve.cc) refuses such a job; CudaOps checks what it runs.
const char* AttentionKernelRefuses(AttentionKernel kernel, AttentionPass pass,
                                   const AttentionShape& shape);

// Bytes of device workspace the kernel of each pass allocates beyond the engine's buffers, at
// `heads` query heads (a stage's) of `shape`: the own Hopper backward's f32 dQ accumulator and
// padded rows (hopper_attention.h, HopperAttentionBackwardWorkspace: the same formula), cuDNN's
// backward workspace (8 bytes per token × head × head_dim measured on an H200, 12 ragged) and,
// with documents, the f32 [S, heads] statistics CudaOps converts cuDNN's ragged LSE through.
// The planner adds the larger of the two passes' (they do not overlap).
int64_t AttentionWorkspaceBytes(AttentionKernel kernel, AttentionPass pass,
                                const AttentionShape& shape, int64_t heads);
int64_t HopperBackwardWorkspaceBytes(int64_t s, int64_t heads, int64_t head_dim);

}  // namespace ithaca
