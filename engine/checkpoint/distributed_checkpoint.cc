#include "engine/checkpoint/distributed_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "engine/memory/allocator.h"
#include "engine/model/safetensors.h"

namespace ithaca {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// What a rank holds on the host at once while saving: one unit's kept tensors of one kind (the
// largest such set), as Optimizer::SaveEach downloads them.
int64_t HeldAtOnce(const ParamLayout& layout, const OptimizerSelection& share) {
  int64_t most = 0;
  for (const ParamUnit& unit : layout.units()) {
    for (const std::set<std::string>* names : {&share.master, &share.m, &share.v}) {
      int64_t bytes = 0;
      for (const ParamEntry& e : unit.entries) {
        if (names->count(e.hf_name)) bytes += 4 * NumElements(e.shape);
      }
      most = std::max(most, bytes);
    }
  }
  return most;
}

// Every rank learns every rank's verdict on its share of the files of the checkpoint at `path`
// (0 fine, i + 1 when file i of `manifest` failed verification, -1 any other error, as `mine`
// says), and so fails alike: a rank that stopped alone would leave the others waiting in their
// next collective. A file that failed is named on every rank; `mine`, this rank's own error, says
// the most. Collective.
absl::Status AgreeOnVerdicts(const std::string& path, const CheckpointManifest* manifest,
                             float verdict, const absl::Status& mine, LlamaModel* model, Comm* comm,
                             const char* other_error) {
  const int world = comm ? comm->size() : 1;
  if (world > 1) {
    // One slot per rank, so the sum is exact.
    ASSIGN_OR_RETURN(Buffer buf,
                     Buffer::Make(model->allocator(), DType::kF32, {world}, Tier::kComm));
    std::vector<float> verdicts(world, 0.f);
    verdicts[comm->rank()] = verdict;
    model->ops()->Upload(verdicts.data(), DType::kF32, buf.tensor());
    RETURN_IF_ERROR(comm->AllReduce(buf.tensor()));
    model->ops()->Download(buf.tensor(), verdicts.data(), DType::kF32);
    RETURN_IF_ERROR(mine);
    for (int r = 0; r < world; ++r) {
      const int64_t file = static_cast<int64_t>(verdicts[r]) - 1;
      if (manifest != nullptr && file >= 0 && file < static_cast<int64_t>(manifest->files.size())) {
        return absl::DataLossError(
            absl::StrCat(path, "/", manifest->files[file].path, ": failed verification on rank ", r,
                         " (its size or CRC-32 is not the manifest's): corrupt or truncated"));
      }
    }
    for (int r = 0; r < world; ++r) {
      if (verdicts[r] != 0) {
        return absl::AbortedError(absl::StrCat("checkpoint ", path, ": rank ", r, " ", other_error,
                                               " (its error says why)"));
      }
    }
  }
  return mine;
}

}  // namespace

absl::Status VerifyCheckpointWeightsTogether(const std::string& step,
                                             const SafetensorsReader& reader, LlamaModel* model,
                                             Comm* comm) {
  const int rank = comm ? comm->rank() : 0;
  const int world = comm ? comm->size() : 1;
  float verdict = 0;
  absl::StatusOr<CheckpointManifest> manifest = ReadCheckpointManifest(step);
  absl::Status mine = manifest.status();
  if (mine.ok()) mine = CheckManifestListsFiles(step, *manifest, reader);
  if (mine.ok()) {
    // The weights' files only (model/), shared among the ranks as a resume shares all of them.
    CheckpointManifest weights;
    std::vector<size_t> index;  // of each of weights.files in *manifest
    for (size_t i = 0; i < manifest->files.size(); ++i) {
      if (absl::StartsWith(manifest->files[i].path, "model/")) {
        weights.files.push_back(manifest->files[i]);
        index.push_back(i);
      }
    }
    const std::vector<int> verifier = VerifierOfEachFile(weights, world);
    for (size_t j = 0; j < weights.files.size() && mine.ok(); ++j) {
      if (verifier[j] != rank) continue;
      mine = VerifyCheckpointFile(step, *manifest, index[j]);
      if (!mine.ok()) verdict = absl::IsDataLoss(mine) ? static_cast<float>(index[j] + 1) : -1.f;
    }
  }
  if (!mine.ok() && verdict == 0) verdict = -1;
  return AgreeOnVerdicts(step, manifest.ok() ? &*manifest : nullptr, verdict, mine, model, comm,
                         "could not verify its part");
}

