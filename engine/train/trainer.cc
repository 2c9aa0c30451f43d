#include "engine/core/units.h"
#include "engine/train/trainer.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>

#include "engine/core/file_util.h"
#include "engine/core/path_policy.h"
#include "engine/plan/step_time.h"
#include "engine/schedule/spec_options.h"
#include "engine/model/lora_adapter.h"
#include "engine/model/weights.h"
#include "engine/checkpoint/distributed_checkpoint.h"
#include "engine/checkpoint/export.h"
#include "engine/train/lr_schedule.h"

namespace ithaca {

std::string FormatStepLine(const StepReport& r) {
  // MFU only where the backend knows its peak; the fields around it stay in place.
  const std::string mfu = r.mfu > 0 ? absl::StrFormat(" | mfu %.1f%%", 100 * r.mfu) : "";
  // One unit for the whole memory field, chosen by the total, so the line parses uniformly.
  const bool gib = r.mem_device_peak >= kGiBBytes;
  const double unit = gib ? kGiB : kMiB;
  std::string tiers;
  for (int t = 0; t < kNumTiers; ++t) {
    if (!IsDeviceTier(static_cast<Tier>(t)) && r.mem_peak[t] == 0) continue;
    absl::StrAppendFormat(&tiers, "%s%s %.1f", tiers.empty() ? "" : " ",
                          TierName(static_cast<Tier>(t)), r.mem_peak[t] / unit);
  }
  // Only under optimizer offload: the CPU AdamW's time and how long the device waited for it.
  const std::string host_update =
      r.device_wait_seconds > 0 || r.cpu_update_seconds > 0
          ? absl::StrFormat(" | cpu adamw %.2f s (device waited %.2f s)", r.cpu_update_seconds,
                            r.device_wait_seconds)
          : "";
  std::string sources;
  for (size_t i = 0; i < r.sources.size(); ++i) {
    const SourceStats& st = r.sources[i];
    absl::StrAppendFormat(&sources, "%s source %d: %d sample%s", i == 0 ? " |" : ",", i + 1,
                          st.samples, st.samples == 1 ? "" : "s");
    if (st.loss_tokens > 0) absl::StrAppendFormat(&sources, " loss %.4f", st.loss);
  }
  return absl::StrFormat(
      "step %d/%d | loss %.4f | tok/s/gpu %.1f | tflops %.1f%s | mem %.1f %s (%s)%s%s | %.2f s",
      r.step, r.total_steps, r.loss, r.tokens_per_second, r.model_tflops, mfu,
      r.mem_device_peak / unit, gib ? "GiB" : "MiB", tiers, host_update, sources, r.seconds);
}

std::vector<std::pair<std::string, double>> TensorBoardScalars(const StepReport& r) {
  std::vector<std::pair<std::string, double>> v = {
      {"train/loss", r.loss},
      {"train/lr", r.lr},
      {"train/grad_norm", r.grad_norm},
      {"train/tokens_per_second", r.tokens_per_second},
      {"train/step_seconds", r.seconds},
      {"memory/device_peak_gib", r.mem_device_peak / kGiB},
  };
  for (int t = 0; t < kNumTiers; ++t) {
    if (!IsDeviceTier(static_cast<Tier>(t)) && r.mem_peak[t] == 0) continue;
    v.emplace_back(absl::StrCat("memory/", TierName(static_cast<Tier>(t)), "_peak_gib"),
                   r.mem_peak[t] / kGiB);
  }
  if (r.model_tflops > 0) v.emplace_back("train/model_tflops", r.model_tflops);
  if (r.mfu > 0) v.emplace_back("train/mfu", r.mfu);
  for (size_t i = 0; i < r.sources.size(); ++i) {
    const SourceStats& st = r.sources[i];
    const std::string tag = absl::StrCat("source/", i + 1, "/");
    v.emplace_back(tag + "samples", static_cast<double>(st.samples));
    v.emplace_back(tag + "tokens", static_cast<double>(st.tokens));
    if (st.loss_tokens > 0) v.emplace_back(tag + "loss", st.loss);
  }
  return v;
}

std::vector<std::pair<std::string, double>> EvalScalars(const EvalReport& r) {
  std::vector<std::pair<std::string, double>> v;
  if (r.tokens > 0) v.emplace_back("eval/loss", r.loss);
  for (const PositionLoss& b : r.positions) {
    if (b.tokens > 0)
      v.emplace_back(absl::StrFormat("eval/position/%d-%d", b.begin, b.end), b.loss);
  }
  for (const PasskeyResult& p : r.passkey) {
    const std::string at =
        p.keys > 1 ? absl::StrFormat("passkey/%d_keys/%d/depth_%g", p.keys, p.length, p.depth)
                   : absl::StrFormat("passkey/%d/depth_%g", p.length, p.depth);
    v.emplace_back(at + "/accuracy", p.accuracy);
    v.emplace_back(at + "/logprob", p.logprob);
  }
  return v;
}

std::string FormatStartupLine(const StartupReport& r) {
  const Optimizer::StartupTimes& o = r.optimizer;
  const double rest =
      r.total_s - r.model_s - o.allocate_s - o.init_s - o.place_s - o.working_copy_s;
  const std::string pinned =
      o.host_bytes > 0 ? absl::StrFormat(" (pinned host %.1f GB)", o.host_bytes / 1e9) : "";
  return absl::StrFormat(
      "start-up %.1f s: model %.1f s, optimizer state allocated %.1f s%s, initial weights %.1f s, "
      "placed %.1f s, working copy %.1f s, data and the rest %.1f s",
      r.total_s, r.model_s, o.allocate_s, pinned, o.init_s, o.place_s, o.working_copy_s,
      std::max(0.0, rest));
}

double ModelFlopsPerToken(const LlamaConfig& c, int64_t seq_len) {
  return ModelFlopsPerSample(c, seq_len, {}) / static_cast<double>(seq_len);
}

double ModelFlopsPerSample(const LlamaConfig& c, int64_t seq_len,
                           const std::vector<int64_t>& doc_starts) {
  const double d = c.hidden_size, D = c.head_dim;
  const double per_layer = d * D * (2.0 * c.num_attention_heads + 2.0 * c.num_key_value_heads) +
                           3.0 * d * c.intermediate_size;
  const double n = c.num_hidden_layers * per_layer + double(c.vocab_size) * d;
  // Each layer counts the attention it computes, with its own window (Qwen2/Qwen3 window only
  // some): AttentionPairs, the step-time model's count too.
  const double full = AttentionPairs(seq_len, 0, doc_starts);
  const double windowed =
      c.sliding_window > 0 ? AttentionPairs(seq_len, c.sliding_window, doc_starts) : 0;
  double pairs = 0;  // over every layer
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    pairs += c.LayerWindow(l) > 0 ? windowed : full;
  }
  return 6.0 * n * double(seq_len) + 6.0 * pairs * c.num_attention_heads * D;
}

