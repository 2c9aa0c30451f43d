// A spec's own rules, checked once it is parsed and before anything is computed from it: each
// key's range and the relations between keys (the relations to the model are validate.cc's).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/core/path_policy.h"
#include "engine/spec/job_spec_internal.h"

namespace ithaca {

using spec_internal::FormatDouble;
using spec_internal::QuotedList;
using spec_internal::SpecReader;

absl::StatusOr<std::vector<int64_t>> DataMixSlots(const std::vector<double>& weights) {
  std::vector<int64_t> slots;
  int64_t g = 0;
  for (double w : weights) {
    const double milli = w * 1000;
    if (!(w > 0) || !(milli < 1e15)) {
      return absl::InvalidArgumentError(
          absl::StrCat("must be positive numbers, got ", FormatDouble(w)));
    }
    const int64_t m = static_cast<int64_t>(std::llround(milli));
    if (m < 1 || std::abs(milli - static_cast<double>(m)) > 1e-6 * std::max(1.0, milli)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "at most 3 decimals each (the mix is exact in whole samples), got ", FormatDouble(w)));
    }
    slots.push_back(m);
    g = std::gcd(g, m);
  }
  int64_t period = 0;
  for (int64_t& m : slots) {
    m /= g;
    period += m;
    if (period > kMaxDataMixPeriod) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the mix repeats only every ", period, "+ samples (at most ", kMaxDataMixPeriod,
          "): use weights with fewer digits, such as [7, 3] rather than [0.701, 0.299]"));
    }
  }
  return slots;
}

