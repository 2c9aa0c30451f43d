// cuDNN fused attention through CudaOps (the path training takes): forward, backward and
// forward+backward TFLOPS, causal, GQA, bf16, [S, H, D] layout. Causal FLOPs are counted as
// 4·S²·Hq·D/2 forward and 2.5× that backward (the long-context papers' convention).
// With --doc_len N the sample is also run packed with documents of N tokens (a document mask,
// the last document shorter when N does not divide S), side by side with full causal at the
// same S; its FLOPs count only the attention computed: Σ over documents of 4·L²·Hq·D/2.
// --forward=cudnn,hopper and --backward=cudnn,hopper run each shape once per pair of forward and
// backward kernels (AttentionKernel: cudnn, hopper, flash or auto, the per-shape rule training
// takes: engine/backend/attention_choice.h), side by side. Prints one JSON line per (shape,
// forward, backward, mask, pass); "impl" is what ran ("hopper+cudnn" for a fwd+bwd pass with the
// Hopper forward and cuDNN's backward), "forward" and "backward" what was asked.
#include <algorithm>
#include <memory>
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

ABSL_FLAG(std::string, shapes, "128:32:8:65536,64:32:8:131072",
          "comma-separated head_dim:Hq:Hkv:S");
ABSL_FLAG(std::string, backward, "cudnn",
          "comma list of backward kernels (as --forward), each timed with each forward");
ABSL_FLAG(std::string, forward, "cudnn",
          "comma list of forward kernels to time side by side: cudnn, hopper (the own sm_90a "
          "kernel), flash (the own portable kernel), auto (the engine's per-shape rule)");
ABSL_FLAG(std::string, cudnn_heuristics, "A",
          "cuDNN heuristic modes offering plans: a comma list of A, B, FALLBACK");
ABSL_FLAG(bool, cudnn_verbose, false, "print every cuDNN plan's time");
ABSL_FLAG(std::string, cudnn_forward_impl, "", "cuDNN frontend forward node: composite|unified");
ABSL_FLAG(std::string, cudnn_plans, "", "F,B: cuDNN plan indices forward and backward, untimed");
ABSL_FLAG(std::string, cudnn_config_forward, "", "ENGINE[:TYPE=VALUE,...] (from a sweep)");
ABSL_FLAG(std::string, cudnn_config_backward, "", "ENGINE[:TYPE=VALUE,...] (from a sweep)");
ABSL_FLAG(int64_t, cudnn_sweep, 0, "> 0: time every engine's knob combinations, <= N each");
ABSL_FLAG(int, iters, 5, "timed repetitions per pass (median reported)");
ABSL_FLAG(std::string, passes, "fwd,bwd,fwd+bwd", "which passes to time (comma list)");
ABSL_FLAG(int64_t, doc_len, 0,
          "> 0: also time a packed sample of documents of this many tokens (document mask)");
ABSL_FLAG(bool, full_causal, true, "time full causal attention (with --doc_len: beside it)");
ABSL_FLAG(int64_t, window, 0,
          "> 0: also time a sliding window of this many keys (Mistral's), beside the others");
ABSL_FLAG(bool, ring_piece, false,
          "also time a ring piece: S queries against the S keys before them, no causal mask "
          "(Ops::AttentionChunk)");

