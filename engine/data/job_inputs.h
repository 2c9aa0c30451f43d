// A job's inputs, opened and checked against its model: the training data, the evaluation data
// and the initial weights. The one check of them: ithacad's admission runs CheckJobInputs before
// the job is queued (a bad input then costs no slot and no launch), and the trainer opens its
// data with the same functions.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "engine/spec/job_spec.h"
#include "engine/data/text_tokenizer.h"  // ModelSourceDir, ModelTokenizerJson
#include "engine/data/data_loader.h"

namespace ithaca {

// data.path's files as the training loader: one tokenizer (the model's, when it has one), tokens
// within the model's vocabulary, the masks the spec asks for, at least one window.
// `check_limit`: how many entries of each file's arrays opening checks (TokenFile::Open): every
// one for the trainer, kAdmissionCheckLimit for CheckJobInputs.
absl::StatusOr<std::unique_ptr<DataLoader>> OpenTrainingData(
    const JobSpec& spec, const LlamaConfig& cfg, int64_t check_limit = TokenFile::kCheckEvery);
// eval.path's files with data.path's checks, from the training data's tokenizer
// (`training_file`, its first file, when the job trains), holding the windows one evaluation
// reads (eval.batches x data.micro_batch x `dp` replicas). Errors start with "eval.path: ".
absl::StatusOr<std::unique_ptr<DataLoader>> OpenEvalData(
    const JobSpec& spec, const LlamaConfig& cfg, const TokenFile* training_file, int64_t dp,
    int64_t check_limit = TokenFile::kCheckEvery);
// model.weights' tensors: every one the model needs, with its shape, in a dtype Ithaca reads
// (headers only; no tensor data is read). Errors start with "model.weights: ".
absl::Status CheckWeights(const std::string& path, const LlamaConfig& cfg);

// What admission checks of each file's tokens, document index and loss mask: the first and
// last 2M entries (8 MiB of tokens each way), so a call takes milliseconds whatever the file's
// size; the ranks check every entry when they open the data.
inline constexpr int64_t kAdmissionCheckLimit = int64_t{1} << 22;

// All of the above for a job (the data-parallel replicas from spec.parallel), and the passkey
// eval's prompts in the model's tokenizer (CheckPasskeyInputs); the warnings the loaders have
// (not errors).
absl::StatusOr<std::vector<std::string>> CheckJobInputs(const JobSpec& spec,
                                                        const LlamaConfig& cfg);

}  // namespace ithaca
