// One rank of the scale-out checks (tests/parallel/scaleout_test.cc), started by the launcher
// (ITHACA_* environment) or alone. Trains the tiny model of a config.json with a fixed global
// batch (grad_accum = global batch / world, so every world size sees the same samples per step),
// optionally checkpointing and resuming, and on rank 0 writes what runs must agree on:
//   steps, losses   the optimizer steps this run made and their losses
//   param.<name>    every f32 master weight at the end
//
//   scaleout_rank --out FILE --config config.json --data corpus.tok --global-batch G --steps N
//                 [--stop-at K] [--checkpoint-dir DIR --every E] [--fsdp 0|1]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "engine/runtime/rank.h"

namespace ithaca {
namespace {

absl::Status Run(int argc, char** argv) {
  std::string out;
  int64_t global_batch = 4, stop_at = 0;
  JobSpec spec;
  spec.training.steps = 4;
  spec.training.warmup_steps = 1;
  spec.training.lr = 1e-2;
  spec.training.min_lr = 1e-3;
  spec.training.grad_clip = 0.5;
  spec.data.seq_len = 32;
  spec.memory.recompute = RecomputePolicy::kNone;
  spec.parallel.fsdp = true;
  spec.metrics.log_every = 1000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--out") {
      out = next();
    } else if (a == "--config") {
      spec.model.config = next();
    } else if (a == "--data") {
      spec.data.path = next();
    } else if (a == "--global-batch") {
      global_batch = std::stoll(next());
    } else if (a == "--steps") {
      spec.training.steps = std::stoll(next());
    } else if (a == "--stop-at") {
      stop_at = std::stoll(next());
    } else if (a == "--checkpoint-dir") {
      spec.checkpoint.dir = next();
    } else if (a == "--every") {
      spec.checkpoint.every = std::stoll(next());
    } else if (a == "--sp") {
      spec.parallel.sp = std::stoll(next());
    } else if (a == "--ring") {
      spec.parallel.ring = std::stoll(next());
    } else if (a == "--fsdp") {
      spec.parallel.fsdp = next() == "1";
    } else {
      return absl::InvalidArgumentError("unknown flag " + a);
    }
  }
  ASSIGN_OR_RETURN(RankInfo info, RankInfoOrAlone());
  // Each data-parallel replica (a sequence-parallel group of sp ranks) takes its share of the
  // global batch.
  const int64_t replicas = info.world / std::max<int64_t>(1, spec.parallel.sp);
  if (info.world % std::max<int64_t>(1, spec.parallel.sp) != 0 || global_batch % replicas != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--global-batch ", global_batch, " over a world of ", info.world, " at sp ",
                     spec.parallel.sp, ": not a whole number of samples per replica"));
  }
  spec.parallel.world = info.world;
  spec.training.grad_accum = global_batch / replicas;
  RankOptions options;
  options.comm_timeout_s = 60;
  ASSIGN_OR_RETURN(std::unique_ptr<Rank> self, Rank::Create(spec, info, options));
  Trainer* trainer = &self->trainer();
  std::vector<float> steps, losses;
  RETURN_IF_ERROR(trainer->Run(
      [&](const StepReport& r) {
        steps.push_back(static_cast<float>(r.step));
        losses.push_back(static_cast<float>(r.loss));
      },
      stop_at));
  ASSIGN_OR_RETURN(HostWeights master, trainer->GatherMasterWeights());  // collective
  if (info.rank != 0) return absl::OkStatus();

  SafetensorsWriter w;
  const int64_t n = static_cast<int64_t>(steps.size());
  w.Add("steps", DType::kF32, {n}, steps.data(), DType::kF32);
  w.Add("losses", DType::kF32, {n}, losses.data(), DType::kF32);
  const ParamLayout& layout = trainer->model()->layout();
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const ParamEntry& e : layout.units()[u].entries) {
      w.Add("param." + e.hf_name, DType::kF32, e.shape, master[u].data() + e.offset, DType::kF32);
    }
  }
  return w.WriteFile(out);
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::Status st = ithaca::Run(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "scaleout_rank: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
