// SPDX-License-Identifier: Apache-2.0
// Descriptor validation shared by every op.
#include <cinttypes>
#include <cstring>

#include "core.hpp"

namespace fly {

size_t dtype_size(fly_dtype dt) {
  switch (dt) {
    case FLY_F16: case FLY_BF16: return 2;
    case FLY_F32: case FLY_I32: return 4;
    case FLY_F64: case FLY_I64: return 8;
    case FLY_U8: return 1;
    case FLY_F8_E4M3: case FLY_F4_E2M1X2: case FLY_E8M0: return 1;
    default: return 0;
  }
}

const char* dtype_name(fly_dtype dt) {
  switch (dt) {
    case FLY_F16: return "fp16";
    case FLY_BF16: return "bf16";
    case FLY_F32: return "fp32";
    case FLY_F64: return "fp64";
    case FLY_I32: return "int32";
    case FLY_I64: return "int64";
    case FLY_U8: return "uint8";
    case FLY_F8_E4M3: return "e4m3";
    case FLY_F4_E2M1X2: return "e2m1x2";
    case FLY_E8M0: return "e8m0";
    default: return "invalid";
  }
}

int32_t dtype_value(const fly_tensor& t) {
  static_assert(sizeof(t.dtype) == sizeof(int32_t), "fly_dtype is stored as a C int");
  int32_t v = 0;
  std::memcpy(&v, &t.dtype, sizeof v);
  return v;
}

int64_t numel(const fly_tensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.rank; ++i) n *= t.sizes[i];
  return n;
}

int64_t extent_bytes(const fly_tensor& t) {
  if (numel(t) == 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < t.rank; ++i) last += (t.sizes[i] - 1) * t.strides[i];
  return (last + 1) * int64_t(dtype_size(t.dtype));
}

fly_status check_tensor(const fly_tensor* t, const char* what, int rank) {
  if (!t) return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: descriptor is NULL", what);
  const int32_t dv = dtype_value(*t);
  const size_t es = dv > FLY_DTYPE_INVALID && dv <= FLY_E8M0 ? dtype_size(static_cast<fly_dtype>(dv)) : 0;
  if (es == 0)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: invalid dtype value %d", what, int(dv));
  if (t->rank < 0 || t->rank > FLY_MAX_RANK)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: rank %d outside 0..%d", what, t->rank, FLY_MAX_RANK);
  if (rank >= 0 && t->rank != rank)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: expected rank %d, got %d", what, rank, t->rank);
  // Sizes and strides must be non-negative, and the byte extent must fit in int64 (and in the
  // 48-bit virtual address space, which also keeps every index computation in the kernels safe).
  const int64_t kLimit = int64_t(1) << 47;
  int64_t span = 0;
  bool empty = false;
  for (int i = 0; i < t->rank; ++i) {
    if (t->sizes[i] < 0)
      return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: size[%d] = %" PRId64 " is negative", what, i, t->sizes[i]);
    if (t->strides[i] < 0)
      return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: stride[%d] = %" PRId64 " is negative", what, i, t->strides[i]);
    if (t->sizes[i] == 0) empty = true;
    if (t->sizes[i] >= kLimit || t->strides[i] >= kLimit)
      return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: size/stride of dim %d overflows the address space", what, i);
  }
  if (!empty) {
    for (int i = 0; i < t->rank; ++i) {
      // (size - 1) * stride, checked against the limit before multiplying
      if (t->strides[i] != 0 && t->sizes[i] - 1 > (kLimit - span) / t->strides[i])
        return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: extent overflows (sizes x strides exceed 2^47 elements)", what);
      span += (t->sizes[i] - 1) * t->strides[i];
    }
    if ((span + 1) > kLimit / int64_t(es))
      return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: byte extent overflows", what);
    if (!t->data) return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: data pointer is NULL", what);
    if (reinterpret_cast<uintptr_t>(t->data) % es != 0)
      return fail(FLY_ERROR_MISALIGNED, "%s: data pointer %p is not aligned to its %zu-byte elements",
                  what, t->data, es);
  }
  return FLY_SUCCESS;
}


fly_status check_row_layout(const fly_tensor& t, const char* what, bool output) {
  if (t.sizes[1] > 1 && t.strides[1] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "%s: inner stride must be 1, got %" PRId64, what, t.strides[1]);
  if (t.sizes[0] > 1 && t.strides[0] < t.sizes[1])
    return fail(output ? FLY_ERROR_INVALID_ARGUMENT : FLY_ERROR_UNSUPPORTED,
                "%s: row stride %" PRId64 " is smaller than the row length %" PRId64 " (rows overlap)", what,
                t.strides[0], t.sizes[1]);
  return FLY_SUCCESS;
}

