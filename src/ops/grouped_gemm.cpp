// SPDX-License-Identifier: Apache-2.0
// fly_grouped_gemm / fly_grouped_gemm_workspace_size: validation, dispatch and launch of the
// grouped_gemm family (kernels/gemm/gemm_grouped_sm90.cu; docs/grouped_gemm.md).
#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <string>

#include "core.hpp"
#include "gemm/gemm_grouped_k_params.h"
#include "gemm/gemm_grouped_params.h"
#include "gemm/gemm_plan.h"

namespace fly {
namespace {

constexpr const char* kFamily = "grouped_gemm";

struct GroupedCall {
  fly_dtype dt = FLY_DTYPE_INVALID;
  int64_t T = 0, K = 0, N = 0, G = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  bool b_kmajor = false;          // B's K contiguous ([G, N, K] in memory: w.transpose(-2, -1))
  int64_t b_ld = 0;               // K-major: stride of n; MN-major: stride of k (elements)
  int64_t b_gs = 0;               // stride of g (elements)
  const int32_t* offs = nullptr;
  const void* bias = nullptr;
  int64_t bias_gs = 0;
  void* c = nullptr;
  int64_t ldc = 0;
};

// Both modes: a FP16 or BF16, b, c (and bias) of a's dtype, offs int32 (`offs_what`: what its
// entries are, for the message).
fly_status check_dtypes(const fly_tensor* a, const fly_tensor* b, const fly_tensor* c, const fly_tensor* bias,
                        const fly_tensor* offs, const char* offs_what) {
  const fly_dtype dt = a->dtype;
  if (dt != FLY_F16 && dt != FLY_BF16)
    return fail(FLY_ERROR_UNSUPPORTED, "a: dtype %s is not supported (fp16, bf16)", dtype_name(dt));
  if (b->dtype != dt)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "b: dtype %s does not match a (%s)", dtype_name(b->dtype), dtype_name(dt));
  if (c->dtype != dt)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "c: dtype %s does not match a (%s)", dtype_name(c->dtype), dtype_name(dt));
  if (bias && bias->dtype != dt)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "bias: dtype %s does not match a (%s)", dtype_name(bias->dtype),
                dtype_name(dt));
  if (offs->dtype != FLY_I32)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "offs: dtype %s, expected int32 (%s)", dtype_name(offs->dtype), offs_what);
  return FLY_SUCCESS;
}

