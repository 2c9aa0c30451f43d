// ithacad's flags: each defined here, with its default and help, and read in one place,
// OptionsFromFlags, into the checked DaemonOptions that Serve (ithacad_main.cc) runs with.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/auth.h"
#include "server/jobs.h"

namespace ithaca {

// Everything ithacad is told by its flags, checked: what Serve runs with.
struct DaemonOptions {
  ServerSecurity security;
  std::string state_dir;  // absolute
  std::string listen;
  std::string metrics_listen;  // empty: no /metrics
  std::string health_listen;   // empty: no plaintext health server
  Jobs::Options jobs;          // node, supervisor, allowed roots
  // On SIGTERM / SIGINT: fail the running jobs (the old way) instead of leaving them to the
  // next daemon.
  bool stop_jobs_on_exit = false;
  // On SIGTERM / SIGINT: drain the running jobs first (Jobs::Drain), waiting up to this long.
  bool drain_on_exit = false;
  absl::Duration drain_timeout;
};

absl::StatusOr<DaemonOptions> OptionsFromFlags();

// Why --listen could not be served once CheckListenAddress found it free, in the flags' words.
absl::Status ListenFailure(const std::string& listen, bool tls);

}  // namespace ithaca
