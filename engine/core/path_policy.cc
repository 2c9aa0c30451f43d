#include "engine/core/path_policy.h"

#include <dirent.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace ithaca {
namespace {

// The kernel's own bound on the links one path may pass through (ELOOP past it).
constexpr int kMaxLinkHops = 40;

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

bool Inside(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

// A path the system calls would read otherwise than it is written is refused: one over
// kMaxPathBytes, and one with a NUL byte (a C string ends there, so "<root>/\0<anything>" would
// stat, list and match as <root> itself).
absl::Status CheckPathBytes(const std::string& path) {
  if (path.size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path.substr(0, 64), "...: a path of ",
                                                   path.size(), " bytes; at most ", kMaxPathBytes));
  }
  if (const size_t nul = path.find('\0'); nul != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(absl::CHexEscape(path.substr(0, 64)),
                                                   ": a NUL byte at byte ", nul, " of the path"));
  }
  return absl::OkStatus();
}

// PERMISSION_DENIED "<path> is outside ..." unless `path` resolves inside a root. Where it
// resolves to is not said: that would tell what lies outside the roots.
absl::Status CheckInside(const std::string& path, const std::vector<std::string>& roots) {
  if (roots.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> real = ResolveBeneathExisting(path);
  // PERMISSION_DENIED: a link that cannot be followed, answered as any path outside.
  if (!real.ok() && !absl::IsPermissionDenied(real.status())) return real.status();
  for (const std::string& root : roots) {
    if (real.ok() && Inside(*real, root)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(path, " is outside the allowed roots ",
                                                  absl::StrJoin(roots, ":"),
                                                  " (ithacad --allowed-roots)"));
}

// --- Patterns -------------------------------------------------------------------------------

bool HasWildcard(absl::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '*' || s[i] == '?' || s[i] == '[') {
      return true;
    }
  }
  return false;
}

std::string Unescape(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) ++i;
    out.push_back(s[i]);
  }
  return out;
}

// The first top-level brace group of `p`: [open, close] and its alternatives (begin, end).
// False when there is none; INVALID_ARGUMENT for a '{' without its '}'.
absl::StatusOr<bool> FirstGroup(const std::string& p, size_t* open, size_t* close,
                                std::vector<std::pair<size_t, size_t>>* alternatives) {
  int depth = 0;
  size_t start = 0, segment = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      ++i;
    } else if (c == '{') {
      if (depth++ == 0) {
        start = i;
        segment = i + 1;
        alternatives->clear();
      }
    } else if (c == ',' && depth == 1) {
      alternatives->push_back({segment, i});
      segment = i + 1;
    } else if (c == '}' && depth > 0 && --depth == 0) {
      alternatives->push_back({segment, i});
      *open = start;
      *close = i;
      return true;
    }
  }
  if (depth > 0) {
    return absl::InvalidArgumentError(absl::StrCat(p, ": a '{' without its '}'"));
  }
  return false;
}

struct Budget {
  const ExpandLimits& limits;
  const std::string& pattern;
  absl::Time deadline;
  size_t entries = 0;

  absl::Status Check() const {
    if (limits.cancelled && limits.cancelled()) {
      return absl::CancelledError(absl::StrCat(pattern, ": expansion cancelled"));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(pattern, ": expanding the pattern took over ",
                                                      absl::FormatDuration(limits.max_time),
                                                      "; name fewer files"));
    }
    return absl::OkStatus();
  }
};