fly_status validate(const fly_tensor* a, const fly_tensor* b, const fly_tensor* offs, const fly_tensor* bias,
                    const fly_tensor* c, GroupedCall* out) {
  FLY_TRY(check_tensor(a, "a", 2));
  FLY_TRY(check_tensor(b, "b", 3));
  FLY_TRY(check_tensor(offs, "offs", 1));
  FLY_TRY(check_tensor(c, "c", 2));
  if (bias) FLY_TRY(check_tensor(bias, "bias", 2));
  FLY_TRY(check_dtypes(a, b, c, bias, offs, "cumulative group end rows"));
  const fly_dtype dt = a->dtype;
  const int64_t T = a->sizes[0], K = a->sizes[1], G = b->sizes[0], N = b->sizes[2];
  if (b->sizes[1] != K)
    return fail(FLY_ERROR_INVALID_ARGUMENT,
                "b: shape [%" PRId64 ", %" PRId64 ", %" PRId64 "] does not match a [%" PRId64 ", %" PRId64
                "] (b must be [G, K, N])", G, b->sizes[1], N, T, K);
  if (offs->sizes[0] != G)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "offs: %" PRId64 " entries, expected G = %" PRId64 " (b's first dimension)",
                offs->sizes[0], G);
  if (c->sizes[0] != T || c->sizes[1] != N)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "c: shape [%" PRId64 ", %" PRId64 "], expected [%" PRId64 ", %" PRId64 "]",
                c->sizes[0], c->sizes[1], T, N);
  if (bias && (bias->sizes[0] != G || bias->sizes[1] != N))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "bias: shape [%" PRId64 ", %" PRId64 "], expected [G, N] = [%" PRId64
                ", %" PRId64 "]", bias->sizes[0], bias->sizes[1], G, N);
  if (G == 0 && T > 0)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "b: G = 0 groups for T = %" PRId64 " rows of a", T);
  const int64_t lim = int64_t(1) << 31;
  if (T >= lim || N >= lim || K >= lim || G >= lim)
    return fail(FLY_ERROR_UNSUPPORTED,
                "a/b: dimensions T=%" PRId64 " K=%" PRId64 " N=%" PRId64 " G=%" PRId64 " exceed the kernel's 2^31 limit",
                T, K, N, G);
  // Strides: A and C row-major, offs and bias rows unit stride.
  if (K > 1 && a->strides[1] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "a: inner stride must be 1 (row-major [T, K]), got %" PRId64, a->strides[1]);
  if (T > 1 && a->strides[0] < K)  // an input layout no kernel reads (an output's would be a mistake)
    return fail(FLY_ERROR_UNSUPPORTED, "a: row stride %" PRId64 " is smaller than K = %" PRId64 " (rows overlap)",
                a->strides[0], K);
  if (N > 1 && c->strides[1] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "c: inner stride must be 1 (row-major [T, N]), got %" PRId64, c->strides[1]);
  if (T > 1 && c->strides[0] < N)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "c: row stride %" PRId64 " is smaller than N = %" PRId64 " (rows overlap)",
                c->strides[0], N);
  if (G > 1 && offs->strides[0] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "offs: stride must be 1, got %" PRId64, offs->strides[0]);
  if (bias && N > 1 && bias->strides[1] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "bias: inner stride must be 1 ([G, N] rows), got %" PRId64, bias->strides[1]);
  if (bias && G > 1 && bias->strides[0] < N)
    return fail(FLY_ERROR_UNSUPPORTED, "bias: row stride %" PRId64 " is smaller than N = %" PRId64,
                bias->strides[0], N);
  // B [G, K, N]: N contiguous (w) or K contiguous (w.transpose(-2, -1)); groups must not overlap.
  const int64_t sg = b->strides[0], sk = b->strides[1], sn = b->strides[2];
  bool kmajor;
  if ((N <= 1 || sn == 1) && (K <= 1 || sk >= N)) kmajor = false;
  else if ((K <= 1 || sk == 1) && (N <= 1 || sn >= K)) kmajor = true;
  else
    return fail(FLY_ERROR_UNSUPPORTED,
                "b: strides {%" PRId64 ", %" PRId64 ", %" PRId64 "} of [G, K, N] have neither N nor K contiguous "
                "(with non-overlapping lines)", sg, sk, sn);
  // N == 1 or K == 1: a single line; take the order whose line stride is never used.
  if (N <= 1) kmajor = true;
  else if (K <= 1) kmajor = false;
  const int64_t ld = kmajor ? (N > 1 ? sn : K) : (K > 1 ? sk : N);
  const int64_t group_extent = kmajor ? (N - 1) * ld + K : (K - 1) * ld + N;
  if (G > 1 && K > 0 && N > 0 && sg < group_extent)
    return fail(FLY_ERROR_UNSUPPORTED, "b: group stride %" PRId64 " is smaller than one group's extent %" PRId64
                " (groups overlap)", sg, group_extent);
  out->dt = dt;
  out->T = T;
  out->K = K;
  out->N = N;
  out->G = G;
  out->a = a->data;
  out->lda = T > 1 ? a->strides[0] : K;
  out->b = b->data;
  out->b_kmajor = kmajor;
  out->b_ld = ld;
  out->b_gs = G > 1 ? sg : group_extent;
  out->offs = static_cast<const int32_t*>(offs->data);
  out->bias = bias ? bias->data : nullptr;
  out->bias_gs = bias ? (G > 1 ? bias->strides[0] : N) : 0;
  out->c = c->data;
  out->ldc = T > 1 ? c->strides[0] : N;
  if (T == 0 || N == 0) return FLY_SUCCESS;  // no-op: nothing to check further
  if (K == 0)
    return fail(FLY_ERROR_UNSUPPORTED, "a: K = 0 (an empty reduction) is not supported: C would be just the bias");
  // TMA's 16-byte rules (base address, strides of the outer dimensions).
  const int eb = 2;
  if (reinterpret_cast<uintptr_t>(out->a) % 16 != 0)
    return fail(FLY_ERROR_MISALIGNED, "a: base address is not 16-byte aligned (TMA)");
  if (T > 1 && (out->lda * eb) % 16 != 0)
    return fail(FLY_ERROR_UNSUPPORTED, "a: row stride %" PRId64 " * 2 bytes is not a multiple of 16 (TMA)", out->lda);
  if (reinterpret_cast<uintptr_t>(out->b) % 16 != 0)
    return fail(FLY_ERROR_MISALIGNED, "b: base address is not 16-byte aligned (TMA)");
  if ((kmajor ? N : K) > 1 && (ld * eb) % 16 != 0)
    return fail(FLY_ERROR_UNSUPPORTED, "b: stride %" PRId64 " of its %s * 2 bytes is not a multiple of 16 (TMA)", ld,
                kmajor ? "n lines" : "k lines");
  if (G > 1 && (sg * eb) % 16 != 0)
    return fail(FLY_ERROR_UNSUPPORTED, "b: group stride %" PRId64 " * 2 bytes is not a multiple of 16 (TMA)", sg);
  return FLY_SUCCESS;
}

