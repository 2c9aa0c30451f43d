// The checks that relate a job's settings to each other and to its model. Each lives here and
// nowhere else, so a bad job gets the same message wherever it is caught: at admission
// (ResolveJob runs ValidateJob) or, for code that builds the engine's parts directly, where
// those parts would otherwise compute nonsense (MakeHeadPlan, LlamaModel::UploadSample). Every
// message starts with the spec key that is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/config.h"
#include "engine/spec/job_spec.h"

namespace ithaca {

// The tokens each rank of a sequence-parallel group holds of a sample of seq_len: an equal share,
// seq_len / sp rounded up (with a ring, up to an even number: each group holds two equal pieces,
// engine/parallel/token_runs.h). The sample is padded past its end (token 0, label ignored): causal
// attention keeps every real token from seeing the pad, and the loss never counts it.
int64_t SequenceShare(int64_t seq_len, int64_t sp, int64_t ring = 1);

// The attention heads split over `sp` ranks (query heads evenly; K/V heads evenly, or each
// replicated to sp / Hkv ranks), and into UPipe stages of `head_chunk` query heads over the
// group (0: all heads in one stage) that are whole per rank and fit the GQA groups.
absl::Status CheckHeadSplit(const LlamaConfig& cfg, int64_t sp, int64_t head_chunk);

// The ring factor r of sp = u x r (parallel.ring; 0: auto). Auto: the smallest r dividing sp
// whose Ulysses group of u = sp / r ranks passes CheckHeadSplit. A named r must divide sp and
// its u pass; else INVALID_ARGUMENT listing the values that would.
absl::StatusOr<int64_t> RingFor(const LlamaConfig& cfg, int64_t sp, int64_t ring,
                                int64_t head_chunk);
// Every r dividing sp whose Ulysses group of sp / r passes CheckHeadSplit, ascending (RingFor's
// "auto" is the first; ResolveJob takes a later one when only it fits).
std::vector<int64_t> ValidRings(const LlamaConfig& cfg, int64_t sp, int64_t head_chunk);

// The dtype a backend computes in: "bf16" on "cuda", "f32" on "cpu" (what "auto" becomes).
const char* BackendDtype(const std::string& backend);

// The backend computes in `dtype` ("auto" passes: resolution picks the backend's own).
absl::Status CheckDtype(const std::string& backend, const std::string& dtype);

// [model.rope] against the model's family: a scaling that family's checkpoints do not use
// (llama3 outside Llama) is refused, naming the ones it does.
absl::Status CheckRopeFamily(const JobSpec::Model::Rope& rope, const LlamaConfig& cfg);

// The warnings a job gets at submit (not errors): data.seq_len past the model's
// max_position_embeddings without a [model.rope] that extends it, naming the keys that would.
std::vector<std::string> JobWarnings(const JobSpec& spec, const LlamaConfig& cfg);

// All of the above for a parsed spec and its model. (Single-key checks and the model-free
// relations, such as parallel.sp dividing parallel.world, are made by ParseJobSpec.)
absl::Status ValidateJob(const JobSpec& spec, const LlamaConfig& cfg);

}  // namespace ithaca
