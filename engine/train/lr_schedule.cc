// The learning-rate schedules of training.schedule (lr_schedule.h).
#include "engine/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/core/enum_names.h"

namespace ithaca {
namespace {

// The decay's shape: 1 at x = 0 (its start), 0 at x = 1 (the last step).
double DecayFactor(LrScheduleKind kind, double x) {
  x = std::clamp(x, 0.0, 1.0);
  switch (kind) {
    case LrScheduleKind::kCosine:
      return 0.5 * (1.0 + std::cos(M_PI * x));
    case LrScheduleKind::kLinear:
    case LrScheduleKind::kWsd:
      return 1.0 - x;
    case LrScheduleKind::kConstant:
      return 1.0;
  }
  return 1.0;
}

}  // namespace

constexpr EnumName<LrScheduleKind> kLrScheduleNames[] = {
    {LrScheduleKind::kCosine, "cosine"},
    {LrScheduleKind::kLinear, "linear"},
    {LrScheduleKind::kWsd, "wsd"},
    {LrScheduleKind::kConstant, "constant"},
};

absl::StatusOr<LrScheduleKind> ParseLrScheduleKind(const std::string& name) {
  if (std::optional<LrScheduleKind> k = ValueOf(kLrScheduleNames, name)) return *k;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule \"", name, "\" (", NamesText(kLrScheduleNames, ", "), ")"));
}

const char* LrScheduleName(LrScheduleKind kind) { return NameOf(kLrScheduleNames, kind); }

int64_t LrSchedule::DecayStart() const {
  const int64_t start = std::max<int64_t>(warmup_steps, 0);
  if (kind != LrScheduleKind::kWsd) return start;
  const int64_t after = std::max<int64_t>(total_steps - start, 0);
  const int64_t decay =
      static_cast<int64_t>(std::llround(decay_ratio * static_cast<double>(after)));
  return total_steps - std::clamp<int64_t>(decay, 0, after);
}

double LrSchedule::At(int64_t step) const {
  step = std::max<int64_t>(step, 0);
  if (anchor_step && step >= *anchor_step) {
    // A resumed run whose step count changed: the same decay shape, from where it was.
    const int64_t from = *anchor_step;
    if (step >= total_steps || total_steps <= from) {
      return kind == LrScheduleKind::kConstant ? anchor_lr : min_lr;
    }
    const double x = static_cast<double>(step - from) / static_cast<double>(total_steps - from);
    return min_lr + (anchor_lr - min_lr) * DecayFactor(kind, x);
  }
  if (warmup_steps > 0 && step <= warmup_steps) {
    return lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  }
  if (kind == LrScheduleKind::kConstant) return lr;
  const int64_t start = DecayStart();
  if (step <= start && step < total_steps) return lr;
  // Past the end (or with no room left to decay) the rate stays at its floor.
  if (step >= total_steps || total_steps <= start) return min_lr;
  const double x = static_cast<double>(step - start) / static_cast<double>(total_steps - start);
  return min_lr + (lr - min_lr) * DecayFactor(kind, x);
}

LrSchedule ContinueAfterResume(LrSchedule schedule, int64_t resumed_step, double resumed_lr,
                               int64_t saved_total_steps, std::string* note) {
  if (note) note->clear();
  if (saved_total_steps <= 0 || saved_total_steps == schedule.total_steps) return schedule;
  const double fresh = schedule.At(resumed_step);
  const double tolerance = 1e-9 * std::max(std::abs(schedule.lr), std::abs(resumed_lr));
  if (std::abs(fresh - resumed_lr) <= tolerance) {
    if (note) {
      *note = absl::StrFormat(
          "training.steps %d -> %d: the %s schedule is unchanged at step %d (lr %.4g); it "
          "now decays to min_lr at step %d",
          saved_total_steps, schedule.total_steps, LrScheduleName(schedule.kind), resumed_step,
          resumed_lr, schedule.total_steps);
    }
    return schedule;
  }
  schedule.anchor_step = resumed_step;
  schedule.anchor_lr = resumed_lr;
  if (note) {
    *note = absl::StrFormat(
        "training.steps %d -> %d: the %s decay continues from lr %.4g at step %d down to "
        "min_lr %.4g at step %d (a schedule planned for %d steps would have lr %.4g there)",
        saved_total_steps, schedule.total_steps, LrScheduleName(schedule.kind), resumed_lr,
        resumed_step, schedule.min_lr, schedule.total_steps, schedule.total_steps, fresh);
  }
  return schedule;
}

}  // namespace ithaca
