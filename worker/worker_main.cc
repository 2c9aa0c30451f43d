// ithaca-worker: one training rank. Modes:
//   --standalone JOB.toml   train without a daemon (development, benchmarks, the demo)
#include <cstdio>
#include <cstring>

#include "worker/exit_codes.h"
#include "worker/standalone.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: ithaca-worker --standalone JOB.toml\n"
               "  Trains the job in this process (no daemon) and prints one line per step.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--standalone") == 0) {
    absl::Status st = ithaca::RunStandalone(argv[2]);
    if (!st.ok()) {
      std::fprintf(stderr, "ithaca-worker: %s\n", st.ToString().c_str());
      return ithaca::ExitCodeFor(st);
    }
    return 0;
  }
  Usage();
  return ithaca::kExitBadSpec;
}
