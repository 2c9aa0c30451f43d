// The learning-rate schedule (training.schedule): a linear warmup from 0 to training.lr over
// training.warmup_steps, then one of
//   cosine    half a cosine from lr down to min_lr at the last step (the default)
//   linear    a straight line from lr down to min_lr at the last step
//   wsd       warmup-stable-decay: lr until the last training.decay_ratio of the steps after
//             warmup, then a straight line down to min_lr at the last step
//   constant  lr to the end (min_lr unused)
// Past the last step the rate stays where the schedule ended.
//
// A resumed run whose training.steps changed keeps its schedule's shape: when the schedule for
// the new step count gives another rate at the resumed step than the run had (a cosine or linear
// decay under way, a WSD decay begun), it continues from the rate the run had there, with the
// same decay shape, down to min_lr at the new last step (ContinueAfterResume), instead of
// jumping to the rate a run planned that long from the start would have had.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace ithaca {

enum class LrScheduleKind { kCosine, kLinear, kWsd, kConstant };

// "cosine", "linear", "wsd", "constant"; InvalidArgument naming the choices otherwise.
absl::StatusOr<LrScheduleKind> ParseLrScheduleKind(const std::string& name);
const char* LrScheduleName(LrScheduleKind kind);

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kCosine;
  double lr = 0;      // the peak, reached at the end of warmup
  double min_lr = 0;  // absolute: where the decay ends
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double decay_ratio = 0.2;  // wsd: the share of the steps after warmup that decay

  // Set by ContinueAfterResume: from `anchor_step` on, the decay continues from `anchor_lr`.
  std::optional<int64_t> anchor_step;
  double anchor_lr = 0;

  // The rate of optimizer step `step` (1-based: the first step is 1).
  double At(int64_t step) const;

  // Where the rate starts to fall after warmup (the end of WSD's stable phase).
  int64_t DecayStart() const;
};

// The schedule of a run resumed at `resumed_step`, whose rate there was `resumed_lr` under a
// schedule planned for `saved_total_steps`, now running to schedule.total_steps. Unchanged when
// the step count is the same or the new schedule agrees with the old rate at the resumed step;
// otherwise anchored there (above). `note` (optional) gets a sentence saying what changed, or
// "" when nothing did.
LrSchedule ContinueAfterResume(LrSchedule schedule, int64_t resumed_step, double resumed_lr,
                               int64_t saved_total_steps, std::string* note = nullptr);

}  // namespace ithaca
