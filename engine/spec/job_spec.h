// JobSpec: a training job, as written in a TOML file. Every key is declared once, as a row of the
// key table in key_table.cc (its path, its member here, its kind and range, whether it may be
// "auto", its documentation), which drives parsing, range checks, writing, CheckResolved and
// docs/spec.md. Parsing rejects unknown keys and bad values with the key's path ("training.lr:
// must be > 0, got -1"). Settings left "auto" (or 0 where a comment says so) are turned into values
// once, by ResolveJob (engine/plan/resolve.h); a resolved spec has none left and is what the
// workers run.
//
// Adding a key: a member here, a row in Keys() (key_table.cc) with its range when it has one
// (Int(FIELD(x), AtLeast(1))), relations to other keys in Validate (job_spec_validate.cc), then
// `bazel run //engine/spec:spec_reference > docs/spec.md`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/config.h"
#include "engine/spec/recompute_policy.h"

namespace ithaca {

// A setting that is on, off, or left to the planner ("auto").
enum class OffloadChoice { kOff, kOn, kAuto };

struct JobSpec {
  std::string name = "job";     // top-level `name`
  std::string backend = "cpu";  // top-level `backend`: "cpu" | "cuda"

  struct Model {
    std::string preset = "tiny";  // "tiny" | "llama-3.2-1b" | "llama-3.2-3b" | "llama-3-8b"
    std::string config;           // path to a config.json (overrides preset when set)
    std::string weights;          // safetensors file / index / directory; empty: random init
    std::string dtype = "auto";   // "auto" | "bf16" (cuda) | "f32" (cpu): the backend's own
    // [model.rope]: the rotary embedding, overriding what the model's config.json (or preset)
    // says (ApplyRopeOverride). A key left unset (0, "") keeps the model's own.
    struct Rope {
      double theta = 0;     // 0: the model's rope_theta
      std::string scaling;  // "" (the model's) | "none" | "linear" | "llama3" | "yarn"
      // The scaling's parameters; each only where `scaling` reads it, 0: its default.
      double factor = 0;                             // linear, llama3, yarn (required)
      double low_freq_factor = 0;                    // llama3 (1)
      double high_freq_factor = 0;                   // llama3 (4)
      double beta_fast = 0;                          // yarn (32)
      double beta_slow = 0;                          // yarn (1)
      double attention_factor = 0;                   // yarn (0.1 ln(factor) + 1)
      int64_t original_max_position_embeddings = 0;  // llama3, yarn (the model's context)
      bool set() const {
        return theta != 0 || !scaling.empty() || factor != 0 || low_freq_factor != 0 ||
               high_freq_factor != 0 || beta_fast != 0 || beta_slow != 0 || attention_factor != 0 ||
               original_max_position_embeddings != 0;
      }
    } rope;
  } model;

  // [init]: a weights-only start (a new phase of a model trained before). Only the weights are
  // loaded: the run starts at step 0 with a fresh optimizer, schedule and data position, and
  // checkpoint.dir must not hold a run already.
  struct Init {
    // A checkpoint.dir (its newest checkpoint), one step directory, a Hugging Face model
    // directory, or "job:ID" (that job's checkpoint.dir: ithacad resolves it at admission).
    std::string from;
  } init;

  // [lora]: LoRA adapters on a frozen base (LoraConfig, engine/model/config.h). rank 0: none.
  struct Lora {
    int64_t rank = 0;
    double alpha = 0;  // the adapters' output is scaled by alpha / rank; required (> 0)
    std::vector<std::string> targets;  // Hugging Face module names: "q_proj", ..., "down_proj"
    std::string init;                  // a PEFT adapter directory to start from; empty: PEFT's init
    double dropout = 0;                // only 0 is implemented
    // checkpoint.export writes the base with the adapters merged in (W + alpha / rank · B A),
    // and the PEFT adapter beside it (export-adapter); false: the PEFT adapter alone.
    bool merge_on_export = false;
    bool enabled() const { return rank > 0; }
  } lora;

