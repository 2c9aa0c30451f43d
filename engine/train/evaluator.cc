#include "engine/train/evaluator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/data/job_inputs.h"

namespace ithaca {

std::string FormatEvalLine(const EvalReport& r) {
  // exp() of a large loss overflows to inf, which prints as "inf": honest and still parseable.
  return absl::StrFormat("eval step %d: loss %.4f (ppl %.1f) over %d tokens, %d batches, %.2f s",
                         r.step, r.loss, std::exp(r.loss), r.tokens, r.batches, r.seconds);
}

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::Create(const JobSpec& spec, LlamaModel* model,
                                                             Comm* world, int dp, int dp_rank,
                                                             const TokenFile* training_file) {
  std::unique_ptr<Evaluator> e(new Evaluator());
  e->eval_ = spec.eval;
  e->seq_len_ = spec.data.seq_len;
  e->document_mask_ = spec.data.document_mask;
  e->micro_batch_ = spec.data.micro_batch;
  e->model_ = model;
  e->world_ = world;
  e->dp_ = dp;
  e->dp_rank_ = dp_rank;

  ASSIGN_OR_RETURN(e->data_, OpenEvalData(spec, model->config(), training_file, dp));
  for (const std::string& w : e->data_->warnings()) e->warnings_.push_back("eval.path: " + w);
  return e;
}

DocumentMask SampleDocuments(const DataLoader& data) {
  DocumentMask docs;
  docs.starts = data.sample_doc_starts();
  // A window that starts inside a document: its cut part is a document of its own.
  if (docs.starts.empty() || docs.starts[0] != 0) docs.starts.insert(docs.starts.begin(), 0);
  return docs;
}

absl::StatusOr<EvalReport> Evaluator::Run(int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  Ops* ops = model_->ops();
  const int64_t S = seq_len_;
  // Window i of the evaluation goes to replica i mod dp; every rank reads them all, so each
  // knows the evaluation's token count without a collective.
  data_->set_position(0);
  ASSIGN_OR_RETURN(Buffer sums, Buffer::Make(model_->allocator(), DType::kF32, {micro_batch_},
                                             Tier::kActivations));
  std::vector<int32_t> inputs(S), labels(S);
  std::vector<float> host(micro_batch_);
  double loss_sum = 0;  // this rank's
  int64_t tokens = 0;   // every rank's
  for (int64_t b = 0; b < eval_.batches; ++b) {
    // A micro-batch's windows go to the device before its compute, as in a training step.
    std::vector<DeviceSample> mine;
    for (int64_t i = 0; i < micro_batch_ * dp_; ++i) {
      data_->Next(inputs.data(), labels.data());
      tokens += std::count_if(labels.begin(), labels.end(), [](int32_t v) { return v >= 0; });
      if (i % dp_ != dp_rank_) continue;
      const DocumentMask docs = document_mask_ ? SampleDocuments(*data_) : DocumentMask{};
      ASSIGN_OR_RETURN(DeviceSample d, model_->UploadSample(inputs.data(), labels.data(), S, docs));
      mine.push_back(std::move(d));
    }
    for (size_t k = 0; k < mine.size(); ++k) {
      RETURN_IF_ERROR(model_->Forward(mine[k], sums.tensor().Slice(k, {1})));
    }
    ops->Download(sums.tensor(), host.data(), DType::kF32);
    for (float v : host) loss_sum += v;
  }
  // The mean over every rank's tokens: the loss sums of the sequence shards and of the
  // replicas add up (the token count is already global).
  ASSIGN_OR_RETURN(Buffer total,
                   Buffer::Make(model_->allocator(), DType::kF32, {1}, Tier::kActivations));
  const float local = static_cast<float>(loss_sum);
  ops->Upload(&local, DType::kF32, total.tensor());
  if (world_ != nullptr && world_->size() > 1) RETURN_IF_ERROR(world_->AllReduce(total.tensor()));
  float global = 0;
  ops->Download(total.tensor(), &global, DType::kF32);
  if (tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval.path: ", eval_.path, ": no labelled token in the evaluated windows"));
  }
  EvalReport r;
  r.step = step;
  r.loss = global / static_cast<double>(tokens);
  if (!std::isfinite(r.loss)) {
    return NonFiniteLossError(absl::StrCat("eval loss is ", r.loss, " at step ", step));
  }
  r.tokens = tokens;
  r.batches = eval_.batches;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace ithaca