struct TileOf {
  int bm, bn, stages, epi;
};
TileOf tile_of(const Variant& v) {
  return {int(v.get_int("bm", 128)), int(v.get_int("bn", 128)), int(v.get_int("stages", 4)), int(v.get_int("epi", 0))};
}

// MN-major B comes in 64-wide chunks per warpgroup's columns (the dense kernel's layout_fits).
bool variant_fits(const Variant& v, const GroupedCall& call) {
  const TileOf t = tile_of(v);
  if (v.get("dtype") != dtype_name(call.dt) || v.get("mode") == "k") return false;  // mode k: the ragged-K kernel
  const int q_cols = t.bm == 128 ? t.bn : t.bn / 2;
  return call.b_kmajor || q_cols % 64 == 0;
}

// Family default (names from tuning/grouped_gemm.json "defaults"): 64-row tiles when the groups
// average at most 64 rows (128-row tiles would be half padding), 128 x 128 for narrow N, else
// 128 x 256. BF16: the TMA-store epilogue (epi 2), which the H200 tuning picked on most keys;
// FP16: the staged one (epi 1), its epi 2 forms not yet run on the GPU.
std::string default_variant(const GroupedCall& call) {
  const std::string d = dtype_name(call.dt);
  const int64_t mean = call.G > 0 ? call.T / call.G : 0;
  const bool bf16 = call.dt == FLY_BF16;
  if (mean <= 64) return "grouped_gemm_" + d + "_bm64_bn128_st8_e0";
  if (call.N <= 2048 || mean <= 128) return "grouped_gemm_" + d + (bf16 ? "_bm128_bn128_st6_e2" : "_bm128_bn128_st5_e1");
  return "grouped_gemm_" + d + (bf16 ? "_bm128_bn256_st4_e2" : "_bm128_bn256_st4_e1");
}

