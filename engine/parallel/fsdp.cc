#include "engine/parallel/fsdp.h"

#include <algorithm>

namespace ithaca {

absl::StatusOr<std::unique_ptr<ParamStore>> ParamStore::Create(const ParamLayout& layout, Ops* ops,
                                                               Allocator* alloc, Comm* world,
                                                               bool fsdp, bool host_params) {
  std::unique_ptr<ParamStore> p(new ParamStore(ops, alloc, world));
  const int W = world ? world->size() : 1;
  p->sharded_ = fsdp && W > 1;
  p->host_params_ = host_params;
  const Tier working_tier = host_params ? Tier::kHostParams : Tier::kParams;
  p->rank_ = world ? world->rank() : 0;
  for (const ParamUnit& u : layout.units()) {
    Unit unit;
    unit.numel = u.numel;
    unit.shard = p->sharded_ ? (u.numel + W - 1) / W : u.numel;
    ASSIGN_OR_RETURN(unit.working,
                     Buffer::Make(alloc, ops->act_dtype(), {unit.shard}, working_tier));
    // A frozen unit (LoRA's base) has no gradient.
    if (u.trainable) {
      ASSIGN_OR_RETURN(unit.grad, Buffer::Make(alloc, DType::kF32, {unit.shard}, Tier::kGrads));
      ops->Fill(unit.grad.tensor(), 0.f);
    }
    // Host memory is written whole by the optimizer (Optimizer::RefreshWorkingCopy) before
    // any use, on the host; the device's is zeroed.
    if (!host_params) ops->Fill(unit.working.tensor(), 0.f);
    p->units_.push_back(std::move(unit));
  }
  return p;
}

absl::Status ParamStore::BeforeUse(int i) {
  if (!before_use_) return absl::OkStatus();
  ASSIGN_OR_RETURN(Ops::Fence f, before_use_(i));
  ops_->WaitFence(f);
  return absl::OkStatus();
}

absl::Status ParamStore::FreshGrad(int i) {
  Unit& u = units_[i];
  if (!u.stale_grad || u.grad.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(BeforeUse(i));  // an update may still have to read the old gradient
  ops_->Fill(u.grad.tensor(), 0.f);
  u.stale_grad = false;
  return absl::OkStatus();
}

absl::Status ParamStore::Gather(int i) {
  Unit& u = units_[i];
  if (!(sharded_ || host_params_)) return absl::OkStatus();  // Gathered calls the hook
  if (u.users++ > 0) return absl::OkStatus();
  if (absl::Status st = BeforeUse(i); !st.ok()) {
    u.users = 0;
    return st;
  }
  auto start = [&]() -> absl::Status {
    const int W = sharded_ ? world_->size() : 1;
    ASSIGN_OR_RETURN(u.gathered,
                     Buffer::Make(alloc_, ops_->act_dtype(), {u.shard * W}, Tier::kParams));
    if (host_params_) {
      // The shard comes up on the copy stream: straight into the unit without FSDP, else into
      // a staging buffer the all-gather reads once the compute stream has waited for it.
      if (sharded_) {
        ASSIGN_OR_RETURN(u.staged,
                         Buffer::Make(alloc_, ops_->act_dtype(), {u.shard}, Tier::kParams));
      }
      u.upload =
          ops_->CopyAsync(u.working.tensor(), sharded_ ? u.staged.tensor() : u.gathered.tensor());
      if (!sharded_) {
        if (!overlap_) ops_->WaitFence(u.upload);
        return absl::OkStatus();
      }
      ops_->WaitFence(u.upload);
    }
    const Tensor& from = host_params_ ? u.staged.tensor() : u.working.tensor();
    ASSIGN_OR_RETURN(u.gathering, world_->IssueAllGather(from, u.gathered.tensor()));
    return overlap_ ? absl::OkStatus() : u.gathering.Wait();
  };
  absl::Status st = start();
  if (!st.ok()) {
    u.users = 0;
    u.gathering.Wait().IgnoreError();
    u.gathering = Issued();
    ops_->WaitFence(u.upload);
    u.upload = Ops::Fence();
    u.gathered.Reset();
    u.staged.Reset();
  }
  return st;
}

absl::StatusOr<Tensor> ParamStore::Gathered(int i) {
  Unit& u = units_[i];
  if (!(sharded_ || host_params_)) {
    RETURN_IF_ERROR(BeforeUse(i));
    Trace(absl::StrCat("use ", i));
    return u.working.tensor();
  }
  Trace(absl::StrCat("use ", i));  // its hook ran at Gather
  if (!sharded_) {
    ops_->WaitFence(u.upload);  // later compute reads the unit only after its upload
    return u.gathered.tensor().Slice(0, {u.numel});
  }
  RETURN_IF_ERROR(u.gathering.Wait());
  u.staged.Reset();  // the all-gather has read it
  return u.gathered.tensor().Slice(0, {u.numel});
}

absl::StatusOr<Tensor> ParamStore::Acquire(int i) {
  RETURN_IF_ERROR(Gather(i));
  absl::StatusOr<Tensor> t = Gathered(i);
  if (!t.ok()) Release(i);
  return t;
}

void ParamStore::Release(int i) {
  Unit& u = units_[i];
  if ((sharded_ || host_params_) && u.users > 0 && --u.users == 0) {
    // A gather or upload never waited for (an error path) still writes the buffer until done.
    u.gathering.Wait().IgnoreError();
    if (u.upload.pending()) ops_->WaitFence(u.upload);
    u.upload = Ops::Fence();
    u.gathered.Reset();
    u.staged.Reset();
  }
}

absl::StatusOr<Tensor> ParamStore::AcquireGrad(int i) {
  Unit& u = units_[i];
  if (!sharded_) {
    RETURN_IF_ERROR(FreshGrad(i));
    return u.grad.tensor();
  }
  const int W = world_->size();
  ASSIGN_OR_RETURN(u.full_grad, Buffer::Make(alloc_, DType::kF32, {u.shard * W}, Tier::kGrads));
  ops_->Fill(u.full_grad.tensor(), 0.f);
  return u.full_grad.tensor().Slice(0, {u.numel});
}

absl::Status ParamStore::ReduceGrad(int i) {
  Unit& u = units_[i];
  if (!sharded_) return absl::OkStatus();
  Reduction r;
  r.unit = i;
  r.full = std::move(u.full_grad);
  ASSIGN_OR_RETURN(r.part, Buffer::Make(alloc_, DType::kF32, {u.shard}, Tier::kComm));
  ASSIGN_OR_RETURN(r.reduce_scatter, world_->IssueReduceScatter(r.full.tensor(), r.part.tensor()));
  reducing_.push_back(std::move(r));
  // The previous unit's reduction had this unit's backward to hide under; this one gets the
  // next unit's.
  const size_t keep = overlap_ ? 1 : 0;
  while (reducing_.size() > keep) {
    absl::Status st = Finish(reducing_.front());
    reducing_.erase(reducing_.begin());
    RETURN_IF_ERROR(st);
  }
  return absl::OkStatus();
}

absl::Status ParamStore::Finish(Reduction& r) {
  RETURN_IF_ERROR(r.reduce_scatter.Wait());
  r.full.Reset();
  RETURN_IF_ERROR(FreshGrad(r.unit));
  ops_->Axpy(1.f, r.part.tensor(), units_[r.unit].grad.tensor());
  return absl::OkStatus();
}

absl::Status ParamStore::FlushGradients() {
  absl::Status first;
  for (Reduction& r : reducing_) first.Update(Finish(r));
  reducing_.clear();
  return first;
}

absl::Status ParamStore::FinishGradients() {
  RETURN_IF_ERROR(FlushGradients());
  for (int i = 0; i < num_units(); ++i) RETURN_IF_ERROR(FreshGrad(i));  // a unit no backward wrote
  if (sharded_ || world_ == nullptr || world_->size() == 1) return absl::OkStatus();
  for (Unit& u : units_) {
    if (!u.grad.empty()) RETURN_IF_ERROR(world_->AllReduce(u.grad.tensor()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ParamStore::GatherToHost(int i, const Tensor& shard) {
  ASSIGN_OR_RETURN(auto parts, GatherRangesToHost(i, shard, {{0, units_[i].numel}}));
  return std::move(parts[0]);
}

absl::StatusOr<std::vector<std::vector<float>>> ParamStore::GatherRangesToHost(
    int i, const Tensor& shard, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  const Unit& u = units_[i];
  for (const auto& [begin, end] : ranges) {
    if (begin < 0 || begin > end || end > u.numel) {
      return absl::InvalidArgumentError(absl::StrCat("GatherRangesToHost: [", begin, ", ", end,
                                                     ") is not a range of unit ", i, " (", u.numel,
                                                     " elements)"));
    }
  }
  Buffer all;
  Tensor whole = shard;
  if (sharded_) {
    ASSIGN_OR_RETURN(all,
                     Buffer::Make(alloc_, shard.dtype, {u.shard * world_->size()}, Tier::kComm));
    RETURN_IF_ERROR(world_->AllGather(shard, all.tensor()));
    whole = all.tensor();
  }
  std::vector<std::vector<float>> host;
  for (const auto& [begin, end] : ranges) {
    host.emplace_back(end - begin);
    if (end > begin) {
      ops_->Download(whole.Slice(begin, {end - begin}), host.back().data(), DType::kF32);
    }
  }
  return host;
}

void ParamStore::ScatterFromHost(int i, const std::vector<float>& whole, const Tensor& shard) {
  const Unit& u = units_[i];
  std::vector<float> part(u.shard, 0.f);
  const int64_t begin = shard_begin(i);
  const int64_t n = std::max<int64_t>(0, std::min<int64_t>(u.shard, u.numel - begin));
  std::copy(whole.begin() + begin, whole.begin() + begin + n, part.begin());
  ops_->Upload(part.data(), DType::kF32, shard);
}

void ParamStore::ZeroGrads() {
  FlushGradients().IgnoreError();  // a failed reduction already failed the step
  for (Unit& u : units_) u.stale_grad = true;
}

}  // namespace ithaca
