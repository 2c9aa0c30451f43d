#include "engine/comm/nccl/nccl_comm.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "engine/comm/comm_checks.h"
#include "engine/comm/rendezvous.h"

namespace ithaca {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kUniqueIdKey[] = "nccl-unique-id";

Clock::time_point DeadlineAfter(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Polls cheaply at first (collectives are often short), then backs off to 1 ms.
void Pause(int* round) {
  if (*round < 100) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(*round < 1000 ? 50 : 1000));
  }
  ++*round;
}

absl::StatusOr<ncclDataType_t> NcclType(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
  }
  return absl::InvalidArgumentError(absl::StrCat("nccl: unsupported dtype ", DTypeName(t)));
}

std::string NcclError(ncclResult_t res, ncclComm_t comm) {
  std::string s = ncclGetErrorString(res);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&s, " (", last, ")");
  return s;
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; progress is polled (with our timeout)
  return config;
}

absl::Status UseDevice(int gpu, int* device) {
  if (gpu >= 0) {
    cudaError_t err = cudaSetDevice(gpu);
    if (err != cudaSuccess) {
      return absl::FailedPreconditionError(
          absl::StrCat("nccl: cannot use GPU ", gpu, ": ", cudaGetErrorString(err)));
    }
  }
  cudaError_t err = cudaGetDevice(device);
  if (err != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl: no usable GPU: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

}  // namespace

NcclComm::NcclComm(ncclComm_t comm, int rank, int size, int device, const NcclOptions& options)
    : comm_(comm), rank_(rank), size_(size), device_(device), options_(options) {}

NcclComm::~NcclComm() {
  if (watchdog_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
  }
  if (comm_ != nullptr) {
    // A clean shutdown flushes outstanding work; if that cannot finish in time, abort.
    bool finalized = false;
    ncclResult_t res = ncclCommFinalize(comm_);
    if (res == ncclSuccess || res == ncclInProgress) {
      const auto deadline = DeadlineAfter(options_.timeout_s);
      int round = 0;
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
             Clock::now() < deadline) {
        Pause(&round);
      }
      finalized = state == ncclSuccess;
    }
    if (finalized) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }
  for (const InFlight& f : in_flight_) {
    cudaEventDestroy(f.started);
    cudaEventDestroy(f.done);
  }
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  for (auto& [id, e] : issued_) cudaEventDestroy(e);
  if (inputs_ready_ != nullptr) cudaEventDestroy(inputs_ready_);
  if (barrier_word_ != nullptr) cudaFree(barrier_word_);
}

