// Learning-rate schedule: linear warmup from 0, then cosine decay to min_lr at the last step.
#pragma once

#include <cstdint>

namespace ithaca {

// step is 1-based (the first optimizer step is 1).
double LearningRate(int64_t step, int64_t total_steps, int64_t warmup_steps, double lr,
                    double min_lr);

}  // namespace ithaca
