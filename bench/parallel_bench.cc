// Training steps of a preset model over several ranks (Ulysses sequence parallelism and FSDP),
// with random weights and random tokens, at each requested sequence length: the per-GPU
// throughput of a parallel layout, with the schedule's communication overlap on or off
// (LlamaModel::Options::overlap, the spec's memory.overlap).
//
//   parallel_bench --world=2 --sp=2 --seq_lens=65536,262144 --overlap=true [--timeline=PATH]
//
// The program forks one process per rank (rank r on GPU r; on the CPU backend all on the host).
// Each sets itself up as the engine's workers do (engine/runtime: MakeBackend, ConnectComm over a
// file rendezvous, the communicator on the backend's streams, Ulysses groups of consecutive
// ranks as the Trainer splits them) and times forward, backward, the gradient reduction and the
// optimizer step. Rank 0 prints one JSON line per S (docs/benchmarks.md).
//
// --timeline=PATH (CUDA only) wraps the communicator in TimelineComm (bench/timeline.h), which
// records CUDA events around every collective during the last timed step, and writes one JSON
// line per collective to PATH.w<world>sp<sp>.[no-]overlap.S<S>.rank<r>.jsonl, then a summary
// line: how much of the communication time the compute stream spent doing something else (the
// share hidden under compute). Rank 0's summary is also in its result line.
// --plan_only prints the planner's per-rank memory for the layout without a GPU.
// --rehearse runs one rank (--rank) of the layout alone in this process, on this one GPU (or the
// CPU): RehearsalComm (engine/comm/rehearsal_comm.h) makes each collective a local copy of the
// real sizes that holds the comm stream for the link model's time (--link), with --nodes nodes
// of world/nodes ranks. --device_memory_gib caps the GPU at another's memory (80: an H100),
// --node_host_gib and --node_cores give the node's host, which the rank gets its share of. Each
// S is timed with the link time (step_s) and again without it (compute_s): the difference is
// the communication the schedule could not hide (comm_exposed_s). --planner_settings runs each S
// with the memory settings admission would resolve for it on the rehearsed node. Its lines say
// "mode": "rehearsal" (docs/rehearsal.md).
// --probe=W is the memory probe (as train_bench's): one untimed step per S with attention limited
// to a causal window of W keys, every buffer, copy and collective at full size. Its lines say
// "mode": "memory-probe", carry no throughput, and put rank 0's measured device and host peaks
// and its whole process (cudaMemGetInfo) beside the planner's.
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "engine/spec/validate.h"
#include "bench/bench_util.h"
#include "bench/model_flags.h"
#include "bench/timeline.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/comm/bootstrap.h"
#include "engine/comm/comm.h"
#include "engine/core/ranks_per_host.h"
#include "engine/core/units.h"
#include "engine/plan/budgets.h"
#include "engine/plan/resolve.h"
#include "engine/model/config.h"
#include "engine/model/weights.h"
#include "engine/core/file_util.h"
#include "engine/plan/planner.h"
#include "engine/plan/step_time.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/rank.h"
#include "engine/schedule/llama.h"
#include "engine/train/optimizer.h"
#include "engine/train/trainer.h"

ABSL_DECLARE_FLAG(int64_t, ring);  // bench/model_flags.cc

ABSL_FLAG(int, world, 2, "ranks (one per GPU on CUDA)");
ABSL_FLAG(int, sp, 2, "Ulysses group size (divides --world; the rest is data parallel)");
ABSL_FLAG(std::string, backend, "cuda", "cuda | cpu");
ABSL_FLAG(std::string, model, "llama-3.2-1b", "model preset");
ABSL_FLAG(std::string, seq_lens, "65536", "comma-separated sequence lengths S (per sample)");
ABSL_FLAG(int, steps, 2, "timed steps per S (median reported), after --warmup steps");
ABSL_FLAG(int, warmup, 1, "untimed warm-up steps per S (cuDNN plan choice happens in the first)");
ABSL_FLAG(std::string, timeline, "",
          "per-collective CUDA-event timeline of the last timed step, one file per rank and S: "
          "PATH.w<world>sp<sp>.[no-]overlap.S<S>.rank<r>.jsonl (CUDA only)");
