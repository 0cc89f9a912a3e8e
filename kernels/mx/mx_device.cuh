// SPDX-License-Identifier: Apache-2.0
// Device pieces the MX weight-only kernels share (mx_decode.cu, mx_prefill.cu): the variant's
// weight format, and the shared-memory load and BF16 multiply they issue as inline PTX.
#pragma once
#include <stdint.h>

// The weight format of the variant (tools/flygen: FLY_FMT_IS_E4M3 / FLY_FMT_IS_E2M1).
#if defined(FLY_FMT_IS_E2M1)
constexpr bool kFp4 = true;
#elif defined(FLY_FMT_IS_E4M3)
constexpr bool kFp4 = false;
#else
#error "MX weight-only kernel: FLY_FMT_IS_E4M3 or FLY_FMT_IS_E2M1 must be defined"
#endif

namespace fly::mxk {

// 16 bytes of shared memory (a shared-space load: a generic pointer made ptxas emit LD).
__device__ __forceinline__ uint4 lds16(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
// Two BF16 products, each the exact product rounded once (to nearest even).
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

}  // namespace fly::mxk
