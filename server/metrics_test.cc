#include "server/metrics.h"

#include <gtest/gtest.h>

#include <tuple>
#include "absl/strings/str_cat.h"

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
  auto* b = r.add_memory();  // the saved block inputs on the device
  b->set_tier("block_inputs");
  b->set_current_bytes(300);
  b->set_peak_bytes(400);
  auto* h = r.add_memory();  // and the ones offloaded to the host
  h->set_tier("host_block_inputs");
  h->set_current_bytes(77);
  auto* o = r.add_memory();
  o->set_tier("host_optimizer");
  o->set_current_bytes(99);
  auto* w = r.add_memory();
  w->set_tier("host_params");
  w->set_current_bytes(55);
  return r;
}

// A rank on a CPU slot is labelled by job and rank alone: no gpu, no UUID.
TEST(MetricsTest, ACpuSlotIsNoGpu) {
  Metrics m;
  m.OnStep("job-c", 2, Metrics::kCpuSlot, "", Report(1, 0.5));
  const std::string text = m.Render();
  EXPECT_NE(text.find("ithaca_gpu_memory_bytes{job_id=\"job-c\",rank=\"2\",tier=\"params\"} 1000"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ithaca_train_loss{job_id=\"job-c\",rank=\"2\"} 2.5"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("gpu="), std::string::npos) << text;
  EXPECT_EQ(text.find("UUID="), std::string::npos) << text;
}

// A data.weights mix: per source, samples, tokens and trained tokens add up over the steps rank 0
// reports, and the loss is the newest step's that sampled the source.
TEST(MetricsTest, PerSourceSeriesOfAMix) {
  Metrics m;
  auto with_sources = [](int step, int64_t b_samples, double b_loss) {
    v1::StepReport r = Report(step, 1.0);
    v1::SourceReport* a = r.add_sources();
    a->set_source(1);
    a->set_path("/data/web/*.tok");
    a->set_samples(3);
    a->set_tokens(3 * 64);
    a->set_loss_tokens(3 * 64);
    a->set_loss(3.25 + step);
    v1::SourceReport* b = r.add_sources();
    b->set_source(2);
    b->set_path("/data/sft.tok");
    b->set_samples(b_samples);
    b->set_tokens(b_samples * 64);
    b->set_loss_tokens(b_samples * 20);
    b->set_loss(b_loss);
    return r;
  };
  m.OnStep("job-m", 0, 0, "GPU-a", with_sources(1, 1, 1.5));
  m.OnStep("job-m", 0, 0, "GPU-a", with_sources(2, 0, 0));  // no sample of source 2
  m.OnStep("job-m", 1, 1, "GPU-b", with_sources(2, 0, 0));  // rank 1: not counted again
  const std::string text = m.Render();
  const std::string a = "{job_id=\"job-m\",path=\"/data/web/*.tok\",source=\"1\"}";
  const std::string b = "{job_id=\"job-m\",path=\"/data/sft.tok\",source=\"2\"}";
  for (const std::string& want : std::vector<std::string>{
           "ithaca_source_samples_total" + a + " 6",
           "ithaca_source_tokens_total" + a + " 384",
           "ithaca_source_loss_tokens_total" + a + " 384",
           "ithaca_source_loss" + a + " 5.25",
           "ithaca_source_samples_total" + b + " 1",
           "ithaca_source_tokens_total" + b + " 64",
           "ithaca_source_loss_tokens_total" + b + " 20",
           "ithaca_source_loss" + b + " 1.5",
       }) {
    EXPECT_NE(text.find(want + "\n"), std::string::npos) << want << "\n" << text;
  }
}

TEST(MetricsTest, RendersSeriesWithJoinLabelsAndAHistogram) {
  Metrics m;
  m.OnStep("job-1", 1, 3, "GPU-abc", Report(1, 0.03));
  m.OnStep("job-1", 1, 3, "GPU-abc", Report(2, 0.3));
  m.OnWorkerExit("nan_loss");
  m.SetJobCounts({{v1::JOB_STATE_RUNNING, 1}});
  v1::Job running, failed;
  running.set_id("job-1");
  running.set_state(v1::JOB_STATE_RUNNING);
  failed.set_id("job-0");
  failed.set_state(v1::JOB_STATE_FAILED);
  m.SetJobs({running, failed});
  m.SetDevices({{3, "GPU-abc", int64_t{141} << 30}});
  const std::string text = m.Render();
  // prometheus-cpp writes labels sorted by name.
  const std::string l = "UUID=\"GPU-abc\",gpu=\"3\",job_id=\"job-1\",rank=\"1\"";
  for (const std::string& want : std::vector<std::string>{
           "# TYPE ithaca_step_duration_seconds histogram",
           "ithaca_gpu_memory_bytes{" + l + ",tier=\"params\"} 1000",
           "ithaca_gpu_memory_peak_bytes{" + l + ",tier=\"params\"} 1500",
           "ithaca_gpu_memory_bytes{" + l + ",tier=\"block_inputs\"} 300",
           "ithaca_gpu_memory_peak_bytes{" + l + ",tier=\"block_inputs\"} 400",
           "ithaca_host_block_inputs_bytes{" + l + "} 77",
           "ithaca_host_optimizer_bytes{" + l + "} 99",
           "ithaca_host_params_bytes{" + l + "} 55",
           "ithaca_tokens_total{" + l + "} 1024",
           "ithaca_train_step{" + l + "} 2",
           "ithaca_step_duration_seconds_bucket{" + l + ",le=\"0.05\"} 1",
           "ithaca_step_duration_seconds_bucket{" + l + ",le=\"0.5\"} 2",
           "ithaca_step_duration_seconds_bucket{" + l + ",le=\"+Inf\"} 2",
           "ithaca_step_duration_seconds_count{" + l + "} 2",
           "ithaca_jobs{state=\"running\"} 1",
           "ithaca_jobs{state=\"queued\"} 0",
           "ithaca_worker_exits_total{reason=\"nan_loss\"} 1",
           "ithaca_job_state{job_id=\"job-1\",state=\"running\"} 1",
           "ithaca_job_state{job_id=\"job-0\",state=\"failed\"} 1",
           "ithaca_gpu_memory_capacity_bytes{UUID=\"GPU-abc\",gpu=\"3\"} 151397597184",
           "ithaca_step_duration_seconds_bucket{" + l + ",le=\"7200\"} 2",
           std::string("ithaca_build_info{version=\"") + kIthacaVersion + "\"} 1",
           "# TYPE process_cpu_seconds_total counter",
           "process_resident_memory_bytes ",
           "process_open_fds ",
           "process_start_time_seconds 1",
           "ithaca_last_step_timestamp_seconds{" + l + "} 1",  // Unix seconds: 1.7e9…
       }) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  // host_block_inputs is not a GPU tier.
  EXPECT_EQ(text.find("tier=\"host_block_inputs\""), std::string::npos);
  EXPECT_EQ(text.find("tier=\"host_optimizer\""), std::string::npos);
  EXPECT_EQ(text.find("tier=\"host_params\""), std::string::npos);
  // MFU 0 means unknown: no sample, rather than a 0 that reads as an idle GPU.
  EXPECT_EQ(text.find("ithaca_mfu_ratio{"), std::string::npos) << text;
  // The scrape job's label is Prometheus' own.
  EXPECT_EQ(text.find("job=\""), std::string::npos) << text;
}

TEST(MetricsTest, HostnameEvalCheckpointQueueWaitAndMfu) {
  Metrics m("node-7");
  v1::EvalReport eval;
  eval.set_rank(0);
  eval.set_loss(3.25);
  m.OnEval("job-2", 0, 1, "GPU-x", eval);  // before the first step: no step series yet
  v1::StepReport r = Report(4, 2.0);
  r.set_rank(0);
  r.set_mfu(0.41);
  r.set_checkpoint_seconds(12.5);
  r.set_checkpoint_time_unix(1780000000);
  r.set_trainable_parameters(4736);
  r.set_parameters(113728);
  m.OnStep("job-2", 0, 1, "GPU-x", r);
  m.OnJobStarted(42);
  std::string text = m.Render();
  const std::string l = "Hostname=\"node-7\",UUID=\"GPU-x\",gpu=\"1\",job_id=\"job-2\",rank=\"0\"";
  for (const std::string& want : std::vector<std::string>{
           "ithaca_eval_loss{" + l + "} 3.25",
           "ithaca_mfu_ratio{" + l + "} 0.41",
           "ithaca_checkpoint_seconds{Hostname=\"node-7\",job_id=\"job-2\"} 12.5",
           "ithaca_trainable_parameters{Hostname=\"node-7\",job_id=\"job-2\"} 4736",
           "ithaca_checkpoint_last_timestamp_seconds{Hostname=\"node-7\",job_id=\"job-2\"} "
           "1780000000",
           "ithaca_queue_wait_seconds_bucket{Hostname=\"node-7\",le=\"30\"} 0",
           "ithaca_queue_wait_seconds_bucket{Hostname=\"node-7\",le=\"60\"} 1",
           "ithaca_queue_wait_seconds_sum{Hostname=\"node-7\"} 42",
           std::string("ithaca_build_info{Hostname=\"node-7\",version=\"") + kIthacaVersion +
               "\"} 1",
           "process_max_fds{Hostname=\"node-7\"} ",
       }) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  // The eval series of the device-less entry was relabelled, not duplicated.
  EXPECT_EQ(text.find("gpu=\"\""), std::string::npos) << text;
  // MFU becoming unknown removes the sample.
  r.set_mfu(0);
  m.OnStep("job-2", 0, 1, "GPU-x", r);
  text = m.Render();
  EXPECT_EQ(text.find("ithaca_mfu_ratio{"), std::string::npos) << text;
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
  EXPECT_EQ(text.find("job_id=\"job-0\""), std::string::npos);
  EXPECT_NE(text.find("job_id=\"job-18\""), std::string::npos);
}

// The newest evaluation's loss, with the per-rank labels; an evaluation-only job (no step) gets
// it without any step series.
TEST(MetricsTest, EvalLossOfTheNewestEvaluation) {
  Metrics m("node-1");
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
  EXPECT_NE(text.find("ithaca_eval_loss{Hostname=\"node-1\",UUID=\"GPU-abc\",gpu=\"3\","
                      "job_id=\"job-1\",rank=\"0\"} 3.125\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ithaca_eval_loss{Hostname=\"node-1\",UUID=\"GPU-def\",gpu=\"1\","
                      "job_id=\"job-2\",rank=\"0\"} 4.5\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("job_id=\"job-2\",rank=\"0\"} 0"), std::string::npos)
      << "an evaluation-only job has no step series\n"
      << text;
}

// The passkey eval's points: one accuracy and one logprob series per (length, depth) of the job,
// the newest evaluation's values; a passkey-only evaluation (no held-out tokens) sets no
// ithaca_eval_loss.
TEST(MetricsTest, PasskeyPointsOfTheNewestEvaluation) {
  Metrics m("node-1");
  v1::EvalReport e;
  e.set_step(10);
  for (auto [length, depth, accuracy] :
       {std::tuple<int64_t, double, double>{4096, 0, 1.0}, {4096, 0.5, 0.25}, {8192, 0.5, 0.5}}) {
    v1::PasskeyResult* p = e.add_passkey();
    p->set_length(length);
    p->set_depth(depth);
    p->set_samples(4);
    p->set_accuracy(accuracy);
    p->set_logprob(-0.5);
  }
  m.OnEval("job-1", 0, 0, "", e);
  e.mutable_passkey(1)->set_accuracy(0.75);
  m.OnEval("job-1", 0, 0, "", e);
  const std::string text = m.Render();
  EXPECT_NE(text.find("# TYPE ithaca_passkey_accuracy gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("ithaca_passkey_accuracy{Hostname=\"node-1\",depth=\"0.5\",job_id=\"job-1\","
                      "length=\"4096\"} 0.75\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ithaca_passkey_accuracy{Hostname=\"node-1\",depth=\"0\",job_id=\"job-1\","
                      "length=\"4096\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ithaca_passkey_logprob{Hostname=\"node-1\",depth=\"0.5\",job_id=\"job-1\","
                      "length=\"8192\"} -0.5\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("ithaca_eval_loss{"), std::string::npos) << "no held-out loss\n" << text;
  // A multi-key point (eval.passkey.keys) beside the passkey point of the same length and depth:
  // its own series, labelled with its keys.
  v1::PasskeyResult* multi = e.add_passkey();
  multi->set_keys(4);
  multi->set_length(4096);
  multi->set_depth(0.5);
  multi->set_accuracy(0.125);
  m.OnEval("job-1", 0, 0, "", e);
  const std::string with = m.Render();
  EXPECT_NE(with.find("ithaca_passkey_accuracy{Hostname=\"node-1\",depth=\"0.5\",job_id=\"job-1\","
                      "keys=\"4\",length=\"4096\"} 0.125\n"),
            std::string::npos)
      << with;
  EXPECT_NE(with.find("ithaca_passkey_accuracy{Hostname=\"node-1\",depth=\"0.5\",job_id=\"job-1\","
                      "length=\"4096\"} 0.75\n"),
            std::string::npos)
      << with;
}

// eval.position_buckets: one loss series per bucket of the job, the newest evaluation's value,
// gone with the job's other series.
TEST(MetricsTest, PositionBucketsOfTheNewestEvaluation) {
  Metrics m("node-1");
  v1::EvalReport e;
  e.set_step(10);
  e.set_loss(3);
  e.set_tokens(100);
  for (auto [begin, end, loss] :
       {std::tuple<int64_t, int64_t, double>{0, 1024, 3.5}, {1024, 4096, 2.75}}) {
    v1::PositionLoss* b = e.add_positions();
    b->set_begin(begin);
    b->set_end(end);
    b->set_loss(loss);
    b->set_tokens(50);
  }
  m.OnEval("job-1", 0, 0, "", e);
  e.mutable_positions(1)->set_loss(2.5);
  m.OnEval("job-1", 0, 0, "", e);
  std::string text = m.Render();
  EXPECT_NE(text.find("# TYPE ithaca_eval_position_loss gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("ithaca_eval_position_loss{Hostname=\"node-1\",begin=\"0\",end=\"1024\","
                      "job_id=\"job-1\"} 3.5\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ithaca_eval_position_loss{Hostname=\"node-1\",begin=\"1024\","
                      "end=\"4096\",job_id=\"job-1\"} 2.5\n"),
            std::string::npos)
      << text;
  for (int i = 0; i <= Metrics::kFinishedJobsKept; ++i)
    m.OnJobFinished(absl::StrCat("job-", i + 1));
  text = m.Render();
  EXPECT_EQ(text.find("ithaca_eval_position_loss{"), std::string::npos) << text;
}

// A finished job's throughput and memory gauges go at once: sum(ithaca_tokens_per_second) read
// 36k tok/s on a node doing 250, from the 16 finished jobs kept. What the job did last stays.
TEST(MetricsTest, EndedJobsLeaveNoThroughputOrMemoryGauges) {
  Metrics m;
  v1::StepReport r = Report(3, 0.5);
  r.set_mfu(0.3);
  r.set_model_tflops(2);
  m.OnStep("job-1", 0, 0, "GPU-a", r);
  m.OnStep("job-2", 0, 1, "GPU-b", Report(1, 2.0));
  m.OnJobFinished("job-1");
  std::string text = m.Render();
  const std::string l1 = "UUID=\"GPU-a\",gpu=\"0\",job_id=\"job-1\",rank=\"0\"";
  for (const char* gone :
       {"ithaca_tokens_per_second{", "ithaca_gpu_memory_bytes{", "ithaca_gpu_memory_peak_bytes{",
        "ithaca_host_block_inputs_bytes{", "ithaca_model_flops_per_second{", "ithaca_mfu_ratio{"}) {
    EXPECT_EQ(text.find(std::string(gone) + l1), std::string::npos) << gone << "\n" << text;
  }
  for (const std::string& kept :
       {"ithaca_train_loss{" + l1 + "} 2.5", "ithaca_train_step{" + l1 + "} 3",
        "ithaca_tokens_total{" + l1 + "} 512"}) {
    EXPECT_NE(text.find(kept), std::string::npos) << kept << "\n" << text;
  }
  // The running job is untouched: the node's sum is its rate alone.
  EXPECT_NE(text.find("ithaca_tokens_per_second{UUID=\"GPU-b\",gpu=\"1\",job_id=\"job-2\","
                      "rank=\"0\"} 256\n"),
            std::string::npos)
      << text;
  // A relaunch of the job (a resume) brings them back.
  m.OnStep("job-1", 0, 0, "GPU-a", Report(4, 1.0));
  text = m.Render();
  EXPECT_NE(text.find("ithaca_tokens_per_second{" + l1 + "} 512"), std::string::npos) << text;
  EXPECT_NE(text.find("ithaca_gpu_memory_bytes{" + l1 + ",tier=\"params\"} 1000"),
            std::string::npos)
      << text;
}

// ithaca_job_info names the job and its model, for legends; the time a job entered its state
// lets an alert fire only for recent failures (a fresh Prometheus has no history to compare).
TEST(MetricsTest, JobInfoAndTheTimeEachJobEnteredItsState) {
  Metrics m;
  v1::Job job;
  job.set_id("job-9");
  job.set_name("long context");
  job.mutable_spec()->set_model("llama-3.2-1b");
  job.set_state(v1::JOB_STATE_FAILED);
  auto* t = job.add_transitions();
  t->set_to(v1::JOB_STATE_RUNNING);
  t->mutable_time()->set_seconds(1780000000);
  t = job.add_transitions();
  t->set_to(v1::JOB_STATE_FAILED);
  t->mutable_time()->set_seconds(1780000500);
  m.SetJobs({job});
  std::string text = m.Render();
  EXPECT_NE(text.find("ithaca_job_info{job_id=\"job-9\",model=\"llama-3.2-1b\","
                      "name=\"long context\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ithaca_job_state_since_timestamp_seconds{job_id=\"job-9\","
                      "state=\"failed\"} 1780000500\n"),
            std::string::npos)
      << text;
  m.SetJobs({});
  text = m.Render();
  EXPECT_EQ(text.find("job-9"), std::string::npos) << text;
}

}  // namespace
}  // namespace ithaca
