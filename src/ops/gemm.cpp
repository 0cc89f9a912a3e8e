// SPDX-License-Identifier: Apache-2.0
// fly_gemm / fly_gemm_workspace_size: validation, dispatch and launch of the gemm family
// (kernels/gemm/gemm_sm90.cu, host planning shared with the dev harness in gemm/gemm_plan.h; the
// decode kernel kernels/gemm/gemm_decode_sm90.cu, planned by gemm/gemm_decode.h).
#include <algorithm>
#include <cinttypes>
#include <string>

#include "core.hpp"
#include "dispatch.hpp"
#include "gemm/gemm_decode.h"
#include "gemm/gemm_odd_plan.h"
#include "gemm/gemm_params.h"
#include "gemm/gemm_plan.h"

namespace fly {
namespace {

constexpr const char* kFamily = "gemm";

// One validated call: the kernel-facing problem plus what dispatch needs.
struct GemmCall {
  gemm::Problem pr{};
  fly_dtype dt = FLY_DTYPE_INVALID;
  std::string layout;  // "nt", "nn", "tn", "tt": A row (n) / col (t) major, B row (n) / col (t)
  // Set when TMA cannot address A or B (gemm_plan.h operand_tma_problem): the call copies those
  // operands into the workspace and runs the TMA kernel on the copies (the packed path) when the
  // workspace holds them, else takes the cp.async kernel (gemm_odd_sm90.cu). Names the operand and
  // the rule, for the info log.
  std::string odd_reason;
  bool odd_a = false, odd_b = false;
};

// Row- or column-major view of a [rows, cols] tensor. A size-1 dimension makes one stride
// irrelevant: such a matrix takes the interpretation whose leading dimension is never used
// (row-major for a single row, column-major for a single contiguous column), so TMA's 16-byte
// rule on the leading dimension cannot reject it.
fly_status matrix_major(const fly_tensor& t, const char* what, bool* row_major, int64_t* ld) {
  const int64_t r = t.sizes[0], c = t.sizes[1], s0 = t.strides[0], s1 = t.strides[1];
  if (r <= 1 && (c <= 1 || s1 == 1)) {
    *row_major = true;
    *ld = c;
    return FLY_SUCCESS;
  }
  if (c <= 1 && s0 == 1) {
    *row_major = false;
    *ld = r;
    return FLY_SUCCESS;
  }
  if ((c <= 1 || s1 == 1) && (r <= 1 || s0 >= c)) {
    *row_major = true;
    *ld = s0;
    return FLY_SUCCESS;
  }
  if ((r <= 1 || s0 == 1) && (c <= 1 || s1 >= r)) {
    *row_major = false;
    *ld = c > 1 ? s1 : r;
    return FLY_SUCCESS;
  }
  return fail(FLY_ERROR_UNSUPPORTED,
              "%s: strides {%" PRId64 ", %" PRId64 "} of a [%" PRId64 ", %" PRId64
              "] matrix are neither row-major nor column-major (with non-overlapping lines)",
              what, s0, s1, r, c);
}

fly_status validate(const fly_tensor* a, const fly_tensor* b, const fly_tensor* c,
                    const fly_tensor* bias, GemmCall* out) {
  FLY_TRY(check_tensor(a, "a", 2));
  FLY_TRY(check_tensor(b, "b", 2));
  FLY_TRY(check_tensor(c, "c", 2));
  const fly_dtype dt = a->dtype;
  if (dt != FLY_F16 && dt != FLY_BF16)
    return fail(FLY_ERROR_UNSUPPORTED, "a: dtype %s is not supported (fp16, bf16)", dtype_name(dt));
  if (b->dtype != dt)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "b: dtype %s does not match a (%s)", dtype_name(b->dtype), dtype_name(dt));
  if (c->dtype != dt)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "c: dtype %s does not match a (%s)", dtype_name(c->dtype), dtype_name(dt));
  const int64_t M = a->sizes[0], K = a->sizes[1], N = b->sizes[1];
  if (b->sizes[0] != K)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "b: shape [%" PRId64 ", %" PRId64 "] does not match a [%" PRId64 ", %" PRId64
                "] (b must be [K, N])", b->sizes[0], b->sizes[1], M, K);
  if (c->sizes[0] != M || c->sizes[1] != N)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "c: shape [%" PRId64 ", %" PRId64 "], expected [%" PRId64 ", %" PRId64 "]",
                c->sizes[0], c->sizes[1], M, N);
  if (bias) FLY_TRY(check_vector(bias, "bias", N, dt));
  // C: row-major with unit inner stride.
  if (N > 1 && c->strides[1] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "c: inner stride must be 1 (row-major C), got %" PRId64, c->strides[1]);
  if (M > 1 && c->strides[0] < N)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "c: row stride %" PRId64 " is smaller than N = %" PRId64 " (rows overlap)",
                c->strides[0], N);
  bool a_row = true, b_row = true;
  int64_t lda = 0, ldb = 0;
  FLY_TRY(matrix_major(*a, "a", &a_row, &lda));
  FLY_TRY(matrix_major(*b, "b", &b_row, &ldb));
  const int64_t lim = int64_t(1) << 31;
  if (M >= lim || N >= lim || K >= lim)
    return fail(FLY_ERROR_UNSUPPORTED, "a/b: dimensions M=%" PRId64 " N=%" PRId64 " K=%" PRId64 " exceed the kernels' 2^31 limit",
                M, N, K);
  out->dt = dt;
  out->layout = keys::gemm_layout(a_row, b_row);
  gemm::Problem& p = out->pr;
  p.M = M;
  p.N = N;
  p.K = K;
  p.a = {a->data, M, lda, a_row};
  // B^T [N, K]: K-major exactly when B is column-major.
  p.bt = {b->data, N, ldb, !b_row};
  p.c = c->data;
  p.ldc = M > 1 ? c->strides[0] : N;
  p.bias = bias ? bias->data : nullptr;
  p.dtype = dt == FLY_BF16 ? gemm::Dtype::kBf16 : gemm::Dtype::kFp16;
  if (M == 0 || N == 0) return FLY_SUCCESS;  // nothing to check further: no-op
  if (K == 0)
    return fail(FLY_ERROR_UNSUPPORTED, "a: K = 0 (an empty reduction) is not supported: C would be just the bias");
  // Operands TMA cannot address (16-byte rows and bases) go to the cp.async kernel instead.
  if (const char* why = gemm::operand_tma_problem(p.a, K, p.dtype)) {
    out->odd_reason = std::string("a: ") + why + " (lda = " + std::to_string(lda) + ")";
    out->odd_a = true;
  }
  if (const char* why = gemm::operand_tma_problem(p.bt, K, p.dtype)) {
    out->odd_reason += std::string(out->odd_reason.empty() ? "" : "; ") + "b: " + why + " (ldb = " + std::to_string(ldb) + ")";
    out->odd_b = true;
  }
  return FLY_SUCCESS;
}

