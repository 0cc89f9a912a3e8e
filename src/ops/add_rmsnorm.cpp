// SPDX-License-Identifier: Apache-2.0
// fly_add_rms_norm_fwd / fly_add_rms_norm_bwd (+ its workspace query): validation, dispatch and
// launch of the add_rmsnorm family (kernels/add_rmsnorm/).
#include <algorithm>
#include <cfloat>
#include <cinttypes>
#include <map>
#include <mutex>
#include <string>

#include "core.hpp"
#include "add_rmsnorm/add_rmsnorm_params.h"

namespace fly {
namespace {

constexpr const char* kFamily = "add_rmsnorm";
constexpr int kDwThreads = 256, kDwCols = 32;  // kernels/add_rmsnorm/add_rmsnorm.cu

// The leading input's dtype and shape: FP16/BF16/FP32 [M, N].
fly_status check_lead(const fly_tensor* t, const char* what, fly_dtype* dt) {
  FLY_TRY(check_tensor(t, what, 2));
  *dt = t->dtype;
  if (*dt != FLY_F16 && *dt != FLY_BF16 && *dt != FLY_F32)
    return fail(FLY_ERROR_UNSUPPORTED, "%s: dtype %s is not supported (fp16, bf16, fp32)", what, dtype_name(*dt));
  return FLY_SUCCESS;
}

fly_status check_sizes(int64_t M, int64_t N, const char* what) {
  if (M > 0 && N == 0) return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: N = 0 (normalizing empty rows is undefined)", what);
  if (N >= (int64_t(1) << 31))
    return fail(FLY_ERROR_UNSUPPORTED, "%s: rows of %" PRId64 " elements exceed the kernels' 2^31 limit", what, N);
  return FLY_SUCCESS;
}

int64_t row_stride(const fly_tensor& t, int64_t M, int64_t N) { return M > 1 ? t.strides[0] : N; }
bool rows_aligned(const fly_tensor& t, int64_t M, int64_t N, int64_t es) {
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && (row_stride(t, M, N) * es) % 16 == 0;
}
// Every operand's rows (and the weight) 16-byte aligned and N a whole number of vectors.
bool vec_ok(std::initializer_list<const fly_tensor*> ts, const fly_tensor* w, int64_t M, int64_t N, int64_t es) {
  if (N % (16 / es) != 0) return false;
  for (const fly_tensor* t : ts)
    if (t && !rows_aligned(*t, M, N, es)) return false;
  return !w || reinterpret_cast<uintptr_t>(w->data) % 16 == 0;
}

// The variant off the database's rows (tuning/add_rmsnorm.json says why these): FP16/BF16 forward
// t128_c2, every row length (past 2048 elements its second pass rereads h, mostly from L2); FP32
// t256_c8; backward t256_c4 (rows up to 8192 FP16/BF16 elements in registers).
std::string default_variant(const std::string& dir, fly_dtype dt) {
  const char* tile = dir == "bwd" ? "_t256_c4" : dt == FLY_F32 ? "_t256_c8" : "_t128_c2";
  return "add_rmsnorm_" + dir + "_" + dtype_name(dt) + tile;
}

fly_status resolve(const DeviceCtx& dc, bool fwd, fly_dtype dt, int64_t M, int64_t N, ResolvedKernel* rk) {
  const char* op = fwd ? "add_rmsnorm_fwd" : "add_rmsnorm_bwd";
  const std::string dir = fwd ? "fwd" : "bwd";
  DispatchRequest req = make_request(kFamily, keys::add_rmsnorm(fwd, dtype_name(dt), M, N));
  // A backward whose row does not fit the variant's registers takes a second pass that rereads dy
  // and h (1.5x slower than a variant that holds the row): a nearest row's winner is taken only
  // where it holds the row, else the default (which holds the most of the bundled ones).
  const int64_t vec_elems = int64_t(16 / dtype_size(dt));
  const std::string fallback = default_variant(dir, dt);
  req.supports = [dt, dir, fwd, N, vec_elems, fallback](const Variant& v) {
    if (v.get("dtype") != dtype_name(dt) || v.get("dir") != dir) return false;
    return fwd || v.name == fallback || v.get_int("threads") * v.get_int("cache") * vec_elems >= N;
  };
  req.fallback = [dt, dir] { return default_variant(dir, dt); };
  return resolve_kernel(dc, req, op, rk);
}

// Resident CTAs of `f` per SM at `threads` threads (queried once per function; 1 when unknown).
int blocks_per_sm(const Driver& d, CUfunction f, int threads) {
  static std::mutex mu;
  static std::map<CUfunction, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(f);
  if (it != cache.end()) return it->second;
  int n = 1;
  if (d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, threads, 0) != CUDA_SUCCESS || n < 1) n = 1;
  cache[f] = n;
  return n;
}

// CTAs of a launch over M rows: every resident slot busy, never more CTAs than rows (nor, for the
// backward, than its workspace holds partial rows for).
int64_t row_ctas(const Driver& d, const DeviceCtx& dc, CUfunction f, int threads, int64_t M, int64_t cap) {
  return std::max<int64_t>(1, std::min<int64_t>({M, cap, int64_t(dc.sm_count) * blocks_per_sm(d, f, threads)}));
}

size_t workspace_bytes_for(int64_t M, int64_t N, bool weight) {
  if (!weight || M == 0 || N == 0) return 0;
  const int64_t parts = std::min<int64_t>(M, FLY_ADD_RMSNORM_BWD_MAX_CTAS);
  return size_t((parts * N * 4 + 255) / 256 * 256);
}

}  // namespace
}  // namespace fly

