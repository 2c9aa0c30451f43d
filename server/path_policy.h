// Which files a job may touch: every path a spec reads or writes (data.path and what its glob
// matches, model.config, model.weights and the files of a weights directory, checkpoint.dir,
// where resume reads and export writes) must lie inside one of ithacad's --allowed-roots once
// symbolic links are resolved, so a job cannot read or overwrite the daemon's own files or
// anything else its user can reach.
//
// The check runs at admission, before anything is opened. A link planted inside a root after
// admission is not seen; workers that run as an unprivileged --worker-user bound that too.
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

// "DIR[:DIR...]" → each directory's real path (they must exist). INVALID_ARGUMENT naming
// --allowed-roots and the directory otherwise.
absl::StatusOr<std::vector<std::string>> ParseAllowedRoots(const std::string& flag);

// Where `path` (absolute) leads: the real path of its longest existing prefix, followed by the
// components that do not exist yet. INVALID_ARGUMENT for a relative path, or a ".." among the
// components that do not exist (it would be resolved against a directory made later).
absl::StatusOr<std::string> ResolveBeneathExisting(const std::string& path);

// OK when `path` resolves inside one of `roots` (real paths, as ParseAllowedRoots gives them);
// otherwise PERMISSION_DENIED "<source>: <key>: <path> (resolves to <real>) is outside the
// allowed roots <roots> (ithacad --allowed-roots)".
absl::Status CheckAllowedPath(const std::string& source, const std::string& key,
                              const std::string& path, const std::vector<std::string>& roots);

}  // namespace ithaca
