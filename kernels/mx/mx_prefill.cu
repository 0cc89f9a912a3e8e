// SPDX-License-Identifier: Apache-2.0
// Weight-only MX prefill GEMM, sm_90a (kernels/mx/mx_prefill.h; docs/mxfp.md "Weight-only prefill"):
// C[M, N] = A[M, K] * bf16(dequant(W))^T (+ bias), A and C BF16, W MXFP8 or MXFP4 [N, K] with
// E8M0 scales per 32 k.
//
// The dense GEMM core (kernels/gemm) with its W operand made in shared memory instead of loaded:
// 384 threads, persistent over 128 x BN tiles, a ring of STAGES stages of (A tile: TMA, W tile:
// widened), two consumer warpgroups running the dense kernel's wgmma mainloop (consumer_mma) and
// register epilogue (store_tile) unchanged.
// - Producer warpgroup, all 128 threads. Each thread owns fixed 16-byte chunks of the tile's
//   packed W rows (chunk c of every (128 / CPR)-th row, CPR = chunks a row a stage) and streams
//   them with cp.async into a staging slot of its own, RD stages ahead of the one it widens, so no
//   barrier is needed between the threads for the packed bytes (each reads back what it copied).
//   Per stage: wait until the ring slot is free (every thread: it writes the W tile); thread 0 arms
//   the full barrier for the A tile's bytes and issues its TMA; every thread widens its chunks
//   (mx_prefill.h: E4M3 placed into BF16, or E2M1 -> E4M3 -> BF16, times the block's power of two
//   in one mul.rn.bf16x2) and stores them into the W tile where a 128B-swizzled TMA box would have
//   put them; refills the staging slot with the chunks RD stages on; then a proxy fence (generic
//   writes -> wgmma's async reads) and one arrival per warp on the full barrier (count 1 + 4).
// - The block scales are read with ld.global.nc per stage (a row's 32-byte sector covers 16 stages;
//   L1 keeps it).
// - Split-K for few-tile shapes (GemmParams::split > 1): clusters of `split` CTAs, one k range
//   each, reduced through DSMEM as the dense kernel does (gemm_epilogue.cuh).
//
// Variant constants (tools/flygen, tuning/mx_decode.json): FLY_ACT_IS_BF16, FLY_FMT_IS_{E4M3,E2M1},
// FLY_BN (128, 256), FLY_STAGES (ring), FLY_RD (staging slots: packed stages in flight per thread).
#ifndef FLY_DTYPE_IS_BF16
#define FLY_DTYPE_IS_BF16 1  // the GEMM core's operand type: the activations and the widened weights
#endif
#include "gemm/gemm_config.cuh"
#include "gemm/gemm_epilogue.cuh"
#include "gemm/gemm_mainloop.cuh"
#include "gemm/gemm_scheduler.cuh"
#include "mx/mx_decode.h"
#include "mx/mx_device.cuh"
#include "mx/mx_prefill.h"
#include "mx/mx_unpack.h"

#if !defined(FLY_ACT_IS_BF16)
#error "mx_prefill: BF16 activations only (FP16's range cannot hold the scaled weights)"
#endif
#ifndef FLY_RD
#define FLY_RD 4
#endif

