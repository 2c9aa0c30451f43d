#include "client/format.h"

#include <gtest/gtest.h>

#include <tuple>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/json.h"

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
    v1::TierBytes* h = r->add_memory();  // the longest tier name
    h->set_tier("host_block_inputs");
    h->set_peak_bytes(int64_t{5} << 30);
  }
  EXPECT_EQ(ProgressLine(job.last_steps(0), 7),
            "step 12/60 | loss 3.2140 | 12.4k tok/s/rank | mem 3.0 MiB | ETA 0:07");
  const std::string table = MemoryTable(job);
  EXPECT_NE(table.find("rank 0"), std::string::npos) << table;
  EXPECT_NE(table.find("rank 1"), std::string::npos) << table;
  EXPECT_NE(table.find("2.0 KiB"), std::string::npos) << table;
  EXPECT_NE(table.find("device total"), std::string::npos) << table;
  // Every row lines up under the header, the longest tier name included.
  EXPECT_NE(table.find("\nhost_block_inputs "), std::string::npos) << table;
  for (absl::string_view line : absl::StrSplit(table, '\n', absl::SkipEmpty())) {
    EXPECT_EQ(line.size(), table.find('\n')) << table;
  }
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_reason("rank 1 exited with code 4 (NaN loss)");
  job.set_failed_rank(1);
  const std::string details = JobDetails(job);
  EXPECT_EQ(details.find("cpu adamw"), std::string::npos) << "no offload, no figure";
  job.mutable_last_steps(0)->set_cpu_update_seconds(1.25);
  job.mutable_last_steps(0)->set_device_wait_seconds(1.5);
  EXPECT_NE(JobDetails(job).find(" | lr 0 | cpu adamw 1.250 s (device waited 1.500 s)\n"),
            std::string::npos)
      << JobDetails(job);
  EXPECT_EQ(details.find("source 1"), std::string::npos) << "no mix, no sources";
  for (int i = 0; i < 2; ++i) {
    v1::SourceReport* src = job.mutable_last_steps(0)->add_sources();
    src->set_source(i + 1);
    src->set_path(i == 0 ? "/data/web/*.tok" : "/data/sft.tok");
    src->set_samples(i == 0 ? 3 : 0);
    src->set_tokens(i == 0 ? 768 : 0);
    src->set_loss_tokens(i == 0 ? 700 : 0);
    src->set_loss(i == 0 ? 3.21 : 0);
  }
  EXPECT_NE(JobDetails(job).find(" (device waited 1.500 s)\n"
                                 "    source 1 (/data/web/*.tok): 3 samples, 768 tokens (700 "
                                 "trained), loss 3.2100\n"
                                 "    source 2 (/data/sft.tok): 0 samples, 0 tokens (0 trained)\n"),
            std::string::npos)
      << JobDetails(job);
  EXPECT_NE(details.find("FAILED"), std::string::npos);
  EXPECT_NE(details.find("failed rank: 1"), std::string::npos);
  EXPECT_EQ(details.find("attempt:"), std::string::npos) << "never restarted: no line";
  job.set_restarts(2);
  job.set_cluster_job("slurm:12");
  EXPECT_NE(JobDetails(job).find("  attempt: 3 (restarted 2 times by its [retry] policy)\n"
                                 "  cluster job: slurm:12\n"),
            std::string::npos)
      << JobDetails(job);
  EXPECT_EQ(details.find("spec (resolved)"), std::string::npos) << "no spec, no section";
  job.set_spec_toml("name = \"j\"\n\n[memory]\nhead_chunk = 4\n");
  EXPECT_NE(JobDetails(job).find("  spec (resolved):\n    name = \"j\"\n    [memory]\n"
                                 "    head_chunk = 4\n"),
            std::string::npos)
      << JobDetails(job);
  const std::string list = JobTable({job}, false, absl::Now());
  EXPECT_NE(list.find("12/60"), std::string::npos) << list;
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