struct VariantShapeOf {
  static gemm::VariantShape of(const Variant& v) {
    return {int(v.get_int("bn", 128)), int(v.get_int("stages", 4)), v.get_int("swap", 0) == 1,
            int(v.get_int("mc", 1)), int(v.get_int("epi", 0)), int(v.get_int("bm", gemm::kBM)),
            int(v.get_int("mp", 1)), int(v.get_int("l2p", 256)), int(v.get_int("pp", 0)),
            int(v.get_int("kb", 1)), int(v.get_int("ks", 0)), int(v.get_int("gm", 0)), int(v.get_int("kw", 1))};
  }
};

// Decode variants (kernels/gemm/gemm_decode_sm90.cu) are the ones with a "rpw" parameter.
bool is_decode(const Variant& v) { return v.get_int("rpw", 0) > 0; }
gemm::DecodeShape decode_shape(const Variant& v) {
  return {int(v.get_int("nw", 8)), int(v.get_int("rpw", 16)), int(v.get_int("mt", 8)), int(v.get_int("cl", 0))};
}

// Whether a variant can take the problem: a decode one only NT with M <= 8 mt and K % 8 == 0
// (gemm_decode.h decode_fits); one with a forced split-K factor (launch axis "split" > 0) only
// where split-K makes sense (gemm_plan.h forced_split_fits); every tile only with the operand
// layouts it can load (gemm_plan.h layout_fits: MN-major operands come in 64-wide chunks), and
// only a tile the legality rules admit (gemm_legal.h).
bool variant_fits(const Variant& v, const gemm::Problem& pr, int sm_count) {
  if (is_decode(v)) return gemm::decode_fits(pr, decode_shape(v));
  const gemm::VariantShape vs = VariantShapeOf::of(v);
  if (!gemm::tile_legal(gemm::tile_shape(vs))) return false;  // a bundled entry the kernel cannot be
  const int split = int(v.get_int("split", 0));
  return (split <= 0 || gemm::forced_split_fits(pr, vs, split, sm_count)) && gemm::layout_fits(pr, vs);
}

