// The own Hopper attention forward and backward (hopper_attention.h) through CudaOps: against the
// CPU oracle at small S (tiles that do not divide S, GQA 4:1 and 8:1, MHA; the backward also with
// the document mask of packed samples), against cuDNN at long S, the per-shape rule's choice,
// and the training paths: the Hopper forward's O and LSE feed cuDNN's backward, which must give
// the gradients it gives after its own forward, and the Hopper backward must give cuDNN's
// gradients.
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/attention_choice.h"
#include "engine/backend/cpu/cpu_ops.h"
#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_ops.h"
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
using Kernel = AttentionKernel;

// The kernel needs a compute capability 9.0 GPU and a build with CUTLASS.
#define SKIP_WITHOUT_HOPPER()                                                                  \
  SKIP_WITHOUT_GPU();                                                                          \
  if (!cuda::HopperAttentionBuilt()) GTEST_SKIP() << "built without CUTLASS: kernel left out"; \
  if (!cuda::HopperAttentionDeviceSupported())                                                 \
  GTEST_SKIP() << "the GPU is not compute capability 9.0 (sm_90a code)"

CudaOps::Options OptionsFor(Allocator* alloc, Kernel forward, Kernel backward = Kernel::kCudnn) {
  CudaOps::Options o;
  o.alloc = alloc;
  o.attention_forward = forward;
  o.attention_backward = backward;
  return o;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    m = std::max(m, std::fabs(double(a[i]) - b[i]));
  }
  return m;
}

struct Shape4 {
  int64_t s, hq, hkv, d;
};

std::string Name(const Shape4& sh) {
  return "S" + std::to_string(sh.s) + "_hq" + std::to_string(sh.hq) + "_hkv" +
         std::to_string(sh.hkv) + "_d" + std::to_string(sh.d);
}
std::string ParamName(const ::testing::TestParamInfo<Shape4>& i) { return Name(i.param); }

// Against the CPU oracle, forward and backward.
const std::vector<Shape4> kSmallShapes = {
    {8, 4, 1, 64},       // one partial tile
    {1000, 32, 8, 64},   // Llama-3.2-1B heads, S no tile divides
    {1000, 16, 2, 128},  // GQA 8:1
    {4160, 8, 2, 64},    // 4K + 64: ragged last tiles
    {4160, 8, 1, 128},   // GQA 8:1
    {520, 6, 6, 128},    // MHA
};
// Against cuDNN, forward and backward: below and at the rules' thresholds.
const std::vector<Shape4> kLongShapes = {
    {16384, 32, 8, 64}, {16384, 32, 8, 128}, {65536, 32, 8, 64}, {65536, 32, 8, 128}};

// The forward in clusters of 2 and 4 CTAs (K/V multicast), forced, into `out` and `lse`, which
// hold the kernel's output without clusters: each cluster size matches the CPU oracle and gives
// the same bits when launched twice (no atomics, static schedule). Where it walks the rows in the
// same order as without clusters (HopperForwardPairsRowBlocks false) it gives those very bits;
// with pairs of row blocks the key blocks of a row are summed in another order.
void CheckClusters(CudaOps& ops, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, const Shape4& shape,
                   const int64_t* dev_starts, int64_t ndocs, int64_t window,
                   const std::vector<float>& out_ref, const std::vector<float>& lse_ref) {
  const auto [S, hq, hkv, D] = shape;
  const std::vector<float> unclustered = Host(ops, out), unclustered_lse = Host(ops, lse);
  const auto stream = static_cast<cudaStream_t>(ops.streams().compute);
  for (int cluster : {2, 4}) {
    if ((hq / hkv) % cluster != 0) continue;
    SCOPED_TRACE("cluster " + std::to_string(cluster));
    std::vector<float> runs[2], run_lse[2];
    for (int run = 0; run < 2; ++run) {
      ops.Fill(out, std::nanf(""));
      ops.Fill(lse, std::nanf(""));
      ASSERT_EQ(cuda::HopperAttentionForward(static_cast<const uint16_t*>(q.data),
                                             static_cast<const uint16_t*>(k.data),
                                             static_cast<const uint16_t*>(v.data), S, hq, hkv, D,
                                             static_cast<uint16_t*>(out.data), lse.f32(), stream,
                                             cluster, dev_starts, ndocs, window),
                cudaSuccess);
      runs[run] = Host(ops, out);
      run_lse[run] = Host(ops, lse);
    }
    EXPECT_CLOSE(runs[0], out_ref, 1e-2, "hopper out vs cpu, in clusters");
    EXPECT_CLOSE(run_lse[0], lse_ref, 1e-5, "hopper lse vs cpu, in clusters");
    EXPECT_EQ(runs[1], runs[0]) << "a second launch differs";
    EXPECT_EQ(run_lse[1], run_lse[0]) << "a second launch differs (LSE)";
    if (!cuda::HopperForwardPairsRowBlocks(D, cluster)) {
      EXPECT_EQ(runs[0], unclustered) << "O differs from the kernel without clusters";
      EXPECT_EQ(run_lse[0], unclustered_lse) << "LSE differs from the kernel without clusters";
    }
  }
}

