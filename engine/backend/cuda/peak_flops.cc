#include "engine/backend/cuda/peak_flops.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace ithaca {

double PeakBf16Flops(const std::string& device_name) {
  // "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200",
  // "NVIDIA GH200 480GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB".
  const std::string name = absl::AsciiStrToUpper(device_name);
  if (absl::StrContains(name, "H200")) return 989e12;  // H200 and GH200
  if (absl::StrContains(name, "H100")) {
    if (absl::StrContains(name, "PCIE")) return 756e12;
    if (absl::StrContains(name, "NVL")) return 835e12;
    return 989e12;
  }
  if (absl::StrContains(name, "A100")) return 312e12;
  return 0;
}

}  // namespace ithaca
