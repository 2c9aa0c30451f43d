// Checkpoint save and load throughput: builds a model of a preset or config.json on every rank
// (FSDP over the ranks, deterministic pseudo-random weights, no training), saves a checkpoint
// with every rank writing its share (SaveCheckpointTogether) and loads it back as a resuming job
// does (Optimizer::ResumeEach over LoadCheckpointTogether: every rank reads its slices of each
// unit and uploads them into a new optimizer as they arrive). One JSON line per rank and phase:
// bytes, seconds, GB/s and the most bytes this rank held on the host at once: one unit's tensors
// of one kind to save (written as they arrive), one unit's slices to load.
//
// Runs on the CPU (backend cpu, a tiny model: the smoke test) and on GPUs (backend cuda):
//   checkpoint_bench --model llama-3-8b --backend cuda --nproc 2 --dir /disk/ckpt-bench
// With --nproc N (and not already started as a rank) it launches N ranks of itself, rank r on
// GPU r, like ithaca-worker --standalone. Before loading, the checkpoint's pages are dropped
// from the page cache (posix_fadvise DONTNEED, no root needed) unless --warm, so the load reads
// the disk. The checkpoint is removed at the end unless --keep.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "engine/comm/bootstrap.h"
#include "engine/core/file_util.h"
#include "engine/model/config.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/rank.h"
#include "engine/schedule/llama.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/distributed_checkpoint.h"
#include "engine/train/optimizer.h"
#include "engine/train/optimizer_checkpoint.h"
#include "worker/local_launch.h"

ABSL_FLAG(std::string, model, "llama-3.2-1b", "model preset (tiny, llama-3.2-1b, llama-3-8b, ...)");
ABSL_FLAG(std::string, config, "", "a config.json instead of --model");
ABSL_FLAG(std::string, backend, "cuda", "cpu | cuda");
ABSL_FLAG(std::string, dir, "", "checkpoint directory (required; needs room for ~12 bytes/param)");
ABSL_FLAG(int, nproc, 1, "ranks to launch (one per GPU) when not started as a rank");
ABSL_FLAG(bool, fsdp, true, "shard the state over the ranks (off: every rank holds it whole)");
ABSL_FLAG(bool, warm, false, "leave the checkpoint in the page cache before loading");
ABSL_FLAG(bool, check, false, "compare the loaded master weights with the saved ones");
ABSL_FLAG(bool, keep, false, "keep the checkpoint afterwards");
ABSL_FLAG(std::string, tag, "", "free-form label copied into each line");

namespace ithaca {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Fast deterministic values (a full Llama-3-8B init with <random> takes minutes per rank): small
// enough to be plausible weights, varied enough that a misplaced tensor shows in --check.
std::vector<float> BenchUnit(const ParamLayout& layout, int unit) {
  std::vector<float> w(layout.units()[unit].numel);
  uint64_t x = 0x9e3779b97f4a7c15ull * (unit + 1);
  for (float& v : w) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<float>(static_cast<int64_t>(x % 2001) - 1000) * 2e-5f;
  }
  return w;
}

// Drops the checkpoint's pages from the page cache (they are clean: the save fsynced them).
absl::Status DropFromPageCache(const std::string& path) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(path));
  for (const CheckpointManifest::File& f : manifest.files) {
    const std::string file = path + "/" + f.path;
    const int fd = open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::InternalError("cannot open " + file);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
  return absl::OkStatus();
}

std::string Line(const std::string& phase, const RankInfo& info, const std::string& model,
                 const std::string& fields) {
  return absl::StrFormat(
      "{\"bench\": \"checkpoint\", \"phase\": \"%s\", \"model\": \"%s\", \"backend\": \"%s\", "
      "\"world\": %d, \"rank\": %d, \"fsdp\": %s, %s, \"tag\": \"%s\"}",
      phase, model, absl::GetFlag(FLAGS_backend), info.world, info.rank,
      absl::GetFlag(FLAGS_fsdp) ? "true" : "false", fields, absl::GetFlag(FLAGS_tag));
}

