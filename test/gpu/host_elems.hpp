// SPDX-License-Identifier: Apache-2.0
// FP16 / BF16 / FP32 elements in host byte buffers, for the GPU tests that fill inputs and read
// outputs of any of the three dtypes through one code path (values go through double / float).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "flykernels/flykernels.h"

namespace fly_test {

inline size_t esize(fly_dtype dt) { return dt == FLY_F32 ? 4 : 2; }

// Element i of h, a buffer of dt elements.
inline double load(const std::vector<uint8_t>& h, size_t i, fly_dtype dt) {
  if (dt == FLY_F32) { float f; std::memcpy(&f, &h[i * 4], 4); return f; }
  if (dt == FLY_F16) { __half v; std::memcpy(&v, &h[i * 2], 2); return __half2float(v); }
  __nv_bfloat16 v; std::memcpy(&v, &h[i * 2], 2); return __bfloat162float(v);
}

// f rounded to dt (round to nearest even) into element i of h.
inline void store(std::vector<uint8_t>& h, size_t i, fly_dtype dt, float f) {
  if (dt == FLY_F32) std::memcpy(&h[i * 4], &f, 4);
  else if (dt == FLY_F16) { __half v = __float2half(f); std::memcpy(&h[i * 2], &v, 2); }
  else { __nv_bfloat16 v = __float2bfloat16(f); std::memcpy(&h[i * 2], &v, 2); }
}

}  // namespace fly_test
