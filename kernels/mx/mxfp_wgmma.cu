// SPDX-License-Identifier: Apache-2.0
// MX block-scaled GEMM on FP8 wgmma (MXFP8 / MXFP4, NT), second design (docs/mxfp.md "wgmma path"):
//   C[M,N] = sum over k32 blocks kb of sa[m,kb] * sb[n,kb] * (A[m, 32kb..+32] . B[n, 32kb..+32]) (+ bias[n])
//
// Persistent, warp-specialized: warpgroup 0 produces, warpgroups 1 and 2 consume (64 rows of the
// 128 x BN CTA tile each). A ring of STAGES stages, each four k32 blocks (128 k elements):
// - producer: waits for the stage to be empty; one thread TMA-loads the A and B tiles (MXFP8:
//   straight into the 128B-swizzled E4M3 tiles; MXFP4: the packed bytes into a raw buffer); all
//   128 threads decode the stage's E8M0 scales (2^(b-127), 0x00 = 2^-127, 0xFF = NaN:
//   mxe::e8m0_to_float) into float tiles; MXFP4 then widens the raw bytes to E4M3 in the swizzled
//   layout (exact), fences the generic writes for the async proxy, and every thread arrives on
//   the stage's full barrier (MXFP8: 128 arrivals + the TMA thread's expect_tx arrival).
// - consumers, per k32 block: one wgmma m64nBNk32 E4M3 x E4M3 (both K-major) into a scratch
//   accumulator (scale-d = 0), wait, then acc = fma(tmp, sa[row] * sb[col], acc): the two FP32
//   operations per accumulator per k32 of the issue. The two consumer warpgroups run
//   independently, so one's promotion overlaps the other's wgmma. A block product sa * sb is
//   formed in FP32 exactly as the mma.sync kernel (mxfp_gemm.cu) and the CPU emulation form it.
//   k32 blocks past K are skipped (their scales are never read: a NaN scale there must not leak).
// - epilogue straight from the accumulators: + bias, FP16/BF16 rounding, row/column tails
//   clipped, 4-byte paired stores where the pair is inside N and aligned.
// k128 fold (FLY_FOLD = 1, MXFP4 only): when every row of a stage's A and B tiles has its four k32
// scales within kFoldMaxShift binades (and none is NaN), the producer folds them into the data
// (E2M1 * 2^(e_j - e_max) is exact in E4M3) and the consumers run the stage's four wgmma into one
// scratch accumulator and promote once with 2^e_max(row) * 2^e_max(col): a quarter of the
// promotion work. Otherwise (or for MXFP8) the stage runs per k32 as above. Decided per stage for
// the whole CTA (a reduction over the producer warpgroup: named barrier 1).
// Variant constants (tools/flygen): FLY_BN (32, 64 or 128; 32: twice the CTAs of 64 for the
// decode shapes, whose B stream is the whole cost), FLY_FOLD (0 or 1), FLY_PIPE (1, 2), FLY_SPLIT
// (2, 4, 8: split-K, at most that many k ranges per tile, docs/mxfp.md "Split-K").
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/convert.cuh"
#include "common/pipeline.cuh"
#if !defined(FLY_MX_HOST_EMU)
#include "common/sm90.h"
#include "common/wgmma_ops.h"
#else
// test/cpu/test_mx_wgmma_emu.cpp runs this file on host threads: it defines fly::sm90 (mbarriers,
// TMA, wgmma emulated from their PTX ISA definitions), the shared memory and the producer AND.
uint8_t* fly_mxw_emu_smem();
bool fly_mxw_emu_and128(bool v);
#endif
#include "mx/mx_encode.h"
#include "mx/mx_store.cuh"
#include "mx/mx_unpack.h"
#include "mx/mx_wgmma_params.h"

