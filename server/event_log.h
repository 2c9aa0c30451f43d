// EventLog: one job's stream of events (state changes, step reports, log lines) for WatchJob.
// Appends number events 1, 2, ...; watchers wait for events after the last one they saw. The
// newest `max_events` are retained, so a watcher that starts late replays what it missed.
// Closed after the terminal state event, which is therefore always the last.
#pragma once

#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/core/mutex.h"
#include "absl/time/time.h"
#include "ithaca/v1/job.pb.h"

namespace ithaca {

class EventLog {
 public:
  explicit EventLog(size_t max_events = 50000) : max_events_(max_events) {}

  // Sets the event's seq and time; returns the seq. Ignored once closed.
  int64_t Append(v1::JobEvent event);
  void Close();

  // Retained events with seq > after, waiting up to `timeout` for the first one. `*closed` tells
  // whether the log was closed when the returned batch was taken (nothing will follow it).
  std::vector<v1::JobEvent> WaitAfter(int64_t after, absl::Duration timeout, bool* closed);
  int64_t last_seq();

 private:
  Mutex mu_;
  CondVar cv_;  // an event appended, or the log closed
  std::deque<v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  const size_t max_events_;
};

}  // namespace ithaca
