#include "client/format.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/time_util.h"

namespace ithaca {
namespace {

using google::protobuf::util::TimeUtil;

std::string Time(const google::protobuf::Timestamp& t) {
  std::string s = TimeUtil::ToString(t);  // RFC 3339, UTC
  return s.substr(0, std::min<size_t>(s.size(), 19)) + "Z";
}

absl::Time ToAbsl(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

const v1::StepReport* Rank0(const v1::Job& job) {
  for (const v1::StepReport& r : job.last_steps()) {
    if (r.rank() == 0) return &r;
  }
  return job.last_steps_size() > 0 ? &job.last_steps(0) : nullptr;
}

}  // namespace

std::string HumanBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::abs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

std::string HumanDuration(double seconds) {
  if (!(seconds >= 0) || std::isinf(seconds)) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

std::string HumanRate(double v) {
  if (v >= 1e6) return absl::StrFormat("%.1fM", v / 1e6);
  if (v >= 1e4) return absl::StrFormat("%.1fk", v / 1e3);
  return absl::StrFormat("%.1f", v);
}

std::string StateName(v1::JobState s) {
  std::string n = v1::JobState_Name(s);
  return absl::StartsWith(n, "JOB_STATE_") ? n.substr(10) : n;
}

std::string ProgressLine(const v1::StepReport& r, double eta_seconds) {
  std::string line = absl::StrFormat("step %d/%d | loss %.4f | %s tok/s/rank | mem %s", r.step(),
                                     r.total_steps(), r.loss(), HumanRate(r.tokens_per_second()),
                                     HumanBytes(r.device_peak_bytes()));
  if (eta_seconds >= 0) absl::StrAppend(&line, " | ETA ", HumanDuration(eta_seconds));
  return line;
}

std::string EvalLine(const v1::EvalReport& r) {
  if (r.passkey_size() == 0 || r.tokens() > 0) {
    std::string line = absl::StrFormat(
        "eval step %d: loss %.4f (ppl %.1f) over %d tokens, %d batches, %.2f s", r.step(), r.loss(),
        std::exp(r.loss()), r.tokens(), r.batches(), r.seconds());
    if (r.passkey_size() > 0) absl::StrAppend(&line, " | ", PasskeySummary(r));
    return line;
  }
  return absl::StrFormat("eval step %d: %s, %.2f s", r.step(), PasskeySummary(r), r.seconds());
}

std::string PasskeySummary(const v1::EvalReport& r) {
  // Per key count and length (in the report's order), the accuracy over its depths.
  struct Group {
    int64_t keys, length;
    double sum;
    int n;
  };
  std::vector<Group> groups;
  for (const v1::PasskeyResult& p : r.passkey()) {
    const int64_t keys = std::max<int64_t>(1, p.keys());
    if (groups.empty() || groups.back().length != p.length() || groups.back().keys != keys) {
      groups.push_back({keys, p.length(), 0.0, 0});
    }
    groups.back().sum += p.accuracy();
    groups.back().n += 1;
  }
  // "passkey accuracy 1.00 at 4096, 0.75 at 8192 tokens; 4-key accuracy 0.50 at 4096 tokens"
  std::vector<std::string> sections;
  for (size_t i = 0; i < groups.size();) {
    std::vector<std::string> parts;
    size_t j = i;
    for (; j < groups.size() && groups[j].keys == groups[i].keys; ++j) {
      parts.push_back(absl::StrFormat("%.2f at %d", groups[j].sum / groups[j].n, groups[j].length));
    }
    const std::string what =
        groups[i].keys > 1 ? absl::StrCat(groups[i].keys, "-key") : std::string("passkey");
    sections.push_back(absl::StrCat(what, " accuracy ", absl::StrJoin(parts, ", "), " tokens"));
    i = j;
  }
  return absl::StrJoin(sections, "; ");
}

std::vector<std::string> PasskeyTable(const v1::EvalReport& r) {
  std::vector<std::string> lines;
  for (int i = 0; i < r.passkey_size();) {
    const int64_t length = r.passkey(i).length(), keys = r.passkey(i).keys();
    std::vector<std::string> cells;
    for (; i < r.passkey_size() && r.passkey(i).length() == length && r.passkey(i).keys() == keys;
         ++i) {
      const v1::PasskeyResult& p = r.passkey(i);
      cells.push_back(
          absl::StrFormat("depth %g %.2f (logprob %.3f)", p.depth(), p.accuracy(), p.logprob()));
    }
    lines.push_back(absl::StrFormat("%d tokens%s: %s", length,
                                    keys > 1 ? absl::StrFormat(", %d keys", keys) : "",
                                    absl::StrJoin(cells, ", ")));
  }
  return lines;
}

std::string PositionLine(const v1::EvalReport& r) {
  if (r.positions_size() == 0) return "";
  std::vector<std::string> losses, tokens;
  for (const v1::PositionLoss& b : r.positions()) {
    losses.push_back(absl::StrFormat("[%d, %d) %.4f", b.begin(), b.end(), b.loss()));
    tokens.push_back(absl::StrCat(b.tokens()));
  }
  return absl::StrCat("by position: ", absl::StrJoin(losses, ", "), " (",
                      absl::StrJoin(tokens, ", "), " tokens)");
}

std::string MemoryTable(const v1::Job& job) {
  if (job.last_steps_size() == 0) return "memory: no step reported yet\n";
  std::vector<std::string> tiers;
  std::map<std::string, std::map<int, int64_t>> peak;
  std::map<int, int64_t> device_peak;
  for (const v1::StepReport& r : job.last_steps()) {
    for (const v1::TierBytes& t : r.memory()) {
      if (!peak.count(t.tier())) tiers.push_back(t.tier());
      peak[t.tier()][r.rank()] = t.peak_bytes();
    }
    device_peak[r.rank()] = r.device_peak_bytes();
  }
  // The first column fits the longest tier name (host_block_inputs) and a space.
  std::string out = absl::StrFormat("%-18s", "tier (peak)");
  for (const auto& [rank, _] : device_peak)
    absl::StrAppend(&out, absl::StrFormat("%12s", absl::StrCat("rank ", rank)));
  absl::StrAppend(&out, "\n");
  for (const std::string& tier : tiers) {
    absl::StrAppend(&out, absl::StrFormat("%-18s", tier));
    for (const auto& [rank, _] : device_peak) {
      absl::StrAppend(&out, absl::StrFormat("%12s", HumanBytes(peak[tier][rank])));
    }
    absl::StrAppend(&out, "\n");
  }
  absl::StrAppend(&out, absl::StrFormat("%-18s", "device total"));
  for (const auto& [rank, bytes] : device_peak) {
    absl::StrAppend(&out, absl::StrFormat("%12s", HumanBytes(bytes)));
  }
  absl::StrAppend(&out, "\n");
  return out;
}

std::string Printable(const std::string& s, bool keep_newlines, size_t max_bytes) {
  const size_t n = max_bytes > 0 ? std::min(s.size(), max_bytes) : s.size();
  std::string out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c < 0x20 && !(keep_newlines && (c == '\n' || c == '\t'))) || c == 0x7f) {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", c));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (n < s.size()) absl::StrAppend(&out, "...(", s.size() - n, " more bytes)");
  return out;
}

std::string HumanAge(absl::Duration d) {
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(d));
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 120 * 60) return absl::StrCat(s / 60, "m");
  if (s < 48 * 3600) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

std::string JobTable(const std::vector<v1::Job>& jobs, bool wide, absl::Time now) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"ID", "NAME", "STATE", "STEP", "LOSS", "AGE", "DURATION"});
  if (wide) {
    for (const char* h : {"WORLD", "BACKEND", "MODEL", "SLOTS", "AFTER"}) rows[0].push_back(h);
  }
  rows[0].push_back("REASON");
  for (const v1::Job& job : jobs) {
    std::vector<std::string> row = {Printable(job.id(), false, 64),
                                    Printable(job.name(), false, 64), StateName(job.state())};
    const v1::StepReport* r = Rank0(job);
    row.push_back(r ? absl::StrCat(r->step(), "/", r->total_steps()) : "-");
    row.push_back(r ? absl::StrFormat("%.4f", r->loss()) : "-");
    row.push_back(job.has_created_at() ? HumanAge(now - ToAbsl(job.created_at())) : "-");
    // From the first start to the end: the time the job held its GPUs.
    std::optional<absl::Time> started, ended;
    for (const v1::StateTransition& t : job.transitions()) {
      const absl::Time at = ToAbsl(t.time());
      if (!started && t.to() == v1::JOB_STATE_STARTING) started = at;
      if (t.to() == v1::JOB_STATE_SUCCEEDED || t.to() == v1::JOB_STATE_FAILED ||
          t.to() == v1::JOB_STATE_CANCELLED) {
        ended = at;
      }
    }
    row.push_back(started ? HumanDuration(absl::ToDoubleSeconds(ended.value_or(now) - *started))
                          : "-");
    if (wide) {
      const v1::JobSpecSummary& s = job.spec();
      row.push_back(absl::StrCat(s.world()));
      row.push_back(Printable(s.backend(), false, 16));
      row.push_back(Printable(s.model(), false, 256));
      std::vector<std::string> slots;
      for (int slot : job.slots()) slots.push_back(absl::StrCat(slot));
      row.push_back(slots.empty() ? "-" : absl::StrJoin(slots, ","));
      row.push_back(job.after().empty() ? "-" : Printable(job.after(), false, 64));
    }
    // The last column: nothing after it to keep aligned, so the reason is whole.
    row.push_back(Printable(job.reason()));
    rows.push_back(std::move(row));
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) line.append(width[i] - row[i].size() + 3, ' ');
    }
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return out;
}