  struct Data {
    std::string path;       // token file(s) (engine/data/token_file.h), or a glob ("shards/*.tok",
                            // "{a.tok,b.tok}"); required
    int64_t seq_len = 256;  // tokens per sample (the context length S)
    int64_t micro_batch = 1;  // samples per micro-step
    bool shuffle = true;      // windows in a seeded (training.seed), resumable random order
    // Packed documents: attention stays inside each document of a sample and RoPE positions
    // restart at each (boundaries from the token file's document index, or for a version 1
    // file from the model's bos_token_id); a label that would cross into the next document is
    // not trained.
    bool document_mask = false;
    // SFT: only the tokens the token file's loss mask marks are trained (the file must have
    // one: ithaca-tokenize --sft). The loss is the mean over the trained tokens of the step.
    bool loss_mask = false;
    // Per source of a mix (data.weights), whether it is SFT data: true trains only what its
    // files' loss masks mark (each file must carry one), false every label (a pretraining
    // source). Empty: data.loss_mask decides for every source. Not with data.loss_mask = true.
    std::vector<bool> source_loss_mask;
    // Byte-level token files (ithaca-tokenize without --tokenizer) for a model that has its own
    // tokenizer.json are refused unless this says they are meant (training a byte model on
    // the architecture); the model's own tokens come from `ithaca-tokenize --tokenizer DIR`.
    bool byte_tokens = false;
    // A weighted mix: data.path is one brace group "{A,B,...}" and source i (A, B, ...: each a
    // file, glob or group of its own) gets weights[i] / sum of the samples, exactly: a fixed
    // interleave repeating every DataMixSlots period (engine/data/token_file.h). Empty: no mix
    // (data.path is one source, its files' windows shuffled together).
    std::vector<double> weights;
  } data;

  struct Training {
    int64_t steps = 100;  // 0: an evaluation-only job (needs [eval]; lr may then be 0)
    double lr = 3e-4;
    // Where the decay ends: min_lr (absolute) when the spec gives it, else
    // min_lr_ratio × lr (TorchTitan's way; so a fine-tune's lr = 1e-5 needs nothing else).
    // ParseJobSpec leaves min_lr absolute either way.
    double min_lr = 3e-5;
    double min_lr_ratio = 0.1;
    int64_t warmup_steps = 10;
    // The learning-rate schedule after warmup (engine/train/lr_schedule.h): "cosine",
    // "linear", "wsd" (hold lr, then decay over the last decay_ratio of the steps after
    // warmup) or "constant".
    std::string schedule = "cosine";
    double decay_ratio = 0.2;
    double weight_decay = 0.1;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double grad_clip = 1.0;  // max global gradient norm; 0 disables clipping
    int64_t grad_accum = 1;  // micro-steps per optimizer step
    uint64_t seed = 1234;
  } training;

  struct Parallel {
    int64_t world = 1;  // ranks (one per GPU)
    int64_t sp = 1;     // sequence-parallel group size (u x ring); divides world
    // r of sp = u x r: ring attention across r Ulysses groups of u ranks; 0 ("auto"): the
    // smallest r whose u the model's heads allow (RingFor, engine/spec/validate.h).
    int64_t ring = 0;
    bool fsdp = true;
  } parallel;

  struct Memory {
    RecomputePolicy recompute = RecomputePolicy::kAuto;  // the planner chooses (ResolveJob)
    // Under attention-aware: the last N blocks keep O and LSE, the others recompute fully; -1:
    // every block.
    int64_t attention_aware_blocks = -1;
    // How saved block data is kept: true | false | "auto" each (kAuto, and recompute_interval 0:
    // the planner chooses, ResolveJob writes its choice; a value the user set is kept).
    OffloadChoice offload = OffloadChoice::kAuto;  // saved block inputs in pinned host memory
    // Under offload: the last N blocks' saved data stays on the device; -1: "auto".
    int64_t offload_keep_last = -1;
    // Offloaded inputs come back one block ahead (else just in time).
    OffloadChoice prefetch = OffloadChoice::kAuto;
    int64_t recompute_interval = 0;  // save every k-th block's input; regrow the rest in backward
    // > 0: hold at most this many block inputs at once, saved and regrown, with the fewest
    // regrowing forwards (RecomputeSchedule::AtMost); 0: recompute_interval decides.
    int64_t saved_block_inputs = 0;
    int64_t head_chunk = 0;   // query heads per UPipe stage; 0 = "auto"
    int64_t tile_tokens = 0;  // tokens per MLP / loss tile; 0 = "auto"
    // Collectives under compute (FSDP gathers a block ahead and reductions in flight, UPipe's
    // exchanges a stage ahead): faster across GPUs, for a second set of stage buffers and one
    // more full-size gradient buffer. "auto": on unless the planner turns it off to fit.
    OffloadChoice overlap = OffloadChoice::kAuto;
    // Per rank; 0: from the node (engine/plan/budgets.h BudgetsFor). On the CPU backend the
    // "GPU" budget is the rank's share of the host's memory, which is its device.
    double gpu_budget_gib = 0;
    double host_budget_gib = 0;  // pinned host memory for offloaded block data
    // Each rank's f32 master weights and Adam m, v in (pinned) host memory, updated by the CPU
    // AdamW (engine/train/host_adamw.h): true | false | "auto" (the planner turns it on only
    // when the state does not fit the GPU budget with the job's activations).
    OffloadChoice optimizer_offload = OffloadChoice::kAuto;
    // Each rank's bf16 working copy in (pinned) host memory too, streamed to the device a unit
    // ahead of use (engine/parallel/fsdp.h): true | false | "auto" (the planner turns it on
    // when the job does not fit the GPU budget with the optimizer's state on the host alone, or
    // where the device memory it frees makes the step predicted faster). Needs the optimizer's
    // state on the host (the CPU AdamW writes the working copy).
    OffloadChoice param_offload = OffloadChoice::kAuto;
    // Under optimizer offload: the CPU update of each step runs under the next step's forward,
    // unit by unit just before the forward reads each unit (engine/train/optimizer.h), instead
    // of between the steps with the device idle. The same bits either way.
    bool overlap_update = true;
  } memory;