// `name` (gemm_<dtype>_...) with the call's dtype: the profile rows were measured in one dtype or
// the other, and FP16 and BF16 run the same code at the same speed.
std::string with_dtype(const std::string& name, fly_dtype dt) {
  const std::string want = std::string("_") + dtype_name(dt) + "_";
  for (const char* other : {"_bf16_", "_fp16_"}) {
    const size_t at = name.find(other);
    if (at != std::string::npos) return name.substr(0, at) + want + name.substr(at + 6);
  }
  return name;
}

// Family default (only names listed in tuning/gemm.json "defaults"): swap-AB for decode-sized M,
// 128x128 tiles (with split-K) up to M = 128, else 128x256.
std::string default_variant(fly_dtype dt, int64_t M) {
  const std::string d = dtype_name(dt);
  if (M <= 64) return "gemm_" + d + "_bn64_st8_sw1_mc1";
  if (M <= 128) return "gemm_" + d + "_bn128_st6_sw0_mc1";
  return "gemm_" + d + "_bn256_st4_sw0_mc1";
}

// The launch tail both kernels share: a variant needing more shared memory than the device
// allows is refused (callers fall back), otherwise the planned grid is launched.
template <class Params>
fly_status launch_planned(const DeviceCtx& dc, const Variant& v, CUfunction f, unsigned grid, unsigned threads,
                          unsigned smem, unsigned cluster, void* stream, const Params& params) {
  if (int64_t(smem) > dc.max_smem_optin)
    return fail(FLY_ERROR_UNSUPPORTED, "variant %s needs %u bytes of shared memory, the device allows %d",
                v.name.c_str(), smem, dc.max_smem_optin);
  LaunchConfig cfg;
  cfg.grid[0] = grid;
  cfg.block[0] = threads;
  cfg.smem = smem;
  cfg.cluster[0] = cluster;
  return launch1(f, cfg, stream, params);
}

// Workspace that lets every path run: stream-K variants (launch axis split = 1) keep flags and
// partial tiles there, at most one 128 x 256 fp32 tile per CTA of a grid no larger than the SM
// count. Device independent: bounded by the largest sm_90 part (144 SMs). Split-K clusters
// reduce through distributed shared memory and need none.
constexpr int kMaxSms = 144;
int64_t stream_k_need(const GemmCall& call) {
  int64_t need = 0;
  for (const Variant* v : variants_of(kFamily))
    if (v->get_int("split", 0) == 1 && v->get("dtype") == dtype_name(call.dt))
      need = std::max(need, gemm::sk_workspace_bytes(kMaxSms, int(v->get_int("bm", gemm::kBM)), int(v->get_int("bn", 128))));
  return need;
}

