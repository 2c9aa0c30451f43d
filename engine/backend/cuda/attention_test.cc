// Attention on the GPU (cuDNN's fused flash attention and the own flash kernel) against the CPU
// oracle, forward and backward, causal with GQA, on sequence lengths no tile divides, plain and
// packed with documents (cuDNN's ragged batch; the own kernel's mask); and the two GPU
// implementations against each other.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cudnn_attention.h"
#include "engine/backend/cuda/cuda_test_util.h"
#include "engine/backend/cuda/hopper_attention.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using cuda_test::CpuT;
using cuda_test::Dev;
using cuda_test::Host;
using cuda_test::Poisoned;
using cuda_test::Randn;

struct Shape4 {
  int64_t s, hq, hkv, d;
};

struct Case {
  Shape4 sh;
  AttentionKernel kernel;  // both passes
  const char* name;
  std::vector<int64_t> starts = {};  // the documents (ops.h's DocumentMask); empty: one
  int64_t window = 0;                // a sliding window (Mistral's); 0: none
};

class AttentionTest : public ::testing::TestWithParam<Case> {};

void RoundAll(std::vector<float>& v) {
  for (float& x : v) x = cuda_test::RoundBf16(x);
}

TEST_P(AttentionTest, ForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const auto [S, hq, hkv, D] = c.sh;
  const DocumentMask docs{c.starts, c.window};
  if (c.window == 1 && !(cuda::HopperAttentionBuilt() && cuda::HopperAttentionDeviceSupported())) {
    GTEST_SKIP() << "a window of one key runs on the Hopper kernels only";
  }
  CudaAllocator alloc;
  CudaOps::Options o;
  o.alloc = &alloc;
  o.attention_forward = o.attention_backward = c.kernel;
  CudaOps ops(o);
  CpuOps cpu;

  std::vector<float> q = Randn(S * hq * D, 1), k = Randn(S * hkv * D, 2), v = Randn(S * hkv * D, 3);
  std::vector<float> out_ref(S * hq * D), lse_ref(hq * S);
  cpu.Attention(CpuT(q, {S, hq, D}), CpuT(k, {S, hkv, D}), CpuT(v, {S, hkv, D}),
                CpuT(out_ref, {S, hq, D}), CpuT(lse_ref, {hq, S}), docs);

  auto dq_in = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, q);
  auto dk_in = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, k);
  auto dv_in = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, v);
  auto out = Poisoned(ops, &alloc, DType::kBF16, {S, hq, D});
  auto lse = Poisoned(ops, &alloc, DType::kF32, {hq, S});
  ops.Attention(dq_in.tensor(), dk_in.tensor(), dv_in.tensor(), out.tensor(), lse.tensor(), docs);
  std::printf("[%s] S %lld Hq %lld Hkv %lld D %lld documents %zu ran: %s\n", c.name, (long long)S,
              (long long)hq, (long long)hkv, (long long)D, c.starts.size(),
              ops.last_attention_impl());
  if (c.kernel == AttentionKernel::kFlash) {
    EXPECT_STREQ(ops.last_attention_impl(), "flash");
  } else if (c.kernel == AttentionKernel::kCudnn) {
    EXPECT_STREQ(ops.last_attention_impl(), "cudnn");
  }
  EXPECT_CLOSE(Host(ops, out.tensor()), out_ref, 1e-2, "attention out");
  EXPECT_CLOSE(Host(ops, lse.tensor()), lse_ref, 1e-5, "attention lse");

  // Backward from the CPU's out and lse (out rounded to bf16, as the GPU stores it), so both
  // backends differentiate the same point.
  RoundAll(out_ref);
  std::vector<float> dout = Randn(S * hq * D, 4);
  std::vector<float> dq_ref(S * hq * D), dk_ref(S * hkv * D), dv_ref(S * hkv * D);
  cpu.AttentionBackward(CpuT(q, {S, hq, D}), CpuT(k, {S, hkv, D}), CpuT(v, {S, hkv, D}),
                        CpuT(out_ref, {S, hq, D}), CpuT(dout, {S, hq, D}), CpuT(lse_ref, {hq, S}),
                        CpuT(dq_ref, {S, hq, D}), CpuT(dk_ref, {S, hkv, D}),
                        CpuT(dv_ref, {S, hkv, D}), docs);
  auto o_in = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, out_ref);
  auto do_in = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, dout);
  auto lse_in = Dev(ops, &alloc, DType::kF32, {hq, S}, lse_ref);
  auto dq = Poisoned(ops, &alloc, DType::kBF16, {S, hq, D});
  auto dk = Poisoned(ops, &alloc, DType::kBF16, {S, hkv, D});
  auto dv = Poisoned(ops, &alloc, DType::kBF16, {S, hkv, D});
  ops.AttentionBackward(dq_in.tensor(), dk_in.tensor(), dv_in.tensor(), o_in.tensor(),
                        do_in.tensor(), lse_in.tensor(), dq.tensor(), dk.tensor(), dv.tensor(),
                        docs);
  // (A window of one key: every query sees only itself, and dQ, dK are exactly 0.)
  EXPECT_CLOSE_OR_ZERO(Host(ops, dq.tensor()), dq_ref, dv_ref, 2e-2, 1e-4, "attention dq");
  EXPECT_CLOSE_OR_ZERO(Host(ops, dk.tensor()), dk_ref, dv_ref, 2e-2, 1e-4,
                       "attention dk (GQA sum)");
  EXPECT_CLOSE(Host(ops, dv.tensor()), dv_ref, 2e-2, "attention dv (GQA sum)");
}

