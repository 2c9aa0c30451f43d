// A finished (or running) job's history, for people and for scripts:
//   ithaca logs JOB --steps     every persisted step and eval report, one JSON object per line
//   ithaca report JOB [--out F] a self-contained HTML page (inline SVG plots: loss and eval loss,
//                               tokens/s, step time, memory per tier per rank; the resolved spec,
//                               the memory plan and the state history)
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/commands.h"
#include "ithaca/v1/job.pb.h"

namespace ithaca {

int StepsCommand(CliContext& c, const std::string& id);
// Writes the page to `out` ("" means JOB.html in the current directory).
int ReportCommand(CliContext& c, const std::string& id, const std::string& out);

// One line of a chart: (x, y) points in order.
struct ChartSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;
  bool markers = false;  // dots at each point (sparse series such as evaluations)
  bool sparse = false;   // sampled (every Nth step): dots at each point, a dotted line between
};

// An inline <svg> line chart with axes, ticks and a legend. Every series is one <polyline>
// with data-series="name" and one point per input point (in order); non-finite points are
// dropped.
std::string SvgLineChart(const std::string& title, const std::string& x_label,
                         const std::string& y_label, const std::vector<ChartSeries>& series);

// The passkey eval's points of one evaluation as the needle-in-a-haystack picture: an inline
// <svg id="passkey"> with a cell per (length, depth) (x: length, y: depth, colour: accuracy from
// red 0 through yellow to green 1), each a rect with data-length, data-depth, data-accuracy and
// data-logprob.
// The points of one key count (eval.passkey.keys): id "passkey" for the passkey test,
// "passkey-K-keys" and a multi-key title for K keys.
std::string SvgPasskeyHeatmap(const v1::EvalReport& r);

// An earlier phase of a job's chain: the job whose checkpoint.dir the next phase's [init] from
// named, and its history (with its own earlier attempts).
struct ReportPhase {
  v1::Job job;
  std::vector<v1::JobEvent> history;
};

// The whole page. `plan` is the daemon's memory plan for the job's resolved spec, absent when it
// could not be made (`plan_error` says why). `earlier_jobs`: the jobs whose steps
// AddEarlierAttempts put before this job's in `history`, oldest first. `chain`: the earlier
// phases (AddChainPhases), oldest first; with any, the page has a "Chain" table (each phase's
// length, steps, last train and eval loss) and the "Loss across the chain" chart: each phase's
// train and eval loss, its steps counted on from the end of the phase before.
std::string RenderReportHtml(const v1::Job& job, const std::vector<v1::JobEvent>& history,
                             const std::optional<v1::PlanJobResponse>& plan,
                             const std::string& plan_error,
                             const std::vector<std::string>& earlier_jobs = {},
                             const std::vector<ReportPhase>& chain = {});

// A job that resumed another's checkpoint (the same checkpoint.dir, submitted earlier) trained
// only the rest of the run: puts the earlier jobs' steps and evaluations before its first step
// at the front of `history` (each one up to where the next attempt took over) and names those
// jobs in `earlier`. 0, or the exit code after an RPC error.
int AddEarlierAttempts(CliContext& c, const v1::Job& job, std::vector<v1::JobEvent>* history,
                       std::vector<std::string>* earlier);

// A new phase ([init] from an earlier run's checkpoint.dir, Job.spec.init_from) continues a
// chain: puts the job whose checkpoint.dir that is (the newest submitted before this one; its
// checkpoint when init.from names one inside it), the phase before that, and so on, into
// `chain`, oldest first, each with its history. 0, or the exit code after an RPC error.
int AddChainPhases(CliContext& c, const v1::Job& job, std::vector<ReportPhase>* chain);

}  // namespace ithaca
