// SPDX-License-Identifier: Apache-2.0
// MX block-scaled GEMM: aten::_scaled_mm_v2 (F.scaled_mm) and aten::_scaled_mm on CUDA and Meta,
// through fly_scaled_gemm; and fly_mx_quantize for the Python side.
// Ours: MXFP8 (float8_e4m3fn) or MXFP4 (float4_e2m1fn_x2) operands, both the same, A [M, K] row-major
// and B [K, N] column-major (a transposed view of a row-major [N, K]; FP4 counts packed bytes: K/2),
// one float8_e8m0fnu scale per 32 values of K (BlockWise1x32), scales either unswizzled (NO_SWIZZLE:
// [M, K/32] and [N, K/32] row-major, any shape with that many contiguous elements) or cuBLAS's
// SWIZZLE_32_4_4 blocked layout (unswizzled here with one small copy), output bf16/fp16, optional
// bias [N] in the output dtype. Everything else (other recipes, fp32 output, e5m2, tensorwise,
// rowwise) runs the stock kernel. v1 (_scaled_mm) with E8M0 scales means the blocked layout.
//
// Stock PyTorch runs no MX GEMM on sm_90 (it raises, or crashes: issue 46 saw it segfault on
// swizzle arguments that do not match the scales), so no MX call is left to it for those: every v2
// MX call (BlockWise1x32 recipes, one E8M0 scale per operand, MXFP8 or MXFP4 operands) first meets
// upstream's contract checks (ScaledBlas.cpp: check_swizzle_lengths, _scaled_mxfp8_mxfp8 /
// _scaled_mxfp4_mxfp4, the fast-accum rule), raising ValueError with upstream's messages where
// upstream does, in the CUDA and the Meta kernel alike (check_mx_contract). Our extension beyond
// upstream: NO_SWIZZLE scales, unpadded [rows, K/32] (and any M, N; K % 32 == 0).
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include "common.hpp"
#include "decisions.hpp"
#include "families.hpp"
#include "overrides.hpp"

