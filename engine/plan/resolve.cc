#include "engine/plan/resolve.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "engine/backend/attention_choice.h"
#include "engine/plan/planner.h"
#include "engine/spec/validate.h"
#include "engine/core/units.h"

namespace ithaca {
namespace {

// The step-time model's view of the node: its GPUs' rates.
PlanHardware HardwareOf(const NodeResources& node) {
  PlanHardware h;
  h.gpu_name = node.gpu_name;
  return h;
}

// A job that does not fit: the first of a few changes that makes it fit, as "; it fits with
// ...", or "" when none does (or the planning takes too long). The changes are tried in order,
// the smallest first: the keys the user set to how block data is kept, the optimizer's state
// and the working copy on the host, full recompute, fewer saved inputs, a wider Ulysses group
// on the same ranks, more ranks, a shorter sequence. Each try is one first-fit PlanJob (whether
// anything fits, PlanLimits::first_fit), so a big model's tries take seconds, not the full
// search's minutes; together they take at most 20 s, within the plan's own bound.
std::string FitSuggestion(const JobSpec& spec, const LlamaConfig& cfg, const NodeResources& node,
                          const PlanLimits& limits) {
  constexpr absl::Duration kMaxTime = absl::Seconds(20);
  struct Try {
    std::string what;
    std::function<void(JobSpec*)> change;
  };
  std::vector<Try> tries;
  const JobSpec::Memory& m = spec.memory;
  // How block data is kept, where the user set it: "auto" lets the planner offload, save fewer
  // inputs and give up overlap to fit.
  std::vector<std::string> kept;
  if (m.offload != OffloadChoice::kAuto) kept.push_back("memory.offload");
  if (m.prefetch != OffloadChoice::kAuto) kept.push_back("memory.prefetch");
  if (m.overlap != OffloadChoice::kAuto) kept.push_back("memory.overlap");
  if (m.recompute_interval > 0) kept.push_back("memory.recompute_interval");
  if (!kept.empty()) {
    tries.push_back({absl::StrCat(absl::StrJoin(kept, ", "),
                                  " = \"auto\" (the planner keeps block "
                                  "data as fits: offloaded, fewer inputs saved, no overlap)"),
                     [](JobSpec* t) {
                       t->memory.offload = t->memory.prefetch = t->memory.overlap =
                           OffloadChoice::kAuto;
                       t->memory.recompute_interval = 0;
                     }});
  }
  if (m.optimizer_offload == OffloadChoice::kOff) {
    tries.push_back({"memory.optimizer_offload = \"auto\" (the optimizer's state on the host)",
                     [](JobSpec* t) { t->memory.optimizer_offload = OffloadChoice::kAuto; }});
  }
  if (m.param_offload == OffloadChoice::kOff) {
    tries.push_back(
        {"memory.optimizer_offload and memory.param_offload = \"auto\" (the "
         "optimizer's state and the working copy on the host)",
         [](JobSpec* t) {
           if (t->memory.optimizer_offload == OffloadChoice::kOff) {
             t->memory.optimizer_offload = OffloadChoice::kAuto;
           }
           t->memory.param_offload = OffloadChoice::kAuto;
         }});
  }
  // ("auto" planned full recompute already.)
  if (m.recompute != RecomputePolicy::kFull && m.recompute != RecomputePolicy::kAuto) {
    tries.push_back({"memory.recompute = \"full\"",
                     [](JobSpec* t) { t->memory.recompute = RecomputePolicy::kFull; }});
  }
  if (m.saved_block_inputs == 0 || m.saved_block_inputs > 2) {
    tries.push_back({"memory.saved_block_inputs = 2 (at most two block inputs held)",
                     [](JobSpec* t) { t->memory.saved_block_inputs = 2; }});
  }
  // A wider Ulysses group on the same ranks: each holds a smaller share of the sequence.
  for (int64_t k : {2, 4, 8}) {
    const int64_t sp = spec.parallel.sp * k;
    if (sp > spec.parallel.world || spec.parallel.world % sp != 0) break;
    tries.push_back(
        {absl::StrCat("parallel.sp = ", sp, " (the same ", spec.parallel.world, " ranks)"),
         [sp](JobSpec* t) { t->parallel.sp = sp; }});
  }
  for (int64_t k : {2, 4, 8}) {
    const int64_t world = spec.parallel.world * k, sp = spec.parallel.sp * k;
    tries.push_back(
        {absl::StrCat("parallel.world = ", world, ", parallel.sp = ", sp, " (", world, " ranks)"),
         [world, sp](JobSpec* t) {
           t->parallel.world = world;
           t->parallel.sp = sp;
         }});
  }
  // A shorter sequence, on these ranks as they are.
  for (int64_t k : {2, 4, 8}) {
    const int64_t len = spec.data.seq_len / k / 1024 * 1024;
    if (len < 1024) break;
    tries.push_back({absl::StrCat("data.seq_len = ", len,
                                  " (`ithaca plan --max-seq-len` finds the longest that fits)"),
                     [len](JobSpec* t) { t->data.seq_len = len; }});
  }
  const absl::Time deadline = std::min(absl::Now() + kMaxTime, limits.deadline);
  PlanLimits bounded = limits;
  bounded.deadline = deadline;
  bounded.first_fit = true;
  bounded.fit_memo = nullptr;
  for (const Try& t : tries) {
    if (absl::Now() > deadline) break;
    JobSpec changed = spec;
    t.change(&changed);
    if (!ValidateJob(changed, cfg).ok()) continue;  // e.g. more ranks than heads
    const RankBudgets b = BudgetsFor(changed, node);
    absl::StatusOr<MemoryPlan> plan =
        PlanJob(changed, b.gpu_bytes, b.host_bytes, bounded, HardwareOf(node));
    if (plan.ok() && plan->fits) return absl::StrCat("; it fits with ", t.what);
  }
  return "";
}

}  // namespace

absl::StatusOr<ResolvedJob> ResolveJob(const JobSpec& spec, const NodeResources& node,
                                       const PlanLimits& limits) {
  ResolvedJob job;
  absl::StatusOr<LlamaConfig> cfg = ResolveModelConfig(spec);
  if (!cfg.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.model.config.empty() ? "model.preset: " : "model.config: ", cfg.status().message()));
  }
  job.config = *cfg;
  RETURN_IF_ERROR(ValidateJob(spec, job.config));

  JobSpec& s = job.spec;
  s = spec;
  if (s.model.dtype == "auto") s.model.dtype = BackendDtype(s.backend);
  job.budgets = BudgetsFor(spec, node);
  if (job.budgets.gpu_bytes <= 0) {
    return absl::FailedPreconditionError(
        "memory.gpu_budget_gib: the node's GPU memory is unknown (no GPU found); set the budget "
        "to plan for one");
  }
  if (job.budgets.host_bytes <= 0) {
    return absl::FailedPreconditionError(
        "memory.host_budget_gib: the node's host memory is unknown; set the budget");
  }
  // Whole bytes over a power of two: the GiB figures read back to the same bytes exactly, which
  // is what makes resolving a resolved spec a no-op.
  s.memory.gpu_budget_gib = job.budgets.gpu_bytes / kGiB;
  s.memory.host_budget_gib = job.budgets.host_bytes / kGiB;
  // parallel.ring "auto": the widest Ulysses group the heads allow, or, when its plan does not
  // fit, the first wider ring whose plan does (a ring of r holds 1/r of the sample's chunk per
  // stage: Llama-3-8B at 32M on 64 ranks needs 155 GiB a rank as 32 x 2, 71 GiB as 8 x 8).
  const bool auto_ring = s.parallel.ring == 0;
  std::vector<int64_t> rings = {s.parallel.ring};
  if (auto_ring) rings = ValidRings(job.config, s.parallel.sp, s.memory.head_chunk);
  absl::StatusOr<MemoryPlan> plan = absl::InternalError("no ring to plan");
  for (size_t i = 0; i < rings.size(); ++i) {
    JobSpec with_ring = s;
    with_ring.parallel.ring = rings[i];
    absl::StatusOr<MemoryPlan> p =
        PlanJob(with_ring, job.budgets.gpu_bytes, job.budgets.host_bytes, limits, HardwareOf(node));
    if (i == 0 || (p.ok() && p->fits)) {
      plan = std::move(p);
      s.parallel.ring = auto_ring ? rings[i] : s.parallel.ring;
    }
    if (!plan.ok() || plan->fits || limits.first_fit) break;
  }
  if (absl::IsDeadlineExceeded(plan.status()) || absl::IsCancelled(plan.status())) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("planning data.seq_len = ", s.data.seq_len, " for ",
                                     s.model.config.empty() ? s.model.preset : s.model.config, ": ",
                                     plan.status().message()));
  }
  RETURN_IF_ERROR(plan.status());
  job.plan = *plan;
  if (!job.plan.fits && !limits.first_fit) {
    job.plan.verdict += FitSuggestion(s, job.config, node, limits);
  }
  s.memory.head_chunk = job.plan.head_chunk;
  ASSIGN_OR_RETURN(s.parallel.ring,
                   RingFor(job.config, s.parallel.sp, s.parallel.ring, s.memory.head_chunk));
  // (The ring the plan was made for; "auto" became it above.)
  s.memory.tile_tokens = job.plan.tile_tokens;
  s.memory.offload = job.plan.offload ? OffloadChoice::kOn : OffloadChoice::kOff;
  s.memory.offload_keep_last = job.plan.offload_keep_last;
  s.memory.prefetch = job.plan.prefetch ? OffloadChoice::kOn : OffloadChoice::kOff;
  s.memory.overlap = job.plan.overlap ? OffloadChoice::kOn : OffloadChoice::kOff;
  s.memory.recompute_interval = job.plan.recompute_interval;
  s.memory.saved_block_inputs = job.plan.saved_block_inputs;
  s.memory.recompute = job.plan.recompute;
  s.memory.attention_aware_blocks = job.plan.attention_aware_blocks;
  if (s.backend == "cuda") {  // the kernel each attention pass runs, for the job's shapes
    const std::vector<AttentionShape> shapes =
        ModelAttentionShapes(job.config, s.data.seq_len, s.data.document_mask);
    for (auto [pass, kernel] :
         {std::pair{AttentionPass::kForward, &s.kernels.attention_forward},
          std::pair{AttentionPass::kBackward, &s.kernels.attention_backward}}) {
      ASSIGN_OR_RETURN(AttentionKernel asked, ParseAttentionKernel(*kernel));
      // One kernel runs every layer's pass. With full and windowed layers (Qwen2/Qwen3's window
      // from max_window_layers on), "auto" takes the first shape's choice that the other shape
      // can run too, the full layers' first.
      std::vector<AttentionKernel> candidates;
      for (const AttentionShape& shape : shapes) {
        candidates.push_back(ChooseAttention(pass, shape, asked).kernel);
      }
      std::string refused;
      for (AttentionKernel chosen : candidates) {
        refused.clear();
        for (const AttentionShape& shape : shapes) {
          if (const char* why = AttentionKernelRefuses(chosen, pass, shape)) {
            refused = absl::StrCat(pass == AttentionPass::kForward ? "kernels.attention_forward"
                                                                   : "kernels.attention_backward",
                                   ": \"", AttentionKernelName(chosen), "\"",
                                   asked == AttentionKernel::kAuto ? " (auto)" : "",
                                   " cannot run the model's sliding_window of ", shape.window,
                                   " keys at head_dim ", shape.head_dim, ": ", why);
            break;
          }
        }
        if (refused.empty()) {
          *kernel = AttentionKernelName(chosen);
          break;
        }
      }
      if (!refused.empty()) return absl::InvalidArgumentError(refused);
    }
  }
  s.memory.optimizer_offload =
      job.plan.optimizer_offload ? OffloadChoice::kOn : OffloadChoice::kOff;
  s.memory.param_offload = job.plan.param_offload ? OffloadChoice::kOn : OffloadChoice::kOff;
  job.toml = JobSpecToToml(s);
  return job;
}

