// SPDX-License-Identifier: Apache-2.0
// Weight-only MX decode GEMM for sm_90a: C[M, N] = A[M, K] * dequant(W[N, K])^T (+ bias), M <= 64,
// A and C BF16 or FP16, W MXFP8 (E4M3) or MXFP4 (packed E2M1) with E8M0 scales per 32 k
// (kernels/mx/mx_decode.h: parameters, plan, widenings; docs/mxfp.md "Weight-only decode").
//
// The BF16 decode kernel's structure (kernels/gemm/gemm_decode_sm90.cu): at decode sizes the GEMM
// is a stream of W, so W never touches shared memory. Each warp owns RPW rows of W and loads them
// straight from global memory into registers, DEPTH 64-wide k stages ahead; they are widened in
// registers to the mma.sync A operand (m16n8k16, W rows as the MMA's M, tokens as its N). The
// activations (read by every CTA) arrive through a TMA ring of 64-wide k stages filled by one
// thread; a cluster of CL CTAs (1..8) splits K and reduces through DSMEM in rank order
// (deterministic), each CTA summing an even share of the tile's (row, 4 columns) items.
//
// Scales, exactly: a lane (g = lane / 4, c = lane % 4) holds k [8c, 8c + 8) of every 32-k block of
// its rows g and g + 8 of each 16-row m tile: 8 bytes (MXFP8) or 4 bytes (MXFP4) per row and
// block, so each k16 mma adds the products of one block only. Per block the two mma accumulate
// into a zeroed fp32 scratch, and acc += scratch * 2^(e - 127) (one FFMA per accumulator per block,
// the row's multiplier decoded from its E8M0 byte with three integer operations): exact for every
// scale byte (0x00 = 2^-127, 0xFF = NaN), where multiplying the 16-bit weights by the scale would
// leave FP16's ~40 binades (and round away BF16's subnormals). The price is narrower loads (a
// quad reads one 32-byte sector per row for MXFP8, half of one for MXFP4) instead of one 16-byte
// load per lane, which would put two blocks into every k16 step.
//
// Widening (mx_decode.h, checked on the CPU over every input): MXFP8 by cvt.rn.f16x2.e4m3x2
// (exact), to BF16 through FP32 (exact); MXFP4 by a table in shared memory, one word per packed
// byte (its two elements as a 16-bit pair), replicated per lane so lookups never conflict, laid
// out so an address is one byte permute.
//
// Register layout of one k16 step s (0, 1) of block b, lane (g, c): the A slots {2c, 2c + 1} and
// {2c + 8, 2c + 9} take the lane's logical k (8c + 4s + {0, 1}, 8c + 4s + {2, 3}) (MXFP8: the
// two halves of byte word s; MXFP4: bytes 2s and 2s + 1 of its word); the B fragment takes the
// same activations from one 16-byte shared-memory read of activation row 8t + (g >> 1) + 4 (g & 1)
// (the original kernel's conflict-free row order): words x, y for step 0, z, w for step 1.
//
// The wide kernel (axis ld = wide, BF16 activations; docs/mxfp.md "Wide decode kernel"): 128-k
// stages in which lane c of a quad holds the whole 32-k block c of each of its rows, loaded with
// 16-byte loads (a quad reads 64 contiguous bytes of a row for MXFP4, 128 for MXFP8: 4x fewer
// L1 requests per byte than the quad-block layout above), its k16 steps taking 4 consecutive k of
// that block (A and B agree on the permutation). Each mma then mixes four blocks, so the block
// scale goes into the widened BF16 weights (mx_decode.h wide_mult16: exact for every MXFP4 byte
// and MXFP8's 3..134) and the accumulator needs no per-block promotion; an MXFP8 tile holding any
// other scale byte or an E4M3 NaN code is recomputed exactly on the CUDA cores.
//
// Variant constants (tools/flygen): FLY_ACT_IS_{BF16,FP16}, FLY_FMT_IS_{E4M3,E2M1}, FLY_NW
// (warps), FLY_RPW (W rows per warp: 16 or 32), FLY_MT (activation rows / 8: M <= 8 MT),
// FLY_DEPTH (k stages of W in flight per warp beyond the one in use), FLY_LD_IS_WIDE (the wide kernel).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/sm90.h"
#include "common/vec.cuh"
#include "gemm/gemm_reduce.cuh"
#include "gemm/gemm_ring.cuh"
#include "mx/mx_decode.h"
#include "mx/mx_device.cuh"

