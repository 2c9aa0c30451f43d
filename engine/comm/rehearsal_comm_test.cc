// RehearsalComm on the host: the copies of the real sizes, the groups the split rule gives, the
// link model's time counted per collective, and misuse refused.
#include "engine/comm/rehearsal_comm.h"

#include <vector>

#include "gtest/gtest.h"

namespace ithaca {
namespace {

RehearsalLayout Layout(int world, int nodes, int sp) {
  RehearsalLayout l;
  l.world = world;
  l.nodes = nodes;
  auto link = LinkPreset("h200-sxm");
  l.link = *link;
  l.split = [sp](int r) { return SplitArgs{r / sp, r}; };
  return l;
}

std::unique_ptr<RehearsalComm> Make(int rank, const RehearsalLayout& l) {
  auto c = RehearsalComm::Create(rank, l, HostRehearsalDevice());
  EXPECT_TRUE(c.ok()) << c.status();
  return std::move(*c);
}

TEST(RehearsalCommTest, CollectivesAreLocalCopiesOfTheRealSizes) {
  auto c = Make(2, Layout(4, 1, 4));
  EXPECT_EQ(c->rank(), 2);
  EXPECT_EQ(c->size(), 4);
  // All-gather: every slot is this rank's shard.
  std::vector<float> shard = {5, 6}, all(8, 0);
  ASSERT_TRUE(
      c->AllGather(Tensor(shard.data(), DType::kF32, {2}), Tensor(all.data(), DType::kF32, {8}))
          .ok());
  EXPECT_EQ(all, std::vector<float>({5, 6, 5, 6, 5, 6, 5, 6}));
  // Reduce-scatter: this rank's chunk, unsummed.
  std::vector<float> in = {0, 1, 2, 3, 4, 5, 6, 7}, out(2, 0);
  ASSERT_TRUE(
      c->ReduceScatter(Tensor(in.data(), DType::kF32, {8}), Tensor(out.data(), DType::kF32, {2}))
          .ok());
  EXPECT_EQ(out, std::vector<float>({4, 5}));
  // All-to-all: a copy.
  std::vector<float> a2a(8, 0);
  auto issued =
      c->IssueAllToAll(Tensor(in.data(), DType::kF32, {8}), Tensor(a2a.data(), DType::kF32, {8}));
  ASSERT_TRUE(issued.ok());
  ASSERT_TRUE(issued->Wait().ok());
  EXPECT_EQ(a2a, in);
  // All-reduce and broadcast leave x.
  ASSERT_TRUE(c->AllReduce(Tensor(in.data(), DType::kF32, {8})).ok());
  ASSERT_TRUE(c->Broadcast(Tensor(in.data(), DType::kF32, {8}), 3).ok());
  EXPECT_EQ(in, std::vector<float>({0, 1, 2, 3, 4, 5, 6, 7}));
  // In place: this rank's slot of the output is the input.
  std::vector<float> inplace = {0, 0, 0, 0, 9, 8, 0, 0};
  Tensor whole(inplace.data(), DType::kF32, {8});
  ASSERT_TRUE(c->AllGather(Tensor(inplace.data() + 4, DType::kF32, {2}), whole).ok());
  EXPECT_EQ(inplace, std::vector<float>({9, 8, 9, 8, 9, 8, 9, 8}));

  // The real checks: an all-gather's output must be size x the input.
  EXPECT_EQ(
      c->AllGather(Tensor(shard.data(), DType::kF32, {2}), Tensor(all.data(), DType::kF32, {6}))
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(RehearsalCommTest, CountsEachCollectiveWithTheLinkModel) {
  const RehearsalLayout l = Layout(8, 1, 8);
  auto c = Make(0, l);
  std::vector<float> x(1024, 1), y(8 * 1024);
  ASSERT_TRUE(
      c->AllGather(Tensor(x.data(), DType::kF32, {1024}), Tensor(y.data(), DType::kF32, {8 * 1024}))
          .ok());
  ASSERT_TRUE(c->AllReduce(Tensor(x.data(), DType::kF32, {1024})).ok());
  const RehearsalStats s = c->stats();
  const RehearsalCounts& ag = s.by_op[static_cast<int>(CollectiveOp::kAllGather)];
  EXPECT_EQ(ag.calls, 1);
  EXPECT_EQ(ag.bytes, 8 * 1024 * 4);
  EXPECT_DOUBLE_EQ(ag.modeled_s, CollectiveSeconds(l.link, CollectiveOp::kAllGather, 8 * 1024 * 4,
                                                   GroupShape{8, 1, 8}));
  EXPECT_EQ(s.calls(), 2);
  EXPECT_GT(s.modeled_s(), ag.modeled_s);
  c->ResetStats();
  EXPECT_EQ(c->stats().calls(), 0);
}

// A ring shift (dst = rank + 1, src = rank - 1) copies send into recv and is held for NVLink
// when the whole ring is on one node; on a ring over two nodes every member's shift waits for
// the hops over the NIC (SendRecvAcrossNodes), even where its own peers share its node. An
// exchange that is no shift takes this rank's own links.
TEST(RehearsalCommTest, SendRecvIsHeldForTheShiftsSlowestHop) {
  const RehearsalLayout one_node = Layout(8, 1, 8);
  const RehearsalLayout l = Layout(16, 2, 16);  // 8 ranks per node
  const int64_t n = 1 << 20, bytes = n * 4;
  std::vector<float> send(n), recv(n, 0);
  for (int64_t i = 0; i < n; ++i) send[i] = static_cast<float>(i % 251);
  const Tensor ts(send.data(), DType::kF32, {n}), tr(recv.data(), DType::kF32, {n});
  auto modeled = [&](RehearsalComm& c) {
    return c.stats().by_op[static_cast<int>(CollectiveOp::kSendRecv)].modeled_s;
  };

  auto inside = Make(3, one_node);  // 2 -> 3 -> 4, the ring all on node 0
  ASSERT_TRUE(inside->SendRecv(ts, 4, tr, 2).ok());
  EXPECT_EQ(recv, send);
  const RehearsalCounts sr = inside->stats().by_op[static_cast<int>(CollectiveOp::kSendRecv)];
  EXPECT_EQ(sr.calls, 1);
  EXPECT_EQ(sr.bytes, bytes);
  EXPECT_DOUBLE_EQ(sr.modeled_s, SendRecvSeconds(l.link, bytes, false));
  // Twice the bytes, more time.
  std::vector<float> big(2 * n), big_out(2 * n);
  inside->ResetStats();
  ASSERT_TRUE(inside
                  ->SendRecv(Tensor(big.data(), DType::kF32, {2 * n}), 4,
                             Tensor(big_out.data(), DType::kF32, {2 * n}), 2)
                  .ok());
  EXPECT_GT(modeled(*inside), sr.modeled_s);

  auto edge = Make(7, l);  // 6 -> 7 -> 8: the send crosses to node 1
  std::fill(recv.begin(), recv.end(), 0.f);
  auto issued = edge->IssueSendRecv(ts, 8, tr, 6);
  ASSERT_TRUE(issued.ok()) << issued.status();
  ASSERT_TRUE(issued->Wait().ok());
  EXPECT_EQ(recv, send);
  EXPECT_DOUBLE_EQ(modeled(*edge), SendRecvSeconds(l.link, bytes, true));
  EXPECT_GT(modeled(*edge), sr.modeled_s);
  auto first = Make(0, l);  // 15 -> 0 -> 1: the receive crosses from node 1
  ASSERT_TRUE(first->SendRecv(ts, 1, tr, 15).ok());
  EXPECT_DOUBLE_EQ(modeled(*first), modeled(*edge));
  auto middle = Make(3, l);  // 2 -> 3 -> 4 on node 0, but the shift's 7 -> 8 is not
  ASSERT_TRUE(middle->SendRecv(ts, 4, tr, 2).ok());
  EXPECT_DOUBLE_EQ(modeled(*middle), modeled(*edge));
  middle->ResetStats();
  ASSERT_TRUE(middle->SendRecv(ts, 4, tr, 1).ok());  // no shift: its own links, on node 0
  EXPECT_DOUBLE_EQ(modeled(*middle), sr.modeled_s);

  // To itself: a copy, no link time. Misuse is refused before anything is counted.
  auto self = Make(5, l);
  std::fill(recv.begin(), recv.end(), 0.f);
  ASSERT_TRUE(self->SendRecv(ts, 5, tr, 5).ok());
  EXPECT_EQ(recv, send);
  EXPECT_EQ(modeled(*self), 0);
  EXPECT_EQ(self->SendRecv(ts, 6, Tensor(recv.data(), DType::kF32, {n - 1}), 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(self->SendRecv(ts, 16, tr, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(self->SendRecv(ts, 5, tr, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(self->stats().calls(), 1);
}

TEST(RehearsalCommTest, SplitGivesTheRealGroups) {
  // 16 ranks on 2 nodes, Ulysses groups of 4: rank 6 is rank 2 of the group {4..7}, on node 0.
  auto c = Make(6, Layout(16, 2, 4));
  EXPECT_EQ(c->shape().nodes, 2);
  EXPECT_EQ(c->shape().ranks_per_node, 8);
  auto sp = c->Split(1, 6);
  ASSERT_TRUE(sp.ok()) << sp.status();
  EXPECT_EQ((*sp)->rank(), 2);
  EXPECT_EQ((*sp)->size(), 4);
  EXPECT_EQ(static_cast<RehearsalComm*>(sp->get())->shape().nodes, 1);
  // Groups of 16 over 4 nodes of 4: a group spans every node.
  auto wide = Make(5, Layout(16, 4, 16));
  auto all = wide->Split(0, 5);
  ASSERT_TRUE(all.ok());
  const GroupShape g = static_cast<RehearsalComm*>(all->get())->shape();
  EXPECT_EQ(g.ranks, 16);
  EXPECT_EQ(g.nodes, 4);
  EXPECT_EQ(g.ranks_per_node, 4);
  // The group's collectives count into the world's stats (one rank, one comm stream).
  std::vector<float> x(4), y(64);
  ASSERT_TRUE(
      (*all)
          ->AllGather(Tensor(x.data(), DType::kF32, {4}), Tensor(y.data(), DType::kF32, {64}))
          .ok());
  EXPECT_EQ(wide->stats().calls(), 1);
}

// A sequence-parallel group of 8 = u 4 x r 2 over 2 nodes of 4 splits again by the group rules:
// the Ulysses groups are the nodes, the rings cross them.
TEST(RehearsalCommTest, AGroupSplitsByTheGroupRules) {
  RehearsalLayout l = Layout(8, 2, 8);
  l.group_splits = {[](int i) {
                      return SplitArgs{i / 4, i % 4};
                    },
                    [](int i) {
                      return SplitArgs{i % 4, i / 4};
                    }};
  auto c = Make(5, l);
  auto sp = c->Split(0, 5);
  ASSERT_TRUE(sp.ok()) << sp.status();
  auto ulysses = (*sp)->Split(1, 1);
  ASSERT_TRUE(ulysses.ok()) << ulysses.status();
  EXPECT_EQ((*ulysses)->size(), 4);
  EXPECT_EQ((*ulysses)->rank(), 1);
  EXPECT_EQ(static_cast<RehearsalComm*>(ulysses->get())->shape().nodes, 1);
  auto ring = (*sp)->Split(1, 1);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ((*ring)->size(), 2);
  EXPECT_EQ((*ring)->rank(), 1);  // ranks 1 and 5
  EXPECT_EQ(static_cast<RehearsalComm*>(ring->get())->shape().nodes, 2);
  EXPECT_FALSE((*sp)->Split(0, 0).ok());       // a third split has no rule
  EXPECT_FALSE((*ulysses)->Split(0, 0).ok());  // nor has a split of a split
}

TEST(RehearsalCommTest, MisuseIsRefused) {
  EXPECT_FALSE(RehearsalComm::Create(4, Layout(4, 1, 4), HostRehearsalDevice()).ok());
  EXPECT_FALSE(RehearsalComm::Create(0, Layout(6, 4, 2), HostRehearsalDevice()).ok());
  auto c = Make(1, Layout(4, 1, 2));
  // Arguments other than the rule's.
  auto bad = c->Split(1, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rule gives it color 0"), absl::string_view::npos);
  EXPECT_FALSE(c->Split(-1, 1).ok());
  auto sp = c->Split(0, 1);
  ASSERT_TRUE(sp.ok());
  EXPECT_FALSE((*sp)->Split(0, 1).ok());  // a group does not split again
  RehearsalLayout no_rule = Layout(4, 1, 2);
  no_rule.split = nullptr;
  auto plain = Make(0, no_rule);
  EXPECT_FALSE(plain->Split(0, 0).ok());
}

}  // namespace
}  // namespace ithaca
