#include "server/admission.h"

#include <sys/stat.h>

#include "engine/parallel/head_plan.h"
#include "engine/plan/planner.h"
#include "engine/train/token_file.h"
#include "engine/train/trainer.h"

namespace ithaca {
namespace {

constexpr double kGiB = double(int64_t{1} << 30);

std::string ResolvePath(const std::string& dir, const std::string& p) {
  if (p.empty() || p[0] == '/' || dir.empty()) return p;
  return absl::StrCat(dir, dir.back() == '/' ? "" : "/", p);
}

absl::Status Invalid(const std::string& source, const std::string& key, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, ": ", msg));
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

absl::StatusOr<AdmittedSpec> ParseSubmission(const std::string& toml_text,
                                             const std::string& source_in,
                                             const std::string& base_dir) {
  const std::string source = source_in.empty() ? "job.toml" : source_in;
  if (!base_dir.empty() && base_dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("base_dir: must be an absolute path, got \"", base_dir, "\""));
  }
  AdmittedSpec a;
  ASSIGN_OR_RETURN(a.spec, ParseJobSpec(toml_text, source));
  JobSpec& s = a.spec;
  for (std::string* p : {&s.data.path, &s.model.config, &s.model.weights, &s.checkpoint.dir}) {
    *p = ResolvePath(base_dir, *p);
  }
  for (auto [key, path] : {std::pair<const char*, std::string*>{"data.path", &s.data.path},
                           {"model.config", &s.model.config},
                           {"model.weights", &s.model.weights}}) {
    if (!path->empty() && (*path)[0] != '/') {
      return Invalid(source, key,
                     absl::StrCat("\"", *path,
                                  "\" is relative and the submission has no "
                                  "base_dir; give an absolute path"));
    }
    std::string first = *path;
    if (path == &s.data.path && !path->empty()) {
      // A glob names several files: it must match at least one.
      absl::StatusOr<std::vector<std::string>> files = ExpandDataPath(*path);
      if (!files.ok()) return Invalid(source, key, std::string(files.status().message()));
      first = files->front();
    }
    if (!first.empty() && !Exists(first)) {
      return Invalid(source, key, absl::StrCat(first, ": no such file or directory"));
    }
  }
  if (s.data.path.empty()) return Invalid(source, "data.path", "is required");
  absl::StatusOr<LlamaConfig> cfg = ResolveModelConfig(s);
  if (!cfg.ok()) {
    return Invalid(source, s.model.config.empty() ? "model.preset" : "model.config",
                   std::string(cfg.status().message()));
  }
  a.config = *cfg;
  const int64_t sp = s.parallel.sp;
  if (a.config.num_attention_heads % sp != 0) {
    return Invalid(source, "parallel.sp",
                   absl::StrCat("must divide the model's num_attention_heads (",
                                a.config.num_attention_heads, "), got ", sp));
  }
  if (absl::StatusOr<HeadPlan> heads = MakeHeadPlan(a.config, sp, s.memory.head_chunk);
      !heads.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", heads.status().message()));
  }
  if (s.data.seq_len % sp != 0) {
    return Invalid(
        source, "data.seq_len",
        absl::StrCat("must be divisible by parallel.sp (", sp, "), got ", s.data.seq_len));
  }
  a.toml = JobSpecToToml(s);
  v1::JobSpecSummary& m = a.summary;
  m.set_name(s.name);
  m.set_backend(s.backend);
  m.set_model(s.model.config.empty() ? s.model.preset : s.model.config);
  m.set_parameters(a.config.NumParameters());
  m.set_world(static_cast<int32_t>(s.parallel.world));
  m.set_sp(static_cast<int32_t>(sp));
  m.set_seq_len(s.data.seq_len);
  m.set_steps(s.training.steps);
  m.set_data_path(s.data.path);
  m.set_checkpoint_dir(s.checkpoint.dir);
  return a;
}

v1::MemoryPlan EstimateMemory(const AdmittedSpec& a, const Node& node) {
  const JobSpec& s = a.spec;
  const int64_t world = s.parallel.world;
  v1::MemoryPlan plan;
  plan.set_parameters(a.config.NumParameters());
  plan.set_world(static_cast<int32_t>(world));
  int64_t device_budget = 0, host_budget = 0;
  if (s.backend == "cpu") {
    // CPU ranks share the host's memory: each rank's "device" is its share of it.
    const double host = s.memory.host_budget_gib > 0 ? s.memory.host_budget_gib * kGiB
                                                     : double(node.host_memory_bytes);
    device_budget = static_cast<int64_t>(host / world);
    plan.set_budget_source(
        absl::StrCat(s.memory.host_budget_gib > 0 ? "memory.host_budget_gib" : "host memory", " / ",
                     world, " ranks"));
  } else {
    const int64_t device = node.devices.empty() ? 0 : node.devices[0].memory_bytes;
    device_budget =
        s.memory.gpu_budget_gib > 0 ? static_cast<int64_t>(s.memory.gpu_budget_gib * kGiB) : device;
    host_budget =
        static_cast<int64_t>((s.memory.host_budget_gib > 0 ? s.memory.host_budget_gib * kGiB
                                                           : double(node.host_memory_bytes)) /
                             world);
    plan.set_budget_source(s.memory.gpu_budget_gib > 0 ? "memory.gpu_budget_gib" : "GPU memory");
  }
  plan.set_budget_bytes(device_budget);
  // The engine's planner replays one step of the real schedule (engine/plan/planner.h).
  absl::StatusOr<MemoryPlan> p = PlanJob(s, device_budget, host_budget);
  if (!p.ok()) {
    plan.set_fits(false);
    plan.set_summary(absl::StrCat("cannot plan: ", p.status().message()));
    return plan;
  }
  for (int i = 0; i < kNumTiers; ++i) {
    v1::TierBytes* t = plan.add_per_rank();
    t->set_tier(TierName(static_cast<Tier>(i)));
    t->set_current_bytes(p->peak[i]);
    t->set_peak_bytes(p->peak[i]);
  }
  plan.set_per_rank_bytes(p->device_total());
  plan.set_fits(p->fits);
  plan.set_summary(absl::StrFormat(
      "peak %s per rank %s budget %s (%s); head_chunk %d, tile_tokens %d, offload %s%s",
      HumanBytes(p->device_total()).c_str(), p->fits ? "<=" : ">",
      HumanBytes(device_budget).c_str(), plan.budget_source().c_str(), p->head_chunk,
      p->tile_tokens, p->offload ? "on" : "off",
      p->fits ? "" : absl::StrCat("; ", p->verdict).c_str()));
  return plan;
}

absl::Status CheckFits(const AdmittedSpec& a, const Node& node) {
  const JobSpec& s = a.spec;
  if (s.backend == "cuda" && !node.gpu) {
    return absl::FailedPreconditionError(
        "backend: \"cuda\" needs GPUs and this node has none (ithacad --gpus 0); use "
        "backend = \"cpu\"");
  }
  if (s.parallel.world > node.slots()) {
    return absl::FailedPreconditionError(
        absl::StrCat("parallel.world: the job needs ", s.parallel.world, " ranks; this node has ",
                     node.slots(), node.gpu ? " GPUs" : " CPU slots (ithacad --cpu-slots)"));
  }
  v1::MemoryPlan plan = EstimateMemory(a, node);
  if (!plan.fits()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model does not fit in memory: ", plan.summary()));
  }
  return absl::OkStatus();
}

}  // namespace ithaca
