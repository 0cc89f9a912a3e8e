// SPDX-License-Identifier: Apache-2.0
// fly_moe_*: validation, dispatch and launch of the moe_route family (kernels/moe_route/): the
// router (softmax/sigmoid + top-k + renormalization, forward and backward), the permutation of
// token pairs into expert order (counting sort + gather) and the weighted unpermute-sum with its
// backward.
#include <cinttypes>
#include <string>

#include "core.hpp"
#include "moe_route/moe_route_params.h"

namespace fly {
namespace {

constexpr const char* kFamily = "moe_route";
constexpr int kScanThreads = 1024;   // kernels/moe_route/sort.cu
constexpr int64_t kMinChunk = 1024;  // pairs per sort CTA at least; at most 1024 chunks
constexpr int64_t kMaxChunks = 1024;

bool is_float(fly_dtype dt) { return dt == FLY_F16 || dt == FLY_BF16 || dt == FLY_F32; }
bool is_index(fly_dtype dt) { return dt == FLY_I32 || dt == FLY_I64; }

// A [rows, cols] matrix argument, unit inner stride (an input otherwise: FLY_ERROR_UNSUPPORTED);
// an output's rows must not overlap (FLY_ERROR_INVALID_ARGUMENT).
fly_status check_matrix(const fly_tensor* t, const char* what, int64_t rows, int64_t cols, bool output) {
  FLY_TRY(check_tensor(t, what, 2));
  if (t->sizes[0] != rows || t->sizes[1] != cols)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: shape [%" PRId64 ", %" PRId64 "], expected [%" PRId64 ", %" PRId64 "]",
                what, t->sizes[0], t->sizes[1], rows, cols);
  if (cols > 1 && t->strides[1] != 1)
    return fail(output ? FLY_ERROR_INVALID_ARGUMENT : FLY_ERROR_UNSUPPORTED, "%s: inner stride must be 1, got %" PRId64,
                what, t->strides[1]);
  if (output && rows > 1 && t->strides[0] < cols)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: row stride %" PRId64 " is smaller than the row length %" PRId64
                " (rows overlap)", what, t->strides[0], cols);
  return FLY_SUCCESS;
}
fly_status check_dtype_is(const fly_tensor* t, const char* what, fly_dtype dt, const char* ref) {
  if (t->dtype != dt)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: dtype %s does not match %s (%s)", what, dtype_name(t->dtype), ref,
                dtype_name(dt));
  return FLY_SUCCESS;
}
// A weights-like argument: FP32 or the data's dtype.
fly_status check_weight_dtype(const fly_tensor* t, const char* what, fly_dtype data, const char* ref) {
  if (t->dtype != FLY_F32 && t->dtype != data)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: dtype %s, expected fp32 or the dtype of %s (%s)", what, dtype_name(t->dtype), ref,
                dtype_name(data));
  return FLY_SUCCESS;
}
// The leading float operand: a dtype a kernel reads, unit inner stride.
fly_status check_lead(const fly_tensor* t, const char* what) {
  FLY_TRY(check_tensor(t, what, 2));
  if (!is_float(t->dtype))
    return fail(FLY_ERROR_UNSUPPORTED, "%s: dtype %s is not supported (fp16, bf16, fp32)", what, dtype_name(t->dtype));
  if (t->sizes[1] > 1 && t->strides[1] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "%s: inner stride must be 1, got %" PRId64, what, t->strides[1]);
  return FLY_SUCCESS;
}
fly_status check_offsets(const fly_tensor* offsets, int64_t* E) {
  FLY_TRY(check_tensor(offsets, "offsets", 1));
  *E = offsets->sizes[0];
  if (*E < 1) return fail(FLY_ERROR_INVALID_ARGUMENT, "offsets: needs one entry per expert, got 0 experts");
  return check_vector(offsets, "offsets", *E, FLY_I32);
}

int64_t ld_of(const fly_tensor& t, int64_t cols) { return t.sizes[0] > 1 ? t.strides[0] : cols; }

