#include "server/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ithaca {
namespace {

constexpr size_t kMaxRequestBytes = 8192;

struct Connection {
  int fd = -1;
  absl::Time deadline;
  std::string in, out;
  size_t sent = 0;
  bool answering = false;
};

const char* Reason(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    default:
      return "Error";
  }
}

std::string Serialize(const HttpServer::Response& r, bool head) {
  return absl::StrCat("HTTP/1.1 ", r.code, " ", Reason(r.code),
                      "\r\nContent-Type: ", r.content_type, "\r\nContent-Length: ", r.body.size(),
                      "\r\nConnection: close\r\n\r\n", head ? "" : r.body);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(Options options) {
  const std::string& listen = options.listen;
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(listen, ": expected host:port"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    return absl::UnavailableError(absl::StrCat(listen, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      error = strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return absl::UnavailableError(absl::StrCat(listen, ": ", error));
  sockaddr_storage bound = {};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int actual =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("pipe: ", strerror(errno)));
  }
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(options), fd, actual, wake[0]));
  server->wake_fd_[1] = wake[1];
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

HttpServer::HttpServer(Options options, int listen_fd, int port, int wake_fd)
    : options_(std::move(options)), listen_fd_(listen_fd), port_(port), wake_fd_{wake_fd, -1} {}

HttpServer::~HttpServer() {
  stop_ = true;
  if (wake_fd_[1] >= 0) (void)!write(wake_fd_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_fd_[0]);
  if (wake_fd_[1] >= 0) close(wake_fd_[1]);
}

void HttpServer::Loop() {
  std::list<Connection> conns;  // oldest first
  auto answer = [&](Connection& c) {
    // "GET /path?query HTTP/1.1"
    const std::string line = c.in.substr(0, c.in.find("\r\n"));
    const size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
    Response r;
    bool head = false;
    if (sp1 == std::string::npos || sp2 == sp1 || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
      r.code = 400;
      r.body = "bad request line\n";
    } else {
      const std::string method = line.substr(0, sp1);
      std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
      path = path.substr(0, path.find('?'));
      head = method == "HEAD";
      auto it = options_.handlers.find(path);
      if (method != "GET" && !head) {
        r.code = 405;
        r.body = "only GET\n";
      } else if (it == options_.handlers.end()) {
        r.code = 404;
        r.body = "not found\n";
      } else {
        r = it->second();
      }
    }
    c.out = Serialize(r, head);
    c.answering = true;
    shutdown(c.fd, SHUT_RD);
  };
  std::vector<pollfd> fds;
  std::vector<Connection*> polled;
  while (!stop_) {
    fds.clear();
    polled.clear();
    fds.push_back({wake_fd_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    absl::Time next = absl::InfiniteFuture();
    for (Connection& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
      polled.push_back(&c);
      next = std::min(next, c.deadline);
    }
    const int wait_ms = next == absl::InfiniteFuture()
                            ? -1
                            : static_cast<int>(std::max<int64_t>(
                                  0, absl::ToInt64Milliseconds(next - absl::Now()) + 1));
    if (poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) break;
    if (stop_) break;
    std::vector<Connection*> done;
    for (size_t i = 2; i < fds.size(); ++i) {
      Connection& c = *polled[i - 2];
      if (fds[i].revents == 0) continue;
      if (!c.answering) {
        char buf[4096];
        const ssize_t n = read(c.fd, buf, sizeof(buf));
        if (n <= 0) {
          if (n == 0 || (errno != EAGAIN && errno != EINTR)) done.push_back(&c);
          continue;
        }
        c.in.append(buf, n);
        if (c.in.find("\r\n\r\n") != std::string::npos || c.in.find("\n\n") != std::string::npos) {
          answer(c);
        } else if (c.in.size() > kMaxRequestBytes) {
          c.out = Serialize({431, "text/plain", "request too large\n"}, false);
          c.answering = true;
        }
      } else {
        const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
          done.push_back(&c);
        } else if (n > 0) {
          c.sent += static_cast<size_t>(n);
          if (c.sent == c.out.size()) done.push_back(&c);
        }
      }
    }
    const absl::Time now = absl::Now();
    for (Connection& c : conns) {
      if (now > c.deadline) done.push_back(&c);  // too slow to ask, or to read the answer
    }
    for (Connection* c : done) c->fd = c->fd >= 0 ? (close(c->fd), -2) : c->fd;
    conns.remove_if([](const Connection& c) { return c.fd == -2; });
    if (fds[1].revents & POLLIN) {
      while (true) {
        const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          // Out of descriptors: the oldest connection makes room (else the pending one would
          // keep the listener readable and this loop would spin).
          if ((errno == EMFILE || errno == ENFILE) && !conns.empty()) {
            close(conns.front().fd);
            conns.pop_front();
            continue;
          }
          break;
        }
        if (static_cast<int>(conns.size()) >= options_.max_connections) {
          close(conns.front().fd);  // the oldest makes room: it has waited longest
          conns.pop_front();
        }
        Connection c;
        c.fd = fd;
        c.deadline = absl::Now() + options_.timeout;
        conns.push_back(std::move(c));
      }
    }
  }
  for (Connection& c : conns) close(c.fd);
}

}  // namespace ithaca
