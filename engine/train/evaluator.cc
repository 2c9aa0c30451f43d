#include "engine/train/evaluator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_join.h"
#include "engine/data/job_inputs.h"

namespace ithaca {

std::string FormatEvalLine(const EvalReport& r) {
  // exp() of a large loss overflows to inf, which prints as "inf": honest and still parseable.
  return absl::StrFormat("eval step %d: loss %.4f (ppl %.1f) over %d tokens, %d batches, %.2f s",
                         r.step, r.loss, std::exp(r.loss), r.tokens, r.batches, r.seconds);
}

std::string FormatPositionLine(const EvalReport& r) {
  if (r.positions.empty()) return "";
  std::vector<std::string> parts;
  for (const PositionLoss& b : r.positions) {
    parts.push_back(absl::StrFormat("[%d, %d) %.4f", b.begin, b.end, b.loss));
  }
  return absl::StrFormat("eval step %d by position: %s", r.step, absl::StrJoin(parts, ", "));
}

std::vector<PositionLoss> PositionBuckets(const std::vector<int64_t>& bounds, int64_t seq_len) {
  std::vector<PositionLoss> out;
  int64_t begin = 0;
  for (int64_t b : bounds) {
    out.push_back({begin, b});
    begin = b;
  }
  out.push_back({begin, seq_len});
  return out;
}

std::vector<int64_t> LabelPositions(int64_t seq_len, const DocumentMask& docs) {
  std::vector<int64_t> pos(seq_len);
  size_t d = 0;
  int64_t start = 0;
  for (int64_t i = 0; i < seq_len; ++i) {
    while (d < docs.starts.size() && docs.starts[d] <= i) start = docs.starts[d++];
    pos[i] = i - start;
  }
  return pos;
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
  // One bucket (the whole window) without eval.position_buckets: one forward per window.
  std::vector<PositionLoss> buckets = PositionBuckets(eval_.position_buckets, S);
  const int64_t B = static_cast<int64_t>(buckets.size());
  // Window i of the evaluation goes to replica i mod dp; every rank reads them all, so each
  // knows the evaluation's token counts without a collective.
  data_->set_position(0);
  ASSIGN_OR_RETURN(Buffer sums, Buffer::Make(model_->allocator(), DType::kF32, {micro_batch_ * B},
                                             Tier::kActivations));
  std::vector<int32_t> inputs(S), labels(S), masked(S);
  std::vector<int64_t> bucket_of(S, 0);
  std::vector<float> host(micro_batch_ * B);
  std::vector<double> loss_sum(B, 0);  // this rank's, per bucket
  for (int64_t b = 0; b < eval_.batches; ++b) {
    // A micro-batch's windows go to the device before its compute, as in a training step.
    std::vector<DeviceSample> mine;
    for (int64_t i = 0; i < micro_batch_ * dp_; ++i) {
      data_->Next(inputs.data(), labels.data());
      const DocumentMask docs = document_mask_ ? SampleDocuments(*data_) : DocumentMask{};
      if (B > 1) {
        const std::vector<int64_t> pos = LabelPositions(S, document_mask_ ? docs : DocumentMask{});
        for (int64_t t = 0; t < S; ++t) {
          bucket_of[t] = std::upper_bound(eval_.position_buckets.begin(),
                                          eval_.position_buckets.end(), pos[t]) -
                         eval_.position_buckets.begin();
        }
      }
      for (int64_t t = 0; t < S; ++t) {
        if (labels[t] >= 0) ++buckets[bucket_of[t]].tokens;
      }
      if (i % dp_ != dp_rank_) continue;
      for (int64_t k = 0; k < B; ++k) {
        for (int64_t t = 0; t < S; ++t) masked[t] = bucket_of[t] == k ? labels[t] : -1;
        ASSIGN_OR_RETURN(DeviceSample d,
                         model_->UploadSample(inputs.data(), masked.data(), S, docs));
        mine.push_back(std::move(d));
      }
    }
    // Sample k · B + bucket of the micro-batch sums into slot k · B + bucket.
    for (size_t k = 0; k < mine.size(); ++k) {
      RETURN_IF_ERROR(model_->Forward(mine[k], sums.tensor().Slice(k, {1})));
    }
    ops->Download(sums.tensor(), host.data(), DType::kF32);
    for (size_t k = 0; k < mine.size(); ++k) loss_sum[k % B] += host[k];
  }
  // The means over every rank's tokens: the loss sums of the sequence shards and of the
  // replicas add up (the token counts are already global).
  ASSIGN_OR_RETURN(Buffer total,
                   Buffer::Make(model_->allocator(), DType::kF32, {B}, Tier::kActivations));
  std::vector<float> local(loss_sum.begin(), loss_sum.end()), global(B);
  ops->Upload(local.data(), DType::kF32, total.tensor());
  if (world_ != nullptr && world_->size() > 1) RETURN_IF_ERROR(world_->AllReduce(total.tensor()));
  ops->Download(total.tensor(), global.data(), DType::kF32);
  int64_t tokens = 0;
  double all = 0;
  for (int64_t k = 0; k < B; ++k) {
    tokens += buckets[k].tokens;
    all += global[k];
    if (buckets[k].tokens > 0) buckets[k].loss = global[k] / static_cast<double>(buckets[k].tokens);
  }
  if (tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval.path: ", eval_.path, ": no labelled token in the evaluated windows"));
  }
  EvalReport r;
  r.step = step;
  r.loss = all / static_cast<double>(tokens);
  if (!std::isfinite(r.loss)) {
    return NonFiniteLossError(absl::StrCat("eval loss is ", r.loss, " at step ", step));
  }
  r.tokens = tokens;
  r.batches = eval_.batches;
  if (B > 1) {
    r.positions = std::move(buckets);
    for (const PositionLoss& p : r.positions) {
      if (!std::isfinite(p.loss)) {
        return NonFiniteLossError(absl::StrCat("eval loss at positions [", p.begin, ", ", p.end,
                                               ") is ", p.loss, " at step ", step));
      }
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace ithaca
