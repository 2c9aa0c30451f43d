// LearningRate: warmup ramp, peak, cosine decay to min_lr, clamping past the end.
#include "engine/train/schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace ithaca {
namespace {

constexpr double kLr = 1e-3;
constexpr double kMin = 1e-4;

TEST(ScheduleTest, LinearWarmupToPeak) {
  EXPECT_DOUBLE_EQ(LearningRate(0, 100, 10, kLr, kMin), 0.0);
  EXPECT_DOUBLE_EQ(LearningRate(1, 100, 10, kLr, kMin), kLr * 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(5, 100, 10, kLr, kMin), kLr * 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(10, 100, 10, kLr, kMin), kLr);  // the peak ends warmup
}

TEST(ScheduleTest, CosineDecayEndsAtMinLr) {
  // Halfway through the decay the cosine is at the midpoint.
  EXPECT_NEAR(LearningRate(55, 100, 10, kLr, kMin), (kLr + kMin) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(LearningRate(100, 100, 10, kLr, kMin), kMin);
  EXPECT_GT(LearningRate(99, 100, 10, kLr, kMin), kMin);
  EXPECT_DOUBLE_EQ(LearningRate(101, 100, 10, kLr, kMin), kMin);  // clamped past the end
  EXPECT_DOUBLE_EQ(LearningRate(10000, 100, 10, kLr, kMin), kMin);
}

TEST(ScheduleTest, MonotoneDecayAfterWarmup) {
  double prev = LearningRate(10, 100, 10, kLr, kMin);
  for (int64_t step = 11; step <= 100; ++step) {
    double lr = LearningRate(step, 100, 10, kLr, kMin);
    EXPECT_LT(lr, prev) << "step " << step;
    EXPECT_GE(lr, kMin) << "step " << step;
    prev = lr;
  }
}

TEST(ScheduleTest, NoWarmupStartsAtPeak) {
  EXPECT_DOUBLE_EQ(LearningRate(0, 50, 0, kLr, kMin), kLr);
  EXPECT_LT(LearningRate(1, 50, 0, kLr, kMin), kLr);
  EXPECT_GT(LearningRate(1, 50, 0, kLr, kMin), 0.99 * kLr);
  EXPECT_DOUBLE_EQ(LearningRate(50, 50, 0, kLr, kMin), kMin);
}

TEST(ScheduleTest, WarmupLongerThanTraining) {
  EXPECT_DOUBLE_EQ(LearningRate(5, 10, 20, kLr, kMin), kLr * 0.25);
  EXPECT_DOUBLE_EQ(LearningRate(21, 10, 20, kLr, kMin), kMin);
}

}  // namespace
}  // namespace ithaca