class HopperVsCpu : public ::testing::TestWithParam<Shape4> {};

TEST_P(HopperVsCpu, ForwardMatchesCpu) {
  SKIP_WITHOUT_HOPPER();
  const auto [S, hq, hkv, D] = GetParam();
  CudaAllocator alloc;
  CudaOps ops(OptionsFor(&alloc, Kernel::kHopper));
  CpuOps cpu;
  std::vector<float> q = Randn(S * hq * D, 1), k = Randn(S * hkv * D, 2), v = Randn(S * hkv * D, 3);
  std::vector<float> out_ref(S * hq * D), lse_ref(hq * S);
  cpu.Attention(CpuT(q, {S, hq, D}), CpuT(k, {S, hkv, D}), CpuT(v, {S, hkv, D}),
                CpuT(out_ref, {S, hq, D}), CpuT(lse_ref, {hq, S}), DocumentMask{});
  auto tq = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, q);
  auto tk = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, k);
  auto tv = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, v);
  auto out = Poisoned(ops, &alloc, DType::kBF16, {S, hq, D});
  auto lse = Poisoned(ops, &alloc, DType::kF32, {hq, S});
  ops.Attention(tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), lse.tensor(), DocumentMask{});
  ASSERT_STREQ(ops.last_attention_impl(), "hopper");
  std::printf("[%s]\n", Name(GetParam()).c_str());
  const std::vector<float> got_lse = Host(ops, lse.tensor());
  EXPECT_CLOSE(Host(ops, out.tensor()), out_ref, 1e-2, "hopper out vs cpu");
  EXPECT_CLOSE(got_lse, lse_ref, 1e-5, "hopper lse vs cpu");
  EXPECT_LT(MaxAbsDiff(got_lse, lse_ref), 1e-4) << "lse max abs diff";

  // Launched again into the same buffers: the same bits (no atomics, static schedule).
  const std::vector<float> first = Host(ops, out.tensor());
  ops.Fill(out.tensor(), std::nanf(""));
  ops.Attention(tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), lse.tensor(), DocumentMask{});
  EXPECT_EQ(Host(ops, out.tensor()), first) << "a second launch differs";

  // Clusters of 2 and 4 CTAs (K/V multicast; the per-shape rule uses them from S 64K).
  CheckClusters(ops, tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), lse.tensor(), GetParam(),
                nullptr, 0, 0, out_ref, lse_ref);
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperVsCpu, ::testing::ValuesIn(kSmallShapes), ParamName);

// Long S (no CPU oracle): cuDNN's forward is the reference; LSE to 1e-3 absolute. Also the rule:
// kAuto picks the Hopper kernel from S 64K at both head dims (ChooseAttention, HopperRules).
class HopperVsCudnn : public ::testing::TestWithParam<Shape4> {};

TEST_P(HopperVsCudnn, ForwardMatchesCudnn) {
  SKIP_WITHOUT_HOPPER();
  const auto [S, hq, hkv, D] = GetParam();
  CudaAllocator alloc;
  CudaOps cudnn(OptionsFor(&alloc, Kernel::kCudnn));
  CudaOps hopper(OptionsFor(&alloc, Kernel::kHopper));
  CudaOps autop(OptionsFor(&alloc, Kernel::kAuto));
  auto tq = Dev(cudnn, &alloc, DType::kBF16, {S, hq, D}, Randn(S * hq * D, 11));
  auto tk = Dev(cudnn, &alloc, DType::kBF16, {S, hkv, D}, Randn(S * hkv * D, 12));
  auto tv = Dev(cudnn, &alloc, DType::kBF16, {S, hkv, D}, Randn(S * hkv * D, 13));
  std::vector<float> res[2][2];
  CudaOps* ops[2] = {&cudnn, &hopper};
  const char* impl[2] = {"cudnn", "hopper"};
  for (int i = 0; i < 2; ++i) {
    auto out = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hq, D});
    auto lse = Poisoned(*ops[i], &alloc, DType::kF32, {hq, S});
    ops[i]->Attention(tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), lse.tensor(),
                      DocumentMask{});
    EXPECT_STREQ(ops[i]->last_attention_impl(), impl[i]);
    res[i][0] = Host(*ops[i], out.tensor());
    res[i][1] = Host(*ops[i], lse.tensor());
  }
  std::printf("[%s]\n", Name(GetParam()).c_str());
  EXPECT_CLOSE(res[1][0], res[0][0], 1e-2, "hopper out vs cudnn");
  const double lse_diff = MaxAbsDiff(res[1][1], res[0][1]);
  std::printf("  lse max abs diff %.3e\n", lse_diff);
  EXPECT_LT(lse_diff, 1e-3) << "lse";

  auto out = Poisoned(autop, &alloc, DType::kBF16, {S, hq, D});
  auto lse = Poisoned(autop, &alloc, DType::kF32, {hq, S});
  autop.Attention(tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), lse.tensor(),
                  DocumentMask{});
  const bool want_hopper = S >= 65536;  // CudaOps' rule, at both head dims
  EXPECT_STREQ(autop.last_attention_impl(), want_hopper ? "hopper" : "cudnn");
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperVsCudnn, ::testing::ValuesIn(kLongShapes), ParamName);

