// SPDX-License-Identifier: Apache-2.0
// SDPA forward and backward on CUDA through fly_attention_fwd / fly_attention_bwd:
//   aten::_scaled_dot_product_{flash,efficient,cudnn}_attention (what SDPA's dispatcher calls after
//   picking a backend) and aten::_scaled_dot_product_{flash,efficient}_attention_backward.
// Ours takes dense fp16/bf16 [B, H, S, D] inputs without dropout, mask or debug mask; the library
// decides which head dims, strides and head ratios it takes (anything it declines runs the stock
// kernel). Outputs follow each stock op's contract (layout, log-sum-exp shape), so the stock
// backward works on them, and our backward works on the stock forward's.
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common.hpp"
#include "decisions.hpp"
#include "families.hpp"
#include "overrides.hpp"

namespace flyk {
namespace {

// Torch's side of eligibility: what the library cannot judge (devices, dtypes we map, dropout,
// nested tensors, the rank we describe, the outputs we allocate). Shapes, head dims, head ratios
// and strides are the library's to accept (its status sends the call back to stock).
const char* sdpa_ineligible(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p,
                            bool check_device) {
  if (check_device && !(q.is_cuda() && k.is_cuda() && v.is_cuda())) return "inputs are not CUDA tensors";
  if (q.scalar_type() != at::kHalf && q.scalar_type() != at::kBFloat16) return "dtype not covered (fp16, bf16)";
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) return "mixed dtypes";
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return "inputs are not [B, H, S, D]";
  if (q.is_nested() || k.is_nested() || v.is_nested()) return "nested tensors";
  if (dropout_p != 0.0) return "dropout";
  // The outputs are allocated with the query's head dim: the value's must be the same.
  if (v.size(3) != q.size(3)) return "value head dim differs from the query's";
  if (check_device && (k.device() != q.device() || v.device() != q.device())) return "inputs on different devices";
  if (check_device) return device_unsupported(q.device());
  return nullptr;
}

// The decision key (decisions.hpp): dtype; "causal" | "full"; Sk, Sq, B * Hq, D.
DecisionKey sdpa_key(const char* op, const at::Tensor& q, const at::Tensor& k, bool causal) {
  DecisionKey key;
  key.op = op;
  key.dtype = dtype_key(q.scalar_type());
  key.layout = causal ? "causal" : "full";
  key.k[0] = k.size(2);
  key.k[1] = q.size(2);
  key.k[2] = q.size(0) * q.size(1);
  key.k[3] = q.size(3);
  return key;
}

// The stock op each override replaces, and its own rules beyond sdpa_ineligible: calls the stock op
// rejects stay the stock op's (it raises its own error), as do calls whose meaning is its own.
enum class SdpaOp { kFlash, kEfficient, kCudnn, kFlashBwd, kEfficientBwd };
constexpr const char* kSdpaKeyOps[] = {"sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_flash_bwd",
                                       "sdpa_efficient_bwd"};

const char* sdpa_op_ineligible(SdpaOp op, const at::Tensor& q, const at::Tensor& k, bool causal) {
  // Empty inputs: each stock op has its own answer (an empty result, zeros, or an error).
  if (q.numel() == 0 || k.numel() == 0) return "empty input (the stock op's own answer)";
  const int64_t D = q.size(3);
  switch (op) {
    case SdpaOp::kFlash:
    case SdpaOp::kFlashBwd:
      // mha_fwd / mha_bwd: "head_size must be a multiple of 8, this is ensured by padding!" and "only
      // supports head dimension at most 256" (SDPA pads the head dim and picks another backend above).
      if (D % 8 != 0) return "head dim not a multiple of 8 (the flash op's rule; SDPA pads it)";
      if (D > 256) return "head dim above 256 (the flash op's limit)";
      // SDPA never sends these (its causal mask is top-left, flash's own bottom-right); a direct
      // call keeps the stock op's meaning.
      if (causal && q.size(2) != k.size(2)) return "causal with Sq != Sk (flash's own rule)";
      return nullptr;
    case SdpaOp::kCudnn:
      // cuDNN's own limits on Hopper (sdp_utils: "head_dim should be a multiple of 8", "less than or
      // equal to 256 ... on hopper architecture").
      if (D % 8 != 0 || D > 256) return "head dim outside cuDNN's (a multiple of 8, at most 256)";
      return nullptr;
    case SdpaOp::kEfficient:
    case SdpaOp::kEfficientBwd:
      // _efficient_attention_forward / _backward check query.size(2) == key.size(2) (heads, BSHD):
      // SDPA sends grouped-query heads to flash or math, never here.
      if (k.size(1) != q.size(1)) return "grouped-query heads (the memory-efficient op has none)";
      return nullptr;
  }
  return nullptr;
}

fly_tensor lse_desc(const at::Tensor& lse) {
  fly_tensor ld{};
  ld.data = lse.data_ptr();
  ld.dtype = FLY_F32;
  ld.rank = 3;
  for (int i = 0; i < 3; ++i) {
    ld.sizes[i] = lse.size(i);
    ld.strides[i] = lse.stride(i);
  }
  return ld;
}

// Runs our forward into `out` (and `lse`, FP32 [B, H, Sq] view, or undefined); false when the
// library declines (why says so), nothing written then.
bool sdpa_run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
              std::optional<double> scale, at::Tensor& out, const at::Tensor& lse, std::string& why) {
  c10::DeviceGuard guard(q.device());
  fly_tensor qd = desc_nd(q), kd = desc_nd(k), vd = desc_nd(v), od = desc_nd(out), ld{};
  if (lse.defined()) ld = lse_desc(lse);
  fly_attention_fwd_params prm{};
  prm.struct_size = sizeof(prm);
  prm.q = &qd;
  prm.k = &kd;
  prm.v = &vd;
  prm.o = &od;
  prm.lse = lse.defined() ? &ld : nullptr;
  prm.softmax_scale = scale.has_value() ? *scale : 0.0;
  prm.causal = causal ? 1 : 0;
  // 0 means 1/sqrt(D) to the library: an explicit zero scale is not that.
  if (scale.has_value() && !(std::isfinite(*scale) && *scale != 0.0)) {
    why = "softmax scale zero or not finite";
    return false;
  }
  size_t ws_bytes = 0;
  fly_status st = fly_attention_fwd_workspace_size(&prm, &ws_bytes);
  c10::DataPtr ws;  // back to the caching allocator, stream-ordered, when this returns
  if (st == FLY_SUCCESS && ws_bytes > 0) {
    ws = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(ws_bytes);
    prm.workspace = ws.get();
    prm.workspace_bytes = ws_bytes;
  }
  if (st == FLY_SUCCESS) st = fly_attention_fwd(&prm, current_stream(q.device()));
  if (st == FLY_SUCCESS) return true;
  if (status_means_fallback(st)) {
    why = fly_get_last_error();
    return false;
  }
  TORCH_CHECK(false, "flykernels attention: ", fly_status_string(st), ": ", fly_get_last_error());
}

