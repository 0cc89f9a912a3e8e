// SPDX-License-Identifier: Apache-2.0
// Few very long rows: each row is cut into pieces that the row's CTAs claim one at a time (an
// atomic counter per row and launch), so the whole GPU reads it and the CTAs stay busy to the
// end. A radix select over the 32-bit key in three levels (11, 11, 10 bits), one launch per level
// (the histograms of all CTAs meet in the workspace; the CTA that finishes last picks the digit):
//   init (R CTAs)        zero the row state
//   pass 0               histogram of the top 11 key bits over x
//   pass 1..3            read B_{l-1} (x, or the compaction buffer once the bucket was small):
//                        elements above B_l -> candidates; B_l -> histogram of the next digit and
//                        the compaction buffer; once B_l is resolved, its elements -> candidates
//   tie pass             deterministic only, when more than kSplitSmallTies elements share the
//                        k-th key: pieces in index order take the lowest indices (per-piece tie
//                        counts of pass 3, turned into offsets by its last CTA)
//   sort (R CTAs)        deterministic small tie sets sorted by index first, then the k
//                        candidates sorted (registers + shuffles + shared memory) and written
// Launches after a row is resolved return at once. x is read twice on typical data (pass 0 and
// pass 1), more only when a bucket stays larger than C/8 (e.g. many equal keys) or in the
// deterministic tie pass.
#pragma once
#include "topk/topk_common.cuh"

namespace fly_topk {

__device__ __forceinline__ int level_shift(int l) { return l == 0 ? 21 : l == 1 ? 10 : 0; }
__device__ __forceinline__ uint32_t level_mask(int l) {
  return l == 0 ? 0xffe00000u : l == 1 ? 0xfffffc00u : 0xffffffffu;
}
__device__ __forceinline__ uint32_t level_digit(uint32_t key, int l) {
  return l == 0 ? key >> 21 : l == 1 ? (key >> 10) & 2047u : key & 1023u;
}

template <int NT>
__device__ __forceinline__ void split_init_body(const TopkParams& p) {
  TopkSplitState* st = p.ws_state + blockIdx.x;
  uint32_t* w = reinterpret_cast<uint32_t*>(st);
  constexpr int kWords = int(sizeof(TopkSplitState) / 4);
  for (int i = threadIdx.x; i < kWords; i += NT) w[i] = 0;
  if (threadIdx.x == 0) {
    st->kk = (uint32_t)p.k;
    st->cnt = (uint32_t)p.C;
  }
}

// Block-wide exclusive prefix sum of v (all NT threads call it); *total gets the block's sum.
// scratch: 33 words of shared memory, reusable after the call returns.
template <int NT>
__device__ __forceinline__ uint32_t block_exclusive_scan(uint32_t v, uint32_t* scratch, uint32_t* total) {
  constexpr int kWarps = NT / 32;
  const unsigned lane = lane_id();
  const int warp = (int)threadIdx.x >> 5;
  uint32_t incl = v;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    uint32_t o = __shfl_up_sync(kFull, incl, off);
    if ((int)lane >= off) incl += o;
  }
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  uint32_t before = 0, all = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const uint32_t s = scratch[w];
    before += w < warp ? s : 0u;
    all += s;
  }
  __syncthreads();
  *total = all;
  return before + incl - v;
}

