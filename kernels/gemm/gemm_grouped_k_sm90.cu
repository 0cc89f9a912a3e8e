// SPDX-License-Identifier: Apache-2.0
// sm_90a ragged-K grouped GEMM entry (the weight gradient of F.grouped_mm, torch._grouped_mm's
// 2-D x 2-D form with offsets along K):
//   out[g] = a[:, offs[g-1]:offs[g]] @ b[offs[g-1]:offs[g], :]   for every group g (zeros if empty),
// FP16/BF16 in/out, FP32 accumulation, one persistent launch over G x tiles_m x tiles_n units.
// One compile per variant (FLY_DTYPE_IS_*, FLY_BM, FLY_BN, FLY_STAGES, FLY_EPI; tuning/grouped_gemm.json,
// the spaces with mode "k"). Parameters and the decomposition: gemm_grouped_k_params.h.
//
// Two kernels per module, launched one after the other on the caller's stream:
//   fly_grouped_gemm_k_maps  one thread per group copies the template maps of a and b^T (the whole
//       tensors) into the workspace and sets the ragged dimension's extent to the group's end
//       (tensormap.replace .global_dim), so TMA zero-fills the k tail of the group's last block;
//   fly_grouped_gemm_k_sm90  the dense kernel's producer warpgroup (TMA ring, load_operand), the
//       consumers' wgmma mainloop (consumer_mma, both operand orders) and epilogue (store_tile,
//       store_tile_smem) over units (group, tm, tn); a unit's k blocks start at the group's first
//       k. A group of no k writes zeros (no k blocks: the accumulators stay 0).
// Not combined with multicast, split-K, stream-K, kb > 1, ping-pong, kw = 2 or the TMA-store
// epilogues (static_asserts).
#include "gemm/gemm_config.cuh"
#include "gemm/gemm_epilogue.cuh"
#include "gemm/gemm_grouped_k_params.h"
#include "gemm/gemm_mainloop.cuh"

namespace fly::gemm {

static_assert(Config::MC == 1 && Config::MP == 1, "grouped k: no multicast");
static_assert(Config::KB == 1 && Config::KW == 1 && !Config::PP, "grouped k: one k block per stage, both warpgroups per stage");
static_assert(Config::EPI <= 1, "grouped k: direct or staged stores");

// Replaces the global extent of dimension ORD of the 128-byte tensor map at `map` (global memory).
template <int ORD>
__device__ __forceinline__ void tensormap_set_dim(CUtensorMap* map, int32_t extent) {
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], %1, %2;\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "n"(ORD), "r"(extent)
               : "memory");
}
// Sets the ragged (k) dimension: dimension 0 of a K-major map ({K, rows}), 1 of an MN-major one.
__device__ __forceinline__ void tensormap_set_k(CUtensorMap* map, bool kmajor, int32_t extent) {
  if (kmajor) tensormap_set_dim<0>(map, extent);
  else tensormap_set_dim<1>(map, extent);
}
__device__ __forceinline__ void tensormap_release_gpu() {
  asm volatile("fence.proxy.tensormap::generic.release.gpu;\n" ::: "memory");
}
__device__ __forceinline__ void tensormap_acquire_gpu(const CUtensorMap* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(map))
               : "memory");
}

__device__ __forceinline__ void copy_map(CUtensorMap* dst, const CUtensorMap* src) {
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
#pragma unroll
  for (int i = 0; i < int(sizeof(CUtensorMap) / sizeof(int4)); ++i) d[i] = s[i];
}

// The unit's group, tiles and k range (both roles compute the same).
struct KUnit : WorkUnit {
  int group = 0;
  int k0 = 0;  // the group's first k: k block kb starts at k0 + 64 kb
};
struct KScheduler {
  const GroupedKParams* kp;
  int64_t next, step;
  __device__ explicit KScheduler(const GroupedKParams& p) : kp(&p), next(blockIdx.x), step(gridDim.x) {}
  __device__ bool fetch(KUnit& u) {
    if (next >= kp->units) return false;
    const GroupedKUnit g = grouped_k_unit(next, kp->core.tiles_m, kp->core.tiles_n);
    next += step;
    int32_t kb, ke;
    grouped_k_range(kp->offs, g.group, kp->ktot, &kb, &ke);
    u.group = g.group;
    u.tm = g.tm;
    u.tn = g.tn;
    u.k0 = kb;
    u.kb_begin = 0;
    u.kb_end = grouped_k_blocks(ke - kb, Config::BK);
    return true;
  }
};