namespace {

// ModelSourceDir, absolute: what the checkpoint records for ithaca-export.
std::string RecordedSourceModel(const JobSpec& spec) {
  const std::string dir = ModelSourceDir(spec);
  if (dir.empty()) return "";
  char real[PATH_MAX];
  return realpath(dir.c_str(), real) != nullptr ? std::string(real) : dir;
}

LrSchedule LrScheduleOf(const JobSpec::Training& t) {
  LrSchedule s;
  // ParseJobSpec accepted only the names ParseLrScheduleKind knows.
  s.kind = ParseLrScheduleKind(t.schedule).value_or(LrScheduleKind::kCosine);
  s.decay_ratio = t.decay_ratio;
  s.lr = t.lr;
  s.min_lr = t.min_lr;
  s.warmup_steps = t.warmup_steps;
  s.total_steps = t.steps;
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const JobSpec& spec, Ops* ops,
                                                         Allocator* alloc, Comm* comm,
                                                         const std::string& run_id) {
  const auto created = std::chrono::steady_clock::now();
  const int world = comm ? comm->size() : 1;
  if (world != spec.parallel.world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.world: the job asks for ", spec.parallel.world, " ranks but ", world, " joined"));
  }
  // The settings are the resolved spec's (ResolveJob validated them and chose every "auto"); the
  // trainer decides none of them.
  RETURN_IF_ERROR(CheckResolved(spec));
  if (spec.model.dtype != DTypeName(ops->act_dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.dtype: the job is resolved for ", spec.model.dtype,
                     " but the backend computes in ", DTypeName(ops->act_dtype())));
  }
  std::unique_ptr<Trainer> t(new Trainer());
  t->spec_ = spec;
  t->ops_ = ops;
  t->alloc_ = alloc;
  t->comm_ = comm;
  t->schedule_ = LrScheduleOf(spec.training);
  t->state_.run_id = run_id;
  t->state_.schedule_steps = spec.training.steps;
  t->state_.source_model = RecordedSourceModel(spec);
  t->world_ = world;
  t->rank_ = comm ? comm->rank() : 0;
  t->dp_ = world / spec.parallel.sp;
  t->dp_rank_ = t->rank_ / spec.parallel.sp;
  if (comm && spec.parallel.sp > 1) {
    const SplitArgs group = UlyssesSplit(t->rank_, static_cast<int>(spec.parallel.sp));
    ASSIGN_OR_RETURN(t->sp_comm_, comm->Split(group.color, group.key));
  }
  ASSIGN_OR_RETURN(t->cfg_, ResolveModelConfig(spec));
  t->state_.lora = t->cfg_.lora;  // what ithaca-export reads back
  const LlamaModel::Options mo = ModelOptionsFromSpec(spec);
  const auto model_start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(t->model_, LlamaModel::Create(t->cfg_, ops, alloc, mo, comm, t->sp_comm_.get()));
  ops->Synchronize();
  t->startup_.model_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - model_start).count();

  // An evaluation-only job may name no training data; when it does, the data is checked all
  // the same (and the eval data against it).
  if (!spec.data.path.empty()) {
    ASSIGN_OR_RETURN(t->data_, OpenTrainingData(spec, t->cfg_));
    if (!spec.data.weights.empty()) {
      ASSIGN_OR_RETURN(t->source_paths_, SplitDataSources(spec.data.path));
    }
    if (t->rank_ == 0) {
      for (const std::string& w : t->data_->warnings()) std::printf("warning: %s\n", w.c_str());
    }
  } else if (spec.training.steps > 0) {
    return absl::InvalidArgumentError("data.path: required: the token file to train on");
  }
  if (!spec.eval.passkey.lengths.empty()) {
    ASSIGN_OR_RETURN(t->passkey_,
                     PasskeyEval::Create(spec, t->model_.get(), comm, t->dp_, t->dp_rank_));
  }
  if (!spec.eval.path.empty()) {
    ASSIGN_OR_RETURN(t->evaluator_,
                     Evaluator::Create(spec, t->model_.get(), comm, t->dp_, t->dp_rank_,
                                       t->data_ ? &t->data_->file(0) : nullptr));
    if (t->rank_ == 0) {
      for (const std::string& w : t->evaluator_->warnings()) {
        std::printf("warning: %s\n", w.c_str());
      }
    }
  }

  // Resume when asked and a checkpoint exists; otherwise the given weights or a random init.
  absl::StatusOr<std::string> latest = absl::NotFoundError("checkpointing off");
  if (!spec.checkpoint.dir.empty() && spec.checkpoint.resume) {
    latest = LatestCheckpoint(spec.checkpoint.dir);
  }
  const ParamLayout& layout = t->model_->layout();
  const bool host_state = spec.memory.optimizer_offload == OffloadChoice::kOn;
  // With LoRA the adapters' units start from lora.init's PEFT adapter, else PEFT's own init; the
  // base's units from the model's weights as without it.
  std::unique_ptr<SafetensorsReader> adapter;
  if (!spec.lora.init.empty()) {
    ASSIGN_OR_RETURN(adapter, OpenPeftAdapter(spec.lora.init, t->cfg_.lora));
  }
  if (layout.has_lora() && t->rank_ == 0) {
    std::printf("lora: rank %lld, alpha %g; %lld trainable parameters of %lld (the base frozen)\n",
                static_cast<long long>(t->cfg_.lora.rank), t->cfg_.lora.alpha,
                static_cast<long long>(layout.trainable_numel()),
                static_cast<long long>(layout.total_numel()));
  }
  auto with_lora = [&](Optimizer::UnitFill base) -> Optimizer::UnitFill {
    return [&, base](int u, float* out) -> absl::Status {
      if (layout.units()[u].trainable && layout.has_lora()) {
        if (adapter) return ReadPeftUnitInto(layout, *adapter, u, out);
        LoraInitUnitInto(layout, u, spec.training.seed, out);
        return absl::OkStatus();
      }
      return base(u, out);
    };
  };
  // A new phase ([init] from) starts a run of its own: checkpoint.dir may hold only this run
  // (a relaunch of it resumes, below, rather than starting over).
  if (!spec.init.from.empty()) RETURN_IF_ERROR(CheckInitTarget(spec.checkpoint.dir, run_id));
  if (latest.ok()) {
    ASSIGN_OR_RETURN(const TrainState saved, ReadCheckpointState(*latest));
    RETURN_IF_ERROR(
        CheckResumeHasWork(spec.checkpoint.dir, spec.training.steps, *latest, saved, run_id));
    RETURN_IF_ERROR(CheckResumeRope(*latest, t->cfg_));
    // Each rank reads only its slice of the state, one unit at a time straight into the
    // optimizer, and verifies a share of the files.
    // With LoRA the checkpoint holds the adapters alone: the frozen base comes from where the
    // run's first start took it (model.weights, init.from, or the seed).
    std::shared_ptr<SafetensorsReader> base_reader;
    Optimizer::UnitFill base_fill = nullptr;
    if (layout.has_lora()) {
      std::string weights = spec.model.weights;
      if (weights.empty() && !spec.init.from.empty()) {
        ASSIGN_OR_RETURN(weights, InitWeightsDir(spec.init.from));
      }
      if (!weights.empty()) {
        ASSIGN_OR_RETURN(base_reader, SafetensorsReader::Open(weights));
        base_fill = [&](int u, float* out) {
          return ReadUnitWeightsInto(layout, *base_reader, u, out);
        };
      } else {
        base_fill = [&](int u, float* out) {
          RandomUnitWeightsInto(layout, u, spec.training.seed, out);
          return absl::OkStatus();
        };
      }
    }
    ASSIGN_OR_RETURN(ResumedCheckpoint resumed,
                     ResumeCheckpointTogether(*latest, t->model_.get(), comm, spec.training,
                                              host_state, base_fill));
    t->optimizer_ = std::move(resumed.optimizer);
    const LoadedCheckpoint& ck = resumed.loaded;
    t->state_ = ck.state;
    t->state_.run_id = run_id;
    t->state_.schedule_steps = spec.training.steps;
    if (t->state_.source_model.empty()) t->state_.source_model = RecordedSourceModel(spec);
    t->state_.lora = t->cfg_.lora;
    std::string note;
    if (ck.state.schedule_steps > 0) {
      t->schedule_ = ContinueAfterResume(t->schedule_, ck.state.step, ck.state.lr,
                                         ck.state.schedule_steps, &note);
    }
    if (t->rank_ == 0 && !note.empty()) std::printf("%s\n", note.c_str());
    if (t->data_) t->data_->set_position(ck.state.data_position);
    if (t->rank_ == 0) {
      std::printf(
          "resumed from %s at step %lld (saved by %d ranks, loaded by %d; %.3f GB verified by "
          "the ranks together in %.2f s, %.2f GB/s; rank 0 verified %.3f GB, read %.3f GB of "
          "tensors and held at most %.3f GB on the host, %.1f%% of the state)\n",
          latest->c_str(), static_cast<long long>(ck.state.step), ck.saved_world, t->world_,
          ck.bytes / 1e9, ck.seconds, ck.bytes / 1e9 / std::max(ck.seconds, 1e-9),
          ck.verified_bytes / 1e9, ck.read_bytes / 1e9, ck.host_bytes / 1e9,
          100.0 * ck.host_bytes / (12.0 * layout.trainable_numel()));
    }
  } else if (!spec.model.weights.empty() || !spec.init.from.empty()) {
    // init.from: only the weights of the phase before; the step, optimizer state, schedule and
    // data position start afresh.
    std::string weights = spec.model.weights;
    if (!spec.init.from.empty()) {
      if (!InitFromJob(spec.init.from).empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "init.from: \"", spec.init.from,
            "\" names an ithacad job; only ithacad resolves it (submit the job there), a "
            "standalone run needs the directory"));
      }
      ASSIGN_OR_RETURN(weights, InitWeightsDir(spec.init.from));
      RETURN_IF_ERROR(CheckInitModel(weights, t->cfg_));
    }
    ASSIGN_OR_RETURN(std::shared_ptr<SafetensorsReader> reader, SafetensorsReader::Open(weights));
    RETURN_IF_ERROR(CheckNotAdaptersOnly(*reader,
                                         spec.init.from.empty() ? "model.weights" : "init.from",
                                         spec.init.from.empty() ? weights : spec.init.from));
    // A checkpoint's weights are verified against its manifest before a phase starts from them,
    // as a resume's are: damage since the run that wrote them is refused, naming the file.
    if (const std::string step = CheckpointStepOfWeights(weights); !step.empty()) {
      RETURN_IF_ERROR(VerifyCheckpointWeightsTogether(step, *reader, t->model_.get(), comm));
    }
    auto from_file = [&](int u, float* out) {
      return ReadUnitWeightsInto(layout, *reader, u, out);
    };
    ASSIGN_OR_RETURN(t->optimizer_, Optimizer::CreateFilled(t->model_.get(), with_lora(from_file),
                                                            spec.training, host_state));
    if (t->rank_ == 0 && !spec.init.from.empty()) {
      std::printf(
          "init from %s: weights only (%s); step 0, a fresh optimizer, learning-rate schedule "
          "and data position\n",
          weights.c_str(), DescribeModelRope(t->cfg_).c_str());
    }
  } else {
    const uint64_t seed = spec.training.seed;
    auto random = [&](int u, float* out) {
      RandomUnitWeightsInto(layout, u, seed, out);
      return absl::OkStatus();
    };
    ASSIGN_OR_RETURN(t->optimizer_, Optimizer::CreateFilled(t->model_.get(), with_lora(random),
                                                            spec.training, host_state));
  }
  t->optimizer_->set_overlap_update(spec.memory.overlap_update);
  ops->Synchronize();
  t->startup_.optimizer = t->optimizer_->startup();
  t->startup_.total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - created).count();
  if (t->rank_ == 0) {
    std::printf("%s\n", FormatStartupLine(t->startup_).c_str());
    std::fflush(stdout);
  }
  return t;
}

