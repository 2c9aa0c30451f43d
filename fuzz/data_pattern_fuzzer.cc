// libFuzzer harness: data.path patterns (engine/core/path_policy.h ExpandPattern), as admission
// and the workers expand them. Under a small tree made once per process (a root with files and
// directories, a directory outside it, a link from the root to the outside), any input must
// expand or be refused, within a time budget (10,000-way brace groups must not cost seconds)
// and within libFuzzer's memory limit; every file it returns lies inside the root; no
// refusal names a file outside the root.
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "engine/core/path_policy.h"

namespace {

struct Tree {
  std::string root, outside;
  Tree() {
    const char* dir = std::getenv("TMPDIR");
    const std::string base = std::string(dir && *dir ? dir : "/tmp") + "/ithaca_fuzz_pattern." +
                             std::to_string(getpid());
    root = base + "/root";
    outside = base + "/outside";
    for (const std::string& d : {base, root, root + "/shards", root + "/shards/deep", outside}) {
      mkdir(d.c_str(), 0700);
    }
    for (const std::string& f :
         {root + "/a.tok", root + "/b.tok", root + "/shards/s1.tok", root + "/shards/s2.tok",
          root + "/shards/deep/x.tok", outside + "/hidden-outside-name"}) {
      std::ofstream(f) << "x";
    }
    symlink(outside.c_str(), (root + "/escape").c_str());
    char buf[PATH_MAX];
    if (realpath(root.c_str(), buf)) root = buf;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tree tree;
  const std::string pattern =
      tree.root + "/" + std::string(reinterpret_cast<const char*>(data), size);
  ithaca::ExpandLimits limits;
  limits.max_time = absl::Seconds(1);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<std::string>> files =
      ithaca::ExpandPattern(pattern, {tree.root}, limits);
  if (absl::Now() - start > absl::Seconds(3)) {
    std::fprintf(stderr, "fuzz check: ExpandPattern took %s\n",
                 absl::FormatDuration(absl::Now() - start).c_str());
    std::abort();
  }
  if (!files.ok()) {
    // (The input itself may spell the name, across brace groups too: every alternative is a
    // subsequence of the pattern's characters, "hidden-outsid{}e-name" and "{h,x}idden-..."
    // alike. Echoing what the input can spell tells nothing; a listing of the outside would
    // name it where the input cannot.)
    const std::string name = "hidden-outside-name";
    size_t matched = 0;
    for (char c : pattern) {
      if (matched < name.size() && c == name[matched]) ++matched;
    }
    if (files.status().message().find(name) != absl::string_view::npos && matched < name.size()) {
      std::fprintf(stderr, "fuzz check: a refusal names a file outside the root: %s\n",
                   files.status().ToString().c_str());
      std::abort();
    }
    return 0;
  }
  for (const std::string& f : *files) {
    if (f.find_first_of("*?[{") != std::string::npos && files->size() == 1 && f == pattern) {
      continue;  // a path without wildcards comes back as it is
    }
    char buf[PATH_MAX];
    const std::string real = realpath(f.c_str(), buf) ? std::string(buf) : f;
    if (real.compare(0, tree.root.size(), tree.root) != 0) {
      std::fprintf(stderr, "fuzz check: %s lies outside the root %s\n", real.c_str(),
                   tree.root.c_str());
      std::abort();
    }
  }
  return 0;
}