// The philox seed / offset tensors the stock ops return (dtype and shape as their meta functions
// say, so compiled graphs see the same); without dropout nothing reads them.
at::Tensor no_rng(c10::IntArrayRef sizes, at::ScalarType dtype = at::kUInt64) { return empty_unfilled(sizes, dtype); }

// Asks the decision hook; false (counted as a fallback) when the stock kernel should run.
bool decided_ours(OpId id, SdpaOp op, const at::Tensor& q, const at::Tensor& k, bool causal, const char* schema,
                  const torch::jit::Stack& s, size_t nargs) {
  const DecisionKey key = sdpa_key(kSdpaKeyOps[static_cast<int>(op)], q, k, causal);
  if (take_ours(key, [&] { return timing_call(schema, "", s, nargs); })) return true;
  note_fallback(id, "decision: stock");
  return false;
}

// _scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, return_debug_mask, *, scale)
//   -> (out, logsumexp [B,H,Sq], cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_mask)
void sdpa_flash_boxed(const Impl& self, const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t b = s.size() - 7;
  const at::Tensor& q = s[b].toTensor();
  const at::Tensor& k = s[b + 1].toTensor();
  const at::Tensor& v = s[b + 2].toTensor();
  const double dropout_p = s[b + 3].toDouble();
  const bool causal = s[b + 4].toBool();
  const char* why = s[b + 5].toBool() ? "debug mask requested" : sdpa_ineligible(q, k, v, dropout_p, true);
  if (why == nullptr) why = sdpa_op_ineligible(SdpaOp::kFlash, q, k, causal);
  if (why == nullptr) {
    if (!decided_ours(kSdpaFlash, SdpaOp::kFlash, q, k, causal, "aten::_scaled_dot_product_flash_attention", s, 7))
      return self.call_prev(op, ks, stack);
    at::Tensor out = at::empty_like(q);  // the query's layout, as the stock op
    at::Tensor lse = empty_unfilled({q.size(0), q.size(1), q.size(2)}, at::kFloat);
    std::string lib_why;
    if (sdpa_run(q, k, v, causal, opt_double(s[b + 6]), out, lse, lib_why)) {
      note_ours(kSdpaFlash);
      const int64_t max_q = q.size(2), max_k = k.size(2);
      at::Tensor rng = no_rng({2}), unused = no_rng({}), debug = at::empty({0}, q.options());
      torch::jit::drop(s, 7);
      torch::jit::push(s, std::move(out), std::move(lse), at::Tensor(), at::Tensor(), c10::SymInt(max_q),
                       c10::SymInt(max_k), std::move(rng), std::move(unused), std::move(debug));
      return;
    }
    note_fallback(kSdpaFlash, lib_why.c_str());
  } else {
    note_fallback(kSdpaFlash, why);
  }
  self.call_prev(op, ks, stack);
}

