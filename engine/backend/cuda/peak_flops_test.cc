#include "engine/backend/cuda/peak_flops.h"

#include "gtest/gtest.h"

namespace ithaca {
namespace {

TEST(PeakFlopsTest, KnownGpusByTheNamesCudaReports) {
  EXPECT_EQ(PeakBf16Flops("NVIDIA H200"), 989e12);
  EXPECT_EQ(PeakBf16Flops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(PeakBf16Flops("NVIDIA GH200 480GB"), 989e12);
  EXPECT_EQ(PeakBf16Flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(PeakBf16Flops("NVIDIA H100 NVL"), 835e12);
  EXPECT_EQ(PeakBf16Flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(PeakBf16Flops("NVIDIA A100-PCIE-40GB"), 312e12);
}

TEST(PeakFlopsTest, AnUnknownGpuHasNoPeak) {
  EXPECT_EQ(PeakBf16Flops("NVIDIA GeForce RTX 4090"), 0);
  EXPECT_EQ(PeakBf16Flops(""), 0);
}

}  // namespace
}  // namespace ithaca
