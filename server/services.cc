#include "server/services.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>

#include "absl/time/clock.h"
#include "engine/core/utf8.h"
#include "server/log_files.h"
#include "launch/rpc_text.h"
#include "launch/launcher.h"
#include "launch/worker_contract.h"

namespace ithaca {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // gRPC sends the message in a trailer, and a trailer over the peer's metadata limit (8 KiB by
  // default) turns the answer into RESOURCE_EXHAUSTED: an error must never echo a client's
  // unbounded input whole.
  constexpr size_t kMaxMessageBytes = 2048;
  // Clients decode the message as UTF-8 (Python's grpc does).
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      BoundedUtf8(status.message(), kMaxMessageBytes));
}

namespace {

using AddrInfo = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

// The addresses a server binds for host:port ("[v6]:port" too; an empty host: every address),
// or getaddrinfo's reason.
absl::StatusOr<AddrInfo> PassiveAddresses(const std::string& host, const std::string& port) {
  const std::string bare =
      host.size() >= 2 && host.front() == '[' ? host.substr(1, host.size() - 2) : host;
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(bare.empty() ? nullptr : bare.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(gai_strerror(rc));
  }
  return AddrInfo(found, &freeaddrinfo);
}

}  // namespace

absl::Status CheckListenAddress(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (absl::StartsWith(listen, "unix") || colon == std::string::npos) return absl::OkStatus();
  absl::StatusOr<AddrInfo> found =
      PassiveAddresses(listen.substr(0, colon), listen.substr(colon + 1));
  if (!found.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, ": ", found.status().message()));
  }
  int error = 0;
  bool bound = false;
  for (addrinfo* a = found->get(); a != nullptr && !bound; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    bound = bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!bound) error = errno;
    close(fd);
  }
  if (bound) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", listen, ": ", std::strerror(error)));
}

absl::StatusOr<std::string> ChooseListenPort(const std::string& listen) {
  // host:port or [v6]:port, the port a number: without one gRPC would take :443.
  if (!absl::StartsWith(listen, "unix:") && !absl::StartsWith(listen, "unix-abstract:")) {
    size_t port_at = std::string::npos;
    if (absl::StartsWith(listen, "[")) {
      const size_t close = listen.find("]:");
      if (close != std::string::npos) port_at = close + 2;
    } else if (std::count(listen.begin(), listen.end(), ':') == 1) {
      port_at = listen.find(':') + 1;
    }
    int port = -1;
    if (port_at == std::string::npos || !absl::SimpleAtoi(listen.substr(port_at), &port) ||
        port < 0 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen ", listen, ": give host:port (127.0.0.1:50051, [::1]:50051) or unix:PATH"));
    }
  }
  const size_t colon = listen.rfind(':');
  if (listen.rfind("unix:", 0) == 0 || colon == std::string::npos ||
      listen.substr(colon + 1) != "0") {
    return listen;
  }
  const std::string host = listen.substr(0, colon);
  absl::StatusOr<AddrInfo> found = PassiveAddresses(host, "0");
  if (!found.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen ", listen, ": ", found.status().message()));
  }
  int port = 0;
  for (addrinfo* a = found->get(); a != nullptr && port == 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    sockaddr_storage bound = {};
    socklen_t len = sizeof(bound);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    }
    close(fd);
  }
  if (port == 0) return absl::UnavailableError(absl::StrCat("--listen ", listen, ": no free port"));
  return absl::StrCat(host, ":", port);
}

namespace {

// What a handler answers: valid UTF-8 in every string (launch/rpc_text.h), or the error.
template <typename M>
grpc::Status Answer(absl::StatusOr<M> result, M* response) {
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  SanitizeUtf8(response);
  return grpc::Status::OK;
}

// Writes one streamed message with its strings made valid UTF-8.
template <typename M>
bool WriteValid(grpc::ServerWriter<M>* writer, M message) {
  SanitizeUtf8(&message);
  return writer->Write(message);
}

}  // namespace