absl::StatusOr<ncclUniqueId> NcclComm::NewUniqueId() {
  ncclUniqueId id;
  ncclResult_t res = ncclGetUniqueId(&id);
  if (res != ncclSuccess) {
    return absl::UnavailableError(
        absl::StrCat("nccl: ncclGetUniqueId failed: ", ncclGetErrorString(res)));
  }
  return id;
}

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::Create(int rank, int world,
                                                           const std::string& rendezvous, int gpu,
                                                           const NcclOptions& options) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: rank ", rank, " is not a rank of a world of ", world));
  }
  if (!(options.timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: timeout must be positive, got ", options.timeout_s, " s"));
  }
  int device = 0;
  RETURN_IF_ERROR(UseDevice(gpu, &device));
  if (world == 1) {
    ASSIGN_OR_RETURN(ncclUniqueId id, NewUniqueId());
    return CreateFromId(rank, world, id, gpu, options);
  }
  ASSIGN_OR_RETURN(Rendezvous rdzv, ParseRendezvous(rendezvous));
  ncclUniqueId id;
  if (rank == 0) {
    ASSIGN_OR_RETURN(id, NewUniqueId());
    RETURN_IF_ERROR(PublishRendezvousValue(
        rdzv, kUniqueIdKey, std::string(reinterpret_cast<const char*>(&id), sizeof(id)),
        options.timeout_s));
  } else {
    auto value = WaitRendezvousValue(rdzv, kUniqueIdKey, options.timeout_s);
    if (!value.ok()) {
      return absl::Status(value.status().code(), absl::StrCat("nccl rank ", rank, " of ", world,
                                                              ": waiting for rank 0's unique id: ",
                                                              value.status().message()));
    }
    if (value->size() != sizeof(id)) {
      return absl::DataLossError(absl::StrCat("nccl rank ", rank, ": the unique id at ",
                                              rdzv.address, " has ", value->size(),
                                              " bytes, expected ", sizeof(id)));
    }
    std::memcpy(&id, value->data(), sizeof(id));
  }
  return CreateFromId(rank, world, id, gpu, options);
}

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::CreateFromId(int rank, int world,
                                                                 const ncclUniqueId& id, int gpu,
                                                                 const NcclOptions& options) {
  int device = 0;
  RETURN_IF_ERROR(UseDevice(gpu, &device));
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t raw = nullptr;
  ncclUniqueId id_copy = id;
  ncclResult_t res = ncclCommInitRankConfig(&raw, world, id_copy, rank, &config);
  if (res != ncclSuccess && res != ncclInProgress) {
    std::string message = NcclError(res, raw);
    if (raw != nullptr) ncclCommAbort(raw);
    return absl::UnavailableError(absl::StrCat("nccl rank ", rank, " of ", world,
                                               ": ncclCommInitRankConfig failed: ", message));
  }
  std::unique_ptr<NcclComm> comm(new NcclComm(raw, rank, world, device, options));
  std::lock_guard<std::mutex> lock(comm->mu_);
  RETURN_IF_ERROR(comm->WaitReady("init"));
  RETURN_IF_ERROR(comm->Init());
  return comm;
}

absl::Status NcclComm::Init() {
  cudaError_t err = cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaMalloc(&barrier_word_, sizeof(float));
  if (err == cudaSuccess) err = cudaMemset(barrier_word_, 0, sizeof(float));
  if (err != cudaSuccess) {
    return Abort(absl::StatusCode::kInternal,
                 absl::StrCat("init: CUDA error: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

std::string NcclComm::Name() const {
  return absl::StrCat("nccl rank ", rank_, " of ", size_, " (GPU ", device_, ")");
}

absl::Status NcclComm::Abort(absl::StatusCode code, const std::string& message) {
  broken_ = absl::Status(code, absl::StrCat(Name(), ": ", message));
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  return broken_;
}

absl::Status NcclComm::Usable(const char* op) const {
  if (broken_.ok()) return absl::OkStatus();
  return absl::Status(
      broken_.code(),
      absl::StrCat(op, " on a communicator that already failed: ", broken_.message()));
}

absl::Status NcclComm::WaitReady(const char* op) {
  const auto deadline = DeadlineAfter(options_.timeout_s);
  int round = 0;
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t res = ncclCommGetAsyncError(comm_, &state);
    if (res != ncclSuccess) state = res;
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return Abort(absl::StatusCode::kUnavailable,
                   absl::StrCat(op, " failed: ", NcclError(state, comm_)));
    }
    if (Clock::now() > deadline) {
      return Abort(absl::StatusCode::kDeadlineExceeded,
                   absl::StrCat(op, " did not finish within ", options_.timeout_s,
                                " s (did every rank join, with the same world size?)"));
    }
    Pause(&round);
  }
}

cudaEvent_t NcclComm::NewEvent() {
  cudaEvent_t e = nullptr;
  if (!free_events_.empty()) {
    e = free_events_.back();
    free_events_.pop_back();
  } else if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
    e = nullptr;
  }
  return e;
}

absl::StatusOr<bool> NcclComm::Poll() {
  ncclResult_t state = ncclSuccess;
  ncclResult_t res = ncclCommGetAsyncError(comm_, &state);
  if (res != ncclSuccess) state = res;
  if (state != ncclSuccess && state != ncclInProgress) {
    const char* op = in_flight_.empty() ? "collective" : in_flight_.front().op;
    return Abort(absl::StatusCode::kUnavailable,
                 absl::StrCat(op, " failed: ", NcclError(state, comm_)));
  }
  while (!in_flight_.empty()) {
    InFlight& f = in_flight_.front();
    const cudaError_t done = cudaEventQuery(f.done);
    if (done == cudaSuccess) {
      free_events_.push_back(f.started);
      free_events_.push_back(f.done);
      in_flight_.pop_front();
      continue;
    }
    if (done != cudaErrorNotReady) {
      return Abort(absl::StatusCode::kInternal,
                   absl::StrCat(f.op, ": CUDA error: ", cudaGetErrorString(done)));
    }
    // The clock starts when the comm stream reaches the collective, not when it was enqueued:
    // it may wait long behind compute work.
    if (!f.running && cudaEventQuery(f.started) == cudaSuccess) {
      f.running = true;
      f.deadline = DeadlineAfter(options_.timeout_s);
    }
    if (f.running && Clock::now() > f.deadline) {
      return Abort(absl::StatusCode::kDeadlineExceeded,
                   absl::StrCat(f.op, " did not complete within ", options_.timeout_s,
                                " s (timeout: a peer is stuck, gone, or not calling the same "
                                "collective); communicator aborted"));
    }
    return false;
  }
  return true;
}

absl::Status NcclComm::WaitDone() {
  int round = 0;
  while (true) {
    ASSIGN_OR_RETURN(bool idle, Poll());
    if (idle) return absl::OkStatus();
    Pause(&round);
  }
}

void NcclComm::Watch() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && comm_ != nullptr) {
    absl::StatusOr<bool> idle = Poll();
    if (!idle.ok()) return;  // aborted: the next call on the communicator reports it
    if (*idle) {
      wake_.wait(lock, [&] { return stop_ || !in_flight_.empty(); });
    } else {
      wake_.wait_for(lock, std::chrono::milliseconds(2), [&] { return stop_; });
    }
  }
}

