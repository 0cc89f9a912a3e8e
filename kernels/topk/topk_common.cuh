// SPDX-License-Identifier: Apache-2.0
// Device helpers shared by the TopK kernels: order-preserving keys, the row walker with 16-byte
// loads, warp-aggregated slot allocation, radix digit selection and the bitonic sort.
#pragma once
#include <stdint.h>

#include "topk/topk_params.h"

namespace fly_topk {

constexpr unsigned kFull = 0xffffffffu;

// FP32 -> uint32 key whose unsigned order is the wanted rank order (larger key = ranked first).
// Positives get the sign bit set, negatives are inverted, so unsigned order == float order (with
// -0 < +0, as torch's radix select). Every NaN becomes one canonical key: the top one when
// largest (NaN ranks above +inf, like torch), 1 when !largest (NaN is taken last). Real numbers
// map into [0x007fffff, 0xff800000] either way, so key 0 is never produced: it marks empty slots.
__device__ __forceinline__ uint32_t to_key(float v, bool largest) {
  uint32_t u = __float_as_uint(v);
  bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return largest ? (nan ? 0xffffffffu : ord) : (nan ? 1u : ~ord);
}
// Inverse of to_key: exact for numbers; NaN keys give a quiet NaN.
__device__ __forceinline__ float from_key(uint32_t key, bool largest) {
  uint32_t o = largest ? key : ~key;
  uint32_t u = (o & 0x80000000u) ? (o ^ 0x80000000u) : ~o;
  return __uint_as_float(u);
}
// 64-bit composite: larger = ranked first, ties broken by the lower index. Unique per element, so
// sorting composites is deterministic and a radix select over them has no ties.
__device__ __forceinline__ uint64_t composite(uint32_t key, uint32_t idx) {
  return ((uint64_t)key << 32) | (uint32_t)~idx;
}
__device__ __forceinline__ uint32_t comp_index(uint64_t c) { return ~(uint32_t)c; }
__device__ __forceinline__ uint32_t comp_key(uint64_t c) { return (uint32_t)(c >> 32); }

__device__ __forceinline__ float4 ldg4(const float4* p) { return __ldg(p); }

// Walks x[lo, hi) of one row with NT cooperating threads (t = 0..NT-1): a scalar head up to
// 16-byte alignment, 16-byte loads (UNROLL of them in flight per thread), a scalar tail.
// Every thread makes the same number of calls f(index, value, valid) (valid=false past the end),
// so warp collectives inside f are safe. Each thread sees its indices in increasing order.
template <int NT, int UNROLL, class F>
__device__ __forceinline__ void walk_row(const float* row, int lo, int hi, int t, F&& f) {
  const float* p = row + lo;
  int n = hi - lo;
  if (n <= 0) return;
  int head = (int)((((uintptr_t)0 - (uintptr_t)p) & 15u) >> 2);  // elements to 16 B alignment
  if (head > n) head = n;
  if (head > 0) {  // uniform
    bool valid = t < head;
    float v = valid ? p[t] : 0.f;
    f(lo + t, v, valid);
  }
  const int nvec = (n - head) >> 2;
  const float4* q = reinterpret_cast<const float4*>(p + head);
  const int body = lo + head;
  for (int base = 0; base < nvec; base += NT * UNROLL) {
    float4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      int j = base + u * NT + t;
      v[u] = j < nvec ? ldg4(q + j) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      int j = base + u * NT + t;
      bool valid = j < nvec;
      int i = body + 4 * j;
      f(i + 0, v[u].x, valid);
      f(i + 1, v[u].y, valid);
      f(i + 2, v[u].z, valid);
      f(i + 3, v[u].w, valid);
    }
  }
  const int rem = n - head - 4 * nvec;
  if (rem > 0) {  // uniform
    bool valid = t < rem;
    int i = body + 4 * nvec + t;
    float v = valid ? p[i - lo] : 0.f;
    f(i, v, valid);
  }
}

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & 31u; }