namespace {

using namespace fly::gemm;
namespace mxp = fly::mxp;
namespace sm90 = fly::sm90;

constexpr int RD = FLY_RD;
constexpr int BN = Config::BN;
constexpr int CPR = mxp::chunks_per_row(kFp4);    // 16-byte packed chunks of a row a stage (E4M3 4, E2M1 2)
constexpr int NCH = BN * CPR / 128;              // chunks a producer thread widens a stage
constexpr int ROW_STEP = 128 / CPR;              // tile rows between a thread's chunks
constexpr int RAW_BYTES = mxp::raw_stage_bytes(BN, kFp4);
constexpr int kFullArrivals = 1 + 4;             // thread 0's expect_tx, then one per producer warp
static_assert(Config::BM == 128 && Config::KB == 1 && Config::MC == 1 && Config::MP == 1 && !Config::PP &&
                  Config::KW == 1 && Config::EPI == 0,
              "mx_prefill: 128-row tiles, one k block a stage, no multicast, register epilogue");
static_assert(BN == 128 || BN == 256, "mx_prefill: W tiles of 128 or 256 rows");
static_assert(RD >= 2 && RD <= 8, "staging slots");
static_assert(Config::BK == mxp::kBK, "one 64-k block a stage");
static_assert(mxp::smem_bytes(BN, Config::STAGES, RD, kFp4) <= 227 * 1024, "shared memory per block on sm_90");
// 128 x 256 tiles: 128 accumulators a consumer thread (224 registers); the producer keeps 64.
using Regs = fly::RegSplit<2, BN == 256 ? 64 : 104, BN == 256 ? 224 : 200>;
static_assert(Config::ACC + 32 <= Regs::kConsumer, "accumulators fit the consumers' registers");

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void sts16(uint32_t a, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(a), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}
using fly::mxk::lds16;
using fly::mxk::mul_bf16x2;

// The producer's walk over (tile, k stage) in the consumers' order: the same scheduler.
struct Cursor {
  TileScheduler<1, 1, 1> sched;
  WorkUnit u;
  int kb = 0;
  bool valid;
  __device__ explicit Cursor(const GemmParams& g) : sched(g) { fetch(); }
  __device__ void next() {
    if (++kb >= u.kb_end) fetch();
  }
  // the next unit with k steps (the consumers skip empty ones without touching the ring)
  __device__ void fetch() {
    do {
      valid = sched.fetch(u);
      kb = valid ? u.kb_begin : 0;
    } while (valid && kb >= u.kb_end);
  }
};

// This thread's packed chunks of stage (u, kb) into its staging slot (zero-filled past N or K),
// one cp.async group (empty when the walk is over: the groups stay counted per stage).
__device__ __forceinline__ void stage_in(const mxp::PrefillParams& p, uint32_t slot, const Cursor& c, int t) {
  if (c.valid) {
    const int ch = t % CPR;
    const int row0 = c.u.tn * BN + t / CPR;
    const int64_t kbyte = int64_t(c.kb) * mxp::raw_row_bytes(kFp4) + ch * 16;
    const bool kin = c.kb * mxp::kBK + ch * (kFp4 ? 32 : 16) < p.k;  // K % 32 == 0: a chunk is wholly in or out
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
      const int row = row0 + i * ROW_STEP;
      const bool in = kin && row < p.n;
      cp_async16(slot + (i * 128 + t) * 16, in ? p.w + row * p.ldw + kbyte : p.w, in ? 16u : 0u);
    }
  }
  cp_async_commit();
}

// Two BF16 pairs from the E4M3 bytes of w, times the block's multiplier(s), NaN codes patched.
__device__ __forceinline__ void widen_word(uint32_t w, uint32_t m1, uint32_t m2, bool two, uint32_t& lo,
                                           uint32_t& hi) {
  lo = mul_bf16x2(fly::mxd::e4m3x2_place_bf16(w, false), m1);
  hi = mul_bf16x2(fly::mxd::e4m3x2_place_bf16(w, true), m1);
  if (two) {  // scale bytes 135..254 (mx_prefill.h): a second, exact-then-rounding step
    lo = mul_bf16x2(lo, m2);
    hi = mul_bf16x2(hi, m2);
  }
  if constexpr (!kFp4) {
    const uint32_t nan = mxp::e4m3_nan_mask(w);
    if (nan) {
      if (nan & 0x80u) lo = (lo & 0xFFFF0000u) | 0x7FC0u;
      if (nan & 0x8000u) lo = (lo & 0xFFFFu) | 0x7FC00000u;
      if (nan & 0x800000u) hi = (hi & 0xFFFF0000u) | 0x7FC0u;
      if (nan & 0x80000000u) hi = (hi & 0xFFFFu) | 0x7FC00000u;
    }
  }
}

// Widens this thread's chunks of stage (u, kb) from its staging slot into the ring's W tile.
__device__ __forceinline__ void widen_stage(const mxp::PrefillParams& p, uint32_t slot, uint32_t q, const Cursor& c,
                                            int t) {
  const int ch = t % CPR, r0 = t / CPR;
  const int blk = c.kb * 2 + (kFp4 ? ch : ch / 2);  // the 32-k block of this thread's chunks
  const bool kin = blk * 32 < p.k;
  const int64_t lds = p.k / 32;
  uint32_t sc[NCH];
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const int row = c.u.tn * BN + r0 + i * ROW_STEP;
    sc[i] = kin && row < p.n ? uint32_t(__ldg(p.sw + row * lds + blk)) : 0u;
  }
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
    const uint4 raw = lds16(slot + (i * 128 + t) * 16);
    const uint32_t r = uint32_t(r0 + i * ROW_STEP);  // tile row
    const uint32_t m1 = mxp::mult_first16(sc[i]) * 0x10001u;
    const bool two = sc[i] > mxp::kOneMulMax && sc[i] < 255u;
    const uint32_t m2 = mxp::mult_second16(sc[i]) * 0x10001u;
    const uint32_t line = q + r * 128u, sw = r & 7u;
    const uint32_t wv[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (kFp4) {
      // one packed word = 8 elements = one 16-byte chunk of the BF16 row: chunk 4 ch + j
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t o0, o1, o2, o3;
        widen_word(fly::mxu::e2m1x4_to_e4m3x4(wv[j] & 0xFFFFu), m1, m2, two, o0, o1);
        widen_word(fly::mxu::e2m1x4_to_e4m3x4(wv[j] >> 16), m1, m2, two, o2, o3);
        sts16(line + (((uint32_t(4 * ch + j)) ^ sw) << 4), o0, o1, o2, o3);
      }
    } else {
      // two packed words = 8 elements = one chunk: chunks 2 ch and 2 ch + 1
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint32_t o0, o1, o2, o3;
        widen_word(wv[2 * j], m1, m2, two, o0, o1);
        widen_word(wv[2 * j + 1], m1, m2, two, o2, o3);
        sts16(line + (((uint32_t(2 * ch + j)) ^ sw) << 4), o0, o1, o2, o3);
      }
    }
  }
}