ABSL_FLAG(double, comm_timeout_s, 600, "bound on joining and on every collective");
ABSL_FLAG(std::string, tag, "", "free-form label copied into each line");
ABSL_FLAG(int64_t, probe, 0, "memory probe: attention window W (0: real, timed steps)");
ABSL_FLAG(bool, rehearse, false,
          "run one rank (--rank) of the layout alone on this device, collectives as local "
          "copies held for the link model's time (docs/rehearsal.md)");
ABSL_FLAG(int, rank, 0, "--rehearse: the rank rehearsed");
ABSL_FLAG(int, nodes, 1, "--rehearse: nodes of the job, world/nodes consecutive ranks on each");
ABSL_FLAG(std::string, link, "h200-sxm",
          "--rehearse: a preset (h100-sxm, h200-sxm, zero) and/or nvlink_gbps=, nvlink_us=, "
          "ib_gbps=, ib_us= overrides, comma-separated");
ABSL_FLAG(double, device_memory_gib, 0,
          "--rehearse: the rehearsed GPU's memory in GiB (e.g. 80 for an H100 SXM); 0: this one's");
ABSL_FLAG(double, node_host_gib, 2048,
          "--rehearse: host memory of one rehearsed node in GiB (DGX H100/H200: 2 TiB)");
ABSL_FLAG(int, node_cores, 112, "--rehearse: CPU cores of one rehearsed node (DGX H100: 112)");
ABSL_FLAG(bool, compute_step, true,
          "--rehearse: time one more step per S without link time (compute_s, comm_exposed_s)");
ABSL_FLAG(bool, planner_settings, false,
          "--rehearse: for each S, the memory settings admission resolves for the job on the "
          "rehearsed node (recompute from --recompute; head_chunk, tiles, offload, saved inputs, "
          "optimizer and parameter offload chosen by the planner)");
ABSL_FLAG(bool, plan_only, false,
          "print the planner's per-rank device memory for each S and exit (no GPU, no ranks)");

ABSL_FLAG(std::string, rates, "",
          "the step-time model's rate table (engine/plan/step_time.h text; empty: the committed "
          "table of the backend's device class) for the lines' predicted_step_s");

namespace ithaca {
namespace {

// The GPU whose rates predict a rehearsed node's steps: this machine's, or without one
// (--plan_only on a CPU machine) the rehearsed node's as --link names it ("h100-sxm").
std::string RehearsedGpuName() {
  const std::string here = bench::DeviceName();
  return here != "unknown" ? here : absl::GetFlag(FLAGS_link);
}

// The rate table the lines' predictions use (--rates, else the committed one of the GPU).
const RateTable& Rates(Device device) {
  static const RateTable* from_flag = [] {
    const std::string path = absl::GetFlag(FLAGS_rates);
    if (path.empty()) return static_cast<RateTable*>(nullptr);
    absl::StatusOr<std::string> text = ReadFileToString(path);
    absl::StatusOr<RateTable> t =
        text.ok() ? ParseRateTable(*text) : absl::StatusOr<RateTable>(text.status());
    if (!t.ok()) {
      std::fprintf(stderr, "--rates %s: %s\n", path.c_str(),
                   std::string(t.status().message()).c_str());
      std::exit(2);
    }
    return new RateTable(*t);
  }();
  return from_flag != nullptr ? *from_flag : DefaultRateTable(device, RehearsedGpuName());
}

// The planner's prediction for one rank of this layout (bf16 on CUDA), as the bench's lines
// carry it: the device peak plus the library workspaces.
absl::StatusOr<MemoryPlan> Plan(const LlamaConfig& cfg, int64_t S, int world, int sp,
                                Device device = Device::kCuda) {
  PlanRequest req;
  req.cfg = cfg;
  req.world = world;
  req.sp = sp;
  req.seq_len = S;
  req.opts = bench::ModelOptions();
  req.optimizer_offload = absl::GetFlag(FLAGS_optimizer_offload);
  req.device = device;
  req.act = device == Device::kCuda ? DType::kBF16 : DType::kF32;
  bench::PlanProbeKernels(absl::GetFlag(FLAGS_probe),
                          device == Device::kCuda && bench::HopperAttentionRunsHere(), &req);
  req.rates = &Rates(device);
  ASSIGN_OR_RETURN(req.link, ParseLinkModel(absl::GetFlag(FLAGS_link)));
  req.ranks_per_node = RanksPerHost(world, absl::GetFlag(FLAGS_nodes));
  return PlanMemory(req);
}

// ---------------------------------------------------------------------------------------------
// One rank.

struct RankSetup {
  Backend backend;
  std::shared_ptr<bench::Timeline> timeline;  // null: no --timeline
  bool record_timeline = false;               // CUDA: the timeline records the last timed step
  std::unique_ptr<Comm> world;                // null for a world of one
  std::unique_ptr<Comm> sp;                   // null without Ulysses
  RehearsalComm* rehearsal = nullptr;         // `world`, when rehearsing
  // --rehearse: one node of the cluster rehearsed, and what the rank gets of it.
  NodeResources node;
  LinkModel link;
  int cores_share = 0, cores_used = 0;
};

// One node of the rehearsed cluster: its GPU (--device_memory_gib, else `this_gpu_bytes`), its
// host (--node_host_gib) and its ranks (world / --nodes).
NodeResources RehearsedNode(int world, int64_t this_gpu_bytes) {
  NodeResources node;
  const double gib = absl::GetFlag(FLAGS_device_memory_gib);
  node.device_memory_bytes = gib > 0 ? static_cast<int64_t>(gib * kGiB) : this_gpu_bytes;
  node.host_memory_bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_node_host_gib) * kGiB);
  node.ranks_on_host = RanksPerHost(world, absl::GetFlag(FLAGS_nodes));
  node.gpu_name = RehearsedGpuName();  // --planner_settings' plans use its rate table
  return node;
}

