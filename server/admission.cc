#include "engine/core/ranks_per_host.h"
#include "server/admission.h"

#include <dirent.h>
#include <sys/stat.h>

#include "absl/strings/match.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/plan/planner.h"
#include "engine/data/job_inputs.h"
#include "engine/data/token_file.h"
#include "engine/core/path_policy.h"
#include "engine/spec/validate.h"

namespace ithaca {
namespace {

absl::Status Invalid(const std::string& source, const std::string& key, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, ": ", msg));
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

// The model files of `dir` (what a job may read beside model.config or model.weights: shards,
// indexes, config and tokenizer files) must resolve inside the roots. Other entries are never
// read, and a home directory full of unrelated links must not fail a job.
absl::Status CheckModelDirectory(const std::string& source, const std::string& key,
                                 const std::string& dir, const std::vector<std::string>& roots) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::OkStatus();  // unreadable: nothing can be read from it either
  absl::Status inside;
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (!absl::EndsWith(name, ".safetensors") && !absl::EndsWith(name, ".json") &&
        name != "tokenizer.model") {
      continue;
    }
    inside = CheckAllowedPath(source, key, dir + "/" + name, roots);
    if (!inside.ok()) break;
  }
  closedir(d);
  return inside;
}

// Every path the spec reads or writes, checked against the allowed roots before any is opened
// (even stat or a glob would tell a client whether a file exists outside them).
absl::Status CheckSpecPaths(const JobSpec& s, const std::string& source,
                            const std::vector<std::string>& roots) {
  if (roots.empty()) return absl::OkStatus();
  // Relative inputs (no base_dir) are refused by the caller with their own message; a relative
  // checkpoint.dir is refused here (it would land wherever the worker's working directory is).
  auto relative = [](const std::string& p) { return !p.empty() && p[0] != '/'; };
  // data.path and eval.path: ExpandPattern checks each of their alternatives before it looks.
  for (auto [key, path] :
       {std::pair<const char*, const std::string*>{"model.config", &s.model.config},
        {"model.weights", &s.model.weights},
        {"init.from", &s.init.from},
        {"lora.init", &s.lora.init},
        {"checkpoint.dir", &s.checkpoint.dir}}) {
    if (path->empty() || (relative(*path) && path != &s.checkpoint.dir)) continue;
    RETURN_IF_ERROR(CheckAllowedPath(source, key, *path, roots));
  }
  // init.from's weights (a checkpoint's model/ or a model directory) are read as model.weights'.
  if (!s.init.from.empty() && !relative(s.init.from)) {
    absl::StatusOr<std::string> weights = InitWeightsDir(s.init.from);
    if (weights.ok()) {
      RETURN_IF_ERROR(CheckAllowedPath(source, "init.from", *weights, roots));
      RETURN_IF_ERROR(CheckModelDirectory(source, "init.from", *weights, roots));
    }
  }
  // The files read beside these paths (a weights directory's or an index's shards, the
  // tokenizer files beside model.config or model.weights) may be links out of the roots.
  for (auto [key, path] :
       {std::pair<const char*, const std::string*>{"model.weights", &s.model.weights},
        {"model.config", &s.model.config}}) {
    if (path->empty() || relative(*path)) continue;
    struct stat st;
    if (stat(path->c_str(), &st) != 0) continue;  // missing: refused by the caller
    RETURN_IF_ERROR(
        CheckModelDirectory(source, key, S_ISDIR(st.st_mode) ? *path : Dirname(*path), roots));
  }
  return absl::OkStatus();
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

SpecBase ChooseSpecBase(const std::string& client_dir, const std::string& daemon_dir,
                        const std::string& host) {
  SpecBase b;
  const std::string where = absl::StrCat("on the daemon's host (ithacad on ", host, ")");
  if (IsDirectory(client_dir) || (!client_dir.empty() && daemon_dir.empty())) {
    b.dir = client_dir;
    b.relative_note = absl::StrCat(" (looked for ", where, ", relative to the client's directory ",
                                   client_dir, ")");
  } else if (!daemon_dir.empty()) {
    b.dir = daemon_dir;
    b.relative_note = absl::StrCat(
        " (looked for ", where, ", relative to its state directory ", daemon_dir,
        client_dir.empty()
            ? std::string("")
            : absl::StrCat(": the client's directory ", client_dir, " does not exist there"),
        "; give a path on the daemon's host)");
  }
  b.absolute_note = absl::StrCat(" (looked for ", where, ")");
  return b;
}

std::string SpecSource(const std::string& source) { return source.empty() ? "job.toml" : source; }

absl::StatusOr<AdmittedSpec> ParseSubmission(
    const std::string& toml_text, const std::string& source_in, const std::string& base_dir,
    const Node& node, const std::string& daemon_dir, const std::vector<std::string>& allowed_roots,
    const std::function<bool()>& cancelled, const InitJobLookup& init_job, const PlanLimits& search,
    bool plan) {
  const std::string source = SpecSource(source_in);
  if (!base_dir.empty() && base_dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("base_dir: must be an absolute path, got \"", base_dir, "\""));
  }
  ASSIGN_OR_RETURN(JobSpec s, ParseJobSpec(toml_text, source));
  // init.from = "job:ID": that job's checkpoint.dir, whose newest checkpoint the job starts from.
  bool init_pending = false;  // a job whose checkpoints are still to come
  if (const std::string parent = InitFromJob(s.init.from); !parent.empty()) {
    if (!init_job) {
      return Invalid(
          source, "init.from",
          absl::StrCat("\"", s.init.from, "\" names a job, which only ithacad resolves"));
    }
    absl::StatusOr<InitJob> j = init_job(parent);
    if (!j.ok()) {
      return absl::Status(j.status().code(),
                          absl::StrCat(source, ": init.from: ", j.status().message()));
    }
    s.init.from = j->checkpoint_dir;
    init_pending = !j->ended;
  }
  const SpecBase base = ChooseSpecBase(base_dir, daemon_dir, node.hostname);
  // Every path is resolved and checked against the allowed roots before any is looked at.
  std::map<const std::string*, std::string> notes;  // where a missing file was looked for
  for (std::string* p : {&s.data.path, &s.eval.path, &s.model.config, &s.model.weights,
                         &s.checkpoint.dir, &s.init.from, &s.lora.init}) {
    if (p->empty()) continue;
    // The client may be on another machine: say which host looked where.
    notes[p] = (*p)[0] != '/' ? base.relative_note : base.absolute_note;
    absl::StatusOr<std::string> resolved = ResolvePattern(base.dir, *p);
    if (!resolved.ok())
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", resolved.status().message()));
    *p = *resolved;
  }
  RETURN_IF_ERROR(CheckSpecPaths(s, source, allowed_roots));
  for (auto [key, path] : {std::pair<const char*, std::string*>{"data.path", &s.data.path},
                           {"eval.path", &s.eval.path},
                           {"model.config", &s.model.config},
                           {"model.weights", &s.model.weights},
                           {"checkpoint.dir", &s.checkpoint.dir}}) {
    if (path->empty()) continue;
    const std::string& note = notes[path];
    if (path == &s.checkpoint.dir) continue;  // made by the job
    if (!PatternIsAbsolute(*path)) {
      return Invalid(source, key,
                     absl::StrCat("\"", *path,
                                  "\" is relative and the submission has no "
                                  "base_dir; give an absolute path"));
    }
    std::vector<std::string> files = {*path};
    if (path == &s.data.path || path == &s.eval.path) {
      // A pattern names several files: each alternative must match at least one, inside the
      // roots, within bounded work (engine/core/path_policy.h).
      ExpandLimits limits;
      limits.cancelled = cancelled;
      absl::StatusOr<std::vector<std::string>> expanded =
          ExpandPattern(*path, allowed_roots, limits);
      if (!expanded.ok()) {
        const absl::StatusCode code = expanded.status().code();
        const bool keep = code == absl::StatusCode::kPermissionDenied ||
                          code == absl::StatusCode::kResourceExhausted ||
                          code == absl::StatusCode::kCancelled ||
                          code == absl::StatusCode::kDeadlineExceeded;
        return absl::Status(keep ? code : absl::StatusCode::kInvalidArgument,
                            absl::StrCat(source, ": ", key, ": ", expanded.status().message(),
                                         code == absl::StatusCode::kNotFound ? note : ""));
      }
      files = *expanded;
    }
    // Inputs are regular files (weights may also be a directory of shards): a FIFO or a device
    // would hang or never end the worker that reads it.
    for (const std::string& file : files) {
      if ((path == &s.data.path || path == &s.eval.path) && !allowed_roots.empty()) {
        RETURN_IF_ERROR(CheckAllowedPath(source, key, file, allowed_roots));
      }
      struct stat st;
      if (stat(file.c_str(), &st) != 0) {
        return Invalid(source, key, absl::StrCat(file, ": no such file or directory", note));
      }
      const bool dir_ok = path == &s.model.weights && S_ISDIR(st.st_mode);
      if (!S_ISREG(st.st_mode) && !dir_ok) {
        return Invalid(
            source, key,
            absl::StrCat(file, ": not a regular file", S_ISFIFO(st.st_mode) ? " (a FIFO)" : "",
                         S_ISCHR(st.st_mode) ? " (a device)" : ""));
      }
    }
  }
  if (s.data.path.empty() && s.training.steps > 0) {
    return Invalid(source, "data.path", "is required");
  }
  if (!s.init.from.empty()) {
    if (!PatternIsAbsolute(s.init.from)) {
      return Invalid(source, "init.from",
                     absl::StrCat("\"", s.init.from,
                                  "\" is relative and the submission has no base_dir; give an "
                                  "absolute path"));
    }
    if (!init_pending) {
      absl::StatusOr<std::string> weights = InitWeightsDir(s.init.from);
      if (!weights.ok()) {
        std::string msg(weights.status().message());
        if (absl::StartsWith(msg, "init.from: ")) msg = msg.substr(11);
        return Invalid(source, "init.from",
                       absl::StrCat(msg, s.init.from[0] == '/' ? notes[&s.init.from] : ""));
      }
    }
    // A new phase starts a run of its own: its checkpoint.dir may hold none yet.
    absl::Status target = CheckInitTarget(s.checkpoint.dir, /*run_id=*/"");
    if (!target.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(source, ": ", target.message()));
    }
  }
  if (cancelled && cancelled()) return absl::CancelledError("the client went away");
  if (s.backend == "cuda" && !node.gpu) {
    return absl::FailedPreconditionError(
        "backend: \"cuda\" needs GPUs and this node has none (ithacad --gpus 0); use "
        "backend = \"cpu\"");
  }
  // A resubmitted finished run is refused here, before it takes a slot; the worker checks again
  // at start (a checkpoint written meanwhile by the job that was using the directory). A plan
  // is answered, warned that a submission would be refused.
  std::string submit_refused;
  if (!s.checkpoint.dir.empty() && s.checkpoint.resume && s.training.steps > 0) {
    absl::StatusOr<std::string> latest = LatestCheckpoint(s.checkpoint.dir);
    if (latest.ok()) {
      absl::StatusOr<TrainState> saved = ReadCheckpointState(*latest);
      if (saved.ok()) {
        absl::Status work =
            CheckResumeHasWork(s.checkpoint.dir, s.training.steps, *latest, *saved, /*run_id=*/"");
        if (!work.ok() && !plan) {
          return absl::FailedPreconditionError(absl::StrCat(source, ": ", work.message()));
        }
        if (!work.ok()) {
          submit_refused = absl::StrCat("`ithaca submit` would refuse this spec: ", work.message());
        }
      }
    }
  }
  // The node's slots before anything that depends on the world size (an eval set too small
  // for 100 ranks is not what is wrong with 100 ranks on 4 slots).
  RETURN_IF_ERROR(CheckSlots(s, node));
  // Planning costs daemon CPU in proportion to the model and the length: bounded in time, and
  // stopped when the client goes (issue 43 N3).
  PlanLimits limits;
  limits.deadline =
      search.deadline == absl::InfiniteFuture() ? absl::Now() + kMaxPlanTime : search.deadline;
  limits.cancelled = cancelled;
  limits.first_fit = search.first_fit;
  limits.fit_memo = search.fit_memo;
  absl::StatusOr<ResolvedJob> resolved = ResolveJob(s, NodeResourcesFor(node, s), limits);
  if (!resolved.ok()) {
    return absl::Status(resolved.status().code(),
                        absl::StrCat(source, ": ", resolved.status().message()));
  }
  AdmittedSpec a;
  static_cast<ResolvedJob&>(a) = *std::move(resolved);
  // A plain resume keeps the run's RoPE; another one is a new phase ([init] from).
  if (!a.spec.checkpoint.dir.empty() && a.spec.checkpoint.resume && a.spec.init.from.empty()) {
    absl::StatusOr<std::string> latest = LatestCheckpoint(a.spec.checkpoint.dir);
    if (latest.ok()) {
      absl::Status rope = CheckResumeRope(*latest, a.config);
      if (absl::IsFailedPrecondition(rope)) {
        return absl::FailedPreconditionError(absl::StrCat(source, ": ", rope.message()));
      }
    }
  }
  a.warnings = JobWarnings(a.spec, a.config);
  if (!submit_refused.empty()) a.warnings.insert(a.warnings.begin(), submit_refused);
  v1::JobSpecSummary& m = a.summary;
  m.set_name(a.spec.name);
  m.set_backend(a.spec.backend);
  m.set_model(a.spec.model.config.empty() ? a.spec.model.preset : a.spec.model.config);
  m.set_parameters(a.config.NumParameters());
  m.set_world(static_cast<int32_t>(a.spec.parallel.world));
  m.set_sp(static_cast<int32_t>(a.spec.parallel.sp));
  m.set_seq_len(a.spec.data.seq_len);
  m.set_steps(a.spec.training.steps);
  m.set_data_path(a.spec.data.path);
  m.set_checkpoint_dir(a.spec.checkpoint.dir);
  m.set_rope(absl::StrCat(DescribeModelRope(a.config),
                          a.spec.model.rope.set() ? " (from [model.rope])" : ""));
  m.set_max_position_embeddings(a.config.max_position_embeddings);
  m.set_init_from(a.spec.init.from);
  return a;
}

