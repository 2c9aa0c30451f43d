// The own Hopper (sm_90a) causal GQA attention forward (hopper_attention.h), on CuTe: wgmma
// tensor-core GEMMs fed by TMA, built only with -gencode=arch=compute_90a,code=sm_90a.
//
// The design follows FlashAttention-3 (Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao, 2024:
// warp specialisation with a TMA producer, intra-warpgroup overlap of softmax and GEMMs,
// ping-pong scheduling between consumer warpgroups); the tile order is the engine's own.
//
//   * Persistent: one CTA per SM; static schedule (cluster c takes units c, c + #clusters, ...;
//     producer and consumers compute the same sequence, no atomics). Units are ordered
//     KV-head-major, so that the CTAs running at one time share one KV head's K/V. Heads
//     innermost ("m-major") spread the concurrent CTAs over all KV heads and streamed K/V from
//     DRAM: the clock dropped from 1.72 to 1.45 GHz (power) and the kernel lost 8 % at hd128 64K
//     (lab/hopper_attention/README.md). Inside a KV head, one of two orders (unit_coords):
//     pairs of row blocks that keep every cluster at one of two key positions (head_dim 128 in
//     clusters: one KV head's K/V need not fit L2; DRAM reads at 512K ÷ 3.4), or one row block
//     a unit, longest first (short S, head_dim 64).
//   * Clusters with K/V multicast (cluster size per shape, ClusterSizeFor): a cluster of 2 or 4
//     CTAs takes one row block of 2 or 4 query heads of the same KV head, so all its CTAs read
//     the same K/V blocks over the same causal extent. Each CTA loads 1/cluster of every K/V
//     block and multicasts it into all the cluster's shared memories; a consumer warpgroup
//     releases a stage at every CTA's empty barrier, so the cluster walks the keys in
//     lock-step. Fewer, larger streams of K/V: at S where one KV head's K/V exceeds L2, DRAM
//     reads halve (cluster 2) or quarter (4). Q stays per CTA. The static schedule hands out
//     work units (KV head, row block, head group) per cluster, in the same order.
//   * Warp-specialised: warp 0 of warpgroup 0 is the producer (one elected thread issues TMA
//     loads of Q once per tile, K and V per 128-key block into mbarrier rings, V one step
//     behind K); warpgroups 1..NWG are consumers, each owning 64 query rows. The producer waits
//     on a named barrier ("Q empty") before overwriting Q, so the next tile's Q and first K
//     load while the consumers finish the previous tile.
//   * Consumers: S = Q K^T with wgmma (both operands in 128B-swizzled smem), causal mask only
//     on the blocks that touch the diagonal, online softmax in registers (exp2 with the scale
//     folded into one FFMA, ftz ex2.approx), P converted to bf16 in registers and used as the
//     A operand of O += P V (wgmma RS; V read MN-major from smem, no transpose).
//   * Intra-warpgroup overlap: the QK^T of block n is issued together with the PV of block
//     n+1, and the softmax of block n runs while the PV gemm is in flight.
//   * Inter-warpgroup ping-pong: named barriers order the gemm issue of the consumer
//     warpgroups, so one warpgroup's softmax overlaps the others' gemms.
//   * Epilogue: O scaled by 1/rowsum and stored straight from registers (bf16 pairs); LSE by
//     one thread per row.
//   * Masks besides the causal one (optional): the documents of packed samples and a sliding
//     window (Mistral's: a query sees its last W keys, itself included). Row r sees the keys
//     [lo(r), r], lo(r) = max(start of r's document, r - W + 1), which never falls as r rises.
//     A row block reads the key blocks from the one holding lo(its first row) up to its
//     diagonal (the blocks before are skipped, never loaded); the blocks before lo(its last
//     row) take the mask key < lo(row) besides the causal one. Each thread finds its rows' lo
//     once per tile (a binary search in the document starts).
//
// Tiles: hd128 128x128 (2 consumer warpgroups, 240 registers each, 2 K/V stages); hd64 192x128
// (3 consumer warpgroups, 160 registers, 3 stages). S need not be a multiple of the tile (TMA
// zero-fills the ragged last tiles, stores are guarded).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

// clang-format off: cute/tensor.hpp must come before the atoms.
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>
// clang-format on

#include "engine/backend/cuda/hopper_attention.h"
#include "engine/backend/cuda/hopper_cute.cuh"

namespace ithaca {
namespace cuda {
namespace {

using namespace cute;
using bf16 = cutlass::bfloat16_t;

template <int D_, int NWG_, int kBlockN_, int kStages_, int kCluster_, bool kPairs_>
struct Cfg {
  static constexpr int D = D_;
  // The work order (unit_coords): pairs of row blocks whose clusters stay in phase, or one row
  // block a unit, longest first.
  static constexpr bool kPairs = kPairs_;
  // CTAs per cluster: they hold query heads of one KV head and one row block, so their K/V
  // blocks are the same; each CTA loads 1/kCluster of every K/V block and multicasts it.
  static constexpr int kCluster = kCluster_;
  static constexpr int NWG = NWG_;  // consumer warpgroups
  static constexpr int kBlockM = 64 * NWG;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int NumMmaThreads = 128 * NWG;
  static constexpr int NumThreads = NumMmaThreads + 128;

