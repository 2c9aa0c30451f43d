// calibrate: measures the rate table of the step-time model (engine/plan/step_time.h) on this
// machine's backend and writes it in its text form, one command:
//
//   calibrate --backend=cuda --device=h200 > engine/plan/rates/h200.txt
//
// What it measures, each through the engine's own Ops (so the kernels the engine runs):
// - every GEMM shape the planner's replay issues for --models at --layouts, --seq_lens, the tile
//   and head-stage candidates (a dimension above --gemm_cap is measured at the cap; the model
//   scales by FLOPs from there);
// - attention forward and backward at each --head_dims, --attention_heads (a quarter of them K/V
//   heads) and --attention_seqs, causal, in FLOP/s of AttentionFlops; a (heads, length) whose
//   work heads x length^2 is above --attention_max_work is skipped (32 heads stop at 512K,
//   4 heads, a rank's share under Ulysses 8, at 1M);
// - each elementwise op at --elementwise_elems elements (its bytes counted by the meta device's
//   own rule) and at 4096 (the launch time);
// - pinned host <-> device copies of 1 GiB (CUDA), and the CPU AdamW of optimizer offload over
//   all cores.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "engine/model/config.h"
#include "engine/plan/meta.h"
#include "engine/plan/planner.h"
#include "engine/plan/step_time.h"
#include "engine/runtime/backend.h"
#include "engine/train/host_adamw.h"

ABSL_FLAG(std::string, backend, "cuda", "cuda | cpu");
ABSL_FLAG(std::string, device, "h200", "the device class the table is for (its `device` line)");
ABSL_FLAG(std::string, models, "llama-3.2-1b,llama-3-8b,qwen3-1.7b",
          "presets whose GEMM shapes are measured");
ABSL_FLAG(std::string, layouts, "1:1,8:8", "world:sp pairs whose GEMM shapes are measured");
ABSL_FLAG(std::string, seq_lens, "65536,1048576",
          "sequence lengths whose GEMM shapes are measured");
ABSL_FLAG(int64_t, gemm_cap, 65536, "GEMM dimensions above this are measured at it");
ABSL_FLAG(std::string, head_dims, "64,128", "attention head dims");
ABSL_FLAG(std::string, attention_seqs, "4096,16384,65536,131072,262144,524288,1048576",
          "attention lengths");
ABSL_FLAG(std::string, attention_heads, "32,4",
          "query heads per attention call (a quarter of them K/V heads)");
ABSL_FLAG(double, attention_max_work, 32.0 * 524288.0 * 524288.0,
          "largest heads x length^2 of an attention measurement (each one's time is bounded)");
ABSL_FLAG(int64_t, elementwise_elems, int64_t{1} << 27, "elements of the elementwise ops");
ABSL_FLAG(int64_t, adamw_params, int64_t{1} << 26, "parameters of the CPU AdamW measurement");
ABSL_FLAG(bool, list_shapes, false, "print the GEMM shapes it would measure, and exit");
ABSL_FLAG(double, min_seconds, 0.05, "time each measurement at least this long");

