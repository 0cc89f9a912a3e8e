// SPDX-License-Identifier: Apache-2.0
// fly_attention_bwd / fly_attention_bwd_workspace_size: validation, dispatch and launch of the
// attention backward family (kernels/attention/attention_bwd.cu, parameters and sizes in
// attention/attention_bwd_params.h): preprocess (Delta, LSE rows), dK/dV, dQ on one stream.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "attention/attention_bwd_params.h"
#include "attention/attention_plan.h"
#include "core.hpp"
#include "ops/attention_common.hpp"

namespace fly {
namespace {

constexpr const char* kFamily = "attention_bwd";
constexpr size_t kBwdParamsV1Size = offsetof(fly_attention_bwd_params, workspace_bytes) + sizeof(size_t);
constexpr int kMaxBwdHeadDim = 256;  // compiled head dims of the default build (64 .. 256)

// The wide (hd 512) backward variants are not defaults (tuning/attention_bwd.json: unmeasured):
// D 257..512 runs only in builds that bundle one (-DFLY_ALL_VARIANTS=ON [-DFLY_VARIANT_MATCH=hd512]).
// The bundled one of the dtype with the smallest name (the launcher's fallback), or nullptr.
const Variant* wide_variant(fly_dtype dt) {
  const Variant* best = nullptr;
  for (const Variant* v : variants_of(kFamily))
    if (v->get("dtype") == dtype_name(dt) && v->get_int("hd") == attn::kBwdWideHeadDim && (!best || v->name < best->name))
      best = v;
  return best;
}

struct BwdCall {
  attn::Shape s{};
  fly_dtype dt = FLY_DTYPE_INVALID;
  double scale = 0;
  int hd = 0;
  const fly_attention_bwd_params* prm = nullptr;
  bool empty = false;
  // Q, K, V, dO that TMA cannot address (attn_common::tma_problem): copied to 16-byte rows at the
  // end of the workspace first (the packed path). `need`: the workspace the call needs, the
  // backward's own part (rounded to 256 bytes) plus the copies.
  bool pack[4] = {false, false, false, false};  // q, k, v, dout
  std::string pack_why;
  int64_t copy_bytes = 0;
  int64_t need = 0;
};

// Byte ranges [lo, hi) two tensors' elements can reach; disjoint ranges cannot alias.
bool ranges_overlap(const fly_tensor& a, const fly_tensor& b) {
  auto range = [](const fly_tensor& t, uintptr_t* lo, uintptr_t* hi) {
    const uintptr_t elem = t.dtype == FLY_F32 ? 4 : 2;
    int64_t last = 0;
    for (int i = 0; i < t.rank; ++i) {
      if (t.sizes[i] == 0) return false;
      last += (t.sizes[i] - 1) * t.strides[i];
    }
    *lo = reinterpret_cast<uintptr_t>(t.data);
    *hi = *lo + uintptr_t(last + 1) * elem;
    return true;
  };
  uintptr_t alo, ahi, blo, bhi;
  if (!range(a, &alo, &ahi) || !range(b, &blo, &bhi)) return false;
  return alo < bhi && blo < ahi;
}

// `query`: the workspace size query, which validates everything but the workspace itself.
fly_status validate(const fly_attention_bwd_params* prm, BwdCall* out, bool query = false) {
  if (!prm) return fail(FLY_ERROR_INVALID_ARGUMENT, "params: NULL pointer");
  FLY_TRY(attn_common::check_struct_size(prm->struct_size, kBwdParamsV1Size, sizeof(fly_attention_bwd_params),
                                        "fly_attention_bwd_params"));
  FLY_TRY(check_tensor(prm->q, "q", 4));
  FLY_TRY(check_tensor(prm->k, "k", 4));
  FLY_TRY(check_tensor(prm->v, "v", 4));
  FLY_TRY(check_tensor(prm->o, "o", 4));
  FLY_TRY(check_tensor(prm->dout, "dout", 4));
  FLY_TRY(check_tensor(prm->lse, "lse", 3));
  FLY_TRY(check_tensor(prm->dq, "dq", 4));
  FLY_TRY(check_tensor(prm->dk, "dk", 4));
  FLY_TRY(check_tensor(prm->dv, "dv", 4));
  const fly_tensor &q = *prm->q, &k = *prm->k, &v = *prm->v, &o = *prm->o, &dout = *prm->dout, &lse = *prm->lse;
  const fly_tensor &dq = *prm->dq, &dk = *prm->dk, &dv = *prm->dv;
  const fly_dtype dt = q.dtype;
  if (dt != FLY_F16 && dt != FLY_BF16)
    return fail(FLY_ERROR_UNSUPPORTED, "q: dtype %s is not supported (fp16, bf16)", dtype_name(dt));
  const fly_tensor* same[] = {&k, &v, &o, &dout, &dq, &dk, &dv};
  const char* same_names[] = {"k", "v", "o", "dout", "dq", "dk", "dv"};
  for (int i = 0; i < 7; ++i)
    if (same[i]->dtype != dt)
      return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: dtype %s does not match q (%s)", same_names[i],
                  dtype_name(same[i]->dtype), dtype_name(dt));
  const int64_t B = q.sizes[0], Hq = q.sizes[1], Sq = q.sizes[2], D = q.sizes[3];
  const int64_t Hkv = k.sizes[1], Sk = k.sizes[2];
  FLY_TRY(attn_common::check_kv_of_q(k, q));
  FLY_TRY(attn_common::check_same_shape(v, k, "v", "k"));
  FLY_TRY(attn_common::check_same_shape(dk, k, "dk", "k"));
  FLY_TRY(attn_common::check_same_shape(dv, k, "dv", "k"));
  FLY_TRY(attn_common::check_same_shape(o, q, "o", "q"));
  FLY_TRY(attn_common::check_same_shape(dout, q, "dout", "q"));
  FLY_TRY(attn_common::check_same_shape(dq, q, "dq", "q"));
  if (lse.dtype != FLY_F32) return fail(FLY_ERROR_INVALID_ARGUMENT, "lse: dtype %s, expected fp32", dtype_name(lse.dtype));
  if (lse.sizes[0] != B || lse.sizes[1] != Hq || lse.sizes[2] != Sq)
    return fail(FLY_ERROR_INVALID_ARGUMENT,
                "lse: shape [%" PRId64 ", %" PRId64 ", %" PRId64 "], expected [B, Hq, Sq] = [%" PRId64 ", %" PRId64
                ", %" PRId64 "]",
                lse.sizes[0], lse.sizes[1], lse.sizes[2], B, Hq, Sq);
  if (prm->causal != 0 && prm->causal != 1)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "causal: %d, expected 0 or 1", int(prm->causal));
  if (prm->nondeterministic != 0 && prm->nondeterministic != 1)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "nondeterministic: %d, expected 0 or 1", int(prm->nondeterministic));
  if (!std::isfinite(prm->softmax_scale))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "softmax_scale: must be finite, got %g", prm->softmax_scale);
  if (prm->softmax_scale < 0)
    return fail(FLY_ERROR_UNSUPPORTED, "softmax_scale: negative scales (%g) are not supported", prm->softmax_scale);
  for (int i = 0; i < 8; ++i) {
    const fly_tensor* t = i < 7 ? same[i] : &q;
    const char* name = i < 7 ? same_names[i] : "q";
    if (t->sizes[3] > 1 && t->strides[3] != 1)
      return fail(FLY_ERROR_UNSUPPORTED, "%s: the head dim must be innermost (stride 1), got stride %" PRId64, name,
                  t->strides[3]);
  }
  const fly_tensor* outs[] = {&dq, &dk, &dv};
  const char* out_names[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i)
    if (!attn_common::non_overlapping(*outs[i])) return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: strides make elements overlap", out_names[i]);
  for (int i = 0; i < 3; ++i)
    for (int j = i + 1; j < 3; ++j)
      if (ranges_overlap(*outs[i], *outs[j]))
        return fail(FLY_ERROR_INVALID_ARGUMENT, "%s and %s: the outputs share memory", out_names[i], out_names[j]);
  const fly_tensor* ins[] = {&q, &k, &v, &o, &dout, &lse};
  const char* in_names[] = {"q", "k", "v", "o", "dout", "lse"};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 6; ++j)
      if (ranges_overlap(*outs[i], *ins[j]))
        return fail(FLY_ERROR_INVALID_ARGUMENT, "%s and %s: an output shares memory with an input (in-place is not supported)",
                    out_names[i], in_names[j]);
  if (!query && prm->workspace)
    for (int j = 0; j < 9; ++j) {
      const fly_tensor* t = j < 3 ? outs[j] : ins[j - 3];
      FLY_TRY(check_workspace_disjoint(prm->workspace, prm->workspace_bytes, t, j < 3 ? out_names[j] : in_names[j - 3]));
    }
  out->dt = dt;
  out->prm = prm;
  out->s = attn::Shape{B, Hq, Hkv, Sq, Sk, D, prm->causal == 1};
  out->empty = B == 0 || Hq == 0 || Sq == 0;
  if (out->empty) return FLY_SUCCESS;
  if (Hkv == 0 || Hq % Hkv != 0)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "k: Hq = %" PRId64 " query heads is not a multiple of Hkv = %" PRId64 " kv heads",
                Hq, Hkv);
  if (D == 0) return fail(FLY_ERROR_INVALID_ARGUMENT, "q: head dim D = 0");
  if (D > attn::kMaxHeadDim)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "q: head dim D = %" PRId64 " exceeds the maximum %d", D, attn::kMaxHeadDim);
  if (D > kMaxBwdHeadDim && !wide_variant(dt))
    return fail(FLY_ERROR_UNSUPPORTED,
                "q: head dim D = %" PRId64 " is above the backward's largest compiled head dim (%d); the hd %d backward "
                "variants are not in this build (-DFLY_ALL_VARIANTS=ON)",
                D, kMaxBwdHeadDim, attn::kBwdWideHeadDim);
  out->scale = prm->softmax_scale != 0 ? prm->softmax_scale : 1.0 / std::sqrt(double(D));
  out->hd = attn::padded_head_dim(D);
  const int64_t lim = int64_t(1) << 30;
  if (Sq >= lim || Sk >= lim || B > 65535 || Hq > 65535)
    return fail(FLY_ERROR_UNSUPPORTED, "q/k: B = %" PRId64 ", Hq = %" PRId64 ", Sq = %" PRId64 ", Sk = %" PRId64
                " exceed the kernels' grid limits (B, H <= 65535, S < 2^30)", B, Hq, Sq, Sk);
  if (B * Hq * Sq > (int64_t(1) << 36))  // the workspace size stays far from overflow
    return fail(FLY_ERROR_UNSUPPORTED, "q: B * Hq * Sq = %" PRId64 " query rows exceed the backward's limit 2^36", B * Hq * Sq);
  const fly_tensor* tma_ins[4] = {&q, &k, &v, &dout};
  const char* tma_names[4] = {"q", "k", "v", "dout"};
  for (int i = 0; i < 4; ++i) {
    if ((i == 1 || i == 2) && Sk == 0) continue;  // no keys: K and V are never read
    const std::string why = attn_common::tma_problem(*tma_ins[i], tma_names[i]);
    if (why.empty()) continue;
    out->pack[i] = true;
    out->copy_bytes += attn_common::packed_bytes(*tma_ins[i]);
    if (out->pack_why.empty()) out->pack_why = why;
  }
  const int64_t own = attn::bwd_ws_bytes(B, Hq, Sq);
  out->need = out->copy_bytes ? (own + 255) / 256 * 256 + out->copy_bytes : own;
  if (query) return FLY_SUCCESS;
  FLY_TRY(check_optional_workspace(prm->workspace, prm->workspace_bytes));
  const int64_t given = prm->workspace ? int64_t(prm->workspace_bytes) : 0;
  if (given < own)  // a workspace that is too small: FLY_ERROR_WORKSPACE, as every op's
    return fail(FLY_ERROR_WORKSPACE,
                "workspace: %zu bytes, the backward needs %" PRId64 " (fly_attention_bwd_workspace_size)", size_t(given),
                out->need);
  if (given < out->need)  // room for the backward, not for the copies the size query counted
    return fail(FLY_ERROR_WORKSPACE,
                "%s; with a workspace of %" PRId64 " bytes (fly_attention_bwd_workspace_size; %zu given) the call runs "
                "on aligned copies",
                out->pack_why.c_str(), out->need, size_t(given));
  return FLY_SUCCESS;
}

