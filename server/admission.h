// Admission: what ithacad checks before it queues a job, so a bad job fails at submit with the
// key that is wrong (INVALID_ARGUMENT) or the numbers that do not fit (FAILED_PRECONDITION),
// never later on a worker.
//
// A job is resolved here, once (engine/plan/resolve.h ResolveJob): the budget rule
// (engine/plan/budgets.h) applied to this node, the planner's per-rank peak per tier for the
// settings it chose for every "auto", and the job is admitted only if that peak fits. The
// resolved TOML is what the job store keeps, `ithaca status` shows and the workers run as it is,
// also after a daemon restart.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/plan/budgets.h"
#include "engine/plan/resolve.h"
#include "ithaca/v1/job.pb.h"
#include "server/node.h"

namespace ithaca {

// The resolved job (spec paths absolute; toml: what the workers receive) and its summary.
struct AdmittedSpec : ResolvedJob {
  v1::JobSpecSummary summary;
  // What the job is warned of at submit (engine/spec/validate.h JobWarnings): not errors.
  std::vector<std::string> warnings;
};

// init.from = "job:ID": that job as admission needs it. ithacad answers from its job store
// (Jobs::Admit): NOT_FOUND for an unknown job, FAILED_PRECONDITION for one without a
// checkpoint.dir or one that has not ended when the submission does not wait for it (--after).
struct InitJob {
  std::string checkpoint_dir;  // absolute, as admitted
  bool ended = false;          // false: its checkpoints are still to come
};
using InitJobLookup = std::function<absl::StatusOr<InitJob>(const std::string& job_id)>;

// Where a submission's relative paths resolve. Files are opened by the workers, on the daemon's
// host, so that is where paths must exist: relative ones against the client's directory
// (`base_dir` of the request: the spec file's directory) when that directory exists on this host
// (the CLI on the same machine, or a shared file system), else against `daemon_dir` (ithacad's
// state directory: a pod's volume). The notes say which host looked where, for errors.
struct SpecBase {
  std::string dir;  // "" when neither is known: relative paths are refused
  std::string
      relative_note;  // " (looked for on the daemon's host (ithacad on H), relative to ...)"
  std::string absolute_note;  // " (looked for on the daemon's host (ithacad on H))"
};
SpecBase ChooseSpecBase(const std::string& client_dir, const std::string& daemon_dir,
                        const std::string& host);

// The name a submitted spec goes by in errors: `source`, or "job.toml" when the client sent none.
std::string SpecSource(const std::string& source);

// Parses, validates and resolves a submitted spec against `node`; relative paths resolve as
// ChooseSpecBase(base_dir, daemon_dir) says. INVALID_ARGUMENT naming the key for anything wrong
// in the spec itself (unknown key, bad value, heads not divisible by sp, missing data file, with
// where it was looked for); FAILED_PRECONDITION naming `backend` when the node has no GPU for a
// CUDA job. With `allowed_roots` (real paths, engine/core/path_policy.h), PERMISSION_DENIED naming
// the key for a path that resolves outside them; empty: any path. Expanding data.path is bounded
// (ExpandPattern's limits: RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED) and polls `cancelled` (the
// RPC's client went away: CANCELLED), so abandoned admissions free their slot.
// init.from: "job:ID" becomes that job's checkpoint.dir (`init_job`; without it refused); a path
// obeys the roots as model.weights does and must hold weights now (InitWeightsDir), unless it is
// a job's whose checkpoints are still to come. A new phase's checkpoint.dir must hold no run
// (CheckInitTarget), and a plain resume must keep the checkpoint's RoPE (CheckResumeRope).
// `search`: its first_fit and fit_memo are the plan's (PlanJobRequest.fit_only), its deadline
// the daemon's bound (infinite: kMaxPlanTime from now); cancellation is admission's own. `plan`:
// the spec is planned, not submitted (PlanJob): a plan is a memory question and is answered where a
// submission would be refused for the state of its checkpoint.dir (a finished run), with a warning
// that says so.
absl::StatusOr<AdmittedSpec> ParseSubmission(const std::string& toml_text,
                                             const std::string& source, const std::string& base_dir,
                                             const Node& node, const std::string& daemon_dir = "",
                                             const std::vector<std::string>& allowed_roots = {},
                                             const std::function<bool()>& cancelled = nullptr,
                                             const InitJobLookup& init_job = nullptr,
                                             const PlanLimits& search = {}, bool plan = false);

// The job's data, evaluation data and weights (model.weights, and init.from's when they exist)
// opened and checked against its model as the workers will (engine/data/job_inputs.h), so that a
// job they would refuse is refused before it takes a slot; errors start with `source`. SubmitJob
// runs it; PlanJob, which answers what a job would take (also for data.seq_len values the data does
// not hold yet), does not.
absl::Status CheckInputs(const AdmittedSpec& admitted, const std::string& source);

// One node as the budget rule sees it for the job `s`: the ranks sharing its host are
// parallel.world / slurm.nodes (a 2-node Slurm job's rank shares its host with half the ranks,
// as the workers' own rule, engine/runtime/rank.h RankNode, counts them).
NodeResources NodeResourcesFor(const Node& node, const JobSpec& s);

// The resolved job's per-rank peak per tier against its budget.
v1::MemoryPlan EstimateMemory(const AdmittedSpec& admitted);

// The most daemon time one submission's planning may take by default (DEADLINE_EXCEEDED naming
// the job's length and model past it); ithacad --max-plan-seconds raises it.
inline constexpr absl::Duration kMaxPlanTime = absl::Seconds(30);

// FAILED_PRECONDITION when one node cannot hold the job's ranks on it (world / slurm.nodes >
// its slots). ParseSubmission checks it before resolving (for PlanJob too).
absl::Status CheckSlots(const JobSpec& s, const Node& node);

// FAILED_PRECONDITION when the node cannot run the job: world > slots, or the plan does not fit
// (the message carries the plan's numbers).
absl::Status CheckFits(const AdmittedSpec& admitted, const Node& node);

}  // namespace ithaca
