// Issue 53 R6: what a replay holds on the host does not grow with the sequence. The tiny model
// planned at 2^27 tokens raised ithacad to 574 MB (the sample's token ids and this rank's share
// of them and of the labels, 12 bytes a token, made only to be read by a device that reads
// nothing); the replay now holds none of them.
#include <fstream>
#include <string>

#include "engine/plan/planner.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

// This process's peak resident memory (VmHWM), in bytes.
int64_t PeakResidentBytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

TEST(PlanMemoryTest, AReplayAtAnyLengthHoldsNoPerTokenHostMemory) {
  const int64_t before = PeakResidentBytes();
  ASSERT_GT(before, 0);
  PlanRequest req;
  req.cfg = *PresetConfig("tiny");
  req.seq_len = int64_t{1} << 27;
  req.opts.tile_tokens = int64_t{1} << 20;  // few tiles: the test is about memory, not time
  auto plan = PlanMemory(req);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GT(plan->device_total(), req.seq_len);  // the plan did see the whole length
  const int64_t grown = PeakResidentBytes() - before;
  EXPECT_LT(grown, int64_t{64} << 20) << "the replay's peak grew by " << grown << " bytes";
}

}  // namespace
}  // namespace ithaca