std::string JobDetails(const v1::Job& job) {
  const v1::JobSpecSummary& s = job.spec();
  std::string out = absl::StrFormat("job %s (%s): %s\n", Printable(job.id(), false, 64),
                                    Printable(job.name(), false, 256), StateName(job.state()));
  if (!job.reason().empty()) absl::StrAppend(&out, "  reason: ", Printable(job.reason()), "\n");
  if (job.has_failed_rank()) absl::StrAppend(&out, "  failed rank: ", job.failed_rank(), "\n");
  if (job.restarts() > 0) {
    absl::StrAppend(&out, "  attempt: ", job.restarts() + 1, " (restarted ", job.restarts(),
                    job.restarts() == 1 ? " time" : " times", " by its [retry] policy)\n");
  }
  if (!job.cluster_job().empty()) {
    absl::StrAppend(&out, "  cluster job: ", Printable(job.cluster_job(), false, 64), "\n");
  }
  absl::StrAppend(&out,
                  absl::StrFormat("  model: %s (%.3g M parameters), backend %s, world %d (sp %d), "
                                  "seq_len %d, %d steps\n",
                                  s.model(), s.parameters() / 1e6, s.backend(), s.world(), s.sp(),
                                  s.seq_len(), s.steps()));
  if (!job.after().empty()) {
    absl::StrAppend(&out, "  after: ", Printable(job.after(), false, 64),
                    " (starts when it succeeds; cancelled if it fails or is cancelled)\n");
  }
  if (!s.rope().empty()) absl::StrAppend(&out, "  rope: ", Printable(s.rope()), "\n");
  if (!s.init_from().empty()) {
    absl::StrAppend(&out, "  init from: ", Printable(s.init_from()), " (weights only)\n");
  }
  for (const std::string& w : job.warnings()) {
    absl::StrAppend(&out, "  warning: ", Printable(w), "\n");
  }
  absl::StrAppend(&out, "  data: ", s.data_path(), "\n");
  if (!s.checkpoint_dir().empty())
    absl::StrAppend(&out, "  checkpoints: ", s.checkpoint_dir(), "\n");
  absl::StrAppend(&out, "  logs: ", job.log_dir(), "/rank-*.log\n");
  if (const v1::StepReport* r = Rank0(job)) {
    absl::StrAppend(&out, "  last step: ", ProgressLine(*r, -1),
                    absl::StrFormat(" | %.3f s | grad norm %.3f | lr %.3g", r->seconds(),
                                    r->grad_norm(), r->lr()));
    // Optimizer offload: the CPU update and the device's wait for it.
    if (r->device_wait_seconds() > 0) {
      absl::StrAppendFormat(&out, " | cpu adamw %.3f s (device waited %.3f s)",
                            r->cpu_update_seconds(), r->device_wait_seconds());
    }
    out += "\n";
    // A data.weights mix: what the step took from each source, and its loss there.
    for (const v1::SourceReport& src : r->sources()) {
      absl::StrAppendFormat(&out, "    source %d (%s): %d sample%s, %d tokens (%d trained)",
                            src.source(), Printable(src.path(), false, 256), src.samples(),
                            src.samples() == 1 ? "" : "s", src.tokens(), src.loss_tokens());
      if (src.loss_tokens() > 0) absl::StrAppendFormat(&out, ", loss %.4f", src.loss());
      out += "\n";
    }
    // Under [lora] only the adapters train.
    if (r->parameters() > 0 && r->trainable_parameters() != r->parameters()) {
      absl::StrAppendFormat(&out, "  trainable parameters: %d of %d (%.3f%%)\n",
                            r->trainable_parameters(), r->parameters(),
                            100.0 * r->trainable_parameters() / r->parameters());
    }
  }
  if (job.has_last_eval()) {
    absl::StrAppend(&out, "  last eval: ", EvalLine(job.last_eval()), "\n");
    if (job.last_eval().positions_size() > 0) {
      absl::StrAppend(&out, "    ", PositionLine(job.last_eval()), "\n");
    }
    for (const std::string& line : PasskeyTable(job.last_eval())) {
      absl::StrAppend(&out, "    passkey ", line, "\n");
    }
  }
  absl::StrAppend(&out, "  history:\n");
  // The daemon keeps the first 16 transitions and the newest (job.proto transitions_omitted).
  constexpr int kKeptFirst = 16;
  for (int i = 0; i < job.transitions_size(); ++i) {
    const v1::StateTransition& t = job.transitions(i);
    if (i == kKeptFirst && job.transitions_omitted() > 0) {
      absl::StrAppend(&out, "    ... ", job.transitions_omitted(),
                      " transitions not kept (restarts, drains, requeues) ...\n");
    }
    absl::StrAppend(&out, "    ", Time(t.time()), "  ", StateName(t.to()),
                    t.reason().empty() ? "" : "  (" + Printable(t.reason()) + ")", "\n");
  }
  if (job.last_steps_size() > 0) {
    absl::StrAppend(&out, "  memory per tier:\n");
    std::string table = MemoryTable(job);
    size_t start = 0, nl;
    while ((nl = table.find('\n', start)) != std::string::npos) {
      absl::StrAppend(&out, "    ", table.substr(start, nl - start + 1));
      start = nl + 1;
    }
  }
  if (!job.spec_toml().empty()) {
    // Resolved at admission: every "auto" is the number the workers run with.
    absl::StrAppend(&out, "  spec (resolved):\n");
    for (absl::string_view line : absl::StrSplit(job.spec_toml(), '\n', absl::SkipEmpty())) {
      absl::StrAppend(&out, "    ", line, "\n");
    }
  }
  return out;
}

