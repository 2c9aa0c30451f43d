#include "engine/parallel/fsdp.h"

#include <algorithm>

namespace ithaca {

absl::StatusOr<std::unique_ptr<ParamStore>> ParamStore::Create(const ParamLayout& layout, Ops* ops,
                                                               Allocator* alloc, Comm* world,
                                                               bool fsdp) {
  std::unique_ptr<ParamStore> p(new ParamStore(ops, alloc, world));
  const int W = world ? world->size() : 1;
  p->sharded_ = fsdp && W > 1;
  p->rank_ = world ? world->rank() : 0;
  for (const ParamUnit& u : layout.units()) {
    Unit unit;
    unit.numel = u.numel;
    unit.shard = p->sharded_ ? (u.numel + W - 1) / W : u.numel;
    ASSIGN_OR_RETURN(unit.working,
                     Buffer::Make(alloc, ops->act_dtype(), {unit.shard}, Tier::kParams));
    ASSIGN_OR_RETURN(unit.grad, Buffer::Make(alloc, DType::kF32, {unit.shard}, Tier::kGrads));
    ops->Fill(unit.working.tensor(), 0.f);
    ops->Fill(unit.grad.tensor(), 0.f);
    p->units_.push_back(std::move(unit));
  }
  return p;
}

absl::StatusOr<Tensor> ParamStore::Acquire(int i) {
  Unit& u = units_[i];
  if (!sharded_) return u.working.tensor();
  if (u.users++ == 0) {
    const int W = world_->size();
    ASSIGN_OR_RETURN(u.gathered,
                     Buffer::Make(alloc_, ops_->act_dtype(), {u.shard * W}, Tier::kParams));
    absl::Status st = world_->AllGather(u.working.tensor(), u.gathered.tensor());
    if (!st.ok()) {
      u.users = 0;
      u.gathered.Reset();
      return st;
    }
  }
  return u.gathered.tensor().Slice(0, {u.numel});
}

void ParamStore::Release(int i) {
  Unit& u = units_[i];
  if (sharded_ && u.users > 0 && --u.users == 0) u.gathered.Reset();
}

absl::StatusOr<Tensor> ParamStore::AcquireGrad(int i) {
  Unit& u = units_[i];
  if (!sharded_) return u.grad.tensor();
  const int W = world_->size();
  ASSIGN_OR_RETURN(u.full_grad, Buffer::Make(alloc_, DType::kF32, {u.shard * W}, Tier::kGrads));
  ops_->Fill(u.full_grad.tensor(), 0.f);
  return u.full_grad.tensor().Slice(0, {u.numel});
}

absl::Status ParamStore::ReduceGrad(int i) {
  Unit& u = units_[i];
  if (!sharded_) return absl::OkStatus();
  ASSIGN_OR_RETURN(Buffer part, Buffer::Make(alloc_, DType::kF32, {u.shard}, Tier::kComm));
  RETURN_IF_ERROR(world_->ReduceScatter(u.full_grad.tensor(), part.tensor()));
  u.full_grad.Reset();
  ops_->Axpy(1.f, part.tensor(), u.grad.tensor());
  return absl::OkStatus();
}

absl::Status ParamStore::FinishGradients() {
  if (sharded_ || world_ == nullptr || world_->size() == 1) return absl::OkStatus();
  for (Unit& u : units_) RETURN_IF_ERROR(world_->AllReduce(u.grad.tensor()));
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
  for (Unit& u : units_) ops_->Fill(u.grad.tensor(), 0.f);
}

}  // namespace ithaca
