#include "engine/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <tuple>

namespace ithaca {

absl::Status Optimizer::Allocate() {
  ParamStore& ps = model_->params();
  for (int u = 0; u < ps.num_units(); ++u) {
    for (auto* vec : {&master_, &m_, &v_}) {
      ASSIGN_OR_RETURN(Buffer b, Buffer::Make(model_->allocator(), DType::kF32, {ps.shard_numel(u)},
                                              Tier::kOptimizer));
      model_->ops()->Fill(b.tensor(), 0.f);
      vec->push_back(std::move(b));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(LlamaModel* model,
                                                             const UnitSource& init,
                                                             const JobSpec::Training& hp) {
  std::unique_ptr<Optimizer> o(new Optimizer(model, hp));
  RETURN_IF_ERROR(o->Allocate());
  ParamStore& ps = model->params();
  for (int u = 0; u < ps.num_units(); ++u) {
    ASSIGN_OR_RETURN(std::vector<float> whole, init(u));
    if (static_cast<int64_t>(whole.size()) != ps.unit_numel(u)) {
      return absl::InternalError("initial weights do not match the parameter layout");
    }
    ps.ScatterFromHost(u, whole, o->master_[u].tensor());
  }
  o->RefreshWorkingCopy();
  return o;
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Resume(LlamaModel* model,
                                                             const Shards& shards,
                                                             const JobSpec::Training& hp) {
  std::unique_ptr<Optimizer> o(new Optimizer(model, hp));
  RETURN_IF_ERROR(o->Allocate());
  RETURN_IF_ERROR(o->Restore(shards));
  return o;
}

void Optimizer::RefreshWorkingCopy() {
  ParamStore& ps = model_->params();
  for (size_t u = 0; u < master_.size(); ++u) {
    model_->ops()->Copy(master_[u].tensor(), ps.working_shard(u));
  }
}

absl::Status Optimizer::GradSumSquares(const Tensor& sumsq) {
  ParamStore& ps = model_->params();
  if (sumsq.numel() != ps.num_units() || sumsq.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("GradSumSquares: ", sumsq.DebugString(),
                                                   " is not f32 [", ps.num_units(), "]"));
  }
  for (int u = 0; u < ps.num_units(); ++u) {
    model_->ops()->SumSquaresInto(ps.grad_shard(u), sumsq.Slice(u, {1}));
  }
  return absl::OkStatus();
}

absl::StatusOr<Optimizer::StepResult> Optimizer::Step(int64_t step, double lr) {
  ParamStore& ps = model_->params();
  const int U = ps.num_units();
  ASSIGN_OR_RETURN(Buffer b, Buffer::Make(model_->allocator(), DType::kF32, {U}, Tier::kComm));
  RETURN_IF_ERROR(GradSumSquares(b.tensor()));
  if (ps.sharded()) RETURN_IF_ERROR(ps.world()->AllReduce(b.tensor()));
  std::vector<float> sq(U);
  model_->ops()->Download(b.tensor(), sq.data(), DType::kF32);
  double total = 0;
  for (float v : sq) total += v;
  return Step(step, lr, total);
}

Optimizer::StepResult Optimizer::Step(int64_t step, double lr, double grad_sumsq) {
  Ops* ops = model_->ops();
  ParamStore& ps = model_->params();
  StepResult r;
  r.grad_norm = std::sqrt(grad_sumsq);
  if (hp_.grad_clip > 0 && r.grad_norm > hp_.grad_clip) r.clip_scale = hp_.grad_clip / r.grad_norm;
  AdamWParams p;
  p.lr = static_cast<float>(lr);
  p.beta1 = static_cast<float>(hp_.beta1);
  p.beta2 = static_cast<float>(hp_.beta2);
  p.eps = static_cast<float>(hp_.eps);
  p.grad_scale = static_cast<float>(r.clip_scale);
  p.step = step;
  for (int u = 0; u < ps.num_units(); ++u) {
    // Each entry's part of this rank's shard, so weight decay follows the entry's kind.
    const int64_t begin = ps.shard_begin(u), end = begin + ps.shard_numel(u);
    for (const ParamEntry& e : model_->layout().units()[u].entries) {
      const int64_t lo = std::max(begin, e.offset);
      const int64_t hi = std::min(end, e.offset + NumElements(e.shape));
      if (lo >= hi) continue;
      p.weight_decay = e.is_matrix ? static_cast<float>(hp_.weight_decay) : 0.f;
      auto part = [&](const Tensor& t) { return t.Slice(lo - begin, {hi - lo}); };
      ops->AdamW(part(master_[u].tensor()), part(ps.grad_shard(u)), part(m_[u].tensor()),
                 part(v_[u].tensor()), part(ps.working_shard(u)), p);
    }
  }
  return r;
}

absl::Status Optimizer::SaveEach(const Selection& keep, const TensorSink& sink) const {
  ParamStore& ps = model_->params();
  const std::vector<ParamUnit>& units = model_->layout().units();
  absl::Status first_error;
  for (size_t u = 0; u < master_.size(); ++u) {
    for (auto [buffers, names, kind] :
         {std::tuple{&master_, &keep.master, "master"}, {&m_, &keep.m, "m"}, {&v_, &keep.v, "v"}}) {
      std::vector<const ParamEntry*> kept;
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (const ParamEntry& e : units[u].entries) {
        if (!first_error.ok() || names->count(e.hf_name) == 0) continue;
        kept.push_back(&e);
        ranges.push_back({e.offset, e.offset + NumElements(e.shape)});
      }
      // Collective: every rank gathers the unit, also one that keeps none of it.
      ASSIGN_OR_RETURN(auto parts, ps.GatherRangesToHost(u, (*buffers)[u].tensor(), ranges));
      for (size_t i = 0; i < kept.size() && first_error.ok(); ++i) {
        first_error = sink(kind, kept[i]->hf_name, std::move(parts[i]));
      }
    }
  }
  return first_error;
}

absl::StatusOr<HostWeights> Optimizer::GatherMasterWeights() const {
  HostWeights w;
  ParamStore& ps = model_->params();
  for (size_t u = 0; u < master_.size(); ++u) {
    ASSIGN_OR_RETURN(std::vector<float> unit, ps.GatherToHost(u, master_[u].tensor()));
    w.push_back(std::move(unit));
  }
  return w;
}

absl::Status Optimizer::Restore(const Shards& s) {
  for (size_t u = 0; u < master_.size(); ++u) {
    if (u >= s.master.size() || u >= s.m.size() || u >= s.v.size()) {
      return absl::DataLossError(absl::StrCat("optimizer state: unit ", u, " is missing"));
    }
    RETURN_IF_ERROR(RestoreUnit(u, s.master[u], s.m[u], s.v[u]));
  }
  RefreshWorkingCopy();
  return absl::OkStatus();
}

absl::Status Optimizer::RestoreUnit(size_t u, const std::vector<float>& master,
                                    const std::vector<float>& m, const std::vector<float>& v) {
  ParamStore& ps = model_->params();
  if (u >= master_.size()) {
    return absl::DataLossError(
        absl::StrCat("optimizer state: unit ", u, " of ", master_.size(), " units"));
  }
  for (auto [dst, src, kind] : {std::tuple{&master_, &master, "master weights"},
                                {&m_, &m, "Adam m"},
                                {&v_, &v, "Adam v"}}) {
    if (static_cast<int64_t>(src->size()) != ps.shard_numel(u)) {
      return absl::DataLossError(absl::StrCat("optimizer state: the ", kind, " slice of unit ", u,
                                              " has ", src->size(), " elements, this rank holds ",
                                              ps.shard_numel(u)));
    }
    model_->ops()->Upload(src->data(), DType::kF32, (*dst)[u].tensor());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::ResumeEach(LlamaModel* model,
                                                                 const UnitLoader& load,
                                                                 const JobSpec::Training& hp) {
  std::unique_ptr<Optimizer> o(new Optimizer(model, hp));
  RETURN_IF_ERROR(o->Allocate());
  std::vector<bool> came(o->master_.size(), false);
  RETURN_IF_ERROR(load([&](int unit, std::vector<float>&& master, std::vector<float>&& m,
                           std::vector<float>&& v) -> absl::Status {
    RETURN_IF_ERROR(o->RestoreUnit(static_cast<size_t>(unit), master, m, v));
    came[unit] = true;
    return absl::OkStatus();
  }));
  for (size_t u = 0; u < came.size(); ++u) {
    if (!came[u])
      return absl::DataLossError(absl::StrCat("optimizer state: unit ", u, " never came"));
  }
  o->RefreshWorkingCopy();
  return o;
}

}  // namespace ithaca
