// SPDX-License-Identifier: Apache-2.0
// Loads and stores by a runtime dtype (fly_dtype values): the moe_route kernels serve every
// element type from one image, the dtype being warp-uniform (one branch per access).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/convert.cuh"
#include "moe_route/moe_route_params.h"

namespace moe {

__device__ __forceinline__ float load_f(const void* p, int dt, int64_t i) {
  if (dt == kMoeF32) return static_cast<const float*>(p)[i];
  if (dt == kMoeBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return __half2float(static_cast<const __half*>(p)[i]);
}
__device__ __forceinline__ void store_f(void* p, int dt, int64_t i, float v) {
  if (dt == kMoeF32) static_cast<float*>(p)[i] = v;
  else if (dt == kMoeBF16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else static_cast<__half*>(p)[i] = __float2half_rn(v);
}
__device__ __forceinline__ int64_t load_id(const void* p, int dt, int64_t i) {
  return dt == kMoeI64 ? static_cast<const int64_t*>(p)[i] : int64_t(static_cast<const int32_t*>(p)[i]);
}
__device__ __forceinline__ void store_id(void* p, int dt, int64_t i, int64_t v) {
  if (dt == kMoeI64) static_cast<int64_t*>(p)[i] = v;
  else static_cast<int32_t*>(p)[i] = int32_t(v);
}

// Warp reductions, butterfly order (every lane ends with the same value; deterministic).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace moe
