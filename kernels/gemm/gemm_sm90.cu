// SPDX-License-Identifier: Apache-2.0
// sm_90a GEMM entry: C = A @ B (+bias), BF16/FP16 in/out, FP32 accumulation.
// One compile per variant (FLY_DTYPE_IS_*, FLY_BM, FLY_BN, FLY_STAGES, FLY_MC, FLY_EPI; see tuning/gemm.json).
//
// Block of 384 threads = 3 warpgroups:
//   wg 0: producer. setmaxnreg.dec; one elected thread issues the TMA loads of the ring.
//   wg 1, 2: consumers. setmaxnreg.inc; wgmma on rows [0,64) / [64,128) of the BM x BN tile,
//            then the epilogue.
// Modes (runtime): split == 1: persistent over tiles (grid <= #SMs), optionally with stream-K
// over the last tiles (sk_tiles > 0: gemm_params.h, gemm_scheduler.cuh); split > 1: the launch
// has clusters of `split` CTAs along x, one per k slice of a tile, reduced through DSMEM.
// FLY_MC == 2 (compile time, persistent only): clusters of 2 CTAs share the Q tile by multicast
// (128-row and narrow tiles);
// FLY_MP == 2: clusters of 2 CTAs share the P tile by multicast (narrow and 128-row tiles).
// FLY_PP == 1 (ping-pong): the consumer warpgroups take alternate whole tiles (gemm_config.cuh).
// FLY_KW == 2 (narrow tiles): the consumer warpgroups take alternate k steps of the whole tile and
// sum their partials through shared memory (gemm_config.cuh, gemm_epilogue.cuh kw_exchange).
// Layouts (runtime): p_kmajor / q_kmajor pick one of four consumer instantiations (the wgmma
// transpose bits are immediates), so one kernel serves NN/NT/TN/TT and swap-AB.
#include "gemm/gemm_config.cuh"
#include "gemm/gemm_epilogue.cuh"
#include "gemm/gemm_mainloop.cuh"
#include "gemm/gemm_scheduler.cuh"

namespace fly::gemm {

// Ping-pong order: warpgroup w runs the mainloop of the CTA's units w, w + 2, ...; before each
// one (except warpgroup 0's first) it waits until the other has finished the mainloop of the unit
// before it (named barrier kPingPongTurn + w, 256 threads: the other's 128 arrive, these 128 wait). Besides
// taking turns on the tensor cores, this keeps every full-barrier wait at most one phase ahead of
// the producer, which the parity test of mbarrier.try_wait needs.
__device__ __forceinline__ void pp_wait_turn(int wg) { named_bar_sync<256>(named_bar::kPingPongTurn + wg); }
__device__ __forceinline__ void pp_pass_turn(int wg) { named_bar_arrive<256>(named_bar::kPingPongTurn + (wg ^ 1)); }

template <int TA, int TB>
__device__ __forceinline__ void consumer_role_pp(const GemmParams& p, const Ring& ring, int wg) {
  TileScheduler<Config::MC, Config::MP, Config::KB> sched(p);
  PipeState ps;
  WorkUnit u, other;
  const OutView out(p);
  float acc[Config::ACC];
  // The ring holds the units in the CTA's order; warpgroup 1 starts by skipping unit 0's stages.
  if (wg == 1) {
    if (!sched.fetch(other)) return;
    ps.advance(other.kb_end - other.kb_begin);
  }
  bool first = wg == 0;
  while (sched.fetch(u)) {
    if (!first) pp_wait_turn(wg);
    first = false;
    consumer_mma<TA, TB>(ring, ps, u, wg, acc);
    // Hand the turn over only when the other warpgroup has a next unit (no dangling arrivals).
    const bool more = sched.fetch(other);
    if (more) pp_pass_turn(wg);
    store_tile(out, u, wg, acc);  // overlaps the other warpgroup's mainloop
    if (!more) break;
    ps.advance(other.kb_end - other.kb_begin);
  }
}

template <int TA, int TB>
__device__ __forceinline__ void consumer_role(const GemmParams& p, const Ring& ring, int wg,
                                              uint8_t* epi_stage) {
  if constexpr (Config::PP) {
    consumer_role_pp<TA, TB>(p, ring, wg);
    return;
  }
  TileScheduler<Config::MC, Config::MP, Config::KB> sched(p);
  PipeState ps;
  WorkUnit u;
  const OutView out(p);
  float acc[Config::ACC];
  uint32_t npass = 0;  // TMA-store epilogue: passes so far (which staging box is next)
#ifdef FLY_GEMM_TRACE
  int trace_tile = 0;
  unsigned long long* trace = nullptr;
#endif
  while (sched.fetch(u)) {
    long long trace_wait = 0;
#ifdef FLY_GEMM_TRACE
    trace = threadIdx.x % 128 == 0 && trace_tile < kTraceTiles && blockIdx.x < 132
                ? fly_gemm_trace + ((blockIdx.x * 2 + wg) * kTraceTiles + trace_tile++) * 4 : nullptr;
    if (trace) trace[0] = clock64();
#endif
    consumer_mma<TA, TB>(ring, ps, u, wg, acc, &trace_wait);
#ifdef FLY_GEMM_TRACE
    if (trace) trace[1] = clock64(), trace[3] = static_cast<unsigned long long>(trace_wait);
#endif
    // Stream-K: a contributor leaves its partial for the tile's owner, which adds them first.
    if (u.role == kContributor) {
      sk_park(p, wg, acc);
      continue;
    }
    if (u.role == kOwner) sk_gather(p, u, wg, acc);
    if constexpr (Config::BM != 128) {
      // narrow tiles: no split-K (the launcher plans split = 1); KW = 2: sum the two k halves first
      if constexpr (Config::KW == 2) kw_exchange(acc, wg, reinterpret_cast<float*>(epi_stage));
      store_tile(out, u, wg, acc);
    } else if constexpr (Config::BN > 256) {
      // 320-wide tiles: no split-K, no swap-AB (the launcher plans neither): the epilogue of one
      // orientation only, which keeps the 160 accumulators in registers.
      if constexpr (Config::EPI != 0) store_tile_smem<false>(out, u, wg, acc, epi_stage);
      else store_tile(out, u, wg, acc);
    } else if (p.split > 1) {
      // Both consumer warpgroups must be done reading the ring before it holds partials.
      consumers_sync();
      float* part = reinterpret_cast<float*>(ring.base);
      const PartialLayout L{out.swap};
      if (L.swap) park_partial<true>(part, wg, acc);
      else park_partial<false>(part, wg, acc);
      sm90::cluster_sync();  // partials of every CTA visible cluster-wide
      reduce_partials(out, u, part, L, sched.rank, p.split, threadIdx.x - 128);
      sm90::cluster_sync();  // nobody leaves while others still read its shared memory
    } else if constexpr (Config::EPI >= 2) {
      if (p.c_tma) store_tile_tma(p, out, u, wg, acc, epi_stage, npass);
      else store_tile(out, u, wg, acc);  // swap-AB, or a C that TMA cannot address
    } else if constexpr (Config::EPI != 0) {
      if (out.swap) store_tile_smem<true>(out, u, wg, acc, epi_stage);
      else store_tile_smem<false>(out, u, wg, acc, epi_stage);
    } else {
      store_tile(out, u, wg, acc);
    }
#ifdef FLY_GEMM_TRACE
    if (trace) trace[2] = clock64();
#endif
  }
  // The TMA stores must have read their boxes before the CTA's shared memory goes away (lane 0 of
  // each warp issued its warp's stores).
  if constexpr (Config::EPI >= 2)
    if (npass > 0 && threadIdx.x % 32 == 0) sm90::bulk_wait_group_read<0>();
}

}  // namespace fly::gemm

