// SPDX-License-Identifier: Apache-2.0
// Variant entry: radix-select TopK, one CTA per row (any k). Axis: FLY_THREADS.
// Launch: grid R, dynamic smem from topk_plan::plan_radix.
#include "topk/topk_radix.cuh"

#ifndef FLY_THREADS
#define FLY_THREADS 512
#endif

extern "C" __global__ void __launch_bounds__(FLY_THREADS) fly_topk_radix(const TopkParams p) {
  fly_topk::radix_body<FLY_THREADS>(p);
}
