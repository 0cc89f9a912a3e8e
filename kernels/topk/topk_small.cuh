// SPDX-License-Identifier: Apache-2.0
// Small-k TopK: a group of TPR lanes (a warp or part of one) per row, several rows per CTA.
// Each lane keeps its own sorted top-KMAX in registers while streaming the row with 16-byte
// loads; the group then merges its lists with k rounds of a shuffle arg-max.
#pragma once
#include "topk/topk_common.cuh"

namespace fly_topk {

template <int THREADS, int TPR, int KMAX>
__device__ __forceinline__ void small_body(const TopkParams& p) {
  static_assert(TPR >= 2 && TPR <= 32 && (TPR & (TPR - 1)) == 0,
                "a row's lanes must be a power-of-two part of one warp (shuffle merge)");
  static_assert(THREADS % 32 == 0 && THREADS >= 32 && THREADS <= 1024, "whole warps per CTA");
  static_assert(KMAX >= 1 && KMAX <= 32, "the per-lane list lives in 2*KMAX registers");
  constexpr int RPC = THREADS / TPR;  // rows per CTA
  constexpr int UNROLL = 4;           // 16-byte loads in flight per lane

  const int g = threadIdx.x / TPR;
  const int t = threadIdx.x % TPR;
  const int64_t row = (int64_t)blockIdx.x * RPC + g;
  const bool active = row < p.R;
  const bool largest = p.largest != 0;

  // Sorted descending by key; equal keys keep arrival order, which is increasing index within a
  // lane (walk_row), so each list is ordered by (key desc, index asc). Empty slots have key 0
  // (never a real key) and index ~0, i.e. composite 0, below every element.
  uint32_t keys[KMAX], idx[KMAX];
#pragma unroll
  for (int j = 0; j < KMAX; ++j) {
    keys[j] = 0;
    idx[j] = 0xffffffffu;
  }
  const float* xr = p.x + (active ? row : 0) * p.ldx;
  walk_row<TPR, UNROLL>(xr, 0, active ? p.C : 0, t, [&](int i, float v, bool valid) {
    uint32_t kv = to_key(v, largest);
    if (valid && kv > keys[KMAX - 1]) {
      // Insert after every entry with key >= kv; unrolled selects keep the list in registers.
#pragma unroll
      for (int j = KMAX - 1; j > 0; --j) {
        bool shift = kv > keys[j - 1];
        bool here = !shift && kv > keys[j];
        keys[j] = shift ? keys[j - 1] : (here ? kv : keys[j]);
        idx[j] = shift ? idx[j - 1] : (here ? (uint32_t)i : idx[j]);
      }
      if (kv > keys[0]) {
        keys[0] = kv;
        idx[0] = (uint32_t)i;
      }
    }
  });

  // Merge: round r takes the best head of the group (composites are unique, so exactly one lane
  // owns it) and that lane pops its list. Any element of the row's top-k is within its lane's
  // top-KMAX because k <= KMAX, so k rounds suffice. All lanes of the warp run every round.
  for (int r = 0; r < p.k; ++r) {
    uint64_t head = composite(keys[0], idx[0]);
    if (keys[0] == 0) head = 0;
    uint64_t best = head;
#pragma unroll
    for (int off = TPR / 2; off > 0; off >>= 1) {
      uint64_t o = __shfl_xor_sync(kFull, best, off, TPR);
      best = o > best ? o : best;
    }
    const bool pop = head == best;
#pragma unroll
    for (int j = 0; j < KMAX - 1; ++j) {
      keys[j] = pop ? keys[j + 1] : keys[j];
      idx[j] = pop ? idx[j + 1] : idx[j];
    }
    if (pop) {
      keys[KMAX - 1] = 0;
      idx[KMAX - 1] = 0xffffffffu;
    }
    if (active && t == (r & (TPR - 1))) {
      p.values[row * p.ldv + r] = from_key(comp_key(best), largest);
      p.indices[row * p.ldi + r] = (int64_t)comp_index(best);
    }
  }
}

}  // namespace fly_topk
