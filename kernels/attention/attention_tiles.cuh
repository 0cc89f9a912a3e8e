// SPDX-License-Identifier: Apache-2.0
// Reusable pieces of the sm_90a attention kernels (attention_fwd.cu, attention_bwd.cu): the tile
// configuration, TMA tile loads of Q/K/V into 128B-swizzled shared memory, the wgmma fragments of
// S = Q K^T (both operands in shared memory) and O += P V (P from registers), the online softmax in
// exp2 with the scale folded in, and the causal / key-bound masking of a score tile.
//
// Fragment layout (wgmma m64nN accumulator, per thread of a warpgroup): register 4 j + e holds row
// 16 warp + lane / 4 + 8 (e / 2), column 8 j + 2 (lane % 4) + (e % 2). A thread owns two rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "attention/attention_math.h"
#include "common/pipeline.cuh"  // named_bar_sync / named_bar_arrive
#include "common/sm90.h"
#include "common/wgmma_ops.h"

namespace fly::attn {

// ---- configuration ---------------------------------------------------------------------------
// HD: compiled head dim (a multiple of 64: one 128-byte swizzle row per 64 columns); NWG: consumer
// warpgroups, 64 query rows each; BN: keys per tile; ST: K/V ring stages.
template <int HD, int NWG, int BN, int ST, bool BF16>
struct AttnConfig {
  static constexpr int kHD = HD;
  static constexpr int kChunks = HD / 64;  // 64-column chunks of a row (one swizzle row each)
  static constexpr int kNWG = NWG;
  static constexpr int BM = 64 * NWG;
  static constexpr int kBN = BN;
  static constexpr int kST = ST;
  static constexpr bool kBF16 = BF16;
  static constexpr int kThreads = 128 * (NWG + 1);  // warpgroup 0 is the producer
  static constexpr int kQBytes = BM * HD * 2;
  static constexpr int kKVBytes = BN * HD * 2;      // one K or one V tile
  static constexpr int kBarOffset = kQBytes + 2 * ST * kKVBytes;
  static constexpr int kSmemBytes = kBarOffset + 256 + 1024;  // barriers, 1 KiB alignment slack
  static_assert(HD % 64 == 0 && HD >= 64 && HD <= 256, "compiled head dims: 64, 128, 192, 256");
  static_assert(BN % 16 == 0 && BN >= 16 && BN <= 256, "key tile: a multiple of 16, at most 256");
  static_assert(NWG == 1 || NWG == 2, "one or two consumer warpgroups");
  static_assert(kSmemBytes <= 232448, "shared memory over the 227 KiB a block may have");
};

// Wide-head schedule (HD 512): 64 query rows per CTA, two consumer warpgroups, each owning 256 of
// the 512 columns. Each computes the partial S over its half of D (Half's mma_qk on its chunks), the
// two exchange partials through shared memory (kXOffset: one fp32 [64][BN] tile per warpgroup), both
// run the same online softmax on the full S, and each accumulates its 256 output columns (Half's
// mma_pv on its V chunks). K and V tiles have one slot each (K j + 1 loads under P V of tile j).
template <int BN, bool BF16>
struct WideConfig {
  static constexpr int kHD = 512;
  static constexpr int kChunks = 8;
  static constexpr int kNWG = 2;   // consumer warpgroups, both on the same 64 rows
  static constexpr int BM = 64;
  static constexpr int kBN = BN;
  static constexpr int kST = 1;
  static constexpr bool kBF16 = BF16;
  static constexpr int kThreads = 384;
  static constexpr int kQBytes = BM * kHD * 2;
  static constexpr int kKVBytes = BN * kHD * 2;
  static constexpr int kXOffset = kQBytes + 2 * kKVBytes;
  static constexpr int kXBytes = 2 * 64 * BN * 4;
  static constexpr int kBarOffset = kXOffset + kXBytes;
  static constexpr int kSmemBytes = kBarOffset + 256 + 1024;
  using Half = AttnConfig<256, 1, BN, 1, BF16>;  // one consumer's operands: 4 chunks of Q, K, V
  static_assert(BN % 16 == 0 && BN >= 16 && BN <= 64, "wide key tile: a multiple of 16, at most 64");
  static_assert(kSmemBytes <= 232448, "shared memory over the 227 KiB a block may have");
};

// Register split (setmaxnreg) of a kernel with one TMA producer warpgroup and NWG consumer
// warpgroups (the forward and the dQ kernel; the dK/dV kernel has its own in attention_bwd.cu):
// 24 / 240 with two consumers, 56 / 256 with one.
template <int NWG>
using AttnRegSplit = fly::RegSplit<NWG, NWG == 2 ? 24 : 56, NWG == 2 ? 240 : 256>;

// ---- hardware wrappers the common set lacks ------------------------------------------------------
// 4-D tile load (c0 innermost), completion counted in bytes on `bar`; out-of-bounds elements are
// zero-filled and still counted.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(sm90::smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(sm90::smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
// The same, multicast to the CTAs of `cta_mask` (same shared offset and mbarrier offset in each).
__device__ __forceinline__ void tma_load_4d_multicast(void* dst, const CUtensorMap* map, uint64_t* bar, int c0,
                                                      int c1, int c2, int c3, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;\n" ::"r"(sm90::smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(sm90::smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "h"(cta_mask)
      : "memory");
}
__device__ __forceinline__ float ex2(float x) { return attn_exp2(x); }  // MUFU.EX2 (attention_math.h)
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) sm90::reg_fence(r[i]);
}
template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (BF16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// ---- tile loads (producer) ---------------------------------------------------------------------
// A [rows][HD] tile lands as HD / 64 chunks of [rows][64] (128 B rows, 128B swizzle), chunk c at
// dst + c * rows * 128: the layout both K-major descriptors and the MN-major V descriptor read.
template <int HD>
__device__ __forceinline__ void load_tile(uint8_t* dst, const CUtensorMap* map, uint64_t* bar, int rows, int row0,
                                          int head, int batch) {
#pragma unroll
  for (int c = 0; c < HD / 64; ++c) tma_load_4d(dst + c * rows * 128, map, bar, c * 64, row0, head, batch);
}

// ---- wgmma fragments -----------------------------------------------------------------------------
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t saddr) { return sm90::make_desc_sw128(saddr, 16, 1024); }
// MN-major (V as the B operand of P V): 64 columns per 128-byte row, LBO = the chunk stride.
__device__ __forceinline__ uint64_t desc_mnmajor(uint32_t saddr, uint32_t chunk_bytes) {
  return sm90::make_desc_sw128(saddr, chunk_bytes, 1024);
}

