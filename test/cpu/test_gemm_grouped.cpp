// SPDX-License-Identifier: Apache-2.0
// The grouped GEMM work decomposition (kernels/gemm/gemm_grouped.h), as the device scheduler walks
// it: every tile of every group exactly once, in any CTA count, clipped at its group's end, with
// empty and ragged groups.
#include <cstdint>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "catch_compat.hpp"
#include "gemm/gemm_grouped.h"

namespace {

using fly::gemm::GroupedCursor;
using fly::gemm::GroupedUnit;

// Every unit the `ctas` persistent CTAs take (CTA b: units b, b + ctas, ...), keyed by (group, tm, tn).
std::map<std::tuple<int, int, int>, GroupedUnit> walk(const std::vector<int32_t>& offs, int bm, int tiles_n, int ctas,
                                                      int* duplicates) {
  std::map<std::tuple<int, int, int>, GroupedUnit> seen;
  *duplicates = 0;
  for (int b = 0; b < ctas; ++b) {
    GroupedCursor c;
    GroupedUnit u;
    for (int64_t t = b; fly::gemm::grouped_unit(offs.data(), int32_t(offs.size()), bm, tiles_n, t, c, &u); t += ctas)
      if (!seen.emplace(std::make_tuple(u.group, u.tm, u.tn), u).second) ++*duplicates;
  }
  return seen;
}

// The tiles a group of rows [begin, end) must produce, checked against the walk.
void check_cover(const std::vector<int32_t>& offs, int bm, int tiles_n, int ctas) {
  int dups = 0;
  const auto seen = walk(offs, bm, tiles_n, ctas, &dups);
  CHECK(dups == 0);
  size_t expected = 0;
  int32_t begin = 0;
  for (size_t g = 0; g < offs.size(); ++g) {
    const int32_t end = offs[g];
    const int32_t rows = end > begin ? end - begin : 0;
    const int tiles_m = rows == 0 ? 0 : (rows + bm - 1) / bm;
    expected += size_t(tiles_m) * tiles_n;
    for (int tm = 0; tm < tiles_m; ++tm)
      for (int tn = 0; tn < tiles_n; ++tn) {
        auto it = seen.find(std::make_tuple(int(g), tm, tn));
        REQUIRE(it != seen.end());
        CHECK(it->second.row0 == begin + tm * bm);
        CHECK(it->second.row_end == end);
        CHECK(it->second.row0 < it->second.row_end);  // no tile starts in another group
      }
    if (end > begin) begin = end;
  }
  CHECK(seen.size() == expected);
}

}  // namespace

TEST_CASE("grouped decomposition: even groups, one tile row each", "[gemm][grouped]") {
  check_cover({128, 256, 384, 512}, 128, 4, 132);
  check_cover({128, 256, 384, 512}, 128, 4, 1);
}

TEST_CASE("grouped decomposition: ragged and empty groups", "[gemm][grouped]") {
  // group 1 and the last are empty; group 2 has 1 row; group 3 ends mid-tile
  check_cover({502, 502, 503, 1000, 1000}, 128, 3, 7);
  check_cover({0, 0, 0}, 128, 3, 5);      // nothing to do
  check_cover({1}, 64, 1, 132);           // one row, one tile, most CTAs idle
  int dups = 0;
  CHECK(walk({0, 0}, 128, 8, 4, &dups).empty());
}

TEST_CASE("grouped decomposition: random offsets and CTA counts", "[gemm][grouped]") {
  std::mt19937 rng(20261201);
  for (int trial = 0; trial < 200; ++trial) {
    const int groups = 1 + int(rng() % 64);
    std::vector<int32_t> offs(groups);
    int32_t row = 0;
    for (auto& o : offs) {
      const uint32_t r = rng() % 8;
      row += r == 0 ? 0 : int32_t(rng() % (r == 1 ? 2000 : 300));  // some empty, some long
      o = row;
    }
    const int bm = rng() % 2 ? 128 : 64;
    const int tiles_n = 1 + int(rng() % 12);
    const int ctas = 1 + int(rng() % 200);
    check_cover(offs, bm, tiles_n, ctas);
  }
}

TEST_CASE("grouped decomposition: decreasing offsets end the walk", "[gemm][grouped]") {
  // A bad offs (not cumulative) must not hang or start a tile before its group: the decreasing
  // entry counts as an empty group.
  int dups = 0;
  const auto seen = walk({300, 100, 400}, 128, 2, 3, &dups);
  CHECK(dups == 0);
  for (const auto& kv : seen) CHECK(kv.second.row0 < kv.second.row_end);
  // groups 0 (rows 0-299: 3 tile rows) and 2 (rows 300-399: 1 tile row), 2 columns each
  CHECK(seen.size() == size_t((3 + 1) * 2));
  CHECK(fly::gemm::grouped_tiles_m(0, 128) == 0);
  CHECK(fly::gemm::grouped_tiles_m(-5, 128) == 0);
  CHECK(fly::gemm::grouped_tiles_m(129, 128) == 2);
  GroupedCursor c;
  GroupedUnit u;
  const int32_t offs[2] = {128, 256};
  CHECK_FALSE(fly::gemm::grouped_unit(offs, 2, 128, 0, 0, c, &u));  // no columns: no units
}

TEST_CASE("grouped decomposition: group ends clamped to the rows of A and C", "[gemm][grouped]") {
  // Offsets past T (bad device data) end their group at T; every later group is empty, so no
  // unit reaches a row >= T and the work does not grow with the bad value.
  const int32_t T = 300;
  for (const std::vector<int32_t>& offs :
       {std::vector<int32_t>{100, 100000, 200}, std::vector<int32_t>{-7, 2147483647, 5}, std::vector<int32_t>{T, T + 1}}) {
    for (int ctas : {1, 3, 132}) {
      int64_t units = 0;
      for (int b = 0; b < ctas; ++b) {
        GroupedCursor c;
        GroupedUnit u;
        for (int64_t t = b; fly::gemm::grouped_unit(offs.data(), int32_t(offs.size()), T, 64, 2, t, c, &u); t += ctas) {
          ++units;
          CHECK(u.row0 >= 0);
          CHECK(u.row0 < u.row_end);
          CHECK(u.row_end <= T);
        }
      }
      // rows [0, T) in total, split at the (clamped) ends: at most T / 64 + groups tile rows
      CHECK(units <= int64_t(T / 64 + int64_t(offs.size())) * 2);
      CHECK(units >= int64_t((T + 63) / 64) * 2 - 2 * 2);
    }
  }
  // {100, 100000, 200}: group 0 rows [0, 100) = 2 tile rows, group 1 [100, 300) = 4, group 2 empty
  GroupedCursor c;
  GroupedUnit u;
  const int32_t offs[3] = {100, 100000, 200};
  int64_t n = 0;
  int last_group = -1;
  for (int64_t t = 0; fly::gemm::grouped_unit(offs, 3, T, 64, 1, t, c, &u); ++t, ++n) last_group = u.group;
  CHECK(n == 2 + 4);
  CHECK(last_group == 1);
}
