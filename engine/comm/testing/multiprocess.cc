#include "engine/comm/testing/multiprocess.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

namespace ithaca {
namespace testing {

constexpr int kStatusExitBase = 64;

absl::StatusCode RankOutcome::code() const {
  if (!exited) return absl::StatusCode::kUnknown;
  if (exit_code == 0) return absl::StatusCode::kOk;
  if (exit_code > kStatusExitBase && exit_code <= kStatusExitBase + 16) {
    return static_cast<absl::StatusCode>(exit_code - kStatusExitBase);
  }
  return absl::StatusCode::kUnknown;
}

std::string RankOutcome::ToString() const {
  std::string s = absl::StrCat("rank ", rank, " (pid ", pid, ")");
  if (killed_by_harness) absl::StrAppend(&s, " killed by the test harness");
  if (exited) {
    absl::StrAppend(&s, " exited with ", exit_code);
    if (exit_code > kStatusExitBase) {
      absl::StrAppend(&s, " (", absl::StatusCodeToString(code()), ")");
    }
  } else {
    absl::StrAppend(&s, " killed by signal ", signal, " (", strsignal(signal), ")");
  }
  return s;
}

std::vector<RankOutcome> RunRanks(int world, const std::function<absl::Status(int rank)>& body,
                                  const RunOptions& options) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<RankOutcome> out(world);
  for (int r = 0; r < world; ++r) {
    out[r].rank = r;
    pid_t pid = fork();
    if (pid == 0) {
      int code = 1;
      try {
        absl::Status st = body(r);
        if (st.ok()) {
          code = 0;
        } else {
          std::fprintf(stderr, "[rank %d] %s\n", r, st.ToString().c_str());
          code = kStatusExitBase + static_cast<int>(st.code());
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] uncaught exception: %s\n", r, e.what());
      } catch (...) {
        std::fprintf(stderr, "[rank %d] uncaught exception\n", r);
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);  // never return into the test framework
    }
    out[r].pid = pid;
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(options.wall_limit_s * 1e3));
  int running = world;
  while (running > 0) {
    bool progress = false;
    for (RankOutcome& o : out) {
      if (o.exit_code != -1 || o.signal != 0) continue;
      int status = 0;
      if (waitpid(o.pid, &status, WNOHANG) == o.pid) {
        o.exited = WIFEXITED(status);
        o.exit_code = o.exited ? WEXITSTATUS(status) : -2;
        o.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        --running;
        progress = true;
      }
    }
    if (progress) continue;
    bool only_expendable = true;
    for (const RankOutcome& o : out) {
      bool alive = o.exit_code == -1 && o.signal == 0;
      if (alive && !options.expendable.count(o.rank)) only_expendable = false;
    }
    if (only_expendable || std::chrono::steady_clock::now() > deadline) {
      for (RankOutcome& o : out) {
        if (o.exit_code == -1 && o.signal == 0) {
          kill(o.pid, SIGKILL);
          o.killed_by_harness = true;
        }
      }
      for (RankOutcome& o : out) {
        if (!o.killed_by_harness) continue;
        int status = 0;
        waitpid(o.pid, &status, 0);
        o.exited = WIFEXITED(status);
        o.exit_code = o.exited ? WEXITSTATUS(status) : -2;
        o.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return out;
}

std::string Failures(const std::vector<RankOutcome>& outcomes) {
  std::string s;
  for (const RankOutcome& o : outcomes) {
    if (o.exited && o.exit_code == 0 && !o.killed_by_harness) continue;
    absl::StrAppend(&s, o.ToString(), "\n");
  }
  return s;
}

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(base ? base : "/tmp", "/ithaca-test-XXXXXX");
  char* made = mkdtemp(tmpl.data());
  if (made == nullptr) {
    std::fprintf(stderr, "mkdtemp(%s): %s\n", tmpl.c_str(), std::strerror(errno));
    std::abort();
  }
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

bool WaitFor(const std::function<bool()>& cond, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace testing
}  // namespace ithaca