// 3-D map of B: K-major dims {K, N, G}, box {64, BN, 1}; MN-major dims {N, K, G}, box {64, 64, 1}.
template <class Encode>
CUresult encode_b(Encode encode, CUtensorMap* map, const GroupedCall& call, int bn, gemm::Dtype dt) {
  const int eb = 2;
  const int64_t inner = call.b_kmajor ? call.K : call.N, outer = call.b_kmajor ? call.N : call.K;
  const cuuint64_t dims[3] = {cuuint64_t(inner), cuuint64_t(outer), cuuint64_t(std::max<int64_t>(call.G, 1))};
  const cuuint64_t line = gemm::map_row_stride(outer, call.b_ld, inner, eb);
  // One group: its stride is never followed; keep it TMA-legal (16-byte multiple).
  const cuuint64_t gs = call.G > 1 ? cuuint64_t(call.b_gs * eb) : line * outer;
  const cuuint64_t strides[2] = {line, gs};
  const cuuint32_t box[3] = {64, cuuint32_t(call.b_kmajor ? bn : 64), 1};
  return gemm::encode_sw128(encode, map, 3, call.b, dims, strides, box, dt, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}


// ---- ragged-K mode (2-D x 2-D, offsets along K: the weight gradient; gemm_grouped_k_params.h) ----
// out[g] = a[:, k range of g] @ b[k range of g, :]: a [M, Ktot], b [Ktot, N], out [G, M, N].
bool is_k_mode(const fly_tensor* a, const fly_tensor* b) { return a && b && a->rank == 2 && b->rank == 2; }

struct KCall {
  fly_dtype dt = FLY_DTYPE_INVALID;
  int64_t M = 0, N = 0, Ktot = 0, G = 0;
  // a is M contiguous (X.t()) and b N contiguous (dC): the K-contiguous orders are refused
  // (validate_k), so both are MN-major operands whose strides are those of k.
  const void* a = nullptr;
  int64_t a_ld = 0;  // stride of k in a (elements)
  const void* b = nullptr;
  int64_t b_ld = 0;  // stride of k in b
  const int32_t* offs = nullptr;
  void* c = nullptr;
  int64_t ldc = 0, c_gs = 0;
};

fly_status validate_k(const fly_tensor* a, const fly_tensor* b, const fly_tensor* offs, const fly_tensor* bias,
                      const fly_tensor* c, KCall* out) {
  FLY_TRY(check_tensor(a, "a", 2));
  FLY_TRY(check_tensor(b, "b", 2));
  FLY_TRY(check_tensor(offs, "offs", 1));
  if (c && c->rank != 3)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "c: rank %d, expected 3 ([G, M, N]: a and b are 2-D, the ragged-K mode)",
                int(c->rank));
  FLY_TRY(check_tensor(c, "c", 3));
  if (bias) return fail(FLY_ERROR_UNSUPPORTED, "bias: not supported in the ragged-K mode (2-D a and b)");
  FLY_TRY(check_dtypes(a, b, c, nullptr, offs, "cumulative group ends along K"));
  const fly_dtype dt = a->dtype;
  const int64_t M = a->sizes[0], Ktot = a->sizes[1], N = b->sizes[1], G = offs->sizes[0];
  if (b->sizes[0] != Ktot)
    return fail(FLY_ERROR_INVALID_ARGUMENT,
                "b: shape [%" PRId64 ", %" PRId64 "] does not match a [%" PRId64 ", %" PRId64 "] (b must be [K, N])",
                b->sizes[0], N, M, Ktot);
  if (c->sizes[0] != G || c->sizes[1] != M || c->sizes[2] != N)
    return fail(FLY_ERROR_INVALID_ARGUMENT,
                "c: shape [%" PRId64 ", %" PRId64 ", %" PRId64 "], expected [G, M, N] = [%" PRId64 ", %" PRId64 ", %" PRId64 "]",
                c->sizes[0], c->sizes[1], c->sizes[2], G, M, N);
  const int64_t lim = int64_t(1) << 31;
  if (M >= lim || N >= lim || Ktot >= lim || G >= lim)
    return fail(FLY_ERROR_UNSUPPORTED,
                "a/b: dimensions M=%" PRId64 " K=%" PRId64 " N=%" PRId64 " G=%" PRId64 " exceed the kernel's 2^31 limit",
                M, Ktot, N, G);
  if (G > 1 && offs->strides[0] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "offs: stride must be 1, got %" PRId64, offs->strides[0]);
  // out [G, M, N]: rows contiguous, groups not overlapping.
  if (N > 1 && c->strides[2] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "c: inner stride must be 1 (row-major [G, M, N]), got %" PRId64, c->strides[2]);
  if (M > 1 && c->strides[1] < N)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "c: row stride %" PRId64 " is smaller than N = %" PRId64 " (rows overlap)",
                c->strides[1], N);
  const int64_t ldc = M > 1 ? c->strides[1] : N;
  const int64_t c_extent = (M - 1) * ldc + N;
  if (G > 1 && M > 0 && N > 0 && c->strides[0] < c_extent)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "c: group stride %" PRId64 " is smaller than one group's extent %" PRId64
                " (groups overlap)", c->strides[0], c_extent);
  // a M contiguous (X.t(), as autograd passes it), b N contiguous (dC): the ragged K is the outer
  // dimension of both TMA maps, whose per-group extent (the group's end) may be any value. With K
  // contiguous it would be the maps' innermost extent: on the H200 every such call faulted
  // (illegal instruction; likely an innermost extent that is not a 16-byte multiple), so those
  // orders are refused (docs/grouped_gemm.md).
  const bool a_mc = (M <= 1 || a->strides[0] == 1) && (Ktot <= 1 || a->strides[1] >= M);
  if (!a_mc)
    return fail(FLY_ERROR_UNSUPPORTED,
                "a: strides {%" PRId64 ", %" PRId64 "} of [M, K]: the ragged-K mode takes a with M contiguous "
                "(X.t(), what autograd passes; lines not overlapping), not K contiguous", a->strides[0], a->strides[1]);
  const bool b_nc = (N <= 1 || b->strides[1] == 1) && (Ktot <= 1 || b->strides[0] >= N);
  if (!b_nc)
    return fail(FLY_ERROR_UNSUPPORTED,
                "b: strides {%" PRId64 ", %" PRId64 "} of [K, N]: the ragged-K mode takes b with N contiguous "
                "(dC, what autograd passes; lines not overlapping), not K contiguous", b->strides[0], b->strides[1]);
  const int64_t a_ld = Ktot > 1 ? a->strides[1] : M, b_ld = Ktot > 1 ? b->strides[0] : N;
  out->dt = dt;
  out->M = M;
  out->N = N;
  out->Ktot = Ktot;
  out->G = G;
  out->a = a->data;
  out->a_ld = a_ld;
  out->b = b->data;
  out->b_ld = b_ld;
  out->offs = static_cast<const int32_t*>(offs->data);
  out->c = c->data;
  out->ldc = ldc;
  out->c_gs = G > 1 ? c->strides[0] : c_extent;
  if (G == 0 || M == 0 || N == 0 || Ktot == 0) return FLY_SUCCESS;  // no operand is read
  // TMA's 16-byte rules (base address, stride of the outer dimension).
  const int eb = 2;
  if (reinterpret_cast<uintptr_t>(out->a) % 16 != 0)
    return fail(FLY_ERROR_MISALIGNED, "a: base address is not 16-byte aligned (TMA)");
  if (Ktot > 1 && (a_ld * eb) % 16 != 0)
    return fail(FLY_ERROR_UNSUPPORTED, "a: stride %" PRId64 " of its k columns * 2 bytes is not a multiple of 16 (TMA)",
                a_ld);
  if (reinterpret_cast<uintptr_t>(out->b) % 16 != 0)
    return fail(FLY_ERROR_MISALIGNED, "b: base address is not 16-byte aligned (TMA)");
  if (Ktot > 1 && (b_ld * eb) % 16 != 0)
    return fail(FLY_ERROR_UNSUPPORTED, "b: stride %" PRId64 " of its k rows * 2 bytes is not a multiple of 16 (TMA)",
                b_ld);
  return FLY_SUCCESS;
}

