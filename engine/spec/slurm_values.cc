// The [slurm] string values, which go on #SBATCH lines: each key's alphabet.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/spec/job_spec.h"
#include "engine/spec/job_spec_internal.h"

namespace ithaca {
namespace spec_internal {

// The [slurm] values go on #SBATCH lines of the batch script ithacad writes: a value with a
// space, a quote or a newline could add options of its own, so each key has its alphabet.
bool SlurmValueOk(const std::string& key, const std::string& v) {
  if (v.size() > 256) return false;
  if (key == "slurm.time_limit") {
    if (v.empty()) return true;
    // minutes | MM:SS | HH:MM:SS | D-HH | D-HH:MM | D-HH:MM:SS (sbatch --time)
    size_t dash = v.find('-');
    std::string days = dash == std::string::npos ? "" : v.substr(0, dash);
    std::string rest = dash == std::string::npos ? v : v.substr(dash + 1);
    std::vector<std::string> parts = absl::StrSplit(rest, ':');
    if (dash != std::string::npos && days.empty()) return false;
    for (char c : days) {
      if (c < '0' || c > '9') return false;
    }
    if (parts.size() > 3) return false;
    for (const std::string& p : parts) {
      if (p.empty() || p.size() > 6) return false;
      for (char c : p) {
        if (c < '0' || c > '9') return false;
      }
    }
    return true;
  }
  const std::string extra = key == "slurm.constraint" ? "_.,-&|!*()[]:" : "_.,-";
  for (char c : v) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && extra.find(c) == std::string::npos) return false;
  }
  return true;
}

std::string SlurmValueRule(const std::string& key) {
  if (key == "slurm.time_limit") {
    return " (sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)";
  }
  if (key == "slurm.constraint") {
    return " (letters, digits and _ . , - & | ! * ( ) [ ] :, at most 256)";
  }
  return " (letters, digits and _ . , -, at most 256)";
}

}  // namespace spec_internal

using spec_internal::SlurmValueOk;
using spec_internal::SlurmValueRule;

absl::Status CheckSlurmValue(const std::string& key, const std::string& value,
                             const std::string& what) {
  if (SlurmValueOk(key, value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": \"", value, "\" is not valid", SlurmValueRule(key)));
}

}  // namespace ithaca