  struct Checkpoint {
    std::string dir;     // empty: no checkpoints
    int64_t every = 0;   // steps between checkpoints; 0: only at the end
    bool resume = true;  // resume from the latest checkpoint in dir when one exists
    int64_t keep = 2;    // newest checkpoints kept
    // "bf16" or "f32": at the end of the job, also write the final weights as an
    // inference-ready Hugging Face directory (dir/export); empty: no export.
    std::string export_dtype;
  } checkpoint;

  struct Metrics {
    int64_t log_every = 1;  // steps between step lines
    // Rank 0 writes TensorBoard event files to checkpoint.dir/tensorboard
    // (engine/train/tensorboard.h).
    bool tensorboard = false;
  } metrics;

  // Which attention kernel runs each pass on the CUDA backend: "auto" | "cudnn" | "hopper" |
  // "flash" (engine/backend/attention_choice.h). ResolveJob turns "auto" into the kernel the
  // measured rule picks for the job's shape, so the stored spec names what runs.
  struct Kernels {
    std::string attention_forward = "auto";
    std::string attention_backward = "auto";
  } kernels;

  // What ithacad does when the job fails in a way that need not repeat (a rank killed or
  // crashed, a lost heartbeat; not a bad spec, a NaN loss or out of memory): it queues the job
  // again, up to max_restarts times, backoff_seconds after the failure; the job resumes from its
  // newest checkpoint (checkpoint.resume).
  struct Retry {
    int64_t max_restarts = 0;
    double backoff_seconds = 10;
  } retry;

  // Where ithacad --cluster slurm runs the job: `nodes` Slurm nodes, parallel.world / nodes ranks
  // on each (one sbatch task per node running the per-node launcher). The other keys override
  // the daemon's --slurm-* defaults; empty: the daemon's (or Slurm's) default. A daemon without
  // --cluster slurm runs only jobs of one node.
  struct Slurm {
    int64_t nodes = 1;
    std::string partition;   // sbatch --partition
    std::string account;     // sbatch --account
    std::string time_limit;  // sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM[:SS]
    std::string constraint;  // sbatch --constraint (node features)
    // sbatch --signal=USR1@signal_grace: seconds of warning before the time limit (and on
    // preemption) to checkpoint and stop in; 0: the daemon's --slurm-signal-grace.
    int64_t signal_grace = 0;
  } slurm;