// The pattern with every brace group expanded, in order.
absl::StatusOr<std::vector<std::string>> ExpandBraces(const std::string& pattern, Budget& budget) {
  std::deque<std::string> work = {pattern};
  std::vector<std::string> done;
  size_t made = 0;
  const size_t max = budget.limits.max_alternatives;
  while (!work.empty()) {
    std::string p = std::move(work.front());
    work.pop_front();
    size_t open = 0, close = 0;
    std::vector<std::pair<size_t, size_t>> alternatives;
    ASSIGN_OR_RETURN(bool group, FirstGroup(p, &open, &close, &alternatives));
    if (!group) {
      done.push_back(std::move(p));
      continue;
    }
    // Every string made counts, so nested and repeated groups cannot multiply unseen.
    made += alternatives.size();
    if (done.size() + work.size() + alternatives.size() > max || made > 4 * max) {
      return absl::ResourceExhaustedError(
          absl::StrCat(pattern, ": its braces expand to more than ", max, " alternatives"));
    }
    RETURN_IF_ERROR(budget.Check());
    const std::string prefix = p.substr(0, open), suffix = p.substr(close + 1);
    for (auto it = alternatives.rbegin(); it != alternatives.rend(); ++it) {
      work.push_front(absl::StrCat(
          prefix, absl::string_view(p).substr(it->first, it->second - it->first), suffix));
    }
  }
  return done;
}

std::string Join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return absl::StrCat(dir, dir.back() == '/' ? "" : "/", name);
}

// Adds to `out` the files under `dir` (which exists, and lies inside the roots when it is to be
// listed) that components[i...] match.
absl::Status Walk(const std::string& dir, const std::vector<std::string>& components, size_t i,
                  const std::vector<std::string>& roots, Budget& budget,
                  std::vector<std::string>* out) {
  // Every step is checked, not only every 256 entries read: the steps between listings (a stat,
  // the roots check of each match) are what a pattern with many matches spends its time on.
  RETURN_IF_ERROR(budget.Check());
  if (i == components.size()) {
    RETURN_IF_ERROR(CheckInside(dir, roots));
    if (out->size() >= budget.limits.max_matches) {
      return absl::ResourceExhaustedError(absl::StrCat(budget.pattern, ": matches more than ",
                                                       budget.limits.max_matches, " files"));
    }
    out->push_back(dir);
    return absl::OkStatus();
  }
  const std::string& c = components[i];
  const bool last = i + 1 == components.size();
  if (!HasWildcard(c)) {
    const std::string next = Join(dir, Unescape(c));
    struct stat st;
    if (stat(next.c_str(), &st) != 0 || (!last && !S_ISDIR(st.st_mode))) return absl::OkStatus();
    return Walk(next, components, i + 1, roots, budget, out);
  }
  // Nothing outside the roots is listed: the check comes before opendir.
  RETURN_IF_ERROR(CheckInside(dir.empty() ? "." : dir, roots));
  DIR* d = opendir(dir.empty() ? "." : dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT || errno == ENOTDIR) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat(dir, ": a directory of the pattern cannot be read (", strerror(errno), ")"));
  }
  std::vector<std::string> names;
  absl::Status st;
  while (struct dirent* e = readdir(d)) {
    if (++budget.entries > budget.limits.max_entries) {
      st = absl::ResourceExhaustedError(absl::StrCat(
          budget.pattern, ": reads more than ", budget.limits.max_entries, " directory entries"));
      break;
    }
    if ((budget.entries & 255) == 0 && !(st = budget.Check()).ok()) break;
    const char* name = e->d_name;
    if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
    if (fnmatch(c.c_str(), name, FNM_PERIOD) == 0) names.emplace_back(name);
  }
  closedir(d);
  RETURN_IF_ERROR(st);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string next = Join(dir, name);
    struct stat s;
    if (!last && (stat(next.c_str(), &s) != 0 || !S_ISDIR(s.st_mode))) continue;
    RETURN_IF_ERROR(Walk(next, components, i + 1, roots, budget, out));
  }
  return absl::OkStatus();
}

// --- Opening --------------------------------------------------------------------------------

absl::Status OpenError(const std::string& path, const std::string& what, int err) {
  const std::string msg = absl::StrCat(path, ": ", what, ": ", strerror(err));
  if (err == ELOOP || err == ENOTDIR) {
    return absl::PermissionDeniedError(absl::StrCat(
        path, ": ", what, ": a symbolic link appeared on the path after it was checked; refused"));
  }
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::UnavailableError(msg);
}

