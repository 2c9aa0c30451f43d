// The one translation of a job spec's memory and parallel settings into the step schedule's
// options (LlamaModel::Options): the trainer builds its model with it and the planner replays
// the same options, so a new memory key is added here once. "auto" values pass through as the
// spec holds them (0 for head_chunk and tile_tokens, RecomputePolicy::kAuto); the planner
// resolves them before a model is built.
#pragma once

#include "engine/schedule/llama.h"
#include "engine/spec/job_spec.h"

namespace ithaca {

LlamaModel::Options ModelOptionsFromSpec(const JobSpec& spec);

}  // namespace ithaca