using Impl = AttentionKernel;
INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(
        Case{{131, 4, 2, 64}, Impl::kCudnn, "cudnn_hd64"},
        Case{{131, 4, 2, 64}, Impl::kFlash, "own_hd64"},
        Case{{200, 8, 2, 128}, Impl::kCudnn, "cudnn_hd128"},
        Case{{200, 8, 2, 128}, Impl::kFlash, "own_hd128"},
        Case{{77, 4, 2, 16}, Impl::kAuto, "auto_hd16_tiny"},
        Case{{77, 4, 2, 16}, Impl::kFlash, "own_hd16_tiny"},
        Case{{300, 6, 6, 32}, Impl::kAuto, "auto_mha_hd32"},
        // Packed samples: uneven documents, one of a single
        // token, none aligned to a tile; 5 documents fill
        // cuDNN's batch bucket of 8 with 3 empty ones.
        Case{{300, 8, 2, 64}, Impl::kCudnn, "docs_cudnn_hd64", {0, 1, 65, 200, 233}},
        Case{{300, 8, 2, 64}, Impl::kFlash, "docs_own_hd64", {0, 1, 65, 200, 233}},
        Case{{517, 4, 1, 128}, Impl::kCudnn, "docs_cudnn_hd128", {0, 128, 129, 300, 511}},
        Case{{517, 4, 1, 128}, Impl::kFlash, "docs_own_hd128", {0, 128, 129, 300, 511}},
        Case{{1000, 32, 8, 64}, Impl::kCudnn, "docs_cudnn_llama1b", {0, 100, 356, 357, 700, 999}},
        Case{{257, 4, 2, 64}, Impl::kCudnn, "one_doc_cudnn", {0}},
        Case{{257, 4, 2, 64}, Impl::kFlash, "one_doc_own", {0}},
        // Sliding windows on cuDNN's causal band: smaller than a tile, of one key, wider than
        // S, and with packed documents (auto picks cuDNN at these S: HopperRules).
        Case{{300, 8, 2, 64}, Impl::kCudnn, "window_cudnn_hd64", {}, 37},
        Case{{300, 8, 2, 128}, Impl::kAuto, "window_auto_hd128", {}, 100},
        // cuDNN's band is wrong at a window of one key (its forward disagreed with the CPU
        // here, bench/results/2026-12-01-gpu-tests-merged.log): auto runs the Hopper kernels.
        Case{{136, 4, 2, 64}, Impl::kAuto, "window1_auto", {}, 1},
        Case{{131, 4, 2, 64}, Impl::kCudnn, "window_wider_than_s_cudnn", {}, 1000},
        Case{{300, 8, 2, 64}, Impl::kCudnn, "window_docs_cudnn", {0, 1, 65, 200, 233}, 40},
        Case{{517, 4, 1, 128}, Impl::kAuto, "window_docs_auto_hd128", {0, 128, 129, 300}, 64}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Ring attention's pieces on the GPU against the CPU's whole attention: the sample cut into
// chunks, every (query chunk, key chunk) pair run (diagonal chunks on the causal kernels with
// their documents rebased; chunks whose keys all come before their queries on cuDNN without the
// causal mask over the rectangle their queries see, or on the flash kernel's span form where a
// window cuts into it; chunks no query sees included), merged by AttentionMerge, and the chunks'
// gradients (given the merged rows) summed.
struct ChunkCase {
  Shape4 sh;
  const char* name;
  std::vector<int64_t> starts = {};
  int64_t window = 0;
  int64_t pieces = 0;  // > 0: that many equal chunks (as the ring's); 0: three uneven ones
};
class AttentionChunkTest : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(AttentionChunkTest, ChunksMergedMatchTheCpusWholeAttention) {
  SKIP_WITHOUT_GPU();
  const ChunkCase c = GetParam();
  const auto [S, hq, hkv, D] = c.sh;
  const DocumentMask docs{c.starts, c.window};
  std::vector<int64_t> cuts = {0, S / 3, S / 3 + 77, S};
  if (c.pieces > 0) {
    cuts.clear();
    for (int64_t p = 0; p <= c.pieces; ++p) cuts.push_back(p * S / c.pieces);
  }
  // Off-diagonal pairs run on cuDNN (or nowhere, when no query sees a key), but for those whose
  // rectangle a window cuts into, which run on the flash kernel.
  int64_t full_pairs = 0, want_flash = 0, flash_fwd = 0, flash_bwd = 0, cudnn_fwd = 0;
  CudaAllocator alloc;
  CudaOps::Options o;
  o.alloc = &alloc;
  CudaOps ops(o);
  CpuOps cpu;
  std::vector<float> q = Randn(S * hq * D, 1), k = Randn(S * hkv * D, 2), v = Randn(S * hkv * D, 3);
  RoundAll(q);
  RoundAll(k);
  RoundAll(v);
  std::vector<float> out_ref(S * hq * D), lse_ref(hq * S);
  cpu.Attention(CpuT(q, {S, hq, D}), CpuT(k, {S, hkv, D}), CpuT(v, {S, hkv, D}),
                CpuT(out_ref, {S, hq, D}), CpuT(lse_ref, {hq, S}), docs);
  RoundAll(out_ref);
  std::vector<float> dout = Randn(S * hq * D, 4);
  RoundAll(dout);
  std::vector<float> dq_ref(S * hq * D), dk_ref(S * hkv * D), dv_ref(S * hkv * D);
  cpu.AttentionBackward(CpuT(q, {S, hq, D}), CpuT(k, {S, hkv, D}), CpuT(v, {S, hkv, D}),
                        CpuT(out_ref, {S, hq, D}), CpuT(dout, {S, hq, D}), CpuT(lse_ref, {hq, S}),
                        CpuT(dq_ref, {S, hq, D}), CpuT(dk_ref, {S, hkv, D}),
                        CpuT(dv_ref, {S, hkv, D}), docs);
  auto rows = [&](const std::vector<float>& x, int64_t h, int64_t a, int64_t b) {
    return std::vector<float>(x.begin() + a * h * D, x.begin() + b * h * D);
  };
  auto lse_rows = [&](const std::vector<float>& l, int64_t a, int64_t n) {
    std::vector<float> r(hq * n);
    for (int64_t h = 0; h < hq; ++h) std::copy(&l[h * S + a], &l[h * S + a + n], &r[h * n]);
    return r;
  };
  std::vector<float> got_out(S * hq * D), got_lse(hq * S), got_dq(S * hq * D);
  std::vector<float> got_dk(S * hkv * D, 0.f), got_dv(S * hkv * D, 0.f);
  for (size_t a = 0; a + 1 < cuts.size(); ++a) {
    const int64_t qa = cuts[a], nq = cuts[a + 1] - qa;
    auto qc = Dev(ops, &alloc, DType::kBF16, {nq, hq, D}, rows(q, hq, qa, qa + nq));
    auto acc = Dev(ops, &alloc, DType::kF32, {nq, hq, D}, std::vector<float>(nq * hq * D, 0.f));
    auto acc_lse = Dev(ops, &alloc, DType::kF32, {hq, nq}, std::vector<float>(hq * nq, -INFINITY));
    auto part = Poisoned(ops, &alloc, DType::kBF16, {nq, hq, D});
    auto part_lse = Poisoned(ops, &alloc, DType::kF32, {hq, nq});
    // The backward's inputs: the CPU's merged rows, as a ring's forward would leave them.
    auto oc = Dev(ops, &alloc, DType::kBF16, {nq, hq, D}, rows(out_ref, hq, qa, qa + nq));
    auto doc = Dev(ops, &alloc, DType::kBF16, {nq, hq, D}, rows(dout, hq, qa, qa + nq));
    auto lc = Dev(ops, &alloc, DType::kF32, {hq, nq}, lse_rows(lse_ref, qa, nq));
    std::vector<float> dq_sum(nq * hq * D, 0.f);
    for (size_t b = 0; b + 1 < cuts.size(); ++b) {
      const int64_t ka = cuts[b], nk = cuts[b + 1] - ka;
      auto kc = Dev(ops, &alloc, DType::kBF16, {nk, hkv, D}, rows(k, hkv, ka, ka + nk));
      auto vc = Dev(ops, &alloc, DType::kBF16, {nk, hkv, D}, rows(v, hkv, ka, ka + nk));
      const bool full = b < a;
      full_pairs += full ? 1 : 0;
      want_flash += full && !VisiblePieceRectangle(docs, nq, nk, qa, ka).dense ? 1 : 0;
      ops.AttentionChunk(qc.tensor(), kc.tensor(), vc.tensor(), part.tensor(), part_lse.tensor(),
                         docs, qa, ka);
      if (full && std::string(ops.last_attention_impl()) == "flash") ++flash_fwd;
      if (full && std::string(ops.last_attention_impl()) == "cudnn") ++cudnn_fwd;
      ops.AttentionMerge(acc.tensor(), acc_lse.tensor(), part.tensor(), part_lse.tensor());
      auto dqc = Poisoned(ops, &alloc, DType::kBF16, {nq, hq, D});
      auto dkc = Poisoned(ops, &alloc, DType::kBF16, {nk, hkv, D});
      auto dvc = Poisoned(ops, &alloc, DType::kBF16, {nk, hkv, D});
      ops.AttentionChunkBackward(qc.tensor(), kc.tensor(), vc.tensor(), oc.tensor(), doc.tensor(),
                                 lc.tensor(), dqc.tensor(), dkc.tensor(), dvc.tensor(), docs, qa,
                                 ka);
      if (full && std::string(ops.last_attention_impl()) == "flash") ++flash_bwd;
      const std::vector<float> gq = Host(ops, dqc.tensor()), gk = Host(ops, dkc.tensor()),
                               gv = Host(ops, dvc.tensor());
      for (size_t i = 0; i < gq.size(); ++i) dq_sum[i] += gq[i];
      for (size_t i = 0; i < gk.size(); ++i) got_dk[ka * hkv * D + i] += gk[i];
      for (size_t i = 0; i < gv.size(); ++i) got_dv[ka * hkv * D + i] += gv[i];
    }
    const std::vector<float> o_host = Host(ops, acc.tensor()), l_host = Host(ops, acc_lse.tensor());
    std::copy(o_host.begin(), o_host.end(), got_out.begin() + qa * hq * D);
    std::copy(dq_sum.begin(), dq_sum.end(), got_dq.begin() + qa * hq * D);
    for (int64_t h = 0; h < hq; ++h) {
      std::copy(&l_host[h * nq], &l_host[h * nq] + nq, &got_lse[h * S + qa]);
    }
  }
  ASSERT_TRUE(ops.status().ok()) << ops.status();
  std::printf(
      "[%s] of %lld off-diagonal pairs, %lld on cuDNN and %lld on the flash kernel "
      "(forward; %lld backward)\n",
      c.name, static_cast<long long>(full_pairs), static_cast<long long>(cudnn_fwd),
      static_cast<long long>(flash_fwd), static_cast<long long>(flash_bwd));
  EXPECT_EQ(flash_fwd, want_flash);
  EXPECT_EQ(flash_bwd, want_flash);
  if (c.window == 0) {
    EXPECT_GT(cudnn_fwd, 0) << "no off-diagonal pair ran on cuDNN";
  }
  EXPECT_CLOSE(got_out, out_ref, 1e-2, "merged out");
  EXPECT_CLOSE(got_lse, lse_ref, 1e-5, "merged lse");
  EXPECT_CLOSE(got_dq, dq_ref, 2e-2, "summed dq");
  EXPECT_CLOSE(got_dk, dk_ref, 2e-2, "summed dk");
  EXPECT_CLOSE(got_dv, dv_ref, 2e-2, "summed dv");
}

INSTANTIATE_TEST_SUITE_P(
    Chunks, AttentionChunkTest,
    ::testing::Values(ChunkCase{{300, 8, 2, 64}, "causal_hd64"},
                      ChunkCase{{300, 4, 1, 128}, "causal_hd128"},
                      ChunkCase{{300, 8, 2, 64}, "docs_hd64", {0, 37, 100, 101, 250}},
                      ChunkCase{{300, 8, 2, 128}, "window_hd128", {}, 60},
                      ChunkCase{{300, 8, 2, 64}, "docs_window_hd64", {0, 37, 150, 151}, 41},
                      // The ring's own cut: equal pieces (here 4 of 96 and 4 of 128 tokens).
                      ChunkCase{{384, 8, 2, 64}, "pieces_hd64", {}, 0, 4},
                      ChunkCase{{512, 7, 1, 128}, "pieces_7to1_hd128", {}, 0, 4},
                      ChunkCase{{512, 4, 1, 128}, "pieces_docs_hd128", {0, 200, 300}, 0, 4}),
    [](const ::testing::TestParamInfo<ChunkCase>& i) { return std::string(i.param.name); });

// The trivial mask ({0}: one document) takes the old path: the same bits as no mask, forward and
// backward, for both implementations (but cuDNN's dq, which no two runs share bit for bit).
TEST(AttentionDocuments, TrivialMaskIsBitIdentical) {
  SKIP_WITHOUT_GPU();
  const int64_t S = 333, hq = 8, hkv = 2, D = 64;
  CudaAllocator alloc;
  std::vector<float> q = Randn(S * hq * D, 21), k = Randn(S * hkv * D, 22);
  std::vector<float> v = Randn(S * hkv * D, 23), dout = Randn(S * hq * D, 24);
  for (Impl impl : {Impl::kCudnn, Impl::kFlash}) {
    CudaOps::Options o;
    o.alloc = &alloc;
    o.attention_forward = o.attention_backward = impl;
    CudaOps ops(o);
    std::vector<std::vector<float>> res[2];
    const DocumentMask masks[2] = {DocumentMask{}, DocumentMask{{0}}};
    for (int i = 0; i < 2; ++i) {
      auto tq = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, q);
      auto tk = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, k);
      auto tv = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, v);
      auto tdo = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, dout);
      auto to = Poisoned(ops, &alloc, DType::kBF16, {S, hq, D});
      auto tl = Poisoned(ops, &alloc, DType::kF32, {hq, S});
      auto dq = Poisoned(ops, &alloc, DType::kBF16, {S, hq, D});
      auto dk = Poisoned(ops, &alloc, DType::kBF16, {S, hkv, D});
      auto dv = Poisoned(ops, &alloc, DType::kBF16, {S, hkv, D});
      ops.Attention(tq.tensor(), tk.tensor(), tv.tensor(), to.tensor(), tl.tensor(), masks[i]);
      ops.AttentionBackward(tq.tensor(), tk.tensor(), tv.tensor(), to.tensor(), tdo.tensor(),
                            tl.tensor(), dq.tensor(), dk.tensor(), dv.tensor(), masks[i]);
      for (const Buffer* t : {&to, &tl, &dq, &dk, &dv}) res[i].push_back(Host(ops, t->tensor()));
    }
    for (int j = 0; j < 5; ++j) {
      // cuDNN's backward accumulates dq with atomics, so dq differs between any two of its runs
      // in the last bits (seen on the H200: rel_l2 ~1e-6); everything else is bit for bit.
      if (impl == Impl::kCudnn && j == 2) {
        EXPECT_CLOSE(res[1][j], res[0][j], 1e-5, "cuDNN dq, mask {0} vs none");
        continue;
      }
      EXPECT_EQ(res[0][j], res[1][j]) << "output " << j << " of " << ops.last_attention_impl();
    }
  }
}

