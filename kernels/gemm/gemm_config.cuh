// SPDX-License-Identifier: Apache-2.0
// Compile-time configuration of one sm_90a GEMM variant, from the FLY_* macros tools/flygen
// writes (see tuning/gemm.json). Standalone compiles get the defaults below.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/pipeline.cuh"
#include "gemm/gemm_legal.h"
#include "gemm/gemm_operand.h"
#include "gemm/gemm_params.h"

#ifndef FLY_BN
#define FLY_BN 256
#endif
#ifndef FLY_STAGES
#define FLY_STAGES 4
#endif
#ifndef FLY_MC
#define FLY_MC 1
#endif
#ifndef FLY_EPI
#define FLY_EPI 0
#endif
#ifndef FLY_BM
#define FLY_BM 128
#endif
#ifndef FLY_MP
#define FLY_MP 1
#endif
#ifndef FLY_PP
#define FLY_PP 0
#endif
#ifndef FLY_KB
#define FLY_KB 1
#endif
#ifndef FLY_KW
#define FLY_KW 1
#endif

namespace fly::gemm {

// The operands' dtype: one of the operand traits (gemm_operand.h). A variant of a dtype with no
// traits is a compile error; only a standalone compile (no FLY_VARIANT_NAME) defaults to BF16.
#if defined(FLY_DTYPE_IS_FP16)
constexpr Dtype kDtype = Dtype::kFp16;
#elif defined(FLY_DTYPE_IS_BF16) || !defined(FLY_VARIANT_NAME)
constexpr Dtype kDtype = Dtype::kBf16;
#else
#error "gemm: this variant's dtype has no operand traits in kernels/gemm/gemm_operand.h"
#endif
using Traits = OperandTraits<kDtype>;

// The device element type of a dtype (the dense kernels' A, B and C).
template <Dtype D>
struct DeviceElem;
template <>
struct DeviceElem<Dtype::kFp16> {
  using type = __half;
};
template <>
struct DeviceElem<Dtype::kBf16> {
  using type = __nv_bfloat16;
};
using Elem = typename DeviceElem<kDtype>::type;
static_assert(sizeof(Elem) == Traits::kBytes && sizeof(Elem) == kCBytes, "element size");
constexpr bool kBF16 = kDtype == Dtype::kBf16;

// Named barrier ids (bar.sync / bar.arrive; 0 is __syncthreads), in one place so no two uses
// share one by accident.
namespace named_bar {
constexpr int kConsumers = 1;      // both consumer warpgroups (256 threads)
constexpr int kWarpgroup = 2;      // + consumer index: one consumer warpgroup (128 threads)
constexpr int kPingPongTurn = 4;   // + consumer index: the ping-pong turn (256 threads)
}  // namespace named_bar
__device__ __forceinline__ void consumers_sync() { named_bar_sync<named_bar::kConsumers, 256>(); }
// The same barrier without .aligned: legal when the lanes of a warp arrive apart. The KW = 2
// hand-over (kw_exchange) uses it: under compute-sanitizer synccheck, the aligned form there was
// reported as reached by divergent threads (gemm_bf16_bm64_bn128_st4_sw0_mc1_mp2_kb2_kw2).
__device__ __forceinline__ void consumers_sync_unaligned() { named_bar_sync_unaligned<named_bar::kConsumers, 256>(); }
__device__ __forceinline__ void warpgroup_sync(int wg) { named_bar_sync<128>(named_bar::kWarpgroup + wg); }

// Register split between the producer warpgroup and the two consumer warpgroups (setmaxnreg),
// by tile shape. 128-row tiles: 40 / 232. Narrow tiles (small accumulators): 56 / 224; at 40 the
// producer of the kb = 4 and the P-multicast kb = 2 tiles spilled 20 bytes (ptxas caps the code
// after setmaxnreg.dec at the new count). KW = 2 tiles with a multicast cluster and kb = 2
// spilled 36-56 bytes in the producer at 56 (ptxas), none at 72; their consumers need far fewer
// than 208.
struct RegisterSplit {
  int producer, consumer;
};
constexpr RegisterSplit register_split(int bm, int kw) {
  return bm == 64 ? (kw == 2 ? RegisterSplit{72, 208} : RegisterSplit{56, 224}) : RegisterSplit{40, 232};
}
// The cp.async kernel (gemm_odd_sm90.cu): its loading warpgroup computes addresses for many
// copies in flight (ptxas spilled its code at 72-96 registers, not at 104); 192 leave the
// consumers of 128 x 128 tiles (64 accumulators) room, not those of 128 x 256, hence bn = 128 only
// (tuning/gemm.json).
constexpr RegisterSplit kOddRegisterSplit{104, 192};

// Inner-loop (MMA) policies: what one ring stage adds to the accumulators. Dense: wgmma over the
// stage's k slices straight into one accumulator set. A block-scaled policy (MXFP) needs a second
// set to promote per k block (kAccSets = 2), which the config budgets for below.
struct DenseMma {
  static constexpr int kAccSets = 1;
  static constexpr int kScaleBytes = 0;  // scale tiles per stage (block-scaled policies)
};

struct Config {
  // BM = 128: the 2 consumer warpgroups take 64 rows each (wgmma M is 64) of a BM x BN tile.
  // BM = 64 (narrow decode tiles, as cuBLAS runs small-M shapes): both take the same 64 rows and
  // split the tile's BN columns, WG_N = BN / 2 each; no split-K, no staged epilogue.
  static constexpr int BM = FLY_BM;
  static constexpr int BN = FLY_BN;
  // KW = 2 (narrow tiles only): the consumer warpgroups split the k steps instead of the columns.
  // Each takes every other ring stage with the whole 64 x BN tile (wgmma N = BN), and the two
  // partial tiles are summed through shared memory before the epilogue (gemm_epilogue.cuh
  // kw_exchange), each warpgroup storing half of the columns. Each P slice is then read from
  // shared memory once instead of twice.
  // It is no faster than the same tile with KW = 1 at M = 64 and 25-60% slower at M = 128 on the
  // H200 (bench/RESULTS.md, "warpgroups splitting K (`_kw2`)"), and stays in the space because an
  // MN-major Q then needs only BN = 64 (whole 64-wide chunks per wgmma) and the tuner picks it for
  // some keys.
  static constexpr int KW = FLY_KW;
  static constexpr int WG_N = BM == 64 && KW == 1 ? BN / 2 : BN;  // Q columns of each consumer warpgroup
  // BN = 320 (cuBLAS's 320 x 128 tile on the largest shapes: 25% more output per k block than
  // 128 x 256 for 17% more operand bytes): each warpgroup issues two wgmma n160 per k16 slice, whose
  // accumulators lie one after the other (the same column order as one n320 would have).
  static constexpr int MMA_N = WG_N > 256 ? WG_N / 2 : WG_N;  // wgmma N
  static constexpr int NQ = WG_N / MMA_N;                      // wgmmas per warpgroup and k16 slice
  // PP = 1 (ping-pong): each consumer warpgroup takes whole 128 x BN tiles (both 64-row halves of
  // P, MH = 2), the two alternating over the CTA's tiles: one runs its mainloop while the other
  // stores its previous tile. Persistent, no split-K, no multicast, direct-store epilogue.
  static constexpr bool PP = FLY_PP != 0;
  static constexpr int MH = PP ? 2 : 1;  // 64-row halves of P each consumer warpgroup multiplies
  static constexpr int BK = k_block_elems<kDtype>();  // one 128-byte row: exactly one 128B swizzle span
  static_assert(BK == kBK, "the dense kernel's host planning counts k in 64-element blocks");
  using MmaPolicy = DenseMma;
  static constexpr int ACC_SETS = MmaPolicy::kAccSets;
  // KB = 2 or 4: each ring stage holds KB k blocks of P and of Q, each operand brought by one TMA
  // instruction (a 3-D box when K-major, a box of 64 KB k rows when MN-major). On the H200 a TMA
  // stream of decode weights ran 15-35% faster with one box per 2 k blocks than with one per k
  // block (bench/probes/gemm/gemm_tma_stream.cu, bench/RESULTS.md): the per-box cost, not the bytes,
  // limits it.
  // With P multicast (MP = 2) the cluster splits each stage's P k blocks instead of its rows: CTA
  // rank r loads k block r of the stage, all BM rows, into both CTAs (one 2-D box each).
  static constexpr int KB = FLY_KB;
  static constexpr int KSTEP = KB * BK;  // k extent of one stage
  static constexpr int STAGES = FLY_STAGES;
  // MC = 2: clusters of 2 CTAs on vertically adjacent tiles (same Q columns); each CTA loads half
  // of the Q tile and multicasts it to both, halving L2->SM traffic for Q. Persistent mode only.
  // Narrow tiles too: cuBLAS runs 128 x 6144 x 4096 as 64 x 96 tiles whose two 64-row halves of M
  // share the weight tile this way (bench/logs/cublas-kernels.txt).
  static constexpr int MC = FLY_MC;
  // MP = 2: clusters of 2 CTAs on horizontally adjacent tiles (same P rows); each loads half of
  // the P tile's rows and multicasts it to both. Narrow tiles: cuBLAS's layout on 64 x 4096 x 4096;
  // 128-row tiles: cuBLAS's on 512 x 4096 x 4096 and 128 x 14336 x 4096 (112-wide Q tiles), where
  // every CTA reads the same activations.
  static constexpr int MP = FLY_MP;
  static constexpr int CLUSTER = MC * MP;  // CTAs that write into each other's rings
  // One ring stage: KB k blocks of the P tile, of the Q tile, then the policy's scale tiles
  // (none for Dense). The producer's full barrier expects all of it (STAGE_TX_BYTES).
  static constexpr int P_KB_BYTES = BM * kRowBytes;  // one k block of the P tile
  static constexpr int Q_KB_BYTES = BN * kRowBytes;
  static constexpr int P_BYTES = KB * P_KB_BYTES;
  static constexpr int Q_BYTES = KB * Q_KB_BYTES;
  static constexpr int SCALE_BYTES = MmaPolicy::kScaleBytes;
  static constexpr int STAGE_BYTES = P_BYTES + Q_BYTES + SCALE_BYTES;
  static constexpr int STAGE_TX_BYTES = STAGE_BYTES;  // OOB zero-fill bytes count too
  static constexpr int RING_BYTES = STAGES * STAGE_BYTES;
  // EPI = 1: the persistent path stages each tile in shared memory and writes C with coalesced
  // 16-byte stores; 0: stores straight from the accumulators. EPI = 2: each warp stages its 16 rows in
  // 16 x 64 boxes (stmatrix) and stores them with TMA, asynchronously, so it goes on to its next
  // tile while C is written (gemm_epilogue.cuh store_tile_tma); two boxes per warp, in turn.
  // EPI = 3: the same with one box per 64 columns, the warp's whole row band staged at once.
  static constexpr int EPI = FLY_EPI;
  static constexpr int EPI_WG_BYTES = epi_wg_bytes(BN, EPI);
  static constexpr int SMEM_BYTES = smem_bytes(BN, STAGES, EPI, BM, KB, KW);
  static constexpr int ACC = MH * WG_N / 2;  // fp32 accumulators per consumer thread (MH x 64 x WG_N / 128)
  static constexpr int STAGE_READERS = PP || KW == 2 ? 1 : 2;  // consumer warpgroups that read each stage
  static constexpr int PRODUCER_REGS = register_split(BM, KW).producer;
  static constexpr int CONSUMER_REGS = register_split(BM, KW).consumer;
  using Regs = RegSplit<2, PRODUCER_REGS, CONSUMER_REGS>;  // common/pipeline.cuh; checks the register file

