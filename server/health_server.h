// The plaintext health server of ithacad --health-listen.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ithaca {

// grpc.health.v1 alone, plaintext and without a token, for probes that cannot do TLS: it tells
// SERVING or NOT_SERVING, nothing else.
class HealthServer {
 public:
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& address) {
    auto h = std::unique_ptr<HealthServer>(new HealthServer);
    grpc::ServerBuilder hb;
    hb.AddListeningPort(address, grpc::InsecureServerCredentials());
    h->queue_ = hb.AddCompletionQueue();
    h->server_ = hb.BuildAndStart();
    if (!h->server_) {
      return absl::UnavailableError(absl::StrCat("--health-listen: cannot listen on ", address));
    }
    // The health service is the server's only one and runs on a queue of its own; gRPC still
    // wants a polled queue for calls no service takes, which this thread drains.
    h->poller_ = std::thread([q = h->queue_.get()] {
      void* tag;
      bool ok;
      while (q->Next(&tag, &ok)) {
      }
    });
    return h;
  }
  ~HealthServer() {
    server_->Shutdown(std::chrono::system_clock::now());
    queue_->Shutdown();
    poller_.join();
  }
  void SetServing(bool serving) { server_->GetHealthCheckService()->SetServingStatus(serving); }

 private:
  HealthServer() = default;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::thread poller_;
};

}  // namespace ithaca
