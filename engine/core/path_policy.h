// Which files a job may touch, one policy for ithacad's admission and for the worker's opens:
// every path a spec reads or writes (data.path and what its pattern matches, model.config,
// model.weights and the files of a weights directory, the shards a weights index names
// (engine/model/safetensors.h), checkpoint.dir, where resume reads and export writes) must lie
// inside one of ithacad's --allowed-roots once symbolic links are resolved, so a job cannot read
// or overwrite the daemon's own files or anything else its user can reach.
//
// Admission checks before anything is opened; the worker checks again when it opens (a link
// planted after admission, OpenInsideRoots), with the roots ithacad passes it in
// $ITHACA_ALLOWED_ROOTS. Refusals never name what lies outside the roots (no existence oracle,
// no listing): a path outside is refused the same way whether it exists or not.
#pragma once

#include <fcntl.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "engine/core/status.h"

namespace ithaca {

// Longer paths are refused outright (the kernel would refuse them too, ENAMETOOLONG); this is
// what keeps resolving a path linear in its length.
inline constexpr size_t kMaxPathBytes = 4096;

// The environment variable through which ithacad gives its workers the roots ("DIR[:DIR...]").
inline constexpr char kAllowedRootsEnv[] = "ITHACA_ALLOWED_ROOTS";

// "DIR[:DIR...]" → each directory's real path (they must exist). INVALID_ARGUMENT naming
// --allowed-roots and the directory otherwise.
absl::StatusOr<std::vector<std::string>> ParseAllowedRoots(const std::string& flag);

// The roots in $ITHACA_ALLOWED_ROOTS; empty (any path) when it is unset or empty.
absl::StatusOr<std::vector<std::string>> AllowedRootsFromEnvironment();

// Where `path` (absolute) leads: the real path of its longest existing prefix, followed by the
// components that do not exist yet. A link whose target does not exist is followed to where it
// points (a link to a missing file is judged as one to a file that exists: no existence oracle);
// one that cannot be followed (a loop) is PERMISSION_DENIED, which CheckAllowedPath answers as
// any path outside the roots. INVALID_ARGUMENT for a relative path, one longer than
// kMaxPathBytes or holding a NUL byte, or a ".." among the components that do not exist (it would
// be resolved against a directory made later).
absl::StatusOr<std::string> ResolveBeneathExisting(const std::string& path);

// OK when `path` resolves inside one of `roots` (real paths, as ParseAllowedRoots gives them), or
// `roots` is empty; otherwise PERMISSION_DENIED "<source>: <key>: <path> is outside the allowed
// roots <roots> (ithacad --allowed-roots)". The message never says where the path leads.
absl::Status CheckAllowedPath(const std::string& source, const std::string& key,
                              const std::string& path, const std::vector<std::string>& roots);

// The bounds on expanding a data pattern, so a 300-byte pattern cannot cost minutes or
// gigabytes: brace groups multiply (`{,}` twenty times is a million alternatives), and `*`
// components walk directories.
struct ExpandLimits {
  size_t max_alternatives = 1024;  // after brace expansion
  size_t max_matches = 100000;     // files in all
  size_t max_entries = 1000000;    // directory entries read in all
  absl::Duration max_time = absl::Seconds(10);
  // Polled while expanding (the RPC's client went away): true ends it with CANCELLED.
  std::function<bool()> cancelled;
};

// The files a data pattern names, sorted and without repeats. Braces ({a,b}, nested) expand
// first; each alternative is then a path or a glob (*, ? and [...] within one component; a
// backslash escapes). Every alternative must name at least one file: NOT_FOUND naming the
// alternative otherwise (a typo in one of several files is not silently dropped). With `roots`,
// each alternative's directory is checked before it is listed and each match before it is
// returned (PERMISSION_DENIED as CheckAllowedPath). INVALID_ARGUMENT for an unmatched brace or
// a pattern over kMaxPathBytes or holding a NUL byte; RESOURCE_EXHAUSTED naming the bound a pattern
// exceeds; DEADLINE_EXCEEDED past max_time; CANCELLED when `cancelled` says so.
//
// A path without any of "*?[{" comes back as it is, unchecked for existence (the reader says
// when it is missing), but checked against `roots`.
absl::StatusOr<std::vector<std::string>> ExpandPattern(const std::string& pattern,
                                                       const std::vector<std::string>& roots = {},
                                                       const ExpandLimits& limits = {});

// The sources of a weighted data mix (data.weights): a pattern that is one brace group
// "{A,B,...}" from its first to its last character has the sources A, B, ... (each a pattern of
// its own, nested braces and globs kept); any other pattern is one source, itself.
// INVALID_ARGUMENT for an unmatched brace.
absl::StatusOr<std::vector<std::string>> SplitDataSources(const std::string& pattern);

// A path or data pattern of a spec, relative to `dir` (the spec's directory) when it is relative;
// "" and absolute paths come back as they are, and so does anything when `dir` is empty. A pattern
// that begins with a brace group has each alternative resolved on its own (with the rest of the
// pattern after the group appended to each): "{a.tok,/abs/b.tok}" in /d is
// "{/d/a.tok,/abs/b.tok}", so a weighted mix keeps one source per alternative. Each path comes
// back cleaned (CleanPath), so one directory has one name ("ck" and "jobs/../ck" claim the same
// checkpoint.dir); a brace group further in is expanded first and each of its alternatives
// cleaned on its own, written back as one group after their common directory
// ("sub/{c.tok,../../mix/a.tok}" in /d is "/{d/sub/c.tok,mix/a.tok}": still one source). The one
// rule for admission and the standalone worker (a pattern past ExpandLimits' alternatives comes
// back as it is: ExpandPattern refuses it). INVALID_ARGUMENT for an unmatched brace.
absl::StatusOr<std::string> ResolvePattern(const std::string& dir, const std::string& pattern);
// `path` with "." components, repeated slashes and a component followed by ".." removed,
// lexically (as Go's filepath.Clean): "/x/jobs/../ckpt/" is "/x/ckpt"; ".." above the root
// stays at the root, above a relative path it stays. A glob's "j*/.." goes too: it names the
// directory above whatever j* matches, without asking whether anything does.
std::string CleanPath(const std::string& path);

// True when every alternative of the leading brace group (or the pattern itself) is absolute.
bool PatternIsAbsolute(const std::string& pattern);

// Opens `path` for a job: PERMISSION_DENIED (as CheckAllowedPath) unless it resolves inside
// `roots` (empty: any path), then opens the resolved path one component at a time with
// O_NOFOLLOW, so a link swapped in after the check is refused (ELOOP) rather than followed out
// of the roots. `flags` as for open(2) (O_CREAT needs the parent to exist; `mode` then applies).
// Returns the file descriptor; the caller closes it.
absl::StatusOr<int> OpenInsideRoots(const std::string& path, int flags,
                                    const std::vector<std::string>& roots, mode_t mode = 0644);

// Makes `dir` and its missing parents the same way (each component created and entered with
// O_NOFOLLOW beneath the resolved existing prefix), after checking it against `roots`.
absl::Status MakeDirsInsideRoots(const std::string& dir, const std::vector<std::string>& roots);

}  // namespace ithaca
