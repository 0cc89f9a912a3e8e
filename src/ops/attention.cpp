// SPDX-License-Identifier: Apache-2.0
// fly_attention_fwd / fly_attention_fwd_workspace_size: validation, dispatch and launch of the
// attention family (kernels/attention/attention_fwd.cu, planned by attention/attention_plan.h).
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <string>

#include "attention/attention_math.h"
#include "attention/attention_params.h"
#include "attention/attention_plan.h"
#include "core.hpp"
#include "ops/attention_common.hpp"

namespace fly {
namespace {

constexpr const char* kFamily = "attention";
// The first version of the struct ends with workspace_bytes; later fields are optional.
constexpr size_t kParamsV1Size = offsetof(fly_attention_fwd_params, workspace_bytes) + sizeof(size_t);

struct AttnCall {
  attn::Shape s{};
  fly_dtype dt = FLY_DTYPE_INVALID;
  double scale = 0;
  int hd = 0;  // compiled head dim serving D
  const fly_tensor *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *lse = nullptr;
  bool empty = false;  // B, Hq or Sq of 0: nothing to do
  // Q, K, V that TMA cannot address (attn_common::tma_problem): copied to 16-byte lines at the end
  // of the workspace first (the packed path), or refused without room for the copies. `why` is the
  // first operand's problem, for the message.
  bool pack[3] = {false, false, false};
  std::string pack_why;
  int64_t pack_bytes() const {
    int64_t n = 0;
    const fly_tensor* t[3] = {q, k, v};
    for (int i = 0; i < 3; ++i) n += pack[i] ? attn_common::packed_bytes(*t[i]) : 0;
    return n;
  }
};

fly_status validate(const fly_attention_fwd_params* prm, AttnCall* out) {
  if (!prm) return fail(FLY_ERROR_INVALID_ARGUMENT, "params: NULL pointer");
  FLY_TRY(attn_common::check_struct_size(prm->struct_size, kParamsV1Size, sizeof(fly_attention_fwd_params),
                                        "fly_attention_fwd_params"));
  FLY_TRY(check_tensor(prm->q, "q", 4));
  FLY_TRY(check_tensor(prm->k, "k", 4));
  FLY_TRY(check_tensor(prm->v, "v", 4));
  FLY_TRY(check_tensor(prm->o, "o", 4));
  const fly_tensor &q = *prm->q, &k = *prm->k, &v = *prm->v, &o = *prm->o;
  const fly_dtype dt = q.dtype;
  if (dt != FLY_F16 && dt != FLY_BF16)
    return fail(FLY_ERROR_UNSUPPORTED, "q: dtype %s is not supported (fp16, bf16)", dtype_name(dt));
  if (k.dtype != dt || v.dtype != dt || o.dtype != dt) {
    const char* which = k.dtype != dt ? "k" : v.dtype != dt ? "v" : "o";
    const fly_tensor& w = k.dtype != dt ? k : v.dtype != dt ? v : o;
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: dtype %s does not match q (%s)", which, dtype_name(w.dtype), dtype_name(dt));
  }
  const int64_t B = q.sizes[0], Hq = q.sizes[1], Sq = q.sizes[2], D = q.sizes[3];
  const int64_t Hkv = k.sizes[1], Sk = k.sizes[2];
  FLY_TRY(attn_common::check_kv_of_q(k, q));
  FLY_TRY(attn_common::check_same_shape(v, k, "v", "k"));
  FLY_TRY(attn_common::check_same_shape(o, q, "o", "q"));
  if (prm->lse) {
    FLY_TRY(check_tensor(prm->lse, "lse", 3));
    const fly_tensor& l = *prm->lse;
    if (l.dtype != FLY_F32)
      return fail(FLY_ERROR_INVALID_ARGUMENT, "lse: dtype %s, expected fp32", dtype_name(l.dtype));
    if (l.sizes[0] != B || l.sizes[1] != Hq || l.sizes[2] != Sq)
      return fail(FLY_ERROR_INVALID_ARGUMENT,
                  "lse: shape [%" PRId64 ", %" PRId64 ", %" PRId64 "], expected [B, Hq, Sq] = [%" PRId64 ", %" PRId64
                  ", %" PRId64 "]",
                  l.sizes[0], l.sizes[1], l.sizes[2], B, Hq, Sq);
    if (!attn_common::non_overlapping(l)) return fail(FLY_ERROR_INVALID_ARGUMENT, "lse: strides make elements overlap");
  }
  if (prm->causal != 0 && prm->causal != 1)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "causal: %d, expected 0 or 1", int(prm->causal));
  if (prm->reserved != 0)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "reserved: %d, must be 0", int(prm->reserved));
  if (!std::isfinite(prm->softmax_scale))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "softmax_scale: must be finite, got %g", prm->softmax_scale);
  if (prm->softmax_scale < 0)  // the running max would have to be a running min
    return fail(FLY_ERROR_UNSUPPORTED, "softmax_scale: negative scales (%g) are not supported", prm->softmax_scale);
  FLY_TRY(check_optional_workspace(prm->workspace, prm->workspace_bytes));
  for (const fly_tensor* t : {&q, &k, &v, &o})
    if (t->sizes[3] > 1 && t->strides[3] != 1) {
      const char* which = t == &q ? "q" : t == &k ? "k" : t == &v ? "v" : "o";
      return fail(FLY_ERROR_UNSUPPORTED, "%s: the head dim must be innermost (stride 1), got stride %" PRId64, which,
                  t->strides[3]);
    }
  if (!attn_common::non_overlapping(o)) return fail(FLY_ERROR_INVALID_ARGUMENT, "o: strides make elements overlap");
  // Outputs against the inputs and each other (host arithmetic, before the device check).
  const fly_tensor* ins[3] = {&q, &k, &v};
  const char* in_names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    FLY_TRY(check_disjoint(&o, "o", ins[i], in_names[i]));
    FLY_TRY(check_disjoint(prm->lse, "lse", ins[i], in_names[i]));
  }
  FLY_TRY(check_disjoint(prm->lse, "lse", &o, "o"));
  out->dt = dt;
  out->q = prm->q;
  out->k = prm->k;
  out->v = prm->v;
  out->o = prm->o;
  out->lse = prm->lse;
  out->s = attn::Shape{B, Hq, Hkv, Sq, Sk, D, prm->causal == 1};
  out->empty = B == 0 || Hq == 0 || Sq == 0;
  if (out->empty) return FLY_SUCCESS;
  if (Hkv == 0 || Hq % Hkv != 0)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "k: Hq = %" PRId64 " query heads is not a multiple of Hkv = %" PRId64 " kv heads",
                Hq, Hkv);
  if (D == 0) return fail(FLY_ERROR_INVALID_ARGUMENT, "q: head dim D = 0");
  if (D > attn::kMaxHeadDim)
    return fail(FLY_ERROR_INVALID_ARGUMENT, "q: head dim D = %" PRId64 " exceeds the maximum %d", D, attn::kMaxHeadDim);
  out->scale = prm->softmax_scale != 0 ? prm->softmax_scale : 1.0 / std::sqrt(double(D));
  out->hd = attn::padded_head_dim(D);
  if (out->hd == 0)
    return fail(FLY_ERROR_UNSUPPORTED, "q: head dim D = %" PRId64 " is above the largest compiled head dim (512) of this build",
                D);
  const int64_t lim = int64_t(1) << 31;
  if (Sq >= lim || Sk >= lim || B > 65535 || Hq > 65535)
    return fail(FLY_ERROR_UNSUPPORTED, "q/k: B = %" PRId64 ", Hq = %" PRId64 ", Sq = %" PRId64 ", Sk = %" PRId64
                " exceed the kernels' grid limits (B, H <= 65535, S < 2^31)", B, Hq, Sq, Sk);
  const fly_tensor* ops[3] = {&q, &k, &v};
  const char* names[3] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    if (i > 0 && Sk == 0) break;  // no keys: K and V are never read
    const std::string why = attn_common::tma_problem(*ops[i], names[i]);
    if (why.empty()) continue;
    out->pack[i] = true;
    if (out->pack_why.empty()) out->pack_why = why;
  }
  return FLY_SUCCESS;
}

