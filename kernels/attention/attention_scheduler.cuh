// Tile scheduler of the attention kernels: which (rows, head, batch, key range) a CTA owns.
// One CTA per tile (not persistent): blockIdx.x = m block x splits + split, y = head (packed:
// kv head), z = batch. Causal grids run the longest tiles (last m blocks) first.
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

template <int BM, int BN>
__device__ __forceinline__ TileCoord schedule_tile(const AttnFwdParams& p) {
  TileCoord t;
  t.split = int(blockIdx.x) % p.splits;
  int mb = int(blockIdx.x) / p.splits;
  if (p.causal) mb = p.m_blocks - 1 - mb;
  t.m0 = mb * BM;
  t.head_y = int(blockIdx.y);
  t.kv_head = p.pack_gqa ? t.head_y : t.head_y / p.group;
  t.batch = int(blockIdx.z);
  // Last query position of the tile bounds the visible keys (causal, top-left).
  const int last_pos = p.pack_gqa ? p.Sq - 1 : min(t.m0 + BM, p.Sq) - 1;
  const int kv_end = p.causal ? min(p.Sk, last_pos + 1) : p.Sk;
  const int n_total = (kv_end + BN - 1) / BN;
  const int per = (n_total + p.splits - 1) / p.splits;
  t.n_begin = min(n_total, t.split * per);
  t.n_end = min(n_total, t.n_begin + per);
  return t;
}

}  // namespace fly::attn