// Warp-aggregated slot allocation: one atomic per warp instead of one per element. Must be
// called by all 32 lanes. Returns the slot for lanes with want (undefined otherwise).
__device__ __forceinline__ uint32_t warp_slot(bool want, uint32_t* counter) {
  unsigned b = __ballot_sync(kFull, want);
  if (b == 0) return 0;
  unsigned lane = lane_id();
  int leader = __ffs(b) - 1;
  uint32_t base = 0;
  if ((int)lane == leader) base = atomicAdd(counter, (uint32_t)__popc(b));
  base = __shfl_sync(kFull, base, leader);
  return base + __popc(b & ((1u << lane) - 1u));
}

// Gather step shared by the radix and split paths: composite c (key above index) goes to the
// candidate buffer when its selected bits beat the final bucket (`sure`: always in the top k) or
// equal it (`tie`: in while the bucket's k - kk slots last). All 32 lanes must call it.
__device__ __forceinline__ void gather_candidate(uint64_t c, bool valid, uint64_t prefix, uint64_t mask,
                                                 uint32_t* sure_counter, uint32_t* tie_counter,
                                                 uint64_t* buf, uint32_t k) {
  const uint64_t m = c & mask;
  const bool sure = valid && m > prefix;
  const bool tie = valid && m == prefix;
  const uint32_t s = warp_slot(sure, sure_counter);
  if (sure) buf[s] = c;
  const uint32_t s2 = warp_slot(tie, tie_counter);
  if (tie && s2 < k) buf[s2] = c;
}

// Digit selection of one radix pass, by one full warp over a 256-bin histogram: the digit d with
// count(> d) < kk <= count(>= d). Lane l owns bins 255-8l .. 248-8l (descending).
struct DigitChoice {
  uint32_t digit, above, in_bucket;
};
template <bool kVolatile>
__device__ __forceinline__ DigitChoice select_digit(const uint32_t* hist, uint32_t kk) {
  unsigned lane = lane_id();
  uint32_t c[8];
  uint32_t s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    int b = 255 - 8 * (int)lane - j;
    c[j] = kVolatile ? *(volatile const uint32_t*)(hist + b) : hist[b];
    s += c[j];
  }
  uint32_t incl = s;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    uint32_t o = __shfl_up_sync(kFull, incl, off);
    if ((int)lane >= off) incl += o;
  }
  uint32_t run = incl - s;
  bool found = false;
  DigitChoice r{0, 0, 0};
  if (run < kk && incl >= kk) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (!found && run + c[j] >= kk) {
        found = true;
        r.digit = 255 - 8 * lane - j;
        r.above = run;
        r.in_bucket = c[j];
      }
      run += c[j];
    }
  }
  unsigned who = __ballot_sync(kFull, found);
  int src = who ? __ffs(who) - 1 : 0;
  r.digit = __shfl_sync(kFull, r.digit, src);
  r.above = __shfl_sync(kFull, r.above, src);
  r.in_bucket = __shfl_sync(kFull, r.in_bucket, src);
  return r;
}

// Bitonic sort of buf[0, n) descending (n a power of two), by the NT threads of the block.
// buf may be shared or global memory: __syncthreads orders both within the block.
template <int NT>
__device__ __forceinline__ void bitonic_sort_desc(uint64_t* buf, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < (n >> 1); t += NT) {
        int i = 2 * t - (t & (stride - 1));
        int j = i + stride;
        bool desc = (i & size) == 0;
        uint64_t a = buf[i], b = buf[j];
        if ((a < b) == desc) {
          buf[i] = b;
          buf[j] = a;
        }
      }
      __syncthreads();
    }
  }
}

// Writes the first k sorted composites of buf as (value, int64 index) of output row `row`.
template <int NT>
__device__ __forceinline__ void write_sorted(const TopkParams& p, int64_t row,
                                             const uint64_t* buf) {
  const bool largest = p.largest != 0;
  for (int t = threadIdx.x; t < p.k; t += NT) {
    uint64_t c = buf[t];
    p.values[row * p.ldv + t] = from_key(comp_key(c), largest);
    p.indices[row * p.ldi + t] = (int64_t)comp_index(c);
  }
}

}  // namespace fly_topk
