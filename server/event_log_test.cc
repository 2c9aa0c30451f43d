#include "server/event_log.h"

#include <gtest/gtest.h>

#include <thread>

namespace ithaca {
namespace {

v1::JobEvent Step(int s) {
  v1::JobEvent e;
  e.mutable_step()->set_step(s);
  return e;
}

TEST(EventLogTest, NumbersEventsAndReplaysAfterASeq) {
  EventLog log;
  for (int s = 1; s <= 5; ++s) EXPECT_EQ(log.Append(Step(s)), s);
  bool closed = true;
  auto all = log.WaitAfter(0, absl::ZeroDuration(), &closed);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_FALSE(closed);
  EXPECT_GT(all[0].time().seconds(), 0);
  auto tail = log.WaitAfter(3, absl::ZeroDuration(), &closed);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0].step().step(), 4);
}

TEST(EventLogTest, WakesWaitersAndEndsWithClose) {
  EventLog log;
  std::vector<int> seen;
  std::thread watcher([&] {
    int64_t after = 0;
    while (true) {
      bool closed = false;
      for (const v1::JobEvent& e : log.WaitAfter(after, absl::Seconds(5), &closed)) {
        seen.push_back(static_cast<int>(e.step().step()));
        after = e.seq();
      }
      if (closed) break;
    }
  });
  for (int s = 1; s <= 100; ++s) log.Append(Step(s));
  log.Close();
  watcher.join();
  ASSERT_EQ(seen.size(), 100u);
  EXPECT_EQ(seen.back(), 100);
  EXPECT_EQ(log.Append(Step(101)), 0);  // nothing after close
}

TEST(EventLogTest, RetainsOnlyTheNewest) {
  EventLog log(10);
  for (int s = 1; s <= 25; ++s) log.Append(Step(s));
  bool closed;
  auto kept = log.WaitAfter(0, absl::ZeroDuration(), &closed);
  ASSERT_EQ(kept.size(), 10u);
  EXPECT_EQ(kept.front().seq(), 16);
}

}  // namespace
}  // namespace ithaca
