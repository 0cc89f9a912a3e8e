// SPDX-License-Identifier: Apache-2.0
// fly_glu_fwd / fly_glu_bwd: validation, dispatch and launch of the glu family (kernels/glu/).
#include <cinttypes>
#include <string>

#include "core.hpp"
#include "glu/glu_params.h"

namespace fly {
namespace {

constexpr const char* kFamily = "glu";
constexpr int kThreads = 256;  // kernels/glu/glu.cu
constexpr int kBlocksPerSm = 8;

// Whether two [M, N] operands share a byte. Exact for the layouts this family sees: one row
// (contiguous spans), disjoint spans, or rows of one common stride (gate and up as the halves of
// one [M, 2N] projection interleave without touching: each row of one lies in the other's gap).
// Anything else whose spans meet counts as overlapping.
bool operands_overlap(const fly_tensor& a, const fly_tensor& b, int64_t es) {
  const int64_t ea = extent_bytes(a), eb = extent_bytes(b);
  if (ea == 0 || eb == 0) return false;
  const int64_t a0 = int64_t(reinterpret_cast<uintptr_t>(a.data)), b0 = int64_t(reinterpret_cast<uintptr_t>(b.data));
  if (!(a0 < b0 + eb && b0 < a0 + ea)) return false;
  const int64_t M = a.sizes[0], row = a.sizes[1] * es;
  if (M > 1 && a.strides[0] == b.strides[0]) {
    const int64_t L = a.strides[0] * es;
    const int64_t d = ((b0 - a0) % L + L) % L;  // b's rows start d bytes into a's period
    return !(d >= row && L - d >= row);
  }
  return true;
}
bool same_view(const fly_tensor& a, const fly_tensor& b) {
  return a.data == b.data && a.strides[0] == b.strides[0] && a.strides[1] == b.strides[1];
}
// An output may be an input exactly (elementwise: each element is read before it is written, by
// the same thread), never a shifted or partial view of it.
fly_status check_output_vs(const fly_tensor* out, const char* out_name, const fly_tensor* in, const char* in_name) {
  if (operands_overlap(*out, *in, int64_t(dtype_size(out->dtype))) && !same_view(*out, *in))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s and %s: the output shares memory with the input without being the same "
                "view (in place needs the same pointer and strides)", out_name, in_name);
  return FLY_SUCCESS;
}

int64_t row_stride(const fly_tensor& t, int64_t M, int64_t N) { return M > 1 ? t.strides[0] : N; }

bool rows_aligned(const fly_tensor& t, int64_t M, int64_t N, int64_t es) {
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && (row_stride(t, M, N) * es) % 16 == 0;
}

fly_status run(bool fwd, const fly_tensor* dout, const fly_tensor* gate, const fly_tensor* up, int act,
               const fly_tensor* out, const fly_tensor* dup, void* stream) {
  FLY_TRY(check_tensor(gate, "gate", 2));
  const fly_dtype dt = gate->dtype;
  if (dt != FLY_F16 && dt != FLY_BF16 && dt != FLY_F32)
    return fail(FLY_ERROR_UNSUPPORTED, "gate: dtype %s is not supported (fp16, bf16, fp32)", dtype_name(dt));
  const int64_t M = gate->sizes[0], N = gate->sizes[1];
  FLY_TRY(check_row_operand(gate, "gate", "gate", dt, M, N, false));
  FLY_TRY(check_row_operand(up, "up", "gate", dt, M, N, false));
  if (!fwd) FLY_TRY(check_row_operand(dout, "dout", "gate", dt, M, N, false));
  const char* out_name = fwd ? "out" : "dgate";
  FLY_TRY(check_row_operand(out, out_name, "gate", dt, M, N, true));
  if (!fwd) FLY_TRY(check_row_operand(dup, "dup", "gate", dt, M, N, true));
  if (act != FLY_GLU_SILU && act != FLY_GLU_GELU_TANH && act != FLY_GLU_GELU)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "activation: %d is not a fly_glu_activation (0 silu, 1 gelu_tanh, 2 gelu)",
                act);
  // Outputs against the inputs and each other (host arithmetic, before the device check).
  FLY_TRY(check_output_vs(out, out_name, gate, "gate"));
  FLY_TRY(check_output_vs(out, out_name, up, "up"));
  if (!fwd) {
    FLY_TRY(check_output_vs(out, out_name, dout, "dout"));
    FLY_TRY(check_output_vs(dup, "dup", gate, "gate"));
    FLY_TRY(check_output_vs(dup, "dup", up, "up"));
    FLY_TRY(check_output_vs(dup, "dup", dout, "dout"));
    if (operands_overlap(*out, *dup, int64_t(dtype_size(dt))))
      return fail(FLY_ERROR_INVALID_ARGUMENT, "dup and dgate: the outputs share memory (the two gradients need their own)");
  }
  if (M == 0 || N == 0) return FLY_SUCCESS;

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*gate, "gate"));
  FLY_TRY(check_device_pointer(*up, "up"));
  FLY_TRY(check_device_pointer(*out, out_name));
  if (!fwd) {
    FLY_TRY(check_device_pointer(*dout, "dout"));
    FLY_TRY(check_device_pointer(*dup, "dup"));
  }

  const char* op = fwd ? "glu_fwd" : "glu_bwd";
  const std::string dir = fwd ? "fwd" : "bwd";
  DispatchRequest req = make_request(kFamily, keys::glu(fwd, dtype_name(dt), M, N));
  req.supports = [dt, dir](const Variant& v) { return v.get("dtype") == dtype_name(dt) && v.get("dir") == dir; };
  req.fallback = [dt, dir] { return std::string("glu_") + dir + "_" + dtype_name(dt); };
  ResolvedKernel rk;
  FLY_TRY(resolve_kernel(*dc, req, op, &rk));

  const int64_t es = int64_t(dtype_size(dt));
  const int64_t per_vec = 16 / es;
  bool vec = N % per_vec == 0;
  for (const fly_tensor* t : {gate, up, out, dout, dup})
    if (t && !rows_aligned(*t, M, N, es)) vec = false;
  GluParams p{};
  p.gate = gate->data;
  p.up = up->data;
  p.dout = fwd ? nullptr : dout->data;
  p.out = out->data;
  p.dup = fwd ? nullptr : dup->data;
  p.M = M;
  p.cols = vec ? N / per_vec : N;
  p.ld_gate = row_stride(*gate, M, N);
  p.ld_up = row_stride(*up, M, N);
  p.ld_dout = fwd ? 0 : row_stride(*dout, M, N);
  p.ld_out = row_stride(*out, M, N);
  p.ld_dup = fwd ? 0 : row_stride(*dup, M, N);
  p.act = act;
  p.vec = vec ? 1 : 0;
  return launch1(rk.f, grid_stride_launch(M * p.cols, kThreads, dc->sm_count, kBlocksPerSm), stream, p);
}

}  // namespace
}  // namespace fly

extern "C" FLY_API fly_status fly_glu_fwd(const fly_tensor* gate, const fly_tensor* up, int activation,
                                           const fly_tensor* out, void* stream) {
  fly::clear_error();
  return fly::run(true, nullptr, gate, up, activation, out, nullptr, stream);
}

extern "C" FLY_API fly_status fly_glu_bwd(const fly_tensor* dout, const fly_tensor* gate, const fly_tensor* up,
                                           int activation, const fly_tensor* dgate, const fly_tensor* dup,
                                           void* stream) {
  fly::clear_error();
  return fly::run(false, dout, gate, up, activation, dgate, dup, stream);
}