// The output against the inputs, the workspace against every argument (both modes; host
// arithmetic, before the device check).
fly_status check_arguments_disjoint(const fly_tensor* a, const fly_tensor* b, const fly_tensor* offs,
                                    const fly_tensor* bias, const fly_tensor* c, const void* workspace,
                                    size_t workspace_bytes) {
  FLY_TRY(check_disjoint(c, "c", a, "a"));
  FLY_TRY(check_disjoint(c, "c", b, "b"));
  FLY_TRY(check_disjoint(c, "c", offs, "offs"));
  FLY_TRY(check_disjoint(c, "c", bias, "bias"));
  const fly_tensor* all[5] = {a, b, offs, bias, c};
  const char* names[5] = {"a", "b", "offs", "bias", "c"};
  for (int i = 0; i < 5; ++i) FLY_TRY(check_workspace_disjoint(workspace, workspace_bytes, all[i], names[i]));
  return FLY_SUCCESS;
}

// Workspace of the mode: two tensor maps per group (written on the device by the maps kernel).
int64_t k_workspace_bytes(const KCall& k) { return k.G * gemm::kGroupedKMapBytes; }

bool is_k_variant(const Variant& v) { return v.get("mode") == "k"; }

// Q (= b^T) MN-major tiles come in 64-wide chunks per warpgroup's columns, P's likewise per
// warpgroup's rows (BM 64 or 128: always whole chunks).
bool k_variant_fits(const Variant& v, const KCall& k) {
  if (!is_k_variant(v) || v.get("dtype") != dtype_name(k.dt)) return false;
  const TileOf t = tile_of(v);
  const int q_cols = t.bm == 128 ? t.bn : t.bn / 2;
  return q_cols % 64 == 0;
}


// Default (tuning/grouped_gemm.json "defaults" of mode k): 128 x 256 staged tiles, 128 x 128 when
// N <= 128 (a 256-wide tile would be half padding).
std::string default_variant_k(const KCall& k) {
  const std::string d = dtype_name(k.dt);
  if (k.N <= 128) return "grouped_gemm_k_" + d + "_bm128_bn128_st5_e1";
  return "grouped_gemm_k_" + d + "_bm128_bn256_st4_e1";
}

