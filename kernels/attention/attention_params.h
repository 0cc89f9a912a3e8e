// SPDX-License-Identifier: Apache-2.0
// Parameters of the sm_90a attention forward kernels (attention_fwd.cu), shared by host and device.
//
// A CTA owns one tile of BM "virtual rows" of one (batch, head group) and one split of the keys.
// Unpacked: the rows are query positions m0..m0+BM-1 of query head blockIdx.y. Packed grouped-query
// (pack_gqa = 1, short queries): the rows are (head in group g, position s) = (r / Sq, r % Sq) of kv
// head blockIdx.y, so the Hq / Hkv heads sharing a kv head read its keys once.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <stdint.h>

namespace fly::attn {

struct AttnFwdParams {
  // 4-D maps {D, S, H, B} (innermost first), 128B swizzle, box {64, rows, heads, 1}; zero fill past
  // D and S, so head dims below the compiled one and partial tiles read zeros.
  CUtensorMap tm_q;  // box {64, BM, 1, 1}, or packed {64, Sq, group, 1}
  CUtensorMap tm_k;  // box {64, BN, 1, 1}
  CUtensorMap tm_v;  // box {64, BN, 1, 1}
  void* o;           // [B, Hq, Sq, D] of q's dtype
  float* lse;        // [B, Hq, Sq] fp32 or nullptr
  int64_t o_sb, o_sh, o_ss;        // elements
  int64_t lse_sb, lse_sh, lse_ss;  // elements
  // Split keys (splits > 1): each split writes its softmax-normalized O (fp32, D_pad wide) and its
  // row statistics (the raw max score and the biased probability sum, two floats: the merge weighs
  // splits by them exactly, where LSEs would lose the sums under scores of 1e11, issue 46) here,
  // indexed [split][b][h][s]; the last split of a tile to finish (ws_cnt: one arrival counter per
  // tile, zeroed by the launcher before the kernel) merges them into o and lse.
  float* ws_o;
  float* ws_ml;  // [split][row][2]: max, sum
  uint32_t* ws_cnt;
  int32_t B, Hq, Hkv, Sq, Sk, D;
  int32_t group;      // Hq / Hkv
  int32_t m_blocks;   // tiles along the virtual rows
  int32_t splits;     // key splits (1: none)
  int32_t pack_gqa;   // 1: packed rows (see above); m_blocks == 1 then
  int32_t causal;     // 1: key j visible to query i only when j <= i
  int32_t o_vec2;     // 1: o's base and strides allow 4-byte stores of element pairs
  uint32_t q_bytes;   // bytes one Q tile load brings (the mbarrier's expected transaction count)
  float scale_log2;   // softmax_scale * log2(e): exp(x * scale) = exp2(x * scale_log2)
  // Wide-head mc2 variants: 1 = launched as clusters of 2 CTAs along x (adjacent m blocks of one
  // head) that multicast each K / V tile, each CTA loading half of it (splits 1, unpacked only).
  int32_t cluster;
  float scale;        // softmax_scale (the LSE: m * scale + ln(sum), attention_math.h row_lse)
  float prob_bias;    // attention_math.h prob_bias(Sk, bf16): probabilities computed as 2^-bias of theirs
};

// Workspace of a split launch: partial O (fp32, dpad wide) and the (max, sum) pair per (split, row),
// then the tiles' arrival counters, each part 256-aligned.
inline int64_t attn_ws_o_bytes(int64_t splits, int64_t rows, int64_t dpad) {
  return (splits * rows * dpad * 4 + 255) / 256 * 256;
}
inline int64_t attn_ws_ml_bytes(int64_t splits, int64_t rows) { return (splits * rows * 8 + 255) / 256 * 256; }
// The tiles' arrival counters: one uint32 per tile; rows (B Hq Sq) bounds the tile count.
inline int64_t attn_ws_cnt_bytes(int64_t rows) { return (rows * 4 + 255) / 256 * 256; }
inline int64_t attn_ws_bytes(int64_t splits, int64_t rows, int64_t dpad) {
  return attn_ws_o_bytes(splits, rows, dpad) + attn_ws_ml_bytes(splits, rows) + attn_ws_cnt_bytes(rows);
}

}  // namespace fly::attn
