// The cuDNN and NCCL this test binary loads report their versions, at least the ones it was
// needs (the worker prints these lines at start and refuses a library older than that).
#include <gtest/gtest.h>

#include "engine/backend/cuda/cuda_backend.h"
#include "engine/comm/nccl/nccl_connect.h"

namespace ithaca {
namespace {

TEST(LibraryVersions, CudnnLoadedIsAtLeastBuilt) {
  auto report = CudnnVersionReport();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->rfind("cuDNN 9.", 0), 0u) << *report;
  EXPECT_NE(report->find("(built with 9."), std::string::npos) << *report;
  std::printf("%s\n", report->c_str());
}

TEST(LibraryVersions, NcclLoadedIsAtLeastBuilt) {
  auto report = NcclVersionReport();
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->rfind("NCCL 2.", 0), 0u) << *report;
  EXPECT_NE(report->find("(built with 2."), std::string::npos) << *report;
  std::printf("%s\n", report->c_str());
}

}  // namespace
}  // namespace ithaca
