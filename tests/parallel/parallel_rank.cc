// One rank of a distributed equivalence check (or the single-rank reference when started without
// ITHACA_RANK). It trains the model of a config.json with the given parallel layout and memory
// techniques and, on rank 0, writes what every layout must agree on to a safetensors file:
//   loss0                 the loss of one forward/backward over the first sample
//   grad.<name>           every parameter's gradient of that loss, gathered from the shards
//   loss_step.<i>         the loss of each optimizer step of a short training run
//   param.<name>          every f32 master weight after those steps
//
//   parallel_rank --out FILE --config config.json --data corpus.tok [--world N --sp P --fsdp 0|1
//                 --recompute none|full|attention-aware --head-chunk U --ring R --offload --tile T
//                 --seq S --grad-accum A --steps N --packed [--separate] --loss-mask
//                 --optimizer-offload --param-offload --weight-decay W --lora]
// --lora: rank-4 LoRA adapters on all seven linears ([lora]), the base frozen: the gradients
// written are the adapters' alone.
// It also writes grad_norm_steps (each step's gradient norm, before clipping).
// --peaks FILE: every rank writes FILE.rank<r>, its allocator's peak per tier after the first
// forward/backward ("fb TIER MEASURED PLANNED") and in each training step ("step<i> TIER PEAK").
// --rehearse --rank R [--nodes M]: this process is rank R of --world alone (RankRehearsal, no
// link time): what the real rank R measures, it must measure (tests/parallel/rehearsal_test.cc).
// --packed: the first sample is packed documents (kPackedStarts) under a document mask, and the
// training run sets data.document_mask (the corpus is a version 1 file: its documents are found
// by the model's bos_token_id). With --separate (the reference) the first sample's documents
// are instead run one by one, each alone: what the packed sample must equal exactly.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/ranks_per_host.h"
#include "engine/model/safetensors.h"
#include "engine/plan/planner.h"
#include "engine/runtime/rank.h"

