// SPDX-License-Identifier: Apache-2.0
// What a dense GEMM tile configuration may be: each rule defined once, as a constexpr predicate
// that the kernel's Config static_asserts (with the rule's message), the launcher checks on the
// variant it is handed (src/ops/gemm.cpp variant_fits), and a CPU test checks every variant of
// tuning/gemm.json against (the JSON constraints may prune further, never admit an illegal one).
// Plain C++, host and device.
#pragma once

#include "gemm/gemm_params.h"

namespace fly::gemm {

struct TileShape {
  int bm = kBM, bn = 128, stages = 4, kb = 1, kw = 1, mc = 1, mp = 1, epi = 0, pp = 0;
};

namespace legal {
// tile rows: 128 (two 64-row halves) or 64 (shared rows)
constexpr bool bm(const TileShape& t) { return t.bm == 128 || t.bm == 64; }
// tile N: a multiple of 16 in 32..256, or 320 (128-row tiles, one k block per stage, no ping-pong)
constexpr bool bn(const TileShape& t) {
  return t.bn % 16 == 0 && t.bn >= 32 && (t.bn <= 256 || (t.bn == 320 && t.bm == 128 && t.kb == 1 && !t.pp));
}
// staged epilogue: bn >= 64 (epi_wg_bytes), passes of 64 columns above 128
constexpr bool epi_staged(const TileShape& t) { return t.epi == 0 || (t.bn >= 64 && (t.bn <= 128 || t.bn % 64 == 0)); }
// narrow tiles: no staged epilogue, bn <= 128
constexpr bool narrow(const TileShape& t) { return t.bm == 128 || (t.epi == 0 && t.bn <= 128); }
// TMA-store epilogue: 128-row tiles, passes of 64 columns
constexpr bool epi_tma(const TileShape& t) {
  return t.epi < 2 || (t.epi <= 3 && t.bm == 128 && t.bn % 64 == 0 && t.bn <= 256 && !t.pp);
}
// multicast: clusters of 2, of one operand
constexpr bool multicast(const TileShape& t) {
  return (t.mp == 1 || t.mp == 2) && (t.mc == 1 || (t.mc == 2 && t.bn % 16 == 0)) && (t.mc == 1 || t.mp == 1);
}
// k split over the warpgroups: narrow tiles, an even number of stages (stage s is warpgroup s % 2's)
constexpr bool kw(const TileShape& t) {
  return t.kw == 1 || (t.kw == 2 && t.bm == 64 && !t.pp && t.epi == 0 && t.stages % 2 == 0);
}
// ping-pong: 128-row tiles, no multicast, direct stores, bn <= 128 (2 x bn/2 accumulators)
constexpr bool pp(const TileShape& t) {
  return !t.pp || (t.bm == 128 && t.mc == 1 && t.mp == 1 && t.epi == 0 && t.bn <= 128);
}
// 2 or 4 k blocks per stage; multicast with 2 only; Q multicast with 2 on narrow tiles only
constexpr bool kb(const TileShape& t) {
  return t.kb == 1 || ((t.kb == 2 || t.kb == 4) && (t.mc * t.mp == 1 || t.kb == 2) && (t.mc == 1 || t.bm == 64));
}
// pipeline depth
constexpr bool stages(const TileShape& t) { return t.stages >= 2 && t.stages <= 12; }
// shared memory per block on sm_90
constexpr bool smem(const TileShape& t) {
  return smem_bytes(t.bn, t.stages, t.epi, t.bm, t.kb, t.kw) <= 227 * 1024;
}
// 128B-swizzle atoms are 1024 B: whole atoms of P and Q rows per stage
constexpr bool atoms(const TileShape& t) { return (t.bm * t.kb * kRowBytes) % 1024 == 0 && (t.bn * t.kb * kRowBytes) % 1024 == 0; }
// split-K partials (fp32, padded rows) reuse the stage ring after the mainloop
constexpr bool partials(const TileShape& t) {
  const int ring = t.stages * t.kb * (t.bm + t.bn) * kRowBytes;
  return t.bm * (t.bn + 4) * 4 <= ring && t.bn * (t.bm + 4) * 4 <= ring;
}
}  // namespace legal

// Every rule at once (the launcher and the tests; the kernel asserts them one by one).
constexpr bool tile_legal(const TileShape& t) {
  return legal::bm(t) && legal::bn(t) && legal::epi_staged(t) && legal::narrow(t) && legal::epi_tma(t) &&
         legal::multicast(t) && legal::kw(t) && legal::pp(t) && legal::kb(t) && legal::stages(t) && legal::smem(t) &&
         legal::atoms(t) && legal::partials(t);
}

}  // namespace fly::gemm