namespace spec_internal {
namespace {

// [model.rope] on its own (ApplyRopeOverride checks it against the model): each parameter only
// under a scaling that reads it, and every value in range.
absl::Status ValidateRope(const JobSpec::Model::Rope& rope, const SpecReader& r) {
  if (r.Given("model.rope.theta")) {
    RETURN_IF_ERROR(r.Require(rope.theta > 0, "model.rope.theta",
                              absl::StrCat("must be > 0, got ", FormatDouble(rope.theta))));
  }
  struct Param {
    const char* key;
    bool given;
    std::vector<std::string> scalings;  // the scalings that read it
  };
  const Param params[] = {
      {"factor", rope.factor != 0 || r.Given("model.rope.factor"), {"linear", "llama3", "yarn"}},
      {"low_freq_factor", r.Given("model.rope.low_freq_factor"), {"llama3"}},
      {"high_freq_factor", r.Given("model.rope.high_freq_factor"), {"llama3"}},
      {"beta_fast", r.Given("model.rope.beta_fast"), {"yarn"}},
      {"beta_slow", r.Given("model.rope.beta_slow"), {"yarn"}},
      {"attention_factor", r.Given("model.rope.attention_factor"), {"yarn"}},
      {"original_max_position_embeddings",
       r.Given("model.rope.original_max_position_embeddings"),
       {"llama3", "yarn"}},
  };
  for (const Param& p : params) {
    if (!p.given) continue;
    const std::string key = absl::StrCat("model.rope.", p.key);
    if (rope.scaling.empty()) {
      return r.Error(key, absl::StrCat("needs model.rope.scaling (", QuotedList(p.scalings),
                                       ": the scaling it is a parameter of)"));
    }
    RETURN_IF_ERROR(r.Require(
        std::find(p.scalings.begin(), p.scalings.end(), rope.scaling) != p.scalings.end(), key,
        absl::StrCat("not a parameter of scaling \"", rope.scaling, "\" (it is one of ",
                     QuotedList(p.scalings), ")")));
  }
  for (const auto& [key, v] : {std::pair<const char*, double>{"factor", rope.factor},
                               {"low_freq_factor", rope.low_freq_factor},
                               {"high_freq_factor", rope.high_freq_factor},
                               {"beta_fast", rope.beta_fast},
                               {"beta_slow", rope.beta_slow},
                               {"attention_factor", rope.attention_factor}}) {
    const std::string path = absl::StrCat("model.rope.", key);
    if (!r.Given(path)) continue;
    RETURN_IF_ERROR(r.Require(v > 0, path, absl::StrCat("must be > 0, got ", FormatDouble(v))));
  }
  if (r.Given("model.rope.original_max_position_embeddings")) {
    RETURN_IF_ERROR(r.Require(rope.original_max_position_embeddings >= 1 &&
                                  rope.original_max_position_embeddings <= kMaxSeqLen,
                              "model.rope.original_max_position_embeddings",
                              absl::StrCat("must be in [1, ", kMaxSeqLen, "], got ",
                                           rope.original_max_position_embeddings)));
  }
  const bool scaled =
      rope.scaling == "linear" || rope.scaling == "llama3" || rope.scaling == "yarn";
  RETURN_IF_ERROR(r.Require(!scaled || rope.factor > 0, "model.rope.factor",
                            absl::StrCat("required with scaling \"", rope.scaling,
                                         "\" (how many times the context is stretched)")));
  if (rope.scaling == "llama3") {
    const double low = rope.low_freq_factor != 0 ? rope.low_freq_factor : 1.0;
    const double high = rope.high_freq_factor != 0 ? rope.high_freq_factor : 4.0;
    RETURN_IF_ERROR(r.Require(high > low, "model.rope.high_freq_factor",
                              absl::StrCat("must exceed low_freq_factor (", FormatDouble(low),
                                           "), got ", FormatDouble(high))));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Validate(const JobSpec& s, const SpecReader& r) {
  RETURN_IF_ERROR(r.Require(!s.name.empty(), "name", "must not be empty"));
  // Every value is range-checked here, before any arithmetic or planning uses it: admission runs
  // inside the daemon, and a spec from any client must not be able to exhaust it.
  RETURN_IF_ERROR(
      r.Require(s.name.size() <= kMaxJobNameBytes, "name",
                absl::StrCat("must be at most ", kMaxJobNameBytes, " bytes, got ", s.name.size())));
  RETURN_IF_ERROR(r.Require(
      std::none_of(s.name.begin(), s.name.end(),
                   [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }),
      "name", "must not contain control characters"));

  // An evaluation-only job (training.steps = 0) trains on nothing: data.path is optional there.
  const bool eval_only = s.training.steps == 0;
  RETURN_IF_ERROR(r.Require(!s.data.path.empty() || eval_only, "data.path",
                            "required: the token file to train on (see ithaca-tokenize)"));
  if (!s.data.weights.empty()) {
    absl::StatusOr<std::vector<int64_t>> slots = DataMixSlots(s.data.weights);
    if (!slots.ok()) return r.Error("data.weights", std::string(slots.status().message()));
    absl::StatusOr<std::vector<std::string>> sources = SplitDataSources(s.data.path);
    RETURN_IF_ERROR(r.Require(sources.ok(), "data.path",
                              sources.ok() ? "" : std::string(sources.status().message())));
    RETURN_IF_ERROR(
        r.Require(sources->size() == s.data.weights.size(), "data.weights",
                  absl::StrCat(s.data.weights.size(), " weights for ", sources->size(),
                               sources->size() == 1 ? " source" : " sources",
                               ": data.path must be one brace group with a source per weight, "
                               "\"{web/*.tok,code/*.tok}\" for weights = [3, 1]")));
  }
  RETURN_IF_ERROR(
      r.Require(s.data.seq_len >= 2 && s.data.seq_len <= kMaxSeqLen, "data.seq_len",
                absl::StrCat("must be in [2, ", kMaxSeqLen, "], got ", s.data.seq_len)));
  RETURN_IF_ERROR(
      r.Require(s.data.micro_batch >= 1 && s.data.micro_batch <= kMaxMicroBatch, "data.micro_batch",
                absl::StrCat("must be in [1, ", kMaxMicroBatch, "], got ", s.data.micro_batch)));

  const JobSpec::Training& t = s.training;
  RETURN_IF_ERROR(
      r.Require(t.steps >= 0, "training.steps", absl::StrCat("must be >= 0, got ", t.steps)));
  const JobSpec::Eval::Passkey& pk = s.eval.passkey;
  RETURN_IF_ERROR(r.Require(!eval_only || !s.eval.path.empty() || !pk.lengths.empty(),
                            "training.steps",
                            "0 (an evaluation-only job) needs an [eval] section with eval.path "
                            "or [eval.passkey]"));
  // An evaluation-only job never takes an optimizer step, so its learning rates do not matter.
  RETURN_IF_ERROR(r.Require(
      t.lr > 0 || (eval_only && t.lr == 0), "training.lr",
      absl::StrCat("must be > 0, got ", t.lr,
                   t.lr == 0 ? " (0 only for an evaluation-only job, training.steps = 0)" : "")));
  RETURN_IF_ERROR(
      r.Require(t.min_lr >= 0, "training.min_lr", absl::StrCat("must be >= 0, got ", t.min_lr)));
  // Says so when min_lr is the default: lowering only lr is the likely way to get here.
  RETURN_IF_ERROR(r.Require(
      t.min_lr <= t.lr || eval_only, "training.min_lr",
      absl::StrCat("must be <= training.lr (", t.lr, "), got ", t.min_lr,
                   r.Given("training.min_lr") ? "" : " (the default; set training.min_lr)")));
  RETURN_IF_ERROR(r.Require(t.warmup_steps >= 0, "training.warmup_steps",
                            absl::StrCat("must be >= 0, got ", t.warmup_steps)));
  RETURN_IF_ERROR(r.Require(t.decay_ratio >= 0 && t.decay_ratio <= 1, "training.decay_ratio",
                            absl::StrCat("must be in [0, 1], got ", t.decay_ratio)));
  RETURN_IF_ERROR(r.Require(t.weight_decay >= 0, "training.weight_decay",
                            absl::StrCat("must be >= 0, got ", t.weight_decay)));
  RETURN_IF_ERROR(r.Require(t.beta1 >= 0 && t.beta1 < 1, "training.beta1",
                            absl::StrCat("must be in [0, 1), got ", t.beta1)));
  RETURN_IF_ERROR(r.Require(t.beta2 >= 0 && t.beta2 < 1, "training.beta2",
                            absl::StrCat("must be in [0, 1), got ", t.beta2)));
  RETURN_IF_ERROR(r.Require(t.eps > 0, "training.eps", absl::StrCat("must be > 0, got ", t.eps)));
  RETURN_IF_ERROR(r.Require(t.grad_clip >= 0, "training.grad_clip",
                            absl::StrCat("must be >= 0 (0 disables clipping), got ", t.grad_clip)));
  RETURN_IF_ERROR(
      r.Require(t.grad_accum >= 1 && t.grad_accum <= kMaxGradAccum, "training.grad_accum",
                absl::StrCat("must be in [1, ", kMaxGradAccum, "], got ", t.grad_accum)));
  // A step's samples are held in host memory together; each factor is bounded above, so the
  // product cannot overflow.
  const int64_t step_tokens = s.data.micro_batch * t.grad_accum * (s.data.seq_len + 1);
  RETURN_IF_ERROR(r.Require(
      step_tokens <= kMaxStepTokens, "training.grad_accum",
      absl::StrCat("data.micro_batch x training.grad_accum x (data.seq_len + 1) = ", step_tokens,
                   " tokens per step; at most ", kMaxStepTokens, " are allowed")));

  const JobSpec::Parallel& p = s.parallel;
  RETURN_IF_ERROR(r.Require(p.world >= 1 && p.world <= kMaxWorld, "parallel.world",
                            absl::StrCat("must be in [1, ", kMaxWorld, "], got ", p.world)));
  RETURN_IF_ERROR(r.Require(p.sp >= 1, "parallel.sp", absl::StrCat("must be >= 1, got ", p.sp)));
  RETURN_IF_ERROR(
      r.Require(p.world % p.sp == 0, "parallel.sp",
                absl::StrCat("must divide parallel.world (", p.world, "), got ", p.sp)));

  const JobSpec::Memory& m = s.memory;
  RETURN_IF_ERROR(r.Require(m.offload_keep_last >= 0, "memory.offload_keep_last",
                            absl::StrCat("must be >= 0, got ", m.offload_keep_last)));
  RETURN_IF_ERROR(r.Require(m.recompute_interval >= 1, "memory.recompute_interval",
                            absl::StrCat("must be >= 1, got ", m.recompute_interval)));
  RETURN_IF_ERROR(r.Require(m.saved_block_inputs == 0 || m.saved_block_inputs >= 2,
                            "memory.saved_block_inputs",
                            absl::StrCat("must be 0 (off) or >= 2, got ", m.saved_block_inputs)));
  if (m.saved_block_inputs > 0) {
    RETURN_IF_ERROR(r.Require(m.recompute_interval == 1, "memory.saved_block_inputs",
                              "set it or memory.recompute_interval, not both"));
    RETURN_IF_ERROR(r.Require(m.recompute != RecomputePolicy::kNone, "memory.saved_block_inputs",
                              "needs memory.recompute \"full\" or \"attention-aware\" (\"none\" "
                              "keeps every block's input)"));
  }
  RETURN_IF_ERROR(
      r.Require(m.gpu_budget_gib >= 0, "memory.gpu_budget_gib",
                absl::StrCat("must be >= 0 (0: from the node), got ", m.gpu_budget_gib)));
  RETURN_IF_ERROR(
      r.Require(m.host_budget_gib >= 0, "memory.host_budget_gib",
                absl::StrCat("must be >= 0 (0: from the node), got ", m.host_budget_gib)));

  RETURN_IF_ERROR(ValidateRope(s.model.rope, r));
  RETURN_IF_ERROR(r.Require(s.init.from.empty() || s.model.weights.empty(), "init.from",
                            "set either init.from (a new phase's start) or model.weights, not "
                            "both"));
  RETURN_IF_ERROR(r.Require(
      !absl::StartsWith(s.init.from, "job:") || !InitFromJob(s.init.from).empty(), "init.from",
      absl::StrCat("\"", s.init.from.substr(0, 64),
                   "\" names no job: write job:ID with the id `ithaca list` shows (job:job-3)")));

  RETURN_IF_ERROR(r.Require(s.checkpoint.every >= 0, "checkpoint.every",
                            absl::StrCat("must be >= 0, got ", s.checkpoint.every)));
  RETURN_IF_ERROR(r.Require(s.checkpoint.keep >= 1, "checkpoint.keep",
                            absl::StrCat("must be >= 1, got ", s.checkpoint.keep)));
  const std::string& ex = s.checkpoint.export_dtype;
  RETURN_IF_ERROR(
      r.Require(ex.empty() || !s.checkpoint.dir.empty(), "checkpoint.export",
                "needs checkpoint.dir (the export is written to checkpoint.dir/export)"));
  RETURN_IF_ERROR(r.Require(ex.empty() || !eval_only, "checkpoint.export",
                            "an evaluation-only job (training.steps = 0) writes no checkpoint to "
                            "export"));
  RETURN_IF_ERROR(r.Require(!r.Given("eval.passkey") || !pk.lengths.empty(), "eval.passkey.lengths",
                            "required in an [eval.passkey] section: the prompt lengths in tokens, "
                            "e.g. [4096, 8192]"));
  RETURN_IF_ERROR(r.Require(!r.Given("eval") || !s.eval.path.empty() || !pk.lengths.empty(),
                            "eval.path",
                            "required in an [eval] section without [eval.passkey]: the held-out "
                            "token file(s) (see ithaca-tokenize --val-fraction)"));
  if (!pk.lengths.empty()) {
    RETURN_IF_ERROR(r.Require(
        pk.lengths.size() <= kMaxPasskeyPoints, "eval.passkey.lengths",
        absl::StrCat("at most ", kMaxPasskeyPoints, " lengths, got ", pk.lengths.size())));
    for (size_t i = 0; i < pk.lengths.size(); ++i) {
      const int64_t n = pk.lengths[i];
      RETURN_IF_ERROR(r.Require(
          n >= 1 && n <= s.data.seq_len, "eval.passkey.lengths",
          absl::StrCat(n, " is not in [1, data.seq_len = ", s.data.seq_len,
                       "]: the job is planned for data.seq_len tokens, so no prompt may be "
                       "longer (raise data.seq_len)")));
      RETURN_IF_ERROR(r.Require(
          s.parallel.sp < 1 || n % s.parallel.sp == 0, "eval.passkey.lengths",
          absl::StrCat(n, " is not divisible by parallel.sp (", s.parallel.sp,
                       "): every rank of a Ulysses group holds an equal share of a prompt")));
      RETURN_IF_ERROR(r.Require(
          std::find(pk.lengths.begin(), pk.lengths.begin() + i, n) == pk.lengths.begin() + i,
          "eval.passkey.lengths", absl::StrCat(n, " is given twice")));
    }
    RETURN_IF_ERROR(r.Require(
        !pk.depths.empty() && pk.depths.size() <= kMaxPasskeyPoints, "eval.passkey.depths",
        absl::StrCat("must hold 1 to ", kMaxPasskeyPoints, " depths, got ", pk.depths.size())));
    for (size_t i = 0; i < pk.depths.size(); ++i) {
      const double d = pk.depths[i];
      RETURN_IF_ERROR(r.Require(d >= 0 && d <= 1, "eval.passkey.depths",
                                absl::StrCat(FormatDouble(d),
                                             " is not in [0, 1] (0: the key at the start of "
                                             "the filler, 1: at its end)")));
      RETURN_IF_ERROR(
          r.Require(std::find(pk.depths.begin(), pk.depths.begin() + i, d) == pk.depths.begin() + i,
                    "eval.passkey.depths", absl::StrCat(FormatDouble(d), " is given twice")));
    }
    RETURN_IF_ERROR(
        r.Require(pk.samples >= 1 && pk.samples <= kMaxPasskeySamples, "eval.passkey.samples",
                  absl::StrCat("must be in [1, ", kMaxPasskeySamples, "], got ", pk.samples)));
  }
  RETURN_IF_ERROR(
      r.Require(s.eval.every >= 0, "eval.every",
                absl::StrCat("must be >= 0 (0: only after the last step), got ", s.eval.every)));
  RETURN_IF_ERROR(
      r.Require(s.eval.batches >= 1 && s.eval.batches <= kMaxEvalBatches, "eval.batches",
                absl::StrCat("must be in [1, ", kMaxEvalBatches, "], got ", s.eval.batches)));
  RETURN_IF_ERROR(r.Require(s.retry.max_restarts >= 0 && s.retry.max_restarts <= 1000,
                            "retry.max_restarts",
                            absl::StrCat("must be in 0..1000, got ", s.retry.max_restarts)));
  RETURN_IF_ERROR(r.Require(
      s.retry.backoff_seconds >= 0 && s.retry.backoff_seconds <= 86400, "retry.backoff_seconds",
      absl::StrCat("must be in 0..86400, got ", FormatDouble(s.retry.backoff_seconds))));
  RETURN_IF_ERROR(r.Require(s.slurm.nodes >= 1 && s.slurm.nodes <= 4096, "slurm.nodes",
                            absl::StrCat("must be in 1..4096, got ", s.slurm.nodes)));
  RETURN_IF_ERROR(r.Require(
      s.parallel.world % s.slurm.nodes == 0, "slurm.nodes",
      absl::StrCat("must divide parallel.world (", s.parallel.world, "), got ", s.slurm.nodes)));
  RETURN_IF_ERROR(r.Require(s.slurm.signal_grace >= 0 && s.slurm.signal_grace <= 86400,
                            "slurm.signal_grace",
                            absl::StrCat("must be in 0..86400, got ", s.slurm.signal_grace)));
  for (const auto& [key, value] :
       {std::pair<const char*, const std::string*>{"slurm.partition", &s.slurm.partition},
        {"slurm.account", &s.slurm.account},
        {"slurm.time_limit", &s.slurm.time_limit},
        {"slurm.constraint", &s.slurm.constraint}}) {
    RETURN_IF_ERROR(
        r.Require(SlurmValueOk(key, *value), key,
                  absl::StrCat("\"", *value, "\" is not a valid ", key, SlurmValueRule(key))));
  }
  RETURN_IF_ERROR(r.Require(s.metrics.log_every >= 1, "metrics.log_every",
                            absl::StrCat("must be >= 1, got ", s.metrics.log_every)));
  RETURN_IF_ERROR(r.Require(
      !s.metrics.tensorboard || !s.checkpoint.dir.empty(), "metrics.tensorboard",
      "needs checkpoint.dir (the event files are written to checkpoint.dir/tensorboard)"));
  return absl::OkStatus();
}

}  // namespace spec_internal
}  // namespace ithaca
