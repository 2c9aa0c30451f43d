#include "engine/backend/attention_choice.h"

#include "engine/core/enum_names.h"

namespace ithaca {
namespace {

constexpr EnumName<AttentionKernel> kAttentionKernelNames[] = {
    {AttentionKernel::kAuto, "auto"},
    {AttentionKernel::kCudnn, "cudnn"},
    {AttentionKernel::kHopper, "hopper"},
    {AttentionKernel::kFlash, "flash"},
};

}  // namespace

const char* AttentionKernelName(AttentionKernel k) { return NameOf(kAttentionKernelNames, k); }

const std::vector<std::string>& AttentionKernelNames() {
  static const auto* names = new std::vector<std::string>(NamesOf(kAttentionKernelNames));
  return *names;
}

absl::StatusOr<AttentionKernel> ParseAttentionKernel(const std::string& name) {
  if (std::optional<AttentionKernel> k = ValueOf(kAttentionKernelNames, name)) return *k;
  return absl::InvalidArgumentError(absl::StrCat("attention kernel \"", name.substr(0, 64),
                                                 "\": expected ",
                                                 NamesText(kAttentionKernelNames)));
}

// TFLOPS on one H200 (causal, Hq 32, Hkv 8, bf16) against the engine's cuDNN 9.14.
// Forward (lab/hopper_attention/README.md; K/V multicast over clusters of 2 or 4 CTAs):
//   head_dim 64:  S 64K 513-515 vs 499, 128K 516 vs 498, 256K 508-511 vs 462, 512K 500-502 vs 428
//   head_dim 128: S 64K 619-620 vs 609, 128K 588-595, 256K 582-584, 512K 578-580
//                 (cuDNN 9.19: 554, 513, 487 at 128K, 256K, 512K)
//   Below 64K the fwd+bwd pass with the Hopper backward is as fast or faster after cuDNN's
//   forward (hd64 16K: 542 vs 483).
//   With documents and sliding windows both kernels skip the key blocks (the backward: the query
//   tiles) that no row sees. Measured on one H200 in-engine at S 128K, 32/8 heads
//   (bench/results/2026-12-02-kernels-attention.jsonl, ms, two runs where there are two):
//   documents, forward, hd64: 8K documents 9.70 / 9.70 vs cuDNN's ragged 9.68 / 9.68 (a tie),
//     2K documents 3.58 vs 2.99 (cuDNN faster). In training (train_bench, Llama-3.2-1B, the
//     step's 16 forwards; bench/results/2026-12-02-packed-loss-tile.jsonl): 512K of 32K
//     documents 2305-2328 ms vs cuDNN's 2495-2513 (the own 8 % faster), 128K of 8K documents
//     171.9 vs 181-184. The forward with documents is the own: where cuDNN's wins (documents of
//     2K) it wins by 0.6 ms a layer, 0.3 % of that step, and the longer the documents, the more
//     the step is attention and the more the own forward gains. hd128 with documents was not
//     timed apart; its unmasked lead (below) is larger than hd64's.
//   window 4096, forward: hd64 9.55-9.61 vs cuDNN's band 10.18; hd128 15.40-15.55 vs 15.86-15.93.
//   window 4096, backward: hd64 25.1-25.5 vs 28.6-28.8; hd128 54.7-55.9 vs 47.0 (cuDNN faster).
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
      {AttentionPass::kForward, 64, 65536, true, true},
      {AttentionPass::kForward, 128, 65536, true, true},
      {AttentionPass::kBackward, 64, 16384, true, true},
      {AttentionPass::kBackward, 128, 32768, true, false},
  };
  return *rules;
}

AttentionChoice ChooseAttention(AttentionPass pass, const AttentionShape& shape,
                                AttentionKernel asked) {
  if (asked != AttentionKernel::kAuto) return {asked, "asked for"};
  const char* name = pass == AttentionPass::kForward ? "forward" : "backward";
  const bool hopper_dim = shape.head_dim == 64 || shape.head_dim == 128;
  if (hopper_dim) {
    if (const char* why = AttentionKernelRefuses(AttentionKernel::kCudnn, pass, shape)) {
      return {AttentionKernel::kHopper, absl::StrCat("auto: ", why)};
    }
  }
  const bool window = shape.window > 0 && shape.window < shape.s;
  for (const HopperRule& r : HopperRules()) {
    if (r.pass != pass || r.head_dim != shape.head_dim) continue;
    if (shape.documents && !r.documents) {
      return {AttentionKernel::kCudnn,
              absl::StrCat("auto: the Hopper ", name, " was not measured faster with documents")};
    }
    if (window && !r.window) {
      return {AttentionKernel::kCudnn,
              absl::StrCat("auto: the Hopper ", name, " was not measured faster with a window")};
    }
    if (shape.s >= r.min_s) {
      return {AttentionKernel::kHopper,
              absl::StrCat("auto: Hopper ", name, " measured faster from S ", r.min_s,
                           " at head_dim ", r.head_dim)};
    }
    return {AttentionKernel::kCudnn,
            absl::StrCat("auto: Hopper ", name, " measured faster only from S ", r.min_s,
                         " at head_dim ", r.head_dim)};
  }
  return {AttentionKernel::kCudnn,
          absl::StrCat("auto: no Hopper ", name, " rule for head_dim ", shape.head_dim)};
}

}  // namespace ithaca

namespace ithaca {

const char* AttentionKernelRefuses(AttentionKernel kernel, AttentionPass pass,
                                   const AttentionShape& shape) {
  (void)pass;
  const bool window = shape.window > 0 && shape.window < shape.s;
  if (kernel == AttentionKernel::kFlash && window) return "the flash kernel has no sliding window";
  if (kernel == AttentionKernel::kCudnn && window && shape.window == 1) {
    return "cuDNN's causal band is wrong at a window of one key";
  }
  return nullptr;
}

int64_t HopperBackwardWorkspaceBytes(int64_t s, int64_t heads, int64_t head_dim) {
  const int64_t s_pad = (s + 127) / 128 * 128;  // the kernel's S_pad (kPadS)
  return int64_t{4} * heads * s_pad * (head_dim + 2) + int64_t{8} * s_pad;
}

int64_t AttentionWorkspaceBytes(AttentionKernel kernel, AttentionPass pass,
                                const AttentionShape& shape, int64_t heads) {
  const int64_t s = shape.s, d = shape.head_dim;
  const bool backward = pass == AttentionPass::kBackward;
  switch (kernel) {
    case AttentionKernel::kHopper:
      return backward ? HopperBackwardWorkspaceBytes(s, heads, d) : 0;
    case AttentionKernel::kCudnn: {
      const int64_t stats = shape.documents ? 4 * s * heads : 0;
      return stats + (backward ? (shape.documents ? 12 : 8) * s * heads * d : 0);
    }
    case AttentionKernel::kFlash:  // the f32 [heads, S] row sums of the backward
      return backward ? 4 * s * heads : 0;
    case AttentionKernel::kAuto:
      break;
  }
  return AttentionWorkspaceBytes(ChooseAttention(pass, shape, kernel).kernel, pass, shape, heads);
}

}  // namespace ithaca