namespace flyk {
namespace {

constexpr int64_t kRecipeBlockWise1x32 = 3;  // at::blas::ScalingType::BlockWise1x32
constexpr int64_t kSwizzleNone = 0, kSwizzle32_4_4 = 1;
constexpr size_t kScaledMmV2Args = 12, kScaledMmV1Args = 8;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The logical K of an MX operand pair (FP4 packs two values per byte), or -1.
int64_t mx_k(const at::Tensor& a) {
  if (a.dim() != 2) return -1;
  return a.scalar_type() == at::kFloat4_e2m1fn_x2 ? 2 * a.size(1) : a.size(1);
}

// nullptr when a scale tensor holds `rows` x K/32 scales in the layout `swizzle` names, else why not.
const char* mx_scale_ineligible(const at::Tensor& sc, int64_t rows, int64_t kb, int64_t swizzle) {
  if (sc.scalar_type() != at::kFloat8_e8m0fnu) return "scales not float8_e8m0fnu";
  if (!sc.is_contiguous()) return "scales not contiguous";
  const int64_t want = swizzle == kSwizzleNone ? rows * kb : round_up(rows, 128) * round_up(kb, 4);
  if (sc.numel() != want) return swizzle == kSwizzleNone ? "scale count is not rows * K/32 (NO_SWIZZLE)"
                                                         : "scale count is not the padded SWIZZLE_32_4_4 size";
  return nullptr;
}

// Torch's side: the recipe, dtypes, each swizzle's scale layout, and the row-/column-major views
// we describe to the library (which checks the rest: alignment, limits).
const char* scaled_mm_ineligible(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
                                 int64_t swizzle_a, int64_t swizzle_b, const at::Tensor* bias,
                                 std::optional<at::ScalarType> out_dtype, bool check_device) {
  if (check_device && !(a.is_cuda() && b.is_cuda() && sa.is_cuda() && sb.is_cuda())) return "inputs are not CUDA tensors";
  if (a.scalar_type() != at::kFloat8_e4m3fn && a.scalar_type() != at::kFloat4_e2m1fn_x2)
    return "operands not float8_e4m3fn / float4_e2m1fn_x2 (MXFP8 / MXFP4)";
  if (b.scalar_type() != a.scalar_type()) return "mixed operand dtypes";
  if (a.dim() != 2 || b.dim() != 2) return "operands not 2-D";
  if (sa.scalar_type() != at::kFloat8_e8m0fnu || sb.scalar_type() != at::kFloat8_e8m0fnu) return "scales not float8_e8m0fnu";
  if (!out_dtype.has_value() || (*out_dtype != at::kBFloat16 && *out_dtype != at::kHalf))
    return "output dtype not bf16 / fp16";
  if (bias != nullptr && bias->defined() && bias->scalar_type() != *out_dtype) return "bias dtype differs from the output's";
  for (int64_t sw : {swizzle_a, swizzle_b})
    if (sw != kSwizzleNone && sw != kSwizzle32_4_4) return "unknown scale swizzle";
  if (!check_device && (symbolic(a) || symbolic(b) || symbolic(sa) || symbolic(sb) ||
                        (bias != nullptr && bias->defined() && symbolic(*bias))))
    return nullptr;  // shape inference with symbolic sizes (the Meta kernel): the dtypes say MX
  if (a.size(1) != b.size(0)) return "K of A and B differ";
  const int64_t M = a.size(0), N = b.size(1), K = mx_k(a);
  if (K % 32 != 0) return "K not a multiple of 32";  // the scales are counted in blocks of 32
  if (a.stride(1) != 1 || (M > 1 && a.stride(0) < a.size(1))) return "A not row-major";
  if (b.stride(0) != 1 || (N > 1 && b.stride(1) < b.size(0))) return "B not column-major";
  if (const char* why = mx_scale_ineligible(sa, M, K / 32, swizzle_a)) return why;
  if (const char* why = mx_scale_ineligible(sb, N, K / 32, swizzle_b)) return why;
  if (bias != nullptr && bias->defined() && (bias->dim() != 1 || bias->size(0) != N || (N > 1 && bias->stride(0) != 1)))
    return "bias not a contiguous [N]";
  if (check_device) {
    const c10::Device d = a.device();
    if (b.device() != d || sa.device() != d || sb.device() != d || (bias && bias->defined() && bias->device() != d))
      return "inputs on different devices";
    return device_unsupported(d);
  }
  return nullptr;
}

// [rows, kb] row-major scales from cuBLAS's blocked layout: [rows/128 tiles][kb/4 tiles] of 512 bytes,
// (r, c) of a tile at byte 16 * (r % 32) + 4 * (r / 32) + c.
at::Tensor unswizzle_scales(const at::Tensor& sc, int64_t rows, int64_t kb) {
  const int64_t R = round_up(rows, 128), C = round_up(kb, 4);
  return sc.view(at::kByte)
      .reshape({R / 128, C / 4, 32, 4, 4})
      .permute({0, 3, 2, 1, 4})
      .reshape({R, C})
      .slice(0, 0, rows)
      .slice(1, 0, kb)
      .contiguous()
      .view(at::kFloat8_e8m0fnu);
}

// Runs ours; false (with the reason noted) when the library declines the call.
bool scaled_mm_run(OpId id, const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa_in, const at::Tensor& sb_in,
                   int64_t swizzle_a, int64_t swizzle_b, const at::Tensor* bias, at::ScalarType out_dtype,
                   at::Tensor* out) {
  c10::DeviceGuard guard(a.device());
  const int64_t M = a.size(0), N = b.size(1), K = mx_k(a), kb = K / 32;
  const at::Tensor sa = swizzle_a == kSwizzleNone ? sa_in : unswizzle_scales(sa_in, M, kb);
  const at::Tensor sb = swizzle_b == kSwizzleNone ? sb_in : unswizzle_scales(sb_in, N, kb);
  at::Tensor c = empty_unfilled({M, N}, out_dtype);
  const at::Tensor bt = b.t();  // [N, K(bytes)] row-major
  fly_tensor ad = desc_2d(a, M, a.size(1), M > 1 ? a.stride(0) : a.size(1));
  fly_tensor bd = desc_2d(bt, N, bt.size(1), N > 1 ? bt.stride(0) : bt.size(1));
  fly_tensor sad = desc_2d(sa, M, kb, kb), sbd = desc_2d(sb, N, kb, kb), cd = desc_2d(c, M, N, N), biasd{};
  if (bias) biasd = desc_1d(*bias, N);
  // The split-K variants' FP32 partials (docs/mxfp.md "Split-K"; 0 bytes unless one is bundled and
  // would split this shape): a call-scoped buffer from the caching allocator, back to it
  // (stream-ordered) when this returns, as the attention workspace. Unlike the dense GEMM's
  // stream-K workspace (_ops/gemm.py: a persistent zero-filled per-stream tensor from Python, which
  // CUDA-graph trees reject because it outlives the run), it needs no initialization and keeps no
  // state between calls, so the same code serves eager calls and Inductor's / CUDA-graph captured
  // ones (an allocation made during capture comes from the graph's pool and is freed inside it).
  // Should a captured run ever need otherwise, NULL is the fallback the C API defines: the split
  // variants then run unsplit (correct, only slower).
  size_t ws_bytes = 0;
  c10::DataPtr ws;
  if (fly_scaled_gemm_workspace_size(&ad, &bd, &cd, &ws_bytes) != FLY_SUCCESS) ws_bytes = 0;  // the GEMM says why
  if (ws_bytes > 0) ws = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(ws_bytes);
  const fly_status st = fly_scaled_gemm(&ad, &sad, &bd, &sbd, bias ? &biasd : nullptr, &cd, ws_bytes ? ws.get() : nullptr,
                                        ws_bytes, current_stream(a.device()));
  if (st == FLY_SUCCESS) {
    note_ours(id);
    *out = std::move(c);
    return true;
  }
  TORCH_CHECK(status_means_fallback(st), "flykernels scaled_mm: ", fly_status_string(st), ": ", fly_get_last_error());
  note_fallback(id, fly_get_last_error());
  return false;
}

// The one-element recipe / swizzle of a v2 call, or -1 when the list is not that.
int64_t single(const c10::IValue& v, int64_t if_empty) {
  const auto l = v.toIntList();
  if (l.size() == 0) return if_empty;
  return l.size() == 1 ? l.get(0) : -1;
}

// True when a v2 call is MX as this family reads it: BlockWise1x32 recipes, one E8M0 scale per
// operand, both operands float8_e4m3fn or both float4_e2m1fn_x2 (whatever its other arguments).
bool is_mx_v2(const torch::jit::Stack& s, size_t b0) {
  const at::Tensor& a = s[b0].toTensor();
  const at::Tensor& b = s[b0 + 1].toTensor();
  if (single(s[b0 + 3], -1) != kRecipeBlockWise1x32 || single(s[b0 + 6], -1) != kRecipeBlockWise1x32) return false;
  const auto scale_a = s[b0 + 2].toTensorList(), scale_b = s[b0 + 5].toTensorList();
  if (scale_a.size() != 1 || scale_b.size() != 1) return false;
  if (a.scalar_type() != b.scalar_type()) return false;
  if (a.scalar_type() != at::kFloat8_e4m3fn && a.scalar_type() != at::kFloat4_e2m1fn_x2) return false;
  return scale_a.get(0).scalar_type() == at::kFloat8_e8m0fnu && scale_b.get(0).scalar_type() == at::kFloat8_e8m0fnu;
}

// Upstream's contract for an MX v2 call, in upstream's order (ScaledBlas.cpp, _scaled_mm_cuda_v2):
// use_fast_accum with FP4 operands; one swizzle value per operand (check_swizzle_lengths); each
// scale's element count, then each swizzle (_scaled_mxfp8_mxfp8 / _scaled_mxfp4_mxfp4); contiguous
// scales. All ValueError with upstream's messages. Where upstream wants SWIZZLE_32_4_4 and the padded
// count we also take NO_SWIZZLE with the unpadded one [rows, K/32]; a claim that does not match its
// scales raises what upstream raises for them. Counts are skipped for symbolic shapes.
void check_mx_contract(const torch::jit::Stack& s, size_t b0) {
  const at::Tensor& a = s[b0].toTensor();
  const at::Tensor& b = s[b0 + 1].toTensor();
  const bool fp4 = a.scalar_type() == at::kFloat4_e2m1fn_x2;
  TORCH_CHECK_VALUE(!(fp4 && s[b0 + 11].toBool()),
                    "`use_fast_accum` is not supported when `mat_a` or `mat_b` tensors have the `Float4_e2m1fn_x2` "
                    "dtype.");
  const auto swa = s[b0 + 4].toIntList(), swb = s[b0 + 7].toIntList();
  TORCH_CHECK_VALUE(swa.size() == 1, "swizzle_a must have 1 value, got ", swa.size());
  TORCH_CHECK_VALUE(swb.size() == 1, "swizzle_b must have 1 value, got ", swb.size());
  const at::Tensor sa = s[b0 + 2].toTensorList().get(0), sb = s[b0 + 5].toTensorList().get(0);
  if (a.dim() != 2 || b.dim() != 2 || symbolic(a) || symbolic(b) || symbolic(sa) || symbolic(sb)) return;
  const int64_t kmul = fp4 ? 2 : 1;
  const int64_t kb_a = (kmul * a.size(1) + 31) / 32, kb_b = (kmul * b.size(0) + 31) / 32;
  struct Operand {
    const char* name;
    const at::Tensor& scale;
    int64_t swizzle, padded, unpadded;
  };
  const Operand ops[2] = {{"scale_a", sa, swa.get(0), round_up(a.size(0), 128) * round_up(kb_a, 4), a.size(0) * kb_a},
                          {"scale_b", sb, swb.get(0), round_up(b.size(1), 128) * round_up(kb_b, 4), b.size(1) * kb_b}};
  for (const Operand& o : ops) {
    const int64_t n = o.scale.numel();
    const bool unswizzled = o.swizzle == kSwizzleNone;
    if (n == o.padded || (unswizzled && n == o.unpadded)) continue;
    if (unswizzled)
      TORCH_CHECK_VALUE(false, "For Blockwise scaling ", o.name, " should have ", o.padded, " elements, got: ", n,
                        " (NO_SWIZZLE scales: ", o.unpadded, ")");
    TORCH_CHECK_VALUE(false, "For Blockwise scaling ", o.name, " should have ", o.padded, " elements, got: ", n);
  }
  for (const Operand& o : ops) {
    const bool ok = o.swizzle == kSwizzle32_4_4 || (o.swizzle == kSwizzleNone && o.scale.numel() == o.unpadded);
    TORCH_CHECK_VALUE(ok, o.name, " must be swizzled to SWIZZLE_32_4_4 format");
  }
  TORCH_CHECK_VALUE(sa.is_contiguous() && sb.is_contiguous(), "For Blockwise scaling both scales should be contiguous");
}

// v2's eligibility from its stack (12 arguments from b0; an MX call has met check_mx_contract);
// sets the swizzles it read.
const char* scaled_mm_v2_ineligible(const torch::jit::Stack& s, size_t b0, int64_t* swizzle_a, int64_t* swizzle_b,
                                    bool check_device) {
  const at::Tensor& a = s[b0].toTensor();
  const at::Tensor& b = s[b0 + 1].toTensor();
  const auto scale_a = s[b0 + 2].toTensorList(), scale_b = s[b0 + 5].toTensorList();
  if (single(s[b0 + 3], -1) != kRecipeBlockWise1x32 || single(s[b0 + 6], -1) != kRecipeBlockWise1x32)
    return "scale recipe not BlockWise1x32";
  if (scale_a.size() != 1 || scale_b.size() != 1) return "not one scale tensor per operand";
  *swizzle_a = single(s[b0 + 4], -1);
  *swizzle_b = single(s[b0 + 7], -1);
  if (s[b0 + 10].toIntList().size() != 0) {
    const auto cd = s[b0 + 10].toIntList();
    if (!(cd.size() == 2 && cd.get(0) == 1 && cd.get(1) == 0)) return "contraction_dim not the plain (1, 0)";
  }
  const at::Tensor* bias = s[b0 + 8].isNone() ? nullptr : &s[b0 + 8].toTensor();
  const std::optional<at::ScalarType> od =
      s[b0 + 9].isNone() ? std::nullopt : std::optional<at::ScalarType>(s[b0 + 9].toScalarType());
  return scaled_mm_ineligible(a, b, scale_a.get(0), scale_b.get(0), *swizzle_a, *swizzle_b, bias, od, check_device);
}

// v1: (self, mat2, scale_a, scale_b, bias?, scale_result?, out_dtype?, use_fast_accum); E8M0 scales
// there are cuBLAS's blocked layout.
const char* scaled_mm_v1_ineligible(const torch::jit::Stack& s, size_t b0, bool check_device) {
  if (!s[b0 + 5].isNone()) return "scale_result given";
  // Stock refuses use_fast_accum with FP4 operands: its error, in its order.
  if (s[b0 + 7].toBool() && s[b0].toTensor().scalar_type() == at::kFloat4_e2m1fn_x2)
    return "use_fast_accum with FP4 operands (the stock op's error)";
  const at::Tensor* bias = s[b0 + 4].isNone() ? nullptr : &s[b0 + 4].toTensor();
  const std::optional<at::ScalarType> od =
      s[b0 + 6].isNone() ? std::nullopt : std::optional<at::ScalarType>(s[b0 + 6].toScalarType());
  return scaled_mm_ineligible(s[b0].toTensor(), s[b0 + 1].toTensor(), s[b0 + 2].toTensor(), s[b0 + 3].toTensor(),
                              kSwizzle32_4_4, kSwizzle32_4_4, bias, od, check_device);
}

// CUDA: the calls we take run ours (argument positions per schema: v2's bias 8 and out dtype 9,
// its scales as one-element lists at 2 and 5; v1's scales 2 and 3, bias 4, out dtype 6, always
// the blocked 32_4_4 layout); every other call, or one our library refuses, runs the stock kernel.
// No decision hook: stock PyTorch runs no MX GEMM on sm_90 (ours or an error).
template <bool kV1>
void scaled_mm_cuda_boxed(const Impl& self, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                          torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t n = kV1 ? kScaledMmV1Args : kScaledMmV2Args;
  const size_t b0 = s.size() - n;
  const OpId id = kV1 ? kScaledMmV1 : kScaledMm;
  if (!kV1 && is_mx_v2(s, b0)) check_mx_contract(s, b0);
  int64_t swizzle_a = kSwizzle32_4_4, swizzle_b = kSwizzle32_4_4;
  const char* why =
      kV1 ? scaled_mm_v1_ineligible(s, b0, true) : scaled_mm_v2_ineligible(s, b0, &swizzle_a, &swizzle_b, true);
  if (why == nullptr) {
    const c10::IValue& bias_v = s[b0 + (kV1 ? 4 : 8)];
    const at::Tensor* bias = bias_v.isNone() ? nullptr : &bias_v.toTensor();
    const at::Tensor sa = kV1 ? s[b0 + 2].toTensor() : s[b0 + 2].toTensorList().get(0);
    const at::Tensor sb = kV1 ? s[b0 + 3].toTensor() : s[b0 + 5].toTensorList().get(0);
    at::Tensor c;
    if (scaled_mm_run(id, s[b0].toTensor(), s[b0 + 1].toTensor(), sa, sb, swizzle_a, swizzle_b, bias,
                      s[b0 + (kV1 ? 6 : 9)].toScalarType(), &c)) {
      torch::jit::drop(s, n);
      torch::jit::push(s, std::move(c));
      return;
    }
  } else {
    note_fallback(id, why);
  }
  self.call_prev(op, ks, stack);
}

// Meta (shape inference under FakeTensor / torch.compile): the stock Meta kernels refuse NO_SWIZZLE
// MX scales on CUDA, so for the calls we take the result is a [M, N] tensor of the output dtype;
// MX calls meet the same contract checks as on CUDA (ValueError); every other call gets the stock
// Meta kernel's checks and result.
template <bool kV1>
void scaled_mm_meta_boxed(const Impl& self, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                          torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t n = kV1 ? kScaledMmV1Args : kScaledMmV2Args;
  const size_t b0 = s.size() - n;
  if (!kV1 && is_mx_v2(s, b0)) check_mx_contract(s, b0);
  int64_t swizzle_a = -1, swizzle_b = -1;
  const char* why =
      kV1 ? scaled_mm_v1_ineligible(s, b0, false) : scaled_mm_v2_ineligible(s, b0, &swizzle_a, &swizzle_b, false);
  if (why == nullptr) {
    const at::Tensor& a = s[b0].toTensor();
    const at::ScalarType od = s[b0 + (kV1 ? 6 : 9)].toScalarType();
    at::Tensor c = at::empty_symint({a.sym_size(0), s[b0 + 1].toTensor().sym_size(1)}, a.options().dtype(od));
    torch::jit::drop(s, n);
    torch::jit::push(s, std::move(c));
    return;
  }
  self.call_prev(op, ks, stack);
}

}  // namespace

// '' when our MX GEMM takes an F.scaled_mm call with these operands (swizzle 0: NO_SWIZZLE, 1:
// SWIZZLE_32_4_4; out_dtype None: the call's default), else why not.
std::string explain_scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
                              int64_t swizzle, std::optional<at::Tensor> bias, std::optional<at::ScalarType> out_dtype,
                              bool check_device) {
  const char* why =
      scaled_mm_ineligible(a, b, sa, sb, swizzle, swizzle, bias ? &*bias : nullptr, out_dtype, check_device);
  return why ? why : "";
}