bool NcclComm::Ordered() const {
  return options_.compute_stream != nullptr && options_.compute_stream != options_.stream;
}

void NcclComm::SetStreams(cudaStream_t stream, cudaStream_t compute_stream) {
  std::lock_guard<std::mutex> lock(mu_);
  options_.stream = stream;
  options_.compute_stream = compute_stream;
}

void NcclComm::set_synchronous(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  options_.synchronous = on;
}

void NcclComm::UseStreams(const DeviceStreams& streams) {
  if (streams.comm == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  options_.stream = static_cast<cudaStream_t>(streams.comm);
  options_.compute_stream = static_cast<cudaStream_t>(streams.compute);
  options_.synchronous = false;
}

absl::Status NcclComm::health() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

absl::Status NcclComm::Run(const char* op, bool wait, const std::function<ncclResult_t()>& enqueue,
                           Issued* deferred) {
  // Deferring needs a compute stream that can wait later, and no host wait now.
  const bool defer = deferred != nullptr && Ordered() && !wait;
  // Listed at once, so its events are released even if enqueueing fails (which aborts).
  in_flight_.push_back(InFlight{op, NewEvent(), NewEvent()});
  const InFlight& f = in_flight_.back();
  cudaError_t err = f.started && f.done ? cudaSuccess : cudaErrorMemoryAllocation;
  if (err == cudaSuccess && Ordered()) {
    // The inputs are written, and the buffers' memory last used, on the compute stream.
    err = cudaEventRecord(inputs_ready_, options_.compute_stream);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(options_.stream, inputs_ready_, 0);
  }
  if (err == cudaSuccess) err = cudaEventRecord(f.started, options_.stream);
  if (err != cudaSuccess) {
    return Abort(absl::StatusCode::kInternal,
                 absl::StrCat(op, ": CUDA error: ", cudaGetErrorString(err)));
  }
  const ncclResult_t res = enqueue();
  if (res != ncclSuccess && res != ncclInProgress) {
    return Abort(absl::StatusCode::kUnavailable,
                 absl::StrCat(op, " failed: ", NcclError(res, comm_)));
  }
  if (res == ncclInProgress) RETURN_IF_ERROR(WaitReady(op));
  err = cudaEventRecord(f.done, options_.stream);
  if (err == cudaSuccess && defer) {
    // The compute stream waits at Issued::Wait, on an event of the issue's own.
    cudaEvent_t ready = NewEvent();
    err = ready != nullptr ? cudaEventRecord(ready, options_.stream) : cudaErrorMemoryAllocation;
    if (err == cudaSuccess) {
      const int64_t id = next_issued_++;
      issued_[id] = ready;
      *deferred = Issued(this, id);
    }
  } else if (err == cudaSuccess && Ordered()) {
    // Compute work enqueued from now on reads the outputs, or reuses the buffers' memory.
    err = cudaStreamWaitEvent(options_.compute_stream, f.done, 0);
  }
  if (err != cudaSuccess) {
    return Abort(absl::StatusCode::kInternal,
                 absl::StrCat(op, ": CUDA error: ", cudaGetErrorString(err)));
  }
  if (wait) return WaitDone();
  if (!watchdog_.joinable()) watchdog_ = std::thread([this] { Watch(); });
  wake_.notify_all();
  return absl::OkStatus();
}

absl::Status NcclComm::AllGather(const Tensor& in, const Tensor& out) {
  ASSIGN_OR_RETURN(Issued issued, IssueAllGather(in, out));
  return issued.Wait();
}

absl::StatusOr<Issued> NcclComm::Issue(const char* op, int64_t numel,
                                       const std::function<ncclResult_t()>& enqueue) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Usable(op));
  Issued issued;
  if (numel == 0) return issued;
  RETURN_IF_ERROR(Run(op, options_.synchronous, enqueue, &issued));
  return issued;
}

