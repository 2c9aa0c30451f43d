// The own Hopper (sm_90a) causal GQA attention BACKWARD (hopper_attention.h), FlashAttention-3
// style (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, 2024: hopper/mainloop_bwd_sm90_tma_gmma_
// ws.hpp); the code is our own, on CuTe, in the conventions of the forward (hopper_attention.cu).
// lab/hopper_attention/backward/ builds it standalone (variants, PyTorch checks, ncu) and its
// README has the design notes and the measurements.
//
// Layouts (the forward's): Q, O, dO, dQ [S, Hq, D] bf16; K, V, dK, dV [S, Hkv, D] bf16 (token
// stride H·D); LSE [Hq, S] f32, natural log of sum_j exp(scale · q·k_j), scale = 1/sqrt(D).
// Query head h reads KV head h / (Hq / Hkv). Causal (key j ≤ query i), optionally
// document-masked (packed samples: key j also ≥ the start of query i's document) and optionally
// windowed (a sliding window of W keys: j > i - W). Query i sees the keys [lo(i), i].
//
// Three kernels on one stream:
//   1. preprocess: Dsum[h, i] = Σ_d dO[i,h,d]·O[i,h,d] and LSE·log2(e) copied into a padded
//      [Hq, S_pad] buffer (padding rows: Dsum 0, LSE +inf, so that their P is exactly 0); the f32
//      dQ accumulator is zeroed by cudaMemsetAsync. With documents or a window, each row's first
//      key lo (int32 [S_pad]; padding rows: S_pad, so every key is masked), and with documents
//      the end of each row's document too.
//   2. main: one CTA per (KV head g, KV tile n of 128 keys), ordered KV-head-major and longest
//      first (small n = most query tiles). It loops over the query tiles m at or after its
//      diagonal (with documents or a window: up to the last query that sees its last key; the
//      KV tiles beyond a window are never visited) and, inside, over the
//      Hq/Hkv query heads of the group, so dK and dV accumulate in registers with no atomics.
//      Per (m, h), with the KV tile as the M side of the GEMMs ("SdP swapAB"):
//          Sᵀ  = K Qᵀ                     (SS wgmma, 128 × Bm)
//          dPᵀ = V dOᵀ                    (SS wgmma)
//          Pᵀ  = exp2(Sᵀ·scale·log2e − LSE·log2e)   (causal mask on the diagonal tiles; the
//                                         document mask where a query's document starts after
//                                         the tile's first key)
//          dSᵀ = Pᵀ ∘ (dPᵀ − Dsum)
//          dV += Pᵀ dO                    (RS wgmma: Pᵀ straight from registers)
//          dK += dSᵀ Q                    (RS wgmma)
//          dQ_m += dS K                   (SS wgmma, dS through shared memory), reduced into
//                                         the f32 accumulator with cp.reduce.async.bulk (a
//                                         whole warpgroup slice per instruction, from smem)
//      dK is scaled by `scale` in the epilogue; dK, dV stored from registers.
//   3. postprocess: dQ = bf16(scale · dQ_accum).
//
// Warp roles (384 threads): warpgroup 0 = warp 0 producer (TMA of K, V once; Q, dO, LSE, Dsum
// per (m, h) into a 2-stage PipelineTmaAsync) + warp 1 dQ writer (bulk reduce-add of each
// consumer warpgroup's dQ slice); warpgroups 1, 2 = consumers, each owning 64 of the 128 keys
// for S/dP/dK/dV and half of the dQ tile.
//
// Tiles as FA3 on H100: head_dim 128: 128 keys × 64 queries; head_dim 64: 128 × 128.
//
// dQ accumulator layout: [Hq, S_pad, D] f32 in blocks of Bm·D floats per (h, m). Inside a block
// the values are in *register order*, not row-major: consumer warpgroup w owns the half
// [w·Bm·D/2, (w+1)·Bm·D/2); its thread t (0..127) puts value i of its dQ fragment at
// (i/4)·512 + 4t + i%4. So the shared-memory staging is written with conflict-free 16-byte
// stores and the bulk reduce is one contiguous copy; the postprocess kernel recomputes each
// value's (row, col) from the same TiledMma partition. dK and dV are bitwise reproducible; dQ is
// not (f32 reductions from many CTAs in the order they finish).
//
// The choices below are the measured best of the variants timed on the H200 (causal 32:8, hd64
// at 128K: descending query tiles 528.8 TFLOPS, ascending 514.4, KV-tile-major CTAs 526.3, dQ by
// float4 atomics 517.5, dV issued before dS -4 %; the variants' code is in git history before
// the commit that removed their switches, and lab/hopper_attention/ holds their notes).
#include <cuda_runtime.h>

#include <cstdint>

// clang-format off: cute/tensor.hpp must come before the atoms.
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>
// clang-format on

#include "engine/backend/cuda/hopper_attention.h"
#include "engine/backend/cuda/hopper_cute.cuh"

// Registers of the producer warpgroup (setmaxnreg); consumers get 240. 24 + 2·240 fits the
// register file with 128 threads each.
constexpr int kProducerRegs = 24;
// Query tiles inside a CTA go descending from the last tile (the concurrent CTAs walk the same
// query tiles in lock-step: a small L2 working set). CTAs are KV-head-major (all KV tiles of KV
// head 0, longest first, then head 1, ...).

