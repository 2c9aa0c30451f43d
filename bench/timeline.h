// Timeline: CUDA events around each collective of one step, for parallel_bench --timeline.
// TimelineComm forwards every call to the communicator it wraps and, while the timeline records,
// brackets each collective with the timeline's events; Timeline::Write turns them into one JSON
// line per collective and a summary (docs/benchmarks.md, "The timeline").
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/bench_util.h"
#include "engine/comm/comm.h"

namespace ithaca {
namespace bench {

// One collective as the events saw it. Every event is timing-enabled; times are relative to the
// step's start event on the compute stream.
struct CollectiveEvents {
  std::string op, group;
  int64_t bytes = 0;
  bool issued = false;  // an Issue* call (the compute stream waits only at Issued::Wait)
  // compute_before: the compute stream reaches the call (the collective's input is ready then);
  // comm_before / comm_after: the comm stream reaches the call / is past the collective (the
  // stream runs in order, so comm_after is the collective's end); wait_before / wait_after: the
  // compute stream reaches the point where it must see the result (the call itself for a
  // blocking collective, Issued::Wait for an issued one) / is past it.
  cudaEvent_t compute_before = nullptr, comm_before = nullptr, comm_after = nullptr;
  cudaEvent_t wait_before = nullptr, wait_after = nullptr;
};

class Timeline {
 public:
  Timeline(cudaStream_t compute, cudaStream_t comm) : compute_(compute), comm_(comm) {}
  ~Timeline() { Clear(); }

  bool on() const { return on_.load(); }
  // Changes at every BeginStep: an index from an earlier step means nothing in this one.
  int64_t generation() const { return generation_.load(); }

  void BeginStep() {
    std::lock_guard<std::mutex> lock(mu_);
    Clear();
    step_start_ = NewEvent();
    step_end_ = NewEvent();
    cudaEventRecord(step_start_, compute_);
    ++generation_;
    on_ = true;
  }
  void EndStep() {
    std::lock_guard<std::mutex> lock(mu_);
    cudaEventRecord(step_end_, compute_);
    on_ = false;
  }

  // Before the call is forwarded; returns the collective's index.
  size_t Before(const char* op, const std::string& group, int64_t bytes, bool issued) {
    std::lock_guard<std::mutex> lock(mu_);
    CollectiveEvents e;
    e.op = op;
    e.group = group;
    e.bytes = bytes;
    e.issued = issued;
    e.compute_before = NewEvent();
    e.comm_before = NewEvent();
    cudaEventRecord(e.compute_before, compute_);
    cudaEventRecord(e.comm_before, comm_);
    ops_.push_back(e);
    return ops_.size() - 1;
  }
  // After the call returned. A blocking collective's compute-side wait is the call itself.
  void After(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    CollectiveEvents& e = ops_[i];
    e.comm_after = NewEvent();
    cudaEventRecord(e.comm_after, comm_);
    if (!e.issued) {
      e.wait_before = e.compute_before;
      e.wait_after = NewEvent();
      cudaEventRecord(e.wait_after, compute_);
    }
  }
  void BeforeWait(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    ops_[i].wait_before = NewEvent();
    cudaEventRecord(ops_[i].wait_before, compute_);
  }
  void AfterWait(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    ops_[i].wait_after = NewEvent();
    cudaEventRecord(ops_[i].wait_after, compute_);
  }

