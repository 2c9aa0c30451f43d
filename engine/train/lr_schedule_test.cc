// LrSchedule: warmup ramp, the four decays (cosine, linear, wsd, constant), clamping past the
// end, and a resumed run whose step count changed keeping its schedule's shape.
#include "engine/train/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace ithaca {
namespace {

constexpr double kLr = 1e-3;
constexpr double kMin = 1e-4;

LrSchedule Make(LrScheduleKind kind, int64_t total, int64_t warmup) {
  LrSchedule s;
  s.kind = kind;
  s.lr = kLr;
  s.min_lr = kMin;
  s.total_steps = total;
  s.warmup_steps = warmup;
  return s;
}

TEST(LrScheduleTest, LinearWarmupToPeak) {
  for (LrScheduleKind k : {LrScheduleKind::kCosine, LrScheduleKind::kLinear, LrScheduleKind::kWsd,
                           LrScheduleKind::kConstant}) {
    const LrSchedule s = Make(k, 100, 10);
    EXPECT_DOUBLE_EQ(s.At(0), 0.0) << LrScheduleName(k);
    EXPECT_DOUBLE_EQ(s.At(1), kLr * 0.1) << LrScheduleName(k);
    EXPECT_DOUBLE_EQ(s.At(5), kLr * 0.5) << LrScheduleName(k);
    EXPECT_DOUBLE_EQ(s.At(10), kLr) << LrScheduleName(k);  // the peak ends warmup
  }
}

TEST(LrScheduleTest, CosineDecayEndsAtMinLr) {
  const LrSchedule s = Make(LrScheduleKind::kCosine, 100, 10);
  // Halfway through the decay the cosine is at the midpoint.
  EXPECT_NEAR(s.At(55), (kLr + kMin) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(s.At(100), kMin);
  EXPECT_GT(s.At(99), kMin);
  EXPECT_DOUBLE_EQ(s.At(101), kMin);  // clamped past the end
  EXPECT_DOUBLE_EQ(s.At(10000), kMin);
  double prev = s.At(10);
  for (int64_t step = 11; step <= 100; ++step) {
    EXPECT_LT(s.At(step), prev) << "step " << step;
    EXPECT_GE(s.At(step), kMin) << "step " << step;
    prev = s.At(step);
  }
}

TEST(LrScheduleTest, LinearDecayIsAStraightLine) {
  const LrSchedule s = Make(LrScheduleKind::kLinear, 110, 10);
  EXPECT_NEAR(s.At(35), kLr - 0.25 * (kLr - kMin), 1e-15);
  EXPECT_NEAR(s.At(60), (kLr + kMin) / 2, 1e-15);
  EXPECT_DOUBLE_EQ(s.At(110), kMin);
}

TEST(LrScheduleTest, WsdHoldsThePeakThenDecaysItsLastShare) {
  LrSchedule s = Make(LrScheduleKind::kWsd, 110, 10);
  s.decay_ratio = 0.2;  // 20 of the 100 steps after warmup
  EXPECT_EQ(s.DecayStart(), 90);
  for (int64_t step = 10; step <= 90; ++step) EXPECT_DOUBLE_EQ(s.At(step), kLr) << step;
  EXPECT_NEAR(s.At(100), (kLr + kMin) / 2, 1e-15);
  EXPECT_LT(s.At(91), kLr);
  EXPECT_DOUBLE_EQ(s.At(110), kMin);
}

TEST(LrScheduleTest, ConstantStaysAtLr) {
  const LrSchedule s = Make(LrScheduleKind::kConstant, 50, 5);
  EXPECT_DOUBLE_EQ(s.At(6), kLr);
  EXPECT_DOUBLE_EQ(s.At(50), kLr);
  EXPECT_DOUBLE_EQ(s.At(500), kLr);
}

TEST(LrScheduleTest, NoWarmupStartsAtPeakAndWarmupLongerThanTraining) {
  const LrSchedule s = Make(LrScheduleKind::kCosine, 50, 0);
  EXPECT_DOUBLE_EQ(s.At(0), kLr);
  EXPECT_LT(s.At(1), kLr);
  EXPECT_GT(s.At(1), 0.99 * kLr);
  EXPECT_DOUBLE_EQ(s.At(50), kMin);
  const LrSchedule w = Make(LrScheduleKind::kCosine, 10, 20);
  EXPECT_DOUBLE_EQ(w.At(5), kLr * 0.25);
  EXPECT_DOUBLE_EQ(w.At(21), kMin);
}

TEST(LrScheduleTest, NamesRoundTripAndUnknownIsRefused) {
  for (const char* name : {"cosine", "linear", "wsd", "constant"}) {
    auto k = ParseLrScheduleKind(name);
    ASSERT_TRUE(k.ok()) << k.status();
    EXPECT_STREQ(LrScheduleName(*k), name);
  }
  auto bad = ParseLrScheduleKind("step");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cosine, linear, wsd, constant"), std::string::npos);
}

// The case: 40 cosine steps, then training.steps raised to 60. Re-deriving the cosine
// for 60 steps jumps from min_lr to a much higher rate at step 41; the continued schedule
// starts where the run was and never rises.
TEST(LrScheduleTest, RaisingStepsAfterAFinishedCosineDoesNotJump) {
  const LrSchedule old = Make(LrScheduleKind::kCosine, 40, 4);
  const double at40 = old.At(40);
  EXPECT_DOUBLE_EQ(at40, kMin);
  std::string note;
  const LrSchedule more =
      ContinueAfterResume(Make(LrScheduleKind::kCosine, 60, 4), 40, at40, 40, &note);
  EXPECT_GT(Make(LrScheduleKind::kCosine, 60, 4).At(41), 3 * kMin) << "the old jump";
  for (int64_t step = 41; step <= 60; ++step) EXPECT_DOUBLE_EQ(more.At(step), kMin) << step;
  EXPECT_NE(note.find("training.steps 40 -> 60"), std::string::npos) << note;
  EXPECT_NE(note.find("continues from lr"), std::string::npos) << note;
}

TEST(LrScheduleTest, RaisingStepsMidDecayContinuesTheSameShapeFromTheCurrentRate) {
  const LrSchedule old = Make(LrScheduleKind::kCosine, 100, 10);
  const double at50 = old.At(50);
  const LrSchedule more =
      ContinueAfterResume(Make(LrScheduleKind::kCosine, 150, 10), 50, at50, 100);
  ASSERT_TRUE(more.anchor_step.has_value());
  EXPECT_DOUBLE_EQ(more.At(50), at50);  // steps up to the resume point are the old ones
  EXPECT_LT(more.At(51), at50);
  EXPECT_GT(more.At(51), at50 - (at50 - kMin) * 0.01);  // a smooth continuation
  EXPECT_NEAR(more.At(100), (at50 + kMin) / 2, 1e-12);  // halfway along the remaining cosine
  EXPECT_DOUBLE_EQ(more.At(150), kMin);
}

TEST(LrScheduleTest, RaisingStepsInWsdStablePhaseJustExtendsIt) {
  LrSchedule old = Make(LrScheduleKind::kWsd, 110, 10);
  LrSchedule longer = Make(LrScheduleKind::kWsd, 210, 10);
  std::string note;
  const LrSchedule more = ContinueAfterResume(longer, 50, old.At(50), 110, &note);
  EXPECT_FALSE(more.anchor_step.has_value());
  EXPECT_DOUBLE_EQ(more.At(150), kLr);  // still stable
  EXPECT_DOUBLE_EQ(more.At(210), kMin);
  EXPECT_NE(note.find("unchanged"), std::string::npos) << note;
}

TEST(LrScheduleTest, SameStepCountChangesNothing) {
  const LrSchedule s = Make(LrScheduleKind::kCosine, 100, 10);
  std::string note = "x";
  const LrSchedule same = ContinueAfterResume(s, 50, s.At(50), 100, &note);
  EXPECT_FALSE(same.anchor_step.has_value());
  EXPECT_EQ(note, "");
}

}  // namespace
}  // namespace ithaca