// A rehearsal's memory settings for S: the bench's flags, or (--planner_settings) what admission
// resolves for the job on the rehearsed node, written into the same flags so that every reader
// (ModelOptions, Techniques, RandomOptimizer, Plan) sees them.
absl::StatusOr<ResolvedJob> ApplyPlannerSettings(const NodeResources& node, int64_t S, int world,
                                                 int sp) {
  // The command line's spec, read before an S wrote its resolution into the flags. Of its memory
  // section only the policy asked for is kept: the rest is the planner's to choose.
  static const JobSpec asked = bench::BenchSpec();
  JobSpec spec;
  spec.backend = absl::GetFlag(FLAGS_backend);
  spec.model.preset = absl::GetFlag(FLAGS_model);
  spec.lora = asked.lora;
  spec.data.seq_len = S;
  spec.parallel.world = world;
  spec.parallel.sp = sp;
  spec.parallel.ring = asked.parallel.ring;
  spec.parallel.fsdp = asked.parallel.fsdp;
  spec.memory.recompute = asked.memory.recompute;
  spec.memory.attention_aware_blocks = asked.memory.attention_aware_blocks;
  // The offloads stay at the spec's defaults ("auto"), as a job through ithacad plans them.
  ASSIGN_OR_RETURN(ResolvedJob job, ResolveJob(spec, node));
  if (!job.plan.fits) {
    std::fprintf(stderr, "S %lld: the planner finds no settings that fit: %s\n",
                 static_cast<long long>(S), job.plan.verdict.c_str());
  }
  bench::SetMemoryFlags(job.spec.memory);
  absl::SetFlag(&FLAGS_ring, job.spec.parallel.ring);  // the ring the plan was made for
  std::fprintf(stderr, "S %lld: %s\n", static_cast<long long>(S), ResolutionLine(job).c_str());
  return job;
}

// Bytes per tier as a JSON object.
bench::Json TierBytes(const std::array<int64_t, kNumTiers>& bytes) {
  bench::Json j;
  for (int t = 0; t < kNumTiers; ++t) j.Int(TierName(static_cast<Tier>(t)), bytes[t]);
  return j;
}

