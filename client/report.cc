#include "client/report.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/format.h"
#include "client/json.h"
#include "engine/core/units.h"
#include "google/protobuf/util/time_util.h"

namespace ithaca {
namespace {

using google::protobuf::util::TimeUtil;

absl::StatusOr<std::vector<v1::JobEvent>> ReadHistory(CliContext& c, const std::string& id,
                                                      grpc::Status* status) {
  v1::ReadHistoryRequest req;
  req.set_id(id);
  grpc::ClientContext ctx;
  auto reader = c.stub->ReadHistory(&ctx, req);
  std::vector<v1::JobEvent> out;
  v1::JobEvent e;
  while (reader->Read(&e)) out.push_back(e);
  *status = reader->Finish();
  if (!status->ok()) return absl::UnknownError(status->error_message());
  return out;
}

std::string Html(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

// A tick step of 1, 2 or 5 times a power of ten giving about `n` intervals over `span`.
double NiceStep(double span, int n) {
  const double raw = span / n;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * p) return m * p;
  }
  return 10 * p;
}

std::string TickLabel(double v) {
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e6 || a < 1e-3)) return absl::StrFormat("%.3g", v);
  return absl::StrFormat("%.6g", v);
}

// Fewer points than half the steps they span: a rank that reports every 10th step.
bool Sparse(const std::vector<std::pair<double, double>>& points) {
  if (points.size() < 2) return false;
  const double span = points.back().first - points.front().first + 1;
  return static_cast<double>(points.size()) < 0.5 * span;
}

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string Time(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0) return "";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixSeconds(t.seconds()),
                          absl::UTCTimeZone());
}

}  // namespace

std::string SvgLineChart(const std::string& title, const std::string& x_label,
                         const std::string& y_label, const std::vector<ChartSeries>& series) {
  constexpr double kW = 640, kH = 320, kLeft = 72, kRight = 16, kTop = 28, kBottom = 44;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  std::vector<std::vector<std::pair<double, double>>> finite(series.size());
  for (size_t i = 0; i < series.size(); ++i) {
    for (const auto& [x, y] : series[i].points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      finite[i].push_back({x, y});
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  }
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"%g\" height=\"%g\" "
      "viewBox=\"0 0 %g %g\" role=\"img\" aria-label=\"%s\">\n"
      "<rect x=\"0\" y=\"0\" width=\"%g\" height=\"%g\" fill=\"#fff\"/>\n"
      "<text x=\"%g\" y=\"18\" font-size=\"14\" font-weight=\"bold\">%s</text>\n",
      kW, kH, kW, kH, Html(title), kW, kH, kLeft, Html(title));
  if (!std::isfinite(x0)) {
    absl::StrAppend(&svg, "<text x=\"", kW / 2, "\" y=\"", kH / 2,
                    "\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n</svg>\n");
    return svg;
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) {
    const double pad = y0 == 0 ? 1 : std::fabs(y0) * 0.05;
    y0 -= pad;
    y1 += pad;
  }
  const double ystep = NiceStep(y1 - y0, 5), xstep = NiceStep(x1 - x0, 6);
  y0 = std::floor(y0 / ystep) * ystep;
  y1 = std::ceil(y1 / ystep) * ystep;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return kTop + (1 - (y - y0) / (y1 - y0)) * ph; };
  // Grid and ticks.
  for (double y = y0; y <= y1 + ystep / 2; y += ystep) {
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>"
        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n",
        kLeft, py(y), kW - kRight, py(y), kLeft - 6, py(y) + 4, TickLabel(y));
  }
  for (double x = std::ceil(x0 / xstep) * xstep; x <= x1 + xstep / 1e6; x += xstep) {
    absl::StrAppendFormat(
        &svg,
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>"
        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s"
        "</text>\n",
        px(x), kTop, px(x), kTop + ph, px(x), kTop + ph + 16, TickLabel(x));
  }
  absl::StrAppendFormat(
      &svg,
      "<rect x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"none\" stroke=\"#333\"/>\n"
      "<text x=\"%g\" y=\"%g\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n"
      "<text x=\"14\" y=\"%g\" font-size=\"12\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 14 %g)\">%s</text>\n",
      kLeft, kTop, pw, ph, kLeft + pw / 2, kH - 6, Html(x_label), kTop + ph / 2, kTop + ph / 2,
      Html(y_label));
  for (size_t i = 0; i < series.size(); ++i) {
    const char* color = kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
    std::vector<std::string> pts;
    for (const auto& [x, y] : finite[i]) pts.push_back(absl::StrFormat("%.1f,%.1f", px(x), py(y)));
    // A sampled series (a rank reporting every 10th step) is dotted between its samples, which
    // are marked: a solid line would claim values between them that were never measured.
    absl::StrAppendFormat(&svg,
                          "<polyline data-series=\"%s\" fill=\"none\" stroke=\"%s\" "
                          "stroke-width=\"1.6\"%s points=\"%s\"/>\n",
                          Html(series[i].name), color,
                          series[i].sparse ? " stroke-dasharray=\"2 4\"" : "",
                          absl::StrJoin(pts, " "));
    if (series[i].markers || series[i].sparse) {
      for (const auto& [x, y] : finite[i]) {
        absl::StrAppendFormat(&svg, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                              px(x), py(y), color);
      }
    }
    // Legend, top right, one row per series.
    const double ly = kTop + 14 + 15 * i;
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"3\" fill=\"%s\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">%s</text>\n",
                          kW - kRight - 150, ly - 4, color, kW - kRight - 134, ly,
                          Html(series[i].name));
  }
  svg += "</svg>\n";
  return svg;
}