fly_status run_k(const KCall& call, void* workspace, size_t workspace_bytes, void* stream) {
  FLY_TRY(check_optional_workspace(workspace, workspace_bytes));
  if (call.G == 0 || call.M == 0 || call.N == 0) return FLY_SUCCESS;
  const int64_t need = k_workspace_bytes(call);
  if (!workspace || int64_t(workspace_bytes) < need)
    return fail(FLY_ERROR_WORKSPACE,
                "workspace: %zu bytes, the ragged-K mode needs %" PRId64 " (G = %" PRId64
                " x 256: fly_grouped_gemm_workspace_size)", workspace ? workspace_bytes : size_t(0), need, call.G);

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  const bool reads = call.Ktot > 0;
  FLY_TRY(check_device_bytes(call.offs, call.G * 4, "offs"));
  FLY_TRY(check_device_bytes(call.c, ((call.G - 1) * call.c_gs + (call.M - 1) * call.ldc + call.N) * 2, "c"));
  FLY_TRY(check_device_bytes(workspace, need, "workspace"));
  if (reads) {
    const int64_t a_extent = (call.Ktot - 1) * call.a_ld + call.M;
    const int64_t b_extent = (call.Ktot - 1) * call.b_ld + call.N;
    FLY_TRY(check_device_bytes(call.a, a_extent * 2, "a"));
    FLY_TRY(check_device_bytes(call.b, b_extent * 2, "b"));
  }

  // Key: (dtype, layout "mn": a's contiguous dimension m, b's n (the one order taken); N, M,
  // mean-k bucket, G).
  DispatchRequest req =
      make_request(kFamily, keys::grouped_gemm_k(dtype_name(call.dt), call.M, call.N, call.Ktot, call.G));
  const KCall cc = call;
  req.supports = [cc](const Variant& v) { return k_variant_fits(v, cc); };
  req.fallback = [cc] { return default_variant_k(cc); };
  ResolvedKernel rk;
  FLY_TRY(resolve_kernel(*dc, req, "fly_grouped_gemm_k_sm90", &rk));
  CUfunction fmaps = nullptr;
  if (reads) FLY_TRY(get_function(*dc, *rk.v, "fly_grouped_gemm_k_maps", &fmaps));
  const TileOf t = tile_of(*rk.v);
  const gemm::Dtype gdt = call.dt == FLY_BF16 ? gemm::Dtype::kBf16 : gemm::Dtype::kFp16;

  gemm::GroupedKParams kp;
  std::memset(&kp, 0, sizeof(kp));
  gemm::GemmParams& p = kp.core;
  if (reads) {
    // The template maps over all of Ktot: P = a (rows M), Q = b^T (rows N).
    const gemm::Operand A{call.a, call.M, call.a_ld, false};  // MN-major (see KCall)
    const gemm::Operand B{call.b, call.N, call.b_ld, false};
    CUresult r = gemm::encode_operand(rk.d->cuTensorMapEncodeTiled, &p.tm_p, A, call.Ktot, t.bm, gdt);
    if (r != CUDA_SUCCESS) return cuda_fail(r, "cuTensorMapEncodeTiled (a)");
    r = gemm::encode_operand(rk.d->cuTensorMapEncodeTiled, &p.tm_q, B, call.Ktot, t.bn, gdt);
    if (r != CUDA_SUCCESS) return cuda_fail(r, "cuTensorMapEncodeTiled (b)");
  }
  p.c = call.c;
  p.bias = nullptr;
  p.ldc = call.ldc;
  p.rows = int32_t(call.M);
  p.cols = int32_t(call.N);
  p.k = int32_t(call.Ktot);
  p.p_kmajor = 0;  // both MN-major: the kernel's consumers take <1, 1> only
  p.q_kmajor = 0;
  p.tiles_m = int32_t((call.M + t.bm - 1) / t.bm);
  p.tiles_n = int32_t((call.N + t.bn - 1) / t.bn);
  p.strip_m = 1;
  p.split = 1;
  p.c_vec = (reinterpret_cast<uintptr_t>(call.c) % 8 == 0) && (call.ldc % 4 == 0) && (call.c_gs % 4 == 0);
  p.mc = 1;
  kp.maps = static_cast<CUtensorMap*>(workspace);
  kp.offs = call.offs;
  kp.groups = int32_t(call.G);
  kp.ktot = int32_t(call.Ktot);
  kp.c_group_stride = call.c_gs;
  kp.units = call.G * int64_t(p.tiles_m) * p.tiles_n;
  const unsigned smem = unsigned(gemm::smem_bytes(t.bn, t.stages, t.epi, t.bm));
  if (int64_t(smem) > dc->max_smem_optin)
    return fail(FLY_ERROR_UNSUPPORTED, "variant %s needs %u bytes of shared memory, the device allows %d",
                rk.v->name.c_str(), smem, dc->max_smem_optin);
  if (reads) {
    LaunchConfig mc;
    mc.grid[0] = unsigned((call.G + 127) / 128);
    mc.block[0] = 128;
    FLY_TRY(launch1(fmaps, mc, stream, kp));
  }
  LaunchConfig cfg;
  cfg.grid[0] = unsigned(std::max<int64_t>(1, std::min<int64_t>(kp.units, dc->sm_count)));
  cfg.block[0] = gemm::kThreads;
  cfg.smem = smem;
  return launch1(rk.f, cfg, stream, kp);
}

}  // namespace
}  // namespace fly

