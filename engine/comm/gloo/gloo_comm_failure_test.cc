// GlooComm when things go wrong: a rank that exits or is killed mid-collective, a rank that
// hangs, a rank that never joins, a reused rendezvous directory, and local misuse. Every case
// must end in an error status within the timeout (each test bounds its wall-clock time), and no
// exception may escape.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "engine/comm/gloo/gloo_comm.h"
#include "engine/comm/testing/multiprocess.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using testing::RunOptions;
using testing::RunRanks;
using testing::TempDir;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

GlooOptions Options(double timeout_s) {
  GlooOptions o;
  o.timeout_s = timeout_s;
  return o;
}

bool IsCommFailure(const absl::Status& st) {
  return st.code() == absl::StatusCode::kUnavailable ||
         st.code() == absl::StatusCode::kDeadlineExceeded;
}

// A survivor's view of a collective during which rank `victim` died: an error naming this rank
// and the victim, well within the timeout; and every later call fails at once.
absl::Status ExpectPeerLoss(Comm& comm, int victim, double timeout_s) {
  std::vector<float> x(1 << 16, 1.0f);
  const auto start = Clock::now();
  absl::Status st = comm.AllReduce(Tensor(x.data(), DType::kF32, {1 << 16}));
  const double took = Since(start);
  std::fprintf(stderr, "[survivor %d] %s\n", comm.rank(), st.ToString().c_str());
  RANK_CHECK(IsCommFailure(st), st.ToString());
  RANK_CHECK(took < timeout_s + 1, "took ", took, " s");
  RANK_CHECK(absl::StrContains(st.message(), absl::StrCat("gloo rank ", comm.rank(), " of 4")),
             st.ToString());
  RANK_CHECK(absl::StrContains(st.message(), absl::StrCat("rank ", victim, " (pid")),
             st.ToString());
  const auto again = Clock::now();
  absl::Status later = comm.Barrier();
  RANK_CHECK(IsCommFailure(later) && Since(again) < 0.5, later.ToString());
  RANK_CHECK(absl::StrContains(later.message(), "already failed"), later.ToString());
  return absl::OkStatus();
}

TEST(GlooFailureTest, RankThatExitsBeforeACollective) {
  TempDir dir;
  const double timeout_s = 5;
  const auto start = Clock::now();
  RunOptions run;
  run.wall_limit_s = 20;
  auto outcomes = RunRanks(
      4,
      [&](int rank) -> absl::Status {
        ASSIGN_OR_RETURN(auto comm,
                         GlooComm::Create(rank, 4, dir.rendezvous(), Options(timeout_s)));
        RETURN_IF_ERROR(comm->Barrier());
        if (rank == 2) _exit(9);
        return ExpectPeerLoss(*comm, 2, timeout_s);
      },
      run);
  EXPECT_LT(Since(start), 10);
  for (int r : {0, 1, 3}) EXPECT_EQ(outcomes[r].exit_code, 0) << outcomes[r].ToString();
  EXPECT_EQ(outcomes[2].exit_code, 9);
}

TEST(GlooFailureTest, RankKilledMidCollective) {
  TempDir dir;
  const double timeout_s = 5;
  const auto start = Clock::now();
  RunOptions run;
  run.wall_limit_s = 20;
  auto outcomes = RunRanks(
      4,
      [&](int rank) -> absl::Status {
        ASSIGN_OR_RETURN(auto comm,
                         GlooComm::Create(rank, 4, dir.rendezvous(), Options(timeout_s)));
        RETURN_IF_ERROR(comm->Barrier());
        if (rank == 1) {
          // The others are inside the all-reduce by now, waiting for this rank's data.
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          raise(SIGKILL);
        }
        return ExpectPeerLoss(*comm, 1, timeout_s);
      },
      run);
  EXPECT_LT(Since(start), 10);
  for (int r : {0, 2, 3}) EXPECT_EQ(outcomes[r].exit_code, 0) << outcomes[r].ToString();
  EXPECT_EQ(outcomes[1].signal, SIGKILL);
}

