// Test harness: runs a function as N real rank processes (fork, no exec) and collects how each
// ended, with a wall-clock bound so a hung collective fails the test instead of hanging it.
// Fork before the test process starts any thread of its own (Gloo, CUDA): the child gets only
// the calling thread.
#pragma once

#include <sys/types.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "engine/core/status.h"

// In a rank body: returns INTERNAL (and so fails the rank) when `cond` is false.
#define RANK_CHECK(cond, ...)                                                                    \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      return ::absl::InternalError(                                                              \
          ::absl::StrCat(__FILE__, ":", __LINE__, ": check failed: " #cond " ", ##__VA_ARGS__)); \
    }                                                                                            \
  } while (0)

namespace ithaca {
namespace testing {

struct RankOutcome {
  int rank = 0;
  pid_t pid = 0;
  bool exited = false;  // exited normally (else killed by `signal`)
  int exit_code = -1;   // 0: the body returned OK
  int signal = 0;
  bool killed_by_harness = false;  // still running at the wall limit, or expendable
  absl::StatusCode code() const;   // the body's status code, decoded from the exit code
  std::string ToString() const;
};

struct RunOptions {
  double wall_limit_s = 30;
  // Ranks allowed to still be running once all the others have ended (e.g. a rank a test makes
  // hang on purpose); they are then killed with SIGKILL.
  std::set<int> expendable;
};

// Forks `world` processes; process r runs body(r) and exits 0 when it returns OK, otherwise
// prints the status to stderr and exits with 64 + its code. Returns one outcome per rank.
std::vector<RankOutcome> RunRanks(int world, const std::function<absl::Status(int rank)>& body,
                                  const RunOptions& options = {});

// "" when every rank's body returned OK, else a description of each one that did not.
std::string Failures(const std::vector<RankOutcome>& outcomes);

// A TCP port on 127.0.0.1 that was free a moment ago (a tcp: rendezvous for launchers started by
// a test).
int FreeLoopbackPort();

// Polls `cond` every 10 ms until it holds (true) or `seconds` have passed (false).
bool WaitFor(const std::function<bool()>& cond, double seconds);

// A fresh directory for a file rendezvous, removed (with everything in it) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string rendezvous() const { return "file:" + path_; }

 private:
  std::string path_;
};

}  // namespace testing
}  // namespace ithaca
