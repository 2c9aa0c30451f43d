#include "worker/node_link.h"

#include <unistd.h>

#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/comm/rendezvous.h"

namespace ithaca {
namespace {

std::string ThisHost() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NodeLink>> NodeLink::Join(const LaunchOptions& o) {
  ASSIGN_OR_RETURN(Rendezvous rdzv, ParseRendezvous(o.rendezvous));
  if (rdzv.kind != Rendezvous::Kind::kTcp) {
    return absl::InvalidArgumentError(absl::StrCat("launcher: --rendezvous ", o.rendezvous,
                                                   ": ranks on several nodes need tcp:HOST:PORT"));
  }
  std::unique_ptr<NodeLink> link(new NodeLink());
  link->options_ = &o;
  link->name_ = absl::StrCat("node ", o.node_rank, " (", ThisHost(), ")");
  if (o.node_rank == 0) {
    auto server = TcpStoreServer::Start("0.0.0.0", rdzv.port);
    if (!server.ok()) {
      return absl::Status(server.status().code(),
                          absl::StrCat("launcher (node 0): ", server.status().message()));
    }
    link->server_ = std::move(*server);
  }
  auto client = TcpStoreClient::Connect(rdzv.host, rdzv.port, o.rendezvous_timeout_s);
  if (!client.ok()) {
    return absl::Status(client.status().code(),
                        absl::StrCat("launcher (", link->name_, "): ", client.status().message()));
  }
  link->client_ = std::move(*client);
  RETURN_IF_ERROR(link->client_->Register(link->name_));
  link->joined_by_ = Clock::now() + std::chrono::milliseconds(
                                        static_cast<int64_t>(o.rendezvous_timeout_s * 1000.0));
  return link;
}

std::string NodeLink::RemoteFailure(bool now) {
  if (!now && Clock::now() < next_poll_) return "";
  next_poll_ = Clock::now() + std::chrono::milliseconds(200);
  if (server_ != nullptr && Clock::now() > joined_by_ && !all_joined_) {
    std::string missing = MissingNodes();
    all_joined_ = missing.empty();
    if (!all_joined_) {
      const std::string what = absl::StrCat(missing, " did not join ", client_->Describe(),
                                            " within ", options_->rendezvous_timeout_s,
                                            " s (did every node's launcher start, with --nnodes ",
                                            options_->nnodes, " and the same --rendezvous?)");
      client_->Set(kFailedKey, what).IgnoreError();
      return what;
    }
  }
  absl::StatusOr<std::string> failed = client_->TryGet(kFailedKey);
  if (failed.ok()) return *failed;
  if (absl::IsNotFound(failed.status())) return "";
  return absl::StrCat("node 0, which serves ", client_->Describe(), ", vanished (",
                      failed.status().message(), ")");
}

std::string NodeLink::ReportFailure(const std::string& what) {
  // A local rank that fails because a peer on another node vanished usually fails a moment
  // after the peer's launcher connection dropped: give the store that moment to say so.
  const auto until = Clock::now() + std::chrono::milliseconds(500);
  while (Clock::now() < until) {
    std::string remote = RemoteFailure(/*now=*/true);
    if (!remote.empty()) return remote;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string mine = absl::StrCat(name_, ": ", what);
  if (client_->Set(kFailedKey, mine).ok()) return "";
  return RemoteFailure(/*now=*/true);
}

void NodeLink::Announce(const std::string& what) {
  client_->Set(kFailedKey, absl::StrCat(name_, ": ", what)).IgnoreError();
}

absl::Status NodeLink::Finish() {
  RETURN_IF_ERROR(client_->Finish());
  if (server_ == nullptr) return absl::OkStatus();
  const auto deadline =
      Clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(options_->rendezvous_timeout_s * 1000.0));
  while (static_cast<int>(server_->Finished().size()) < options_->nnodes) {
    const std::string failed = server_->Failure();
    if (!failed.empty()) return absl::AbortedError(failed);
    if (Clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("launcher (node 0): this node's ranks finished, but not every node's "
                       "launcher said goodbye within ",
                       options_->rendezvous_timeout_s, " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::OkStatus();
}

std::string NodeLink::MissingNodes() const {
  std::vector<std::string> missing;
  const std::vector<std::string> joined = server_->Registered();
  for (int n = 0; n < options_->nnodes; ++n) {
    const std::string prefix = absl::StrCat("node ", n, " ");
    bool found = false;
    for (const std::string& j : joined) found |= absl::StartsWith(j, prefix);
    if (!found) missing.push_back(absl::StrCat("node ", n));
  }
  return absl::StrJoin(missing, ", ");
}

}  // namespace ithaca