extern "C" FLY_API fly_status fly_add_rms_norm_fwd(const fly_tensor* x, const fly_tensor* residual,
                                                    const fly_tensor* weight, double eps, const fly_tensor* y,
                                                    const fly_tensor* h, const fly_tensor* rstd, void* stream) {
  using namespace fly;
  clear_error();
  fly_dtype dt;
  FLY_TRY(check_lead(x, "x", &dt));
  const int64_t M = x->sizes[0], N = x->sizes[1];
  FLY_TRY(check_row_operand(x, "x", "x", dt, M, N, false));
  FLY_TRY(check_row_operand(residual, "residual", "x", dt, M, N, false));
  FLY_TRY(check_row_operand(y, "y", "x", dt, M, N, true));
  FLY_TRY(check_row_operand(h, "h", "x", dt, M, N, true));
  if (weight) FLY_TRY(check_vector(weight, "weight", N, dt));
  if (rstd) FLY_TRY(check_vector(rstd, "rstd", M, FLY_F32));
  // Outputs against the other arguments (host arithmetic, before the device check): y and h may
  // each be x or residual exactly (in place: vLLM's fused_add_rms_norm writes y over x and h over
  // residual), never a shifted or partial view of one, nor each other.
  FLY_TRY(check_disjoint(y, "y", x, "x", /*same_ok=*/true));
  FLY_TRY(check_disjoint(y, "y", residual, "residual", /*same_ok=*/true));
  FLY_TRY(check_disjoint(h, "h", x, "x", /*same_ok=*/true));
  FLY_TRY(check_disjoint(h, "h", residual, "residual", /*same_ok=*/true));
  FLY_TRY(check_disjoint(h, "h", y, "y"));
  FLY_TRY(check_disjoint(y, "y", weight, "weight"));
  FLY_TRY(check_disjoint(h, "h", weight, "weight"));
  FLY_TRY(check_disjoint(rstd, "rstd", x, "x"));
  FLY_TRY(check_disjoint(rstd, "rstd", residual, "residual"));
  FLY_TRY(check_disjoint(rstd, "rstd", y, "y"));
  FLY_TRY(check_disjoint(rstd, "rstd", h, "h"));
  FLY_TRY(check_disjoint(rstd, "rstd", weight, "weight"));
  // The kernels compute in fp32: an eps beyond float's range would become inf there.
  if (!(eps >= 0.0) || !(eps <= double(FLT_MAX)))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "eps: must be finite, >= 0 and within fp32 range, got %g", eps);
  FLY_TRY(check_sizes(M, N, "x"));
  if (M == 0) return FLY_SUCCESS;

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*x, "x"));
  FLY_TRY(check_device_pointer(*residual, "residual"));
  FLY_TRY(check_device_pointer(*y, "y"));
  FLY_TRY(check_device_pointer(*h, "h"));
  if (weight) FLY_TRY(check_device_pointer(*weight, "weight"));
  if (rstd) FLY_TRY(check_device_pointer(*rstd, "rstd"));

  ResolvedKernel rk;
  FLY_TRY(resolve(*dc, true, dt, M, N, &rk));
  const int threads = int(rk.v->get_int("threads"));
  const int64_t es = int64_t(dtype_size(dt));
  const bool vec = vec_ok({x, residual, y, h}, weight, M, N, es);
  AddRmsNormFwdParams p{};
  p.x = x->data;
  p.residual = residual->data;
  p.w = weight ? weight->data : nullptr;
  p.y = y->data;
  p.h = h->data;
  p.rstd = rstd ? static_cast<float*>(rstd->data) : nullptr;
  p.M = M;
  p.N = N;
  p.cols = (N + 16 / es - 1) / (16 / es);
  p.ldx = row_stride(*x, M, N);
  p.ldr = row_stride(*residual, M, N);
  p.ldy = row_stride(*y, M, N);
  p.ldh = row_stride(*h, M, N);
  p.eps = float(eps);
  p.vec = vec ? 1 : 0;
  LaunchConfig cfg;
  cfg.grid[0] = unsigned(row_ctas(*rk.d, *dc, rk.f, threads, M, int64_t(1) << 30));
  cfg.block[0] = unsigned(threads);
  return launch1(rk.f, cfg, stream, p);
}