// The packed path's copies (A's, then B's) go at the end of the workspace, never into its first
// kPackFront bytes: those hold stream-K's flags, which every call must find zero.
constexpr int64_t kPackFront = 4096;
static_assert(gemm::sk_flags_bytes(kMaxSms) <= kPackFront, "stream-K flags fit the workspace's front");
int64_t pack_need(const GemmCall& call) {
  return (call.odd_a ? gemm::pack_bytes(call.pr.a, call.pr.K, call.pr.dtype) : 0) +
         (call.odd_b ? gemm::pack_bytes(call.pr.bt, call.pr.K, call.pr.dtype) : 0);
}
// Copies are offered up to kMaxPackBytes in all: no GPU holds a 1 TiB operand (validation allows
// extents up to 2^47 elements, so the sizes above cannot overflow). Larger calls take the cp.async
// kernel and the workspace query leaves the copies out.
constexpr int64_t kMaxPackBytes = int64_t(1) << 40;
bool packable(int64_t pack) { return pack > 0 && pack <= kMaxPackBytes; }

// The query: stream-K's part, and for operands TMA cannot address room for their copies after it.
int64_t workspace_need(const GemmCall& call) {
  if (call.pr.M == 0 || call.pr.N == 0) return 0;
  const int64_t sk = stream_k_need(call), pack = pack_need(call);
  if (!packable(pack)) return sk;
  return (std::max(sk, kPackFront) + 255) / 256 * 256 + pack;
}

// ---- the cp.async path (kernels/gemm/gemm_odd_sm90.cu): operands TMA cannot address ----------
// Its variants are named gemm_odd_<dtype>_bn<bn>_st<stages> (tuning/gemm.json). Chosen without
// the database: the 128 x 128 tile with 6 stages (the only ones in `defaults`) for every shape;
// a forced gemm_odd_ variant runs any call, aligned or not (for tests and benchmarks).
bool is_odd(const Variant& v) { return v.name.rfind("gemm_odd_", 0) == 0; }
std::string default_odd_variant(fly_dtype dt) { return std::string("gemm_odd_") + dtype_name(dt) + "_bn128_st6"; }

fly_status launch_odd(const DeviceCtx& dc, const Variant& v, const gemm::Problem& pr, void* stream) {
  CUfunction f = nullptr;
  FLY_TRY(get_function(dc, v, "fly_gemm_odd_sm90", &f));
  gemm::OddLaunch L;
  gemm::plan_odd(pr, int(v.get_int("bn", 128)), int(v.get_int("stages", 6)), dc.sm_count, &L);
  if (log_level() >= LogLevel::kInfo)
    log(LogLevel::kInfo, "gemm: %s loads A with %d-byte and B with %d-byte copies, grid %u, split %u", v.name.c_str(),
        L.params.tail.p.gran, L.params.tail.q.gran, L.grid, L.cluster);
  return launch_planned(dc, v, f, L.grid, gemm::kOddThreads, L.smem, L.cluster, stream, L.params);
}

// A call TMA cannot address: the cp.async kernel, through the dispatch of op "gemm_odd" (a forced
// variant, else the fallback: no database rows name this op).
fly_status run_odd(const DeviceCtx& dc, const GemmCall& call, void* stream) {
  DispatchRequest req =
      make_request(kFamily, keys::gemm(dtype_name(call.dt), call.layout, call.pr.M, call.pr.N, call.pr.K, true));
  const fly_dtype dt = call.dt;
  req.supports = [dt](const Variant& v) { return is_odd(v) && v.get("dtype") == dtype_name(dt); };
  req.fallback = [dt] { return default_odd_variant(dt); };
  const Variant* v = nullptr;
  FLY_TRY(choose_variant(dc, req, &v));
  if (log_level() >= LogLevel::kInfo)
    log(LogLevel::kInfo, "gemm: cp.async path %s, since TMA cannot address the operands: %s", v->name.c_str(),
        call.odd_reason.c_str());
  return launch_odd(dc, *v, call.pr, stream);
}