__device__ __forceinline__ void producer_role(const mxp::PrefillParams& p, const Ring& ring, uint32_t raw, int t) {
  Cursor cur(p.g), ahead(p.g);
#pragma unroll 1
  for (int j = 0; j < RD; ++j) {
    stage_in(p, raw + j * RAW_BYTES, ahead, t);
    if (ahead.valid) ahead.next();
  }
  PipeState ps;
  int slot = 0;
  const uint32_t ring_s = sm90::smem_u32(ring.base);
  while (cur.valid) {
    cp_async_wait<RD - 1>();  // this thread's chunks of the stage have landed
    sm90::mbar_wait(&ring.empty[ps.stage], ps.phase ^ 1);
    uint64_t* fb = &ring.full[ps.stage];
    if (t == 0) {
      sm90::mbar_arrive_expect_tx(fb, Config::P_BYTES);
      sm90::tma_load_2d(ring.p_tile(ps.stage), &p.g.tm_p, fb, cur.kb * Config::BK, cur.u.tm * Config::BM);
    }
    const uint32_t slot_s = raw + slot * RAW_BYTES;
    widen_stage(p, slot_s, ring_s + ps.stage * Config::STAGE_BYTES + Config::P_BYTES, cur, t);
    stage_in(p, slot_s, ahead, t);  // the slot's next use: RD stages on (only this thread read it)
    if (ahead.valid) ahead.next();
    sm90::fence_proxy_async_smem();  // the W tile's generic stores before wgmma reads them
    __syncwarp();
    if (t % 32 == 0) sm90::mbar_arrive(fb);
    ps.advance();
    slot = slot + 1 == RD ? 0 : slot + 1;
    cur.next();
  }
  cp_async_wait<0>();  // nothing in flight at exit
}

__device__ __forceinline__ void consumer_role(const GemmParams& g, const Ring& ring, int wg) {
  TileScheduler<1, 1, 1> sched(g);
  PipeState ps;
  WorkUnit u;
  const OutView out(g);
  float acc[Config::ACC];
  while (sched.fetch(u)) {
    consumer_mma<0, 0>(ring, ps, u, wg, acc);
    // Stream-K as the dense kernel has it (the launcher plans none yet: sk_tiles = 0).
    // NOTE: without these branches ptxas kept the 128 accumulators of 128 x 256 tiles in local
    // memory and serialized the wgmmas (C7514); with them it keeps them in registers.
    if (u.role == kContributor) {
      sk_park(g, wg, acc);
      continue;
    }
    if (u.role == kOwner) sk_gather(g, u, wg, acc);
    if (g.split > 1) {
      // split-K (a cluster of `split` CTAs, one k range each): the dense kernel's DSMEM reduction
      // through the ring, which no stage uses any more (the producer wrote only stages these
      // warpgroups have consumed)
      consumers_sync();
      float* part = reinterpret_cast<float*>(ring.base);
      park_partial<false>(part, wg, acc);
      sm90::cluster_sync();
      reduce_partials(out, u, part, PartialLayout{false}, sched.rank, g.split, threadIdx.x - 128);
      sm90::cluster_sync();
    } else {
      store_tile(out, u, wg, acc);
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1) fly_mx_prefill_sm90(const __grid_constant__ mxp::PrefillParams p) {
  extern __shared__ uint8_t smem_raw[];
  const Ring ring = Ring::at(smem_raw);
  // the staging slots follow the ring's barriers (16-byte aligned: the stages are 1 KiB multiples)
  const uint32_t raw = sm90::smem_u32(ring.empty + Config::STAGES);
  const int wg = sm90::warp_uniform(threadIdx.x / 128);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Config::STAGES; ++s) {
      sm90::mbar_init(&ring.full[s], kFullArrivals);
      sm90::mbar_init(&ring.empty[s], Config::STAGE_READERS);
    }
    sm90::fence_barrier_init();
    sm90::tma_prefetch_desc(&p.g.tm_p);
  }
  __syncthreads();
  if (wg == 0) {
    Regs::producer();
    producer_role(p, ring, raw, int(threadIdx.x));
    if (p.g.split > 1) {  // the consumers' two cluster barriers
      sm90::cluster_sync();
      sm90::cluster_sync();
    }
  } else {
    Regs::consumer();
    consumer_role(p.g, ring, wg - 1);
  }
}
