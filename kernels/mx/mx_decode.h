// SPDX-License-Identifier: Apache-2.0
// Weight-only MX decode GEMM (kernels/mx/mx_decode.cu, docs/mxfp.md "Weight-only decode"):
// C[M, N] = A[M, K] * dequant(W[N, K])^T (+ bias), A and C BF16 or FP16, W MXFP8 (E4M3) or MXFP4
// (E2M1, two per byte) with one E8M0 scale per 32 k of a row, M <= 64.
//
// This header is shared by the kernel, the launcher (src/ops/mx.cpp) and the CPU tests: the
// parameters, the launch plan (host), and the exact register widenings (host and device: the CPU
// tests run them over every input).
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define FLY_MXD_HD __host__ __device__ __forceinline__
#else
#define FLY_MXD_HD inline
#endif

#if !defined(__CUDACC_RTC__)
#include <cuda.h>  // CUtensorMap
#endif

namespace fly::mxd {

struct DecodeParams {
  CUtensorMap tm_a;    // A [M, K] (16-bit): dims {K, M}, box {64, 8 mt}, 128-byte swizzle
  const void* a;       // A itself (the wide kernel's exact fallback reads it directly), rows lda elements apart
  const uint8_t* w;    // W [N, K] E4M3 bytes or [N, K/2] packed E2M1, rows ldw bytes apart (16-aligned)
  const uint8_t* sw;   // scales [N, K/32] E8M0, contiguous (rows K/32 bytes apart)
  void* c;             // C [M, N], rows ldc elements apart, A's dtype
  const void* bias;    // bias [N] in C's dtype, or nullptr
  int64_t ldw, ldc, lda;
  int32_t M, N, K;
  int32_t kst_per_cta;  // k stages (64 wide, the wide kernel's 128) per CTA of a cluster (the cluster splits K)
  int32_t cl;           // CTAs per cluster (== the launch's cluster size)
};

constexpr int kStages = 8;  // activation ring depth (k stages)
// k per stage: 64 for the quad-block kernel, 128 for the wide one (ld = wide: one 32-k block per
// lane and row a stage, 16-byte weight loads; docs/mxfp.md "Wide decode kernel").
// ld = wide2: two 128-k sub-stages a stage (nsub = 2).
inline constexpr int stage_k(bool wide, int nsub = 1) { return wide ? 128 * nsub : 64; }

inline constexpr int rows_per_cta(int nw, int rpw) { return nw * rpw; }
inline constexpr int threads_per_cta(int nw) { return nw * 32; }
inline constexpr int imax(int a, int b) { return a > b ? a : b; }
// Dynamic shared memory: (MXFP4: the widening table,) 1 KiB alignment slack, then the activation ring (reused after the main
// loop for the fp32 partial tile, C's [8 mt][rows] block with rows padded by 4 floats, as
// gemm_reduce.cuh lays it out), then the ring's barriers.
inline constexpr int region_bytes(int nw, int rpw, int mt, bool wide = false, int nsub = 1) {
  return imax(kStages * mt * 8 * 2 * stage_k(wide, nsub), mt * 8 * (rows_per_cta(nw, rpw) + 4) * 4);
}
// MXFP4 variants add the widening table (kLutSpan, below) in front, 64 KiB-aligned in the shared
// window (so a lookup's address is one PRMT): up to 64 KiB of padding before it.
inline constexpr int smem_bytes(int nw, int rpw, int mt, bool fp4, bool wide = false, int nsub = 1) {
  return region_bytes(nw, rpw, mt, wide, nsub) + 2 * kStages * 8 + 1024 + (fp4 ? 2 * 256 * 256 : 0);
}

struct Shape {
  int nw = 8;    // warps
  int rpw = 32;  // W rows per warp (16 or 32)
  int mt = 2;    // activation rows / 8 (M <= 8 mt)
  int cl = 0;    // cluster size (K split); 0: choose_cluster
  bool fp4 = false;  // MXFP4 weights (the widening table in shared memory)
  bool wide = false;  // the wide kernel (128-k stages)
  int nsub = 1;       // its 128-k sub-stages a stage (ld = wide2: 2)
};

// The cluster size when the variant does not force one: of 1..8 (any size: N = 6144 at 256 rows
// a CTA is 24 tiles, 5 CTAs each fill 120 of 132 SMs where 4 fill 96), the one that puts the most
// CTAs on the SMs in one wave (one CTA per SM: each holds ~255 registers a thread) while every
// CTA keeps at least 4 stages of K; the smaller on a tie.
inline int choose_cluster(int64_t tiles, int64_t stages, int sm_count) {
  int best = 1;
  for (int cl = 2; cl <= 8; ++cl)
    if (tiles * cl <= int64_t(sm_count) && stages >= 4 * cl && tiles * cl > tiles * best) best = cl;
  return best;
}

struct Launch {
  unsigned grid, cluster, threads, smem;
  int32_t kst_per_cta, cl;
};
// Grid and cluster of one call (the launcher fills the rest of DecodeParams).
inline Launch plan(int64_t N, int64_t K, const Shape& v, int sm_count) {
  Launch L{};
  const int rows = rows_per_cta(v.nw, v.rpw);
  const int64_t tiles = (N + rows - 1) / rows;
  const int64_t stages = (K + stage_k(v.wide, v.nsub) - 1) / stage_k(v.wide, v.nsub);
  int cl = v.cl > 0 ? v.cl : choose_cluster(tiles, stages, sm_count);
  if (cl > stages) cl = int(stages);
  const int64_t per = (stages + cl - 1) / cl;
  cl = int((stages + per - 1) / per);  // no CTA without k stages
  L.kst_per_cta = int32_t(per);
  L.cl = cl;
  L.grid = unsigned(tiles * cl);
  L.cluster = unsigned(cl);
  L.threads = unsigned(threads_per_cta(v.nw));
  L.smem = unsigned(smem_bytes(v.nw, v.rpw, v.mt, v.fp4, v.wide, v.nsub));
  return L;
}

// ---- exact widening (a lane's weight words -> mma.sync A-operand pairs) ------------------------
//
// The k16 steps of a lane never mix MX blocks: lane c (of a quad) holds k [8c, 8c + 8) of each
// 32-k block of its two rows (MXFP8: 8 bytes, MXFP4: 4 bytes), so each mma adds products of one
// block only and the block scale is applied once per block to the fp32 partial (exact for every
// E8M0 byte, unlike scaling the 16-bit weights: FP16 holds only ~40 binades).

// E8M0 byte -> the FP32 block multiplier 2^(b - 127): b * 2^23 (+ 2^14 (b + 1), which reaches bit
// 22 only for b = 255, the NaN quiet bit), masked to the exponent and bit 22, then at least 2^-127
// (0x00400000, the FP32 subnormal that b = 0 means). Three integer operations, exact for all 256.
FLY_MXD_HD uint32_t e8m0_mult_bits(uint32_t b) {
  const uint32_t v = (b * 0x804000u + 0x4000u) & 0x7FC00000u;
  return v > 0x00400000u ? v : 0x00400000u;
}

// MXFP4 (packed E2M1, element 2i in the low nibble of byte i) -> A-operand pairs by table: one
// shared-memory word per packed byte holds its two elements as an FP16 or BF16 pair (exact: every
// E2M1 value is a normal 16-bit float). Entry e of lane l sits at byte 256 e + 4 l of a 64 KiB-
// aligned table: a warp's 32 lookups hit 32 banks whatever the bytes, and the address of byte b of
// a word q is one byte permute (q's byte b into bits 8..15 of the lane's base), so a pair costs a
// PRMT and an LDS. (Half of each 256-byte row is unused: 32 KiB of the 64.) Bit placement instead
// (e1 e0 m into the exponent's low bits) needs four integer operations per pair plus, for BF16, a
// multiply: E2M1's subnormal 0.5 lands on a 16-bit subnormal.
constexpr int kLutWords = 256 * 32;     // entries x lanes
constexpr int kLutSpan = 256 * 256;     // bytes the table spans (and its alignment)
// The 16-bit pattern of one E2M1 code (low 4 bits of `code`).
FLY_MXD_HD uint32_t e2m1_bits16(uint32_t code, bool bf16) {
  // magnitude code e1 e0 m: 0 and 0.5 (e = 0), else 2^(e - 1) (1 + m / 2)
  const uint32_t c = code & 7u, e = c >> 1, m = c & 1u;
  const uint32_t mag = c == 0 ? 0u
                       : c == 1 ? (bf16 ? 0x3F00u : 0x3800u)
                                : (bf16 ? ((126u + e) << 7) | (m << 6) : ((14u + e) << 10) | (m << 9));
  return mag | ((code & 8u) << 12);
}
// The table word of packed byte `byte`: element 0 (low nibble) in the low half.
FLY_MXD_HD uint32_t e2m1_lut_entry(uint32_t byte, bool bf16) {
  return e2m1_bits16(byte & 15u, bf16) | (e2m1_bits16((byte >> 4) & 15u, bf16) << 16);
}
// Shared address of byte b (0..3) of word q in the table, for a lane whose `lane_base` is the
// table's (64 KiB-aligned) address | 4 * lane: lane_base + 256 * byte, as one byte permute (bytes
// 0, 2, 3 from lane_base, byte 1 from q's byte b).
FLY_MXD_HD uint32_t e2m1_lut_addr(uint32_t q, int b, uint32_t lane_base) {
  const uint32_t sel = 0x7604u | (uint32_t(b) << 4);
#if defined(__CUDA_ARCH__)
  return __byte_perm(q, lane_base, sel);
#else
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t k = (sel >> (4 * i)) & 7u;
    r |= ((k < 4 ? q >> (8 * k) : lane_base >> (8 * (k - 4))) & 0xFFu) << (8 * i);
  }
  return r;
#endif
}
// The FP16 value (host) of a 16-bit pattern, for the tests.
inline double f16_bits_value(uint32_t h) {
  const int s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? m / 1024.0 * (1.0 / 16384.0) : (1.0 + m / 1024.0) * double(int64_t(1) << (e > 15 ? e - 15 : 0)) /
                                                        double(int64_t(1) << (e < 15 ? 15 - e : 0));
  if (e == 31) v = m ? __builtin_nan("") : __builtin_inf();
  return s ? -v : v;
}
inline double bf16_bits_value(uint32_t h) {
  const uint32_t f = (h & 0xFFFFu) << 16;
  float x;
  __builtin_memcpy(&x, &f, 4);
  return double(x);
}

