// cuBLASLt GEMM through CudaOps: bf16 operands, f32 compute; C bf16 (beta 0) and C f32 (beta 1,
// the gradient case). TFLOPS = 2·m·n·k / time, median of --iters after a warm-up.
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_ops.h"

ABSL_FLAG(std::string, shapes, "8192:8192:8192,16384:8192:2048,16384:2048:8192",
          "comma-separated m:n:k (row-major c[m, n] = a[m, k] · b[n, k]ᵀ)");
ABSL_FLAG(int, iters, 20, "timed repetitions (median reported)");

namespace ithaca {
namespace {

int Main() {
  CudaAllocator alloc;
  CudaOps::Options o;
  o.alloc = &alloc;
  CudaOps ops(o);
  const std::string device = bench::DeviceName();
  std::mt19937_64 gen(1);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (absl::string_view spec : absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',')) {
    std::vector<std::string> f = absl::StrSplit(spec, ':');
    ITHACA_CHECK(f.size() == 3, "bad shape ", spec);
    const int64_t m = std::stoll(f[0]), n = std::stoll(f[1]), k = std::stoll(f[2]);
    for (DType ct : {DType::kBF16, DType::kF32}) {
      auto mk = [&](DType t, Shape s) {
        auto b = Buffer::Make(&alloc, t, s, Tier::kActivations);
        ITHACA_CHECK(b.ok(), "allocation: ", b.status().ToString());
        std::vector<float> host(b->tensor().numel());
        for (float& x : host) x = dist(gen);  // random data: zeros run faster than real data
        ops.Upload(host.data(), DType::kF32, b->tensor());
        return std::move(*b);
      };
      Buffer a = mk(DType::kBF16, {m, k}), b = mk(DType::kBF16, {n, k}), c = mk(ct, {m, n});
      const float beta = ct == DType::kF32 ? 1.f : 0.f;
      const int iters = absl::GetFlag(FLAGS_iters);
      const double ms = bench::Median(bench::TimeMs(ops.stream(), 2, iters, [&] {
        ops.Gemm(a.tensor(), false, b.tensor(), true, c.tensor(), 1.f, beta);
      }));
      bench::Json()
          .Str("bench", "gemm")
          .Str("date", bench::Today())
          .Str("device", device)
          .Int("m", m)
          .Int("n", n)
          .Int("k", k)
          .Str("c_dtype", DTypeName(ct))
          .Num("beta", beta)
          .Num("ms", ms)
          .Num("tflops", 2.0 * m * n * k / (ms * 1e-3) / 1e12)
          .Int("iters", iters)
          .Print();
    }
  }
  return 0;
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ithaca::Main();
}
