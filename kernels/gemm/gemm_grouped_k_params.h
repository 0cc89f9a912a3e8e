// SPDX-License-Identifier: Apache-2.0
// Ragged-K grouped GEMM (the weight gradient of F.grouped_mm: dB_g = A_g^T @ dC_g), shared by
// host and device: parameters of kernels/gemm/gemm_grouped_k_sm90.cu and the work decomposition
// (checked on the CPU by test/cpu/test_gemm_grouped_k.cpp).
//
//   out[g] = a[:, k_begin(g) : k_end(g)] @ b[k_begin(g) : k_end(g), :]   for g = 0 .. G-1
//   a [M, Ktot] (M or K contiguous), b [Ktot, N] (N or K contiguous), out [G, M, N] row-major,
//   offs [G] int32 on the device: cumulative group ends along K (torch._grouped_mm's 2-D x 2-D).
//
// In the GEMM core's terms P = a (rows M), Q = b^T (rows N), D = out[g]. Every unit is one BM x BN
// tile of one group's output; a group's k blocks start at its first k (any alignment: TMA takes
// any coordinate) and its TMA maps end at its last (the ragged dimension's global extent is the
// group's end, so the k tail of its last block reads as zeros, never as the next group's data).
// Those per-group maps are written on the device (fly_grouped_gemm_k_maps, the same module) into
// the caller's workspace: no host sync, so a call can be captured in a CUDA graph.
//
// How the core's fields read (src/ops/grouped_gemm.cpp fills them):
//   tm_p, tm_q  the template maps over all of Ktot (a 2-D map of a and of b^T, as the dense
//               kernel's encode_operand makes them); each group's copy differs in one extent.
//   c, ldc      out's group 0 (row stride ldc); group g at c + g * c_group_stride.
//   rows = M, cols = N, k = Ktot, p_kmajor, q_kmajor, tiles_m, tiles_n, c_vec as dense.
//   Unused: tm_p3, tm_q3, tm_c, bias (none in this mode), swap, strip_m, split, stream-K fields.
#pragma once

#include <stdint.h>

#include "gemm/gemm_grouped.h"  // FLY_GEMM_HD
#include "gemm/gemm_params.h"

namespace fly::gemm {

// Bytes of workspace per group: two 128-byte tensor maps (a's, then b's), 128-byte aligned.
constexpr int64_t kGroupedKMapBytes = 2 * 128;

struct GroupedKParams {
  GemmParams core;
  CUtensorMap* maps;       // workspace: maps[2 g] = a's map of group g, maps[2 g + 1] = b's
  const int32_t* offs;     // [groups] cumulative group ends along K (device)
  int32_t groups;
  int32_t ktot;            // the ragged dimension's length: every end is clamped to it
  int64_t c_group_stride;  // elements between out[g] and out[g + 1]
  int64_t units;           // groups * tiles_m * tiles_n
};

// Group g's k range [*kb, *ke): begin = offs[g - 1] (0 for g = 0), end = offs[g], both clamped
// into [0, ktot] and end >= begin. Bad offsets (negative, decreasing, past ktot) therefore give an
// empty or shortened range, never one outside the tensors: a decreasing entry is an empty group.
FLY_GEMM_HD void grouped_k_range(const int32_t* offs, int32_t g, int32_t ktot, int32_t* kb, int32_t* ke) {
  int32_t b = g > 0 ? offs[g - 1] : 0;
  b = b < 0 ? 0 : (b > ktot ? ktot : b);
  int32_t e = offs[g];
  e = e < b ? b : (e > ktot ? ktot : e);
  *kb = b;
  *ke = e;
}

// Unit t (0 <= t < groups * tiles_m * tiles_n) -> (group, tile row, tile column): group after
// group, and inside a group down the tile rows first (the CTAs in flight share b's column tiles).
struct GroupedKUnit {
  int32_t group, tm, tn;
};
FLY_GEMM_HD GroupedKUnit grouped_k_unit(int64_t t, int32_t tiles_m, int32_t tiles_n) {
  const int64_t per = int64_t(tiles_m) * tiles_n;
  GroupedKUnit u;
  u.group = int32_t(t / per);
  const int64_t r = t - int64_t(u.group) * per;
  u.tm = int32_t(r % tiles_m);
  u.tn = int32_t(r / tiles_m);
  return u;
}

// k blocks (64 wide) of a range of `len` elements.
FLY_GEMM_HD int32_t grouped_k_blocks(int32_t len, int32_t bk) { return len <= 0 ? 0 : (len + bk - 1) / bk; }

}  // namespace fly::gemm
