#include "server/event_log.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "google/protobuf/util/time_util.h"

namespace ithaca {

int64_t EventLog::Append(v1::JobEvent event) {
  MutexLock lock(&mu_);
  if (closed_) return 0;
  event.set_seq(next_seq_++);
  *event.mutable_time() =
      google::protobuf::util::TimeUtil::MillisecondsToTimestamp(absl::ToUnixMillis(absl::Now()));
  events_.push_back(std::move(event));
  if (events_.size() > max_events_) events_.pop_front();
  cv_.SignalAll();
  return next_seq_ - 1;
}

void EventLog::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  cv_.SignalAll();
}

int64_t EventLog::last_seq() {
  MutexLock lock(&mu_);
  return next_seq_ - 1;
}

std::vector<v1::JobEvent> EventLog::WaitAfter(int64_t after, absl::Duration timeout, bool* closed) {
  MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
  while (!closed_ && next_seq_ - 1 <= after && absl::Now() < deadline) {
    cv_.WaitUntil(&mu_, deadline);
  }
  std::vector<v1::JobEvent> out;
  // Events are in seq order: skip to the first one after `after`.
  auto it = std::lower_bound(events_.begin(), events_.end(), after + 1,
                             [](const v1::JobEvent& e, int64_t s) { return e.seq() < s; });
  for (; it != events_.end(); ++it) out.push_back(*it);
  *closed = closed_;
  return out;
}

}  // namespace ithaca