namespace ithaca_bwd {
namespace {

using namespace cute;
using bf16 = cutlass::bfloat16_t;

constexpr int kBlockN = 128;  // keys per CTA
constexpr int kPadS = 128;    // S_pad = S rounded up to this (a multiple of every Bm)

template <int D_, int kBlockM_, int kStages_>
struct Cfg {
  static constexpr int D = D_;
  static constexpr int kBlockM = kBlockM_;  // queries per step
  static constexpr int kStages = kStages_;  // Q/dO/LSE/Dsum stages (and dS buffers)
  static constexpr int NWG = 2;             // consumer warpgroups
  static constexpr int NumMmaThreads = 128 * NWG;
  static constexpr int NumThreads = NumMmaThreads + 128;
  // dQ = dS K: hd128 (Bm 64) splits the head dim over the 2 warpgroups; hd64 (Bm 128) the rows.
  static constexpr int kAtomMdQ = kBlockM / 64;  // 1 or 2
  static_assert(kAtomMdQ == 1 || kAtomMdQ == 2, "kBlockM must be 64 or 128");

  // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: M = keys (64 per warpgroup), N = queries, K = D.
  using MmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<bf16, bf16, float, Shape<Int<kBlockN / NWG>, Int<kBlockM>, Int<D>>>(),
      Layout<Shape<Int<NWG>, _1, _1>>{}));
  // dV += Pᵀ dO, dK += dSᵀ Q: M = keys (64 per warpgroup), N = D, K = queries; A from registers.
  using MmadKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<bf16, bf16, float, Shape<Int<kBlockN / NWG>, Int<D>, Int<kBlockM>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<Int<NWG>, _1, _1>>{}));
  // dQ = dS K: M = queries, N = D, K = keys. A = dS (smem, K-major), B = Kᵀ view (MN-major).
  using MmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<bf16, bf16, float,
                           Shape<Int<kBlockM / kAtomMdQ>, Int<D / (NWG / kAtomMdQ)>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<Int<kAtomMdQ>, Int<NWG / kAtomMdQ>, _1>>{}));

  // Shared memory. Every tile is K-major with 128-byte swizzle; the transposed views (Qᵀ, dOᵀ,
  // Kᵀ, dSᵀ) are compositions of the same layouts (same bytes, MN-major for the GEMM that reads
  // them), as FA3 does.
  using SmemQ = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{},
                                       Shape<Int<kBlockM>, Int<D>, Int<kStages>>{}));
  using SmemQt =
      decltype(composition(SmemQ{}, make_layout(Shape<Int<D>, Int<kBlockM>, Int<kStages>>{},
                                                Stride<Int<kBlockM>, _1, Int<kBlockM * D>>{})));
  using SmemK =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{}, Shape<Int<kBlockN>, Int<D>>{}));
  using SmemKt = decltype(composition(
      SmemK{}, make_layout(Shape<Int<D>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));
  using SmemdS = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{},
                                        Shape<Int<kBlockM>, Int<kBlockN>, Int<kStages>>{}));
  using SmemdSt = decltype(composition(
      SmemdS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>, Int<kStages>>{},
                            Stride<Int<kBlockM>, _1, Int<kBlockM * kBlockN>>{})));

  using GShape = Shape<int32_t, int32_t, int32_t>;  // (S, D, H)
  using GStride = Stride<int64_t, _1, int64_t>;     // (H*D, 1, D)
  using TmaQ = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<bf16 const*>(nullptr)), GShape{}, GStride{}),
      take<0, 2>(SmemQ{}), Shape<Int<kBlockM>, Int<D>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<bf16 const*>(nullptr)), GShape{}, GStride{}), SmemK{},
      Shape<Int<kBlockN>, Int<D>>{}, _1{}));

  using Pipe = cutlass::PipelineTmaAsync<kStages>;

  static constexpr int kDqHalf = kBlockM * D / NWG;  // floats of one warpgroup's dQ slice
  // Floats of the dQ fragment per consumer thread.
  static constexpr int kDqPerThread = kBlockM * D / NumMmaThreads;
  static_assert(kDqPerThread % 4 == 0, "dQ fragment must split into float4");

  struct SharedStorage {
    alignas(1024) cute::array_aligned<bf16, cosize_v<SmemQ>, 1024> q;
    alignas(1024) cute::array_aligned<bf16, cosize_v<SmemQ>, 1024> dO;
    alignas(1024) cute::array_aligned<bf16, cosize_v<SmemK>, 1024> k;
    alignas(1024) cute::array_aligned<bf16, cosize_v<SmemK>, 1024> v;
    alignas(1024) cute::array_aligned<bf16, cosize_v<SmemdS>, 1024> ds;
    alignas(128) cute::array_aligned<float, kBlockM * D, 128> dq;
    alignas(128) float lse[kStages][kBlockM];
    alignas(128) float dsum[kStages][kBlockM];
    alignas(128) int doc_lo[kStages][kBlockM];  // with documents or a window only
    typename Pipe::SharedStorage pipe;
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_kv;
  };

  static constexpr uint32_t kBytesQ = kBlockM * D * 2;
  static constexpr uint32_t kBytesKV = kBlockN * D * 2;
  static constexpr uint32_t kBytesStage = 2 * kBytesQ + 2 * kBlockM * 4;
};