// A call TMA can address (its own operands, or the packed path's copies): database dispatch over
// the TMA and decode kernels (or a forced variant, a cp.async one included).
fly_status run_tma(const DeviceCtx& dc, const GemmCall& call, void* workspace, size_t workspace_bytes, void* stream) {
  const gemm::Problem& pr = call.pr;
  DispatchRequest req = make_request(kFamily, keys::gemm(dtype_name(call.dt), call.layout, pr.M, pr.N, pr.K));
  const fly_dtype dt = call.dt;
  const int sms = dc.sm_count;
  const gemm::Problem prob = pr;
  req.supports = [dt, sms, prob](const Variant& v) {
    return v.get("dtype") == dtype_name(dt) && variant_fits(v, prob, sms);
  };
  req.cache_tag = "sms=" + std::to_string(sms);  // forced_split_fits depends on the SM count
  const int64_t M = pr.M;
  req.fallback = [dt, M] { return default_variant(dt, M); };
  // Off the tuned keys, the profiled shapes vote (db/sm_90a_gemm_profile.sql: random shapes timed
  // with every bundled variant, either dtype: a variant's speed does not depend on it).
  req.profile_op = "gemm";
  req.profile_name = [dt](const std::string& name) { return with_dtype(name, dt); };
  // The two kernels of the family have their own entry symbols and parameter structs.
  const Variant* v = nullptr;
  FLY_TRY(choose_variant(dc, req, &v));
  if (is_odd(*v)) return launch_odd(dc, *v, pr, stream);  // a forced cp.async variant
  CUfunction f = nullptr;
  FLY_TRY(get_function(dc, *v, is_decode(*v) ? "fly_gemm_decode_sm90" : "fly_gemm_sm90", &f));
  const Driver* d = nullptr;
  FLY_TRY(driver(&d));

  if (is_decode(*v)) {
    gemm::DecodeLaunch L;
    const CUresult r = gemm::plan_decode(pr, decode_shape(*v), dc.sm_count, d->cuTensorMapEncodeTiled, &L);
    if (r != CUDA_SUCCESS) return cuda_fail(r, "cuTensorMapEncodeTiled");
    return launch_planned(dc, *v, f, L.grid, L.threads, L.smem, L.cluster, stream, L.params);
  }
  gemm::Launch L;
  const CUresult r = gemm::plan_gemm(pr, VariantShapeOf::of(*v), dc.sm_count, d->cuTensorMapEncodeTiled, &L,
                                     int(v->get_int("split", 0)), gemm::Workspace{workspace, workspace_bytes});
  if (r != CUDA_SUCCESS) return cuda_fail(r, "cuTensorMapEncodeTiled");
  return launch_planned(dc, *v, f, L.grid, gemm::kThreads, L.smem, L.cluster, stream, L.params);
}

// The packed path: each operand TMA cannot address is copied (fly_pack_lines_sm90, in the cp.async
// variant's cubin) into the last `pack` bytes of the workspace, then run_tma runs on the copies
// with the workspace's front (stream-K's flags and, when large enough, its partial tiles).
fly_status run_packed(const DeviceCtx& dc, const GemmCall& call, void* workspace, size_t workspace_bytes, int64_t pack,
                      void* stream) {
  const Variant* pv = find_variant(default_odd_variant(call.dt));
  if (!pv) return run_odd(dc, call, stream);  // not bundled: run_odd says so
  CUfunction f = nullptr;
  FLY_TRY(get_function(dc, *pv, "fly_pack_lines_sm90", &f));
  const int64_t front = (int64_t(workspace_bytes) - pack) / 256 * 256;  // >= kPackFront, 256-aligned
  char* dst = static_cast<char*>(workspace) + front;
  GemmCall packed = call;
  for (int which = 0; which < 2; ++which) {
    if (!(which == 0 ? call.odd_a : call.odd_b)) continue;
    const gemm::Operand& o = which == 0 ? call.pr.a : call.pr.bt;
    gemm::PackLaunch L;
    gemm::plan_pack(o, call.pr.K, dst, dc.sm_count, &L);
    LaunchConfig cfg;
    cfg.grid[0] = L.grid;
    cfg.block[0] = gemm::kPackThreads;
    FLY_TRY(launch1(f, cfg, stream, L.params));
    (which == 0 ? packed.pr.a : packed.pr.bt) = L.packed;
    dst += gemm::pack_bytes(o, call.pr.K, call.pr.dtype);
  }
  packed.odd_reason.clear();
  packed.odd_a = packed.odd_b = false;
  FLY_TRY(run_tma(dc, packed, workspace, size_t(front), stream));
  append_decision(":packed");
  if (log_level() >= LogLevel::kInfo)
    log(LogLevel::kInfo, "gemm: packed path: %s copied to aligned lines in the workspace (%" PRId64 " bytes), then %s",
        call.odd_reason.c_str(), pack, last_variant());
  return FLY_SUCCESS;
}

}  // namespace
}  // namespace fly