  // Waits for the step's events and writes one JSON line per collective to `path`, then a
  // summary line, which it also returns.
  absl::StatusOr<bench::Json> Write(const std::string& path, int rank, int64_t S) {
    std::lock_guard<std::mutex> lock(mu_);
    if (step_end_ == nullptr) return absl::FailedPreconditionError("timeline: no step recorded");
    cudaEventSynchronize(step_end_);
    cudaDeviceSynchronize();  // the comm stream's last events may come after the step's end
    auto ms = [&](cudaEvent_t e) {
      float t = 0;
      cudaEventElapsedTime(&t, step_start_, e);
      return static_cast<double>(t);
    };
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return absl::InternalError(absl::StrCat("--timeline: cannot write ", path));
    const double step_ms = ms(step_end_);
    std::vector<std::pair<double, double>> comm, waits;
    std::vector<std::string> kinds;
    for (const CollectiveEvents& e : ops_) {
      // The collective starts once its input is ready (compute_before: NcclComm orders the comm
      // stream after the compute stream at the call) and the comm stream is free (comm_before).
      const double start = std::max(ms(e.compute_before), ms(e.comm_before));
      const double end = ms(e.comm_after);
      comm.emplace_back(start, end);
      kinds.push_back(absl::StrCat(e.group, ".", e.op, e.issued ? ".issued" : ""));
      bench::Json j;
      j.Int("rank", rank)
          .Int("S", S)
          .Str("op", e.op)
          .Str("group", e.group)
          .Int("bytes", e.bytes)
          .Bool("issued", e.issued)
          .Num("start_ms", start)
          .Num("end_ms", end);
      if (e.wait_before != nullptr && e.wait_after != nullptr) {
        const double w0 = ms(e.wait_before), w1 = ms(e.wait_after);
        waits.emplace_back(w0, w1);
        j.Num("wait_at_ms", w0).Num("compute_wait_ms", w1 - w0);
      } else {
        j.Null("compute_wait_ms");  // issued and not waited for within the step
      }
      std::fprintf(f, "%s\n", j.str().c_str());
    }
    // Hidden communication, approximately: the time some collective runs minus the time the
    // compute stream stood still waiting for one (a blocking collective's call, an Issued's
    // Wait). The compute stream counts as busy at every other moment, which overstates the
    // overlap where it idles for other reasons (the host launching too slowly, a copy it waits
    // for); the compute stream's profile (train_bench --profile) bounds that idle time.
    const double comm_ms = UnionLength(comm);
    const double exposed_ms = IntersectionLength(comm, waits);
    // Per kind of collective (group.op[.issued]): count, time and exposed time.
    struct Kind {
      int64_t count = 0;
      double ms = 0, exposed_ms = 0;
    };
    std::map<std::string, Kind> by_kind;
    for (size_t i = 0; i < comm.size(); ++i) {
      Kind& k = by_kind[kinds[i]];
      ++k.count;
      k.ms += std::max(0.0, comm[i].second - comm[i].first);
      k.exposed_ms += IntersectionLength({comm[i]}, waits);
    }
    bench::Json kinds_json;
    for (const auto& [name, k] : by_kind) {
      kinds_json.Raw(name, absl::StrFormat("{\"count\": %lld, \"ms\": %.3f, \"exposed_ms\": %.3f}",
                                           static_cast<long long>(k.count), k.ms, k.exposed_ms));
    }
    bench::Json summary;
    summary.Str("summary", "timeline")
        .Int("rank", rank)
        .Int("S", S)
        .Int("collectives", static_cast<int64_t>(ops_.size()))
        .Num("step_ms", step_ms)
        .Num("comm_ms", comm_ms)
        .Num("comm_exposed_ms", exposed_ms)
        .Num("comm_hidden_ms", comm_ms - exposed_ms)
        .Num("hidden_fraction", comm_ms > 0 ? (comm_ms - exposed_ms) / comm_ms : 0.0)
        .Obj("by_kind", kinds_json);
    std::fprintf(f, "%s\n", summary.str().c_str());
    std::fclose(f);
    return summary;
  }

 private:
  cudaEvent_t NewEvent() {
    cudaEvent_t e = nullptr;
    cudaEventCreate(&e);
    events_.push_back(e);
    return e;
  }
  void Clear() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    events_.clear();
    ops_.clear();
    step_start_ = step_end_ = nullptr;
  }
  static std::vector<std::pair<double, double>> Merge(std::vector<std::pair<double, double>> v) {
    std::sort(v.begin(), v.end());
    std::vector<std::pair<double, double>> out;
    for (const auto& iv : v) {
      if (iv.second <= iv.first) continue;
      if (!out.empty() && iv.first <= out.back().second) {
        out.back().second = std::max(out.back().second, iv.second);
      } else {
        out.push_back(iv);
      }
    }
    return out;
  }
  static double UnionLength(const std::vector<std::pair<double, double>>& v) {
    double total = 0;
    for (const auto& iv : Merge(v)) total += iv.second - iv.first;
    return total;
  }
  static double IntersectionLength(const std::vector<std::pair<double, double>>& a,
                                   const std::vector<std::pair<double, double>>& b) {
    const auto x = Merge(a), y = Merge(b);
    double total = 0;
    size_t i = 0, j = 0;
    while (i < x.size() && j < y.size()) {
      total += std::max(0.0, std::min(x[i].second, y[j].second) - std::max(x[i].first, y[j].first));
      if (x[i].second < y[j].second) {
        ++i;
      } else {
        ++j;
      }
    }
    return total;
  }

