#include "engine/core/library_version.h"

#include <gtest/gtest.h>

namespace ithaca {
namespace {

TEST(LibraryVersion, FormatsMajorMinorPatch) {
  EXPECT_EQ(FormatLibraryVersion(91900), "9.19.0");
  EXPECT_EQ(FormatLibraryVersion(22809), "2.28.9");
  EXPECT_EQ(FormatLibraryVersion(92701), "9.27.1");
}

TEST(LibraryVersion, SameOrNewerLoadedIsFine) {
  auto same = CheckLibraryVersion("cuDNN", 91400, 91400, kMinCudnnVersion);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(*same, "cuDNN 9.14.0 (built with 9.14.0)");
  auto newer = CheckLibraryVersion("NCCL", 22809, 23203, kMinNcclVersion);
  ASSERT_TRUE(newer.ok()) << newer.status();
  EXPECT_EQ(*newer, "NCCL 2.32.3 (built with 2.28.9)");
}

TEST(LibraryVersion, OlderThanTheHeadersButNotThanTheMinimumIsFine) {
  // Built against 9.19 headers, run on the GPU hosts' 9.14.
  auto older = CheckLibraryVersion("cuDNN", 91900, 91400, kMinCudnnVersion);
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(*older, "cuDNN 9.14.0 (built with 9.19.0)");
}

TEST(LibraryVersion, TooOldOrAnotherMajorIsAnErrorNamingBoth) {
  auto old = CheckLibraryVersion("cuDNN", 92700, 91000, kMinCudnnVersion);
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(old.status().message().find("cuDNN 9.10.0 is loaded but Ithaca needs cuDNN 9.14.0 "
                                        "or newer"),
            std::string::npos)
      << old.status();
  auto major = CheckLibraryVersion("NCCL", 22809, 30001, kMinNcclVersion);
  ASSERT_FALSE(major.ok());
  EXPECT_NE(major.status().message().find("NCCL 3.0.1 is loaded but Ithaca needs NCCL 2.x"),
            std::string::npos)
      << major.status();
}

TEST(LibraryVersion, NothingLoadedIsUnavailable) {
  auto none = CheckLibraryVersion("cuDNN", 91900, 0, kMinCudnnVersion);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("9.19.0"), std::string::npos) << none.status();
}

TEST(LibraryReport, JoinsTheReportsAndRefusesTheFirstTooOld) {
  LibraryReport fine =
      CombineLibraryReports({CheckLibraryVersion("cuDNN", 91900, 91900, kMinCudnnVersion),
                             CheckLibraryVersion("NCCL", 22809, 22809, kMinNcclVersion)});
  EXPECT_TRUE(fine.refusal.ok()) << fine.refusal;
  EXPECT_EQ(fine.line, "cuDNN 9.19.0 (built with 9.19.0), NCCL 2.28.9 (built with 2.28.9)");

  // A library that cannot be loaded is named in its place, and refuses nothing.
  LibraryReport missing =
      CombineLibraryReports({CheckLibraryVersion("cuDNN", 91900, 0, kMinCudnnVersion),
                             CheckLibraryVersion("NCCL", 22809, 22809, kMinNcclVersion)});
  EXPECT_TRUE(missing.refusal.ok()) << missing.refusal;
  EXPECT_EQ(missing.line,
            "cuDNN: built with 9.19.0 but none could be loaded, NCCL 2.28.9 (built with 2.28.9)");

  LibraryReport old =
      CombineLibraryReports({CheckLibraryVersion("cuDNN", 91900, 91900, kMinCudnnVersion),
                             CheckLibraryVersion("NCCL", 22809, 21000, kMinNcclVersion)});
  EXPECT_EQ(old.refusal.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(old.refusal.message().find("NCCL 2.10.0 is loaded"), std::string::npos) << old.refusal;
  EXPECT_NE(old.line.find("cuDNN 9.19.0 (built with 9.19.0), NCCL 2.10.0 is loaded"),
            std::string::npos)
      << old.line;
}

}  // namespace
}  // namespace ithaca