struct Problem {
  int S, S_pad, Hq, Hkv, num_n, num_m;
  float scale, scale_log2;
  float const* lse2;  // [Hq, S_pad] LSE·log2(e), +inf past S
  float const* dsum;  // [Hq, S_pad], 0 past S
  float* dq_acc;      // [Hq, S_pad, D] blocks in register order (see the top)
  int const* doc_lo;  // [S_pad] first key each row sees; nullptr: causal only
  int const* doc_hi;  // [S_pad] one past the last token of each row's document; or nullptr
  int window;         // a sliding window of this many keys; 0: none
  bf16* dk;
  bf16* dv;
};

// One past the last query tile a CTA with KV tile n visits: every tile to the end, or up to the
// last query that sees the tile's last key: the end of that key's document, and with a window
// the key + W - 1 (no later query sees a key of the tile). Producer, dQ writer and consumers
// all call it.
template <int Bm>
__device__ __forceinline__ int m_end(Problem const& pb, int n_block) {
  if (pb.doc_hi == nullptr && pb.window == 0) return pb.num_m;
  int const last_key = min((n_block + 1) * kBlockN, pb.S) - 1;
  int end = pb.doc_hi != nullptr ? pb.doc_hi[last_key] : pb.S;  // one past the last query
  if (pb.window > 0) end = min(end, last_key + pb.window);
  return min(pb.num_m, (end + Bm - 1) / Bm);
}

template <class C>
struct Params {
  typename C::TmaQ tma_q;
  typename C::TmaQ tma_do;
  typename C::TmaK tma_k;
  typename C::TmaK tma_v;
  Problem pb;
};

// Named barrier ids (CUTLASS adds its reserved count). PdS: both consumer warpgroups wrote their
// dS half. dQ empty/full per consumer warpgroup, between it (128) and the dQ writer warp (32).
enum : uint32_t { kBarPdS = 0, kBarDqEmpty0 = 1, kBarDqFull0 = 3 };

using ithaca::cuda::hopper::acc_as_A;  // hopper_cute.cuh: helpers shared with the forward
using ithaca::cuda::hopper::acc_rowcol;
using ithaca::cuda::hopper::exp2_ftz;
using ithaca::cuda::hopper::wg_gemm;

// Physical register k of src (f32) -> physical register k of dst (bf16); both tensors share
// the accumulator's register order.
template <class TS, class TD>
__device__ __forceinline__ void convert_bf16(TS const& src, TD& dst) {
  static_assert(decltype(size(src))::value == decltype(size(dst))::value);
  float const* s = src.data();
  auto* d = reinterpret_cast<__nv_bfloat162*>(dst.data());
  CUTE_UNROLL
  for (int k = 0; k < decltype(size(src))::value / 2; ++k)
    d[k] = __floats2bfloat162_rn(s[2 * k], s[2 * k + 1]);
}

__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, float const* smem, int bytes) {
  uint32_t const s = cute::cast_smem_ptr_to_uint(smem);
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               :
               : "l"(gmem), "r"(s), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// KV tile of CTA b: KV-head-major (all tiles of KV head 0 first, so the CTAs running at one time
// read the same query heads' Q/dO), longest first inside a head (tile 0 has every query tile).
CUTE_HOST_DEVICE void cta_coords(Problem const& pb, int b, int& g, int& n) {
  g = b / pb.num_n;
  n = b % pb.num_n;
}

// The it-th query tile a CTA visits (descending); producer, dQ writer and consumers all
// walk the same sequence.
CUTE_HOST_DEVICE int m_at(int it, int /*m_min*/, int m_max) { return m_max - 1 - it; }

// ------------------------------------------------------------------------------ preprocess
// One warp per (query row i < S_pad, head h).
__global__ void bwd_preprocess(bf16 const* __restrict__ o, bf16 const* __restrict__ dout,
                               float const* __restrict__ lse, float* __restrict__ lse2,
                               float* __restrict__ dsum, int S, int S_pad, int Hq, int D,
                               int64_t const* __restrict__ doc_starts, int ndocs, int window,
                               int* __restrict__ doc_lo, int* __restrict__ doc_hi) {
  int64_t const w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  int const lane = threadIdx.x % 32;
  if (w >= int64_t(S_pad) * Hq) return;
  int const i = int(w / Hq), h = int(w % Hq);
  float acc = 0.f;
  if (i < S) {
    int64_t const base = (int64_t(i) * Hq + h) * D;
    auto const* o2 = reinterpret_cast<__nv_bfloat162 const*>(o + base);
    auto const* d2 = reinterpret_cast<__nv_bfloat162 const*>(dout + base);
    for (int d = lane; d < D / 2; d += 32) {
      float2 const a = __bfloat1622float2(o2[d]);
      float2 const b = __bfloat1622float2(d2[d]);
      acc = fmaf(a.x, b.x, acc);
      acc = fmaf(a.y, b.y, acc);
    }
  }
  CUTE_UNROLL
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffff, acc, off);
  if (lane == 0) {
    int64_t const j = int64_t(h) * S_pad + i;
    dsum[j] = i < S ? acc : 0.f;
    lse2[j] = i < S ? lse[int64_t(h) * S + i] * 1.4426950408889634f : INFINITY;
    if ((doc_starts != nullptr || window > 0) && h == 0) {
      // The last document starting at or before i (binary search; starts[0] = 0).
      int lo = 0, hi = doc_starts != nullptr ? ndocs : 1;
      while (hi - lo > 1) {
        int const mid = (lo + hi) / 2;
        if (doc_starts[mid] <= i)
          lo = mid;
        else
          hi = mid;
      }
      int const start = doc_starts != nullptr ? int(doc_starts[lo]) : 0;
      doc_lo[i] = i >= S ? S_pad : window > 0 ? max(start, i - window + 1) : start;
      if (doc_starts != nullptr) doc_hi[i] = i < S && lo + 1 < ndocs ? int(doc_starts[lo + 1]) : S;
    }
  }
}

