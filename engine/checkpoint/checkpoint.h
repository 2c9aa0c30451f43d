// Training checkpoints: DIR/step-00000012/ holding model/ (Hugging Face config.json + f32 master
// weights, loadable by transformers), optimizer.safetensors or optimizer/ (Adam m and v under
// the weights' names), state.json (step, data position, world size) and manifest.json (every
// other file's size and CRC-32), written last. Every rank writes its share (see below).
//
// What makes a crash at any moment safe:
// - A checkpoint is written under a hidden temporary name (.step-N.tmp.<run>), every file and
//   directory fsynced, the manifest written last, and only then renamed into place. A step
//   directory counts as complete only when its manifest exists, and loading verifies every
//   file against it, so a checkpoint that lists as complete is whole or a clear DATA_LOSS.
// - Old checkpoints are pruned by renaming them to a hidden trash name first, then deleting, so
//   a kill during a prune never leaves a half-deleted step that still lists as complete.
// - Deleting never follows symbolic links: a link inside a checkpoint is removed, its target is
//   left alone.
// - Temporaries and trash left by a killed process are removed at the next save (and by
//   RemoveStaleCheckpointFiles at start); a save that fails removes its own temporary. The
//   temporary is named after the run and locked while its save is live, so two runs in one
//   directory never delete each other's.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/core/units.h"
#include "engine/model/config.h"
#include "engine/model/params.h"
#include "engine/checkpoint/optimizer_state.h"

