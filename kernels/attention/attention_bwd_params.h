// SPDX-License-Identifier: Apache-2.0
// Parameters and host planning of the sm_90a attention backward kernels (attention_bwd.cu), shared
// by host (src/ops/attention_bwd.cpp, tools, CPU tests) and device.
//
// Three kernels per variant, launched in order on one stream:
//   fly_attn_bwd_pre:  Delta = rowsum(dO * O) (fp32) and each row's probability reference (a, r)
//                      into the workspace, rows padded to a multiple of kBwdRowPad: P = exp2((s - a)
//                      scale log2(e) - r) with (a, r) = (0, LSE log2(e)), or for a row whose |LSE| is
//                      kBwdExactLse or more (scores so large that the FP32 LSE cannot give P) its
//                      exact max score and log2 of its sum, recomputed from Q and K (issue 46);
//                      padding: Delta 0, r = +inf, so P = 0.
//   fly_attn_bwd_dkdv: a CTA owns KN keys of one (batch, kv head) with K and V resident in shared
//                      memory; Q and dO tiles of QM queries of every query head of the group stream
//                      through a TMA ring (LSE2 / Delta read from the workspace). Deterministic:
//                      one CTA sums the group.
//   fly_attn_bwd_dq:   a CTA owns MQ queries of one (batch, query head) with Q and dO resident; K
//                      and V tiles of NQ keys stream through a ring. Deterministic by construction.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <stdint.h>

namespace fly::attn {

constexpr int kBwdRowPad = 128;  // query rows of the workspace rounded up to this (>= QM, MQ)

struct AttnBwdParams {
  // 4-D maps {D, S, H, B}, 128B swizzle, box {64, rows, 1, 1}, zero fill past D and S.
  CUtensorMap tm_q_kv, tm_do_kv;  // dK/dV kernel: box rows QM
  CUtensorMap tm_k_kv, tm_v_kv;   // dK/dV kernel: box rows KN
  CUtensorMap tm_q_dq, tm_do_dq;  // dQ kernel: box rows MQ
  CUtensorMap tm_k_dq, tm_v_dq;   // dQ kernel: box rows NQ
  const void* o;                  // [B, Hq, Sq, D]
  const void* dout;               // [B, Hq, Sq, D]
  const float* lse;               // [B, Hq, Sq] natural log (the forward's)
  void* dq;                       // [B, Hq, Sq, D]
  void* dk;                       // [B, Hkv, Sk, D]
  void* dv;                       // [B, Hkv, Sk, D]
  float* ws_lse2;                 // [B, Hq, sq_pad]: r, LSE * log2(e) (+inf in padding / empty rows)
  float* ws_delta;                // [B, Hq, sq_pad]
  float* ws_max;                  // [B, Hq, sq_pad]: a, 0 or a recomputed row's max score
  int64_t o_s[3], do_s[3], lse_s[3], dq_s[3], dk_s[3], dv_s[3];  // strides (elements) of b, h, s
  int32_t B, Hq, Hkv, Sq, Sk, D;
  int32_t group;   // Hq / Hkv
  int32_t sq_pad;  // Sq rounded up to kBwdRowPad
  int32_t causal;  // 1: key j visible to query i only when j <= i (top-left)
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
  // The preprocessing's exact recomputation of a row's statistics (rare: |LSE| >= kBwdExactLse)
  // reads Q and K rows directly (the tensors the maps address: 16-byte aligned rows).
  const void* q;                  // [B, Hq, Sq, D]
  const void* k;                  // [B, Hkv, Sk, D]
  int64_t q_s[3], k_s[3];         // strides (elements) of b, h, s
};

inline int64_t bwd_pad_rows(int64_t sq) { return (sq + kBwdRowPad - 1) / kBwdRowPad * kBwdRowPad; }
inline int64_t bwd_ws_part_bytes(int64_t b, int64_t hq, int64_t sq) {
  return (b * hq * bwd_pad_rows(sq) * 4 + 255) / 256 * 256;
}
// Workspace of a backward call: the padded r (LSE * log2(e)), Delta and a (row max) arrays,
// 256-byte aligned each, in that order.
constexpr int kBwdWsParts = 3;
inline int64_t bwd_ws_bytes(int64_t b, int64_t hq, int64_t sq) { return kBwdWsParts * bwd_ws_part_bytes(b, hq, sq); }

// Consumer warpgroups splitting the head dim of the dK/dV accumulators (wide heads): 64 columns
// each at 192, 128 each at 256 (splits start on a 64-column swizzle chunk).
constexpr int bwd_dsplit(int hd) { return hd == 192 ? 3 : hd == 256 ? 2 : 1; }

// Wide-head backward (hd 512, attention_bwd.cu under FLY_HD > 256; docs/attention.md "Backward,
// D 257..512"): dK + dV of 64 keys x 512 columns in fp32 (256 KiB) exceed the register file, so each
// key block runs as kBwdWideSlices CTAs, each owning 256 of the output columns (2 consumer
// warpgroups of 128); both warpgroups of a CTA split the S^T / dP^T contraction over D (256 each)
// and exchange the fp32 partials through shared memory, as the forward's wide schedule does.
// The dQ kernel keeps 64 query rows and splits dQ's columns over its 2 warpgroups the same way.
constexpr int kBwdWideHeadDim = 512;
constexpr int kBwdWideSlices = 2;  // dK/dV CTAs per key block (column slices of 256)
constexpr bool bwd_is_wide(int hd) { return hd > 256; }
// The two warpgroups' exchanged partials: [warpgroup][S, dP][64 x cols] fp32.
constexpr int bwd_wide_xchg_bytes(int cols) { return 2 * 2 * 64 * cols * 4; }

// Dynamic shared memory of the two main kernels (the kernel checks these by static_assert). Wide:
// K and V resident, one Q slot and one dO slot (qm rows), the exchange; dQ: Q and dO resident,
// one K slot and one V slot (nq keys), the exchange.
constexpr int bwd_dkdv_smem_bytes(int hd, int kn, int qm, int st) {
  return bwd_is_wide(hd) ? 2 * kn * hd * 2 + 2 * qm * hd * 2 + bwd_wide_xchg_bytes(qm) + 256 + 1024
                         : 2 * kn * hd * 2 + st * 2 * qm * hd * 2 + 256 + 1024;
}
constexpr int bwd_dq_smem_bytes(int hd, int mq, int nq, int st) {
  return bwd_is_wide(hd) ? 2 * mq * hd * 2 + 2 * nq * hd * 2 + bwd_wide_xchg_bytes(nq) + 256 + 1024
                         : 2 * mq * hd * 2 + st * 2 * nq * hd * 2 + 256 + 1024;
}
constexpr int bwd_dkdv_threads(int hd, int kn) { return bwd_is_wide(hd) ? 384 : 128 * (kn / 64 * bwd_dsplit(hd) + 1); }
constexpr int bwd_dq_threads(int mq) { return 128 * (mq / 64 + 1); }
constexpr int bwd_dq_threads(int hd, int mq) { return bwd_is_wide(hd) ? 384 : bwd_dq_threads(mq); }
// CTAs along x of the dK/dV grid: key blocks of kn, times the column slices when wide.
inline int64_t bwd_dkdv_grid_x(int hd, int64_t sk, int kn) {
  return (sk + kn - 1) / kn * (bwd_is_wide(hd) ? kBwdWideSlices : 1);
}

}  // namespace fly::attn