#if defined(FLY_ACT_IS_BF16)
using T = __nv_bfloat16;
#define FLY_MMA_TYPE "bf16"
constexpr bool kBf16 = true;
#elif defined(FLY_ACT_IS_FP16)
using T = __half;
#define FLY_MMA_TYPE "f16"
constexpr bool kBf16 = false;
#else
#error "mx_decode: FLY_ACT_IS_BF16 or FLY_ACT_IS_FP16 must be defined"
#endif
#if defined(FLY_LD_IS_WIDE) || defined(FLY_LD_IS_WIDE2)
#define FLY_MXD_WIDE 1
constexpr bool kWide = true;
static_assert(kBf16, "mx_decode wide: BF16 activations only (FP16's range cannot hold the prescaled weights)");
#else
constexpr bool kWide = false;
#endif
// Wide: 128-k sub-stages per stage (ld = wide2: two, loaded together, so a quad's two loads of a
// row cover twice the contiguous bytes: 128 (MXFP4) or 256 (MXFP8))
#if defined(FLY_LD_IS_WIDE2)
constexpr int NSUB = 2;
#else
constexpr int NSUB = 1;
#endif
// Whether the kernel checks its weights for the fast path's range and recomputes flagged tiles
// exactly (the wide kernel's MXFP8: mx_decode.h wide_e4m3_scale_ok; MXFP4 is exact for every byte).
constexpr bool kExactFallback = kWide && !kFp4;

namespace {

using fly::mxd::DecodeParams;
using fly::mxd::kStages;

constexpr int NW = FLY_NW;
constexpr int RPW = FLY_RPW;
constexpr int MT = FLY_MT;
constexpr int DEPTH = FLY_DEPTH;
constexpr int MI = RPW / 16;                 // 16-row m tiles per warp
constexpr int ROWS = NW * RPW;               // W rows per CTA
constexpr int ACT_ROWS = 8 * MT;             // activation rows in the ring (TMA zero-fills past M)
constexpr int KS = fly::mxd::stage_k(kWide, NSUB);  // k per stage
constexpr int BOX_BYTES = ACT_ROWS * 128;     // one 64-k TMA box of them, 128B-swizzled
constexpr int STAGE_BYTES = BOX_BYTES * (KS / 64);
constexpr int THREADS = fly::mxd::threads_per_cta(NW);
using PartialLayout = fly::gemm::PartialLayoutT<ACT_ROWS, ROWS>;
constexpr int REGION = fly::mxd::region_bytes(NW, RPW, MT, kWide, NSUB);
using ActRing = fly::gemm::StageRing<kStages, STAGE_BYTES, REGION>;
using RingPos = fly::gemm::RingPos<kStages>;
static_assert(REGION >= STAGE_BYTES * kStages && REGION >= ACT_ROWS * (ROWS + 4) * 4, "the ring and the partial tile");
static_assert(RPW == 16 || RPW == 32 || RPW == 64, "W rows per warp: 16, 32 or 64");
static_assert(MT == 1 || MT == 2 || MT == 4 || MT == 8, "activation tile: 8, 16, 32 or 64 rows");
static_assert(DEPTH >= 1 && DEPTH <= 12, "k stages in flight");
// the MXFP4 widening table in front, 64 KiB-aligned (up to 64 KiB of padding before it)
constexpr int LUT_SPAN = kFp4 ? 2 * fly::mxd::kLutSpan : 0;
static_assert(fly::mxd::smem_bytes(NW, RPW, MT, kFp4, kWide, NSUB) == LUT_SPAN + REGION + 2 * kStages * 8 + 1024, "host sizing");

// One 64-wide k stage of a lane's W rows in registers: [m tile][row g, g + 8][32-k block], the
// weight bytes and the E8M0 scale bytes.
#if defined(FLY_MXD_WIDE)
// Wide: per m tile and row (g, g + 8) the lane's 32-k block of each sub-stage: 16 bytes (MXFP4) or
// 32 (MXFP8), and its scale byte.
constexpr int kWPerSub = kFp4 ? 1 : 2;  // 16-byte words of a lane's block
struct WStage {
  uint4 w[MI][2][NSUB * kWPerSub];
  uint32_t s[MI][2][NSUB];
};
#else
struct WStage {
#if defined(FLY_FMT_IS_E2M1)
  uint32_t w[MI][2][2];
#else
  uint2 w[MI][2][2];
#endif
  uint32_t s[MI][2][2];
};
#endif

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." FLY_MMA_TYPE "." FLY_MMA_TYPE ".f32"
               " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two E4M3 bytes (the low or high half of w) -> the A operand pair (FP16, or BF16 through FP32).
__device__ __forceinline__ uint32_t widen_e4m3x2(uint32_t w, bool hi) {
  uint32_t h;
  const unsigned short v = static_cast<unsigned short>(hi ? w >> 16 : w & 0xFFFFu);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(v));
  if constexpr (!kBf16) {
    return h;
  } else {
    const __half2 hh = *reinterpret_cast<const __half2*>(&h);
    const float2 f = __half22float2(hh);
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);  // exact: E4M3 fits BF16
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}
// Byte b of an MXFP4 word -> the A operand pair (its two elements, exact), from this lane's copy of
// the table (mx_decode.h e2m1_lut_addr: one PRMT, one LDS).
__device__ __forceinline__ uint32_t widen_e2m1(uint32_t q, int b, uint32_t lane_base) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(fly::mxd::e2m1_lut_addr(q, b, lane_base)));
  return v;
}