// _scaled_dot_product_efficient_attention(q, k, v, attn_bias, compute_log_sumexp, dropout_p,
//   is_causal, *, scale) -> (out [B,Sq,H,D] transposed, log_sumexp [B,H,ceil(Sq/32)*32] or
//   [B,H,0], philox_seed, philox_offset)
void sdpa_efficient_boxed(const Impl& self, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                          torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t b = s.size() - 8;
  const at::Tensor& q = s[b].toTensor();
  const at::Tensor& k = s[b + 1].toTensor();
  const at::Tensor& v = s[b + 2].toTensor();
  const bool with_lse = s[b + 4].toBool();
  const double dropout_p = s[b + 5].toDouble();
  const bool causal = s[b + 6].toBool();
  const char* why = !s[b + 3].isNone() ? "attention bias" : sdpa_ineligible(q, k, v, dropout_p, true);
  if (why == nullptr) why = sdpa_op_ineligible(SdpaOp::kEfficient, q, k, causal);
  if (why == nullptr) {
    if (!decided_ours(kSdpaEfficient, SdpaOp::kEfficient, q, k, causal,
                      "aten::_scaled_dot_product_efficient_attention", s, 8))
      return self.call_prev(op, ks, stack);
    const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3);
    at::Tensor out = empty_unfilled({B, Sq, H, D}, q.scalar_type()).transpose(1, 2);
    const int64_t padded = with_lse ? (Sq + 31) / 32 * 32 : 0;
    at::Tensor lse_all = with_lse ? at::full({B, H, padded}, std::numeric_limits<float>::infinity(),
                                             q.options().dtype(at::kFloat))
                                  : at::empty({B, H, 0}, q.options().dtype(at::kFloat));
    at::Tensor lse = with_lse ? lse_all.narrow(2, 0, Sq) : at::Tensor();
    std::string lib_why;
    if (sdpa_run(q, k, v, causal, opt_double(s[b + 7]), out, lse, lib_why)) {
      note_ours(kSdpaEfficient);
      at::Tensor seed = no_rng({}, at::kLong), offset = no_rng({}, at::kLong);
      torch::jit::drop(s, 8);
      torch::jit::push(s, std::move(out), std::move(lse_all), std::move(seed), std::move(offset));
      return;
    }
    note_fallback(kSdpaEfficient, lib_why.c_str());
  } else {
    note_fallback(kSdpaEfficient, why);
  }
  self.call_prev(op, ks, stack);
}

