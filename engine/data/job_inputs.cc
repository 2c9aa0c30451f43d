#include "engine/data/job_inputs.h"

#include <sys/stat.h>

#include <utility>

#include "engine/core/file_util.h"
#include "engine/core/path_policy.h"
#include "engine/data/passkey_prompt.h"
#include "engine/model/params.h"
#include "engine/model/safetensors.h"

namespace ithaca {
namespace {

// Every error of the eval data names the key it came from; the file is in the message already.
absl::Status EvalPathError(const absl::Status& st) {
  return absl::Status(st.code(), absl::StrCat("eval.path: ", st.message()));
}

absl::StatusOr<std::vector<std::unique_ptr<TokenFile>>> OpenTokenFiles(const std::string& path,
                                                                       int64_t check_limit) {
  ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandDataPath(path));
  std::vector<std::unique_ptr<TokenFile>> files;
  for (const std::string& p : paths) {
    ASSIGN_OR_RETURN(std::unique_ptr<TokenFile> f, TokenFile::Open(p, check_limit));
    files.push_back(std::move(f));
  }
  return files;
}

// The options both loaders share: the model's tokenizer and bos, the spec's masks.
DataOptions DataOptionsFor(const JobSpec& spec, const LlamaConfig& cfg) {
  DataOptions o;
  o.tokenizer_json = ModelTokenizerJson(spec);
  o.document_mask = spec.data.document_mask;
  o.loss_mask = spec.data.loss_mask;
  o.allow_byte_tokens = spec.data.byte_tokens;
  o.bos_id = static_cast<int32_t>(cfg.bos_token_id);
  return o;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataLoader>> OpenTrainingData(const JobSpec& spec,
                                                             const LlamaConfig& cfg,
                                                             int64_t check_limit) {
  DataOptions options = DataOptionsFor(spec, cfg);
  options.shuffle = spec.data.shuffle;
  options.seed = spec.training.seed;
  options.source_loss_mask = spec.data.source_loss_mask;
  if (spec.data.weights.empty()) {
    ASSIGN_OR_RETURN(std::vector<std::unique_ptr<TokenFile>> files,
                     OpenTokenFiles(spec.data.path, check_limit));
    return DataLoader::Create(std::move(files), spec.data.seq_len, cfg.vocab_size, options);
  }
  // data.weights: one source per alternative of data.path's brace group (ParseJobSpec checked
  // that their numbers agree).
  ASSIGN_OR_RETURN(std::vector<std::string> patterns, SplitDataSources(spec.data.path));
  std::vector<std::vector<std::unique_ptr<TokenFile>>> sources;
  for (const std::string& pattern : patterns) {
    ASSIGN_OR_RETURN(std::vector<std::unique_ptr<TokenFile>> files,
                     OpenTokenFiles(pattern, check_limit));
    sources.push_back(std::move(files));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> slots, DataMixSlots(spec.data.weights));
  return DataLoader::CreateMix(std::move(sources), slots, spec.data.seq_len, cfg.vocab_size,
                               options);
}

absl::StatusOr<std::unique_ptr<DataLoader>> OpenEvalData(const JobSpec& spec,
                                                         const LlamaConfig& cfg,
                                                         const TokenFile* training_file, int64_t dp,
                                                         int64_t check_limit) {
  if (spec.eval.path.empty()) {
    return absl::InvalidArgumentError("eval.path: the job has no [eval] section");
  }
  absl::StatusOr<std::vector<std::unique_ptr<TokenFile>>> files =
      OpenTokenFiles(spec.eval.path, check_limit);
  if (!files.ok()) return EvalPathError(files.status());
  DataOptions options = DataOptionsFor(spec, cfg);
  options.shuffle = false;  // the same windows, in the same order, every time
  // The held-out loss is measured as training measures it: within documents, on trained labels.
  absl::StatusOr<std::unique_ptr<DataLoader>> data =
      DataLoader::Create(*std::move(files), spec.data.seq_len, cfg.vocab_size, options);
  if (!data.ok()) return EvalPathError(data.status());
  // A loss on tokens of another tokenizer than the training data's measures nothing, also when
  // the model directory has no tokenizer.json to check either against.
  const TokenFile& first = (*data)->file(0);
  if (training_file != nullptr && (first.fingerprint() != training_file->fingerprint() ||
                                   first.vocab_size() != training_file->vocab_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval.path: ", first.path(), ": made with tokenizer ", FingerprintHex(first.fingerprint()),
        " (vocab_size ", first.vocab_size(), ") but data.path's ", training_file->path(), " with ",
        FingerprintHex(training_file->fingerprint()), " (vocab_size ", training_file->vocab_size(),
        "): evaluate on data of the training data's tokenizer"));
  }
  // Each window is read once per evaluation: wrapping around would count some twice.
  const int64_t needed = spec.eval.batches * spec.data.micro_batch * dp;
  if ((*data)->samples_per_epoch() < needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval.path: ", spec.eval.path, " holds ", (*data)->samples_per_epoch(),
        " windows of data.seq_len + 1 = ", spec.data.seq_len + 1, " tokens; an evaluation reads ",
        needed, " (eval.batches ", spec.eval.batches, " x data.micro_batch ", spec.data.micro_batch,
        " x ", dp, " data-parallel replicas): lower eval.batches or add data"));
  }
  return data;
}

absl::Status CheckWeights(const std::string& path, const LlamaConfig& cfg) {
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader = SafetensorsReader::Open(path);
  if (!reader.ok()) {
    return absl::Status(reader.status().code(),
                        absl::StrCat("model.weights: ", reader.status().message()));
  }
  const ParamLayout layout(cfg);
  for (const ParamUnit& unit : layout.units()) {
    for (const ParamEntry& e : unit.entries) {
      absl::StatusOr<TensorInfo> info = (*reader)->Info(e.hf_name);
      if (!info.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("model.weights: ", path, " has no tensor '",
                                                       e.hf_name,
                                                       "', which the model's config needs"));
      }
      if (info->shape != e.shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.weights: ", path, ": tensor '", e.hf_name, "' has shape ",
            ShapeString(info->shape), ", the model's config needs ", ShapeString(e.shape)));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> CheckJobInputs(const JobSpec& spec,
                                                        const LlamaConfig& cfg) {
  std::vector<std::string> warnings;
  std::unique_ptr<DataLoader> train;
  if (!spec.data.path.empty()) {
    ASSIGN_OR_RETURN(train, OpenTrainingData(spec, cfg, kAdmissionCheckLimit));
    for (const std::string& w : train->warnings()) warnings.push_back(w);
  }
  if (!spec.eval.path.empty()) {
    const int64_t dp = spec.parallel.world / std::max<int64_t>(1, spec.parallel.sp);
    ASSIGN_OR_RETURN(
        std::unique_ptr<DataLoader> eval,
        OpenEvalData(spec, cfg, train ? &train->file(0) : nullptr, dp, kAdmissionCheckLimit));
    for (const std::string& w : eval->warnings()) warnings.push_back("eval.path: " + w);
  }
  if (!spec.model.weights.empty()) RETURN_IF_ERROR(CheckWeights(spec.model.weights, cfg));
  if (!spec.eval.passkey.lengths.empty()) RETURN_IF_ERROR(CheckPasskeyInputs(spec, cfg.vocab_size));
  return warnings;
}

}  // namespace ithaca
