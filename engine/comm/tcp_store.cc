#include "engine/comm/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/numbers.h"

namespace ithaca {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxFrameBytes = kMaxValueBytes + kMaxKeyBytes + 64;

enum Op : char { kSet = 'S', kGet = 'G', kTryGet = 'T', kRegister = 'R', kFinish = 'F' };
enum Reply : char { kOk = 0, kNotFound = 1, kDeadline = 2, kAborted = 3, kRefused = 4 };

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

void PutString(std::string* out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}

// Reads the next length-prefixed string of `payload` at `*pos`; false when it runs past the end.
bool TakeString(const std::string& payload, size_t* pos, std::string* s) {
  if (payload.size() - *pos < 4) return false;
  const uint32_t n = GetU32(payload.data() + *pos);
  *pos += 4;
  if (payload.size() - *pos < n) return false;
  s->assign(payload, *pos, n);
  *pos += n;
  return true;
}

std::string Frame(const std::string& payload) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(payload.size()));
  return out + payload;
}

std::string ReplyFrame(Reply status, const std::string& body) {
  std::string payload(1, static_cast<char>(status));
  payload += body;
  return Frame(payload);
}

// Sends all of `data`; false if the peer is gone or the send timed out (SO_SNDTIMEO).
bool SendAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

double Remaining(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

Clock::time_point DeadlineAfter(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, seconds)));
}

}  // namespace

// ---- Server