// Training: the Hopper forward, then cuDNN's backward from its O and LSE, against cuDNN forward
// and backward. The backward recomputes P from LSE, so an LSE off by a constant or in log2
// would show in every gradient.
class HopperTraining : public ::testing::TestWithParam<Shape4> {};

TEST_P(HopperTraining, CudnnBackwardFromHopperForward) {
  SKIP_WITHOUT_HOPPER();
  const auto [S, hq, hkv, D] = GetParam();
  CudaAllocator alloc;
  CudaOps cudnn(OptionsFor(&alloc, Kernel::kCudnn));
  CudaOps hopper(OptionsFor(&alloc, Kernel::kHopper));
  auto tq = Dev(cudnn, &alloc, DType::kBF16, {S, hq, D}, Randn(S * hq * D, 21));
  auto tk = Dev(cudnn, &alloc, DType::kBF16, {S, hkv, D}, Randn(S * hkv * D, 22));
  auto tv = Dev(cudnn, &alloc, DType::kBF16, {S, hkv, D}, Randn(S * hkv * D, 23));
  auto tdo = Dev(cudnn, &alloc, DType::kBF16, {S, hq, D}, Randn(S * hq * D, 24));
  std::vector<std::vector<float>> res[2];
  CudaOps* ops[2] = {&cudnn, &hopper};
  const char* impl[2] = {"cudnn", "hopper"};
  for (int i = 0; i < 2; ++i) {
    auto out = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hq, D});
    auto lse = Poisoned(*ops[i], &alloc, DType::kF32, {hq, S});
    auto dq = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hq, D});
    auto dk = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hkv, D});
    auto dv = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hkv, D});
    ops[i]->Attention(tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), lse.tensor(),
                      DocumentMask{});
    EXPECT_STREQ(ops[i]->last_attention_impl(), impl[i]);
    ops[i]->AttentionBackward(tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), tdo.tensor(),
                              lse.tensor(), dq.tensor(), dk.tensor(), dv.tensor(), DocumentMask{});
    EXPECT_STREQ(ops[i]->last_attention_impl(), "cudnn");
    for (const Buffer* t : {&out, &dq, &dk, &dv}) res[i].push_back(Host(*ops[i], t->tensor()));
  }
  std::printf("[%s]\n", Name(GetParam()).c_str());
  EXPECT_CLOSE(res[1][0], res[0][0], 1e-2, "out, hopper vs cudnn forward");
  EXPECT_CLOSE(res[1][1], res[0][1], 2e-2, "dq after hopper vs cudnn fwd");
  EXPECT_CLOSE(res[1][2], res[0][2], 2e-2, "dk after hopper vs cudnn fwd");
  EXPECT_CLOSE(res[1][3], res[0][3], 2e-2, "dv after hopper vs cudnn fwd");
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperTraining,
                         ::testing::Values(Shape4{8192, 32, 8, 64}, Shape4{8192, 32, 8, 128},
                                           Shape4{1000, 16, 2, 128}),
                         ParamName);