absl::Status RequireFits(const ResolvedJob& job) {
  if (job.plan.fits) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("the job does not fit: ", job.plan.verdict));
}

std::string ResolutionLine(const ResolvedJob& job) {
  const JobSpec::Memory& m = job.spec.memory;
  return absl::StrFormat(
      "memory plan: sp %d = ulysses %d x ring %d, recompute %s, head_chunk %d, tile_tokens %d, "
      "offload %s, prefetch %s, "
      "recompute_interval %d%s, overlap %s, optimizer_offload %s, param_offload %s, dtype %s%s, "
      "peak %s per rank (GPU budget %s), host %s per rank (budget %s)%s",
      job.spec.parallel.sp, job.spec.parallel.sp / std::max<int64_t>(1, job.spec.parallel.ring),
      std::max<int64_t>(1, job.spec.parallel.ring), RecomputeSetting(job.plan), m.head_chunk,
      m.tile_tokens, OffloadSetting(m.offload == OffloadChoice::kOn, m.offload_keep_last),
      m.prefetch == OffloadChoice::kOn ? "on" : "off", m.recompute_interval,
      SavedBlockInputsSetting(m.saved_block_inputs), m.overlap == OffloadChoice::kOn ? "on" : "off",
      m.optimizer_offload == OffloadChoice::kOn ? "on" : "off",
      m.param_offload == OffloadChoice::kOn ? "on" : "off", job.spec.model.dtype,
      job.spec.backend == "cuda"
          ? absl::StrCat(", attention ", job.spec.kernels.attention_forward, " forward / ",
                         job.spec.kernels.attention_backward, " backward")
          : std::string(),
      HumanBytes(job.plan.device_total()), HumanBytes(job.budgets.gpu_bytes),
      HumanBytes(job.plan.host_total()), HumanBytes(job.budgets.host_bytes),
      job.plan.predicted.step_s > 0
          ? absl::StrCat("; ", PredictionLine(job.plan, job.spec.parallel.world))
          : std::string());
}

}  // namespace ithaca
