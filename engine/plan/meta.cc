#include "engine/plan/meta.h"

#include <algorithm>
#include <cstring>

namespace ithaca {

// ---- MetaOps: nothing computed; with timing, each op's predicted time on its stream.

void MetaOps::Elementwise(ElementwiseOp op, int64_t bytes) {
  if (clock_) {
    std::optional<OpRate>& rate = op_rates_[static_cast<size_t>(op)];
    if (!rate) rate = ElementwiseRate(*rates_, op);
    clock_->Compute(ElementwiseSeconds(*rate, bytes), StepClock::Work::kElementwise);
  }
}

Ops::Fence MetaOps::Transfer(const Tensor& src, const Tensor& dst, bool unordered) {
  if (!clock_) return Fence{};
  const bool from_host = MetaAllocator::IsHost(src.data), to_host = MetaAllocator::IsHost(dst.data);
  double s = 0;
  if (from_host != to_host) {
    s = TransferSeconds(*rates_, /*to_device=*/from_host, static_cast<int64_t>(src.bytes()));
  } else {
    s = ElementwiseSeconds(*rates_, ElementwiseOp::kCopy,
                           static_cast<int64_t>(src.bytes() + dst.bytes()));
  }
  return Fence{clock_->Transfer(s, unordered)};
}

void MetaOps::Fill(const Tensor& x, float) {
  Elementwise(ElementwiseOp::kFill, static_cast<int64_t>(x.bytes()));
}

void MetaOps::Copy(const Tensor& src, const Tensor& dst) {
  if (!clock_) return;
  if (MetaAllocator::IsHost(src.data) != MetaAllocator::IsHost(dst.data)) {
    // A synchronous copy across the bus: the compute stream does it.
    const double s = TransferSeconds(*rates_, MetaAllocator::IsHost(src.data),
                                     static_cast<int64_t>(src.bytes()));
    clock_->Compute(s, StepClock::Work::kTransfer);
    return;
  }
  Elementwise(ElementwiseOp::kCopy, static_cast<int64_t>(src.bytes() + dst.bytes()));
}

void MetaOps::Copy2D(const Tensor& src, int64_t, const Tensor&, int64_t, int64_t rows,
                     int64_t cols) {
  Elementwise(ElementwiseOp::kCopy, 2 * rows * cols * static_cast<int64_t>(DTypeSize(src.dtype)));
}

Ops::Fence MetaOps::CopyAsync(const Tensor& src, const Tensor& dst) {
  return Transfer(src, dst, /*unordered=*/false);
}

Ops::Fence MetaOps::CopyAsyncUnordered(const Tensor& src, const Tensor& dst) {
  return Transfer(src, dst, /*unordered=*/true);
}

void MetaOps::WaitFence(Fence fence) {
  if (clock_) clock_->WaitTransfer(fence.ticket);
}

void MetaOps::Upload(const void*, DType, const Tensor& dst) {
  if (clock_) {
    clock_->Compute(TransferSeconds(*rates_, true, static_cast<int64_t>(dst.bytes())),
                    StepClock::Work::kTransfer);
  }
}

void MetaOps::Download(const Tensor& src, void* host, DType host_dtype) {
  // Host-side readers (gathers for checkpoints) see zeros.
  std::memset(host, 0, src.numel() * DTypeSize(host_dtype));
  if (clock_) {
    clock_->Compute(TransferSeconds(*rates_, false, static_cast<int64_t>(src.bytes())),
                    StepClock::Work::kTransfer);
  }
}

void MetaOps::Axpy(float, const Tensor&, const Tensor& y) {
  Elementwise(ElementwiseOp::kAxpy, 3 * static_cast<int64_t>(y.bytes()));
}

double MetaOps::SumSquares(const Tensor& x) {
  Elementwise(ElementwiseOp::kReduce, static_cast<int64_t>(x.bytes()));
  return 0;
}

double MetaOps::Sum(const Tensor& x) {
  Elementwise(ElementwiseOp::kReduce, static_cast<int64_t>(x.bytes()));
  return 0;
}

void MetaOps::SumSquaresInto(const Tensor& x, const Tensor&) {
  Elementwise(ElementwiseOp::kReduce, static_cast<int64_t>(x.bytes()));
}

void MetaOps::SumInto(const Tensor& x, const Tensor&) {
  Elementwise(ElementwiseOp::kReduce, static_cast<int64_t>(x.bytes()));
}

void MetaOps::Gemm(const Tensor& a, bool ta, const Tensor&, bool tb, const Tensor& c, float,
                   float) {
  const GemmShape g{c.dim(0), c.dim(1), ta ? a.dim(0) : a.dim(1),
                    ta,       tb,       c.dtype == DType::kF32 && act_ != DType::kF32};
  if (gemm_log_) gemm_log_->insert(g);
  if (!clock_) return;
  auto [it, added] = gemm_seconds_.try_emplace(g, 0.0);
  if (added) it->second = GemmSeconds(*rates_, g);
  clock_->Compute(it->second, StepClock::Work::kGemm);
}

void MetaOps::GemmBias(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor&,
                       const Tensor& c, float alpha, float beta) {
  Gemm(a, ta, b, tb, c, alpha, beta);
}

void MetaOps::Embedding(const Tensor& ids, const Tensor&, const Tensor& out) {
  Elementwise(ElementwiseOp::kEmbedding, static_cast<int64_t>(2 * out.bytes() + ids.bytes()));
}

void MetaOps::EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor&) {
  Elementwise(ElementwiseOp::kEmbeddingBackward,
              static_cast<int64_t>(3 * dout.bytes() + ids.bytes()));
}

