#include "server/admission.h"

#include <sys/stat.h>

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
    if (!path->empty() && !Exists(*path)) {
      return Invalid(source, key, absl::StrCat(*path, ": no such file or directory"));
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
  const int64_t params = a.config.NumParameters();
  // Bytes per parameter: the working copy and its gradient at the compute precision, then the
  // f32 master + Adam m + v.
  const int64_t work = s.backend == "cpu" ? 4 : 2;
  const int64_t shards = s.parallel.fsdp ? world : 1;
  auto per_rank = [&](int64_t bytes_per_param) { return params * bytes_per_param / shards; };
  v1::MemoryPlan plan;
  plan.set_parameters(params);
  plan.set_world(static_cast<int32_t>(world));
  int64_t total = 0;
  for (auto [tier, bpp] :
       {std::pair<const char*, int64_t>{"params", work}, {"grads", work}, {"optimizer", 12}}) {
    v1::TierBytes* t = plan.add_per_rank();
    t->set_tier(tier);
    t->set_current_bytes(per_rank(bpp));
    t->set_peak_bytes(per_rank(bpp));
    total += per_rank(bpp);
  }
  plan.set_per_rank_bytes(total);
  int64_t budget = 0;
  if (s.backend == "cpu") {
    // CPU ranks share the host's memory.
    const double host = s.memory.host_budget_gib > 0 ? s.memory.host_budget_gib * kGiB
                                                     : double(node.host_memory_bytes);
    budget = static_cast<int64_t>(host / world);
    plan.set_budget_source(
        absl::StrCat(s.memory.host_budget_gib > 0 ? "memory.host_budget_gib" : "host memory", " / ",
                     world, " ranks"));
  } else {
    const int64_t device = node.devices.empty() ? 0 : node.devices[0].memory_bytes;
    budget =
        s.memory.gpu_budget_gib > 0 ? static_cast<int64_t>(s.memory.gpu_budget_gib * kGiB) : device;
    plan.set_budget_source(s.memory.gpu_budget_gib > 0 ? "memory.gpu_budget_gib" : "GPU memory");
  }
  plan.set_budget_bytes(budget);
  plan.set_fits(total <= budget);
  auto gib = [](int64_t b) {
    return b >= (int64_t{1} << 30) ? absl::StrFormat("%.2f GiB", b / kGiB)
                                   : absl::StrFormat("%.2f MiB", b / double(1 << 20));
  };
  plan.set_summary(absl::StrFormat(
      "%.4g M parameters x %d bytes (params %d + grads %d + optimizer 12)%s = %s per rank "
      "%s budget %s (%s); activations and attention not counted",
      params / 1e6, static_cast<int>(2 * work + 12), static_cast<int>(work), static_cast<int>(work),
      shards > 1 ? absl::StrCat(" / ", shards, " ranks (fsdp)").c_str() : "", gib(total),
      plan.fits() ? "<=" : ">", gib(budget), plan.budget_source().c_str()));
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
