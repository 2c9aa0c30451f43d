#include "engine/train/optimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <tuple>

namespace ithaca {
namespace {

int64_t stage_elements = kHostStageElements;  // SetHostStageElementsForTesting

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

void Optimizer::SetHostStageElementsForTesting(int64_t n) {
  stage_elements = n > 0 ? n : kHostStageElements;
}

absl::Status Optimizer::Allocate() {
  const auto start = std::chrono::steady_clock::now();
  ParamStore& ps = model_->params();
  if (ps.host_params() && !host_state_) {
    return absl::InvalidArgumentError(
        "memory.param_offload: the working copy on the host needs the optimizer's state there "
        "too (memory.optimizer_offload = true): the CPU AdamW writes it");
  }
  const Tier tier = host_state_ ? Tier::kHostOptimizer : Tier::kOptimizer;
  if (host_state_) pool_ = std::make_unique<HostThreadPool>();
  int64_t largest = 0;
  for (int u = 0; u < ps.num_units(); ++u) {
    if (!ps.trainable(u)) {  // a frozen unit (LoRA's base): no master weights, no m and v
      for (auto* vec : {&master_, &m_, &v_}) vec->emplace_back();
      continue;
    }
    largest = std::max(largest, std::min(ps.shard_numel(u), stage_elements));
    for (auto* vec : {&master_, &m_, &v_}) {
      ASSIGN_OR_RETURN(Buffer b,
                       Buffer::Make(model_->allocator(), DType::kF32, {ps.shard_numel(u)}, tier));
      if (host_state_) {  // 12 bytes per parameter to zero: every core (and its first touch)
        float* p = b.tensor().f32();
        pool_->ParallelFor(b.tensor().numel(), 1 << 16, [p](int64_t lo, int64_t hi) {
          std::memset(p + lo, 0, (hi - lo) * sizeof(float));
        });
      } else {
        model_->ops()->Fill(b.tensor(), 0.f);
      }
      vec->push_back(std::move(b));
    }
  }
  if (host_state_) {
    for (int k = 0; k < 2; ++k) {
      ASSIGN_OR_RETURN(grad_stage_[k],
                       Buffer::Make(model_->allocator(), DType::kF32, {largest}, tier));
      // With the working copy on the host the CPU writes it in place: no staging for it.
      if (ps.host_params()) continue;
      ASSIGN_OR_RETURN(
          working_stage_[k],
          Buffer::Make(model_->allocator(), model_->ops()->act_dtype(), {largest}, tier));
    }
  }
  if (host_state_) {
    for (auto* vec : {&master_, &m_, &v_}) {
      for (const Buffer& b : *vec) startup_.host_bytes += b.tensor().bytes();
    }
  }
  startup_.allocate_s = SecondsSince(start);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Optimizer::OnDevice(const Buffer& host, Buffer* keep) const {
  ASSIGN_OR_RETURN(
      *keep, Buffer::Make(model_->allocator(), DType::kF32, host.tensor().shape, Tier::kComm));
  model_->ops()->Upload(host.tensor().data, DType::kF32, keep->tensor());
  return keep->tensor();
}

void Optimizer::PlaceFrozen(int u, const float* whole) {
  ParamStore& ps = model_->params();
  const int64_t begin = ps.shard_begin(u), shard = ps.shard_numel(u);
  const int64_t n = std::max<int64_t>(0, std::min(shard, ps.unit_numel(u) - begin));
  const Tensor w = ps.working_shard(u);
  if (!ps.host_params()) {  // this rank's slice, zero padded, uploaded
    std::vector<float> part(shard, 0.f);
    std::copy(whole + begin, whole + begin + n, part.begin());
    model_->ops()->Upload(part.data(), DType::kF32, w);
    return;
  }
  // On the host (memory.param_offload): converted in place, as RefreshWorkingCopy writes it.
  const float* from = whole + begin;
  if (w.dtype == DType::kBF16) {
    uint16_t* to = static_cast<uint16_t*>(w.data);
    for (int64_t k = 0; k < shard; ++k) to[k] = k < n ? FloatToBf16(from[k]).bits : 0;
  } else {
    float* to = w.f32();
    for (int64_t k = 0; k < shard; ++k) to[k] = k < n ? from[k] : 0.f;
  }
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(LlamaModel* model,
                                                             const UnitSource& init,
                                                             const JobSpec::Training& hp,
                                                             bool host_state) {
  std::unique_ptr<Optimizer> o(new Optimizer(model, hp, host_state));
  RETURN_IF_ERROR(o->Allocate());
  ParamStore& ps = model->params();
  for (int u = 0; u < ps.num_units(); ++u) {
    auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(std::vector<float> whole, init(u));
    o->startup_.init_s += SecondsSince(t0);
    t0 = std::chrono::steady_clock::now();
    if (static_cast<int64_t>(whole.size()) != ps.unit_numel(u)) {
      return absl::InternalError("initial weights do not match the parameter layout");
    }
    if (!ps.trainable(u)) {  // frozen: straight into the working copy, as it stays
      o->PlaceFrozen(u, whole.data());
    } else if (host_state) {
      // This rank's slice, zero padded past the unit's end (as ScatterFromHost uploads it),
      // copied on every core (8B's 32 GB of master weights are a minute's copy on one).
      const int64_t begin = ps.shard_begin(u);
      const int64_t n = std::max<int64_t>(0, std::min(ps.shard_numel(u), ps.unit_numel(u) - begin));
      const float* from = whole.data() + begin;
      float* to = o->master_[u].tensor().f32();
      o->pool_->ParallelFor(n, 1 << 16, [from, to](int64_t lo, int64_t hi) {
        std::memcpy(to + lo, from + lo, (hi - lo) * sizeof(float));
      });
    } else {
      ps.ScatterFromHost(u, whole, o->master_[u].tensor());
    }
    o->startup_.place_s += SecondsSince(t0);
  }
  const auto t0 = std::chrono::steady_clock::now();
  o->RefreshWorkingCopy();
  o->startup_.working_copy_s = SecondsSince(t0);
  return o;
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::CreateFilled(LlamaModel* model,
                                                                   const UnitFill& fill,
                                                                   const JobSpec::Training& hp,
                                                                   bool host_state) {
  ParamStore& ps = model->params();
  if (!host_state || ps.sharded()) {  // a whole unit on the host first, then this rank's part
    return Create(
        model,
        [&](int u) -> absl::StatusOr<std::vector<float>> {
          std::vector<float> whole(ps.unit_numel(u));
          RETURN_IF_ERROR(fill(u, whole.data()));
          return whole;
        },
        hp, host_state);
  }
  std::unique_ptr<Optimizer> o(new Optimizer(model, hp, host_state));
  RETURN_IF_ERROR(o->Allocate());
  for (int u = 0; u < ps.num_units(); ++u) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!ps.trainable(u)) {  // frozen: no master weights, the working copy alone
      std::vector<float> whole(ps.unit_numel(u));
      RETURN_IF_ERROR(fill(u, whole.data()));
      o->PlaceFrozen(u, whole.data());
    } else {
      RETURN_IF_ERROR(fill(u, o->master_[u].tensor().f32()));  // the shard is the whole unit
    }
    o->startup_.init_s += SecondsSince(t0);
  }
  const auto t0 = std::chrono::steady_clock::now();
  o->RefreshWorkingCopy();
  o->startup_.working_copy_s = SecondsSince(t0);
  return o;
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Resume(LlamaModel* model,
                                                             const Shards& shards,
                                                             const JobSpec::Training& hp,
                                                             bool host_state) {
  std::unique_ptr<Optimizer> o(new Optimizer(model, hp, host_state));
  RETURN_IF_ERROR(o->Allocate());
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(o->Restore(shards));
  o->startup_.place_s = SecondsSince(t0);
  return o;
}

void Optimizer::RefreshWorkingCopy() {
  Ops* ops = model_->ops();
  ParamStore& ps = model_->params();
  if (!host_state_) {
    for (size_t u = 0; u < master_.size(); ++u) {
      if (!master_[u].empty()) ops->Copy(master_[u].tensor(), ps.working_shard(u));
    }
    return;
  }
  // The master weights converted on every core into the two working-copy staging buffers, piece
  // by piece, each going up on the copy stream while the next is converted (slot i % 2 is
  // rewritten only after piece i's upload has completed).
  // With the working copy on the host (memory.param_offload) they are converted in place.
  std::vector<Ops::Fence> up;
  const bool in_place = ps.host_params();
  size_t pieces = 0;
  for (size_t u = 0; u < master_.size(); ++u) {
    if (master_[u].empty()) continue;  // frozen: its working copy was placed once
    for (int64_t lo = 0; lo < ps.shard_numel(u); lo += stage_elements) {
      const int64_t n = std::min(ps.shard_numel(u) - lo, stage_elements);
      const size_t i = pieces++;
      if (!in_place && i >= 2) ops->HostWaitFence(up[i - 2]);
      const Tensor stage = in_place ? ps.working_shard(u).Slice(lo, {n})
                                    : working_stage_[i % 2].tensor().Slice(0, {n});
      const float* from = master_[u].tensor().f32() + lo;
      pool_->ParallelFor(n, 16384, [&](int64_t b, int64_t e) {
        if (stage.dtype == DType::kBF16) {
          uint16_t* to = static_cast<uint16_t*>(stage.data);
          for (int64_t k = b; k < e; ++k) to[k] = FloatToBf16(from[k]).bits;
        } else {
          std::copy(from + b, from + e, stage.f32() + b);
        }
      });
      if (!in_place) up.push_back(ops->CopyAsync(stage, ps.working_shard(u).Slice(lo, {n})));
    }
  }
  if (!up.empty()) ops->WaitFence(up.back());
}

absl::Status Optimizer::GradSumSquares(const Tensor& sumsq) {
  ParamStore& ps = model_->params();
  if (sumsq.numel() != ps.num_units() || sumsq.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("GradSumSquares: ", sumsq.DebugString(),
                                                   " is not f32 [", ps.num_units(), "]"));
  }
  for (int u = 0; u < ps.num_units(); ++u) {
    if (ps.trainable(u)) {
      model_->ops()->SumSquaresInto(ps.grad_shard(u), sumsq.Slice(u, {1}));
    } else {
      model_->ops()->Fill(sumsq.Slice(u, {1}), 0.f);  // clipping covers what is trained
    }
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

AdamWParams Optimizer::Params(int64_t step, double lr, double clip_scale) const {
  AdamWParams p;
  p.lr = static_cast<float>(lr);
  p.beta1 = static_cast<float>(hp_.beta1);
  p.beta2 = static_cast<float>(hp_.beta2);
  p.eps = static_cast<float>(hp_.eps);
  p.grad_scale = static_cast<float>(clip_scale);
  p.step = step;
  return p;
}

Optimizer::StepResult Optimizer::Step(int64_t step, double lr, double grad_sumsq) {
  Ops* ops = model_->ops();
  ParamStore& ps = model_->params();
  StepResult r;
  r.grad_norm = std::sqrt(grad_sumsq);
  if (hp_.grad_clip > 0 && r.grad_norm > hp_.grad_clip) r.clip_scale = hp_.grad_clip / r.grad_norm;
  AdamWParams p = Params(step, lr, r.clip_scale);
  if (host_state_) {
    HostStep(p, &r);
    return r;
  }
  for (int u = 0; u < ps.num_units(); ++u) {
    if (!ps.trainable(u)) continue;
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

void Optimizer::HostStep(const AdamWParams& base, StepResult* r) {
  ParamStore& ps = model_->params();
  Drain();  // an update the forward did not finish (a step without one)
  auto p = std::make_unique<Pending>();
  p->base = base;
  // The pieces of every unit's shard, in the order the next forward reads them: at most
  // kHostStageElements each (an embedding of 525M parameters is many pieces).
  p->unit_end.resize(ps.num_units());
  p->unit_fence.resize(ps.num_units());
  for (int u = 0; u < ps.num_units(); ++u) {
    // A frozen unit (LoRA's base) has nothing to update: no pieces, and no transfer to wait for.
    for (int64_t lo = 0; ps.trainable(u) && lo < ps.shard_numel(u); lo += stage_elements) {
      p->pieces.push_back({u, lo, std::min(ps.shard_numel(u), lo + stage_elements)});
    }
    p->unit_end[u] = p->pieces.size();
  }
  p->down.resize(p->pieces.size());
  pending_ = std::move(p);
  if (overlap_update_) return;  // the next forward runs it, unit by unit (EnsureUnit)
  const auto start = std::chrono::steady_clock::now();
  Ops::Fence last = Advance(pending_->pieces.size());
  // Later compute (the next forward) reads the working copy only after every upload.
  model_->ops()->WaitFence(last);
  r->cpu_update_seconds = pending_->cpu;
  r->device_wait_seconds = SecondsSince(start);
  pending_.reset();
}

Ops::Fence Optimizer::Advance(size_t until) const {
  Ops* ops = model_->ops();
  ParamStore& ps = model_->params();
  Pending& p = *pending_;
  auto stage = [&](const Buffer* slots, size_t i) {
    return slots[i % 2].tensor().Slice(0, {p.pieces[i].hi - p.pieces[i].lo});
  };
  auto shard = [&](const Tensor& t, size_t i) {
    return t.Slice(p.pieces[i].lo, {p.pieces[i].hi - p.pieces[i].lo});
  };
  // Piece i + 1's gradient comes down while the CPU updates piece i. Staging slot i % 2 is free
  // again at piece i + 2: its gradient was read at piece i (on this thread), and its working
  // copy's upload was issued before piece i + 2's download, whose end the host waits for first
  // (transfers complete in order). The transfers need not wait for the compute stream (the
  // gradients were final when the host read the step's norm, and nothing enqueued since uses
  // the working copy of a unit not yet updated), so they run under the forward's blocks.
  while (p.done < until) {
    const size_t i = p.done;
    while (p.issued < std::min(p.pieces.size(), i + 2)) {
      const size_t k = p.issued++;
      p.down[k] =
          ops->CopyAsyncUnordered(shard(ps.grad_shard(p.pieces[k].unit), k), stage(grad_stage_, k));
    }
    // The host waits for piece i's gradient alone: piece i + 1's download and piece i − 1's
    // upload go on meanwhile.
    ops->HostWaitFence(p.down[i]);
    const auto t0 = std::chrono::steady_clock::now();
    const int u = p.pieces[i].unit;
    // The piece as elements [begin, end) of the whole unit.
    const int64_t begin = ps.shard_begin(u) + p.pieces[i].lo;
    const int64_t end = ps.shard_begin(u) + p.pieces[i].hi;
    // The working copy's piece: staging to upload, or in place on the host (param_offload).
    const Tensor working =
        ps.host_params() ? shard(ps.working_shard(u), i) : stage(working_stage_, i);
    const Tensor grad = stage(grad_stage_, i);
    const size_t wbytes = DTypeSize(working.dtype);
    // What no entry covers (the padding past the unit's end on the last rank) keeps master
    // weights of zero, and so a working copy of zero, as on the device.
    int64_t covered = begin;
    auto zero_working = [&](int64_t from, int64_t to) {
      if (to > from) {
        std::memset(static_cast<char*>(working.data) + (from - begin) * wbytes, 0,
                    (to - from) * wbytes);
      }
    };
    for (const ParamEntry& e : model_->layout().units()[u].entries) {
      const int64_t lo = std::max(begin, e.offset);
      const int64_t hi = std::min(end, e.offset + NumElements(e.shape));
      if (lo >= hi) continue;
      zero_working(covered, lo);
      covered = std::max(covered, hi);
      AdamWParams a = p.base;
      a.weight_decay = e.is_matrix ? static_cast<float>(hp_.weight_decay) : 0.f;
      const int64_t at = lo - begin;                    // in the piece
      const int64_t in_shard = lo - ps.shard_begin(u);  // in the shard
      HostAdamWSpan sp;
      sp.master = master_[u].tensor().f32() + in_shard;
      sp.grad = grad.f32() + at;
      sp.m = m_[u].tensor().f32() + in_shard;
      sp.v = v_[u].tensor().f32() + in_shard;
      sp.working = static_cast<char*>(working.data) + at * wbytes;
      sp.working_dtype = working.dtype;
      sp.n = hi - lo;
      HostAdamW(sp, a, pool_.get());
    }
    zero_working(covered, end);
    p.cpu += SecondsSince(t0);
    // What the compute waits for before reading the unit (or zeroing its gradient): its last
    // upload, or with the working copy on the host its last gradient download.
    p.last = ps.host_params() ? p.down[i]
                              : ops->CopyAsyncUnordered(working, shard(ps.working_shard(u), i));
    p.unit_fence[u] = p.last;
    ++p.done;
    if (p.done == p.unit_end[u]) ps.Trace(absl::StrCat("update ", u));
  }
  return p.last;
}

absl::StatusOr<Ops::Fence> Optimizer::EnsureUnit(int unit) {
  if (!pending_) return finished_fence_;
  Pending& p = *pending_;
  const auto start = std::chrono::steady_clock::now();
  Advance(p.unit_end[unit]);
  const Ops::Fence f = p.unit_fence[unit];
  // The first unit's update has no block queued before it to hide under: the device waits.
  if (!p.first_done) p.exposed += SecondsSince(start);
  p.first_done = true;
  if (p.done == p.pieces.size()) {
    finished_fence_ = p.last;
    last_update_ = {p.cpu, p.exposed};
    pending_.reset();
  }
  return f;
}

void Optimizer::Drain() const {
  if (!pending_) return;
  const auto start = std::chrono::steady_clock::now();
  Ops::Fence last = Advance(pending_->pieces.size());
  model_->ops()->WaitFence(last);
  finished_fence_ = last;
  last_update_ = {pending_->cpu, pending_->exposed + SecondsSince(start)};
  pending_.reset();
}

absl::Status Optimizer::FinishUpdate() {
  Drain();
  return absl::OkStatus();
}

Optimizer::UpdateTimes Optimizer::TakeUpdateTimes() {
  UpdateTimes t = last_update_;
  last_update_ = UpdateTimes();
  return t;
}

Optimizer::~Optimizer() {
  Drain();
  if (overlap_update_) model_->params().set_before_use(nullptr);
}

void Optimizer::set_overlap_update(bool on) {
  Drain();
  overlap_update_ = on && host_state_;
  if (overlap_update_) {
    model_->params().set_before_use([this](int u) { return EnsureUnit(u); });
  } else {
    model_->params().set_before_use(nullptr);
  }
}

absl::Status Optimizer::SaveEach(const Selection& keep, const TensorSink& sink) const {
  Drain();  // the state of the last step, whole
  ParamStore& ps = model_->params();
  const std::vector<ParamUnit>& units = model_->layout().units();
  absl::Status first_error;
  for (size_t u = 0; u < master_.size(); ++u) {
    if (master_[u].empty()) continue;  // frozen: the base is the model's, not the run's
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
      Buffer copy;
      Tensor shard = (*buffers)[u].tensor();
      if (host_state_) {
        if (!ps.sharded()) {  // the whole unit is here: hand over the kept ranges directly
          for (size_t i = 0; i < kept.size() && first_error.ok(); ++i) {
            const float* at = shard.f32() + ranges[i].first;
            first_error = sink(kind, kept[i]->hf_name,
                               std::vector<float>(at, at + (ranges[i].second - ranges[i].first)));
          }
          continue;
        }
        ASSIGN_OR_RETURN(shard, OnDevice((*buffers)[u], &copy));
      }
      ASSIGN_OR_RETURN(auto parts, ps.GatherRangesToHost(u, shard, ranges));
      for (size_t i = 0; i < kept.size() && first_error.ok(); ++i) {
        first_error = sink(kind, kept[i]->hf_name, std::move(parts[i]));
      }
    }
  }
  return first_error;
}

absl::StatusOr<HostWeights> Optimizer::GatherMasterWeights() const {
  Drain();
  HostWeights w;
  ParamStore& ps = model_->params();
  for (size_t u = 0; u < master_.size(); ++u) {
    if (master_[u].empty()) {  // frozen: its weights are the working copy's
      Buffer copy;
      Tensor shard = ps.working_shard(u);
      if (ps.host_params()) {  // on the host: a device copy for the collective
        ASSIGN_OR_RETURN(copy,
                         Buffer::Make(model_->allocator(), shard.dtype, shard.shape, Tier::kComm));
        model_->ops()->Copy(shard, copy.tensor());
        shard = copy.tensor();
      }
      ASSIGN_OR_RETURN(std::vector<float> unit, ps.GatherToHost(u, shard));
      w.push_back(std::move(unit));
      continue;
    }
    if (host_state_ && !ps.sharded()) {
      const float* at = master_[u].tensor().f32();
      w.emplace_back(at, at + ps.unit_numel(u));
      continue;
    }
    Buffer copy;
    Tensor shard = master_[u].tensor();
    if (host_state_) {
      ASSIGN_OR_RETURN(shard, OnDevice(master_[u], &copy));
    }
    ASSIGN_OR_RETURN(std::vector<float> unit, ps.GatherToHost(u, shard));
    w.push_back(std::move(unit));
  }
  return w;
}

absl::Status Optimizer::Restore(const Shards& s) {
  for (size_t u = 0; u < master_.size(); ++u) {
    if (master_[u].empty()) continue;  // frozen: not in the state
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
    if (host_state_) {  // on every core
      const float* from = src->data();
      float* to = (*dst)[u].tensor().f32();
      pool_->ParallelFor(static_cast<int64_t>(src->size()), 1 << 16,
                         [from, to](int64_t lo, int64_t hi) {
                           std::memcpy(to + lo, from + lo, (hi - lo) * sizeof(float));
                         });
    } else {
      model_->ops()->Upload(src->data(), DType::kF32, (*dst)[u].tensor());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::ResumeEach(LlamaModel* model,
                                                                 const UnitLoader& load,
                                                                 const JobSpec::Training& hp,
                                                                 bool host_state,
                                                                 const UnitFill& frozen) {
  std::unique_ptr<Optimizer> o(new Optimizer(model, hp, host_state));
  RETURN_IF_ERROR(o->Allocate());
  ParamStore& ps = model->params();
  std::vector<bool> came(o->master_.size(), false);
  for (int u = 0; u < ps.num_units(); ++u) {
    if (ps.trainable(u)) continue;
    if (!frozen) {
      return absl::InvalidArgumentError("Optimizer::ResumeEach: frozen units and no weights");
    }
    std::vector<float> whole(ps.unit_numel(u));
    RETURN_IF_ERROR(frozen(u, whole.data()));
    o->PlaceFrozen(u, whole.data());
    came[u] = true;
  }
  auto t0 = std::chrono::steady_clock::now();
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
  o->startup_.init_s = SecondsSince(t0);  // reading the checkpoint's slices, and placing them
  t0 = std::chrono::steady_clock::now();
  o->RefreshWorkingCopy();
  o->startup_.working_copy_s = SecondsSince(t0);
  return o;
}

}  // namespace ithaca