std::string RunTime(double seconds) {
  if (seconds < 120) return absl::StrFormat("%.0f s", seconds);
  if (seconds < 120 * 60) return absl::StrFormat("%.0f min", seconds / 60);
  if (seconds < 72 * 3600) return absl::StrFormat("%.1f h", seconds / 3600);
  return absl::StrFormat("%.1f days", seconds / 86400);
}

std::string PlanText(const v1::PlanJobResponse& p) {
  const v1::MemoryPlan& plan = p.plan();
  std::string out =
      absl::StrFormat("plan for %s: %s, %.3g M parameters, world %d\n", p.spec().name(),
                      p.spec().model(), plan.parameters() / 1e6, plan.world());
  if (!p.spec().rope().empty()) absl::StrAppend(&out, "  rope: ", p.spec().rope(), "\n");
  if (!p.spec().init_from().empty()) {
    absl::StrAppend(&out, "  init from: ", p.spec().init_from(), " (weights only)\n");
  }
  for (const std::string& w : p.warnings()) absl::StrAppend(&out, "  warning: ", w, "\n");
  for (const v1::TierBytes& t : plan.per_rank()) {
    absl::StrAppend(
        &out, absl::StrFormat("  %-17s %12s per rank\n", t.tier(), HumanBytes(t.peak_bytes())));
  }
  // Both tiers against their budgets: the host's binds too (offloaded block data, the
  // optimizer's state), at long lengths first.
  absl::StrAppend(&out, absl::StrFormat("  %-17s %12s per rank, budget %s (%s)\n", "device total",
                                        HumanBytes(plan.per_rank_bytes()),
                                        HumanBytes(plan.budget_bytes()), plan.budget_source()));
  absl::StrAppend(
      &out, absl::StrFormat("  %-17s %12s per rank, budget %s\n", "host total",
                            HumanBytes(plan.host_per_rank_bytes()),
                            plan.host_budget_bytes() > 0 ? HumanBytes(plan.host_budget_bytes())
                                                         : std::string("unbounded")));
  if (plan.predicted_step_s() > 0) {
    absl::StrAppend(
        &out, absl::StrFormat("  %-17s %.4g s a step, %.0f tok/s (%.0f per GPU; "
                              "recompute %s; rates %s)\n",
                              "predicted", plan.predicted_step_s(), plan.predicted_tok_per_s(),
                              plan.predicted_tok_per_s_per_gpu(), plan.recompute(),
                              plan.rates_note().empty()
                                  ? plan.rates()
                                  : absl::StrCat(plan.rates(), ", ", plan.rates_note())));
    if (plan.has_predicted_time()) {
      // Where the time goes (issue 56): the compute by kind and the forwards it runs again, the
      // other streams beside it, the update.
      const v1::MemoryPlan::PredictedTime& t = plan.predicted_time();
      absl::StrAppend(
          &out,
          absl::StrFormat("  %-17s %.4g s a forward/backward (x%d a step): attention %.4g s, "
                          "GEMMs %.4g s, elementwise %.4g s; of those, forwards run again: "
                          "regrowing %.4g s, recompute %.4g s; transfers %.4g s and collectives "
                          "%.4g s beside them (compute waited %.4g s); update %.4g s a step\n",
                          "where time goes", t.forward_backward_s(), t.samples(), t.attention_s(),
                          t.gemm_s(), t.elementwise_s(), t.regrow_s(), t.recompute_s(),
                          t.transfer_s(), t.collective_s(), t.waited_s(), t.update_s()));
    }
    if (p.spec().steps() > 0) {
      const double run_s = plan.predicted_step_s() * static_cast<double>(p.spec().steps());
      absl::StrAppend(&out, absl::StrFormat("  %-17s %s for training.steps = %d\n", "the run",
                                            RunTime(run_s), p.spec().steps()));
    }
  }
  absl::StrAppend(&out, plan.fits() ? "fits" : "does NOT fit", ": ", plan.summary(), "\n");
  return out;
}

