// SPDX-License-Identifier: Apache-2.0
// The MX GEMM kernels' epilogue straight from the wgmma accumulators (mxfp_wgmma.cu, mxfp_widen.cu):
// + bias, FP16/BF16 rounding, row and column tails clipped, 4-byte paired stores where aligned;
// for split-K variants (FLY_SPLIT > 1) the FP32 partial of a work unit and the reduction kernel
// mxfp_splitk_reduce that both kernels' modules carry.
#pragma once
#include <stdint.h>

#include "common/convert.cuh"
#include "mx/mx_wgmma_params.h"

namespace fly::mxw {

// One work unit: tile t, split q, stages [ks0, ks1) (mx_wgmma_params.h, SplitParams; split_count
// keeps splits <= stages, so no range is empty). Unsplit variants: the tile and all its stages
// (constants, so their code is what it was).
struct Unit {
  int t, q, ks0, ks1;
};
#if defined(FLY_SPLIT) && FLY_SPLIT > 1
__device__ __forceinline__ int splits_of(const SplitParams& p) { return p.splits; }
__device__ __forceinline__ Unit unit_of(const SplitParams& p, int u, int ksteps) {
  const int sp = p.splits, t = u / sp, q = u - t * sp;
  return Unit{t, q, int(int64_t(q) * ksteps / sp), int(int64_t(q + 1) * ksteps / sp)};
}
#else
__device__ __forceinline__ int splits_of(const Params&) { return 1; }
__device__ __forceinline__ Unit unit_of(const Params&, int u, int ksteps) { return Unit{u, 0, 0, ksteps}; }
#endif

// Accumulator i of consumer thread ct: row acc_row(ct, i), column acc_col(ct, i) of the
// warpgroup's 64 x BN block (mx_wgmma_params.h): rows 16 w + lane / 4 (+8), column pairs.
// fix(i, v): the value stored for accumulator i (the widening kernel's NaN rows and columns).
struct KeepAcc {
  __device__ __forceinline__ float operator()(int, float v) const { return v; }
};
// TRANS (the widening kernel's swapped decode variants): the kernel's rows are C's columns and its
// columns C's rows, so element (row, col) goes to c[col][row] and the bias is indexed by row.
template <int BN, class T, class Fix = KeepAcc, bool TRANS = false>
__device__ __forceinline__ void store_acc_tile(const Params& p, int64_t row0, int64_t col0, int ct,
                                               const float (&acc)[BN / 2], Fix fix = Fix()) {
  using fly::from_float;
  using fly::to_float;
  T* c = static_cast<T*>(p.c);
  const T* bias = static_cast<const T*>(p.bias);
  const int64_t r0 = row0 + acc_row(ct, 0);
  if constexpr (TRANS) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = r0 + 8 * h;
      if (row >= p.M) continue;
      const float b = bias ? to_float<T>(bias[row]) : 0.0f;
#pragma unroll
      for (int c8 = 0; c8 < BN / 8; ++c8) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t col = col0 + acc_col(ct, 4 * c8) + e;
          const int i = 4 * c8 + 2 * h + e;
          if (col < p.N) c[col * p.ldc + row] = from_float<T>(fix(i, acc[i]) + b);
        }
      }
    }
  } else {
#pragma unroll
    for (int c8 = 0; c8 < BN / 8; ++c8) {
      const int64_t col = col0 + acc_col(ct, 4 * c8);
      if (col >= p.N) continue;
      const bool two = col + 1 < p.N;
      const float b0 = bias ? to_float<T>(bias[col]) : 0.0f;
      const float b1 = bias && two ? to_float<T>(bias[col + 1]) : 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = r0 + 8 * h;
        if (row >= p.M) continue;
        T* dst = c + row * p.ldc + col;
        const T v0 = from_float<T>(fix(4 * c8 + 2 * h, acc[4 * c8 + 2 * h]) + b0);
        if (two) {
          const T v1 = from_float<T>(fix(4 * c8 + 2 * h + 1, acc[4 * c8 + 2 * h + 1]) + b1);
          if ((reinterpret_cast<uintptr_t>(dst) & 3) == 0) {
            struct alignas(4) Pair { T x, y; };
            *reinterpret_cast<Pair*>(dst) = Pair{v0, v1};
          } else {
            dst[0] = v0;
            dst[1] = v1;
          }
        } else {
          dst[0] = v0;
        }
      }
    }
  }
}