// fly_mx_quantize for the Python side: (q, scales) of x [M, K] (bf16/fp16/fp32, unit inner stride).
std::tuple<at::Tensor, at::Tensor> mx_quantize(const at::Tensor& x, const std::string& format, bool rceil) {
  TORCH_CHECK_VALUE(format == "e4m3" || format == "e2m1", "flykernels mx_quantize: format must be 'e4m3' or 'e2m1', got '",
                    format, "'");
  TORCH_CHECK_VALUE(x.is_cuda(), "flykernels mx_quantize: x must be a CUDA tensor");
  TORCH_CHECK_VALUE(x.dim() == 2, "flykernels mx_quantize: x must be 2-D [M, K], got ", x.dim(), " dimensions");
  TORCH_CHECK_VALUE(is_fly_float(x.scalar_type()), "flykernels mx_quantize: x must be bf16, fp16 or fp32, got ",
                    x.scalar_type());
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK_VALUE(K % 32 == 0, "flykernels mx_quantize: K = ", K, " is not a multiple of 32");
  const bool f4 = format == "e2m1";
  c10::DeviceGuard guard(x.device());
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  at::Tensor q = empty_unfilled({M, f4 ? K / 2 : K}, f4 ? at::kFloat4_e2m1fn_x2 : at::kFloat8_e4m3fn);
  at::Tensor sc = empty_unfilled({M, K / 32}, at::kFloat8_e8m0fnu);
  fly_tensor xd = desc_2d(xc, M, K, M > 1 ? xc.stride(0) : K), qd = desc_2d(q, M, q.size(1), q.size(1)),
             sd = desc_2d(sc, M, K / 32, K / 32);
  const int fmt = (f4 ? FLY_MX_E2M1 : FLY_MX_E4M3) | (rceil ? FLY_MX_SCALE_RCEIL : 0);
  const fly_status st = fly_mx_quantize(&xd, fmt, &qd, &sd, current_stream(x.device()));
  TORCH_CHECK(st == FLY_SUCCESS, "flykernels mx_quantize: ", fly_status_string(st), ": ", fly_get_last_error());
  return {q, sc};
}

std::vector<Override> scaled_mm_overrides() {
  // MX F.scaled_mm (v2) and _scaled_mm with E8M0 scales (v1), CUDA and Meta.
  std::vector<Override> rows(1);
  rows[0].family = "scaled_mm";
  rows[0].file = __FILE__;
  rows[0].impls.push_back(Impl{"aten::_scaled_mm_v2", "", c10::DispatchKey::CUDA, &scaled_mm_cuda_boxed<false>,
                               std::nullopt});
  rows[0].impls.push_back(Impl{"aten::_scaled_mm", "", c10::DispatchKey::CUDA, &scaled_mm_cuda_boxed<true>,
                               std::nullopt});
  rows[0].impls.push_back(Impl{"aten::_scaled_mm_v2", "", c10::DispatchKey::Meta, &scaled_mm_meta_boxed<false>,
                               std::nullopt});
  rows[0].impls.push_back(Impl{"aten::_scaled_mm", "", c10::DispatchKey::Meta, &scaled_mm_meta_boxed<true>,
                               std::nullopt});
  return rows;
}

}  // namespace flyk