extern "C" FLY_API fly_status fly_grouped_gemm_check_offsets(const int32_t* offs, int64_t groups, int64_t rows) {
  using namespace fly;
  clear_error();
  if (groups < 0) return fail(FLY_ERROR_INVALID_ARGUMENT, "groups: %" PRId64 " is negative", groups);
  if (rows < 0) return fail(FLY_ERROR_INVALID_ARGUMENT, "rows: %" PRId64 " is negative", rows);
  if (groups > 0 && !offs) return fail(FLY_ERROR_INVALID_ARGUMENT, "offs: null pointer with %" PRId64 " groups", groups);
  int64_t prev = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t o = offs[g];
    if (o < prev)
      return fail(FLY_ERROR_INVALID_ARGUMENT,
                  "offs[%" PRId64 "] = %" PRId64 " is smaller than %s = %" PRId64 " (offsets are cumulative group ends)",
                  g, o, g ? "the entry before" : "0", prev);
    if (o > rows)
      return fail(FLY_ERROR_INVALID_ARGUMENT, "offs[%" PRId64 "] = %" PRId64 " exceeds the rows of a, T = %" PRId64, g, o,
                  rows);
    prev = o;
  }
  return FLY_SUCCESS;
}

extern "C" FLY_API fly_status fly_grouped_gemm_workspace_size(const fly_tensor* a, const fly_tensor* b,
                                                              const fly_tensor* offs, const fly_tensor* c,
                                                              size_t* bytes) {
  using namespace fly;
  clear_error();
  if (!bytes) return fail(FLY_ERROR_INVALID_ARGUMENT, "bytes: null pointer");
  *bytes = 0;
  if (is_k_mode(a, b)) {  // 2-D a and b: the ragged-K mode, two tensor maps per group
    KCall kc;
    FLY_TRY(validate_k(a, b, offs, nullptr, c, &kc));
    *bytes = size_t(k_workspace_bytes(kc));
    return FLY_SUCCESS;
  }
  GroupedCall call;
  FLY_TRY(validate(a, b, offs, nullptr, c, &call));
  return FLY_SUCCESS;  // the kernels need none today (the argument is kept for split variants)
}