  // Held-out loss, measured with no gradients. The section is optional; without it (path empty)
  // the job never evaluates.
  struct Eval {
    std::string path;     // token file(s) or a glob, like data.path; read in order, from the
                          // start each time, so successive evaluations are comparable
    int64_t every = 0;    // steps between evaluations; 0: only after the last step (always then)
    int64_t batches = 8;  // micro-batches of data.micro_batch windows per data-parallel replica
    // The held-out loss split by position (engine/train/evaluator.h): the bounds between
    // buckets, increasing, each in [1, data.seq_len). [1024, 4096] gives the buckets [0, 1024),
    // [1024, 4096) and [4096, data.seq_len). Empty: the loss is not split.
    std::vector<int64_t> position_buckets;
    // [eval.passkey]: retrieval at length (engine/train/passkey.h), run with the loss above (at
    // eval.every and after the last step). Off while `lengths` is empty.
    struct Passkey {
      std::vector<int64_t> lengths;  // prompt tokens of each length measured
      std::vector<double> depths = {0, 0.25, 0.5, 0.75, 1};  // where the key sits, 0..1
      int64_t samples = 4;  // prompts (each with its own key) per (length, depth)
      // Keys hidden in each prompt, one of them asked: 1 is the passkey test, more is
      // multi-key retrieval (engine/data/passkey_prompt.h); each count is its own points.
      std::vector<int64_t> keys = {1};
    } passkey;
  } eval;
};

// Hard bounds, checked by the parser before anything is computed from them.
inline constexpr size_t kMaxJobNameBytes = 256;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 27;  // 134M tokens per sample
inline constexpr int64_t kMaxMicroBatch = 4096;
inline constexpr int64_t kMaxGradAccum = int64_t{1} << 20;
inline constexpr int64_t kMaxStepTokens = int64_t{1} << 32;  // a step's samples: 16 GiB of ids
inline constexpr int64_t kMaxWorld = 65536;
inline constexpr int64_t kMaxEvalBatches = int64_t{1} << 20;
// [eval.passkey]: at most this many lengths and depths, and samples per (length, depth).
inline constexpr size_t kMaxPasskeyPoints = 64;
inline constexpr int64_t kMaxPasskeySamples = 4096;
// eval.passkey.keys: at most this many counts, each at most kMaxPasskeyKeys keys; and at most
// kMaxPasskeyPoints² points (counts x lengths x depths) in all.
inline constexpr size_t kMaxPasskeyKeyCounts = 8;
inline constexpr int64_t kMaxPasskeyKeys = 64;
// eval.position_buckets: at most this many bounds (each bucket costs the evaluation a forward).
inline constexpr size_t kMaxPositionBounds = 31;
// data.weights: at most this many sources, and a mix period of at most kMaxDataMixPeriod samples.
inline constexpr size_t kMaxDataSources = 256;
inline constexpr int64_t kMaxDataMixPeriod = int64_t{1} << 20;

// data.weights as whole samples per period: each weight (with at most 3 decimals) × 1000,
// divided by their greatest common divisor ([0.7, 0.3] → [7, 3]; [3, 1] → [3, 1]). Over every
// period (their sum) of consecutive samples, source i serves exactly slots[i].
// INVALID_ARGUMENT (naming data.weights) for a weight that is not positive, has more decimals,
// or a period over kMaxDataMixPeriod.
absl::StatusOr<std::vector<int64_t>> DataMixSlots(const std::vector<double>& weights);
inline constexpr size_t kMaxSpecStringBytes = 4096;  // every string value (paths: PATH_MAX)

// Parses TOML text; `source` names the file in error messages.
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& toml_text,
                                     const std::string& source = "job.toml");
absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path);
// A spec that an older ithacad stored, with the keys of its version (memory.checkpoint and
// memory.checkpoint_interval, now memory.recompute and memory.recompute_interval), written with
// today's names; any other text unchanged. For stored specs only (the job store reads every spec
// through it, so a job queued or running across an upgrade is still read): a spec submitted now
// with an old key is refused, naming the new one.
std::string UpgradeStoredSpec(const std::string& toml_text);
// The spec's model: config.json when given, else the preset, with [model.rope] applied
// (ApplyRopeOverride).
absl::StatusOr<LlamaConfig> ResolveModelConfig(const JobSpec& spec);
// [model.rope] over the model's own rotary embedding: theta when given; a scaling given
// replaces the model's type and parameters (its unset parameters take transformers' defaults,
// original_max_position_embeddings the model's original context). INVALID_ARGUMENT naming the
// model.rope key for a value the resulting embedding cannot have.
absl::Status ApplyRopeOverride(const JobSpec::Model::Rope& rope, LlamaConfig* cfg);
// "job:ID" in init.from: the job id (empty when `from` is not of that form).
std::string InitFromJob(const std::string& from);

// Writes a spec back as TOML (round-trips through ParseJobSpec).
std::string JobSpecToToml(const JobSpec& spec);

// OK when nothing in `spec` is left to resolve; else INVALID_ARGUMENT naming the first key that
// is still "auto" (the trainer runs only resolved specs).
absl::Status CheckResolved(const JobSpec& spec);

// The rule of a [slurm] string key ("slurm.partition", "slurm.account", "slurm.time_limit",
// "slurm.constraint"), whose value goes on an #SBATCH line: OK, or INVALID_ARGUMENT naming
// `what` (the key, or the ithacad flag that gives its default) and the allowed alphabet.
absl::Status CheckSlurmValue(const std::string& key, const std::string& value,
                             const std::string& what);

// The key reference (docs/spec.md): every section and key with its kind, default and meaning,
// generated from the key table.
std::string SpecReferenceMarkdown();

}  // namespace ithaca