// s[BN/2] = Q[64 rows at q_rows][HD] * K[BN][HD]^T. q: Q tile base (chunks of q_tile_rows rows);
// k: K tile base (chunks of BN rows). Issues and commits; the caller waits.
template <class Cfg>
__device__ __forceinline__ void mma_qk(float (&s)[Cfg::kBN / 2], uint32_t q, int q_tile_rows, uint32_t k) {
  using Mma = sm90::Wgmma<Cfg::kBN, 0, 0, Cfg::kBF16>;
  sm90::wgmma_fence();
#pragma unroll
  for (int c = 0; c < Cfg::kChunks; ++c)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      Mma::mma(s, desc_kmajor(q + c * q_tile_rows * 128 + kk * 32), desc_kmajor(k + c * Cfg::kBN * 128 + kk * 32),
               (c | kk) != 0);
  sm90::wgmma_commit();
}

// o[HD/2] += P[64][BN] * V[BN][HD], P as packed 16-bit pairs in the A-fragment layout.
template <class Cfg>
__device__ __forceinline__ void mma_pv(float (&o)[Cfg::kHD / 2], const uint32_t (&p)[Cfg::kBN / 16][4], uint32_t v) {
  using Mma = sm90::WgmmaRS<Cfg::kHD, 1, Cfg::kBF16>;
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Cfg::kBN / 16; ++kk) Mma::mma(o, p[kk], desc_mnmajor(v + kk * 2048, Cfg::kBN * 128), 1);
  sm90::wgmma_commit();
}

