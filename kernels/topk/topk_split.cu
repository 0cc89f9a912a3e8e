// SPDX-License-Identifier: Apache-2.0
// Variant entry: split-row TopK for few very long rows. Axes: FLY_THREADS, FLY_CHUNK (the largest
// piece a CTA claims; used by the launcher only). Kernels: init, pass, tie, sort (topk_split.cuh).
#include "topk/topk_split.cuh"

#ifndef FLY_THREADS
#define FLY_THREADS 512
#endif

extern "C" __global__ void __launch_bounds__(FLY_THREADS) fly_topk_split_init(const TopkParams p) {
  fly_topk::split_init_body<FLY_THREADS>(p);
}
extern "C" __global__ void __launch_bounds__(FLY_THREADS) fly_topk_split_pass(const TopkParams p) {
  fly_topk::split_pass_body<FLY_THREADS>(p);
}
extern "C" __global__ void __launch_bounds__(FLY_THREADS) fly_topk_split_tie(const TopkParams p) {
  fly_topk::split_tie_body<FLY_THREADS>(p);
}
extern "C" __global__ void __launch_bounds__(FLY_THREADS) fly_topk_split_sort(const TopkParams p) {
  fly_topk::split_sort_body<FLY_THREADS>(p);
}