// The last CTA of a pass over level l's histogram: the digit holding the kk-th element (from the
// top) and the new row state. All NT threads call it.
template <int NT>
__device__ __forceinline__ void split_select(const TopkParams& p, TopkSplitState* st, int l, uint32_t* scratch) {
  static_assert(kSplitBins % NT == 0, "bins per thread");
  constexpr int kPer = kSplitBins / NT;
  __shared__ uint32_t s_digit, s_above, s_in;
  const uint32_t* h = st->hist[l];
  const uint32_t kk = st->kk;
  // Thread t owns positions t*kPer .. t*kPer+kPer-1 of the descending bin order.
  uint32_t c[kPer];
  uint32_t sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    c[j] = __ldcg(h + (kSplitBins - 1 - ((int)threadIdx.x * kPer + j)));
    sum += c[j];
  }
  uint32_t total;
  uint32_t run = block_exclusive_scan<NT>(sum, scratch, &total);
  if (run < kk && run + sum >= kk) {
    bool found = false;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (!found && run + c[j] >= kk) {
        found = true;
        s_digit = (uint32_t)(kSplitBins - 1 - ((int)threadIdx.x * kPer + j));
        s_above = run;
        s_in = c[j];
      }
      run += c[j];
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t nk = kk - s_above;
    const uint32_t cnt = s_in;
    // The next pass reads B_{l-1}: this pass compacted it when st->compact was set.
    if (l >= 1 && st->compact) {
      st->src = (uint32_t)l;  // 1: buffer A holds B_0; 2: buffer B holds B_1
      st->src_count = st->cnt;
    }
    st->prefix_prev = st->prefix;
    st->mask_prev = st->mask;
    st->prefix = st->prefix | (s_digit << level_shift(l));
    st->mask = level_mask(l);
    st->kk = nk;
    st->cnt = cnt;
    const bool fin = cnt == nk || l == 2;
    st->final_ = fin ? 1u : 0u;
    st->straddle = (fin && cnt > nk && p.deterministic) ? 1u : 0u;
    const uint32_t cap = l == 0 ? (uint32_t)p.cap_a : (uint32_t)p.cap_b;
    st->compact = (!fin && l <= 1 && cnt <= cap) ? 1u : 0u;
  }
}

// Bitonic sort of buf[0, NT*E) descending (shared memory), E elements per thread held in
// registers: strides below E inside a thread, below 32*E by warp shuffles, only the larger ones
// through shared memory (a barrier each). For 4096 entries on 512 threads: 22 barriers, not 78.
template <int NT, int E>
__device__ __forceinline__ void bitonic_sort_desc_reg(uint64_t* buf) {
  constexpr int n = NT * E;
  const int t = threadIdx.x;
  uint64_t r[E];
  for (int size = 2; size <= n; size <<= 1) {
    int stride = size >> 1;
    for (; stride >= 32 * E; stride >>= 1) {
      for (int q = t; q < (n >> 1); q += NT) {
        const int i = 2 * q - (q & (stride - 1));
        const int j = i + stride;
        const bool desc = (i & size) == 0;
        const uint64_t a = buf[i], b = buf[j];
        if ((a < b) == desc) {
          buf[i] = b;
          buf[j] = a;
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int e = 0; e < E; ++e) r[e] = buf[t * E + e];
    for (; stride >= E; stride >>= 1) {
      const int d = stride / E;  // partner lane distance (< 32)
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int g = t * E + e;
        const uint64_t b = __shfl_xor_sync(kFull, r[e], d);
        const bool lower = (g & stride) == 0;
        const bool desc = (g & size) == 0;
        const uint64_t mx = r[e] > b ? r[e] : b, mn = r[e] > b ? b : r[e];
        r[e] = lower == desc ? mx : mn;
      }
    }
#pragma unroll
    for (int s = E / 2; s >= 1; s >>= 1) {
      if (s <= stride) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          if ((e & s) == 0) {
            const int g = t * E + e;
            const bool desc = (g & size) == 0;
            const uint64_t a = r[e], b = r[e | s];
            if ((a < b) == desc) {
              r[e] = b;
              r[e | s] = a;
            }
          }
        }
      }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) buf[t * E + e] = r[e];
    __syncthreads();
  }
}

// Sorts buf[0, n) descending (n a power of two): the register version when buf is in shared
// memory and n is 2..16 elements per thread, else the plain bitonic sort.
template <int NT>
__device__ __forceinline__ void sort_desc(uint64_t* buf, int n, bool in_smem) {
  if (in_smem) {
    switch (n / NT) {
      case 2: if (n == 2 * NT) return bitonic_sort_desc_reg<NT, 2>(buf); break;
      case 4: if (n == 4 * NT) return bitonic_sort_desc_reg<NT, 4>(buf); break;
      case 8: if (n == 8 * NT) return bitonic_sort_desc_reg<NT, 8>(buf); break;
      case 16: if (n == 16 * NT) return bitonic_sort_desc_reg<NT, 16>(buf); break;
      default: break;
    }
  }
  bitonic_sort_desc<NT>(buf, n);
}