namespace {

using namespace fly::mxw;
namespace sm90 = fly::sm90;
using Regs = fly::RegSplit<2, kProducerRegs, kConsumerRegs>;  // mx_wgmma_params.h

constexpr int BN = FLY_BN;
#if defined(FLY_FOLD)
constexpr bool FOLD = FLY_FOLD != 0;
#else
constexpr bool FOLD = false;
#endif
#if defined(FLY_PIPE)
constexpr bool PIPE = FLY_PIPE != 0;      // 1, 2: two scratch accumulator sets in the consumers
constexpr bool PREFETCH = FLY_PIPE >= 2;  // 2: the producer prefetches the scales a chunk ahead
#else
constexpr bool PIPE = false;
constexpr bool PREFETCH = false;
#endif
#if defined(FLY_SPLIT) && FLY_SPLIT > 1
constexpr bool SPLIT = true;  // split-K: work units (tile, k range), FP32 partials, mxfp_splitk_reduce
using KParams = SplitParams;
#else
constexpr bool SPLIT = false;
using KParams = Params;
#endif
constexpr int STAGES = stages(BN);
constexpr int STAGE = stage_bytes(BN, FOLD);
constexpr int OFF_B = a_bytes();
constexpr int OFF_SA = OFF_B + b_bytes(BN);
constexpr int OFF_SB = OFF_SA + sa_bytes();
constexpr int OFF_RAW = OFF_SB + sb_bytes(BN);
constexpr int OFF_FSC = OFF_RAW + raw_bytes(BN);        // fold: float [kBM + BN] folded scales
constexpr int OFF_FSH = OFF_FSC + (kBM + BN) * 4;       // fold: uint32 [kBM + BN] k32 shifts (bytes)
constexpr int OFF_FLAG = OFF_FSH + (kBM + BN) * 4;      // fold: uint32, 1 when the stage is folded
constexpr int ACC = BN / 2;  // accumulators per consumer thread (m64nBN: BN/2 floats)
static_assert(BN == 32 || BN == 64 || BN == 128, "BN: 32, 64 or 128 (two accumulator sets of BN/2 registers)");
static_assert(OFF_B % 1024 == 0 && OFF_SA % 1024 == 0 && OFF_RAW % 1024 == 0 && STAGE % 1024 == 0,
              "stage parts keep the 1024-byte swizzle-atom alignment");
static_assert(smem_bytes(BN, FOLD, PREFETCH) <= 232448, "ring fits the 227 KiB of dynamic shared memory");
constexpr int kRowsPerThread = (kBM + BN + 127) / 128;  // tile rows (A then B) of one producer thread
static_assert(!FOLD || OFF_FLAG + 4 <= STAGE, "fold area inside the stage");
using Mma = sm90::WgmmaF8<BN, sm90::F8::kE4m3, sm90::F8::kE4m3>;
static_assert(Mma::kRegs == ACC, "accumulator count");

// AND of v over the 128 producer threads (bar.red on named barrier 1; only they use it).
__device__ __forceinline__ bool producer_and(bool v) {
#if defined(FLY_MX_HOST_EMU)
  return fly_mxw_emu_and128(v);
#else
  uint32_t r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.and.pred q, 1, 128, p;\n selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"(uint32_t(v))
      : "memory");
  return r != 0;
#endif
}

__device__ __forceinline__ uint64_t desc_of(const uint8_t* tile) {
  return sm90::make_desc_sw128(sm90::smem_u32(tile), 16, 1024);
}

using fly::from_float;  // common/convert.cuh
using fly::to_float;

// One k32 block's promotion: acc += tmp * sa[row] * sb[col] with the block's decoded scales
// (sa_j: the block's [kBM] row scales, sb_j: its [BN] column scales in shared memory).
__device__ __forceinline__ void promote(float (&acc)[ACC], const float (&tmp)[ACC], const float* sa_j, const float* sb_j,
                                        int ra, int ct) {
  const float sa0 = sa_j[ra], sa1 = sa_j[ra + 8];
#pragma unroll
  for (int c8 = 0; c8 < BN / 8; ++c8) {
    const float2 sbv = *reinterpret_cast<const float2*>(&sb_j[acc_col(ct, 4 * c8)]);
    acc[4 * c8 + 0] = fmaf(tmp[4 * c8 + 0], sa0 * sbv.x, acc[4 * c8 + 0]);
    acc[4 * c8 + 1] = fmaf(tmp[4 * c8 + 1], sa0 * sbv.y, acc[4 * c8 + 1]);
    acc[4 * c8 + 2] = fmaf(tmp[4 * c8 + 2], sa1 * sbv.x, acc[4 * c8 + 2]);
    acc[4 * c8 + 3] = fmaf(tmp[4 * c8 + 3], sa1 * sbv.y, acc[4 * c8 + 3]);
  }
}