  using TileQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<D>>;
  using TilePV = Shape<Int<kBlockM>, Int<D>, Int<kBlockN>>;
  using MmaQK = decltype(make_tiled_mma(GMMA::ss_op_selector<bf16, bf16, float, TileQK>(),
                                        Layout<Shape<Int<NWG>, _1, _1>>{}));
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<bf16, bf16, float, TilePV, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<Int<NWG>, _1, _1>>{}));

  using SmemQ =
      decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{}, Shape<Int<kBlockM>, Int<D>>{}));
  using SmemK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bf16>{},
                                       Shape<Int<kBlockN>, Int<D>, Int<kStages>>{}));
  // V^T: (D, kBlockN, stages), D contiguous (MN-major for the PV gemm's B operand).
  using SmemVt =
      decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<bf16>{},
                             Shape<Int<D>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{}));

  // Global tensor types used to build the TMA descriptors.
  using GShape = Shape<int32_t, int32_t, int32_t>;
  using GStrideQK = Stride<int64_t, _1, int64_t>;  // (S, D, H): (H*D, 1, D)
  using GStrideVt = Stride<_1, int64_t, int64_t>;  // (D, S, H): (1, H*D, D)

  using TmaQ = decltype(make_tma_copy(
      SM90_TMA_LOAD{},
      make_tensor(make_gmem_ptr(static_cast<bf16 const*>(nullptr)), GShape{}, GStrideQK{}), SmemQ{},
      Shape<Int<kBlockM>, Int<D>>{}, _1{}));
  using TmaLoadKV = cute::conditional_t<kCluster == 1, SM90_TMA_LOAD, SM90_TMA_LOAD_MULTICAST>;
  using TmaK = decltype(make_tma_copy(
      TmaLoadKV{},
      make_tensor(make_gmem_ptr(static_cast<bf16 const*>(nullptr)), GShape{}, GStrideQK{}),
      take<0, 2>(SmemK{}), Shape<Int<kBlockN>, Int<D>>{}, Int<kCluster>{}));
  using TmaV = decltype(make_tma_copy(
      TmaLoadKV{},
      make_tensor(make_gmem_ptr(static_cast<bf16 const*>(nullptr)), GShape{}, GStrideVt{}),
      take<0, 2>(SmemVt{}), Shape<Int<D>, Int<kBlockN>>{}, Int<kCluster>{}));
  using ClusterShape = Shape<Int<kCluster>, _1, _1>;

  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;

  struct SharedStorage {
    alignas(1024) cute::array_aligned<bf16, cosize_v<SmemQ>, 1024> q;
    alignas(1024) cute::array_aligned<bf16, cosize_v<SmemK>, 1024> k;
    alignas(1024) cute::array_aligned<bf16, cosize_v<SmemVt>, 1024> v;
    typename PipelineKV::SharedStorage pipe_k;
    typename PipelineKV::SharedStorage pipe_v;
    alignas(16) cutlass::arch::ClusterTransactionBarrier barrier_q;
  };

  static constexpr uint32_t kBytesQ = kBlockM * D * 2;
  static constexpr uint32_t kBytesKV = kBlockN * D * 2;
};

struct Problem {
  int S, Hq, Hkv, D;
  int num_m_blocks, num_tiles;
  int num_units;     // pairs of row blocks x Hq / cluster size: what one cluster takes at once
  float scale_log2;  // softmax_scale * log2(e)
  float softmax_scale;
  bf16* O;
  float* LSE;
  int64_t const* doc_starts;  // packed samples' document starts (device, ascending); or nullptr
  int ndocs;
  int window;  // a sliding window of this many keys; 0: none
};

// The first key row sees: its document's start (0 without documents), or with a window the
// first key of the window if later. Non-decreasing in row. Rows past S take the last row's.
__device__ __forceinline__ int key_lo(Problem const& pb, int row) {
  row = min(row, pb.S - 1);
  int lo = 0;
  if (pb.doc_starts != nullptr) {
    int a = 0, b = pb.ndocs;
    while (b - a > 1) {
      int const mid = (a + b) / 2;
      if (pb.doc_starts[mid] <= row)
        a = mid;
      else
        b = mid;
    }
    lo = int(pb.doc_starts[a]);
  }
  if (pb.window > 0) lo = max(lo, row - pb.window + 1);
  return lo;
}

template <class C>
struct Params {
  typename C::TmaQ tma_q;
  typename C::TmaK tma_k;
  typename C::TmaV tma_v;
  Problem pb;
};