absl::StatusOr<StepReport> Trainer::TrainStep() {
  const auto start = std::chrono::steady_clock::now();
  alloc_->tracker().ResetPeaks();
  const int64_t S = spec_.data.seq_len;
  // Every data-parallel replica reads the same global stream of samples and trains on its own
  // share of them (sample i goes to replica i mod dp), so any world size sees the same data.
  const int64_t per_replica = spec_.training.grad_accum * spec_.data.micro_batch;
  const int64_t samples = per_replica * dp_;
  // The step's loss is the mean over the labels it trains, across every rank and micro-step.
  // Every rank reads the same sample stream, so each counts them all on the host, before the
  // first micro-step (a cheap pass over the masks), and scales its gradients to that mean
  // directly: no collective, no wait.
  const int64_t first = data_->position();
  int64_t tokens = 0;
  std::vector<int64_t> trained(samples);  // per sample of the step, its trained labels
  for (int64_t i = 0; i < samples; ++i) tokens += trained[i] = data_->CountLabels(first + i);
  if (tokens == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec_.data.loss_mask ? "data.loss_mask" : "data.source_loss_mask", ": the ",
                     samples, " samples of step ", state_.step + 1, " (from data position ", first,
                     ") have no trained token: every label is masked"));
  }
  const float grad_scale = 1.f / static_cast<float>(tokens);
  // What the step reports, kept on the device until the one read below: each sample's loss
  // sum (sample i of the step in slot i, the other replicas' slots zero on this rank, so the
  // sum over the world is every sample's whole loss: a mix reports each source's), then each
  // unit's Σ g² of this rank's gradient shard.
  ParamStore& ps = model_->params();
  const int64_t m = samples, U = ps.num_units();
  ASSIGN_OR_RETURN(Buffer stats, Buffer::Make(alloc_, DType::kF32, {m + U}, Tier::kComm));
  const Tensor losses = stats.tensor().Slice(0, {m}), sumsq = stats.tensor().Slice(m, {U});
  if (dp_ > 1) ops_->Fill(losses, 0.f);
  ps.ZeroGrads();
  // Samples stream in: each is read and copied to the device (asynchronously: the host does not
  // wait) just before its forward, so the device holds one sample's tokens at a time. The pinned
  // staging buffers live until the read below, after which every copy has completed.
  std::vector<Buffer> staging;
  double step_flops = 0;  // every sample of the step, all ranks
  {
    std::vector<int32_t> inputs(S), labels(S);
    for (int64_t i = 0; i < samples; ++i) {
      data_->Next(inputs.data(), labels.data());
      const DocumentMask docs = spec_.data.document_mask ? SampleDocuments(*data_) : DocumentMask{};
      step_flops += ModelFlopsPerSample(cfg_, S, docs.starts);
      if (i % dp_ != dp_rank_) continue;
      ASSIGN_OR_RETURN(DeviceSample d,
                       model_->UploadSampleAsync(inputs.data(), labels.data(), S, docs, &staging));
      RETURN_IF_ERROR(model_->ForwardBackward(d, grad_scale, losses.Slice(i, {1})));
    }
  }
  RETURN_IF_ERROR(ps.FinishGradients());
  RETURN_IF_ERROR(optimizer_->GradSumSquares(sumsq));
  // One collective for both: loss sums always span the world; Σ g² only when the gradients
  // are sharded (otherwise every rank already holds the global sums).
  if (comm_ && world_ > 1) {
    RETURN_IF_ERROR(comm_->AllReduce(ps.sharded() ? stats.tensor() : losses));
  }
  // The step's one read before its end: the loss and the gradient norm, which the loop reports
  // and which must be finite (and known, for clipping) before the update.
  std::vector<float> host(m + U);
  ops_->Download(stats.tensor(), host.data(), DType::kF32);
  staging.clear();
  double loss_sum = 0, grad_sumsq = 0;
  for (int64_t k = 0; k < m; ++k) loss_sum += host[k];
  for (int64_t u = 0; u < U; ++u) grad_sumsq += host[m + u];
  const double loss = loss_sum / static_cast<double>(tokens);
  if (!std::isfinite(loss)) {
    return NonFiniteLossError(absl::StrCat("loss is ", loss, " at step ", state_.step + 1));
  }
  const int64_t step = state_.step + 1;
  const double lr = schedule_.At(step);
  const Optimizer::StepResult opt = optimizer_->Step(step, lr, grad_sumsq);
  state_.step = step;
  state_.lr = lr;
  state_.data_position = data_->position();
  state_.tokens += samples * S;

  StepReport r;
  r.step = step;
  r.total_steps = spec_.training.steps;
  r.loss = loss;
  r.tokens = samples * S;
  r.loss_tokens = tokens;
  if (data_->num_sources() > 1) {
    // Per source of the mix: its samples of the step and the mean loss over their trained
    // labels (their sums, as the step's loss is one).
    r.sources.resize(data_->num_sources());
    std::vector<double> sums(data_->num_sources(), 0);
    for (size_t src = 0; src < r.sources.size(); ++src) r.sources[src].path = source_paths_[src];
    for (int64_t i = 0; i < samples; ++i) {
      const size_t src = data_->SourceFor(first + i).first;
      SourceStats& st = r.sources[src];
      ++st.samples;
      st.tokens += S;
      st.loss_tokens += trained[i];
      sums[src] += host[i];
    }
    for (size_t src = 0; src < r.sources.size(); ++src) {
      SourceStats& st = r.sources[src];
      st.loss = st.loss_tokens > 0 ? sums[src] / static_cast<double>(st.loss_tokens) : 0;
    }
  }
  ops_->Synchronize();  // the step's end, for its time: the optimizer's update is part of it
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.tokens_per_second = r.tokens / r.seconds / world_;
  r.model_tflops = step_flops / r.seconds / world_ / 1e12;
  const double peak = ops_->PeakFlops();
  r.mfu = peak > 0 ? r.model_tflops * 1e12 / peak : 0;
  r.grad_norm = opt.grad_norm;
  r.lr = lr;
  r.trainable_parameters = model_->layout().trainable_numel();
  r.parameters = model_->layout().total_numel();
  r.cpu_update_seconds = opt.cpu_update_seconds;
  r.device_wait_seconds = opt.device_wait_seconds;
  if (optimizer_->host_state() && spec_.memory.overlap_update) {
    // The update of the step before, which ran under this step's forward.
    const Optimizer::UpdateTimes u = optimizer_->TakeUpdateTimes();
    r.cpu_update_seconds = u.cpu_seconds;
    r.device_wait_seconds = u.device_wait_seconds;
  }
  const MemoryTracker& mt = alloc_->tracker();
  for (int t = 0; t < kNumTiers; ++t) {
    r.mem_current[t] = mt.current(static_cast<Tier>(t));
    r.mem_peak[t] = mt.peak(static_cast<Tier>(t));
  }
  r.mem_device_peak = mt.device_peak();
  return r;
}

