// SPDX-License-Identifier: Apache-2.0
// Small device helpers for memory-bound kernels: 16-byte loads/stores with cache hints, dtype
// conversion to and from float, warp reductions, named barriers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/convert.cuh"  // fly::to_float / fly::from_float

namespace fly {

// Elements of T in one 16-byte vector.
template <class T> struct Vec16 {
  static constexpr int kElems = 16 / sizeof(T);
  union {
    uint4 raw;
    T e[kElems];
  };
};

// Read-once data: stream through L1 without allocating (x of a norm is read exactly once).
// FLY_LD_L2_256B: also ask the L2 to fetch the whole 256-byte block (measured per build, see
// bench/RESULTS.md).
__device__ __forceinline__ uint4 ld16_stream(const void* p) {
  uint4 v;
#if defined(FLY_LD_L2_256B)
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#else
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
#endif
  return v;
}
__device__ __forceinline__ uint4 ld16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
// A norm's output: stored with an L2 evict_last policy, so it stays in L2 for the op that reads
// it next (the following GEMM's activations) instead of being pushed out to HBM first.
// Measured on the H200 (flytune rmsnorm --times, bf16 8192x4096, best variant, L2 flushed before
// each call): evict-first stores (__stcs, FLY_ST_EVICT_FIRST) 36.7 us, plain write-back stores
// (FLY_ST_WB) 37.5 us, evict_last 34.2 us; evict_last on half the lines 35.1 us; evict_last plus
// evict_first loads 34.5 us. The gain is HBM write traffic that happens after the kernel ends
// (ncu: 27-29 MB written to HBM during the kernel against 41-42 MB with evict-first); a following
// compute-bound GEMM hides it (norm + GEMM on its output: 0.5% faster), back-to-back norms pay it
// (6% slower per call, CUDA graph of 20 calls). bench/probes/rmsnorm/rmsnorm_l2_probe.py measures
// all of these.
__device__ __forceinline__ void st16_out(void* p, uint4 v) {
#if defined(FLY_ST_WB)
  *reinterpret_cast<uint4*>(p) = v;
#elif defined(FLY_ST_EVICT_FIRST)
  __stcs(reinterpret_cast<uint4*>(p), v);
#else
  uint64_t pol;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;"
               :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(pol) : "memory");
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace fly
