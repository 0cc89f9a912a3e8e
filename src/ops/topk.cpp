// SPDX-License-Identifier: Apache-2.0
// fly_topk / fly_topk_workspace_size: validation, dispatch and launch of the topk family.
// Paths (tuning/topk.json, kernels/topk/): "small" (k <= kmax: per-lane register lists merged with
// shuffles, several rows per CTA), "radix" (one CTA per row: radix select + bitonic sort of the
// survivors) and "split" (few long rows: several CTAs per row, per-row state in the workspace).
#include <algorithm>
#include <cinttypes>
#include <string>

#include "core.hpp"
#include "topk/topk_params.h"

namespace fly {
namespace {

constexpr const char* kFamily = "topk";

enum class Path { kSmall, kRadix, kSplit, kUnknown };
Path path_of(const Variant& v) {
  const std::string p = v.get("path");
  if (p == "small") return Path::kSmall;
  if (p == "radix") return Path::kRadix;
  if (p == "split") return Path::kSplit;
  return Path::kUnknown;
}

// What a variant can run (capability, not preference: preferences live in the DB and fallback).
bool variant_supports(const Variant& v, int64_t R, int64_t C, int64_t k) {
  if (v.get("dtype") != "fp32") return false;
  switch (path_of(v)) {
    case Path::kSmall:
      return k <= v.get_int("kmax");
    case Path::kRadix:
      return true;
    case Path::kSplit: {
      // The row index is blockIdx.y (<= 65535) and the per-row state lives in the workspace:
      // the split path is for few rows longer than its largest piece.
      const int64_t chunk = v.get_int("chunk");
      return chunk > 0 && R <= 1024 && C > chunk;
    }
    default:
      return false;
  }
}

int64_t variant_workspace(const Variant& v, int64_t R, int64_t C, int64_t k) {
  switch (path_of(v)) {
    case Path::kRadix: return topk_plan::radix_workspace(R, k);
    case Path::kSplit: return topk_plan::plan_split(R, C, k, v.get_int("chunk")).ws_bytes;
    default: return 0;
  }
}

// Workspace the call needs: the most any bundled variant able to run the shape needs, so that a
// buffer of the queried size works whichever variant the database picks. Device independent.
// -1: some variant's workspace would not fit in 64 bits (topk_plan's checked arithmetic).
int64_t workspace_need(int64_t R, int64_t C, int64_t k) {
  if (R == 0) return 0;
  int64_t need = 0;
  for (const Variant* v : variants_of(kFamily)) {
    if (!variant_supports(*v, R, C, k)) continue;
    const int64_t w = variant_workspace(*v, R, C, k);
    if (w < 0) return -1;
    need = std::max(need, w);
  }
  return need;
}

fly_status workspace_too_large(int64_t R, int64_t C, int64_t k) {
  return fail(FLY_ERROR_UNSUPPORTED, "x: [%" PRId64 ", %" PRId64 "] with k = %" PRId64
              " needs a workspace beyond 64-bit sizes", R, C, k);
}

// The family default (only variants listed in tuning/topk.json "defaults"). Measured on H200
// (docs/topk.md): small wins for k <= 8 at any row length it can fill the GPU with and
// for k <= 16 on short rows; radix beyond; split when few long rows would leave SMs idle.
std::string default_variant(int64_t R, int64_t C, int64_t k) {
  if (R < 132 && C >= 65536) return "topk_split_fp32_t512_c32768";
  const bool many_rows = C <= 32768 || R >= 4096;
  if (many_rows && k <= 4) return C <= 512 ? "topk_small_fp32_t256_w8_k4" : "topk_small_fp32_t256_w32_k4";
  if (many_rows && k <= 8) return C <= 512 ? "topk_small_fp32_t256_w8_k8" : "topk_small_fp32_t256_w32_k8";
  if (k <= 16 && C <= 512) return "topk_small_fp32_t256_w4_k16";
  return C <= 8192 ? "topk_radix_fp32_t256" : "topk_radix_fp32_t1024";
}

// Rows of a [rows, cols] matrix with unit inner stride; rows of outputs must not overlap.
fly_status check_matrix(const fly_tensor* t, const char* what, int64_t rows, int64_t cols, bool output) {
  FLY_TRY(check_tensor(t, what, 2));
  if (t->sizes[0] != rows || t->sizes[1] != cols)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: shape [%" PRId64 ", %" PRId64 "], expected [%" PRId64 ", %" PRId64 "]",
                what, t->sizes[0], t->sizes[1], rows, cols);
  if (cols > 1 && t->strides[1] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "%s: inner stride must be 1, got %" PRId64, what, t->strides[1]);
  if (output && rows > 1 && t->strides[0] < cols)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: row stride %" PRId64 " is smaller than the row length %" PRId64
                " (rows overlap)", what, t->strides[0], cols);
  return FLY_SUCCESS;
}

