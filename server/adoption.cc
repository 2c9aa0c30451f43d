#include "launch/worker_contract.h"
#include "server/adoption.h"

#include "launch/layout.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/core/file_util.h"
#include "launch/layout.h"

namespace ithaca {

absl::Status WriteAdoptionRecord(const std::string& log_dir, const AdoptionRecord& r) {
  const std::string text = absl::StrCat(
      "job=", r.job_id, "\nsecret=", r.secret, "\npgid=", r.pgid, "\nrendezvous=", r.rendezvous,
      "\nslots=", absl::StrJoin(r.slots, ","), "\npids=", absl::StrJoin(r.pids, ","), "\n");
  const std::string path = AdoptionRecordPath(log_dir);
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat(tmp, ": ", std::strerror(errno)));
  const bool wrote =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  close(fd);
  if (!wrote || rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

namespace {

absl::Status ParseInts(const std::string& path, const std::string& key, const std::string& value,
                       std::vector<int>* out) {
  for (absl::string_view item : absl::StrSplit(value, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(item, &v)) {
      return absl::DataLossError(absl::StrCat(path, ": ", key, ": not a number: ", item));
    }
    out->push_back(v);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AdoptionRecord> ReadAdoptionRecord(const std::string& log_dir) {
  const std::string path = AdoptionRecordPath(log_dir);
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": no adoption record"));
  AdoptionRecord r;
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) {
      return absl::DataLossError(absl::StrCat(path, ": not key=value: \"", line, "\""));
    }
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == "job") {
      r.job_id = value;
    } else if (key == "secret") {
      r.secret = value;
    } else if (key == "pgid") {
      if (!absl::SimpleAtoi(value, &r.pgid)) {
        return absl::DataLossError(absl::StrCat(path, ": pgid: not a number: ", value));
      }
    } else if (key == "rendezvous") {
      r.rendezvous = value;
    } else if (key == "slots") {
      RETURN_IF_ERROR(ParseInts(path, key, value, &r.slots));
    } else if (key == "pids") {
      std::vector<int> pids;
      RETURN_IF_ERROR(ParseInts(path, key, value, &pids));
      r.pids.assign(pids.begin(), pids.end());
    } else {
      return absl::DataLossError(absl::StrCat(path, ": unknown key \"", key, "\""));
    }
  }
  if (r.job_id.empty() || r.secret.empty() || r.pids.empty() || r.pids.size() != r.slots.size()) {
    return absl::DataLossError(
        absl::StrCat(path, ": incomplete (needs job, secret and as many pids as slots)"));
  }
  return r;
}

absl::StatusOr<std::string> NewJobSecret() {
  unsigned char bytes[32];
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) {
    return absl::InternalError("cannot read /dev/urandom for a job secret");
  }
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : bytes) {
    hex.push_back(kHex[b >> 4]);
    hex.push_back(kHex[b & 15]);
  }
  return hex;
}

bool IsWorkerOf(pid_t pid, const std::string& job_id, const std::string& secret) {
  if (pid <= 0) return false;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close_paren = line.rfind(')');
  // The state follows the parenthesized command: Z (zombie) and X (dead) are gone.
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return false;
  const char state = line[close_paren + 2];
  if (state == 'Z' || state == 'X') return false;
  std::ifstream env(absl::StrCat("/proc/", pid, "/environ"), std::ios::binary);
  const std::string want_job = absl::StrCat(kEnvJobId, "=", job_id);
  const std::string want_secret = absl::StrCat(kEnvJobSecret, "=", secret);
  bool job = false, same_launch = false;
  std::string var;
  while (std::getline(env, var, '\0')) {
    job |= var == want_job;
    same_launch |= var == want_secret;
  }
  return job && same_launch;
}

}  // namespace ithaca
