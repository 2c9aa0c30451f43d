// GlooComm over real processes on loopback: every collective against values computed locally,
// for worlds of 1, 2, 4 and 8; Ulysses-style splits; and failures (a rank that exits, is killed
// or hangs; a rank that never joins) that must end in errors within the timeout, never a hang.
#include "engine/comm/gloo/gloo_comm.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "engine/comm/tcp_store.h"
#include "engine/comm/testing/multiprocess.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using testing::RunOptions;
using testing::RunRanks;
using testing::TempDir;

float Val(int r, int64_t i) { return std::sin(0.37f * r + 0.011f * i) * 3.1f + 0.1f * r; }

GlooOptions Options(double timeout_s) {
  GlooOptions o;
  o.timeout_s = timeout_s;
  return o;
}

absl::Status CheckAllGather(Comm& c) {
  const int P = c.size(), r = c.rank();
  const int n = 5;
  {  // f32
    std::vector<float> in(n), out(n * P, -1);
    for (int i = 0; i < n; ++i) in[i] = r * 1000 + i;
    RETURN_IF_ERROR(
        c.AllGather(Tensor(in.data(), DType::kF32, {n}), Tensor(out.data(), DType::kF32, {P, n})));
    for (int k = 0; k < P; ++k)
      for (int i = 0; i < n; ++i) RANK_CHECK(out[k * n + i] == k * 1000 + i, "f32 k=", k, " i=", i);
  }
  {  // i32, in place: this rank's part already sits in its slot of the output
    std::vector<int32_t> buf(n * P, -1);
    for (int i = 0; i < n; ++i) buf[r * n + i] = -(r * 1000 + i);
    Tensor out(buf.data(), DType::kI32, {P * n});
    RETURN_IF_ERROR(c.AllGather(out.Slice(r * n, {n}), out));
    for (int k = 0; k < P; ++k)
      for (int i = 0; i < n; ++i) RANK_CHECK(buf[k * n + i] == -(k * 1000 + i), "i32 k=", k);
  }
  {  // bf16: bit patterns travel untouched
    std::vector<uint16_t> in(n), out(n * P, 0);
    for (int i = 0; i < n; ++i) in[i] = static_cast<uint16_t>(0x7f00 + r * 16 + i);
    RETURN_IF_ERROR(c.AllGather(Tensor(in.data(), DType::kBF16, {n}),
                                Tensor(out.data(), DType::kBF16, {P * n})));
    for (int k = 0; k < P; ++k)
      for (int i = 0; i < n; ++i) RANK_CHECK(out[k * n + i] == 0x7f00 + k * 16 + i, "bf16 k=", k);
  }
  return absl::OkStatus();
}

// Chunk j of rank s, element i, encodes (s, j, i): every received element proves its origin.
int32_t Code(int s, int j, int i) { return s * 10000 + j * 100 + i; }