int per_sm(int threads) { return 2048 / threads; }

LaunchConfig rows_launch(int64_t rows, int threads, int sm_count) {
  const int64_t cap = int64_t(sm_count) * per_sm(threads);
  LaunchConfig cfg;
  cfg.grid[0] = unsigned(rows < 1 ? 1 : rows < cap ? rows : cap);
  cfg.block[0] = unsigned(threads);
  return cfg;
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// ---- router -------------------------------------------------------------------------------
fly_status check_route_args(int64_t k, int64_t E, int score, int flags) {
  if (E > kMoeMaxExperts)
    return fail(FLY_ERROR_UNSUPPORTED, "logits: %" PRId64 " experts, the router takes at most %d", E, kMoeMaxExperts);
  if (k < 1 || k > E)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "k: %" PRId64 " is outside 1..E (E = %" PRId64 ")", k, E);
  if (score != FLY_MOE_SOFTMAX && score != FLY_MOE_SIGMOID)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "score: %d is not a fly_moe_score (0 softmax, 1 sigmoid)", score);
  if (flags & ~(FLY_MOE_RENORMALIZE | FLY_MOE_TOPK_FIRST))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "flags: %d has bits outside FLY_MOE_RENORMALIZE | FLY_MOE_TOPK_FIRST", flags);
  return FLY_SUCCESS;
}

fly_status run_route(bool fwd, const fly_tensor* logits, const fly_tensor* dweights, const fly_tensor* ids, int64_t k,
                     int score, int flags, const fly_tensor* weights, const fly_tensor* dlogits, void* stream) {
  FLY_TRY(check_lead(logits, "logits"));
  const fly_dtype dt = logits->dtype;
  const int64_t T = logits->sizes[0], E = logits->sizes[1];
  if (!fwd) {
    FLY_TRY(check_tensor(dweights, "dweights", 2));
    k = dweights->sizes[1];
  }
  FLY_TRY(check_route_args(k, E, score, flags));
  const fly_tensor* w = fwd ? weights : dweights;
  const char* w_name = fwd ? "weights" : "dweights";
  FLY_TRY(check_matrix(w, w_name, T, k, fwd));
  FLY_TRY(check_weight_dtype(w, w_name, dt, "logits"));
  FLY_TRY(check_matrix(ids, "ids", T, k, fwd));
  if (!is_index(ids->dtype))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "ids: dtype %s, expected int32 or int64", dtype_name(ids->dtype));
  if (fwd) {
    FLY_TRY(check_disjoint(weights, "weights", logits, "logits"));
    FLY_TRY(check_disjoint(ids, "ids", logits, "logits"));
    FLY_TRY(check_disjoint(ids, "ids", weights, "weights"));
  } else {
    FLY_TRY(check_matrix(dlogits, "dlogits", T, E, true));
    FLY_TRY(check_dtype_is(dlogits, "dlogits", dt, "logits"));
    FLY_TRY(check_disjoint(dlogits, "dlogits", logits, "logits"));
    FLY_TRY(check_disjoint(dlogits, "dlogits", dweights, "dweights"));
    FLY_TRY(check_disjoint(dlogits, "dlogits", ids, "ids"));
  }
  if (T == 0) return FLY_SUCCESS;

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*logits, "logits"));
  FLY_TRY(check_device_pointer(*w, w_name));
  FLY_TRY(check_device_pointer(*ids, "ids"));
  if (!fwd) FLY_TRY(check_device_pointer(*dlogits, "dlogits"));

  const char* op = fwd ? "moe_route_fwd" : "moe_route_bwd";
  DispatchRequest req = make_request(kFamily, keys::moe_route(fwd, dtype_name(dt), T, E, k));
  req.supports = [](const Variant& v) { return starts_with(v.name, "moe_route_router_"); };
  req.fallback = [] { return std::string("moe_route_router_w4"); };
  const int per_lane = E <= 64 ? 2 : E <= 128 ? 4 : E <= 256 ? 8 : 32;  // registers per lane: E <= 32 * per_lane
  const std::string kernel = std::string(op) + "_pl" + std::to_string(per_lane);
  ResolvedKernel rk;
  FLY_TRY(resolve_kernel(*dc, req, kernel.c_str(), &rk));
  const int wpc = int(rk.v->get_int("wpc", 4));

  MoeRouteParams p{};
  p.logits = logits->data;
  p.ld_logits = ld_of(*logits, E);
  p.ids = ids->data;
  p.ld_ids = ld_of(*ids, k);
  if (fwd) {
    p.weights = weights->data;
    p.ld_weights = ld_of(*weights, k);
  } else {
    p.dweights = dweights->data;
    p.ld_dweights = ld_of(*dweights, k);
    p.dlogits = dlogits->data;
    p.ld_dlogits = ld_of(*dlogits, E);
  }
  p.T = T;
  p.E = int32_t(E);
  p.k = int32_t(k);
  p.logit_dtype = dt;
  p.weight_dtype = w->dtype;
  p.id_dtype = ids->dtype;
  p.score = score;
  p.flags = flags;
  p.per_lane = per_lane;
  LaunchConfig cfg;
  const int64_t want = (T + wpc - 1) / wpc, cap = int64_t(dc->sm_count) * (2048 / (32 * wpc));
  cfg.grid[0] = unsigned(want < cap ? want : cap);
  cfg.block[0] = unsigned(32 * wpc);
  return launch1(rk.f, cfg, stream, p);
}

