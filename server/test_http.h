// Raw loopback HTTP for the tests of /metrics and /healthz (http_server_test, load_test): a
// plain TCP connection, and a GET that reads the whole answer.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/time/clock.h"

namespace ithaca {

// A connection to 127.0.0.1:port (the caller closes it).
inline int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// GET `path` on a fresh connection; the whole answer, or "" after `timeout`.
inline std::string HttpGet(int port, const std::string& path,
                           absl::Duration timeout = absl::Seconds(2)) {
  const int fd = ConnectLoopback(port);
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

}  // namespace ithaca
