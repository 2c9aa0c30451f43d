#include "engine/core/tensor.h"

#include <cmath>

#include "gtest/gtest.h"

namespace ithaca {
namespace {

TEST(TensorTest, RowsAndSlicesPointIntoTheSameMemory) {
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = i;
  Tensor t(v.data(), DType::kF32, {4, 3, 2});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.bytes(), 96u);
  Tensor r = t.Rows(1, 3);
  EXPECT_EQ(r.shape, (Shape{2, 3, 2}));
  EXPECT_EQ(r.f32()[0], 6.0f);
  Tensor s = t.Slice(5, {2, 2});
  EXPECT_EQ(s.f32()[3], 8.0f);
  EXPECT_EQ(t.Reshaped({6, 4}).dim(-1), 4);
}

TEST(DTypeTest, Bf16RoundTripRoundsToNearestEven) {
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f)), 1.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-3.5f)), -3.5f);
  // 1 + 2^-8 lies exactly between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_NEAR(Bf16ToFloat(FloatToBf16(3.14159f)), 3.14159f, 0.02f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

}  // namespace
}  // namespace ithaca
