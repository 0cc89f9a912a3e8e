// SPDX-License-Identifier: Apache-2.0
// What the attention forward and backward launchers (src/ops/attention.cpp, attention_bwd.cpp)
// share: argument checks (the same rules give the same messages in both) and the TMA map of a
// [B, H, S, D] operand. Their dispatch key is dispatch_key.hpp's keys::attention.
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cstddef>
#include <cstdio>
#include <string>

#include "common/pack_params.h"
#include "core.hpp"

namespace fly::attn_common {

// No two in-range index tuples reach the same element (an output must not alias itself).
inline bool non_overlapping(const fly_tensor& t) {
  int idx[FLY_MAX_RANK];
  int n = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.sizes[i] == 0) return true;  // no elements
    if (t.sizes[i] > 1) idx[n++] = i;
  }
  for (int i = 1; i < n; ++i)  // insertion sort by stride (at most FLY_MAX_RANK dims)
    for (int j = i; j > 0 && t.strides[idx[j]] < t.strides[idx[j - 1]]; --j) std::swap(idx[j], idx[j - 1]);
  int64_t span = 1;  // elements covered by the inner dims
  for (int i = 0; i < n; ++i) {
    if (t.strides[idx[i]] < span) return false;
    span = t.strides[idx[i]] * (t.sizes[idx[i]] - 1) + span;
  }
  return true;
}

// A versioned params struct: at least its first version, at most what this library knows.
inline fly_status check_struct_size(size_t got, size_t v1, size_t known, const char* type) {
  if (got < v1)
    return fail(FLY_ERROR_INVALID_ARGUMENT,
                "params: struct_size %zu is smaller than the first version of %s (%zu bytes); set struct_size = "
                "sizeof(%s)",
                got, type, v1, type);
  if (got > known)
    return fail(FLY_ERROR_UNSUPPORTED,
                "params: struct_size %zu is larger than this library's %s (%zu bytes): the caller was built against "
                "a newer header",
                got, type, known);
  return FLY_SUCCESS;
}

// TMA's rules for a [B, H, S, D] operand: 16-byte aligned base, batch/head/sequence strides
// multiples of 16 bytes. What is broken ("" when nothing), as check_tma_operand words it.
inline std::string tma_problem(const fly_tensor& t, const char* what) {
  char msg[256];
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) {
    std::snprintf(msg, sizeof msg, "%s: base address is not 16-byte aligned (TMA loads need it)", what);
    return msg;
  }
  static const char* kDim[3] = {"batch", "head", "sequence"};
  for (int i = 0; i < 3; ++i)
    if (t.sizes[i] > 1 && t.strides[i] % 8 != 0) {
      std::snprintf(msg, sizeof msg,
                    "%s: %s stride %" PRId64 " elements is not a multiple of 8 (16 bytes, a TMA rule; pad the head "
                    "dim to a multiple of 8 as SDPA does)",
                    what, kDim[i], t.strides[i]);
      return msg;
    }
  return std::string();
}
inline fly_status check_tma_operand(const fly_tensor& t, const char* what) {
  const std::string why = tma_problem(t, what);
  return why.empty() ? FLY_SUCCESS : fail(FLY_ERROR_UNSUPPORTED, "%s", why.c_str());
}

