// The memory planner: per-rank peak bytes per tier for (model, world, sp, S, techniques), without
// a GPU and without computing anything. It replays one real training step (forward, backward,
// optimizer state) of the engine's own schedule on the meta device (meta.h), so every buffer the
// schedule allocates is counted at its real size and lifetime; "auto" settings are resolved by
// searching for the fastest configuration that fits the budgets. Packed documents
// (data.document_mask) shrink the attention's work but not the engine's memory (every buffer is
// sized by the sequence, whatever its documents); only the attention kernels' workspaces differ,
// and the plan adds those of the kernels that run. The step line's model TFLOPS count only the
// attention computed (ModelFlopsPerSample).
#pragma once

#include <array>
#include <map>
#include <mutex>
#include <string>

#include "engine/backend/attention_choice.h"
#include "engine/core/status.h"
#include "engine/memory/tiers.h"
#include "engine/model/config.h"
#include "engine/comm/link_model.h"
#include "engine/plan/meta.h"
#include "engine/plan/step_time.h"
#include "engine/schedule/llama.h"
#include "engine/spec/job_spec.h"

namespace ithaca {

struct PlanRequest {
  LlamaConfig cfg;
  int64_t world = 1, sp = 1, seq_len = 0;
  bool document_mask = false;  // data.document_mask: cuDNN's ragged attention workspace
  // kernels.attention_forward / _backward: the workspace follows the kernels that run ("auto":
  // ChooseAttention's choice for the shape, as admission resolves it).
  AttentionKernel attention_forward = AttentionKernel::kAuto;
  AttentionKernel attention_backward = AttentionKernel::kAuto;
  LlamaModel::Options opts;  // head_chunk / tile_tokens 0 are resolved by PlanJob, not here
  // memory.optimizer_offload: the f32 master weights and Adam m, v (12 bytes per parameter of
  // the rank's shards) and two units' staging in the host_optimizer tier instead of the device's
  // optimizer tier.
  bool optimizer_offload = false;
  // memory.param_offload is opts.param_offload: the working copy's shards in the host_params
  // tier (the device holds the units being used and prefetched), and no working-copy staging.
  Device device = Device::kCpu;
  DType act = DType::kF32;
  PlanLimits limits;  // engine/plan/meta.h: the replay's time bound and cancellation
  // The step-time model (step_time.h): rates of the device class (nullptr: no prediction), the
  // links between ranks placed ranks_per_node to a node, and the step's shape around the
  // replayed forward/backward.
  const RateTable* rates = nullptr;
  LinkModel link;
  int ranks_per_node = 8;
  // Forward/backward passes of one step on a data-parallel replica: training.grad_accum
  // micro-steps of data.micro_batch samples, each sample its own pass (Trainer::TrainStep).
  int64_t samples = 1;
  bool overlap_update = true;               // memory.overlap_update
  std::set<GemmShape>* gemm_log = nullptr;  // every GEMM shape of the step (bench/calibrate)
  // Identical block calls replayed from the first one's record (block_tape.h): the same figures
  // as running every block, which false does (the tests' reference).
  bool block_tapes = true;
};

// What the step-time model predicts for a plan (0 where it made no prediction).
struct StepPrediction {
  double step_s = 0;     // one optimizer step: `samples` forward/backward passes and the update
  double tok_per_s = 0;  // the job's tokens (every data-parallel rank's samples) per second
  double forward_backward_s = 0;  // one sample's forward and backward, the streams overlapped
  double update_s = 0;            // the update's share of the step (exposed, not hidden)
  // Busy seconds of one forward/backward by kind, and what the compute stream waited.
  double gemm_s = 0, attention_s = 0, elementwise_s = 0, transfer_s = 0, collective_s = 0;
  double waited_s = 0;
  // Compute seconds of one forward/backward spent running forwards again: blocks regrown because
  // their inputs were not held (saved_block_inputs, recompute_interval), and the backward's
  // recompute of what each block's forward freed (full recompute: attention and the MLP's
  // input; attention-aware: the MLP's input).
  double regrow_s = 0, recompute_s = 0;
  double forward_s = 0;  // compute seconds of the blocks' first forwards, for comparison
  int64_t samples =
      1;  // forward/backwards a step (step_s = samples · forward_backward_s + update_s)
  std::string rates;       // the rate table's device class
  std::string rates_note;  // the table's own note: the GPU and the day it was measured on
};

// "h100, bench/calibrate --backend=cuda on NVIDIA H100 80GB HBM3, 2026-12-06": the table a
// prediction used and where its rates come from (a class without its own measurement says so).
std::string RatesLabel(const StepPrediction& r);

struct MemoryPlan {
  std::array<int64_t, kNumTiers> peak{};     // each tier's own peak over the step
  int64_t device_peak = 0;                   // the highest device total at any moment
  std::array<int64_t, kNumTiers> at_peak{};  // what that highest total is made of, per tier
  int64_t workspace = 0;                     // library workspaces not allocated through the engine
  // What the CUDA caching allocator holds at the end of the step (its size classes replayed,
  // engine/memory SizeClassCache) plus the workspaces: the process's GPU memory less the CUDA
  // context and the libraries' own. At least device_total(); the difference is memory cached
  // in size classes that peak at other moments, which the allocator gives back under pressure.
  int64_t device_reserved = 0;
  // The options the plan was made for (auto settings resolved).
  int64_t head_chunk = 0, tile_tokens = 0;
  bool offload = false, prefetch = true;
  int64_t offload_keep_last = 0;  // under offload: the last blocks' saved data on the device
  int64_t recompute_interval = 1;
  int64_t saved_block_inputs = 0;
  bool overlap = true;
  bool optimizer_offload = false;
  bool param_offload = false;
  RecomputePolicy recompute = RecomputePolicy::kFull;
  int64_t attention_aware_blocks = -1;  // under attention-aware; -1: every block
  StepPrediction predicted;
  // Block calls the replay took from a record (block_tape.h) instead of running them.
  int64_t block_calls_replayed = 0;
  int64_t gpu_budget = 0, host_budget = 0;  // 0: unbounded
  bool fits = true;
  std::string verdict;  // "fits", or what does not fit and by how much
  int64_t device_total() const { return device_peak + workspace; }
  // What the host tiers (host_block_inputs, host_optimizer) hold at most, together: the figure the
  // host budget bounds (each tier's peak, summed: the optimizer's state lives all step long).
  int64_t host_total() const;
};

// ", saved_block_inputs N" when the plan holds at most N block inputs, else "": for the lines
// that print a plan's settings after its recompute_interval.
std::string SavedBlockInputsSetting(int64_t saved_block_inputs);
// "off", "on", or "on (the last N blocks' on the device)" (memory.offload_keep_last): a plan's
// offload as the lines that print its settings say it.
std::string OffloadSetting(bool offload, int64_t keep_last);

// The attention shapes a model's layers run at seq_len tokens: full causal where a layer has no
// window, windowed where it has (a Mistral window: one shape; Qwen2/Qwen3's from
// max_window_layers on: both).
std::vector<AttentionShape> ModelAttentionShapes(const LlamaConfig& cfg, int64_t seq_len,
                                                 bool documents);

// Exactly the given options.
absl::StatusOr<MemoryPlan> PlanMemory(const PlanRequest& req);

// Where a job's ranks run, for the step-time model: the rates of the device class (nullptr:
// DefaultRateTable of the spec's backend and `gpu_name`) and the links between them (empty name:
// the h200-sxm preset on CUDA, none on the CPU), `ranks_per_node` to a node (0: the spec's world
// over its slurm.nodes).
struct PlanHardware {
  const RateTable* rates = nullptr;
  std::string gpu_name;  // NodeResources::gpu_name
  LinkModel link;
  int ranks_per_node = 0;
};

// What first-fit plans of one job at several lengths (`ithaca plan --max-seq-len`) learn of
// each configuration the search tries: the shortest length at which it did not fit. Memory
// grows with the length for a fixed configuration, so at that length and beyond it is not
// replayed again. Thread-safe: concurrent plans of the same job share one.
class FitMemo {
 public:
  // True when `config` is known not to fit at `seq_len`.
  bool KnownNotToFit(const std::string& config, int64_t seq_len) const;
  void RecordNotFit(const std::string& config, int64_t seq_len);
  // The configuration that fit last (PlanJob's own encoding), tried first next time: near the
  // longest length that fits, it is usually the only one that does.
  std::string LastFit() const;
  void RecordFit(const std::string& config);