void MetaOps::RmsNorm(const Tensor& x, const Tensor&, float, const Tensor& out, const Tensor&) {
  Elementwise(ElementwiseOp::kRmsNorm, static_cast<int64_t>(x.bytes() + out.bytes()));
}

void MetaOps::RmsNormBackward(const Tensor& x, const Tensor&, const Tensor&, const Tensor& dout,
                              const Tensor& dx, const Tensor&) {
  Elementwise(ElementwiseOp::kRmsNormBackward,
              static_cast<int64_t>(x.bytes() + dout.bytes() + 2 * dx.bytes()));
}

void MetaOps::RmsNormBackwardInPlace(const Tensor& x, const Tensor&, float, const Tensor& grad,
                                     const Tensor&) {
  Elementwise(ElementwiseOp::kRmsNormBackward, static_cast<int64_t>(x.bytes() + 2 * grad.bytes()));
}

void MetaOps::Rope(const Tensor& x, int64_t, const Tensor&, bool, const DocumentMask&) {
  Elementwise(ElementwiseOp::kRope, 2 * static_cast<int64_t>(x.bytes()));
}

void MetaOps::Attention(const Tensor& q, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const DocumentMask& docs) {
  if (!clock_) return;
  const int64_t S = q.dim(0);
  clock_->Compute(AttentionSeconds(*rates_, false, S, AttentionPairs(S, docs.window, docs.starts),
                                   q.dim(1), q.dim(2)),
                  StepClock::Work::kAttention);
}

void MetaOps::AttentionBackward(const Tensor& q, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, const DocumentMask& docs) {
  if (!clock_) return;
  const int64_t S = q.dim(0);
  clock_->Compute(AttentionSeconds(*rates_, true, S, AttentionPairs(S, docs.window, docs.starts),
                                   q.dim(1), q.dim(2)),
                  StepClock::Work::kAttention);
}

void MetaOps::AttentionChunk(const Tensor& q, const Tensor& k, const Tensor&, const Tensor&,
                             const Tensor&, const DocumentMask& docs, int64_t q_pos0,
                             int64_t k_pos0) {
  if (!clock_) return;
  const double pairs =
      AttentionChunkPairs(q.dim(0), k.dim(0), q_pos0, k_pos0, docs.window, docs.starts);
  if (pairs == 0) return;  // the kernels skip a chunk no query sees
  clock_->Compute(
      AttentionSeconds(*rates_, false, std::max(q.dim(0), k.dim(0)), pairs, q.dim(1), q.dim(2)),
      StepClock::Work::kAttention);
}