// A packed sample equals its documents run one by one as plain causal sequences (cuDNN, GPU
// against GPU, on a size where the CPU oracle would be slow): outputs and gradients per document.
TEST(AttentionDocuments, PackedEqualsDocumentsOneByOne) {
  SKIP_WITHOUT_GPU();
  const int64_t S = 4096, hq = 32, hkv = 8, D = 64;
  const std::vector<int64_t> starts = {0, 1000, 1017, 2048, 3333};
  CudaAllocator alloc;
  CudaOps::Options o;
  o.alloc = &alloc;
  o.attention_forward = o.attention_backward = Impl::kCudnn;
  CudaOps ops(o);
  std::vector<float> q = Randn(S * hq * D, 31), k = Randn(S * hkv * D, 32);
  std::vector<float> v = Randn(S * hkv * D, 33), dout = Randn(S * hq * D, 34);
  auto run = [&](int64_t b, int64_t e, const DocumentMask& docs) {
    const int64_t n = e - b;
    auto part = [&](const std::vector<float>& x, int64_t h) {
      return std::vector<float>(x.begin() + b * h * D, x.begin() + e * h * D);
    };
    auto tq = Dev(ops, &alloc, DType::kBF16, {n, hq, D}, part(q, hq));
    auto tk = Dev(ops, &alloc, DType::kBF16, {n, hkv, D}, part(k, hkv));
    auto tv = Dev(ops, &alloc, DType::kBF16, {n, hkv, D}, part(v, hkv));
    auto tdo = Dev(ops, &alloc, DType::kBF16, {n, hq, D}, part(dout, hq));
    auto to = Poisoned(ops, &alloc, DType::kBF16, {n, hq, D});
    auto tl = Poisoned(ops, &alloc, DType::kF32, {hq, n});
    auto dq = Poisoned(ops, &alloc, DType::kBF16, {n, hq, D});
    auto dk = Poisoned(ops, &alloc, DType::kBF16, {n, hkv, D});
    auto dv = Poisoned(ops, &alloc, DType::kBF16, {n, hkv, D});
    ops.Attention(tq.tensor(), tk.tensor(), tv.tensor(), to.tensor(), tl.tensor(), docs);
    ops.AttentionBackward(tq.tensor(), tk.tensor(), tv.tensor(), to.tensor(), tdo.tensor(),
                          tl.tensor(), dq.tensor(), dk.tensor(), dv.tensor(), docs);
    std::vector<std::vector<float>> r;
    for (const Buffer* t : {&to, &tl, &dq, &dk, &dv}) r.push_back(Host(ops, t->tensor()));
    return r;
  };
  const auto packed = run(0, S, DocumentMask{starts});
  EXPECT_STREQ(ops.last_attention_impl(), "cudnn");
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t b = starts[i], e = i + 1 < starts.size() ? starts[i + 1] : S, n = e - b;
    const auto one = run(b, e, DocumentMask{});
    const int64_t heads[5] = {hq, hq, hq, hkv, hkv};
    const char* names[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int j = 0; j < 5; ++j) {
      std::vector<float> got;
      if (j == 1) {  // lse [Hq, S]: document i's columns
        for (int64_t h = 0; h < hq; ++h) {
          got.insert(got.end(), packed[1].begin() + h * S + b, packed[1].begin() + h * S + e);
        }
      } else {
        got.assign(packed[j].begin() + b * heads[j] * D, packed[j].begin() + e * heads[j] * D);
      }
      EXPECT_CLOSE(got, one[j],
                   j == 1   ? 1e-5
                   : j == 0 ? 1e-2
                            : 2e-2,
                   (std::string("packed vs one by one, document ") + std::to_string(i) + " (" +
                    std::to_string(n) + " tokens) " + names[j])
                       .c_str());
    }
  }
}