extern "C" FLY_API fly_status fly_gemm_workspace_size(const fly_tensor* a, const fly_tensor* b,
                                                      const fly_tensor* c, size_t* bytes) {
  using namespace fly;
  clear_error();
  if (!bytes) return fail(FLY_ERROR_INVALID_ARGUMENT, "bytes: null pointer");
  *bytes = 0;
  GemmCall call;
  FLY_TRY(validate(a, b, c, nullptr, &call));
  *bytes = size_t(workspace_need(call));
  return FLY_SUCCESS;
}

extern "C" FLY_API fly_status fly_gemm(const fly_tensor* a, const fly_tensor* b, const fly_tensor* c,
                                       const fly_tensor* bias, void* workspace, size_t workspace_bytes,
                                       void* stream) {
  using namespace fly;
  clear_error();
  GemmCall call;
  FLY_TRY(validate(a, b, c, bias, &call));
  // The workspace is optional (stream-K variants run as plain persistent launches without one).
  FLY_TRY(check_optional_workspace(workspace, workspace_bytes));
  // The output against the inputs, the workspace against every argument (host arithmetic, before
  // the device check).
  FLY_TRY(check_disjoint(c, "c", a, "a"));
  FLY_TRY(check_disjoint(c, "c", b, "b"));
  FLY_TRY(check_disjoint(c, "c", bias, "bias"));
  for (const fly_tensor* t : {a, b, c, bias})
    FLY_TRY(check_workspace_disjoint(workspace, workspace_bytes, t, t == a ? "a" : t == b ? "b" : t == c ? "c" : "bias"));
  if (call.pr.M == 0 || call.pr.N == 0) return FLY_SUCCESS;

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*a, "a"));
  FLY_TRY(check_device_pointer(*b, "b"));
  FLY_TRY(check_device_pointer(*c, "c"));
  if (bias) FLY_TRY(check_device_pointer(*bias, "bias"));
  if (workspace && workspace_bytes > 0) FLY_TRY(check_device_bytes(workspace, int64_t(workspace_bytes), "workspace"));
  if (call.odd_reason.empty()) return run_tma(*dc, call, workspace, workspace_bytes, stream);
  // TMA cannot address A or B: copies in the workspace when it holds them (and no cp.async variant
  // is forced), else the cp.async kernel.
  const int64_t pack = pack_need(call);
  const bool odd_forced = forced_variant().rfind("gemm_odd_", 0) == 0;
  if (!odd_forced && packable(pack) && workspace && int64_t(workspace_bytes) - pack >= kPackFront)
    return run_packed(*dc, call, workspace, workspace_bytes, pack, stream);
  if (log_level() >= LogLevel::kInfo && !odd_forced) {
    if (packable(pack))
      log(LogLevel::kInfo, "gemm: a workspace of %" PRId64 " bytes (fly_gemm_workspace_size; %zu given) would run "
          "the TMA kernel on aligned copies of the operands", workspace_need(call), workspace_bytes);
    else
      log(LogLevel::kInfo, "gemm: aligned copies of these operands would exceed %" PRId64 " bytes: the cp.async kernel",
          kMaxPackBytes);
  }
  return run_odd(*dc, call, stream);
}
