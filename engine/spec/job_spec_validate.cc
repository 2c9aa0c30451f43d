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

using spec_internal::CheckRange;
using spec_internal::FormatDouble;
using spec_internal::Key;
using spec_internal::Keys;
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
// under a scaling that reads it (each value's range is its row's).
absl::Status ValidateRope(const JobSpec::Model::Rope& rope, const SpecReader& r) {
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

// [lora]: its keys need a rank, a rank needs alpha and targets, and what is not implemented
// (dropout) is refused by name.
absl::Status ValidateLora(const JobSpec& s, const SpecReader& r) {
  const JobSpec::Lora& l = s.lora;
  if (!l.enabled()) {
    for (const char* key :
         {"lora.alpha", "lora.targets", "lora.init", "lora.dropout", "lora.merge_on_export"}) {
      RETURN_IF_ERROR(r.Require(!r.Given(key), key, "needs lora.rank (the adapters' rank, >= 1)"));
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(r.Require(l.alpha > 0, "lora.alpha",
                            "required with lora.rank: the scaling is alpha / rank (PEFT's "
                            "lora_alpha, e.g. 16)"));
  RETURN_IF_ERROR(r.Require(!l.targets.empty(), "lora.targets",
                            "required with lora.rank: the linears that get adapters, e.g. "
                            "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\"]"));
  RETURN_IF_ERROR(r.Require(l.dropout == 0, "lora.dropout",
                            absl::StrCat("only 0 is implemented, got ", FormatDouble(l.dropout))));
  RETURN_IF_ERROR(r.Require(!l.merge_on_export || !s.checkpoint.export_dtype.empty(),
                            "lora.merge_on_export", "needs checkpoint.export (what is merged)"));
  RETURN_IF_ERROR(r.Require(!l.merge_on_export || !s.model.weights.empty() || !s.init.from.empty(),
                            "lora.merge_on_export",
                            "needs model.weights or init.from: the base the adapters merge into"));
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
  if (!s.data.source_loss_mask.empty()) {
    const size_t n = s.data.source_loss_mask.size();
    RETURN_IF_ERROR(r.Require(!s.data.weights.empty(), "data.source_loss_mask",
                              "needs a mix (data.weights, one source per value); for one source "
                              "use data.loss_mask"));
    RETURN_IF_ERROR(
        r.Require(n == s.data.weights.size(), "data.source_loss_mask",
                  absl::StrCat(n, n == 1 ? " value" : " values", " for ", s.data.weights.size(),
                               " sources (data.weights): one per source")));
    RETURN_IF_ERROR(r.Require(!s.data.loss_mask, "data.source_loss_mask",
                              "set either data.loss_mask = true (every source masked) or "
                              "data.source_loss_mask (per source), not both"));
  }

  const JobSpec::Training& t = s.training;
  // An evaluation-only job never takes an optimizer step, so its learning rates do not matter.
  // Before the ranges: training.min_lr, when not given, is min_lr_ratio x lr, so a bad lr is
  // named as such rather than as the min_lr it made.
  RETURN_IF_ERROR(r.Require(
      t.lr > 0 || (eval_only && t.lr == 0), "training.lr",
      absl::StrCat("must be > 0, got ", t.lr,
                   t.lr == 0 ? " (0 only for an evaluation-only job, training.steps = 0)" : "")));
  // Every key's own range (its row in the key table), before the relations below and any
  // arithmetic use the values.
  for (const Key& k : Keys()) RETURN_IF_ERROR(CheckRange(k, s, r));

  const JobSpec::Eval::Passkey& pk = s.eval.passkey;
  RETURN_IF_ERROR(r.Require(!eval_only || !s.eval.path.empty() || !pk.lengths.empty(),
                            "training.steps",
                            "0 (an evaluation-only job) needs an [eval] section with eval.path "
                            "or [eval.passkey]"));
  // Says so when min_lr is the default: lowering only lr is the likely way to get here.
  RETURN_IF_ERROR(r.Require(
      t.min_lr <= t.lr || eval_only, "training.min_lr",
      absl::StrCat("must be <= training.lr (", t.lr, "), got ", t.min_lr,
                   r.Given("training.min_lr") ? "" : " (the default; set training.min_lr)")));
  // A step's samples are held in host memory together; each factor is bounded above, so the
  // product cannot overflow.
  const int64_t step_tokens = s.data.micro_batch * t.grad_accum * (s.data.seq_len + 1);
  RETURN_IF_ERROR(r.Require(
      step_tokens <= kMaxStepTokens, "training.grad_accum",
      absl::StrCat("data.micro_batch x training.grad_accum x (data.seq_len + 1) = ", step_tokens,
                   " tokens per step; at most ", kMaxStepTokens, " are allowed")));

  const JobSpec::Parallel& p = s.parallel;
  RETURN_IF_ERROR(
      r.Require(p.world % p.sp == 0, "parallel.sp",
                absl::StrCat("must divide parallel.world (", p.world, "), got ", p.sp)));

  const JobSpec::Memory& m = s.memory;
  if (m.saved_block_inputs > 0) {
    RETURN_IF_ERROR(r.Require(m.recompute_interval <= 1, "memory.saved_block_inputs",
                              "set it or memory.recompute_interval, not both"));
    RETURN_IF_ERROR(r.Require(m.recompute != RecomputePolicy::kNone, "memory.saved_block_inputs",
                              "needs memory.recompute \"full\" or \"attention-aware\" (\"none\" "
                              "keeps every block's input)"));
  }

  RETURN_IF_ERROR(ValidateRope(s.model.rope, r));
  RETURN_IF_ERROR(r.Require(s.init.from.empty() || s.model.weights.empty(), "init.from",
                            "set either init.from (a new phase's start) or model.weights, not "
                            "both"));
  RETURN_IF_ERROR(r.Require(
      !absl::StartsWith(s.init.from, "job:") || !InitFromJob(s.init.from).empty(), "init.from",
      absl::StrCat("\"", s.init.from.substr(0, 64),
                   "\" names no job: write job:ID with the id `ithaca list` shows (job:job-3)")));

  RETURN_IF_ERROR(ValidateLora(s, r));

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
  const std::vector<int64_t>& bounds = s.eval.position_buckets;
  if (!bounds.empty()) {
    RETURN_IF_ERROR(r.Require(!s.eval.path.empty(), "eval.position_buckets",
                              "needs eval.path: it splits the held-out loss by position"));
    RETURN_IF_ERROR(
        r.Require(bounds.size() <= kMaxPositionBounds, "eval.position_buckets",
                  absl::StrCat("at most ", kMaxPositionBounds, " bounds, got ", bounds.size())));
    for (size_t i = 0; i < bounds.size(); ++i) {
      RETURN_IF_ERROR(
          r.Require(bounds[i] >= 1 && bounds[i] < s.data.seq_len, "eval.position_buckets",
                    absl::StrCat(bounds[i], " is not in [1, data.seq_len = ", s.data.seq_len,
                                 "): a bound splits a window's positions 0 .. data.seq_len - 1")));
      RETURN_IF_ERROR(r.Require(i == 0 || bounds[i] > bounds[i - 1], "eval.position_buckets",
                                absl::StrCat(bounds[i], " follows ", i == 0 ? 0 : bounds[i - 1],
                                             ": the bounds must increase")));
    }
  }
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
        !pk.keys.empty() && pk.keys.size() <= kMaxPasskeyKeyCounts, "eval.passkey.keys",
        absl::StrCat("must hold 1 to ", kMaxPasskeyKeyCounts, " counts, got ", pk.keys.size())));
    for (size_t i = 0; i < pk.keys.size(); ++i) {
      RETURN_IF_ERROR(r.Require(pk.keys[i] >= 1 && pk.keys[i] <= kMaxPasskeyKeys,
                                "eval.passkey.keys",
                                absl::StrCat(pk.keys[i], " is not in [1, ", kMaxPasskeyKeys, "]")));
      RETURN_IF_ERROR(r.Require(
          std::find(pk.keys.begin(), pk.keys.begin() + i, pk.keys[i]) == pk.keys.begin() + i,
          "eval.passkey.keys", absl::StrCat(pk.keys[i], " is given twice")));
    }
    const size_t points = pk.keys.size() * pk.lengths.size() * pk.depths.size();
    RETURN_IF_ERROR(
        r.Require(points <= kMaxPasskeyPoints * kMaxPasskeyPoints, "eval.passkey.keys",
                  absl::StrCat(pk.keys.size(), " counts x ", pk.lengths.size(), " lengths x ",
                               pk.depths.size(), " depths = ", points, " points; at most ",
                               kMaxPasskeyPoints * kMaxPasskeyPoints, " are allowed")));
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
  }
  RETURN_IF_ERROR(r.Require(
      s.parallel.world % s.slurm.nodes == 0, "slurm.nodes",
      absl::StrCat("must divide parallel.world (", s.parallel.world, "), got ", s.slurm.nodes)));
  for (const auto& [key, value] :
       {std::pair<const char*, const std::string*>{"slurm.partition", &s.slurm.partition},
        {"slurm.account", &s.slurm.account},
        {"slurm.time_limit", &s.slurm.time_limit},
        {"slurm.constraint", &s.slurm.constraint}}) {
    RETURN_IF_ERROR(
        r.Require(SlurmValueOk(key, *value), key,
                  absl::StrCat("\"", *value, "\" is not a valid ", key, SlurmValueRule(key))));
  }
  RETURN_IF_ERROR(r.Require(
      !s.metrics.tensorboard || !s.checkpoint.dir.empty(), "metrics.tensorboard",
      "needs checkpoint.dir (the event files are written to checkpoint.dir/tensorboard)"));
  return absl::OkStatus();
}

}  // namespace spec_internal
}  // namespace ithaca