absl::StatusOr<CheckpointSaveReport> SaveCheckpointTogether(const std::string& dir,
                                                            LlamaModel* model,
                                                            const CheckpointStateSaver& save_state,
                                                            const TrainState& state, Comm* comm,
                                                            int64_t keep) {
  const int rank = comm ? comm->rank() : 0;
  const int world = comm ? comm->size() : 1;
  const ParamLayout& layout = model->layout();
  const auto start = Clock::now();
  CheckpointSaveReport report;
  const OptimizerSelection share = CheckpointTensorsOf(layout, rank, world);

  // The files are opened before the gathers (rank 0 first makes the step's directory), and each
  // tensor of this rank's share is written to its place as its unit arrives on the host.
  CheckpointSaveLock lock;  // rank 0's, held until the save is committed or abandoned
  absl::Status st;
  bool began = false;
  if (rank == 0) {
    absl::StatusOr<CheckpointSaveLock> begun = BeginCheckpoint(dir, state);
    began = begun.ok();
    if (began) lock = *std::move(begun);
    st = begun.status();
  }
  if (comm) RETURN_IF_ERROR(comm->Barrier());
  double producing = 0, writing = 0;  // the gathers' span, and the writes inside it
  if (st.ok()) {
    absl::StatusOr<CheckpointWriteReport> w = WriteCheckpointShardFrom(
        dir, model->config(), layout, state, rank, world, [&](const OptimizerTensorSink& sink) {
          const auto begin = Clock::now();
          // Collective: every rank gathers every unit, whatever it writes.
          absl::Status done = save_state(
              share, [&](const char* kind, const std::string& name, std::vector<float>&& values) {
                const auto put = Clock::now();
                absl::Status wrote = sink(kind, name, std::move(values));
                writing += SecondsSince(put);
                return wrote;
              });
          producing = SecondsSince(begin);
          return done;
        });
    if (w.ok()) {
      report.rank_bytes = w->bytes;
      report.rank_write_seconds = w->seconds;
      // The unit being downloaded, and what waited for the writer thread (some of it the same
      // tensors, moved): an upper bound.
      report.host_bytes = HeldAtOnce(layout, share) + w->queued_bytes;
    }
    st = w.status();
  } else {
    // Rank 0 could not prepare the directory: the gathers are collective all the same.
    (void)save_state(share,
                     [&](const char*, const std::string&, std::vector<float>&&) { return st; });
  }
  report.gather_seconds = producing - writing;
  if (comm) RETURN_IF_ERROR(comm->Barrier());
  report.write_seconds = SecondsSince(start) - report.gather_seconds;

  // A share that could not be written (a full disk): its temporary does not outlive the save.
  if (rank == 0 && !st.ok() && began) AbandonCheckpoint(dir, state);
  if (rank == 0 && st.ok()) {
    absl::StatusOr<CheckpointWriteReport> commit = CommitCheckpoint(dir, state, world, keep);
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
                                                        Comm* comm, const OptimizerUnitSink& sink) {
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
    loaded = LoadCheckpointSlices(path, model->layout(), slices, sink);
    mine = loaded.status();
  }
  if (!mine.ok() && verdict == 0) verdict = -1;
  RETURN_IF_ERROR(AgreeOnVerdicts(path, manifest.ok() ? &*manifest : nullptr, verdict, mine, model,
                                  comm, "could not load its part"));
  loaded->verified_bytes = verified;
  loaded->seconds = SecondsSince(start);
  return std::move(*loaded);
}

}  // namespace ithaca