// The row's k candidates, sorted (composites descending) and written as (value, index).
template <int NT>
__device__ __forceinline__ void split_finish(const TopkParams& p, int64_t row, unsigned char* smem) {
  uint64_t* g = p.ws_cand + row * p.kpad;
  uint64_t* buf = p.sort_in_smem ? reinterpret_cast<uint64_t*>(smem) : g;
  for (int i = threadIdx.x; i < p.kpad; i += NT) {
    uint64_t v = i < p.k ? __ldcg(g + i) : 0;  // written by other CTAs: read through L2
    if (p.sort_in_smem || i >= p.k) buf[i] = v;
  }
  __syncthreads();
  sort_desc<NT>(buf, p.kpad, p.sort_in_smem != 0);
  write_sorted<NT>(p, row, buf);
}

// Deterministic mode, few elements share the k-th key: the last CTA sorts them (equal keys, so by
// index, lowest first) and the first kk join the candidates.
template <int NT>
__device__ __forceinline__ void split_small_ties(const TopkParams& p, int64_t row, uint32_t cnt, uint32_t kk,
                                                 unsigned char* smem) {
  const uint64_t* g = p.ws_ties + row * topk_plan::kSplitSmallTies;
  uint64_t* cand = p.ws_cand + row * p.kpad + (p.k - kk);
  uint64_t* buf = reinterpret_cast<uint64_t*>(smem);
  int n = 1;
  while (n < (int)cnt) n <<= 1;
  for (int i = threadIdx.x; i < n; i += NT) buf[i] = i < (int)cnt ? __ldcg(g + i) : 0;
  __syncthreads();
  sort_desc<NT>(buf, n, true);
  for (int i = threadIdx.x; i < (int)kk; i += NT) cand[i] = buf[i];
  __syncthreads();  // candidates complete (global writes of this block) before the sort
}

// Claims the next piece of the row for this launch (thread 0), broadcast to the block.
__device__ __forceinline__ int claim_piece(TopkSplitState* st, int launch, int* s_piece) {
  if (threadIdx.x == 0) *s_piece = (int)atomicAdd(&st->next[launch], 1u);
  __syncthreads();
  const int piece = *s_piece;
  __syncthreads();  // everyone has read it before thread 0 claims again
  return piece;
}

// Returns true in the one CTA of the row that finishes this launch last (all threads call it,
// after their writes to the workspace).
__device__ __forceinline__ bool last_of_launch(TopkSplitState* st, int launch, int* s_flag) {
  __threadfence();  // our histogram bins, candidates and counters before our ticket
  __syncthreads();
  if (threadIdx.x == 0) *s_flag = atomicAdd(&st->ticket[launch], 1u) == gridDim.x - 1;
  __syncthreads();
  const bool last = *s_flag != 0;
  if (last) __threadfence();
  return last;
}