fly_status check_row_operand(const fly_tensor* t, const char* what, const char* lead, fly_dtype dt, int64_t M,
                             int64_t N, bool output) {
  FLY_TRY(check_tensor(t, what, 2));
  if (t->dtype != dt)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: dtype %s does not match %s (%s)", what, dtype_name(t->dtype), lead,
                dtype_name(dt));
  if (t->sizes[0] != M || t->sizes[1] != N)
    return fail(FLY_ERROR_INVALID_ARGUMENT,
                "%s: shape [%" PRId64 ", %" PRId64 "] does not match %s [%" PRId64 ", %" PRId64 "]", what, t->sizes[0],
                t->sizes[1], lead, M, N);
  return check_row_layout(*t, what, output);
}

fly_status check_vector(const fly_tensor* t, const char* what, int64_t n, fly_dtype dt) {
  FLY_TRY(check_tensor(t, what, 1));
  if (t->sizes[0] != n)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: expected %" PRId64 " elements, got %" PRId64, what, n, t->sizes[0]);
  if (t->dtype != dt)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: dtype %s, expected %s", what, dtype_name(t->dtype), dtype_name(dt));
  if (n > 1 && t->strides[0] != 1)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: stride must be 1, got %" PRId64, what, t->strides[0]);
  return FLY_SUCCESS;
}

fly_status check_optional_workspace(const void* workspace, size_t bytes, size_t align) {
  if (!workspace && bytes > 0) return fail(FLY_ERROR_INVALID_ARGUMENT, "workspace: NULL with workspace_bytes = %zu", bytes);
  if (bytes >= (size_t(1) << 47))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "workspace_bytes: %zu is larger than any allocation", bytes);
  // (a pointer with 0 bytes is no workspace, as NULL: its alignment does not matter)
  if (workspace && bytes > 0 && reinterpret_cast<uintptr_t>(workspace) % align != 0)
    return fail(FLY_ERROR_MISALIGNED, "workspace: %p is not %zu-byte aligned%s", workspace, align,
                align == 256 ? " (cudaMalloc's alignment)" : "");
  return FLY_SUCCESS;
}

namespace {
// [lo, hi) bytes a tensor's elements reach; false when it has none.
bool byte_range(const fly_tensor& t, uintptr_t* lo, uintptr_t* hi) {
  if (numel(t) == 0 || !t.data) return false;
  *lo = reinterpret_cast<uintptr_t>(t.data);
  *hi = *lo + uintptr_t(extent_bytes(t));
  return true;
}
bool same_view(const fly_tensor& a, const fly_tensor& b) {
  if (a.data != b.data || dtype_value(a) != dtype_value(b) || a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i)
    if (a.sizes[i] != b.sizes[i] || (a.sizes[i] > 1 && a.strides[i] != b.strides[i])) return false;
  return true;
}
}  // namespace

bool tensors_overlap(const fly_tensor& a, const fly_tensor& b) {
  uintptr_t alo, ahi, blo, bhi;
  if (!byte_range(a, &alo, &ahi) || !byte_range(b, &blo, &bhi)) return false;
  return alo < bhi && blo < ahi;
}

fly_status check_disjoint(const fly_tensor* out, const char* out_name, const fly_tensor* in, const char* in_name,
                          bool same_ok) {
  if (!out || !in || !tensors_overlap(*out, *in)) return FLY_SUCCESS;
  if (same_ok && same_view(*out, *in)) return FLY_SUCCESS;
  return fail(FLY_ERROR_INVALID_ARGUMENT, "%s and %s: the output shares memory with another argument%s", out_name,
              in_name, same_ok ? " (only exactly in place, the same view, is allowed)" : " (no in-place or overlap)");
}

fly_status check_workspace_disjoint(const void* workspace, size_t bytes, const fly_tensor* t, const char* what) {
  uintptr_t lo, hi;
  // (a size beyond any allocation is check_optional_workspace's to refuse)
  if (!workspace || bytes == 0 || bytes >= (size_t(1) << 47) || !t || !byte_range(*t, &lo, &hi)) return FLY_SUCCESS;
  const uintptr_t wlo = reinterpret_cast<uintptr_t>(workspace), whi = wlo + bytes;
  if (wlo < hi && lo < whi)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "workspace and %s: the workspace shares memory with an argument", what);
  return FLY_SUCCESS;
}

}  // namespace fly