// The S accumulator of columns 16 kk .. 16 kk + 15 is the A fragment of k step kk: a pure regroup.
template <class Cfg>
__device__ __forceinline__ void pack_p(const float (&s)[Cfg::kBN / 2], uint32_t (&p)[Cfg::kBN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < Cfg::kBN / 16; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) p[kk][q] = pack2<Cfg::kBF16>(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1]);
}

// ---- masking ------------------------------------------------------------------------------------
// Scores of keys past sk, or (causal) after the row's query position, become -inf. n0: the tile's
// first key; qpos[i]: query position of the thread's row i.
template <int BN>
__device__ __forceinline__ void mask_tile(float (&s)[BN / 2], int n0, int sk, bool causal, const int (&qpos)[2]) {
  const int c0 = n0 + 2 * (threadIdx.x % 4);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = c0 + 8 * j + (e & 1);
      if (col >= sk || (causal && col > qpos[e >> 1])) s[4 * j + e] = -INFINITY;
    }
}

// ---- online softmax -------------------------------------------------------------------------------
// Running max (unscaled scores) and thread-partial row sums of the thread's two rows. Scores stay
// unscaled; a probability is exp2((s - m) scale_log2 - bias) (attention_math.h: prob_arg; one FADD,
// one FFMA, one MUFU.EX2), exact 2^-bias at the row's max whatever the scores' magnitude (issue 46:
// the earlier single FFMA s * c - fl(m c) put the rounding error of fl(m c), up to 8192 at scores of
// 1e12, into every exponent). bias: prob_bias (BF16 only), so sum_j p_j v_j cannot overflow FP32.
struct OnlineSoftmax {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  float bias = 0.f;

  __device__ __forceinline__ explicit OnlineSoftmax(float prob_bias) : bias(prob_bias) {}

  // Turns s into probabilities against the updated max and returns the factors the previous
  // accumulator rows must be scaled by. A row with nothing visible yet keeps max -inf and uses 0.
  template <int BN>
  __device__ __forceinline__ void step(float (&s)[BN / 2], float scale_log2, float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = m[i];
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float ref = row_ref(mx);
      alpha[i] = ex2(rescale_arg(m[i], ref, scale_log2));  // m = -inf: 0; unchanged max: 1
      m[i] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[4 * j + 2 * i + e];
          x = ex2(prob_arg(x, ref, scale_log2, bias));
          sum += x;
        }
      l[i] = l[i] * alpha[i] + sum;
    }
  }

  // Row sums over the quad (t: the biased sum, 0 for an empty row); then 1 / t (0 for an empty row)
  // and the natural-log LSE (-inf empty; row_lse: m * scale + ln t + bias ln 2).
  __device__ __forceinline__ void finish(float scale, float (&inv)[2], float (&lse)[2], float (&t)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float x = l[i];
      x += __shfl_xor_sync(0xffffffffu, x, 1);
      x += __shfl_xor_sync(0xffffffffu, x, 2);
      const bool empty = !(x > 0.f);
      t[i] = empty ? 0.f : x;
      inv[i] = empty ? 0.f : 1.f / x;
      lse[i] = row_lse(m[i], t[i], scale, bias);
    }
  }
};

// Scales the accumulator rows (registers 4 j + 2 i + {0, 1} belong to row i).
template <int N>
__device__ __forceinline__ void scale_rows(float (&acc)[N], const float (&f)[2]) {
#pragma unroll
  for (int j = 0; j < N / 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[4 * j + e] *= f[e >> 1];
}

}  // namespace fly::attn
