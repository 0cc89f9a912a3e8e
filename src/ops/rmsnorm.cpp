// SPDX-License-Identifier: Apache-2.0
// fly_rms_norm_fwd: validation, dispatch and launch of the rmsnorm family.
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>

#include "core.hpp"
#include "rmsnorm/rmsnorm_params.h"

namespace fly {
namespace {

constexpr const char* kFamily = "rmsnorm";

// The family default (built in every configuration, see tuning/rmsnorm.json "defaults"): the
// smallest CTA whose register cache holds the row's aligned body (at most N / vec vectors), so
// each thread keeps as many loads in flight as its cache allows.
std::string default_variant(fly_dtype dt, int64_t n) {
  const int64_t nvec = n / (16 / int64_t(dtype_size(dt)));
  struct Choice { int tpr, rpc, cache, pf; };
  static const Choice kLadder[] = {{32, 4, 4, 1},  {64, 4, 4, 1},  {128, 2, 4, 1},
                                   {256, 2, 4, 1}, {512, 1, 4, 1}, {1024, 1, 8, 0}};
  Choice c = kLadder[5];
  for (auto& k : kLadder)
    if (nvec <= int64_t(k.tpr) * k.cache) { c = k; break; }
  return std::string("rmsnorm_") + dtype_name(dt) + "_t" + std::to_string(c.tpr) + "_r" + std::to_string(c.rpc) +
         "_c" + std::to_string(c.cache) + "_p" + std::to_string(c.pf);
}

// Dynamic shared memory the function may have: the device's opt-in maximum per block less the
// function's static shared memory (queried once per function).
int64_t dynamic_smem_limit(const Driver& d, const DeviceCtx& dc, CUfunction f) {
  static std::mutex mu;
  static std::map<CUfunction, int> static_smem;
  std::lock_guard<std::mutex> lock(mu);
  auto it = static_smem.find(f);
  if (it == static_smem.end()) {
    int stat = 0;
    if (d.cuFuncGetAttribute(&stat, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f) != CUDA_SUCCESS) stat = 1024;
    it = static_smem.emplace(f, stat).first;
  }
  return int64_t(dc.max_smem_optin) - it->second;
}

int blocks_per_sm(const Driver& d, const DeviceCtx& dc, CUfunction f, int threads, unsigned smem) {
  static std::mutex mu;
  static std::map<std::pair<CUfunction, unsigned>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({f, smem});
  if (it != cache.end()) return it->second;
  int n = 1;
  // The occupancy query counts dynamic shared memory only up to the function's current limit.
  // NOTE: raised to the maximum, never to `smem`: launch() raises the limit monotonically and
  // skips functions it has raised before, so lowering it here could fail a later launch.
  if (smem > 48 * 1024)
    d.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(dynamic_smem_limit(d, dc, f)));
  if (d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, threads, smem) != CUDA_SUCCESS || n < 1) n = 1;
  cache[{f, smem}] = n;
  return n;
}

int64_t ring_smem(const Variant& v, int64_t n, int64_t es) {
  const int64_t pf = v.get_int("pf", 0);
  if (pf < 2) return 0;
  return v.get_int("rpc") * pf * rmsnorm_ring_stage_bytes(n, es);
}
bool ring_usable(const Variant& v, int64_t n, int64_t es, bool vec_io, const Driver& d, const DeviceCtx& dc,
                 CUfunction f) {
  if (v.get_int("pf", 0) < 2) return false;
  const int64_t per_vec = 16 / es;
  return vec_io && n / per_vec <= v.get_int("tpr") * v.get_int("cache") &&
         ring_smem(v, n, es) <= dynamic_smem_limit(d, dc, f);
}

}  // namespace
}  // namespace fly

