#include "engine/backend/attention_choice.h"

#include "gtest/gtest.h"

namespace ithaca {
namespace {

using K = AttentionKernel;
using P = AttentionPass;

K Auto(P pass, int64_t s, int64_t d, bool docs = false) {
  return ChooseAttention(pass, {s, d, docs}, K::kAuto).kernel;
}

TEST(AttentionChoiceTest, AutoFollowsTheMeasuredTable) {
  EXPECT_EQ(Auto(P::kForward, 65536, 64), K::kHopper);
  EXPECT_EQ(Auto(P::kForward, 65535, 64), K::kCudnn);
  EXPECT_EQ(Auto(P::kForward, 131072, 128), K::kHopper);
  EXPECT_EQ(Auto(P::kBackward, 16384, 64), K::kHopper);
  EXPECT_EQ(Auto(P::kBackward, 16383, 64), K::kCudnn);
  EXPECT_EQ(Auto(P::kBackward, 16384, 128), K::kCudnn);
  EXPECT_EQ(Auto(P::kBackward, 32768, 128), K::kHopper);
  EXPECT_EQ(Auto(P::kForward, 1 << 20, 96), K::kCudnn);  // no rule for head_dim 96
}

// Packed samples run the Hopper kernels from the causal rows' S on (the forward was faster in the
// step at documents of 8K and 32K, and loses 0.3 % of it at 2K).
TEST(AttentionChoiceTest, DocumentsFollowTheTable) {
  EXPECT_EQ(Auto(P::kForward, 1 << 20, 64, true), K::kHopper);
  EXPECT_EQ(Auto(P::kForward, 1 << 17, 128, true), K::kHopper);
  EXPECT_EQ(Auto(P::kForward, 32768, 64, true), K::kCudnn);
  EXPECT_EQ(Auto(P::kBackward, 1 << 17, 64, true), K::kHopper);
  EXPECT_EQ(Auto(P::kBackward, 1 << 17, 128, true), K::kHopper);
}

// A window of 4096 at 128K: the Hopper forward won at both head dims, the backward at 64 only.
TEST(AttentionChoiceTest, SlidingWindowsFollowTheTable) {
  EXPECT_EQ(ChooseAttention(P::kForward, {1 << 17, 128, false, 4096}, K::kAuto).kernel, K::kHopper);
  EXPECT_EQ(ChooseAttention(P::kForward, {1 << 17, 64, false, 4096}, K::kAuto).kernel, K::kHopper);
  EXPECT_EQ(ChooseAttention(P::kBackward, {1 << 17, 64, false, 4096}, K::kAuto).kernel, K::kHopper);
  EXPECT_EQ(ChooseAttention(P::kBackward, {1 << 17, 128, false, 4096}, K::kAuto).kernel, K::kCudnn);
  EXPECT_EQ(ChooseAttention(P::kBackward, {1 << 17, 64, true, 4096}, K::kAuto).kernel, K::kHopper);
  EXPECT_EQ(ChooseAttention(P::kForward, {1 << 17, 64, true, 4096}, K::kAuto).kernel, K::kHopper);
  EXPECT_EQ(ChooseAttention(P::kForward, {4096, 128, false, 100}, K::kAuto).kernel, K::kCudnn);
  // A window of S keys or more is the causal mask: the causal rows decide.
  EXPECT_EQ(ChooseAttention(P::kBackward, {1 << 17, 128, false, 1 << 17}, K::kAuto).kernel,
            K::kHopper);
}

// cuDNN's causal band is wrong at a window of one key: auto takes the Hopper kernels at any S
// where they exist (head_dim 64, 128), and cuDNN or flash asked for are refused with the reason.
TEST(AttentionChoiceTest, AWindowOfOneKeyNeverRunsOnCudnn) {
  for (P pass : {P::kForward, P::kBackward}) {
    AttentionChoice c = ChooseAttention(pass, {136, 64, false, 1}, K::kAuto);
    EXPECT_EQ(c.kernel, K::kHopper);
    EXPECT_NE(c.why.find("one key"), std::string::npos) << c.why;
    EXPECT_EQ(ChooseAttention(pass, {136, 96, false, 1}, K::kAuto).kernel, K::kCudnn);
    EXPECT_NE(AttentionKernelRefuses(K::kCudnn, pass, {136, 96, false, 1}), nullptr);
    EXPECT_EQ(AttentionKernelRefuses(K::kCudnn, pass, {136, 64, false, 2}), nullptr);
    EXPECT_EQ(AttentionKernelRefuses(K::kCudnn, pass, {1, 64, false, 1}), nullptr)
        << "a window of S keys or more is the causal mask";
    EXPECT_EQ(AttentionKernelRefuses(K::kHopper, pass, {136, 64, false, 1}), nullptr);
    EXPECT_NE(AttentionKernelRefuses(K::kFlash, pass, {136, 64, false, 40}), nullptr);
    EXPECT_EQ(AttentionKernelRefuses(K::kFlash, pass, {136, 64, true, 0}), nullptr);
  }
}

// The workspace of the kernel that runs: the Hopper backward's f32 dQ accumulator and rows,
// cuDNN's backward at 8 (12 ragged) bytes per element plus the ragged statistics.
TEST(AttentionChoiceTest, WorkspacesPerKernel) {
  const int64_t S = 131072, h = 32;
  const AttentionShape causal{S, 64, false}, docs{S, 64, true};
  EXPECT_EQ(AttentionWorkspaceBytes(K::kHopper, P::kBackward, docs, h), 4 * h * S * 66 + 8 * S);
  EXPECT_EQ(HopperBackwardWorkspaceBytes(1000, h, 64), 4 * h * 1024 * 66 + 8 * 1024);
  EXPECT_EQ(AttentionWorkspaceBytes(K::kHopper, P::kForward, docs, h), 0);
  EXPECT_EQ(AttentionWorkspaceBytes(K::kCudnn, P::kBackward, causal, h), 8 * S * h * 64);
  EXPECT_EQ(AttentionWorkspaceBytes(K::kCudnn, P::kBackward, docs, h), 12 * S * h * 64 + 4 * S * h);
  EXPECT_EQ(AttentionWorkspaceBytes(K::kCudnn, P::kForward, docs, h), 4 * S * h);
  EXPECT_EQ(AttentionWorkspaceBytes(K::kAuto, P::kBackward, docs, h),
            AttentionWorkspaceBytes(K::kHopper, P::kBackward, docs, h));
}

TEST(AttentionChoiceTest, AnAskedKernelIsKept) {
  for (K k : {K::kCudnn, K::kHopper, K::kFlash}) {
    AttentionChoice c = ChooseAttention(P::kForward, {128, 64, false}, k);
    EXPECT_EQ(c.kernel, k);
    EXPECT_EQ(c.why, "asked for");
  }
}

TEST(AttentionChoiceTest, WhyNamesTheDecidingRow) {
  AttentionChoice c = ChooseAttention(P::kBackward, {8192, 128, false}, K::kAuto);
  EXPECT_EQ(c.why, "auto: Hopper backward measured faster only from S 32768 at head_dim 128");
}

TEST(AttentionChoiceTest, NamesRoundTrip) {
  for (const std::string& n : AttentionKernelNames()) {
    auto k = ParseAttentionKernel(n);
    ASSERT_TRUE(k.ok());
    EXPECT_EQ(AttentionKernelName(*k), n);
  }
  EXPECT_FALSE(ParseAttentionKernel("own").ok());
}

}  // namespace
}  // namespace ithaca