absl::Status RunS(RankSetup& r, const LlamaConfig& cfg, int64_t S, int rank, int world, int sp) {
  const bool rehearse = r.rehearsal != nullptr;
  if (rehearse && absl::GetFlag(FLAGS_planner_settings)) {
    RETURN_IF_ERROR(ApplyPlannerSettings(r.node, S, world, sp).status());
  }
  Ops* ops = r.backend.ops.get();
  Allocator* alloc = r.backend.alloc.get();
  const LlamaModel::Options mo = bench::ModelOptions();
  ASSIGN_OR_RETURN(auto model, LlamaModel::Create(cfg, ops, alloc, mo, r.world.get(), r.sp.get()));
  JobSpec::Training hp;
  ASSIGN_OR_RETURN(auto opt, bench::RandomOptimizer(model.get(), hp));
  ParamStore& ps = model->params();
  const int dp = world / sp, dp_rank = rank / sp;
  // Each data-parallel replica trains its own sample; a Ulysses group shares one.
  std::mt19937 gen(7 + dp_rank);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.vocab_size - 1));
  std::vector<int32_t> inputs(S), labels(S);
  ASSIGN_OR_RETURN(Buffer loss_buf, Buffer::Make(alloc, DType::kF32, {1}, Tier::kComm));
  const float grad_scale = 1.f / static_cast<float>(S * dp);

  const int64_t probe = absl::GetFlag(FLAGS_probe);
  // A probe is one step: its time is not a measurement.
  const int warmup = probe > 0 ? 0 : absl::GetFlag(FLAGS_warmup);
  const int timed = probe > 0 ? 1 : absl::GetFlag(FLAGS_steps);
  // A rehearsal times one more step without link time: the step's compute (and copies) alone.
  const int compute_steps = rehearse && probe == 0 && absl::GetFlag(FLAGS_compute_step) ? 1 : 0;
  std::vector<double> step_s, compute_s, modeled_s;
  double loss = 0;
  int64_t device_peak = 0, process_used = 0;
  std::array<int64_t, kNumTiers> peaks{};
  RehearsalStats comm_stats;
  absl::StatusOr<bench::Json> timeline_summary = absl::NotFoundError("no timeline");
  for (int step = 0; step < warmup + timed + compute_steps; ++step) {
    const bool compute_only = step >= warmup + timed;
    if (rehearse) r.rehearsal->set_link_time(!compute_only);
    for (int64_t i = 0; i < S; ++i) inputs[i] = tok(gen);
    for (int64_t i = 0; i + 1 < S; ++i) labels[i] = inputs[i + 1];
    labels[S - 1] = tok(gen);
    const bool record = r.record_timeline && step + 1 == warmup + timed;
    ops->Synchronize();
    if (r.world) RETURN_IF_ERROR(r.world->Barrier());  // the ranks start the step together
    alloc->tracker().ResetPeaks();
    if (rehearse) r.rehearsal->ResetStats();
    const auto start = std::chrono::steady_clock::now();
    if (record) r.timeline->BeginStep();
    ps.ZeroGrads();
    std::vector<Buffer> staging;
    {
      ASSIGN_OR_RETURN(DeviceSample d,
                       model->UploadSampleAsync(inputs.data(), labels.data(), S, {}, &staging));
      RETURN_IF_ERROR(model->ForwardBackward(d, grad_scale, loss_buf.tensor()));
    }
    RETURN_IF_ERROR(ps.FinishGradients());
    // The global gradient norm (its all-reduce and one host read) and the AdamW update.
    RETURN_IF_ERROR(opt->Step(step + 1, hp.lr).status());
    if (record) r.timeline->EndStep();
    ops->Synchronize();
    if (r.world) RETURN_IF_ERROR(r.world->Synchronize());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!compute_only) {
      device_peak = alloc->tracker().device_peak();
      for (int t = 0; t < kNumTiers; ++t) peaks[t] = alloc->tracker().peak(static_cast<Tier>(t));
      process_used = bench::DeviceUsedBytes();
      if (rehearse) comm_stats = r.rehearsal->stats();
    }
    // The loss, outside the timed span: summed over the Ulysses shares and the replicas.
    if (r.world) RETURN_IF_ERROR(r.world->AllReduce(loss_buf.tensor()));
    float l = 0;
    ops->Download(loss_buf.tensor(), &l, DType::kF32);
    loss = l / static_cast<double>(S * dp);
    if (rank == 0 || rehearse) {
      std::fprintf(stderr, "S %lld step %d%s: %.3f s, loss %.4f\n", static_cast<long long>(S), step,
                   compute_only ? " (no link time)" : "", seconds, loss);
    }
    if (compute_only) {
      compute_s.push_back(seconds);
    } else if (step >= warmup) {
      step_s.push_back(seconds);
      if (rehearse) modeled_s.push_back(comm_stats.modeled_s());
    }
    if (record) {
      const std::string path =
          absl::StrCat(absl::GetFlag(FLAGS_timeline), ".w", world, "sp", sp,
                       mo.overlap ? ".overlap" : ".no-overlap", ".S", S, ".rank", rank, ".jsonl");
      timeline_summary = r.timeline->Write(path, rank, S);
      RETURN_IF_ERROR(timeline_summary.status());
      std::fprintf(stderr, "%s: %s\n", path.c_str(), timeline_summary->str().c_str());
    }
  }
  if (rank != 0 && !rehearse) return absl::OkStatus();

  const double t = bench::Median(step_s);
  const double tok_s = static_cast<double>(S * dp) / t;
  const double tflops = ModelFlopsPerSample(cfg, S, {}) * dp / t / 1e12;
  std::string steps_json = "[";
  for (size_t i = 0; i < step_s.size(); ++i)
    absl::StrAppendFormat(&steps_json, "%s%.4f", i ? ", " : "", step_s[i]);
  steps_json += "]";
  auto* cuda = dynamic_cast<CudaOps*>(ops);
  const bench::Json techniques = bench::Techniques(mo, cuda ? cuda->last_attention_impl() : "cpu");
  const char* mode = rehearse ? "rehearsal" : probe > 0 ? "memory-probe" : "throughput";
  bench::Json line;
  line.Str("bench", "parallel")
      .Str("date", bench::Today())
      .Str("device", cuda ? bench::DeviceName() : "cpu")
      .Str("model", absl::GetFlag(FLAGS_model))
      .Int("S", S)
      .Int("world", world)
      .Int("sp", sp)
      .Int("ring", model->head_plan().P > 0 ? sp / model->head_plan().P : 1)
      .Int("dp", dp)
      .Bool("overlap", mo.overlap)
      .Str("mode", mode)
      .Obj("techniques", techniques);
  if (!absl::GetFlag(FLAGS_tag).empty()) line.Str("tag", absl::GetFlag(FLAGS_tag));
  if (rehearse) {
    const LinkModel& link = r.link;
    bench::Json link_json;
    link_json.Str("name", link.name)
        .Num("nvlink_gbps", link.nvlink.bytes_per_s / 1e9)
        .Num("nvlink_us", link.nvlink.latency_s * 1e6)
        .Num("ib_gbps", link.ib.bytes_per_s / 1e9)
        .Num("ib_us", link.ib.latency_s * 1e6);
    line.Int("nodes", absl::GetFlag(FLAGS_nodes)).Int("rank", rank).Obj("link", link_json);
  }
  // The decoder layers this step ran, and the model's. A step of fewer layers is not the model's
  // step: its line carries no tok/s (bench/project_layers.py projects whole steps from such
  // lines, in lines of their own).
  ASSIGN_OR_RETURN(const LlamaConfig preset, PresetConfig(absl::GetFlag(FLAGS_model)));
  const bool whole_model = cfg.num_hidden_layers == preset.num_hidden_layers;
  line.Int("layers", cfg.num_hidden_layers).Int("model_layers", preset.num_hidden_layers);
  if (probe > 0) {
    line.Int("probe_window", probe);
  } else if (!rehearse && whole_model) {  // a rehearsal's figures are projections (below)
    line.Num("tok_per_s", tok_s)
        .Num("tok_per_s_per_gpu", tok_s / world)
        .Num("model_tflops_per_gpu", tflops / world);
    if (ops->PeakFlops() > 0) line.Num("mfu", tflops * 1e12 / world / ops->PeakFlops());
  }
  line.Num("step_s", t).Raw("step_times_s", steps_json).Int("device_peak_bytes", device_peak);
  line.Int("host_block_inputs_peak_bytes", peaks[static_cast<int>(Tier::kHostBlockInputs)]);
  if (rehearse) {
    line.Obj("peaks", TierBytes(peaks));
    if (probe == 0) {
      // What the job would do: every rank runs this rank's step (the layout is symmetric).
      if (whole_model) {
        line.Num("projected_tok_per_s_per_gpu", tok_s / world)
            .Num("projected_model_tflops_per_gpu", tflops / world);
      }
      line.Num("comm_modeled_s", bench::Median(modeled_s)).Int("collectives", comm_stats.calls());
      if (!compute_s.empty()) {
        const double c = bench::Median(compute_s);
        line.Num("compute_s", c).Num("comm_exposed_s", std::max(0.0, t - c));
      } else {
        line.Null("compute_s").Null("comm_exposed_s");
      }
      bench::Json by_op;
      for (int o = 0; o < static_cast<int>(comm_stats.by_op.size()); ++o) {
        const RehearsalCounts& c = comm_stats.by_op[o];
        if (c.calls == 0) continue;
        by_op.Raw(CollectiveOpName(static_cast<CollectiveOp>(o)),
                  absl::StrFormat("{\"calls\": %lld, \"bytes\": %lld, \"modeled_s\": %.6g}",
                                  static_cast<long long>(c.calls), static_cast<long long>(c.bytes),
                                  c.modeled_s));
      }
      line.Obj("comm_by_op", by_op);
    }
    // The node rehearsed and this rank's share of it.
    JobSpec backend_spec;  // the budget rule for this backend: BudgetsFor
    backend_spec.backend = absl::GetFlag(FLAGS_backend);
    const RankBudgets budgets = BudgetsFor(backend_spec, r.node);
    const NodeResources here = LocalNodeResources(r.backend.device_bytes, 1);
    line.Int("device_memory_bytes", r.node.device_memory_bytes)
        .Int("gpu_budget_bytes", budgets.gpu_bytes)
        .Int("node_host_bytes", r.node.host_memory_bytes)
        .Int("ranks_per_node", r.node.ranks_on_host)
        .Int("host_share_bytes", budgets.host_bytes)
        .Int("host_here_bytes", here.host_memory_bytes)
        .Bool("host_share_representable",
              budgets.host_bytes <= BudgetsFor(backend_spec, here).host_bytes)
        .Int("cores_share", r.cores_share)
        .Int("cores_used", r.cores_used);
  }
  if (cuda || rehearse) {
    // Rank 0's GPU as the device sees it (context, libraries, NCCL and the allocator's
    // reservations), against the planner's prediction for one rank.
    if (cuda) line.Int("process_device_used_bytes", process_used);
    absl::StatusOr<MemoryPlan> plan = Plan(cfg, S, world, sp, r.backend.device());
    if (plan.ok()) {
      line.Int("planner_device_total_bytes", plan->device_total())
          .Int("planner_host_block_inputs_bytes",
               plan->peak[static_cast<int>(Tier::kHostBlockInputs)]);
      if (rehearse) line.Obj("planner_peaks", TierBytes(plan->peak));
      bench::AddPrediction(*plan, t, &line);
      if (process_used > 0 && cuda) {
        line.Num("planner_rel_error_process",
                 double(plan->device_total() - process_used) / double(process_used));
      }
    }
  }
  if (timeline_summary.ok()) line.Obj("timeline_rank0", *timeline_summary);
  line.Num("loss", loss).Print();
  return absl::OkStatus();
}