// ------------------------------------------------------------------------------ postprocess
// One CTA of 256 threads per (query tile m, head h); thread t reads the values it (as consumer
// thread t of the main kernel) reduced, and finds their (row, col) from the same partition.
template <class C>
__global__ void __launch_bounds__(C::NumMmaThreads)
    bwd_postprocess(float const* __restrict__ dq_acc, bf16* __restrict__ dq, int S, int S_pad,
                    int Hq, float scale) {
  int const m = blockIdx.x, h = blockIdx.y;
  int const tid = threadIdx.x, wg = tid / 128, t = tid % 128;
  typename C::MmadQ mma;
  auto thr = mma.get_thread_slice(tid);
  Tensor cQ = make_identity_tensor(Shape<Int<C::kBlockM>, Int<C::D>>{});
  Tensor tc = thr.partition_C(cQ);
  static_assert(decltype(size(tc))::value == C::kDqPerThread);
  float const* blk =
      dq_acc + (int64_t(h) * S_pad + int64_t(m) * C::kBlockM) * C::D + wg * C::kDqHalf + t * 4;
  int64_t const ld = int64_t(Hq) * C::D;
  CUTE_UNROLL
  for (int i = 0; i < C::kDqPerThread; i += 4) {
    float4 const v = *reinterpret_cast<float4 const*>(blk + (i / 4) * 512);
    float const vals[4] = {v.x, v.y, v.z, v.w};
    CUTE_UNROLL
    for (int k = 0; k < 4; ++k) {
      int const row = m * C::kBlockM + get<0>(tc(i + k));
      int const col = get<1>(tc(i + k));
      if (row < S) dq[row * ld + h * C::D + col] = bf16(vals[k] * scale);
    }
  }
}