  // Legality: each rule once, in gemm_legal.h (the launcher and a CPU test use the same ones).
  static constexpr TileShape SHAPE{BM, BN, STAGES, KB, KW, MC, MP, EPI, PP ? 1 : 0};
  static_assert(legal::bm(SHAPE), "tile rows: 128 (two 64-row halves) or 64 (shared rows)");
  // wgmma N (BN, or BN / 2 for narrow tiles) is any multiple of 8 from 8 to 256; common/wgmma_ops.h
  // instantiates the ones tuning/gemm.json uses. BN that is not a multiple of 64 (48, 96, 112: tile
  // counts that fill the 132 SMs on decode shapes) needs a K-major Q: an MN-major Q tile is loaded
  // in 64-wide chunks (gemm_plan.h layout_fits refuses the rest).
  static_assert(legal::bn(SHAPE), "tile N: a multiple of 16 in 32..256, or 320 (128-row tiles, one k block per stage)");
  static_assert(legal::epi_staged(SHAPE), "staged epilogue: bn >= 64 (epi_wg_bytes), passes of 64 columns above 128");
  static_assert(legal::narrow(SHAPE), "narrow tiles: no staged epilogue, BN <= 128");
  static_assert(legal::epi_tma(SHAPE), "TMA-store epilogue: 128-row tiles, passes of 64 columns");
  static_assert(legal::multicast(SHAPE), "multicast: clusters of 2 CTAs, of one operand");
  // KW = 2 with an even ring: stage s always belongs to warpgroup s % 2, so each full barrier has
  // one reader and its parity test is never a whole phase behind (with an odd ring a warpgroup
  // could test a stage whose previous fill, the other warpgroup's, has not landed yet).
  static_assert(legal::kw(SHAPE), "k split over the warpgroups: narrow tiles, an even number of stages");
  static_assert(legal::pp(SHAPE), "ping-pong: 128-row tiles, no multicast, direct stores, BN <= 128 (2 x BN/2 accumulators)");
  // With KB = 2 a multicast cluster of 2 (P or Q) splits each stage's two k blocks: CTA rank r
  // brings k block r of the shared operand, all its rows, into both (gemm_mainloop.cuh load_tile).
  static_assert(legal::kb(SHAPE), "2 or 4 k blocks per stage; multicast with 2 only; Q multicast with 2 on narrow tiles only");
  static_assert(legal::stages(SHAPE), "pipeline depth");
  static_assert(legal::smem(SHAPE) && SMEM_BYTES <= 227 * 1024, "shared memory per block on sm_90");
  static_assert(legal::atoms(SHAPE) && P_BYTES % 1024 == 0 && Q_BYTES % 1024 == 0, "128B-swizzle atoms are 1024 B");
  // Split-K partials (fp32, padded rows) reuse the ring after the mainloop.
  static_assert(legal::partials(SHAPE), "split-K partial tile must fit in the stage ring");
  static_assert(ACC * ACC_SETS + 32 <= CONSUMER_REGS, "the accumulator sets fit the consumers' registers");
  static_assert(SCALE_BYTES == 0 || SCALE_BYTES % 128 == 0, "scale tiles keep the next stage 128-byte aligned");
  // smem_bytes (host) sizes the ring from the same P and Q rows.
  static_assert(SCALE_BYTES != 0 || STAGE_BYTES == KB * (BM + BN) * kRowBytes, "ring layout as smem_bytes has it");
};

}  // namespace fly::gemm
