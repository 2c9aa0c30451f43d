#include "engine/train/optimizer.h"

#include <cmath>

namespace ithaca {

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(LlamaModel* model,
                                                             const HostWeights& init,
                                                             const JobSpec::Training& hp) {
  std::unique_ptr<Optimizer> o(new Optimizer(model, hp));
  Ops* ops = model->ops();
  const auto& units = model->layout().units();
  if (init.size() != units.size()) return absl::InternalError("weights do not match the layout");
  for (size_t u = 0; u < units.size(); ++u) {
    for (auto* vec : {&o->master_, &o->m_, &o->v_}) {
      ASSIGN_OR_RETURN(Buffer b, Buffer::Make(model->allocator(), DType::kF32, {units[u].numel},
                                              Tier::kOptimizer));
      ops->Fill(b.tensor(), 0.f);
      vec->push_back(std::move(b));
    }
    ops->Upload(init[u].data(), DType::kF32, o->master_[u].tensor());
  }
  o->RefreshWorkingCopy();
  return o;
}

void Optimizer::RefreshWorkingCopy() {
  for (size_t u = 0; u < master_.size(); ++u) model_->ops()->Copy(master_[u].tensor(),
                                                                  model_->params(u));
}

Optimizer::StepResult Optimizer::Step(int64_t step, double lr) {
  Ops* ops = model_->ops();
  StepResult r;
  double sq = 0;
  for (size_t u = 0; u < master_.size(); ++u) sq += ops->SumSquares(model_->grads(u));
  r.grad_norm = std::sqrt(sq);
  if (hp_.grad_clip > 0 && r.grad_norm > hp_.grad_clip) r.clip_scale = hp_.grad_clip / r.grad_norm;
  AdamWParams p;
  p.lr = static_cast<float>(lr);
  p.beta1 = static_cast<float>(hp_.beta1);
  p.beta2 = static_cast<float>(hp_.beta2);
  p.eps = static_cast<float>(hp_.eps);
  p.grad_scale = static_cast<float>(r.clip_scale);
  p.step = step;
  for (size_t u = 0; u < master_.size(); ++u) {
    for (const ParamEntry& e : model_->layout().units()[u].entries) {
      p.weight_decay = e.is_matrix ? static_cast<float>(hp_.weight_decay) : 0.f;
      auto slice = [&](const Tensor& t) { return ParamLayout::View(t, e); };
      ops->AdamW(slice(master_[u].tensor()), slice(model_->grads(u)), slice(m_[u].tensor()),
                 slice(v_[u].tensor()), slice(model_->params(u)), p);
    }
  }
  return r;
}

Optimizer::State Optimizer::Save() const {
  State s;
  Ops* ops = model_->ops();
  for (size_t u = 0; u < master_.size(); ++u) {
    for (auto [src, dst] : {std::pair{&master_, &s.master}, {&m_, &s.m}, {&v_, &s.v}}) {
      std::vector<float> host((*src)[u].tensor().numel());
      ops->Download((*src)[u].tensor(), host.data(), DType::kF32);
      dst->push_back(std::move(host));
    }
  }
  return s;
}

absl::Status Optimizer::Restore(const State& s) {
  Ops* ops = model_->ops();
  for (size_t u = 0; u < master_.size(); ++u) {
    for (auto [dst, src] : {std::pair{&master_, &s.master}, {&m_, &s.m}, {&v_, &s.v}}) {
      if (u >= src->size() || (*src)[u].size() != static_cast<size_t>((*dst)[u].tensor().numel()))
        return absl::DataLossError("optimizer state does not match the model");
      ops->Upload((*src)[u].data(), DType::kF32, (*dst)[u].tensor());
    }
  }
  RefreshWorkingCopy();
  return absl::OkStatus();
}

}  // namespace ithaca