absl::StatusOr<HostWeights> Trainer::GatherMasterWeights() {
  RETURN_IF_ERROR(optimizer_->FinishUpdate());
  return optimizer_->GatherMasterWeights();
}

absl::StatusOr<CheckpointSaveReport> Trainer::SaveCheckpointNow() {
  if (spec_.checkpoint.dir.empty()) return CheckpointSaveReport();
  // Every rank writes its share of the files, each tensor as its unit arrives, so its host never
  // holds more than one unit's tensors of one kind (engine/checkpoint/distributed_checkpoint.h).
  ASSIGN_OR_RETURN(CheckpointSaveReport r,
                   SaveCheckpointTogether(spec_.checkpoint.dir, model_.get(), *optimizer_, state_,
                                          comm_, spec_.checkpoint.keep));
  if (rank_ == 0) {
    // The figures a save's throughput is judged by: the whole checkpoint over the whole save,
    // and this rank's share over its own writing (the ranks write at once); and the most this
    // rank held on the host at once: one unit's tensors of one kind, written as they arrive
    // (as a share of the state: f32 master weights, Adam m and v, 12 bytes per parameter).
    std::printf(
        "checkpoint step %lld: %.3f GB by %d ranks in %.2f s (%.2f GB/s; gather %.2f s, "
        "write %.2f s, rank 0 wrote %.3f GB at %.2f GB/s holding at most %.3f GB on the host, "
        "%.1f%% of the state; commit %.2f s)\n",
        static_cast<long long>(state_.step), r.bytes / 1e9, world_, r.seconds,
        r.bytes / 1e9 / std::max(r.seconds, 1e-9), r.gather_seconds, r.write_seconds,
        r.rank_bytes / 1e9, r.rank_bytes / 1e9 / std::max(r.rank_write_seconds, 1e-9),
        r.host_bytes / 1e9, 100.0 * r.host_bytes / (12.0 * model_->layout().trainable_numel()),
        r.commit_seconds);
    std::fflush(stdout);
  }
  return r;
}

