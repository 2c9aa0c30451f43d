// What the gRPC handlers send back: an error never carries a client's unbounded input whole;
// no JobService call gets past a missing or wrong token.
#include "server/services.h"

#include <gtest/gtest.h>

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
    v1::ListJobsResponse list;
    answers.push_back(stub->ListJobs(context().get(), v1::ListJobsRequest(), &list));
    v1::PlanJobResponse plan;
    answers.push_back(stub->PlanJob(context().get(), v1::PlanJobRequest(), &plan));
    v1::NodeInfo node;
    answers.push_back(stub->GetNode(context().get(), v1::GetNodeRequest(), &node));
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
    ASSERT_EQ(answers.size(), 8u);
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