// Validation shared by the size query and the op: x and k.
fly_status check_x_k(const fly_tensor* x, int64_t k) {
  FLY_TRY(check_tensor(x, "x", 2));
  if (x->dtype != FLY_F32)
    return fail(FLY_ERROR_UNSUPPORTED, "x: dtype %s is not supported (fp32)", dtype_name(x->dtype));
  const int64_t R = x->sizes[0], C = x->sizes[1];
  if (C > 1 && x->strides[1] != 1)
    return fail(FLY_ERROR_UNSUPPORTED, "x: inner stride must be 1, got %" PRId64, x->strides[1]);
  if (k < 1 || k > C)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "k: %" PRId64 " is outside 1..C (C = %" PRId64 ")", k, C);
  if (C >= (int64_t(1) << 31) || R >= (int64_t(1) << 31))
    return fail(FLY_ERROR_UNSUPPORTED, "x: [%" PRId64 ", %" PRId64 "] exceeds the kernels' 2^31 rows/columns", R, C);
  return FLY_SUCCESS;
}

}  // namespace
}  // namespace fly

extern "C" FLY_API fly_status fly_topk_workspace_size(const fly_tensor* x, int64_t k, int largest,
                                                      int deterministic, size_t* bytes) {
  using namespace fly;
  (void)largest;
  (void)deterministic;
  clear_error();
  if (!bytes) return fail(FLY_ERROR_INVALID_ARGUMENT, "bytes: output pointer is NULL");
  *bytes = 0;
  FLY_TRY(check_x_k(x, k));
  const int64_t need = workspace_need(x->sizes[0], x->sizes[1], k);
  if (need < 0) return workspace_too_large(x->sizes[0], x->sizes[1], k);
  *bytes = size_t(need);
  return FLY_SUCCESS;
}

