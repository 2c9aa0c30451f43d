// What checkpoint.h's files share, for engine/checkpoint:checkpoint's own files only (in its srcs):
//   checkpoint.cc           the checkpoint directory: listing steps, removing without following
//                           links, stale temporaries and trash, a step's tree checked
//   checkpoint_save.cc      saving: the split of the files among the ranks, the shards, the commit
//   checkpoint_manifest.cc  manifest.json: checksums, writing it, reading and verifying against it
//   checkpoint_load.cc      loading: state.json, whole units or each rank's slices
//   checkpoint_phases.cc    resume and new-phase rules (CheckResumeHasWork, CheckResumeRope,
//                           InitWeightsDir, CheckInitTarget)
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {
namespace checkpoint_internal {

inline constexpr char kPrefix[] = "step-";
inline constexpr char kManifest[] = "manifest.json";
inline constexpr char kManifestFormat[] = "ithaca-manifest-v1";
inline constexpr char kTrashPrefix[] = ".trash-";

// ---- checkpoint.cc.

// "step-00000012".
std::string StepDirName(int64_t step);
// INTERNAL "`what` `path`: strerror(errno)".
absl::Status Errno(const std::string& what, const std::string& path);
// A regular file, not followed if a link.
bool IsRegularFile(const std::string& path);
// Completed checkpoints (step-NNNNNNNN with a manifest), oldest first.
std::vector<std::string> ListCheckpoints(const std::string& dir);
absl::Status FsyncPath(const std::string& path);
// Renames dir/name to a hidden trash name, then deletes it: a kill in between leaves only trash,
// never a half-deleted checkpoint that still lists as complete.
absl::Status MoveToTrashAndRemove(const std::string& dir, const std::string& name);
double SecondsSince(std::chrono::steady_clock::time_point start);

// ---- checkpoint_manifest.cc.

struct FileSum {
  int64_t bytes = 0;
  uint32_t crc = 0;
};
// A file's size and CRC-32, read whole: DATA_LOSS "PATH: missing" when it is not there.
absl::StatusOr<FileSum> Checksum(const std::string& path);
// Writes manifest.json listing every file under `root` (written last, after the data is
// fsynced), then fsyncs every directory of the tree; returns the files' total bytes.
// `known`: sums the ranks computed for the files they wrote, so that only the rest is read here.
absl::StatusOr<int64_t> WriteManifest(const std::string& root,
                                      const std::map<std::string, FileSum>& known);

}  // namespace checkpoint_internal
}  // namespace ithaca