// ------------------------------------------------------------------------------ main kernel
template <class C>
__global__ void __launch_bounds__(C::NumThreads, 1)
    attn_bwd_kernel(__grid_constant__ Params<C> const p) {
  using SS = typename C::SharedStorage;
  using Pipe = typename C::Pipe;
  constexpr int Bm = C::kBlockM;
  extern __shared__ __align__(1024) char smem_raw[];
  SS& ss = *reinterpret_cast<SS*>(smem_raw);
  Problem const& pb = p.pb;

  int const warp_idx = cutlass::canonical_warp_idx_sync();
  int const wg_idx = cutlass::canonical_warp_group_idx();
  int const lane = threadIdx.x % 32;

  if (warp_idx == 0 && lane == 0) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    ss.barrier_kv.init(1);
  }
  typename Pipe::Params pp;
  bool const lower = pb.doc_lo != nullptr;  // documents or a window: a first key per row
  pp.transaction_bytes = C::kBytesStage + (lower ? C::kBlockM * 4 : 0);
  pp.role = wg_idx == 0 ? Pipe::ThreadCategory::Producer : Pipe::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = C::NumMmaThreads;
  Pipe pipe(ss.pipe, pp, Shape<_1, _1, _1>{});
  cutlass::arch::fence_barrier_init();
  __syncthreads();

  int g, n_block;
  cta_coords(pb, blockIdx.x, g, n_block);
  int const group = pb.Hq / pb.Hkv;
  // Query tiles at or after the diagonal: m·Bm ≥ n·128 (Bm divides 128).
  int const m_min = n_block * kBlockN / Bm;
  int const m_max = m_end<Bm>(pb, n_block);
  // Tiles with m·Bm < (n+1)·128 hold some key > query: those need the causal mask.
  int const m_mask_end = (n_block + 1) * kBlockN / Bm;

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename C::SmemQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dO.data()), typename C::SmemQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename C::SmemK{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename C::SmemK{});

  if (wg_idx == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegs>();
    int const warp_in_wg = warp_idx % 4;
    if (warp_in_wg == 0) {
      // ---------------------------------------------------------------- producer
      if (lane == 0) {
        int const d = C::D;  // by value: make_shape takes references
        Tensor mQ = p.tma_q.get_tma_tensor(make_shape(pb.S, d, pb.Hq));
        Tensor mdO = p.tma_do.get_tma_tensor(make_shape(pb.S, d, pb.Hq));
        Tensor mK = p.tma_k.get_tma_tensor(make_shape(pb.S, d, pb.Hkv));
        Tensor mV = p.tma_v.get_tma_tensor(make_shape(pb.S, d, pb.Hkv));
        auto cta_q = p.tma_q.get_slice(_0{});
        auto cta_do = p.tma_do.get_slice(_0{});
        auto cta_k = p.tma_k.get_slice(_0{});
        auto cta_v = p.tma_v.get_slice(_0{});

        Tensor gK =
            local_tile(mK(_, _, g), Shape<Int<kBlockN>, Int<C::D>>{}, make_coord(n_block, 0));
        Tensor gV =
            local_tile(mV(_, _, g), Shape<Int<kBlockN>, Int<C::D>>{}, make_coord(n_block, 0));
        ss.barrier_kv.arrive_and_expect_tx(2 * C::kBytesKV);
        copy(p.tma_k.with(reinterpret_cast<uint64_t&>(ss.barrier_kv), 0,
                          TMA::CacheHintSm90::EVICT_FIRST),
             cta_k.partition_S(gK), cta_k.partition_D(sK));
        copy(p.tma_v.with(reinterpret_cast<uint64_t&>(ss.barrier_kv), 0,
                          TMA::CacheHintSm90::EVICT_FIRST),
             cta_v.partition_S(gV), cta_v.partition_D(sV));

        Tensor tQsQ = group_modes<0, 3>(cta_q.partition_D(sQ));      // (TMA, stages)
        Tensor tdOsdO = group_modes<0, 3>(cta_do.partition_D(sdO));  // (TMA, stages)
        auto wr = cutlass::make_producer_start_state<Pipe>();
        for (int it = 0; it < m_max - m_min; ++it) {
          int const m = m_at(it, m_min, m_max);
          for (int hh = 0; hh < group; ++hh) {
            int const h = g * group + hh;
            Tensor gQ = local_tile(mQ(_, _, h), Shape<Int<Bm>, Int<C::D>>{}, make_coord(m, 0));
            Tensor gdO = local_tile(mdO(_, _, h), Shape<Int<Bm>, Int<C::D>>{}, make_coord(m, 0));
            pipe.producer_acquire(wr);
            uint64_t* bar = pipe.producer_get_barrier(wr);
            int const s = wr.index();
            // Q and dO are read again by the other KV tiles of this head: EVICT_LAST.
            copy(p.tma_q.with(*bar, 0, TMA::CacheHintSm90::EVICT_LAST),
                 group_modes<0, 3>(cta_q.partition_S(gQ)), tQsQ(_, s));
            copy(p.tma_do.with(*bar, 0, TMA::CacheHintSm90::EVICT_LAST),
                 group_modes<0, 3>(cta_do.partition_S(gdO)), tdOsdO(_, s));
            int64_t const off = int64_t(h) * pb.S_pad + int64_t(m) * Bm;
            SM90_BULK_COPY_G2S::copy(pb.lse2 + off, bar, &ss.lse[s][0], Bm * 4);
            SM90_BULK_COPY_G2S::copy(pb.dsum + off, bar, &ss.dsum[s][0], Bm * 4);
            if (lower) {
              SM90_BULK_COPY_G2S::copy(pb.doc_lo + int64_t(m) * Bm, bar, &ss.doc_lo[s][0], Bm * 4);
            }
            ++wr;
          }
        }
        pipe.producer_tail(wr);
      }
    } else if (warp_in_wg == 1) {
      // ---------------------------------------------------------------- dQ writer
      for (int it = 0; it < m_max - m_min; ++it) {
        int const m = m_at(it, m_min, m_max);
        for (int hh = 0; hh < group; ++hh) {
          int const h = g * group + hh;
          float* gblk = pb.dq_acc + (int64_t(h) * pb.S_pad + int64_t(m) * Bm) * C::D;
          CUTE_UNROLL
          for (int w = 0; w < C::NWG; ++w) {
            cutlass::arch::NamedBarrier::sync(128 + 32, kBarDqFull0 + w);
            if (lane == 0) {
              bulk_reduce_add_f32(gblk + w * C::kDqHalf, ss.dq.data() + w * C::kDqHalf,
                                  C::kDqHalf * 4);
              tma_store_arrive();
            }
          }
          // Warpgroup w's staging may be overwritten once its reduce has read it.
          if (lane == 0) tma_store_wait<1>();
          __syncwarp();
          cutlass::arch::NamedBarrier::arrive(128 + 32, kBarDqEmpty0 + 0);
          if (lane == 0) tma_store_wait<0>();
          __syncwarp();
          cutlass::arch::NamedBarrier::arrive(128 + 32, kBarDqEmpty0 + 1);
        }
      }
      if (lane == 0) bulk_wait_all();
    }
  } else {
    // ---------------------------------------------------------------- consumers
    cutlass::arch::warpgroup_reg_alloc<240>();
    int const mma_tid = threadIdx.x - 128;
    int const cwg = wg_idx - 1;

    Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename C::SmemQt{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.dO.data()), typename C::SmemQt{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename C::SmemKt{});
    Tensor sdS = make_tensor(make_smem_ptr(ss.ds.data()), typename C::SmemdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(ss.ds.data()), typename C::SmemdSt{});

    typename C::MmaSdP mma_sdp;
    typename C::MmadKV mma_dkv;
    typename C::MmadQ mma_dq;
    auto thr_sdp = mma_sdp.get_thread_slice(mma_tid);
    auto thr_dkv = mma_dkv.get_thread_slice(mma_tid);
    auto thr_dq = mma_dq.get_thread_slice(mma_tid);

    Tensor tSrK = thr_sdp.partition_fragment_A(sK);      // (MMA, M, K)
    Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);      // (MMA, N, K, stages)
    Tensor tdPrV = thr_sdp.partition_fragment_A(sV);     // (MMA, M, K)
    Tensor tdPrdO = thr_sdp.partition_fragment_B(sdO);   // (MMA, N, K, stages)
    Tensor tdVrdO = thr_dkv.partition_fragment_B(sdOt);  // (MMA, N=D, K=q, stages)
    Tensor tdKrQ = thr_dkv.partition_fragment_B(sQt);    // (MMA, N=D, K=q, stages)
    Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);    // (MMA, M=q, K=keys, stages)
    Tensor tdQrK = thr_dq.partition_fragment_B(sKt);     // (MMA, N=D, K=keys)

    auto stsm = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, bf16>{}, mma_sdp);
    auto thr_stsm = stsm.get_thread_slice(mma_tid);
    Tensor tdSsdS = thr_stsm.partition_D(as_position_independent_swizzle_tensor(sdSt));

    // (key, query) coordinates of each Sᵀ accumulator element inside the 128 × Bm tile.
    Tensor cS = make_identity_tensor(Shape<Int<kBlockN>, Int<Bm>>{});
    Tensor tScS = thr_sdp.partition_C(cS);
    Tensor cS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));

    Tensor tdVrdV = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<C::D>>{});
    Tensor tdKrdK = partition_fragment_C(mma_dkv, Shape<Int<kBlockN>, Int<C::D>>{});
    clear(tdVrdV);
    clear(tdKrdK);

    // The dQ writer's first "staging empty" arrival, made on its behalf (32 threads).
    if (mma_tid % 128 < 32) cutlass::arch::NamedBarrier::arrive(128 + 32, kBarDqEmpty0 + cwg);

    float const sl2 = pb.scale_log2;
    int const kv0 = n_block * kBlockN;
    ss.barrier_kv.wait(0);

    typename Pipe::PipelineState rd;
    for (int it = 0; it < m_max - m_min; ++it) {
      int const m = m_at(it, m_min, m_max);
      bool const diagonal = m < m_mask_end;
      int const q0 = m * Bm;
      for (int hh = 0; hh < group; ++hh) {
        [[maybe_unused]] int const h = g * group + hh;
        Tensor tSrS = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<Bm>>{});
        Tensor tdPrdP = partition_fragment_C(mma_sdp, Shape<Int<kBlockN>, Int<Bm>>{});
        Tensor S_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
        Tensor dP_rc = make_tensor(tdPrdP.data(), acc_rowcol(tdPrdP.layout()));

        pipe.consumer_wait(rd);
        int const s = rd.index();
        wg_gemm<true, -1>(mma_sdp, tSrK, tSrQ(_, _, _, s), tSrS);       // Sᵀ = K Qᵀ
        wg_gemm<true, -1>(mma_sdp, tdPrV, tdPrdO(_, _, _, s), tdPrdP);  // dPᵀ = V dOᵀ
        warpgroup_wait<1>();

        // Pᵀ = exp2(Sᵀ·scale·log2e − LSE·log2e); masked entries (key > query, or key before the
        // query's document) → 0.
        float const* lse_s = ss.lse[s];
        float const* dsum_s = ss.dsum[s];
        int const* doc_s = ss.doc_lo[s];
        // Three copies of the loop so that the tiles off the diagonal carry no mask compares, and
        // only those that a document start cuts carry the document compares. doc_lo rises with
        // the query: the tile's last query has the latest document start.
        auto compute_P = [&](auto causal, auto document) {
          CUTE_UNROLL
          for (int j = 0; j < size<1>(S_rc); ++j) {
            int const qc = get<1>(cS_rc(0, j));
            float const l = lse_s[qc];
            [[maybe_unused]] int const lo = decltype(document)::value ? doc_s[qc] : 0;
            CUTE_UNROLL
            for (int i = 0; i < size<0>(S_rc); ++i) {
              float x = S_rc(i, j);
              [[maybe_unused]] int const key = kv0 + get<0>(cS_rc(i, j));
              if constexpr (decltype(causal)::value) {
                if (key > q0 + qc) x = -INFINITY;
              }
              if constexpr (decltype(document)::value) {
                if (key < lo) x = -INFINITY;
              }
              S_rc(i, j) = exp2_ftz(fmaf(x, sl2, -l));
            }
          }
        };
        if (lower && doc_s[Bm - 1] > kv0) {
          compute_P(cute::true_type{}, cute::true_type{});
        } else if (diagonal) {
          compute_P(cute::true_type{}, cute::false_type{});
        } else {
          compute_P(cute::false_type{}, cute::false_type{});
        }
        Tensor rP = make_tensor_like<bf16>(tSrS);
        convert_bf16(tSrS, rP);
        Tensor tdVrP = make_tensor(rP.data(), acc_as_A(rP.layout()));
        warpgroup_wait<0>();
        warpgroup_fence_operand(tdPrdP);
        // dSᵀ = Pᵀ ∘ (dPᵀ − Dsum), in the dP registers.
        CUTE_UNROLL
        for (int j = 0; j < size<1>(dP_rc); ++j) {
          float const ds = dsum_s[get<1>(cS_rc(0, j))];
          CUTE_UNROLL
          for (int i = 0; i < size<0>(dP_rc); ++i) dP_rc(i, j) = S_rc(i, j) * (dP_rc(i, j) - ds);
        }

        Tensor rdS = make_tensor_like<bf16>(tdPrdP);
        convert_bf16(tdPrdP, rdS);

        // dSᵀ → shared memory (as dS, K-major) for dQ = dS K. Stage s's buffer was last read by
        // the dQ gemms of two steps ago, which both warpgroups finished before the PdS barrier
        // of the previous step.
        copy(stsm, thr_stsm.retile_S(rdS), tdSsdS(_, _, _, s));

        wg_gemm<false, -1>(mma_dkv, tdVrP, tdVrdO(_, _, _, s), tdVrdV);  // dV += Pᵀ dO

        cutlass::arch::fence_view_async_shared();
        cutlass::arch::NamedBarrier::sync(C::NumMmaThreads, kBarPdS);

        Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<Bm>, Int<C::D>>{});
        wg_gemm<true, 1>(mma_dq, tdQrdS(_, _, _, s), tdQrK, tdQrdQ);  // dQ = dS K; dV done
        Tensor tdKrdS = make_tensor(rdS.data(), acc_as_A(rdS.layout()));
        wg_gemm<false, 1>(mma_dkv, tdKrdS, tdKrQ(_, _, _, s), tdKrdK);  // dK += dSᵀ Q; dQ done

        static_assert(decltype(size(tdQrdQ))::value == C::kDqPerThread);
        {
          cutlass::arch::NamedBarrier::sync(128 + 32, kBarDqEmpty0 + cwg);
          float4* dst =
              reinterpret_cast<float4*>(ss.dq.data() + cwg * C::kDqHalf + (mma_tid % 128) * 4);
          CUTE_UNROLL
          for (int i = 0; i < C::kDqPerThread; i += 4) {
            dst[(i / 4) * 128] =
                make_float4(tdQrdQ(i), tdQrdQ(i + 1), tdQrdQ(i + 2), tdQrdQ(i + 3));
          }
          cutlass::arch::fence_view_async_shared();
          cutlass::arch::NamedBarrier::arrive(128 + 32, kBarDqFull0 + cwg);
        }
        warpgroup_wait<0>();  // dK done: Q, dO, LSE, Dsum of stage s are free
        pipe.consumer_release(rd);
        ++rd;
      }
    }

    // Epilogue: dK (times the softmax scale) and dV straight from registers, bf16 pairs.
    Tensor cKV = make_identity_tensor(Shape<Int<kBlockN>, Int<C::D>>{});
    Tensor tcKV = thr_dkv.partition_C(cKV);
    Tensor c_rc = make_tensor(tcKV.data(), acc_rowcol(tcKV.layout()));
    Tensor dK_rc = make_tensor(tdKrdK.data(), acc_rowcol(tdKrdK.layout()));
    Tensor dV_rc = make_tensor(tdVrdV.data(), acc_rowcol(tdVrdV.layout()));
    int64_t const ld = int64_t(pb.Hkv) * C::D;
    float const scale = pb.scale;
    CUTE_UNROLL
    for (int i = 0; i < size<0>(dK_rc); ++i) {
      int const row = kv0 + get<0>(c_rc(i, 0));
      if (row < pb.S) {
        bf16* krow = pb.dk + row * ld + g * C::D;
        bf16* vrow = pb.dv + row * ld + g * C::D;
        CUTE_UNROLL
        for (int j = 0; j < size<1>(dK_rc); j += 2) {
          int const col = get<1>(c_rc(i, j));
          *reinterpret_cast<__nv_bfloat162*>(krow + col) =
              __floats2bfloat162_rn(dK_rc(i, j) * scale, dK_rc(i, j + 1) * scale);
          *reinterpret_cast<__nv_bfloat162*>(vrow + col) =
              __floats2bfloat162_rn(dV_rc(i, j), dV_rc(i, j + 1));
        }
      }
    }
  }
}