absl::Status CheckInputs(const AdmittedSpec& a, const std::string& source) {
  absl::StatusOr<std::vector<std::string>> inputs = CheckJobInputs(a.spec, a.config);
  if (!inputs.ok()) {
    return absl::Status(inputs.status().code(),
                        absl::StrCat(SpecSource(source), ": ", inputs.status().message()));
  }
  // init.from's weights, when they are there already (a job waited for writes them later): every
  // tensor the model needs, in its shape, as the workers will read them.
  if (!a.spec.init.from.empty()) {
    absl::StatusOr<std::string> weights = InitWeightsDir(a.spec.init.from);
    if (weights.ok()) {
      // The same model (its config.json beside the weights), then every tensor it needs.
      if (absl::Status same = CheckInitModel(*weights, a.config); !same.ok()) {
        return absl::Status(same.code(), absl::StrCat(SpecSource(source), ": ", same.message()));
      }
      absl::Status st = CheckWeights(*weights, a.config);
      if (!st.ok()) {
        std::string msg(st.message());
        if (absl::StartsWith(msg, "model.weights: ")) msg = msg.substr(15);
        return absl::Status(st.code(), absl::StrCat(SpecSource(source), ": init.from: ", msg));
      }
    }
  }
  return absl::OkStatus();
}

