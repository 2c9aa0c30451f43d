// The gRPC services: thin handlers. JobService (over Jobs) is public (TCP or unix socket);
// WorkerService (over the Supervisor) is for ithaca-worker processes, on the daemon's own unix
// socket.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>

#include "ithaca/v1/job.grpc.pb.h"
#include "ithaca/v1/worker.grpc.pb.h"
#include "server/auth.h"
#include "server/jobs.h"
#include "server/supervisor.h"

namespace ithaca {

// absl::Status → grpc::Status (the codes are the same numbers).
grpc::Status ToGrpc(const absl::Status& status);

// "HOST:0" → "HOST:P" with P a port free now; anything else unchanged. gRPC 1.51 binds every
// port of a server twice when its default health service is enabled: for port 0 the second
// listener gets a port of its own, which serves JobService unannounced (not in ithacad.addr).
// With the port chosen first, both listen on the one port.
absl::StatusOr<std::string> ChooseListenPort(const std::string& listen);

// Whether `listen` (host:port; unix: addresses are not checked) can be bound now, as gRPC binds
// it (SO_REUSEADDR): UNAVAILABLE saying why ("Address already in use", "Cannot assign requested
// address") when not. ithacad asks before starting its server, since gRPC's own failure says
// nothing of the cause, and so a failure after it means the TLS key and certificate.
absl::Status CheckListenAddress(const std::string& listen);

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // The sync server gives every open stream (WatchJob, ReadLogs, ReadHistory) a thread: past
  // this many at once, a new one gets RESOURCE_EXHAUSTED instead of another thread.
  static constexpr int kMaxStreams = 256;

  // Every call is first checked by `auth` (server/auth.h); none: every call is let through.
  explicit JobServiceImpl(Jobs* jobs, std::shared_ptr<const Authenticator> auth = nullptr)
      : jobs_(jobs), auth_(auth ? std::move(auth) : std::make_shared<Authenticator>("")) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status ReadLogs(grpc::ServerContext* context, const v1::ReadLogsRequest* request,
                        grpc::ServerWriter<v1::LogLine>* writer) override;
  grpc::Status ReadHistory(grpc::ServerContext* context, const v1::ReadHistoryRequest* request,
                           grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status PlanJob(grpc::ServerContext*, const v1::PlanJobRequest* request,
                       v1::PlanJobResponse* response) override;
  grpc::Status GetNode(grpc::ServerContext*, const v1::GetNodeRequest*,
                       v1::NodeInfo* response) override;
  grpc::Status Drain(grpc::ServerContext*, const v1::DrainRequest* request,
                     v1::DrainResponse* response) override;

 private:
  // Counts an open stream for its lifetime; `ok()` false when kMaxStreams are open already.
  class StreamSlot {
   public:
    explicit StreamSlot(std::atomic<int>* open) : open_(open) {
      ok_ = open_->fetch_add(1) < kMaxStreams;
    }
    ~StreamSlot() { open_->fetch_sub(1); }
    bool ok() const { return ok_; }

   private:
    std::atomic<int>* open_;
    bool ok_;
  };
  grpc::Status TooManyStreams() const;

  Jobs* jobs_;
  std::shared_ptr<const Authenticator> auth_;
  std::atomic<int> open_streams_{0};
};

// The workers' service. On the daemon's unix socket (the default) nothing is checked beyond the
// job's secret at Register. On its client port (`remote`: ranks on other nodes, ithacad
// --cluster slurm) every call must also carry the clients' bearer token and, under
// launch/worker_contract.h's key, the secret of the job it names.
class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  explicit WorkerServiceImpl(Supervisor* supervisor,
                             std::shared_ptr<const Authenticator> remote = nullptr)
      : supervisor_(supervisor), remote_(std::move(remote)) {}

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status ReportStep(grpc::ServerContext*, const v1::ReportStepRequest* request,
                          v1::Ack*) override;
  grpc::Status ReportEval(grpc::ServerContext*, const v1::ReportEvalRequest* request,
                          v1::Ack*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::Ack*) override;
  grpc::Status Log(grpc::ServerContext*, const v1::LogRequest* request, v1::Ack*) override;
  grpc::Status Exiting(grpc::ServerContext*, const v1::ExitingRequest* request, v1::Ack*) override;

 private:
  // The job's secret on every call; on the TCP port the client token too.
  grpc::Status Check(const grpc::ServerContext& context, const std::string& job_id) const;

  Supervisor* supervisor_;
  std::shared_ptr<const Authenticator> remote_;
};

}  // namespace ithaca
