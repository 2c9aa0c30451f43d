#include "engine/backend/attention_choice.h"

namespace ithaca {

const char* AttentionKernelName(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::kAuto:
      return "auto";
    case AttentionKernel::kCudnn:
      return "cudnn";
    case AttentionKernel::kHopper:
      return "hopper";
    case AttentionKernel::kFlash:
      return "flash";
  }
  return "?";
}

const std::vector<std::string>& AttentionKernelNames() {
  static const auto* names = new std::vector<std::string>{"auto", "cudnn", "hopper", "flash"};
  return *names;
}

absl::StatusOr<AttentionKernel> ParseAttentionKernel(const std::string& name) {
  for (AttentionKernel k : {AttentionKernel::kAuto, AttentionKernel::kCudnn,
                            AttentionKernel::kHopper, AttentionKernel::kFlash}) {
    if (name == AttentionKernelName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "attention kernel \"", name.substr(0, 64), "\": expected auto, cudnn, hopper or flash"));
}

// TFLOPS on one H200 (causal, Hq 32, Hkv 8, bf16) against the engine's cuDNN 9.14.
// Forward (lab/hopper_attention/README.md; K/V multicast over clusters of 2 or 4 CTAs):
//   head_dim 64:  S 64K 513-515 vs 499, 128K 516 vs 498, 256K 508-511 vs 462, 512K 500-502 vs 428
//   head_dim 128: S 64K 619-620 vs 609, 128K 588-595, 256K 582-584, 512K 578-580
//                 (cuDNN 9.19: 554, 513, 487 at 128K, 256K, 512K)
//   Below 64K the fwd+bwd pass with the Hopper backward is as fast or faster after cuDNN's
//   forward (hd64 16K: 542 vs 483). The forward has no document mask: packed samples stay on
//   cuDNN's ragged forward.
// Backward, in-engine (bench/results/2026-12-01-s5-hopperbwd-in-engine.jsonl, two runs of each
// kernel, the spread is the power-limited clock's):
//   head_dim 64:  S 16K 522-547 vs 447-454, 32K 520-541 vs 439-471, 64K 490-522 vs 439,
//                 128K 515-521 vs 431-434, 256K 520 vs 434-435
//   head_dim 128: S 16K 531-577 vs 576-577, 32K 557-560 vs 522-538, 64K 532-556 vs 527-528,
//                 128K 548-554 vs 527
//   With documents (bench/results/2026-12-01-s6-docmask-attention.jsonl, 128K): hd64 8K
//   documents 442 vs 365, 2K documents 329 vs 287; hd128 8K documents 515 vs 469.
// Shorter S were not measured and stay on cuDNN. Either backward reads the O and LSE
// (natural-log f32 [Hq, S], cuDNN's stats layout for one sequence) that either forward writes.
const std::vector<HopperRule>& HopperRules() {
  static const auto* rules = new std::vector<HopperRule>{
      {AttentionPass::kForward, 64, 65536, false},
      {AttentionPass::kForward, 128, 65536, false},
      {AttentionPass::kBackward, 64, 16384, true},
      {AttentionPass::kBackward, 128, 32768, true},
  };
  return *rules;
}

AttentionChoice ChooseAttention(AttentionPass pass, const AttentionShape& shape,
                                AttentionKernel asked) {
  if (asked != AttentionKernel::kAuto) return {asked, "asked for"};
  const char* name = pass == AttentionPass::kForward ? "forward" : "backward";
  if (shape.window) return {AttentionKernel::kCudnn, "auto: a sliding window runs on cuDNN's band"};
  for (const HopperRule& r : HopperRules()) {
    if (r.pass != pass || r.head_dim != shape.head_dim) continue;
    if (shape.documents && !r.documents) {
      return {AttentionKernel::kCudnn,
              absl::StrCat("auto: the Hopper ", name, " takes no document mask")};
    }
    if (shape.s >= r.min_s) {
      return {AttentionKernel::kHopper, absl::StrCat("auto: Hopper ", name, " measured faster from S ",
                                                     r.min_s, " at head_dim ", r.head_dim)};
    }
    return {AttentionKernel::kCudnn, absl::StrCat("auto: Hopper ", name, " measured faster only from S ",
                                                  r.min_s, " at head_dim ", r.head_dim)};
  }
  return {AttentionKernel::kCudnn,
          absl::StrCat("auto: no Hopper ", name, " rule for head_dim ", shape.head_dim)};
}

}  // namespace ithaca
