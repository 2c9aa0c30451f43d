// Standalone mode: `ithaca-worker --standalone job.toml` trains without a daemon, as one rank or
// as one of the ranks a local launcher started (ITHACA_RANK etc. in the environment).
#pragma once

#include <string>

#include "engine/core/status.h"

namespace ithaca {

// The spec is resolved here (engine/plan/resolve.h ResolveJob) against this host, as admission
// would resolve it against the daemon's node.
absl::Status RunStandalone(const std::string& spec_path);

// `ithaca-worker --plan job.toml`: resolves the spec against this host and prints the memory
// plan per tier; FAILED_PRECONDITION when it does not fit the budgets.
absl::Status PrintPlan(const std::string& spec_path);

}  // namespace ithaca