template <int NT>
__device__ __forceinline__ void split_pass_body(const TopkParams& p) {
  static_assert(NT >= 256 && NT <= 1024 && NT % 32 == 0, "block size");
  extern __shared__ __align__(16) unsigned char smem[];
  uint32_t* hist = reinterpret_cast<uint32_t*>(smem);
  __shared__ uint32_t scratch[33];
  __shared__ int s_piece, s_flag;
  __shared__ uint32_t s_ties, s_count, s_base, s_local;
  const int64_t row = blockIdx.y;
  TopkSplitState* st = p.ws_state + row;
  const int L = p.pass;  // 0..3
  if (st->finished) return;  // resolved by an earlier launch
  const uint32_t prefix_prev = st->prefix_prev, mask_prev = st->mask_prev;
  const uint32_t prefix = st->prefix, mask = st->mask;
  const uint32_t kk = st->kk;
  const bool fin = L > 0 && st->final_ != 0;
  if (L == 3 && !fin) return;  // cannot happen: the key is complete after level 2
  const bool compact = !fin && st->compact != 0;
  // Deterministic ties beyond kk at the complete key: count them per piece of x (in index order)
  // for the tie pass instead of taking the first to claim a slot.
  // Few of them (at most kSplitSmallTies): gather them all and sort them by index at the end.
  const bool small_ties = fin && st->straddle != 0 && st->cnt <= (uint32_t)topk_plan::kSplitSmallTies;
  const bool det_ties = fin && st->straddle != 0 && !small_ties;
  const uint32_t src = det_ties ? 0u : st->src;
  const uint32_t src_count = st->src_count;
  const bool largest = p.largest != 0;
  const uint32_t k = (uint32_t)p.k;
  const int tid = threadIdx.x;
  uint64_t* cand = p.ws_cand + row * p.kpad;
  uint64_t* out_buf = L == 1 ? p.ws_buf_a + row * p.cap_a : p.ws_buf_b + row * p.cap_b;
  uint32_t* fill = &st->fill[L == 1 ? 0 : 1];
  const uint64_t* in_buf = src == 1 ? p.ws_buf_a + row * p.cap_a : p.ws_buf_b + row * p.cap_b;
  uint32_t* tiecnt = p.ws_tiecnt + row * p.ldt;

  if (!fin)
    for (int b = tid; b < kSplitBins; b += NT) hist[b] = 0;
  __syncthreads();

  uint32_t my_ties = 0;
  // One element of B_{l-1}'s superset: all 32 lanes call it (warp-aggregated slots).
  auto visit = [&](uint32_t key, uint32_t idx, bool valid) {
    const bool in_src = valid && (key & mask_prev) == prefix_prev;
    const uint32_t m = key & mask;
    const bool inb = in_src && m == prefix;
    if (L > 0) {
      const bool sure = in_src && m > prefix;
      const uint32_t s = warp_slot(sure, &st->sure);
      if (sure) cand[s] = composite(key, idx);
      if (fin) {
        if (det_ties) {
          my_ties += inb ? 1u : 0u;
        } else if (small_ties) {
          const uint32_t s2 = warp_slot(inb, &st->tie);  // cnt <= kSplitSmallTies of them
          if (inb) p.ws_ties[row * topk_plan::kSplitSmallTies + s2] = composite(key, idx);
        } else {
          const uint32_t s2 = warp_slot(inb, &st->tie);
          if (inb && s2 < kk) cand[(k - kk) + s2] = composite(key, idx);
        }
        return;
      }
      if (compact) {  // slots in this piece's reservation (a shared counter)
        const uint32_t s3 = warp_slot(inb, &s_local);
        if (inb) out_buf[s_base + s3] = composite(key, idx);
      }
    }
    if (inb) atomicAdd(&hist[level_digit(key, L)], 1u);
  };

  const float* xr = p.x + row * p.ldx;
  const bool from_x = src == 0;
  const int npieces = from_x ? p.pieces : (int)((src_count + (uint32_t)p.chunk - 1) / (uint32_t)p.chunk);
  if (tid == 0) s_count = 0;
  for (;;) {
    if (tid == 0) s_ties = 0;
    const int piece = claim_piece(st, L, &s_piece);
    if (piece >= npieces) break;
    const int lo = piece * p.chunk;
    if (compact) {
      // Reserve the piece's compaction slots with one global atomic (a per-warp atomic on the
      // row's counter serializes when B_l is a large share of the row): count first (the piece
      // is in L2 for the pass below), then hand out slots through a shared counter.
      uint32_t n = 0;
      auto count = [&](uint32_t key, bool valid) {
        n += (valid && (key & mask_prev) == prefix_prev && (key & mask) == prefix) ? 1u : 0u;
      };
      if (from_x) {
        walk_row<NT, 4>(xr, lo, min(p.C, lo + p.chunk), tid,
                        [&](int, float v, bool valid) { count(to_key(v, largest), valid); });
      } else {
        const int hi = (int)min(src_count, (uint32_t)lo + (uint32_t)p.chunk);
        for (int j = lo + tid; j < hi; j += NT) count(comp_key(in_buf[j]), true);
      }
      if (n) atomicAdd(&s_count, n);
      __syncthreads();
      if (tid == 0) {
        s_base = s_count ? atomicAdd(fill, s_count) : 0u;
        s_count = 0;
        s_local = 0;
      }
      __syncthreads();
    }
    if (from_x) {
      const int hi = min(p.C, lo + p.chunk);
      walk_row<NT, 4>(xr, lo, hi, tid, [&](int i, float v, bool valid) {
        visit(to_key(v, largest), (uint32_t)i, valid);
      });
    } else {
      const int hi = (int)min(src_count, (uint32_t)lo + (uint32_t)p.chunk);
      for (int base = lo; base < hi; base += NT) {
        const int j = base + tid;
        const bool valid = j < hi;
        const uint64_t c = valid ? in_buf[j] : 0;
        visit(comp_key(c), comp_index(c), valid);
      }
    }
    if (det_ties) {  // uniform
      if (my_ties) atomicAdd(&s_ties, my_ties);
      my_ties = 0;
      __syncthreads();
      if (tid == 0) tiecnt[piece] = s_ties;
      __syncthreads();
    }
  }
  __syncthreads();
  if (!fin)
    for (int b = tid; b < kSplitBins; b += NT)
      if (hist[b] != 0) atomicAdd(&st->hist[L][b], hist[b]);
  if (!last_of_launch(st, L, &s_flag)) return;
  if (!fin) {
    split_select<NT>(p, st, L, scratch);
    return;
  }
  if (det_ties) {  // the tie pass finishes the row; here the per-piece counts become offsets
    const int P = p.pieces;
    uint32_t carry = 0;
    for (int base = 0; base < P; base += NT) {
      const int j = base + tid;
      const uint32_t v = j < P ? __ldcg(tiecnt + j) : 0u;
      uint32_t total;
      const uint32_t ex = block_exclusive_scan<NT>(v, scratch, &total);
      if (j < P) tiecnt[j] = carry + ex;
      carry += total;
    }
    if (tid == 0) tiecnt[P] = carry;
    return;
  }
  if (tid == 0) st->finished = 1;  // candidates complete: the sort launch writes the row
}

