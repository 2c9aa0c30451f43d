// The peak dense bf16 tensor-core rate of a GPU, by the name CUDA reports for it: the denominator
// of model FLOPs utilization (MFU). Kept apart from CudaOps so it can be checked without a GPU.
#pragma once

#include <string>

namespace ithaca {

// FLOP/s from the vendor's data sheet (dense, no sparsity): H100 SXM, H200 and GH200 989e12;
// H100 NVL 835e12; H100 PCIe 756e12; A100 312e12. 0 for any other name: MFU is then unknown
// rather than wrong.
double PeakBf16Flops(const std::string& device_name);

}  // namespace ithaca