// Named barrier ids (offset by CUTLASS's reserved count inside NamedBarrier).
enum : uint32_t { kBarQueryEmpty = 0, kBarSched0 = 1 };

// K/V blocks are read again by the other CTAs of the same KV head: loaded EVICT_LAST (Q is read
// once: EVICT_FIRST). EVICT_NORMAL measured the same at hd64 512K.

using hopper::acc_as_A;  // hopper_cute.cuh: helpers shared with the backward
using hopper::acc_rowcol;
using hopper::exp2_ftz;
using hopper::wg_gemm;

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// The work a cluster of K CTAs takes at a time, a unit: row blocks of K consecutive query heads
// of one KV head, in one of two orders (Cfg::kPairs). Units of KV head g come before those of
// g+1, so the clusters running at one time share one KV head's K/V.
//
// Pairs (kPairs): a unit is the pair of row blocks (p, M-1-p), taken one after the other, the
// first walked up (keys from its first block to its diagonal), the second down. The pair's two
// lengths add up to the same number of key blocks whatever p is, so every unit takes the same
// time, and at any moment every cluster reads one of only two key positions: t blocks into its
// unit it is at key block t (first half) or M - t (second half). The clusters stay in phase and
// read the same K/V blocks at the same time, so one KV head's K/V need not fit L2 (it does not
// beyond 64K tokens at head_dim 128): hd128 512K on an H100 read 0.96 TB from DRAM instead of
// 3.3 (lab/hopper_attention/README.md, v7). With an odd number of row blocks the middle one is a
// unit alone.
//
// Longest first (!kPairs): a unit is one row block, walked down from its diagonal, the longest
// first. The clusters drift apart over the key range; that costs little while a KV head's K/V
// fit L2 and balances the last tiles better at short S (16K) than equal pairs do.
template <class C>
__device__ __forceinline__ int units_per_head_group(Problem const& pb) {
  return C::kPairs ? (pb.num_m_blocks + 1) / 2 : pb.num_m_blocks;
}
template <class C>
__device__ __forceinline__ int tiles_in_unit(Problem const& pb, int u, int subs) {
  if constexpr (!C::kPairs) {
    return 1;
  } else {
    int const p = (u % (units_per_head_group<C>(pb) * subs)) / subs;
    return pb.num_m_blocks - 1 - p == p ? 1 : 2;
  }
}
// Tile t (0 or 1) of unit u -> the CTA's row block, query head and walking direction (up: from
// its first key block to its diagonal).
template <class C>
__device__ __forceinline__ void unit_coords(Problem const& pb, int u, int t, int rank, int& m_block,
                                            int& head, bool& up) {
  constexpr int K = C::kCluster;
  int const g = pb.Hq / pb.Hkv;
  int const subs = g / K;  // units per (KV head, unit of row blocks)
  int const per_kv = units_per_head_group<C>(pb) * subs;
  int const kv = u / per_kv, r = u % per_kv;
  int const p = r / subs;
  if constexpr (C::kPairs) {
    m_block = t == 0 ? p : pb.num_m_blocks - 1 - p;
    up = t == 0;
  } else {
    m_block = pb.num_m_blocks - 1 - p;
    up = false;
  }
  head = kv * g + (r % subs) * K + rank;
}

template <class C>
__device__ __forceinline__ int n_blocks_for(Problem const& pb, int m_block) {
  int end = min((m_block + 1) * C::kBlockM, pb.S);
  return (end + C::kBlockN - 1) / C::kBlockN;
}

// The first key block a row block reads: the one holding the first key of its first row (0 with
// the causal mask alone). No row of the block sees a key before it. Producer and consumers agree.
template <class C>
__device__ __forceinline__ int n_first_for(Problem const& pb, int m_block) {
  return key_lo(pb, m_block * C::kBlockM) / C::kBlockN;
}