namespace ithaca {
namespace {

// Documents of 5, 1, 23, 21 and 14 tokens (S = 64): short ones, and ones that cross every
// rank's share of the sequence under Ulysses.
const std::vector<int64_t> kPackedStarts = {0, 5, 6, 29, 50};

absl::Status Run(int argc, char** argv) {
  std::string out;
  int die_rank = -1;  // this rank exits abruptly in the middle of the second training step
  bool packed = false, separate = false;
  bool rehearse = false;
  int rehearse_rank = 0, nodes = 1;
  std::string peaks_path;
  JobSpec spec;
  spec.training.steps = 3;
  spec.training.warmup_steps = 1;
  spec.training.lr = 1e-2;
  spec.training.min_lr = 1e-3;
  spec.training.grad_clip = 0.5;  // small enough that clipping happens
  spec.data.seq_len = 64;
  spec.memory.recompute = RecomputePolicy::kNone;
  spec.parallel.fsdp = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--out")
      out = next();
    else if (a == "--config")
      spec.model.config = next();
    else if (a == "--data")
      spec.data.path = next();
    else if (a == "--world")
      spec.parallel.world = std::stoll(next());
    else if (a == "--sp")
      spec.parallel.sp = std::stoll(next());
    else if (a == "--fsdp")
      spec.parallel.fsdp = next() == "1";
    else if (a == "--ring")
      spec.parallel.ring = std::stoll(next());
    else if (a == "--head-chunk")
      spec.memory.head_chunk = std::stoll(next());
    else if (a == "--packed")
      packed = spec.data.document_mask = true;
    else if (a == "--separate")
      separate = true;
    else if (a == "--loss-mask")
      spec.data.loss_mask = true;
    else if (a == "--offload")
      spec.memory.offload = OffloadChoice::kOn;
    else if (a == "--no-prefetch")
      spec.memory.prefetch = OffloadChoice::kOff;
    else if (a == "--no-overlap")
      spec.memory.overlap = OffloadChoice::kOff;
    else if (a == "--rehearse")
      rehearse = true;
    else if (a == "--rank")
      rehearse_rank = std::stoi(next());
    else if (a == "--nodes")
      nodes = std::stoi(next());
    else if (a == "--peaks")
      peaks_path = next();
    else if (a == "--die-rank")
      die_rank = std::stoi(next());
    else if (a == "--recompute-interval")
      spec.memory.recompute_interval = std::stoll(next());
    else if (a == "--saved-block-inputs")
      spec.memory.saved_block_inputs = std::stoll(next());
    else if (a == "--tile")
      spec.memory.tile_tokens = std::stoll(next());
    else if (a == "--seq")
      spec.data.seq_len = std::stoll(next());
    else if (a == "--grad-accum")
      spec.training.grad_accum = std::stoll(next());
    else if (a == "--steps")
      spec.training.steps = std::stoll(next());
    else if (a == "--optimizer-offload")
      spec.memory.optimizer_offload = OffloadChoice::kOn;
    else if (a == "--param-offload")
      spec.memory.param_offload = OffloadChoice::kOn;
    else if (a == "--weight-decay")
      spec.training.weight_decay = std::stod(next());
    else if (a == "--lora") {  // rank 4 adapters on all seven linears, the base frozen
      spec.lora.rank = 4;
      spec.lora.alpha = 8;
      spec.lora.targets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                           "gate_proj", "up_proj", "down_proj"};
    } else if (a == "--attention-aware-blocks")
      spec.memory.attention_aware_blocks = std::stoll(next());
    else if (a == "--recompute") {
      const std::string p = next();
      const std::optional<RecomputePolicy> policy = RecomputePolicyFromName(p);
      if (!policy) return absl::InvalidArgumentError("--recompute=" + p + ": unknown policy");
      spec.memory.recompute = *policy;
    } else {
      return absl::InvalidArgumentError("unknown flag " + a);
    }
  }
  ASSIGN_OR_RETURN(RankInfo info, RankInfoOrAlone());
  RankOptions options;
  options.comm_timeout_s = 60;
  if (rehearse) {
    const int world = static_cast<int>(spec.parallel.world);
    info = RankInfo();
    info.rank = rehearse_rank;
    info.world = world;
    RankRehearsal r;
    r.nodes = nodes;
    ASSIGN_OR_RETURN(r.link, LinkPreset("zero"));
    r.node = LocalNodeResources(0, RanksPerHost(world, nodes));
    options.rehearsal = r;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Rank> self, Rank::Create(spec, info, options));
  const int rank = info.rank;
  Comm* comm = self->comm();
  Trainer* trainer = &self->trainer();
  LlamaModel* model = trainer->model();
  ParamStore& ps = model->params();