NodeResources NodeResourcesFor(const Node& node, const JobSpec& s) {
  NodeResources r;
  r.device_memory_bytes = node.gpu && !node.devices.empty() ? node.devices[0].memory_bytes : 0;
  r.host_memory_bytes = node.host_memory_bytes;
  r.ranks_on_host = RanksPerHost(s.parallel.world, s.slurm.nodes);
  if (node.gpu && !node.devices.empty()) r.gpu_name = node.devices[0].name;
  return r;
}

v1::MemoryPlan EstimateMemory(const AdmittedSpec& a) {
  const MemoryPlan& p = a.plan;
  v1::MemoryPlan plan;
  plan.set_parameters(a.config.NumParameters());
  plan.set_world(static_cast<int32_t>(a.spec.parallel.world));
  plan.set_budget_bytes(a.budgets.gpu_bytes);
  plan.set_budget_source(a.budgets.gpu_source);
  for (int i = 0; i < kNumTiers; ++i) {
    v1::TierBytes* t = plan.add_per_rank();
    t->set_tier(TierName(static_cast<Tier>(i)));
    t->set_current_bytes(p.peak[i]);
    t->set_peak_bytes(p.peak[i]);
  }
  plan.set_per_rank_bytes(p.device_total());
  plan.set_host_per_rank_bytes(p.host_total());
  plan.set_host_budget_bytes(p.host_budget);
  plan.set_fits(p.fits);
  plan.set_recompute(RecomputeSetting(p));
  plan.set_predicted_step_s(p.predicted.step_s);
  plan.set_predicted_tok_per_s(p.predicted.tok_per_s);
  plan.set_predicted_tok_per_s_per_gpu(
      p.predicted.tok_per_s / static_cast<double>(std::max<int64_t>(1, a.spec.parallel.world)));
  plan.set_rates(p.predicted.rates);
  plan.set_rates_note(p.predicted.rates_note);
  if (p.predicted.step_s > 0) {
    const StepPrediction& r = p.predicted;
    v1::MemoryPlan::PredictedTime* t = plan.mutable_predicted_time();
    t->set_forward_backward_s(r.forward_backward_s);
    t->set_samples(r.samples);
    t->set_update_s(r.update_s);
    t->set_gemm_s(r.gemm_s);
    t->set_attention_s(r.attention_s);
    t->set_elementwise_s(r.elementwise_s);
    t->set_transfer_s(r.transfer_s);
    t->set_collective_s(r.collective_s);
    t->set_waited_s(r.waited_s);
    t->set_forward_s(r.forward_s);
    t->set_regrow_s(r.regrow_s);
    t->set_recompute_s(r.recompute_s);
  }
  plan.set_summary(absl::StrFormat(
      "peak %s per rank %s budget %s (%s); sp %d = ulysses %d x ring %d, recompute %s, "
      "head_chunk %d, tile_tokens %d, offload %s%s%s",
      HumanBytes(p.device_total()).c_str(),
      p.gpu_budget > 0 && p.device_total() > p.gpu_budget ? ">" : "<=",
      HumanBytes(a.budgets.gpu_bytes).c_str(), plan.budget_source().c_str(),
      static_cast<int>(a.spec.parallel.sp),
      static_cast<int>(a.spec.parallel.sp / std::max<int64_t>(1, a.spec.parallel.ring)),
      static_cast<int>(std::max<int64_t>(1, a.spec.parallel.ring)), plan.recompute().c_str(),
      p.head_chunk, p.tile_tokens, OffloadSetting(p.offload, p.offload_keep_last).c_str(),
      p.fits && p.predicted.step_s > 0
          ? absl::StrCat("; ", PredictionLine(p, a.spec.parallel.world)).c_str()
          : "",
      p.fits ? "" : absl::StrCat("; ", p.verdict).c_str()));
  return plan;
}

absl::Status CheckSlots(const JobSpec& s, const Node& node) {
  // Across Slurm nodes (slurm.nodes), each node runs world / nodes ranks; `node` describes one.
  const int64_t per_node = RanksPerHost(s.parallel.world, s.slurm.nodes);
  if (per_node > node.slots()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "parallel.world: the job needs ", per_node, " ranks",
        s.slurm.nodes > 1 ? absl::StrCat(" on each of its ", s.slurm.nodes, " nodes") : "", "; ",
        absl::StartsWith(node.hostname, "--hardware") ? node.hostname : "this node", " has ",
        node.slots(), node.gpu ? " GPUs" : " CPU slots (ithacad --cpu-slots)"));
  }
  return absl::OkStatus();
}

absl::Status CheckFits(const AdmittedSpec& a, const Node& node) {
  RETURN_IF_ERROR(CheckSlots(a.spec, node));
  v1::MemoryPlan plan = EstimateMemory(a);
  if (!plan.fits()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model does not fit in memory: ", plan.summary()));
  }
  return absl::OkStatus();
}

}  // namespace ithaca
