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
  if (done_ != nullptr) cudaEventDestroy(done_);
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
        rdzv.path, kUniqueIdKey, std::string(reinterpret_cast<const char*>(&id), sizeof(id))));
  } else {
    auto value = WaitRendezvousValue(rdzv.path, kUniqueIdKey, options.timeout_s);
    if (!value.ok()) {
      return absl::Status(value.status().code(), absl::StrCat("nccl rank ", rank, " of ", world,
                                                              ": waiting for rank 0's unique id: ",
                                                              value.status().message()));
    }
    if (value->size() != sizeof(id)) {
      return absl::DataLossError(absl::StrCat("nccl rank ", rank, ": the unique id in ", rdzv.path,
                                              " has ", value->size(), " bytes, expected ",
                                              sizeof(id)));
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
  RETURN_IF_ERROR(comm->WaitReady("init"));
  RETURN_IF_ERROR(comm->Init());
  return comm;
}

absl::Status NcclComm::Init() {
  cudaError_t err = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
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

absl::Status NcclComm::WaitDone(const char* op) {
  const auto deadline = DeadlineAfter(options_.timeout_s);
  int round = 0;
  while (true) {
    cudaError_t query = cudaEventQuery(done_);
    ncclResult_t state = ncclSuccess;
    ncclResult_t res = ncclCommGetAsyncError(comm_, &state);
    if (res != ncclSuccess) state = res;
    if (state != ncclSuccess && state != ncclInProgress) {
      return Abort(absl::StatusCode::kUnavailable,
                   absl::StrCat(op, " failed: ", NcclError(state, comm_)));
    }
    if (query == cudaSuccess) return absl::OkStatus();
    if (query != cudaErrorNotReady) {
      return Abort(absl::StatusCode::kInternal,
                   absl::StrCat(op, ": CUDA error: ", cudaGetErrorString(query)));
    }
    if (Clock::now() > deadline) {
      return Abort(absl::StatusCode::kDeadlineExceeded,
                   absl::StrCat(op, " did not complete within ", options_.timeout_s,
                                " s (timeout: a peer is stuck, gone, or not calling the same "
                                "collective); communicator aborted"));
    }
    Pause(&round);
  }
}

absl::Status NcclComm::Finish(const char* op, ncclResult_t res, bool wait) {
  if (res != ncclSuccess && res != ncclInProgress) {
    return Abort(absl::StatusCode::kUnavailable,
                 absl::StrCat(op, " failed: ", NcclError(res, comm_)));
  }
  if (res == ncclInProgress) RETURN_IF_ERROR(WaitReady(op));
  cudaError_t err = cudaEventRecord(done_, options_.stream);
  if (err != cudaSuccess) {
    return Abort(absl::StatusCode::kInternal,
                 absl::StrCat(op, ": CUDA error: ", cudaGetErrorString(err)));
  }
  return wait ? WaitDone(op) : absl::OkStatus();
}

absl::Status NcclComm::AllGather(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckAllGather(in, out, rank_, size_, Device::kCuda));
  ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(in.dtype));
  RETURN_IF_ERROR(Usable("all_gather"));
  if (in.numel() == 0) return absl::OkStatus();
  return Finish("all_gather",
                ncclAllGather(in.data, out.data, in.numel(), type, comm_, options_.stream),
                options_.synchronous);
}

absl::Status NcclComm::ReduceScatter(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckReduceScatter(in, out, rank_, size_, Device::kCuda));
  ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(in.dtype));
  RETURN_IF_ERROR(Usable("reduce_scatter"));
  if (out.numel() == 0) return absl::OkStatus();
  return Finish(
      "reduce_scatter",
      ncclReduceScatter(in.data, out.data, out.numel(), type, ncclSum, comm_, options_.stream),
      options_.synchronous);
}

absl::Status NcclComm::AllToAll(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckAllToAll(in, out, size_, Device::kCuda));
  ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(in.dtype));
  RETURN_IF_ERROR(Usable("all_to_all"));
  if (in.numel() == 0) return absl::OkStatus();
  return Finish("all_to_all",
                ncclAlltoAll(in.data, out.data, in.numel() / size_, type, comm_, options_.stream),
                options_.synchronous);
}

absl::Status NcclComm::AllReduce(const Tensor& x) {
  RETURN_IF_ERROR(CheckAllReduce(x, Device::kCuda));
  ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(x.dtype));
  RETURN_IF_ERROR(Usable("all_reduce"));
  if (x.numel() == 0) return absl::OkStatus();
  return Finish("all_reduce",
                ncclAllReduce(x.data, x.data, x.numel(), type, ncclSum, comm_, options_.stream),
                options_.synchronous);
}

absl::Status NcclComm::Broadcast(const Tensor& x, int root) {
  RETURN_IF_ERROR(CheckBroadcast(x, root, size_, Device::kCuda));
  ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(x.dtype));
  RETURN_IF_ERROR(Usable("broadcast"));
  if (x.numel() == 0) return absl::OkStatus();
  return Finish("broadcast",
                ncclBroadcast(x.data, x.data, x.numel(), type, root, comm_, options_.stream),
                options_.synchronous);
}

absl::Status NcclComm::Barrier() {
  RETURN_IF_ERROR(Usable("barrier"));
  return Finish(
      "barrier",
      ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclSum, comm_, options_.stream),
      /*wait=*/true);
}

absl::Status NcclComm::Synchronize() {
  RETURN_IF_ERROR(Usable("synchronize"));
  return WaitDone("synchronize");
}

absl::StatusOr<std::unique_ptr<Comm>> NcclComm::Split(int color, int key) {
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
