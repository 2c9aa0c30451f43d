// /metrics and /healthz with real sockets: idle half-request connections (slowloris) do not stall
// them; a reconnecting attacker neither.
#include "server/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "absl/time/clock.h"
#include "server/test_http.h"
#include "server/metrics.h"

namespace ithaca {
namespace {

TEST(HttpServerTest, ServesWhileManyIdleHalfRequestsHang) {
  Metrics metrics("node-1");
  auto http = MetricsHttp::Start({"127.0.0.1:0", &metrics, nullptr});
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = std::stoi((*http)->address().substr((*http)->address().rfind(':') + 1));
  EXPECT_NE(HttpGet(port, "/healthz").find("HTTP/1.1 200 OK"), std::string::npos);

  // 200 connections that send half a request line and then nothing (4 would have stopped the
  // civetweb Exposer's threads for ~50 s).
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    idle.push_back(ConnectLoopback(port));
    send(idle.back(), "GET /metr", 9, MSG_NOSIGNAL);
  }
  for (int round = 0; round < 3; ++round) {
    const absl::Time start = absl::Now();
    const std::string metrics_answer = HttpGet(port, "/metrics");
    EXPECT_NE(metrics_answer.find("HTTP/1.1 200 OK"), std::string::npos) << round;
    EXPECT_NE(metrics_answer.find("ithaca_build_info"), std::string::npos) << round;
    EXPECT_NE(HttpGet(port, "/healthz").find("HTTP/1.1 200 OK"), std::string::npos) << round;
    EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << round;
    // The attacker reconnects.
    close(idle[round]);
    idle[round] = ConnectLoopback(port);
    send(idle[round], "GET /", 5, MSG_NOSIGNAL);
  }
  EXPECT_NE(HttpGet(port, "/nope").find("404"), std::string::npos);
  for (int fd : idle) close(fd);
}

// A connection that asks nothing is closed at the deadline; past max_connections the oldest
// makes room, so new clients are always served.
TEST(HttpServerTest, IdleConnectionsAreClosedAndBounded) {
  HttpServer::Options o;
  o.handlers["/healthz"] = [] { return HttpServer::Response{}; };
  o.timeout = absl::Milliseconds(300);
  o.max_connections = 8;
  auto server = HttpServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const int idle = ConnectLoopback(port);
  std::vector<int> many;
  for (int i = 0; i < 20; ++i) many.push_back(ConnectLoopback(port));
  EXPECT_NE(HttpGet(port, "/healthz").find("200 OK"), std::string::npos);
  pollfd p = {idle, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 2000), 1) << "closed by the server";
  char c;
  EXPECT_EQ(read(idle, &c, 1), 0);
  close(idle);
  for (int fd : many) close(fd);
  EXPECT_FALSE(HttpServer::Start({"127.0.0.1:99999"}).ok());
}

}  // namespace
}  // namespace ithaca
