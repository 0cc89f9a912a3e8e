// TopK kernel parameters and launch planning, shared by the device code (kernels/topk/*.cu), the
// launcher (src/ops/topk.cpp), the tools and the standalone check. Plain C++, stdint only.
#pragma once
#include <stdint.h>

// Per-row state of the split path (several CTAs per row), kept in the caller's workspace.
// The radix select narrows a 64-bit composite (key << 32 | ~index) eight bits per pass:
// `prefix`/`mask` are the bits fixed so far, `kk` how many of the k still come from the bucket
// `prefix` denotes. `done` means every element of that bucket is selected (count == kk).
struct TopkRowState {
  uint64_t prefix;
  uint64_t mask;
  uint32_t kk;
  uint32_t done;
  uint32_t ticket;  // CTAs of the current pass that have finished (the last one selects)
  uint32_t sure;    // gather: next slot for elements above the bucket
  uint32_t tie;     // gather: next slot for elements inside the bucket (starts at k - kk)
  uint32_t pad_;
  uint32_t hist[256];
};
static_assert(sizeof(TopkRowState) % 8 == 0, "row state must keep 8-byte alignment");

struct TopkParams {
  const float* x;
  int64_t ldx;  // elements between rows of x
  float* values;
  int64_t ldv;
  int64_t* indices;
  int64_t ldi;
  int32_t R, C, k;
  int32_t largest;        // 0/1
  int32_t deterministic;  // 0/1
  int32_t kpad;           // radix/split: k rounded up to a power of two (bitonic sort size)
  int32_t cache_row;      // radix: the row's keys stay in shared memory between passes
  int32_t sort_in_smem;   // radix/split: candidates sorted in shared memory (else in ws_cand)
  int32_t splits;         // split: CTAs per row
  int32_t chunk;          // split: elements per CTA (multiple of 4)
  int32_t pass;           // split: radix pass of this launch (0..7)
  int32_t pad_;
  uint64_t* ws_cand;      // [R][kpad] candidate composites, when a path needs them in memory
  TopkRowState* ws_state; // [R] split state
};

// ---- host-side planning (also used by the standalone check) ---------------------------------
// ws_bytes of -1 means the shape's workspace does not fit in 64 bits (callers reject it).
namespace topk_plan {

// Size arithmetic on non-negative values: -1 when the result would not fit in int64 (and -1 in,
// -1 out), so a size query can never wrap around to a small number.
constexpr int64_t kSizeMax = INT64_MAX;
inline int64_t checked_mul(int64_t a, int64_t b) {
  if (a < 0 || b < 0) return -1;
  return b != 0 && a > kSizeMax / b ? -1 : a * b;
}
inline int64_t checked_add(int64_t a, int64_t b) {
  if (a < 0 || b < 0) return -1;
  return a > kSizeMax - b ? -1 : a + b;
}
inline int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v && p <= kSizeMax / 2) p <<= 1;
  return p < v ? -1 : p;
}
inline int64_t align_up(int64_t v, int64_t a) {
  const int64_t t = checked_add(v, a - 1);
  return t < 0 ? -1 : t / a * a;
}

// Shared memory of the radix kernel: 256-bin histogram + state words (2 KiB, see topk_radix.cuh),
// then the sort buffer (kpad u64) and the row cache (C u32).
constexpr int64_t kRadixFixedSmem = 2048;
// Sort buffers above this go to the workspace: a larger one leaves too little room for the cache
// and occupancy, and a 16 Ki-element bitonic sort in one CTA is already slow.
constexpr int64_t kMaxSmemSortElems = 8192;

struct RadixPlan {
  bool cache_row = false;
  bool sort_in_smem = true;
  int64_t smem = 0;
  int64_t ws_bytes = 0;
};
// smem_limit: the device's opt-in limit per block (bytes). cache_limit: largest row (bytes) worth
// caching; caching pays whenever the row is re-read (more than one pass).
inline RadixPlan plan_radix(int64_t R, int64_t C, int64_t k, int64_t smem_limit) {
  RadixPlan p;
  int64_t kpad = next_pow2(k);
  p.sort_in_smem = kpad <= kMaxSmemSortElems;
  int64_t sort_bytes = p.sort_in_smem ? align_up(kpad * 8, 16) : 0;  // cache stays 16 B aligned
  int64_t base = kRadixFixedSmem + sort_bytes;
  int64_t cache_bytes = checked_mul(align_up(C, 4), 4);
  p.cache_row = cache_bytes >= 0 && cache_bytes <= smem_limit - base;
  p.smem = base + (p.cache_row ? cache_bytes : 0);
  p.ws_bytes = p.sort_in_smem ? 0 : checked_mul(checked_mul(R, kpad), 8);
  return p;
}
// Workspace the radix path needs for this shape (device independent: the cache decision does not
// change it).
inline int64_t radix_workspace(int64_t R, int64_t k) {
  int64_t kpad = next_pow2(k);
  return kpad >= 0 && kpad <= kMaxSmemSortElems ? 0 : checked_mul(checked_mul(R, kpad), 8);
}

struct SplitPlan {
  int64_t splits = 1;
  int64_t chunk = 0;
  bool sort_in_smem = true;
  int64_t sort_smem = 0;  // dynamic smem of the sort kernel
  int64_t ws_bytes = 0;
  int64_t state_offset = 0, cand_offset = 0;
};
inline SplitPlan plan_split(int64_t R, int64_t C, int64_t k, int64_t chunk) {
  SplitPlan p;
  p.chunk = align_up(chunk, 4);
  p.splits = (C + p.chunk - 1) / p.chunk;
  int64_t kpad = next_pow2(k);
  p.sort_in_smem = kpad <= 2 * kMaxSmemSortElems;  // the sort kernel has nothing else in smem
  p.sort_smem = p.sort_in_smem ? kpad * 8 : 0;
  p.state_offset = 0;
  p.cand_offset = align_up(checked_mul(R, (int64_t)sizeof(TopkRowState)), 256);
  p.ws_bytes = checked_add(p.cand_offset, checked_mul(checked_mul(R, kpad), 8));  // -1: too large
  return p;
}

}  // namespace topk_plan