// ---- permute --------------------------------------------------------------------------------
int64_t sort_chunk(int64_t N) {
  int64_t c = (N + kMaxChunks - 1) / kMaxChunks;
  c = (c + 255) / 256 * 256;
  return c < kMinChunk ? kMinChunk : c;
}
int64_t permute_workspace(int64_t N, int64_t E) {
  if (N == 0) return 0;
  const int64_t chunks = (N + sort_chunk(N) - 1) / sort_chunk(N);
  return ((E + 1) * chunks * 4 + 255) / 256 * 256;
}
fly_status check_pairs(int64_t T, int64_t k, int64_t E) {
  if (T < 0 || k < 0) return fail(FLY_ERROR_INVALID_ARGUMENT, "ids: negative shape [%" PRId64 ", %" PRId64 "]", T, k);
  if (E > kMoeMaxExperts)
    return fail(FLY_ERROR_UNSUPPORTED, "offsets: %" PRId64 " experts, the sort takes at most %d", E, kMoeMaxExperts);
  if (k > kMoeMaxK) return fail(FLY_ERROR_UNSUPPORTED, "ids: k = %" PRId64 " is more than %d slots", k, kMoeMaxK);
  if (k > 0 && T >= ((int64_t(1) << 31) - 1) / k)
    return fail(FLY_ERROR_UNSUPPORTED, "ids: %" PRId64 " x %" PRId64 " pairs, the indices are int32 (< 2^31)", T, k);
  return FLY_SUCCESS;
}

bool rows_vec(std::initializer_list<const fly_tensor*> ts, int64_t H, int64_t es) {
  if ((H * es) % 16 != 0) return false;
  for (const fly_tensor* t : ts) {
    if (!t) continue;
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0 || (ld_of(*t, H) * es) % 16 != 0) return false;
  }
  return true;
}

fly_status resolve_rows(const DeviceCtx& dc, const char* op, const char* kernel, fly_dtype dt, int64_t H, int64_t rows,
                        ResolvedKernel* rk) {
  DispatchRequest req = make_request(kFamily, keys::moe_rows(op, dtype_name(dt), rows, H));
  req.supports = [](const Variant& v) { return starts_with(v.name, "moe_route_rows_"); };
  const int64_t bytes = H * int64_t(dtype_size(dt));
  req.fallback = [bytes] { return std::string(bytes <= 2048 ? "moe_route_rows_t128" : "moe_route_rows_t256"); };
  return resolve_kernel(dc, req, kernel, rk);
}