// The wgmma of k32 block j of the stage into tmp (scale-d = 0: it overwrites), committed as its own group.
__device__ __forceinline__ void issue_block(float (&tmp)[ACC], uint64_t da, uint64_t db, int j) {
  sm90::wgmma_fence();
  Mma::mma(tmp, da + 2 * j, db + 2 * j, 0);  // +32 bytes of the 128-byte row per k32
  sm90::wgmma_commit();
}

__device__ __forceinline__ void fence_tmp(float (&tmp)[ACC]) {
#pragma unroll
  for (int i = 0; i < ACC; ++i) sm90::reg_fence(tmp[i]);
}

template <class T>
__device__ __forceinline__ void store_tile(const Params& p, int64_t row0, int64_t col0, int ct, const float (&acc)[ACC]) {
  store_acc_tile<BN, T>(p, row0, col0, ct, acc);
}

// Split-K: the unit's FP32 partial to ws[q][M][N] (mx_store.cuh).
__device__ __forceinline__ void store_partial(const KParams& p, int q, int64_t row0, int64_t col0, int ct,
                                              const float (&acc)[ACC]) {
#if defined(FLY_SPLIT) && FLY_SPLIT > 1
  store_partial_tile<BN>(p, q, row0, col0, ct, acc);
#else
  (void)p, (void)q, (void)row0, (void)col0, (void)ct, (void)acc;
#endif
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1) mxfp_wgmma(const __grid_constant__ KParams p) {
#if defined(FLY_MX_HOST_EMU)
  uint8_t* smem_raw = fly_mxw_emu_smem();
#else
  extern __shared__ uint8_t smem_raw[];
#endif
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + STAGES * STAGE);
  uint64_t* empty = full + STAGES;
  uint64_t* raw_full = empty + STAGES;
  uint32_t* scale_buf = reinterpret_cast<uint32_t*>(raw_full + STAGES);  // PREFETCH: [kBM + BN][kScaleChunk]

  const int wg = threadIdx.x / 128;
  const bool fp4 = p.fp4 != 0;
  if (threadIdx.x == 0) {
    sm90::tma_prefetch_desc(&p.tm_a);
    sm90::tma_prefetch_desc(&p.tm_b);
    for (int s = 0; s < STAGES; ++s) {
      sm90::mbar_init(&full[s], fp4 ? 128 : 129);
      sm90::mbar_init(&empty[s], 256);
      sm90::mbar_init(&raw_full[s], 1);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();

  const int total = p.tiles_m * p.tiles_n;
  const int kbs = p.K / 32;
  const int ksteps = (p.K + kKStep - 1) / kKStep;
  const int units = total * splits_of(p);

  if (wg == 0) {
    // ---------------- producer warpgroup ----------------
    Regs::producer();
    const int pt = threadIdx.x;
    int s = 0;
    uint32_t ph = 0;
    // PREFETCH: with 4-byte aligned scale rows (K a multiple of 128 and aligned scale tensors),
    // the thread's rows' scale words of chunk c + 1 (stages 4c + 4 .. 4c + 7) are loaded into
    // registers while chunk c runs, and land in scale_buf at the chunk's start: the loads' latency
    // is spread over four stages instead of stalling each stage. Otherwise each stage loads its
    // bytes when it needs them.
    const bool prefetch = PREFETCH && ((reinterpret_cast<uintptr_t>(p.sa) | reinterpret_cast<uintptr_t>(p.sb) |
                                        uintptr_t(kbs)) & 3u) == 0;
    uint32_t next[kRowsPerThread][kScaleChunk];
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const Unit un = unit_of(p, u, ksteps);
      const Tile tl = tile_of(p.tiles_m, p.tiles_n, p.strip_m, un.t);
      const int m0 = tl.tm * kBM, n0 = tl.tn * BN;
      // Scale word of stage ks (its four k32 blocks' bytes, low byte first) for the thread's row i.
      auto load_word = [&](int i, int ks) -> uint32_t {
        const int r = pt + 128 * i;
        if (r >= kBM + BN || ks >= (SPLIT ? un.ks1 : ksteps)) return 0u;
        const bool is_a = r < kBM;
        const int64_t grow = int64_t(is_a ? m0 : n0) + (is_a ? r : r - kBM);
        if (grow >= (is_a ? p.M : p.N)) return 0u;
        return *reinterpret_cast<const uint32_t*>((is_a ? p.sa : p.sb) + grow * kbs + ks * 4);
      };
      auto issue_chunk = [&](int c) {
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
          for (int q = 0; q < kScaleChunk; ++q) next[i][q] = load_word(i, (SPLIT ? un.ks0 : 0) + c * kScaleChunk + q);
      };
      auto land_chunk = [&]() {
#pragma unroll
        for (int i = 0; i < kRowsPerThread; ++i)
          if (pt + 128 * i < kBM + BN)
#pragma unroll
            for (int q = 0; q < kScaleChunk; ++q) scale_buf[(pt + 128 * i) * kScaleChunk + q] = next[i][q];
      };
      if (prefetch) {
        issue_chunk(0);
        land_chunk();
        issue_chunk(1);
      }
#if defined(FLY_SPLIT) && FLY_SPLIT > 1
      for (int ks = un.ks0; ks < un.ks1; ++ks) {
        const int kl = ks - un.ks0;  // stage of the unit
#else
      for (int ks = 0; ks < ksteps; ++ks) {  // unsplit: the tile's stages (the shipped code, unchanged)
        const int kl = ks;
#endif
        if (prefetch && kl > 0 && kl % kScaleChunk == 0) {
          land_chunk();  // chunk kl / 4, loaded during the previous chunk
          issue_chunk(kl / kScaleChunk + 1);
        }
        sm90::mbar_wait(&empty[s], ph ^ 1);
        uint8_t* st = ring + s * STAGE;
        if (pt == 0) {
          if (fp4) {
            sm90::mbar_arrive_expect_tx(&raw_full[s], uint32_t(raw_bytes(BN)));
            sm90::tma_load_2d(st + OFF_RAW, &p.tm_a, &raw_full[s], ks * (kKStep / 2), m0);
            sm90::tma_load_2d(st + OFF_RAW + kBM * 64, &p.tm_b, &raw_full[s], ks * (kKStep / 2), n0);
          } else {
            sm90::mbar_arrive_expect_tx(&full[s], uint32_t(a_bytes() + b_bytes(BN)));
            sm90::tma_load_2d(st, &p.tm_a, &full[s], ks * kKStep, m0);
            sm90::tma_load_2d(st + OFF_B, &p.tm_b, &full[s], ks * kKStep, n0);
          }
        }
        // the stage's scales, decoded: sa[j][r], sb[j][c] (rows past M / N and blocks past K: 0)
        float* sa_s = reinterpret_cast<float*>(st + OFF_SA);
        float* sb_s = reinterpret_cast<float*>(st + OFF_SB);
        const int kb0 = ks * 4;
        bool fold_ok = true;  // this thread's rows allow the fold
        for (int r = pt; r < kBM + BN; r += 128) {
          const bool is_a = r < kBM;
          const int rr = is_a ? r : r - kBM;
          const int64_t grow = int64_t(is_a ? m0 : n0) + rr;
          const bool in = grow < (is_a ? p.M : p.N);
          const uint8_t* src = (is_a ? p.sa : p.sb) + grow * kbs;
          float* dst = is_a ? sa_s : sb_s;
          const int ld = is_a ? kBM : BN;
          uint8_t e[4];
          bool valid[4];
          int emax = 0;
          const uint32_t word = prefetch ? scale_buf[r * kScaleChunk + kl % kScaleChunk] : 0u;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            valid[j] = in && kb0 + j < kbs;
            e[j] = !valid[j] ? uint8_t(0) : prefetch ? uint8_t(word >> (8 * j)) : src[kb0 + j];
            dst[j * ld + rr] = valid[j] ? fly::mxe::e8m0_to_float(e[j]) : 0.0f;
            emax = e[j] > emax ? e[j] : emax;
          }
          if (FOLD && fp4) {
            uint32_t sh = 0;
            bool ok = emax != 0xFF;  // a NaN scale: per k32 (the NaN must reach its block only)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const int d = valid[j] ? emax - e[j] : 0;
              ok = ok && d <= kFoldMaxShift;
              sh |= uint32_t(d & 0xFF) << (8 * j);
            }
            fold_ok = fold_ok && ok;
            reinterpret_cast<float*>(st + OFF_FSC)[r] = in ? fly::mxe::e8m0_to_float(uint8_t(emax)) : 0.0f;
            reinterpret_cast<uint32_t*>(st + OFF_FSH)[r] = sh;
          }
        }
        // uniform over the producer warpgroup; the barrier also orders the fold arrays' writes
        // before the other producer threads read them below
        const bool fold = FOLD && fp4 && producer_and(fold_ok);
        if (FOLD && pt == 0) *reinterpret_cast<uint32_t*>(st + OFF_FLAG) = fold ? 1u : 0u;
        if (fp4) {
          sm90::mbar_wait(&raw_full[s], ph);
          const uint8_t* raw = st + OFF_RAW;
          for (int idx = pt; idx < (kBM + BN) * 8; idx += 128) {
            const uint32_t r = uint32_t(idx) / 8, ch = uint32_t(idx) % 8;
            const uint2 v = *reinterpret_cast<const uint2*>(raw + r * 64 + ch * 8);
            uint32_t lo = fly::mxu::kMagLo, hi = fly::mxu::kMagHi;
            if (fold) {  // chunk ch holds k elements 16 ch .. +16: k32 block ch / 2
              const uint32_t d = (reinterpret_cast<const uint32_t*>(st + OFF_FSH)[r] >> (8 * (ch / 2))) & 0xFFu;
              fly::mxu::e2m1_table_shifted(d, &lo, &hi);
            }
            uint32_t o[4];
            fly::mxu::e2m1x16_to_e4m3x16(v.x, v.y, o, lo, hi);
            *reinterpret_cast<uint4*>(st + fly::mxu::sw128_offset(r, ch * 16)) = make_uint4(o[0], o[1], o[2], o[3]);
          }
          sm90::fence_proxy_async_smem();  // the widened tiles are read by wgmma (async proxy)
        }
        sm90::mbar_arrive(&full[s]);
        if (++s == STAGES) {
          s = 0;
          ph ^= 1;
        }
      }
    }
  } else {
    // ---------------- consumer warpgroups ----------------
    Regs::consumer();
    const int cw = wg - 1;            // 64-row half of the tile
    const int ct = threadIdx.x - 128 * wg;
    const int ra = cw * 64 + acc_row(ct, 0);  // tile row of accumulators 4 c8 + {0, 1}; + 8 for {2, 3}
    int s = 0;
    uint32_t ph = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const Unit un = unit_of(p, u, ksteps);
      const Tile tl = tile_of(p.tiles_m, p.tiles_n, p.strip_m, un.t);
      float acc[ACC];
#pragma unroll
      for (int i = 0; i < ACC; ++i) acc[i] = 0.0f;
      for (int ks = un.ks0; ks < un.ks1; ++ks) {
        sm90::mbar_wait(&full[s], ph);
        const uint8_t* st = ring + s * STAGE;
        const float* sa_s = reinterpret_cast<const float*>(st + OFF_SA);
        const float* sb_s = reinterpret_cast<const float*>(st + OFF_SB);
        const uint64_t da = desc_of(st + cw * 64 * 128), db = desc_of(st + OFF_B);
        const int left = kbs - ks * 4;
        const int jmax = left < 4 ? left : 4;
        const bool fold = FOLD && *reinterpret_cast<const uint32_t*>(st + OFF_FLAG) != 0u;
        float tmp[ACC];  // the scratch accumulator (one set for both paths)
        if (fold) {
          // the stage's k32 blocks into one scratch accumulator, one promotion with the folded scales
          sm90::wgmma_fence();
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (j < jmax) Mma::mma(tmp, da + 2 * j, db + 2 * j, j > 0 ? 1 : 0);
          sm90::wgmma_commit();
          sm90::wgmma_wait<0>();
#pragma unroll
          for (int i = 0; i < ACC; ++i) sm90::reg_fence(tmp[i]);
          const float* fsc = reinterpret_cast<const float*>(st + OFF_FSC);
          const float sa0 = fsc[ra], sa1 = fsc[ra + 8];
#pragma unroll
          for (int c8 = 0; c8 < BN / 8; ++c8) {  // promote() with the folded scales, kept apart: the
            // fold variants' code stays as it was validated on the H200 (bit-identical cubins)
            const float2 sbv = *reinterpret_cast<const float2*>(&fsc[kBM + acc_col(ct, 4 * c8)]);
            acc[4 * c8 + 0] = fmaf(tmp[4 * c8 + 0], sa0 * sbv.x, acc[4 * c8 + 0]);
            acc[4 * c8 + 1] = fmaf(tmp[4 * c8 + 1], sa0 * sbv.y, acc[4 * c8 + 1]);
            acc[4 * c8 + 2] = fmaf(tmp[4 * c8 + 2], sa1 * sbv.x, acc[4 * c8 + 2]);
            acc[4 * c8 + 3] = fmaf(tmp[4 * c8 + 3], sa1 * sbv.y, acc[4 * c8 + 3]);
          }
        }
        if constexpr (PIPE) {
          if (!fold && jmax == 4) {
            // Two scratch sets: block j + 1's wgmma runs while block j is promoted (wait_group 1
            // leaves the newer group in flight), so the tensor core works through 3 of the 4
            // promotions. Straight-line, and only for whole stages: ptxas serializes the wgmma
            // (C7514) when some path it cannot rule out leaves a group in flight past the stage.
            float tmp2[ACC];
            issue_block(tmp, da, db, 0);
            issue_block(tmp2, da, db, 1);
            sm90::wgmma_wait<1>();
            fence_tmp(tmp);
            promote(acc, tmp, sa_s, sb_s, ra, ct);
            issue_block(tmp, da, db, 2);
            sm90::wgmma_wait<1>();
            fence_tmp(tmp2);
            promote(acc, tmp2, sa_s + kBM, sb_s + BN, ra, ct);
            issue_block(tmp2, da, db, 3);
            sm90::wgmma_wait<1>();
            fence_tmp(tmp);
            promote(acc, tmp, sa_s + 2 * kBM, sb_s + 2 * BN, ra, ct);
            sm90::wgmma_wait<0>();
            fence_tmp(tmp2);
            promote(acc, tmp2, sa_s + 3 * kBM, sb_s + 3 * BN, ra, ct);
          } else if (!fold) {  // a partial last stage: one set
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if (j < jmax) {
                issue_block(tmp, da, db, j);
                sm90::wgmma_wait<0>();
                fence_tmp(tmp);
                promote(acc, tmp, sa_s + j * kBM, sb_s + j * BN, ra, ct);
              }
            }
          }
        } else {
          // One set: each block's wgmma waited on before its promotion (written out rather than
          // through issue_block / promote: these variants keep the code validated on the H200,
          // bit-identical cubins).
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (!fold && j < jmax) {
              sm90::wgmma_fence();
              Mma::mma(tmp, da + 2 * j, db + 2 * j, 0);  // +32 bytes of the 128-byte row per k32
              sm90::wgmma_commit();
              sm90::wgmma_wait<0>();
#pragma unroll
              for (int i = 0; i < ACC; ++i) sm90::reg_fence(tmp[i]);
              const float sa0 = sa_s[j * kBM + ra], sa1 = sa_s[j * kBM + ra + 8];
#pragma unroll
              for (int c8 = 0; c8 < BN / 8; ++c8) {
                const float2 sbv = *reinterpret_cast<const float2*>(&sb_s[j * BN + acc_col(ct, 4 * c8)]);
                acc[4 * c8 + 0] = fmaf(tmp[4 * c8 + 0], sa0 * sbv.x, acc[4 * c8 + 0]);
                acc[4 * c8 + 1] = fmaf(tmp[4 * c8 + 1], sa0 * sbv.y, acc[4 * c8 + 1]);
                acc[4 * c8 + 2] = fmaf(tmp[4 * c8 + 2], sa1 * sbv.x, acc[4 * c8 + 2]);
                acc[4 * c8 + 3] = fmaf(tmp[4 * c8 + 3], sa1 * sbv.y, acc[4 * c8 + 3]);
              }
            }
          }
        }
        sm90::mbar_arrive(&empty[s]);  // this thread's wgmma reads and scale reads are done
        if (++s == STAGES) {
          s = 0;
          ph ^= 1;
        }
      }
      const int64_t row0 = int64_t(tl.tm) * kBM + cw * 64, col0 = int64_t(tl.tn) * BN;
      if (SPLIT && splits_of(p) > 1) store_partial(p, un.q, row0, col0, ct, acc);
      else if (p.out_bf16) store_tile<__nv_bfloat16>(p, row0, col0, ct, acc);
      else store_tile<__half>(p, row0, col0, ct, acc);
    }
  }
}