struct TcpStoreServer::State {
  struct Conn {
    std::string in;         // bytes received, not yet a whole frame
    std::string name;       // set by Register: a node whose drop is a failure
    bool finished = false;  // said goodbye
    bool waiting = false;   // a Get is pending
    std::string wait_key;
    Clock::time_point wait_deadline;
  };
  mutable std::mutex mu;  // guards what the accessors read: kv, registered, finished
  std::map<std::string, std::string> kv;
  std::vector<std::string> registered, done;
  std::map<int, Conn> conns;  // only the serving thread touches these
  std::string address;        // "host:port" or "port N", for messages
};

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& host,
                                                                      int port) {
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  s->state_ = std::make_unique<State>();
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("rendezvous: socket: ", std::strerror(errno)));
  s->listen_fd_ = fd;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string bind_host = host.empty() ? "0.0.0.0" : host;
  if (::inet_pton(AF_INET, bind_host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous: cannot listen on \"", bind_host, "\": not an IPv4 address"));
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 256) != 0) {
    return absl::UnavailableError(absl::StrCat("rendezvous: cannot listen on ", bind_host, ":",
                                               port, ": ", std::strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  s->port_ = ntohs(addr.sin_port);
  s->state_->address = bind_host == "0.0.0.0" ? absl::StrCat("port ", s->port_)
                                              : absl::StrCat(bind_host, ":", s->port_);
  if (::pipe2(s->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::InternalError(absl::StrCat("rendezvous: pipe: ", std::strerror(errno)));
  }
  s->thread_ = std::thread([srv = s.get()] { srv->Serve(); });
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  if (thread_.joinable()) {
    char c = 0;
    ssize_t ignored = ::write(wake_[1], &c, 1);
    (void)ignored;
    thread_.join();
  }
  if (state_) {
    for (auto& [fd, conn] : state_->conns) ::close(fd);
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

std::vector<std::string> TcpStoreServer::Registered() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->registered;
}

std::vector<std::string> TcpStoreServer::Finished() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

std::string TcpStoreServer::Failure() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->kv.find(kFailedKey);
  return it == state_->kv.end() ? "" : it->second;
}

void TcpStoreServer::Serve() {
  State& st = *state_;
  std::set<int> closing;
  auto failure = [&]() -> std::string {
    auto it = st.kv.find(kFailedKey);
    return it == st.kv.end() ? "" : it->second;
  };
  auto reply = [&](int fd, Reply status, const std::string& body) {
    if (!SendAll(fd, ReplyFrame(status, body))) closing.insert(fd);
  };
  // After any change: answer the Gets that can be answered now.
  auto settle = [&] {
    const std::string failed = failure();
    const auto now = Clock::now();
    for (auto& [fd, c] : st.conns) {
      if (!c.waiting) continue;
      auto it = st.kv.find(c.wait_key);
      if (it != st.kv.end()) {
        c.waiting = false;
        reply(fd, kOk, it->second);
      } else if (!failed.empty() && c.wait_key != kFailedKey) {
        c.waiting = false;
        reply(fd, kAborted, failed);
      } else if (now >= c.wait_deadline) {
        c.waiting = false;
        reply(fd, kDeadline, absl::StrCat("key \"", c.wait_key, "\" was not set in time"));
      }
    }
  };
  auto handle = [&](int fd, State::Conn& c, const std::string& payload) {
    if (payload.empty()) return reply(fd, kRefused, "empty request");
    size_t pos = 1;
    std::string key, arg;
    if (!TakeString(payload, &pos, &key) || key.size() > kMaxKeyBytes) {
      return reply(fd, kRefused, "malformed request");
    }
    std::lock_guard<std::mutex> lock(st.mu);
    switch (payload[0]) {
      case kSet: {
        if (!TakeString(payload, &pos, &arg)) return reply(fd, kRefused, "malformed set");
        if (st.kv.count(key) != 0) {
          return reply(fd, kRefused, absl::StrCat("key \"", key, "\" is already set"));
        }
        st.kv[key] = arg;
        return reply(fd, kOk, "");
      }
      case kGet: {
        int64_t ms = 0;
        if (!TakeString(payload, &pos, &arg) || !absl::SimpleAtoi(arg, &ms)) {
          return reply(fd, kRefused, "malformed get");
        }
        c.waiting = true;
        c.wait_key = key;
        c.wait_deadline = Clock::now() + std::chrono::milliseconds(ms);
        return;  // settle answers it
      }
      case kTryGet: {
        auto it = st.kv.find(key);
        if (it == st.kv.end()) return reply(fd, kNotFound, "");
        return reply(fd, kOk, it->second);
      }
      case kRegister:
        c.name = key;
        st.registered.push_back(key);
        return reply(fd, kOk, "");
      case kFinish:
        c.finished = true;
        if (!c.name.empty()) st.done.push_back(c.name);
        return reply(fd, kOk, "");
      default:
        return reply(fd, kRefused, "unknown request");
    }
  };
  // A registered node whose connection drops without a goodbye is a dead node.
  auto drop = [&](int fd) {
    auto it = st.conns.find(fd);
    if (it == st.conns.end()) return;
    if (!it->second.name.empty() && !it->second.finished) {
      std::lock_guard<std::mutex> lock(st.mu);
      if (st.kv.count(kFailedKey) == 0) {
        st.kv[kFailedKey] =
            absl::StrCat(it->second.name, " lost its connection to the rendezvous at ", st.address,
                         " (the node died, or its launcher was killed)");
      }
    }
    ::close(fd);
    st.conns.erase(it);
  };

  while (true) {
    std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    int timeout_ms = 1000;
    for (auto& [fd, c] : st.conns) {
      fds.push_back({fd, POLLIN, 0});
      if (c.waiting) {
        const double left = Remaining(c.wait_deadline);
        timeout_ms = std::min<int>(timeout_ms, std::max(0, static_cast<int>(left * 1000) + 1));
      }
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;  // shutting down
    if (fds[1].revents & POLLIN) {
      const int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        const int one = 1;
        ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        timeval tv = {10, 0};  // a client that stops reading cannot stall the store for long
        ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        st.conns[c] = State::Conn();
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int fd = fds[i].fd;
      State::Conn& c = st.conns[fd];
      char buf[65536];
      ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        closing.insert(fd);
        continue;
      }
      c.in.append(buf, static_cast<size_t>(n));
      while (c.in.size() >= 4) {
        const uint32_t len = GetU32(c.in.data());
        if (len > kMaxFrameBytes) {  // not our protocol, or a broken client
          closing.insert(fd);
          break;
        }
        if (c.in.size() < 4 + len) break;
        const std::string payload = c.in.substr(4, len);
        c.in.erase(0, 4 + len);
        handle(fd, c, payload);
      }
    }
    for (int fd : closing) drop(fd);
    closing.clear();
    {
      std::lock_guard<std::mutex> lock(st.mu);
      settle();
    }
    for (int fd : closing) drop(fd);
    closing.clear();
  }
}

// ---- Client

absl::StatusOr<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(const std::string& host,
                                                                        int port,
                                                                        double timeout_s) {
  std::unique_ptr<TcpStoreClient> c(new TcpStoreClient());
  c->host_ = host;
  c->port_ = port;
  c->timeout_s_ = timeout_s;
  const auto deadline = DeadlineAfter(timeout_s);
  std::string last_error;
  while (true) {
    addrinfo hints = {};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    // A name that does not resolve yet (a Kubernetes pod's DNS record appears once it runs) is
    // retried like a refused connection.
    const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0) {
      last_error = absl::StrCat("cannot resolve ", host, ": ", ::gai_strerror(gai));
    } else {
      const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->fd_ = fd;
        return c;
      }
      last_error = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      ::freeaddrinfo(res);
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("cannot reach ", c->Describe(), " within ", timeout_s, " s (", last_error,
                       "): is node 0's launcher running, and is the address right?"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStoreClient::LocalAddress() const {
  sockaddr_in addr = {};
  socklen_t len = sizeof(addr);
  char text[INET_ADDRSTRLEN] = {};
  if (fd_ < 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text)) == nullptr) {
    return "";
  }
  return text;
}

std::string TcpStoreClient::Describe() const {
  return absl::StrCat("the rendezvous at ", host_, ":", port_);
}

absl::StatusOr<std::string> TcpStoreClient::Call(const std::string& request,
                                                 double reply_timeout_s) {
  std::lock_guard<std::mutex> lock(mu_);
  auto lost = [&](const std::string& why) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return absl::UnavailableError(
        absl::StrCat(Describe(), " ", why, " (node 0, which serves it, died or was unreachable)"));
  };
  if (fd_ < 0) return lost("is no longer connected");
  if (!SendAll(fd_, Frame(request))) return lost("closed the connection");
  const auto deadline = DeadlineAfter(reply_timeout_s);
  std::string in;
  while (true) {
    if (in.size() >= 4) {
      const uint32_t len = GetU32(in.data());
      if (len == 0 || len > kMaxFrameBytes) return lost("sent a malformed reply");
      if (in.size() >= 4 + len) {
        const char status = in[4];
        std::string body = in.substr(5, len - 1);
        switch (status) {
          case kOk:
            return body;
          case kNotFound:
            return absl::NotFoundError(body);
          case kDeadline:
            return absl::DeadlineExceededError(body);
          case kAborted:
            return absl::AbortedError(body);
          default:
            return absl::FailedPreconditionError(body);
        }
      }
    }
    const double left = Remaining(deadline);
    if (left <= 0) return lost(absl::StrCat("did not answer within ", reply_timeout_s, " s"));
    pollfd p = {fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (r < 0 && errno != EINTR) return lost(std::strerror(errno));
    if (r <= 0) continue;
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return lost("closed the connection");
    in.append(buf, static_cast<size_t>(n));
  }
}

absl::Status TcpStoreClient::Set(const std::string& key, const std::string& value) {
  if (key.empty() || key.size() > kMaxKeyBytes || value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous: key \"", key.substr(0, 64),
                                                   "\" or its value (", value.size(),
                                                   " bytes) is empty or too large"));
  }
  std::string req(1, kSet);
  PutString(&req, key);
  PutString(&req, value);
  absl::StatusOr<std::string> r = Call(req, timeout_s_);
  if (!r.ok()) {
    return absl::Status(r.status().code(), absl::StrCat("rendezvous: setting \"", key, "\" at ",
                                                        Describe(), ": ", r.status().message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpStoreClient::Get(const std::string& key, double timeout_s) {
  if (key.empty() || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError("rendezvous: empty or oversized key");
  }
  std::string req(1, kGet);
  PutString(&req, key);
  PutString(&req, std::to_string(static_cast<int64_t>(timeout_s * 1000)));
  // The server answers at the deadline itself; the margin covers the network.
  absl::StatusOr<std::string> r = Call(req, timeout_s + 10);
  if (!r.ok()) {
    std::string text = absl::StrCat("rendezvous: waiting for \"", key, "\" at ", Describe(), ": ",
                                    r.status().message());
    if (absl::IsDeadlineExceeded(r.status())) {
      absl::StrAppend(&text, " (", timeout_s, " s: did every node start, with the same --nnodes?)");
    }
    return absl::Status(r.status().code(), text);
  }
  return r;
}

absl::StatusOr<std::string> TcpStoreClient::TryGet(const std::string& key) {
  std::string req(1, kTryGet);
  PutString(&req, key);
  return Call(req, timeout_s_);
}

absl::Status TcpStoreClient::Register(const std::string& name) {
  std::string req(1, kRegister);
  PutString(&req, name);
  return Call(req, timeout_s_).status();
}

absl::Status TcpStoreClient::Finish() {
  std::string req(1, kFinish);
  PutString(&req, "-");
  return Call(req, timeout_s_).status();
}

}  // namespace ithaca