absl::Status RunRank(const RankInfo& info) {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  JobSpec spec;
  spec.backend = absl::GetFlag(FLAGS_backend);
  const std::string config = absl::GetFlag(FLAGS_config);
  const std::string model_name = config.empty() ? absl::GetFlag(FLAGS_model) : config;
  ASSIGN_OR_RETURN(LlamaConfig cfg,
                   config.empty() ? PresetConfig(model_name) : LoadConfigJson(config));
  ASSIGN_OR_RETURN(Backend backend, MakeBackend(spec, info.gpu));
  std::unique_ptr<Comm> comm;
  if (info.world > 1) {
    ASSIGN_OR_RETURN(comm, ConnectComm(info, backend.device(), /*timeout_s=*/1800));
    comm->UseStreams(backend.ops->streams());
  }
  LlamaModel::Options mo;
  mo.fsdp = absl::GetFlag(FLAGS_fsdp);
  ASSIGN_OR_RETURN(auto model,
                   LlamaModel::Create(cfg, backend.ops.get(), backend.alloc.get(), mo, comm.get()));
  const ParamLayout& layout = model->layout();
  JobSpec::Training hp;
  auto init = [&](int u) -> absl::StatusOr<std::vector<float>> { return BenchUnit(layout, u); };
  ASSIGN_OR_RETURN(auto optimizer, Optimizer::Create(model.get(), init, hp));
  int64_t state_bytes = 0;
  for (const ParamUnit& u : layout.units()) state_bytes += 3 * 4 * u.numel;

  const TrainState state{1, 0, 0};
  if (comm) RETURN_IF_ERROR(comm->Barrier());
  ASSIGN_OR_RETURN(CheckpointSaveReport saved,
                   SaveCheckpointTogether(dir, model.get(), *optimizer, state, comm.get(), 1));
  ASSIGN_OR_RETURN(const std::string path, LatestCheckpoint(dir));
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(path));
  const int64_t bytes = manifest.total_bytes;
  std::printf(
      "%s\n",
      Line("save", info, model_name,
           absl::StrFormat("\"checkpoint_bytes\": %d, \"state_bytes\": %d, \"rank_bytes\": %d, "
                           "\"host_bytes\": %d, \"host_fraction\": %.4f, \"seconds\": %.3f, "
                           "\"gb_per_s\": %.3f, \"gather_seconds\": %.3f, \"write_seconds\": %.3f, "
                           "\"rank_write_gb_per_s\": %.3f, \"commit_seconds\": %.3f",
                           bytes, state_bytes, saved.rank_bytes, saved.host_bytes,
                           double(saved.host_bytes) / state_bytes, saved.seconds,
                           bytes / 1e9 / saved.seconds, saved.gather_seconds, saved.write_seconds,
                           saved.rank_bytes / 1e9 / std::max(saved.rank_write_seconds, 1e-9),
                           saved.commit_seconds))
          .c_str());
  std::fflush(stdout);

  HostWeights before;
  if (absl::GetFlag(FLAGS_check)) {
    ASSIGN_OR_RETURN(before, optimizer->GatherMasterWeights());  // collective
  }
  const bool warm = absl::GetFlag(FLAGS_warm);
  if (!warm && info.rank == 0) RETURN_IF_ERROR(DropFromPageCache(path));
  if (comm) RETURN_IF_ERROR(comm->Barrier());

  // The saved optimizer goes first, as in a job that resumes: the new one takes its memory.
  optimizer.reset();
  const auto start = Clock::now();
  ASSIGN_OR_RETURN(ResumedCheckpoint resumed,
                   ResumeCheckpointTogether(path, model.get(), comm.get(), hp));
  optimizer = std::move(resumed.optimizer);
  const LoadedCheckpoint& loaded = resumed.loaded;
  const double read_s = loaded.seconds;  // read, verified and uploaded unit by unit
  backend.ops->Synchronize();
  const double total_s = Since(start);
  const int64_t held = loaded.host_bytes, verified = loaded.verified_bytes,
                read = loaded.read_bytes;
  if (comm) RETURN_IF_ERROR(comm->Barrier());
  const double world_s = Since(start);  // until the slowest rank is done
  std::printf(
      "%s\n",
      Line("load", info, model_name,
           absl::StrFormat(
               "\"checkpoint_bytes\": %d, \"state_bytes\": %d, \"verified_bytes\": %d, "
               "\"read_bytes\": %d, \"host_bytes\": %d, \"host_fraction\": %.4f, "
               "\"seconds\": %.3f, \"gb_per_s\": %.3f, \"read_seconds\": %.3f, "
               "\"upload_seconds\": %.3f, \"rank_seconds\": %.3f, \"page_cache\": \"%s\"",
               bytes, state_bytes, verified, read, held, double(held) / state_bytes, world_s,
               bytes / 1e9 / world_s, read_s, total_s - read_s, total_s, warm ? "warm" : "dropped"))
          .c_str());
  std::fflush(stdout);

  if (absl::GetFlag(FLAGS_check)) {
    ASSIGN_OR_RETURN(HostWeights after, optimizer->GatherMasterWeights());  // collective
    if (after != before) {
      return absl::DataLossError("the loaded master weights differ from the saved ones");
    }
    if (info.rank == 0) std::printf("check: the loaded master weights equal the saved ones\n");
  }
  if (comm) RETURN_IF_ERROR(comm->Barrier());
  if (!absl::GetFlag(FLAGS_keep) && info.rank == 0) RETURN_IF_ERROR(RemoveTreeNoFollow(path));
  return absl::OkStatus();
}

absl::Status Main(int argc, char** argv) {
  if (absl::GetFlag(FLAGS_dir).empty()) return absl::InvalidArgumentError("--dir is required");
  const bool is_rank = getenv(kEnvRank) != nullptr;
  const int nproc = absl::GetFlag(FLAGS_nproc);
  if (!is_rank && nproc > 1) {
    LaunchOptions o;
    o.argv.push_back("/proc/self/exe");
    for (int i = 1; i < argc; ++i) o.argv.push_back(argv[i]);
    o.nproc = nproc;
    o.grace_period_s = 5;
    return LaunchLocal(o);
  }
  ASSIGN_OR_RETURN(RankInfo info, RankInfoOrAlone());
  return RunRank(info);
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status st = ithaca::Main(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "checkpoint_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
