// What the CLI prints: byte sizes, durations, the live progress line, the per-tier memory table,
// job lines and details. Pure functions of the API's messages, so they are unit-tested.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ithaca/v1/job.pb.h"

namespace ithaca {

// Text from the daemon made safe for a terminal: control characters (ESC, CR, backspace, ...)
// and DEL are shown as \xNN, so a job name or a log line cannot move the cursor or recolour
// the screen; `keep_newlines` keeps \n and \t (log lines). Longer than `max_bytes` (0: no
// limit): cut, with how much was left out.
std::string Printable(const std::string& s, bool keep_newlines = false, size_t max_bytes = 0);

std::string HumanBytes(int64_t bytes);      // "2.9 MiB", "15.4 GiB", "512 B"
std::string HumanDuration(double seconds);  // "0:07", "12:03", "3:02:11"
std::string HumanRate(double per_second);   // "472.5", "12.4k", "1.2M"
std::string StateName(v1::JobState s);      // "RUNNING"
std::string HumanAge(absl::Duration d);     // kubectl's AGE: "45s", "12m", "5h", "3d"

// "step 12/60 | loss 3.2140 | 12.4k tok/s/rank | mem 2.9 MiB | ETA 0:07"; `eta_seconds` < 0
// leaves ETA out.
std::string ProgressLine(const v1::StepReport& r, double eta_seconds);

// "eval step 20: loss 3.1234 (ppl 22.7) over 65536 tokens, 8 batches, 1.20 s": the worker's own
// eval line; with passkey points "... | passkey accuracy 1.00 at 4096 tokens", and with only
// those "eval step 20: passkey accuracy 1.00 at 4096, 0.50 at 8192 tokens, 3.10 s".
std::string EvalLine(const v1::EvalReport& r);
// The passkey eval's accuracy per length, over its depths:
// "passkey accuracy 1.00 at 4096, 0.75 at 8192 tokens", and per multi-key count
// (eval.passkey.keys) "; 4-key accuracy 0.50 at 4096 tokens".
std::string PasskeySummary(const v1::EvalReport& r);
// One line per key count and length: "4096 tokens: depth 0 1.00 (logprob -0.012), depth 0.5 0.75
// (...)", a multi-key line "4096 tokens, 4 keys: ...".
std::vector<std::string> PasskeyTable(const v1::EvalReport& r);
// eval.position_buckets: "by position: [0, 1024) 3.2100, [1024, 4096) 2.9800 (1024, 3072
// tokens)"; empty without buckets.
std::string PositionLine(const v1::EvalReport& r);

// One row per tier, one column per rank: peak bytes during the newest step; a total row (the
// device tiers' sum) at the bottom.
std::string MemoryTable(const v1::Job& job);

// `ithaca list`: a header and one row per job, columns aligned: ID NAME STATE STEP LOSS AGE
// DURATION REASON (whole: the last column); `wide` adds WORLD BACKEND MODEL SLOTS.
// AGE counts from submission, DURATION from the first start to the end (or `now`).
std::string JobTable(const std::vector<v1::Job>& jobs, bool wide, absl::Time now);
// The multi-line `ithaca status` view: state and reason, spec, newest step and evaluation,
// transitions, memory,
// and the resolved spec the workers run.
std::string JobDetails(const v1::Job& job);
// "45 s", "12 min", "3.5 h", "4.2 days": a predicted run's length.
std::string RunTime(double seconds);
// `ithaca plan`: each tier against its budget, the predicted step and the run's time.
std::string PlanText(const v1::PlanJobResponse& plan);
// `ithaca plan SPEC --then SPEC2 ...`, after each phase's PlanText: the chain's whole run (each
// phase's predicted step times its training.steps, summed) and a line per phase:
//   chain of 3 phases: 5.2 h in all for their training.steps; every phase fits
//     phase 1 (phase1.toml): 2.0 h, 1000 steps of 7.2 s at data.seq_len 8192
// A phase without a prediction is named, and the sum is of the others ("at least").
std::string ChainPlanText(const std::vector<std::string>& sources,
                          const std::vector<v1::PlanJobResponse>& plans);
// The predicted phases' run seconds, summed.
double ChainRunSeconds(const std::vector<v1::PlanJobResponse>& plans);
// `ithaca node`.
std::string NodeText(const v1::NodeInfo& node);

}  // namespace ithaca
