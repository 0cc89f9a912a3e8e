// Few very long rows: each row is split over `splits` CTAs (chunk elements each) so the whole GPU
// reads it. Same radix select as topk_radix.cuh, but one launch per pass: every CTA adds its
// chunk's histogram into the row's histogram in the workspace, and the CTA that finishes last
// (ticket) picks the digit and advances the row's state for the next launch.
// Launch sequence (one stream): init(R) -> pass 0..npass-1 (splits x R) -> gather (splits x R)
// -> sort(R).
#pragma once
#include "topk/topk_common.cuh"

namespace fly_topk {

template <int NT>
__device__ __forceinline__ void split_init_body(const TopkParams& p) {
  TopkRowState* st = p.ws_state + blockIdx.x;
  for (int b = threadIdx.x; b < 256; b += NT) st->hist[b] = 0;
  if (threadIdx.x == 0) {
    st->prefix = 0;
    st->mask = 0;
    st->kk = (uint32_t)p.k;
    st->done = 0;
    st->ticket = 0;
    st->sure = 0;
    st->tie = 0;
  }
}

template <int NT>
__device__ __forceinline__ void split_pass_body(const TopkParams& p) {
  static_assert(NT >= 256 && NT % 32 == 0, "histogram loops assume >= 256 threads");
  __shared__ uint32_t hist[256];
  __shared__ int is_last;
  const int64_t row = blockIdx.y;
  TopkRowState* st = p.ws_state + row;
  if (st->done) return;  // selected in an earlier pass (written by an earlier launch)
  const uint64_t prefix = st->prefix, mask = st->mask;
  const uint32_t kk = st->kk;
  const int shift = 56 - 8 * p.pass;
  const bool largest = p.largest != 0;
  const int tid = threadIdx.x;
  if (tid < 256) hist[tid] = 0;
  __syncthreads();
  const int lo = (int)blockIdx.x * p.chunk;
  const int hi = min(p.C, lo + p.chunk);
  walk_row<NT, 4>(p.x + row * p.ldx, lo, hi, tid, [&](int i, float v, bool valid) {
    uint64_t c = composite(to_key(v, largest), (uint32_t)i);
    if (valid && (c & mask) == prefix) atomicAdd(&hist[(uint32_t)(c >> shift) & 255u], 1u);
  });
  __syncthreads();
  if (tid < 256 && hist[tid] != 0) atomicAdd(&st->hist[tid], hist[tid]);
  __threadfence();  // our bins are visible before our ticket
  __syncthreads();
  if (tid == 0) is_last = atomicAdd(&st->ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  if (tid < 32) {
    DigitChoice d = select_digit<true>(st->hist, kk);  // volatile: other CTAs' atomics, via L2
    if (tid == 0) {
      uint32_t nk = kk - d.above;
      st->prefix = prefix | ((uint64_t)d.digit << shift);
      st->mask = mask | ((uint64_t)0xff << shift);
      st->kk = nk;
      st->done = d.in_bucket == nk;
      st->ticket = 0;
      st->sure = 0;
      st->tie = (uint32_t)p.k - nk;
    }
  }
  __syncthreads();
  if (tid < 256) st->hist[tid] = 0;  // ready for the next pass's launch
}

template <int NT>
__device__ __forceinline__ void split_gather_body(const TopkParams& p) {
  const int64_t row = blockIdx.y;
  TopkRowState* st = p.ws_state + row;
  const uint64_t prefix = st->prefix, mask = st->mask;
  const uint32_t k = (uint32_t)p.k;
  const bool largest = p.largest != 0;
  uint64_t* buf = p.ws_cand + row * p.kpad;
  const int lo = (int)blockIdx.x * p.chunk;
  const int hi = min(p.C, lo + p.chunk);
  walk_row<NT, 4>(p.x + row * p.ldx, lo, hi, (int)threadIdx.x, [&](int i, float v, bool valid) {
    gather_candidate(composite(to_key(v, largest), (uint32_t)i), valid, prefix, mask, &st->sure, &st->tie, buf, k);
  });
}

template <int NT>
__device__ __forceinline__ void split_sort_body(const TopkParams& p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t row = blockIdx.x;
  uint64_t* g = p.ws_cand + row * p.kpad;
  uint64_t* buf = p.sort_in_smem ? reinterpret_cast<uint64_t*>(smem) : g;
  for (int i = threadIdx.x; i < p.kpad; i += NT) {
    uint64_t v = i < p.k ? g[i] : 0;
    if (p.sort_in_smem || i >= p.k) buf[i] = v;
  }
  __syncthreads();
  bitonic_sort_desc<NT>(buf, p.kpad);
  write_sorted<NT>(p, row, buf);
}

}  // namespace fly_topk
