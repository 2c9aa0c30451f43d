// Learning-rate schedule: linear warmup, then half a cosine from lr down to min_lr.
#include "engine/train/schedule.h"

#include <algorithm>
#include <cmath>

namespace ithaca {

double LearningRate(int64_t step, int64_t total_steps, int64_t warmup_steps, double lr,
                    double min_lr) {
  step = std::max<int64_t>(step, 0);
  if (warmup_steps > 0 && step <= warmup_steps) {
    return lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  }
  const int64_t start = std::max<int64_t>(warmup_steps, 0);
  // Past the end (or with no room left to decay after warmup) the rate stays at its floor.
  if (step >= total_steps || total_steps <= start) return min_lr;
  const double progress =
      static_cast<double>(step - start) / static_cast<double>(total_steps - start);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace ithaca
