// SPDX-License-Identifier: Apache-2.0
// Host planning of an attention forward launch (src/ops/attention.cpp; CPU-tested in
// test/cpu/test_attention_args.cpp): compiled head dim, GQA packing, key splits, workspace, smem.
#pragma once

#include <stdint.h>

#include <algorithm>

#include "attention_params.h"  // same folder: also included from tools/

namespace fly::attn {

constexpr int kCompiledHeadDims[] = {64, 128, 192, 256, 512};  // tuning/attention.json "hd"
constexpr int kWideHeadDim = 512;  // the wide-head schedule (D split over two consumer warpgroups)
constexpr int kMaxHeadDim = 512;                          // the C entry's documented range
constexpr int kMaxSplits = 32;                            // the fused merge: one lane per split
constexpr int kMaxSms = 144;                              // workspace sizes are device independent
constexpr int kMaxBM = 128;

// The compiled head dim serving head dim d: the smallest one >= d, 0 when none does.
inline int padded_head_dim(int64_t d) {
  for (int hd : kCompiledHeadDims)
    if (d >= 1 && d <= hd) return hd;
  return 0;
}

// Dynamic shared memory of a variant: Q tile, ST stages of K and V, barriers, 1 KiB alignment slack
// (the kernel's AttnConfig::kSmemBytes / WideConfig::kSmemBytes, checked there by static_assert).
// The wide schedule (hd 512) adds the two fp32 [64][bn] partial-score tiles its warpgroups exchange.
constexpr int attn_smem_bytes(int hd, int bm, int bn, int st) {
  return bm * hd * 2 + 2 * st * bn * hd * 2 + (hd > 256 ? 2 * 64 * bn * 4 : 0) + 256 + 1024;
}
// Threads of a variant: a producer warpgroup plus one consumer warpgroup per 64 rows, or (wide) two
// consumer warpgroups sharing 64 rows, each owning half of D.
constexpr int attn_threads(int hd, int bm) { return hd > 256 ? 384 : 128 * (bm / 64 + 1); }

struct Shape {
  int64_t B, Hq, Hkv, Sq, Sk, D;
  bool causal;
};

// Grouped-query heads share a CTA (rows = head in group x position) when they all fit in one tile.
inline bool use_pack_gqa(const Shape& s, int bm) {
  const int64_t group = s.Hkv > 0 ? s.Hq / s.Hkv : 1;
  return group > 1 && s.Sq * group <= bm;
}

struct Grid {
  int64_t m_blocks, heads_y, tiles;
};
inline Grid tile_grid(const Shape& s, int bm) {
  Grid g;
  const bool pack = use_pack_gqa(s, bm);
  g.m_blocks = pack ? 1 : (s.Sq + bm - 1) / bm;
  g.heads_y = pack ? s.Hkv : s.Hq;
  g.tiles = g.m_blocks * g.heads_y * s.B;
  return g;
}

// Key splits (flash-decoding) when the tiles leave most SMs idle: as many as keep one wave, each
// split at least two key tiles, at most kMaxSplits.
inline int choose_splits(const Shape& s, int bm, int bn, int sms) {
  const Grid g = tile_grid(s, bm);
  const int64_t n_tiles = (s.Sk + bn - 1) / bn;
  if (g.tiles * 2 > sms || n_tiles < 4) return 1;
  const int64_t by_sms = sms / std::max<int64_t>(g.tiles, 1);
  return int(std::max<int64_t>(1, std::min<int64_t>({by_sms, n_tiles / 2, int64_t(kMaxSplits)})));
}

inline int64_t split_workspace_bytes(const Shape& s, int splits, int hd) {
  if (splits <= 1) return 0;
  return attn_ws_bytes(splits, s.B * s.Hq * s.Sq, hd);
}

// Device-independent workspace that lets every split launch run: the most splits any bundled tile
// shape (BM 64 or 128, the narrowest key tile 64) could pick on a kMaxSms-SM device.
inline int64_t max_workspace_bytes(const Shape& s) {
  const int hd = padded_head_dim(s.D);
  if (hd == 0) return 0;
  int64_t need = 0;
  for (int bm : {64, 128}) need = std::max(need, split_workspace_bytes(s, choose_splits(s, bm, 64, kMaxSms), hd));
  return need;
}

}  // namespace fly::attn