// The Hopper backward against the CPU oracle's backward, from the CPU's O and LSE (so only the
// backward is under test). dK and dV are summed over each KV head's query heads in registers
// (bitwise reproducible: checked on a second launch); dQ is reduced in f32 from many CTAs, so
// only close.
void CheckBackwardAgainstCpu(const Shape4& sh, const DocumentMask& docs) {
  const auto [S, hq, hkv, D] = sh;
  CudaAllocator alloc;
  CudaOps ops(OptionsFor(&alloc, Kernel::kHopper, Kernel::kHopper));
  CpuOps cpu;
  std::vector<float> q = Randn(S * hq * D, 31), k = Randn(S * hkv * D, 32),
                     v = Randn(S * hkv * D, 33), dout = Randn(S * hq * D, 34);
  std::vector<float> out(S * hq * D), lse(hq * S);
  cpu.Attention(CpuT(q, {S, hq, D}), CpuT(k, {S, hkv, D}), CpuT(v, {S, hkv, D}),
                CpuT(out, {S, hq, D}), CpuT(lse, {hq, S}), docs);
  std::vector<float> dq_ref(S * hq * D), dk_ref(S * hkv * D), dv_ref(S * hkv * D);
  cpu.AttentionBackward(CpuT(q, {S, hq, D}), CpuT(k, {S, hkv, D}), CpuT(v, {S, hkv, D}),
                        CpuT(out, {S, hq, D}), CpuT(dout, {S, hq, D}), CpuT(lse, {hq, S}),
                        CpuT(dq_ref, {S, hq, D}), CpuT(dk_ref, {S, hkv, D}),
                        CpuT(dv_ref, {S, hkv, D}), docs);
  auto tq = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, q);
  auto tk = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, k);
  auto tv = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, v);
  auto tout = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, out);
  auto tdo = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, dout);
  auto tlse = Dev(ops, &alloc, DType::kF32, {hq, S}, lse);
  auto dq = Poisoned(ops, &alloc, DType::kBF16, {S, hq, D});
  auto dk = Poisoned(ops, &alloc, DType::kBF16, {S, hkv, D});
  auto dv = Poisoned(ops, &alloc, DType::kBF16, {S, hkv, D});
  auto backward = [&] {
    ops.AttentionBackward(tq.tensor(), tk.tensor(), tv.tensor(), tout.tensor(), tdo.tensor(),
                          tlse.tensor(), dq.tensor(), dk.tensor(), dv.tensor(), docs);
  };
  backward();
  ASSERT_STREQ(ops.last_attention_impl(), "hopper");
  std::printf("[%s, %zu documents]\n", Name(sh).c_str(), docs.trivial() ? 1 : docs.starts.size());
  const std::vector<float> got_dk = Host(ops, dk.tensor()), got_dv = Host(ops, dv.tensor());
  // bf16 inputs, O and dO against the fp32 oracle: ~3e-3 rel. L2 measured (PyTorch's cuDNN
  // SDPA lands at the same); a wrong mask, scale or LSE gives O(1).
  // (Where every query sees only itself, dQ and dK are exactly 0.)
  EXPECT_CLOSE_OR_ZERO(Host(ops, dq.tensor()), dq_ref, dv_ref, 2e-2, 1e-4, "hopper dq vs cpu");
  EXPECT_CLOSE_OR_ZERO(got_dk, dk_ref, dv_ref, 2e-2, 1e-4, "hopper dk vs cpu");
  EXPECT_CLOSE(got_dv, dv_ref, 2e-2, "hopper dv vs cpu");

  for (const Buffer* t : {&dq, &dk, &dv}) ops.Fill(t->tensor(), std::nanf(""));
  backward();
  EXPECT_EQ(Host(ops, dk.tensor()), got_dk) << "a second launch: dK differs";
  EXPECT_EQ(Host(ops, dv.tensor()), got_dv) << "a second launch: dV differs";
  EXPECT_CLOSE_OR_ZERO(Host(ops, dq.tensor()), dq_ref, dv_ref, 2e-2, 1e-4,
                       "hopper dq, second launch");
}

// GQA, ragged tiles, MHA; one document.
class HopperBackwardVsCpu : public ::testing::TestWithParam<Shape4> {};

TEST_P(HopperBackwardVsCpu, BackwardMatchesCpu) {
  SKIP_WITHOUT_HOPPER();
  CheckBackwardAgainstCpu(GetParam(), DocumentMask{});
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperBackwardVsCpu, ::testing::ValuesIn(kSmallShapes), ParamName);

// Packed samples: the document mask. Documents of one token, documents that start inside a
// 64- or 128-token tile, a KV tile over several documents, the last document one token long.
struct DocCase {
  Shape4 shape;
  std::vector<int64_t> starts;
};
const std::vector<DocCase> kDocCases = {
    {{1000, 4, 1, 64}, {0, 1, 2, 130, 300, 777}},
    {{1000, 32, 8, 128}, {0, 500, 999}},
    {{4160, 8, 2, 64}, {0, 64, 200, 2049, 2050, 4000}},
    {{4160, 8, 2, 128}, {0, 128, 256, 1000, 4159}},
    {{520, 6, 6, 128}, {0, 100, 101, 102, 333}},
};
class HopperBackwardWithDocumentsVsCpu : public ::testing::TestWithParam<DocCase> {};

TEST_P(HopperBackwardWithDocumentsVsCpu, BackwardMatchesCpu) {
  SKIP_WITHOUT_HOPPER();
  CheckBackwardAgainstCpu(GetParam().shape, DocumentMask{GetParam().starts});
}

INSTANTIATE_TEST_SUITE_P(Documents, HopperBackwardWithDocumentsVsCpu,
                         ::testing::ValuesIn(kDocCases),
                         [](const ::testing::TestParamInfo<DocCase>& i) {
                           return Name(i.param.shape) + "_docs" +
                                  std::to_string(i.param.starts.size());
                         });