namespace ithaca {
namespace {

std::vector<int64_t> Ints(const std::string& csv) {
  std::vector<int64_t> out;
  for (const std::string& s :
       std::vector<std::string>(absl::StrSplit(csv, ',', absl::SkipEmpty()))) {
    int64_t v = 0;
    if (absl::SimpleAtoi(s, &v)) out.push_back(v);
  }
  return out;
}

// Seconds per call of `fn`: `warmup` calls, then calls until min_seconds have passed (at least 2).
double Time(Ops* ops, const std::function<void()>& fn, int warmup = 1) {
  for (int i = 0; i < warmup; ++i) fn();
  ops->Synchronize();
  const auto start = std::chrono::steady_clock::now();
  int n = 0;
  double s = 0;
  do {
    fn();
    ++n;
    ops->Synchronize();
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (n < 2 || s < absl::GetFlag(FLAGS_min_seconds));
  return s / n;
}

absl::StatusOr<Buffer> Make(Allocator* a, DType d, Shape s, Tier t = Tier::kActivations) {
  return Buffer::Make(a, d, std::move(s), t);
}

// Normal values of standard deviation `scale`: a GPU runs constant data measurably faster (its
// tensor cores switch less, and clock higher), so every input of a timed op is random.
void FillRandom(Ops* ops, const Tensor& t, float scale, uint64_t seed) {
  constexpr int64_t kBlock = 1 << 22;
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> host(std::min(kBlock, t.numel()));
  for (float& x : host) x = dist(gen);
  const Tensor flat = t.Reshaped({t.numel()});
  for (int64_t off = 0; off < t.numel(); off += kBlock) {
    const int64_t n = std::min(kBlock, t.numel() - off);
    ops->Upload(host.data(), DType::kF32, flat.Slice(off, {n}));
  }
}

// The GEMM shapes of the planner's replays.
absl::StatusOr<std::set<GemmShape>> ReplayedShapes(Device device, DType act) {
  std::set<GemmShape> shapes;
  const int64_t cap = absl::GetFlag(FLAGS_gemm_cap);
  for (const std::string& model :
       std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_models), ','))) {
    ASSIGN_OR_RETURN(LlamaConfig cfg, PresetConfig(model));
    cfg.num_hidden_layers = 1;  // every block issues the same shapes
    for (const std::string& layout :
         std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_layouts), ','))) {
      const std::vector<int64_t> ws = Ints(absl::StrReplaceAll(layout, {{":", ","}}));
      if (ws.size() != 2) return absl::InvalidArgumentError("--layouts: world:sp pairs");
      for (int64_t S : Ints(absl::GetFlag(FLAGS_seq_lens))) {
        const int64_t s = S / ws[1];
        for (int64_t tile : {int64_t{2048}, int64_t{4096}, int64_t{8192}, int64_t{16384}}) {
          for (int64_t chunk : {int64_t{0}, int64_t{8}, int64_t{4}}) {
            if (chunk > 0 && !MakeHeadPlan(cfg, ws[1], chunk).ok()) continue;
            PlanRequest req;
            req.cfg = cfg;
            req.world = ws[0];
            req.sp = ws[1];
            req.seq_len = S;
            req.device = device;
            req.act = act;
            req.opts.tile_tokens = std::min(tile, s);
            req.opts.head_chunk = chunk;
            std::set<GemmShape> log;
            req.gemm_log = &log;
            RETURN_IF_ERROR(PlanMemory(req).status());
            for (GemmShape g : log) {
              g.m = std::min(g.m, cap);
              g.n = std::min(g.n, cap);
              g.k = std::min(g.k, cap);
              shapes.insert(g);
            }
          }
        }
      }
    }
  }
  return shapes;
}

