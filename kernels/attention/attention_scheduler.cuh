// SPDX-License-Identifier: Apache-2.0
// Tile scheduler of the attention kernels: which (rows, head, batch, key range) a CTA owns.
// One CTA per tile: blockIdx.x = m block x splits + split, y = head (packed: kv head), z = batch;
// causal grids run the longest tiles (last m blocks) first. Persistent variants walk the same
// tiles in a longest-first stream (persistent_tile).
#pragma once

#include "attention/attention_params.h"

namespace fly::attn {

struct TileCoord {
  int m0;        // first virtual row
  int head_y;    // blockIdx.y: query head, or kv head when packed
  int kv_head;
  int batch;
  int split;
  int n_begin, n_end;  // key tiles [n_begin, n_end) of this split
};

// The tile of grid position (x, y, z): x = m block rank x splits + split, y = head (packed: kv
// head), z = batch, each given as a callable read where it is used (so the one-tile-per-CTA
// kernels read blockIdx in the order they always did: their cubins are unchanged).
template <int BM, int BN, class X, class Y, class Z>
__device__ __forceinline__ TileCoord schedule_tile_at(const AttnFwdParams& p, X x, Y y, Z z) {
  TileCoord t;
  t.split = x() % p.splits;
  int mb = x() / p.splits;
  if (p.causal) mb = p.m_blocks - 1 - mb;
  t.m0 = mb * BM;
  t.head_y = y();
  t.kv_head = p.pack_gqa ? t.head_y : t.head_y / p.group;
  t.batch = z();
  // Last query position of the tile bounds the visible keys (causal, top-left).
  const int last_pos = p.pack_gqa ? p.Sq - 1 : min(t.m0 + BM, p.Sq) - 1;
  const int kv_end = p.causal ? min(p.Sk, last_pos + 1) : p.Sk;
  const int n_total = (kv_end + BN - 1) / BN;
  const int per = (n_total + p.splits - 1) / p.splits;
  t.n_begin = min(n_total, t.split * per);
  t.n_end = min(n_total, t.n_begin + per);
  return t;
}

template <int BM, int BN>
__device__ __forceinline__ TileCoord schedule_tile(const AttnFwdParams& p) {
  return schedule_tile_at<BM, BN>(p, [] { return int(blockIdx.x); }, [] { return int(blockIdx.y); },
                                  [] { return int(blockIdx.z); });
}

// Persistent variants (FLY_PS = 1): a grid of at most one CTA per SM walks tiles L = blockIdx.x,
// blockIdx.x + gridDim.x, ... of attn_tile_count(p). Causal: the m block rank (longest tiles
// first) is the outermost index, so every CTA starts on the longest tiles left and the short ones
// fill the last wave; otherwise batch and head are outermost and the m blocks of one head run side
// by side (its K and V stay in L2).
__device__ __forceinline__ int attn_heads_y(const AttnFwdParams& p) { return p.pack_gqa ? p.Hkv : p.Hq; }
__device__ __forceinline__ int attn_tile_count(const AttnFwdParams& p) {
  return p.m_blocks * p.splits * attn_heads_y(p) * p.B;
}
template <int BM, int BN>
__device__ __forceinline__ TileCoord persistent_tile(const AttnFwdParams& p, int L) {
  const int ny = attn_heads_y(p), sx = p.splits;
  const int split = L % sx;
  int r = L / sx, rank, h, b;
  if (p.causal) {
    h = r % ny;
    r /= ny;
    b = r % p.B;
    rank = r / p.B;
  } else {
    rank = r % p.m_blocks;
    r /= p.m_blocks;
    h = r % ny;
    b = r / ny;
  }
  const int x = rank * sx + split;
  return schedule_tile_at<BM, BN>(p, [x] { return x; }, [h] { return h; }, [b] { return b; });
}

}  // namespace fly::attn