fly_status run_permute(const fly_tensor* x, const fly_tensor* ids, const fly_tensor* x_perm, const fly_tensor* offsets,
                       const fly_tensor* row_of, const fly_tensor* pair_of, void* workspace, size_t workspace_bytes,
                       void* stream) {
  if (x) FLY_TRY(check_lead(x, "x"));
  FLY_TRY(check_tensor(ids, "ids", 2));
  if (!is_index(ids->dtype))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "ids: dtype %s, expected int32 or int64", dtype_name(ids->dtype));
  const int64_t T = ids->sizes[0], k = ids->sizes[1];
  FLY_TRY(check_matrix(ids, "ids", T, k, false));
  int64_t E = 0;
  FLY_TRY(check_offsets(offsets, &E));
  FLY_TRY(check_pairs(T, k, E));
  const int64_t N = T * k;
  int64_t H = 0;
  if (x) {
    H = x->sizes[1];
    if (x->sizes[0] != T)
      return fail(FLY_ERROR_INVALID_ARGUMENT, "x: %" PRId64 " rows, ids has %" PRId64 " tokens", x->sizes[0], T);
    if (!x_perm) return fail(FLY_ERROR_INVALID_ARGUMENT, "x_perm: descriptor is NULL (needed with x)");
    FLY_TRY(check_matrix(x_perm, "x_perm", N, H, true));
    FLY_TRY(check_dtype_is(x_perm, "x_perm", x->dtype, "x"));
  } else if (x_perm) {
    return fail(FLY_ERROR_INVALID_ARGUMENT, "x_perm: given without x");
  }
  FLY_TRY(check_matrix(row_of, "row_of", T, k, true));
  FLY_TRY(check_dtype_is(row_of, "row_of", FLY_I32, "the index type"));
  FLY_TRY(check_vector(pair_of, "pair_of", N, FLY_I32));
  FLY_TRY(check_optional_workspace(workspace, workspace_bytes, 256));
  const int64_t need = permute_workspace(N, E);
  if (need > 0 && (!workspace || workspace_bytes < size_t(need)))
    return fail(FLY_ERROR_WORKSPACE, "workspace: %zu bytes at %p, this call needs %" PRId64
                " (fly_moe_permute_workspace_size)", workspace_bytes, workspace, need);
  // Outputs against the inputs and each other, the workspace against everything.
  const fly_tensor* outs[] = {x_perm, offsets, row_of, pair_of};
  const char* out_names[] = {"x_perm", "offsets", "row_of", "pair_of"};
  for (int i = 0; i < 4; ++i) {
    if (!outs[i]) continue;
    FLY_TRY(check_disjoint(outs[i], out_names[i], x, "x"));
    FLY_TRY(check_disjoint(outs[i], out_names[i], ids, "ids"));
    for (int j = 0; j < i; ++j) FLY_TRY(check_disjoint(outs[i], out_names[i], outs[j], out_names[j]));
  }
  if (need > 0) {
    FLY_TRY(check_workspace_disjoint(workspace, size_t(need), x, "x"));
    FLY_TRY(check_workspace_disjoint(workspace, size_t(need), ids, "ids"));
    for (int i = 0; i < 4; ++i) FLY_TRY(check_workspace_disjoint(workspace, size_t(need), outs[i], out_names[i]));
  }

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*offsets, "offsets"));
  if (N == 0) {  // no pair: every expert empty (offsets all 0), nothing else to write
    const Driver* d = nullptr;
    FLY_TRY(driver(&d));
    FLY_CU(d->cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(offsets->data), 0, size_t(E) * 4,
                              static_cast<CUstream>(stream)),
           "cuMemsetD8Async");
    return FLY_SUCCESS;
  }
  FLY_TRY(check_device_pointer(*ids, "ids"));
  FLY_TRY(check_device_pointer(*row_of, "row_of"));
  FLY_TRY(check_device_pointer(*pair_of, "pair_of"));
  FLY_TRY(check_device_bytes(workspace, need, "workspace"));
  if (x) {
    FLY_TRY(check_device_pointer(*x, "x"));
    FLY_TRY(check_device_pointer(*x_perm, "x_perm"));
  }

  DispatchRequest req = make_request(kFamily, keys::moe_sort(dtype_name(ids->dtype), E, N));
  req.supports = [](const Variant& v) { return starts_with(v.name, "moe_route_sort_"); };
  req.fallback = [] { return std::string("moe_route_sort_t256"); };
  ResolvedKernel hist;
  FLY_TRY(resolve_kernel(*dc, req, "moe_sort_hist", &hist));
  CUfunction scan = nullptr, rank = nullptr;
  FLY_TRY(get_function(*dc, *hist.v, "moe_sort_scan", &scan));
  FLY_TRY(get_function(*dc, *hist.v, "moe_sort_rank", &rank));
  const int tpb = int(hist.v->get_int("tpb", 256));

  MoeSortParams sp{};
  sp.ids = ids->data;
  sp.ld_ids = ld_of(*ids, k);
  sp.id_dtype = ids->dtype;
  sp.k = int32_t(k);
  sp.E = int32_t(E);
  sp.chunk = int32_t(sort_chunk(N));
  sp.chunks = int32_t((N + sp.chunk - 1) / sp.chunk);
  sp.N = N;
  sp.counts = static_cast<int32_t*>(workspace);
  sp.offsets = static_cast<int32_t*>(offsets->data);
  sp.row_of = static_cast<int32_t*>(row_of->data);
  sp.ld_row = ld_of(*row_of, k);
  sp.pair_of = static_cast<int32_t*>(pair_of->data);
  LaunchConfig cc;
  cc.grid[0] = unsigned(sp.chunks);
  cc.block[0] = unsigned(tpb);
  FLY_TRY(launch1(hist.f, cc, stream, sp));
  LaunchConfig one;
  one.block[0] = kScanThreads;
  FLY_TRY(launch1(scan, one, stream, sp));
  FLY_TRY(launch1(rank, cc, stream, sp));
  if (!x) return FLY_SUCCESS;

  const int64_t es = int64_t(dtype_size(x->dtype));
  ResolvedKernel rk;
  FLY_TRY(resolve_rows(*dc, "moe_gather", "moe_gather", x->dtype, H, N, &rk));
  MoeRowsParams p{};
  p.vec = rows_vec({x, x_perm}, H, es) ? 1 : 0;
  p.src = x->data;
  p.ld_src = ld_of(*x, H);
  p.dst = x_perm->data;
  p.ld_dst = ld_of(*x_perm, H);
  p.pair_of = sp.pair_of;
  p.offsets = sp.offsets;
  p.rows = N;
  p.n_perm = N;
  p.n_tok = T;
  p.units = p.vec ? H * es / 16 : H;
  p.k = int32_t(k);
  p.E = int32_t(E);
  p.dtype = x->dtype;
  if (H == 0) return FLY_SUCCESS;
  return launch1(rk.f, rows_launch(N, int(rk.v->get_int("tpb", 128)), dc->sm_count), stream, p);
}

