// SPDX-License-Identifier: Apache-2.0
// fly_cross_entropy_fwd_bwd: validation, dispatch and launch of the cross_entropy family
// (kernels/cross_entropy/).
#include <algorithm>
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core.hpp"
#include "cross_entropy/cross_entropy_params.h"

namespace fly {
namespace {

constexpr const char* kFamily = "cross_entropy";
constexpr const char* kKernel = "cross_entropy_fwd_bwd";
// Static shared memory of the kernel (the per-warp reduction slots, at most 32 x 8 bytes) and a
// margin: what the dynamic stash leaves free of the per-block opt-in limit.
constexpr int kStaticSmemReserve = 1024;

int64_t row_stride(const fly_tensor& t, int64_t M, int64_t V) { return M > 1 ? t.strides[0] : V; }
bool rows_aligned(const fly_tensor& t, int64_t M, int64_t V, int64_t es) {
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && (row_stride(t, M, V) * es) % 16 == 0;
}

// The default rule (no tuning rows): rows of at most 4096 units (a 32000-entry BF16 row is 4000)
// fit the registers of a 256-thread CTA, two of which share an SM, so one CTA's loads overlap the
// other's reduction and stores; longer rows take 512 threads (8192 units in registers, the rest in
// the shared-memory stash), one CTA per SM.
std::string default_variant(fly_dtype dt, int64_t cols) {
  return std::string("cross_entropy_") + dtype_name(dt) + (cols <= 256 * 16 ? "_t256_c16" : "_t512_c16");
}

fly_status resolve(const DeviceCtx& dc, fly_dtype dt, int64_t M, int64_t V, ResolvedKernel* rk) {
  DispatchRequest req = make_request(kFamily, keys::cross_entropy(dtype_name(dt), M, V));
  req.supports = [dt](const Variant& v) { return v.get("dtype") == dtype_name(dt); };
  const int64_t cols = (V + int64_t(16 / dtype_size(dt)) - 1) / int64_t(16 / dtype_size(dt));
  req.fallback = [dt, cols] { return default_variant(dt, cols); };
  return resolve_kernel(dc, req, kKernel, rk);
}

// Resident CTAs of `f` per SM at `threads` threads and `smem` dynamic bytes (queried once per
// (function, smem); 1 when unknown).
int blocks_per_sm(const Driver& d, CUfunction f, int threads, unsigned smem) {
  static std::mutex mu;
  static std::map<std::pair<CUfunction, unsigned>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find({f, smem});
  if (it != cache.end()) return it->second;
  int n = 1;
  if (d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, f, threads, smem) != CUDA_SUCCESS || n < 1) n = 1;
  cache[{f, smem}] = n;
  return n;
}

}  // namespace
}  // namespace fly

