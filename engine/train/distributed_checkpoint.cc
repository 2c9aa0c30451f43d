#include "engine/train/distributed_checkpoint.h"

#include <chrono>
#include <utility>
#include <vector>

#include "engine/memory/allocator.h"

namespace ithaca {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

absl::StatusOr<CheckpointSaveReport> SaveCheckpointTogether(const std::string& dir,
                                                            LlamaModel* model,
                                                            const Optimizer& optimizer,
                                                            const TrainState& state, Comm* comm,
                                                            int64_t keep) {
  const int rank = comm ? comm->rank() : 0;
  const int world = comm ? comm->size() : 1;
  const ParamLayout& layout = model->layout();
  const auto start = Clock::now();
  CheckpointSaveReport report;
  ASSIGN_OR_RETURN(Optimizer::State held,
                   optimizer.Save(CheckpointTensorsOf(layout, rank, world)));  // collective
  report.host_bytes = held.HostBytes();
  report.gather_seconds = SecondsSince(start);

  absl::Status st = rank == 0 ? BeginCheckpoint(dir, state.step) : absl::OkStatus();
  if (comm) RETURN_IF_ERROR(comm->Barrier());
  if (st.ok()) {
    absl::StatusOr<CheckpointWriteReport> w =
        WriteCheckpointShard(dir, model->config(), layout, held, state, rank, world);
    if (w.ok()) {
      report.rank_bytes = w->bytes;
      report.rank_write_seconds = w->seconds;
    }
    st = w.status();
  }
  held = Optimizer::State();  // written: the host copies are not needed for the commit
  if (comm) RETURN_IF_ERROR(comm->Barrier());
  report.write_seconds = SecondsSince(start) - report.gather_seconds;

  if (rank == 0 && st.ok()) {
    absl::StatusOr<CheckpointWriteReport> commit = CommitCheckpoint(dir, state.step, world, keep);
    if (commit.ok()) {
      report.bytes = commit->bytes;
      report.commit_seconds = commit->seconds;
    }
    st = commit.status();
  }
  if (comm) RETURN_IF_ERROR(comm->Barrier());
  report.seconds = SecondsSince(start);
  RETURN_IF_ERROR(st);
  return report;
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointTogether(const std::string& path, LlamaModel* model,
                                                        Comm* comm) {
  const int rank = comm ? comm->rank() : 0;
  const int world = comm ? comm->size() : 1;
  const auto start = Clock::now();
  // This rank's share of the verification (VerifierOfEachFile): its files, read whole. Its
  // verdict: 0 fine, i + 1 when manifest file i failed, -1 for any other error.
  float verdict = 0;
  int64_t verified = 0;
  absl::StatusOr<CheckpointManifest> manifest = ReadCheckpointManifest(path);
  absl::Status mine = manifest.status();
  if (mine.ok()) {
    const std::vector<int> verifier = VerifierOfEachFile(*manifest, world);
    for (size_t i = 0; i < manifest->files.size(); ++i) {
      if (verifier[i] != rank) continue;
      mine = VerifyCheckpointFile(path, *manifest, i);
      if (!mine.ok()) {
        // A file that does not match the manifest is named on every rank; another error (the
        // file cannot be opened or read) is this rank's to tell.
        verdict = absl::IsDataLoss(mine) ? static_cast<float>(i + 1) : -1.f;
        break;
      }
      verified += manifest->files[i].bytes;
    }
  }
  // Then its slices, without waiting for the others' verdicts: they come together once, below,
  // before anything loaded is used.
  absl::StatusOr<LoadedCheckpoint> loaded = absl::AbortedError("not loaded");
  if (mine.ok()) {
    ParamStore& ps = model->params();
    std::vector<UnitSlice> slices;
    for (int u = 0; u < ps.num_units(); ++u) {
      slices.push_back({ps.shard_begin(u), ps.shard_numel(u)});
    }
    loaded = LoadCheckpointSlices(path, model->layout(), slices);
    mine = loaded.status();
  }
  if (!mine.ok() && verdict == 0) verdict = -1;

  if (comm && world > 1) {
    // Every rank learns every verdict (one slot per rank, so the sum is exact), and so fails
    // alike: a rank that stopped alone would leave the others waiting in their next collective.
    ASSIGN_OR_RETURN(Buffer buf,
                     Buffer::Make(model->allocator(), DType::kF32, {world}, Tier::kComm));
    std::vector<float> verdicts(world, 0.f);
    verdicts[rank] = verdict;
    model->ops()->Upload(verdicts.data(), DType::kF32, buf.tensor());
    RETURN_IF_ERROR(comm->AllReduce(buf.tensor()));
    model->ops()->Download(buf.tensor(), verdicts.data(), DType::kF32);
    RETURN_IF_ERROR(mine);  // this rank's own error says the most
    for (int r = 0; r < world; ++r) {
      const int64_t file = static_cast<int64_t>(verdicts[r]) - 1;
      if (file >= 0 && file < static_cast<int64_t>(manifest->files.size())) {
        return absl::DataLossError(
            absl::StrCat(path, "/", manifest->files[file].path, ": failed verification on rank ", r,
                         " (its size or CRC-32 is not the manifest's): corrupt or truncated"));
      }
    }
    for (int r = 0; r < world; ++r) {
      if (verdicts[r] != 0) {
        return absl::AbortedError(absl::StrCat("checkpoint ", path, ": rank ", r,
                                               " could not load its part (its error says why)"));
      }
    }
  }
  RETURN_IF_ERROR(mine);
  loaded->verified_bytes = verified;
  loaded->seconds = SecondsSince(start);
  return std::move(*loaded);
}

}  // namespace ithaca
