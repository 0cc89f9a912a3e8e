// SPDX-License-Identifier: Apache-2.0
// fly_rope_fwd / fly_rope_bwd: validation, dispatch and launch of the rope family (kernels/rope/).
#include <cinttypes>
#include <string>

#include "core.hpp"
#include "rope/rope_params.h"

namespace fly {
namespace {

constexpr const char* kFamily = "rope";
constexpr int kThreads = 256;      // kernels/rope/rope.cu
constexpr int kBlocksPerSm = 8;
constexpr int64_t kMaxHeadDim = 1 << 16;

// Whether distinct indices of t address distinct elements (an output must not write one element
// twice): the non-trivial dimensions ordered by stride, each stride at least the extent of the
// ones inside it.
bool injective(const fly_tensor& t) {
  for (int i = 0; i < t.rank; ++i)
    if (t.sizes[i] == 0) return true;  // no element at all
  int dims[FLY_MAX_RANK];
  int n = 0;
  for (int i = 0; i < t.rank && i < FLY_MAX_RANK; ++i) {  // insertion by stride: at most 8
    if (t.sizes[i] <= 1) continue;
    int j = n++;
    for (; j > 0 && t.strides[dims[j - 1]] > t.strides[i]; --j) dims[j] = dims[j - 1];
    dims[j] = i;
  }
  int64_t extent = 1;  // elements spanned by the dimensions inside this one
  for (int j = 0; j < n; ++j) {
    if (t.strides[dims[j]] < extent) return false;
    extent = t.strides[dims[j]] * (t.sizes[dims[j]] - 1) + extent;
  }
  return true;
}

// q or k (or their gradients): rank 4 [B, H, S, D] of the call's dtype, unit inner stride.
fly_status check_x(const fly_tensor* t, const char* what, fly_dtype dt, int64_t B, int64_t S, int64_t D) {
  FLY_TRY(check_tensor(t, what, 4));
  if (t->dtype != dt)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: dtype %s does not match q (%s)", what, dtype_name(t->dtype),
                dtype_name(dt));
  if (t->sizes[0] != B || t->sizes[2] != S || t->sizes[3] != D)
    return fail(FLY_ERROR_INVALID_ARGUMENT,
                "%s: shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] does not match q's batch, sequence "
                "and head dim (%" PRId64 ", %" PRId64 ", %" PRId64 ")", what, t->sizes[0], t->sizes[1], t->sizes[2],
                t->sizes[3], B, S, D);
  if (D > 1 && t->strides[3] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "%s: the head dim's stride must be 1, got %" PRId64, what, t->strides[3]);
  return FLY_SUCCESS;
}

// An output: the shape of its input, no element addressed twice.
fly_status check_out(const fly_tensor* out, const char* what, const fly_tensor& in, const char* in_name) {
  FLY_TRY(check_x(out, what, in.dtype, in.sizes[0], in.sizes[2], in.sizes[3]));
  if (out->sizes[1] != in.sizes[1])
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: %" PRId64 " heads, %s has %" PRId64, what, out->sizes[1], in_name,
                in.sizes[1]);
  if (!injective(*out))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: strides address one element more than once", what);
  return FLY_SUCCESS;
}

// cos / sin: rank 3 [B or 1, S, W], the call's dtype, unit inner stride.
fly_status check_table(const fly_tensor* t, const char* what, fly_dtype dt, int64_t B, int64_t S, int64_t W) {
  FLY_TRY(check_tensor(t, what, 3));
  if (t->dtype != dt)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: dtype %s does not match q (%s)", what, dtype_name(t->dtype),
                dtype_name(dt));
  if ((t->sizes[0] != B && t->sizes[0] != 1) || t->sizes[1] != S || t->sizes[2] != W)
    return fail(FLY_ERROR_INVALID_ARGUMENT,
                "%s: shape [%" PRId64 ", %" PRId64 ", %" PRId64 "], expected [%" PRId64 " or 1, %" PRId64 ", %" PRId64
                "]", what, t->sizes[0], t->sizes[1], t->sizes[2], B, S, W);
  if (W > 1 && t->strides[2] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "%s: the last dimension's stride must be 1, got %" PRId64, what, t->strides[2]);
  return FLY_SUCCESS;
}