// lds16 (16 bytes of the activation ring) and mul_bf16x2: mx_device.cuh.
using fly::mxk::lds16;
using fly::mxk::mul_bf16x2;

// Read-only loads as inline PTX, predicated (the value stays `v` when `on` is false): with __ldg
// inside stage branches ptxas kept the global memory descriptor in ordinary registers and moved it
// to uniform ones before every load (two R2UR per load, ~60 per stage); a predicate keeps the
// code straight.
// MXFP8: a quad reads one whole 32-byte sector per row and block, never again: no L1 allocation.
__device__ __forceinline__ void ld_w8(uint2& v, const uint8_t* p, bool on) {
  asm volatile("{ .reg .pred q; setp.ne.b32 q, %3, 0; @q ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2]; }"
               : "+r"(v.x), "+r"(v.y) : "l"(p), "r"(int(on)));
}
// MXFP4: a quad reads half a sector per row and block; the stage's other block is the other half,
// so these allocate in L1.
__device__ __forceinline__ void ld_w4(uint32_t& v, const uint8_t* p, bool on) {
  asm volatile("{ .reg .pred q; setp.ne.b32 q, %2, 0; @q ld.global.nc.u32 %0, [%1]; }" : "+r"(v) : "l"(p), "r"(int(on)));
}
// Wide: 16 bytes of one row (every sector is read by exactly one load, so no L1 allocation).
__device__ __forceinline__ void ld_w16(uint4& v, const uint8_t* p, bool on) {
  asm volatile("{ .reg .pred q; setp.ne.b32 q, %5, 0; @q ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4]; }"
               : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w) : "l"(p), "r"(int(on)));
}
__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }
__device__ __forceinline__ void ld_s8(uint32_t& v, const uint8_t* p, bool on) {
  asm volatile("{ .reg .pred q; setp.ne.b32 q, %2, 0; @q ld.global.nc.u8 %0, [%1]; }" : "+r"(v) : "l"(p), "r"(int(on)));
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, 1) fly_mx_decode_sm90(const __grid_constant__ DecodeParams p) {
  extern __shared__ uint8_t smem_raw[];
  // MXFP4: the widening table first, at the first 64 KiB boundary of the shared window, then the ring
  [[maybe_unused]] uint32_t lut_lane = 0;  // the table's shared address | 4 * lane
  uint8_t* after_lut = smem_raw;
  if constexpr (kFp4) {
    const uint32_t s0 = uint32_t(__cvta_generic_to_shared(smem_raw));
    const uint32_t lut_s = (s0 + uint32_t(fly::mxd::kLutSpan - 1)) & ~uint32_t(fly::mxd::kLutSpan - 1);
    uint8_t* lut = smem_raw + (lut_s - s0);
    // entry e (a packed byte) of lane l at byte 256 e + 4 l
    for (int w = int(threadIdx.x); w < fly::mxd::kLutWords; w += THREADS)
      *reinterpret_cast<uint32_t*>(lut + (w >> 5) * 256 + (w & 31) * 4) = fly::mxd::e2m1_lut_entry(uint32_t(w) >> 5, kBf16);
    lut_lane = lut_s | (uint32_t(threadIdx.x % 32) << 2);
    after_lut = lut + fly::mxd::kLutSpan;
  }
  const ActRing ring = ActRing::at_as<ActRing>(after_lut);

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int rank = p.cl > 1 ? int(fly::sm90::cluster_ctarank()) : 0;
  const int tile = int(blockIdx.x) / p.cl;
  const int row0 = tile * ROWS;
  const int ksts = (p.K + KS - 1) / KS;  // k stages of the whole K
  const int nblk = p.K / 32;            // 32-k MX blocks (K % 32 == 0)
  const int kst0 = rank * p.kst_per_cta;
  const int nks = max(0, min(ksts, kst0 + p.kst_per_cta) - kst0);

  if (threadIdx.x == 0) ring.init_barriers(NW);  // empty: one arrival per warp
  __syncthreads();

  [[maybe_unused]] uint32_t bad = 0;  // wide MXFP8: a scale byte or code the fast path cannot take exactly
  float acc[MI][MT][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][t][e] = 0.f;

  // The ring: lane 0 of warp 0 fills it (the BF16 decode kernel's scheme: the first kStages stages,
  // then at iteration it >= 1 the slot of stage it - 1, freed by every warp, with stage
  // it - 1 + kStages).
  const bool issuer = warp == 0 && lane == 0;
  RingPos fill;
  auto issue = [&](int i) {
    uint64_t* fb = ring.acquire(fill, STAGE_BYTES);
#pragma unroll
    for (int b = 0; b < KS / 64; ++b)  // the wide kernel's 128-k sub-stages: two 64-k boxes each
      fly::sm90::tma_load_2d(ring.stage_ptr(fill.stage) + b * BOX_BYTES, &p.tm_a, fb, (kst0 + i) * KS + 64 * b, 0);
    fill.advance();
  };
  if (issuer) {
    fly::sm90::tma_prefetch_desc(&p.tm_a);
    for (int i = 0; i < min(nks, kStages); ++i) issue(i);
  }
  {
    const int g = lane >> 2, c = lane & 3;
#if defined(FLY_MXD_WIDE)
    // Per lane and row (m tile i, half h): the row's weight and scale pointers at the CTA's first
    // stage, at this lane's block (c) of it. Rows past N read row N - 1 (never stored).
    constexpr int kSub = kFp4 ? 64 : 128;  // weight bytes of one 128-k sub-stage of a row
    constexpr int kSB = NSUB * kSub;       // ... of a stage
    constexpr int kLB = kSub / 4;          // ... of one lane's 32-k block
    const uint8_t* wrow[MI][2];
    const uint8_t* srow[MI][2];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = min(row0 + warp * RPW + i * 16 + g + 8 * h, p.N - 1);
        wrow[i][h] = p.w + int64_t(n) * p.ldw + int64_t(kst0) * kSB + kLB * c;
        srow[i][h] = p.sw + int64_t(n) * nblk + 4 * NSUB * kst0 + c;
      }
    // stages of this CTA in which this lane's block of sub-stage q is inside K (block
    // 4 (NSUB st + q) + c < nblk)
    int nks_lane[NSUB];
#pragma unroll
    for (int q = 0; q < NSUB; ++q) nks_lane[q] = max(0, min(nks, ((nblk - c - 4 * q + 3) / 4 + NSUB - 1) / NSUB - kst0));
    // Stage `it` into b (as the quad-block kernel's load_w): a lane whose block lies past K keeps
    // its registers (zeros and scale 127 at first, else this row's weights and scale of an earlier
    // stage, which widen to finite values, or NaN in a row already NaN, or were flagged), and they
    // meet the zero-filled activations there.
    auto load_w = [&](WStage& b, const uint8_t* const (&wg)[MI][2], const uint8_t* const (&sg)[MI][2], int jo, int it) {
#pragma unroll
      for (int q = 0; q < NSUB; ++q) {
        const bool on = it < nks_lane[q];
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int u = 0; u < kWPerSub; ++u)
              ld_w16(b.w[i][h][q * kWPerSub + u], wg[i][h] + jo * kSB + q * kSub + 16 * u, on);
            ld_s8(b.s[i][h][q], sg[i][h] + 4 * NSUB * jo + 4 * q, on);
          }
      }
    };
    // Lane (g, c)'s B fragment of k16 step 2j + s: activation row 8t + g, k 32c + 8j + 4s + {0..3}
    // of the stage: box c / 2, 16-byte chunk 4 (c % 2) + j, at chunk ^ (row % 8) under the 128-byte
    // swizzle (lanes c and c + 2 share banks: a two-way conflict on 4 MT loads a stage).
    const uint32_t b_lane = uint32_t((c >> 1) * BOX_BYTES + g * 128);
    const uint32_t b_chunk = uint32_t(4 * (c & 1)) ^ uint32_t(g);
    auto compute = [&](const WStage& b, const uint8_t* st) {
#pragma unroll
     for (int sub = 0; sub < NSUB; ++sub) {
      const uint32_t st_s = uint32_t(__cvta_generic_to_shared(st)) + uint32_t(sub * 2 * BOX_BYTES) + b_lane;
      uint32_t mul[MI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mul[i][h] = fly::mxd::wide_mult16(b.s[i][h][sub], kFp4) * 0x10001u;
          if constexpr (kExactFallback) {
            bad |= fly::mxd::wide_e4m3_scale_ok(b.s[i][h][sub]) ? 0u : 1u;
#pragma unroll
            for (int q = 0; q < kWPerSub; ++q) {  // an E4M3 NaN code (x111 1111) in any byte
              const uint4 w = b.w[i][h][sub * kWPerSub + q];
              bad |= (((w.x & 0x7F7F7F7Fu) + 0x01010101u) | ((w.y & 0x7F7F7F7Fu) + 0x01010101u) |
                      ((w.z & 0x7F7F7F7Fu) + 0x01010101u) | ((w.w & 0x7F7F7F7Fu) + 0x01010101u)) & 0x80808080u;
            }
          }
        }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint4 x[MT];
#pragma unroll
        for (int t = 0; t < MT; ++t) x[t] = lds16(st_s + uint32_t(t * 8 * 128) + ((b_chunk ^ uint32_t(j)) << 4));
#pragma unroll
        for (int i = 0; i < MI; ++i) {
          uint32_t a[2][4];
#pragma unroll
          for (int s2 = 0; s2 < 2; ++s2) {
#if defined(FLY_FMT_IS_E2M1)
            const uint32_t q0 = word_of(b.w[i][0][sub], j), q1 = word_of(b.w[i][1][sub], j);
            a[s2][0] = mul_bf16x2(widen_e2m1(q0, 2 * s2, lut_lane), mul[i][0]);
            a[s2][1] = mul_bf16x2(widen_e2m1(q1, 2 * s2, lut_lane), mul[i][1]);
            a[s2][2] = mul_bf16x2(widen_e2m1(q0, 2 * s2 + 1, lut_lane), mul[i][0]);
            a[s2][3] = mul_bf16x2(widen_e2m1(q1, 2 * s2 + 1, lut_lane), mul[i][1]);
#else
            const uint32_t w0 = word_of(b.w[i][0][sub * kWPerSub + (j >> 1)], 2 * (j & 1) + s2),
                           w1 = word_of(b.w[i][1][sub * kWPerSub + (j >> 1)], 2 * (j & 1) + s2);
            a[s2][0] = mul_bf16x2(fly::mxd::e4m3x2_place_bf16(w0, false), mul[i][0]);
            a[s2][1] = mul_bf16x2(fly::mxd::e4m3x2_place_bf16(w1, false), mul[i][1]);
            a[s2][2] = mul_bf16x2(fly::mxd::e4m3x2_place_bf16(w0, true), mul[i][0]);
            a[s2][3] = mul_bf16x2(fly::mxd::e4m3x2_place_bf16(w1, true), mul[i][1]);
#endif
          }
#pragma unroll
          for (int t = 0; t < MT; ++t) {
            mma16816(acc[i][t], a[0][0], a[0][1], a[0][2], a[0][3], x[t].x, x[t].y);
            mma16816(acc[i][t], a[1][0], a[1][1], a[1][2], a[1][3], x[t].z, x[t].w);
          }
        }
      }
     }
    };