extern "C" FLY_API fly_status fly_grouped_gemm(const fly_tensor* a, const fly_tensor* b, const fly_tensor* offs,
                                               const fly_tensor* bias, const fly_tensor* c, void* workspace,
                                               size_t workspace_bytes, void* stream) {
  using namespace fly;
  clear_error();
  if (is_k_mode(a, b)) {  // 2-D a and b: the ragged-K mode (weight gradient)
    KCall kc;
    FLY_TRY(validate_k(a, b, offs, bias, c, &kc));
    FLY_TRY(check_arguments_disjoint(a, b, offs, bias, c, workspace, workspace_bytes));
    return run_k(kc, workspace, workspace_bytes, stream);
  }
  GroupedCall call;
  FLY_TRY(validate(a, b, offs, bias, c, &call));
  FLY_TRY(check_optional_workspace(workspace, workspace_bytes));
  FLY_TRY(check_arguments_disjoint(a, b, offs, bias, c, workspace, workspace_bytes));
  if (call.T == 0 || call.N == 0) return FLY_SUCCESS;

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*a, "a"));
  FLY_TRY(check_device_pointer(*b, "b"));
  FLY_TRY(check_device_pointer(*offs, "offs"));
  FLY_TRY(check_device_pointer(*c, "c"));
  if (bias) FLY_TRY(check_device_pointer(*bias, "bias"));
  if (workspace && workspace_bytes > 0) FLY_TRY(check_device_bytes(workspace, int64_t(workspace_bytes), "workspace"));

  // Key: (dtype, B order; N, K, mean-M bucket, G): a G without rows of its own takes the nearest
  // G's (log2 distance, weighted as the mean M).
  DispatchRequest req =
      make_request(kFamily, keys::grouped_gemm(dtype_name(call.dt), call.b_kmajor, call.T, call.G, call.N, call.K));
  const GroupedCall cc = call;
  req.supports = [cc](const Variant& v) { return variant_fits(v, cc); };
  req.fallback = [cc] { return default_variant(cc); };
  ResolvedKernel rk;
  FLY_TRY(resolve_kernel(*dc, req, "fly_grouped_gemm_sm90", &rk));
  const TileOf t = tile_of(*rk.v);
  const gemm::Dtype gdt = call.dt == FLY_BF16 ? gemm::Dtype::kBf16 : gemm::Dtype::kFp16;

  gemm::GroupedGemmParams gp;
  std::memset(&gp, 0, sizeof(gp));
  gemm::GemmParams& p = gp.core;
  const gemm::Operand A{call.a, call.T, call.lda, true};
  CUresult r = gemm::encode_operand(rk.d->cuTensorMapEncodeTiled, &p.tm_p, A, call.K, t.bm, gdt);
  if (r != CUDA_SUCCESS) return cuda_fail(r, "cuTensorMapEncodeTiled (a)");
  r = encode_b(rk.d->cuTensorMapEncodeTiled, &p.tm_q, call, t.bn, gdt);
  if (r != CUDA_SUCCESS) return cuda_fail(r, "cuTensorMapEncodeTiled (b)");
  p.c = call.c;
  p.bias = call.bias;
  p.ldc = call.ldc;
  p.rows = int32_t(call.T);
  p.cols = int32_t(call.N);
  p.k = int32_t(call.K);
  p.p_kmajor = 1;
  p.q_kmajor = call.b_kmajor ? 1 : 0;
  p.tiles_n = int32_t((call.N + t.bn - 1) / t.bn);
  p.tiles_m = int32_t((call.T + t.bm - 1) / t.bm);
  p.strip_m = 1;
  p.split = 1;
  p.kb_per_split = int32_t((call.K + gemm::kBK - 1) / gemm::kBK);
  p.c_vec = (reinterpret_cast<uintptr_t>(call.c) % 8 == 0) && (call.ldc % 4 == 0);
  // epi = 2: C through a tensor map (dims {N, T}, box {64, 16}: one warp's rows) when TMA can
  // address it; otherwise those variants store from the registers (p.c_tma = 0).
  if (t.epi == 2 && reinterpret_cast<uintptr_t>(call.c) % 16 == 0 && (call.T <= 1 || (call.ldc * 2) % 16 == 0)) {
    const cuuint64_t dims[2] = {cuuint64_t(call.N), cuuint64_t(call.T)};
    const cuuint64_t strides[1] = {gemm::map_row_stride(call.T, call.ldc, call.N, 2)};
    const cuuint32_t box[2] = {64, gemm::kEpiWarpRows};
    p.c_tma = gemm::encode_sw128(rk.d->cuTensorMapEncodeTiled, &p.tm_c, 2, call.c, dims, strides, box, gdt,
                                 CU_TENSOR_MAP_L2_PROMOTION_NONE) == CUDA_SUCCESS;
  }
  p.mc = 1;
  gp.tail.offs = call.offs;
  gp.tail.groups = int32_t(call.G);
  gp.tail.rows = int32_t(call.T);
  gp.tail.b_group_stride = call.b_gs;
  gp.tail.bias_group_stride = call.bias_gs;
  // Units: at most sum_g ceil(M_g / BM) <= T / BM + G tile rows, times the tile columns (the
  // offsets are device data, so the grid is sized for the worst case, at most one CTA per SM).
  const int64_t units = (call.T / t.bm + call.G) * int64_t(p.tiles_n);
  const unsigned smem = unsigned(gemm::smem_bytes(t.bn, t.stages, t.epi, t.bm));
  if (int64_t(smem) > dc->max_smem_optin)
    return fail(FLY_ERROR_UNSUPPORTED, "variant %s needs %u bytes of shared memory, the device allows %d",
                rk.v->name.c_str(), smem, dc->max_smem_optin);
  LaunchConfig cfg;
  cfg.grid[0] = unsigned(std::max<int64_t>(1, std::min<int64_t>(units, dc->sm_count)));
  cfg.block[0] = gemm::kThreads;
  cfg.smem = smem;
  return launch1(rk.f, cfg, stream, gp);
}
