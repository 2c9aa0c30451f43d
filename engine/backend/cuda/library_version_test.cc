#include "engine/backend/cuda/library_version.h"

#include <gtest/gtest.h>

namespace ithaca {
namespace {

TEST(LibraryVersion, FormatsMajorMinorPatch) {
  EXPECT_EQ(FormatLibraryVersion(91900), "9.19.0");
  EXPECT_EQ(FormatLibraryVersion(22809), "2.28.9");
  EXPECT_EQ(FormatLibraryVersion(92701), "9.27.1");
}

TEST(LibraryVersion, SameOrNewerLoadedIsFine) {
  auto same = CheckLibraryVersion("cuDNN", 91400, 91400);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(*same, "cuDNN 9.14.0 (built with 9.14.0)");
  auto newer = CheckLibraryVersion("NCCL", 22809, 23203);
  ASSERT_TRUE(newer.ok()) << newer.status();
  EXPECT_EQ(*newer, "NCCL 2.32.3 (built with 2.28.9)");
}

TEST(LibraryVersion, OlderLoadedIsAnErrorNamingBoth) {
  auto older = CheckLibraryVersion("cuDNN", 92700, 91400);
  ASSERT_FALSE(older.ok());
  EXPECT_EQ(older.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(older.status().message().find("cuDNN 9.14.0 is loaded"), std::string::npos)
      << older.status();
  EXPECT_NE(older.status().message().find("built with cuDNN 9.27.0"), std::string::npos)
      << older.status();
}

TEST(LibraryVersion, NothingLoadedIsUnavailable) {
  auto none = CheckLibraryVersion("cuDNN", 91900, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("9.19.0"), std::string::npos) << none.status();
}

}  // namespace
}  // namespace ithaca
