// Trainer: one rank's training loop. Builds the model from a JobSpec (preset or config.json,
// weights or random init), resumes from the newest checkpoint, runs the steps, reports each one
// (the stable step line of docs/architecture.md and a StepReport for whoever listens), and
// checkpoints.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>

#include "engine/backend/ops.h"
#include "engine/comm/comm.h"
#include "engine/memory/allocator.h"
#include "engine/schedule/llama.h"
#include "engine/spec/job_spec.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/train/optimizer_checkpoint.h"
#include "engine/train/evaluator.h"
#include "engine/data/job_inputs.h"
#include "engine/train/lr_schedule.h"
#include "engine/train/optimizer.h"
#include "engine/data/data_loader.h"
#include "engine/train/tensorboard.h"

namespace ithaca {

// One source of a data.weights mix in one step: its samples, their tokens, those trained (the
// loss's denominator) and the mean cross-entropy over them (0 when it trained none).
struct SourceStats {
  std::string path;  // the source's alternative of data.path's brace group
  int64_t samples = 0, tokens = 0, loss_tokens = 0;
  double loss = 0;
};

struct StepReport {
  int64_t step = 0, total_steps = 0;
  double loss = 0;               // mean cross-entropy over the step's trained labels
  int64_t tokens = 0;            // tokens in this step (all ranks of the sample)
  int64_t loss_tokens = 0;       // of which trained (the loss's denominator; masks lower it)
  double seconds = 0;            // wall time of the step
  double tokens_per_second = 0;  // per rank (per GPU)
  double model_tflops = 0;       // docs/benchmarks.md's convention, per rank; with document
                                 // masks only the attention computed (ModelFlopsPerSample)
  double mfu = 0;                // model FLOP/s / Ops::PeakFlops(); 0: the peak is unknown
  double grad_norm = 0;
  double lr = 0;
  // Under optimizer offload (memory.optimizer_offload): the CPU AdamW's time, and how long the
  // device waited for the host's update (from the first gradient download to the last upload
  // enqueued); 0 otherwise. With memory.overlap_update, the update of the step before, which
  // ran under this step's forward, and the part of it the device surely waited for (its first
  // unit's, which no queued block hides): 0 on the first step.
  double cpu_update_seconds = 0;
  double device_wait_seconds = 0;
  std::array<int64_t, kNumTiers> mem_current{}, mem_peak{};
  int64_t mem_device_peak = 0;
  // Set when a checkpoint was saved after this step: the save's wall time (every rank waits
  // for rank 0's write) and when it was complete (Unix seconds).
  double checkpoint_seconds = 0;
  int64_t checkpoint_time_unix = 0;
  // The most of the state this rank held on the host at once for that save: one unit's tensors
  // of one kind (written to their files as they arrive).
  int64_t checkpoint_host_bytes = 0;
  // Parameters trained (with [lora] the adapters' alone) and the model's in all.
  int64_t trainable_parameters = 0, parameters = 0;
  // Per source of a data.weights mix, in data.path's order (all ranks' samples); empty
  // without a mix.
  std::vector<SourceStats> sources;
};

// The stable, parseable step line:
// step 12/100 | loss 3.2140 | tok/s/gpu 472.5 | tflops 401.2 | mfu 40.6% | mem 68.1 GiB (params
// 15.4 grads ... ) | 41.3 s
// The "mfu" field is left out when it is 0 (the backend does not know its peak FLOP/s). Under
// optimizer offload a field before the time says how long the CPU update took and how long the
// device waited for it: "| cpu adamw 1.10 s (device waited 1.32 s) |". A data.weights mix
// adds each source's samples and loss before the time: "| source 1: 3 samples loss 3.2140,
// source 2: 1 sample loss 2.9012 |" (a source the step did not sample: "source 2: 0 samples").
std::string FormatStepLine(const StepReport& r);

// The step's TensorBoard scalars (metrics.tensorboard): train/loss, train/lr, train/grad_norm,
// train/tokens_per_second (per rank), train/step_seconds, memory/device_peak_gib and each
// tier's memory/<tier>_peak_gib (the step's peak), train/model_tflops, train/mfu (when known);
// with a data.weights mix, per source i (from 1) source/<i>/samples, source/<i>/tokens and,
// when it trained labels in the step, source/<i>/loss.
std::vector<std::pair<std::string, double>> TensorBoardScalars(const StepReport& r);
// An evaluation's: eval/loss (with eval.path), per eval.position_buckets bucket
// eval/position/<begin>-<end> (its loss), and per passkey point
// passkey/<length>/depth_<depth>/accuracy and .../logprob (a multi-key point:
// passkey/<keys>_keys/<length>/depth_<depth>/...).
std::vector<std::pair<std::string, double>> EvalScalars(const EvalReport& r);

// Where a job's start-up went before step 1 (Trainer::Create), printed by rank 0 as
// "start-up 95.1 s: model 0.4 s, optimizer state allocated 31.0 s (pinned host 96.4 GB), initial
// weights 40.2 s, placed 12.1 s, working copy 3.3 s, data and the rest 8.1 s".
struct StartupReport {
  double total_s = 0, model_s = 0;
  Optimizer::StartupTimes optimizer;
};
std::string FormatStartupLine(const StartupReport& r);

// Model FLOPs per token: 6·N (matmul parameters incl. the LM head) + 6·L·S·Hq·D (causal
// attention, forward + backward, no recompute).
double ModelFlopsPerToken(const LlamaConfig& cfg, int64_t seq_len);
// Model FLOPs of one sample whose documents start at doc_starts (empty: one document), counting
// only the attention that is computed: 6·N·S + 6·L·Hq·D·Σ n_d² over its documents' lengths n_d
// (S² for one document, so ModelFlopsPerToken(cfg, S) · S).
double ModelFlopsPerSample(const LlamaConfig& cfg, int64_t seq_len,
                           const std::vector<int64_t>& doc_starts);

// The Ulysses groups: consecutive ranks (on one node, neighbouring GPUs), so every rank of a job
// calls Split(rank / sp, rank). The one rule, for the Trainer and for a rehearsal of its ranks
// (engine/comm/rehearsal_comm.h), which must know what the other ranks pass.
inline SplitArgs UlyssesSplit(int rank, int sp) { return SplitArgs{rank / sp, rank}; }

class Trainer {
 public:
  // `spec` must be resolved (engine/plan/resolve.h ResolveJob; CheckResolved), for the dtype
  // `ops` computes in. `comm` spans the job's ranks (spec.parallel.world of them); nullptr means
  // a single rank. `run_id` names the run (ithaca-worker under ithacad: the daemon and the job)
  // and is saved in its checkpoints: a relaunch of the same run may resume at its last step
  // (to redo an evaluation or export a crash cut short); any other run whose checkpoint.dir
  // holds a checkpoint at or past training.steps is refused, saying so (nothing would train).
  // A resume with another training.steps keeps the schedule's shape (lr_schedule.h) and says
  // what changed on rank 0.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const JobSpec& spec, Ops* ops,
                                                         Allocator* alloc, Comm* comm = nullptr,
                                                         const std::string& run_id = "");
  // Runs from the current step to spec.training.steps (or to `stop_at_step` when > 0, as if
  // interrupted there). `on_step` (optional) sees every report. With an [eval] section it
  // evaluates every eval.every steps and after the last step (also when a job resumes there),
  // printing the eval and passkey lines after the step line on rank 0; `on_eval` (optional) sees
  // each report.
  // An evaluation-only job (training.steps = 0) evaluates once, here.
  absl::Status Run(const std::function<void(const StepReport&)>& on_step = nullptr,
                   int64_t stop_at_step = 0,
                   const std::function<void(const EvalReport&)>& on_eval = nullptr);
  // One evaluation of the current weights: the held-out loss (eval.path) and the passkey eval
  // ([eval.passkey]), whichever the job has (collective; FAILED_PRECONDITION with neither).
  absl::StatusOr<EvalReport> Evaluate();

