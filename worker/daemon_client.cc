#include "worker/daemon_client.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon_link/connection.h"
#include "launch/exit_codes.h"
#include "launch/rpc_text.h"
#include "launch/worker_contract.h"

namespace ithaca {
namespace {

// The node this rank runs on, for the daemon's status and metrics: Slurm's name for it, else
// the host name.
std::string NodeName() {
  if (const char* n = std::getenv("SLURMD_NODENAME"); n != nullptr && *n != 0) return n;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

std::chrono::system_clock::time_point In(int ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

// Every call carries the job's secret: over TCP, a client's token alone does not make a caller
// one of the job's ranks.
void WithSecret(grpc::ClientContext* ctx, const std::string& secret) {
  if (!secret.empty()) ctx->AddMetadata(kJobSecretMetadata, secret);
}

// The daemon is not there (stopped, restarting; CANCELLED: a call in flight when it stopped):
// try again later. The daemon ignores a step report it already recorded.
bool DaemonAway(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ||
         st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         st.error_code() == grpc::StatusCode::CANCELLED;
}

void SendExiting(v1::WorkerService::Stub* stub, const std::string& secret,
                 const std::string& job_id, int rank, int exit_code, int signal) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(5000));
  WithSecret(&ctx, secret);
  v1::ExitingRequest req;
  req.set_job_id(job_id);
  req.set_rank(rank);
  req.set_exit_code(exit_code);
  req.set_signal(signal);
  v1::Ack ack;
  stub->Exiting(&ctx, req, &ack);
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> DaemonChannel(const std::string& address) {
  ConnectionOptions c;
  c.server =
      IsUnixAddress(address) && !absl::StartsWith(address, "unix:") ? "unix:" + address : address;
  if (!IsUnixAddress(address)) ApplyConnectionEnvironment(&c);
  c.max_reconnect_backoff_ms = 1000;
  return Connect(c);
}

DaemonClient::DaemonClient(const DaemonWorkerOptions& o, std::shared_ptr<grpc::Channel> channel,
                           std::atomic<bool>* stop)
    : o_(o),
      stop_(stop),
      address_(o.socket),
      stub_(v1::WorkerService::NewStub(std::move(channel))) {}

DaemonClient::~DaemonClient() {
  FlushReports();
  StopHeartbeats();
}

absl::StatusOr<v1::RegisterResponse> DaemonClient::Register(bool reattach) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(reattach ? 5000 : 30000));
  ctx.set_wait_for_ready(true);  // the daemon may still be binding its socket
  WithSecret(&ctx, o_.secret);
  v1::RegisterRequest req;
  req.set_job_id(o_.job_id);
  req.set_rank(o_.rank);
  req.set_pid(getpid());
  req.set_secret(o_.secret);
  req.set_reattach(reattach);
  req.set_node(NodeName());
  v1::RegisterResponse resp;
  grpc::Status st = stub()->Register(&ctx, req, &resp);
  if (!st.ok()) {
    if (reattach && DaemonAway(st)) return absl::UnavailableError(st.error_message());
    return absl::Status(
        static_cast<absl::StatusCode>(st.error_code()),
        absl::StrCat("register with ithacad at ", o_.socket, ": ", st.error_message()));
  }
  return resp;
}

void DaemonClient::ReportStep(v1::StepReport report) { Queue(std::move(report)); }

void DaemonClient::ReportEval(v1::EvalReport report) { Queue(std::move(report)); }

void DaemonClient::FlushReports() {
  {
    MutexLock lock(&report_mu_);
    reports_done_ = true;
  }
  report_cv_.SignalAll();
  if (sender_.joinable()) sender_.join();
}

void DaemonClient::Log(const std::string& level, const std::string& text) {
  std::fprintf(stderr, "rank %d: %s\n", o_.rank, text.c_str());
  std::fflush(stderr);
  grpc::ClientContext ctx;
  ctx.set_deadline(In(5000));
  WithSecret(&ctx, o_.secret);
  v1::LogRequest req;
  req.set_job_id(o_.job_id);
  req.set_rank(o_.rank);
  req.set_level(level);
  req.set_text(text);
  // A file name in Latin-1 must not turn the real error into an unparsable request.
  SanitizeUtf8(&req);
  v1::Ack ack;
  stub()->Log(&ctx, req, &ack);
}

void DaemonClient::Exiting(int code) {
  SendExiting(stub().get(), o_.secret, o_.job_id, o_.rank, code, 0);
}

void DaemonClient::StartHeartbeats(int interval_ms, int lost_timeout_ms) {
  thread_ = std::thread([this, interval_ms, lost_timeout_ms] {
    const auto lost_after = std::chrono::milliseconds(
        lost_timeout_ms > 0 ? lost_timeout_ms : std::max(10000, 10 * interval_ms));
    auto last_ok = std::chrono::steady_clock::now();
    bool away = false;  // the daemon stopped answering: re-attach when one answers again
    while (true) {
      {
        MutexLock lock(&mu_);
        if (!done_) cv_.WaitFor(&mu_, absl::Milliseconds(interval_ms));
        if (done_) break;
      }
      grpc::Status st = away ? Reattach() : Beat();
      const auto now = std::chrono::steady_clock::now();
      if (st.ok()) {
        if (away) std::fprintf(stderr, "rank %d: re-attached to ithacad\n", o_.rank);
        away = false;
        last_ok = now;
      } else if (DaemonAway(st) || st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        // FAILED_PRECONDITION from Heartbeat: a new daemon adopted the job and waits for this
        // rank to re-attach.
        if (!away) {
          std::fprintf(stderr, "rank %d: ithacad away (%s); training on, waiting for it\n", o_.rank,
                       st.error_message().c_str());
        }
        away = true;
        if (now - last_ok > lost_after) {
          std::fprintf(stderr, "rank %d: ithacad unreachable for %lld s (%s); exiting\n", o_.rank,
                       static_cast<long long>(
                           std::chrono::duration_cast<std::chrono::seconds>(lost_after).count()),
                       st.error_message().c_str());
          std::fflush(stderr);
          _exit(kExitKilled);
        }
      } else {  // ABORTED: the job is ending; NOT_FOUND, PERMISSION_DENIED: not ours any more
        std::fprintf(stderr, "rank %d: %s; stopping\n", o_.rank, st.error_message().c_str());
        stop_->store(true);
        if (st.error_code() != grpc::StatusCode::ABORTED) {
          reports_abandoned_.store(true);  // no daemon will take them
          report_cv_.SignalAll();
        }
      }
      std::fflush(stderr);
    }
  });
}

void DaemonClient::StopHeartbeats() {
  {
    MutexLock lock(&mu_);
    done_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

grpc::Status DaemonClient::Beat() {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(5000));
  WithSecret(&ctx, o_.secret);
  v1::HeartbeatRequest req;
  req.set_job_id(o_.job_id);
  req.set_rank(o_.rank);
  v1::Ack ack;
  return stub()->Heartbeat(&ctx, req, &ack);
}

// The daemon this rank talks to (the heartbeat thread may switch it: FollowDaemon).
std::shared_ptr<v1::WorkerService::Stub> DaemonClient::stub() {
  MutexLock lock(&stub_mu_);
  return stub_;
}

// A daemon restarted elsewhere (another port or host) says where in the address file; the
// rank dials it from now on.
void DaemonClient::FollowDaemon() {
  if (o_.address_file.empty()) return;
  std::ifstream in(o_.address_file);
  std::string address;
  std::getline(in, address);
  address = std::string(absl::StripAsciiWhitespace(address));
  if (address.empty() || address == address_) return;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = DaemonChannel(address);
  if (!channel.ok()) {
    std::fprintf(stderr, "rank %d: %s names ithacad at %s: %s\n", o_.rank, o_.address_file.c_str(),
                 address.c_str(), channel.status().ToString().c_str());
    return;
  }
  std::fprintf(stderr, "rank %d: ithacad is now at %s (%s)\n", o_.rank, address.c_str(),
               o_.address_file.c_str());
  address_ = address;
  MutexLock lock(&stub_mu_);
  stub_ = v1::WorkerService::NewStub(*std::move(channel));
}

grpc::Status DaemonClient::Reattach() {
  FollowDaemon();
  absl::StatusOr<v1::RegisterResponse> r = Register(/*reattach=*/true);
  if (r.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(r.status().code()),
                      std::string(r.status().message()));
}

void DaemonClient::Queue(Report report) {
  {
    MutexLock lock(&report_mu_);
    if (!sender_.joinable()) sender_ = std::thread([this] { SendReports(); });
    reports_.push_back(std::move(report));
  }
  report_cv_.SignalAll();
}

// Waits up to `timeout`, or until the daemon disowns the job (reports_abandoned_).
void DaemonClient::WaitUnlessAbandoned(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!reports_abandoned_.load() && absl::Now() < deadline) {
    report_cv_.WaitUntil(&report_mu_, deadline);
  }
}

void DaemonClient::SendReports() {
  report_mu_.Lock();
  while (true) {
    while (!reports_done_ && reports_.empty()) report_cv_.Wait(&report_mu_);
    if (reports_.empty()) break;  // done and drained
    Report report = reports_.front();
    report_mu_.Unlock();
    grpc::Status st = Send(report);
    report_mu_.Lock();
    // The daemon is away (restarting): the report waits at the head of the queue, so the next
    // daemon gets every step in order. The heartbeat thread ends the wait, one way or another.
    if (DaemonAway(st) && !reports_abandoned_.load()) {
      WaitUnlessAbandoned(absl::Milliseconds(200));
      continue;
    }
    // The daemon could not store it (its state disk full): sent again each second while the
    // rank trains; once it exits, for at most kStoreRetry, then the daemon names the gap.
    if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      const auto now = std::chrono::steady_clock::now();
      if (!reports_done_) store_retry_until_.reset();
      if (reports_done_ && !store_retry_until_) store_retry_until_ = now + kStoreRetry;
      if (!store_retry_until_ || now < *store_retry_until_) {
        WaitUnlessAbandoned(absl::Seconds(1));
        if (!reports_abandoned_.load()) continue;
      }
    }
    reports_.pop_front();
    if (!st.ok()) {
      std::fprintf(stderr, "rank %d: report %s: %s\n", o_.rank,
                   report.index() == 0 ? "step" : "eval", st.error_message().c_str());
    }
  }
  report_mu_.Unlock();
}

grpc::Status DaemonClient::Send(const Report& report) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(10000));
  WithSecret(&ctx, o_.secret);
  v1::Ack ack;
  if (const auto* step = std::get_if<v1::StepReport>(&report)) {
    v1::ReportStepRequest req;
    req.set_job_id(o_.job_id);
    *req.mutable_step() = *step;
    SanitizeUtf8(&req);
    return stub()->ReportStep(&ctx, req, &ack);
  }
  v1::ReportEvalRequest req;
  req.set_job_id(o_.job_id);
  *req.mutable_eval() = std::get<v1::EvalReport>(report);
  SanitizeUtf8(&req);
  return stub()->ReportEval(&ctx, req, &ack);
}

void ReportKilledRank(const std::string& address, const std::string& job_id, int rank, int signal) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = DaemonChannel(address);
  if (!channel.ok()) return;
  const char* secret = std::getenv(kEnvJobSecret);
  auto stub = v1::WorkerService::NewStub(*std::move(channel));
  SendExiting(stub.get(), secret != nullptr ? secret : "", job_id, rank, 0, signal);
}

}  // namespace ithaca