absl::StatusOr<Issued> NcclComm::IssueAllGather(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckAllGather(in, out, rank_, size_, Device::kCuda));
  ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(in.dtype));
  return Issue("all_gather", in.numel(), [&] {
    return ncclAllGather(in.data, out.data, in.numel(), type, comm_, options_.stream);
  });
}

absl::StatusOr<Issued> NcclComm::IssueReduceScatter(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckReduceScatter(in, out, rank_, size_, Device::kCuda));
  ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(in.dtype));
  return Issue("reduce_scatter", out.numel(), [&] {
    return ncclReduceScatter(in.data, out.data, out.numel(), type, ncclSum, comm_, options_.stream);
  });
}

absl::StatusOr<Issued> NcclComm::IssueAllToAll(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckAllToAll(in, out, size_, Device::kCuda));
  ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(in.dtype));
  return Issue("all_to_all", in.numel(), [&] {
    return ncclAlltoAll(in.data, out.data, in.numel() / size_, type, comm_, options_.stream);
  });
}

absl::StatusOr<Issued> NcclComm::IssueSendRecv(const Tensor& send, int dst, const Tensor& recv,
                                               int src) {
  RETURN_IF_ERROR(CheckSendRecv(send, dst, recv, src, rank_, size_, Device::kCuda));
  ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(send.dtype));
  return Issue("send_recv", send.numel(), [&] {
    ncclResult_t res = ncclGroupStart();
    if (res != ncclSuccess) return res;
    res = ncclSend(send.data, send.numel(), type, dst, comm_, options_.stream);
    if (res == ncclSuccess || res == ncclInProgress) {
      res = ncclRecv(recv.data, recv.numel(), type, src, comm_, options_.stream);
    }
    // The group is closed even after an error (it is per thread and would swallow later calls).
    const ncclResult_t end = ncclGroupEnd();
    return res == ncclSuccess || res == ncclInProgress ? end : res;
  });
}