// Family defaults (tuning/attention_bwd.json "defaults").
std::string default_variant(const BwdCall& c) {
  const std::string d = dtype_name(c.dt);
  if (c.hd == attn::kBwdWideHeadDim) {
    const Variant* w = wide_variant(c.dt);  // validate() refused the call when none is bundled
    return w ? w->name : "attention_bwd_" + d + "_hd512_kn64_qm32_mq64_nq32";
  }
  switch (c.hd) {
    case 64: return "attention_bwd_" + d + "_hd64_kn128_qm64_mq128_nq128";
    case 128: return "attention_bwd_" + d + "_hd128_kn128_qm64_mq128_nq128";
    case 192: return "attention_bwd_" + d + "_hd192_kn64_qm64_mq128_nq64";
    default: return "attention_bwd_" + d + "_hd256_kn64_qm64_mq64_nq64";
  }
}

void strides3(const fly_tensor& t, int64_t (&s)[3]) {
  for (int i = 0; i < 3; ++i) s[i] = t.strides[i];
}

}  // namespace
}  // namespace fly

extern "C" FLY_API fly_status fly_attention_bwd_workspace_size(const fly_attention_bwd_params* params, size_t* bytes) {
  using namespace fly;
  clear_error();
  if (!bytes) return fail(FLY_ERROR_INVALID_ARGUMENT, "bytes: NULL pointer");
  *bytes = 0;
  if (!params) return fail(FLY_ERROR_INVALID_ARGUMENT, "params: NULL pointer");
  // The size depends only on the shapes: validate everything but the workspace itself.
  BwdCall c;
  FLY_TRY(validate(params, &c, /*query=*/true));
  if (!c.empty) *bytes = size_t(c.need);
  return FLY_SUCCESS;
}