namespace ithaca {
namespace {

AttentionKernel ParseKernel(const std::string& f) {
  absl::StatusOr<AttentionKernel> k = ParseAttentionKernel(f);
  ITHACA_CHECK(k.ok(), "--forward/--backward: ", k.status().ToString());
  return *k;
}

int Main() {
  CudaAllocator alloc;
  // One CudaOps per (forward, backward) pair, sharing the buffers (the allocator is shared).
  std::vector<std::string> forward_list = absl::StrSplit(absl::GetFlag(FLAGS_forward), ',');
  std::vector<std::string> backward_list = absl::StrSplit(absl::GetFlag(FLAGS_backward), ',');
  struct Kernels {
    std::string forward, backward;  // as asked
    std::unique_ptr<CudaOps> ops;
  };
  std::vector<Kernels> all_ops;
  for (const std::string& f : forward_list) {
    for (const std::string& b : backward_list) {
      CudaOps::Options o;
      o.alloc = &alloc;
      o.cudnn = {
          absl::GetFlag(FLAGS_cudnn_heuristics),     absl::GetFlag(FLAGS_cudnn_verbose),
          absl::GetFlag(FLAGS_cudnn_forward_impl),   absl::GetFlag(FLAGS_cudnn_plans),
          absl::GetFlag(FLAGS_cudnn_config_forward), absl::GetFlag(FLAGS_cudnn_config_backward),
          absl::GetFlag(FLAGS_cudnn_sweep)};
      o.attention_forward = ParseKernel(f);
      o.attention_backward = ParseKernel(b);
      all_ops.push_back({f, b, std::make_unique<CudaOps>(o)});
    }
  }
  CudaOps& fill = *all_ops[0].ops;  // fills the inputs
  const std::string device = bench::DeviceName();
  for (absl::string_view spec : absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',')) {
    std::vector<std::string> f = absl::StrSplit(spec, ':');
    ITHACA_CHECK(f.size() == 4, "bad shape ", spec);
    const int64_t D = std::stoll(f[0]), hq = std::stoll(f[1]), hkv = std::stoll(f[2]),
                  S = std::stoll(f[3]);
    auto mk = [&](DType t, Shape s, Tier tier) {
      auto b = Buffer::Make(&alloc, t, std::move(s), tier);
      ITHACA_CHECK(b.ok(), "allocation: ", b.status().ToString());
      return std::move(*b);
    };
    Buffer q = mk(DType::kBF16, {S, hq, D}, Tier::kAttention);
    Buffer k = mk(DType::kBF16, {S, hkv, D}, Tier::kAttention);
    Buffer v = mk(DType::kBF16, {S, hkv, D}, Tier::kAttention);
    Buffer out = mk(DType::kBF16, {S, hq, D}, Tier::kAttention);
    Buffer dout = mk(DType::kBF16, {S, hq, D}, Tier::kAttention);
    Buffer lse = mk(DType::kF32, {hq, S}, Tier::kAttention);
    Buffer dq = mk(DType::kBF16, {S, hq, D}, Tier::kAttention);
    Buffer dk = mk(DType::kBF16, {S, hkv, D}, Tier::kAttention);
    Buffer dv = mk(DType::kBF16, {S, hkv, D}, Tier::kAttention);
    bench::FillRandom(fill, &alloc, q.tensor(), 1);
    bench::FillRandom(fill, &alloc, k.tensor(), 2);
    bench::FillRandom(fill, &alloc, v.tensor(), 3);
    bench::FillRandom(fill, &alloc, dout.tensor(), 4);
    fill.Synchronize();  // the other CudaOps read the inputs on their own streams
    const int64_t doc_len = absl::GetFlag(FLAGS_doc_len);
    // Each mask: documents / window, or `piece` (a ring piece: the queries at positions
    // [S, 2S) against the keys at [0, S), every key seen).
    struct Mask {
      DocumentMask docs;
      bool piece = false;
    };
    std::vector<Mask> masks;
    if (absl::GetFlag(FLAGS_full_causal)) masks.push_back({});
    if (doc_len > 0) {
      DocumentMask docs;
      for (int64_t t = 0; t < S; t += doc_len) docs.starts.push_back(t);
      masks.push_back({docs});
    }
    const int64_t window = absl::GetFlag(FLAGS_window);
    if (window > 0) masks.push_back({DocumentMask{{}, window}});
    if (absl::GetFlag(FLAGS_ring_piece)) masks.push_back({DocumentMask{}, true});
    // Each (forward, backward) pair on each mask.
    struct Run {
      const Kernels* kernels;
      const Mask* mask;
    };
    std::vector<Run> runs;
    for (const Kernels& kernels : all_ops) {
      for (const Mask& mask : masks) runs.push_back({&kernels, &mask});
    }
    for (const Run& run : runs) {
      CudaOps& ops = *run.kernels->ops;
      const DocumentMask& docs = run.mask->docs;
      const bool piece = run.mask->piece;
      std::string fwd_impl, bwd_impl;
      auto fwd = [&] {
        if (piece) {
          ops.AttentionChunk(q.tensor(), k.tensor(), v.tensor(), out.tensor(), lse.tensor(), docs,
                             S, 0);
        } else {
          ops.Attention(q.tensor(), k.tensor(), v.tensor(), out.tensor(), lse.tensor(), docs);
        }
        fwd_impl = ops.last_attention_impl();
      };
      auto bwd = [&] {
        if (piece) {
          ops.AttentionChunkBackward(q.tensor(), k.tensor(), v.tensor(), out.tensor(),
                                     dout.tensor(), lse.tensor(), dq.tensor(), dk.tensor(),
                                     dv.tensor(), docs, S, 0);
        } else {
          ops.AttentionBackward(q.tensor(), k.tensor(), v.tensor(), out.tensor(), dout.tensor(),
                                lse.tensor(), dq.tensor(), dk.tensor(), dv.tensor(), docs);
        }
        bwd_impl = ops.last_attention_impl();
      };
      const int iters = absl::GetFlag(FLAGS_iters);
      const cudaStream_t st = ops.stream();
      const std::vector<std::string> passes = absl::StrSplit(absl::GetFlag(FLAGS_passes), ',');
      auto wanted = [&](const char* p) {
        return std::find(passes.begin(), passes.end(), p) != passes.end();
      };
      // Σ L²/2 over the documents (one document of S tokens without a mask); with a window of
      // W < L keys, the W·L − W²/2 scores of the band; a ring piece's S² scores.
      double half_squares = piece ? double(S) * S : 0;
      const int64_t ndocs = docs.trivial() ? 1 : static_cast<int64_t>(docs.starts.size());
      for (int64_t i = 0; i < ndocs && !piece; ++i) {
        const int64_t b = docs.trivial() ? 0 : docs.starts[i];
        const int64_t e = i + 1 < ndocs ? docs.starts[i + 1] : S;
        const double L = double(e - b), W = double(docs.window);
        half_squares += docs.window > 0 && W < L ? W * L - W * W / 2 : L * L / 2;
      }
      const double fwd_flops = 4.0 * half_squares * hq * D;
      struct Row {
        const char* pass;
        double ms, flops;
        std::string impl;
      };
      std::vector<Row> rows;
      fwd();  // the backward needs a real O and LSE even when the forward is not timed
      if (wanted("fwd")) {
        rows.push_back(
            {"fwd", bench::Median(bench::TimeMs(st, 1, iters, fwd)), fwd_flops, fwd_impl});
      }
      if (wanted("bwd")) {
        const double ms = bench::Median(bench::TimeMs(st, 1, iters, bwd));
        rows.push_back({"bwd", ms, 2.5 * fwd_flops, bwd_impl});
      }
      if (wanted("fwd+bwd")) {
        const double ms = bench::Median(bench::TimeMs(st, 1, iters, [&] {
          fwd();
          bwd();
        }));
        rows.push_back({"fwd+bwd", ms, 3.5 * fwd_flops,
                        fwd_impl == bwd_impl ? fwd_impl : fwd_impl + "+" + bwd_impl});
      }
      for (const auto& r : rows) {
        bench::Json()
            .Str("bench", "attention")
            .Str("date", bench::Today())
            .Str("device", device)
            .Str("impl", r.impl)
            .Str("forward", run.kernels->forward)
            .Str("backward", run.kernels->backward)
            .Str("layout", "[S,H,D]")
            .Bool("causal", !piece)
            .Str("mask", piece             ? "ring_piece"
                         : docs.window > 0 ? "window"
                         : docs.trivial()  ? "causal"
                                           : "documents")
            .Int("window", docs.window)
            .Int("doc_len", docs.trivial() ? S : doc_len)
            .Int("docs", ndocs)
            .Int("S", S)
            .Int("hq", hq)
            .Int("hkv", hkv)
            .Int("head_dim", D)
            .Str("pass", r.pass)
            .Num("ms", r.ms)
            .Num("tflops", r.flops / (r.ms * 1e-3) / 1e12)
            .Int("iters", iters)
            .Print();
      }
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