absl::Status Run() {
  JobSpec spec;
  spec.backend = absl::GetFlag(FLAGS_backend);
  ASSIGN_OR_RETURN(Backend b, MakeBackend(spec, 0));
  Ops* ops = b.ops.get();
  Allocator* alloc = b.alloc.get();
  const DType act = ops->act_dtype();
  RateTable t;
  t.device = absl::GetFlag(FLAGS_device);
  t.note = absl::StrCat("bench/calibrate --backend=", spec.backend, " on ",
                        spec.backend == "cuda" ? bench::DeviceName() : std::string("the CPU"), ", ",
                        bench::Today());

  // GEMMs.
  ASSIGN_OR_RETURN(std::set<GemmShape> shapes, ReplayedShapes(ops->device(), act));
  if (absl::GetFlag(FLAGS_list_shapes)) {
    double flops = 0;
    for (const GemmShape& g : shapes) flops += 2.0 * g.m * g.n * g.k;
    std::printf("%zu shapes, %.3g FLOPs in all\n", shapes.size(), flops);
    return absl::OkStatus();
  }
  double gemm_flops = 0, gemm_seconds = 0;
  for (const GemmShape& g : shapes) {
    ASSIGN_OR_RETURN(Buffer a, Make(alloc, act, g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k}));
    ASSIGN_OR_RETURN(Buffer bb, Make(alloc, act, g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n}));
    ASSIGN_OR_RETURN(Buffer c, Make(alloc, g.c_f32 ? DType::kF32 : act, {g.m, g.n}));
    FillRandom(ops, a.tensor(), 1.f, 1);
    FillRandom(ops, bb.tensor(), 0.02f, 2);
    ops->Fill(c.tensor(), 0.f);
    const float beta = g.c_f32 ? 1.f : 0.f;
    const double s = Time(
        ops, [&] { ops->Gemm(a.tensor(), g.ta, bb.tensor(), g.tb, c.tensor(), 1.f, beta); },
        /*warmup=*/13);  // CudaOps times cuBLASLt's candidates on a shape's first 12 calls
    t.gemms.push_back({g, s});
    gemm_flops += 2.0 * g.m * g.n * g.k;
    gemm_seconds += s;
    std::fprintf(stderr, "gemm %lld %lld %lld %d %d %d: %.3f ms, %.1f TFLOPS\n", (long long)g.m,
                 (long long)g.n, (long long)g.k, g.ta, g.tb, g.c_f32, s * 1e3,
                 2.0 * g.m * g.n * g.k / s / 1e12);
  }
  t.gemm_flops_per_s = gemm_seconds > 0 ? gemm_flops / gemm_seconds : 1e12;

  // Attention, causal, GQA 4.
  for (int64_t D : Ints(absl::GetFlag(FLAGS_head_dims))) {
    for (int64_t H : Ints(absl::GetFlag(FLAGS_attention_heads))) {
      for (int64_t S : Ints(absl::GetFlag(FLAGS_attention_seqs))) {
        if (double(H) * double(S) * double(S) > absl::GetFlag(FLAGS_attention_max_work)) continue;
        const int64_t Hkv = std::max<int64_t>(1, H / 4);
        ASSIGN_OR_RETURN(Buffer q, Make(alloc, act, {S, H, D}, Tier::kAttention));
        ASSIGN_OR_RETURN(Buffer k, Make(alloc, act, {S, Hkv, D}, Tier::kAttention));
        ASSIGN_OR_RETURN(Buffer v, Make(alloc, act, {S, Hkv, D}, Tier::kAttention));
        ASSIGN_OR_RETURN(Buffer o, Make(alloc, act, {S, H, D}, Tier::kAttention));
        ASSIGN_OR_RETURN(Buffer lse, Make(alloc, DType::kF32, {H, S}, Tier::kAttention));
        ASSIGN_OR_RETURN(Buffer dout, Make(alloc, act, {S, H, D}, Tier::kAttention));
        ASSIGN_OR_RETURN(Buffer dq, Make(alloc, act, {S, H, D}, Tier::kAttention));
        ASSIGN_OR_RETURN(Buffer dk, Make(alloc, act, {S, Hkv, D}, Tier::kAttention));
        ASSIGN_OR_RETURN(Buffer dv, Make(alloc, act, {S, Hkv, D}, Tier::kAttention));
        uint64_t seed = 3;
        for (Buffer* x : {&q, &k, &v, &dout}) FillRandom(ops, x->tensor(), 1.f, ++seed);
        const DocumentMask docs;
        const double pairs = AttentionPairs(S, 0, {});
        const double fwd = Time(ops, [&] {
          ops->Attention(q.tensor(), k.tensor(), v.tensor(), o.tensor(), lse.tensor(), docs);
        });
        const double bwd = Time(ops, [&] {
          ops->AttentionBackward(q.tensor(), k.tensor(), v.tensor(), o.tensor(), dout.tensor(),
                                 lse.tensor(), dq.tensor(), dk.tensor(), dv.tensor(), docs);
        });
        t.attention.push_back({false, D, H, S, AttentionFlops(false, pairs, H, D) / fwd});
        t.attention.push_back({true, D, H, S, AttentionFlops(true, pairs, H, D) / bwd});
        std::fprintf(stderr, "attention hd %lld heads %lld S %lld: fwd %.1f, bwd %.1f TFLOPS\n",
                     (long long)D, (long long)H, (long long)S,
                     AttentionFlops(false, pairs, H, D) / fwd / 1e12,
                     AttentionFlops(true, pairs, H, D) / bwd / 1e12);
      }
    }
  }

  // Elementwise ops: their bytes as the meta device counts them (a table of 1 byte/s), at a
  // large size for the bandwidth and a small one for the launch.
  RateTable unit;
  unit.gemm_flops_per_s = 1;
  for (int i = 0; i < static_cast<int>(ElementwiseOp::kNumOps); ++i) {
    unit.ops[ElementwiseOpName(static_cast<ElementwiseOp>(i))] = {1.0, 0.0};
  }
  for (int64_t n : {absl::GetFlag(FLAGS_elementwise_elems), int64_t{4096}}) {
    const int64_t d = 2048, T = std::max<int64_t>(1, n / d), V = 32768;
    const int64_t rows_ce = std::max<int64_t>(1, n / V);
    ASSIGN_OR_RETURN(Buffer x, Make(alloc, act, {T, d}));
    ASSIGN_OR_RETURN(Buffer y, Make(alloc, act, {T, d}));
    ASSIGN_OR_RETURN(Buffer z, Make(alloc, act, {T, d}));
    ASSIGN_OR_RETURN(Buffer w, Make(alloc, act, {d}));
    ASSIGN_OR_RETURN(Buffer wf, Make(alloc, DType::kF32, {d}));
    ASSIGN_OR_RETURN(Buffer rstd, Make(alloc, DType::kF32, {T}));
    ASSIGN_OR_RETURN(Buffer sum, Make(alloc, DType::kF32, {1}));
    ASSIGN_OR_RETURN(Buffer ids, Make(alloc, DType::kI32, {T}));
    ASSIGN_OR_RETURN(Buffer table, Make(alloc, act, {V, d}));
    ASSIGN_OR_RETURN(Buffer dtable, Make(alloc, DType::kF32, {V, d}));
    ASSIGN_OR_RETURN(Buffer inv, Make(alloc, DType::kF32, {32}));
    ASSIGN_OR_RETURN(Buffer logits, Make(alloc, act, {rows_ce, V}));
    ASSIGN_OR_RETURN(Buffer labels, Make(alloc, DType::kI32, {rows_ce}));
    ASSIGN_OR_RETURN(Buffer losses, Make(alloc, DType::kF32, {rows_ce}));
    const int64_t np = std::max<int64_t>(1, n / 4);
    ASSIGN_OR_RETURN(Buffer master, Make(alloc, DType::kF32, {np}));
    ASSIGN_OR_RETURN(Buffer grad, Make(alloc, DType::kF32, {np}));
    ASSIGN_OR_RETURN(Buffer mm, Make(alloc, DType::kF32, {np}));
    ASSIGN_OR_RETURN(Buffer vv, Make(alloc, DType::kF32, {np}));
    ASSIGN_OR_RETURN(Buffer working, Make(alloc, act, {np}));
    uint64_t seed = 10;
    for (Buffer* b : {&x, &y, &z, &w, &table, &logits, &master, &grad, &mm, &vv}) {
      FillRandom(ops, b->tensor(), 0.1f, ++seed);
    }
    ops->Fill(wf.tensor(), 1.f);
    ops->Fill(inv.tensor(), 0.01f);
    ops->Fill(ids.tensor(), 0.f);
    ops->Fill(labels.tensor(), 0.f);
    const Tensor heads = x.tensor().Reshaped({T, d / 64, 64});
    const AdamWParams p;
    struct Case {
      ElementwiseOp op;
      std::function<void(Ops*)> run;
    };
    const std::vector<Case> cases = {
        {ElementwiseOp::kFill, [&](Ops* o) { o->Fill(x.tensor(), 0.01f); }},
        {ElementwiseOp::kCopy, [&](Ops* o) { o->Copy(x.tensor(), y.tensor()); }},
        {ElementwiseOp::kAxpy, [&](Ops* o) { o->Axpy(0.5f, grad.tensor(), master.tensor()); }},
        {ElementwiseOp::kReduce, [&](Ops* o) { o->SumSquaresInto(x.tensor(), sum.tensor()); }},
        {ElementwiseOp::kEmbedding,
         [&](Ops* o) { o->Embedding(ids.tensor(), table.tensor(), y.tensor()); }},
        {ElementwiseOp::kEmbeddingBackward,
         [&](Ops* o) { o->EmbeddingBackward(ids.tensor(), x.tensor(), dtable.tensor()); }},
        {ElementwiseOp::kRmsNorm,
         [&](Ops* o) { o->RmsNorm(x.tensor(), w.tensor(), 1e-5f, y.tensor(), rstd.tensor()); }},
        {ElementwiseOp::kRmsNormBackward,
         [&](Ops* o) {
           o->RmsNormBackward(x.tensor(), w.tensor(), rstd.tensor(), y.tensor(), z.tensor(),
                              wf.tensor());
         }},
        {ElementwiseOp::kRope,
         [&](Ops* o) { o->Rope(heads, 0, inv.tensor(), false, DocumentMask()); }},
        {ElementwiseOp::kSwiGLU, [&](Ops* o) { o->SwiGLU(x.tensor(), y.tensor(), z.tensor()); }},
        {ElementwiseOp::kSwiGLUBackward,
         [&](Ops* o) {
           o->SwiGLUBackward(x.tensor(), y.tensor(), z.tensor(), x.tensor(), y.tensor());
         }},
        {ElementwiseOp::kCrossEntropy,
         [&](Ops* o) {
           o->CrossEntropy(logits.tensor(), labels.tensor(), losses.tensor(), logits.tensor(), 1);
         }},
        {ElementwiseOp::kAdamW,
         [&](Ops* o) {
           o->AdamW(master.tensor(), grad.tensor(), mm.tensor(), vv.tensor(), working.tensor(), p);
         }},
    };
    for (const Case& c : cases) {
      MetaOps meta(ops->device(), act);
      StepClock clock;
      meta.set_timing(&unit, &clock);
      c.run(&meta);
      const double bytes = clock.busy(StepClock::Work::kElementwise);
      const double s = Time(ops, [&] { c.run(ops); });
      OpRate& r = t.ops[ElementwiseOpName(c.op)];
      if (n > 4096) {
        r.bytes_per_s = bytes / s;
      } else {
        r.launch_s = std::max(0.0, s - bytes / std::max(1.0, r.bytes_per_s));
      }
    }
  }
  for (const auto& [name, r] : t.ops) {
    std::fprintf(stderr, "op %s: %.0f GB/s, launch %.1f us\n", name.c_str(), r.bytes_per_s / 1e9,
                 r.launch_s * 1e6);
  }

  // Pinned host <-> device.
  if (ops->device() == Device::kCuda) {
    const int64_t n = int64_t{1} << 29;  // 1 GiB of bf16
    ASSIGN_OR_RETURN(Buffer dev, Make(alloc, DType::kBF16, {n}, Tier::kBlockInputs));
    ASSIGN_OR_RETURN(Buffer host, Make(alloc, DType::kBF16, {n}, Tier::kHostBlockInputs));
    const double up =
        Time(ops, [&] { ops->WaitFence(ops->CopyAsync(host.tensor(), dev.tensor())); });
    const double down =
        Time(ops, [&] { ops->WaitFence(ops->CopyAsync(dev.tensor(), host.tensor())); });
    t.h2d_bytes_per_s = 2.0 * n / up;
    t.d2h_bytes_per_s = 2.0 * n / down;
  } else {
    t.h2d_bytes_per_s = t.d2h_bytes_per_s = t.ops["copy"].bytes_per_s / 2;
  }

  // The CPU AdamW over every core.
  {
    const int64_t n = absl::GetFlag(FLAGS_adamw_params);
    std::vector<float> master(n, 0.1f), grad(n, 0.01f), m(n), v(n);
    std::vector<uint16_t> working(n);
    HostThreadPool pool;
    HostAdamWSpan span{master.data(),  grad.data(),  m.data(), v.data(),
                       working.data(), DType::kBF16, n};
    AdamWParams p;
    HostAdamW(span, p, &pool);
    const auto start = std::chrono::steady_clock::now();
    const int reps = 3;
    for (int i = 0; i < reps; ++i) HostAdamW(span, p, &pool);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    t.host_adamw_params_per_s = reps * double(n) / s;
  }
  std::fputs(RateTableText(t).c_str(), stdout);
  return absl::OkStatus();
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = ithaca::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "calibrate: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