namespace ithaca {

class SafetensorsReader;

struct TrainState {
  int64_t step = 0;           // optimizer steps completed
  int64_t data_position = 0;  // samples served by the data loader
  int64_t tokens = 0;         // tokens trained on
  // What a resume needs to keep the run's learning-rate schedule and to tell a relaunch of the
  // same run from a new submission (engine/train/trainer.cc): training.steps of the run that
  // saved it and the rate of its last step (0 in checkpoints older than these fields), and the
  // run's id (Trainer::Create's run_id; "" when it had none).
  int64_t schedule_steps = 0;
  double lr = 0;
  std::string run_id;
  // The model directory the run started from (ModelSourceDir; "" for a preset): ithaca-export
  // copies its tokenizer and generation config when not given --source-model.
  std::string source_model;
  // The run's [lora] (rank 0: none): a LoRA checkpoint holds the adapters alone, and ithaca-export
  // needs their alpha and targets to write the PEFT adapter or merge it into a base. state.json's
  // "lora" ({"r", "lora_alpha", "target_modules"}, PEFT's names); absent in checkpoints saved
  // before 2026-12-07's last version, and in every run without adapters.
  LoraConfig lora;
};

// One process saving alone: BeginCheckpoint, WriteCheckpointShard(rank 0 of 1), CommitCheckpoint.
// `opt` holds every tensor (StateOfWholeUnits makes it from whole units).
absl::Status SaveCheckpoint(const std::string& dir, const LlamaConfig& cfg,
                            const ParamLayout& layout, const OptimizerState& opt,
                            const TrainState& state, int64_t keep);

// ---- Saving from every rank at once (engine/checkpoint/distributed_checkpoint.h runs the ranks).
//
// The files are split among the ranks, by tensor: each rank writes and checksums its share in
// parallel, and holds on the host only the tensors of its share (CheckpointTensorsOf says which;
// Optimizer::Save keeps just those). model/ is the Hugging Face sharded layout (files of at most
// 4 GiB, as many per rank, at least one), so export and transformers read it as it is; the Adam
// moments are the same layout in optimizer/ (or one optimizer.safetensors when a single file holds
// them). Rank 0 also writes config.json, the indexes and state.json (which records the world it was
// saved at), and at the end the manifest, from every rank's checksums. The tensors are whole
// (split by tensor, not by FSDP shard), so a checkpoint saved at one world size loads at any
// other.
//
// The order, with a barrier after each step: rank 0 BeginCheckpoint; every rank
// WriteCheckpointShard; rank 0 CommitCheckpoint.
struct CheckpointWriteReport {
  int64_t bytes = 0;  // what this rank wrote (CommitCheckpoint: the whole checkpoint)
  double seconds = 0;
  // WriteCheckpointShardFrom: the most produced tensor bytes that waited to be written at once.
  int64_t queued_bytes = 0;
};
// The tensors rank `rank` writes in a checkpoint saved at `world`: the one place the split is
// decided (its files are parts rank, rank + world, ... of SafetensorsWriter::WriteShard's split).
// Every tensor is written by exactly one rank.
OptimizerSelection CheckpointTensorsOf(const ParamLayout& layout, int rank, int world);
// Every tensor of whole units (one process holding the whole state: tests, tools).
OptimizerState StateOfWholeUnits(const ParamLayout& layout, const OptimizerShards& whole);
// Held by the rank that began a save until the save is committed or abandoned: a lock (flock)
// on the save's temporary directory, which another run's RemoveStaleCheckpointFiles respects.
class CheckpointSaveLock {
 public:
  CheckpointSaveLock() = default;
  explicit CheckpointSaveLock(int fd) : fd_(fd) {}
  CheckpointSaveLock(CheckpointSaveLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  CheckpointSaveLock& operator=(CheckpointSaveLock&& other) noexcept;
  ~CheckpointSaveLock();

 private:
  int fd_ = -1;
};
// The temporary directory of `state.step`'s save by the run `state.run_id`:
// DIR/.step-N.tmp.<a hash of the run id> ("save" for a run without an id).
std::string CheckpointTempPath(const std::string& dir, const TrainState& state);
// Prepares the step's temporary directory (removing what killed saves left behind, but not a
// live save of another run) and locks it until the returned lock is destroyed.
absl::StatusOr<CheckpointSaveLock> BeginCheckpoint(const std::string& dir, const TrainState& state);
// Removes the temporary of a save that failed before its commit (a full disk, say).
void AbandonCheckpoint(const std::string& dir, const TrainState& state);
// `opt` must hold at least this rank's tensors (CheckpointTensorsOf); it may hold more.
absl::StatusOr<CheckpointWriteReport> WriteCheckpointShard(
    const std::string& dir, const LlamaConfig& cfg, const ParamLayout& layout,
    const OptimizerState& opt, const TrainState& state, int rank, int world);
inline constexpr int64_t kCheckpointWriteQueueBytes = 2 * kGiBBytes;
// Hands each tensor of the rank's share (CheckpointTensorsOf) to the sink, in any order.
using CheckpointProducer = std::function<absl::Status(const OptimizerTensorSink& sink)>;
// WriteCheckpointShard for a state that arrives piecewise (Optimizer::SaveEach): the rank's
// files are opened first and each tensor is written to its place as it comes, on a thread of
// its own, so that the producer's gathers (collective) go on meanwhile and the ranks write at
// the same time, not in turn. At most kCheckpointWriteQueueBytes of produced tensors wait (or
// one tensor, if larger), so the host holds that beyond what the producer does. Errors name a
// tensor that is misshapen, not the rank's, or never produced. `produce` runs exactly once, also
// when the files cannot be opened (its sink then answers that error): a producer's collectives must
// run on every rank.
absl::StatusOr<CheckpointWriteReport> WriteCheckpointShardFrom(
    const std::string& dir, const LlamaConfig& cfg, const ParamLayout& layout,
    const TrainState& state, int rank, int world, const CheckpointProducer& produce);
// Writes the manifest (DATA_LOSS naming a rank whose share is missing), renames the checkpoint
// into place and prunes all but the newest `keep`.
absl::StatusOr<CheckpointWriteReport> CommitCheckpoint(const std::string& dir,
                                                       const TrainState& state, int world,
                                                       int64_t keep);

// The newest complete checkpoint under `dir` (NOT_FOUND when there is none).
absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir);

// The part of a unit a rank loads: elements [begin, begin + numel) of the unit's flat buffer
// (ParamStore::shard_begin, shard_numel); past the unit's end it is zeros (FSDP padding).
struct UnitSlice {
  int64_t begin = 0, numel = 0;
};

struct LoadedCheckpoint {
  OptimizerShards optimizer;  // the slices asked for (whole units for LoadCheckpoint)
  TrainState state;
  int saved_world = 1;         // the world size it was saved at (1 for checkpoints that do not say)
  int64_t bytes = 0;           // the checkpoint's size (the manifest's total)
  int64_t verified_bytes = 0;  // what this process read to check against the manifest
  int64_t read_bytes = 0;      // tensor bytes read for the slices
  int64_t host_bytes = 0;      // held on the host: the slices
  double seconds = 0;          // how long loading took
};
// One process loading everything: verifies the checkpoint against its manifest first, then
// reads whole units. Errors name the file and what is wrong (missing, wrong size, checksum
// mismatch, corrupt, truncated, a tensor missing or misshapen).
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path, const ParamLayout& layout);
// A job of training.steps = `steps` resuming from `checkpoint` (the newest in checkpoint.dir
// `dir`, whose state is `saved`) has nothing to train when saved.step >= steps: unless it is a
// relaunch of the run that wrote it (the same non-empty run_id, which redoes the end's
// evaluation and export), FAILED_PRECONDITION saying what to change. An evaluation-only job
// (steps = 0) evaluates the checkpoint, whatever its step. The worker checks it at start, and
// ithacad at admission (with no run id: a submission is never a relaunch), so a resubmitted
// finished run is refused before it takes a slot.
absl::Status CheckResumeHasWork(const std::string& dir, int64_t steps,
                                const std::string& checkpoint, const TrainState& saved,
                                const std::string& run_id);