extern "C" FLY_API fly_status fly_cross_entropy_fwd_bwd(const fly_tensor* logits, const fly_tensor* labels,
                                                         int64_t ignore_index, double scale, const fly_tensor* loss,
                                                         const fly_tensor* lse, const fly_tensor* dlogits,
                                                         void* stream) {
  using namespace fly;
  clear_error();
  FLY_TRY(check_tensor(logits, "logits", 2));
  const fly_dtype dt = logits->dtype;
  if (dt != FLY_F16 && dt != FLY_BF16 && dt != FLY_F32)
    return fail(FLY_ERROR_UNSUPPORTED, "logits: dtype %s is not supported (fp16, bf16, fp32)", dtype_name(dt));
  const int64_t M = logits->sizes[0], V = logits->sizes[1];
  FLY_TRY(check_row_operand(logits, "logits", "logits", dt, M, V, false));
  FLY_TRY(check_vector(labels, "labels", M, FLY_I64));
  FLY_TRY(check_vector(loss, "loss", M, FLY_F32));
  if (lse) FLY_TRY(check_vector(lse, "lse", M, FLY_F32));
  if (dlogits) FLY_TRY(check_row_operand(dlogits, "dlogits", "logits", dt, M, V, true));
  // Outputs against the other arguments (host arithmetic, before the device check): dlogits may
  // be the logits exactly (in place), never a shifted or partial view of them; nothing else
  // shares memory.
  FLY_TRY(check_disjoint(dlogits, "dlogits", logits, "logits", /*same_ok=*/true));
  FLY_TRY(check_disjoint(dlogits, "dlogits", labels, "labels"));
  FLY_TRY(check_disjoint(dlogits, "dlogits", loss, "loss"));
  FLY_TRY(check_disjoint(dlogits, "dlogits", lse, "lse"));
  FLY_TRY(check_disjoint(loss, "loss", logits, "logits"));
  FLY_TRY(check_disjoint(loss, "loss", labels, "labels"));
  FLY_TRY(check_disjoint(loss, "loss", lse, "lse"));
  FLY_TRY(check_disjoint(lse, "lse", logits, "logits"));
  FLY_TRY(check_disjoint(lse, "lse", labels, "labels"));
  // The kernel multiplies in FP32: a scale beyond float's range would become inf there.
  if (!std::isfinite(scale) || std::fabs(scale) > double(FLT_MAX))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "scale: must be finite and within fp32 range, got %g", scale);
  if (M > 0 && V == 0)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "logits: V = 0 (the softmax of an empty row is undefined)");
  if (V >= (int64_t(1) << 31) - 64)
    return fail(FLY_ERROR_UNSUPPORTED, "logits: rows of %" PRId64 " elements exceed the kernel's 2^31 limit", V);
  if (M == 0) return FLY_SUCCESS;

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*logits, "logits"));
  FLY_TRY(check_device_pointer(*labels, "labels"));
  FLY_TRY(check_device_pointer(*loss, "loss"));
  if (lse) FLY_TRY(check_device_pointer(*lse, "lse"));
  if (dlogits) FLY_TRY(check_device_pointer(*dlogits, "dlogits"));

  ResolvedKernel rk;
  FLY_TRY(resolve(*dc, dt, M, V, &rk));
  const int threads = int(rk.v->get_int("threads"));
  const int64_t cache = rk.v->get_int("cache");
  const int64_t es = int64_t(dtype_size(dt));
  const int64_t per_unit = 16 / es;
  CrossEntropyParams p{};
  p.logits = logits->data;
  p.dlogits = dlogits ? dlogits->data : nullptr;
  p.labels = static_cast<const int64_t*>(labels->data);
  p.loss = static_cast<float*>(loss->data);
  p.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  p.M = M;
  p.V = V;
  p.cols = (V + per_unit - 1) / per_unit;
  p.ldl = row_stride(*logits, M, V);
  p.ldd = dlogits ? row_stride(*dlogits, M, V) : 0;
  p.ignore_index = ignore_index;
  p.scale = float(scale);
  p.vec = V % per_unit == 0 && rows_aligned(*logits, M, V, es) && (!dlogits || rows_aligned(*dlogits, M, V, es)) ? 1
                                                                                                                  : 0;
  // Units past the register cache stay in shared memory up to the opt-in limit (a gradient only:
  // without one there is no second pass). The defaults' register use already allows one CTA per
  // SM, so the stash costs no occupancy there.
  const int64_t beyond = std::max<int64_t>(0, p.cols - int64_t(threads) * cache);
  const int64_t room = std::max<int64_t>(0, (int64_t(dc->max_smem_optin) - kStaticSmemReserve) / 16);
  p.smem_units = dlogits ? int32_t(std::min(beyond, room)) : 0;
  LaunchConfig cfg;
  cfg.smem = unsigned(p.smem_units) * 16u;
  cfg.block[0] = unsigned(threads);
  const int64_t resident = int64_t(dc->sm_count) * blocks_per_sm(*rk.d, rk.f, threads, cfg.smem);
  cfg.grid[0] = unsigned(std::max<int64_t>(1, std::min(M, resident)));
  return launch1(rk.f, cfg, stream, p);
}
