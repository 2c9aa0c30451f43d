#include "client/format.h"

#include <gtest/gtest.h>

namespace ithaca {
namespace {

TEST(FormatTest, HumanUnits) {
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(3 * 1024 * 1024 + 100 * 1024), "3.1 MiB");
  EXPECT_EQ(HumanBytes(int64_t{15} << 30), "15.0 GiB");
  EXPECT_EQ(HumanDuration(7.4), "0:07");
  EXPECT_EQ(HumanDuration(3 * 3600 + 2 * 60 + 11), "3:02:11");
  EXPECT_EQ(HumanDuration(-1), "?");
  EXPECT_EQ(HumanRate(472.54), "472.5");
  EXPECT_EQ(HumanRate(12400), "12.4k");
}

TEST(FormatTest, ProgressLineAndMemoryTable) {
  v1::Job job;
  job.set_id("job-1");
  for (int rank = 0; rank < 2; ++rank) {
    v1::StepReport* r = job.add_last_steps();
    r->set_rank(rank);
    r->set_step(12);
    r->set_total_steps(60);
    r->set_loss(3.214);
    r->set_tokens_per_second(12400);
    r->set_device_peak_bytes(int64_t{3} << 20);
    v1::TierBytes* t = r->add_memory();
    t->set_tier("params");
    t->set_peak_bytes((rank + 1) * 1024);
  }
  EXPECT_EQ(ProgressLine(job.last_steps(0), 7),
            "step 12/60 | loss 3.2140 | 12.4k tok/s/rank | mem 3.0 MiB | ETA 0:07");
  const std::string table = MemoryTable(job);
  EXPECT_NE(table.find("rank 0"), std::string::npos) << table;
  EXPECT_NE(table.find("rank 1"), std::string::npos) << table;
  EXPECT_NE(table.find("2.0 KiB"), std::string::npos) << table;
  EXPECT_NE(table.find("device total"), std::string::npos) << table;
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_reason("rank 1 exited with code 4 (NaN loss)");
  job.set_failed_rank(1);
  const std::string details = JobDetails(job);
  EXPECT_NE(details.find("FAILED"), std::string::npos);
  EXPECT_NE(details.find("failed rank: 1"), std::string::npos);
  EXPECT_EQ(details.find("spec (resolved)"), std::string::npos) << "no spec, no section";
  job.set_spec_toml("name = \"j\"\n\n[memory]\nhead_chunk = 4\n");
  EXPECT_NE(JobDetails(job).find("  spec (resolved):\n    name = \"j\"\n    [memory]\n"
                                 "    head_chunk = 4\n"),
            std::string::npos)
      << JobDetails(job);
  EXPECT_NE(JobLine(job).find("step 12/60"), std::string::npos);
}

TEST(FormatTest, EvalLineInWatchAndStatus) {
  v1::EvalReport e;
  e.set_rank(0);
  e.set_step(20);
  e.set_loss(3.1234);
  e.set_tokens(65536);
  e.set_batches(8);
  e.set_seconds(1.2);
  EXPECT_EQ(EvalLine(e),
            "eval step 20: loss 3.1234 (ppl 22.7) over 65536 tokens, 8 batches, 1.20 s");
  v1::Job job;
  job.set_id("job-1");
  EXPECT_EQ(JobDetails(job).find("last eval"), std::string::npos) << "none yet, no line";
  *job.mutable_last_eval() = e;
  EXPECT_NE(JobDetails(job).find("  last eval: eval step 20: loss 3.1234 (ppl 22.7)"),
            std::string::npos)
      << JobDetails(job);
}

TEST(FormatTest, ControlCharactersFromTheDaemonNeverReachTheTerminalRaw) {
  EXPECT_EQ(Printable("run\x1b[2J\r\x7f-1"), "run\\x1b[2J\\x0d\\x7f-1");
  EXPECT_EQ(Printable("a\tb\nc"), "a\\x09b\\x0ac");
  EXPECT_EQ(Printable("a\tb\nc\x07", /*keep_newlines=*/true), "a\tb\nc\\x07");
  EXPECT_EQ(Printable("\xc3\xa9t\xc3\xa9"), "\xc3\xa9t\xc3\xa9");  // UTF-8 passes
  EXPECT_EQ(Printable(std::string(300, 'n'), false, 256),
            std::string(256, 'n') + "...(44 more bytes)");
  v1::Job job;
  job.set_id("job-1");
  job.set_name("evil\x1b]0;pwned\x07");
  EXPECT_EQ(JobLine(job).find('\x1b'), std::string::npos);
  EXPECT_NE(JobLine(job).find("evil\\x1b]0;pwned\\x07"), std::string::npos);
}

TEST(FormatTest, NodeShowsTheLibrariesWorkersLoad) {
  v1::NodeInfo n;
  n.set_hostname("h200-0");
  n.set_libraries("cuDNN 9.14.0 (built with 9.19.0), NCCL 2.28.3 (built with 2.28.9)");
  EXPECT_NE(NodeText(n).find("libraries: cuDNN 9.14.0 (built with 9.19.0), NCCL 2.28.3"),
            std::string::npos)
      << NodeText(n);
  n.clear_libraries();
  EXPECT_EQ(NodeText(n).find("libraries:"), std::string::npos);
}

}  // namespace
}  // namespace ithaca