template <class C>
__global__ void __launch_bounds__(C::NumThreads, 1)
    attn_fwd_kernel(__grid_constant__ Params<C> const p) {
  using SS = typename C::SharedStorage;
  extern __shared__ __align__(1024) char smem_raw[];
  SS& ss = *reinterpret_cast<SS*>(smem_raw);
  Problem const& pb = p.pb;

  int const warp_idx = cutlass::canonical_warp_idx_sync();
  int const wg_idx = cutlass::canonical_warp_group_idx();
  int const lane = threadIdx.x % 32;

  if (warp_idx == 0 && lane == 0) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    ss.barrier_q.init(1);
  }

  using PipeKV = typename C::PipelineKV;
  typename PipeKV::Params pp;
  pp.transaction_bytes = C::kBytesKV;
  pp.role = wg_idx == 0 ? PipeKV::ThreadCategory::Producer : PipeKV::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;
  pp.num_consumers = C::NumMmaThreads;
  // In a cluster, every consumer warpgroup releases a stage at the empty barriers of all CTAs
  // (each multicasts into it); the full barrier still expects the whole block's bytes.
  PipeKV pipe_k(ss.pipe_k, pp, typename C::ClusterShape{});
  PipeKV pipe_v(ss.pipe_v, pp, typename C::ClusterShape{});
  cutlass::arch::fence_barrier_init();
  // The other CTAs' barriers must be initialised before the first multicast or remote arrive.
  if constexpr (C::kCluster > 1) {
    cute::cluster_sync();
  } else {
    __syncthreads();
  }
  constexpr int K = C::kCluster;
  int const rank = K == 1 ? 0 : int(cute::block_rank_in_cluster());
  int const unit0 = blockIdx.x / K, unit_step = gridDim.x / K;

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename C::SmemQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename C::SmemK{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename C::SmemVt{});

  int const group = pb.Hq / pb.Hkv;

  if (wg_idx == 0) {
    // ---------------------------------------------------------------- producer
    cutlass::arch::warpgroup_reg_dealloc<C::NWG == 2 ? 24 : 32>();
    if (warp_idx != 0) return;
    Tensor mQ = p.tma_q.get_tma_tensor(make_shape(pb.S, pb.D, pb.Hq));
    Tensor mK = p.tma_k.get_tma_tensor(make_shape(pb.S, pb.D, pb.Hkv));
    Tensor mVt = p.tma_v.get_tma_tensor(make_shape(pb.D, pb.S, pb.Hkv));
    auto cta_q = p.tma_q.get_slice(_0{});
    auto cta_k = p.tma_k.get_slice(rank);  // this CTA's 1/K of each K/V block
    auto cta_v = p.tma_v.get_slice(rank);
    uint16_t const mcast = uint16_t((1u << K) - 1);
    Tensor tKsK = group_modes<0, 3>(cta_k.partition_D(sK));   // (TMA, stages)
    Tensor tVsV = group_modes<0, 3>(cta_v.partition_D(sVt));  // (TMA, stages)
    Tensor tQsQ = group_modes<0, 3>(cta_q.partition_D(sQ));   // (TMA)

    auto wr = cutlass::make_producer_start_state<PipeKV>();
    bool const leader = lane == 0;
    int const subs = group / K;
    for (int u = unit0; u < pb.num_units; u += unit_step) {
      int const tiles = tiles_in_unit<C>(pb, u, subs);
      for (int t = 0; t < tiles; ++t) {
        int m_block, head;
        bool up;
        unit_coords<C>(pb, u, t, rank, m_block, head, up);
        int const hkv = head / group;
        int const n_max = n_blocks_for<C>(pb, m_block);
        int const n_min = n_first_for<C>(pb, m_block);
        int const nb = n_max - n_min;
        // The i-th key block this tile reads (the consumers walk the same sequence).
        auto block = [&](int i) { return up ? n_min + i : n_max - 1 - i; };

        Tensor gQ =
            local_tile(mQ(_, _, head), Shape<Int<C::kBlockM>, Int<C::D>>{}, make_coord(m_block, 0));
        Tensor gK = local_tile(mK(_, _, hkv), Shape<Int<C::kBlockN>, Int<C::D>>{},
                               make_coord(_, 0));  // (N, D, nb)
        Tensor gVt = local_tile(mVt(_, _, hkv), Shape<Int<C::D>, Int<C::kBlockN>>{},
                                make_coord(0, _));  // (D, N, nb)
        Tensor tQgQ = group_modes<0, 3>(cta_q.partition_S(gQ));
        Tensor tKgK = group_modes<0, 3>(cta_k.partition_S(gK));   // (TMA, nb)
        Tensor tVgV = group_modes<0, 3>(cta_v.partition_S(gVt));  // (TMA, nb)

        if (leader) {
          pipe_k.producer_acquire(wr);
          copy(
              p.tma_k.with(*pipe_k.producer_get_barrier(wr), mcast, TMA::CacheHintSm90::EVICT_LAST),
              tKgK(_, block(0)), tKsK(_, wr.index()));
        }
        __syncwarp();
        // Wait until the consumers no longer read sQ (previous tile's QK^T gemms are done).
        cutlass::arch::NamedBarrier::sync(C::NumMmaThreads + 32, kBarQueryEmpty);
        if (leader) {
          ss.barrier_q.arrive_and_expect_tx(C::kBytesQ);
          copy(p.tma_q.with(reinterpret_cast<uint64_t&>(ss.barrier_q), 0,
                            TMA::CacheHintSm90::EVICT_FIRST),
               tQgQ, tQsQ);
          for (int i = 1; i < nb; ++i) {
            auto wr_v = wr;
            ++wr;
            pipe_k.producer_acquire(wr);
            copy(p.tma_k.with(*pipe_k.producer_get_barrier(wr), mcast,
                              TMA::CacheHintSm90::EVICT_LAST),
                 tKgK(_, block(i)), tKsK(_, wr.index()));
            pipe_v.producer_acquire(wr_v);
            copy(p.tma_v.with(*pipe_v.producer_get_barrier(wr_v), mcast,
                              TMA::CacheHintSm90::EVICT_LAST),
                 tVgV(_, block(i - 1)), tVsV(_, wr_v.index()));
          }
          pipe_v.producer_acquire(wr);
          copy(
              p.tma_v.with(*pipe_v.producer_get_barrier(wr), mcast, TMA::CacheHintSm90::EVICT_LAST),
              tVgV(_, block(nb - 1)), tVsV(_, wr.index()));
        }
        ++wr;
        __syncwarp();
      }
    }
    // A CTA of a cluster must not exit while the others' consumers may still arrive at its
    // empty barriers: wait until every stage has been released everywhere.
    if constexpr (K > 1) {
      if (leader) {
        pipe_k.producer_tail(wr);
        pipe_v.producer_tail(wr);
      }
    }
  } else {
    // ---------------------------------------------------------------- consumers
    cutlass::arch::warpgroup_reg_alloc<C::NWG == 2 ? 240 : 160>();
    int const mma_tid = threadIdx.x - 128;
    int const cwg = wg_idx - 1;  // consumer warpgroup 0..NWG-1

    typename C::MmaQK mma_qk;
    typename C::MmaPV mma_pv;
    auto thr_qk = mma_qk.get_thread_slice(mma_tid);
    auto thr_pv = mma_pv.get_thread_slice(mma_tid);
    Tensor tSrQ = thr_qk.partition_fragment_A(sQ);
    Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, MN, MK, stages)
    Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, MN, MK, stages)

    // Coordinates (row, col) of each S accumulator element inside the tile.
    Tensor cS = make_identity_tensor(Shape<Int<C::kBlockM>, Int<C::kBlockN>>{});
    Tensor tScS = thr_qk.partition_C(cS);
    Tensor cO = make_identity_tensor(Shape<Int<C::kBlockM>, Int<C::D>>{});
    Tensor tOcO = thr_pv.partition_C(cO);

    // Tell the producer sQ is free, and hand the first scheduling token to WG 0.
    cutlass::arch::NamedBarrier::arrive(C::NumMmaThreads + 32, kBarQueryEmpty);
    if (cwg == 0) cutlass::arch::NamedBarrier::arrive(256, kBarSched0 + 0);

    auto sched_sync = [&]() { cutlass::arch::NamedBarrier::sync(256, kBarSched0 + cwg); };
    auto sched_arrive = [&]() {
      int next = cwg + 1 == C::NWG ? 0 : cwg + 1;
      cutlass::arch::NamedBarrier::arrive(256, kBarSched0 + next);
    };

    float const sl2 = pb.scale_log2;
    typename C::PipelineKV::PipelineState rd;  // consumer state starts at phase 0
    int work = 0;                              // tiles done
    int const subs = group / K;
    for (int u = unit0, t = 0; u < pb.num_units; ++work) {
      int m_block, head;
      bool up;
      unit_coords<C>(pb, u, t, rank, m_block, head, up);
      if (++t == tiles_in_unit<C>(pb, u, subs)) {
        t = 0;
        u += unit_step;
      }
      int const n_max = n_blocks_for<C>(pb, m_block);
      int const n_min = n_first_for<C>(pb, m_block);
      int const nb = n_max - n_min;
      auto block = [&](int i) { return up ? n_min + i : n_max - 1 - i; };  // as the producer's
      int const row0 = m_block * C::kBlockM;
      // Blocks n >= n_mask_min intersect the diagonal for some row of this tile; with documents
      // or a window, blocks n < n_lo_end hold a key before the last row's first key.
      int const n_mask_min = row0 / C::kBlockN;
      int const n_lo_end = (key_lo(pb, row0 + C::kBlockM - 1) + C::kBlockN - 1) / C::kBlockN;

      Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<C::kBlockM>, Int<C::kBlockN>>{});
      Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<C::kBlockM>, Int<C::D>>{});
      Tensor S_rc = make_tensor(tSrS.data(), acc_rowcol(tSrS.layout()));
      Tensor O_rc = make_tensor(tOrO.data(), acc_rowcol(tOrO.layout()));
      Tensor cS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
      Tensor tOrP = make_tensor<bf16>(acc_as_A(tSrS.layout()));
      Tensor P_acc = make_tensor(tSrS.data(), acc_as_A(tSrS.layout()));
      constexpr int kRows = decltype(size<0>(S_rc))::value;  // 2 rows per thread
      float row_max[kRows], row_sum[kRows];
      int row_lo[kRows];  // the first key each row sees
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) row_lo[i] = key_lo(pb, row0 + get<0>(cS_rc(i, 0)));

      // Causal (key > row) and lower (key before the row's first key) masks.
      auto apply_mask = [&](int n) {
        int const col0 = n * C::kBlockN;
        CUTE_UNROLL
        for (int i = 0; i < size<0>(S_rc); ++i) {
          int const row = row0 + get<0>(cS_rc(i, 0));
          CUTE_UNROLL
          for (int j = 0; j < size<1>(S_rc); ++j) {
            int const key = col0 + get<1>(cS_rc(i, j));
            if (key > row || key < row_lo[i]) S_rc(i, j) = -INFINITY;
          }
        }
      };
      // Online softmax on the current S; returns the O rescale factor per row.
      auto softmax = [&](bool first, float(&scale)[kRows]) {
        CUTE_UNROLL
        for (int i = 0; i < kRows; ++i) {
          float mx = first ? -INFINITY : row_max[i];
          CUTE_UNROLL
          for (int j = 0; j < size<1>(S_rc); ++j) mx = fmaxf(mx, S_rc(i, j));
          mx = quad_max(mx);
          float const mx_use = mx == -INFINITY ? 0.f : mx * sl2;
          scale[i] = first ? 1.f : exp2_ftz(row_max[i] * sl2 - mx_use);
          row_max[i] = mx;
          float sum = 0.f;
          CUTE_UNROLL
          for (int j = 0; j < size<1>(S_rc); ++j) {
            float const arg = fmaf(S_rc(i, j), sl2, -mx_use);
            float const e = exp2_ftz(arg);
            S_rc(i, j) = e;
            sum += e;
          }
          row_sum[i] = first ? sum : row_sum[i] * scale[i] + sum;  // per-thread partial sum
        }
      };
      // tOrP and P_acc share one layout, so physical register k maps to physical k.
      auto convert_P = [&]() {
        float const* src = P_acc.data();
        auto* dst = reinterpret_cast<__nv_bfloat162*>(tOrP.data());
        CUTE_UNROLL
        for (int k = 0; k < size(tOrP) / 2; ++k)
          dst[k] = __floats2bfloat162_rn(src[2 * k], src[2 * k + 1]);
      };
      auto rescale_O = [&](float(&scale)[kRows]) {
        CUTE_UNROLL
        for (int i = 0; i < size<0>(O_rc); ++i) {
          CUTE_UNROLL
          for (int j = 0; j < size<1>(O_rc); ++j) O_rc(i, j) *= scale[i];
        }
      };

      ss.barrier_q.wait(work % 2);

      // First block.
      float scale[kRows];
      int n = block(0);
      pipe_k.consumer_wait(rd);
      wg_gemm<true, 0>(mma_qk, tSrQ, tSrK(_, _, _, rd.index()), tSrS);
      pipe_k.consumer_release(rd);
      if (n >= n_mask_min || n < n_lo_end) apply_mask(n);
      softmax(true, scale);
      convert_P();
      clear(tOrO);

      for (int i = 1; i < nb; ++i) {
        n = block(i);
        auto rd_v = rd;
        ++rd;
        pipe_k.consumer_wait(rd);
        sched_sync();
        wg_gemm<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, rd.index()), tSrS);
        pipe_v.consumer_wait(rd_v);
        wg_gemm<false, -1>(mma_pv, tOrP, tOrV(_, _, _, rd_v.index()), tOrO);
        sched_arrive();
        warpgroup_wait<1>();
        pipe_k.consumer_release(rd);
        if (n >= n_mask_min || n < n_lo_end) apply_mask(n);
        softmax(false, scale);
        warpgroup_wait<0>();
        pipe_v.consumer_release(rd_v);
        convert_P();
        rescale_O(scale);
      }
      // All QK^T gemms of this tile are complete: sQ may be overwritten.
      cutlass::arch::NamedBarrier::arrive(C::NumMmaThreads + 32, kBarQueryEmpty);
      pipe_v.consumer_wait(rd);
      wg_gemm<false, 0>(mma_pv, tOrP, tOrV(_, _, _, rd.index()), tOrO);
      pipe_v.consumer_release(rd);
      ++rd;

      // Finalize: O /= sum, LSE = max*scale + log(sum).
      float inv[kRows];
      CUTE_UNROLL
      for (int i = 0; i < kRows; ++i) {
        float const sum = quad_sum(row_sum[i]);
        inv[i] = (sum == 0.f || sum != sum) ? 0.f : 1.f / sum;
        float const lse = sum == 0.f ? -INFINITY : row_max[i] * pb.softmax_scale + logf(sum);
        int const row = row0 + get<0>(cS_rc(i, 0));
        if ((mma_tid % 4) == 0 && row < pb.S) pb.LSE[(int64_t)head * pb.S + row] = lse;
      }
      rescale_O(inv);
      // Store O straight from registers: each thread owns pairs of adjacent columns.
      Tensor cO_rc = make_tensor(tOcO.data(), acc_rowcol(tOcO.layout()));
      int64_t const ld = (int64_t)pb.Hq * pb.D;
      CUTE_UNROLL
      for (int i = 0; i < size<0>(O_rc); ++i) {
        int const row = row0 + get<0>(cO_rc(i, 0));
        if (row < pb.S) {
          bf16* orow = pb.O + row * ld + head * pb.D;
          CUTE_UNROLL
          for (int j = 0; j < size<1>(O_rc); j += 2) {
            int const col = get<1>(cO_rc(i, j));
            __nv_bfloat162 v2 = __floats2bfloat162_rn(O_rc(i, j), O_rc(i, j + 1));
            *reinterpret_cast<__nv_bfloat162*>(orow + col) = v2;
          }
        }
      }
    }
  }
}