absl::Status CheckAllToAll(Comm& c) {
  const int P = c.size(), r = c.rank();
  const int m = 3;
  std::vector<float> f_in(m * P), f_out(m * P, -1);
  std::vector<int32_t> i_in(m * P), i_buf(m * P, -1);
  std::vector<uint16_t> b_in(m * P), b_out(m * P);
  for (int j = 0; j < P; ++j) {
    for (int i = 0; i < m; ++i) {
      f_in[j * m + i] = Code(r, j, i);
      i_in[j * m + i] = Code(r, j, i);
      b_in[j * m + i] = static_cast<uint16_t>(r * 64 + j * 8 + i);
    }
  }
  RETURN_IF_ERROR(c.AllToAll(Tensor(f_in.data(), DType::kF32, {P * m}),
                             Tensor(f_out.data(), DType::kF32, {P * m})));
  RETURN_IF_ERROR(c.AllToAll(Tensor(i_in.data(), DType::kI32, {P, m}),
                             Tensor(i_buf.data(), DType::kI32, {P, m})));
  RETURN_IF_ERROR(c.AllToAll(Tensor(b_in.data(), DType::kBF16, {P * m}),
                             Tensor(b_out.data(), DType::kBF16, {P * m})));
  for (int s = 0; s < P; ++s) {
    for (int i = 0; i < m; ++i) {
      RANK_CHECK(f_out[s * m + i] == Code(s, r, i), "f32 from ", s, " got ", f_out[s * m + i]);
      RANK_CHECK(i_buf[s * m + i] == Code(s, r, i), "i32 from ", s, " got ", i_buf[s * m + i]);
      RANK_CHECK(b_out[s * m + i] == s * 64 + r * 8 + i, "bf16 from ", s);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckReduceScatter(Comm& c) {
  const int P = c.size(), r = c.rank();
  const int m = 37;
  std::vector<float> in(m * P), out(m, 0);
  for (int64_t e = 0; e < m * P; ++e) in[e] = Val(r, e);
  RETURN_IF_ERROR(c.ReduceScatter(Tensor(in.data(), DType::kF32, {P * m}),
                                  Tensor(out.data(), DType::kF32, {m})));
  for (int i = 0; i < m; ++i) {
    float want = Val(0, r * m + i);  // summed over ranks 0, 1, ... in order: bit-exact
    for (int k = 1; k < P; ++k) want += Val(k, r * m + i);
    RANK_CHECK(out[i] == want, "element ", i, absl::StrFormat(": %.9g vs %.9g", out[i], want));
  }
  std::vector<int32_t> iin(m * P), iout(m);
  for (int e = 0; e < m * P; ++e) iin[e] = r + e;
  RETURN_IF_ERROR(c.ReduceScatter(Tensor(iin.data(), DType::kI32, {P * m}),
                                  Tensor(iout.data(), DType::kI32, {m})));
  for (int i = 0; i < m; ++i) RANK_CHECK(iout[i] == P * (r * m + i) + P * (P - 1) / 2, "i32 ", i);
  // In place: the result lands in this rank's own chunk of the input.
  Tensor whole(iin.data(), DType::kI32, {P * m});
  for (int e = 0; e < m * P; ++e) iin[e] = r + e;
  RETURN_IF_ERROR(c.ReduceScatter(whole, whole.Slice(r * m, {m})));
  for (int i = 0; i < m; ++i) RANK_CHECK(iin[r * m + i] == iout[i], "in place ", i);
  return absl::OkStatus();
}

absl::Status CheckAllReduce(Comm& c) {
  const int P = c.size(), r = c.rank();
  const int n = 1001;  // not a multiple of P: exercises the padding
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = Val(r, i);
  RETURN_IF_ERROR(c.AllReduce(Tensor(x.data(), DType::kF32, {n})));
  for (int i = 0; i < n; ++i) {
    float want = Val(0, i);
    for (int k = 1; k < P; ++k) want += Val(k, i);
    RANK_CHECK(x[i] == want, "f32 element ", i, absl::StrFormat(": %.9g vs %.9g", x[i], want));
  }
  std::vector<int32_t> xi(7);
  for (int i = 0; i < 7; ++i) xi[i] = (r + 1) * (i - 3);
  RETURN_IF_ERROR(c.AllReduce(Tensor(xi.data(), DType::kI32, {7})));
  for (int i = 0; i < 7; ++i) RANK_CHECK(xi[i] == P * (P + 1) / 2 * (i - 3), "i32 ", i);
  std::vector<bf16> xb(9);
  for (int i = 0; i < 9; ++i) xb[i] = FloatToBf16(0.5f * i + r);
  RETURN_IF_ERROR(c.AllReduce(Tensor(xb.data(), DType::kBF16, {9})));
  for (int i = 0; i < 9; ++i) {
    float want = 0;
    for (int k = 0; k < P; ++k) want += Bf16ToFloat(FloatToBf16(0.5f * i + k));
    RANK_CHECK(xb[i].bits == FloatToBf16(want).bits, "bf16 ", i);
  }
  std::vector<float> scalar = {static_cast<float>(r)};  // fewer elements than ranks
  RETURN_IF_ERROR(c.AllReduce(Tensor(scalar.data(), DType::kF32, {1})));
  RANK_CHECK(scalar[0] == P * (P - 1) / 2.0f, "scalar ", scalar[0]);
  return absl::OkStatus();
}

absl::Status CheckBroadcast(Comm& c) {
  const int P = c.size(), r = c.rank();
  for (int root : {P - 1, 0}) {
    std::vector<float> x(6, static_cast<float>(r));
    std::vector<uint16_t> b(3, static_cast<uint16_t>(r));
    RETURN_IF_ERROR(c.Broadcast(Tensor(x.data(), DType::kF32, {6}), root));
    RETURN_IF_ERROR(c.Broadcast(Tensor(b.data(), DType::kBF16, {3}), root));
    for (float v : x) RANK_CHECK(v == root, "f32 root ", root, " got ", v);
    for (uint16_t v : b) RANK_CHECK(v == root, "bf16 root ", root);
  }
  return absl::OkStatus();
}

// Ring shifts: right (from r - 1), left (from r + 1) in bf16, two in a row (the second passes on
// what the first brought, so data from r - 2 arrives), and the issued form.
absl::Status CheckSendRecv(Comm& c) {
  const int P = c.size(), r = c.rank();
  const int right = (r + 1) % P, left = (r + P - 1) % P;
  const int n = 1000;
  std::vector<float> mine(n), got(n, -1), again(n, -1);
  for (int i = 0; i < n; ++i) mine[i] = Code(r, 0, i % 100);
  const Tensor t_mine(mine.data(), DType::kF32, {n}), t_got(got.data(), DType::kF32, {n});
  RETURN_IF_ERROR(c.SendRecv(t_mine, right, t_got, left));
  for (int i = 0; i < n; ++i) RANK_CHECK(got[i] == Code(left, 0, i % 100), "right shift i=", i);
  RETURN_IF_ERROR(c.SendRecv(t_got, right, Tensor(again.data(), DType::kF32, {n}), left));
  const int left2 = (r + 2 * P - 2) % P;
  for (int i = 0; i < n; ++i) RANK_CHECK(again[i] == Code(left2, 0, i % 100), "second shift i=", i);

  std::vector<uint16_t> b_mine(7), b_got(7, 0);
  for (int i = 0; i < 7; ++i) b_mine[i] = static_cast<uint16_t>(0x3f00 + r * 16 + i);
  RETURN_IF_ERROR(c.SendRecv(Tensor(b_mine.data(), DType::kBF16, {7}), left,
                             Tensor(b_got.data(), DType::kBF16, {7}), right));
  for (int i = 0; i < 7; ++i) RANK_CHECK(b_got[i] == 0x3f00 + right * 16 + i, "left shift bf16");

  std::vector<int32_t> i_mine(5), i_got(5, -1);
  for (int i = 0; i < 5; ++i) i_mine[i] = Code(r, 1, i);
  ASSIGN_OR_RETURN(Issued shift, c.IssueSendRecv(Tensor(i_mine.data(), DType::kI32, {5}), right,
                                                 Tensor(i_got.data(), DType::kI32, {5}), left));
  RETURN_IF_ERROR(shift.Wait());
  for (int i = 0; i < 5; ++i) RANK_CHECK(i_got[i] == Code(left, 1, i), "issued shift i=", i);
  return absl::OkStatus();
}

absl::Status CheckBarrier(Comm& c, const std::string& dir) {
  // Rank 0 arrives late and marks its arrival with a file just before it: nobody may leave the
  // barrier before the file exists. (No clock: under load a timed check flakes.)
  const std::string arrived = dir + "/rank0-arrived";
  if (c.rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::FILE* f = std::fopen(arrived.c_str(), "w");
    RANK_CHECK(f != nullptr, "cannot create ", arrived);
    std::fclose(f);
  }
  RETURN_IF_ERROR(c.Barrier());
  RANK_CHECK(std::filesystem::exists(arrived), "left the barrier before rank 0 arrived");
  return absl::OkStatus();
}

class GlooWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorldTest, CollectivesMatchLocalComputation) {
  const int world = GetParam();
  TempDir dir;
  auto outcomes = RunRanks(world, [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(auto comm, GlooComm::Create(rank, world, dir.rendezvous(), Options(10)));
    RANK_CHECK(comm->rank() == rank && comm->size() == world);
    RETURN_IF_ERROR(CheckAllGather(*comm));
    RETURN_IF_ERROR(CheckAllToAll(*comm));
    RETURN_IF_ERROR(CheckReduceScatter(*comm));
    RETURN_IF_ERROR(CheckAllReduce(*comm));
    RETURN_IF_ERROR(CheckBroadcast(*comm));
    RETURN_IF_ERROR(CheckSendRecv(*comm));
    RETURN_IF_ERROR(CheckBarrier(*comm, dir.path()));
    return absl::OkStatus();
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooWorldTest, ::testing::Values(1, 2, 4, 8),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

// Issue-now collectives run on the communicator's background thread while this thread goes on:
// several in flight at once, a blocking call behind them, waits in another order than issued,
// and each result whole at its Wait.
TEST(GlooIssueTest, IssuedCollectivesCompleteInOrderAndOverlapTheCaller) {
  TempDir dir;
  constexpr int kWorld = 3;
  auto outcomes = RunRanks(kWorld, [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(auto comm, GlooComm::Create(rank, kWorld, dir.rendezvous(), Options(10)));
    const int P = kWorld, n = 1 << 16;
    std::vector<float> mine(n), gathered(n * P, -1), rs_in(n * P), rs_out(n, -1);
    std::vector<int32_t> a2a_in(n * P), a2a_out(n * P, -1);
    for (int i = 0; i < n; ++i) mine[i] = Val(rank, i);
    for (int j = 0; j < P; ++j) {
      for (int i = 0; i < n; ++i) {
        rs_in[j * n + i] = Val(rank, j * n + i);
        a2a_in[j * n + i] = Code(rank, j, i % 100);
      }
    }
    ASSIGN_OR_RETURN(Issued gather,
                     comm->IssueAllGather(Tensor(mine.data(), DType::kF32, {n}),
                                          Tensor(gathered.data(), DType::kF32, {P * n})));
    ASSIGN_OR_RETURN(Issued reduce,
                     comm->IssueReduceScatter(Tensor(rs_in.data(), DType::kF32, {P * n}),
                                              Tensor(rs_out.data(), DType::kF32, {n})));
    ASSIGN_OR_RETURN(Issued exchange,
                     comm->IssueAllToAll(Tensor(a2a_in.data(), DType::kI32, {P * n}),
                                         Tensor(a2a_out.data(), DType::kI32, {P * n})));
    RANK_CHECK(gather.pending() && reduce.pending() && exchange.pending());
    // A blocking collective queues behind the issued ones (the same order on every rank).
    float one = 1;
    RETURN_IF_ERROR(comm->AllReduce(Tensor(&one, DType::kF32, {1})));
    RANK_CHECK(one == P, "all_reduce after issued collectives: ", one);
    RETURN_IF_ERROR(exchange.Wait());
    RETURN_IF_ERROR(reduce.Wait());
    RETURN_IF_ERROR(gather.Wait());
    RANK_CHECK(!gather.pending());
    for (int k = 0; k < P; ++k) {
      for (int i = 0; i < n; i += 997) {
        RANK_CHECK(gathered[k * n + i] == Val(k, i), "gathered k=", k, " i=", i);
        RANK_CHECK(a2a_out[k * n + i] == Code(k, rank, i % 100), "exchanged k=", k, " i=", i);
      }
    }
    for (int i = 0; i < n; i += 997) {
      float sum = 0;
      for (int k = 0; k < P; ++k) sum += Val(k, rank * n + i);
      RANK_CHECK(std::abs(rs_out[i] - sum) < 1e-5f, "reduce_scatter i=", i);
    }
    return comm->Barrier();
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
}

// A peer lost while a collective is in flight: the error arrives at Wait, naming the peer.
TEST(GlooIssueTest, APeerLostUnderAnIssuedCollectiveFailsItsWait) {
  TempDir dir;
  RunOptions run;
  run.wall_limit_s = 20;
  auto outcomes = RunRanks(
      2,
      [&](int rank) -> absl::Status {
        ASSIGN_OR_RETURN(auto comm, GlooComm::Create(rank, 2, dir.rendezvous(), Options(3)));
        RETURN_IF_ERROR(comm->Barrier());
        if (rank == 1) _exit(7);
        std::vector<float> in(8, 1.f), out(16);
        ASSIGN_OR_RETURN(Issued gather,
                         comm->IssueAllGather(Tensor(in.data(), DType::kF32, {8}),
                                              Tensor(out.data(), DType::kF32, {16})));
        const absl::Status st = gather.Wait();
        RANK_CHECK(!st.ok(), "the gather with a dead peer succeeded");
        RANK_CHECK(absl::StrContains(st.message(), "rank 1"), st.ToString());
        // The communicator stays failed.
        RANK_CHECK(!comm->Barrier().ok());
        return absl::OkStatus();
      },
      run);
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].ToString();
  EXPECT_EQ(outcomes[1].exit_code, 7);
}

// Ring attention's shifts over four ranks, mixed with the other collectives: an exchange only some
// ranks take part in leaves the others' collectives undisturbed, a copy to itself, an issued shift
// overlapping the caller, and a misuse rejected on the rank that made it before anything is sent.
TEST(GlooSendRecvTest, RingShiftsOfFourRanks) {
  TempDir dir;
  GlooOptions options = Options(10);
  options.issue_delay_ms = 50;  // an issued shift is still in flight when the caller goes on
  auto outcomes = RunRanks(4, [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(auto comm, GlooComm::Create(rank, 4, dir.rendezvous(), options));
    RETURN_IF_ERROR(CheckSendRecv(*comm));
    RETURN_IF_ERROR(CheckAllReduce(*comm));

    // Ranks 0 and 1 swap twice while 2 and 3 only copy to themselves (no message); then the whole
    // world reduces, its collectives still paired up.
    const int peer = rank < 2 ? 1 - rank : rank;
    for (int round = 0; round < 2; ++round) {
      float mine = rank * 10.f + round, got = -1;
      RETURN_IF_ERROR(comm->SendRecv(Tensor(&mine, DType::kF32, {1}), peer,
                                     Tensor(&got, DType::kF32, {1}), peer));
      RANK_CHECK(got == peer * 10.f + round, "round ", round, " got ", got);
    }
    RETURN_IF_ERROR(CheckAllReduce(*comm));

    // An issued shift runs on the background thread while this one goes on.
    const int n = 1 << 16;
    std::vector<float> send(n), recv(n, -1);
    for (int i = 0; i < n; ++i) send[i] = Val(rank, i);
    ASSIGN_OR_RETURN(Issued shift,
                     comm->IssueSendRecv(Tensor(send.data(), DType::kF32, {n}), (rank + 1) % 4,
                                         Tensor(recv.data(), DType::kF32, {n}), (rank + 3) % 4));
    RANK_CHECK(shift.pending());
    RETURN_IF_ERROR(shift.Wait());
    for (int i = 0; i < n; i += 331) RANK_CHECK(recv[i] == Val((rank + 3) % 4, i), "issued i=", i);

    // A receive buffer one element short: rejected here, naming the sizes; nothing was sent, so
    // the next shift pairs up as before.
    float one = 1, short_recv = 0;
    absl::Status bad = comm->SendRecv(Tensor(send.data(), DType::kF32, {2}), (rank + 1) % 4,
                                      Tensor(&short_recv, DType::kF32, {1}), (rank + 3) % 4);
    RANK_CHECK(bad.code() == absl::StatusCode::kInvalidArgument, bad.ToString());
    RANK_CHECK(absl::StrContains(bad.message(), "send has 2 elements but recv has 1"),
               bad.ToString());
    bad = comm->SendRecv(Tensor(&one, DType::kF32, {1}), (rank + 1) % 4,
                         Tensor(&short_recv, DType::kF32, {1}), rank);
    RANK_CHECK(bad.code() == absl::StatusCode::kInvalidArgument, bad.ToString());
    RANK_CHECK(comm->health().ok(), comm->health().ToString());
    RETURN_IF_ERROR(CheckSendRecv(*comm));

    // Inside a split: the pairs {0, 1} and {2, 3} swap within their group.
    ASSIGN_OR_RETURN(auto pair, comm->Split(rank / 2, rank));
    return CheckSendRecv(*pair);
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
}

// A TCP store served from a process of its own, on loopback, until destroyed. Not from this test
// process: RunRanks forks the ranks from it, and a fork of a process whose server thread holds a
// lock (the allocator's, under ASan) left ranks hung in their first allocation, never joining.
class StoreProcess {
 public:
  StoreProcess() {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      auto server = TcpStoreServer::Start("127.0.0.1", 0);
      const int port = server.ok() ? (*server)->port() : -1;
      ssize_t ignored = ::write(fds[1], &port, sizeof(port));
      (void)ignored;
      ::close(fds[1]);
      for (;;) ::pause();  // serves on its thread until killed
    }
    ::close(fds[1]);
    if (pid_ > 0 && ::read(fds[0], &port_, sizeof(port_)) != sizeof(port_)) port_ = -1;
    ::close(fds[0]);
  }
  ~StoreProcess() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  StoreProcess(const StoreProcess&) = delete;
  StoreProcess& operator=(const StoreProcess&) = delete;
  int port() const { return port_; }  // -1: it did not start

 private:
  pid_t pid_ = -1;
  int port_ = -1;
};

// The same collectives and a split with ranks meeting at a TCP store (how ranks on several
// machines meet), served as node 0's launcher would.
TEST(GlooTcpTest, CollectivesAndSplitsOverATcpRendezvous) {
  StoreProcess server;
  ASSERT_GT(server.port(), 0);
  const std::string rendezvous = absl::StrCat("tcp:127.0.0.1:", server.port());
  auto outcomes = RunRanks(4, [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(auto comm, GlooComm::Create(rank, 4, rendezvous, Options(10)));
    RETURN_IF_ERROR(CheckAllGather(*comm));
    RETURN_IF_ERROR(CheckAllReduce(*comm));
    ASSIGN_OR_RETURN(auto pair, comm->Split(rank / 2, rank));
    RETURN_IF_ERROR(CheckReduceScatter(*pair));
    return comm->Barrier();
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
}

// A rank that never joins a TCP rendezvous: the others fail within the timeout, naming it.
TEST(GlooTcpTest, AMissingRankIsNamed) {
  StoreProcess server;
  ASSERT_GT(server.port(), 0);
  const std::string rendezvous = absl::StrCat("tcp:127.0.0.1:", server.port());
  auto outcomes = RunRanks(2, [&](int rank) -> absl::Status {
    auto comm = GlooComm::Create(rank, 3, rendezvous, Options(1));
    RANK_CHECK(absl::IsDeadlineExceeded(comm.status()), comm.status().ToString());
    RANK_CHECK(absl::StrContains(comm.status().message(), "rank 2 did not join"),
               comm.status().ToString());
    return absl::OkStatus();
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
}

// The ranks of `c`, gathered: the members of a split group and their order.
absl::StatusOr<std::vector<int32_t>> Members(Comm& c, int32_t global_rank) {
  std::vector<int32_t> all(c.size());
  RETURN_IF_ERROR(c.AllGather(Tensor(&global_rank, DType::kI32, {1}),
                              Tensor(all.data(), DType::kI32, {c.size()})));
  return all;
}

TEST(GlooSplitTest, UlyssesGroupsOfFourRanks) {
  TempDir dir;
  auto outcomes = RunRanks(4, [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(auto world, GlooComm::Create(rank, 4, dir.rendezvous(), Options(10)));
    // Sequence-parallel pairs {0,1} {2,3}, ordered by rank.
    ASSIGN_OR_RETURN(auto sp, world->Split(rank / 2, rank));
    RANK_CHECK(sp->size() == 2 && sp->rank() == rank % 2);
    ASSIGN_OR_RETURN(auto sp_members, Members(*sp, rank));
    RANK_CHECK(sp_members == std::vector<int32_t>({rank / 2 * 2, rank / 2 * 2 + 1}));
    // Data-parallel pairs {0,2} {1,3}, ordered by descending rank (key = -rank).
    ASSIGN_OR_RETURN(auto dp, world->Split(rank % 2, -rank));
    ASSIGN_OR_RETURN(auto dp_members, Members(*dp, rank));
    RANK_CHECK(dp_members == std::vector<int32_t>({rank % 2 + 2, rank % 2}), "dp order");
    RANK_CHECK(dp->rank() == (rank < 2 ? 1 : 0));
    // Collectives inside groups, interleaved with the world's: each group keeps its own stream.
    RETURN_IF_ERROR(CheckAllToAll(*sp));
    RETURN_IF_ERROR(CheckAllReduce(*dp));
    RETURN_IF_ERROR(CheckAllReduce(*world));
    RETURN_IF_ERROR(CheckReduceScatter(*sp));
    // A split of a split, and singletons.
    ASSIGN_OR_RETURN(auto again, sp->Split(0, sp->rank()));
    ASSIGN_OR_RETURN(auto again_members, Members(*again, rank));
    RANK_CHECK(again_members == sp_members);
    ASSIGN_OR_RETURN(auto alone, world->Split(rank, 0));
    RANK_CHECK(alone->size() == 1 && alone->rank() == 0);
    RETURN_IF_ERROR(CheckAllGather(*alone));
    // A negative color is rejected on every rank, not only the one that passed it.
    auto bad = world->Split(rank == 3 ? -1 : 0, 0);
    RANK_CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument, bad.status().ToString());
    RANK_CHECK(absl::StrContains(bad.status().message(), "rank 3"), bad.status().ToString());
    return world->Barrier();
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
}

TEST(GlooSplitTest, SequenceAndDataParallelGroupsOfEightRanks) {
  TempDir dir;
  auto outcomes = RunRanks(8, [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(auto world, GlooComm::Create(rank, 8, dir.rendezvous(), Options(10)));
    ASSIGN_OR_RETURN(auto sp, world->Split(rank / 4, rank));  // sp = 4
    ASSIGN_OR_RETURN(auto dp, world->Split(rank % 4, rank));  // dp = 2
    RANK_CHECK(sp->size() == 4 && sp->rank() == rank % 4);
    RANK_CHECK(dp->size() == 2 && dp->rank() == rank / 4);
    float x = static_cast<float>(rank);
    RETURN_IF_ERROR(sp->AllReduce(Tensor(&x, DType::kF32, {1})));
    RANK_CHECK(x == 16 * (rank / 4) + 6, "sp sum ", x);
    float y = static_cast<float>(rank);
    RETURN_IF_ERROR(dp->AllReduce(Tensor(&y, DType::kF32, {1})));
    RANK_CHECK(y == 2 * (rank % 4) + 4, "dp sum ", y);
    RETURN_IF_ERROR(CheckAllToAll(*sp));
    return absl::OkStatus();
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
}

}  // namespace
}  // namespace ithaca
