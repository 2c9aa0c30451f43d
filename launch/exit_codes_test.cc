#include "launch/exit_codes.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>

namespace ithaca {
namespace {

TEST(WorkerEndTest, ReasonsNameTheWorkerExitCodes) {
  EXPECT_EQ(WorkerEnd({false, 0}).Reason(), "ok");
  EXPECT_EQ(WorkerEnd({false, 2}).Reason(), "bad_spec");
  EXPECT_EQ(WorkerEnd({false, 3}).Describe(), "exited with code 3 (out of memory)");
  EXPECT_EQ(WorkerEnd({false, 4}).Reason(), "nan_loss");
  EXPECT_EQ(WorkerEnd({false, 4}).Describe(), "exited with code 4 (NaN loss)");
  EXPECT_EQ(WorkerEnd({false, 5}).Reason(), "killed");
  EXPECT_EQ(WorkerEnd({false, 6}).Reason(), "drained");
  EXPECT_EQ(WorkerEnd({false, 6}).Describe(),
            "exited with code 6 (checkpointed and stopped: drained)");
  EXPECT_EQ(WorkerEnd({false, 127}).Describe(), "exited with code 127 (could not start)");
  EXPECT_EQ(WorkerEnd({true, SIGKILL}).Describe(), "killed by SIGKILL (signal 9)");
  EXPECT_EQ(WorkerEnd({true, SIGKILL}).ShellCode(), 128 + SIGKILL);
}

TEST(WorkerEndTest, RetryableFollowsTheTable) {
  // Another attempt would fail the same way: a bad spec, a NaN loss, out of memory.
  EXPECT_FALSE(WorkerEnd({false, kExitBadSpec}).Retryable());
  EXPECT_FALSE(WorkerEnd({false, kExitNanLoss}).Retryable());
  EXPECT_FALSE(WorkerEnd({false, kExitOutOfMemory}).Retryable());
  EXPECT_FALSE(WorkerEnd({false, kExitOk}).Retryable());
  // A crash, an I/O error, a kill, a code nobody gave: maybe not again.
  EXPECT_TRUE(WorkerEnd({false, kExitError}).Retryable());
  EXPECT_TRUE(WorkerEnd({false, 77}).Retryable());
  EXPECT_TRUE(WorkerEnd({true, SIGKILL}).Retryable());
  EXPECT_TRUE(WorkerEnd({false, kExitDrained}).drained());
  EXPECT_FALSE(WorkerEnd({true, kExitDrained}).drained());
  EXPECT_EQ(WorkerEnd({false, 77}).Reason(), "error");
  EXPECT_EQ(WorkerEnd({false, 77}).Describe(), "exited with code 77 (error)");
}

TEST(WorkerEndTest, EveryReasonIsListedOnce) {
  const std::vector<std::string> reasons = WorkerExitReasons();
  for (int code = 0; code < 256; ++code) {
    const std::string r = WorkerEnd({false, code}).Reason();
    EXPECT_EQ(std::count(reasons.begin(), reasons.end(), r), 1) << r;
  }
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "signal"), 1);
  EXPECT_EQ(std::count(reasons.begin(), reasons.end(), "drained"), 1);
}

TEST(ExitCodeForTest, ANonFiniteLossIsToldByItsMarkNotItsText) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), kExitOk);
  EXPECT_EQ(ExitCodeFor(NonFiniteLossError("loss is nan at step 3")), kExitNanLoss);
  // Corrupt data whose message happens to say "loss is" is bad input, not a NaN loss.
  EXPECT_EQ(ExitCodeFor(absl::DataLossError("data.path: loss is masked everywhere")), kExitBadSpec);
  EXPECT_EQ(ExitCodeFor(absl::DataLossError("checkpoint: checksum mismatch")), kExitBadSpec);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("x")), kExitBadSpec);
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("x")), kExitBadSpec);
  EXPECT_EQ(ExitCodeFor(absl::ResourceExhaustedError("x")), kExitOutOfMemory);
  EXPECT_EQ(ExitCodeFor(absl::CancelledError("x")), kExitKilled);
  EXPECT_EQ(ExitCodeFor(absl::InternalError("x")), kExitError);
  // The mark travels with a copy of the status.
  const absl::Status nan = NonFiniteLossError("eval loss is inf at step 9");
  absl::Status copy = nan;
  EXPECT_TRUE(IsNonFiniteLoss(copy));
  EXPECT_FALSE(IsNonFiniteLoss(absl::DataLossError(nan.message())));
}

}  // namespace
}  // namespace ithaca
