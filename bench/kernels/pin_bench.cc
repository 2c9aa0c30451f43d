// Pinning host memory: cudaHostAlloc against mmap + parallel first touch + cudaHostRegister
// (engine/backend/cuda/pinned_host.h), at each size: the time to obtain the zeroed, pinned block,
// its pinning rate, and a host-to-device copy from it (a pinned block copies at PCIe speed; a
// block the driver does not see as pinned would be staged, far slower). One JSON line per
// (size, method, threads). Without a GPU it says so on stderr and exits 0.
#include <chrono>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "engine/backend/cuda/pinned_host.h"
#include "engine/core/units.h"

ABSL_FLAG(std::string, sizes_gib, "4,16", "comma-separated block sizes in GiB");
ABSL_FLAG(std::string, threads, "1,16", "touch threads for the register method (0: every core)");

namespace ithaca {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Host-to-device GB/s of a 1 GiB copy from the start of the block.
double CopyGbps(void* host, void* dev, size_t bytes) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, 0);  // warm
  cudaEventRecord(a, 0);
  cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, 0);
  cudaEventRecord(b, 0);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return bytes / (ms * 1e-3) / 1e9;
}

int Main() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::fprintf(stderr, "pin_bench: no GPU\n");
    return 0;
  }
  constexpr size_t kCopy = static_cast<size_t>(kGiBBytes);
  void* dev = nullptr;
  if (cudaMalloc(&dev, kCopy) != cudaSuccess) return 1;
  for (absl::string_view gib_s : absl::StrSplit(absl::GetFlag(FLAGS_sizes_gib), ',')) {
    double gib = 0;
    if (!absl::SimpleAtod(gib_s, &gib)) return 2;
    const size_t bytes = static_cast<size_t>(gib * kGiB);
    struct Way {
      PinMethod method;
      int threads;
    };
    std::vector<Way> ways = {{PinMethod::kHostAlloc, 1}};
    for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
      int n = 0;
      if (absl::SimpleAtoi(t, &n)) ways.push_back({PinMethod::kRegister, n});
    }
    for (const Way& w : ways) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<void*> p = AllocatePinnedHost(bytes, w.method, w.threads);
      const double pin_s = Seconds(start);
      bench::Json line;
      line.Str("bench", "pin")
          .Str("date", bench::Today())
          .Str("gpu", bench::DeviceName())
          .Num("gib", gib)
          .Str("method", w.method == PinMethod::kHostAlloc ? "cudaHostAlloc" : "register")
          .Int("threads", w.threads);
      if (!p.ok()) {
        line.Str("error", std::string(p.status().message())).Print();
        continue;
      }
      line.Num("pin_s", pin_s)
          .Num("pin_gb_per_s", bytes / pin_s / 1e9)
          .Num("h2d_gb_per_s", CopyGbps(*p, dev, std::min(kCopy, bytes)));
      const auto free_start = std::chrono::steady_clock::now();
      FreePinnedHost(*p, bytes, w.method);
      line.Num("free_s", Seconds(free_start)).Print();
    }
  }
  cudaFree(dev);
  return 0;
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ithaca::Main();
}