// Long S: the Hopper backward against cuDNN's on the same bf16 inputs, each after its own
// CudaOps' forward (the Hopper forward where it qualifies; with documents every forward is cuDNN's
// ragged one), and the rule: kAuto runs the Hopper backward from S 16K at head_dim 64, from 32K at
// head_dim 128, with or without documents.
void CheckBackwardAgainstCudnn(const Shape4& sh, const DocumentMask& docs, uint64_t seed) {
  const auto [S, hq, hkv, D] = sh;
  CudaAllocator alloc;
  CudaOps cudnn(OptionsFor(&alloc, Kernel::kCudnn, Kernel::kCudnn));
  CudaOps hopper(OptionsFor(&alloc, Kernel::kHopper, Kernel::kHopper));
  CudaOps autop(OptionsFor(&alloc, Kernel::kAuto, Kernel::kAuto));
  auto tq = Dev(cudnn, &alloc, DType::kBF16, {S, hq, D}, Randn(S * hq * D, seed));
  auto tk = Dev(cudnn, &alloc, DType::kBF16, {S, hkv, D}, Randn(S * hkv * D, seed + 1));
  auto tv = Dev(cudnn, &alloc, DType::kBF16, {S, hkv, D}, Randn(S * hkv * D, seed + 2));
  auto tdo = Dev(cudnn, &alloc, DType::kBF16, {S, hq, D}, Randn(S * hq * D, seed + 3));
  std::vector<std::vector<float>> res[3];
  CudaOps* ops[3] = {&cudnn, &hopper, &autop};
  const bool want_hopper = S >= (D == 64 ? 16384 : 32768);  // CudaOps' rule for the backward
  const char* impl[3] = {"cudnn", "hopper", want_hopper ? "hopper" : "cudnn"};
  for (int i = 0; i < 3; ++i) {
    auto out = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hq, D});
    auto lse = Poisoned(*ops[i], &alloc, DType::kF32, {hq, S});
    auto dq = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hq, D});
    auto dk = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hkv, D});
    auto dv = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hkv, D});
    ops[i]->Attention(tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), lse.tensor(), docs);
    ops[i]->AttentionBackward(tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), tdo.tensor(),
                              lse.tensor(), dq.tensor(), dk.tensor(), dv.tensor(), docs);
    EXPECT_STREQ(ops[i]->last_attention_impl(), impl[i]) << "backward " << i;
    for (const Buffer* t : {&dq, &dk, &dv}) res[i].push_back(Host(*ops[i], t->tensor()));
  }
  std::printf("[%s, %zu documents]\n", Name(sh).c_str(), docs.trivial() ? 1 : docs.starts.size());
  EXPECT_CLOSE(res[1][0], res[0][0], 2e-2, "dq, hopper vs cudnn");
  EXPECT_CLOSE(res[1][1], res[0][1], 2e-2, "dk, hopper vs cudnn");
  EXPECT_CLOSE(res[1][2], res[0][2], 2e-2, "dv, hopper vs cudnn");
  EXPECT_CLOSE(res[2][1], res[want_hopper ? 1 : 0][1], 2e-2, "dk, auto");
}

class HopperBackwardVsCudnn : public ::testing::TestWithParam<Shape4> {};

TEST_P(HopperBackwardVsCudnn, BackwardMatchesCudnn) {
  SKIP_WITHOUT_HOPPER();
  CheckBackwardAgainstCudnn(GetParam(), DocumentMask{}, 41);
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperBackwardVsCudnn, ::testing::ValuesIn(kLongShapes),
                         ParamName);

// With documents: against cuDNN's ragged backward.
class HopperBackwardWithDocumentsVsCudnn : public ::testing::TestWithParam<Shape4> {};

TEST_P(HopperBackwardWithDocumentsVsCudnn, BackwardMatchesCudnn) {
  SKIP_WITHOUT_HOPPER();
  const int64_t S = GetParam().s;
  CheckBackwardAgainstCudnn(GetParam(), DocumentMask{{0, 3000, S / 2, S / 2 + 8, S - 4000}}, 51);
}

INSTANTIATE_TEST_SUITE_P(Shapes, HopperBackwardWithDocumentsVsCudnn,
                         ::testing::Values(Shape4{16384, 32, 8, 64}, Shape4{16384, 32, 8, 128}),
                         ParamName);