extern "C" FLY_API fly_status fly_rms_norm_fwd(const fly_tensor* x, const fly_tensor* weight, double eps,
                                                const fly_tensor* y, const fly_tensor* rstd, void* stream) {
  using namespace fly;
  clear_error();
  FLY_TRY(check_tensor(x, "x", 2));
  const fly_dtype dt = x->dtype;
  if (dt != FLY_F16 && dt != FLY_BF16 && dt != FLY_F32)
    return fail(FLY_ERROR_UNSUPPORTED, "x: dtype %s is not supported (fp16, bf16, fp32)", dtype_name(dt));
  const int64_t M = x->sizes[0], N = x->sizes[1];
  FLY_TRY(check_row_layout(*x, "x", false));
  FLY_TRY(check_tensor(y, "y", 2));
  if (y->sizes[0] != M || y->sizes[1] != N)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "y: shape [%" PRId64 ", %" PRId64 "] does not match x [%" PRId64 ", %" PRId64 "]",
                y->sizes[0], y->sizes[1], M, N);
  if (y->dtype != dt)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "y: dtype %s does not match x (%s)", dtype_name(y->dtype), dtype_name(dt));
  FLY_TRY(check_row_layout(*y, "y", true));
  if (weight) FLY_TRY(check_vector(weight, "weight", N, dt));
  if (rstd) FLY_TRY(check_vector(rstd, "rstd", M, FLY_F32));
  // Outputs against the other arguments (host arithmetic, before the device check): y may be x
  // exactly (in place), never a shifted or partial view of it.
  FLY_TRY(check_disjoint(y, "y", x, "x", /*same_ok=*/true));
  FLY_TRY(check_disjoint(y, "y", weight, "weight"));
  FLY_TRY(check_disjoint(rstd, "rstd", x, "x"));
  FLY_TRY(check_disjoint(rstd, "rstd", y, "y"));
  FLY_TRY(check_disjoint(rstd, "rstd", weight, "weight"));
  // The kernels compute in fp32: an eps beyond float's range would become inf there.
  if (!(eps >= 0.0) || !(eps <= double(FLT_MAX)))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "eps: must be finite, >= 0 and within fp32 range, got %g", eps);
  if (M == 0) return FLY_SUCCESS;
  if (N == 0) return fail(FLY_ERROR_INVALID_ARGUMENT, "x: N = 0 (normalizing empty rows is undefined)");
  if (N >= (int64_t(1) << 31))
    return fail(FLY_ERROR_UNSUPPORTED, "x: rows of %" PRId64 " elements exceed the kernels' 2^31 limit", N);

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*x, "x"));
  FLY_TRY(check_device_pointer(*y, "y"));
  if (weight) FLY_TRY(check_device_pointer(*weight, "weight"));
  if (rstd) FLY_TRY(check_device_pointer(*rstd, "rstd"));

  DispatchRequest req = make_request(kFamily, keys::rmsnorm(dtype_name(dt), M, N));
  req.supports = [dt](const Variant& v) { return v.get("dtype") == dtype_name(dt); };
  req.fallback = [dt, N] { return default_variant(dt, N); };
  ResolvedKernel rk;
  FLY_TRY(resolve_kernel(*dc, req, "rmsnorm_fwd", &rk));
  const Variant* v = rk.v;
  const CUfunction f = rk.f;
  const Driver* d = rk.d;

  const int tpr = int(v->get_int("tpr")), rpc = int(v->get_int("rpc"));
  const int64_t es = int64_t(dtype_size(dt));
  const int64_t ldx = M > 1 ? x->strides[0] : N, ldy = M > 1 ? y->strides[0] : N;
  // x and y rows share their 16-byte alignment: vector loads and stores serve both.
  const uintptr_t xa = reinterpret_cast<uintptr_t>(x->data), ya = reinterpret_cast<uintptr_t>(y->data);
  const bool vec_io = ((xa - ya) % 16 == 0) && (((ldx - ldy) * es) % 16 == 0);
  RmsNormParams p{};
  p.x = x->data;
  p.w = weight ? weight->data : nullptr;
  p.y = y->data;
  p.rstd = rstd ? static_cast<float*>(rstd->data) : nullptr;
  p.M = M;
  p.N = N;
  p.ldx = ldx;
  p.ldy = ldy;
  p.eps = float(eps);
  p.vec_io = vec_io;
  const bool ring = ring_usable(*v, N, es, vec_io, *d, *dc, f);
  p.stage_bytes = ring ? int32_t(rmsnorm_ring_stage_bytes(N, es)) : 0;
  const unsigned smem = ring ? unsigned(ring_smem(*v, N, es)) : 0u;
  // Alignment classes: row r starts at xa + r * ldx * es, periodic modulo 16 bytes.
  const int64_t row_bytes_mod = (ldx * es) % 16;
  p.period = p.vec_io ? int32_t(16 / std::gcd<int64_t>(row_bytes_mod == 0 ? 16 : row_bytes_mod, 16)) : 1;
  const int64_t resident = int64_t(dc->sm_count) * blocks_per_sm(*d, *dc, f, tpr * rpc, smem) * rpc;
  int64_t groups = std::min<int64_t>(M, resident);
  // Balanced rounds: as few groups as give the same number of rounds, so no group walks one row
  // more than the others while most of the GPU idles (8192 rows on 528 groups: 512 x 16 rows, not
  // 272 groups x 16 + 256 x 15). Measured on the H200: 2% over all variants, 0.2% on the winners.
  const int64_t rounds = (M + groups - 1) / groups;
  groups = (M + rounds - 1) / rounds;
  groups = (groups + p.period - 1) / p.period * p.period;
  p.groups = int32_t(groups);
  LaunchConfig cfg;
  cfg.grid[0] = unsigned((groups + rpc - 1) / rpc);
  cfg.block[0] = unsigned(tpr * rpc);
  cfg.smem = smem;
  return launch1(f, cfg, stream, p);
}