// cuDNN and the own kernel on a longer sequence (no CPU oracle needed): the second opinion.
TEST(AttentionCrossCheck, CudnnAgreesWithOwnKernel) {
  SKIP_WITHOUT_GPU();
  const int64_t S = 1000, hq = 8, hkv = 2, D = 128;
  CudaAllocator alloc;
  CudaOps::Options o;
  o.alloc = &alloc;
  o.attention_forward = o.attention_backward = Impl::kCudnn;
  CudaOps a(o);
  o.attention_forward = o.attention_backward = Impl::kFlash;
  CudaOps b(o);
  std::vector<float> q = Randn(S * hq * D, 5), k = Randn(S * hkv * D, 6), v = Randn(S * hkv * D, 7);
  std::vector<float> dout = Randn(S * hq * D, 8);
  std::vector<std::vector<float>> res[2];
  CudaOps* ops[2] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    auto tq = Dev(*ops[i], &alloc, DType::kBF16, {S, hq, D}, q);
    auto tk = Dev(*ops[i], &alloc, DType::kBF16, {S, hkv, D}, k);
    auto tv = Dev(*ops[i], &alloc, DType::kBF16, {S, hkv, D}, v);
    auto tdo = Dev(*ops[i], &alloc, DType::kBF16, {S, hq, D}, dout);
    auto to = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hq, D});
    auto tl = Poisoned(*ops[i], &alloc, DType::kF32, {hq, S});
    auto dq = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hq, D});
    auto dk = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hkv, D});
    auto dv = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hkv, D});
    ops[i]->Attention(tq.tensor(), tk.tensor(), tv.tensor(), to.tensor(), tl.tensor(),
                      DocumentMask{});
    ops[i]->AttentionBackward(tq.tensor(), tk.tensor(), tv.tensor(), to.tensor(), tdo.tensor(),
                              tl.tensor(), dq.tensor(), dk.tensor(), dv.tensor(), DocumentMask{});
    for (const Buffer* t : {&to, &tl, &dq, &dk, &dv}) res[i].push_back(Host(*ops[i], t->tensor()));
  }
  const char* names[] = {"cross out", "cross lse", "cross dq", "cross dk", "cross dv"};
  for (int j = 0; j < 5; ++j) EXPECT_CLOSE(res[1][j], res[0][j], 2e-2, names[j]);
}