TEST(GlooFailureTest, StuckRankTimesOut) {
  TempDir dir;
  const double timeout_s = 2;
  RunOptions run;
  run.wall_limit_s = 15;
  run.expendable = {1};
  const auto start = Clock::now();
  auto outcomes = RunRanks(
      3,
      [&](int rank) -> absl::Status {
        ASSIGN_OR_RETURN(auto comm,
                         GlooComm::Create(rank, 3, dir.rendezvous(), Options(timeout_s)));
        RETURN_IF_ERROR(comm->Barrier());
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(60));  // alive but never calls
          return absl::OkStatus();
        }
        std::vector<float> x(3 * 100, 1.0f), y(3 * 100);
        const auto t = Clock::now();
        absl::Status st = comm->AllToAll(Tensor(x.data(), DType::kF32, {300}),
                                         Tensor(y.data(), DType::kF32, {300}));
        std::fprintf(stderr, "[waiting rank %d] %s\n", rank, st.ToString().c_str());
        RANK_CHECK(IsCommFailure(st), st.ToString());
        RANK_CHECK(Since(t) < timeout_s + 1.5, "took ", Since(t), " s");
        // Rank 1 is alive, so it must not be reported as gone (the other waiting rank may have
        // finished and exited by now, and may be named).
        RANK_CHECK(!absl::StrContains(st.message(), "rank 1 (pid"), st.ToString());
        if (st.code() == absl::StatusCode::kDeadlineExceeded) {
          RANK_CHECK(absl::StrContains(st.message(), "timeout 2 s"), st.ToString());
        }
        return absl::OkStatus();
      },
      run);
  EXPECT_LT(Since(start), 8);
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].ToString();
  EXPECT_EQ(outcomes[2].exit_code, 0) << outcomes[2].ToString();
  EXPECT_TRUE(outcomes[1].killed_by_harness);
}

// A ring shift of four ranks in which rank 2 never takes part: alive but stuck, or gone. Its two
// neighbours (rank 1 sends to it, rank 3 receives from it) fail within the timeout with an error
// that names it; rank 0, whose peers are 1 and 3, may finish or see them fail.
void RingShiftWithoutRank2(bool exits) {
  TempDir dir;
  const double timeout_s = 2;
  RunOptions run;
  run.wall_limit_s = 15;
  if (!exits) run.expendable = {2};
  const auto start = Clock::now();
  auto outcomes = RunRanks(
      4,
      [&](int rank) -> absl::Status {
        ASSIGN_OR_RETURN(auto comm,
                         GlooComm::Create(rank, 4, dir.rendezvous(), Options(timeout_s)));
        RETURN_IF_ERROR(comm->Barrier());
        if (rank == 2) {
          if (exits) _exit(9);
          std::this_thread::sleep_for(std::chrono::seconds(60));  // alive but never calls
          return absl::OkStatus();
        }
        std::vector<float> send(1 << 16, 1.0f), recv(1 << 16);
        const auto t = Clock::now();
        absl::Status st =
            comm->SendRecv(Tensor(send.data(), DType::kF32, {1 << 16}), (rank + 1) % 4,
                           Tensor(recv.data(), DType::kF32, {1 << 16}), (rank + 3) % 4);
        std::fprintf(stderr, "[rank %d] %s\n", rank, st.ToString().c_str());
        RANK_CHECK(Since(t) < timeout_s + 1.5, "took ", Since(t), " s");
        if (rank == 0) {
          RANK_CHECK(st.ok() || IsCommFailure(st), st.ToString());
          return absl::OkStatus();
        }
        RANK_CHECK(IsCommFailure(st), st.ToString());
        RANK_CHECK(absl::StrContains(st.message(), rank == 1 ? "to rank 2" : "from rank 2"),
                   st.ToString());
        if (exits) {
          RANK_CHECK(absl::StrContains(st.message(), "rank 2 (pid"), st.ToString());
        } else {
          RANK_CHECK(st.code() == absl::StatusCode::kDeadlineExceeded, st.ToString());
        }
        // Rank 0 is not this exchange's peer: even once it has finished and exited, it is not
        // blamed.
        RANK_CHECK(!absl::StrContains(st.message(), "rank 0 (pid"), st.ToString());
        RANK_CHECK(!comm->health().ok(), "the communicator must stay failed");
        return absl::OkStatus();
      },
      run);
  EXPECT_LT(Since(start), 10);
  for (int r : {0, 1, 3}) EXPECT_EQ(outcomes[r].exit_code, 0) << outcomes[r].ToString();
  if (exits) {
    EXPECT_EQ(outcomes[2].exit_code, 9);
  } else {
    EXPECT_TRUE(outcomes[2].killed_by_harness);
  }
}

TEST(GlooFailureTest, SendRecvWithAStuckPeerTimesOutNamingIt) { RingShiftWithoutRank2(false); }

TEST(GlooFailureTest, SendRecvWithAPeerThatExitedNamesIt) { RingShiftWithoutRank2(true); }