template <class C>
cudaError_t launch(void const* q, void const* k, void const* v, void* o, float* lse, int S, int Hq,
                   int Hkv, int64_t const* doc_starts, int ndocs, int window, cudaStream_t stream) {
  Params<C> p;
  auto mkQK = [&](void const* ptr, int H) {
    return make_tensor(make_gmem_ptr(static_cast<bf16 const*>(ptr)), make_shape(S, C::D, H),
                       make_stride(int64_t(H) * C::D, _1{}, int64_t(C::D)));
  };
  auto mVt = make_tensor(make_gmem_ptr(static_cast<bf16 const*>(v)), make_shape(C::D, S, Hkv),
                         make_stride(_1{}, int64_t(Hkv) * C::D, int64_t(C::D)));
  p.tma_q = make_tma_copy(SM90_TMA_LOAD{}, mkQK(q, Hq), typename C::SmemQ{},
                          Shape<Int<C::kBlockM>, Int<C::D>>{}, _1{});
  p.tma_k = make_tma_copy(typename C::TmaLoadKV{}, mkQK(k, Hkv), take<0, 2>(typename C::SmemK{}),
                          Shape<Int<C::kBlockN>, Int<C::D>>{}, Int<C::kCluster>{});
  p.tma_v = make_tma_copy(typename C::TmaLoadKV{}, mVt, take<0, 2>(typename C::SmemVt{}),
                          Shape<Int<C::D>, Int<C::kBlockN>>{}, Int<C::kCluster>{});
  Problem& pb = p.pb;
  pb.S = S;
  pb.Hq = Hq;
  pb.Hkv = Hkv;
  pb.D = C::D;
  pb.num_m_blocks = (S + C::kBlockM - 1) / C::kBlockM;
  pb.num_tiles = pb.num_m_blocks * Hq;
  pb.num_units = (C::kPairs ? (pb.num_m_blocks + 1) / 2 : pb.num_m_blocks) * (Hq / C::kCluster);
  pb.softmax_scale = 1.f / sqrtf(float(C::D));
  pb.scale_log2 = pb.softmax_scale * 1.4426950408889634f;
  pb.O = static_cast<bf16*>(o);
  pb.LSE = lse;
  pb.doc_starts = ndocs > 1 ? doc_starts : nullptr;
  pb.ndocs = ndocs;
  pb.window = window;

  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  int const smem = int(sizeof(typename C::SharedStorage));
  auto kern = attn_fwd_kernel<C>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  if constexpr (C::kCluster == 1) {
    int grid = min(sms, pb.num_units);
    kern<<<grid, C::NumThreads, smem, stream>>>(p);
    return cudaGetLastError();
  } else {
    // As many clusters as can be resident at once (the GPCs' SM counts are not all multiples
    // of the cluster size, so this can be fewer than #SMs / cluster size).
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = C::kCluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(sms / C::kCluster * C::kCluster, 1, 1);
    cfg.blockDim = dim3(C::NumThreads, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    e = cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg);
    if (e != cudaSuccess) return e;
    if (clusters <= 0) return cudaErrorInvalidConfiguration;
    cfg.gridDim = dim3(min(clusters, pb.num_units) * C::kCluster, 1, 1);
    return cudaLaunchKernelEx(&cfg, kern, p);
  }
}