  cudaStream_t compute_, comm_;
  std::mutex mu_;
  std::atomic<bool> on_{false};  // read without mu_ by TimelineComm
  std::atomic<int64_t> generation_{0};
  cudaEvent_t step_start_ = nullptr, step_end_ = nullptr;
  std::vector<cudaEvent_t> events_;  // every event of the step, destroyed together
  std::vector<CollectiveEvents> ops_;
};

// Forwards every call to the communicator it wraps and, while the timeline records, brackets
// each collective with the timeline's events. Split wraps the sub-communicator the same way.
class TimelineComm final : public Comm {
 public:
  TimelineComm(std::unique_ptr<Comm> inner, std::shared_ptr<Timeline> timeline, std::string group)
      : inner_(std::move(inner)), timeline_(std::move(timeline)), group_(std::move(group)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  absl::Status AllGather(const Tensor& in, const Tensor& out) override {
    return Blocking("all_gather", out.bytes(), [&] { return inner_->AllGather(in, out); });
  }
  absl::Status ReduceScatter(const Tensor& in, const Tensor& out) override {
    return Blocking("reduce_scatter", in.bytes(), [&] { return inner_->ReduceScatter(in, out); });
  }
  absl::Status AllToAll(const Tensor& in, const Tensor& out) override {
    return Blocking("all_to_all", in.bytes(), [&] { return inner_->AllToAll(in, out); });
  }
  absl::Status AllReduce(const Tensor& x) override {
    return Blocking("all_reduce", x.bytes(), [&] { return inner_->AllReduce(x); });
  }
  absl::Status Broadcast(const Tensor& x, int root) override {
    return Blocking("broadcast", x.bytes(), [&] { return inner_->Broadcast(x, root); });
  }
  absl::Status Barrier() override { return inner_->Barrier(); }
  absl::Status SendRecv(const Tensor& send, int dst, const Tensor& recv, int src) override {
    return Blocking("send_recv", send.bytes(),
                    [&] { return inner_->SendRecv(send, dst, recv, src); });
  }

  absl::StatusOr<Issued> IssueAllGather(const Tensor& in, const Tensor& out) override {
    return Issue("all_gather", out.bytes(), [&] { return inner_->IssueAllGather(in, out); });
  }
  absl::StatusOr<Issued> IssueReduceScatter(const Tensor& in, const Tensor& out) override {
    return Issue("reduce_scatter", in.bytes(), [&] { return inner_->IssueReduceScatter(in, out); });
  }
  absl::StatusOr<Issued> IssueAllToAll(const Tensor& in, const Tensor& out) override {
    return Issue("all_to_all", in.bytes(), [&] { return inner_->IssueAllToAll(in, out); });
  }
  absl::StatusOr<Issued> IssueSendRecv(const Tensor& send, int dst, const Tensor& recv,
                                       int src) override {
    return Issue("send_recv", send.bytes(),
                 [&] { return inner_->IssueSendRecv(send, dst, recv, src); });
  }

  absl::Status Synchronize() override { return inner_->Synchronize(); }
  void UseStreams(const DeviceStreams& streams) override { inner_->UseStreams(streams); }
  absl::StatusOr<std::unique_ptr<Comm>> Split(int color, int key) override {
    ASSIGN_OR_RETURN(std::unique_ptr<Comm> child, inner_->Split(color, key));
    return std::unique_ptr<Comm>(new TimelineComm(std::move(child), timeline_, "sp"));
  }

 protected:
  absl::Status WaitIssued(int64_t id) override {
    Pending p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return absl::OkStatus();
      p = std::move(it->second);
      pending_.erase(it);
    }
    // Only a collective issued in the step being recorded has a line to add its wait to.
    const bool record = p.index >= 0 && timeline_->on() && p.generation == timeline_->generation();
    if (record) timeline_->BeforeWait(p.index);
    absl::Status st = p.inner.Wait();
    if (record) timeline_->AfterWait(p.index);
    return st;
  }

 private:
  // An inner Issued this communicator's own Issued stands for, and its timeline index (-1 when
  // it was issued while the timeline was off).
  struct Pending {
    Issued inner;
    int64_t index = -1;
    int64_t generation = 0;  // Timeline::generation() when issued
  };

  template <typename F>
  absl::Status Blocking(const char* op, size_t bytes, F call) {
    if (!timeline_->on()) return call();
    const size_t i = timeline_->Before(op, group_, static_cast<int64_t>(bytes), false);
    absl::Status st = call();
    timeline_->After(i);
    return st;
  }
  template <typename F>
  absl::StatusOr<Issued> Issue(const char* op, size_t bytes, F call) {
    int64_t index = -1;
    if (timeline_->on()) {
      index =
          static_cast<int64_t>(timeline_->Before(op, group_, static_cast<int64_t>(bytes), true));
    }
    absl::StatusOr<Issued> inner = call();
    if (index >= 0) timeline_->After(static_cast<size_t>(index));
    if (!inner.ok()) return inner.status();
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t id = next_id_++;
    pending_.emplace(id, Pending{std::move(*inner), index, timeline_->generation()});
    return Issued(this, id);
  }

  std::unique_ptr<Comm> inner_;
  std::shared_ptr<Timeline> timeline_;
  std::string group_;
  std::mutex mu_;  // guards pending_ and next_id_
  std::map<int64_t, Pending> pending_;
  int64_t next_id_ = 1;
};

}  // namespace bench
}  // namespace ithaca