// Opens the directory `real` (a resolved absolute path) from "/" down, one component at a time
// with O_NOFOLLOW, creating missing components when `create`. Returns an O_PATH descriptor.
absl::StatusOr<int> OpenDirectoryNoFollow(const std::string& real, bool create) {
  int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return OpenError(real, "open /", errno);
  for (absl::string_view part : absl::StrSplit(real, '/', absl::SkipEmpty())) {
    const std::string name(part);
    int next = openat(fd, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0 && errno == ENOENT && create) {
      if (mkdirat(fd, name.c_str(), 0755) != 0 && errno != EEXIST) {
        const int err = errno;
        close(fd);
        return OpenError(real, absl::StrCat("create ", name), err);
      }
      next = openat(fd, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    const int err = errno;
    close(fd);
    if (next < 0) return OpenError(real, absl::StrCat("open ", name), err);
    fd = next;
  }
  return fd;
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

absl::StatusOr<std::vector<std::string>> AllowedRootsFromEnvironment() {
  const char* env = getenv(kAllowedRootsEnv);
  if (env == nullptr || *env == '\0') return std::vector<std::string>{};
  absl::StatusOr<std::vector<std::string>> roots = ParseAllowedRoots(env);
  if (!roots.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("$", kAllowedRootsEnv, ": ", roots.status().message()));
  }
  return roots;
}

namespace {

absl::StatusOr<std::string> ResolveFollowing(const std::string& path, int hops) {
  RETURN_IF_ERROR(CheckPathBytes(path));
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an absolute path"));
  }
  // Walk up until a prefix exists; what is below it is kept as written.
  std::vector<std::string> missing;
  std::string prefix = path;
  std::string real = RealPath(prefix);
  while (real.empty()) {
    while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
    // A link whose target does not exist (yet) leads where its target says, like any link: it
    // is followed, so that a link to a missing file outside the roots is judged as one to a
    // file that exists there (no existence oracle). Whatever stops the resolution past a link
    // (a loop, "..") is PERMISSION_DENIED without a reason: it lies where the link leads.
    struct stat lst;
    if (lstat(prefix.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
      char target[PATH_MAX];
      const ssize_t n = readlink(prefix.c_str(), target, sizeof(target));
      const auto unresolvable = [&] {
        return absl::PermissionDeniedError(absl::StrCat(path, ": cannot be resolved"));
      };
      if (hops >= kMaxLinkHops || n <= 0 || n == static_cast<ssize_t>(sizeof(target))) {
        return unresolvable();
      }
      std::string next(target, static_cast<size_t>(n));
      if (next[0] != '/') {
        const size_t slash = prefix.rfind('/');
        next = absl::StrCat(slash == 0 ? "" : prefix.substr(0, slash), "/", next);
      }
      for (auto it = missing.rbegin(); it != missing.rend(); ++it) absl::StrAppend(&next, "/", *it);
      absl::StatusOr<std::string> followed = ResolveFollowing(next, hops + 1);
      if (!followed.ok()) return unresolvable();
      return followed;
    }
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

}  // namespace

absl::StatusOr<std::string> ResolveBeneathExisting(const std::string& path) {
  return ResolveFollowing(path, 0);
}

absl::Status CheckAllowedPath(const std::string& source, const std::string& key,
                              const std::string& path, const std::vector<std::string>& roots) {
  if (roots.empty()) return absl::OkStatus();
  absl::Status inside = CheckInside(path, roots);
  if (inside.ok()) return inside;
  return absl::Status(inside.code(), absl::StrCat(source, ": ", key, ": ", inside.message()));
}

absl::StatusOr<std::vector<std::string>> ExpandPattern(const std::string& pattern,
                                                       const std::vector<std::string>& roots,
                                                       const ExpandLimits& limits) {
  RETURN_IF_ERROR(CheckPathBytes(pattern));
  if (pattern.find_first_of("*?[{") == std::string::npos) {
    RETURN_IF_ERROR(CheckInside(pattern, roots));
    return std::vector<std::string>{pattern};
  }
  Budget budget{limits, pattern, absl::Now() + limits.max_time};
  ASSIGN_OR_RETURN(std::vector<std::string> alternatives, ExpandBraces(pattern, budget));
  const bool braces = alternatives.size() > 1 || alternatives[0] != pattern;
  std::vector<std::string> out;
  for (const std::string& alternative : alternatives) {
    RETURN_IF_ERROR(budget.Check());
    const size_t before = out.size();
    if (!HasWildcard(alternative)) {
      const std::string path = Unescape(alternative);
      RETURN_IF_ERROR(CheckInside(path, roots));  // before stat: no existence oracle
      struct stat st;
      if (stat(path.c_str(), &st) == 0) out.push_back(path);
    } else {
      std::vector<std::string> components;
      for (absl::string_view c : absl::StrSplit(alternative, '/', absl::SkipEmpty())) {
        components.emplace_back(c);
      }
      // The literal directory the matches lie under is checked before anything is read.
      size_t first_wild = 0;
      std::string base = alternative[0] == '/' ? "/" : "";
      while (first_wild < components.size() && !HasWildcard(components[first_wild])) {
        base = Join(base, Unescape(components[first_wild++]));
      }
      RETURN_IF_ERROR(CheckInside(base.empty() ? "." : base, roots));
      struct stat st;
      if (stat(base.empty() ? "." : base.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        std::vector<std::string> rest(components.begin() + first_wild, components.end());
        RETURN_IF_ERROR(Walk(base, rest, 0, roots, budget, &out));
      }
    }
    if (out.size() == before) {
      return absl::NotFoundError(
          braces ? absl::StrCat(alternative, ": no such file (an alternative of ", pattern, ")")
                 : absl::StrCat(pattern, ": the pattern matches no file"));
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::StatusOr<int> OpenInsideRoots(const std::string& path, int flags,
                                    const std::vector<std::string>& roots, mode_t mode) {
  RETURN_IF_ERROR(CheckInside(path, roots));
  ASSIGN_OR_RETURN(std::string real, ResolveBeneathExisting(path));
  const size_t slash = real.rfind('/');
  const std::string parent = slash == 0 ? "/" : real.substr(0, slash);
  const std::string name = real.substr(slash + 1);
  ASSIGN_OR_RETURN(int dir, OpenDirectoryNoFollow(parent, /*create=*/false));
  if (name.empty()) return dir;  // "/" itself
  const int fd = openat(dir, name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
  const int err = errno;
  close(dir);
  if (fd < 0) return OpenError(path, "open", err);
  return fd;
}

absl::Status MakeDirsInsideRoots(const std::string& dir, const std::vector<std::string>& roots) {
  RETURN_IF_ERROR(CheckInside(dir, roots));
  ASSIGN_OR_RETURN(std::string real, ResolveBeneathExisting(dir));
  ASSIGN_OR_RETURN(int fd, OpenDirectoryNoFollow(real, /*create=*/true));
  close(fd);
  return absl::OkStatus();
}

std::string CleanPath(const std::string& path) {
  if (path.empty()) return path;
  const bool absolute = path[0] == '/';
  std::vector<std::string> parts;
  for (absl::string_view c : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (c == ".") continue;
    if (c == "..") {
      if (!parts.empty() && parts.back() != "..") {
        parts.pop_back();
      } else if (!absolute) {
        parts.emplace_back("..");
      }
      continue;
    }
    parts.emplace_back(c);
  }
  const std::string joined = absl::StrJoin(parts, "/");
  if (absolute) return "/" + joined;
  return joined.empty() ? "." : joined;
}

namespace {

// `s` with its unescaped ',', '{' and '}' escaped, to stand as one alternative of a brace group.
std::string EscapeAlternative(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      out.append(s, i, 2);
      ++i;
      continue;
    }
    if (s[i] == ',' || s[i] == '{' || s[i] == '}') out.push_back('\\');
    out.push_back(s[i]);
  }
  return out;
}

// CleanPath for a pattern with brace groups: cleaning it whole would let a ".." inside a group
// take away what stands before the group ("sub/{c.tok,../../mix/a.tok}" became
// "sub/mix/a.tok}"). The groups are expanded first (bounded as ExpandPattern's are), each
// alternative cleaned on its own, and they are written back as one group after their common
// directory ("/d/sub/{c.tok,../../mix/a.tok}" is "/{d/sub/c.tok,mix/a.tok}"), which is not
// leading, so the pattern stays one source of a data mix. A pattern whose whole cleaning names
// the same paths (no "." or ".." inside a group) keeps its form.
std::string CleanBracedPattern(const std::string& pattern) {
  const ExpandLimits limits;
  Budget budget{limits, pattern, absl::Now() + limits.max_time};
  absl::StatusOr<std::vector<std::string>> expanded = ExpandBraces(pattern, budget);
  // Past the bounds it is left as it is: expanding it (ExpandPattern) refuses it, naming its key.
  if (!expanded.ok()) return pattern;
  std::vector<std::string> alternatives = *std::move(expanded);
  for (std::string& a : alternatives) a = CleanPath(a);
  const std::string whole = CleanPath(pattern);
  absl::StatusOr<std::vector<std::string>> same = ExpandBraces(whole, budget);
  if (same.ok() && *same == alternatives) return whole;
  if (alternatives.size() == 1) return alternatives[0];
  size_t common = alternatives[0].size();
  for (const std::string& a : alternatives) {
    common = std::min(common, a.size());
    for (size_t i = 0; i < common; ++i) {
      if (a[i] != alternatives[0][i]) {
        common = i;
        break;
      }
    }
  }
  const size_t slash = alternatives[0].rfind('/', common == 0 ? 0 : common - 1);
  const size_t cut = slash == std::string::npos ? 0 : slash + 1;
  // A group at the start would make the pattern a data mix's sources: "./" keeps it one.
  std::string out = (cut == 0 ? "./" : alternatives[0].substr(0, cut)) + "{";
  for (size_t i = 0; i < alternatives.size(); ++i) {
    absl::StrAppend(&out, i ? "," : "", EscapeAlternative(alternatives[i].substr(cut)));
  }
  return out + "}";
}

}  // namespace

absl::StatusOr<std::string> ResolvePattern(const std::string& dir, const std::string& pattern) {
  if (pattern.empty()) return pattern;
  size_t open = 0, close = 0;
  std::vector<std::pair<size_t, size_t>> alternatives;
  ASSIGN_OR_RETURN(bool group, FirstGroup(pattern, &open, &close, &alternatives));
  if (!group || open != 0) {
    if (pattern[0] != '/' && dir.empty()) return pattern;
    const std::string path = pattern[0] == '/' ? pattern : absl::StrCat(dir, "/", pattern);
    return group ? CleanBracedPattern(path) : CleanPath(path);
  }
  const std::string rest = pattern.substr(close + 1);
  std::string out = "{";
  for (size_t i = 0; i < alternatives.size(); ++i) {
    const auto& [b, e] = alternatives[i];
    ASSIGN_OR_RETURN(std::string one, ResolvePattern(dir, pattern.substr(b, e - b) + rest));
    absl::StrAppend(&out, i ? "," : "", one);
  }
  return out + "}";
}

bool PatternIsAbsolute(const std::string& pattern) {
  size_t open = 0, close = 0;
  std::vector<std::pair<size_t, size_t>> alternatives;
  absl::StatusOr<bool> group = FirstGroup(pattern, &open, &close, &alternatives);
  if (!group.ok() || !*group || open != 0) return !pattern.empty() && pattern[0] == '/';
  const std::string rest = pattern.substr(close + 1);
  for (const auto& [b, e] : alternatives) {
    if (!PatternIsAbsolute(pattern.substr(b, e - b) + rest)) return false;
  }
  return true;
}

absl::StatusOr<std::vector<std::string>> SplitDataSources(const std::string& pattern) {
  size_t open = 0, close = 0;
  std::vector<std::pair<size_t, size_t>> alternatives;
  ASSIGN_OR_RETURN(bool group, FirstGroup(pattern, &open, &close, &alternatives));
  if (!group || open != 0 || close + 1 != pattern.size()) return std::vector<std::string>{pattern};
  std::vector<std::string> out;
  for (const auto& [b, e] : alternatives) out.push_back(pattern.substr(b, e - b));
  return out;
}

}  // namespace ithaca