grpc::Status JobServiceImpl::TooManyStreams() const {
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("ithacad is serving ", kMaxStreams,
                                   " streams (watch, logs, history) already; try again shortly"));
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* context,
                                       const v1::SubmitJobRequest* request,
                                       v1::SubmitJobResponse* response) {
  if (grpc::Status auth = auth_->Authorize(*context); !auth.ok()) return auth;
  absl::StatusOr<v1::Job> job =
      jobs_->Submit(*request, [context] { return context->IsCancelled(); });
  if (job.ok()) *response->mutable_job() = *std::move(job);
  SanitizeUtf8(response);
  return ToGrpc(job.status());
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  if (grpc::Status auth = auth_->Authorize(*context); !auth.ok()) return auth;
  return Answer(jobs_->Get(request->id()), response);
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  if (grpc::Status auth = auth_->Authorize(*context); !auth.ok()) return auth;
  return Answer(jobs_->List(*request), response);
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request, v1::Job* response) {
  if (grpc::Status auth = auth_->Authorize(*context); !auth.ok()) return auth;
  return Answer(jobs_->Cancel(request->id(), request->reason()), response);
}

grpc::Status JobServiceImpl::DeleteJob(grpc::ServerContext* context,
                                       const v1::DeleteJobRequest* request,
                                       v1::DeleteJobResponse* response) {
  if (grpc::Status auth = auth_->Authorize(*context); !auth.ok()) return auth;
  absl::StatusOr<v1::Job> job = jobs_->Delete(request->id());
  if (job.ok()) *response->mutable_job() = *std::move(job);
  SanitizeUtf8(response);
  return ToGrpc(job.status());
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  if (grpc::Status auth = auth_->Authorize(*context); !auth.ok()) return auth;
  StreamSlot slot(&open_streams_);
  if (!slot.ok()) return TooManyStreams();
  absl::StatusOr<std::shared_ptr<EventLog>> events = jobs_->Events(request->id());
  if (!events.ok()) return ToGrpc(events.status());
  absl::StatusOr<v1::Job> snapshot = jobs_->Get(request->id());
  if (!snapshot.ok()) return ToGrpc(snapshot.status());
  v1::JobEvent first;
  *first.mutable_job() = *snapshot;
  if (!WriteValid(writer, std::move(first))) return grpc::Status::OK;
  int64_t after = request->after_seq();
  while (!context->IsCancelled()) {
    bool closed = false;
    std::vector<v1::JobEvent> batch = (*events)->WaitAfter(after, absl::Seconds(1), &closed);
    for (const v1::JobEvent& e : batch) {
      after = e.seq();
      if (e.has_log() && !request->include_logs()) continue;
      if (!WriteValid(writer, e)) return grpc::Status::OK;
    }
    if (closed) break;  // the batch taken with `closed` held every remaining event
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ReadHistory(grpc::ServerContext* context,
                                         const v1::ReadHistoryRequest* request,
                                         grpc::ServerWriter<v1::JobEvent>* writer) {
  // Checked before the job is looked up, so NOT_FOUND tells no one without the token which
  // jobs exist.
  if (grpc::Status auth = auth_->Authorize(*context); !auth.ok()) return auth;
  StreamSlot slot(&open_streams_);
  if (!slot.ok()) return TooManyStreams();
  absl::StatusOr<std::vector<v1::JobEvent>> history = jobs_->History(request->id());
  if (!history.ok()) return ToGrpc(history.status());
  for (v1::JobEvent& e : *history) {
    if (context->IsCancelled() || !WriteValid(writer, std::move(e))) break;
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ReadLogs(grpc::ServerContext* context,
                                      const v1::ReadLogsRequest* request,
                                      grpc::ServerWriter<v1::LogLine>* writer) {
  if (grpc::Status auth = auth_->Authorize(*context); !auth.ok()) return auth;
  StreamSlot slot(&open_streams_);
  if (!slot.ok()) return TooManyStreams();
  absl::StatusOr<v1::Job> job = jobs_->Get(request->id());
  if (!job.ok()) return ToGrpc(job.status());
  const int world = std::max(1, job->spec().world());
  if (request->has_rank() && (request->rank() < 0 || request->rank() >= world)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("rank: must be in [0, ", world, "), got ", request->rank()));
  }
  std::vector<std::pair<int, std::unique_ptr<LogTail>>> tails;
  for (int r = 0; r < world; ++r) {
    if (request->has_rank() && request->rank() != r) continue;
    tails.emplace_back(r, std::make_unique<LogTail>(RankLogPath(job->log_dir(), r)));
  }
  while (!context->IsCancelled()) {
    // Decide "ended" before reading, so lines written just before the end are not lost.
    absl::StatusOr<v1::Job> now = jobs_->Get(request->id());
    const bool ended = !now.ok() || IsTerminal(now->state());
    for (auto& [rank, tail] : tails) {
      for (std::string& text : tail->ReadLines(ended || !request->follow())) {
        v1::LogLine line;
        line.set_rank(rank);
        line.set_text(std::move(text));  // a log file may hold any bytes
        if (!WriteValid(writer, std::move(line))) return grpc::Status::OK;
      }
    }
    if (!request->follow() || ended) break;
    usleep(200 * 1000);
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::PlanJob(grpc::ServerContext* context,
                                     const v1::PlanJobRequest* request,
                                     v1::PlanJobResponse* response) {
  if (grpc::Status auth = auth_->Authorize(*context); !auth.ok()) return auth;
  return Answer(jobs_->Plan(*request, [context] { return context->IsCancelled(); }), response);
}

grpc::Status JobServiceImpl::GetNode(grpc::ServerContext* context, const v1::GetNodeRequest*,
                                     v1::NodeInfo* response) {
  if (grpc::Status auth = auth_->Authorize(*context); !auth.ok()) return auth;
  *response = jobs_->NodeInfo();
  SanitizeUtf8(response);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::Drain(grpc::ServerContext* context, const v1::DrainRequest* request,
                                   v1::DrainResponse* response) {
  if (grpc::Status auth = auth_->Authorize(*context); !auth.ok()) return auth;
  if (request->timeout_seconds() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "timeout_seconds must be >= 0");
  }
  const int timeout_s = request->timeout_seconds() > 0 ? request->timeout_seconds() : 300;
  *response = jobs_->DrainNode(request->undo(), absl::Seconds(timeout_s),
                               [context] { return context->IsCancelled(); });
  return grpc::Status::OK;
}

grpc::Status WorkerServiceImpl::Check(const grpc::ServerContext& context,
                                      const std::string& job_id) const {
  // Over TCP the caller also needs the client token; on the local socket too, every call (not
  // only Register) carries the job's secret, so a process that reaches the socket cannot forge
  // a job's progress, losses or failure reason (issue 43 N15).
  if (remote_ != nullptr) {
    if (grpc::Status auth = remote_->Authorize(context); !auth.ok()) return auth;
  }
  const auto& md = context.client_metadata();
  auto it = md.find(kJobSecretMetadata);
  const std::string secret =
      it == md.end() ? "" : std::string(it->second.data(), it->second.size());
  return ToGrpc(supervisor_->CheckSecret(job_id, secret));
}

grpc::Status WorkerServiceImpl::Register(grpc::ServerContext* context,
                                         const v1::RegisterRequest* request,
                                         v1::RegisterResponse* response) {
  if (grpc::Status st = Check(*context, request->job_id()); !st.ok()) return st;
  return Answer(supervisor_->Register(*request), response);
}

grpc::Status WorkerServiceImpl::ReportStep(grpc::ServerContext* context,
                                           const v1::ReportStepRequest* request, v1::Ack*) {
  if (grpc::Status st = Check(*context, request->job_id()); !st.ok()) return st;
  return ToGrpc(supervisor_->ReportStep(*request));
}

grpc::Status WorkerServiceImpl::ReportEval(grpc::ServerContext* context,
                                           const v1::ReportEvalRequest* request, v1::Ack*) {
  if (grpc::Status st = Check(*context, request->job_id()); !st.ok()) return st;
  return ToGrpc(supervisor_->ReportEval(*request));
}

grpc::Status WorkerServiceImpl::Heartbeat(grpc::ServerContext* context,
                                          const v1::HeartbeatRequest* request, v1::Ack*) {
  if (grpc::Status st = Check(*context, request->job_id()); !st.ok()) return st;
  return ToGrpc(supervisor_->Heartbeat(*request));
}

grpc::Status WorkerServiceImpl::Log(grpc::ServerContext* context, const v1::LogRequest* request,
                                    v1::Ack*) {
  if (grpc::Status st = Check(*context, request->job_id()); !st.ok()) return st;
  return ToGrpc(supervisor_->Log(*request));
}

grpc::Status WorkerServiceImpl::Exiting(grpc::ServerContext* context,
                                        const v1::ExitingRequest* request, v1::Ack*) {
  if (grpc::Status st = Check(*context, request->job_id()); !st.ok()) return st;
  return ToGrpc(supervisor_->Exiting(*request));
}

}  // namespace ithaca