// A shape's first call times every plan cuDNN offers, which needs the largest plan's workspace.
// With memory too tight for that, it times the plans that fit instead of failing, and the
// results equal those of a run with room.
TEST(CudnnAttentionTest, TimesOnlyThePlansThatFitWhenMemoryIsTight) {
  SKIP_WITHOUT_GPU();
  const int64_t S = 8192, hq = 32, hkv = 8, D = 64;
  const cuda::AttentionShape sh{S, hq, hkv, D};
  CudaAllocator data;  // the operands; the workspaces come from the allocators below
  CudaOps::Options o;
  o.alloc = &data;
  CudaOps ops(o);
  const cudaStream_t stream = static_cast<cudaStream_t>(ops.streams().compute);
  std::vector<float> q = Randn(S * hq * D, 11), k = Randn(S * hkv * D, 12),
                     v = Randn(S * hkv * D, 13), dout = Randn(S * hq * D, 14);
  auto tq = Dev(ops, &data, DType::kBF16, {S, hq, D}, q);
  auto tk = Dev(ops, &data, DType::kBF16, {S, hkv, D}, k);
  auto tv = Dev(ops, &data, DType::kBF16, {S, hkv, D}, v);
  auto tdo = Dev(ops, &data, DType::kBF16, {S, hq, D}, dout);

  CudaAllocator roomy;
  cuda::CudnnAttention probe(stream, &roomy);
  auto sizes = probe.PlanWorkspaces(sh, /*backward=*/true);
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  const int64_t largest = *std::max_element(sizes->begin(), sizes->end());
  int64_t smallest = largest;
  for (int64_t w : *sizes) {
    if (w >= 0) smallest = std::min(smallest, w);
  }
  std::printf("  backward plans' workspaces:");
  for (int64_t w : *sizes) std::printf(" %lld", static_cast<long long>(w));
  std::printf("\n");
  if (smallest == largest) GTEST_SKIP() << "cuDNN offers one workspace size for this shape";

  // The forward's workspace is freed (to CUDA) before the backward's is allocated, so a cap of
  // one byte under the largest plan's leaves room for every smaller plan only.
  CudaAllocator tight(static_cast<size_t>(largest - 1));
  std::vector<std::vector<float>> res[2];
  CudaAllocator* allocs[2] = {&roomy, &tight};
  for (int i = 0; i < 2; ++i) {
    cuda::CudnnAttention attn(stream, allocs[i]);
    auto to = Poisoned(ops, &data, DType::kBF16, {S, hq, D});
    auto tl = Poisoned(ops, &data, DType::kF32, {hq, S});
    auto dq = Poisoned(ops, &data, DType::kBF16, {S, hq, D});
    auto dk = Poisoned(ops, &data, DType::kBF16, {S, hkv, D});
    auto dv = Poisoned(ops, &data, DType::kBF16, {S, hkv, D});
    ASSERT_TRUE(attn.Forward(sh, tq.tensor().data, tk.tensor().data, tv.tensor().data,
                             to.tensor().data, tl.tensor().f32())
                    .ok());
    const absl::Status st = attn.Backward(sh, tq.tensor().data, tk.tensor().data, tv.tensor().data,
                                          to.tensor().data, tdo.tensor().data, tl.tensor().f32(),
                                          dq.tensor().data, dk.tensor().data, dv.tensor().data);
    ASSERT_TRUE(st.ok()) << (i ? "tight: " : "roomy: ") << st;
    for (const Buffer* t : {&to, &tl, &dq, &dk, &dv}) res[i].push_back(Host(ops, t->tensor()));
  }
  EXPECT_LT(tight.tracker().peak(Tier::kWorkspace), largest);
  EXPECT_GE(roomy.tracker().peak(Tier::kWorkspace), largest) << "with room, every plan is timed";
  const char* names[] = {"out", "lse", "dq", "dk", "dv"};
  for (int j = 0; j < 5; ++j) EXPECT_CLOSE(res[1][j], res[0][j], 2e-2, names[j]);
}

}  // namespace
}  // namespace ithaca