#else
    // Per lane and row (m tile i, half h): the row's weight and scale pointers at the CTA's first
    // stage. Rows past N read row N - 1 instead (their partial sums are never stored), so no load
    // depends on the row.
    constexpr int kSB = kFp4 ? 32 : 64;  // weight bytes of one 64-k stage of a row
    constexpr int kBB = kSB / 2;         // ... of one 32-k block
    const uint8_t* wrow[MI][2];
    const uint8_t* srow[MI][2];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = min(row0 + warp * RPW + i * 16 + g + 8 * h, p.N - 1);
        wrow[i][h] = p.w + int64_t(n) * p.ldw + int64_t(kst0) * kSB + (kFp4 ? 4 : 8) * c;
        srow[i][h] = p.sw + int64_t(n) * nblk + 2 * kst0;
      }
    // stages of this CTA whose two blocks are both inside K
    const int nks_full = max(0, min(nks, nblk / 2 - kst0));
    // Stage `it` of the CTA's range into b, from the row pointers advanced to the current group of
    // DEPTH + 1 stages (`jo`: the stage's place from there, a compile-time constant, so every
    // address is a pointer plus an immediate). Block 0 loads when it < nks, block 1 when the stage
    // is whole (it < nks_full); otherwise the registers keep what they held: a look-ahead past the
    // range is never computed, and a last stage reaching past K (K % 64 == 32) multiplies its
    // block 1 by the zero-filled activations there, so the stale values (zeros at first, else this
    // row's earlier weights and scale: finite, or NaN in a row whose output is NaN anyway) add 0.
    auto load_w = [&](WStage& b, const uint8_t* const (&wg)[MI][2], const uint8_t* const (&sg)[MI][2], int jo, int it) {
      const bool on0 = it < nks, on1 = it < nks_full;
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int kb = 0; kb < 2; ++kb) {
            const uint8_t* src = wg[i][h] + jo * kSB + kb * kBB;
            const bool on = kb ? on1 : on0;
#if defined(FLY_FMT_IS_E2M1)
            ld_w4(b.w[i][h][kb], src, on);
#else
            ld_w8(b.w[i][h][kb], src, on);
#endif
            ld_s8(b.s[i][h][kb], sg[i][h] + 2 * jo + kb, on);
          }
    };
    auto compute = [&](const WStage& b, const uint8_t* st) {
      const uint32_t st_s = uint32_t(__cvta_generic_to_shared(st));
#pragma unroll
      for (int kb = 0; kb < 2; ++kb) {
        // the A operand of both k16 steps of this block, per m tile: [i][step][a0..a3]
        uint32_t a[MI][2][4];
        float mul[MI][2];
#pragma unroll
        for (int i = 0; i < MI; ++i) {
#pragma unroll
          for (int h = 0; h < 2; ++h) mul[i][h] = __uint_as_float(fly::mxd::e8m0_mult_bits(b.s[i][h][kb]));
#pragma unroll
          for (int s = 0; s < 2; ++s) {
#if defined(FLY_FMT_IS_E2M1)
            const uint32_t q0 = b.w[i][0][kb], q1 = b.w[i][1][kb];
            a[i][s][0] = widen_e2m1(q0, 2 * s, lut_lane);
            a[i][s][1] = widen_e2m1(q1, 2 * s, lut_lane);
            a[i][s][2] = widen_e2m1(q0, 2 * s + 1, lut_lane);
            a[i][s][3] = widen_e2m1(q1, 2 * s + 1, lut_lane);
#else
            const uint32_t w0 = s ? b.w[i][0][kb].y : b.w[i][0][kb].x;
            const uint32_t w1 = s ? b.w[i][1][kb].y : b.w[i][1][kb].x;
            a[i][s][0] = widen_e4m3x2(w0, false);
            a[i][s][1] = widen_e4m3x2(w1, false);
            a[i][s][2] = widen_e4m3x2(w0, true);
            a[i][s][3] = widen_e4m3x2(w1, true);
#endif
          }
        }
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          const int m = 8 * t + (g >> 1) + 4 * (g & 1);
          const uint4 x = lds16(st_s + uint32_t(m * 128 + (((kb * 4 + c) ^ (m & 7)) << 4)));
          const uint32_t bf[2][2] = {{x.x, x.y}, {x.z, x.w}};
#pragma unroll
          for (int i = 0; i < MI; ++i) {
            float tmp[4] = {0.f, 0.f, 0.f, 0.f};
            mma16816(tmp, a[i][0][0], a[i][0][1], a[i][0][2], a[i][0][3], bf[0][0], bf[0][1]);
            mma16816(tmp, a[i][1][0], a[i][1][1], a[i][1][2], a[i][1][3], bf[1][0], bf[1][1]);
            acc[i][t][0] = fmaf(tmp[0], mul[i][0], acc[i][t][0]);
            acc[i][t][1] = fmaf(tmp[1], mul[i][0], acc[i][t][1]);
            acc[i][t][2] = fmaf(tmp[2], mul[i][1], acc[i][t][2]);
            acc[i][t][3] = fmaf(tmp[3], mul[i][1], acc[i][t][3]);
          }
        }
      }
    };