// eval.position_buckets: status shows the newest evaluation's loss per bucket under its line.
TEST(FormatTest, StatusShowsTheLossByPosition) {
  v1::EvalReport e;
  e.set_step(20);
  e.set_loss(3.0);
  e.set_tokens(4096);
  e.set_batches(1);
  for (auto [begin, end, loss] :
       {std::tuple<int64_t, int64_t, double>{0, 1024, 3.21}, {1024, 4096, 2.98}}) {
    v1::PositionLoss* b = e.add_positions();
    b->set_begin(begin);
    b->set_end(end);
    b->set_loss(loss);
    b->set_tokens(end - begin);
  }
  EXPECT_EQ(PositionLine(e),
            "by position: [0, 1024) 3.2100, [1024, 4096) 2.9800 (1024, 3072 tokens)");
  v1::Job job;
  job.set_id("job-1");
  *job.mutable_last_eval() = e;
  EXPECT_NE(JobDetails(job).find("  last eval: eval step 20: loss 3.0000 (ppl 20.1) over 4096 "
                                 "tokens, 1 batches, 0.00 s\n    by position: [0, 1024) 3.2100"),
            std::string::npos)
      << JobDetails(job);
  e.clear_positions();
  EXPECT_EQ(PositionLine(e), "");
}

TEST(FormatTest, StatusShowsTrainableParametersUnderLora) {
  v1::Job job;
  job.set_id("job-1");
  v1::StepReport* r = job.add_last_steps();
  r->set_step(3);
  r->set_total_steps(10);
  r->set_trainable_parameters(113728);
  r->set_parameters(113728);
  EXPECT_EQ(JobDetails(job).find("trainable parameters"), std::string::npos)
      << "every parameter trains: no line";
  r->set_trainable_parameters(4736);
  EXPECT_NE(JobDetails(job).find("  trainable parameters: 4736 of 113728 (4.164%)\n"),
            std::string::npos)
      << JobDetails(job);
}

