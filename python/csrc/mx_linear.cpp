// SPDX-License-Identifier: Apache-2.0
// MXLinear's CUDA GEMM (python/flykernels/_mx.py: flykernels::mx_linear and mx_linear_mx): one
// fly_scaled_gemm call on a 2-D activation a [M, K] and the layer's packed weights, in one of the
// two modes of the C ABI (include/flykernels/flykernels.h, docs/mxfp.md):
//  - weight-only (scale_a None): a BF16/FP16 as it is, b = the MX weights, c in a's dtype. This is
//    the mode the mx_decode kernels add (fly_scaled_gemm with a 16-bit a and scale_a NULL: the
//    decode kernels for M <= 64; M > 64 is FLY_ERROR_UNSUPPORTED until the library dispatches its
//    BF16 prefill kernel, and stays so for FP16).
//  - MX activations (scale_a given): a = fly_mx_quantize's codes of x in the weights' format, the
//    MX GEMM F.scaled_mm reaches (scaled_mm.cpp), c in out_dtype (bf16/fp16).
// The weights arrive as MXLinear keeps them, uint8 buffers (qweight [N, K] or [N, K/2], scales
// [N, K/32]), and are described as E4M3 / E2M1X2 / E8M0 by `format`. Returns None when the call is
// not ours (the reason noted: counts() "mx_linear" / "mx_linear_mx", and printed once at
// FLYKERNELS_LOG=info), including a library that predates the weight-only mode (its workspace query
// refuses a 16-bit a; its GEMM a NULL scale_a): the Python side then dequantizes + F.linear.
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include "common.hpp"
#include "families.hpp"

namespace flyk {
namespace {

// Torch's side of a call (the library checks the rest: alignment, strides, M limits); nullptr when
// it is ours to try.
const char* mx_linear_ineligible(const at::Tensor& a, const std::optional<at::Tensor>& scale_a, const at::Tensor& wq,
                                 const at::Tensor& scales, bool fp4, const std::optional<at::Tensor>& bias,
                                 at::ScalarType out_dtype) {
  if (!a.is_cuda() || !wq.is_cuda() || !scales.is_cuda() || (scale_a && !scale_a->is_cuda()) ||
      (bias && !bias->is_cuda()))
    return "inputs are not CUDA tensors";
  if (a.device() != wq.device() || a.device() != scales.device()) return "inputs on different devices";
  if (const char* why = device_unsupported(a.device())) return why;
  if (a.dim() != 2 || wq.dim() != 2 || scales.dim() != 2) return "a, weights or scales not 2-D";
  if (wq.element_size() != 1 || scales.element_size() != 1) return "weights or scales not bytes";
  if (!wq.is_contiguous() || !scales.is_contiguous()) return "weights or scales not contiguous";
  if (out_dtype != at::kBFloat16 && out_dtype != at::kHalf) return "output dtype not bf16 / fp16";
  if (bias && (bias->scalar_type() != out_dtype || bias->dim() != 1 || !bias->is_contiguous()))
    return "bias not a contiguous vector of the output dtype";
  if (scale_a) {
    const at::ScalarType want = fp4 ? at::kFloat4_e2m1fn_x2 : at::kFloat8_e4m3fn;
    if (a.scalar_type() != want) return "MX activations not in the weights' format";
    if (scale_a->dim() != 2 || !scale_a->is_contiguous() || scale_a->element_size() != 1)
      return "activation scales not contiguous 2-D bytes";
  } else if (a.scalar_type() != at::kBFloat16 && a.scalar_type() != at::kHalf) {
    return "weight-only activations not bf16 / fp16";
  } else if (a.scalar_type() != out_dtype) {
    return "weight-only output dtype differs from the activations'";
  }
  if (a.stride(1) != 1) return "a not row-major";
  return nullptr;
}

}  // namespace

std::optional<at::Tensor> mx_linear_run(const at::Tensor& a, const std::optional<at::Tensor>& scale_a,
                                        const at::Tensor& wq, const at::Tensor& scales, const std::string& format,
                                        const std::optional<at::Tensor>& bias,
                                        std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK_VALUE(format == "mxfp8" || format == "mxfp4", "flykernels mx_linear_run: format must be 'mxfp8' or "
                    "'mxfp4', got '", format, "'");
  const bool fp4 = format == "mxfp4";
  const OpId id = scale_a ? kMxLinearMx : kMxLinear;
  const at::ScalarType od = out_dtype.value_or(a.scalar_type());
  if (const char* why = mx_linear_ineligible(a, scale_a, wq, scales, fp4, bias, od)) {
    note_fallback(id, why);
    return std::nullopt;
  }
  c10::DeviceGuard guard(a.device());
  const int64_t M = a.size(0), N = wq.size(0), kb = scales.size(1);
  const at::Tensor b = wq.view(fp4 ? at::kFloat4_e2m1fn_x2 : at::kFloat8_e4m3fn);
  const at::Tensor sb = scales.view(at::kFloat8_e8m0fnu);
  at::Tensor c = empty_unfilled({M, N}, od);
  fly_tensor ad = desc_2d(a, M, a.size(1), M > 1 ? a.stride(0) : a.size(1));
  fly_tensor bd = desc_2d(b, N, b.size(1), b.size(1)), sbd = desc_2d(sb, N, kb, kb), cd = desc_2d(c, M, N, N);
  fly_tensor sad{}, biasd{};
  at::Tensor sa;
  if (scale_a) {
    sa = scale_a->view(at::kFloat8_e8m0fnu);
    sad = desc_2d(sa, M, sa.size(1), sa.size(1));
  }
  if (bias) biasd = desc_1d(*bias, N);
  // The query validates shapes and dtypes without a device; a library without the weight-only
  // mode refuses a 16-bit a here (FLY_ERROR_UNSUPPORTED), so that reaches the fallback, not an
  // error. MX activations: the split-K variants' call-scoped workspace, as scaled_mm_run.
  size_t ws_bytes = 0;
  fly_status st = fly_scaled_gemm_workspace_size(&ad, &bd, &cd, &ws_bytes);
  if (st != FLY_SUCCESS) {
    TORCH_CHECK(status_means_fallback(st), "flykernels mx_linear: ", fly_status_string(st), ": ", fly_get_last_error());
    note_fallback(id, fly_get_last_error());
    return std::nullopt;
  }
  c10::DataPtr ws;
  if (ws_bytes > 0) ws = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(ws_bytes);
  st = fly_scaled_gemm(&ad, scale_a ? &sad : nullptr, &bd, &sbd, bias ? &biasd : nullptr, &cd,
                       ws_bytes ? ws.get() : nullptr, ws_bytes, current_stream(a.device()));
  if (st != FLY_SUCCESS) {
    // e.g. weight-only at M > 64 (no prefill kernel dispatched), a row stride the kernels cannot load
    TORCH_CHECK(status_means_fallback(st), "flykernels mx_linear: ", fly_status_string(st), ": ", fly_get_last_error());
    note_fallback(id, fly_get_last_error());
    return std::nullopt;
  }
  note_ours(id);
  return c;
}

}  // namespace flyk
