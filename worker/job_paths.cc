#include "worker/job_paths.h"

#include <dirent.h>
#include <sys/stat.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/core/path_policy.h"

namespace ithaca {
namespace {

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

// The model files read beside model.config or model.weights (shards, indexes, tokenizer).
absl::Status CheckModelFiles(const std::string& key, const std::string& dir,
                             const std::vector<std::string>& roots) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::OkStatus();  // nothing can be read from it either
  absl::Status st;
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (!absl::EndsWith(name, ".safetensors") && !absl::EndsWith(name, ".json") &&
        name != "tokenizer.model") {
      continue;
    }
    st = CheckAllowedPath("job", key, dir + "/" + name, roots);
    if (!st.ok()) break;
  }
  closedir(d);
  return st;
}

}  // namespace

absl::Status CheckJobPaths(const JobSpec& spec, const std::vector<std::string>& roots) {
  if (roots.empty()) return absl::OkStatus();
  for (auto [key, path] : {std::pair<const char*, const std::string*>{"data.path", &spec.data.path},
                           {"eval.path", &spec.eval.path}}) {
    if (path->empty()) continue;
    absl::StatusOr<std::vector<std::string>> files = ExpandPattern(*path, roots);
    if (!files.ok()) {
      return absl::Status(files.status().code(),
                          absl::StrCat("job: ", key, ": ", files.status().message()));
    }
  }
  for (auto [key, path] :
       {std::pair<const char*, const std::string*>{"model.config", &spec.model.config},
        {"model.weights", &spec.model.weights}}) {
    if (path->empty()) continue;
    RETURN_IF_ERROR(CheckAllowedPath("job", key, *path, roots));
    struct stat st;
    if (stat(path->c_str(), &st) != 0) continue;  // the reader says it is missing
    RETURN_IF_ERROR(CheckModelFiles(key, S_ISDIR(st.st_mode) ? *path : Dirname(*path), roots));
  }
  // init.from's weights (a checkpoint's model/, perhaps written after admission by the job this
  // one waited for) are read as model.weights' are.
  if (!spec.init.from.empty()) {
    RETURN_IF_ERROR(CheckAllowedPath("job", "init.from", spec.init.from, roots));
    absl::StatusOr<std::string> weights = InitWeightsDir(spec.init.from);
    if (weights.ok()) {  // else the trainer says what is missing
      RETURN_IF_ERROR(CheckAllowedPath("job", "init.from", *weights, roots));
      RETURN_IF_ERROR(CheckModelFiles("init.from", *weights, roots));
    }
  }
  if (!spec.lora.init.empty()) {
    RETURN_IF_ERROR(CheckAllowedPath("job", "lora.init", spec.lora.init, roots));
  }
  if (!spec.checkpoint.dir.empty()) {
    absl::Status made = MakeDirsInsideRoots(spec.checkpoint.dir, roots);
    if (!made.ok()) {
      return absl::Status(made.code(), absl::StrCat("job: checkpoint.dir: ", made.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace ithaca