extern "C" FLY_API fly_status fly_topk(const fly_tensor* x, int64_t k, int largest, int deterministic,
                                       const fly_tensor* values, const fly_tensor* indices, void* workspace,
                                       size_t workspace_bytes, void* stream) {
  using namespace fly;
  clear_error();
  FLY_TRY(check_x_k(x, k));
  const int64_t R = x->sizes[0], C = x->sizes[1];
  FLY_TRY(check_matrix(values, "values", R, k, true));
  if (values->dtype != x->dtype)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "values: dtype %s does not match x (%s)", dtype_name(values->dtype),
                dtype_name(x->dtype));
  FLY_TRY(check_matrix(indices, "indices", R, k, true));
  if (indices->dtype != FLY_I64)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "indices: dtype %s, expected int64", dtype_name(indices->dtype));
  FLY_TRY(check_optional_workspace(workspace, workspace_bytes, 16));
  const int64_t need = workspace_need(R, C, k);
  if (need < 0) return workspace_too_large(R, C, k);
  if (need > 0 && (!workspace || workspace_bytes < size_t(need)))
    return fail(FLY_ERROR_WORKSPACE, "workspace: %zu bytes at %p, this shape needs %" PRId64
                " (fly_topk_workspace_size)", workspace_bytes, workspace, need);
  // Outputs against the other arguments (host arithmetic, before the device check).
  FLY_TRY(check_disjoint(values, "values", x, "x"));
  FLY_TRY(check_disjoint(indices, "indices", x, "x"));
  FLY_TRY(check_disjoint(indices, "indices", values, "values"));
  if (need > 0) {
    FLY_TRY(check_workspace_disjoint(workspace, size_t(need), x, "x"));
    FLY_TRY(check_workspace_disjoint(workspace, size_t(need), values, "values"));
    FLY_TRY(check_workspace_disjoint(workspace, size_t(need), indices, "indices"));
  }
  if (R == 0) return FLY_SUCCESS;

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*x, "x"));
  FLY_TRY(check_device_pointer(*values, "values"));
  FLY_TRY(check_device_pointer(*indices, "indices"));
  if (need > 0) FLY_TRY(check_device_bytes(workspace, need, "workspace"));

  DispatchRequest req =
      make_request(kFamily, keys::topk(deterministic, R, C, k));
  req.supports = [R, C, k](const Variant& v) { return variant_supports(v, R, C, k); };
  req.fallback = [R, C, k] { return default_variant(R, C, k); };
  const Variant* v = nullptr;
  FLY_TRY(choose_variant(*dc, req, &v));

  TopkParams p{};
  p.x = static_cast<const float*>(x->data);
  p.ldx = R > 1 ? x->strides[0] : C;
  p.values = static_cast<float*>(values->data);
  p.ldv = R > 1 ? values->strides[0] : k;
  p.indices = static_cast<int64_t*>(indices->data);
  p.ldi = R > 1 ? indices->strides[0] : k;
  p.R = int32_t(R);
  p.C = int32_t(C);
  p.k = int32_t(k);
  p.largest = largest ? 1 : 0;
  p.deterministic = deterministic ? 1 : 0;
  p.kpad = int32_t(topk_plan::next_pow2(k));
  const unsigned threads = unsigned(v->get_int("threads"));

  switch (path_of(*v)) {
    case Path::kSmall: {
      CUfunction f = nullptr;
      FLY_TRY(get_function(*dc, *v, "fly_topk_small", &f));
      const int64_t rpc = int64_t(threads) / v->get_int("tpr");
      LaunchConfig cfg;
      cfg.grid[0] = unsigned((R + rpc - 1) / rpc);
      cfg.block[0] = threads;
      return launch1(f, cfg, stream, p);
    }
    case Path::kRadix: {
      CUfunction f = nullptr;
      FLY_TRY(get_function(*dc, *v, "fly_topk_radix", &f));
      const auto plan = topk_plan::plan_radix(R, C, k, dc->max_smem_optin);
      p.cache_row = plan.cache_row;
      p.sort_in_smem = plan.sort_in_smem;
      p.ws_cand = static_cast<uint64_t*>(workspace);
      LaunchConfig cfg;
      cfg.grid[0] = unsigned(R);
      cfg.block[0] = threads;
      cfg.smem = unsigned(plan.smem);
      return launch1(f, cfg, stream, p);
    }
    case Path::kSplit: {
      CUfunction fi = nullptr, fp = nullptr, ft = nullptr, fs = nullptr;
      FLY_TRY(get_function(*dc, *v, "fly_topk_split_init", &fi));
      FLY_TRY(get_function(*dc, *v, "fly_topk_split_pass", &fp));
      FLY_TRY(get_function(*dc, *v, "fly_topk_split_sort", &fs));
      if (deterministic) FLY_TRY(get_function(*dc, *v, "fly_topk_split_tie", &ft));
      const auto plan = topk_plan::plan_split(R, C, k, v->get_int("chunk"));
      char* ws = static_cast<char*>(workspace);
      p.chunk = int32_t(plan.chunk);
      p.pieces = int32_t(plan.pieces);
      p.cap_a = int32_t(plan.cap_a);
      p.cap_b = int32_t(plan.cap_b);
      p.ldt = int32_t(plan.ldt);
      p.sort_in_smem = plan.sort_in_smem;
      p.ws_state = reinterpret_cast<TopkSplitState*>(ws + plan.state_offset);
      p.ws_cand = reinterpret_cast<uint64_t*>(ws + plan.cand_offset);
      p.ws_buf_a = reinterpret_cast<uint64_t*>(ws + plan.buf_a_offset);
      p.ws_buf_b = reinterpret_cast<uint64_t*>(ws + plan.buf_b_offset);
      p.ws_tiecnt = reinterpret_cast<uint32_t*>(ws + plan.tie_offset);
      p.ws_ties = reinterpret_cast<uint64_t*>(ws + plan.ties_offset);
      // CTAs per row: enough for every SM to hold as many as its threads allow, over all rows;
      // each claims pieces until the row's pass is done, so extra CTAs only find nothing left.
      const int64_t per_sm = std::max<int64_t>(1, 2048 / int64_t(threads));
      const int64_t want = (int64_t(std::max(dc->sm_count, 1)) * per_sm + R - 1) / R;
      p.splits = int32_t(std::max<int64_t>(1, std::min<int64_t>(plan.pieces, want)));
      LaunchConfig rows;  // one CTA per row
      rows.grid[0] = unsigned(R);
      rows.block[0] = threads;
      LaunchConfig pieces;  // the row's CTAs
      pieces.grid[0] = unsigned(p.splits);
      pieces.grid[1] = unsigned(R);
      pieces.block[0] = threads;
      pieces.smem = unsigned(plan.smem);
      log(LogLevel::kDebug, "topk %s: %d CTAs per row, pieces of %d (%d), compaction %d / %d", v->name.c_str(),
          p.splits, p.chunk, p.pieces, p.cap_a, p.cap_b);
      FLY_TRY(launch1(fi, rows, stream, p));
      // Three radix levels and the gather: launches after the row is resolved return at once.
      for (int pass = 0; pass < 4; ++pass) {
        p.pass = pass;
        FLY_TRY(launch1(fp, pieces, stream, p));
      }
      if (deterministic) {
        p.pass = 4;  // many ties at the k-th key, in index order (returns at once otherwise)
        FLY_TRY(launch1(ft, pieces, stream, p));
      }
      LaunchConfig sort = rows;
      sort.smem = unsigned(plan.sort_smem);
      return launch1(fs, sort, stream, p);
    }
    default:
      return fail(FLY_ERROR_INTERNAL, "topk: variant %s has no known path", v->name.c_str());
  }
}
