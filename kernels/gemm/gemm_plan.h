// SPDX-License-Identifier: Apache-2.0
// Host-side planning of one sm_90a GEMM launch: operand roles (swap-AB), TMA tensor maps, tile
// counts, split-K factor and grid. Shared by src/ops/gemm.cpp and the standalone harness in
// kernels/gemm/dev/, so both launch the kernel identically. Host-only, header-only.
#pragma once

#include <cuda.h>
#include <stdint.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>

#include "gemm/gemm_legal.h"
#include "gemm/gemm_params.h"

namespace fly::gemm {

// One operand as the caller laid it out. Element (r, k) of the logical [rows, K] matrix (A: m,k;
// B^T: n,k) lives at data[r*ld + k] when kmajor, else data[r + k*ld].
struct Operand {
  const void* data;
  int64_t rows;
  int64_t ld;
  bool kmajor;
};

struct Problem {
  int64_t M, N, K;
  Operand a;   // A as [M, K]
  Operand bt;  // B^T as [N, K]  (B row-major [K,N] == B^T MN-major)
  void* c;
  int64_t ldc;
  const void* bias;
  Dtype dtype;  // of A, B and C (operand traits: gemm_operand.h)
};

struct VariantShape {
  int bn;      // tile N (wgmma N)
  int stages;  // ring depth
  bool swap;   // P = B^T, Q = A^T
  int mc = 1;  // multicast cluster size along M (1 or 2); 2 disables split-K
  int epi = 0;  // 1: shared-memory staged epilogue (its tiles add to the shared memory)
  int bm = kBM;  // tile rows of P: 128, or 64 for narrow (decode) tiles
  int mp = 1;   // multicast cluster size along N (narrow tiles: 2 CTAs share the P tile)
  int l2p = 256;  // L2 sector promotion of both tensor maps, bytes: 0 (none), 64, 128 or 256
  int pp = 0;     // 1: ping-pong consumers (alternate whole tiles; persistent, no split-K)
  int kb = 1;     // 64-wide k blocks per ring stage (2: one TMA box brings two; no Q multicast)
  int ks = 0;     // 1: stagger the CTAs' k walks (GemmParams::k_stagger; a launch axis)
  int gm = 0;     // raster strip height in tile rows (a launch axis); 0: raster_group's choice
  int kw = 1;     // 2: narrow tiles whose consumer warpgroups split the k steps (gemm_config.cuh KW)
};

// The tile part of a variant, for the legality rules (gemm_legal.h).
inline TileShape tile_shape(const VariantShape& v) {
  return TileShape{v.bm, v.bn, v.stages, v.kb, v.kw, v.mc, v.mp, v.epi, v.pp};
}

// Raster strip height (GemmParams::strip_m) for `wave` tiles in flight at once: the tile order walks
// strips of g tile rows column by column, so a wave touches about g P-tile rows and wave / g
// Q-tile columns (each P row bm x K, each Q column bn x K). Picks the g of {8, 16, 32, 64} that
// minimises those bytes, the smaller on a tie.
// NOTE: measured on the H200 (ncu, 16384x4096x4096, 128 x 256 tiles): with the fixed g = 8 a wave
// read 8 P rows and all 16 Q columns (40 MiB) and the kernel read 775 MB from DRAM against cuBLAS's
// 595; g = 16 touches 16 rows and 8-9 columns (34 MiB, and the next wave reuses the 16 rows).
inline int raster_group(int64_t tiles_m, int64_t tiles_n, int bm, int bn, int64_t wave) {
  int best = 8;
  int64_t best_cost = -1;
  for (int g = 8; g <= 64; g *= 2) {
    const int64_t rows = std::min<int64_t>(g, tiles_m);
    // A wave wider than one strip spans whole strips: ceil(wave / tiles_n) rows, every column.
    const int64_t cost = rows * tiles_n <= wave ? (wave + tiles_n - 1) / tiles_n * bm + tiles_n * bn
                                                : rows * bm + std::min<int64_t>(tiles_n, (wave + rows - 1) / rows) * bn;
    if (best_cost < 0 || cost < best_cost) best = g, best_cost = cost;
  }
  return best;
}

// The tensor-map L2 promotion for `bytes` (a launch axis of the narrow tiles, tuning/gemm.json);
// anything but 0, 64 and 128 means the 256-byte promotion every other variant uses.
inline CUtensorMapL2promotion l2_promotion(int bytes) {
  switch (bytes) {
    case 0: return CU_TENSOR_MAP_L2_PROMOTION_NONE;
    case 64: return CU_TENSOR_MAP_L2_PROMOTION_L2_64B;
    case 128: return CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
    default: return CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  }
}

struct Launch {
  GemmParams params;
  unsigned grid;
  unsigned cluster;  // == params.split
  unsigned smem;
};

// The 16-byte rules of TMA for one operand; returns nullptr when fine, else what is broken.
inline const char* operand_tma_problem(const Operand& o, int64_t k, Dtype dt) {
  if (reinterpret_cast<uintptr_t>(o.data) % 16 != 0) return "base address is not 16-byte aligned";
  const int64_t outer = o.kmajor ? o.rows : k;  // extent of the strided dimension
  const int eb = elem_bytes(dt);
  if (outer > 1 && (o.ld * eb) % 16 != 0)
    return eb == 2 ? "leading dimension * 2 bytes is not a multiple of 16" : "leading dimension is not a multiple of 16 bytes";
  return nullptr;
}

// Bytes between rows of a tensor map's strided dimension: the leading dimension, or for a single
// row (whose stride TMA never follows) its own length rounded up to TMA's 16-byte rule.
inline cuuint64_t map_row_stride(int64_t rows, int64_t ld, int64_t row_elems, int eb) {
  return cuuint64_t(rows > 1 ? ld * eb : ((row_elems * eb + 15) / 16) * 16);
}

// encode: CUresult(*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
// const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
// CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) -- the driver's
// cuTensorMapEncodeTiled, however the caller reaches it.
// The 2-D map of an operand: K-major box {64 k, box_rows}; MN-major box {64 mn, 64 kb k}.
template <class Encode>
CUresult encode_operand(Encode encode, CUtensorMap* map, const Operand& o, int64_t k, int box_rows,
                        Dtype dt, CUtensorMapL2promotion l2 = CU_TENSOR_MAP_L2_PROMOTION_L2_256B, int kb = 1) {
  const int64_t kk = std::max<int64_t>(k, 1);
  const int eb = elem_bytes(dt), bk = kRowBytes / eb;  // k elements of one k block
  cuuint64_t dims[2], strides[1];
  cuuint32_t box[2];
  if (o.kmajor) {
    dims[0] = kk;
    dims[1] = o.rows;
    box[0] = bk;
    box[1] = box_rows;
    strides[0] = map_row_stride(o.rows, o.ld, kk, eb);
  } else {
    dims[0] = o.rows;
    dims[1] = kk;
    box[0] = kRowBytes / eb;  // one 128-byte row of MN elements
    box[1] = static_cast<cuuint32_t>(bk * kb);
    strides[0] = map_row_stride(kk, o.ld, o.rows, eb);
  }
  return encode_sw128(encode, map, 2, o.data, dims, strides, box, dt, l2);
}

// The 3-D view of a K-major operand for kb > 1: (64 k, rows, K / 64 whole k blocks), the k-block
// stride 128 bytes, box {64, box_rows, kb}: one box is kb consecutive [box_rows][64] swizzled
// tiles. Only whole k blocks are in it (the kernel loads a k step that runs past K through the
// 2-D map), so dims[2] = K / 64. plan_gemm encodes it only when K >= 64 x kb: with less, no k step
// is whole, the kernel never reads it, and a 64-element inner extent could overrun short rows.
template <class Encode>
CUresult encode_operand_3d(Encode encode, CUtensorMap* map, const Operand& o, int64_t k, int box_rows, int kb,
                           Dtype dt, CUtensorMapL2promotion l2) {
  const int eb = elem_bytes(dt), bk = kRowBytes / eb;
  const cuuint64_t dims[3] = {cuuint64_t(bk), cuuint64_t(o.rows), cuuint64_t(k / bk)};
  const cuuint64_t strides[2] = {map_row_stride(o.rows, o.ld, k, eb), cuuint64_t(kRowBytes)};
  const cuuint32_t box[3] = {cuuint32_t(bk), cuuint32_t(box_rows), cuuint32_t(kb)};
  return encode_sw128(encode, map, 3, o.data, dims, strides, box, dt, l2);
}

// Clusters of s CTAs (one 384-thread, ~200 KiB CTA per SM) resident at once on a 132-SM H100/H200,
// read with cuOccupancyMaxActiveClusters: a cluster must fit inside one GPC, so big clusters
// strand SMs (s = 4 fits only 30 clusters = 120 CTAs). Scaled for other SM counts.
constexpr int kMaxClusters132[9] = {0, 132, 66, 39, 30, 22, 17, 15, 15};

// Split-K factor for a grid of `tiles` tiles: the largest s whose tiles * s CTAs still run in one
// wave, each slice keeping at least 4 k steps (ring stages: kb_total counts them); 1 when the
// tiles alone fill half the GPU.
inline int choose_split(int64_t tiles, int64_t kb_total, int sm_count) {
  if (tiles * 2 > sm_count) return 1;
  int best = 1;
  for (int s = 2; s <= 8; ++s) {
    const int64_t cap = static_cast<int64_t>(kMaxClusters132[s]) * sm_count / 132;
    if (tiles <= cap && kb_total >= 4 * s) best = s;
  }
  return best;
}

// Stream-K (launch axis split = 1): how many of a persistent launch's `tiles` (super) tiles to
// hand out as equal k-step ranges over `grid` CTA groups instead of whole. With at least two waves of tiles, the
// last partial wave and one full wave before it (so every CTA's stream-K share is 1-2 tiles and
// most cut tiles have two parts), none when the tiles fill whole waves; with fewer, all of them.
inline int64_t stream_k_tiles(int64_t tiles, int64_t grid) {
  if (grid <= 0) return 0;
  if (tiles >= 2 * grid) return tiles % grid == 0 ? 0 : tiles % grid + grid;
  return tiles;
}

// The plan of a stream-K launch over `tiles` tiles (tiles_m rows) of kb_total k steps: super tiles
// of `group` tiles of one column (the largest of 4, 2, 1 dividing tiles_m: the raster's strips are
// 8, 16, 32 or 64 rows tall, raster_group), as many CTA groups as fit on the SMs (no more than the
// k steps), and the tiles cut. Inactive when every group's share is whole super tiles.
struct StreamKPlan {
  int64_t grid = 0, sk_tiles = 0;
  int group = 1;
  bool active() const { return sk_tiles > 0; }
};
inline StreamKPlan plan_stream_k(int64_t tiles_m, int64_t tiles, int64_t kb_total, int sm_count) {
  StreamKPlan s;
  s.group = tiles_m % 4 == 0 ? 4 : tiles_m % 2 == 0 ? 2 : 1;
  const int64_t supers = tiles / s.group;
  const int64_t groups = std::min<int64_t>(sm_count / s.group, supers * kb_total);
  // The kernel numbers stream-K steps in 32-bit ints: at most 2 waves of super tiles are cut.
  if (groups <= 0 || (2 * groups + 1) * kb_total > INT32_MAX) return s;
  s.grid = groups * s.group;
  int64_t sk_supers = stream_k_tiles(supers, groups);
  if (sk_supers * kb_total % groups == 0 && (sk_supers * kb_total / groups) % kb_total == 0) sk_supers = 0;
  s.sk_tiles = sk_supers * s.group;
  return s;
}

// Whether a forced split-K factor (launch axis "split" of tuning/gemm.json) suits the problem:
// the tiles times the split fit in about two waves and K gives every slice at least two 64-wide
// k blocks. Split-K is for few-tile shapes; others go to the variants without a forced split.
// split = 1 (stream-K) suits shapes where it cuts some tile (plan_stream_k), with the same
// restrictions; without a workspace it runs as a plain persistent launch (plan_gemm).
inline bool forced_split_fits(const Problem& pr, const VariantShape& v, int split, int sm_count) {
  if (split <= 0) return split == 0;
  if (v.mc > 1 || v.mp > 1) return false;  // the cluster is taken by multicast
  if (v.bm != kBM) return false;  // narrow tiles have no split-K
  if (v.pp) return false;         // nor do ping-pong consumers
  if (v.bn > 256) return false;   // nor 320-wide tiles
  const int64_t p_rows = v.swap ? pr.N : pr.M, q_rows = v.swap ? pr.M : pr.N;
  const int64_t tiles_m = (p_rows + kBM - 1) / kBM, tiles = tiles_m * ((q_rows + v.bn - 1) / v.bn);
  const int64_t bk = kRowBytes / elem_bytes(pr.dtype);
  const int64_t steps = (pr.K + bk * v.kb - 1) / (bk * v.kb);  // ring stages over K
  if (split == 1) return plan_stream_k(tiles_m, tiles, steps, sm_count).active();
  return tiles * split <= 2 * int64_t(sm_count) && steps >= 2 * int64_t(split);
}

// Whether a variant's tiles can take the problem's operand layouts. An MN-major operand is loaded
// in 64-wide chunks (128B swizzling caps the box's inner extent at 64 elements), so each piece a
// CTA or warpgroup takes of it must be whole chunks:
//  * Q: the columns of each wgmma (bn; bn / 2 for narrow tiles, bm = 64, whose two consumer
//    warpgroups split the columns, and for bn = 320, two wgmma n160) and, with Q multicast
//    (mc = 2, one k block per stage), the bn / 2 rows each CTA loads;
//  * P: with P multicast (mp = 2) and one k block per stage, the bm / 2 rows each CTA loads (with
//    kb = 2 each loads a whole k block of all bm rows instead).
// K-major operands take any tile; so do ordinary 128-row tiles with bn a multiple of 64. 320-wide
// tiles (no swap-AB epilogue) refuse swap variants.
inline bool layout_fits(const Problem& pr, const VariantShape& v) {
  const Operand& P = v.swap ? pr.bt : pr.a;
  const Operand& Q = v.swap ? pr.a : pr.bt;
  if (v.swap && v.bn > 256) return false;  // 320-wide tiles store C in one orientation only
  // Q columns per wgmma: narrow tiles split the bn columns over the warpgroups, unless kw = 2
  const int q_cols = v.bm == kBM ? (v.bn > 256 ? v.bn / 2 : v.bn) : v.kw == 2 ? v.bn : v.bn / 2;
  const bool q_ok = Q.kmajor || (q_cols % 64 == 0 && (v.mc <= 1 || v.kb > 1 || (v.bn / v.mc) % 64 == 0));
  const bool p_ok = P.kmajor || v.mp <= 1 || v.kb > 1 || (v.bm / v.mp) % 64 == 0;
  return q_ok && p_ok;
}

// Workspace a launch may use (fly_gemm's workspace argument): stream-K keeps its flags and
// partial tiles there. A null one (or one too small) plans split = 1 as a plain persistent launch.
struct Workspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// A new nonzero value per stream-K launch for its flags (GemmParams::sk_epoch).
inline uint32_t next_sk_epoch() {
  static std::atomic<uint32_t> counter{0};
  uint32_t e = counter.fetch_add(1, std::memory_order_relaxed) + 1;
  if (e == 0) e = counter.fetch_add(1, std::memory_order_relaxed) + 1;
  return e;
}

// force_split: 0 lets choose_split decide, 1 asks for stream-K (with workspace), 2..8 force
// split-K clusters.
template <class Encode>
CUresult plan_gemm(const Problem& pr, const VariantShape& v, int sm_count, Encode encode,
                   Launch* out, int force_split = 0, Workspace ws = {}) {
  GemmParams& p = out->params;
  std::memset(&p, 0, sizeof(p));
  const Operand& P = v.swap ? pr.bt : pr.a;
  const Operand& Q = v.swap ? pr.a : pr.bt;
  // With P multicast each CTA loads half of the P tile's rows (K-major box {64, bm/2}), or with
  // kb = 2 one of the stage's two k blocks (box {64, bm} or {64 mn, 64 k}; no 3-D view of P).
  const CUtensorMapL2promotion l2 = l2_promotion(v.l2p);
  const int kb = std::max(v.kb, 1);
  const bool p_split_k = v.mp > 1 && kb > 1;
  CUresult r = encode_operand(encode, &p.tm_p, P, pr.K, p_split_k ? v.bm : v.bm / std::max(v.mp, 1), pr.dtype, l2,
                              p_split_k ? 1 : kb);
  if (r != CUDA_SUCCESS) return r;
  // With multicast each CTA loads half of the Q tile's rows (K-major box {64, bn/2}), or with
  // kb = 2 (narrow tiles) one of the stage's two k blocks, as P multicast does.
  const bool q_split_k = v.mc > 1 && kb > 1;
  r = encode_operand(encode, &p.tm_q, Q, pr.K, q_split_k ? v.bn : tma_box_rows(v.bn / std::max(v.mc, 1)), pr.dtype,
                     l2, q_split_k ? 1 : kb);
  if (r != CUDA_SUCCESS) return r;
  const int64_t bk = kRowBytes / elem_bytes(pr.dtype);  // k elements of one k block
  const bool whole_step = pr.K >= bk * kb;  // some k step lies wholly inside K
  if (kb > 1 && whole_step && P.kmajor && !p_split_k &&
      (r = encode_operand_3d(encode, &p.tm_p3, P, pr.K, v.bm, kb, pr.dtype, l2)) != CUDA_SUCCESS)
    return r;
  if (kb > 1 && whole_step && Q.kmajor && !q_split_k &&
      (r = encode_operand_3d(encode, &p.tm_q3, Q, pr.K, v.bn, kb, pr.dtype, l2)) != CUDA_SUCCESS)
    return r;
  p.c = pr.c;
  p.bias = pr.bias;
  p.ldc = pr.ldc;
  p.rows = static_cast<int32_t>(P.rows);
  p.cols = static_cast<int32_t>(Q.rows);
  p.k = static_cast<int32_t>(pr.K);
  p.p_kmajor = P.kmajor;
  p.q_kmajor = Q.kmajor;
  p.swap = v.swap;
  p.tiles_m = static_cast<int32_t>((P.rows + v.bm - 1) / v.bm);
  p.tiles_n = static_cast<int32_t>((Q.rows + v.bn - 1) / v.bn);
  const int64_t tiles = static_cast<int64_t>(p.tiles_m) * p.tiles_n;
  const int64_t kb_total = (pr.K + bk * kb - 1) / (bk * kb);  // k steps (ring stages)
  const bool want_sk = force_split == 1;
  int split = force_split > 1 ? force_split : want_sk ? 1 : choose_split(tiles, kb_total, sm_count);
  // The cluster is taken by multicast; narrow tiles, ping-pong consumers and 320-wide tiles have
  // no split-K.
  if (v.mc > 1 || v.mp > 1 || v.bm != kBM || v.pp || v.bn > 256) split = 1;
  split = std::max(1, std::min(split, 8));
  int kbps = static_cast<int>((kb_total + split - 1) / split);
  if (split > 1) split = static_cast<int>((kb_total + kbps - 1) / std::max(kbps, 1));
  if (split < 1) split = 1;
  p.split = split;
  p.kb_per_split = kbps;
  p.c_vec = (reinterpret_cast<uintptr_t>(pr.c) % 8 == 0) && (pr.ldc % 4 == 0);
  // The TMA-store epilogues (epi = 2, 3) write C through a tensor map, when TMA can address C (16-byte
  // aligned base and rows); otherwise (and with swap-AB) those variants store from the registers.
  if (v.epi >= 2 && !v.swap && reinterpret_cast<uintptr_t>(pr.c) % 16 == 0 && (pr.M <= 1 || (pr.ldc * kCBytes) % 16 == 0)) {
    const cuuint64_t dims[2] = {cuuint64_t(pr.N), cuuint64_t(pr.M)};
    const cuuint64_t strides[1] = {map_row_stride(pr.M, pr.ldc, pr.N, kCBytes)};
    const cuuint32_t box[2] = {64, kEpiWarpRows};  // one warp's 16 rows x 64 columns
    p.c_tma = encode_sw128(encode, &p.tm_c, 2, pr.c, dims, strides, box, pr.dtype, CU_TENSOR_MAP_L2_PROMOTION_NONE) ==
              CUDA_SUCCESS;
  }
  p.mc = v.mc > 1 ? v.mc : 1;
  p.k_stagger = v.ks != 0;
  const int mp = v.mp > 1 ? v.mp : 1;
  if (p.mc > 1 || mp > 1) {
    // Multicast clusters walk super tiles of mc tile rows (or mp tile columns), persistently.
    const int cl = p.mc * mp;
    const int64_t supers = (p.tiles_m + p.mc - 1) / p.mc * int64_t((p.tiles_n + mp - 1) / mp);
    const int64_t cap = std::max<int64_t>(1, int64_t(kMaxClusters132[cl]) * sm_count / 132);
    out->cluster = static_cast<unsigned>(cl);
    out->grid = static_cast<unsigned>(cl * std::min(supers, cap));
  } else {
    out->cluster = static_cast<unsigned>(split);
    out->grid = split > 1 ? static_cast<unsigned>(tiles * split)
                          : static_cast<unsigned>(std::min<int64_t>(tiles, sm_count));
    const StreamKPlan sk = want_sk && !v.pp && split == 1 ? plan_stream_k(p.tiles_m, tiles, kb_total, sm_count)
                                                          : StreamKPlan{};
    const int64_t need = sk_workspace_bytes(sk.grid, v.bm, v.bn);
    if (sk.active() && ws.ptr && reinterpret_cast<uintptr_t>(ws.ptr) % 256 == 0 && int64_t(ws.bytes) >= need) {
      p.sk_tiles = static_cast<int32_t>(sk.sk_tiles);
      p.sk_group = sk.group;
      p.sk_epoch = next_sk_epoch();
      p.sk_flags = static_cast<uint32_t*>(ws.ptr);
      p.sk_ws = reinterpret_cast<float*>(static_cast<char*>(ws.ptr) + sk_flags_bytes(sk.grid));
      out->grid = static_cast<unsigned>(sk.grid);
    }
  }
  // Tiles in flight at once: one per CTA of a persistent grid, one per cluster of split-K.
  const int64_t wave = split > 1 ? std::max<int64_t>(1, sm_count / split) : int64_t(out->grid);
  p.strip_m = v.gm > 0 ? v.gm : raster_group(p.tiles_m, p.tiles_n, v.bm, v.bn, std::min(wave, tiles));
  out->smem = static_cast<unsigned>(smem_bytes(v.bn, v.stages, v.epi, v.bm, kb, v.kw));
  return CUDA_SUCCESS;
}

}  // namespace fly::gemm
