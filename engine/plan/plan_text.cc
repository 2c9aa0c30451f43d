// A plan as people read it: byte counts, the settings lines the CLI, admission and the benches
// print, and FormatPlan's table (planner.h declares them).
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/core/units.h"
#include "engine/plan/planner.h"

namespace ithaca {

std::string HumanBytes(int64_t b) {
  return b >= kGiBBytes ? absl::StrFormat("%.2f GiB", b / kGiB)
                        : absl::StrFormat("%.2f MiB", b / kMiB);
}

std::string RecomputeSetting(const MemoryPlan& p) {
  if (p.recompute == RecomputePolicy::kAttentionAware && p.attention_aware_blocks >= 0) {
    return absl::StrCat("attention-aware on the last ", p.attention_aware_blocks,
                        " blocks (full on the others)");
  }
  return RecomputePolicyName(p.recompute);
}

std::string RatesLabel(const StepPrediction& r) {
  return r.rates_note.empty() ? r.rates : absl::StrCat(r.rates, ", ", r.rates_note);
}

std::string PredictionLine(const MemoryPlan& p, int64_t world) {
  const StepPrediction& r = p.predicted;
  if (r.step_s <= 0) return "";
  return absl::StrFormat("predicted step %.3g s, %s tok/s (%s tok/s per rank; rates: %s)", r.step_s,
                         absl::StrFormat("%.0f", r.tok_per_s),
                         absl::StrFormat("%.0f", r.tok_per_s / double(std::max<int64_t>(1, world))),
                         RatesLabel(r));
}

std::string SavedBlockInputsSetting(int64_t saved_block_inputs) {
  return saved_block_inputs > 0 ? absl::StrCat(", saved_block_inputs ", saved_block_inputs) : "";
}

std::string OffloadSetting(bool offload, int64_t keep_last) {
  if (!offload) return "off";
  return keep_last > 0 ? absl::StrCat("on (the last ", keep_last, " blocks' on the device)") : "on";
}

std::string FormatPlan(const MemoryPlan& p) {
  // One unit for the whole table, chosen by the total, so small models read sensibly too.
  const bool gib = p.device_total() >= kGiBBytes;
  const double unit = gib ? kGiB : kMiB;
  const char* name = gib ? "GiB" : "MiB";
  std::string out = absl::StrFormat("%-14s %9s %s %14s\n", "tier", "peak", name, "at the peak");
  for (int i = 0; i < kNumTiers; ++i) {
    absl::StrAppendFormat(&out, "%-14s %13.3f %14.3f\n", TierName(static_cast<Tier>(i)),
                          p.peak[i] / unit, p.at_peak[i] / unit);
  }
  absl::StrAppendFormat(&out, "%-14s %13.3f  (highest device total during the step)\n",
                        "device peak", p.device_total() / unit);
  absl::StrAppendFormat(&out, "recompute: %s\n", RecomputeSetting(p));
  absl::StrAppendFormat(&out,
                        "settings: head_chunk %d, tile_tokens %d, offload %s, prefetch %s, "
                        "recompute_interval %d%s, overlap %s, optimizer_offload %s, "
                        "param_offload %s\n",
                        p.head_chunk, p.tile_tokens, OffloadSetting(p.offload, p.offload_keep_last),
                        p.prefetch ? "on" : "off", p.recompute_interval,
                        SavedBlockInputsSetting(p.saved_block_inputs), p.overlap ? "on" : "off",
                        p.optimizer_offload ? "on" : "off", p.param_offload ? "on" : "off");
  if (p.host_total() > 0) {
    absl::StrAppendFormat(&out, "%-14s %13.3f  (host tiers together)\n", "host total",
                          p.host_total() / unit);
  }
  if (p.gpu_budget > 0) absl::StrAppendFormat(&out, "GPU budget %.2f GiB", p.gpu_budget / kGiB);
  if (p.host_budget > 0) {
    absl::StrAppendFormat(&out, "%shost budget %.2f GiB", p.gpu_budget > 0 ? ", " : "",
                          p.host_budget / kGiB);
  }
  if (p.gpu_budget > 0 || p.host_budget > 0) out += "\n";
  absl::StrAppend(&out, p.fits ? "verdict: fits\n" : "verdict: does NOT fit: " + p.verdict + "\n");
  const StepPrediction& r = p.predicted;
  if (r.step_s > 0) {
    absl::StrAppendFormat(&out,
                          "predicted step: %.3f s (forward/backward %.3f s: gemm %.3f, attention "
                          "%.3f, elementwise %.3f, transfers %.3f, collectives %.3f busy, compute "
                          "waited %.3f; update %.3f s), %.0f tok/s (rates: %s)\n"
                          "forwards run again: regrowing %.3f s, recompute %.3f s\n",
                          r.step_s, r.forward_backward_s, r.gemm_s, r.attention_s, r.elementwise_s,
                          r.transfer_s, r.collective_s, r.waited_s, r.update_s, r.tok_per_s,
                          RatesLabel(r), r.regrow_s, r.recompute_s);
  }
  return out;
}

}  // namespace ithaca
