// SPDX-License-Identifier: Apache-2.0
// RMSNorm: aten::_fused_rms_norm(input, normalized_shape, weight?, eps?) -> (output, rstd) on CUDA,
// through fly_rms_norm_fwd. PyTorch's backward (_fused_rms_norm_backward) runs on our rstd.
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

#include "common.hpp"
#include "decisions.hpp"
#include "families.hpp"
#include "overrides.hpp"

namespace flyk {
namespace {

// nullptr when ours takes the call (as far as torch's side can tell: the library may still decline
// it, e.g. rows of 2^31 elements), else a static reason. check_device=false skips the device
// checks, so the logic is testable on CPU tensors.
const char* rms_norm_ineligible(const at::Tensor& x, c10::ArrayRef<int64_t> normalized_shape, const at::Tensor* weight,
                                std::optional<double> eps, bool check_device) {
  if (check_device && !x.is_cuda()) return "input is not a CUDA tensor";
  if (!is_fly_float(x.scalar_type())) return "dtype not covered (fp16, bf16, fp32)";
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  if (nd == 0 || nd > x.dim()) return "normalized_shape does not match the input";
  for (int64_t i = 0; i < nd; ++i)
    if (x.size(x.dim() - nd + i) != normalized_shape[i]) return "normalized_shape does not match the input";
  if (x.numel() == 0) return "empty input";
  if (!x.is_contiguous()) return "input is not contiguous";  // viewed as [M, N] rows
  // The library refuses these as well (INVALID_ARGUMENT); kept so explain_rms_norm names them on CPU.
  if (eps.has_value() && !(std::isfinite(*eps) && *eps >= 0)) return "eps negative or not finite";
  if (weight != nullptr && weight->defined()) {
    if (weight->scalar_type() != x.scalar_type()) return "weight dtype differs from the input's";
    if (weight->sizes() != normalized_shape) return "weight shape differs from normalized_shape";
    if (!weight->is_contiguous()) return "weight is not contiguous";  // described as a unit-stride vector
    if (check_device && weight->device() != x.device()) return "weight on another device";
  }
  if (check_device) return device_unsupported(x.device());
  return nullptr;
}

// The decision key (decisions.hpp): dtype of x; "w" | "nw"; N, M.
DecisionKey rms_norm_key(const at::Tensor& x, c10::ArrayRef<int64_t> normalized_shape, bool has_w) {
  int64_t N = 1;
  for (int64_t v : normalized_shape) N *= v;
  DecisionKey key;
  key.op = "rms_norm";
  key.dtype = dtype_key(x.scalar_type());
  key.layout = has_w ? "w" : "nw";
  key.k[0] = N;
  key.k[1] = N > 0 ? x.numel() / N : 0;
  return key;
}

// Runs our forward; returns false (nothing written) when the library declines.
bool rms_norm_run(const at::Tensor& x, c10::ArrayRef<int64_t> normalized_shape, const at::Tensor* weight,
                  std::optional<double> eps, at::Tensor& y, at::Tensor& rstd, std::string& why) {
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  int64_t N = 1;
  for (int64_t v : normalized_shape) N *= v;
  const int64_t M = x.numel() / N;
  c10::DeviceGuard guard(x.device());
  y = empty_unfilled(x.sizes(), x.scalar_type());
  std::vector<int64_t> stat_shape(x.sizes().begin(), x.sizes().end());
  for (int64_t i = x.dim() - nd; i < x.dim(); ++i) stat_shape[i] = 1;
  rstd = empty_unfilled(stat_shape, at::kFloat);
  fly_tensor xd = desc_2d(x, M, N, N), yd = desc_2d(y, M, N, N), rd = desc_1d(rstd, M);
  fly_tensor wd{};
  const bool has_w = weight != nullptr && weight->defined();
  if (has_w) wd = desc_1d(*weight, N);
  // PyTorch's default eps is the epsilon of the accumulation type (fp32 here).
  const double eps_val = eps.value_or(static_cast<double>(std::numeric_limits<float>::epsilon()));
  fly_status st = fly_rms_norm_fwd(&xd, has_w ? &wd : nullptr, eps_val, &yd, &rd, current_stream(x.device()));
  if (st == FLY_SUCCESS) return true;
  if (status_means_fallback(st)) {
    why = fly_get_last_error();
    return false;
  }
  TORCH_CHECK(false, "flykernels rms_norm: ", fly_status_string(st), ": ", fly_get_last_error());
}

void rms_norm_boxed(const Impl& self, const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t n = s.size();
  const at::Tensor& x = s[n - 4].toTensor();
  const std::vector<int64_t> normalized_shape = s[n - 3].toIntVector();
  const at::Tensor* weight = s[n - 2].isNone() ? nullptr : &s[n - 2].toTensor();
  const std::optional<double> eps = opt_double(s[n - 1]);
  const char* why = rms_norm_ineligible(x, normalized_shape, weight, eps, true);
  if (why == nullptr) {
    const DecisionKey key = rms_norm_key(x, normalized_shape, weight != nullptr && weight->defined());
    if (!take_ours(key, [&] { return timing_call("aten::_fused_rms_norm", "", *stack, 4); })) {
      note_fallback(kRmsNorm, "decision: stock");
      return self.call_prev(op, ks, stack);
    }
    at::Tensor y, rstd;
    std::string lib_why;
    if (rms_norm_run(x, normalized_shape, weight, eps, y, rstd, lib_why)) {
      note_ours(kRmsNorm);
      torch::jit::drop(s, 4);
      torch::jit::push(s, std::move(y), std::move(rstd));
      return;
    }
    note_fallback(kRmsNorm, lib_why.c_str());
  } else {
    note_fallback(kRmsNorm, why);
  }
  self.call_prev(op, ks, stack);
}

}  // namespace

std::string explain_rms_norm(const at::Tensor& x, std::vector<int64_t> normalized_shape,
                             std::optional<at::Tensor> weight, std::optional<double> eps, bool check_device) {
  const char* why = rms_norm_ineligible(x, normalized_shape, weight ? &*weight : nullptr, eps, check_device);
  return why ? why : "";
}

std::optional<DecisionKey> key_rms_norm(const at::Tensor& x, std::vector<int64_t> normalized_shape,
                                        std::optional<at::Tensor> weight, std::optional<double> eps,
                                        bool check_device) {
  const at::Tensor* w = weight ? &*weight : nullptr;
  if (rms_norm_ineligible(x, normalized_shape, w, eps, check_device) != nullptr) return std::nullopt;
  return rms_norm_key(x, normalized_shape, w != nullptr && w->defined());
}

std::vector<Override> rmsnorm_overrides() {
  std::vector<Override> rows(1);
  rows[0].family = "rms_norm";
  rows[0].file = __FILE__;
  rows[0].impls.push_back(Impl{"aten::_fused_rms_norm", "", c10::DispatchKey::CUDA, &rms_norm_boxed, std::nullopt});
  return rows;
}

}  // namespace flyk
