// Device helpers for packed samples (ops.h's DocumentMask): `starts` holds the first sample
// index of each document, ascending, starts[0] == 0; n == 0 means one document.
#pragma once

#include <cstdint>

namespace ithaca {
namespace cuda {

// The start of the document holding sample index i: the last starts[j] <= i.
__device__ __forceinline__ int64_t DocStart(const int64_t* starts, int64_t n, int64_t i) {
  if (n == 0) return 0;
  int64_t lo = 0, hi = n - 1;  // starts[lo] <= i always holds (starts[0] == 0)
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (starts[mid] <= i) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return starts[lo];
}

// One past the last index of the document holding i: the first starts[j] > i, else s.
__device__ __forceinline__ int64_t DocEnd(const int64_t* starts, int64_t n, int64_t s, int64_t i) {
  int64_t lo = 0, hi = n;  // the first j with starts[j] > i, in [0, n]
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (starts[mid] <= i) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < n ? starts[lo] : s;
}

}  // namespace cuda
}  // namespace ithaca