absl::Status NcclComm::WaitIssued(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = issued_.find(id);
  if (it == issued_.end()) return absl::OkStatus();
  const cudaEvent_t ready = it->second;
  issued_.erase(it);
  // Even on a broken communicator the stream must wait: the collective may still be touching
  // its buffers until the abort has ended it.
  const cudaError_t err = cudaStreamWaitEvent(options_.compute_stream, ready, 0);
  free_events_.push_back(ready);
  RETURN_IF_ERROR(Usable("wait"));
  if (err != cudaSuccess) {
    return Abort(absl::StatusCode::kInternal,
                 absl::StrCat("wait: CUDA error: ", cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

absl::Status NcclComm::ReduceScatter(const Tensor& in, const Tensor& out) {
  ASSIGN_OR_RETURN(Issued issued, IssueReduceScatter(in, out));
  return issued.Wait();
}

absl::Status NcclComm::AllToAll(const Tensor& in, const Tensor& out) {
  ASSIGN_OR_RETURN(Issued issued, IssueAllToAll(in, out));
  return issued.Wait();
}

absl::Status NcclComm::SendRecv(const Tensor& send, int dst, const Tensor& recv, int src) {
  ASSIGN_OR_RETURN(Issued issued, IssueSendRecv(send, dst, recv, src));
  return issued.Wait();
}

absl::Status NcclComm::AllReduce(const Tensor& x) {
  RETURN_IF_ERROR(CheckAllReduce(x, Device::kCuda));
  ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(x.dtype));
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Usable("all_reduce"));
  if (x.numel() == 0) return absl::OkStatus();
  return Run("all_reduce", options_.synchronous, [&] {
    return ncclAllReduce(x.data, x.data, x.numel(), type, ncclSum, comm_, options_.stream);
  });
}

absl::Status NcclComm::Broadcast(const Tensor& x, int root) {
  RETURN_IF_ERROR(CheckBroadcast(x, root, size_, Device::kCuda));
  ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(x.dtype));
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Usable("broadcast"));
  if (x.numel() == 0) return absl::OkStatus();
  return Run("broadcast", options_.synchronous, [&] {
    return ncclBroadcast(x.data, x.data, x.numel(), type, root, comm_, options_.stream);
  });
}

absl::Status NcclComm::Barrier() {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Usable("barrier"));
  return Run("barrier", /*wait=*/true, [&] {
    return ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm_,
                         options_.stream);
  });
}

absl::Status NcclComm::Synchronize() {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Usable("synchronize"));
  return WaitDone();
}

absl::StatusOr<std::unique_ptr<Comm>> NcclComm::Split(int color, int key) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Usable("split"));
  ncclConfig_t config = NonBlockingConfig();
  ncclComm_t raw = nullptr;
  ncclResult_t res =
      ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &raw, &config);
  if (res != ncclSuccess && res != ncclInProgress) {
    return Abort(absl::StatusCode::kUnavailable,
                 absl::StrCat("split failed: ", NcclError(res, comm_)));
  }
  RETURN_IF_ERROR(WaitReady("split"));
  if (color < 0) {
    if (raw != nullptr) ncclCommAbort(raw);
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), ": split: color ", color, " is negative; colors must be >= 0"));
  }
  if (raw == nullptr) {
    return absl::InternalError(absl::StrCat(Name(), ": split returned no communicator"));
  }
  std::unique_ptr<NcclComm> child(new NcclComm(raw, 0, 1, device_, options_));
  std::lock_guard<std::mutex> child_lock(child->mu_);
  RETURN_IF_ERROR(child->WaitReady("split"));
  int rank = 0, count = 0;
  if (ncclCommUserRank(raw, &rank) != ncclSuccess || ncclCommCount(raw, &count) != ncclSuccess) {
    return child->Abort(absl::StatusCode::kInternal, "split: cannot read the new rank and size");
  }
  child->rank_ = rank;
  child->size_ = count;
  RETURN_IF_ERROR(child->Init());
  return std::unique_ptr<Comm>(std::move(child));
}

}  // namespace ithaca
