#include "server/path_policy.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace ithaca {
namespace {

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

bool Inside(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseAllowedRoots(const std::string& flag) {
  std::vector<std::string> roots;
  for (absl::string_view part : absl::StrSplit(flag, ':', absl::SkipEmpty())) {
    const std::string dir(part);
    const std::string real = RealPath(dir);
    struct stat st;
    if (real.empty() || stat(real.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--allowed-roots: ", dir, ": not an existing directory"));
    }
    roots.push_back(real);
  }
  if (roots.empty()) return absl::InvalidArgumentError("--allowed-roots: no directory given");
  return roots;
}

absl::StatusOr<std::string> ResolveBeneathExisting(const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an absolute path"));
  }
  // Walk up until a prefix exists; what is below it is kept as written.
  std::vector<std::string> missing;
  std::string prefix = path;
  std::string real = RealPath(prefix);
  while (real.empty()) {
    while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
    const size_t slash = prefix.rfind('/');
    missing.push_back(prefix.substr(slash + 1));
    prefix = slash == 0 ? "/" : prefix.substr(0, slash);
    real = RealPath(prefix);
    if (real.empty() && prefix == "/") {
      return absl::InvalidArgumentError(absl::StrCat(path, ": cannot resolve"));
    }
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (*it == "." || it->empty()) continue;
    if (*it == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"..\" below a directory that does not exist yet"));
    }
    real = absl::StrCat(real, real == "/" ? "" : "/", *it);
  }
  return real;
}

absl::Status CheckAllowedPath(const std::string& source, const std::string& key,
                              const std::string& path, const std::vector<std::string>& roots) {
  absl::StatusOr<std::string> real = ResolveBeneathExisting(path);
  if (!real.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", key, ": ", real.status().message()));
  }
  for (const std::string& root : roots) {
    if (Inside(*real, root)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      source, ": ", key, ": ", path,
      *real == path ? "" : absl::StrCat(" (resolves to ", *real, ")"),
      " is outside the allowed roots ", absl::StrJoin(roots, ":"), " (ithacad --allowed-roots)"));
}

}  // namespace ithaca