// Deterministic mode, more elements share the k-th key T than the kk still needed: the kk lowest
// indices among them. Pass 3 counted the ties of every piece of x and turned the counts into
// offsets (tiecnt[j] = ties before piece j, tiecnt[pieces] = all); each piece hands out its slots
// in index order (a block scan per NT elements). Pieces past the kk-th tie are skipped.
template <int NT>
__device__ __forceinline__ void split_tie_body(const TopkParams& p) {
  __shared__ uint32_t scratch[33];
  __shared__ int s_piece, s_flag;
  const int64_t row = blockIdx.y;
  TopkSplitState* st = p.ws_state + row;
  constexpr int kLaunch = kSplitLaunches - 1;
  if (st->finished || !st->straddle) return;
  const uint32_t T = st->prefix;  // the complete k-th key
  const uint32_t prefix_prev = st->prefix_prev, mask_prev = st->mask_prev;
  const uint32_t kk = st->kk, k = (uint32_t)p.k;
  const bool largest = p.largest != 0;
  const float* xr = p.x + row * p.ldx;
  uint64_t* cand = p.ws_cand + row * p.kpad;
  const uint32_t* tiecnt = p.ws_tiecnt + row * p.ldt;
  const int tid = threadIdx.x;

  for (;;) {
    const int piece = claim_piece(st, kLaunch, &s_piece);
    if (piece >= p.pieces) break;
    uint32_t off = tiecnt[piece];                 // ties in the pieces before this one
    const uint32_t n = tiecnt[piece + 1] - off;  // ties in this piece
    if (n == 0 || off >= kk) continue;           // uniform
    const int lo = piece * p.chunk, hi = min(p.C, lo + p.chunk);
    for (int base = lo; base < hi && off < kk; base += NT) {
      const int i = base + tid;
      bool tie = false;
      if (i < hi) {
        const uint32_t key = to_key(xr[i], largest);
        tie = (key & mask_prev) == prefix_prev && key == T;
      }
      uint32_t total;
      const uint32_t r = block_exclusive_scan<NT>(tie ? 1u : 0u, scratch, &total);
      if (tie && off + r < kk) cand[(k - kk) + off + r] = composite(T, (uint32_t)i);
      off += total;
    }
  }
  if (!last_of_launch(st, kLaunch, &s_flag)) return;
  if (tid == 0) st->finished = 1;
}

// Last launch, one CTA per row: the deterministic small tie set first (sorted by index, the first
// kk join the candidates), then the k candidates sorted and written.
template <int NT>
__device__ __forceinline__ void split_sort_body(const TopkParams& p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t row = blockIdx.x;
  const TopkSplitState* st = p.ws_state + row;
  if (p.deterministic && st->straddle && st->cnt <= (uint32_t)topk_plan::kSplitSmallTies)
    split_small_ties<NT>(p, row, st->cnt, st->kk, smem);
  split_finish<NT>(p, row, smem);
}

}  // namespace fly_topk