// ---- unpermute and the backward passes --------------------------------------------------------
// fwd (combine): src = out_perm / dx_perm, weights optional, dst = y / dx.
// bwd: lead = dy, src = out_perm, dst = dout_perm, dw optional.
fly_status run_rows(bool bwd, const char* src_name, const char* dst_name, const fly_tensor* lead,
                    const fly_tensor* src, const fly_tensor* weights, const fly_tensor* row_of,
                    const fly_tensor* offsets, const fly_tensor* dst, const fly_tensor* dweights, void* stream) {
  const char* lead_name = bwd ? "dy" : src_name;
  FLY_TRY(check_lead(lead, lead_name));
  const fly_dtype dt = lead->dtype;
  FLY_TRY(check_tensor(row_of, "row_of", 2));
  FLY_TRY(check_dtype_is(row_of, "row_of", FLY_I32, "the index type"));
  const int64_t T = row_of->sizes[0], k = row_of->sizes[1];
  FLY_TRY(check_matrix(row_of, "row_of", T, k, false));
  FLY_TRY(check_pairs(T, k, 1));
  const int64_t N = T * k, H = lead->sizes[1];
  if (bwd) {
    FLY_TRY(check_matrix(lead, "dy", T, H, false));
    FLY_TRY(check_matrix(src, src_name, N, H, false));
    FLY_TRY(check_dtype_is(src, src_name, dt, "dy"));
  } else if (lead->sizes[0] != N) {
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: %" PRId64 " rows, row_of has %" PRId64 " x %" PRId64 " pairs",
                src_name, lead->sizes[0], T, k);
  }
  int64_t E = 0;
  FLY_TRY(check_offsets(offsets, &E));
  if (weights) {
    FLY_TRY(check_matrix(weights, "weights", T, k, false));
    FLY_TRY(check_weight_dtype(weights, "weights", dt, src_name));
  }
  if (bwd) {
    FLY_TRY(check_matrix(dst, dst_name, N, H, true));
  } else {
    FLY_TRY(check_matrix(dst, dst_name, T, H, true));
  }
  FLY_TRY(check_dtype_is(dst, dst_name, dt, lead_name));
  if (dweights) {
    FLY_TRY(check_matrix(dweights, "dweights", T, k, true));
    if (weights) FLY_TRY(check_dtype_is(dweights, "dweights", weights->dtype, "weights"));
    else FLY_TRY(check_weight_dtype(dweights, "dweights", dt, src_name));
  }
  const fly_tensor* ins[] = {lead, bwd ? src : nullptr, weights, row_of, offsets};
  const char* in_names[] = {lead_name, src_name, "weights", "row_of", "offsets"};
  for (int i = 0; i < 5; ++i) {
    if (!ins[i]) continue;
    FLY_TRY(check_disjoint(dst, dst_name, ins[i], in_names[i]));
    if (dweights) FLY_TRY(check_disjoint(dweights, "dweights", ins[i], in_names[i]));
  }
  if (dweights) FLY_TRY(check_disjoint(dweights, "dweights", dst, dst_name));
  if (T == 0 || (!bwd && H == 0)) return FLY_SUCCESS;

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  for (int i = 0; i < 5; ++i)
    if (ins[i]) FLY_TRY(check_device_pointer(*ins[i], in_names[i]));
  FLY_TRY(check_device_pointer(*dst, dst_name));
  if (dweights) FLY_TRY(check_device_pointer(*dweights, "dweights"));

  const char* op = bwd ? "moe_unpermute_bwd" : weights ? "moe_unpermute" : "moe_permute_bwd";
  ResolvedKernel rk;
  FLY_TRY(resolve_rows(*dc, op, bwd ? "moe_unpermute_bwd" : "moe_combine", dt, H, T, &rk));
  const int64_t es = int64_t(dtype_size(dt));
  MoeRowsParams p{};
  p.vec = rows_vec({lead, src, dst}, H, es) ? 1 : 0;
  p.src = src->data;
  p.ld_src = ld_of(*src, H);
  p.dst = dst->data;
  p.ld_dst = ld_of(*dst, H);
  if (bwd) {
    p.dy = lead->data;
    p.ld_dy = ld_of(*lead, H);
  }
  if (weights) {
    p.w = weights->data;
    p.ld_w = ld_of(*weights, k);
    p.w_dtype = weights->dtype;
  } else {
    p.w_dtype = dweights ? dweights->dtype : FLY_F32;
  }
  if (dweights) {
    p.dw = dweights->data;
    p.ld_dw = ld_of(*dweights, k);
  }
  p.row_of = static_cast<const int32_t*>(row_of->data);
  p.ld_row = ld_of(*row_of, k);
  p.offsets = static_cast<const int32_t*>(offsets->data);
  p.rows = T;
  p.n_perm = N;
  p.n_tok = T;
  p.units = p.vec ? H * es / 16 : H;
  p.k = int32_t(k);
  p.E = int32_t(E);
  p.dtype = dt;
  return launch1(rk.f, rows_launch(T, int(rk.v->get_int("tpb", 128)), dc->sm_count), stream, p);
}

}  // namespace
}  // namespace fly

