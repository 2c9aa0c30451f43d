// Shared bits of the benchmark programs: the device's name, CUDA-event timing and medians, and
// a tiny JSON writer (each measurement is one JSON line on stdout, docs/benchmarks.md).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ithaca {
namespace bench {

// Today's date (UTC), YYYY-MM-DD, for the "date" field of every result line.
inline std::string Today() {
  const std::time_t now = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

// What the current GPU has in use (cudaMemGetInfo: total less free): on a GPU this process has
// to itself, the whole process's memory (CUDA context, libraries, NCCL, the allocator's
// reservations), which the planner's prediction is held against.
inline int64_t DeviceUsedBytes() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return 0;
  return static_cast<int64_t>(total_bytes - free_bytes);
}

inline std::string DeviceName() {
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "unknown";
  return p.name;
}

// Milliseconds of `fn` (enqueued on `stream`), timed with events; one warm-up run first.
inline std::vector<double> TimeMs(cudaStream_t stream, int warmup, int iters,
                                  const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaStreamSynchronize(stream);
  std::vector<double> ms;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(a, stream);
    fn();
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Builds {"k": v, ...} in insertion order.
class Json {
 public:
  Json& Str(const std::string& k, const std::string& v) {
    return Raw(k, absl::StrCat("\"", v, "\""));
  }
  Json& Num(const std::string& k, double v) { return Raw(k, absl::StrFormat("%.6g", v)); }
  Json& Int(const std::string& k, int64_t v) { return Raw(k, absl::StrCat(v)); }
  Json& Null(const std::string& k) { return Raw(k, "null"); }
  Json& Bool(const std::string& k, bool v) { return Raw(k, v ? "true" : "false"); }
  Json& Obj(const std::string& k, const Json& v) { return Raw(k, v.str()); }
  Json& Raw(const std::string& k, const std::string& v) {
    absl::StrAppend(&body_, body_.empty() ? "" : ", ", "\"", k, "\": ", v);
    return *this;
  }
  std::string str() const { return absl::StrCat("{", body_, "}"); }
  void Print() const {
    std::printf("%s\n", str().c_str());
    std::fflush(stdout);
  }

 private:
  std::string body_;
};

}  // namespace bench
}  // namespace ithaca