#endif
    // W stages rotate through DEPTH + 1 register buffers; the loop is unrolled by DEPTH + 1 so
    // every buffer index is a compile-time constant.
    WStage buf[DEPTH + 1];
#pragma unroll
    for (int j = 0; j <= DEPTH; ++j)  // defined contents for the stale-register rule of load_w
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#if defined(FLY_MXD_WIDE)
#pragma unroll
          for (int q = 0; q < NSUB * kWPerSub; ++q) buf[j].w[i][h][q] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
          for (int q = 0; q < NSUB; ++q) buf[j].s[i][h][q] = 127u;
#else
#pragma unroll
          for (int kb = 0; kb < 2; ++kb) {
#if defined(FLY_FMT_IS_E2M1)
            buf[j].w[i][h][kb] = 0u;
#else
            buf[j].w[i][h][kb] = make_uint2(0u, 0u);
#endif
            buf[j].s[i][h][kb] = 127u;
          }
#endif
        }
    RingPos pos;
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) load_w(buf[j], wrow, srow, j, j);
    for (int it0 = 0; it0 < nks; it0 += DEPTH + 1) {
      const uint8_t* wg[MI][2];
      const uint8_t* sg[MI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          wg[i][h] = wrow[i][h] + it0 * kSB;
          sg[i][h] = srow[i][h] + (KS / 32) * it0;
        }
#pragma unroll
      for (int j = 0; j <= DEPTH; ++j) {
        const int it = it0 + j;
        if (it < nks) {
          load_w(buf[(j + DEPTH) % (DEPTH + 1)], wg, sg, j + DEPTH, it + DEPTH);
          if (issuer && it >= 1 && it - 1 + kStages < nks) issue(it - 1 + kStages);
          __syncwarp();  // warp 0 reconverges before its mma.sync
          ring.wait_full(pos);
          __syncwarp();
          compute(buf[j], ring.stage_ptr(pos.stage));
          __syncwarp();
          if (lane == 0) ring.release_local(pos.stage);
          pos.advance();
        }
      }
    }
  }

  // Every warp has finished reading the ring (and waited for every TMA issued into it): the
  // ring's memory now holds the fp32 partial tile, C's [ACT_ROWS][ROWS] block.
  bool redo = false;  // some lane met a byte outside the fast path's exact range
  if constexpr (kExactFallback) redo = __syncthreads_or(int(bad != 0)) != 0;
  else __syncthreads();
  float* part = reinterpret_cast<float*>(ring.base);
  const PartialLayout L{false};
  if (!redo) {
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const int n = warp * RPW + i * 16 + g;  // W row (C column)
#if defined(FLY_MXD_WIDE)
        // B column g is activation row 8t + g; the prescale's 2^-pre undone (exact)
        constexpr float kPost = float(1 << (kFp4 ? fly::mxd::kPreE2M1 : fly::mxd::kPreE4M3));
        const int m = 8 * t + 2 * c;
        part[L.index(m, n)] = acc[i][t][0] * kPost;
        part[L.index(m + 1, n)] = acc[i][t][1] * kPost;
        part[L.index(m, n + 8)] = acc[i][t][2] * kPost;
        part[L.index(m + 1, n + 8)] = acc[i][t][3] * kPost;
#else
        const int m = 8 * t + c;  // A row (C row): the conflict-free row order
        part[L.index(m, n)] = acc[i][t][0];
        part[L.index(m + 4, n)] = acc[i][t][1];
        part[L.index(m, n + 8)] = acc[i][t][2];
        part[L.index(m + 4, n + 8)] = acc[i][t][3];
#endif
      }
  }