using namespace fly::gemm;

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    fly_gemm_sm90(const __grid_constant__ GemmParams p) {
  extern __shared__ uint8_t smem_raw[];
  const Ring ring = Ring::at(smem_raw);

  const int wg = fly::sm90::warp_uniform(threadIdx.x / 128);
  if (threadIdx.x == 0) {
    // empty: one arrival per consumer warpgroup that reads a stage, from each CTA whose producer
    // writes it
    ring.init_barriers(Config::STAGE_READERS * Config::CLUSTER);
    fly::sm90::tma_prefetch_desc(&p.tm_p);
    fly::sm90::tma_prefetch_desc(&p.tm_q);
    if (Config::EPI >= 2 && p.c_tma) fly::sm90::tma_prefetch_desc(&p.tm_c);
    if constexpr (Config::KB > 1) {
      // The 3-D views exist for K-major operands when some k step is whole, only for an operand
      // that is not multicast (gemm_plan.h).
      if (p.k >= Config::KSTEP) {
        if (p.p_kmajor && Config::MP == 1) fly::sm90::tma_prefetch_desc(&p.tm_p3);
        if (p.q_kmajor && Config::MC == 1) fly::sm90::tma_prefetch_desc(&p.tm_q3);
      }
    }
  }
  // Multicast peers signal our barriers: they must be initialized cluster-wide first.
  const bool multicast = Config::CLUSTER > 1 && p.split == 1;
  if (multicast) fly::sm90::cluster_sync();
  else __syncthreads();

  if (wg == 0) {
    Config::Regs::producer();
    if (threadIdx.x < 32 && fly::sm90::elect_one()) producer_loop(p, ring);
    __syncwarp();
    if (p.split > 1) {  // match the consumers' two cluster barriers
      fly::sm90::cluster_sync();
      fly::sm90::cluster_sync();
    }
  } else {
    Config::Regs::consumer();
    const int cw = wg - 1;
    // Epilogue staging tiles (EPI = 1, 2, 3) follow the ring's barriers: one area per consumer warpgroup.
    uintptr_t epi_area = reinterpret_cast<uintptr_t>(ring.empty + Config::STAGES);
    if constexpr (Config::EPI >= 2) epi_area = (epi_area + 1023) & ~uintptr_t(1023);  // 128B-swizzled boxes
    // KW = 2 (no staged epilogue): the exchange area, shared by both, in the same place.
    uint8_t* epi_stage = reinterpret_cast<uint8_t*>(epi_area) + (Config::KW == 2 ? 0 : cw * Config::EPI_WG_BYTES);
    const int sel = (p.p_kmajor ? 0 : 2) + (p.q_kmajor ? 0 : 1);
    switch (sel) {
      case 0: consumer_role<0, 0>(p, ring, cw, epi_stage); break;
      case 1: consumer_role<0, 1>(p, ring, cw, epi_stage); break;
      case 2: consumer_role<1, 0>(p, ring, cw, epi_stage); break;
      default: consumer_role<1, 1>(p, ring, cw, epi_stage); break;
    }
  }
  // Multicast: the producer's tail (producer_loop) keeps the CTA alive until its peer is done
  // with it; the barrier-free exit lets idle producer threads leave early.
}