// Every base and every stride of a dimension that is walked a whole number of 16-byte vectors.
bool aligned16(const fly_tensor& t, int64_t es) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16) return false;
  for (int i = 0; i + 1 < t.rank; ++i)
    if (t.sizes[i] > 1 && (t.strides[i] * es) % 16) return false;
  return true;
}

void set_operand(RopeOperand* o, const fly_tensor* x, const fly_tensor* out) {
  if (!x) return;  // rows 0: absent
  auto st = [](const fly_tensor& t, int i) { return t.sizes[i] > 1 ? t.strides[i] : 0; };
  o->x = x->data;
  o->out = out->data;
  o->H = x->sizes[1];
  o->rows = x->sizes[0] * x->sizes[1] * x->sizes[2];
  o->x_b = st(*x, 0), o->x_h = st(*x, 1), o->x_s = st(*x, 2);
  o->o_b = st(*out, 0), o->o_h = st(*out, 1), o->o_s = st(*out, 2);
}

fly_status run(bool bwd, const fly_tensor* q, const fly_tensor* k, const fly_tensor* cos, const fly_tensor* sin,
               int rotary_dim, const fly_tensor* q_out, const fly_tensor* k_out, void* stream) {
  const char* qn = bwd ? "dq_out" : "q";
  const char* kn = bwd ? "dk_out" : "k";
  const char* qon = bwd ? "dq" : "q_out";
  const char* kon = bwd ? "dk" : "k_out";
  FLY_TRY(check_tensor(q, qn, 4));
  const fly_dtype dt = q->dtype;
  if (dt != FLY_F16 && dt != FLY_BF16 && dt != FLY_F32)
    return fail(FLY_ERROR_UNSUPPORTED, "%s: dtype %s is not supported (fp16, bf16, fp32)", qn, dtype_name(dt));
  const int64_t B = q->sizes[0], S = q->sizes[2], D = q->sizes[3];
  FLY_TRY(check_x(q, qn, dt, B, S, D));
  if (D > kMaxHeadDim)
    return fail(FLY_ERROR_UNSUPPORTED, "%s: head dim %" PRId64 " is above %" PRId64, qn, D, kMaxHeadDim);
  if (rotary_dim <= 0 || rotary_dim % 2 || rotary_dim > D)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "rotary_dim: %d must be even, positive and at most the head dim %" PRId64,
                rotary_dim, D);
  if ((k == nullptr) != (k_out == nullptr))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s and %s: give both or neither", kn, kon);
  if (k) FLY_TRY(check_x(k, kn, dt, B, S, D));
  FLY_TRY(check_tensor(cos, "cos", 3));
  const int64_t W = cos->sizes[2];
  if (W != rotary_dim && 2 * W != rotary_dim)
    return fail(FLY_ERROR_INVALID_ARGUMENT,
                "cos: width %" PRId64 " is neither rotary_dim (%d, an angle per column) nor half of it (an angle per "
                "pair)", W, rotary_dim);
  FLY_TRY(check_table(cos, "cos", dt, B, S, W));
  FLY_TRY(check_table(sin, "sin", dt, B, S, W));
  FLY_TRY(check_out(q_out, qon, *q, qn));
  if (k) FLY_TRY(check_out(k_out, kon, *k, kn));
  // Outputs against every argument (host arithmetic, before the device check): each may be its
  // own input exactly (every element is read before the same thread writes it), nothing else.
  for (const fly_tensor* o : {q_out, k_out}) {
    if (!o) continue;
    const char* on = o == q_out ? qon : kon;
    FLY_TRY(check_disjoint(o, on, q, qn, o == q_out));
    FLY_TRY(check_disjoint(o, on, k, kn, o == k_out));
    FLY_TRY(check_disjoint(o, on, cos, "cos"));
    FLY_TRY(check_disjoint(o, on, sin, "sin"));
  }
  FLY_TRY(check_disjoint(k_out, kon, q_out, qon));
  const int64_t rows = B * S * (q->sizes[1] + (k ? k->sizes[1] : 0));
  if (rows == 0 || D == 0) return FLY_SUCCESS;

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*q, qn));
  FLY_TRY(check_device_pointer(*q_out, qon));
  if (k) {
    FLY_TRY(check_device_pointer(*k, kn));
    FLY_TRY(check_device_pointer(*k_out, kon));
  }
  FLY_TRY(check_device_pointer(*cos, "cos"));
  FLY_TRY(check_device_pointer(*sin, "sin"));

  DispatchRequest req = make_request(kFamily, keys::rope(dtype_name(dt), S, D));
  req.supports = [dt](const Variant& v) { return v.get("dtype") == dtype_name(dt); };
  req.fallback = [dt] { return std::string("rope_") + dtype_name(dt); };
  ResolvedKernel rk;
  FLY_TRY(resolve_kernel(*dc, req, "rope", &rk));

  const int64_t es = int64_t(dtype_size(dt));
  const int64_t per_vec = 16 / es;
  const int64_t half = rotary_dim / 2;
  bool vec = half % per_vec == 0 && (D - rotary_dim) % per_vec == 0;
  for (const fly_tensor* t : {q, k, q_out, k_out, cos, sin})
    if (t && !aligned16(*t, es)) vec = false;
  const int64_t unit = vec ? per_vec : 1;
  RopeParams p{};
  set_operand(&p.t[0], q, q_out);
  set_operand(&p.t[1], k, k_out);
  p.cos = cos->data;
  p.sin = sin->data;
  p.cos_b = cos->sizes[0] > 1 ? cos->strides[0] : 0;
  p.cos_s = S > 1 ? cos->strides[1] : 0;
  p.sin_b = sin->sizes[0] > 1 ? sin->strides[0] : 0;
  p.sin_s = S > 1 ? sin->strides[1] : 0;
  p.S = S;
  p.half = int32_t(half);
  p.half_tables = W * 2 == rotary_dim && W != rotary_dim ? 1 : 0;
  p.pair_units = int32_t(half / unit);
  // Columns [R, D) are copied unless every output is its input (nothing to move then).
  const bool in_place = q_out->data == q->data && (!k || k_out->data == k->data);
  p.units = p.pair_units + (in_place ? 0 : int32_t((D - rotary_dim) / unit));
  p.rot = rotary_dim;
  p.bwd = bwd ? 1 : 0;
  p.vec = vec ? 1 : 0;
  if (p.units == 0) return FLY_SUCCESS;
  return launch1(rk.f, grid_stride_launch(rows * p.units, kThreads, dc->sm_count, kBlocksPerSm), stream, p);
}

}  // namespace
}  // namespace fly

extern "C" FLY_API fly_status fly_rope_fwd(const fly_tensor* q, const fly_tensor* k, const fly_tensor* cos,
                                            const fly_tensor* sin, int rotary_dim, const fly_tensor* q_out,
                                            const fly_tensor* k_out, void* stream) {
  fly::clear_error();
  return fly::run(false, q, k, cos, sin, rotary_dim, q_out, k_out, stream);
}

extern "C" FLY_API fly_status fly_rope_bwd(const fly_tensor* dq_out, const fly_tensor* dk_out, const fly_tensor* cos,
                                            const fly_tensor* sin, int rotary_dim, const fly_tensor* dq,
                                            const fly_tensor* dk, void* stream) {
  fly::clear_error();
  return fly::run(true, dq_out, dk_out, cos, sin, rotary_dim, dq, dk, stream);
}
