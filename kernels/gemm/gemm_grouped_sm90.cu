// SPDX-License-Identifier: Apache-2.0
// sm_90a grouped GEMM entry (mixture-of-experts, F.grouped_mm's 2-D x 3-D form):
//   C[offs[g-1]:offs[g], :] = A[offs[g-1]:offs[g], :] @ B[g] (+ bias[g]) for every group g,
// FP16/BF16 in/out, FP32 accumulation, one persistent launch over all groups.
// One compile per variant (FLY_DTYPE_IS_*, FLY_BM, FLY_BN, FLY_STAGES, FLY_EPI; tuning/grouped_gemm.json).
//
// The dense kernel's pieces (gemm_sm90.cu), unchanged: the producer warpgroup's TMA ring
// (gemm_mainloop.cuh Ring, PipeState, load_operand), the consumers' wgmma mainloop
// (consumer_mma) and the epilogues (gemm_epilogue.cuh store_tile, store_tile_smem). What is
// grouped is the scheduler (gemm_scheduler.cuh GroupedScheduler over gemm_grouped.h's units,
// reading the device-side offsets: no host sync) and the addressing:
//   * P = A through one 2-D map over all T rows, each tile at its unit's row0 (a group's first
//     tile row starts at the group's first row, whatever its alignment);
//   * Q = B[g] through one 3-D map whose outer coordinate is the group (gemm_grouped_params.h);
//   * the epilogue writes through a view of C whose first row is the unit's row0 and whose row
//     count ends at the group's end (row_end, never past T): the dense epilogues clip at the
//     view's rows, so a tile never writes into the next group's rows. Bias: the group's row.
// EPI = 2: TMA stores per warp (16 rows) where the warp's rows lie inside the group, direct stores
// for the warp holding a group's end (a TMA store clips at the tensor's end, not at a group's).
// Not combined with multicast, split-K, stream-K, KB > 1, ping-pong, KW = 2 or EPI = 3:
// static_asserts below.
#include "gemm/gemm_config.cuh"
#include "gemm/gemm_epilogue.cuh"
#include "gemm/gemm_grouped_params.h"
#include "gemm/gemm_mainloop.cuh"
#include "gemm/gemm_scheduler.cuh"