// ---- Phases (docs/long_context.md): a resume keeps the run's RoPE; a new phase ([init] from)
// starts from another run's weights only, in a checkpoint.dir of its own.
//
// A resume from `checkpoint` of a job whose model (with [model.rope] applied) is `cfg`:
// FAILED_PRECONDITION naming both RoPEs when the checkpoint's model/config.json has another one
// (the weights were trained with that RoPE; changing it is a new phase, not a resume).
absl::Status CheckResumeRope(const std::string& checkpoint, const LlamaConfig& cfg);
// The model directory init.from names: a checkpoint.dir (its newest complete checkpoint's
// model/), one step directory (its model/; it must be complete) or a Hugging Face model
// directory (config.json and safetensors). NOT_FOUND / DATA_LOSS starting "init.from: " and
// naming the path otherwise.
absl::StatusOr<std::string> InitWeightsDir(const std::string& from);
// A new phase starts from the weights of the job's own model: the config.json beside them
// (`weights`, InitWeightsDir's answer: a Hugging Face model directory or a step's model/) must
// describe the model `cfg` is (its family, sizes, heads, vocabulary, norms, window, tied
// embeddings; only the RoPE and the context may change). FAILED_PRECONDITION naming the key and
// both values otherwise; the config.json's own errors as LoadConfigJson's. OK when there is no
// config.json. ithacad checks at admission, the worker again at start.
absl::Status CheckInitModel(const std::string& weights, const LlamaConfig& cfg);
// Whether `weights` are a LoRA run's checkpoint: adapter tensors (lora_A, lora_B) and no base
// tensor (the frozen base is not saved).
bool HoldsAdaptersOnly(const SafetensorsReader& weights);
// A model's full weights to start from, not a LoRA run's checkpoint (HoldsAdaptersOnly):
// FAILED_PRECONDITION naming `key` and `dir` and what to start from instead.
absl::Status CheckNotAdaptersOnly(const SafetensorsReader& weights, const std::string& key,
                                  const std::string& dir);