// ---- the wide kernel's prescaled widening (BF16 activations) --------------------------------
//
// A lane holds one whole 32-k block of each of its rows per stage, so every k16 mma mixes four
// blocks and the scale must be in the 16-bit weights: each widened pair is multiplied (one
// mul.rn.bf16x2) by 2^(e - 127 - pre), and the accumulator by 2^pre at the end (exact: a power of
// two). BF16 keeps FP32's exponent range and its subnormals, so:
// - MXFP4 (table values 0.5 .. 6, pre = 2): every product q * 2^(e - 129) is a BF16 value (the
//   smallest, 0.5 * 2^-129, a multiple of BF16's 2^-133; the largest, 6 * 2^125, below its max):
//   exact for every scale byte, 0xFF giving NaN.
// - MXFP8: the E4M3 byte's bits placed into BF16 (exponent field = E4M3's, mantissa's top three
//   bits = its mantissa) are the value times 2^-120, subnormals included; the multiplier is then
//   2^(e - 7 - pre) (pre = 0). Exact while that multiplier is a BF16 normal and every product is
//   representable: scale bytes 3 .. 134 (2^-124 .. 2^7; MXFP8 weights' scales sit near 2^-8) and
//   0xFF (NaN). Other bytes, and E4M3 NaN codes (which the placement would read as finite), set
//   the CTA's flag and the kernel recomputes its tile on the CUDA cores, exactly.
constexpr int kPreE2M1 = 2;
constexpr int kPreE4M3 = 0;
constexpr uint32_t kWideE4M3Lo = 3, kWideE4M3Hi = 134;
// The BF16 multiplier of scale byte e (one 16-bit half; the kernel duplicates it).
FLY_MXD_HD uint32_t wide_mult16(uint32_t e, bool fp4) {
  if (e == 255u) return 0x7FC0u;
  if (fp4) {
    const uint32_t pre = kPreE2M1;
    return e > pre ? (e - pre) << 7 : 0x40u >> (pre - e);  // 2^(e - 127 - pre); subnormal below 2^-126
  }
  return ((e + 120u - kPreE4M3) & 0xFFu) << 7;  // 2^(e - 7 - pre); meaningful for the exact range only
}
// Whether the wide kernel's fast path is exact for an MXFP8 scale byte.
FLY_MXD_HD bool wide_e4m3_scale_ok(uint32_t e) { return e == 255u || (e - kWideE4M3Lo) <= (kWideE4M3Hi - kWideE4M3Lo); }
// Two E4M3 bytes (bytes 2 hi, 2 hi + 1 of w) placed into a BF16 pair: value * 2^-120 each.
FLY_MXD_HD uint32_t e4m3x2_place_bf16(uint32_t w, bool hi) {
#if defined(__CUDA_ARCH__)
  const uint32_t t = __byte_perm(w, 0u, hi ? 0x3424u : 0x1404u);  // [0, b, 0, b'] bytes
#else
  const uint32_t b0 = (w >> (hi ? 16 : 0)) & 0xFFu, b1 = (w >> (hi ? 24 : 8)) & 0xFFu;
  const uint32_t t = (b0 << 8) | (b1 << 24);
#endif
  return ((t >> 4) & 0x07F007F0u) | (t & 0x80008000u);
}

}  // namespace fly::mxd
