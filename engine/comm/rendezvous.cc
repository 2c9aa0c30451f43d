#include "engine/comm/rendezvous.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "engine/comm/tcp_store.h"

namespace ithaca {
namespace {

// Keys become file names: keep them to a safe alphabet.
absl::Status CheckKey(const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("rendezvous: empty key");
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.';
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("rendezvous: bad key \"", key, "\""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Rendezvous> ParseRendezvous(const std::string& address) {
  if (absl::StartsWith(address, "file:")) {
    Rendezvous r;
    r.kind = Rendezvous::Kind::kFile;
    r.address = address;
    r.path = address.substr(5);
    if (r.path.empty() || r.path[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("rendezvous \"", address,
                       "\": a file rendezvous needs an absolute directory, "
                       "like file:/tmp/ithaca-rdzv"));
    }
    struct stat st;
    if (::stat(r.path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::NotFoundError(
          absl::StrCat("rendezvous \"", address, "\": ", r.path, " is not a directory"));
    }
    return r;
  }
  if (absl::StartsWith(address, "tcp:")) {
    Rendezvous r;
    r.kind = Rendezvous::Kind::kTcp;
    r.address = address;
    const std::string rest = address.substr(4);
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(rest.substr(colon + 1), &r.port) || r.port < 1 || r.port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rendezvous \"", address, "\": expected tcp:HOST:PORT with a port in 1..65535"));
    }
    r.host = rest.substr(0, colon);
    return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("rendezvous \"", address, "\": expected file:/abs/dir or tcp:HOST:PORT"));
}

absl::Status PublishRendezvousValue(const Rendezvous& rdzv, const std::string& key,
                                    const std::string& value, double timeout_s) {
  RETURN_IF_ERROR(CheckKey(key));
  if (rdzv.kind == Rendezvous::Kind::kTcp) {
    ASSIGN_OR_RETURN(auto client, TcpStoreClient::Connect(rdzv.host, rdzv.port, timeout_s));
    return client->Set(key, value);
  }
  const std::string& dir = rdzv.path;
  const std::string path = dir + "/" + key;
  const std::string tmp = absl::StrCat(dir, "/.", key, ".tmp.", ::getpid());
  if (::access(path.c_str(), F_OK) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rendezvous: ", path, " already exists; the directory was used by another run"));
  }
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(value.data(), static_cast<std::streamsize>(value.size()));
    f.close();
    if (!f) return absl::UnavailableError(absl::StrCat("rendezvous: cannot write ", tmp));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("rendezvous: rename to ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> WaitRendezvousValue(const Rendezvous& rdzv, const std::string& key,
                                                double timeout_s) {
  RETURN_IF_ERROR(CheckKey(key));
  if (rdzv.kind == Rendezvous::Kind::kTcp) {
    ASSIGN_OR_RETURN(auto client, TcpStoreClient::Connect(rdzv.host, rdzv.port, timeout_s));
    return client->Get(key, timeout_s);
  }
  const std::string& dir = rdzv.path;
  const std::string path = dir + "/" + key;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  while (true) {
    std::ifstream f(path, std::ios::binary);
    if (f) {
      std::ostringstream ss;
      ss << f.rdbuf();
      return ss.str();
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous: ", path, " did not appear within ", timeout_s,
                       " s (did rank 0 start, and does it use the same rendezvous?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace ithaca
