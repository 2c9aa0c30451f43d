// What the gRPC handlers send back: an error never carries a client's unbounded input whole;
// no JobService call gets past a missing or wrong token.
#include "server/services.h"

#include <grpcpp/impl/codegen/client_unary_call.h>
#include <gtest/gtest.h>

#include "engine/core/utf8.h"
#include "launch/rpc_text.h"

namespace ithaca {
namespace {

TEST(ServicesTest, ErrorMessagesAreBounded) {
  const std::string id(100000, 'x');
  grpc::Status st = ToGrpc(absl::NotFoundError("job \"" + id + "\" not found"));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_LT(st.error_message().size(), 2100u);
  EXPECT_NE(st.error_message().find("more bytes)"), std::string::npos);
  EXPECT_EQ(ToGrpc(absl::InvalidArgumentError("short")).error_message(), "short");
  EXPECT_TRUE(ToGrpc(absl::OkStatus()).ok());
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// Every JobService call is checked before it reaches the job service: with no Jobs behind the
// handlers at all, each answers UNAUTHENTICATED without a token or with a wrong one.
TEST(ServicesTest, EveryJobServiceCallNeedsTheToken) {
  JobServiceImpl service(nullptr, std::make_shared<Authenticator>("0123456789abcdef-token"));
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_TRUE(server);
  auto stub = v1::JobService::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
  for (const char* header : {"", "Bearer wrong-token-0123456789", "Bearer ",
                             "Basic 0123456789abcdef-token", "Bearer 0123456789abcdef-toke"}) {
    auto context = [&] {
      auto c = std::make_unique<grpc::ClientContext>();
      if (*header) c->AddMetadata("authorization", header);
      return c;
    };
    std::vector<grpc::Status> answers;
    {
      v1::SubmitJobResponse r;
      answers.push_back(stub->SubmitJob(context().get(), v1::SubmitJobRequest(), &r));
    }
    v1::Job job;
    answers.push_back(stub->GetJob(context().get(), v1::GetJobRequest(), &job));
    answers.push_back(stub->CancelJob(context().get(), v1::CancelJobRequest(), &job));
    {
      v1::DeleteJobResponse r;
      answers.push_back(stub->DeleteJob(context().get(), v1::DeleteJobRequest(), &r));
    }
    v1::ListJobsResponse list;
    answers.push_back(stub->ListJobs(context().get(), v1::ListJobsRequest(), &list));
    v1::PlanJobResponse plan;
    answers.push_back(stub->PlanJob(context().get(), v1::PlanJobRequest(), &plan));
    v1::NodeInfo node;
    answers.push_back(stub->GetNode(context().get(), v1::GetNodeRequest(), &node));
    {
      v1::DrainResponse r;  // pausing scheduling and stopping jobs: never without the token
      answers.push_back(stub->Drain(context().get(), v1::DrainRequest(), &r));
    }
    {
      auto c = context();
      v1::JobEvent e;
      auto reader = stub->WatchJob(c.get(), v1::WatchJobRequest());
      EXPECT_FALSE(reader->Read(&e));
      answers.push_back(reader->Finish());
    }
    {
      auto c = context();
      v1::LogLine l;
      auto reader = stub->ReadLogs(c.get(), v1::ReadLogsRequest());
      EXPECT_FALSE(reader->Read(&l));
      answers.push_back(reader->Finish());
    }
    {
      // ReadHistory, too: without the token it must not even say whether the job exists.
      auto c = context();
      v1::JobEvent e;
      v1::ReadHistoryRequest request;
      request.set_id("job-1");
      auto reader = stub->ReadHistory(c.get(), request);
      EXPECT_FALSE(reader->Read(&e));
      answers.push_back(reader->Finish());
    }
    ASSERT_EQ(answers.size(), 11u);  // every JobService method
    for (const grpc::Status& st : answers) {
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << header;
      EXPECT_EQ(st.error_message().find("0123456789abcdef"), std::string::npos)
          << st.error_message();
    }
  }
  server->Shutdown();
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// Error messages go out as valid UTF-8 too (clients decode them), however long the input.
TEST(ServicesTest, ErrorMessagesAreValidUtf8) {
  grpc::Status st = ToGrpc(absl::NotFoundError("data.path: /data/caf\xE9.tok: no such file"));
  EXPECT_TRUE(IsValidUtf8(st.error_message())) << st.error_message();
  EXPECT_NE(st.error_message().find("caf\xEF\xBF\xBD.tok"), std::string::npos);
  std::string cut_in_a_character = std::string(2047, 'x') + "\xE2\x82\xAC";
  EXPECT_TRUE(IsValidUtf8(ToGrpc(absl::InternalError(cut_in_a_character)).error_message()));
}

// Every string of a message the daemon sends, nested and repeated ones included, becomes valid
// UTF-8; the message then parses at the receiver.
TEST(ServicesTest, SanitizeUtf8ReachesEveryStringField) {
  v1::Job job;
  job.set_id("job-1");
  job.set_reason("data.path: /data/caf\xE9.tok: not a token file");
  job.add_transitions()->set_reason("ok");
  job.add_transitions()->set_reason("bad \xFF byte");
  job.mutable_spec()->set_data_path("/data/\xE9t\xE9/*.tok");
  v1::ListJobsResponse list;
  *list.add_jobs() = job;
  EXPECT_EQ(SanitizeUtf8(&list), 3);
  const v1::Job& out = list.jobs(0);
  EXPECT_EQ(out.reason(), "data.path: /data/caf\xEF\xBF\xBD.tok: not a token file");
  EXPECT_EQ(out.transitions(0).reason(), "ok");
  EXPECT_TRUE(IsValidUtf8(out.transitions(1).reason()));
  EXPECT_TRUE(IsValidUtf8(out.spec().data_path()));
  EXPECT_EQ(out.id(), "job-1");
  v1::ListJobsResponse parsed;
  EXPECT_TRUE(parsed.ParseFromString(list.SerializeAsString()));
  EXPECT_EQ(SanitizeUtf8(&list), 0);
}

// A request whose string field is not UTF-8 gets INVALID_ARGUMENT naming the method and the
// cause, not INTERNAL with an empty message; a well-formed one goes on to the handler.
TEST(ServicesTest, InvalidUtf8RequestsGetInvalidArgument) {
  JobServiceImpl service(nullptr, std::make_shared<Authenticator>("0123456789abcdef-token"));
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  AddRpcBoundary(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_TRUE(server);
  std::shared_ptr<grpc::Channel> channel = server->InProcessChannel(grpc::ChannelArguments());
  // GetJobRequest{id = "caf\xE9"} by hand: field 1, length-delimited, 4 bytes.
  const std::string wire = std::string("\x0A\x04", 2) + "caf\xE9";
  for (const char* method : {"/ithaca.v1.JobService/GetJob", "/ithaca.v1.JobService/ReadHistory"}) {
    const bool streaming = std::string(method).find("ReadHistory") != std::string::npos;
    grpc::ClientContext context;
    grpc::Slice slice(wire);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::Status st;
    if (streaming) {
      std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
          grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(
              channel.get(),
              grpc::internal::RpcMethod(method, grpc::internal::RpcMethod::SERVER_STREAMING),
              &context, request));
      while (reader->Read(&response)) {
      }
      st = reader->Finish();
    } else {
      st = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
          channel.get(), grpc::internal::RpcMethod(method, grpc::internal::RpcMethod::NORMAL_RPC),
          &context, request, &response);
    }
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_NE(st.error_message().find("not valid UTF-8"), std::string::npos) << st.error_message();
    EXPECT_NE(st.error_message().find(method), std::string::npos) << st.error_message();
  }
  // Valid UTF-8 reaches the handler (here: the token check).
  auto stub = v1::JobService::NewStub(channel);
  grpc::ClientContext context;
  v1::GetJobRequest get;
  get.set_id("caf\xC3\xA9");
  v1::Job job;
  EXPECT_EQ(stub->GetJob(&context, get, &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  server->Shutdown();
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// With the default health service on, gRPC binds a server's port twice; for ":0" the second
// listener got a port of its own. ChooseListenPort picks the port first.
TEST(ServicesTest, ChooseListenPortPicksAFreePortForZero) {
  EXPECT_EQ(*ChooseListenPort("127.0.0.1:7000"), "127.0.0.1:7000");
  EXPECT_EQ(*ChooseListenPort("unix:/tmp/x.sock"), "unix:/tmp/x.sock");
  EXPECT_EQ(*ChooseListenPort("[::1]:7001"), "[::1]:7001");
  // No port would have been :443 (gRPC's default): refused, naming the form.
  for (const char* bad :
       {"127.0.0.1", "::1", "[::1]", "localhost:", "127.0.0.1:http", "127.0.0.1:70000"}) {
    absl::StatusOr<std::string> st = ChooseListenPort(bad);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.status().message().find("give host:port"), std::string::npos) << st.status();
  }
  absl::StatusOr<std::string> chosen = ChooseListenPort("127.0.0.1:0");
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  ASSERT_EQ(chosen->rfind("127.0.0.1:", 0), 0u) << *chosen;
  const int port = std::stoi(chosen->substr(10));
  EXPECT_GT(port, 0);
  grpc::EnableDefaultHealthCheckService(true);
  JobServiceImpl service(nullptr);
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(*chosen, grpc::InsecureServerCredentials(), &bound);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_TRUE(server);
  EXPECT_EQ(bound, port);
  server->Shutdown();
  grpc::EnableDefaultHealthCheckService(false);
}

}  // namespace
}  // namespace ithaca