void MetaOps::AttentionChunkBackward(const Tensor& q, const Tensor& k, const Tensor&, const Tensor&,
                                     const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, const DocumentMask& docs, int64_t q_pos0,
                                     int64_t k_pos0) {
  if (!clock_) return;
  const double pairs =
      AttentionChunkPairs(q.dim(0), k.dim(0), q_pos0, k_pos0, docs.window, docs.starts);
  if (pairs == 0) return;
  clock_->Compute(
      AttentionSeconds(*rates_, true, std::max(q.dim(0), k.dim(0)), pairs, q.dim(1), q.dim(2)),
      StepClock::Work::kAttention);
}

void MetaOps::AttentionMerge(const Tensor& acc, const Tensor&, const Tensor&, const Tensor&) {
  // acc read and written (f32), the chunk's out read (act dtype, at most as many bytes).
  Elementwise(ElementwiseOp::kAxpy, 3 * static_cast<int64_t>(acc.bytes()));
}

void MetaOps::SwiGLU(const Tensor& gate, const Tensor&, const Tensor&) {
  Elementwise(ElementwiseOp::kSwiGLU, 3 * static_cast<int64_t>(gate.bytes()));
}

void MetaOps::SwiGLUBackward(const Tensor& gate, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&) {
  Elementwise(ElementwiseOp::kSwiGLUBackward, 5 * static_cast<int64_t>(gate.bytes()));
}

void MetaOps::CrossEntropy(const Tensor& logits, const Tensor&, const Tensor&, const Tensor&,
                           float) {
  Elementwise(ElementwiseOp::kCrossEntropy, 2 * static_cast<int64_t>(logits.bytes()));
}

void MetaOps::AdamW(const Tensor& master, const Tensor& grad, const Tensor&, const Tensor&,
                    const Tensor& working, const AdamWParams&) {
  Elementwise(ElementwiseOp::kAdamW,
              static_cast<int64_t>(6 * master.bytes() + grad.bytes() + working.bytes()));
}

// ---- MetaAllocator.

absl::StatusOr<void*> MetaAllocator::Allocate(size_t bytes, Tier tier) {
  // The replay allocates throughout (every tile, stage and block), so this is where a long one
  // stops.
  if (++allocations_ % 256 == 0) {
    if (limits_.cancelled && limits_.cancelled()) {
      return absl::CancelledError("planning stopped: the client went away");
    }
    if (absl::Now() > limits_.deadline) {
      return absl::DeadlineExceededError("planning ran past its time bound");
    }
  }
  uintptr_t& next = IsDeviceTier(tier) ? next_ : next_host_;
  void* p = reinterpret_cast<void*>(next);
  next += (bytes + 255) / 256 * 256 + 256;
  tracker_.OnAlloc(tier, bytes);
  if (IsDeviceTier(tier)) device_cache_.OnAlloc(bytes);
  if (record_) {
    record_->Add({MetaEvent::Kind::kAllocate, uint8_t(tier), bytes, 0, uintptr_t(p)});
  }
  return p;
}

void MetaAllocator::Free(void* ptr, size_t bytes, Tier tier) {
  if (record_) {
    record_->Add({MetaEvent::Kind::kFree, uint8_t(tier), bytes, 0, uintptr_t(ptr)});
  }
  tracker_.OnFree(tier, bytes);
  if (IsDeviceTier(tier)) device_cache_.OnFree(bytes);
}

// ---- MetaComm.

uint64_t MetaComm::Charge(CollectiveOp op, int64_t bytes, bool deferred) {
  if (!clock_ || size_ <= 1) return 0;
  GroupShape g;
  g.ranks = size_;
  g.ranks_per_node = std::min(size_, std::max(1, ranks_per_node_));
  g.nodes = (size_ + g.ranks_per_node - 1) / g.ranks_per_node;
  return clock_->Collective(CollectiveSeconds(*link_, op, bytes, g), deferred);
}

