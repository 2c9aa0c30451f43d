// What a worker checks before it opens anything of its job: the paths admission checked may
// have changed since (a queued job's checkpoint.dir replaced by a link out of the roots), so
// each is checked again against the same roots with the same policy
// (engine/core/path_policy.h), and checkpoint.dir is made here, one component at a time with
// O_NOFOLLOW.
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/spec/job_spec.h"

namespace ithaca {

// OK when `roots` is empty. Otherwise every file data.path and eval.path name, model.config,
// model.weights (and the model files beside them or in a weights directory) must resolve inside
// `roots`, and checkpoint.dir is created inside them: PERMISSION_DENIED naming the key and the
// path (never where it leads) otherwise.
absl::Status CheckJobPaths(const JobSpec& spec, const std::vector<std::string>& roots);

}  // namespace ithaca