// --rehearse: this process is rank --rank of the layout, alone on GPU 0 (or the CPU).
absl::Status SetUpRehearsal(RankSetup& r, const LlamaConfig& cfg, int rank, int world, int sp) {
  const int nodes = absl::GetFlag(FLAGS_nodes);
  if (nodes < 1 || world % nodes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nodes ", nodes, ": must divide --world ", world));
  }
  RankRehearsal rehearsal;
  rehearsal.nodes = nodes;
  ASSIGN_OR_RETURN(rehearsal.link, ParseLinkModel(absl::GetFlag(FLAGS_link)));
  rehearsal.node = RehearsedNode(world, r.backend.device_bytes);
  r.link = rehearsal.link;
  r.node = rehearsal.node;
  const int per_node = RanksPerHost(world, nodes);
  // The rank's cores: its share of the node's, taken from this machine's (the CPU AdamW's
  // threads follow the affinity, engine/train/host_adamw.h).
  r.cores_share = std::max(1, absl::GetFlag(FLAGS_node_cores) / per_node);
  cpu_set_t here;
  CPU_ZERO(&here);
  if (sched_getaffinity(0, sizeof(here), &here) == 0) {
    cpu_set_t mine;
    CPU_ZERO(&mine);
    int taken = 0;
    for (int c = 0; c < CPU_SETSIZE && taken < r.cores_share; ++c) {
      if (CPU_ISSET(c, &here)) {
        CPU_SET(c, &mine);
        ++taken;
      }
    }
    if (sched_setaffinity(0, sizeof(mine), &mine) == 0) r.cores_used = taken;
  }
  RankInfo info;
  info.rank = rank;
  info.world = world;
  const LlamaModel::Options mo = bench::ModelOptions();
  ASSIGN_OR_RETURN(const int64_t ring, RingFor(cfg, sp, mo.ring, mo.head_chunk));
  ASSIGN_OR_RETURN(std::unique_ptr<RehearsalComm> comm,
                   ConnectRehearsal(info, sp, static_cast<int>(ring), rehearsal, r.backend));
  r.rehearsal = comm.get();
  r.world = std::move(comm);
  if (sp > 1) {
    const SplitArgs a = UlyssesSplit(rank, sp);
    ASSIGN_OR_RETURN(r.sp, r.world->Split(a.color, a.key));
  }
  std::fprintf(stderr,
               "rehearsal: rank %d of %d (sp %d, dp %d) on %d node(s) of %d ranks; link %s; GPU "
               "%.1f GiB; host share %.1f GiB, %d cores (of this machine's %.1f GiB)\n",
               rank, world, sp, world / sp, nodes, per_node, LinkModelText(rehearsal.link).c_str(),
               r.node.device_memory_bytes / kGiB, BudgetsFor(JobSpec(), r.node).host_bytes / kGiB,
               r.cores_used, LocalNodeResources(0, 1).host_memory_bytes / kGiB);
  return absl::OkStatus();
}