std::string SvgPasskeyHeatmap(const v1::EvalReport& r) {
  std::vector<int64_t> lengths;
  std::vector<double> depths;
  std::map<std::pair<int64_t, double>, const v1::PasskeyResult*> at;
  for (const v1::PasskeyResult& p : r.passkey()) {
    if (std::find(lengths.begin(), lengths.end(), p.length()) == lengths.end()) {
      lengths.push_back(p.length());
    }
    if (std::find(depths.begin(), depths.end(), p.depth()) == depths.end()) {
      depths.push_back(p.depth());
    }
    at[{p.length(), p.depth()}] = &p;
  }
  std::sort(lengths.begin(), lengths.end());
  std::sort(depths.begin(), depths.end());
  constexpr double kLeft = 80, kRight = 16, kTop = 28, kBottom = 62, kCellH = 30;
  const double cell_w =
      std::max(48.0, std::min(110.0, 544.0 / std::max<size_t>(1, lengths.size())));
  const double W = kLeft + kRight + cell_w * static_cast<double>(lengths.size());
  const double H = kTop + kBottom + kCellH * static_cast<double>(depths.size());
  // One key count a chart (RenderReportHtml splits them): the passkey test, or multi-key.
  const int64_t keys = r.passkey_size() > 0 ? std::max<int64_t>(1, r.passkey(0).keys()) : 1;
  const std::string title =
      keys > 1 ? absl::StrCat("Multi-key retrieval (", keys, " keys, one asked), step ", r.step())
               : absl::StrCat("Passkey retrieval, step ", r.step());
  const std::string id = keys > 1 ? absl::StrCat("passkey-", keys, "-keys") : "passkey";
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"%s\" "
      "width=\"%g\" height=\"%g\" viewBox=\"0 0 %g %g\" role=\"img\" aria-label=\"%s\">\n"
      "<rect x=\"0\" y=\"0\" width=\"%g\" height=\"%g\" fill=\"#fff\"/>\n"
      "<text x=\"%g\" y=\"18\" font-size=\"14\" font-weight=\"bold\">%s</text>\n",
      id, W, H, W, H, Html(title), W, H, kLeft, Html(title));
  // Accuracy 0 red, 0.5 yellow, 1 green (the needle-in-a-haystack picture's scale).
  auto colour = [](double a) {
    a = std::min(1.0, std::max(0.0, a));
    const double lo[3] = {215, 48, 39}, mid[3] = {254, 224, 139}, hi[3] = {26, 152, 80};
    const double* from = a < 0.5 ? lo : mid;
    const double* to = a < 0.5 ? mid : hi;
    const double t = a < 0.5 ? a / 0.5 : (a - 0.5) / 0.5;
    int c[3];
    for (int i = 0; i < 3; ++i)
      c[i] = static_cast<int>(std::lround(from[i] + (to[i] - from[i]) * t));
    return absl::StrFormat("#%02x%02x%02x", c[0], c[1], c[2]);
  };
  for (size_t yi = 0; yi < depths.size(); ++yi) {
    const double y = kTop + kCellH * static_cast<double>(yi);
    absl::StrAppendFormat(&svg,
                          "<text x=\"%g\" y=\"%g\" text-anchor=\"end\" font-size=\"11\">depth "
                          "%g%%</text>\n",
                          kLeft - 6, y + kCellH / 2 + 4, depths[yi] * 100);
    for (size_t xi = 0; xi < lengths.size(); ++xi) {
      const double x = kLeft + cell_w * static_cast<double>(xi);
      auto it = at.find({lengths[xi], depths[yi]});
      if (it == at.end()) continue;
      const v1::PasskeyResult& p = *it->second;
      absl::StrAppendFormat(
          &svg,
          "<rect class=\"cell\" x=\"%g\" y=\"%g\" width=\"%g\" height=\"%g\" fill=\"%s\" "
          "stroke=\"#fff\" data-length=\"%d\" data-depth=\"%g\" data-accuracy=\"%g\" "
          "data-logprob=\"%g\"><title>%d tokens, depth %g: %d samples, accuracy %.2f, mean "
          "logprob %.3f</title></rect>\n"
          "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\" font-size=\"11\">%.2f</text>\n",
          x, y, cell_w, kCellH, colour(p.accuracy()), p.length(), p.depth(), p.accuracy(),
          p.logprob(), p.length(), p.depth(), p.samples(), p.accuracy(), p.logprob(),
          x + cell_w / 2, y + kCellH / 2 + 4, p.accuracy());
    }
  }
  const double bottom = kTop + kCellH * static_cast<double>(depths.size());
  for (size_t xi = 0; xi < lengths.size(); ++xi) {
    const int64_t n = lengths[xi];
    const std::string label = n % 1024 == 0 ? absl::StrCat(n / 1024, "K") : absl::StrCat(n);
    absl::StrAppendFormat(&svg,
                          "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\" "
                          "font-size=\"11\">%s</text>\n",
                          kLeft + cell_w * (static_cast<double>(xi) + 0.5), bottom + 14,
                          Html(label));
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\" font-size=\"12\">"
                        "prompt length (tokens); colour: accuracy, red 0 to green 1</text>\n",
                        kLeft + cell_w * static_cast<double>(lengths.size()) / 2, bottom + 34);
  svg += "</svg>\n";
  return svg;
}

