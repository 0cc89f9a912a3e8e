// SPDX-License-Identifier: Apache-2.0
// Parameters of the grouped GEMM kernel (kernels/gemm/gemm_grouped_sm90.cu), shared by host and
// device: the dense kernel's GemmParams core plus the grouped tail (gemm_grouped.h).
//
// How the core's fields read in grouped mode (src/ops/grouped_gemm.cpp fills them):
//   tm_p   A [T, K] row-major (K-major P): one 2-D map over all T rows, box {64 k, BM}. A tile
//          starts at its unit's row0 (any row: TMA takes any coordinate), rows past T zero-filled.
//   tm_q   B [G, K, N] as one 3-D map with the group as the outer coordinate (all groups share K
//          and N, so no per-group maps): K-major (B's K contiguous) dims {K, N, G}, box
//          {64, BN, 1}; MN-major (N contiguous) dims {N, K, G}, box {64, 64, 1}.
//   c, ldc C [T, N] row-major; bias [G, N] (or null), row g at bias + g * bias_group_stride.
//   rows = T, cols = N, k = K, p_kmajor = 1, q_kmajor, tiles_n = ceil(N / BN), c_vec as dense.
//   Unused: tm_p3, tm_q3, tm_c, swap (0), tiles_m, strip_m, split (1), stream-K fields (0).
#pragma once

#include "gemm/gemm_grouped.h"
#include "gemm/gemm_params.h"

namespace fly::gemm {

struct GroupedGemmParams {
  GemmParams core;
  GroupedTail tail;
};

}  // namespace fly::gemm
