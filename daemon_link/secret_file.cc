#include "daemon_link/secret_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ithaca {
namespace {

constexpr off_t kMaxSecretBytes = 1 << 20;

bool IsOwnGroup(gid_t gid) {
  if (gid == getegid() || gid == getgid()) return true;
  const int n = getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(n);
  const int got = getgroups(n, groups.data());
  return got > 0 && std::find(groups.begin(), groups.begin() + got, gid) != groups.begin() + got;
}

}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what) {
  auto bad = [&](const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": ", msg));
  };
  // O_NONBLOCK: a FIFO must not hang the daemon's start (it is refused below).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return bad(std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return bad("not a regular file");
  }
  const mode_t group_bits = st.st_mode & 070, other_bits = st.st_mode & 007;
  if (other_bits != 0 || (group_bits & 030) != 0 || (group_bits != 0 && !IsOwnGroup(st.st_gid))) {
    close(fd);
    return bad(absl::StrCat("readable or writable by other users (mode ",
                            absl::StrFormat("%04o", st.st_mode & 07777), "); chmod 600 it"));
  }
  if (st.st_size > kMaxSecretBytes) {
    close(fd);
    return bad(absl::StrCat("larger than ", kMaxSecretBytes, " bytes"));
  }
  std::string content(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < content.size()) {
    const ssize_t n = read(fd, content.data() + got, content.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  content.resize(got);
  return content;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, const std::string& what) {
  absl::StatusOr<std::string> content = ReadSecretFile(path, what);
  if (!content.ok()) return content.status();
  const std::string token(absl::StripAsciiWhitespace(*content));
  if (token.size() < kMinTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": the token has ",
                                                   token.size(), " bytes; at least ",
                                                   kMinTokenBytes, " are needed"));
  }
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", path,
                       ": the token must be printable ASCII without spaces (it is sent in an "
                       "HTTP header); e.g. openssl rand -hex 32"));
    }
  }
  return token;
}

}  // namespace ithaca
