// SPDX-License-Identifier: Apache-2.0
// Stream-K work split of the sm_90a GEMM (GemmParams::sk_tiles), shared by the device scheduler
// (gemm_scheduler.cuh) and the host tests, so the CPU suite checks exactly what the kernel runs.
//
// The stream-K tiles' k steps, `steps` = sk_tiles x kb_total of them, numbered tile-major, are cut
// into `grid` contiguous ranges of q or q + 1 steps (q = steps / grid >= 1; the first r = steps %
// grid CTAs take one more). CTA c serves its range as units, in this order:
//   1. the tiles wholly inside its range;
//   2. its contributor unit: the first k steps of the last tile it touches, when that tile ends in
//      a higher CTA (or, for a range inside one tile, the whole range): a partial left for the owner;
//   3. its owner unit: the last k steps of the first tile it touches, when that tile began in a
//      lower CTA: it adds the partials of CTAs first_contrib .. c - 1, in that order, and stores.
// Every CTA has at most one contributor and one owner unit, and an owner only waits for lower CTAs,
// which reach their contributor unit before their own owner unit: no wait cycles.
#pragma once

#if defined(__CUDACC__)
#define FLY_SK_HD __host__ __device__ __forceinline__
#else
#define FLY_SK_HD inline
#endif

namespace fly::gemm {

// What the consumers do with a unit's accumulators.
enum UnitRole : int { kWhole = 0, kContributor = 1, kOwner = 2 };

struct SkUnit {
  int tile;              // stream-K tile index (0 = the first stream-K tile)
  int kb_begin, kb_end;  // k steps of the tile
  int role;              // UnitRole
  int first_contrib;     // owner: the lowest CTA holding part of the tile
};

// First stream-K step of CTA c.
FLY_SK_HD int sk_begin(int c, int steps, int grid) {
  const int q = steps / grid, r = steps % grid;
  return c * q + (c < r ? c : r);
}

// The CTA whose range holds step i.
FLY_SK_HD int sk_cta_of(int i, int steps, int grid) {
  const int q = steps / grid, r = steps % grid;
  const int big = r * (q + 1);
  return i < big ? i / (q + 1) : r + (i - big) / q;
}

// Unit number i of CTA c (see above); false past its last unit.
FLY_SK_HD bool sk_unit(int i, int c, int steps, int grid, int kb_total, SkUnit* u) {
  const int b = sk_begin(c, steps, grid), e = sk_begin(c + 1, steps, grid);
  if (e <= b) return false;
  const int t0 = b / kb_total, t1 = (e - 1) / kb_total;  // first and last tile touched
  const int head = b > t0 * kb_total ? 1 : 0;           // t0 began in a lower CTA
  const int tail = e < (t1 + 1) * kb_total ? 1 : 0;     // t1 ends in a higher CTA
  const int whole_n = t1 - tail - (t0 + head) + 1;       // tiles t0 + head .. t1 - tail
  const int whole = whole_n > 0 ? whole_n : 0;
  u->kb_begin = 0;
  u->kb_end = kb_total;
  u->role = kWhole;
  u->first_contrib = 0;
  if (i < whole) {
    u->tile = t0 + head + i;
  } else if (i == whole && tail) {
    u->tile = t1;
    u->kb_begin = b > t1 * kb_total ? b - t1 * kb_total : 0;
    u->kb_end = e - t1 * kb_total;
    u->role = kContributor;
  } else if (i == whole + tail && head && !(t0 == t1 && tail)) {
    u->tile = t0;
    u->kb_begin = b - t0 * kb_total;
    u->role = kOwner;
    u->first_contrib = sk_cta_of(t0 * kb_total, steps, grid);
  } else {
    return false;
  }
  return true;
}

// Unit i of CTA c in a whole stream-K launch (GemmParams::sk_tiles > 0): `total` tiles in the
// raster order, the last sk_tiles of them stream-K, in super tiles of g consecutive tiles (one
// column, g rows); the grid's CTAs form grid / g groups, and member c % g of group c / g takes
// tile row c % g of each super tile its group takes. First the group's data-parallel super tiles
// (group, + groups, ...; their count is a multiple of the groups), then its stream-K units
// (sk_unit over the groups). u->tile is a raster tile index; u->first_contrib a CTA index (the
// same member of the first contributing group; the others follow every g CTAs).
FLY_SK_HD bool sk_cta_unit(int i, int c, int total, int sk_tiles, int g, int grid, int kb_total, SkUnit* u) {
  const int groups = grid / g, grp = c / g, member = c % g;
  const int dp_supers = (total - sk_tiles) / g;
  const int dp_n = dp_supers / groups;  // data-parallel super tiles per group
  if (i < dp_n) {
    u->tile = (grp + i * groups) * g + member;
    u->kb_begin = 0;
    u->kb_end = kb_total;
    u->role = kWhole;
    u->first_contrib = 0;
    return true;
  }
  if (!sk_unit(i - dp_n, grp, sk_tiles / g * kb_total, groups, kb_total, u)) return false;
  u->tile = (dp_supers + u->tile) * g + member;
  u->first_contrib = u->first_contrib * g + member;
  return true;
}

}  // namespace fly::gemm