// The work order goes with the cluster size: pairs of row blocks (kPairs, unit_coords) for
// head_dim 128 in clusters of 2 and 4, longest first otherwise. Pairs lost at head_dim 128, 16K,
// cluster 1 (620 against 662 TFLOPS on an H100: 15.5 rounds of equal units leave the last half
// idle) and at head_dim 64 (-6 %: the consumers spill at 160 registers).
template <int D, int NWG, int kBlockN, int kStages>
cudaError_t launch_cluster(int cluster, void const* q, void const* k, void const* v, void* o,
                           float* lse, int S, int Hq, int Hkv, int64_t const* docs, int ndocs,
                           int window, cudaStream_t stream) {
  switch (cluster) {
    case 1:
      return launch<Cfg<D, NWG, kBlockN, kStages, 1, HopperForwardPairsRowBlocks(D, 1)>>(
          q, k, v, o, lse, S, Hq, Hkv, docs, ndocs, window, stream);
    case 2:
      return launch<Cfg<D, NWG, kBlockN, kStages, 2, HopperForwardPairsRowBlocks(D, 2)>>(
          q, k, v, o, lse, S, Hq, Hkv, docs, ndocs, window, stream);
    case 4:
      return launch<Cfg<D, NWG, kBlockN, kStages, 4, HopperForwardPairsRowBlocks(D, 4)>>(
          q, k, v, o, lse, S, Hq, Hkv, docs, ndocs, window, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// Cluster size per shape (forward TFLOPS, causal, Hq 32, Hkv 8; lab/hopper_attention/README.md).
// Multicast cuts the K/V bytes each CTA pulls from L2 by the cluster size, and the CTAs of a
// cluster walk the keys in lock-step. Only 30 clusters of 4 fit on the 132 SMs (120 CTAs).
//   head_dim 64 (longest first; H200, s4-2), S 64K/128K/256K/512K:
//     1: 508/508/498/473  2: 513/516/511/502  4: 483/489/487/481
//   head_dim 128 (H100, s7-1; cluster 1 longest first, 2 and 4 in pairs), S 16K/128K/512K:
//     1: 662/633/580  2: -/641/628  4: -/606/601; Hq 4, Hkv 1 at 1M/2M: 2: 626/617, 4: 605/603
//     (longest first, the kernel before pairs: 662 (c1) / 622 (c2) / 579 (c4)).
// Below 64K nothing else was measured: no cluster.
int ClusterSizeFor(int64_t s, int64_t hq, int64_t hkv, int64_t d) {
  int c = 1;
  if (s >= 65536) c = 2;
  while (c > 1 && (hq / hkv) % c != 0) c /= 2;
  return c;
}

}  // namespace

int HopperAttentionClusterSize(int64_t s, int64_t hq, int64_t hkv, int64_t d) {
  return ClusterSizeFor(s, hq, hkv, d);
}

bool HopperAttentionBuilt() { return true; }

bool HopperAttentionDeviceSupported() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  // Per device: 0 not looked up yet, 1 compute capability 9.0, 2 another.
  static std::atomic<int> known[64];
  if (dev < 0 || dev >= 64) return false;
  if (known[dev].load() == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    known[dev].store(major == 9 && minor == 0 ? 1 : 2);
  }
  return known[dev].load() == 1;
}

const char* HopperAttentionUnsupported(int64_t s, int64_t hq, int64_t hkv, int64_t d, const void* q,
                                       const void* k, const void* v, const void* o,
                                       const float* lse) {
  if (d != 64 && d != 128) return "head_dim is not 64 or 128";
  if (s <= 0 || s % 8 != 0) return "S is not a positive multiple of 8";
  // The kernel counts tiles (64-row blocks at least, times Hq) in int.
  if ((s / 64 + 1) * hq >= (int64_t{1} << 31)) return "S·Hq too large for 32-bit tile indices";
  if (hkv <= 0 || hq % hkv != 0) return "Hq is not a multiple of Hkv";
  for (const void* p : {q, k, v, o, static_cast<const void*>(lse)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return "a pointer is not 16-byte aligned";
  }
  return nullptr;
}

cudaError_t HopperAttentionForward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                   int64_t s, int64_t hq, int64_t hkv, int64_t d, uint16_t* o,
                                   float* lse, cudaStream_t stream, int cluster,
                                   const int64_t* doc_starts, int64_t ndocs, int64_t window) {
  if (HopperAttentionUnsupported(s, hq, hkv, d, q, k, v, o, lse) != nullptr ||
      (ndocs > 1 && doc_starts == nullptr) || ndocs > s || window < 0) {
    return cudaErrorInvalidValue;
  }
  if (cluster == 0) cluster = ClusterSizeFor(s, hq, hkv, d);
  if ((hq / hkv) % cluster != 0) return cudaErrorInvalidValue;
  int const S = static_cast<int>(s), Hq = static_cast<int>(hq), Hkv = static_cast<int>(hkv);
  // hd128: 2 consumer warpgroups (128x128 tiles), 2 stages (3 stages, 224 KB of smem, measured
  // 3 % slower). hd64: 3 consumer warpgroups (192x128), 3 stages; 160 registers each is the limit.
  // A window of S keys or more is the causal mask alone.
  const int n = static_cast<int>(ndocs), w = window >= s ? 0 : static_cast<int>(window);
  return d == 128 ? launch_cluster<128, 2, 128, 2>(cluster, q, k, v, o, lse, S, Hq, Hkv, doc_starts,
                                                   n, w, stream)
                  : launch_cluster<64, 3, 128, 3>(cluster, q, k, v, o, lse, S, Hq, Hkv, doc_starts,
                                                  n, w, stream);
}

}  // namespace cuda
}  // namespace ithaca
