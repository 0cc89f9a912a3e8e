// SPDX-License-Identifier: Apache-2.0
// TopK kernel parameters and launch planning, shared by the device code (kernels/topk/*.cu), the
// launcher (src/ops/topk.cpp), the tools and the standalone check. Plain C++, stdint only.
#pragma once
#include <stdint.h>

// Per-row state of the split path (several CTAs per row), kept in the caller's workspace.
// A radix select over the 32-bit key in three levels of 11, 11 and 10 bits. B_l is the bucket
// chosen at level l (the elements whose key agrees with `prefix` under `mask`); pass l+1 reads
// B_{l-1} (from x or from a compaction buffer holding a superset), sends the elements above B_l
// to the candidate list (they are in the top k for sure), histograms B_l's next digit and, when
// B_l is small, compacts it into a buffer so the next pass reads that instead of x. When B_l is
// resolved (`final`: it holds exactly `kk` elements, or the key is complete) the pass gathers it.
constexpr int kSplitBins = 2048;
constexpr int kSplitLaunches = 5;  // passes 0..3 and the deterministic tie pass
struct TopkSplitState {
  uint32_t prefix_prev, mask_prev;  // B_{l-1}: the set the next pass reads
  uint32_t prefix, mask;            // B_l
  uint32_t kk;                      // how many of the k still come from B_l
  uint32_t cnt;                     // |B_l|
  uint32_t src;                     // where the next pass reads B_{l-1}: 0 x, 1 buffer A, 2 buffer B
  uint32_t src_count;               // entries in that buffer
  uint32_t compact;                 // the next pass compacts B_l (into A at level 0, B at level 1)
  uint32_t final_;                  // B_l is resolved: the next pass gathers it
  uint32_t straddle;                // deterministic, key complete, more ties than kk: tie pass
  uint32_t finished;                // the row's output is written
  uint32_t sure;                    // candidate slots taken by elements above the bucket
  uint32_t tie;                     // slots taken among the bucket's kk
  uint32_t fill[2];                 // compaction counters (A, B)
  uint32_t ticket[kSplitLaunches];  // CTAs of a launch that have finished (the last one selects)
  uint32_t next[kSplitLaunches];    // next piece to claim, per launch
  uint32_t pad_[2];
  uint32_t hist[3][kSplitBins];     // digit histograms of levels 0..2
};
static_assert(sizeof(TopkSplitState) % 16 == 0, "row state must keep 16-byte alignment");

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
  int32_t splits;         // split: CTAs per row (each claims pieces until the row is done)
  int32_t chunk;          // split: elements per piece (multiple of 4)
  int32_t pass;           // split: launch index (0..3 radix passes, 4 the deterministic tie pass)
  int32_t pieces;         // split: pieces of a row of x
  int32_t cap_a, cap_b;   // split: compaction buffer capacities (entries per row)
  int32_t ldt;            // split: tie counters per row
  int32_t pad_;
  uint64_t* ws_cand;      // [R][kpad] candidate composites, when a path needs them in memory
  TopkSplitState* ws_state;  // [R] split state
  uint64_t* ws_buf_a;     // split: [R][cap_a] composites of B_0
  uint64_t* ws_buf_b;     // split: [R][cap_b] composites of B_1
  uint32_t* ws_tiecnt;    // split: [R][ldt] ties per piece (deterministic tie pass)
  uint64_t* ws_ties;      // split: [R][kSplitSmallTies] the k-th key's elements (deterministic)
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

// Split path: pieces of `chunk` elements (the variant's axis is the largest piece; rows that give
// fewer than ~kSplitTargetPieces pieces in all get smaller ones, down to kSplitMinChunk), claimed
// by the row's CTAs one at a time. The plan is device independent (the CTA count is not part of
// it), so the workspace query does not depend on the device.
constexpr int64_t kSplitMinChunk = 2048;
constexpr int64_t kSplitTargetPieces = 2048;
constexpr int64_t kSplitMaxSmemSort = 8192;  // sort buffers beyond this stay in the workspace
// Deterministic mode: up to this many elements sharing the k-th key are gathered and sorted by
// index in the row's last CTA; more take the tie pass (per-piece counts, a second read of x).
constexpr int64_t kSplitSmallTies = 4096;
struct SplitPlan {
  int64_t chunk = 0, pieces = 0;
  int64_t cap_a = 0, cap_b = 0;  // compaction buffers: B_0 up to C/8 entries, B_1 up to C/64
  int64_t ldt = 0;               // tie counters per row (>= pieces for any R)
  bool sort_in_smem = true;
  int64_t smem = 0;              // dynamic smem of the pass kernels (the histogram)
  int64_t sort_smem = 0;         // dynamic smem of the sort kernel (candidates, small tie sets)
  int64_t ws_bytes = 0;
  int64_t state_offset = 0, cand_offset = 0, buf_a_offset = 0, buf_b_offset = 0, tie_offset = 0, ties_offset = 0;
};
inline SplitPlan plan_split(int64_t R, int64_t C, int64_t k, int64_t chunk) {
  SplitPlan p;
  if (R < 0 || C < 0 || k < 0 || chunk <= 0) {
    p.ws_bytes = -1;
    return p;
  }
  const int64_t max_chunk = align_up(chunk < kSplitMinChunk ? kSplitMinChunk : chunk, 4);
  int64_t want = C / (kSplitTargetPieces / (R < 1 ? 1 : R > kSplitTargetPieces ? kSplitTargetPieces : R));
  want = align_up(want, 1024);
  p.chunk = want < kSplitMinChunk ? kSplitMinChunk : want > max_chunk ? max_chunk : want;
  p.pieces = (C + p.chunk - 1) / p.chunk;
  p.ldt = (C + kSplitMinChunk - 1) / kSplitMinChunk + 1;
  p.cap_a = C / 8 > 1024 ? C / 8 : 1024;
  p.cap_b = C / 64 > 1024 ? C / 64 : 1024;
  const int64_t kpad = next_pow2(k);
  p.sort_in_smem = kpad >= 0 && kpad <= kSplitMaxSmemSort;
  const int64_t sort_bytes = p.sort_in_smem ? kpad * 8 : 0;
  p.smem = kSplitBins * 4;
  p.sort_smem = sort_bytes > kSplitSmallTies * 8 ? sort_bytes : kSplitSmallTies * 8;
  p.state_offset = 0;
  p.cand_offset = align_up(checked_mul(R, (int64_t)sizeof(TopkSplitState)), 256);
  p.buf_a_offset = align_up(checked_add(p.cand_offset, checked_mul(checked_mul(R, kpad), 8)), 256);
  p.buf_b_offset = align_up(checked_add(p.buf_a_offset, checked_mul(checked_mul(R, p.cap_a), 8)), 256);
  p.tie_offset = align_up(checked_add(p.buf_b_offset, checked_mul(checked_mul(R, p.cap_b), 8)), 256);
  p.ties_offset = align_up(checked_add(p.tie_offset, checked_mul(checked_mul(R, p.ldt), 4)), 256);
  p.ws_bytes = checked_add(p.ties_offset, checked_mul(R, kSplitSmallTies * 8));  // -1: too large
  return p;
}

}  // namespace topk_plan