std::string RenderReportHtml(const v1::Job& job, const std::vector<v1::JobEvent>& history,
                             const std::optional<v1::PlanJobResponse>& plan,
                             const std::string& plan_error,
                             const std::vector<std::string>& earlier_jobs,
                             const std::vector<ReportPhase>& chain) {
  // Per rank, its step reports in order.
  std::map<int, std::vector<const v1::StepReport*>> steps;
  std::vector<const v1::EvalReport*> evals;
  for (const v1::JobEvent& e : history) {
    if (e.has_step()) steps[e.step().rank()].push_back(&e.step());
    if (e.has_eval()) evals.push_back(&e.eval());
  }
  auto per_rank = [&](const std::string& label, double (*value)(const v1::StepReport&)) {
    std::vector<ChartSeries> out;
    for (const auto& [rank, reports] : steps) {
      ChartSeries s{absl::StrCat(label, " rank ", rank), {}, false};
      for (const v1::StepReport* r : reports) s.points.push_back({double(r->step()), value(*r)});
      s.sparse = Sparse(s.points);
      out.push_back(std::move(s));
    }
    return out;
  };
  // Throughput is per rank; a rank is a GPU only on a GPU backend.
  const std::string per = job.spec().backend() == "cpu" ? "rank (CPU)" : "GPU";

  std::string charts;
  {
    std::vector<ChartSeries> loss;
    if (steps.count(0)) {
      ChartSeries train{"train loss (rank 0)", {}, false};
      for (const v1::StepReport* r : steps[0])
        train.points.push_back({double(r->step()), r->loss()});
      loss.push_back(std::move(train));
    }
    ChartSeries eval{"eval loss", {}, true};
    for (const v1::EvalReport* e : evals) {
      // A passkey-only evaluation (no held-out tokens) has no loss to plot.
      if (e->tokens() > 0 || e->passkey_size() == 0) {
        eval.points.push_back({double(e->step()), e->loss()});
      }
    }
    if (!eval.points.empty()) loss.push_back(std::move(eval));
    absl::StrAppend(&charts, SvgLineChart("Loss", "step", "cross-entropy", loss));
  }
  // The chain's phases, this job last: each one's rank-0 train loss and eval loss, its steps
  // counted on from where the phase before ended (a phase starts at step 1 again).
  std::vector<std::string> chain_rows;
  if (!chain.empty()) {
    std::vector<ChartSeries> series;
    int64_t offset = 0;
    auto add_phase = [&](int index, const v1::Job& j, const std::vector<v1::JobEvent>& h) {
      ChartSeries train{absl::StrCat("phase ", index, " ", j.id(), " train loss"), {}, false};
      ChartSeries eval{absl::StrCat("phase ", index, " ", j.id(), " eval loss"), {}, true};
      int64_t last = 0;
      double last_loss = NAN;
      for (const v1::JobEvent& e : h) {
        if (e.has_step() && e.step().rank() == 0) {
          train.points.push_back({double(offset + e.step().step()), e.step().loss()});
          last = std::max(last, e.step().step());
          last_loss = e.step().loss();
        }
        if (e.has_eval() && (e.eval().tokens() > 0 || e.eval().passkey_size() == 0)) {
          eval.points.push_back({double(offset + e.eval().step()), e.eval().loss()});
        }
      }
      chain_rows.push_back(absl::StrCat(
          "<tr><td>", index, "</td><td>", Html(j.id()), "</td><td>", Html(j.name()), "</td><td>",
          j.spec().seq_len(), "</td><td>", last, " of ", j.spec().steps(), "</td><td>",
          offset + (last > 0 ? 1 : 0), "-", offset + last, "</td><td>",
          std::isnan(last_loss) ? "" : absl::StrFormat("%.4f", last_loss), "</td><td>",
          eval.points.empty() ? "" : absl::StrFormat("%.4f", eval.points.back().second),
          "</td><td>", StateName(j.state()), "</td></tr>\n"));
      if (!train.points.empty()) series.push_back(std::move(train));
      if (!eval.points.empty()) series.push_back(std::move(eval));
      offset += last > 0 ? last : j.spec().steps();
    };
    for (size_t i = 0; i < chain.size(); ++i) {
      add_phase(static_cast<int>(i) + 1, chain[i].job, chain[i].history);
    }
    add_phase(static_cast<int>(chain.size()) + 1, job, history);
    absl::StrAppend(&charts, SvgLineChart("Loss across the chain",
                                          "step of the chain (phases one after another)",
                                          "cross-entropy", series));
  }
  // eval.position_buckets: each bucket's held-out loss over the evaluations, so a phase that
  // makes the far context useful shows its far buckets falling below the near ones.
  {
    std::map<std::pair<int64_t, int64_t>, ChartSeries> by_bucket;
    for (const v1::EvalReport* e : evals) {
      for (const v1::PositionLoss& b : e->positions()) {
        if (b.tokens() == 0) continue;
        ChartSeries& s = by_bucket[{b.begin(), b.end()}];
        if (s.name.empty()) {
          s.name = absl::StrFormat("positions [%d, %d)", b.begin(), b.end());
          s.markers = true;
        }
        s.points.push_back({double(e->step()), b.loss()});
      }
    }
    std::vector<ChartSeries> series;
    for (auto& [bucket, s] : by_bucket) series.push_back(std::move(s));
    if (!series.empty()) {
      absl::StrAppend(&charts,
                      SvgLineChart("Eval loss by position", "step", "cross-entropy", series));
    }
  }
  // The newest evaluation with passkey points: the heatmap, and each point's accuracy over the
  // evaluations (one series per length, averaged over its depths).
  const v1::EvalReport* passkey = nullptr;
  for (const v1::EvalReport* e : evals) {
    if (e->passkey_size() > 0) passkey = e;
  }
  if (passkey != nullptr) {
    // A heatmap per key count (eval.passkey.keys), the passkey test's first.
    std::map<int64_t, v1::EvalReport> by_keys;
    for (const v1::PasskeyResult& p : passkey->passkey()) {
      v1::EvalReport& r = by_keys[std::max<int64_t>(1, p.keys())];
      r.set_step(passkey->step());
      *r.add_passkey() = p;
    }
    for (const auto& [keys, r] : by_keys) absl::StrAppend(&charts, SvgPasskeyHeatmap(r));
  }
  absl::StrAppend(&charts, SvgLineChart("Throughput", "step", "tokens/s per " + per,
                                        per_rank("tok/s", [](const v1::StepReport& r) {
                                          return r.tokens_per_second();
                                        })));
  absl::StrAppend(
      &charts,
      SvgLineChart("Step time", "step", "seconds",
                   per_rank("step time", [](const v1::StepReport& r) { return r.seconds(); })));
  // The schedule as it ran (warm-up, decay); every rank reports the same rate: rank 0's.
  if (steps.count(0)) {
    ChartSeries lr{"learning rate", {}, false};
    for (const v1::StepReport* r : steps.at(0)) lr.points.push_back({double(r->step()), r->lr()});
    absl::StrAppend(&charts, SvgLineChart("Learning rate", "step", "lr", {lr}));
  }
  // Each tier's peak during the step (at its end most tiers are empty again: the activations,
  // the attention and the saved block inputs live only inside a step).
  for (const auto& [rank, reports] : steps) {
    std::vector<std::string> tiers;  // in the reports' order
    std::map<std::string, ChartSeries> by_tier;
    int64_t most = 0;
    for (const v1::StepReport* r : reports) {
      for (const v1::TierBytes& t : r->memory()) most = std::max(most, t.peak_bytes());
    }
    // GiB for real models, MiB for small ones (whose GiB ticks would all read 0.000x).
    const bool gib = most >= kGiBBytes;
    const double unit = gib ? kGiB : kMiB;
    for (const v1::StepReport* r : reports) {
      for (const v1::TierBytes& t : r->memory()) {
        if (!by_tier.count(t.tier())) {
          tiers.push_back(t.tier());
          by_tier[t.tier()].name = t.tier();
        }
        by_tier[t.tier()].points.push_back(
            {double(r->step()), static_cast<double>(t.peak_bytes()) / unit});
      }
    }
    std::vector<ChartSeries> series;
    for (const std::string& t : tiers) {
      ChartSeries& tier = by_tier[t];
      const auto& pts = tier.points;
      // Tiers this rank never used would only crowd the legend.
      if (std::any_of(pts.begin(), pts.end(), [](const auto& p) { return p.second > 0; })) {
        tier.sparse = Sparse(pts);
        series.push_back(tier);
      }
    }
    absl::StrAppend(
        &charts,
        SvgLineChart(absl::StrCat("Peak memory per tier, rank ", rank), "step",
                     gib ? "GiB, peak during the step" : "MiB, peak during the step", series));
  }

  std::string page = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Ithaca ",
      Html(job.id()), " ", Html(job.name()),
      "</title>\n<style>\n"
      "body{font-family:sans-serif;margin:24px;color:#222;max-width:1340px}\n"
      "table{border-collapse:collapse;margin:8px 0 16px}\n"
      "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}\n"
      "pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}\n"
      ".chart{margin:6px;border:1px solid #ddd}\n"
      "#charts{display:flex;flex-wrap:wrap}\n"
      "</style>\n</head>\n<body>\n<h1>",
      Html(job.id()), ": ", Html(job.name()), "</h1>\n");
  const v1::JobSpecSummary& s = job.spec();
  int64_t last_step = 0, tokens = 0;
  if (steps.count(0)) last_step = steps[0].back()->step();
  for (const v1::StepReport& r : job.last_steps()) last_step = std::max(last_step, r.step());
  if (steps.count(0)) {
    for (const v1::StepReport* r : steps[0]) tokens += r->tokens();
  }
  auto row = [](const std::string& k, const std::string& v) {
    return absl::StrCat("<tr><th>", Html(k), "</th><td>", Html(v), "</td></tr>\n");
  };
  absl::StrAppend(
      &page, "<table id=\"summary\">\n", row("state", StateName(job.state())),
      row("reason", job.reason()), row("model", s.model()),
      row("parameters", absl::StrCat(s.parameters())), row("backend", s.backend()),
      row("world / sp", absl::StrCat(s.world(), " / ", s.sp())),
      row("sequence length", absl::StrCat(s.seq_len())), row("rope", s.rope()),
      row("init from", s.init_from()), row("after", job.after()),
      row("steps", absl::StrCat(last_step, " of ", s.steps())),
      row("created", Time(job.created_at())), row("updated", Time(job.updated_at())),
      row("attempt", job.restarts() > 0 ? absl::StrCat(job.restarts() + 1, " (", job.restarts(),
                                                       " restarts by its [retry] policy)")
                                        : "1"),
      row("cluster job", job.cluster_job()), row("log directory", job.log_dir()),
      row("checkpoint directory", s.checkpoint_dir()), "</table>\n");
  if (!chain_rows.empty()) {
    absl::StrAppend(&page,
                    "<h2>Chain</h2>\n<p>This job is a phase of a chain ([init] from the phase "
                    "before's checkpoint); the earlier phases, oldest first:</p>\n"
                    "<table id=\"chain\">\n<tr><th>phase</th><th>job</th><th>name</th>"
                    "<th>sequence length</th><th>steps</th><th>chain steps</th>"
                    "<th>last train loss</th><th>last eval loss</th><th>state</th></tr>\n",
                    absl::StrJoin(chain_rows, ""), "</table>\n");
  }
  if (job.has_last_eval() &&
      (job.last_eval().tokens() > 0 || job.last_eval().passkey_size() == 0)) {
    absl::StrAppend(&page, "<p>Newest evaluation: loss ",
                    absl::StrFormat("%.4f", job.last_eval().loss()), " at step ",
                    job.last_eval().step(), ".</p>\n");
  }
  if (passkey != nullptr) {
    absl::StrAppend(&page, "<p id=\"passkey-summary\">Passkey retrieval at step ", passkey->step(),
                    " (teacher-forced; ", passkey->passkey(0).samples(),
                    " samples per length and depth): ", Html(PasskeySummary(*passkey)), ".</p>\n");
  }
  if (!earlier_jobs.empty()) {
    absl::StrAppend(&page, "<p id=\"attempts\">This job resumed a run begun by ",
                    Html(absl::StrJoin(earlier_jobs, ", ")),
                    " (the same checkpoint directory): their steps before this job's first are "
                    "part of the plots.</p>\n");
  }
  absl::StrAppend(&page, "<h2>Plots</h2>\n<div id=\"charts\">\n", charts, "</div>\n");
  absl::StrAppend(&page, "<h2>Memory plan</h2>\n");
  if (plan) {
    const v1::MemoryPlan& p = plan->plan();
    absl::StrAppend(&page, "<p>", Html(p.summary()), "</p>\n<table id=\"plan\">\n",
                    "<tr><th>tier</th><th>estimate per rank</th></tr>\n");
    for (const v1::TierBytes& t : p.per_rank()) {
      absl::StrAppend(&page, "<tr><td>", Html(t.tier()), "</td><td>", HumanBytes(t.current_bytes()),
                      "</td></tr>\n");
    }
    absl::StrAppend(&page, "<tr><th>total</th><th>", HumanBytes(p.per_rank_bytes()), "</th></tr>\n",
                    "<tr><th>budget (", Html(p.budget_source()), ")</th><th>",
                    HumanBytes(p.budget_bytes()), "</th></tr>\n</table>\n");
  } else {
    absl::StrAppend(&page, "<p>No plan: ", Html(plan_error), "</p>\n");
  }
  absl::StrAppend(&page, "<h2>State history</h2>\n<table id=\"transitions\">\n",
                  "<tr><th>time</th><th>from</th><th>to</th><th>reason</th></tr>\n");
  for (const v1::StateTransition& t : job.transitions()) {
    absl::StrAppend(&page, "<tr><td>", Html(Time(t.time())), "</td><td>",
                    t.from() == v1::JOB_STATE_UNSPECIFIED ? "" : StateName(t.from()), "</td><td>",
                    StateName(t.to()), "</td><td>", Html(t.reason()), "</td></tr>\n");
  }
  absl::StrAppend(&page, "</table>\n<h2>Resolved spec</h2>\n<pre id=\"spec\">",
                  Html(job.spec_toml()), "</pre>\n");
  absl::StrAppend(
      &page, "<p>", history.size(), " reports (", tokens,
      " tokens on rank 0's recorded steps). Written by <code>ithaca report</code>.</p>\n",
      "</body>\n</html>\n");
  return page;
}

