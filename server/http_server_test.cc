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
#include "server/metrics.h"

namespace ithaca {
namespace {

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// GET `path` on a fresh connection; the whole answer, or "" after `timeout`.
std::string Get(int port, const std::string& path, absl::Duration timeout = absl::Seconds(2)) {
  const int fd = Connect(port);
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  EXPECT_EQ(send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::string out;
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[65536];
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, n);
  }
  close(fd);
  return out;
}

TEST(HttpServerTest, ServesWhileManyIdleHalfRequestsHang) {
  Metrics metrics("node-1");
  auto http = MetricsHttp::Start({"127.0.0.1:0", &metrics, nullptr});
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = std::stoi((*http)->address().substr((*http)->address().rfind(':') + 1));
  EXPECT_NE(Get(port, "/healthz").find("HTTP/1.1 200 OK"), std::string::npos);

  // 200 connections that send half a request line and then nothing (4 would have stopped the
  // civetweb Exposer's threads for ~50 s).
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    idle.push_back(Connect(port));
    send(idle.back(), "GET /metr", 9, MSG_NOSIGNAL);
  }
  for (int round = 0; round < 3; ++round) {
    const absl::Time start = absl::Now();
    const std::string metrics_answer = Get(port, "/metrics");
    EXPECT_NE(metrics_answer.find("HTTP/1.1 200 OK"), std::string::npos) << round;
    EXPECT_NE(metrics_answer.find("ithaca_build_info"), std::string::npos) << round;
    EXPECT_NE(Get(port, "/healthz").find("HTTP/1.1 200 OK"), std::string::npos) << round;
    EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << round;
    // The attacker reconnects.
    close(idle[round]);
    idle[round] = Connect(port);
    send(idle[round], "GET /", 5, MSG_NOSIGNAL);
  }
  EXPECT_NE(Get(port, "/nope").find("404"), std::string::npos);
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
  const int idle = Connect(port);
  std::vector<int> many;
  for (int i = 0; i < 20; ++i) many.push_back(Connect(port));
  EXPECT_NE(Get(port, "/healthz").find("200 OK"), std::string::npos);
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
