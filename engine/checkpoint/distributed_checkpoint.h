// Saving and loading a training checkpoint with every rank of a job at once (the file layout is
// engine/checkpoint/checkpoint.h's). No rank's host holds the whole state:
// - saving: each rank opens its files (about 1/world of the checkpoint), then each unit is
//   all-gathered on the device in turn and a rank downloads only the tensors it writes
//   (CheckpointTensorsOf) and hands them to a writer thread that puts them in place (at most
//   2 GiB waiting), so it holds one unit's tensors of one kind plus that queue, and the ranks
//   write while the gathers go on; then it checksums its files, in parallel with the others;
// - loading: a rank reads only the byte ranges of the tensors that overlap its FSDP slice of
//   each unit, at any world size (the files hold whole tensors), and the ranks verify the files
//   against the manifest between them (VerifierOfEachFile: about as many bytes each). The verdicts
//   are then all-reduced, so every rank fails alike: DATA_LOSS naming the file on every rank (the
//   rank that read it says what is wrong with it).
#pragma once

#include <functional>
#include <string>

#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/optimizer_state.h"
#include "engine/comm/comm.h"
#include "engine/schedule/llama.h"

namespace ithaca {

struct CheckpointSaveReport {
  int64_t bytes = 0;       // the whole checkpoint (known to rank 0 only; 0 on the others)
  int64_t rank_bytes = 0;  // the files this rank wrote
  // At most what this rank held of the state on the host at once: the unit's tensors of one
  // kind being downloaded (Optimizer::SaveEach) and those waiting for the writer thread (at
  // most kCheckpointWriteQueueBytes).
  int64_t host_bytes = 0;
  double seconds = 0;  // the whole save, barriers included
  // gather: gathering and downloading the units (less any wait for a full write queue);
  // write: the rest until every rank is done (the writes, checksums, barriers); commit: rank 0.
  double gather_seconds = 0, write_seconds = 0, commit_seconds = 0;
  double rank_write_seconds = 0;  // this rank's writing and checksumming alone
};

// What a save writes: it hands each tensor of the state that `keep` names to `sink`, as it
// arrives on the host. Collective: every rank calls it together (Optimizer::SaveEach is one;
// engine/train/optimizer_checkpoint.h saves an Optimizer with it).
using CheckpointStateSaver =
    std::function<absl::Status(const OptimizerSelection& keep, const OptimizerTensorSink& sink)>;

// Collective: every rank of `comm` (nullptr: one rank) calls it. Writes DIR/step-N for
// `state.step` and prunes all but the newest `keep`. Each phase ends at a barrier every rank
// reaches even after an error of its own: nobody writes before rank 0 made the directory, rank 0
// commits only once every share is written (a missing one is an error naming the rank), and
// nobody moves on before the checkpoint is whole. A commit error is rank 0's to return.
absl::StatusOr<CheckpointSaveReport> SaveCheckpointTogether(const std::string& dir,
                                                            LlamaModel* model,
                                                            const CheckpointStateSaver& save_state,
                                                            const TrainState& state, Comm* comm,
                                                            int64_t keep);

// Collective: every rank loads its slice of every unit (ParamStore::shard_begin, shard_numel)
// of the checkpoint at `path`, verifying its share of the files; the result is what
// Optimizer::Resume takes. verified_bytes, read_bytes and host_bytes are this rank's. With
// `sink` (Optimizer::ResumeEach), each unit's slices go to it as they are read, before the
// ranks' verdicts are known: an error on any rank still fails every rank, and the state the
// sink took must then not be used.
absl::StatusOr<LoadedCheckpoint> LoadCheckpointTogether(const std::string& path, LlamaModel* model,
                                                        Comm* comm,
                                                        const OptimizerUnitSink& sink = nullptr);

// Collective: before a new phase ([init] from) starts from the weights of the checkpoint step
// `step` (CheckpointStepOfWeights), read through `reader` (opened on its model/), the ranks verify
// the step's model/ files against its manifest between them (VerifierOfEachFile), as a resume
// verifies its files, and that the manifest lists every file `reader` loads (a weight damaged
// after the run that wrote it, also while the job waited for it, is not trained on): DATA_LOSS
// naming the file on every rank.
absl::Status VerifyCheckpointWeightsTogether(const std::string& step,
                                             const SafetensorsReader& reader, LlamaModel* model,
                                             Comm* comm);

}  // namespace ithaca