// The group's ranks sit `ranks_per_node_` to a node from its rank 0 on, as Charge places them.
uint64_t MetaComm::ChargeSendRecv(int64_t bytes, int dst, int src, bool deferred) {
  if (!clock_ || (dst == rank_ && src == rank_)) return 0;
  const int per_node = std::max(1, ranks_per_node_);
  std::vector<int> node_of(size_);
  for (int m = 0; m < size_; ++m) node_of[m] = m / per_node;
  const bool across = SendRecvAcrossNodes(node_of, rank_, dst, src);
  return clock_->Collective(SendRecvSeconds(*link_, bytes, across), deferred);
}

absl::Status MetaComm::AllGather(const Tensor&, const Tensor& out) {
  Charge(CollectiveOp::kAllGather, static_cast<int64_t>(out.bytes()), false);
  return absl::OkStatus();
}

absl::Status MetaComm::ReduceScatter(const Tensor& in, const Tensor&) {
  Charge(CollectiveOp::kReduceScatter, static_cast<int64_t>(in.bytes()), false);
  return absl::OkStatus();
}

absl::Status MetaComm::AllToAll(const Tensor& in, const Tensor&) {
  Charge(CollectiveOp::kAllToAll, static_cast<int64_t>(in.bytes()), false);
  return absl::OkStatus();
}

absl::Status MetaComm::AllReduce(const Tensor& x) {
  Charge(CollectiveOp::kAllReduce, static_cast<int64_t>(x.bytes()), false);
  return absl::OkStatus();
}

absl::Status MetaComm::Broadcast(const Tensor& x, int) {
  Charge(CollectiveOp::kBroadcast, static_cast<int64_t>(x.bytes()), false);
  return absl::OkStatus();
}

absl::Status MetaComm::Barrier() {
  Charge(CollectiveOp::kBarrier, 0, false);
  return absl::OkStatus();
}

absl::Status MetaComm::SendRecv(const Tensor& send, int dst, const Tensor&, int src) {
  ChargeSendRecv(static_cast<int64_t>(send.bytes()), dst, src, false);
  return absl::OkStatus();
}

absl::StatusOr<Issued> MetaComm::IssueAllGather(const Tensor&, const Tensor& out) {
  const uint64_t t = Charge(CollectiveOp::kAllGather, static_cast<int64_t>(out.bytes()), true);
  return t == 0 ? Issued() : Issued(this, static_cast<int64_t>(t));
}

absl::StatusOr<Issued> MetaComm::IssueReduceScatter(const Tensor& in, const Tensor&) {
  const uint64_t t = Charge(CollectiveOp::kReduceScatter, static_cast<int64_t>(in.bytes()), true);
  return t == 0 ? Issued() : Issued(this, static_cast<int64_t>(t));
}

absl::StatusOr<Issued> MetaComm::IssueAllToAll(const Tensor& in, const Tensor&) {
  const uint64_t t = Charge(CollectiveOp::kAllToAll, static_cast<int64_t>(in.bytes()), true);
  return t == 0 ? Issued() : Issued(this, static_cast<int64_t>(t));
}

absl::StatusOr<Issued> MetaComm::IssueSendRecv(const Tensor& send, int dst, const Tensor&,
                                               int src) {
  const uint64_t t = ChargeSendRecv(static_cast<int64_t>(send.bytes()), dst, src, true);
  return t == 0 ? Issued() : Issued(this, static_cast<int64_t>(t));
}

absl::Status MetaComm::WaitIssued(int64_t id) {
  if (clock_) clock_->WaitCollective(static_cast<uint64_t>(id));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Comm>> MetaComm::Split(int color, int key) {
  (void)color;
  (void)key;
  const GroupOfSplit g =
      splits_.empty() ? GroupOfSplit{} : splits_[std::min(splits_made_++, splits_.size() - 1)];
  auto group = std::make_unique<MetaComm>(0, g.size);
  group->set_timing(link_, std::max(1, ranks_per_node_ / std::max(1, g.stride)), clock_);
  return std::unique_ptr<Comm>(std::move(group));
}

}  // namespace ithaca
