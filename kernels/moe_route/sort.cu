// SPDX-License-Identifier: Apache-2.0
// The stable counting sort of the T*k (token, slot) pairs by expert, on the device, in three
// launches with no host synchronization (docs/moe_route.md):
//   moe_sort_hist: chunk c's count per bucket (bucket E: ids outside [0, E)) -> counts[b][c];
//   moe_sort_scan: one CTA, the exclusive scan of counts in bucket-major order (bucket b's chunk c
//                  starts there), and offsets[e] = the start of bucket e + 1 (F.grouped_mm's offs);
//   moe_sort_rank: chunk c again, 256 pairs at a time in order: a pair's row is its bucket's
//                  running start plus the pairs of that bucket before it in this pass (earlier
//                  warps' counts, then lanes below it in its warp: __match_any_sync), so pairs of
//                  one expert keep their order. Integer counts only: deterministic.
//
// Variant constants (tools/flygen): FLY_TPB, threads per CTA of hist and rank.
#include "moe_route/moe_common.cuh"

namespace {

constexpr int kThreads = FLY_TPB;
constexpr int kWarps = kThreads / 32;
constexpr int kScanThreads = 1024;

__device__ __forceinline__ int bucket_of(const MoeSortParams& p, int64_t i) {
  const int64_t t = i / p.k, j = i - t * p.k;
  const int64_t e = moe::load_id(p.ids, p.id_dtype, t * p.ld_ids + j);
  return e >= 0 && e < p.E ? int(e) : p.E;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) moe_sort_hist(const MoeSortParams p) {
  __shared__ int hist[kMoeMaxExperts + 1];
  const int c = blockIdx.x;
  for (int b = threadIdx.x; b <= p.E; b += kThreads) hist[b] = 0;
  __syncthreads();
  const int64_t lo = int64_t(c) * p.chunk, hi = min(p.N, lo + p.chunk);
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) atomicAdd(&hist[bucket_of(p, i)], 1);
  __syncthreads();
  for (int b = threadIdx.x; b <= p.E; b += kThreads) p.counts[int64_t(b) * p.chunks + c] = hist[b];
}

extern "C" __global__ void __launch_bounds__(kScanThreads) moe_sort_scan(const MoeSortParams p) {
  __shared__ int warp_tot[kScanThreads / 32];
  const int64_t L = int64_t(p.E + 1) * p.chunks;
  const int64_t per = (L + kScanThreads - 1) / kScanThreads;
  const int64_t lo = min(L, int64_t(threadIdx.x) * per), hi = min(L, lo + per);
  int sum = 0;
  for (int64_t i = lo; i < hi; ++i) sum += p.counts[i];
  // Exclusive scan of the per-thread sums over the CTA.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = sum;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = warp_tot[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += v;
    }
    warp_tot[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  int run = incl - sum + (warp > 0 ? warp_tot[warp - 1] : 0);
  for (int64_t i = lo; i < hi; ++i) {
    const int v = p.counts[i];
    p.counts[i] = run;
    run += v;
  }
  __syncthreads();
  // offsets[e]: where bucket e + 1 starts, i.e. the end of expert e.
  for (int e = threadIdx.x; e < p.E; e += kScanThreads) p.offsets[e] = p.counts[int64_t(e + 1) * p.chunks];
}

extern "C" __global__ void __launch_bounds__(kThreads) moe_sort_rank(const MoeSortParams p) {
  __shared__ int run[kMoeMaxExperts + 1];
  __shared__ int wcnt[kWarps][kMoeMaxExperts + 1];
  const int c = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int b = threadIdx.x; b <= p.E; b += kThreads) {
    run[b] = p.counts[int64_t(b) * p.chunks + c];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) wcnt[w][b] = 0;
  }
  __syncthreads();
  const int64_t lo = int64_t(c) * p.chunk, hi = min(p.N, lo + p.chunk);
  const uint32_t below = (1u << lane) - 1u;
  for (int64_t base = lo; base < hi; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const bool active = i < hi;
    const int b = active ? bucket_of(p, i) : -1;
    const uint32_t peers = __match_any_sync(0xffffffffu, b);
    const int wrank = __popc(peers & below);
    const bool leader = (peers & below) == 0;
    if (active && leader) wcnt[warp][b] = __popc(peers);
    __syncthreads();
    if (active) {
      int pos = run[b] + wrank;
      for (int w = 0; w < warp; ++w) pos += wcnt[w][b];
      const int64_t t = i / p.k, j = i - t * p.k;
      p.row_of[t * p.ld_row + j] = pos;
      p.pair_of[pos] = int32_t(i);
    }
    __syncthreads();
    if (active && leader) {
      atomicAdd(&run[b], __popc(peers));
      wcnt[warp][b] = 0;
    }
    __syncthreads();
  }
}
