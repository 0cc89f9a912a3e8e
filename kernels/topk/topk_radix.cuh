// SPDX-License-Identifier: Apache-2.0
// Large-k TopK, one CTA per row: radix select over the 64-bit composite (key << 32 | ~index),
// eight bits per pass, to find the bucket holding the k-th element; then gather the k survivors
// and bitonic-sort only them. Pass 0 reads the row from global memory (16-byte loads) and, when it
// fits, keeps its keys in shared memory so later passes and the gather never touch DRAM again.
#pragma once
#include "topk/topk_common.cuh"

namespace fly_topk {

struct RadixSmemState {
  uint64_t prefix, mask;
  uint32_t kk, done, sure, tie;
};
static_assert(1024 + sizeof(RadixSmemState) <= topk_plan::kRadixFixedSmem,
              "histogram + state must fit the fixed smem header the planner reserves");

// Calls f(index, key, valid) for every element of the row with a uniform trip count: from the
// shared-memory cache (uint4 reads) or from global memory.
template <int NT, class F>
__device__ __forceinline__ void radix_for_each_key(const float* xr, const uint32_t* cache,
                                                   bool use_cache, int C, bool largest, F&& f) {
  if (use_cache) {
    const int n4 = (C + 3) >> 2;
    const uint4* c4 = reinterpret_cast<const uint4*>(cache);
    for (int base = 0; base < n4; base += NT) {
      int j = base + (int)threadIdx.x;
      bool ok = j < n4;
      uint4 v = ok ? c4[j] : make_uint4(0, 0, 0, 0);
      int i = 4 * j;
      f(i + 0, v.x, ok && i + 0 < C);
      f(i + 1, v.y, ok && i + 1 < C);
      f(i + 2, v.z, ok && i + 2 < C);
      f(i + 3, v.w, ok && i + 3 < C);
    }
  } else {
    walk_row<NT, 4>(xr, 0, C, (int)threadIdx.x,
                    [&](int i, float v, bool valid) { f(i, to_key(v, largest), valid); });
  }
}

template <int NT>
__device__ __forceinline__ void radix_body(const TopkParams& p) {
  static_assert(NT >= 256 && NT <= 1024 && NT % 32 == 0, "histogram clear assumes >= 256 threads");
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t* hist = reinterpret_cast<uint32_t*>(smem);
  RadixSmemState* st = reinterpret_cast<RadixSmemState*>(smem + 1024);
  uint64_t* sortbuf = reinterpret_cast<uint64_t*>(smem + topk_plan::kRadixFixedSmem);
  uint32_t* cache = reinterpret_cast<uint32_t*>(
      smem + topk_plan::kRadixFixedSmem +
      (p.sort_in_smem ? (((size_t)p.kpad * 8 + 15) & ~(size_t)15) : 0));  // = plan_radix

  const int64_t row = blockIdx.x;
  const float* xr = p.x + row * p.ldx;
  const bool largest = p.largest != 0;
  const bool use_cache = p.cache_row != 0;
  const int C = p.C;
  const int tid = threadIdx.x;

  if (tid == 0) {
    st->prefix = 0;
    st->mask = 0;
    st->kk = (uint32_t)p.k;
    st->done = 0;
  }
  if (tid < 256) hist[tid] = 0;
  __syncthreads();

  // Pass 0: top byte of the key, straight from global memory; fills the cache.
  walk_row<NT, 4>(xr, 0, C, tid, [&](int i, float v, bool valid) {
    if (valid) {
      uint32_t key = to_key(v, largest);
      if (use_cache) cache[i] = key;
      atomicAdd(&hist[key >> 24], 1u);
    }
  });
  __syncthreads();

  // Non-deterministic mode stops after the 4 key bytes (ties at the threshold: any of them);
  // deterministic mode goes on through the index bytes until the bucket holds exactly kk.
  const int npass = p.deterministic ? 8 : 4;
  for (int pass = 0;;) {
    if (tid < 32) {
      DigitChoice d = select_digit<false>(hist, st->kk);
      if (tid == 0) {
        int shift = 56 - 8 * pass;
        uint32_t kk = st->kk - d.above;
        st->prefix |= (uint64_t)d.digit << shift;
        st->mask |= (uint64_t)0xff << shift;
        st->kk = kk;
        st->done = d.in_bucket == kk;
      }
    }
    __syncthreads();
    ++pass;
    if (st->done || pass == npass) break;  // uniform: everyone reads after the barrier
    const uint64_t prefix = st->prefix, mask = st->mask;
    const int shift = 56 - 8 * pass;
    if (tid < 256) hist[tid] = 0;
    __syncthreads();
    radix_for_each_key<NT>(xr, cache, use_cache, C, largest, [&](int i, uint32_t key, bool valid) {
      uint64_t c = composite(key, (uint32_t)i);
      if (valid && (c & mask) == prefix) atomicAdd(&hist[(uint32_t)(c >> shift) & 255u], 1u);
    });
    __syncthreads();
  }

  // Gather: composites above the bucket are all in (k - kk of them); the bucket supplies kk
  // (exactly its size when done, else the first kk to claim a slot: equal keys, any index).
  const uint64_t prefix = st->prefix, mask = st->mask;
  const uint32_t k = (uint32_t)p.k;
  uint64_t* buf = p.sort_in_smem ? sortbuf : p.ws_cand + row * p.kpad;
  __syncthreads();  // all reads of st above happen before thread 0 rewrites its counters
  if (tid == 0) {
    st->sure = 0;
    st->tie = k - st->kk;
  }
  for (int i = (int)k + tid; i < p.kpad; i += NT) buf[i] = 0;  // padding sorts last
  __syncthreads();
  radix_for_each_key<NT>(xr, cache, use_cache, C, largest, [&](int i, uint32_t key, bool valid) {
    gather_candidate(composite(key, (uint32_t)i), valid, prefix, mask, &st->sure, &st->tie, buf, k);
  });
  __syncthreads();
  bitonic_sort_desc<NT>(buf, p.kpad);
  write_sorted<NT>(p, row, buf);
}

}  // namespace fly_topk