// _scaled_dot_product_cudnn_attention(q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal,
//   return_debug_mask, *, scale) -> (out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
//   philox_seed, philox_offset, debug_mask). Taken only when no log-sum-exp is asked for (no
//   gradient): cuDNN's own backward reads its own statistics, so training stays with cuDNN.
void sdpa_cudnn_boxed(const Impl& self, const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t b = s.size() - 9;
  const at::Tensor& q = s[b].toTensor();
  const at::Tensor& k = s[b + 1].toTensor();
  const at::Tensor& v = s[b + 2].toTensor();
  const double dropout_p = s[b + 5].toDouble();
  const bool causal = s[b + 6].toBool();
  const char* why = !s[b + 3].isNone() ? "attention bias"
                    : s[b + 4].toBool() ? "log-sum-exp for cuDNN's backward requested (training)"
                    : s[b + 7].toBool() ? "debug mask requested"
                                        : sdpa_ineligible(q, k, v, dropout_p, true);
  if (why == nullptr) why = sdpa_op_ineligible(SdpaOp::kCudnn, q, k, causal);
  if (why == nullptr) {
    if (!decided_ours(kSdpaCudnn, SdpaOp::kCudnn, q, k, causal, "aten::_scaled_dot_product_cudnn_attention", s, 9))
      return self.call_prev(op, ks, stack);
    at::Tensor out = at::empty_like(q);
    std::string lib_why;
    if (sdpa_run(q, k, v, causal, opt_double(s[b + 8]), out, at::Tensor(), lib_why)) {
      note_ours(kSdpaCudnn);
      const int64_t max_q = q.size(2), max_k = k.size(2);
      // as the meta function: [B, H, Sq, 1] statistics (not computed: nothing reads them), no mask
      at::Tensor lse = empty_unfilled({q.size(0), q.size(1), q.size(2), 1}, at::kFloat);
      at::Tensor seed = no_rng({}, at::kLong), offset = no_rng({}, at::kLong);
      torch::jit::drop(s, 9);
      torch::jit::push(s, std::move(out), std::move(lse), at::Tensor(), at::Tensor(), c10::SymInt(max_q),
                       c10::SymInt(max_k), std::move(seed), std::move(offset), at::Tensor());
      return;
    }
    note_fallback(kSdpaCudnn, lib_why.c_str());
  } else {
    note_fallback(kSdpaCudnn, why);
  }
  self.call_prev(op, ks, stack);
}

// ---- backward --------------------------------------------------------------------------------
// fly_attention_bwd from the forward's output and natural-log LSE, whoever ran the forward (the
// stock ops' LSE has the same meaning: flash [B, H, Sq], memory-efficient padded [B, H, >= Sq]).
const char* sdpa_bwd_ineligible(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                double dropout_p) {
  const char* why = sdpa_ineligible(q, k, v, dropout_p, true);
  if (why != nullptr) return why;
  for (const at::Tensor* t : {&dout, &out})
    if (!t->defined() || t->device() != q.device()) return "grad_out or out missing or on another device";
  // Described as FP32 [B, H, Sq] (the first Sq columns of the stock ops' padded rows).
  if (!lse.defined() || lse.device() != q.device() || lse.scalar_type() != at::kFloat || lse.dim() != 3 ||
      lse.size(0) != q.size(0) || lse.size(1) != q.size(1) || lse.size(2) < q.size(2))
    return "log-sum-exp not FP32 [B, H, >= Sq]";
  return nullptr;
}

bool sdpa_bwd_run(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& out, const at::Tensor& lse, bool causal, std::optional<double> scale,
                  at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, std::string& why) {
  if (scale.has_value() && !(std::isfinite(*scale) && *scale != 0.0)) {
    why = "softmax scale zero or not finite";
    return false;
  }
  c10::DeviceGuard guard(q.device());
  const at::Tensor l = lse.narrow(2, 0, q.size(2));
  fly_tensor qd = desc_nd(q), kd = desc_nd(k), vd = desc_nd(v), od = desc_nd(out), gd = desc_nd(dout);
  fly_tensor dqd = desc_nd(dq), dkd = desc_nd(dk), dvd = desc_nd(dv), ld = lse_desc(l);
  fly_attention_bwd_params prm{};
  prm.struct_size = sizeof(prm);
  prm.q = &qd;
  prm.k = &kd;
  prm.v = &vd;
  prm.o = &od;
  prm.dout = &gd;
  prm.lse = &ld;
  prm.dq = &dqd;
  prm.dk = &dkd;
  prm.dv = &dvd;
  prm.softmax_scale = scale.has_value() ? *scale : 0.0;
  prm.causal = causal ? 1 : 0;
  size_t ws_bytes = 0;
  fly_status st = fly_attention_bwd_workspace_size(&prm, &ws_bytes);
  c10::DataPtr ws;
  if (st == FLY_SUCCESS && ws_bytes > 0) {
    ws = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(ws_bytes);
    prm.workspace = ws.get();
    prm.workspace_bytes = ws_bytes;
  }
  if (st == FLY_SUCCESS) st = fly_attention_bwd(&prm, current_stream(q.device()));
  if (st == FLY_SUCCESS) return true;
  if (status_means_fallback(st)) {
    why = fly_get_last_error();
    return false;
  }
  TORCH_CHECK(false, "flykernels attention backward: ", fly_status_string(st), ": ", fly_get_last_error());
}