int AddEarlierAttempts(CliContext& c, const v1::Job& job, std::vector<v1::JobEvent>* history,
                       std::vector<std::string>* earlier) {
  int64_t first = -1;  // the first step this job trained
  for (const v1::JobEvent& e : *history) {
    if (e.has_step() && (first < 0 || e.step().step() < first)) first = e.step().step();
  }
  if (first <= 1 || job.spec().checkpoint_dir().empty()) return 0;
  v1::ListJobsRequest req;  // every job, newest first
  v1::ListJobsResponse jobs;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->ListJobs(&ctx, req, &jobs);
  if (!st.ok()) return RpcError(c, st);
  std::vector<v1::JobEvent> before;  // oldest first, once complete
  for (const v1::Job& other : jobs.jobs()) {
    if (first <= 1) break;
    if (other.id() == job.id() || other.spec().checkpoint_dir() != job.spec().checkpoint_dir() ||
        TimeUtil::TimestampToMilliseconds(other.created_at()) >=
            TimeUtil::TimestampToMilliseconds(job.created_at())) {
      continue;
    }
    grpc::Status hst;
    absl::StatusOr<std::vector<v1::JobEvent>> h = ReadHistory(c, other.id(), &hst);
    if (!h.ok()) return RpcError(c, hst);
    // Only what led to the checkpoint the next attempt resumed from: steps past it were
    // trained again.
    std::vector<v1::JobEvent> kept;
    int64_t other_first = -1;
    for (const v1::JobEvent& e : *h) {
      const int64_t step = e.has_step() ? e.step().step() : e.has_eval() ? e.eval().step() : -1;
      if (step < 0 || step >= first) continue;
      if (e.has_step() && (other_first < 0 || step < other_first)) other_first = step;
      kept.push_back(e);
    }
    if (kept.empty()) continue;
    earlier->push_back(other.id());
    before.insert(before.begin(), kept.begin(), kept.end());
    first = other_first;
  }
  history->insert(history->begin(), before.begin(), before.end());
  std::reverse(earlier->begin(), earlier->end());  // oldest first
  return 0;
}