template <class C>
cudaError_t launch(void const* q, void const* k, void const* v, void const* o, void const* dout,
                   float const* lse, void* dq, void* dk, void* dv, float* ws, int S, int Hq,
                   int Hkv, int64_t const* doc_starts, int ndocs, int window, cudaStream_t stream) {
  int const S_pad = (S + kPadS - 1) / kPadS * kPadS;
  float* dq_acc = ws;
  float* lse2 = dq_acc + int64_t(Hq) * S_pad * C::D;
  float* dsum = lse2 + int64_t(Hq) * S_pad;
  int* doc_lo = reinterpret_cast<int*>(dsum + int64_t(Hq) * S_pad);
  int* doc_hi = doc_lo + S_pad;
  bool const docs = doc_starts != nullptr && ndocs > 1;
  bool const lower = docs || window > 0;  // a lower bound per row besides the causal one

  cudaError_t e = cudaMemsetAsync(dq_acc, 0, sizeof(float) * int64_t(Hq) * S_pad * C::D, stream);
  if (e != cudaSuccess) return e;
  {
    int64_t const warps = int64_t(S_pad) * Hq;
    int const blocks = int((warps * 32 + 255) / 256);
    bwd_preprocess<<<blocks, 256, 0, stream>>>(
        static_cast<bf16 const*>(o), static_cast<bf16 const*>(dout), lse, lse2, dsum, S, S_pad, Hq,
        C::D, docs ? doc_starts : nullptr, ndocs, window, doc_lo, doc_hi);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }

  Params<C> p;
  auto mk = [&](void const* ptr, int H) {
    return make_tensor(make_gmem_ptr(static_cast<bf16 const*>(ptr)), make_shape(S, C::D, H),
                       make_stride(int64_t(H) * C::D, _1{}, int64_t(C::D)));
  };
  p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mk(q, Hq), take<0, 2>(typename C::SmemQ{}),
                          Shape<Int<C::kBlockM>, Int<C::D>>{}, _1{});
  p.tma_do = make_tma_copy(SM90_TMA_LOAD{}, mk(dout, Hq), take<0, 2>(typename C::SmemQ{}),
                           Shape<Int<C::kBlockM>, Int<C::D>>{}, _1{});
  p.tma_k = make_tma_copy(SM90_TMA_LOAD{}, mk(k, Hkv), typename C::SmemK{},
                          Shape<Int<kBlockN>, Int<C::D>>{}, _1{});
  p.tma_v = make_tma_copy(SM90_TMA_LOAD{}, mk(v, Hkv), typename C::SmemK{},
                          Shape<Int<kBlockN>, Int<C::D>>{}, _1{});
  Problem& pb = p.pb;
  pb.S = S;
  pb.S_pad = S_pad;
  pb.Hq = Hq;
  pb.Hkv = Hkv;
  pb.num_n = (S + kBlockN - 1) / kBlockN;
  pb.num_m = (S + C::kBlockM - 1) / C::kBlockM;
  pb.scale = 1.f / sqrtf(float(C::D));
  pb.scale_log2 = pb.scale * 1.4426950408889634f;
  pb.lse2 = lse2;
  pb.dsum = dsum;
  pb.dq_acc = dq_acc;
  pb.doc_lo = lower ? doc_lo : nullptr;
  pb.doc_hi = docs ? doc_hi : nullptr;
  pb.window = window;
  pb.dk = static_cast<bf16*>(dk);
  pb.dv = static_cast<bf16*>(dv);

  int const smem = int(sizeof(typename C::SharedStorage));
  auto kern = attn_bwd_kernel<C>;
  e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  kern<<<pb.num_n * Hkv, C::NumThreads, smem, stream>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;

  bwd_postprocess<C><<<dim3(pb.num_m, Hq), C::NumMmaThreads, 0, stream>>>(
      dq_acc, static_cast<bf16*>(dq), S, S_pad, Hq, pb.scale);
  return cudaGetLastError();
}