// Masks besides the causal one on both own kernels: documents (packed samples) and sliding
// windows (a query sees its last W keys), alone and together. Documents of one token, many
// small documents, one document; windows of one key, smaller than a tile (64/128 rows, 128
// keys), equal to it, not a multiple of it, wider than a tile, and wider than S.
struct MaskCase {
  const char* name;
  Shape4 shape;
  std::vector<int64_t> starts;  // empty: one document
  int64_t window = 0;
};
std::vector<int64_t> Every(int64_t n, int64_t s) {
  std::vector<int64_t> v;
  for (int64_t t = 0; t < s; t += n) v.push_back(t);
  return v;
}
const std::vector<MaskCase> kMaskCases = {
    {"docs_of_one_token", {8, 4, 1, 64}, Every(1, 8)},
    {"docs_of_one_token_hd128", {136, 4, 2, 128}, Every(1, 136)},
    {"docs_first_tokens", {1000, 4, 1, 64}, {0, 1, 2, 130, 300, 777}},
    {"docs_llama1b_hd128", {1000, 32, 8, 128}, {0, 500, 999}},
    {"docs_in_tiles", {4160, 8, 2, 64}, {0, 64, 200, 2049, 2050, 4000}},
    {"docs_last_one_token", {4160, 8, 2, 128}, {0, 128, 256, 1000, 4159}},
    {"docs_mha", {520, 6, 6, 128}, {0, 100, 101, 102, 333}},
    {"many_small_docs", {4160, 8, 2, 64}, Every(7, 4160)},
    {"many_small_docs_hd128", {2048, 8, 2, 128}, Every(33, 2048)},
    {"one_doc", {1000, 8, 2, 64}, {0}},
    {"window1", {136, 4, 2, 64}, {}, 1},
    {"window1_hd128", {136, 4, 2, 128}, {}, 1},
    {"window37", {1000, 8, 2, 64}, {}, 37},
    {"window100_hd128", {1000, 16, 2, 128}, {}, 100},
    {"window128", {1000, 8, 2, 64}, {}, 128},
    {"window200", {4160, 8, 2, 64}, {}, 200},
    {"window333_hd128", {4160, 8, 1, 128}, {}, 333},
    {"window4096", {4160, 8, 2, 64}, {}, 4096},
    {"window_wider_than_s", {520, 6, 6, 128}, {}, 1000},
    {"window_docs", {1000, 8, 2, 64}, {0, 1, 65, 200, 233, 700}, 40},
    {"window_docs_hd128", {1000, 4, 1, 128}, {0, 128, 129, 300}, 150},
};
std::string MaskName(const ::testing::TestParamInfo<MaskCase>& i) { return i.param.name; }

class HopperMasksVsCpu : public ::testing::TestWithParam<MaskCase> {};

// The forward against the CPU oracle, without clusters and in clusters of 2 and 4.
TEST_P(HopperMasksVsCpu, ForwardMatchesCpu) {
  SKIP_WITHOUT_HOPPER();
  const MaskCase& c = GetParam();
  const auto [S, hq, hkv, D] = c.shape;
  const DocumentMask docs{c.starts, c.window};
  CudaAllocator alloc;
  CudaOps ops(OptionsFor(&alloc, Kernel::kHopper));
  CpuOps cpu;
  std::vector<float> q = Randn(S * hq * D, 4), k = Randn(S * hkv * D, 5), v = Randn(S * hkv * D, 6);
  std::vector<float> out_ref(S * hq * D), lse_ref(hq * S);
  cpu.Attention(CpuT(q, {S, hq, D}), CpuT(k, {S, hkv, D}), CpuT(v, {S, hkv, D}),
                CpuT(out_ref, {S, hq, D}), CpuT(lse_ref, {hq, S}), docs);
  auto tq = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, q);
  auto tk = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, k);
  auto tv = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, v);
  auto out = Poisoned(ops, &alloc, DType::kBF16, {S, hq, D});
  auto lse = Poisoned(ops, &alloc, DType::kF32, {hq, S});
  ops.Attention(tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), lse.tensor(), docs);
  ASSERT_STREQ(ops.last_attention_impl(), "hopper");
  std::printf("[%s: %s, %zu documents, window %lld]\n", c.name, Name(c.shape).c_str(),
              c.starts.size(), static_cast<long long>(c.window));
  const std::vector<float> first = Host(ops, out.tensor()), first_lse = Host(ops, lse.tensor());
  EXPECT_CLOSE(first, out_ref, 1e-2, "hopper out vs cpu");
  EXPECT_CLOSE(first_lse, lse_ref, 1e-5, "hopper lse vs cpu");
  EXPECT_LT(MaxAbsDiff(first_lse, lse_ref), 1e-4) << "lse max abs diff";

  const size_t n = docs.trivial() ? 0 : docs.starts.size();
  int64_t* dev_starts = nullptr;
  if (n > 0) {
    ASSERT_EQ(cudaMalloc(&dev_starts, n * sizeof(int64_t)), cudaSuccess);
    ASSERT_EQ(
        cudaMemcpy(dev_starts, docs.starts.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice),
        cudaSuccess);
  }
  CheckClusters(ops, tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), lse.tensor(), c.shape,
                dev_starts, static_cast<int64_t>(n), c.window, out_ref, lse_ref);
  if (dev_starts != nullptr) cudaFree(dev_starts);
}

TEST_P(HopperMasksVsCpu, BackwardMatchesCpu) {
  SKIP_WITHOUT_HOPPER();
  CheckBackwardAgainstCpu(GetParam().shape, DocumentMask{GetParam().starts, GetParam().window});
}

INSTANTIATE_TEST_SUITE_P(Masks, HopperMasksVsCpu, ::testing::ValuesIn(kMaskCases), MaskName);