TEST(FormatTest, EvalLineWithPasskeyPoints) {
  v1::EvalReport e;
  e.set_step(20);
  e.set_seconds(3.1);
  for (auto [length, depth, accuracy] :
       {std::tuple<int64_t, double, double>{4096, 0, 1.0}, {4096, 1, 0.5}, {8192, 0, 0.25}}) {
    v1::PasskeyResult* p = e.add_passkey();
    p->set_length(length);
    p->set_depth(depth);
    p->set_accuracy(accuracy);
    p->set_logprob(-0.5);
  }
  EXPECT_EQ(EvalLine(e),
            "eval step 20: passkey accuracy 0.75 at 4096, 0.25 at 8192 tokens, 3.10 s");
  e.set_loss(3.1234);
  e.set_tokens(65536);
  e.set_batches(8);
  EXPECT_EQ(EvalLine(e),
            "eval step 20: loss 3.1234 (ppl 22.7) over 65536 tokens, 8 batches, 3.10 s | passkey "
            "accuracy 0.75 at 4096, 0.25 at 8192 tokens");
  v1::Job job;
  job.set_id("job-1");
  *job.mutable_last_eval() = e;
  EXPECT_NE(JobDetails(job).find("    passkey 4096 tokens: depth 0 1.00 (logprob -0.500), depth 1 "
                                 "0.50 (logprob -0.500)\n    passkey 8192 tokens: depth 0 0.25"),
            std::string::npos)
      << JobDetails(job);
  // Multi-key points (eval.passkey.keys) after the passkey's: their own summary and lines.
  for (double depth : {0.0, 1.0}) {
    v1::PasskeyResult* p = e.add_passkey();
    p->set_keys(4);
    p->set_length(4096);
    p->set_depth(depth);
    p->set_accuracy(depth == 0 ? 0.5 : 0.0);
    p->set_logprob(-1);
  }
  EXPECT_EQ(PasskeySummary(e),
            "passkey accuracy 0.75 at 4096, 0.25 at 8192 tokens; 4-key accuracy 0.25 at 4096 "
            "tokens");
  *job.mutable_last_eval() = e;
  EXPECT_NE(JobDetails(job).find("    passkey 4096 tokens, 4 keys: depth 0 0.50 (logprob -1.000), "
                                 "depth 1 0.00 (logprob -1.000)\n"),
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
  const std::string table = JobTable({job}, true, absl::Now());
  EXPECT_EQ(table.find('\x1b'), std::string::npos);
  EXPECT_NE(table.find("evil\\x1b]0;pwned\\x07"), std::string::npos) << table;
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

TEST(FormatTest, NodeUnderSlurmShowsTheClustersView) {
  v1::NodeInfo n;
  n.set_hostname("login-1");
  n.set_version("ithacad 0.9.0");
  n.set_jobs_running(1);
  n.set_jobs_queued(3);
  v1::ClusterInfo* c = n.mutable_cluster();
  c->set_kind("slurm");
  c->set_partition("gpu");
  c->set_nodes(8);
  c->set_nodes_idle(2);
  c->set_nodes_busy(5);
  c->set_nodes_unavailable(1);
  c->set_jobs_running(1);
  c->set_jobs_pending(2);
  const std::string text = NodeText(n);
  EXPECT_NE(text.find("node login-1 (ithacad 0.9.0): jobs run on slurm; 1 running, 3 queued "
                      "(2 pending in slurm)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("slurm, partition gpu: 8 nodes, 2 idle, 5 busy, 1 unavailable"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("free"), std::string::npos) << text;  // no local slots
  c->clear_partition();
  c->set_error("sinfo: command not found");
  EXPECT_NE(NodeText(n).find("slurm, every partition: cannot say (sinfo: command not found)"),
            std::string::npos)
      << NodeText(n);
}

google::protobuf::Timestamp At(absl::Time t) {
  google::protobuf::Timestamp ts;
  ts.set_seconds(absl::ToUnixSeconds(t));
  return ts;
}

void AddTransition(v1::Job* job, v1::JobState to, absl::Time at) {
  v1::StateTransition* t = job->add_transitions();
  t->set_to(to);
  *t->mutable_time() = At(at);
}

TEST(FormatTest, ListIsATableWithAHeaderAgeAndDuration) {
  const absl::Time now = absl::FromUnixSeconds(1800000000);
  v1::Job running;
  running.set_id("job-12");
  running.set_name("long-context");
  running.set_state(v1::JOB_STATE_RUNNING);
  *running.mutable_created_at() = At(now - absl::Minutes(30));
  AddTransition(&running, v1::JOB_STATE_QUEUED, now - absl::Minutes(30));
  AddTransition(&running, v1::JOB_STATE_STARTING, now - absl::Minutes(25));
  AddTransition(&running, v1::JOB_STATE_RUNNING, now - absl::Minutes(24));
  v1::StepReport* r = running.add_last_steps();
  r->set_step(12);
  r->set_total_steps(60);
  r->set_loss(3.25);
  running.mutable_spec()->set_world(8);
  running.mutable_spec()->set_backend("cuda");
  running.mutable_spec()->set_model("llama-3.2-1b");
  running.add_slots(0);
  running.add_slots(1);
  v1::Job failed;
  failed.set_id("job-3");
  failed.set_name("j");
  failed.set_state(v1::JOB_STATE_FAILED);
  failed.set_reason("rank 1 exited with code 4: " + std::string(100, 'x'));
  *failed.mutable_created_at() = At(now - absl::Hours(50));
  AddTransition(&failed, v1::JOB_STATE_STARTING, now - absl::Hours(49));
  AddTransition(&failed, v1::JOB_STATE_FAILED, now - absl::Hours(49) + absl::Seconds(75));
  v1::Job queued;
  queued.set_id("job-13");
  queued.set_name("q");
  queued.set_state(v1::JOB_STATE_QUEUED);
  *queued.mutable_created_at() = At(now - absl::Seconds(9));

  const std::string table = JobTable({running, failed, queued}, false, now);
  const std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << table;
  EXPECT_EQ(lines[0], "ID       NAME           STATE     STEP    LOSS     AGE   DURATION   REASON");
  EXPECT_EQ(lines[1], "job-12   long-context   RUNNING   12/60   3.2500   30m   25:00");
  EXPECT_EQ(lines[2].rfind("job-3    j              FAILED    -       -        2d    1:15       "
                           "rank 1 exited with code 4: xxx",
                           0),
            0u)
      << lines[2];
  EXPECT_NE(lines[2].find("rank 1 exited with code 4: xxx"), std::string::npos);
  // The last column is never cut: "...(N more bytes)" hid the end of the reason.
  EXPECT_NE(lines[2].find(std::string(100, 'x')), std::string::npos) << "whole in the table";
  EXPECT_EQ(lines[2].find("more bytes"), std::string::npos) << lines[2];
  EXPECT_EQ(lines[3], "job-13   q              QUEUED    -       -        9s    -");

  const std::string wide = JobTable({running, failed}, true, now);
  EXPECT_NE(wide.find("WORLD   BACKEND   MODEL          SLOTS   AFTER   REASON"), std::string::npos)
      << wide;
  EXPECT_NE(wide.find("8       cuda      llama-3.2-1b   0,1     -"), std::string::npos) << wide;
  // A job waiting for another (submit --after) names it.
  queued.set_after("job-12");
  const std::string waiting = JobTable({queued}, true, now);
  EXPECT_NE(waiting.find("   job-12"), std::string::npos) << waiting;
  EXPECT_NE(wide.find(std::string(100, 'x')), std::string::npos) << "whole in the wide view";
}

// A phase of long-context training: status and plan name the job it waits for, its RoPE, the
// weights it starts from and admission's warnings.
TEST(FormatTest, StatusAndPlanShowAfterRopeInitAndWarnings) {
  v1::Job job;
  job.set_id("job-5");
  job.set_name("phase2");
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_after("job-4");
  job.mutable_spec()->set_rope("rope_theta 40000, rope_type default (from [model.rope])");
  job.mutable_spec()->set_init_from("/ck/phase1");
  job.add_warnings("data.seq_len 8192 exceeds the model's max_position_embeddings 4096");
  const std::string details = JobDetails(job);
  EXPECT_NE(details.find("  after: job-4 (starts when it succeeds; cancelled if it fails or is "
                         "cancelled)\n"),
            std::string::npos)
      << details;
  EXPECT_NE(details.find("  rope: rope_theta 40000, rope_type default (from [model.rope])\n"),
            std::string::npos)
      << details;
  EXPECT_NE(details.find("  init from: /ck/phase1 (weights only)\n"), std::string::npos) << details;
  EXPECT_NE(details.find("  warning: data.seq_len 8192 exceeds"), std::string::npos) << details;

  v1::PlanJobResponse plan;
  plan.mutable_spec()->set_name("phase2");
  plan.mutable_spec()->set_rope("rope_theta 40000, rope_type default");
  plan.add_warnings("data.seq_len 8192 exceeds");
  const std::string text = PlanText(plan);
  EXPECT_NE(text.find("\n  rope: rope_theta 40000, rope_type default\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("\n  warning: data.seq_len 8192 exceeds\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("predicted"), std::string::npos) << text;  // no prediction: no line

  plan.mutable_plan()->set_predicted_step_s(12.5);
  plan.mutable_plan()->set_predicted_tok_per_s(10486);
  plan.mutable_plan()->set_predicted_tok_per_s_per_gpu(1311);
  plan.mutable_plan()->set_recompute("attention-aware");
  plan.mutable_plan()->set_rates("h200");
  const std::string predicted = PlanText(plan);
  EXPECT_NE(predicted.find("  predicted         12.5 s a step, 10486 tok/s (1311 per GPU; "
                           "recompute attention-aware; rates h200)\n"),
            std::string::npos)
      << predicted;
  // No steps: no run's time.
  EXPECT_EQ(predicted.find("the run"), std::string::npos) << predicted;
  EXPECT_EQ(predicted.find("where time goes"), std::string::npos) << predicted;

  // Where the time goes (issue 56), when the daemon sends it.
  v1::MemoryPlan::PredictedTime& t = *plan.mutable_plan()->mutable_predicted_time();
  t.set_forward_backward_s(6);
  t.set_samples(2);
  t.set_update_s(0.5);
  t.set_attention_s(4);
  t.set_gemm_s(1.5);
  t.set_elementwise_s(0.25);
  t.set_regrow_s(1.25);
  t.set_recompute_s(2);
  t.set_transfer_s(0.75);
  t.set_collective_s(0.125);
  t.set_waited_s(0.0625);
  const std::string parts = PlanText(plan);
  EXPECT_NE(parts.find("  where time goes   6 s a forward/backward (x2 a step): attention 4 s, "
                       "GEMMs 1.5 s, elementwise 0.25 s; of those, forwards run again: regrowing "
                       "1.25 s, recompute 2 s; transfers 0.75 s and collectives 0.125 s beside "
                       "them (compute waited 0.0625 s); update 0.5 s a step\n"),
            std::string::npos)
      << parts;
}

// The text plan shows the device and the host against their budgets, and the whole run's
// predicted time (issue 54 F5: the host, which binds at 5M, was only in -o json).
TEST(FormatTest, PlanTextShowsBothTiersAndTheRun) {
  v1::PlanJobResponse plan;
  plan.mutable_spec()->set_name("long");
  plan.mutable_spec()->set_steps(1000);
  v1::MemoryPlan& m = *plan.mutable_plan();
  m.set_per_rank_bytes(int64_t{70} << 30);
  m.set_budget_bytes(int64_t{78} << 30);
  m.set_budget_source("GPU memory less 2 GiB for the CUDA context");
  m.set_host_per_rank_bytes(int64_t{200} << 30);
  m.set_host_budget_bytes(int64_t{217} << 30);
  m.set_predicted_step_s(12.5);
  m.set_fits(true);
  const std::string text = PlanText(plan);
  EXPECT_NE(text.find("  device total          70.0 GiB per rank, budget 78.0 GiB (GPU memory "
                      "less 2 GiB for the CUDA context)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  host total           200.0 GiB per rank, budget 217.0 GiB\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  the run           3.5 h for training.steps = 1000\n"), std::string::npos)
      << text;
  m.set_host_budget_bytes(0);
  EXPECT_NE(PlanText(plan).find("per rank, budget unbounded\n"), std::string::npos);
  EXPECT_EQ(RunTime(45), "45 s");
  EXPECT_EQ(RunTime(600), "10 min");
  EXPECT_EQ(RunTime(4 * 86400), "4.0 days");
}

// Issue 54 F5 for chains: `plan A --then B --then C` sums the phases' predicted runs.
TEST(FormatTest, ChainPlanSumsThePhasesRuns) {
  auto phase = [](int64_t seq_len, int64_t steps, double step_s, bool fits) {
    v1::PlanJobResponse p;
    p.mutable_spec()->set_seq_len(seq_len);
    p.mutable_spec()->set_steps(steps);
    p.mutable_plan()->set_predicted_step_s(step_s);
    p.mutable_plan()->set_fits(fits);
    return p;
  };
  std::vector<v1::PlanJobResponse> plans = {phase(8192, 1000, 3.6, true),
                                            phase(65536, 500, 36, true)};
  EXPECT_DOUBLE_EQ(ChainRunSeconds(plans), 3600 + 18000);
  EXPECT_EQ(ChainPlanText({"p1.toml", "p2.toml"}, plans),
            "chain of 2 phases: 6.0 h in all for their training.steps; every phase fits\n"
            "    phase 1 (p1.toml): 60 min, 1000 steps of 3.6 s at data.seq_len 8192\n"
            "    phase 2 (p2.toml): 5.0 h, 500 steps of 36 s at data.seq_len 65536\n");
  plans.push_back(phase(1048576, 100, 0, false));
  EXPECT_EQ(ChainPlanText({"p1.toml", "p2.toml", "p3.toml"}, plans),
            "chain of 3 phases: at least 6.0 h in all for their training.steps (phase 3 not "
            "predicted); phase 3 does NOT fit\n"
            "    phase 1 (p1.toml): 60 min, 1000 steps of 3.6 s at data.seq_len 8192\n"
            "    phase 2 (p2.toml): 5.0 h, 500 steps of 36 s at data.seq_len 65536\n"
            "    phase 3 (p3.toml): no step-time prediction, 100 steps at data.seq_len 1048576\n");
}

TEST(FormatTest, Ages) {
  EXPECT_EQ(HumanAge(absl::Seconds(119)), "119s");
  EXPECT_EQ(HumanAge(absl::Minutes(119)), "119m");
  EXPECT_EQ(HumanAge(absl::Hours(47)), "47h");
  EXPECT_EQ(HumanAge(absl::Hours(49)), "2d");
  EXPECT_EQ(HumanAge(-absl::Seconds(3)), "0s");  // clocks of client and daemon disagree
}

TEST(JsonTest, EveryFieldIsPresentAndInt64sAreNumbers) {
  v1::Job job;
  job.set_id("job-1\"\n");
  job.set_state(v1::JOB_STATE_QUEUED);
  job.mutable_spec()->set_parameters(int64_t{1} << 40);
  job.mutable_created_at()->set_seconds(1800000000);
  v1::StepReport* r = job.add_last_steps();
  r->set_loss(0.5);
  r->set_device_peak_bytes(0);
  const std::string json = ProtoJson(job);
  EXPECT_EQ(json.rfind("{\"id\":\"job-1\\\"\\n\",\"name\":\"\",\"state\":\"JOB_STATE_QUEUED\","
                       "\"reason\":\"\",\"failed_rank\":null,",
                       0),
            0u)
      << json;
  EXPECT_NE(json.find("\"parameters\":1099511627776,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"world\":0,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"created_at\":\"2027-01-15T08:00:00Z\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"updated_at\":null"), std::string::npos) << json;
  EXPECT_NE(json.find("\"loss\":0.5,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"device_peak_bytes\":0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"memory\":[]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"slots\":[]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"last_eval\":null"), std::string::npos) << json;
  // Doubles: the shortest text that reads back the same.
  v1::StepReport lr;
  lr.set_lr(3e-3);
  lr.set_loss(1.0 / 3);
  EXPECT_NE(ProtoJson(lr).find("\"lr\":0.003,"), std::string::npos) << ProtoJson(lr);
  EXPECT_NE(ProtoJson(lr).find("\"loss\":0.33333333333333331,"), std::string::npos)
      << ProtoJson(lr);
  // Of a oneof, the member that is set and no other.
  v1::JobEvent e;
  e.set_seq(7);
  e.mutable_eval()->set_loss(2.25);
  const std::string ev = ProtoJson(e);
  EXPECT_NE(ev.find("\"eval\":{\"rank\":0,\"step\":0,\"loss\":2.25,"), std::string::npos) << ev;
  EXPECT_EQ(ev.find("\"step\":{"), std::string::npos) << ev;
  EXPECT_EQ(ev.find("\"state\""), std::string::npos) << ev;
}

}  // namespace
}  // namespace ithaca
