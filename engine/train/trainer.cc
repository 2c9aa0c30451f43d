#include "engine/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "engine/model/weights.h"
#include "engine/train/schedule.h"

namespace ithaca {

std::string FormatStepLine(const StepReport& r) {
  // One unit for the whole memory field, chosen by the total, so the line parses uniformly.
  const bool gib = r.mem_device_peak >= (int64_t{1} << 30);
  const double unit = gib ? double(1 << 30) : double(1 << 20);
  std::string tiers;
  for (int t = 0; t < kNumTiers; ++t) {
    if (!IsDeviceTier(static_cast<Tier>(t)) && r.mem_peak[t] == 0) continue;
    absl::StrAppendFormat(&tiers, "%s%s %.1f", tiers.empty() ? "" : " ",
                          TierName(static_cast<Tier>(t)), r.mem_peak[t] / unit);
  }
  return absl::StrFormat(
      "step %d/%d | loss %.4f | tok/s/gpu %.1f | tflops %.1f | mfu %.1f%% | mem %.1f %s (%s) | "
      "%.2f s",
      r.step, r.total_steps, r.loss, r.tokens_per_second, r.model_tflops, 100 * r.mfu,
      r.mem_device_peak / unit, gib ? "GiB" : "MiB", tiers, r.seconds);
}

double ModelFlopsPerToken(const LlamaConfig& c, int64_t seq_len) {
  const double d = c.hidden_size, D = c.head_dim;
  const double per_layer = d * D * (2.0 * c.num_attention_heads + 2.0 * c.num_key_value_heads) +
                           3.0 * d * c.intermediate_size;
  const double n = c.num_hidden_layers * per_layer + double(c.vocab_size) * d;
  return 6.0 * n + 6.0 * c.num_hidden_layers * double(seq_len) * c.num_attention_heads * D;
}

absl::StatusOr<LlamaConfig> ResolveModelConfig(const JobSpec& spec) {
  if (!spec.model.config.empty()) return LoadConfigJson(spec.model.config);
  return PresetConfig(spec.model.preset);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const JobSpec& spec, Ops* ops,
                                                         Allocator* alloc, Comm* comm) {
  const int world = comm ? comm->size() : 1;
  if (world != spec.parallel.world) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.world: the job asks for ",
                                                   spec.parallel.world, " ranks but ", world,
                                                   " joined"));
  }
  if (world > 1) {
    return absl::UnimplementedError("parallel.world > 1: the distributed engine is not built yet");
  }
  std::unique_ptr<Trainer> t(new Trainer());
  t->comm_ = comm;
  t->spec_ = spec;
  t->ops_ = ops;
  t->alloc_ = alloc;
  ASSIGN_OR_RETURN(t->cfg_, ResolveModelConfig(spec));
  LlamaModel::Options mo;
  mo.checkpoint = spec.memory.checkpoint;
  mo.tile_tokens = spec.memory.tile_tokens;
  ASSIGN_OR_RETURN(t->model_, LlamaModel::Create(t->cfg_, ops, alloc, mo));

  ASSIGN_OR_RETURN(auto file, TokenFile::Open(spec.data.path));
  ASSIGN_OR_RETURN(t->data_,
                   DataLoader::Create(std::move(file), spec.data.seq_len, t->cfg_.vocab_size));

  // Resume when asked and a checkpoint exists; otherwise the given weights or a random init.
  absl::StatusOr<std::string> latest = absl::NotFoundError("checkpointing off");
  if (!spec.checkpoint.dir.empty() && spec.checkpoint.resume) {
    latest = LatestCheckpoint(spec.checkpoint.dir);
  }
  const ParamLayout& layout = t->model_->layout();
  if (latest.ok()) {
    ASSIGN_OR_RETURN(LoadedCheckpoint ck, LoadCheckpoint(*latest, layout));
    ASSIGN_OR_RETURN(t->optimizer_, Optimizer::Create(t->model_.get(), ck.optimizer.master,
                                                      spec.training));
    RETURN_IF_ERROR(t->optimizer_->Restore(ck.optimizer));
    t->state_ = ck.state;
    t->data_->set_position(ck.state.data_position);
    std::printf("resumed from %s at step %lld\n", latest->c_str(),
                static_cast<long long>(ck.state.step));
  } else {
    HostWeights init;
    if (!spec.model.weights.empty()) {
      ASSIGN_OR_RETURN(auto reader, SafetensorsReader::Open(spec.model.weights));
      ASSIGN_OR_RETURN(init, ReadWeights(layout, *reader));
    } else {
      init = RandomWeights(layout, spec.training.seed);
    }
    ASSIGN_OR_RETURN(t->optimizer_, Optimizer::Create(t->model_.get(), init, spec.training));
  }
  return t;
}