double ChainRunSeconds(const std::vector<v1::PlanJobResponse>& plans) {
  double total = 0;
  for (const v1::PlanJobResponse& p : plans) {
    total += p.plan().predicted_step_s() * static_cast<double>(p.spec().steps());
  }
  return total;
}

std::string ChainPlanText(const std::vector<std::string>& sources,
                          const std::vector<v1::PlanJobResponse>& plans) {
  std::vector<std::string> lines, unknown, not_fitting;
  for (size_t i = 0; i < plans.size(); ++i) {
    const v1::PlanJobResponse& p = plans[i];
    const std::string name = absl::StrFormat("phase %d (%s)", i + 1, Printable(sources[i]));
    if (!p.plan().fits()) not_fitting.push_back(absl::StrCat("phase ", i + 1));
    if (p.plan().predicted_step_s() <= 0) {
      unknown.push_back(absl::StrCat("phase ", i + 1));
      lines.push_back(
          absl::StrFormat("    %s: no step-time prediction, %d steps at data.seq_len %d\n", name,
                          p.spec().steps(), p.spec().seq_len()));
      continue;
    }
    lines.push_back(absl::StrFormat(
        "    %s: %s, %d steps of %.4g s at data.seq_len %d\n", name,
        RunTime(p.plan().predicted_step_s() * static_cast<double>(p.spec().steps())),
        p.spec().steps(), p.plan().predicted_step_s(), p.spec().seq_len()));
  }
  std::string out = absl::StrFormat(
      "chain of %d phases: %s%s in all for their training.steps%s; %s\n", plans.size(),
      unknown.empty() ? "" : "at least ", RunTime(ChainRunSeconds(plans)),
      unknown.empty() ? "" : absl::StrCat(" (", absl::StrJoin(unknown, ", "), " not predicted)"),
      not_fitting.empty() ? "every phase fits"
                          : absl::StrCat(absl::StrJoin(not_fitting, ", "), " does NOT fit"));
  for (const std::string& l : lines) absl::StrAppend(&out, l);
  return out;
}

