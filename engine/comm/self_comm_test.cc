// SelfComm: copies and no-ops with the same argument checks as the real backends.
#include "engine/comm/self_comm.h"

#include <vector>

#include "gtest/gtest.h"

namespace ithaca {
namespace {

TEST(SelfCommTest, CollectivesAreCopies) {
  SelfComm c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.size(), 1);
  std::vector<float> a = {1, 2, 3, 4}, b(4, 0);
  Tensor ta(a.data(), DType::kF32, {4}), tb(b.data(), DType::kF32, {2, 2});
  ASSERT_TRUE(c.AllGather(ta, tb).ok());
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0.f);
  ASSERT_TRUE(c.AllToAll(ta, tb).ok());
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0.f);
  ASSERT_TRUE(c.ReduceScatter(ta, tb).ok());
  EXPECT_EQ(b, a);
  ASSERT_TRUE(c.AllReduce(ta).ok());
  ASSERT_TRUE(c.Broadcast(ta, 0).ok());
  ASSERT_TRUE(c.AllGather(ta, ta).ok());  // in place
  EXPECT_EQ(a, std::vector<float>({1, 2, 3, 4}));
  ASSERT_TRUE(c.Barrier().ok());
  ASSERT_TRUE(c.Synchronize().ok());
}

TEST(SelfCommTest, SendRecvToItselfCopies) {
  SelfComm c;
  std::vector<float> a = {1, 2, 3, 4}, b(4, 0);
  ASSERT_TRUE(
      c.SendRecv(Tensor(a.data(), DType::kF32, {4}), 0, Tensor(b.data(), DType::kF32, {2, 2}), 0)
          .ok());
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0.f);
  absl::StatusOr<Issued> issued =
      c.IssueSendRecv(Tensor(a.data(), DType::kF32, {4}), 0, Tensor(b.data(), DType::kF32, {4}), 0);
  ASSERT_TRUE(issued.ok()) << issued.status();
  ASSERT_TRUE(issued->Wait().ok());
  EXPECT_EQ(b, a);
}

TEST(SelfCommTest, RejectsMisuse) {
  SelfComm c;
  std::vector<float> a(4);
  std::vector<int32_t> i(4);
  Tensor ta(a.data(), DType::kF32, {4});
  EXPECT_EQ(c.AllGather(ta, Tensor(a.data(), DType::kF32, {3})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllToAll(ta, Tensor(i.data(), DType::kI32, {4})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Broadcast(ta, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllToAll(ta, ta).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllReduce(Tensor(a.data(), DType::kF32, {4}, Device::kCuda)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> b(3);
  Tensor tb(b.data(), DType::kF32, {3});
  absl::Status st = c.SendRecv(ta, 0, tb, 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("elements"), absl::string_view::npos) << st;
  EXPECT_EQ(c.SendRecv(ta, 1, Tensor(i.data(), DType::kF32, {4}), 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.SendRecv(ta, 0, Tensor(i.data(), DType::kI32, {4}), 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.SendRecv(ta, 0, ta, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Split(-1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  auto sub = c.Split(3, 7);
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ((*sub)->size(), 1);
}

}  // namespace
}  // namespace ithaca
