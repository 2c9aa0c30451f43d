// A rank's client of the daemon against an in-process WorkerService: reports arrive in order
// from the sender thread while the heartbeat thread beats, a daemon that is away keeps them
// queued, and a daemon that disowns the job stops the rank. tools/sanitize.sh tsan runs it, so
// the three threads' sharing is checked at run time too.
#include "worker/daemon_client.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/comm/testing/multiprocess.h"
#include "engine/core/mutex.h"

namespace ithaca {
namespace {

using testing::WaitFor;

// A WorkerService that records what the rank sends; `fail_steps` ReportStep calls answer
// UNAVAILABLE first (a daemon away), and `disown` makes every heartbeat answer NOT_FOUND.
class FakeDaemon final : public v1::WorkerService::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override {
    MutexLock lock(&mu_);
    ++registers_;
    secret_ = req->secret();
    resp->set_heartbeat_interval_ms(20);
    return grpc::Status::OK;
  }
  grpc::Status ReportStep(grpc::ServerContext*, const v1::ReportStepRequest* req,
                          v1::Ack*) override {
    MutexLock lock(&mu_);
    if (fail_steps_ > 0) {
      --fail_steps_;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "restarting");
    }
    if (always_away_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone");
    reports_.push_back("step " + std::to_string(req->step().step()));
    return grpc::Status::OK;
  }
  grpc::Status ReportEval(grpc::ServerContext*, const v1::ReportEvalRequest* req,
                          v1::Ack*) override {
    MutexLock lock(&mu_);
    reports_.push_back("eval " + std::to_string(req->eval().step()));
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*, v1::Ack*) override {
    MutexLock lock(&mu_);
    ++heartbeats_;
    if (disown_) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such job");
    return grpc::Status::OK;
  }
  grpc::Status Log(grpc::ServerContext*, const v1::LogRequest* req, v1::Ack*) override {
    MutexLock lock(&mu_);
    logs_.push_back(req->level() + ": " + req->text());
    return grpc::Status::OK;
  }
  grpc::Status Exiting(grpc::ServerContext*, const v1::ExitingRequest* req, v1::Ack*) override {
    MutexLock lock(&mu_);
    exit_code_ = req->exit_code();
    return grpc::Status::OK;
  }

  void FailSteps(int n) {
    MutexLock lock(&mu_);
    fail_steps_ = n;
  }
  void Disown() {
    MutexLock lock(&mu_);
    disown_ = true;
    always_away_ = true;
  }
  std::vector<std::string> reports() {
    MutexLock lock(&mu_);
    return reports_;
  }
  std::vector<std::string> logs() {
    MutexLock lock(&mu_);
    return logs_;
  }
  int heartbeats() {
    MutexLock lock(&mu_);
    return heartbeats_;
  }
  int registers() {
    MutexLock lock(&mu_);
    return registers_;
  }
  int exit_code() {
    MutexLock lock(&mu_);
    return exit_code_;
  }
  std::string secret() {
    MutexLock lock(&mu_);
    return secret_;
  }

 private:
  Mutex mu_;
  std::vector<std::string> reports_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> logs_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int registers_ ABSL_GUARDED_BY(mu_) = 0;
  int exit_code_ ABSL_GUARDED_BY(mu_) = -1;
  int fail_steps_ ABSL_GUARDED_BY(mu_) = 0;
  bool disown_ ABSL_GUARDED_BY(mu_) = false;
  bool always_away_ ABSL_GUARDED_BY(mu_) = false;
  std::string secret_ ABSL_GUARDED_BY(mu_);
};

class DaemonClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A unix socket's path is at most 107 bytes: under /tmp, not the test's long TEST_TMPDIR.
    char dir[] = "/tmp/ithaca-dc-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    options_.socket = dir_ + "/worker.sock";
    options_.job_id = "j1";
    options_.secret = "a-secret-of-the-job";
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + options_.socket, grpc::InsecureServerCredentials());
    builder.RegisterService(&daemon_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::unique_ptr<DaemonClient> Client() {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = DaemonChannel(options_.socket);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return std::make_unique<DaemonClient>(options_, *std::move(channel), &stop_);
  }

  static v1::StepReport Step(int step) {
    v1::StepReport r;
    r.set_step(step);
    return r;
  }

  std::string dir_;
  DaemonWorkerOptions options_;
  FakeDaemon daemon_;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<bool> stop_{false};
};

TEST_F(DaemonClientTest, ReportsArriveInOrderWhileHeartbeating) {
  std::unique_ptr<DaemonClient> client = Client();
  absl::StatusOr<v1::RegisterResponse> reg = client->Register();
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(daemon_.secret(), "a-secret-of-the-job");
  client->StartHeartbeats(reg->heartbeat_interval_ms(), 0);
  std::vector<std::string> want;
  for (int step = 1; step <= 100; ++step) {
    client->ReportStep(Step(step));
    want.push_back("step " + std::to_string(step));
    if (step % 25 == 0) {
      v1::EvalReport eval;
      eval.set_step(step);
      client->ReportEval(eval);
      want.push_back("eval " + std::to_string(step));
    }
  }
  EXPECT_TRUE(WaitFor([&] { return daemon_.heartbeats() >= 3; }, 10));
  client->FlushReports();
  EXPECT_EQ(daemon_.reports(), want);
  client->Log("ERROR", "the last words");
  client->Exiting(3);
  client->StopHeartbeats();
  EXPECT_EQ(daemon_.logs(), std::vector<std::string>{"ERROR: the last words"});
  EXPECT_EQ(daemon_.exit_code(), 3);
  EXPECT_EQ(daemon_.registers(), 1);
  EXPECT_FALSE(stop_.load());
}

TEST_F(DaemonClientTest, ADaemonAwayKeepsTheReportsQueuedInOrder) {
  daemon_.FailSteps(3);
  std::unique_ptr<DaemonClient> client = Client();
  ASSERT_TRUE(client->Register().ok());
  client->StartHeartbeats(20, 0);
  for (int step = 1; step <= 5; ++step) client->ReportStep(Step(step));
  client->FlushReports();  // the head is sent again every 200 ms until the daemon takes it
  EXPECT_EQ(daemon_.reports(),
            (std::vector<std::string>{"step 1", "step 2", "step 3", "step 4", "step 5"}));
  EXPECT_FALSE(stop_.load());
}

TEST_F(DaemonClientTest, ADaemonThatDisownsTheJobStopsTheRank) {
  daemon_.Disown();
  std::unique_ptr<DaemonClient> client = Client();
  ASSERT_TRUE(client->Register().ok());
  client->StartHeartbeats(20, 0);
  for (int step = 1; step <= 3; ++step) client->ReportStep(Step(step));
  EXPECT_TRUE(WaitFor([&] { return stop_.load(); }, 10));
  const auto start = std::chrono::steady_clock::now();
  client->FlushReports();  // the queued reports are dropped, not waited on
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(daemon_.reports().empty());
}

}  // namespace
}  // namespace ithaca