// (grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
//  philox_seed, philox_offset, *, scale) -> (dq, dk, dv), each empty_like its input (meta).
void sdpa_flash_bwd_boxed(const Impl& self, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                          torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t b = s.size() - 15;
  const at::Tensor& dout = s[b].toTensor();
  const at::Tensor& q = s[b + 1].toTensor();
  const at::Tensor& k = s[b + 2].toTensor();
  const at::Tensor& v = s[b + 3].toTensor();
  const at::Tensor& out = s[b + 4].toTensor();
  const at::Tensor& lse = s[b + 5].toTensor();
  const bool causal = s[b + 11].toBool();
  const char* why = sdpa_bwd_ineligible(dout, q, k, v, out, lse, s[b + 10].toDouble());
  if (why == nullptr) why = sdpa_op_ineligible(SdpaOp::kFlashBwd, q, k, causal);
  if (why == nullptr) {
    if (!decided_ours(kSdpaFlashBwd, SdpaOp::kFlashBwd, q, k, causal,
                      "aten::_scaled_dot_product_flash_attention_backward", s, 15))
      return self.call_prev(op, ks, stack);
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    std::string lib_why;
    if (sdpa_bwd_run(dout, q, k, v, out, lse, causal, opt_double(s[b + 14]), dq, dk, dv, lib_why)) {
      note_ours(kSdpaFlashBwd);
      torch::jit::drop(s, 15);
      torch::jit::push(s, std::move(dq), std::move(dk), std::move(dv));
      return;
    }
    note_fallback(kSdpaFlashBwd, lib_why.c_str());
  } else {
    note_fallback(kSdpaFlashBwd, why);
  }
  self.call_prev(op, ks, stack);
}

// (grad_out, q, k, v, attn_bias, out, logsumexp, philox_seed, philox_offset, dropout_p,
//  grad_input_mask[4], is_causal, *, scale) -> (dq, dk, dv, dbias); grads [B, S, H, D] transposed
//  (meta), no bias gradient (we take no bias).
void sdpa_efficient_bwd_boxed(const Impl& self, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                              torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t b = s.size() - 13;
  const at::Tensor& dout = s[b].toTensor();
  const at::Tensor& q = s[b + 1].toTensor();
  const at::Tensor& k = s[b + 2].toTensor();
  const at::Tensor& v = s[b + 3].toTensor();
  const bool has_bias = !s[b + 4].isNone() && s[b + 4].toTensor().defined();
  const at::Tensor& out = s[b + 5].toTensor();
  const at::Tensor& lse = s[b + 6].toTensor();
  const bool causal = s[b + 11].toBool();
  const char* why = has_bias ? "attention bias" : sdpa_bwd_ineligible(dout, q, k, v, out, lse, s[b + 9].toDouble());
  if (why == nullptr) why = sdpa_op_ineligible(SdpaOp::kEfficientBwd, q, k, causal);
  if (why == nullptr) {
    // A bias gradient asked for with no bias: the stock op's error (_efficient_attention_backward),
    // not our gradients without one (issue 46). Calls we leave to stock reach the same check there.
    TORCH_CHECK(!s[b + 10].toBoolList().get(3), "bias_requires_grad is true but no bias was provided");
    if (!decided_ours(kSdpaEfficientBwd, SdpaOp::kEfficientBwd, q, k, causal,
                      "aten::_scaled_dot_product_efficient_attention_backward", s, 13))
      return self.call_prev(op, ks, stack);
    auto bshd = [](const at::Tensor& t) {
      return empty_unfilled({t.size(0), t.size(2), t.size(1), t.size(3)}, t.scalar_type()).transpose(1, 2);
    };
    at::Tensor dq = bshd(q), dk = bshd(k), dv = bshd(v);
    std::string lib_why;
    if (sdpa_bwd_run(dout, q, k, v, out, lse, causal, opt_double(s[b + 12]), dq, dk, dv, lib_why)) {
      note_ours(kSdpaEfficientBwd);
      torch::jit::drop(s, 13);
      torch::jit::push(s, std::move(dq), std::move(dk), std::move(dv), at::Tensor());
      return;
    }
    note_fallback(kSdpaEfficientBwd, lib_why.c_str());
  } else {
    note_fallback(kSdpaEfficientBwd, why);
  }
  self.call_prev(op, ks, stack);
}

}  // namespace