TEST(GlooFailureTest, RankThatNeverJoins) {
  TempDir dir;
  RunOptions run;
  run.wall_limit_s = 15;
  auto outcomes = RunRanks(
      3,
      [&](int rank) -> absl::Status {
        if (rank == 2) return absl::OkStatus();  // never shows up
        const auto t = Clock::now();
        auto comm = GlooComm::Create(rank, 3, dir.rendezvous(), Options(1));
        RANK_CHECK(!comm.ok(), "connected without rank 2");
        std::fprintf(stderr, "[rank %d] %s\n", rank, comm.status().ToString().c_str());
        RANK_CHECK(IsCommFailure(comm.status()), comm.status().ToString());
        RANK_CHECK(absl::StrContains(comm.status().message(), absl::StrCat("gloo rank ", rank)),
                   comm.status().ToString());
        RANK_CHECK(absl::StrContains(comm.status().message(), "rank 2 did not join"),
                   comm.status().ToString());
        // Gloo's FileStore counts whole seconds, so a 1 s timeout ends after about 2 s.
        RANK_CHECK(Since(t) < 4, "took ", Since(t), " s");
        return absl::OkStatus();
      },
      run);
  EXPECT_EQ(testing::Failures(outcomes), "");
}

TEST(GlooFailureTest, ReusedRendezvousDirectoryIsAnError) {
  TempDir dir;
  auto first = RunRanks(2, [&](int rank) -> absl::Status {
    ASSIGN_OR_RETURN(auto comm, GlooComm::Create(rank, 2, dir.rendezvous(), Options(5)));
    return comm->Barrier();
  });
  ASSERT_EQ(testing::Failures(first), "");
  RunOptions run;
  run.wall_limit_s = 15;
  auto second = RunRanks(
      2,
      [&](int rank) -> absl::Status {
        auto comm = GlooComm::Create(rank, 2, dir.rendezvous(), Options(1));
        RANK_CHECK(!comm.ok(), "a stale rendezvous directory was accepted");
        std::fprintf(stderr, "[rank %d] %s\n", rank, comm.status().ToString().c_str());
        RANK_CHECK(IsCommFailure(comm.status()), comm.status().ToString());
        return absl::OkStatus();
      },
      run);
  EXPECT_EQ(testing::Failures(second), "");
}

TEST(GlooFailureTest, BadArgumentsAreRejectedLocally) {
  TempDir dir;
  auto outcomes = RunRanks(1, [&](int rank) -> absl::Status {
    RANK_CHECK(GlooComm::Create(1, 1, dir.rendezvous()).status().code() ==
               absl::StatusCode::kInvalidArgument);
    RANK_CHECK(GlooComm::Create(0, 1, "/no/prefix").status().code() ==
               absl::StatusCode::kInvalidArgument);
    RANK_CHECK(GlooComm::Create(0, 1, "file:/does/not/exist").status().code() ==
               absl::StatusCode::kNotFound);
    RANK_CHECK(GlooComm::Create(0, 2, "tcp:localhost:0").status().code() ==
               absl::StatusCode::kInvalidArgument);
    ASSIGN_OR_RETURN(auto comm, GlooComm::Create(rank, 1, dir.rendezvous(), Options(1)));
    std::vector<float> a(4);
    std::vector<int32_t> i(4);
    Tensor ta(a.data(), DType::kF32, {4});
    absl::Status st = comm->AllGather(ta, Tensor(a.data(), DType::kF32, {3}));
    RANK_CHECK(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
    st = comm->ReduceScatter(ta, Tensor(i.data(), DType::kI32, {4}));
    RANK_CHECK(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
    st = comm->AllToAll(ta, ta);
    RANK_CHECK(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
    st = comm->Broadcast(ta, 3);
    RANK_CHECK(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
    st = comm->AllReduce(Tensor(a.data(), DType::kF32, {4}, Device::kCuda));
    RANK_CHECK(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
    std::vector<float> b(3);
    st = comm->SendRecv(ta, 0, Tensor(b.data(), DType::kF32, {3}), 0);
    RANK_CHECK(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
    RANK_CHECK(absl::StrContains(st.message(), "send has 4 elements but recv has 3"),
               st.ToString());
    std::vector<float> w(6);
    Tensor tw(w.data(), DType::kF32, {6});
    st = comm->SendRecv(tw.Slice(0, {4}), 1, ta, 0);  // rank 1 of a world of one
    RANK_CHECK(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
    st = comm->SendRecv(tw.Slice(0, {4}), 0, tw.Slice(2, {4}), 0);  // overlapping
    RANK_CHECK(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
    st = comm->SendRecv(ta, 0, Tensor(i.data(), DType::kI32, {4}), 0);
    RANK_CHECK(st.code() == absl::StatusCode::kInvalidArgument, st.ToString());
    RANK_CHECK(comm->health().ok(), "argument errors must not break the communicator");
    return absl::OkStatus();
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
}

}  // namespace
}  // namespace ithaca
