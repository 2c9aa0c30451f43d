// The bandwidth-bound kernels through CudaOps: RMSNorm forward and backward, SwiGLU forward and
// backward, RoPE, on bf16 [rows, d] tensors. Prints one JSON line per (shape, kernel) with the
// median time and the achieved bandwidth: the bytes each kernel must move (every input read once,
// every output written once; an accumulated output is read and written) over that time.
// Without a GPU it says so on stderr and exits 0.
#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/kernels/fill_random.h"
#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_ops.h"

ABSL_FLAG(std::string, shapes, "65536:2048,4097:2050",
          "comma-separated rows:d (d % 8 != 0 takes the scalar fallbacks)");
ABSL_FLAG(int, iters, 20, "timed repetitions per kernel (median reported)");

namespace ithaca {
namespace {

// The head size RoPE sees when [rows, d] is read as [rows, d / D, D]: 128 where it divides d,
// else the largest even divisor below it (0: d is odd, no RoPE).
int64_t RopeHeadDim(int64_t d) {
  for (int64_t D = 128; D >= 2; D -= 2) {
    if (d % D == 0) return D;
  }
  return 0;
}

// The memory bandwidth the device reports (memory clock · 2 (double data rate) · bus width), the
// figure the achieved bandwidth is read against.
double PeakGbps() {
  int dev = 0, khz = 0, bits = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) {
    return 0;
  }
  return 2.0 * khz * 1e3 * (bits / 8) / 1e9;
}

int Main() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::fprintf(stderr, "norm_bench: no CUDA GPU on this machine: skipped\n");
    return 0;
  }
  CudaAllocator alloc;
  CudaOps::Options o;
  o.alloc = &alloc;
  CudaOps ops(o);
  const std::string device = bench::DeviceName();
  const double peak_gbps = PeakGbps();
  const int iters = absl::GetFlag(FLAGS_iters);
  for (absl::string_view spec : absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',')) {
    std::vector<std::string> f = absl::StrSplit(spec, ':');
    ITHACA_CHECK(f.size() == 2, "bad shape ", spec);
    const int64_t rows = std::stoll(f[0]), d = std::stoll(f[1]);
    auto mk = [&](DType t, Shape s) {
      auto b = Buffer::Make(&alloc, t, std::move(s), Tier::kActivations);
      ITHACA_CHECK(b.ok(), "allocation: ", b.status().ToString());
      return std::move(*b);
    };
    // Five [rows, d] bf16 tensors, reused across the kernels (a, b inputs; c, e outputs; dx
    // accumulated).
    Buffer a = mk(DType::kBF16, {rows, d}), b = mk(DType::kBF16, {rows, d});
    Buffer c = mk(DType::kBF16, {rows, d}), e = mk(DType::kBF16, {rows, d});
    Buffer dx = mk(DType::kBF16, {rows, d});
    Buffer w = mk(DType::kBF16, {d}), dw = mk(DType::kF32, {d}), rstd = mk(DType::kF32, {rows});
    bench::FillRandom(ops, &alloc, a.tensor(), 1);
    bench::FillRandom(ops, &alloc, b.tensor(), 2);
    bench::FillRandom(ops, &alloc, c.tensor(), 3);
    bench::FillRandom(ops, &alloc, w.tensor(), 4);
    ops.Fill(dx.tensor(), 0.f);
    ops.Fill(dw.tensor(), 0.f);

    const double elems = double(rows) * double(d);  // one [rows, d] bf16 tensor: 2 bytes each
    auto report = [&](const char* kernel, double bytes, const std::function<void()>& fn,
                      int64_t head_dim = 0) {
      const double ms = bench::Median(bench::TimeMs(ops.stream(), 2, iters, fn));
      bench::Json j;
      j.Str("bench", "kernel")
          .Str("date", bench::Today())
          .Str("device", device)
          .Str("kernel", kernel)
          .Int("rows", rows)
          .Int("d", d);
      if (head_dim > 0) j.Int("head_dim", head_dim);
      j.Num("ms", ms)
          .Num("gbps", bytes / (ms * 1e-3) / 1e9)
          .Num("peak_gbps", peak_gbps)
          .Int("iters", iters)
          .Print();
    };

    // x = a, w → out = c, rstd.
    report("rmsnorm_fwd", 2 * elems * 2 + d * 2 + rows * 4,
           [&] { ops.RmsNorm(a.tensor(), w.tensor(), 1e-5f, c.tensor(), rstd.tensor()); });
    // x = a, dout = b, dx += (read and written), dw += (f32, once per block: not counted).
    report("rmsnorm_bwd", 4 * elems * 2 + d * 2 + rows * 4, [&] {
      ops.RmsNormBackward(a.tensor(), w.tensor(), rstd.tensor(), b.tensor(), dx.tensor(),
                          dw.tensor());
    });
    // gate = a, up = b → out = c.
    report("swiglu_fwd", 3 * elems * 2, [&] { ops.SwiGLU(a.tensor(), b.tensor(), c.tensor()); });
    // gate = a, up = b, dout = c → dgate = dx, dup = e (not in place: the inputs stay the same).
    report("swiglu_bwd", 5 * elems * 2, [&] {
      ops.SwiGLUBackward(a.tensor(), b.tensor(), c.tensor(), dx.tensor(), e.tensor());
    });
    // In place on a as [rows, d / D, D] (a rotation: repeats keep the values bounded).
    const int64_t D = RopeHeadDim(d);
    if (D > 0) {
      RopeConfig rc;
      rc.head_dim = static_cast<int>(D);
      const std::vector<float> inv = RopeInverseFrequencies(rc);
      Buffer inv_freq = mk(DType::kF32, {D / 2});
      ops.Upload(inv.data(), DType::kF32, inv_freq.tensor());
      const Tensor x = a.tensor().Reshaped({rows, d / D, D});
      auto rope = [&] { ops.Rope(x, 0, inv_freq.tensor(), false, DocumentMask{}); };
      report("rope", 2 * elems * 2, rope, D);
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