absl::StatusOr<StepReport> Trainer::TrainStep() {
  const auto start = std::chrono::steady_clock::now();
  alloc_->tracker().ResetPeaks();
  const int64_t S = spec_.data.seq_len;
  const int64_t samples = spec_.training.grad_accum * spec_.data.micro_batch;
  std::vector<int32_t> inputs(S), labels(S);
  model_->ZeroGrads();
  // Every label is a real next token, so the step's token count is known up front and each
  // sample's gradient can be scaled to the step's mean loss directly.
  const float grad_scale = 1.f / static_cast<float>(samples * S);
  double loss_sum = 0;
  int64_t tokens = 0;
  for (int64_t i = 0; i < samples; ++i) {
    data_->Next(inputs.data(), labels.data());
    ASSIGN_OR_RETURN(LossSum l, model_->ForwardBackward(inputs.data(), labels.data(), S,
                                                        grad_scale));
    loss_sum += l.loss_sum;
    tokens += l.tokens;
  }
  const double loss = loss_sum / tokens;
  if (!std::isfinite(loss)) {
    return absl::DataLossError(absl::StrCat("loss is ", loss, " at step ", state_.step + 1));
  }
  const int64_t step = state_.step + 1;
  const double lr = LearningRate(step, spec_.training.steps, spec_.training.warmup_steps,
                                 spec_.training.lr, spec_.training.min_lr);
  Optimizer::StepResult opt = optimizer_->Step(step, lr);
  state_.step = step;
  state_.data_position = data_->position();
  state_.tokens += tokens;

  StepReport r;
  r.step = step;
  r.total_steps = spec_.training.steps;
  r.loss = loss;
  r.tokens = tokens;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.tokens_per_second = tokens / r.seconds;
  r.model_tflops = r.tokens_per_second * ModelFlopsPerToken(cfg_, S) / 1e12;
  r.mfu = r.model_tflops / 989.0;
  r.grad_norm = opt.grad_norm;
  r.lr = lr;
  const MemoryTracker& mt = alloc_->tracker();
  for (int t = 0; t < kNumTiers; ++t) {
    r.mem_current[t] = mt.current(static_cast<Tier>(t));
    r.mem_peak[t] = mt.peak(static_cast<Tier>(t));
  }
  r.mem_device_peak = mt.device_peak();
  return r;
}

absl::Status Trainer::SaveCheckpointNow() {
  if (spec_.checkpoint.dir.empty()) return absl::OkStatus();
  return SaveCheckpoint(spec_.checkpoint.dir, cfg_, model_->layout(), optimizer_->Save(), state_,
                        spec_.checkpoint.keep);
}

absl::Status Trainer::Run(const std::function<void(const StepReport&)>& on_step,
                          int64_t stop_at_step) {
  const int64_t last = stop_at_step > 0 ? std::min(stop_at_step, spec_.training.steps)
                                        : spec_.training.steps;
  while (state_.step < last) {
    ASSIGN_OR_RETURN(StepReport r, TrainStep());
    if (r.step % spec_.metrics.log_every == 0 || r.step == r.total_steps) {
      std::printf("%s\n", FormatStepLine(r).c_str());
      std::fflush(stdout);
    }
    if (on_step) on_step(r);
    const int64_t every = spec_.checkpoint.every;
    if ((every > 0 && r.step % every == 0) || r.step == spec_.training.steps) {
      RETURN_IF_ERROR(SaveCheckpointNow());
    }
  }
  return absl::OkStatus();
}

}  // namespace ithaca