extern "C" FLY_API fly_status fly_attention_bwd(const fly_attention_bwd_params* params, void* stream) {
  using namespace fly;
  clear_error();
  BwdCall c;
  FLY_TRY(validate(params, &c));
  if (c.empty) return FLY_SUCCESS;
  const attn::Shape& s = c.s;
  fly_attention_bwd_params prm_local = *params;  // the packed path points q, k, v, dout at copies
  const fly_attention_bwd_params& prm = prm_local;

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*prm.q, "q"));
  FLY_TRY(check_device_pointer(*prm.k, "k"));
  FLY_TRY(check_device_pointer(*prm.v, "v"));
  FLY_TRY(check_device_pointer(*prm.o, "o"));
  FLY_TRY(check_device_pointer(*prm.dout, "dout"));
  FLY_TRY(check_device_pointer(*prm.lse, "lse"));
  FLY_TRY(check_device_pointer(*prm.dq, "dq"));
  FLY_TRY(check_device_pointer(*prm.dk, "dk"));
  FLY_TRY(check_device_pointer(*prm.dv, "dv"));
  FLY_TRY(check_device_bytes(prm.workspace, c.need, "workspace"));

  DispatchRequest req =
      make_request(kFamily, keys::attention(false, dtype_name(c.dt), c.hd, s.causal, s.B, s.Hq, s.Hkv, s.Sq, s.Sk));
  const fly_dtype dt = c.dt;
  const int hd = c.hd;
  const int smem_max = dc->max_smem_optin;
  req.supports = [dt, hd, smem_max](const Variant& v) {
    return v.get("dtype") == dtype_name(dt) && v.get_int("hd") == hd &&
           attn::bwd_dkdv_smem_bytes(hd, int(v.get_int("kn")), int(v.get_int("qm")), 2) <= smem_max &&
           attn::bwd_dq_smem_bytes(hd, int(v.get_int("mq")), int(v.get_int("nq")), 2) <= smem_max;
  };
  req.cache_tag = "smem=" + std::to_string(smem_max);
  const BwdCall cc = c;
  req.fallback = [cc] { return default_variant(cc); };
  ResolvedKernel rk;
  FLY_TRY(resolve_kernel(*dc, req, "fly_attn_bwd_dkdv", &rk));
  const Variant* v = rk.v;
  const Driver* d = rk.d;
  const int kn = int(v->get_int("kn")), qm = int(v->get_int("qm")), mq = int(v->get_int("mq")), nq = int(v->get_int("nq"));
  // Copies of the operands TMA cannot address (fly_pack_lines_sm90, in every attention_bwd cubin),
  // at the end of the workspace; the backward's own part stays at its front.
  fly_tensor packed[4];
  if (c.copy_bytes > 0) {
    CUfunction pf = nullptr;
    FLY_TRY(get_function(*dc, *v, "fly_pack_lines_sm90", &pf));
    char* dst = static_cast<char*>(params->workspace) + (int64_t(params->workspace_bytes) - c.copy_bytes) / 256 * 256;
    const fly_tensor** ops[4] = {&prm_local.q, &prm_local.k, &prm_local.v, &prm_local.dout};
    for (int i = 0; i < 4; ++i) {
      if (!c.pack[i]) continue;
      const attn_common::PackedOperand po = attn_common::plan_packed(**ops[i], dst, dc->sm_count);
      LaunchConfig pc;
      for (int j = 0; j < 3; ++j) pc.grid[j] = po.grid[j];
      pc.block[0] = kPackThreads;
      FLY_TRY(launch1(pf, pc, stream, po.params));
      packed[i] = po.t;
      *ops[i] = &packed[i];
      dst += attn_common::packed_bytes(po.t);
    }
    if (log_level() >= LogLevel::kInfo)
      log(LogLevel::kInfo, "attention_bwd: packed path: %s%s%s%scopied to 16-byte rows in the workspace (%" PRId64
          " bytes; %s)", c.pack[0] ? "q " : "", c.pack[1] ? "k " : "", c.pack[2] ? "v " : "", c.pack[3] ? "dout " : "",
          c.copy_bytes, c.pack_why.c_str());
  }
  CUfunction f_pre = nullptr, f_dq = nullptr;
  FLY_TRY(get_function(*dc, *v, "fly_attn_bwd_pre", &f_pre));
  FLY_TRY(get_function(*dc, *v, "fly_attn_bwd_dq", &f_dq));

  attn::AttnBwdParams p{};
  const bool bf16 = dt == FLY_BF16;
  CUresult r = attn_common::encode_operand(*d, &p.tm_q_kv, *prm.q, bf16, qm);
  if (r == CUDA_SUCCESS) r = attn_common::encode_operand(*d, &p.tm_do_kv, *prm.dout, bf16, qm);
  if (r == CUDA_SUCCESS) r = attn_common::encode_operand(*d, &p.tm_q_dq, *prm.q, bf16, mq);
  if (r == CUDA_SUCCESS) r = attn_common::encode_operand(*d, &p.tm_do_dq, *prm.dout, bf16, mq);
  if (s.Sk > 0) {
    if (r == CUDA_SUCCESS) r = attn_common::encode_operand(*d, &p.tm_k_kv, *prm.k, bf16, kn);
    if (r == CUDA_SUCCESS) r = attn_common::encode_operand(*d, &p.tm_v_kv, *prm.v, bf16, kn);
    if (r == CUDA_SUCCESS) r = attn_common::encode_operand(*d, &p.tm_k_dq, *prm.k, bf16, nq);
    if (r == CUDA_SUCCESS) r = attn_common::encode_operand(*d, &p.tm_v_dq, *prm.v, bf16, nq);
  }
  if (r != CUDA_SUCCESS) return cuda_fail(r, "cuTensorMapEncodeTiled");
  p.o = prm.o->data;
  p.dout = prm.dout->data;
  p.lse = static_cast<const float*>(prm.lse->data);
  p.dq = prm.dq->data;
  p.dk = prm.dk->data;
  p.dv = prm.dv->data;
  p.ws_lse2 = static_cast<float*>(prm.workspace);
  p.ws_delta = reinterpret_cast<float*>(static_cast<char*>(prm.workspace) + attn::bwd_ws_part_bytes(s.B, s.Hq, s.Sq));
  p.ws_max = reinterpret_cast<float*>(static_cast<char*>(prm.workspace) + 2 * attn::bwd_ws_part_bytes(s.B, s.Hq, s.Sq));
  // Q and K as the maps read them (the packed path's copies when packed): the preprocessing's exact
  // recomputation of rows whose |LSE| is too large for P = exp(s scale - LSE) reads them directly.
  p.q = prm.q->data;
  p.k = prm.k->data;
  strides3(*prm.q, p.q_s);
  strides3(*prm.k, p.k_s);
  strides3(*prm.o, p.o_s);
  strides3(*prm.dout, p.do_s);
  strides3(*prm.lse, p.lse_s);
  strides3(*prm.dq, p.dq_s);
  strides3(*prm.dk, p.dk_s);
  strides3(*prm.dv, p.dv_s);
  p.B = int32_t(s.B);
  p.Hq = int32_t(s.Hq);
  p.Hkv = int32_t(s.Hkv);
  p.Sq = int32_t(s.Sq);
  p.Sk = int32_t(s.Sk);
  p.D = int32_t(s.D);
  p.group = int32_t(s.Hq / s.Hkv);
  p.sq_pad = int32_t(attn::bwd_pad_rows(s.Sq));
  p.causal = s.causal ? 1 : 0;
  p.scale = float(c.scale);
  p.scale_log2 = float(c.scale * 1.4426950408889634);

  const unsigned smem_kv = unsigned(attn::bwd_dkdv_smem_bytes(hd, kn, qm, 2));
  const unsigned smem_q = unsigned(attn::bwd_dq_smem_bytes(hd, mq, nq, 2));
  if (int64_t(std::max(smem_kv, smem_q)) > dc->max_smem_optin)
    return fail(FLY_ERROR_UNSUPPORTED, "variant %s needs %u bytes of shared memory, the device allows %d", v->name.c_str(),
                std::max(smem_kv, smem_q), dc->max_smem_optin);
  if (log_level() >= LogLevel::kDebug)
    log(LogLevel::kDebug, "attention_bwd %s: dkdv grid %" PRId64 "x%" PRId64 "x%" PRId64 ", dq grid %" PRId64, v->name.c_str(),
        attn::bwd_dkdv_grid_x(hd, s.Sk, kn), s.Hkv, s.B, (s.Sq + mq - 1) / mq);

  LaunchConfig pre;
  pre.grid[0] = unsigned((s.B * s.Hq * p.sq_pad + 7) / 8);
  pre.block[0] = 256;
  FLY_TRY(launch1(f_pre, pre, stream, p));
  if (s.Sk > 0) {
    LaunchConfig kv;
    kv.grid[0] = unsigned(attn::bwd_dkdv_grid_x(hd, s.Sk, kn));  // wide: x kBwdWideSlices column slices
    kv.grid[1] = unsigned(s.Hkv);
    kv.grid[2] = unsigned(s.B);
    kv.block[0] = unsigned(attn::bwd_dkdv_threads(hd, kn));
    kv.smem = smem_kv;
    FLY_TRY(launch1(rk.f, kv, stream, p));
  }
  LaunchConfig q;
  q.grid[0] = unsigned((s.Sq + mq - 1) / mq);
  q.grid[1] = unsigned(s.Hq);
  q.grid[2] = unsigned(s.B);
  q.block[0] = unsigned(attn::bwd_dq_threads(hd, mq));
  q.smem = smem_q;
  return launch1(f_dq, q, stream, p);
}