absl::Status RunRank(int rank, int world, const std::string& rendezvous) {
  const int sp = absl::GetFlag(FLAGS_sp);
  const bool rehearse = absl::GetFlag(FLAGS_rehearse);
  ASSIGN_OR_RETURN(LlamaConfig cfg, bench::BenchConfig(absl::GetFlag(FLAGS_model)));
  JobSpec spec;
  spec.backend = absl::GetFlag(FLAGS_backend);
  if (rehearse && absl::GetFlag(FLAGS_device_memory_gib) > 0 && spec.backend == "cuda") {
    // The allocator holds to the rehearsed GPU's budget (this GPU's own, uncapped, otherwise).
    CapAtRehearsedGpu(RehearsedNode(world, 0), &spec);
  }
  RankSetup r;
  ASSIGN_OR_RETURN(r.backend, MakeBackend(spec, rehearse ? 0 : rank, absl::GetFlag(FLAGS_probe)));
  const DeviceStreams streams = r.backend.ops->streams();
  const bool cuda = r.backend.device() == Device::kCuda;
  if (!absl::GetFlag(FLAGS_timeline).empty()) {
    // The communicator's collectives run on streams.comm once UseStreams is called (below).
    r.timeline = std::make_shared<bench::Timeline>(static_cast<cudaStream_t>(streams.compute),
                                                   static_cast<cudaStream_t>(streams.comm));
    // On the CPU the communicator is wrapped all the same (so the CPU test runs TimelineComm's
    // forwarding) but nothing is recorded.
    r.record_timeline = cuda;
    if (!cuda && rank == 0) {
      std::fprintf(stderr, "--timeline: CUDA only (CUDA events); no timeline on the CPU\n");
    }
  }
  if (rehearse) {
    RETURN_IF_ERROR(SetUpRehearsal(r, cfg, rank, world, sp));
  } else if (world > 1) {
    RankInfo info;
    info.rank = rank;
    info.world = world;
    info.gpu = cuda ? rank : -1;
    info.rendezvous = rendezvous;
    ASSIGN_OR_RETURN(r.world,
                     ConnectComm(info, r.backend.device(), absl::GetFlag(FLAGS_comm_timeout_s)));
    if (r.timeline) {
      r.world = std::make_unique<bench::TimelineComm>(std::move(r.world), r.timeline, "world");
    }
    // Before splitting: the Ulysses group inherits the streams (engine/runtime/rank.cc).
    r.world->UseStreams(streams);
    if (sp > 1) {
      // Ulysses groups of consecutive ranks, as the Trainer splits them.
      const SplitArgs a = UlyssesSplit(rank, sp);
      ASSIGN_OR_RETURN(r.sp, r.world->Split(a.color, a.key));
    }
  }
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_seq_lens), ',')) {
    int64_t S = 0;
    if (!absl::SimpleAtoi(s, &S) || S <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--seq_lens: \"", s, "\" is not a length"));
    }
    absl::Status st = RunS(r, cfg, S, rank, world, sp);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("S ", S, ": ", st.message()));
  }
  return absl::OkStatus();
}