absl::StatusOr<EvalReport> Trainer::Evaluate() {
  if (!evaluator_ && !passkey_) {
    return absl::FailedPreconditionError("eval.path: the job has no [eval] section");
  }
  EvalReport r;
  r.step = state_.step;
  if (evaluator_) {
    ASSIGN_OR_RETURN(r, evaluator_->Run(state_.step));
  }
  if (passkey_) {
    const auto start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(r.passkey, passkey_->Run());
    r.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  evaluated_step_ = state_.step;
  return r;
}

absl::Status Trainer::Run(const std::function<void(const StepReport&)>& on_step,
                          int64_t stop_at_step,
                          const std::function<void(const EvalReport&)>& on_eval) {
  const int64_t steps = spec_.training.steps;
  if (rank_ == 0 && spec_.metrics.tensorboard && !tensorboard_) {
    ASSIGN_OR_RETURN(tensorboard_, TensorBoardWriter::Open(TensorBoardDir(spec_)));
  }
  auto evaluate = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(EvalReport r, Evaluate());
    if (rank_ == 0) {
      if (evaluator_) std::printf("%s\n", FormatEvalLine(r).c_str());
      if (!r.positions.empty()) std::printf("%s\n", FormatPositionLine(r).c_str());
      for (const std::string& line : FormatPasskeyLines(r.step, r.passkey)) {
        std::printf("%s\n", line.c_str());
      }
      std::fflush(stdout);
    }
    if (tensorboard_) RETURN_IF_ERROR(tensorboard_->Write(r.step, EvalScalars(r)));
    if (on_eval) on_eval(r);
    return absl::OkStatus();
  };
  const int64_t last = stop_at_step > 0 ? std::min(stop_at_step, steps) : steps;
  while (state_.step < last) {
    ASSIGN_OR_RETURN(StepReport r, TrainStep());
    if (rank_ == 0 && (r.step % spec_.metrics.log_every == 0 || r.step == r.total_steps)) {
      std::printf("%s\n", FormatStepLine(r).c_str());
      std::fflush(stdout);
    }
    const int64_t every = spec_.checkpoint.every;
    if (!spec_.checkpoint.dir.empty() && ((every > 0 && r.step % every == 0) || r.step == steps)) {
      const auto save_start = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(CheckpointSaveReport saved, SaveCheckpointNow());
      r.checkpoint_host_bytes = saved.host_bytes;
      r.checkpoint_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start).count();
      r.checkpoint_time_unix = static_cast<int64_t>(std::time(nullptr));
    }
    // After the save, so that the step's report carries its checkpoint time.
    if (on_step) on_step(r);
    if (tensorboard_) RETURN_IF_ERROR(tensorboard_->Write(r.step, TensorBoardScalars(r)));
    // The last step's evaluation comes after the loop, once.
    const int64_t eval_every = spec_.eval.every;
    const bool evaluates = evaluator_ || passkey_;
    if (evaluates && eval_every > 0 && r.step % eval_every == 0 && r.step != steps) {
      RETURN_IF_ERROR(evaluate());
    }
  }
  // The job's end (also when it resumes there, so an evaluation or export a crash cut short is
  // redone). An evaluation-only job is always at its end: it evaluates the model it loaded,
  // whatever step a checkpoint it resumed from says.
  RETURN_IF_ERROR(optimizer_->FinishUpdate());  // the last step's update, whole
  const bool at_end = steps == 0 || (state_.step == steps && last == steps);
  if (at_end && (evaluator_ || passkey_) && evaluated_step_ != state_.step) {
    RETURN_IF_ERROR(evaluate());
  }
  if (at_end && steps > 0) RETURN_IF_ERROR(ExportNow());
  return absl::OkStatus();
}

