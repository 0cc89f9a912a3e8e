// SPDX-License-Identifier: Apache-2.0
// Weight-only MX prefill GEMM (kernels/mx/mx_prefill.cu, docs/mxfp.md "Weight-only prefill"):
// C[M, N] = A[M, K] * bf16(dequant(W[N, K]))^T (+ bias), A and C BF16, W MXFP8 (E4M3) or MXFP4
// (E2M1, two per byte) with one E8M0 scale per 32 k of a row, any M (the launcher sends M > 64).
//
// The dense GEMM core's mainloop and epilogue (kernels/gemm: 128 x BN tiles, two consumer
// warpgroups of wgmma on a ring of (A tile, W tile) stages), with the W tile made in shared memory
// by the producer warpgroup: its 128 threads stream the packed bytes with cp.async, RD stages
// ahead, and widen them to BF16 in the 128B-swizzled layout TMA would have written.
//
// Shared by the kernel, the launcher (src/ops/mx.cpp) and the CPU tests: the parameters, the
// shared-memory plan and the exact widening arithmetic.
#pragma once
#include <stdint.h>

#include "gemm/gemm_params.h"
#include "mx/mx_decode.h"

#if defined(__CUDACC__)
#define FLY_MXP_HD __host__ __device__ __forceinline__
#else
#define FLY_MXP_HD inline
#endif

namespace fly::mxp {

struct PrefillParams {
  gemm::GemmParams g;  // the dense GEMM's view: P = A (tm_p), D = C, Q = the widened W (tm_q unused)
  const uint8_t* w;    // W [N, K] E4M3 bytes or [N, K/2] packed E2M1, rows ldw bytes apart (16-aligned)
  const uint8_t* sw;   // scales [N, K/32] E8M0, rows K/32 bytes apart
  int64_t ldw;
  int32_t n, k;        // W's rows and the reduction length
};

constexpr int kBK = 64;  // k per ring stage (one 128-byte BF16 row of the W tile)
// Packed W bytes of one row per stage, and 16-byte chunks of them.
inline constexpr int raw_row_bytes(bool fp4) { return fp4 ? kBK / 2 : kBK; }
inline constexpr int chunks_per_row(bool fp4) { return raw_row_bytes(fp4) / 16; }
// One stage of packed W bytes (the cp.async staging slot): BN rows.
inline constexpr int raw_stage_bytes(int bn, bool fp4) { return bn * raw_row_bytes(fp4); }
// Dynamic shared memory: the dense kernel's ring and barriers (gemm_params.h smem_bytes, no staged
// epilogue), then RD staging slots.
inline constexpr int smem_bytes(int bn, int stages, int rd, bool fp4) {
  return gemm::smem_bytes(bn, stages) + rd * raw_stage_bytes(bn, fp4);
}

// ---- exact widening -----------------------------------------------------------------------------
// An E4M3 byte placed into BF16 (mx_decode.h e4m3x2_place_bf16; MXFP4 goes E2M1 -> E4M3 first,
// mx_unpack.h) is its value times 2^-120, subnormals included; times 2^(e - 7) it is the element
// times its block's 2^(e - 127). One mul.rn.bf16x2 rounds the product once: the widened weight
// is exactly bf16(dequant(w)) (what dequantizing to BF16 and a BF16 GEMM compute) for every code
// and scale byte, with one exception the multiplier range makes: 2^(e - 7) is a BF16 value for
// e <= 134 (every real weight's scale); for 135 <= e <= 254 the kernel multiplies twice, by
// 2^127 (exact: the placed values are below 2^-111) and then by 2^(e - 134), still one rounding.
// e = 0xFF (NaN) is the NaN multiplier; E4M3 NaN codes (which the placement reads as finite) are
// patched to NaN.
constexpr uint32_t kOneMulMax = 134;
// BF16 bits of the first multiplier of scale byte e (2^(e - 7), or 2^127 above kOneMulMax; NaN for 0xFF).
FLY_MXP_HD uint32_t mult_first16(uint32_t e) {
  if (e == 255u) return 0x7FC0u;
  return e <= kOneMulMax ? (e + 120u) << 7 : 0x7F00u;
}
// BF16 bits of the second multiplier (used only for kOneMulMax < e < 255): 2^(e - 134).
FLY_MXP_HD uint32_t mult_second16(uint32_t e) { return (e - 7u) << 7; }
// Per byte of w: 0x80 where the byte is an E4M3 NaN code (0x7F, 0xFF), else 0.
FLY_MXP_HD uint32_t e4m3_nan_mask(uint32_t w) { return ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u; }

// The launch (host): persistent, one CTA per SM at most; or, for few tiles, split-K clusters of
// `split` CTAs a tile (one k range each, reduced through DSMEM): up to 8 while the tiles times the
// split fit on the SMs and every range keeps at least 4 k steps, no range empty.
struct Launch {
  unsigned grid, threads, smem;
  int32_t tiles_m, tiles_n;
  int32_t split, kb_per_split;  // the cluster size along x (1: persistent) and k steps a range
};
inline Launch plan(int64_t M, int64_t N, int64_t K, int bn, int stages, int rd, bool fp4, int sm_count) {
  Launch L{};
  L.tiles_m = int32_t((M + 127) / 128);
  L.tiles_n = int32_t((N + bn - 1) / bn);
  const int64_t tiles = int64_t(L.tiles_m) * L.tiles_n, kb_total = (K + kBK - 1) / kBK;
  int64_t split = tiles > 0 ? sm_count / tiles : 0;
  split = split < 8 ? split : 8;
  split = split < kb_total / 4 ? split : kb_total / 4;
  if (split < 2) split = 1;
  const int64_t per = (kb_total + split - 1) / split;
  split = (kb_total + per - 1) / per;
  L.split = int32_t(split);
  L.kb_per_split = int32_t(per);
  L.grid = unsigned(split > 1 ? tiles * split : (tiles < sm_count ? tiles : sm_count));
  L.threads = unsigned(gemm::kThreads);
  L.smem = unsigned(smem_bytes(bn, stages, rd, fp4));
  return L;
}

}  // namespace fly::mxp