// Split-K: the unit's FP32 partial (no bias, no rounding) to ws[q][M][N], rows / columns clipped,
// 8-byte pairs where aligned.
// TRANS: as store_acc_tile's, ws[q] stays in C's orientation ([p.N][p.M] then).
template <int BN, class Fix = KeepAcc, bool TRANS = false>
__device__ __forceinline__ void store_partial_tile(const SplitParams& p, int q, int64_t row0, int64_t col0, int ct,
                                                   const float (&acc)[BN / 2], Fix fix = Fix()) {
  float* ws = p.ws + int64_t(q) * p.M * p.N;
  const int64_t r0 = row0 + acc_row(ct, 0);
  if constexpr (TRANS) {  // the loop above without the bias, into C's orientation
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = r0 + 8 * h;
      if (row >= p.M) continue;
#pragma unroll
      for (int c8 = 0; c8 < BN / 8; ++c8) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t col = col0 + acc_col(ct, 4 * c8) + e;
          const int i = 4 * c8 + 2 * h + e;
          if (col < p.N) ws[col * p.M + row] = fix(i, acc[i]);
        }
      }
    }
  } else {
#pragma unroll
    for (int c8 = 0; c8 < BN / 8; ++c8) {
      const int64_t col = col0 + acc_col(ct, 4 * c8);
      if (col >= p.N) continue;
      const bool two = col + 1 < p.N;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = r0 + 8 * h;
        if (row >= p.M) continue;
        float* dst = ws + row * p.N + col;
        const float v0 = fix(4 * c8 + 2 * h, acc[4 * c8 + 2 * h]);
        const float v1 = two ? fix(4 * c8 + 2 * h + 1, acc[4 * c8 + 2 * h + 1]) : 0.0f;
        if (two && (reinterpret_cast<uintptr_t>(dst) & 7) == 0) {
          *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
        } else {
          dst[0] = v0;
          if (two) dst[1] = v1;
        }
      }
    }
  }
}

// One column pair of the split-K reduction: the partials summed in split order, + bias, rounded.
template <class T>
__device__ __forceinline__ void reduce_pair(const SplitReduceParams& r, int64_t i, int64_t ppr) {
  using fly::from_float;
  using fly::to_float;
  const int64_t row = i / ppr, col = 2 * (i - row * ppr);
  const bool two = col + 1 < r.N;
  const int64_t plane = int64_t(r.M) * r.N;
  const float* src = r.ws + row * r.N + col;
  const bool vec = two && (reinterpret_cast<uintptr_t>(src) & 7) == 0 && (plane & 1) == 0;
  float v0 = 0.0f, v1 = 0.0f;
  for (int q = 0; q < r.splits; ++q) {  // split order: the same sums on every run
    const float* sq = src + q * plane;
    if (vec) {
      const float2 x = *reinterpret_cast<const float2*>(sq);
      v0 += x.x;
      v1 += x.y;
    } else {
      v0 += sq[0];
      if (two) v1 += sq[1];
    }
  }
  const T* bias = static_cast<const T*>(r.bias);
  if (bias) {
    v0 += to_float<T>(bias[col]);
    if (two) v1 += to_float<T>(bias[col + 1]);
  }
  T* dst = static_cast<T*>(r.c) + row * r.ldc + col;
  if (two && (reinterpret_cast<uintptr_t>(dst) & 3) == 0) {
    struct alignas(4) Pair { T x, y; };
    *reinterpret_cast<Pair*>(dst) = Pair{from_float<T>(v0), from_float<T>(v1)};
  } else {
    dst[0] = from_float<T>(v0);
    if (two) dst[1] = from_float<T>(v1);
  }
}

}  // namespace fly::mxw

#if defined(FLY_SPLIT) && FLY_SPLIT > 1
// Split-K reduction: c[m, n] = round(sum over q = 0 .. splits - 1 of ws[q][m][n] (+ bias[n])),
// one column pair per thread, grid-stride.
extern "C" __global__ void __launch_bounds__(fly::mxw::kReduceThreads)
    mxfp_splitk_reduce(const __grid_constant__ fly::mxw::SplitReduceParams r) {
  const int64_t ppr = (int64_t(r.N) + 1) / 2, total = int64_t(r.M) * ppr;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    if (r.out_bf16) fly::mxw::reduce_pair<__nv_bfloat16>(r, i, ppr);
    else fly::mxw::reduce_pair<__half>(r, i, ppr);
  }
}
#endif