// Bytes of the workspace the call can use: the split-key partials' bound, then the copies.
int64_t workspace_need(const AttnCall& c) {
  const int64_t pack = c.pack_bytes();
  return (attn::max_workspace_bytes(c.s) + 255) / 256 * 256 + pack;
}

// Family default (names listed in tuning/attention.json "defaults").
std::string default_variant(const AttnCall& c) {
  const std::string d = dtype_name(c.dt);
  switch (c.hd) {
    case 64: return "attention_fwd_" + d + "_hd64_m128_n192_st2_ov0";
    case 128: return "attention_fwd_" + d + "_hd128_m128_n128_st2_ov0";
    case 192: return "attention_fwd_" + d + "_hd192_m128_n112_st2_ov0";
    case 256: return "attention_fwd_" + d + "_hd256_m128_n64_st2_ov0";
    default: return "attention_fwd_" + d + "_hd512_m64_n64_st1_ov0_mc1";  // the wide-head schedule
  }
}

}  // namespace
}  // namespace fly

extern "C" FLY_API fly_status fly_attention_fwd_workspace_size(const fly_attention_fwd_params* params, size_t* bytes) {
  using namespace fly;
  clear_error();
  if (!bytes) return fail(FLY_ERROR_INVALID_ARGUMENT, "bytes: NULL pointer");
  *bytes = 0;
  AttnCall c;
  FLY_TRY(validate(params, &c));
  if (!c.empty) *bytes = size_t(workspace_need(c));
  return FLY_SUCCESS;
}

