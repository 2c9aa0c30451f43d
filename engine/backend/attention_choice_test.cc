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

TEST(AttentionChoiceTest, DocumentsKeepTheForwardOnCudnnButNotTheBackward) {
  EXPECT_EQ(Auto(P::kForward, 1 << 20, 64, true), K::kCudnn);
  EXPECT_EQ(Auto(P::kBackward, 1 << 17, 64, true), K::kHopper);
}

TEST(AttentionChoiceTest, ASlidingWindowStaysOnCudnn) {
  EXPECT_EQ(ChooseAttention(P::kForward, {1 << 20, 128, false, true}, K::kAuto).kernel, K::kCudnn);
  EXPECT_EQ(ChooseAttention(P::kBackward, {1 << 20, 128, false, true}, K::kAuto).kernel, K::kCudnn);
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
