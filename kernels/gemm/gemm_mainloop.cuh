// SPDX-License-Identifier: Apache-2.0
// Mainloop of the sm_90a GEMM: a TMA producer (one thread) fills a STAGES-deep ring of
// (P tile, Q tile) pairs guarded by full/empty mbarriers; two consumer warpgroups each multiply
// their 64-row half of P by the whole Q tile with wgmma, KB k blocks (4 KB x k16) per stage.
#pragma once

#include "common/sm90.h"
#include "common/wgmma_ops.h"
#include "gemm/gemm_config.cuh"
#include "gemm/gemm_ring.cuh"
#include "gemm/gemm_scheduler.cuh"

namespace fly::gemm {

// The ring (gemm_ring.cuh, shared with the decode kernel): STAGES stages of one P and one Q tile
// (and the MMA policy's scale tiles), guarded by full/empty mbarriers.
using PipeState = RingPos<Config::STAGES>;

struct Ring : StageRing<Config::STAGES, Config::STAGE_BYTES> {
  // empty: the consumer warpgroups of every CTA writing here released it (STAGE_READERS * CLUSTER)
  __device__ uint8_t* p_tile(int s) const { return stage_ptr(s); }
  __device__ uint8_t* q_tile(int s) const { return p_tile(s) + Config::P_BYTES; }
  // The ring in the kernel's dynamic shared memory: stages from the first 1024-byte boundary
  // (128-byte swizzle atoms), then the full and the empty barriers, one each per stage.
  __device__ __forceinline__ static Ring at(uint8_t* smem_raw) { return at_as<Ring>(smem_raw); }
};

// ---- producer ----------------------------------------------------------------------------------
// Stage layout of one operand (KB k blocks of ROWS rows). K-major: KB tiles [ROWS][64 k] of
// ROWS x 128 B one after the other. MN-major: 128B swizzling caps the box's inner extent at 64
// elements, so the tile is ROWS/64 chunks, each [KB x 64 k][64 mn] (KB x 8 KiB): one box
// {64 mn, KB x 64 k} per chunk; the MN-major descriptor's LBO is the chunk stride.
constexpr int kMnChunkBytes = Config::KB * Config::BK * kRowBytes;

// Loads one operand tile of the k step starting at k0. K-major with KB > 1: one 3-D box (map3)
// when the whole step lies inside K, else one 2-D box per k block (zero-filled past K).
template <int ROWS>
__device__ __forceinline__ void load_operand(uint8_t* dst, const CUtensorMap* map, const CUtensorMap* map3,
                                             uint64_t* bar, bool kmajor, int row0, int k0, int k) {
  if (kmajor) {
    if constexpr (Config::KB == 1) {
      constexpr int BOX = tma_box_rows(ROWS);  // 320-row tiles: two boxes of 160
#pragma unroll
      for (int b = 0; b < ROWS / BOX; ++b)
        sm90::tma_load_2d(dst + b * BOX * kRowBytes, map, bar, k0, row0 + b * BOX);
    } else {
      if (k0 + Config::KSTEP <= k) {
        sm90::tma_load_3d(dst, map3, bar, 0, row0, k0 / Config::BK);
      } else {
#pragma unroll
        for (int j = 0; j < Config::KB; ++j)
          sm90::tma_load_2d(dst + j * ROWS * kRowBytes, map, bar, k0 + j * Config::BK, row0);
      }
    }
  } else if constexpr (ROWS % 64 == 0) {
#pragma unroll
    for (int c = 0; c < ROWS / 64; ++c) sm90::tma_load_2d(dst + c * kMnChunkBytes, map, bar, row0 + 64 * c, k0);
  } else {
    __trap();  // an MN-major tile that is not whole 64-wide chunks: the launcher never plans one (layout_fits)
  }
}

// One operand tile, loaded by this CTA alone (CL == 1) or shared by a multicast cluster of 2
// (CL == 2: Q tiles with Config::MC, P tiles with Config::MP): then CTA `rank` loads its half of
// the tile's rows into both CTAs. K-major: a box {64 k, ROWS/2}; MN-major: ROWS/128 of the 64-wide
// chunks, so ROWS/2 must be a whole number of chunks (gemm_plan.h layout_fits refuses the
// MN-major operands whose halves are not).
template <int ROWS, int CL>
__device__ __forceinline__ void load_tile(uint8_t* dst, const CUtensorMap* map, const CUtensorMap* map3,
                                          uint64_t* bar, bool kmajor, int row0, int k0, int k, int rank) {
  if constexpr (CL == 1) {
    load_operand<ROWS>(dst, map, map3, bar, kmajor, row0, k0, k);
  } else if constexpr (Config::KB == 2) {
    // Two k blocks per stage: CTA `rank` brings k block `rank` (all ROWS rows; a box wholly past
    // K is zero-filled and still counts its bytes). K-major: the stage's k blocks are ROWS x 128 B
    // tiles one after the other; MN-major: k block j is 8 KiB into each 64-wide chunk.
    static_assert(CL == 2, "multicast clusters of 2");
    const uint16_t both = 0x3;
    const int kr = k0 + rank * Config::BK;
    if (kmajor) {
      sm90::tma_load_2d_multicast(dst + rank * ROWS * kRowBytes, map, bar, kr, row0, both);
    } else if constexpr (ROWS % 64 == 0) {
#pragma unroll
      for (int c = 0; c < ROWS / 64; ++c)
        sm90::tma_load_2d_multicast(dst + c * kMnChunkBytes + rank * Config::BK * kRowBytes, map, bar, row0 + 64 * c,
                                    kr, both);
    } else {
      __trap();  // an MN-major tile that is not whole 64-wide chunks: the launcher never plans one (layout_fits)
    }
  } else {
    static_assert(CL == 2 && Config::KB == 1, "multicast clusters of 2");
    constexpr int HALF = ROWS / 2;
    const uint16_t both = 0x3;
    if (kmajor) {
      sm90::tma_load_2d_multicast(dst + rank * HALF * kRowBytes, map, bar, k0, row0 + rank * HALF, both);
    } else if constexpr (HALF % 64 == 0) {
#pragma unroll
      for (int c = 0; c < HALF / 64; ++c) {
        const int chunk = rank * (HALF / 64) + c;
        sm90::tma_load_2d_multicast(dst + chunk * Config::BK * kRowBytes, map, bar, row0 + 64 * chunk, k0, both);
      }
    } else {
      __trap();  // MN-major halves that are not whole chunks: the launcher never plans one (layout_fits)
    }
  }
}

// NOTE: measured on the H200 and dropped (bench/RESULTS.md): prefetching the k blocks 4-32 ahead
// of the ring into L2 (cp.async.bulk.prefetch.tensor) made M <= 512 shapes 1.3-2.2x slower, and
// refilling the ring 2-3 stages at a time was 2-50% slower. On decode shapes more stages are
// slower too (st6 16.4, st9 17.6 us at 64x4096x4096): more outstanding 128-byte row segments do
// not raise the DRAM rate.
__device__ __forceinline__ void producer_loop(const GemmParams& p, const Ring& ring) {
  TileScheduler<Config::MC, Config::MP, Config::KB> sched(p);
  PipeState ps;
  WorkUnit u;
  const bool pk = p.p_kmajor != 0, qk = p.q_kmajor != 0;
  // k_stagger: this CTA's (cluster's: multicast peers must load the same k step) start offset.
  constexpr int CL = Config::CLUSTER;
  const int k_off = p.k_stagger ? int(uint64_t(blockIdx.x / CL) * sched.kb_total / max(1u, gridDim.x / CL)) : 0;
  while (sched.fetch(u)) {
    const int off = u.kb_begin == 0 && u.kb_end == sched.kb_total ? k_off : 0;
    for (int kb0 = u.kb_begin; kb0 < u.kb_end; ++kb0) {
      int kb = kb0 + off;  // the consumers only count stages, so any order of the k steps will do
      if (kb >= u.kb_end) kb -= u.kb_end;
      uint64_t* fb = ring.acquire(ps, Config::STAGE_TX_BYTES);  // the first pass does not block
      load_tile<Config::BM, Config::MP>(ring.p_tile(ps.stage), &p.tm_p, &p.tm_p3, fb, pk, u.tm * Config::BM,
                                        kb * Config::KSTEP, p.k, sched.rank);
      load_tile<Config::BN, Config::MC>(ring.q_tile(ps.stage), &p.tm_q, &p.tm_q3, fb, qk, u.tn * Config::BN,
                                        kb * Config::KSTEP, p.k, sched.rank);
      ps.advance();
    }
  }
  if constexpr (Config::CLUSTER > 1) {
    // NOTE: producer tail instead of a cluster barrier at exit: wait until every stage has been
    // released once more. Then all consumer arrivals aimed at this CTA (local and the peer's) have
    // happened, and all our multicast writes have landed (the consumers waited on them), so this
    // CTA may exit without its peer touching its shared memory afterwards.
    for (int i = 0; i < Config::STAGES; ++i) {
      sm90::mbar_wait(&ring.empty[ps.stage], ps.phase ^ 1);
      ps.advance();
    }
  }
}

// ---- consumer ----------------------------------------------------------------------------------
// Dev tracing (kernels/gemm/dev/trace.cu; never in the shipped cubins): with FLY_GEMM_TRACE the
// consumer warpgroups' thread 0 record, per tile, clock64 at the mainloop's start and end, after
// the epilogue, and the cycles the mainloop spent in full-barrier waits (consumer_mma adds them to
// *trace_wait when given one).
#ifdef FLY_GEMM_TRACE
constexpr int kTraceTiles = 32;
extern "C" __device__ unsigned long long fly_gemm_trace[132 * 2 * kTraceTiles * 4];  // read by name
#define FLY_TRACE_WAIT_BEGIN const long long tw0_ = clock64();
#define FLY_TRACE_WAIT_END if (trace_wait && threadIdx.x % 128 == 0) *trace_wait += clock64() - tw0_;
#else
#define FLY_TRACE_WAIT_BEGIN
#define FLY_TRACE_WAIT_END
#endif

// wgmma descriptors of the stage's operand tiles (128B swizzle, sm90::make_desc_sw128) as two
// 32-bit words: `lo` (start address / 16, LBO / 16) varies per stage; `hi` (SBO = 1024, the
// swizzle mode) is a constant. K-major tiles step 32 B inside the swizzle atom per k16 slice and
// KB_STRIDE bytes per k block (the stage's rows x 128 B); MN-major tiles step two 1 KiB atoms (16 k
// rows) down the chunk, with LBO = the chunk stride.
template <bool KMAJOR>
__device__ __forceinline__ uint32_t desc_lo(uint32_t tile) {
  return static_cast<uint32_t>(sm90::make_desc_sw128(tile, KMAJOR ? 16 : kMnChunkBytes, 1024));
}
constexpr uint32_t kDescHi = static_cast<uint32_t>((1024 >> 4) | (1u << 30));
__device__ __forceinline__ uint64_t desc(uint32_t lo) { return (static_cast<uint64_t>(kDescHi) << 32) | lo; }
// What k slice `kk` (one wgmma's k: 0..4 KB - 1) adds to `lo`: its byte offset / 16 in the
// start-address field. K-major: kMmaK elements further along the 128-byte row, a k block per
// row's worth; MN-major: kMmaK rows of 128 bytes further down the chunk.
// Exact: no operand ends past 2^18 bytes of shared memory, so the 14-bit field never carries.
// NOTE: a 32-bit add per operand and wgmma, in place of a descriptor built from each slice's
// address (the narrow decode tiles' SASS spent ~12 uniform instructions per wgmma on it).
template <bool KMAJOR, int KB_STRIDE>
__device__ __forceinline__ constexpr uint32_t slice_offset(int kk) {
  constexpr int kPerBlock = mma_per_k_block<kDtype>(), kSliceBytes = Traits::kMmaK * Traits::kBytes;
  return (KMAJOR ? (kk / kPerBlock) * KB_STRIDE + (kk % kPerBlock) * kSliceBytes : kk * Traits::kMmaK * kRowBytes) >> 4;
}

// Byte offset of the 64-row (K-major) or 64-wide chunk (MN-major) number `i` of a stage's operand.
template <bool KMAJOR>
__device__ __forceinline__ constexpr int sub_offset(int i) {
  return KMAJOR ? i * 64 * kRowBytes : i * kMnChunkBytes;
}

// NOTE: wgmma writes the accumulators asynchronously; these empty asm statements pin them so the
// compiler neither reads nor moves them between issue and wgmma.wait_group.
__device__ __forceinline__ void fence_acc(float (&acc)[Config::ACC]) {
#pragma unroll
  for (int i = 0; i < Config::ACC; ++i) sm90::reg_fence(acc[i]);
}

// Releases a stage to the producers that write it: this CTA's, and with multicast the peer's too
// (its Q half, or P half, lands in our ring).
__device__ __forceinline__ void release_stage(const Ring& ring, int stage) {
  if constexpr (Config::CLUSTER > 1) {
#pragma unroll
    for (int r = 0; r < Config::CLUSTER; ++r) sm90::mbar_arrive_cluster(&ring.empty[stage], r);
  } else {
    ring.release_local(stage);
  }
}

// The MMA policy's work on one ring stage. Dense: every k slice of the stage, each of the
// warpgroup's MH halves of P times its NQ pieces of Q, into one accumulator set.
template <class Policy>
struct MmaStage;
template <>
struct MmaStage<DenseMma> {
  template <int TA, int TB, class Mma>
  __device__ __forceinline__ static void run(float (&acc)[Config::ACC], const uint32_t (&dp)[Config::MH], uint32_t dq) {
    // NQ = 2 (BN = 320): the second wgmma takes Q rows MMA_N.. (K-major only: gemm_plan.h layout_fits).
    constexpr uint32_t kQHalf = (Config::MMA_N * kRowBytes) >> 4;
#pragma unroll
    for (int kk = 0; kk < Config::KSTEP / Traits::kMmaK; ++kk)
#pragma unroll
      for (int h = 0; h < Config::MH; ++h)
#pragma unroll
        for (int nq = 0; nq < Config::NQ; ++nq)
          Mma::mma(acc + (h * Config::NQ + nq) * Mma::kRegs,
                   desc(dp[h] + slice_offset<TA == 0, Config::P_KB_BYTES>(kk)),
                   desc(dq + nq * kQHalf + slice_offset<TB == 0, Config::Q_KB_BYTES>(kk)), 1);
  }
};

// Accumulates the unit's k blocks into acc (zeroed here). `wg` is the consumer index (0/1).
// NOTE: measured and dropped (bench/RESULTS.md): two wgmma groups in flight instead of one, and
// rotating the k16 steps over 2-4 accumulator sets; neither sped up the narrow decode tiles.
template <int TA, int TB>
__device__ __forceinline__ void consumer_mma(const Ring& ring, PipeState& ps, const WorkUnit& u,
                                             int wg, float (&acc)[Config::ACC], long long* trace_wait = nullptr) {
  using Mma = sm90::Wgmma<Config::MMA_N, TA, TB, kBF16>;
  static_assert(Mma::kRegs * Config::MH * Config::NQ == Config::ACC, "accumulator count");
  const bool signal = (threadIdx.x % 128) == 0;
#pragma unroll
  for (int i = 0; i < Config::ACC; ++i) acc[i] = 0.f;
  // The 64-row half of P this warpgroup multiplies: 64 rows x 128 B (K-major) or the wg-th
  // 64-wide MN chunk (MN-major) are both 8 KiB into the tile. Narrow tiles (BM = 64): both take
  // all of P and the wg-th WG_N columns of Q: WG_N rows x 128 B (K-major) or WG_N / 64 chunks of
  // 8 KiB (MN-major; the launcher plans that only when WG_N is a multiple of 64). Ping-pong: the
  // warpgroup takes both halves of P (MH = 2), each into its own Mma::kRegs accumulators.
  const int p_off = Config::BM == 128 && !Config::PP ? sub_offset<TA == 0>(wg) : 0;
  const int q_off = Config::BM == 128 || Config::KW == 2
                        ? 0
                        : (TB == 0 ? wg * Config::WG_N * kRowBytes : sub_offset<false>(wg * (Config::WG_N / 64)));
  const uint32_t ring_s = sm90::smem_u32(ring.base);  // once: the stages are offsets from it
  int prev = -1;
  for (int kb = u.kb_begin; kb < u.kb_end; ++kb) {
    if constexpr (Config::KW == 2) {
      // The ring is even (gemm_config.cuh), so stage s is always warpgroup s % 2's.
      if ((ps.stage & 1) != wg) {  // the other warpgroup's stage
        ps.advance();
        continue;
      }
    }
    FLY_TRACE_WAIT_BEGIN
    ring.wait_full(ps);
    FLY_TRACE_WAIT_END
    fence_acc(acc);
    sm90::wgmma_fence();
    const uint32_t st = ring_s + ps.stage * Config::STAGE_BYTES;
    uint32_t dp[Config::MH];
#pragma unroll
    for (int h = 0; h < Config::MH; ++h) dp[h] = desc_lo<TA == 0>(st + p_off + sub_offset<TA == 0>(h));
    const uint32_t dq = desc_lo<TB == 0>(st + Config::P_BYTES + q_off);
    MmaStage<Config::MmaPolicy>::run<TA, TB, Mma>(acc, dp, dq);
    sm90::wgmma_commit();
    fence_acc(acc);
    // NOTE: keep one wgmma group in flight; the stage read by the previous group is free now.
    sm90::wgmma_wait<1>();
    if (prev >= 0 && signal) release_stage(ring, prev);
    prev = ps.stage;
    ps.advance();
  }
  sm90::wgmma_wait<0>();
  fence_acc(acc);
  if (prev >= 0 && signal) release_stage(ring, prev);
}

}  // namespace fly::gemm