__device__ __forceinline__ void k_producer_loop(const GroupedKParams& kp, const Ring& ring) {
  KScheduler sched(kp);
  PipeState ps;
  KUnit u;
  const bool pk = kp.core.p_kmajor != 0, qk = kp.core.q_kmajor != 0;
  int acquired = -1;  // the group whose maps this thread has acquired (tensormap proxy)
  while (sched.fetch(u)) {
    if (u.kb_end == 0) continue;  // an empty group: nothing to load, the consumers store zeros
    const CUtensorMap* ma = kp.maps + 2 * u.group;
    const CUtensorMap* mb = ma + 1;
    if (u.group != acquired) {
      // The maps were written by fly_grouped_gemm_k_maps (generic proxy, released there).
      tensormap_acquire_gpu(ma);
      tensormap_acquire_gpu(mb);
      acquired = u.group;
    }
    for (int kb = u.kb_begin; kb < u.kb_end; ++kb) {
      sm90::mbar_wait(&ring.empty[ps.stage], ps.phase ^ 1);
      uint64_t* fb = &ring.full[ps.stage];
      sm90::mbar_arrive_expect_tx(fb, Config::STAGE_TX_BYTES);  // OOB zero-fill bytes count too
      const int k = u.k0 + kb * Config::BK;
      load_operand<Config::BM>(ring.p_tile(ps.stage), ma, nullptr, fb, pk, u.tm * Config::BM, k, kp.ktot);
      load_operand<Config::BN>(ring.q_tile(ps.stage), mb, nullptr, fb, qk, u.tn * Config::BN, k, kp.ktot);
      ps.advance();
    }
  }
}

template <int TA, int TB>
__device__ __forceinline__ void k_consumer_role(const GroupedKParams& kp, const Ring& ring, int wg,
                                                uint8_t* epi_stage) {
  KScheduler sched(kp);
  PipeState ps;
  KUnit u;
  const OutView whole(kp.core);
  float acc[Config::ACC];
  while (sched.fetch(u)) {
    consumer_mma<TA, TB>(ring, ps, u, wg, acc);
    OutView out = whole;
    out.c = whole.c + static_cast<int64_t>(u.group) * kp.c_group_stride;
    if constexpr (Config::EPI == 1) store_tile_smem<false>(out, u, wg, acc, epi_stage);
    else store_tile(out, u, wg, acc);
  }
}

}  // namespace fly::gemm

using namespace fly::gemm;

// One thread per group: maps[2 g] = tm_p with its k extent set to group g's end, maps[2 g + 1] =
// tm_q likewise. An empty group's maps are never read; they get extent >= 1 all the same (a
// legal map whatever the offsets).
extern "C" __global__ void fly_grouped_gemm_k_maps(const __grid_constant__ GroupedKParams kp) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= kp.groups) return;
  int32_t kb, ke;
  grouped_k_range(kp.offs, g, kp.ktot, &kb, &ke);
  const int32_t extent = ke > 0 ? ke : 1;
  CUtensorMap* ma = kp.maps + 2 * g;
  CUtensorMap* mb = ma + 1;
  copy_map(ma, &kp.core.tm_p);
  copy_map(mb, &kp.core.tm_q);
  tensormap_set_k(ma, kp.core.p_kmajor != 0, extent);
  tensormap_set_k(mb, kp.core.q_kmajor != 0, extent);
  tensormap_release_gpu();
}

extern "C" __global__ void __launch_bounds__(kThreads, 1)
    fly_grouped_gemm_k_sm90(const __grid_constant__ GroupedKParams kp) {
  extern __shared__ uint8_t smem_raw[];
  const Ring ring = Ring::at(smem_raw);

  const int wg = fly::sm90::warp_uniform(threadIdx.x / 128);
  if (threadIdx.x == 0) ring.init_barriers(Config::STAGE_READERS);  // both consumer warpgroups
  __syncthreads();

  if (wg == 0) {
    Config::Regs::producer();
    if (threadIdx.x < 32 && fly::sm90::elect_one()) k_producer_loop(kp, ring);
    __syncwarp();
  } else {
    Config::Regs::consumer();
    const int cw = wg - 1;
    uint8_t* epi_stage = reinterpret_cast<uint8_t*>(ring.empty + Config::STAGES) + cw * Config::EPI_WG_BYTES;
    // Both operands MN-major (a M contiguous, b N contiguous): the launcher refuses the K-contiguous
    // orders (a group's end as a map's innermost extent faulted on the H200), so p_kmajor =
    // q_kmajor = 0 here.
    k_consumer_role<1, 1>(kp, ring, cw, epi_stage);
  }
}