#if defined(FLY_MXD_WIDE)
  else if constexpr (kExactFallback) {
    // The exact path for this CTA's k range: per (C row, W row) item, FP32 dot products of each
    // 32-k block, each multiplied by its scale 2^(e - 127) once (the quad-block kernel's
    // arithmetic, on the CUDA cores). Only tiles holding an MXFP8 scale byte outside 3..134 or an
    // E4M3 NaN code get here.
    const __nv_bfloat16* a = static_cast<const __nv_bfloat16*>(p.a);
    const int b_begin = 4 * NSUB * kst0, b_end = min(nblk, 4 * NSUB * (kst0 + nks));
    for (int e = int(threadIdx.x); e < ACT_ROWS * ROWS; e += THREADS) {
      const int m = e / ROWS, nl = e % ROWS, n = row0 + nl;
      float sum = 0.f;
      if (m < p.M && n < p.N) {
        const __nv_bfloat16* arow = a + int64_t(m) * p.lda;
        const uint8_t* wr = p.w + int64_t(n) * p.ldw;
        for (int blk = b_begin; blk < b_end; ++blk) {
          float dot = 0.f;
          for (int k = 32 * blk; k < 32 * blk + 32; k += 2) {
            const uint32_t pair = kFp4 ? fly::mxd::e2m1_lut_entry(wr[k / 2], true)  // BF16 pairs, exact
                                       : widen_e4m3x2(uint32_t(wr[k]) | (uint32_t(wr[k + 1]) << 8), false);
            dot = fmaf(__bfloat162float(arow[k]), __uint_as_float(pair << 16), dot);
            dot = fmaf(__bfloat162float(arow[k + 1]), __uint_as_float(pair & 0xFFFF0000u), dot);
          }
          sum = fmaf(dot, __uint_as_float(fly::mxd::e8m0_mult_bits(p.sw[int64_t(n) * nblk + blk])), sum);
        }
      }
      part[L.index(m, nl)] = sum;
    }
  }
