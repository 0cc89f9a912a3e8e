// The MX GEMM kernels' epilogue straight from the wgmma accumulators (mxfp_wgmma.cu, mxfp_widen.cu):
// + bias, FP16/BF16 rounding, row and column tails clipped, 4-byte paired stores where aligned.
#pragma once
#include <stdint.h>

#include "common/convert.cuh"
#include "mx/mx_wgmma_params.h"

namespace fly::mxw {

// Accumulator i of consumer thread ct: row acc_row(ct, i), column acc_col(ct, i) of the
// warpgroup's 64 x BN block (mx_wgmma_params.h): rows 16 w + lane / 4 (+8), column pairs.
// fix(i, v): the value stored for accumulator i (the widening kernel's NaN rows and columns).
struct KeepAcc {
  __device__ __forceinline__ float operator()(int, float v) const { return v; }
};
template <int BN, class T, class Fix = KeepAcc>
__device__ __forceinline__ void store_acc_tile(const Params& p, int64_t row0, int64_t col0, int ct,
                                               const float (&acc)[BN / 2], Fix fix = Fix()) {
  using fly::from_float;
  using fly::to_float;
  T* c = static_cast<T*>(p.c);
  const T* bias = static_cast<const T*>(p.bias);
  const int64_t r0 = row0 + acc_row(ct, 0);
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

}  // namespace fly::mxw
