#include "engine/spec/validate.h"

#include <algorithm>

#include "absl/strings/str_join.h"

namespace ithaca {

int64_t SequenceShare(int64_t seq_len, int64_t sp, int64_t ring) {
  if (ring <= 1) return (seq_len + sp - 1) / sp;
  return (seq_len + 2 * sp - 1) / (2 * sp) * 2;  // each group's two pieces whole
}

absl::Status CheckHeadSplit(const LlamaConfig& cfg, int64_t sp, int64_t head_chunk) {
  const int64_t hq = cfg.num_attention_heads, hkv = cfg.num_key_value_heads;
  if (sp < 1 || hq % sp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.sp: must divide the model's num_attention_heads (", hq, "), got ", sp));
  }
  if (hkv < 1 || (hkv % sp != 0 && sp % hkv != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.sp: must divide the model's num_key_value_heads (", hkv,
                     ") or be a multiple of it, got ", sp));
  }
  const int64_t U = head_chunk > 0 ? head_chunk : hq;  // heads per stage, group-wide
  if (U % sp != 0 || (hq / sp) % (U / sp) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory.head_chunk: ", U, " heads per stage must be a multiple of parallel.sp (", sp,
        ") that divides the ", hq, " query heads into equal stages per rank"));
  }
  if (hkv < sp) return absl::OkStatus();  // a rank's query heads all share its one K/V head
  // A stage takes whole GQA groups, or a whole fraction of one.
  const int64_t u = U / sp, g = hq / hkv;
  if (u <= g && g % u != 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory.head_chunk: ", U, " (", u,
                                                   " per rank) must divide the GQA group of ", g,
                                                   " query heads per K/V head"));
  }
  if (u > g && u % g != 0) {
    return absl::InvalidArgumentError(absl::StrCat("memory.head_chunk: ", U, " (", u,
                                                   " per rank) must be a multiple of the GQA "
                                                   "group of ",
                                                   g, " query heads per K/V head"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> ValidRings(const LlamaConfig& cfg, int64_t sp, int64_t head_chunk) {
  std::vector<int64_t> valid;
  for (int64_t r = 1; r <= sp; ++r) {
    if (sp % r == 0 && CheckHeadSplit(cfg, sp / r, head_chunk).ok()) valid.push_back(r);
  }
  return valid;
}

absl::StatusOr<int64_t> RingFor(const LlamaConfig& cfg, int64_t sp, int64_t ring,
                                int64_t head_chunk) {
  const std::vector<int64_t> valid = ValidRings(cfg, sp, head_chunk);
  if (ring == 0 && !valid.empty()) return valid.front();
  if (ring > 0 && std::find(valid.begin(), valid.end(), ring) != valid.end()) return ring;
  if (ring > 0 && sp % ring == 0) {
    // The heads refuse this u: say why, and what would work.
    const absl::Status why = CheckHeadSplit(cfg, sp / ring, head_chunk);
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.ring: ", ring, " leaves Ulysses groups of ", sp / ring, " ranks: ", why.message(),
        valid.empty()
            ? std::string()
            : absl::StrCat("; valid rings for sp ", sp, ": ", absl::StrJoin(valid, ", "))));
  }
  if (ring > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.ring: ", ring, " does not divide parallel.sp (", sp, ")",
        valid.empty() ? std::string() : absl::StrCat("; valid: ", absl::StrJoin(valid, ", "))));
  }
  // No u at all (not even 1: the head_chunk itself is wrong): Ulysses over all of sp says how.
  RETURN_IF_ERROR(CheckHeadSplit(cfg, sp, head_chunk));
  return CheckHeadSplit(cfg, 1, head_chunk);
}

const char* BackendDtype(const std::string& backend) {
  // Each backend computes in one dtype: the CPU is the f32 oracle, CUDA is bf16.
  return backend == "cuda" ? "bf16" : "f32";
}

absl::Status CheckDtype(const std::string& backend, const std::string& dtype) {
  const char* own = BackendDtype(backend);
  if (dtype == "auto" || dtype == own) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("model.dtype: the ", backend,
                                                 " backend computes in ", own,
                                                 " (or \"auto\"), "
                                                 "got \"",
                                                 dtype, "\""));
}

absl::Status CheckRopeFamily(const JobSpec::Model::Rope& rope, const LlamaConfig& cfg) {
  // llama3's frequency bands are Llama 3's own recipe, and only its config dialect carries them;
  // the other families extend their context with yarn (Qwen2.5, Qwen3) or linear.
  if (rope.scaling == "llama3" && cfg.family != ModelFamily::kLlama) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.rope.scaling: \"llama3\" is Llama 3's own scaling; a ", ModelTypeName(cfg.family),
        " model extends its context with \"yarn\" or \"linear\""));
  }
  return absl::OkStatus();
}

absl::Status ValidateJob(const JobSpec& spec, const LlamaConfig& cfg) {
  RETURN_IF_ERROR(CheckDtype(spec.backend, spec.model.dtype));
  RETURN_IF_ERROR(CheckRopeFamily(spec.model.rope, cfg));
  if (spec.memory.param_offload == OffloadChoice::kOn &&
      spec.memory.optimizer_offload == OffloadChoice::kOff) {
    return absl::InvalidArgumentError(
        "memory.param_offload = true needs memory.optimizer_offload = true (or \"auto\"): the "
        "CPU AdamW writes the working copy on the host, so the optimizer's state must be there");
  }
  return RingFor(cfg, spec.parallel.sp, spec.parallel.ring, spec.memory.head_chunk).status();
}

std::vector<std::string> JobWarnings(const JobSpec& spec, const LlamaConfig& cfg) {
  std::vector<std::string> w;
  if (spec.data.seq_len > cfg.max_position_embeddings && !spec.model.rope.set()) {
    w.push_back(absl::StrCat(
        "data.seq_len ", spec.data.seq_len, " exceeds the model's max_position_embeddings ",
        cfg.max_position_embeddings, " (", DescribeModelRope(cfg),
        "): positions past it were never trained; to extend the context set [model.rope] theta "
        "(a larger base), or scaling = \"yarn\" (\"llama3\" for Llama, or \"linear\") with "
        "factor and original_max_position_embeddings (docs/long_context.md)"));
  }
  return w;
}

}  // namespace ithaca