 private:
  mutable std::mutex mu_;
  std::map<std::string, int64_t> fails_from_;
  std::string last_fit_;
};

// A job's plan for one rank (ResolveJob, engine/plan/resolve.h, is how a job gets one): resolves
// the model, the dtype and every "auto" setting against the budgets, choosing among the
// configurations that fit the one with the shortest predicted step (step_time.h).
//
// What is searched: how saved block data is kept (the spec's way, then without overlap, offload
// with and without prefetch, saving every 2nd/4th/8th block input, or at most 8..3 inputs on the
// device; only where memory.offload, prefetch, overlap, recompute_interval are "auto": a value
// the user set is every plan's), and for each the largest head stage and tile that fit;
// memory.recompute "auto" also tries no recompute, attention-aware on as many of the last
// blocks as fit (the others full) and full; memory.optimizer_offload / param_offload "auto" try
// the state on the device and on the host. The fastest that fits wins (state moves to the host
// only when that is predicted 3 % faster per tier moved, or nothing else fits); when nothing fits,
// the plan with the smallest device total says by how much. Budgets of 0 take the spec's
// memory.gpu_budget_gib / host_budget_gib (0 there: unbounded). `limits` bound the whole search
// (every replay it makes): DEADLINE_EXCEEDED or CANCELLED.
absl::StatusOr<MemoryPlan> PlanJob(const JobSpec& spec, int64_t gpu_budget_bytes = 0,
                                   int64_t host_budget_bytes = 0, const PlanLimits& limits = {},
                                   const PlanHardware& hardware = {});

// What PlanJob minimizes over the plans that fit: the predicted step, 3 % dearer for each tier of
// state moved to the host (it costs host memory and CPU the prediction does not weigh: other
// jobs', the data loader's).
double PlanCost(const MemoryPlan& plan);

// "attention-aware", "attention-aware on the last 12 of 32 blocks", "full", "none".
std::string RecomputeSetting(const MemoryPlan& plan);

// "predicted step 12.3 s, 10650 tok/s (1331 tok/s per rank; rates: h200)", or "" without one.
std::string PredictionLine(const MemoryPlan& plan, int64_t world);

// "12.34 GiB", or MiB below one GiB.
std::string HumanBytes(int64_t bytes);

// The table `ithaca plan` prints: one line per tier, the total, the budgets and the verdict.
std::string FormatPlan(const MemoryPlan& plan);

}  // namespace ithaca