// head_dim 128: 64 queries × 128 keys per step; head_dim 64: 128 × 128 (FA3's H100 choices).
using CfgD128 = Cfg<128, 64, 2>;
using CfgD64 = Cfg<64, 128, 2>;

}  // namespace
}  // namespace ithaca_bwd

namespace ithaca {
namespace cuda {

int64_t HopperAttentionBackwardWorkspace(int64_t s, int64_t hq, int64_t hkv, int64_t d) {
  (void)hkv;
  const int64_t s_pad = (s + ithaca_bwd::kPadS - 1) / ithaca_bwd::kPadS * ithaca_bwd::kPadS;
  return int64_t{4} * hq * s_pad * (d + 2) + int64_t{8} * s_pad;
}

cudaError_t HopperAttentionBackward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                    const uint16_t* o, const uint16_t* dout, const float* lse,
                                    int64_t s, int64_t hq, int64_t hkv, int64_t d, uint16_t* dq,
                                    uint16_t* dk, uint16_t* dv, void* workspace,
                                    int64_t workspace_bytes, cudaStream_t stream,
                                    const int64_t* doc_starts, int64_t ndocs, int64_t window) {
  if (HopperAttentionUnsupported(s, hq, hkv, d, q, k, v, o, lse) != nullptr ||
      HopperAttentionUnsupported(s, hq, hkv, d, dout, dk, dv, dq, static_cast<float*>(workspace)) !=
          nullptr ||
      workspace_bytes < HopperAttentionBackwardWorkspace(s, hq, hkv, d) ||
      (ndocs > 1 && doc_starts == nullptr) || ndocs > s || window < 0) {
    return cudaErrorInvalidValue;
  }
  auto* ws = static_cast<float*>(workspace);
  const int S = static_cast<int>(s), Hq = static_cast<int>(hq), Hkv = static_cast<int>(hkv);
  // A window of S keys or more is the causal mask alone.
  const int n = static_cast<int>(ndocs), w = window >= s ? 0 : static_cast<int>(window);
  return d == 128 ? ithaca_bwd::launch<ithaca_bwd::CfgD128>(q, k, v, o, dout, lse, dq, dk, dv, ws,
                                                            S, Hq, Hkv, doc_starts, n, w, stream)
                  : ithaca_bwd::launch<ithaca_bwd::CfgD64>(q, k, v, o, dout, lse, dq, dk, dv, ws, S,
                                                           Hq, Hkv, doc_starts, n, w, stream);
}

}  // namespace cuda
}  // namespace ithaca