  const TrainState& state() const { return state_; }
  const StartupReport& startup() const { return startup_; }
  // The learning-rate schedule the steps follow (continued after a resume, lr_schedule.h).
  const LrSchedule& lr_schedule() const { return schedule_; }
  LlamaModel* model() { return model_.get(); }
  // The f32 master weights, whole, per unit (collective: every rank calls it).
  absl::StatusOr<HostWeights> GatherMasterWeights();
  // Writes a checkpoint of the current state now (collective; a no-op, reporting nothing,
  // without checkpoint.dir). Rank 0 prints the "checkpoint step N: ..." line.
  absl::StatusOr<CheckpointSaveReport> SaveCheckpointNow();
  // Where the end of the job writes the checkpoint.export directory: checkpoint.dir/export.
  static std::string ExportDir(const JobSpec& spec) { return spec.checkpoint.dir + "/export"; }
  // Where rank 0 writes TensorBoard event files (metrics.tensorboard): checkpoint.dir/tensorboard.
  static std::string TensorBoardDir(const JobSpec& spec) {
    return spec.checkpoint.dir + "/tensorboard";
  }

 private:
  Trainer() = default;
  // One optimizer step. The host waits for the device twice, both for the report: once for the
  // loss and gradient norm (read together, before the update), once at the end for the time.
  absl::StatusOr<StepReport> TrainStep();
  // Rank 0 writes checkpoint.export (when the spec asks for one) from the newest checkpoint.
  absl::Status ExportNow();
  // With LoRA the export is a PEFT adapter directory of the checkpoint's adapters.
  absl::Status ExportLoraAdapter(const std::string& checkpoint);

  JobSpec spec_;
  StartupReport startup_;
  LlamaConfig cfg_;
  Ops* ops_ = nullptr;
  Allocator* alloc_ = nullptr;
  Comm* comm_ = nullptr;           // the world (nullptr: one rank)
  std::unique_ptr<Comm> sp_comm_;  // this rank's Ulysses group
  int rank_ = 0, world_ = 1, dp_ = 1, dp_rank_ = 0;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<DataLoader> data_;       // null in an evaluation-only job
  std::vector<std::string> source_paths_;  // a data.weights mix's sources; empty without one
  std::unique_ptr<Evaluator> evaluator_;   // null without eval.path
  std::unique_ptr<PasskeyEval> passkey_;   // null without [eval.passkey]
  // Rank 0 with metrics.tensorboard: checkpoint.dir/tensorboard's event file of this run.
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  int64_t evaluated_step_ = -1;  // the step of this process's newest evaluation
  TrainState state_;
  LrSchedule schedule_;
};

}  // namespace ithaca
