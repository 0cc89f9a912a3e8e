// SPDX-License-Identifier: Apache-2.0
// Variant entry: small-k TopK (k <= KMAX). Axes: FLY_THREADS (CTA size), FLY_TPR (lanes per
// row), FLY_KMAX (per-lane list length). Launch: grid ceil(R / (THREADS/TPR)), no smem.
#include "topk/topk_small.cuh"

#ifndef FLY_THREADS
#define FLY_THREADS 256
#endif
#ifndef FLY_TPR
#define FLY_TPR 32
#endif
#ifndef FLY_KMAX
#define FLY_KMAX 16
#endif

extern "C" __global__ void __launch_bounds__(FLY_THREADS) fly_topk_small(const TopkParams p) {
  fly_topk::small_body<FLY_THREADS, FLY_TPR, FLY_KMAX>(p);
}
