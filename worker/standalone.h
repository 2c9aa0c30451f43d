// Standalone mode: `ithaca-worker --standalone job.toml` trains without a daemon, as one rank or
// as one of the ranks a local launcher started (ITHACA_RANK etc. in the environment).
#pragma once

#include <string>

#include "engine/core/status.h"

namespace ithaca {

absl::Status RunStandalone(const std::string& spec_path);

// `ithaca-worker --plan job.toml`: prints the memory plan per tier; FAILED_PRECONDITION when it
// does not fit the spec's budgets.
absl::Status PrintPlan(const std::string& spec_path);

}  // namespace ithaca