std::string NodeText(const v1::NodeInfo& n) {
  std::string out;
  if (n.has_cluster()) {
    const v1::ClusterInfo& c = n.cluster();
    out = absl::StrFormat(
        "node %s (%s): jobs run on %s; %d running, %d queued (%d pending in %s)\n", n.hostname(),
        n.version(), c.kind(), n.jobs_running(), n.jobs_queued(), c.jobs_pending(), c.kind());
    const std::string where =
        c.partition().empty() ? "every partition" : "partition " + c.partition();
    if (c.error().empty()) {
      absl::StrAppend(&out, absl::StrFormat("%s, %s: %d nodes, %d idle, %d busy, %d unavailable\n",
                                            c.kind(), where, c.nodes(), c.nodes_idle(),
                                            c.nodes_busy(), c.nodes_unavailable()));
    } else {
      absl::StrAppend(&out, c.kind(), ", ", where, ": cannot say (", c.error(), ")\n");
    }
  } else {
    out = absl::StrFormat("node %s (%s): %d %s, %d free; host memory %s; %d running, %d queued\n",
                          n.hostname(), n.version(), n.slots(), n.gpus() > 0 ? "GPUs" : "CPU slots",
                          n.free_slots(), HumanBytes(n.host_memory_bytes()), n.jobs_running(),
                          n.jobs_queued());
  }
  if (!n.libraries().empty()) absl::StrAppend(&out, "libraries: ", n.libraries(), "\n");
  if (n.scheduling_paused()) {
    absl::StrAppend(&out,
                    "scheduling paused (ithaca drain): queued jobs wait for "
                    "`ithaca drain --undo`\n");
  }
  for (const v1::Device& d : n.devices()) {
    absl::StrAppend(
        &out,
        absl::StrFormat("  %d  %-20s %-12s %s\n", d.index(), d.uuid().empty() ? d.name() : d.uuid(),
                        HumanBytes(d.memory_bytes()), d.job_id().empty() ? "free" : d.job_id()));
  }
  absl::StrAppend(&out, "metrics: http://", n.metrics_address(), "/metrics\nstate: ", n.state_dir(),
                  "\n");
  return out;
}

}  // namespace ithaca
