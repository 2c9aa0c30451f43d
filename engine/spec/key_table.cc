// The key table: every section and key of the job spec, each key with its codec (how it is read,
// written back and documented) and its documentation. Parsing, JobSpecToToml, CheckResolved and
// docs/spec.md all walk it (job_spec.cc).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend/attention_choice.h"
#include "engine/spec/job_spec_internal.h"
#include "engine/spec/key_codecs.h"

namespace ithaca {
namespace spec_internal {

const std::vector<Section>& Sections() {
  static const auto* sections = new std::vector<Section>{
      {"", "The job.", {}},
      {"model", "The model: a preset, or a Hugging Face config.json and weights.", {}},
      {"model.rope",
       "The rotary embedding, overriding the model's config.json (or preset): how a phase of "
       "long-context training extends the model (docs/long_context.md). Unset keys keep the "
       "model's own; `scaling` replaces the model's scaling type and parameters (a parameter "
       "left unset takes transformers' default). Checkpoints record it, a resume with another "
       "RoPE is refused (start a new phase with `[init] from`), and the export's config.json "
       "writes it in the model's dialect. Written only when a key is set.",
       [](const JobSpec& s) { return s.model.rope.set(); }},
      {"init",
       "A weights-only start: only the weights are loaded, and the run starts at step 0 with a "
       "fresh optimizer, learning-rate schedule and data position (a new phase; a resume is "
       "`checkpoint.resume`). Written only when `from` is set.",
       [](const JobSpec& s) { return !s.init.from.empty(); }},
      {"lora",
       "LoRA: adapters on a frozen base, as PEFT makes them. Each targeted linear computes "
       "y = W x + (alpha / rank) B A x, with A [rank, in] and B [out, rank] trained in f32 "
       "(AdamW, weight decay on both, gradient clipping over them alone) and every base weight "
       "frozen: no gradient, no optimizer state (docs/training.md). Checkpoints hold the adapters "
       "and their optimizer state (a resume takes the base from where the run started); "
       "`checkpoint.export` writes a PEFT adapter directory (f32). Written only when `rank` is "
       "set.",
       [](const JobSpec& s) { return s.lora.enabled(); }},
      {"data", "The training data: token files written by `ithaca-tokenize`.", {}},
      {"training",
       "The optimizer (AdamW) and the learning-rate schedule (warmup, then a decay).",
       {}},
      {"parallel", "Ranks, Ulysses context parallelism and FSDP.", {}},
      {"memory",
       "Memory techniques (docs/schedules.md). \"auto\" settings are chosen by the planner to "
       "fit the budgets.",
       {}},
      {"checkpoint", "Saved training state, resume, and the final Hugging Face export.", {}},
      {"metrics", "Step reports.", {}},
      {"eval",
       "Held-out loss, measured with no gradients. Optional: without the section the job never "
       "evaluates.",
       [](const JobSpec& s) { return !s.eval.path.empty() || !s.eval.passkey.lengths.empty(); }},
      {"eval.passkey",
       "Retrieval at length (the passkey test): prompts of filler text with a 5-digit key at a "
       "depth, built with the model's own tokenizer (its tokenizer.json, else byte-level) and "
       "scored teacher-forced under the job's parallel layout, at each `eval.every` and after "
       "the last step (docs/training.md). Optional; `eval.path` is then optional too.",
       [](const JobSpec& s) { return !s.eval.passkey.lengths.empty(); }},
      {"retry",
       "What ithacad does when the job fails in a way that need not repeat (a rank killed or "
       "crashed, a lost heartbeat; not a bad spec, a NaN loss or out of memory): it queues the "
       "job again and it resumes from its newest checkpoint (docs/jobs.md).",
       {}},
      {"slurm",
       "Where ithacad --cluster slurm runs the job: on `nodes` Slurm nodes, parallel.world / "
       "nodes ranks each (docs/jobs.md). The other keys override the daemon's --slurm-* flags. "
       "Written only when one is set.",
       [](const JobSpec& s) {
         return s.slurm.nodes != 1 || !s.slurm.partition.empty() || !s.slurm.account.empty() ||
                !s.slurm.time_limit.empty() || !s.slurm.constraint.empty() ||
                s.slurm.signal_grace != 0;
       }},
      {"kernels",
       "Which kernel runs each pass of attention on the CUDA backend (ignored on the CPU). "
       "\"auto\" is resolved at admission by the measured rule "
       "(engine/backend/attention_choice.cc), "
       "so the stored spec names the kernel that runs. A CPU job's spec is written without it.",
       [](const JobSpec& s) {
         return s.backend == "cuda" || s.kernels.attention_forward != "auto" ||
                s.kernels.attention_backward != "auto";
       }},
  };
  return *sections;
}

const std::vector<Key>& Keys() {
  static const auto* keys = new std::vector<Key>{
      {"name", Str(FIELD(name)), "The job's name, shown by `ithaca list` (at most 256 bytes)."},
      {"backend", Str(FIELD(backend), {"cpu", "cuda"}), "Where the ranks run."},

      {"model.preset", Str(FIELD(model.preset), PresetNames()),
       "A built-in model; `tiny` is the demo and test model.",
       [](const JobSpec& s) { return s.model.config.empty(); }},
      {"model.config", Str(FIELD(model.config)),
       "Path to a Hugging Face config.json; overrides `preset` when set."},
      {"model.weights", Str(FIELD(model.weights)),
       "Safetensors file, index or directory to start from; empty: random initialization."},
      {"model.dtype", StrOrAuto(FIELD(model.dtype), {"auto", "bf16", "f32"}),
       "Activation dtype; \"auto\" is the backend's own (bf16 on CUDA, f32 on the CPU)."},

      {"model.rope.theta", Float(FIELD(model.rope.theta), Above(0).WhenGiven()),
       "RoPE base (`rope_theta`); 0: the model's.",
       [](const JobSpec& s) { return s.model.rope.theta != 0; }},
      {"model.rope.scaling",
       Str(FIELD(model.rope.scaling), {"none", "linear", "llama3", "yarn"},
           /*or_empty=*/true),
       "The scaling type (`rope_scaling`'s `rope_type`), with its parameters below; \"none\": "
       "plain RoPE; empty: the model's type and parameters.",
       [](const JobSpec& s) { return !s.model.rope.scaling.empty(); }},
      {"model.rope.factor", Float(FIELD(model.rope.factor), Above(0).WhenGiven()),
       "linear, llama3, yarn: the context's scaling factor (required with them).",
       [](const JobSpec& s) { return s.model.rope.factor != 0; }},
      {"model.rope.low_freq_factor", Float(FIELD(model.rope.low_freq_factor), Above(0).WhenGiven()),
       "llama3; 0: 1.", [](const JobSpec& s) { return s.model.rope.low_freq_factor != 0; }},
      {"model.rope.high_freq_factor",
       Float(FIELD(model.rope.high_freq_factor), Above(0).WhenGiven()), "llama3; 0: 4.",
       [](const JobSpec& s) { return s.model.rope.high_freq_factor != 0; }},
      {"model.rope.beta_fast", Float(FIELD(model.rope.beta_fast), Above(0).WhenGiven()),
       "yarn; 0: 32.", [](const JobSpec& s) { return s.model.rope.beta_fast != 0; }},
      {"model.rope.beta_slow", Float(FIELD(model.rope.beta_slow), Above(0).WhenGiven()),
       "yarn; 0: 1.", [](const JobSpec& s) { return s.model.rope.beta_slow != 0; }},
      {"model.rope.attention_factor",
       Float(FIELD(model.rope.attention_factor), Above(0).WhenGiven()),
       "yarn: what rotated q and k are multiplied by; 0: 0.1 ln(factor) + 1.",
       [](const JobSpec& s) { return s.model.rope.attention_factor != 0; }},
      {"model.rope.original_max_position_embeddings",
       Int(FIELD(model.rope.original_max_position_embeddings), Between(1, kMaxSeqLen).WhenGiven()),
       "llama3, yarn: the context the model was trained at before scaling; 0: the model's "
       "(its scaling's, else its max_position_embeddings).",
       [](const JobSpec& s) { return s.model.rope.original_max_position_embeddings != 0; }},

      {"init.from", Str(FIELD(init.from)),
       "Start from these weights only: a `checkpoint.dir` (its newest checkpoint), one step "
       "directory, a Hugging Face model directory, or `job:ID` (that job's newest checkpoint; "
       "ithacad stores its checkpoint.dir). Refused when `checkpoint.dir` already holds a run; not "
       "with `model.weights`."},

      {"lora.rank", Int(FIELD(lora.rank), Between(1, 65536).WhenGiven()),
       "The adapters' rank r (PEFT's `r`); 0: no LoRA, every weight trained."},
      {"lora.alpha", Float(FIELD(lora.alpha), Above(0).WhenGiven()),
       "PEFT's `lora_alpha`: the adapters' output is scaled by alpha / rank. Required with "
       "`rank`."},
      {"lora.targets",
       StrList(FIELD(lora.targets),
               {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
       "The linears that get adapters, by their Hugging Face module names (PEFT's "
       "`target_modules`). Required with `rank`."},
      {"lora.init", Str(FIELD(lora.init)),
       "A PEFT adapter directory (adapter_config.json, adapter_model.safetensors) to start "
       "from; its r, lora_alpha and target_modules must be this section's. Empty: PEFT's own "
       "init, A Kaiming-uniform (seeded by `training.seed`) and B zero."},
      {"lora.dropout", Float(FIELD(lora.dropout), AtLeast(0).WhenGiven()),
       "PEFT's `lora_dropout`; only 0 is implemented."},
      {"lora.merge_on_export", Bool(FIELD(lora.merge_on_export)),
       "`checkpoint.export` writes the model with the adapters merged into its weights "
       "(W + alpha / rank B A, the existing export format) to `checkpoint.dir/export`, and the "
       "PEFT adapter to `checkpoint.dir/export-adapter`; false: the PEFT adapter to "
       "`checkpoint.dir/export`. Needs `model.weights` or `init.from` (the base to merge into)."},

      {"data.path", Str(FIELD(data.path)),
       "Token file(s) to train on, or a glob (`shards/*.tok`, `{a.tok,b.tok}`). Required unless "
       "`training.steps = 0`."},
      {"data.weights", FloatList(FIELD(data.weights)),
       "A weighted mix of sources: `data.path` is one brace group `{A,B,...}` (each source a "
       "file, glob or group) and source i gets weights[i] / sum of the samples, exactly (a "
       "fixed interleave, resumable); at most 3 decimals each. Empty: one source."},
      {"data.seq_len", Int(FIELD(data.seq_len), Between(2, kMaxSeqLen)),
       "Tokens per sample: the context length S."},
      {"data.micro_batch", Int(FIELD(data.micro_batch), Between(1, kMaxMicroBatch)),
       "Samples per micro-step."},
      {"data.shuffle", Bool(FIELD(data.shuffle)),
       "Windows in a seeded (`training.seed`), resumable random order."},
      {"data.document_mask", Bool(FIELD(data.document_mask)),
       "Packed documents: attention stays inside each document and RoPE positions restart at "
       "each; a label that would cross into the next document is not trained."},
      {"data.loss_mask", Bool(FIELD(data.loss_mask)),
       "SFT: train only the tokens the token file's loss mask marks (`ithaca-tokenize --sft`); "
       "every file of every source must carry one (a mix of SFT and pretraining sources: "
       "`source_loss_mask`)."},
      {"data.source_loss_mask", BoolList(FIELD(data.source_loss_mask)),
       "Per source of a mix (`data.weights`, in its order): true trains only the tokens its "
       "files' loss masks mark (SFT; each file must carry one), false every label (a "
       "pretraining source; a loss mask its files carry is not used). Empty: `loss_mask` "
       "decides for every source. Not with `loss_mask = true`. Steps still train the mean over "
       "their trained labels; the held-out loss is masked only under `loss_mask`."},
      {"data.byte_tokens", Bool(FIELD(data.byte_tokens)),
       "Byte-level token files for a model that has its own tokenizer.json are meant (else "
       "refused: tokenize with `ithaca-tokenize --tokenizer MODEL_DIR`)."},

      {"training.steps", Int(FIELD(training.steps), AtLeast(0)),
       "Optimizer steps; 0: an evaluation-only job (needs [eval])."},
      {"training.lr", Float(FIELD(training.lr)), "Peak learning rate."},
      {"training.min_lr", Float(FIELD(training.min_lr), AtLeast(0)),
       "Learning rate at the end of the decay, absolute; when not given, `min_lr_ratio` x `lr`."},
      {"training.min_lr_ratio", Float(FIELD(training.min_lr_ratio), Between(0, 1)),
       "The end of the decay as a fraction of `lr` (TorchTitan's way), unless `min_lr` is given; "
       "not both. The stored spec holds the absolute `min_lr`.",
       /*written=*/[](const JobSpec&) { return false; }},
      {"training.schedule", Str(FIELD(training.schedule), {"cosine", "linear", "wsd", "constant"}),
       "After warmup: cosine or linear decay to `min_lr`, wsd (hold `lr`, then decay linearly "
       "over the last `decay_ratio` of the steps after warmup), or constant."},
      {"training.decay_ratio", Float(FIELD(training.decay_ratio), Between(0, 1)),
       "wsd: the fraction of the steps after warmup spent decaying."},
      {"training.warmup_steps", Int(FIELD(training.warmup_steps), AtLeast(0)),
       "Linear warmup steps."},
      {"training.weight_decay", Float(FIELD(training.weight_decay), AtLeast(0)),
       "AdamW weight decay, on matrices only."},
      {"training.beta1", Float(FIELD(training.beta1), From(0, 1)), "AdamW beta1."},
      {"training.beta2", Float(FIELD(training.beta2), From(0, 1)), "AdamW beta2."},
      {"training.eps", Float(FIELD(training.eps), Above(0)), "AdamW epsilon."},
      {"training.grad_clip",
       Float(FIELD(training.grad_clip), AtLeast(0).Noting("0 disables clipping")),
       "Maximum global gradient norm; 0 disables clipping."},
      {"training.grad_accum", Int(FIELD(training.grad_accum), Between(1, kMaxGradAccum)),
       "Micro-steps per optimizer step."},
      {"training.seed", Seed(FIELD(training.seed)), "Seeds the initialization and the data order."},

      {"parallel.world", Int(FIELD(parallel.world), Between(1, kMaxWorld)), "Ranks (one per GPU)."},
      {"parallel.sp", Int(FIELD(parallel.sp), AtLeast(1)),
       "Sequence-parallel group size (each sample's tokens split over it); divides `world`. "
       "It is u x r: Ulysses (by heads) inside groups of u consecutive ranks, ring attention "
       "across the r groups (`parallel.ring`)."},
      {"parallel.ring", IntOrAuto(FIELD(parallel.ring)),
       "r of parallel.sp = u x r; divides `sp`. \"auto\": the smallest r (Ulysses as wide as "
       "the model's heads allow: u divides the query heads, and divides or is a multiple of "
       "the K/V heads)."},
      {"parallel.fsdp", Bool(FIELD(parallel.fsdp)),
       "Shard parameters, gradients and optimizer state over the data-parallel ranks."},

      {"memory.recompute",
       EnumOrAuto(FIELD(memory.recompute), RecomputePolicyNames(), RecomputePolicy::kAuto),
       "Activation recompute: what each block keeps for its backward (the `block_inputs` tier); "
       "the backward computes the rest again. \"auto\": the policy (and per-block mix) of the "
       "plan with the shortest predicted step that fits. Was `memory.checkpoint`."},
      {"memory.attention_aware_blocks", IntOrAll(FIELD(memory.attention_aware_blocks)),
       "Under \"attention-aware\": how many blocks, the last ones, keep their attention's O and "
       "LSE; the others recompute fully (a per-block mix). \"all\": every block."},
      {"memory.offload", BoolOrAuto(FIELD(memory.offload)),
       "Saved block inputs go to pinned host memory (the `host_block_inputs` tier); \"auto\": "
       "when the plan that fits with the shortest predicted step does so (off unless nothing "
       "fits on the device)."},
      {"memory.offload_keep_last", IntOrAutoFromZero(FIELD(memory.offload_keep_last)),
       "Under offload: how many blocks, the last ones, keep their saved data on the device "
       "instead (the device's room beside the host's). \"auto\": as many as make the plan "
       "with the shortest predicted step that fits (0 unless the host cannot hold every "
       "block's input)."},
      {"memory.prefetch", BoolOrAuto(FIELD(memory.prefetch)),
       "Offloaded inputs come back one block ahead (else just in time); \"auto\": on unless "
       "the planner turns it off to fit."},
      {"memory.recompute_interval", IntOrAuto(FIELD(memory.recompute_interval)),
       "Save every k-th block's input; regrow the rest in the backward; \"auto\": 1 unless the "
       "planner saves fewer (under offload) to fit. Was `memory.checkpoint_interval`."},
      {"memory.saved_block_inputs", Int(FIELD(memory.saved_block_inputs), AtLeast(2).OrZero("off")),
       "Hold at most this many block inputs at once (saved by the forward and regrown by the "
       "backward together), choosing where to save and regrow for the fewest extra block "
       "forwards; 0: `memory.recompute_interval` decides (with it \"auto\", the planner may "
       "hold at most 8 to 3 inputs to fit)."},
      {"memory.head_chunk", IntOrAuto(FIELD(memory.head_chunk)),
       "Query heads per UPipe attention stage."},
      {"memory.tile_tokens", IntOrAuto(FIELD(memory.tile_tokens)), "Tokens per MLP / loss tile."},
      {"memory.overlap", BoolOrAuto(FIELD(memory.overlap)),
       "Collectives under compute (FSDP gathers a block ahead, UPipe exchanges a stage ahead), "
       "for more buffers; \"auto\": on unless the planner turns it off to fit."},
      {"memory.gpu_budget_gib", FloatOrNode(FIELD(memory.gpu_budget_gib)),
       "Per-rank device budget (on the CPU backend the rank's share of host memory)."},
      {"memory.host_budget_gib", FloatOrNode(FIELD(memory.host_budget_gib)),
       "Per-rank pinned host memory for every host tier (offloaded block data, optimizer "
       "state)."},
      {"memory.optimizer_offload", BoolOrAuto(FIELD(memory.optimizer_offload)),
       "The f32 master weights and Adam m, v in pinned host memory, updated by the CPU AdamW "
       "(bit for bit the device's update); \"auto\": when nothing fits the GPU budget without "
       "it, or the planner predicts a step at least 3 % faster with it."},
      {"memory.param_offload", BoolOrAuto(FIELD(memory.param_offload)),
       "The bf16 working copy in pinned host memory too, uploaded a unit ahead of use, so the "
       "GPU holds about two units of weights; needs memory.optimizer_offload on (or \"auto\"); "
       "\"auto\": when the job does not fit the GPU budget with the optimizer's state on the "
       "host alone, or the planner predicts a step at least 3 % faster with it."},
      {"memory.overlap_update", Bool(FIELD(memory.overlap_update)),
       "Under optimizer offload, each step's CPU update runs under the next forward, unit by "
       "unit just before the forward reads each unit (the same bits); false: between the steps, "
       "the device idle."},

      {"checkpoint.dir", Str(FIELD(checkpoint.dir)), "Where checkpoints go; empty: none."},
      {"checkpoint.every", Int(FIELD(checkpoint.every), AtLeast(0)),
       "Steps between checkpoints; 0: only at the end."},
      {"checkpoint.resume", Bool(FIELD(checkpoint.resume)),
       "Resume from the latest checkpoint in `dir` when one exists."},
      {"checkpoint.keep", Int(FIELD(checkpoint.keep), AtLeast(1)), "Newest checkpoints kept."},
      {"checkpoint.export", Str(FIELD(checkpoint.export_dtype), {"bf16", "f32"}, /*or_empty=*/true),
       "At the end, also write the final weights as a Hugging Face directory (`dir/export`) in "
       "this dtype; empty: no export."},

      {"metrics.log_every", Int(FIELD(metrics.log_every), AtLeast(1)), "Steps between step lines."},
      {"metrics.tensorboard", Bool(FIELD(metrics.tensorboard)),
       "Rank 0 also writes TensorBoard event files to `checkpoint.dir/tensorboard` (every step's "
       "loss, lr, grad_norm, tokens/s, memory; each evaluation's loss)."},

      {"eval.path", Str(FIELD(eval.path)),
       "Held-out token file(s) or a glob, read in order from the start each time."},
      {"eval.every", Int(FIELD(eval.every), AtLeast(0).Noting("0: only after the last step")),
       "Steps between evaluations; 0: only after the last step (always then)."},
      {"eval.batches", Int(FIELD(eval.batches), Between(1, kMaxEvalBatches)),
       "Micro-batches of `data.micro_batch` windows per data-parallel replica."},
      {"eval.position_buckets", IntList(FIELD(eval.position_buckets)),
       "The held-out loss by position: the bounds between position buckets, increasing, each in "
       "[1, `data.seq_len`); `[1024, 4096]` reports the loss of the tokens at positions [0, 1024), "
       "[1024, 4096) and [4096, `data.seq_len`). A label's position is how many tokens precede "
       "the token it is predicted from in its window (with `data.document_mask`, in its "
       "document), so a far bucket shows what the far context is worth. Needs `eval.path` (long "
       "documents); each bucket costs the evaluation one forward. Empty: not split."},
      {"eval.passkey.lengths", IntList(FIELD(eval.passkey.lengths)),
       "Prompt lengths in tokens, each at most `data.seq_len` and divisible by `parallel.sp`."},
      {"eval.passkey.depths", FloatList(FIELD(eval.passkey.depths)),
       "Where the key sits in the filler, as fractions 0 (the start) to 1 (just before the "
       "question)."},
      {"eval.passkey.samples", Int(FIELD(eval.passkey.samples), Between(1, kMaxPasskeySamples)),
       "Prompts per (length, depth), each with its own key drawn from `training.seed`."},
      {"eval.passkey.keys", IntList(FIELD(eval.passkey.keys)),
       "Keys hidden in each prompt, one of them asked, each count measured on its own: 1 is the "
       "passkey test; more is multi-key retrieval (numbered keys, the asked one at the depth, the "
       "others spread over the filler, docs/training.md). `[1, 4]` measures both; each count "
       "from 1 to 64."},

      {"retry.max_restarts", Int(FIELD(retry.max_restarts), Between(0, 1000)),
       "Restarts after such failures; 0: the first failure is final."},
      {"retry.backoff_seconds", Float(FIELD(retry.backoff_seconds), Between(0, 86400)),
       "Seconds between a failure and the restart."},

      {"slurm.nodes", Int(FIELD(slurm.nodes), Between(1, 4096)),
       "Slurm nodes; must divide parallel.world. More than 1 needs ithacad --cluster "
       "slurm."},
      {"slurm.partition", Str(FIELD(slurm.partition)),
       "sbatch --partition; empty: ithacad --slurm-partition (else Slurm's default)."},
      {"slurm.account", Str(FIELD(slurm.account)),
       "sbatch --account; empty: ithacad --slurm-account."},
      {"slurm.time_limit", Str(FIELD(slurm.time_limit)),
       "sbatch --time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); empty: ithacad "
       "--slurm-time-limit."},
      {"slurm.constraint", Str(FIELD(slurm.constraint)),
       "sbatch --constraint (node features, e.g. \"h100&ib\"); empty: ithacad "
       "--slurm-constraint."},
      {"slurm.signal_grace", Int(FIELD(slurm.signal_grace), Between(0, 86400)),
       "Seconds of warning (sbatch --signal=USR1@N) before the time limit, and on preemption, in "
       "which the ranks checkpoint and stop and the job is queued again to resume; "
       "0: ithacad --slurm-signal-grace."},

      {"kernels.attention_forward", Str(FIELD(kernels.attention_forward), AttentionKernelNames()),
       "The attention forward's kernel."},
      {"kernels.attention_backward", Str(FIELD(kernels.attention_backward), AttentionKernelNames()),
       "The attention backward's kernel."},
  };
  return *keys;
}

#undef FIELD

const Key& KeyAt(const std::string& path) {
  return *std::find_if(Keys().begin(), Keys().end(), [&](const Key& k) { return k.path == path; });
}

}  // namespace spec_internal
}  // namespace ithaca