// Long S: the masked forward against cuDNN's (ragged for documents, its causal band for a
// window), then both backwards; and what auto runs (HopperRules).
class HopperMasksVsCudnn : public ::testing::TestWithParam<MaskCase> {};

TEST_P(HopperMasksVsCudnn, ForwardAndBackwardMatchCudnn) {
  SKIP_WITHOUT_HOPPER();
  const MaskCase& c = GetParam();
  const auto [S, hq, hkv, D] = c.shape;
  const DocumentMask docs{c.starts, c.window};
  CudaAllocator alloc;
  CudaOps cudnn(OptionsFor(&alloc, Kernel::kCudnn, Kernel::kCudnn));
  CudaOps hopper(OptionsFor(&alloc, Kernel::kHopper, Kernel::kHopper));
  CudaOps autop(OptionsFor(&alloc, Kernel::kAuto, Kernel::kAuto));
  auto tq = Dev(cudnn, &alloc, DType::kBF16, {S, hq, D}, Randn(S * hq * D, 61));
  auto tk = Dev(cudnn, &alloc, DType::kBF16, {S, hkv, D}, Randn(S * hkv * D, 62));
  auto tv = Dev(cudnn, &alloc, DType::kBF16, {S, hkv, D}, Randn(S * hkv * D, 63));
  auto tdo = Dev(cudnn, &alloc, DType::kBF16, {S, hq, D}, Randn(S * hq * D, 64));
  const AttentionShape shape{S, D, !docs.trivial(), c.window};
  const char* want_fwd =
      AttentionKernelName(ChooseAttention(AttentionPass::kForward, shape, Kernel::kAuto).kernel);
  const char* want_bwd =
      AttentionKernelName(ChooseAttention(AttentionPass::kBackward, shape, Kernel::kAuto).kernel);
  std::vector<std::vector<float>> res[3];
  CudaOps* ops[3] = {&cudnn, &hopper, &autop};
  const char* fwd_impl[3] = {"cudnn", "hopper", want_fwd};
  const char* bwd_impl[3] = {"cudnn", "hopper", want_bwd};
  for (int i = 0; i < 3; ++i) {
    auto out = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hq, D});
    auto lse = Poisoned(*ops[i], &alloc, DType::kF32, {hq, S});
    auto dq = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hq, D});
    auto dk = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hkv, D});
    auto dv = Poisoned(*ops[i], &alloc, DType::kBF16, {S, hkv, D});
    ops[i]->Attention(tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), lse.tensor(), docs);
    EXPECT_STREQ(ops[i]->last_attention_impl(), fwd_impl[i]) << "forward " << i;
    ops[i]->AttentionBackward(tq.tensor(), tk.tensor(), tv.tensor(), out.tensor(), tdo.tensor(),
                              lse.tensor(), dq.tensor(), dk.tensor(), dv.tensor(), docs);
    EXPECT_STREQ(ops[i]->last_attention_impl(), bwd_impl[i]) << "backward " << i;
    for (const Buffer* t : {&out, &lse, &dq, &dk, &dv})
      res[i].push_back(Host(*ops[i], t->tensor()));
  }
  std::printf("[%s: %s]\n", c.name, Name(c.shape).c_str());
  EXPECT_CLOSE(res[1][0], res[0][0], 1e-2, "out, hopper vs cudnn");
  EXPECT_LT(MaxAbsDiff(res[1][1], res[0][1]), 1e-3) << "lse, hopper vs cudnn";
  EXPECT_CLOSE(res[1][2], res[0][2], 2e-2, "dq, hopper vs cudnn");
  EXPECT_CLOSE(res[1][3], res[0][3], 2e-2, "dk, hopper vs cudnn");
  EXPECT_CLOSE(res[1][4], res[0][4], 2e-2, "dv, hopper vs cudnn");
}

INSTANTIATE_TEST_SUITE_P(
    Masks, HopperMasksVsCudnn,
    ::testing::Values(MaskCase{"docs_16k_hd64", {16384, 32, 8, 64}, {0, 3000, 8192, 8200, 12384}},
                      MaskCase{"docs8k_64k_hd128", {65536, 32, 8, 128}, Every(8192, 65536)},
                      MaskCase{"window4096_64k_hd64", {65536, 32, 8, 64}, {}, 4096},
                      MaskCase{"window1000_16k_hd128", {16384, 32, 8, 128}, {}, 1000}),
    MaskName);

// The planner's figure for the Hopper backward's workspace (attention_choice.h, no CUDA) is the
// kernel's own.
TEST(HopperWorkspace, ThePlannerCountsWhatTheKernelTakes) {
  if (!cuda::HopperAttentionBuilt()) GTEST_SKIP() << "built without CUTLASS: kernel left out";
  for (int64_t s : {8, 1000, 4160, 131072, 524288}) {
    for (int64_t d : {64, 128}) {
      EXPECT_EQ(cuda::HopperAttentionBackwardWorkspace(s, 32, 8, d),
                HopperBackwardWorkspaceBytes(s, 32, d))
          << s << " " << d;
    }
  }
}

