// What the gRPC handlers send back: an error never carries a client's unbounded input whole.
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
