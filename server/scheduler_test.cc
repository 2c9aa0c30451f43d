#include "server/scheduler.h"

#include <gtest/gtest.h>

namespace ithaca {
namespace {

TEST(SchedulerTest, FirstInFirstOutWithoutOvertaking) {
  Scheduler s({8});
  ASSERT_TRUE(s.Enqueue("a", 4).ok());
  ASSERT_TRUE(s.Enqueue("b", 8).ok());
  ASSERT_TRUE(s.Enqueue("c", 1).ok());
  auto first = s.Schedule();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].job_id, "a");
  EXPECT_EQ(first[0].slots, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(s.free_slots(), 4);
  // "b" needs 8 and waits; "c" would fit but must not jump ahead of it.
  EXPECT_TRUE(s.Schedule().empty());
  EXPECT_EQ(s.queued(), 2);
  s.Release("a");
  auto second = s.Schedule();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].job_id, "b");
  EXPECT_EQ(second[0].slots.size(), 8u);
  s.Release("b");
  auto third = s.Schedule();
  ASSERT_EQ(third.size(), 1u);
  EXPECT_EQ(third[0].job_id, "c");
  EXPECT_EQ(third[0].slots, (std::vector<int>{0}));
}

TEST(SchedulerTest, PacksSeveralJobsAndReusesFreedSlots) {
  Scheduler s({4});
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(s.Enqueue(id, 1).ok());
  auto got = s.Schedule();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2].slots, (std::vector<int>{2}));
  s.Release("b");
  ASSERT_TRUE(s.Enqueue("d", 2).ok());
  auto d = s.Schedule();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].slots, (std::vector<int>{1, 3}));
  EXPECT_EQ(s.owners()[1], "d");
  EXPECT_EQ(s.owners()[0], "a");
  EXPECT_EQ(s.free_slots(), 0);
}

TEST(SchedulerTest, RejectsWhatCanNeverRunAndRemovesQueuedJobs) {
  Scheduler s({2});
  absl::Status st = s.Enqueue("big", 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("parallel.world"), std::string::npos);
  EXPECT_EQ(s.Enqueue("zero", 0).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(s.Enqueue("a", 2).ok());
  ASSERT_TRUE(s.Enqueue("b", 2).ok());
  EXPECT_TRUE(s.Remove("a"));
  EXPECT_FALSE(s.Remove("a"));
  auto got = s.Schedule();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].job_id, "b");
}

}  // namespace
}  // namespace ithaca