extern "C" FLY_API fly_status fly_add_rms_norm_bwd_workspace_size(const fly_tensor* h, const fly_tensor* weight,
                                                                   size_t* bytes) {
  using namespace fly;
  clear_error();
  if (!bytes) return fail(FLY_ERROR_INVALID_ARGUMENT, "bytes: NULL");
  *bytes = 0;
  fly_dtype dt;
  FLY_TRY(check_lead(h, "h", &dt));
  const int64_t M = h->sizes[0], N = h->sizes[1];
  if (weight) FLY_TRY(check_vector(weight, "weight", N, dt));
  FLY_TRY(check_sizes(M, N, "h"));
  *bytes = workspace_bytes_for(M, N, weight != nullptr);
  return FLY_SUCCESS;
}

extern "C" FLY_API fly_status fly_add_rms_norm_bwd(const fly_tensor* dy, const fly_tensor* dh, const fly_tensor* h,
                                                    const fly_tensor* weight, const fly_tensor* rstd,
                                                    const fly_tensor* dx, const fly_tensor* dweight, void* workspace,
                                                    size_t workspace_bytes, void* stream) {
  using namespace fly;
  clear_error();
  fly_dtype dt;
  FLY_TRY(check_lead(dy, "dy", &dt));
  const int64_t M = dy->sizes[0], N = dy->sizes[1];
  FLY_TRY(check_row_operand(dy, "dy", "dy", dt, M, N, false));
  if (dh) FLY_TRY(check_row_operand(dh, "dh", "dy", dt, M, N, false));
  FLY_TRY(check_row_operand(h, "h", "dy", dt, M, N, false));
  FLY_TRY(check_row_operand(dx, "dx", "dy", dt, M, N, true));
  if (weight) FLY_TRY(check_vector(weight, "weight", N, dt));
  FLY_TRY(check_vector(rstd, "rstd", M, FLY_F32));
  if (weight && !dweight)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "dweight: NULL with a weight (its gradient is always computed)");
  if (!weight && dweight)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "dweight: given without a weight (nothing to differentiate)");
  if (dweight) FLY_TRY(check_vector(dweight, "dweight", N, dt));
  // dx may be dy or dh exactly (in place), nothing else; dweight shares memory with nothing.
  FLY_TRY(check_disjoint(dx, "dx", dy, "dy", /*same_ok=*/true));
  FLY_TRY(check_disjoint(dx, "dx", dh, "dh", /*same_ok=*/true));
  FLY_TRY(check_disjoint(dx, "dx", h, "h"));
  FLY_TRY(check_disjoint(dx, "dx", weight, "weight"));
  FLY_TRY(check_disjoint(dx, "dx", rstd, "rstd"));
  for (const auto& [t, what] : {std::pair<const fly_tensor*, const char*>{dy, "dy"}, {dh, "dh"}, {h, "h"},
                                {weight, "weight"}, {rstd, "rstd"}, {dx, "dx"}})
    FLY_TRY(check_disjoint(dweight, "dweight", t, what));
  FLY_TRY(check_sizes(M, N, "dy"));
  FLY_TRY(check_optional_workspace(workspace, workspace_bytes));
  const size_t need = workspace_bytes_for(M, N, weight != nullptr);
  if (workspace_bytes < need)
    return fail(FLY_ERROR_WORKSPACE,
                "workspace: %zu bytes, the dweight partials need %zu (fly_add_rms_norm_bwd_workspace_size)",
                workspace_bytes, need);
  if (need)
    for (const auto& [t, what] : {std::pair<const fly_tensor*, const char*>{dy, "dy"}, {dh, "dh"}, {h, "h"},
                                  {weight, "weight"}, {rstd, "rstd"}, {dx, "dx"}, {dweight, "dweight"}})
      if (t) FLY_TRY(check_workspace_disjoint(workspace, workspace_bytes, t, what));
  if (M == 0) return FLY_SUCCESS;

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*dy, "dy"));
  if (dh) FLY_TRY(check_device_pointer(*dh, "dh"));
  FLY_TRY(check_device_pointer(*h, "h"));
  FLY_TRY(check_device_pointer(*rstd, "rstd"));
  FLY_TRY(check_device_pointer(*dx, "dx"));
  if (weight) {
    FLY_TRY(check_device_pointer(*weight, "weight"));
    FLY_TRY(check_device_pointer(*dweight, "dweight"));
    FLY_TRY(check_device_bytes(workspace, int64_t(need), "workspace"));
  }

  ResolvedKernel rk;
  FLY_TRY(resolve(*dc, false, dt, M, N, &rk));
  const int threads = int(rk.v->get_int("threads"));
  const int64_t es = int64_t(dtype_size(dt));
  const bool vec = vec_ok({dy, dh, h, dx}, weight, M, N, es);
  AddRmsNormBwdParams p{};
  p.dy = dy->data;
  p.dh = dh ? dh->data : nullptr;
  p.h = h->data;
  p.w = weight ? weight->data : nullptr;
  p.rstd = static_cast<const float*>(rstd->data);
  p.dx = dx->data;
  p.partial = weight ? static_cast<float*>(workspace) : nullptr;
  p.M = M;
  p.N = N;
  p.cols = (N + 16 / es - 1) / (16 / es);
  p.lddy = row_stride(*dy, M, N);
  p.lddh = dh ? row_stride(*dh, M, N) : 0;
  p.ldh = row_stride(*h, M, N);
  p.lddx = row_stride(*dx, M, N);
  p.vec = vec ? 1 : 0;
  const int64_t parts = row_ctas(*rk.d, *dc, rk.f, threads, M, FLY_ADD_RMSNORM_BWD_MAX_CTAS);
  LaunchConfig cfg;
  cfg.grid[0] = unsigned(parts);
  cfg.block[0] = unsigned(threads);
  FLY_TRY(launch1(rk.f, cfg, stream, p));
  if (!weight) return FLY_SUCCESS;

  CUfunction fdw = nullptr;
  FLY_TRY(get_function(*dc, *rk.v, "add_rmsnorm_dw", &fdw));
  AddRmsNormDwParams q{};
  q.partial = p.partial;
  q.dw = dweight->data;
  q.N = N;
  q.parts = int32_t(parts);
  LaunchConfig dcfg;
  dcfg.grid[0] = unsigned((N + kDwCols - 1) / kDwCols);
  dcfg.block[0] = unsigned(kDwThreads);
  return launch1(fdw, dcfg, stream, q);
}