// ---- the packed path: an operand TMA cannot address, copied to 16-byte lines ----------------
// The copy of a [B, H, S, D] operand: contiguous [B, H, S, round8(D)] (the padding zeros).
inline int64_t packed_row(int64_t d) { return (d + 7) / 8 * 8; }
inline int64_t packed_bytes(const fly_tensor& t) {
  return (t.sizes[0] * t.sizes[1] * t.sizes[2] * packed_row(t.sizes[3]) * 2 + 255) / 256 * 256;
}
// fly_pack_lines_sm90's parameters and grid {x, H, B} for copying `t` to `dst` (256-byte
// aligned), and the tensor the TMA maps then read.
struct PackedOperand {
  PackParams params{};
  unsigned grid[3] = {1, 1, 1};
  fly_tensor t{};
};
inline PackedOperand plan_packed(const fly_tensor& t, void* dst, int sm_count) {
  PackedOperand out;
  const int64_t B = t.sizes[0], H = t.sizes[1], S = t.sizes[2], D = t.sizes[3], row = packed_row(D);
  PackParams& p = out.params;
  p.src = t.data;
  p.dst = dst;
  p.lines = S;
  p.len = D;
  p.sld = S > 1 ? t.strides[2] : row;
  p.dld = row;
  p.src_sz = B > 1 ? t.strides[0] : 0;
  p.src_sy = H > 1 ? t.strides[1] : 0;
  p.dst_plane = S * row;
  const int64_t planes = std::max<int64_t>(1, B * H), chunks = S * (row / 8);
  const int64_t per_plane = std::max<int64_t>(1, int64_t(std::max(sm_count, 1)) * 8 / planes);
  out.grid[0] = unsigned(std::max<int64_t>(1, std::min((chunks + kPackThreads - 1) / kPackThreads, per_plane)));
  out.grid[1] = unsigned(std::max<int64_t>(1, H));
  out.grid[2] = unsigned(std::max<int64_t>(1, B));
  out.t = t;
  out.t.data = dst;
  out.t.strides[3] = 1;
  out.t.strides[2] = row;
  out.t.strides[1] = S * row;
  out.t.strides[0] = H * S * row;
  return out;
}

// t has exactly ref's four sizes.
inline fly_status check_same_shape(const fly_tensor& t, const fly_tensor& ref, const char* what, const char* ref_name) {
  for (int i = 0; i < 4; ++i)
    if (t.sizes[i] != ref.sizes[i])
      return fail(FLY_ERROR_INVALID_ARGUMENT,
                  "%s: shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] does not match %s [%" PRId64 ", %" PRId64
                  ", %" PRId64 ", %" PRId64 "]",
                  what, t.sizes[0], t.sizes[1], t.sizes[2], t.sizes[3], ref_name, ref.sizes[0], ref.sizes[1], ref.sizes[2],
                  ref.sizes[3]);
  return FLY_SUCCESS;
}

// k is [B, Hkv, Sk, D] for q [B, Hq, Sq, D].
inline fly_status check_kv_of_q(const fly_tensor& k, const fly_tensor& q) {
  if (k.sizes[0] != q.sizes[0] || k.sizes[3] != q.sizes[3])
    return fail(FLY_ERROR_INVALID_ARGUMENT,
                "k: shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] does not match q [%" PRId64 ", %" PRId64
                ", %" PRId64 ", %" PRId64 "] (k must be [B, Hkv, Sk, D])",
                k.sizes[0], k.sizes[1], k.sizes[2], k.sizes[3], q.sizes[0], q.sizes[1], q.sizes[2], q.sizes[3]);
  return FLY_SUCCESS;
}

// A [dims...] TMA map over one operand ({D, S, H, B}), box {64, box_rows, box_heads, 1}; a size-1
// dim's stride is irrelevant and replaced by a legal one (TMA wants multiples of 16 bytes).
inline CUresult encode_operand(const Driver& d, CUtensorMap* map, const fly_tensor& t, bool bf16, int box_rows,
                               int box_heads = 1) {
  cuuint64_t dims[4] = {cuuint64_t(t.sizes[3]), cuuint64_t(std::max<int64_t>(t.sizes[2], 1)),
                        cuuint64_t(std::max<int64_t>(t.sizes[1], 1)), cuuint64_t(std::max<int64_t>(t.sizes[0], 1))};
  cuuint64_t strides[3];
  const int64_t legal = (t.sizes[3] * 2 + 15) / 16 * 16;
  for (int i = 0; i < 3; ++i) {
    const int dim = 2 - i;  // S, H, B
    strides[i] = cuuint64_t(t.sizes[dim] > 1 ? t.strides[dim] * 2 : legal);
  }
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), cuuint32_t(box_heads), 1};
  const cuuint32_t estr[4] = {1, 1, 1, 1};
  return d.cuTensorMapEncodeTiled(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                                  t.data, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace fly::attn_common
