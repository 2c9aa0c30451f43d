// A small HTTP/1.x server for GET /metrics and GET /healthz that idle or slow clients cannot
// stall: one thread polls every connection without blocking, each connection has a deadline
// (request read and answer sent within `timeout`, else it is closed), and past
// `max_connections` the oldest is dropped for a new one. A thread-per-connection server (the
// civetweb Exposer had 4 threads) is stopped by as many clients sending half a request line.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "engine/core/status.h"

namespace ithaca {

class HttpServer {
 public:
  struct Response {
    int code = 200;
    std::string content_type = "text/plain; version=0.0.4; charset=utf-8";
    std::string body;
  };
  // Called on the server's thread for a GET of a registered path (query string removed).
  using Handler = std::function<Response()>;

  struct Options {
    std::string listen = "127.0.0.1:0";  // host:port; port 0 picks one
    std::map<std::string, Handler> handlers;
    absl::Duration timeout = absl::Seconds(5);
    int max_connections = 256;
  };

  // UNAVAILABLE naming the address when it cannot listen; INVALID_ARGUMENT for a bad address.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(Options options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  HttpServer(Options options, int listen_fd, int port, int wake_fd);
  void Loop();

  Options options_;
  int listen_fd_, port_, wake_fd_[2];
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ithaca