int Main() {
  const int world = absl::GetFlag(FLAGS_world), sp = absl::GetFlag(FLAGS_sp);
  if (world < 1 || sp < 1 || world % sp != 0) {
    std::fprintf(stderr, "--world %d, --sp %d: sp must divide world\n", world, sp);
    return 2;
  }
  if (absl::GetFlag(FLAGS_probe) > 0 && absl::GetFlag(FLAGS_backend) != "cuda") {
    std::fprintf(stderr,
                 "--probe: the memory probe needs --backend=cuda (its window is cuDNN's)\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_rehearse)) {
    // One rank, in this process.
    const int rank = absl::GetFlag(FLAGS_rank);
    if (rank < 0 || rank >= world) {
      std::fprintf(stderr, "--rank %d: not a rank of --world %d\n", rank, world);
      return 2;
    }
    absl::Status st = RunRank(rank, world, "");
    if (!st.ok()) {
      std::fprintf(stderr, "rehearsal of rank %d: %s\n", rank, st.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (absl::GetFlag(FLAGS_plan_only)) {
    absl::StatusOr<LlamaConfig> cfg = bench::BenchConfig(absl::GetFlag(FLAGS_model));
    if (!cfg.ok()) {
      std::fprintf(stderr, "%s\n", cfg.status().ToString().c_str());
      return 2;
    }
    for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_seq_lens), ',')) {
      int64_t S = 0;
      if (!absl::SimpleAtoi(text, &S) || S <= 0) {
        std::fprintf(stderr, "--seq_lens: \"%s\" is not a length\n", std::string(text).c_str());
        return 2;
      }
      // --planner_settings: what admission resolves on the rehearsed node (the GPU is
      // --device_memory_gib's; without a GPU here, that flag is needed).
      absl::StatusOr<ResolvedJob> job = absl::NotFoundError("no resolution");
      if (absl::GetFlag(FLAGS_planner_settings)) {
        const NodeResources node = RehearsedNode(world, 0);
        if (node.device_memory_bytes <= 0 && absl::GetFlag(FLAGS_backend) == "cuda") {
          std::fprintf(stderr, "--plan_only --planner_settings: give --device_memory_gib\n");
          return 2;
        }
        job = ApplyPlannerSettings(node, S, world, sp);
        if (!job.ok()) {
          std::fprintf(stderr, "S %lld: %s\n", static_cast<long long>(S),
                       job.status().ToString().c_str());
          return 1;
        }
      }
      absl::StatusOr<MemoryPlan> plan = Plan(*cfg, S, world, sp);
      if (!plan.ok()) {
        std::fprintf(stderr, "S %s: %s\n", std::string(text).c_str(),
                     plan.status().ToString().c_str());
        return 1;
      }
      bench::Json line;
      line.Str("bench", "parallel")
          .Str("mode", "plan-only")
          .Str("model", absl::GetFlag(FLAGS_model))
          .Int("S", S)
          .Int("world", world)
          .Int("sp", sp)
          .Int("ring",
               RingFor(*cfg, sp, bench::ModelOptions().ring, bench::ModelOptions().head_chunk)
                   .value_or(0))
          .Bool("overlap", bench::ModelOptions().overlap)
          .Int("device_total_bytes", plan->device_total())
          .Num("device_total_gib", plan->device_total() / kGiB)
          .Num("host_block_inputs_gib", plan->peak[static_cast<int>(Tier::kHostBlockInputs)] / kGiB)
          .Raw("fits", job.ok() ? (job->plan.fits ? "true" : "false") : "null")
          .Str("verdict", job.ok() ? job->plan.verdict : "")
          .Obj("planner_peaks", TierBytes(plan->peak));
      bench::AddPrediction(*plan, 0, &line);
      line.Print();
    }
    return 0;
  }
  // A file rendezvous in a fresh directory (engine/comm/bootstrap.h), for this run only.
  char dir[] = "/tmp/parallel_bench.XXXXXX";
  if (world > 1 && mkdtemp(dir) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string rendezvous = world > 1 ? absl::StrCat("file:", dir) : "";
  // One process per rank, forked before this process touches CUDA or starts a thread.
  std::vector<pid_t> pids;
  const pid_t parent = getpid();
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      // A rank outlives no parent (one killed by a timeout, say): it would hold its GPU.
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(1);  // it died before prctl
      absl::Status st = RunRank(rank, world, rendezvous);
      if (!st.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, st.ToString().c_str());
      std::fflush(stdout);
      _exit(st.ok() ? 0 : 1);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  std::vector<pid_t> running = pids;
  while (!running.empty()) {
    int status = 0;
    const pid_t pid = wait(&status);
    if (pid < 0) break;
    running.erase(std::remove(running.begin(), running.end(), pid), running.end());
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
      // The others would wait for it until their collectives time out: end them now.
      for (pid_t p : running) kill(p, SIGTERM);
    }
  }
  if (world > 1) {
    // The rendezvous files, then the directory.
    std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ithaca::Main();
}
