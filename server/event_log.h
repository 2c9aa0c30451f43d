// EventLog: one job's stream of events (state changes, step reports, log lines) for WatchJob.
// Appends number events 1, 2, ...; watchers wait for events after the last one they saw. The
// newest `max_events` are retained, so a watcher that starts late replays what it missed.
// Closed after the terminal state event, which is therefore always the last.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

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
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::JobEvent> events_;
  int64_t next_seq_ = 1;
  bool closed_ = false;
  size_t max_events_;
};

}  // namespace ithaca
