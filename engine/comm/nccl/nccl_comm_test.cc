// NcclComm on real GPUs (tagged gpu). Every case runs in forked processes, so this process never
// initializes CUDA and children can. Without a GPU the tests skip with a message; cases for two
// ranks skip unless two GPUs are present.
#include "engine/comm/nccl/nccl_comm.h"

#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "engine/comm/testing/multiprocess.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using testing::RunOptions;
using testing::RunRanks;
using testing::TempDir;

// Counts GPUs in a child process (CUDA must not start in the process that forks ranks).
int GpuCount() {
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(n > 100 ? 100 : n);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

// A device buffer holding `host`, copied back by Get().
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(host.size()) {
    cudaMalloc(&ptr_, n_ * sizeof(T));
    cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceVector() { cudaFree(ptr_); }
  Tensor tensor(DType t) const {
    return Tensor(ptr_, t, {static_cast<int64_t>(n_)}, Device::kCuda);
  }
  std::vector<T> Get() const {
    std::vector<T> host(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t n_;
};

// Integer-valued floats: sums are exact whatever order NCCL adds them in.
absl::Status CheckCollectives(Comm& c) {
  const int P = c.size(), r = c.rank();
  const int n = 6;
  {
    std::vector<float> in(n);
    for (int i = 0; i < n; ++i) in[i] = r * 100 + i;
    DeviceVector<float> din(in), dout(std::vector<float>(n * P, -1));
    RETURN_IF_ERROR(c.AllGather(din.tensor(DType::kF32), dout.tensor(DType::kF32)));
    auto out = dout.Get();
    for (int k = 0; k < P; ++k)
      for (int i = 0; i < n; ++i) RANK_CHECK(out[k * n + i] == k * 100 + i, "all_gather");
  }
  {
    std::vector<uint16_t> in(n * P);
    for (int j = 0; j < P; ++j)
      for (int i = 0; i < n; ++i) in[j * n + i] = static_cast<uint16_t>(r * 64 + j * 8 + i);
    DeviceVector<uint16_t> din(in), dout(std::vector<uint16_t>(n * P, 0));
    RETURN_IF_ERROR(c.AllToAll(din.tensor(DType::kBF16), dout.tensor(DType::kBF16)));
    auto out = dout.Get();
    for (int s = 0; s < P; ++s)
      for (int i = 0; i < n; ++i) RANK_CHECK(out[s * n + i] == s * 64 + r * 8 + i, "all_to_all");
  }
  {
    std::vector<float> in(n * P);
    for (int e = 0; e < n * P; ++e) in[e] = r + e;
    DeviceVector<float> din(in), dout(std::vector<float>(n, 0));
    RETURN_IF_ERROR(c.ReduceScatter(din.tensor(DType::kF32), dout.tensor(DType::kF32)));
    auto out = dout.Get();
    for (int i = 0; i < n; ++i)
      RANK_CHECK(out[i] == P * (r * n + i) + P * (P - 1) / 2, "reduce_scatter ", i);
  }
  {
    DeviceVector<int32_t> dx(std::vector<int32_t>(n, r + 1));
    RETURN_IF_ERROR(c.AllReduce(dx.tensor(DType::kI32)));
    for (int32_t v : dx.Get()) RANK_CHECK(v == P * (P + 1) / 2, "all_reduce i32 ", v);
    std::vector<uint16_t> b(n);
    for (int i = 0; i < n; ++i) b[i] = FloatToBf16(static_cast<float>(r + i)).bits;
    DeviceVector<uint16_t> db(b);
    RETURN_IF_ERROR(c.AllReduce(db.tensor(DType::kBF16)));
    auto got = db.Get();
    for (int i = 0; i < n; ++i) {
      RANK_CHECK(Bf16ToFloat(bf16{got[i]}) == P * i + P * (P - 1) / 2, "all_reduce bf16 ", i);
    }
  }
  {
    DeviceVector<float> dx(std::vector<float>(n, static_cast<float>(r)));
    RETURN_IF_ERROR(c.Broadcast(dx.tensor(DType::kF32), P - 1));
    for (float v : dx.Get()) RANK_CHECK(v == P - 1, "broadcast ", v);
  }
  RETURN_IF_ERROR(c.Barrier());
  RETURN_IF_ERROR(c.Synchronize());
  // Host tensors are refused before anything is enqueued.
  float host = 0;
  absl::Status st = c.AllReduce(Tensor(&host, DType::kF32, {1}));
  RANK_CHECK(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
  return absl::OkStatus();
}

// Ring shifts: right, then left in bf16 (with two ranks the same peer both ways, with one a send
// to itself), then the issued form; each checked against the sender's values. Misuse is refused
// before anything is enqueued.
absl::Status CheckSendRecv(Comm& c) {
  const int P = c.size(), r = c.rank();
  const int right = (r + 1) % P, left = (r + P - 1) % P;
  const int n = 1 << 20;
  {
    std::vector<float> mine(n);
    for (int i = 0; i < n; ++i) mine[i] = r * 1000 + i % 1000;
    DeviceVector<float> dsend(mine), drecv(std::vector<float>(n, -1));
    RETURN_IF_ERROR(c.SendRecv(dsend.tensor(DType::kF32), right, drecv.tensor(DType::kF32), left));
    auto got = drecv.Get();
    for (int i = 0; i < n; ++i) RANK_CHECK(got[i] == left * 1000 + i % 1000, "right shift ", i);
  }
  {
    std::vector<uint16_t> mine(n);
    for (int i = 0; i < n; ++i) mine[i] = static_cast<uint16_t>(r * 4096 + i % 4096);
    DeviceVector<uint16_t> dsend(mine), drecv(std::vector<uint16_t>(n, 0));
    RETURN_IF_ERROR(
        c.SendRecv(dsend.tensor(DType::kBF16), left, drecv.tensor(DType::kBF16), right));
    auto got = drecv.Get();
    for (int i = 0; i < n; ++i) RANK_CHECK(got[i] == right * 4096 + i % 4096, "left shift ", i);
  }
  {
    std::vector<int32_t> mine(n);
    for (int i = 0; i < n; ++i) mine[i] = r * 1000000 + i;
    DeviceVector<int32_t> dsend(mine), drecv(std::vector<int32_t>(n, -1));
    ASSIGN_OR_RETURN(Issued shift, c.IssueSendRecv(dsend.tensor(DType::kI32), right,
                                                   drecv.tensor(DType::kI32), left));
    RETURN_IF_ERROR(shift.Wait());
    RETURN_IF_ERROR(c.Synchronize());
    auto got = drecv.Get();
    for (int i = 0; i < n; ++i) RANK_CHECK(got[i] == left * 1000000 + i, "issued shift ", i);
    DeviceVector<int32_t> short_recv(std::vector<int32_t>(n - 1));
    absl::Status st =
        c.SendRecv(dsend.tensor(DType::kI32), right, short_recv.tensor(DType::kI32), left);
    RANK_CHECK(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
  }
  return absl::OkStatus();
}

NcclOptions Options(double timeout_s, bool synchronous = true) {
  NcclOptions o;
  o.timeout_s = timeout_s;
  o.synchronous = synchronous;
  return o;
}

// Non-blocking compute and comm streams, as CudaOps makes them.
struct Streams {
  Streams() {
    cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking);
  }
  ~Streams() {
    cudaStreamDestroy(compute);
    cudaStreamDestroy(comm);
  }
  cudaStream_t compute = nullptr, comm = nullptr;
};

// The worker's mode: collectives on the comm stream, ordered with a compute stream by events, no
// host wait. The input is written last in a long queue of work on the compute stream, and the
// output is read back on the compute stream right after the call: without the comm stream
// waiting for the input, or the compute stream for the output, the result would be stale.
absl::Status CheckOrderedWithComputeStream(NcclComm& c, const Streams& st) {
  const int P = c.size(), r = c.rank();
  const size_t n = size_t{16} << 20;  // i32 elements (64 MiB) per rank
  const size_t busy_bytes = size_t{1} << 30;
  int32_t *in = nullptr, *out = nullptr, *host = nullptr;
  void* busy = nullptr;
  RANK_CHECK(cudaMalloc(&in, n * 4) == cudaSuccess && cudaMalloc(&out, P * n * 4) == cudaSuccess &&
             cudaMalloc(&busy, busy_bytes) == cudaSuccess &&
             cudaMallocHost(&host, P * n * 4) == cudaSuccess);
  cudaMemset(in, 0, n * 4);
  cudaDeviceSynchronize();
  for (int i = 0; i < 20; ++i) cudaMemsetAsync(busy, i, busy_bytes, st.compute);
  cudaMemsetAsync(in, r + 1, n * 4, st.compute);  // every byte r + 1
  cudaMemsetAsync(out, 0xff, P * n * 4, st.compute);
  RETURN_IF_ERROR(
      c.AllGather(Tensor(in, DType::kI32, {static_cast<int64_t>(n)}, Device::kCuda),
                  Tensor(out, DType::kI32, {static_cast<int64_t>(P * n)}, Device::kCuda)));
  cudaMemcpyAsync(host, out, P * n * 4, cudaMemcpyDeviceToHost, st.compute);
  RANK_CHECK(cudaStreamSynchronize(st.compute) == cudaSuccess);
  RETURN_IF_ERROR(c.Synchronize());
  int bad = 0, first_bad = -1;
  for (size_t i = 0; i < P * n; ++i) {
    const int32_t want = 0x01010101 * static_cast<int32_t>(i / n + 1);
    if (host[i] != want && bad++ == 0) first_bad = static_cast<int>(i);
  }
  cudaFree(in);
  cudaFree(out);
  cudaFree(busy);
  cudaFreeHost(host);
  RANK_CHECK(bad == 0, bad, " stale elements, the first at ", first_bad);
  return absl::OkStatus();
}

// An issued all-gather does not hold the compute stream up (it waits behind a gate on the
// comm stream while compute work after it finishes), and after Wait the compute stream sees the
// whole result.
absl::Status CheckIssuedWaitsOnlyAtUse(NcclComm& c, const Streams& st) {
  const int P = c.size(), r = c.rank();
  const size_t n = size_t{4} << 20;  // i32 elements per rank
  const size_t busy_bytes = size_t{1} << 30;
  int32_t *in = nullptr, *out = nullptr, *host = nullptr;
  void* busy = nullptr;
  cudaStream_t side;
  cudaEvent_t gate, compute_done;
  RANK_CHECK(cudaMalloc(&in, n * 4) == cudaSuccess && cudaMalloc(&out, P * n * 4) == cudaSuccess &&
             cudaMalloc(&busy, busy_bytes) == cudaSuccess &&
             cudaMallocHost(&host, P * n * 4) == cudaSuccess &&
             cudaStreamCreate(&side) == cudaSuccess && cudaEventCreate(&gate) == cudaSuccess &&
             cudaEventCreate(&compute_done) == cudaSuccess);
  cudaMemset(in, r + 1, n * 4);
  cudaMemset(out, 0xff, P * n * 4);
  cudaDeviceSynchronize();
  // The gate: the comm stream cannot start the collective before a long run of work elsewhere.
  for (int i = 0; i < 400; ++i) cudaMemsetAsync(busy, i, busy_bytes, side);
  cudaEventRecord(gate, side);
  cudaStreamWaitEvent(st.comm, gate, 0);
  ASSIGN_OR_RETURN(
      Issued gather,
      c.IssueAllGather(Tensor(in, DType::kI32, {static_cast<int64_t>(n)}, Device::kCuda),
                       Tensor(out, DType::kI32, {static_cast<int64_t>(P * n)}, Device::kCuda)));
  cudaEventRecord(compute_done, st.compute);
  RANK_CHECK(cudaEventSynchronize(compute_done) == cudaSuccess);
  const bool gate_open = cudaEventQuery(gate) == cudaSuccess;
  RETURN_IF_ERROR(gather.Wait());
  cudaMemcpyAsync(host, out, P * n * 4, cudaMemcpyDeviceToHost, st.compute);
  RANK_CHECK(cudaStreamSynchronize(st.compute) == cudaSuccess);
  RETURN_IF_ERROR(c.Synchronize());
  int bad = 0;
  for (size_t i = 0; i < P * n; ++i) {
    bad += host[i] != 0x01010101 * static_cast<int32_t>(i / n + 1);
  }
  cudaFree(in);
  cudaFree(out);
  cudaFree(busy);
  cudaFreeHost(host);
  cudaStreamDestroy(side);
  cudaEventDestroy(gate);
  cudaEventDestroy(compute_done);
  RANK_CHECK(!gate_open, "the compute stream waited for an issued collective before its Wait");
  RANK_CHECK(bad == 0, bad, " stale elements after Wait");
  return absl::OkStatus();
}

TEST(NcclCommTest, OneRank) {
  if (GpuCount() < 1) GTEST_SKIP() << "no CUDA GPU on this machine: NCCL test skipped";
  auto outcomes = RunRanks(
      1,
      [&](int rank) -> absl::Status {
        ASSIGN_OR_RETURN(auto comm, NcclComm::Create(rank, 1, "", 0, Options(30)));
        RETURN_IF_ERROR(CheckCollectives(*comm));
        RETURN_IF_ERROR(CheckSendRecv(*comm));
        ASSIGN_OR_RETURN(auto sub, comm->Split(0, 0));
        RANK_CHECK(sub->size() == 1 && sub->rank() == 0);
        RETURN_IF_ERROR(CheckCollectives(*sub));
        // Asynchronous mode on a stream of our own, then Synchronize.
        cudaStream_t stream;
        RANK_CHECK(cudaStreamCreate(&stream) == cudaSuccess);
        ASSIGN_OR_RETURN(auto async, NcclComm::Create(rank, 1, "", 0, Options(30, false)));
        async->SetStreams(stream);
        RETURN_IF_ERROR(CheckCollectives(*async));
        RETURN_IF_ERROR(async->Synchronize());
        // Ordered with a compute stream, asynchronous (the worker's mode), and synchronous.
        Streams st;
        async->SetStreams(st.comm, st.compute);
        RETURN_IF_ERROR(CheckOrderedWithComputeStream(*async, st));
        RETURN_IF_ERROR(CheckIssuedWaitsOnlyAtUse(*async, st));
        RETURN_IF_ERROR(CheckCollectives(*async));
        RETURN_IF_ERROR(CheckSendRecv(*async));
        async->set_synchronous(true);
        return CheckOrderedWithComputeStream(*async, st);
      },
      RunOptions{120, {}});
  EXPECT_EQ(testing::Failures(outcomes), "");
}

TEST(NcclCommTest, TwoRanksWithSplitAndTimeout) {
  if (GpuCount() < 2) GTEST_SKIP() << "fewer than 2 CUDA GPUs: two-rank NCCL test skipped";
  TempDir dir;
  auto outcomes = RunRanks(
      2,
      [&](int rank) -> absl::Status {
        ASSIGN_OR_RETURN(auto comm, NcclComm::Create(rank, 2, dir.rendezvous(), rank, Options(30)));
        RETURN_IF_ERROR(CheckCollectives(*comm));
        ASSIGN_OR_RETURN(auto pair, comm->Split(0, -rank));  // reversed order
        RANK_CHECK(pair->size() == 2 && pair->rank() == 1 - rank);
        RETURN_IF_ERROR(CheckCollectives(*pair));
        RETURN_IF_ERROR(CheckSendRecv(*comm));
        RETURN_IF_ERROR(CheckSendRecv(*pair));
        // The worker's mode, set through Comm::UseStreams before a split as the worker does: the
        // child inherits it.
        Streams st;
        comm->UseStreams(DeviceStreams{st.compute, st.comm});
        RANK_CHECK(comm->stream() == st.comm);
        RETURN_IF_ERROR(CheckOrderedWithComputeStream(*comm, st));
        RETURN_IF_ERROR(CheckIssuedWaitsOnlyAtUse(*comm, st));
        RETURN_IF_ERROR(CheckSendRecv(*comm));
        ASSIGN_OR_RETURN(auto sub, comm->Split(0, rank));
        return CheckOrderedWithComputeStream(static_cast<NcclComm&>(*sub), st);
      },
      RunOptions{120, {}});
  EXPECT_EQ(testing::Failures(outcomes), "");

  // Rank 1 stops calling: rank 0's all-reduce must fail within its timeout, not hang.
  TempDir dir2;
  RunOptions run{60, {1}};
  auto stuck = RunRanks(
      2,
      [&](int rank) -> absl::Status {
        ASSIGN_OR_RETURN(auto comm, NcclComm::Create(rank, 2, dir2.rendezvous(), rank, Options(5)));
        RETURN_IF_ERROR(comm->Barrier());
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(120));
          return absl::OkStatus();
        }
        DeviceVector<float> dx(std::vector<float>(1024, 1.0f));
        const auto start = std::chrono::steady_clock::now();
        absl::Status st = comm->AllReduce(dx.tensor(DType::kF32));
        double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "[rank 0] %s\n", st.ToString().c_str());
        RANK_CHECK(st.code() == absl::StatusCode::kDeadlineExceeded, st.ToString());
        RANK_CHECK(took < 10, "took ", took, " s");
        RANK_CHECK(comm->Barrier().code() == absl::StatusCode::kDeadlineExceeded);
        return absl::OkStatus();
      },
      run);
  EXPECT_EQ(stuck[0].exit_code, 0) << stuck[0].ToString();

  // The same in the worker's asynchronous mode: the all-reduce returns at once and the compute
  // stream waits for it; the watchdog aborts the communicator within the timeout, which ends the
  // stuck kernel, so the host's stream synchronization returns and the next call reports it.
  TempDir dir3;
  auto stuck_async = RunRanks(
      2,
      [&](int rank) -> absl::Status {
        ASSIGN_OR_RETURN(auto comm, NcclComm::Create(rank, 2, dir3.rendezvous(), rank, Options(5)));
        RETURN_IF_ERROR(comm->Barrier());
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(120));
          return absl::OkStatus();
        }
        Streams st;
        comm->SetStreams(st.comm, st.compute);
        comm->set_synchronous(false);
        DeviceVector<float> dx(std::vector<float>(1024, 1.0f));
        const auto start = std::chrono::steady_clock::now();
        RETURN_IF_ERROR(comm->AllReduce(dx.tensor(DType::kF32)));
        cudaStreamSynchronize(st.compute);
        absl::Status st_sync = comm->Synchronize();
        double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "[rank 0, asynchronous] %s after %.1f s\n", st_sync.ToString().c_str(),
                     took);
        RANK_CHECK(st_sync.code() == absl::StatusCode::kDeadlineExceeded, st_sync.ToString());
        RANK_CHECK(took < 15, "took ", took, " s");
        return absl::OkStatus();
      },
      run);
  EXPECT_EQ(stuck_async[0].exit_code, 0) << stuck_async[0].ToString();
}

}  // namespace
}  // namespace ithaca
