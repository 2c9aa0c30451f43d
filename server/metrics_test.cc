#include "server/metrics.h"

#include <gtest/gtest.h>

namespace ithaca {
namespace {

v1::StepReport Report(int step, double seconds) {
  v1::StepReport r;
  r.set_step(step);
  r.set_total_steps(10);
  r.set_loss(2.5);
  r.set_tokens(512);
  r.set_seconds(seconds);
  r.set_tokens_per_second(512 / seconds);
  auto* t = r.add_memory();
  t->set_tier("params");
  t->set_current_bytes(1000);
  t->set_peak_bytes(1500);
  auto* h = r.add_memory();
  h->set_tier("host_offload");
  h->set_current_bytes(77);
  return r;
}

TEST(MetricsTest, RendersSeriesWithJoinLabelsAndAHistogram) {
  Metrics m;
  m.OnStep("job-1", 1, 3, "GPU-abc", Report(1, 0.03));
  m.OnStep("job-1", 1, 3, "GPU-abc", Report(2, 0.3));
  m.OnWorkerExit("nan_loss");
  m.SetJobCounts({{v1::JOB_STATE_RUNNING, 1}});
  m.SetJobStates({{"job-1", v1::JOB_STATE_RUNNING}, {"job-0", v1::JOB_STATE_FAILED}});
  m.SetDevices({{3, "GPU-abc", int64_t{141} << 30}});
  const std::string text = m.Render();
  const std::string l = "job=\"job-1\",rank=\"1\",gpu=\"3\",UUID=\"GPU-abc\"";
  for (const std::string& want : std::vector<std::string>{
           "# TYPE ithaca_step_duration_seconds histogram",
           "ithaca_gpu_memory_bytes{" + l + ",tier=\"params\"} 1000",
           "ithaca_gpu_memory_peak_bytes{" + l + ",tier=\"params\"} 1500",
           "ithaca_host_offload_bytes{" + l + "} 77", "ithaca_tokens_total{" + l + "} 1024",
           "ithaca_train_step{" + l + "} 2",
           "ithaca_step_duration_seconds_bucket{" + l + ",le=\"0.05\"} 1",
           "ithaca_step_duration_seconds_bucket{" + l + ",le=\"0.5\"} 2",
           "ithaca_step_duration_seconds_bucket{" + l + ",le=\"+Inf\"} 2",
           "ithaca_step_duration_seconds_count{" + l + "} 2", "ithaca_jobs{state=\"running\"} 1",
           "ithaca_jobs{state=\"queued\"} 0", "ithaca_worker_exits_total{reason=\"nan_loss\"} 1",
           "ithaca_job_state{job=\"job-1\",state=\"running\"} 1",
           "ithaca_job_state{job=\"job-0\",state=\"failed\"} 1",
           "ithaca_gpu_memory_capacity_bytes{gpu=\"3\",UUID=\"GPU-abc\"} 151397597184",
           "ithaca_last_step_timestamp_seconds{" + l + "} 1",  // Unix seconds: 1.7e9…
       }) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  // host_offload is not a GPU tier.
  EXPECT_EQ(text.find("tier=\"host_offload\""), std::string::npos);
}

TEST(MetricsTest, DropsSeriesOfOldFinishedJobs) {
  Metrics m;
  for (int j = 0; j < Metrics::kFinishedJobsKept + 3; ++j) {
    const std::string id = "job-" + std::to_string(j);
    m.OnStep(id, 0, 0, "", Report(1, 0.1));
    v1::EvalReport e;
    e.set_loss(3.5);
    m.OnEval(id, 0, 0, "", e);
    m.OnJobFinished(id);
  }
  const std::string text = m.Render();
  EXPECT_EQ(text.find("job=\"job-0\""), std::string::npos);
  EXPECT_NE(text.find("job=\"job-18\""), std::string::npos);
}

// The newest evaluation's loss, with the per-rank labels; an evaluation-only job (no step) gets
// it without any step series.
TEST(MetricsTest, EvalLossOfTheNewestEvaluation) {
  Metrics m;
  m.OnStep("job-1", 0, 3, "GPU-abc", Report(1, 0.1));
  v1::EvalReport e;
  e.set_step(1);
  e.set_loss(3.25);
  m.OnEval("job-1", 0, 3, "GPU-abc", e);
  e.set_loss(3.125);
  m.OnEval("job-1", 0, 3, "GPU-abc", e);
  e.set_loss(4.5);
  m.OnEval("job-2", 0, 1, "GPU-def", e);
  const std::string text = m.Render();
  EXPECT_NE(text.find("# TYPE ithaca_eval_loss gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("ithaca_eval_loss{job=\"job-1\",rank=\"0\",gpu=\"3\",UUID=\"GPU-abc\"} "
                      "3.125\n"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find("ithaca_eval_loss{job=\"job-2\",rank=\"0\",gpu=\"1\",UUID=\"GPU-def\"} 4.5\n"),
      std::string::npos)
      << text;
  EXPECT_EQ(text.find("ithaca_train_loss{job=\"job-2\""), std::string::npos) << text;
}

}  // namespace
}  // namespace ithaca