std::string explain_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p,
                         bool check_device) {
  if (const char* why = sdpa_ineligible(q, k, v, dropout_p, check_device)) return why;
  // The library's own rules (head dims, head ratios, strides), from its size query: validation
  // only, no device and no memory touched. The output is described as SDPA allocates it.
  fly_tensor qd = desc_nd(q), kd = desc_nd(k), vd = desc_nd(v), od = qd;
  for (int i = 3; i >= 0; --i) od.strides[i] = i == 3 ? 1 : od.strides[i + 1] * od.sizes[i + 1];
  // A fresh buffer's address: past every input (the library refuses an output sharing their memory).
  uintptr_t end = 0;
  for (const at::Tensor* t : {&q, &k, &v})
    end = std::max(end, reinterpret_cast<uintptr_t>(t->data_ptr()) +
                            static_cast<uintptr_t>(t->storage().nbytes() + t->element_size()));
  od.data = reinterpret_cast<void*>((end + 4095) / 4096 * 4096);
  fly_attention_fwd_params prm{};
  prm.struct_size = sizeof(prm);
  prm.q = &qd;
  prm.k = &kd;
  prm.v = &vd;
  prm.o = &od;
  size_t bytes = 0;
  if (fly_attention_fwd_workspace_size(&prm, &bytes) != FLY_SUCCESS) return fly_get_last_error();
  return "";
}

std::optional<DecisionKey> key_sdpa(const std::string& op, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, bool is_causal, bool check_device) {
  int which = -1;
  for (int i = 0; i < 5; ++i)
    if (op == kSdpaKeyOps[i]) which = i;
  TORCH_CHECK_VALUE(which >= 0, "flykernels: key_sdpa: op must be one of sdpa_flash, sdpa_efficient, ",
                    "sdpa_cudnn, sdpa_flash_bwd, sdpa_efficient_bwd; got '", op, "'");
  if (sdpa_ineligible(q, k, v, 0.0, check_device) != nullptr) return std::nullopt;
  if (sdpa_op_ineligible(static_cast<SdpaOp>(which), q, k, is_causal) != nullptr) return std::nullopt;
  return sdpa_key(kSdpaKeyOps[which], q, k, is_causal);
}

std::vector<Override> attention_overrides() {
  std::vector<Override> rows(3);
  rows[0].family = "sdpa";  // flash and memory-efficient forward
  rows[0].file = __FILE__;
  rows[0].impls.push_back(Impl{"aten::_scaled_dot_product_flash_attention", "", c10::DispatchKey::CUDA,
                               &sdpa_flash_boxed, std::nullopt});
  rows[0].impls.push_back(Impl{"aten::_scaled_dot_product_efficient_attention", "", c10::DispatchKey::CUDA,
                               &sdpa_efficient_boxed, std::nullopt});
  rows[1].family = "sdpa_cudnn";  // cuDNN forward without log-sum-exp (inference)
  rows[1].file = __FILE__;
  rows[1].impls.push_back(Impl{"aten::_scaled_dot_product_cudnn_attention", "", c10::DispatchKey::CUDA,
                               &sdpa_cudnn_boxed, std::nullopt});
  rows[2].family = "sdpa_bwd";  // flash and memory-efficient backward
  rows[2].file = __FILE__;
  rows[2].impls.push_back(Impl{"aten::_scaled_dot_product_flash_attention_backward", "", c10::DispatchKey::CUDA,
                               &sdpa_flash_bwd_boxed, std::nullopt});
  rows[2].impls.push_back(Impl{"aten::_scaled_dot_product_efficient_attention_backward", "", c10::DispatchKey::CUDA,
                               &sdpa_efficient_bwd_boxed, std::nullopt});
  return rows;
}

}  // namespace flyk