  std::ofstream peaks;  // --peaks: this rank's file
  if (!peaks_path.empty()) {
    peaks.open(absl::StrCat(peaks_path, ".rank", rank));
    if (!peaks) return absl::InternalError("cannot write " + peaks_path);
  }
  // One forward/backward over the first sample; every data-parallel replica takes the same
  // sample with its share of the scale, so the reduced gradient is that sample's gradient.
  ASSIGN_OR_RETURN(auto file, TokenFile::Open(spec.data.path));
  const int64_t S = spec.data.seq_len;
  std::vector<int32_t> inputs(file->tokens(), file->tokens() + S);
  std::vector<int32_t> labels(file->tokens() + 1, file->tokens() + S + 1);
  const int64_t dp = spec.parallel.world / spec.parallel.sp;
  DocumentMask docs;
  if (packed) {
    docs.starts = kPackedStarts;
    // No label crosses into the next document.
    for (size_t d = 1; d < docs.starts.size(); ++d) labels[docs.starts[d] - 1] = -1;
  }
  const int64_t counted = std::count_if(labels.begin(), labels.end(), [](int v) { return v >= 0; });
  const float scale = 1.f / static_cast<float>(counted * dp);
  ps.ZeroGrads();
  LossSum l;
  if (separate) {
    for (size_t d = 0; d < docs.starts.size(); ++d) {
      const int64_t a = docs.starts[d], b = d + 1 < docs.starts.size() ? docs.starts[d + 1] : S;
      ASSIGN_OR_RETURN(LossSum part,
                       model->ForwardBackward(inputs.data() + a, labels.data() + a, b - a, scale));
      l.loss_sum += part.loss_sum;
    }
  } else {
    ASSIGN_OR_RETURN(l, model->ForwardBackward(inputs.data(), labels.data(), S, scale, docs));
    // The memory plan replays this very schedule (overlap's second buffer sets, reductions in
    // flight): on the CPU it must equal what the rank's allocator measured.
    ASSIGN_OR_RETURN(MemoryPlan plan, PlanJob(self->spec()));
    const MemoryTracker& mt = self->alloc().tracker();
    for (int t = 0; t < kNumTiers; ++t) {
      const double planned = plan.peak[t], measured = mt.peak(static_cast<Tier>(t));
      peaks << "fb " << TierName(static_cast<Tier>(t)) << " " << mt.peak(static_cast<Tier>(t))
            << " " << plan.peak[t] << "\n";
      if (std::abs(planned - measured) > 0.05 * measured + 64) {
        return absl::InternalError(absl::StrCat("rank ", rank, ": tier ",
                                                TierName(static_cast<Tier>(t)), " measured ",
                                                measured, " B, the plan says ", planned, " B"));
      }
    }
  }
  RETURN_IF_ERROR(ps.FinishGradients());
  // This rank's loss share: summed over its Ulysses group (replicas hold the same value).
  std::vector<float> loss = {static_cast<float>(l.loss_sum / counted / dp)};
  if (comm) {
    Tensor t(loss.data(), DType::kF32, {1});
    RETURN_IF_ERROR(comm->AllReduce(t));
  }
  HostWeights grads;
  for (int u = 0; u < ps.num_units(); ++u) {
    if (!ps.trainable(u)) {  // a frozen base (--lora) has no gradient
      grads.emplace_back();
      continue;
    }
    ASSIGN_OR_RETURN(auto g, ps.GatherToHost(u, ps.grad_shard(u)));
    grads.push_back(std::move(g));
  }
  ps.ZeroGrads();

  std::vector<float> step_losses, grad_norms;
  RETURN_IF_ERROR(trainer->Run([&](const StepReport& r) {
    step_losses.push_back(r.loss);
    for (int t = 0; t < kNumTiers; ++t) {
      peaks << "step" << r.step << " " << TierName(static_cast<Tier>(t)) << " " << r.mem_peak[t]
            << "\n";
    }
    grad_norms.push_back(static_cast<float>(r.grad_norm));
    // After step 1 the others go on into step 2's collectives and find this rank gone.
    if (r.step == 1 && rank == die_rank) _exit(9);
  }));
  // The master weights after training, gathered (Save is collective).
  ASSIGN_OR_RETURN(HostWeights master, trainer->GatherMasterWeights());
  if (rank != 0) return absl::OkStatus();

  SafetensorsWriter w;
  w.Add("loss0", DType::kF32, {1}, loss.data(), DType::kF32);
  w.Add("loss_steps", DType::kF32, {static_cast<int64_t>(step_losses.size())}, step_losses.data(),
        DType::kF32);
  w.Add("grad_norm_steps", DType::kF32, {static_cast<int64_t>(grad_norms.size())},
        grad_norms.data(), DType::kF32);
  const ParamLayout& layout = model->layout();
  std::vector<std::string> names;
  for (int u = 0; u < layout.num_units(); ++u) {
    for (const ParamEntry& e : layout.units()[u].entries) {
      if (!grads[u].empty()) {
        w.Add("grad." + e.hf_name, DType::kF32, e.shape, grads[u].data() + e.offset, DType::kF32);
      }
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
    std::fprintf(stderr, "parallel_rank: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
