#include "client/report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <tuple>

#include "absl/strings/str_format.h"

namespace ithaca {
namespace {

int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

// The points="..." of the polyline named `series`.
std::vector<std::pair<double, double>> Points(const std::string& svg, const std::string& series) {
  std::smatch m;
  const std::regex re("data-series=\"" + series + "\"[^>]*points=\"([^\"]*)\"");
  EXPECT_TRUE(std::regex_search(svg, m, re)) << series << "\n" << svg;
  std::vector<std::pair<double, double>> out;
  std::string pts = m[1];
  const std::regex pt("(-?[0-9.]+),(-?[0-9.]+)");
  for (auto it = std::sregex_iterator(pts.begin(), pts.end(), pt); it != std::sregex_iterator();
       ++it) {
    out.push_back({std::stod((*it)[1]), std::stod((*it)[2])});
  }
  return out;
}

TEST(ReportTest, ChartHasOnePolylinePointPerFinitePoint) {
  ChartSeries a{"loss", {{1, 3.0}, {2, 2.5}, {3, NAN}, {4, 2.0}}, false};
  ChartSeries b{"eval <x>", {{2, 2.7}, {4, 2.2}}, true};
  const std::string svg = SvgLineChart("Loss", "step", "nats", {a, b});
  const auto pa = Points(svg, "loss");
  ASSERT_EQ(pa.size(), 3u);  // the NaN is dropped
  // Falling loss: y grows downwards in SVG; x grows with the step.
  EXPECT_LT(pa[0].first, pa[2].first);
  EXPECT_LT(pa[0].second, pa[2].second);
  EXPECT_EQ(Points(svg, "eval &lt;x&gt;").size(), 2u);
  EXPECT_EQ(Count(svg, "<circle"), 2);  // markers only on the eval series
  EXPECT_EQ(svg.find("<x>"), std::string::npos) << "names are escaped";
  for (const auto& [x, y] : pa) {
    EXPECT_GE(x, 0);
    EXPECT_LE(x, 640);
    EXPECT_GE(y, 0);
    EXPECT_LE(y, 320);
  }
  EXPECT_NE(SvgLineChart("Empty", "x", "y", {}).find("no data"), std::string::npos);
}

TEST(ReportTest, PageHasTheChartsSpecAndPlan) {
  v1::Job job;
  job.set_id("job-3");
  job.set_name("demo");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.set_spec_toml("name = \"demo\"\n[data]\npath = \"a<b\"\n");
  std::vector<v1::JobEvent> history;
  for (int rank = 0; rank < 2; ++rank) {
    for (int step = 1; step <= 5; ++step) {
      v1::JobEvent e;
      v1::StepReport* r = e.mutable_step();
      r->set_rank(rank);
      r->set_step(step);
      r->set_loss(5.0 - step * 0.5);
      r->set_tokens_per_second(100);
      r->set_seconds(0.5);
      r->set_lr(1e-3 * step);
      auto* t = r->add_memory();
      t->set_tier("params");
      t->set_current_bytes(int64_t{1} << 30);
      t->set_peak_bytes(int64_t{1} << 30);
      auto* act = r->add_memory();  // lives only inside the step: 0 at its end
      act->set_tier("activations");
      act->set_peak_bytes(int64_t{2} << 30);
      auto* unused = r->add_memory();
      unused->set_tier("comm");
      history.push_back(e);
    }
  }
  v1::JobEvent eval;
  eval.mutable_eval()->set_step(5);
  eval.mutable_eval()->set_loss(2.75);
  history.push_back(eval);
  v1::PlanJobResponse plan;
  plan.mutable_plan()->set_summary("fits: 1.2 GiB of 80 GiB");
  const std::string page = RenderReportHtml(job, history, plan, "");
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  // Loss, tok/s, step time, learning rate (rank 0's), memory of ranks 0 and 1.
  EXPECT_EQ(Count(page, "<svg"), 6);
  EXPECT_EQ(Points(page, "learning rate").size(), 5u);
  EXPECT_EQ(Points(page, "train loss \\(rank 0\\)").size(), 5u);
  EXPECT_EQ(Points(page, "eval loss").size(), 1u);
  EXPECT_EQ(Points(page, "tok/s rank 1").size(), 5u);
  EXPECT_EQ(Points(page, "params").size(), 5u);
  EXPECT_EQ(page.find("data-series=\"comm\""), std::string::npos) << "an unused tier is left out";
  EXPECT_NE(page.find("path = &quot;a&lt;b&quot;"), std::string::npos);
  EXPECT_NE(page.find("fits: 1.2 GiB of 80 GiB"), std::string::npos);
  EXPECT_NE(RenderReportHtml(job, {}, std::nullopt, "data gone").find("No plan: data gone"),
            std::string::npos);
}

// The passkey eval as the needle-in-a-haystack picture: a cell per (length, depth), lengths
// left to right, depths top to bottom, coloured by accuracy; the newest evaluation's points; a
// passkey-only evaluation adds no point to the eval loss.
TEST(ReportTest, PasskeyHeatmapOfTheNewestEvaluation) {
  auto add = [](v1::EvalReport* r, int64_t length, double depth, double accuracy) {
    v1::PasskeyResult* p = r->add_passkey();
    p->set_length(length);
    p->set_depth(depth);
    p->set_samples(4);
    p->set_accuracy(accuracy);
    p->set_logprob(-0.25);
  };
  v1::EvalReport r;
  r.set_step(7);
  for (int64_t length : {8192, 4096}) {
    for (double depth : {0.0, 0.5, 1.0}) add(&r, length, depth, length == 4096 ? 1.0 : depth / 2);
  }
  const std::string svg = SvgPasskeyHeatmap(r);
  EXPECT_EQ(Count(svg, "<rect class=\"cell\""), 6);
  auto cell = [&](int64_t length, double depth) {
    std::smatch m;
    const std::regex re(
        absl::StrFormat("<rect class=\"cell\" x=\"([0-9.]+)\" y=\"([0-9.]+)\" "
                        "[^>]*fill=\"(#[0-9a-f]{6})\" [^>]*data-length=\"%d\" "
                        "data-depth=\"%g\" data-accuracy=\"([0-9.]+)\"",
                        length, depth));
    EXPECT_TRUE(std::regex_search(svg, m, re)) << length << " " << depth << "\n" << svg;
    return std::make_tuple(std::stod(m[1]), std::stod(m[2]), std::string(m[3]), std::stod(m[4]));
  };
  const auto [x4, y4, c4, a4] = cell(4096, 0);
  const auto [x8, y8, c8, a8] = cell(8192, 0);
  const auto [x8b, y8b, c8b, a8b] = cell(8192, 1);
  const auto [x8m, y8m, c8m, a8m] = cell(8192, 0.5);
  EXPECT_LT(x4, x8) << "lengths rise to the right";
  EXPECT_LT(y8, y8m) << "depths rise downwards";
  EXPECT_LT(y8m, y8b);
  EXPECT_EQ(a4, 1);
  EXPECT_EQ(a8, 0);
  EXPECT_EQ(a8b, 0.5);
  EXPECT_EQ(c4, "#1a9850") << "accuracy 1: green";
  EXPECT_EQ(c8, "#d73027") << "accuracy 0: red";
  EXPECT_EQ(c8b, "#fee08b") << "accuracy 0.5: yellow";
  EXPECT_NE(svg.find(">4K</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">depth 50%</text>"), std::string::npos) << svg;

  // In the page: the newest evaluation with points, and no eval loss from a passkey-only one.
  v1::Job job;
  job.set_id("job-9");
  std::vector<v1::JobEvent> history;
  v1::JobEvent older, newer;
  *older.mutable_eval() = r;
  older.mutable_eval()->set_step(3);
  older.mutable_eval()->mutable_passkey(0)->set_accuracy(0.125);
  *newer.mutable_eval() = r;
  history = {older, newer};
  *job.mutable_last_eval() = r;
  const std::string page = RenderReportHtml(job, history, std::nullopt, "");
  EXPECT_EQ(Count(page, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"passkey\""),
            1);
  EXPECT_NE(page.find("Passkey retrieval, step 7"), std::string::npos);
  EXPECT_EQ(page.find("data-accuracy=\"0.125\""), std::string::npos) << "only the newest";
  EXPECT_NE(page.find("passkey accuracy 0.25 at 8192, 1.00 at 4096 tokens"), std::string::npos)
      << page;
  EXPECT_EQ(page.find("data-series=\"eval loss\""), std::string::npos) << "no held-out loss";
  EXPECT_EQ(page.find("Newest evaluation: loss"), std::string::npos);

  // Multi-key points (eval.passkey.keys = [1, 4]): a heatmap of their own beside the passkey's.
  v1::EvalReport both = r;
  for (double depth : {0.0, 1.0}) {
    add(&both, 4096, depth, 0.25);
    both.mutable_passkey(both.passkey_size() - 1)->set_keys(4);
  }
  history = {older};
  *history.emplace_back().mutable_eval() = both;
  const std::string page2 = RenderReportHtml(job, history, std::nullopt, "");
  EXPECT_EQ(Count(page2, "class=\"chart\" id=\"passkey\""), 1);
  EXPECT_EQ(Count(page2, "class=\"chart\" id=\"passkey-4-keys\""), 1);
  EXPECT_NE(page2.find("Multi-key retrieval (4 keys, one asked), step 7"), std::string::npos);
  EXPECT_EQ(Count(page2, "<rect class=\"cell\""), 6 + 2);
  EXPECT_NE(page2.find("4-key accuracy 0.25 at 4096 tokens"), std::string::npos);
}

// eval.position_buckets: a chart with one series per bucket, a point per evaluation.
TEST(ReportTest, LossByPositionOverTheEvaluations) {
  v1::Job job;
  job.set_id("job-4");
  std::vector<v1::JobEvent> history;
  for (int step : {10, 20}) {
    v1::JobEvent e;
    v1::EvalReport* r = e.mutable_eval();
    r->set_step(step);
    r->set_loss(3);
    r->set_tokens(4096);
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 1024}, {1024, 4096}}) {
      v1::PositionLoss* b = r->add_positions();
      b->set_begin(begin);
      b->set_end(end);
      b->set_loss(begin == 0 ? 3.5 : 3.0 - step / 10.0);
      b->set_tokens(end - begin);
    }
    history.push_back(e);
  }
  const std::string page = RenderReportHtml(job, history, std::nullopt, "");
  EXPECT_NE(page.find("Eval loss by position"), std::string::npos) << page;
  EXPECT_EQ(Points(page, "positions \\[0, 1024\\)").size(), 2u);
  EXPECT_EQ(Points(page, "positions \\[1024, 4096\\)").size(), 2u);
  // Without buckets, no such chart.
  for (v1::JobEvent& e : history) e.mutable_eval()->clear_positions();
  EXPECT_EQ(RenderReportHtml(job, history, std::nullopt, "").find("Eval loss by position"),
            std::string::npos);
}

// Issue 54 F8: a phase's report shows its chain, the earlier phases' curves before its own (its
// steps counted on from the end of the phase before) and a table of the phases.
TEST(ReportTest, APhaseShowsItsChain) {
  auto phase = [](const std::string& id, int64_t seq_len, int steps, double first_loss) {
    ReportPhase p;
    p.job.set_id(id);
    p.job.set_name(id + "-name");
    p.job.set_state(v1::JOB_STATE_SUCCEEDED);
    p.job.mutable_spec()->set_seq_len(seq_len);
    p.job.mutable_spec()->set_steps(steps);
    for (int step = 1; step <= steps; ++step) {
      v1::JobEvent e;
      e.mutable_step()->set_step(step);
      e.mutable_step()->set_loss(first_loss - 0.25 * step);
      p.history.push_back(e);
    }
    v1::JobEvent e;
    e.mutable_eval()->set_step(steps);
    e.mutable_eval()->set_loss(first_loss - 0.5);
    e.mutable_eval()->set_tokens(64);
    p.history.push_back(e);
    return p;
  };
  const std::vector<ReportPhase> chain = {phase("job-1", 128, 4, 5.0), phase("job-2", 256, 2, 4.0)};
  const ReportPhase last = phase("job-3", 512, 3, 3.5);
  const std::string page = RenderReportHtml(last.job, last.history, std::nullopt, "", {}, chain);
  EXPECT_NE(page.find("Loss across the chain"), std::string::npos) << page;
  const auto p1 = Points(page, "phase 1 job-1 train loss");
  const auto p2 = Points(page, "phase 2 job-2 train loss");
  const auto p3 = Points(page, "phase 3 job-3 train loss");
  ASSERT_EQ(p1.size(), 4u);
  ASSERT_EQ(p2.size(), 2u);
  ASSERT_EQ(p3.size(), 3u);
  EXPECT_LT(p1.back().first, p2.front().first) << "phase 2 after phase 1";
  EXPECT_LT(p2.back().first, p3.front().first) << "phase 3 after phase 2";
  EXPECT_EQ(Points(page, "phase 1 job-1 eval loss").size(), 1u);
  EXPECT_NE(page.find("<table id=\"chain\">"), std::string::npos);
  EXPECT_NE(page.find("<tr><td>1</td><td>job-1</td><td>job-1-name</td><td>128</td><td>4 of "
                      "4</td><td>1-4</td><td>4.0000</td><td>4.5000</td><td>SUCCEEDED</td></tr>"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("<tr><td>3</td><td>job-3</td><td>job-3-name</td><td>512</td><td>3 of "
                      "3</td><td>7-9</td>"),
            std::string::npos)
      << page;
  // A job of no chain: neither.
  const std::string alone = RenderReportHtml(last.job, last.history, std::nullopt, "");
  EXPECT_EQ(alone.find("Loss across the chain"), std::string::npos);
  EXPECT_EQ(alone.find("id=\"chain\""), std::string::npos);
}

// The report findings: "0.00 GiB" in the plan of a small model, end-of-step memory
// (peaks invisible), "per GPU" on a CPU job, a sampled rank drawn as solid segments, and a
// resumed job's page without the run's first steps.
TEST(ReportTest, SmallPlanUnitsPeaksCpuAxisSparseRanksAndEarlierAttempts) {
  v1::Job job;
  job.set_id("job-8");
  job.mutable_spec()->set_backend("cpu");
  std::vector<v1::JobEvent> history;
  for (int step = 11; step <= 30; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      if (rank == 1 && step % 10 != 0) continue;  // rank 1 reports every 10th step
      v1::JobEvent e;
      v1::StepReport* r = e.mutable_step();
      r->set_rank(rank);
      r->set_step(step);
      r->set_tokens_per_second(250);
      auto* t = r->add_memory();
      t->set_tier("activations");
      t->set_current_bytes(0);
      t->set_peak_bytes(int64_t{3} << 20);
      history.push_back(e);
    }
  }
  v1::PlanJobResponse plan;
  auto* tier = plan.mutable_plan()->add_per_rank();
  tier->set_tier("params");
  tier->set_current_bytes(int64_t{3} << 20);
  plan.mutable_plan()->set_per_rank_bytes(int64_t{5} << 20);
  const std::string page = RenderReportHtml(job, history, plan, "", {"job-2", "job-5"});
  EXPECT_NE(page.find("<td>params</td><td>3.0 MiB</td>"), std::string::npos) << page;
  EXPECT_EQ(page.find("0.00 GiB"), std::string::npos);
  // The peak (3 MiB), not the end of the step (0): the chart's y range reaches 3.
  EXPECT_NE(page.find("Peak memory per tier, rank 0"), std::string::npos);
  EXPECT_NE(page.find("MiB, peak during the step"), std::string::npos);
  EXPECT_NE(page.find("tokens/s per rank (CPU)"), std::string::npos);
  EXPECT_EQ(page.find("per GPU"), std::string::npos);
  // Rank 1 (2 samples over 11 steps) is dotted and marked; rank 0 (every step) solid.
  const std::regex sparse("data-series=\"tok/s rank 1\"[^>]*stroke-dasharray");
  EXPECT_TRUE(std::regex_search(page, sparse)) << page;
  const std::regex solid("data-series=\"tok/s rank 0\"[^>]*stroke-dasharray");
  EXPECT_FALSE(std::regex_search(page, solid));
  EXPECT_NE(page.find("This job resumed a run begun by job-2, job-5"), std::string::npos);
}

}  // namespace
}  // namespace ithaca
