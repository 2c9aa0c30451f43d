// Error checks for CUDA runtime calls and kernel launches, carrying file and line.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace ithaca {

inline void CudaCheckImpl(cudaError_t err, const char* file, int line) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s:%d: CUDA error: %s\n", file, line, cudaGetErrorString(err));
    std::abort();
  }
}

}  // namespace ithaca

#define cudaCheck(call) ::ithaca::CudaCheckImpl((call), __FILE__, __LINE__)
// After a kernel launch: catches bad launch configurations at once.
#define cudaCheckLaunch() ::ithaca::CudaCheckImpl(cudaGetLastError(), __FILE__, __LINE__)
