// Standalone mode: `ithaca-worker --standalone job.toml` trains without a daemon.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace ithaca {

absl::Status RunStandalone(const std::string& spec_path);

}  // namespace ithaca