namespace fly::gemm {

static_assert(Config::MC == 1 && Config::MP == 1, "grouped: no multicast (a cluster's tiles may be in different groups)");
static_assert(Config::KB == 1 && Config::KW == 1 && !Config::PP, "grouped: one k block per stage, both warpgroups per stage");
static_assert(Config::EPI <= 2, "grouped: direct, staged or per-warp TMA stores (epi 3 not in the space)");
static_assert(Config::BN <= 256, "grouped: Q tiles of one TMA box");

using GroupedSched = GroupedScheduler<1, 1, 1>;

// Q tile of group g: the 3-D map's box(es) at (k0, n0, g) (K-major) or (n0 + 64 c, k0, g) per
// 64-wide chunk (MN-major); the shared-memory layout is the dense kernel's (load_operand).
__device__ __forceinline__ void load_q_grouped(uint8_t* dst, const CUtensorMap* map, uint64_t* bar, bool kmajor, int n0,
                                               int k0, int g) {
  if (kmajor) {
    sm90::tma_load_3d(dst, map, bar, k0, n0, g);
  } else if constexpr (Config::BN % 64 == 0) {
#pragma unroll
    for (int c = 0; c < Config::BN / 64; ++c) sm90::tma_load_3d(dst + c * kMnChunkBytes, map, bar, n0 + 64 * c, k0, g);
  } else {
    __trap();  // an MN-major tile that is not whole 64-wide chunks: the launcher never plans one
  }
}

__device__ __forceinline__ void grouped_producer_loop(const GroupedGemmParams& gp, const Ring& ring) {
  GroupedSched sched(gp.core, gp.tail, Config::BM);
  PipeState ps;
  GroupedWorkUnit u;
  const bool qk = gp.core.q_kmajor != 0;
  while (sched.fetch(u)) {
    for (int kb = u.kb_begin; kb < u.kb_end; ++kb) {
      sm90::mbar_wait(&ring.empty[ps.stage], ps.phase ^ 1);
      uint64_t* fb = &ring.full[ps.stage];
      sm90::mbar_arrive_expect_tx(fb, Config::STAGE_TX_BYTES);  // OOB zero-fill bytes count too
      load_operand<Config::BM>(ring.p_tile(ps.stage), &gp.core.tm_p, &gp.core.tm_p3, fb, true, u.row0, kb * Config::BK,
                               gp.core.k);
      load_q_grouped(ring.q_tile(ps.stage), &gp.core.tm_q, fb, qk, u.tn * Config::BN, kb * Config::BK, u.group);
      ps.advance();
    }
  }
}

template <int TB>
__device__ __forceinline__ void grouped_consumer_role(const GroupedGemmParams& gp, const Ring& ring, int wg,
                                                      uint8_t* epi_stage) {
  GroupedSched sched(gp.core, gp.tail, Config::BM);
  PipeState ps;
  GroupedWorkUnit u;
  const OutView whole(gp.core);
  float acc[Config::ACC];
  uint32_t npass = 0;  // EPI = 2: this warp's TMA-store passes so far (which staging box is next)
  while (sched.fetch(u)) {
    consumer_mma<0, TB>(ring, ps, u, wg, acc);
    // The unit's view of C: its first row is row0, it ends at the group's end.
    OutView out = whole;
    out.c = whole.c + static_cast<int64_t>(u.row0) * whole.ldc;
    out.rows = u.row_end - u.row0;
    if (whole.bias) out.bias = whole.bias + static_cast<int64_t>(u.group) * gp.tail.bias_group_stride;
    WorkUnit w = u;
    w.tm = 0;
    if constexpr (Config::EPI == 2) {
      // Per warp: its 16 rows go out with TMA stores when they all lie inside the group (or the
      // group ends at T, where the tensor map clips); the warp holding the group's end stores
      // straight from its accumulators, clipped at row_end; a warp wholly past it stores nothing.
      const int warp = (threadIdx.x % 128) / 32;
      const int wrow = u.row0 + wg * 64 + warp * kEpiWarpRows;
      if (wrow < u.row_end) {
        if (gp.core.c_tma && (wrow + kEpiWarpRows <= u.row_end || u.row_end >= gp.tail.rows))
          store_warp_rows_tma(gp.core, out, wrow, u.tn, acc, epi_stage, npass);
        else
          store_block(out, wg * 64, u.tn * Config::BN, acc);  // only this warp's rows: no barrier inside
      }
    } else if constexpr (Config::EPI == 1) {
      store_tile_smem<false>(out, w, wg, acc, epi_stage);
    } else {
      store_tile(out, w, wg, acc);
    }
  }
  // The TMA stores must have read their boxes before the CTA's shared memory goes away.
  if constexpr (Config::EPI == 2)
    if (npass > 0 && threadIdx.x % 32 == 0) sm90::bulk_wait_group_read<0>();
}

}  // namespace fly::gemm

using namespace fly::gemm;

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    fly_grouped_gemm_sm90(const __grid_constant__ GroupedGemmParams gp) {
  extern __shared__ uint8_t smem_raw[];
  const Ring ring = Ring::at(smem_raw);

  const int wg = fly::sm90::warp_uniform(threadIdx.x / 128);
  if (threadIdx.x == 0) {
    ring.init_barriers(Config::STAGE_READERS);  // both consumer warpgroups (no clusters)
    fly::sm90::tma_prefetch_desc(&gp.core.tm_p);
    fly::sm90::tma_prefetch_desc(&gp.core.tm_q);
    if (Config::EPI == 2 && gp.core.c_tma) fly::sm90::tma_prefetch_desc(&gp.core.tm_c);
  }
  __syncthreads();

  if (wg == 0) {
    Config::Regs::producer();
    if (threadIdx.x < 32 && fly::sm90::elect_one()) grouped_producer_loop(gp, ring);
    __syncwarp();
  } else {
    Config::Regs::consumer();
    const int cw = wg - 1;
    // The staged epilogue's tiles follow the ring's barriers: one area per consumer warpgroup.
    uintptr_t epi_area = reinterpret_cast<uintptr_t>(ring.empty + Config::STAGES);
    if constexpr (Config::EPI == 2) epi_area = (epi_area + 1023) & ~uintptr_t(1023);  // 128B-swizzled boxes
    uint8_t* epi_stage = reinterpret_cast<uint8_t*>(epi_area) + cw * Config::EPI_WG_BYTES;
    if (gp.core.q_kmajor) grouped_consumer_role<0>(gp, ring, cw, epi_stage);
    else grouped_consumer_role<1>(gp, ring, cw, epi_stage);
  }
}
