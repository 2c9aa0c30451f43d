// cuBLASLt GEMM through CudaOps: bf16 operands, f32 compute; C bf16 (beta 0) and C f32 (beta 1,
// the gradient case). TFLOPS = 2·m·n·k / time, median of --iters after a warm-up. A shape may
// name its layout (m:n:k:TN is c = aᵀ·b with a [k, m], b [k, n]; default NT, b [n, k]);
// --heuristics=N times each of cuBLASLt's first N ranked algorithms (CudaOps::Options::
// gemm_heuristic), and --timed (the default) then the choice training makes, the fastest of the
// first few as timed on a shape's first calls (heuristic -1 in the JSON; LtGemm).
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/kernels/fill_random.h"
#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/gemm.h"

ABSL_FLAG(std::string, shapes, "8192:8192:8192,16384:8192:2048,16384:2048:8192",
          "comma-separated m:n:k[:LAYOUT] (row-major c[m, n] = op(a) · op(b); LAYOUT, default "
          "NT, is a's then b's: N as stored, T transposed)");
ABSL_FLAG(int, heuristics, 1, "time each of cuBLASLt's first N ranked algorithms");
ABSL_FLAG(bool, timed, true, "then time training's choice (LtGemm's kGemmTimed)");
ABSL_FLAG(std::string, c_dtypes, "bf16,f32", "c's types: bf16 (beta 0), f32 (beta 1)");
ABSL_FLAG(int, iters, 20, "timed repetitions (median reported)");

namespace ithaca {
namespace {

struct Case {
  int64_t m, n, k;
  std::string layout;  // a's then b's: N as stored, T transposed
  DType c;
};

// --shapes × --c_dtypes, checked before anything runs.
std::vector<Case> Cases() {
  std::vector<Case> out;
  for (absl::string_view spec : absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',')) {
    std::vector<std::string> f = absl::StrSplit(spec, ':');
    ITHACA_CHECK(f.size() == 3 || f.size() == 4, "bad shape ", spec);
    const std::string layout = f.size() == 4 ? f[3] : "NT";
    ITHACA_CHECK(layout.size() == 2 && absl::StrContains("NT", layout[0]) &&
                     absl::StrContains("NT", layout[1]),
                 "bad layout ", layout, " in ", spec, " (NN, NT, TN or TT)");
    for (absl::string_view ctn : absl::StrSplit(absl::GetFlag(FLAGS_c_dtypes), ',')) {
      ITHACA_CHECK(ctn == "bf16" || ctn == "f32", "bad --c_dtypes entry ", ctn);
      out.push_back({std::stoll(f[0]), std::stoll(f[1]), std::stoll(f[2]), layout,
                     ctn == "f32" ? DType::kF32 : DType::kBF16});
    }
  }
  return out;
}

int Main() {
  const std::vector<Case> cases = Cases();
  CudaAllocator alloc;
  const std::string device = bench::DeviceName();
  uint64_t seed = 1;
  std::vector<int> heuristics;
  for (int h = 0; h < absl::GetFlag(FLAGS_heuristics); ++h) heuristics.push_back(h);
  if (absl::GetFlag(FLAGS_timed)) heuristics.push_back(cuda::kGemmTimed);
  for (int heuristic : heuristics) {
    CudaOps::Options o;
    o.alloc = &alloc;
    o.gemm_heuristic = heuristic;
    CudaOps ops(o);
    for (const Case& cs : cases) {
      const int64_t m = cs.m, n = cs.n, k = cs.k;
      const bool ta = cs.layout[0] == 'T', tb = cs.layout[1] == 'T';
      const DType ct = cs.c;
      auto mk = [&](DType t, Shape s) {
        auto b = Buffer::Make(&alloc, t, s, Tier::kActivations);
        ITHACA_CHECK(b.ok(), "allocation: ", b.status().ToString());
        // Random data (zeros run faster than real data), made on the device: the loss head's
        // [V, d] operands are hundreds of millions of elements.
        bench::FillRandom(ops, &alloc, b->tensor(), seed++);
        return std::move(*b);
      };
      Buffer a = mk(DType::kBF16, ta ? Shape{k, m} : Shape{m, k});
      Buffer b = mk(DType::kBF16, tb ? Shape{n, k} : Shape{k, n});
      Buffer c = mk(ct, {m, n});
      const float beta = ct == DType::kF32 ? 1.f : 0.f;
      const int iters = absl::GetFlag(FLAGS_iters);
      // The warm-up holds the timed choice's trials.
      const int warmup = 2 + (heuristic == cuda::kGemmTimed
                                  ? cuda::LtGemm::kTimedCandidates * cuda::LtGemm::kTimedCallsEach
                                  : 0);
      const double ms = bench::Median(bench::TimeMs(ops.stream(), warmup, iters, [&] {
        ops.Gemm(a.tensor(), ta, b.tensor(), tb, c.tensor(), 1.f, beta);
      }));
      bench::Json()
          .Str("bench", "gemm")
          .Str("date", bench::Today())
          .Str("device", device)
          .Int("m", m)
          .Int("n", n)
          .Int("k", k)
          .Str("layout", cs.layout)
          .Str("c_dtype", DTypeName(ct))
          .Num("beta", beta)
          .Int("heuristic", heuristic)
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
