// SPDX-License-Identifier: Apache-2.0
// CPU reference and result checker for TopK (tools and tests; host only, plain C++).
// Ordering is the kernels' (and torch's): keys from topk_common.cuh's to_key, ties by lowest index.
#pragma once
#include <stdint.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace topk_ref {

inline uint32_t key(float v, bool largest) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return largest ? (nan ? 0xffffffffu : ord) : (nan ? 1u : ~ord);
}

// Per row, the k best composites (key << 32 | ~index), best first: R * k entries.
inline std::vector<uint64_t> reference(const float* x, int64_t ld, int64_t R, int64_t C, int64_t k,
                                       bool largest) {
  std::vector<uint64_t> ref(static_cast<size_t>(R * k));
  std::vector<uint64_t> comp(static_cast<size_t>(C));
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * ld;
    for (int64_t i = 0; i < C; ++i)
      comp[size_t(i)] = (uint64_t(key(xr[i], largest)) << 32) | uint32_t(~uint32_t(i));
    std::nth_element(comp.begin(), comp.begin() + (k - 1), comp.end(), std::greater<uint64_t>());
    std::sort(comp.begin(), comp.begin() + k, std::greater<uint64_t>());
    std::copy(comp.begin(), comp.begin() + k, ref.begin() + r * k);
  }
  return ref;
}

// Checks one result (values/indices with row strides ldv/ldi). Values must equal the reference
// rank by rank (same key: exact, NaN == NaN); each index in range, unique in its row, pointing at
// an element equal to its value; deterministic results must match the reference indices (lowest
// index first among ties). Returns "" when correct, else the first problem.
inline std::string check(const float* x, int64_t ld, int64_t R, int64_t C, int64_t k, bool largest,
                         bool deterministic, const std::vector<uint64_t>& ref, const float* vals,
                         int64_t ldv, const int64_t* inds, int64_t ldi) {
  std::vector<char> seen(static_cast<size_t>(C), 0);
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * ld;
    std::string why;
    int64_t j = 0;
    for (; j < k; ++j) {
      const uint64_t want = ref[size_t(r * k + j)];
      const uint32_t wkey = uint32_t(want >> 32);
      const float v = vals[r * ldv + j];
      const int64_t id = inds[r * ldi + j];
      if (key(v, largest) != wkey) { why = "value differs from the reference"; break; }
      if (id < 0 || id >= C) { why = "index out of range"; break; }
      if (key(xr[id], largest) != wkey) { why = "x[index] differs from the value"; break; }
      if (deterministic && uint32_t(id) != ~uint32_t(want)) { why = "index is not the lowest among ties"; break; }
      if (seen[size_t(id)]) { why = "index repeated"; break; }
      seen[size_t(id)] = 1;
    }
    for (int64_t q = 0; q < std::min(j + 1, k); ++q) {
      const int64_t id = inds[r * ldi + q];
      if (id >= 0 && id < C) seen[size_t(id)] = 0;
    }
    if (!why.empty())
      return "row " + std::to_string(r) + " rank " + std::to_string(j) + ": " + why;
  }
  return "";
}

}  // namespace topk_ref