// Run-time failures of CudaOps: the operands come from an allocator of their own (`alloc`),
// CudaOps' workspaces from one capped at 8 MiB (`workspaces`).
class HopperRunTimeFailure : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_HOPPER();
    CudaOps::Options o = OptionsFor(&workspaces, Kernel::kHopper, Kernel::kHopper);
    o.gemm_workspace_bytes = size_t{1} << 20;
    ops_ = std::make_unique<CudaOps>(o);
    ASSERT_TRUE(ops_->status().ok());
  }
  CudaAllocator alloc;
  CudaAllocator workspaces{size_t{8} << 20};
  std::unique_ptr<CudaOps> ops_;  // made in SetUp, where a machine without the GPU skips
};

// A backward whose workspace the device cannot hold does not abort the process: the op records
// RESOURCE_EXHAUSTED, naming the attention pass and the workspace, and Ops::status() keeps the
// first failure.
TEST_F(HopperRunTimeFailure, AWorkspaceThatDoesNotFitIsAnErrorNotAnAbort) {
  CudaOps& ops = *ops_;
  const int64_t S = 4096, hq = 8, hkv = 2, D = 128;
  auto q = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, Randn(S * hq * D, 41));
  auto k = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, Randn(S * hkv * D, 42));
  auto v = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, Randn(S * hkv * D, 43));
  auto out = Poisoned(ops, &alloc, DType::kBF16, {S, hq, D});
  auto lse = Poisoned(ops, &alloc, DType::kF32, {hq, S});
  ops.Attention(q.tensor(), k.tensor(), v.tensor(), out.tensor(), lse.tensor(), {});
  ASSERT_TRUE(ops.status().ok()) << ops.status();
  auto dout = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, Randn(S * hq * D, 44));
  auto dq = Poisoned(ops, &alloc, DType::kBF16, {S, hq, D});
  auto dk = Poisoned(ops, &alloc, DType::kBF16, {S, hkv, D});
  auto dv = Poisoned(ops, &alloc, DType::kBF16, {S, hkv, D});
  // The workspace (the f32 dQ accumulator, 17 MB here) is more than the cap.
  ASSERT_GT(cuda::HopperAttentionBackwardWorkspace(S, hq, hkv, D), 8 << 20);
  ops.AttentionBackward(q.tensor(), k.tensor(), v.tensor(), out.tensor(), dout.tensor(),
                        lse.tensor(), dq.tensor(), dk.tensor(), dv.tensor(), {});
  const absl::Status st = ops.status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("attention backward at S 4096"), std::string::npos) << st;
  EXPECT_NE(st.message().find("workspace"), std::string::npos) << st;
  // The first failure is kept; the process is alive and the device still works.
  ops.Attention(q.tensor(), k.tensor(), v.tensor(), out.tensor(), lse.tensor(), {});
  EXPECT_EQ(ops.status(), st);
  EXPECT_TRUE(std::isfinite(Host(ops, out.tensor())[0]));
}

// The document index (the starts of a packed sample's documents on the device) that finds its
// allocator full does not abort either: Rope records RESOURCE_EXHAUSTED naming the index, and
// the attention that would read it skips its launch.
TEST_F(HopperRunTimeFailure, ADocumentIndexThatDoesNotFitIsAnErrorNotAnAbort) {
  CudaOps& ops = *ops_;
  const int64_t S = 1024, hq = 4, hkv = 1, D = 64;
  // Everything the capped allocator has left, held.
  std::vector<Buffer> held;
  for (int64_t n : {int64_t{1} << 16, int64_t{1} << 12, int64_t{1} << 8, int64_t{1}}) {
    for (;;) {
      auto b = Buffer::Make(&workspaces, DType::kI32, {n}, Tier::kAttention);
      if (!b.ok()) break;
      held.push_back(std::move(*b));
    }
  }
  ASSERT_FALSE(held.empty());
  auto x = Dev(ops, &alloc, DType::kBF16, {S, hq, D}, Randn(S * hq * D, 51));
  auto inv_freq = Dev(ops, &alloc, DType::kF32, {D / 2}, std::vector<float>(D / 2, 0.01f));
  DocumentMask docs;
  docs.starts = {0, 100, 600};
  ops.Rope(x.tensor(), 0, inv_freq.tensor(), false, docs);
  const absl::Status st = ops.status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("document index"), std::string::npos) << st;
  auto k = Dev(ops, &alloc, DType::kBF16, {S, hkv, D}, Randn(S * hkv * D, 52));
  auto out = Poisoned(ops, &alloc, DType::kBF16, {S, hq, D});
  auto lse = Poisoned(ops, &alloc, DType::kF32, {hq, S});
  ops.Attention(x.tensor(), k.tensor(), k.tensor(), out.tensor(), lse.tensor(), docs);
  EXPECT_EQ(ops.status(), st);
}

}  // namespace
}  // namespace ithaca
