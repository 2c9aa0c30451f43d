#include "engine/comm/tcp_store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "engine/comm/rendezvous.h"

namespace ithaca {
namespace {

std::unique_ptr<TcpStoreServer> StartServer() {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(*server);
}

std::unique_ptr<TcpStoreClient> ConnectTo(const TcpStoreServer& server, double timeout_s = 5) {
  auto client = TcpStoreClient::Connect("127.0.0.1", server.port(), timeout_s);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(*client);
}

TEST(TcpStoreTest, SetThenGetAcrossClients) {
  auto server = StartServer();
  auto a = ConnectTo(*server), b = ConnectTo(*server);
  ASSERT_TRUE(a->Set("k", std::string("v\0w", 3)).ok());
  auto v = b->Get("k", 1);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("v\0w", 3));
  auto again = a->Set("k", "other");
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_TRUE(absl::StrContains(again.message(), "\"k\"")) << again;
  EXPECT_TRUE(absl::IsNotFound(b->TryGet("missing").status()));
}

TEST(TcpStoreTest, GetWaitsForALaterSet) {
  auto server = StartServer();
  auto a = ConnectTo(*server), b = ConnectTo(*server);
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(a->Set("late", "here").ok());
  });
  auto v = b->Get("late", 5);
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "here");
}

TEST(TcpStoreTest, GetTimesOutNamingTheKey) {
  auto server = StartServer();
  auto a = ConnectTo(*server);
  const auto start = std::chrono::steady_clock::now();
  auto v = a->Get("never", 0.3);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), "\"never\"")) << v.status();
  EXPECT_LT(took, 3);
  // The connection still works after a timeout.
  EXPECT_TRUE(a->Set("after", "1").ok());
}

TEST(TcpStoreTest, ARegisteredNodeThatVanishesFailsWaitersNamingIt) {
  auto server = StartServer();
  auto waiter = ConnectTo(*server);
  auto node = ConnectTo(*server);
  ASSERT_TRUE(node->Register("node 1 (host-b)").ok());
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    node.reset();  // the connection drops without a goodbye
  });
  auto v = waiter->Get("never", 10);
  killer.join();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kAborted) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), "node 1 (host-b)")) << v.status();
  EXPECT_TRUE(absl::StrContains(server->Failure(), "node 1 (host-b)")) << server->Failure();
  auto failed = waiter->TryGet(kFailedKey);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_TRUE(absl::StrContains(*failed, "lost its connection")) << *failed;
}

TEST(TcpStoreTest, AFinishedNodeLeavesCleanly) {
  auto server = StartServer();
  auto node = ConnectTo(*server);
  ASSERT_TRUE(node->Register("node 1").ok());
  ASSERT_TRUE(node->Finish().ok());
  node.reset();
  auto probe = ConnectTo(*server);
  EXPECT_TRUE(probe->Set("x", "y").ok());  // a round trip: the drop has been seen by now
  EXPECT_EQ(server->Failure(), "");
  EXPECT_EQ(server->Finished(), std::vector<std::string>{"node 1"});
}

TEST(TcpStoreTest, TheServerGoingAwayIsAnErrorNotAHang) {
  auto server = StartServer();
  auto a = ConnectTo(*server);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    server.reset();
  });
  auto v = a->Get("never", 30);
  stopper.join();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable) << v.status();
  EXPECT_TRUE(absl::StrContains(v.status().message(), "node 0")) << v.status();
}

TEST(TcpStoreTest, AnOversizedFrameDropsOnlyThatConnection) {
  auto server = StartServer();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server->port()));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const unsigned char huge[4] = {0xff, 0xff, 0xff, 0x7f};
  ASSERT_EQ(::send(fd, huge, 4, 0), 4);
  char c;
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0);  // closed by the server
  ::close(fd);
  auto a = ConnectTo(*server);
  EXPECT_TRUE(a->Set("still", "serving").ok());
}

TEST(TcpStoreTest, ConnectTimesOutWhenNobodyListens) {
  auto server = StartServer();
  const int port = server->port();
  server.reset();
  auto c = TcpStoreClient::Connect("127.0.0.1", port, 0.5);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  EXPECT_TRUE(absl::StrContains(c.status().message(), absl::StrCat(":", port))) << c.status();
}

TEST(RendezvousTest, ParsesTcpAddresses) {
  auto r = ParseRendezvous("tcp:node-0.ithaca:29500");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, Rendezvous::Kind::kTcp);
  EXPECT_EQ(r->host, "node-0.ithaca");
  EXPECT_EQ(r->port, 29500);
  for (const char* bad : {"tcp:host", "tcp::1", "tcp:host:0", "tcp:host:99999", "tcp:host:x"}) {
    EXPECT_EQ(ParseRendezvous(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(RendezvousTest, PublishAndWaitOverTcp) {
  auto server = StartServer();
  auto r = ParseRendezvous(absl::StrCat("tcp:127.0.0.1:", server->port()));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(PublishRendezvousValue(*r, "nccl-id", "123", 5).ok());
  auto v = WaitRendezvousValue(*r, "nccl-id", 5);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "123");
  EXPECT_FALSE(PublishRendezvousValue(*r, "nccl-id", "456", 5).ok());
}

}  // namespace
}  // namespace ithaca
