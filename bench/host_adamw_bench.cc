// The CPU AdamW of optimizer offload (engine/train/host_adamw.h) against the host's memory
// bandwidth, measured in the same run. One JSON line per thread count:
//   copy_gb_per_s      a STREAM-like copy (b[i] = a[i] over --copy_gib, every thread): bytes
//                      read + written per second
//   params_per_s       AdamW updates per second over --params parameters (master, m, v, f32
//                      gradient, bf16 working copy: 16 bytes read and 14 written per parameter)
//   bound_params_per_s copy_gb_per_s / 30 bytes: what the bandwidth allows
//   fraction_of_bound  params_per_s / bound_params_per_s (the bar: >= 0.6)
// Runs on any host (no GPU): `bazel run //bench:host_adamw_bench -- --params=268435456`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/core/units.h"
#include "engine/train/host_adamw.h"

ABSL_FLAG(int64_t, params, int64_t{256} << 20, "parameters per AdamW pass");
ABSL_FLAG(double, copy_gib, 2.0, "GiB copied per STREAM-like pass (read as much, write as much)");
ABSL_FLAG(int, reps, 5, "timed passes (the best is reported), after one untimed pass");
ABSL_FLAG(std::string, threads, "0", "comma-separated thread counts (0: one per core)");
ABSL_FLAG(std::string, tag, "", "free-form label copied into each line");

namespace ithaca {
namespace {

double Best(int reps, const std::function<void()>& f) {
  f();  // first touch and warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

std::string Today() {
  std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

void RunOne(int threads) {
  HostThreadPool pool(threads);
  const int reps = absl::GetFlag(FLAGS_reps);
  const int64_t words = static_cast<int64_t>(absl::GetFlag(FLAGS_copy_gib) * kGiB) / 4;
  std::vector<float> a(words), b(words);
  // Every thread touches its own pages first, as it will in the timed passes.
  pool.ParallelFor(words, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) a[i] = float(i & 1023), b[i] = 0.f;
  });
  const double copy_s = Best(reps, [&] {
    pool.ParallelFor(words, 1 << 16, [&](int64_t lo, int64_t hi) {
      std::memcpy(b.data() + lo, a.data() + lo, (hi - lo) * sizeof(float));
    });
  });
  const double copy_gbs = 2.0 * words * 4 / copy_s / 1e9;
  a = {};
  b = {};

  const int64_t n = absl::GetFlag(FLAGS_params);
  std::vector<float> master(n), m(n), v(n), grad(n);
  std::vector<uint16_t> working(n);
  pool.ParallelFor(n, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      master[i] = 0.01f * float((i * 7919) % 2001 - 1000) / 1000.f;
      grad[i] = 1e-3f * float((i * 104729) % 2001 - 1000) / 1000.f;
      m[i] = v[i] = 0.f;
      working[i] = 0;
    }
  });
  HostAdamWSpan s;
  s.master = master.data();
  s.grad = grad.data();
  s.m = m.data();
  s.v = v.data();
  s.working = working.data();
  s.working_dtype = DType::kBF16;
  s.n = n;
  AdamWParams p;
  p.lr = 1e-4f;
  p.weight_decay = 0.1f;
  int64_t step = 1;
  const double adamw_s = Best(reps, [&] {
    p.step = step++;
    HostAdamW(s, p, &pool);
  });
  const double params_s = n / adamw_s;
  const double bound = copy_gbs * 1e9 / 30.0;
  std::string line = absl::StrFormat(
      "{\"bench\": \"host_adamw\", \"date\": \"%s\", \"threads\": %d, \"vectorized\": %s, "
      "\"params\": %d, \"adamw_s\": %.5f, \"params_per_s\": %.4g, \"adamw_gb_per_s\": %.2f, "
      "\"copy_gib\": %.2f, \"copy_gb_per_s\": %.2f, \"bound_params_per_s\": %.4g, "
      "\"fraction_of_bound\": %.3f",
      Today(), pool.size(), HostAdamWVectorized() ? "true" : "false", n, adamw_s, params_s,
      30.0 * params_s / 1e9, absl::GetFlag(FLAGS_copy_gib), copy_gbs, bound, params_s / bound);
  if (!absl::GetFlag(FLAGS_tag).empty()) {
    line += absl::StrFormat(", \"tag\": \"%s\"", absl::GetFlag(FLAGS_tag));
  }
  std::printf("%s}\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    ithaca::RunOne(std::stoi(std::string(t)));
  }
  return 0;
}