// The checkpoint step whose model/ `weights` is (InitWeightsDir's answer, or a step's model/
// named itself), "" when it is none (a Hugging Face model directory). A new phase verifies such
// weights against the step's manifest before it starts from them, as a resume does
// (engine/checkpoint/distributed_checkpoint.h VerifyCheckpointWeightsTogether).
std::string CheckpointStepOfWeights(const std::string& weights);
// A new phase writes into `dir` (its checkpoint.dir): FAILED_PRECONDITION saying which run it
// holds (its run id, the ithacad job, its step) when it holds a checkpoint of another run than
// `run_id` (a relaunch of the same run resumes it instead; "" is never the same run).
absl::Status CheckInitTarget(const std::string& dir, const std::string& run_id);

// Only the checkpoint's state.json (its step, data position, schedule and run id): DATA_LOSS
// when it is corrupt.
absl::StatusOr<TrainState> ReadCheckpointState(const std::string& path);
// Reads only the byte ranges of the tensors that overlap `slices` (one per unit), verifying no
// file against the manifest: the caller has (LoadCheckpointTogether: the ranks verify a share of
// the files each). The tensors' names, shapes and dtypes are checked, all of them, so every
// rank finds the same mismatch whatever its slices.
// With `sink`, each unit's slices go to it as soon as they are read instead of into
// `optimizer` (which stays empty), so the host holds one unit's slices at a time; host_bytes is
// then that most.
absl::StatusOr<LoadedCheckpoint> LoadCheckpointSlices(const std::string& path,
                                                      const ParamLayout& layout,
                                                      const std::vector<UnitSlice>& slices,
                                                      const OptimizerUnitSink& sink = nullptr);

// A step directory holds only directories and regular files, reached without following a
// symbolic link (the step itself neither): DATA_LOSS naming the first entry that is not, without
// saying anything of where a link leads. Every reader of a step (manifest, state, config) checks.
absl::Status CheckCheckpointStep(const std::string& path);

// manifest.json: every other file of a checkpoint, with its size and CRC-32.
struct CheckpointManifest {
  struct File {
    std::string path;  // relative to the checkpoint
    int64_t bytes = 0;
    uint32_t crc32 = 0;
  };
  std::vector<File> files;  // in the manifest's order
  int64_t total_bytes = 0;
};
// DATA_LOSS naming manifest.json when it is corrupt.
absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(const std::string& path);
// Which of `world` ranks verifies each file of the manifest (verifying reads a file whole): the
// largest files first, each to the rank with the fewest bytes so far, so the ranks read about
// as much each. Every rank computes the same from the same manifest.
std::vector<int> VerifierOfEachFile(const CheckpointManifest& manifest, int world);
// Reads file `i` of the manifest whole and checks its size and CRC-32: DATA_LOSS naming it.
absl::Status VerifyCheckpointFile(const std::string& path, const CheckpointManifest& manifest,
                                  size_t i);
// Checks every file a checkpoint's manifest lists (size and CRC-32): DATA_LOSS naming the file.
absl::Status VerifyCheckpoint(const std::string& path);
// The manifest of the checkpoint at `path` lists every file `reader` (opened on a part of it:
// model/, optimizer/) loads, or that file would be loaded unverified: DATA_LOSS naming the first
// one it leaves out. Every load of a step (a resume, a new phase's start) checks it.
absl::Status CheckManifestListsFiles(const std::string& path, const CheckpointManifest& manifest,
                                     const SafetensorsReader& reader);

// Removes what killed saves and prunes left behind in `dir` (.step-*.tmp.* and .trash-*
// directories). Safe to call while no other process saves into `dir`.
absl::Status RemoveStaleCheckpointFiles(const std::string& dir);

// rm -r that never follows symbolic links (a link is unlinked; its target is untouched).
// OK when `path` does not exist.
absl::Status RemoveTreeNoFollow(const std::string& path);

}  // namespace ithaca