#endif
  if (p.cl > 1) fly::sm90::cluster_sync();
  else __syncthreads();

  // The cluster's reduction: the tile's present C rows (min(M, 8 mt)) x its columns in groups of 4,
  // split evenly over the cluster's CTAs by item (the dense decode kernel's reduce_partials_t splits
  // by row, so at M = 1 one CTA summed all of them), each item the sum of the CTAs' partials in
  // rank order (deterministic; the remote reads unrolled so their latencies overlap), + bias,
  // rounded to C (8-byte stores where C allows).
  {
    const T* bias = static_cast<const T*>(p.bias);
    T* cp = static_cast<T*>(p.c);
    const bool vec = (reinterpret_cast<uintptr_t>(p.c) & 7) == 0 && p.ldc % 4 == 0;
    constexpr int kInner4 = ROWS / 4;
    const int count = min(p.M, ACT_ROWS) * kInner4;
    const int i_begin = rank * count / p.cl, i_end = (rank + 1) * count / p.cl;
    const uint32_t base = fly::sm90::smem_u32(part);
    for (int e = i_begin + int(threadIdx.x); e < i_end; e += THREADS) {
      const int m = e / kInner4, n4 = (e % kInner4) * 4, ccol = row0 + n4;
      if (ccol >= p.N) continue;
      const uint32_t off = uint32_t(m * (ROWS + 4) + n4) * 4;
      float4 v[8];
#pragma unroll
      for (int r = 0; r < 8; ++r)
        if (r < p.cl) v[r] = fly::sm90::ld_cluster_f4(fly::sm90::mapa(base + off, uint32_t(r)));
      float sum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int r = 0; r < 8; ++r)
        if (r < p.cl) {
          sum[0] += v[r].x;
          sum[1] += v[r].y;
          sum[2] += v[r].z;
          sum[3] += v[r].w;
        }
      T* dst = cp + int64_t(m) * p.ldc + ccol;
      if (vec && ccol + 3 < p.N) {
        T h[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) h[q] = fly::from_float<T>(sum[q] + (bias ? fly::to_float(bias[ccol + q]) : 0.f));
        *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(h);
      } else {
        for (int q = 0; q < 4 && ccol + q < p.N; ++q)
          dst[q] = fly::from_float<T>(sum[q] + (bias ? fly::to_float(bias[ccol + q]) : 0.f));
      }
    }
  }
  if (p.cl > 1) fly::sm90::cluster_sync();
}