extern "C" FLY_API fly_status fly_attention_fwd(const fly_attention_fwd_params* params, void* stream) {
  using namespace fly;
  clear_error();
  AttnCall c;
  FLY_TRY(validate(params, &c));
  if (c.empty) return FLY_SUCCESS;
  const attn::Shape& s = c.s;
  // The packed path's copies go at the end of the workspace; the split-key partials use its front.
  const int64_t copy_bytes = c.pack_bytes();
  int64_t ws_front = int64_t(params->workspace_bytes);
  if (copy_bytes > 0) {
    if (!params->workspace || ws_front < copy_bytes)  // the size query counted the copies
      return fail(FLY_ERROR_WORKSPACE,
                  "%s; with a workspace of %" PRId64 " bytes (fly_attention_fwd_workspace_size; %zu given) the call "
                  "runs on aligned copies",
                  c.pack_why.c_str(), workspace_need(c), params->workspace_bytes);
    ws_front = (ws_front - copy_bytes) / 256 * 256;
  }
  for (const fly_tensor* t : {c.q, c.k, c.v, c.o, c.lse}) {
    const char* which = t == c.q ? "q" : t == c.k ? "k" : t == c.v ? "v" : t == c.o ? "o" : "lse";
    FLY_TRY(check_workspace_disjoint(params->workspace, params->workspace_bytes, t, which));
  }

  ScopedContext guard;
  const DeviceCtx* dc = nullptr;
  FLY_TRY(guard.enter(stream, &dc));
  FLY_TRY(check_device_pointer(*c.q, "q"));
  FLY_TRY(check_device_pointer(*c.k, "k"));
  FLY_TRY(check_device_pointer(*c.v, "v"));
  FLY_TRY(check_device_pointer(*c.o, "o"));
  if (c.lse) FLY_TRY(check_device_pointer(*c.lse, "lse"));
  if (params->workspace && params->workspace_bytes > 0)
    FLY_TRY(check_device_bytes(params->workspace, int64_t(params->workspace_bytes), "workspace"));

  DispatchRequest req =
      make_request(kFamily, keys::attention(true, dtype_name(c.dt), c.hd, s.causal, s.B, s.Hq, s.Hkv, s.Sq, s.Sk));
  const fly_dtype dt = c.dt;
  const int hd = c.hd;
  const int smem_max = dc->max_smem_optin;
  req.supports = [dt, hd, smem_max](const Variant& v) {
    return v.get("dtype") == dtype_name(dt) && v.get_int("hd") == hd &&
           attn::attn_smem_bytes(hd, int(v.get_int("m")), int(v.get_int("n")), int(v.get_int("st"))) <= smem_max;
  };
  req.cache_tag = "smem=" + std::to_string(smem_max);
  const AttnCall cc = c;
  req.fallback = [cc] { return default_variant(cc); };
  ResolvedKernel rk;
  FLY_TRY(resolve_kernel(*dc, req, "fly_attn_fwd", &rk));
  const Variant* v = rk.v;
  const Driver* d = rk.d;
  const int bm = int(v->get_int("m")), bn = int(v->get_int("n")), st = int(v->get_int("st"));

  // Copies of the operands TMA cannot address (fly_pack_lines_sm90, in every attention_fwd cubin).
  fly_tensor packed[3];
  if (copy_bytes > 0) {
    CUfunction pf = nullptr;
    FLY_TRY(get_function(*dc, *v, "fly_pack_lines_sm90", &pf));
    char* dst = static_cast<char*>(params->workspace) + ws_front;
    const fly_tensor** ops[3] = {&c.q, &c.k, &c.v};
    for (int i = 0; i < 3; ++i) {
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
      log(LogLevel::kInfo, "attention_fwd: packed path: %s%s%s copied to 16-byte lines in the workspace (%" PRId64
          " bytes; %s)", c.pack[0] ? "q " : "", c.pack[1] ? "k " : "", c.pack[2] ? "v " : "", copy_bytes,
          c.pack_why.c_str());
  }

  attn::AttnFwdParams p{};
  const bool bf16 = dt == FLY_BF16;
  const bool pack = attn::use_pack_gqa(s, bm);
  const attn::Grid g = attn::tile_grid(s, bm);
  const int64_t group = s.Hq / s.Hkv;
  CUresult r = pack ? attn_common::encode_operand(*d, &p.tm_q, *c.q, bf16, int(s.Sq), int(group))
                    : attn_common::encode_operand(*d, &p.tm_q, *c.q, bf16, bm, 1);
  if (r == CUDA_SUCCESS && s.Sk > 0) r = attn_common::encode_operand(*d, &p.tm_k, *c.k, bf16, bn, 1);
  if (r == CUDA_SUCCESS && s.Sk > 0) r = attn_common::encode_operand(*d, &p.tm_v, *c.v, bf16, bn, 1);
  if (r != CUDA_SUCCESS) return cuda_fail(r, "cuTensorMapEncodeTiled");
  p.o = c.o->data;
  p.o_sb = c.o->strides[0];
  p.o_sh = c.o->strides[1];
  p.o_ss = c.o->strides[2];
  if (c.lse) {
    p.lse = static_cast<float*>(c.lse->data);
    p.lse_sb = c.lse->strides[0];
    p.lse_sh = c.lse->strides[1];
    p.lse_ss = c.lse->strides[2];
  }
  p.B = int32_t(s.B);
  p.Hq = int32_t(s.Hq);
  p.Hkv = int32_t(s.Hkv);
  p.Sq = int32_t(s.Sq);
  p.Sk = int32_t(s.Sk);
  p.D = int32_t(s.D);
  p.group = int32_t(group);
  p.m_blocks = int32_t(g.m_blocks);
  p.pack_gqa = pack ? 1 : 0;
  p.causal = s.causal ? 1 : 0;
  const uintptr_t ob = reinterpret_cast<uintptr_t>(c.o->data);
  p.o_vec2 = ob % 4 == 0 && (s.B <= 1 || p.o_sb % 2 == 0) && (s.Hq <= 1 || p.o_sh % 2 == 0) &&
             (s.Sq <= 1 || p.o_ss % 2 == 0);
  const int chunks = hd / 64;
  p.q_bytes = uint32_t(chunks * 128 * (pack ? s.Sq * group : bm));
  p.scale_log2 = float(c.scale * 1.4426950408889634);
  p.scale = float(c.scale);
  p.prob_bias = attn::prob_bias(s.Sk, bf16);  // BF16: probabilities at 2^-bias (attention_math.h)

  int splits = attn::choose_splits(s, bm, bn, dc->sm_count);
  while (splits > 1 && attn::split_workspace_bytes(s, splits, hd) > ws_front) --splits;
  p.splits = splits;
  if (splits > 1) {
    const int64_t rows = s.B * s.Hq * s.Sq;
    p.ws_o = static_cast<float*>(params->workspace);
    p.ws_ml = reinterpret_cast<float*>(static_cast<char*>(params->workspace) + attn::attn_ws_o_bytes(splits, rows, hd));
    p.ws_cnt = reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(p.ws_ml) + attn::attn_ws_ml_bytes(splits, rows));
  }
  const unsigned smem = unsigned(attn::attn_smem_bytes(hd, bm, bn, st));
  if (int64_t(smem) > dc->max_smem_optin)
    return fail(FLY_ERROR_UNSUPPORTED, "variant %s needs %u bytes of shared memory, the device allows %d", v->name.c_str(),
                smem, dc->max_smem_optin);
  if (log_level() >= LogLevel::kDebug)
    log(LogLevel::kDebug, "attention_fwd %s: grid %" PRId64 "x%" PRId64 "x%" PRId64 " splits %d pack_gqa %d", v->name.c_str(),
        g.m_blocks * splits, g.heads_y, s.B, splits, int(pack));
  // Wide mc2 variants: clusters of 2 CTAs on adjacent m blocks multicast K and V (grid x padded to
  // even; the padding CTA has no rows). Not with key splits or packed GQA (one m block per head).
  const bool cluster = hd > 256 && v->get_int("mc", 1) == 2 && splits == 1 && !pack && g.m_blocks >= 2;
  p.cluster = cluster ? 1 : 0;
  LaunchConfig cfg;
  cfg.grid[0] = unsigned(cluster ? (g.m_blocks + 1) / 2 * 2 : g.m_blocks * splits);
  if (cluster) cfg.cluster[0] = 2;
  cfg.grid[1] = unsigned(g.heads_y);
  cfg.grid[2] = unsigned(s.B);
  if (v->get_int("ps", 0) == 1) {  // persistent: at most a CTA per SM, walking every tile (persistent_tile)
    const int64_t tiles = g.m_blocks * splits * g.heads_y * s.B;
    const int64_t sms = dc->sm_count > 0 ? dc->sm_count : 132;
    cfg.grid[0] = unsigned(tiles < 1 ? 1 : tiles < sms ? tiles : sms);
    cfg.grid[1] = cfg.grid[2] = 1;
  }
  cfg.block[0] = unsigned(attn::attn_threads(hd, bm));
  cfg.smem = smem;
  if (splits > 1) {
    // the tiles' arrival counters start at zero (the last split of each tile merges, then re-zeroes it)
    const int64_t tiles = g.m_blocks * g.heads_y * s.B;
    FLY_CU(d->cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p.ws_cnt), 0, size_t(tiles) * 4, static_cast<CUstream>(stream)),
           "cuMemsetD8Async");
  }
  return launch1(rk.f, cfg, stream, p);
}