absl::Status Trainer::ExportLoraAdapter(const std::string& checkpoint) {
  // The adapters alone, as a PEFT directory (f32: they are small), and with merge_on_export the
  // base from where the run took it with each targeted weight + scale · B · A; both from the
  // checkpoint just written, verified against its manifest on the way (ithaca-export's path).
  const std::string source = RecordedSourceModel(spec_);
  const bool merge = spec_.lora.merge_on_export;
  const std::string out = ExportDir(spec_), adapter_out = merge ? out + "-adapter" : out;
  ExportOptions adapter;
  adapter.replace = true;
  adapter.lora = cfg_.lora;
  adapter.peft_base_model = source.empty() ? spec_.model.preset : source;
  RETURN_IF_ERROR(ExportCheckpoint(checkpoint, adapter_out, adapter));
  std::printf("exported the LoRA adapter of %s to %s (PEFT, f32)\n", checkpoint.c_str(),
              adapter_out.c_str());
  if (merge) {
    ExportOptions options;
    ASSIGN_OR_RETURN(options.dtype, ParseExportDType(spec_.checkpoint.export_dtype));
    options.source_model_dir = ModelSourceDir(spec_);
    options.replace = true;
    options.trained_seq_len = spec_.data.seq_len;
    options.lora = cfg_.lora;
    options.lora_base = spec_.model.weights;
    if (options.lora_base.empty()) {
      ASSIGN_OR_RETURN(options.lora_base, InitWeightsDir(spec_.init.from));
    }
    RETURN_IF_ERROR(ExportCheckpoint(checkpoint, out, options));
    std::printf("exported %s merged into %s to %s (%s)\n", checkpoint.c_str(),
                options.lora_base.c_str(), out.c_str(), spec_.checkpoint.export_dtype.c_str());
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status Trainer::ExportNow() {
  const std::string& dtype_name = spec_.checkpoint.export_dtype;
  if (dtype_name.empty() || spec_.checkpoint.dir.empty() || rank_ != 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(DType dtype, ParseExportDType(dtype_name));
  // From the checkpoint just written: it is verified against its manifest on the way.
  ASSIGN_OR_RETURN(std::string checkpoint, LatestCheckpoint(spec_.checkpoint.dir));
  if (cfg_.lora.enabled()) return ExportLoraAdapter(checkpoint);
  ExportOptions options;
  options.dtype = dtype;
  options.source_model_dir = ModelSourceDir(spec_);
  options.replace = true;
  options.trained_seq_len = spec_.data.seq_len;
  const std::string out = ExportDir(spec_);
  RETURN_IF_ERROR(ExportCheckpoint(checkpoint, out, options));
  std::printf("exported %s to %s (%s)\n", checkpoint.c_str(), out.c_str(), dtype_name.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace ithaca