int AddChainPhases(CliContext& c, const v1::Job& job, std::vector<ReportPhase>* chain) {
  if (job.spec().init_from().empty()) return 0;
  v1::ListJobsRequest req;  // every job, newest first
  v1::ListJobsResponse jobs;
  grpc::ClientContext ctx;
  grpc::Status st = c.stub->ListJobs(&ctx, req, &jobs);
  if (!st.ok()) return RpcError(c, st);
  std::vector<std::string> seen = {job.id()};
  const v1::Job* phase = &job;
  while (!phase->spec().init_from().empty()) {
    const std::string& from = phase->spec().init_from();
    const int64_t before = TimeUtil::TimestampToMilliseconds(phase->created_at());
    const v1::Job* earlier = nullptr;
    for (const v1::Job& other : jobs.jobs()) {  // newest first: the first match is the newest
      const std::string& dir = other.spec().checkpoint_dir();
      if (dir.empty() || TimeUtil::TimestampToMilliseconds(other.created_at()) >= before ||
          std::find(seen.begin(), seen.end(), other.id()) != seen.end()) {
        continue;
      }
      if (from == dir || absl::StartsWith(from, dir + "/")) {
        earlier = &other;
        break;
      }
    }
    if (earlier == nullptr) break;  // a Hugging Face directory, or a run ithacad forgot
    ReportPhase p;
    p.job = *earlier;
    grpc::Status hst;
    absl::StatusOr<std::vector<v1::JobEvent>> h = ReadHistory(c, earlier->id(), &hst);
    if (!h.ok()) return RpcError(c, hst);
    p.history = std::move(*h);
    std::vector<std::string> attempts;
    if (int rc = AddEarlierAttempts(c, p.job, &p.history, &attempts); rc != 0) return rc;
    chain->insert(chain->begin(), std::move(p));
    seen.push_back(earlier->id());
    phase = earlier;
  }
  return 0;
}