extern "C" FLY_API fly_status fly_moe_route_fwd(const fly_tensor* logits, int64_t k, int score, int flags,
                                                const fly_tensor* weights, const fly_tensor* ids, void* stream) {
  fly::clear_error();
  return fly::run_route(true, logits, nullptr, ids, k, score, flags, weights, nullptr, stream);
}

extern "C" FLY_API fly_status fly_moe_route_bwd(const fly_tensor* dweights, const fly_tensor* logits,
                                                const fly_tensor* ids, int score, int flags,
                                                const fly_tensor* dlogits, void* stream) {
  fly::clear_error();
  return fly::run_route(false, logits, dweights, ids, 0, score, flags, nullptr, dlogits, stream);
}

extern "C" FLY_API fly_status fly_moe_permute_workspace_size(int64_t num_tokens, int64_t top_k, int64_t num_experts,
                                                             size_t* bytes) {
  using namespace fly;
  clear_error();
  if (!bytes) return fail(FLY_ERROR_INVALID_ARGUMENT, "bytes: output pointer is NULL");
  *bytes = 0;
  if (num_experts < 1) return fail(FLY_ERROR_INVALID_ARGUMENT, "num_experts: %" PRId64 ", at least 1", num_experts);
  FLY_TRY(check_pairs(num_tokens, top_k, num_experts));
  *bytes = size_t(permute_workspace(num_tokens * top_k, num_experts));
  return FLY_SUCCESS;
}

