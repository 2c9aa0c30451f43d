// Evaluator: the held-out loss of the spec's [eval] section, measured with no gradients. It
// runs the training step's own schedule forward only (LlamaModel::Forward: FSDP gathers,
// Ulysses / UPipe attention and the tiles as configured), so it fits wherever training fits, and
// it touches neither the gradients, the optimizer nor the data loader of training.
//
// An evaluation reads eval.path from its first window on, in file order (never shuffled), so
// every evaluation of a job sees the same windows and successive losses are comparable. Like a
// training step, each data-parallel replica takes eval.batches micro-batches of data.micro_batch
// windows (window i of the evaluation goes to replica i mod replicas).
//
// With eval.position_buckets the loss is also split by position: a label's position is how many
// tokens precede the token it is predicted from, in its window (with data.document_mask, in its
// document's part of the window), so position p predicts with p + 1 tokens of context. Each
// bucket is one forward of every window with the labels of the other buckets masked: the split
// needs no per-token loss from the loss head, under any parallel layout, and the buckets' sums
// are the whole loss's (the mean over all tokens is computed from them).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/core/status.h"
#include "engine/schedule/llama.h"
#include "engine/spec/job_spec.h"
#include "engine/data/data_loader.h"
#include "engine/train/passkey.h"

namespace ithaca {

// The documents of the window `data` served last (data.document_mask), in the form attention and
// RoPE take: a window that starts inside a document gets that cut part as its first document.
DocumentMask SampleDocuments(const DataLoader& data);

// One bucket of eval.position_buckets: the held-out loss of the labels at positions [begin, end).
struct PositionLoss {
  int64_t begin = 0, end = 0;
  double loss = 0;     // mean cross-entropy of those labels, every rank's (0 when tokens is 0)
  int64_t tokens = 0;  // labelled tokens at those positions, every rank's
};

// The buckets' [begin, end) for `bounds` (eval.position_buckets) in windows of `seq_len`.
std::vector<PositionLoss> PositionBuckets(const std::vector<int64_t>& bounds, int64_t seq_len);

// The position of each label of a window of `seq_len` (the index of the token it is predicted
// from, less its document's start in `docs`; no documents: the index).
std::vector<int64_t> LabelPositions(int64_t seq_len, const DocumentMask& docs);

struct EvalReport {
  int64_t step = 0;  // optimizer steps done before it (0: an evaluation-only job's model)
  // The held-out loss (eval.path); tokens 0 when the job evaluates only [eval.passkey].
  double loss = 0;                     // mean cross-entropy over the evaluated tokens of every rank
  int64_t tokens = 0;                  // tokens the mean is over (labels < 0 are not counted)
  int64_t batches = 0;                 // eval.batches
  double seconds = 0;                  // wall time of the evaluation (the passkey eval's included)
  std::vector<PasskeyResult> passkey;  // [eval.passkey]: each (keys, length, depth), keys outer
  std::vector<PositionLoss> positions;  // eval.position_buckets: each bucket, positions in order
};

// The companion of the step line:
// eval step 20: loss 3.1234 (ppl 22.8) over 65536 tokens, 8 batches, 1.20 s
std::string FormatEvalLine(const EvalReport& r);
// With eval.position_buckets, the line after it (empty without):
// eval step 20 by position: [0, 1024) 3.2100, [1024, 4096) 2.9800, [4096, 8192) 2.9100
std::string FormatPositionLine(const EvalReport& r);

class Evaluator {
 public:
  // Opens spec.eval.path with OpenEvalData (engine/data/job_inputs.h: data.path's checks, the
  // training data's tokenizer when the job trains, `training_file` being its data's first file,
  // and the windows one evaluation reads). `model` and `world` must outlive the evaluator; `dp`
  // and `dp_rank` are the data-parallel replicas and this rank's.
  static absl::StatusOr<std::unique_ptr<Evaluator>> Create(const JobSpec& spec, LlamaModel* model,
                                                           Comm* world, int dp, int dp_rank,
                                                           const TokenFile* training_file);

  // One evaluation of the model as it is now; `step` is what the report says. Collective: every
  // rank of the job calls it at the same point.
  absl::StatusOr<EvalReport> Run(int64_t step);

  // Things worth saying that are not errors (DataLoader::warnings of the eval data).
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  Evaluator() = default;

  JobSpec::Eval eval_;
  int64_t seq_len_ = 0, micro_batch_ = 1;
  bool document_mask_ = false;
  LlamaModel* model_ = nullptr;
  Comm* world_ = nullptr;
  int dp_ = 1, dp_rank_ = 0;
  std::unique_ptr<DataLoader> data_;
  std::vector<std::string> warnings_;
};

}  // namespace ithaca