int StepsCommand(CliContext& c, const std::string& id) {
  grpc::Status st;
  absl::StatusOr<std::vector<v1::JobEvent>> history = ReadHistory(c, id, &st);
  if (!history.ok()) return RpcError(c, st);
  // The same JSON as every other -o json output (client/json.h): int64 as numbers, every field.
  for (const v1::JobEvent& e : *history) std::printf("%s\n", ProtoJson(e).c_str());
  std::fflush(stdout);
  return 0;
}

int ReportCommand(CliContext& c, const std::string& id, const std::string& out_in) {
  v1::GetJobRequest get;
  get.set_id(id);
  v1::Job job;
  {
    grpc::ClientContext ctx;
    grpc::Status st = c.stub->GetJob(&ctx, get, &job);
    if (!st.ok()) return RpcError(c, st);
  }
  grpc::Status st;
  absl::StatusOr<std::vector<v1::JobEvent>> history = ReadHistory(c, id, &st);
  if (!history.ok()) return RpcError(c, st);
  std::vector<std::string> earlier;
  if (int rc = AddEarlierAttempts(c, job, &*history, &earlier); rc != 0) return rc;
  std::vector<ReportPhase> chain;
  if (int rc = AddChainPhases(c, job, &chain); rc != 0) return rc;
  // The plan admission made for the spec as it ran; a job stored before plans were kept is
  // planned again (a finished run in its checkpoint directory is then only a warning).
  std::optional<v1::PlanJobResponse> plan;
  std::string plan_error;
  if (job.has_plan()) {
    plan.emplace();
    *plan->mutable_plan() = job.plan();
    *plan->mutable_spec() = job.spec();
  } else {
    v1::PlanJobRequest req;
    req.set_spec_toml(job.spec_toml());
    req.set_source(id + " (resolved spec)");
    req.set_base_dir("/");
    v1::PlanJobResponse resp;
    grpc::ClientContext ctx;
    grpc::Status pst = c.stub->PlanJob(&ctx, req, &resp);
    if (pst.ok()) {
      plan = resp;
    } else {
      plan_error = pst.error_message();
    }
  }
  const std::string out = out_in.empty() ? id + ".html" : out_in;
  std::ofstream f(out);
  f << RenderReportHtml(job, *history, plan, plan_error, earlier, chain);
  f.close();
  if (!f) {
    std::fprintf(stderr, "ithaca: %s: cannot write\n", out.c_str());
    return 2;
  }
  std::printf("%s: %zu reports; wrote %s\n", id.c_str(), history->size(), out.c_str());
  return 0;
}

}  // namespace ithaca
