// A bounded load test, real sockets throughout: a store of 3,000 jobs (each with a 4 KiB
// reason), 300 watch streams (more than JobServiceImpl::kMaxStreams), and 100 slow clients on
// each port (half an HTTP/2 preface on gRPC's, half a request line on the metrics port). While
// they hang on: GetJob stays fast, ListJobs answers one bounded page, /metrics and /healthz
// answer, the streams past the bound are refused with RESOURCE_EXHAUSTED instead of taking a
// thread each, and the daemon's memory stays bounded. Runs in well under a minute.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "engine/core/mutex.h"
#include "server/test_http.h"
#include "server/jobs.h"
#include "launch/rpc_text.h"
#include "server/services.h"
#include "server/test_workers.h"

namespace ithaca {
namespace {

int64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(LoadTest, ManyJobsStreamsAndSlowClientsStayBounded) {
  const absl::Time test_start = absl::Now();
  auto store = JobStore::Open({":memory:"});
  ASSERT_TRUE(store.ok()) << store.status();
  constexpr int kJobs = 3000;
  for (int i = 0; i < kJobs; ++i) {
    v1::Job j;
    j.set_name("old");
    j.set_spec_toml(std::string(2000, '#'));
    ASSERT_TRUE((*store)->Create(j, "submitted").ok());
    ASSERT_TRUE((*store)
                    ->Transition(absl::StrCat("job-", i + 1), v1::JOB_STATE_CANCELLED,
                                 std::string(4096, 'r'))
                    .ok());
  }
  Metrics metrics;
  Jobs::Options o;
  o.state_dir = TmpDir() + "/load";
  o.node.host_memory_bytes = int64_t{16} << 30;
  o.node.devices.push_back({0, "", "cpu slot", o.node.host_memory_bytes});
  // The live job's worker never registers and outlives the test: its job stays STARTING, so
  // every watch stream stays open until the test cancels it (a worker that ended first, e.g.
  // on a machine slow enough that the test outlasted it, would end the streams with OK).
  o.supervisor.worker_binary = Script("load_sleep.sh", "exec sleep 600");
  o.supervisor.worker_socket = o.state_dir + "/worker.sock";
  o.supervisor.grace_period = absl::Seconds(1);
  o.supervisor.start_timeout = absl::Seconds(120);
  Jobs jobs(o, store->get(), &metrics);
  ASSERT_TRUE(jobs.Start().ok());
  WriteCorpus(TmpDir() + "/corpus.tok");
  v1::SubmitJobRequest submit;
  submit.set_spec_toml(
      "name = \"live\"\nbackend = \"cpu\"\n[model]\npreset = \"tiny\"\n[data]\npath = "
      "\"corpus.tok\"\nseq_len = 64\n[training]\nsteps = 3\n");
  submit.set_base_dir(TmpDir());
  absl::StatusOr<v1::Job> live = jobs.Submit(submit);
  ASSERT_TRUE(live.ok()) << live.status();

  JobServiceImpl service(&jobs);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  AddRpcBoundary(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_TRUE(server);
  auto http = MetricsHttp::Start({"127.0.0.1:0", &metrics, [&jobs] { jobs.RefreshJobCounts(); }});
  ASSERT_TRUE(http.ok()) << http.status();
  const int metrics_port = std::stoi((*http)->address().substr((*http)->address().rfind(':') + 1));
  const int64_t rss_before = RssBytes();

  // Slow clients on both ports.
  std::vector<int> slow;
  for (int i = 0; i < 100; ++i) {
    slow.push_back(ConnectLoopback(port));
    send(slow.back(), "PRI * HTTP/2.0\r\n", 16, MSG_NOSIGNAL);
    slow.push_back(ConnectLoopback(metrics_port));
    send(slow.back(), "GET /met", 8, MSG_NOSIGNAL);
  }

  // 300 watchers of the live job, on their own channels.
  constexpr int kWatchers = 300;
  std::atomic<int> streaming{0}, refused{0};
  Mutex other_mu;
  std::vector<std::string> other_ends;  // how the streams that ended otherwise ended
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(kWatchers);
  std::vector<std::thread> watchers;
  const std::string target = absl::StrCat("127.0.0.1:", port);
  for (int i = 0; i < kWatchers; ++i) {
    contexts[i] = std::make_unique<grpc::ClientContext>();
    watchers.emplace_back([&, i] {
      grpc::ChannelArguments args;
      args.SetInt("grpc.channel_id", i);  // a connection of its own
      auto stub = v1::JobService::NewStub(
          grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
      v1::WatchJobRequest req;
      req.set_id(live->id());
      // Debian's gRPC (1.51) reads connect(2)'s errno after other calls have overwritten it, so
      // under load about one connection in ten thousand fails at once with an unrelated error
      // ("No such file or directory"; grpc/grpc#35064, later gRPC saves errno). Waiting for the
      // channel to be ready retries the connection, as a client of a real daemon would.
      contexts[i]->set_wait_for_ready(true);
      auto reader = stub->WatchJob(contexts[i].get(), req);
      v1::JobEvent e;
      if (reader->Read(&e)) {
        ++streaming;
        while (reader->Read(&e)) {
        }
      }
      grpc::Status st = reader->Finish();
      if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        ++refused;
      } else if (st.error_code() != grpc::StatusCode::CANCELLED) {
        MutexLock l(&other_mu);
        other_ends.push_back(absl::StrCat("code ", st.error_code(), ": ", st.error_message()));
      }
    });
  }
  for (absl::Time end = absl::Now() + absl::Seconds(20);
       streaming + refused < kWatchers && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(streaming.load(), JobServiceImpl::kMaxStreams);
  EXPECT_EQ(refused.load(), kWatchers - JobServiceImpl::kMaxStreams);

  // Under all of that: quick unary calls, a bounded list, metrics.
  auto stub =
      v1::JobService::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  std::vector<absl::Duration> latency;
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.set_wait_for_ready(true);  // the first call connects: see the watchers
    v1::GetJobRequest req;
    req.set_id(absl::StrCat("job-", 1 + i * 29));
    v1::Job job;
    const absl::Time t = absl::Now();
    ASSERT_TRUE(stub->GetJob(&ctx, req, &job).ok());
    latency.push_back(absl::Now() - t);
  }
  std::sort(latency.begin(), latency.end());
  EXPECT_LT(latency[98], absl::Milliseconds(250)) << "GetJob p99";
  {
    grpc::ClientContext ctx;
    v1::ListJobsResponse list;
    const absl::Time t = absl::Now();
    ASSERT_TRUE(stub->ListJobs(&ctx, v1::ListJobsRequest(), &list).ok());
    EXPECT_LT(absl::Now() - t, absl::Seconds(2));
    EXPECT_EQ(list.jobs_size(), Jobs::kDefaultListLimit);
    EXPECT_FALSE(list.next_page_token().empty());
    EXPECT_LT(list.ByteSizeLong(), size_t{4} << 20);
  }
  const absl::Time t = absl::Now();
  EXPECT_NE(HttpGet(metrics_port, "/metrics").find("200 OK"), std::string::npos);
  EXPECT_NE(HttpGet(metrics_port, "/healthz").find("200 OK"), std::string::npos);
  EXPECT_LT(absl::Now() - t, absl::Seconds(2));
  EXPECT_LT(RssBytes() - rss_before, int64_t{300} << 20) << "memory under load";

  for (auto& c : contexts) c->TryCancel();
  for (std::thread& w : watchers) w.join();
  EXPECT_TRUE(other_ends.empty()) << absl::StrJoin(other_ends, "; ");
  for (int fd : slow) close(fd);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  jobs.Shutdown("test over");
  EXPECT_LT(absl::Now() - test_start, absl::Seconds(50));
}

}  // namespace
}  // namespace ithaca