extern "C" FLY_API fly_status fly_moe_permute(const fly_tensor* x, const fly_tensor* ids, const fly_tensor* x_perm,
                                              const fly_tensor* offsets, const fly_tensor* row_of,
                                              const fly_tensor* pair_of, void* workspace, size_t workspace_bytes,
                                              void* stream) {
  fly::clear_error();
  return fly::run_permute(x, ids, x_perm, offsets, row_of, pair_of, workspace, workspace_bytes, stream);
}

extern "C" FLY_API fly_status fly_moe_unpermute(const fly_tensor* out_perm, const fly_tensor* weights,
                                                const fly_tensor* row_of, const fly_tensor* offsets,
                                                const fly_tensor* y, void* stream) {
  fly::clear_error();
  return fly::run_rows(false, "out_perm", "y", out_perm, out_perm, weights, row_of, offsets, y, nullptr, stream);
}

extern "C" FLY_API fly_status fly_moe_permute_bwd(const fly_tensor* dx_perm, const fly_tensor* row_of,
                                                  const fly_tensor* offsets, const fly_tensor* dx, void* stream) {
  fly::clear_error();
  return fly::run_rows(false, "dx_perm", "dx", dx_perm, dx_perm, nullptr, row_of, offsets, dx, nullptr, stream);
}

extern "C" FLY_API fly_status fly_moe_unpermute_bwd(const fly_tensor* dy, const fly_tensor* out_perm,
                                                    const fly_tensor* weights, const fly_tensor* row_of,
                                                    const fly_tensor* offsets, const fly_tensor* dout_perm,
                                                    const fly_tensor* dweights, void* stream) {
  fly::clear_error();
  return fly::run_rows(true, "out_perm", "dout_perm", dy, out_perm, weights, row_of, offsets, dout_perm, dweights,
                       stream);
}
