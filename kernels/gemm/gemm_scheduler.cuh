// SPDX-License-Identifier: Apache-2.0
// Work decomposition of the sm_90a GEMM: persistent tiles (grid = #SMs, each CTA walks tiles
// blockIdx.x, +gridDim.x, ...) or split-K clusters (one CTA per (tile, k-slice); the cluster's
// CTAs share a tile and reduce through distributed shared memory).
#pragma once

#include "common/sm90.h"
#include "gemm/gemm_grouped.h"
#include "gemm/gemm_params.h"
#include "gemm/gemm_streamk.h"

namespace fly::gemm {

struct WorkUnit {
  int tm, tn;            // tile coordinates in D
  int kb_begin, kb_end;  // k steps (KB x 64 wide, one ring stage each) of this unit
  int role = kWhole;     // stream-K: kContributor leaves a partial; kOwner adds the partials of
  int first_contrib = 0;  // CTAs first_contrib, + sk_group, .. < blockIdx.x, then stores the tile
};

// Scheduler policies: TileScheduler (dense: one problem's tiles, persistent or split-K, stream-K)
// and GroupedScheduler (grouped mode: the tiles of G problems whose rows are concatenated).
//
// MC > 1 (multicast clusters): the cluster walks "super tiles" of MC vertically adjacent tiles;
// CTA rank r takes tile row super*MC + r (possibly past the last row: it then only helps load Q
// and its stores are clipped). MP > 1 is the same along the other axis: MP horizontally adjacent
// tiles (same P rows) and CTA rank r takes tile column super*MP + r. At most one of them is > 1.
// KB: 64-wide k blocks per k step (ring stage); kb_* count k steps.
template <int MC, int MP = 1, int KB = 1>
struct TileScheduler {
  static_assert(MC == 1 || MP == 1, "a cluster multicasts one operand");
  static constexpr int CL = MC * MP;  // CTAs per multicast cluster
  int tiles_m, tiles_n, total, strip_m, split, kb_total, kb_per_split;
  int next, step, rank;
  // Stream-K (CL == 1, split == 1, sk_tiles > 0): unit sk_cur of this CTA (gemm_streamk.h
  // sk_cta_unit: data-parallel super tiles, then stream-K ranges, CTAs in groups of sk_g walking
  // the same Q columns and k steps at once). sk_tiles == 0: no stream-K.
  int sk_tiles = 0, sk_g = 1, sk_cur = 0;
  __device__ explicit TileScheduler(const GemmParams& p) {
    tiles_m = (p.tiles_m + MC - 1) / MC;  // super-tile rows
    tiles_n = (p.tiles_n + MP - 1) / MP;  // super-tile columns
    total = tiles_m * tiles_n;
    strip_m = max(1, p.strip_m / MC);
    split = p.split;
    kb_total = (p.k + KB * kBK - 1) / (KB * kBK);
    kb_per_split = p.kb_per_split;
    if (split > 1) {
      rank = static_cast<int>(sm90::cluster_ctarank());
      next = blockIdx.x / split;
      step = total;  // exactly one unit per CTA
    } else if (CL > 1) {
      rank = static_cast<int>(sm90::cluster_ctarank());
      next = blockIdx.x / CL;
      step = gridDim.x / CL;
    } else {
      rank = 0;
      next = blockIdx.x;
      step = gridDim.x;
      sk_tiles = p.sk_tiles;
      sk_g = max(1, p.sk_group);
    }
  }

  // Tile number t of the raster order -> its coordinates.
  // NOTE: strip rasterization: consecutive tiles walk down a strip of strip_m tile-rows before
  // moving right, so the CTAs running at the same time share P rows and Q columns in L2.
  __device__ void tile_coords(int t, WorkUnit& u) const {
    const int per_strip = strip_m * tiles_n;
    const int g = t / per_strip;
    const int first_m = g * strip_m;
    const int gsz = min(tiles_m - first_m, strip_m);
    const int r = t - g * per_strip;
    u.tm = (first_m + r % gsz) * MC + (MC > 1 ? rank : 0);
    u.tn = (r / gsz) * MP + (MP > 1 ? rank : 0);
  }

  __device__ bool fetch_stream_k(WorkUnit& u) {
    SkUnit s;
    if (!sk_cta_unit(sk_cur++, blockIdx.x, total, sk_tiles, sk_g, gridDim.x, kb_total, &s)) return false;
    tile_coords(s.tile, u);
    u.kb_begin = s.kb_begin;
    u.kb_end = s.kb_end;
    u.role = s.role;
    u.first_contrib = s.first_contrib;
    return true;
  }

  __device__ bool fetch(WorkUnit& u) {
    if (CL == 1 && sk_tiles > 0) return fetch_stream_k(u);
    if (next >= total) return false;
    const int t = next;
    next += step;
    tile_coords(t, u);
    if (split > 1) {
      u.kb_begin = min(kb_total, rank * kb_per_split);
      u.kb_end = min(kb_total, u.kb_begin + kb_per_split);
    } else {
      u.kb_begin = 0;
      u.kb_end = kb_total;
    }
    return true;
  }
};

// Grouped mode: units of the grouped decomposition (gemm_grouped.h), persistent over the CTAs.
// A unit's rows end at its group's end (the epilogue clips at row_end) and its B tile comes from
// its group's matrix. Not combined with multicast (a cluster's tiles could belong to different
// groups, whose operands differ) nor with split-K or stream-K (whose partial tiles would have to
// meet across groups).
struct GroupedWorkUnit : WorkUnit {
  int group = 0;
  int row0 = 0;     // first row of the tile in the concatenated A / C (tm counts inside the group)
  int row_end = 0;  // the group's end row
};
template <int MC, int MP = 1, int KB = 1>
struct GroupedScheduler {
  static_assert(MC == 1 && MP == 1, "grouped mode: no multicast across groups");
  int tiles_n, kb_total, bm;
  int64_t next, step;
  const GroupedTail* tail;
  GroupedCursor cursor;
  __device__ GroupedScheduler(const GemmParams& p, const GroupedTail& t, int bm_) : tail(&t), bm(bm_) {
    tiles_n = p.tiles_n;
    kb_total = (p.k + KB * kBK - 1) / (KB * kBK);
    next = blockIdx.x;
    step = gridDim.x;
  }
  __device__ bool fetch(GroupedWorkUnit& u) {
    GroupedUnit g;
    if (!grouped_unit(tail->offs, tail->groups, tail->rows, bm, tiles_n, next, cursor, &g)) return false;
    next += step;
    u.group = g.group;
    u.row_end = g.row_end;
    u.row0 = g.row0;
    u.tm = g.tm;
    u.tn = g.tn;
    u.kb_begin = 0;
    u.kb_end = kb_total;
    return true;
  }
};

}  // namespace fly::gemm
