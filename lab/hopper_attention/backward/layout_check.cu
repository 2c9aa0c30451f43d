// Host-only checks of the backward's CuTe layouts (runs on the CPU machine, no GPU): the transposed
// shared-memory views, the register reuse of Sᵀ/dPᵀ as the A operand of the dV/dK wgmma, the
// stmatrix retiling of dSᵀ, the dQ and dK/dV ownership per thread. check_layouts.sh runs it.
#include "engine/backend/cuda/hopper_attention_bwd.cu"
#include <cstdio>
using namespace cute;
namespace ithaca_bwd {
namespace {
template <class C>
int run(const char* name) {
  int bad = 0;
  constexpr int Bm = C::kBlockM, D = C::D;
  // 1. transposed smem views address the same element
  auto Q = typename C::SmemQ{};
  auto Qt = typename C::SmemQt{};
  for (int s = 0; s < C::kStages; ++s)
    for (int q = 0; q < Bm; ++q)
      for (int d = 0; d < D; ++d)
        if (Q(q, d, s) != Qt(d, q, s)) ++bad;
  auto K = typename C::SmemK{};
  auto Kt = typename C::SmemKt{};
  for (int n = 0; n < kBlockN; ++n)
    for (int d = 0; d < D; ++d)
      if (K(n, d) != Kt(d, n)) ++bad;
  auto dS = typename C::SmemdS{};
  auto dSt = typename C::SmemdSt{};
  for (int s = 0; s < C::kStages; ++s)
    for (int q = 0; q < Bm; ++q)
      for (int n = 0; n < kBlockN; ++n)
        if (dS(q, n, s) != dSt(n, q, s)) ++bad;
  printf("%s transposed views: %d mismatches\n", name, bad);
  // 2. acc_as_A: the A operand of dV/dK (RS) reads P^T / dS^T element (key, q) from the register
  //    that holds S^T / dP^T element (key, q).
  typename C::MmaSdP mma_sdp;
  typename C::MmadKV mma_dkv;
  typename C::MmadQ mma_dq;
  int bad2 = 0;
  for (int t = 0; t < 256; ++t) {
    auto thr_sdp = mma_sdp.get_thread_slice(t);
    auto thr_dkv = mma_dkv.get_thread_slice(t);
    Tensor cC = thr_sdp.partition_C(make_identity_tensor(Shape<Int<kBlockN>, Int<Bm>>{}));
    Tensor cA = thr_dkv.partition_A(make_identity_tensor(Shape<Int<kBlockN>, Int<Bm>>{}));
    Tensor frag = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<Bm>>{});
    auto la = acc_as_A(frag.layout());
    if (t == 0) {
      print("  C frag ");
      print(frag.layout());
      print("\n  A view ");
      print(la);
      print("\n  A part ");
      print(cA.layout());
      print("\n");
    }
    if (size(la) != size(cA)) {
      ++bad2;
      continue;
    }
    for (int i = 0; i < size(cA); ++i) {
      auto a = cA(i);
      auto c = cC(la(i));
      if (get<0>(a) != get<0>(c) || get<1>(a) != get<1>(c)) ++bad2;
    }
  }
  printf("%s acc_as_A: %d mismatches\n", name, bad2);
  // 3. dQ partition: every (row, col) of the Bm x D tile owned exactly once over 256 threads.
  int cnt[128 * 128] = {0};
  int bad3 = 0;
  for (int t = 0; t < 256; ++t) {
    Tensor c =
        mma_dq.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<Bm>, Int<D>>{}));
    if (size(c) != C::kDqPerThread) ++bad3;
    for (int i = 0; i < size(c); ++i) cnt[get<0>(c(i)) * D + get<1>(c(i))]++;
  }
  for (int i = 0; i < Bm * D; ++i)
    if (cnt[i] != 1) ++bad3;
  printf("%s dQ ownership: %d problems\n", name, bad3);
  // 4. dK/dV partition: warpgroup w owns keys [64w, 64w+64).
  int bad4 = 0;
  for (int t = 0; t < 256; ++t) {
    Tensor c = mma_dkv.get_thread_slice(t).partition_C(
        make_identity_tensor(Shape<Int<kBlockN>, Int<D>>{}));
    for (int i = 0; i < size(c); ++i)
      if (get<0>(c(i)) / 64 != t / 128) ++bad4;
    Tensor s = mma_sdp.get_thread_slice(t).partition_C(
        make_identity_tensor(Shape<Int<kBlockN>, Int<Bm>>{}));
    for (int i = 0; i < size(s); ++i)
      if (get<0>(s(i)) / 64 != t / 128) ++bad4;
  }
  printf("%s key rows per warpgroup: %d problems\n", name, bad4);
  // 5. stmatrix.trans store of dS^T: the copy's source element k of thread t is the register
  //    holding the C element whose coordinate the copy assigns to k.
  int bad5 = 0;
  auto stsm = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, bf16>{}, mma_sdp);
  for (int t = 0; t < 256; ++t) {
    auto thr = stsm.get_thread_slice(t);
    Tensor id = make_identity_tensor(Shape<Int<kBlockN>, Int<Bm>>{});
    Tensor src = thr.partition_S(id);
    Tensor cC = mma_sdp.get_thread_slice(t).partition_C(id);
    Tensor frag = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<Bm>>{});
    int idx[decltype(size(frag))::value];
    for (int i = 0; i < size(frag); ++i) idx[i] = i;
    Tensor fi = make_tensor(&idx[0], frag.layout());
    Tensor r = thr.retile_S(fi);
    if (size(r) != size(src)) {
      ++bad5;
      continue;
    }
    for (int k = 0; k < size(r); ++k) {
      auto a = src(k);
      auto c = cC(r(k));
      if (get<0>(a) != get<0>(c) || get<1>(a) != get<1>(c)) ++bad5;
    }
  }
  printf("%s stmatrix retile: %d mismatches\n", name, bad5);
  bad += bad5;
  printf("%s smem bytes %zu\n", name, sizeof(typename C::SharedStorage));
  return bad + bad2 + bad3 + bad4;
}
}  // namespace
}  // namespace ithaca_bwd
int main() {
  int r =
      ithaca_bwd::run<ithaca_bwd::CfgD128>("hd128") + ithaca_bwd::run<ithaca_bwd::CfgD64>("hd64");
  printf(r ? "FAIL\n" : "ALL OK\n");
  return r != 0;
}
