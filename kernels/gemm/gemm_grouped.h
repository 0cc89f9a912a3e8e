// SPDX-License-Identifier: Apache-2.0
// Grouped mode of the GEMM core (mixture-of-experts): G problems that share K and N, whose rows
// are concatenated, as PyTorch's F.grouped_mm takes them: A [sum M_g, K], B [G, K, N] (one
// matrix per group), C [sum M_g, N], and `offs[g]` the end row of group g (int32, cumulative, on
// the device). The work decomposition lives here, shared by the device scheduler
// (gemm_scheduler.cuh GroupedScheduler) and the CPU tests, which check it covers every tile of
// every group exactly once.
//
// Work units are tiles of BM rows of one group by BN columns, numbered group after group; inside
// a group they walk down its tile rows first, so the CTAs in flight share the group's B tiles.
// A group's last tile row ends at the group's end (row_end): the epilogue clips there, so a tile
// never writes into the next group's rows. Empty groups have no units. The host does not know
// the offsets (they are device data), so a persistent CTA walks units blockIdx.x, + gridDim.x,
// ... until it runs past the last group.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define FLY_GEMM_HD __host__ __device__ __forceinline__
#else
#define FLY_GEMM_HD inline
#endif

namespace fly::gemm {

// The per-mode tail of the grouped kernel's parameters (after the common GemmParams core).
struct GroupedTail {
  const int32_t* offs;  // [groups] cumulative end rows; offs[groups - 1] = rows of A and C
  int32_t groups;
  int32_t rows;            // rows of A and C (T): every group end is clamped to it (bad offsets)
  int64_t b_group_stride;  // elements between consecutive groups' B matrices
  int64_t bias_group_stride;  // elements between consecutive groups' bias rows (bias [G, N])
};

struct GroupedUnit {
  int32_t group;    // which problem
  int32_t row0;     // first row of the tile in the concatenated A / C
  int32_t row_end;  // the group's end row: rows >= row_end belong to the next group (clip)
  int32_t tm;       // tile row inside the group
  int32_t tn;       // tile column
};

// Cursor over the groups for one CTA: units arrive in increasing order, so it only moves forward
// (each CTA scans the offsets once over its whole walk).
struct GroupedCursor {
  int32_t group = 0;
  int32_t row_begin = 0;     // first row of `group`
  int64_t first_unit = 0;    // units of the groups before `group`
};

// Tile rows of a group of `rows` rows.
FLY_GEMM_HD int32_t grouped_tiles_m(int32_t rows, int bm) { return rows <= 0 ? 0 : (rows + bm - 1) / bm; }

// Unit t (t never smaller than the cursor's previous call's) -> its group and tile; false past
// the last group. offs is read as cumulative and non-decreasing; a decreasing entry (bad input)
// counts as an empty group, so the walk always ends. Group ends are clamped to `limit` (the rows
// of A and C): an offset past it (bad input) ends its group at `limit`, and every later group is
// empty, so no unit ever reaches a row past the tensors (nor the work grows with the bad value).
FLY_GEMM_HD bool grouped_unit(const int32_t* offs, int32_t groups, int32_t limit, int bm, int32_t tiles_n,
                             int64_t t, GroupedCursor& c, GroupedUnit* out) {
  if (tiles_n <= 0) return false;
  while (c.group < groups) {
    const int32_t o = offs[c.group];
    const int32_t end = o < limit ? o : limit;
    const int32_t rows = end - c.row_begin;
    const int64_t units = int64_t(grouped_tiles_m(rows, bm)) * tiles_n;
    if (t < c.first_unit + units) {
      const int64_t r = t - c.first_unit;
      const int32_t tiles_m = grouped_tiles_m(rows, bm);
      out->group = c.group;
      out->tm = int32_t(r % tiles_m);
      out->tn = int32_t(r / tiles_m);
      out->row0 = c.row_begin + out->tm * bm;
      out->row_end = end;
      return true;
    }
    c.first_unit += units;
    if (end > c.row_begin) c.row_begin = end;
    ++c.group;
  }
  return false;
}
// Without a row limit (the offsets trusted to stay inside the tensors).
FLY_GEMM_HD bool grouped_unit(const int32_t* offs, int32_t groups, int bm, int32_t tiles_n, int64_t t,
                             GroupedCursor& c, GroupedUnit* out) {
  return grouped_unit(offs, groups, INT32_MAX, bm, tiles_n, t, c, out);
}

}  // namespace fly::gemm
