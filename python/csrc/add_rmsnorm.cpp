// SPDX-License-Identifier: Apache-2.0
// RMSNorm with a fused residual add as PyTorch ops of our own (flykernels.patch puts them into
// Hugging Face decoder layers: the post-attention residual add and post_attention_layernorm):
//   flykernels::add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps) -> (Tensor y, Tensor h)
//   flykernels::add_rms_norm_train(...same...) -> (Tensor y, Tensor h, Tensor rstd)
//   flykernels::add_rms_norm_backward(Tensor dy, Tensor? dh, Tensor h, Tensor? weight, Tensor rstd)
//       -> (Tensor dx, Tensor dweight)
// h = x + residual (the new residual stream), y = weight * rmsnorm(h); rstd FP32 (FP64 for FP64
// x) of x's leading shape; dx is the gradient of x and of residual alike; dweight is empty without
// a weight. CUDA
// runs fly_add_rms_norm_fwd / _bwd where they take the call and the unfused ATen composition
// otherwise (CPU too; a weight of another dtype than x, as the composition promotes it); Meta
// gives shapes for torch.compile; Autograd runs the training forward (rstd saved) and the fused
// backward. The composition reads and writes [M, N] five times forward; the fused op three.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "common.hpp"

namespace flyk {
namespace {

void check_add_rms_args(const at::Tensor& x, const at::Tensor& residual, const std::optional<at::Tensor>& weight) {
  TORCH_CHECK(x.dim() >= 1, "flykernels::add_rms_norm: x must have at least one dimension");
  TORCH_CHECK(x.sizes() == residual.sizes(), "flykernels::add_rms_norm: x ", x.sizes(), " and residual ",
              residual.sizes(), " differ in shape");
  TORCH_CHECK(x.scalar_type() == residual.scalar_type(), "flykernels::add_rms_norm: x and residual differ in dtype");
  if (weight.has_value() && weight->defined())
    TORCH_CHECK(weight->dim() == 1 && weight->size(0) == x.size(-1), "flykernels::add_rms_norm: weight ",
                weight->sizes(), " is not [", x.size(-1), "]");
}

bool has(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// A tensor the kernel reads: itself where its rows collapse, else a contiguous copy.
at::Tensor as_rows(const at::Tensor& t) {
  int64_t M, ld;
  return row_view(t, &M, &ld) ? t : t.contiguous();
}

// Whether fly_add_rms_norm_* can take the call (CUDA, one float dtype and device, the weight
// 1-D contiguous of that dtype); the library checks the rest and may still decline.
bool add_norm_eligible(const at::Tensor& lead, std::initializer_list<const at::Tensor*> others,
                       const std::optional<at::Tensor>& weight) {
  if (!lead.is_cuda() || !is_fly_float(lead.scalar_type()) || device_unsupported(lead.device()) != nullptr) return false;
  if (lead.numel() == 0 || lead.size(-1) == 0) return false;
  for (const at::Tensor* t : others)
    if (t->scalar_type() != lead.scalar_type() || t->device() != lead.device()) return false;
  if (has(weight) && (weight->scalar_type() != lead.scalar_type() || weight->device() != lead.device() ||
                      !weight->is_contiguous()))
    return false;
  return true;
}

// The compute dtype of the composition: FP32, FP64 for FP64 inputs (gradcheck).
at::ScalarType acc_type(const at::Tensor& t) { return at::promote_types(t.scalar_type(), at::kFloat); }

// The unfused composition, as Hugging Face's LlamaRMSNorm computes it: the normalized value
// rounded to x's dtype before the weight product (which promotes to the weight's dtype).
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_composite(const at::Tensor& x, const at::Tensor& residual,
                                                                 const std::optional<at::Tensor>& weight, double eps) {
  at::Tensor h = x + residual;
  const at::Tensor hf = h.to(acc_type(h));
  at::Tensor rstd = at::rsqrt(hf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  at::Tensor y = (hf * rstd).to(x.scalar_type());
  if (has(weight)) y = *weight * y;
  return {y, h, rstd.squeeze(-1)};
}

std::tuple<at::Tensor, at::Tensor> add_rms_backward_composite(const at::Tensor& dy, const std::optional<at::Tensor>& dh,
                                                              const at::Tensor& h, const std::optional<at::Tensor>& weight,
                                                              const at::Tensor& rstd) {
  const at::ScalarType acc = acc_type(h);
  const at::Tensor rs = rstd.to(acc).reshape(h.sizes().slice(0, h.dim() - 1)).unsqueeze(-1);
  const at::Tensor hh = h.to(acc) * rs, dyf = dy.to(acc);
  const at::Tensor g = has(weight) ? dyf * weight->to(acc) : dyf;
  const at::Tensor c1 = (g * hh).mean(-1, /*keepdim=*/true);
  at::Tensor dx = rs * (g - hh * c1);
  if (has(dh)) dx = dx + dh->to(acc);
  at::Tensor dw;
  if (has(weight)) dw = (dyf * hh).reshape({-1, h.size(-1)}).sum(0).to(weight->scalar_type());
  else dw = at::empty({0}, h.options());
  return {dx.to(h.scalar_type()), dw};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_cuda_impl(const at::Tensor& x, const at::Tensor& residual,
                                                                 const std::optional<at::Tensor>& weight, double eps,
                                                                 bool want_rstd) {
  check_add_rms_args(x, residual, weight);
  if (add_norm_eligible(x, {&residual}, weight)) {
    c10::DeviceGuard guard(x.device());
    const at::Tensor xr = as_rows(x), rr = as_rows(residual);
    at::Tensor y = at::empty(x.sizes(), x.options()), h = at::empty(x.sizes(), x.options());
    at::Tensor rstd = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(at::kFloat));
    const int64_t N = x.size(-1), M = x.numel() / N;
    const fly_tensor tx = row_desc(xr), tr = row_desc(rr), ty = row_desc(y), th = row_desc(h);
    const fly_tensor tw = has(weight) ? desc_1d(*weight, N) : fly_tensor{};
    const fly_tensor trs = desc_1d(rstd, M);
    const fly_status st = fly_add_rms_norm_fwd(&tx, &tr, has(weight) ? &tw : nullptr, eps, &ty, &th,
                                               want_rstd ? &trs : nullptr, current_stream(x.device()));
    if (st == FLY_SUCCESS) {
      note_ours(kAddRmsNorm);
      return {y, h, rstd};
    }
    TORCH_CHECK(status_means_fallback(st), "flykernels add_rms_norm: ", fly_status_string(st), ": ",
                fly_get_last_error());
    note_fallback(kAddRmsNorm, fly_get_last_error());
  } else {
    note_fallback(kAddRmsNorm, "operands the fused kernel does not take (dtype, device or weight)");
  }
  return add_rms_composite(x, residual, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> add_rms_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                const std::optional<at::Tensor>& weight, double eps) {
  auto [y, h, rstd] = add_rms_cuda_impl(x, residual, weight, eps, false);
  return {y, h};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_train_cuda(const at::Tensor& x, const at::Tensor& residual,
                                                                  const std::optional<at::Tensor>& weight, double eps) {
  return add_rms_cuda_impl(x, residual, weight, eps, true);
}

std::tuple<at::Tensor, at::Tensor> add_rms_backward_cuda(const at::Tensor& dy, const std::optional<at::Tensor>& dh,
                                                         const at::Tensor& h, const std::optional<at::Tensor>& weight,
                                                         const at::Tensor& rstd) {
  const bool ok = add_norm_eligible(dy, {&h}, weight) && (!has(dh) || (dh->scalar_type() == dy.scalar_type() &&
                                                                  dh->device() == dy.device())) &&
            rstd.scalar_type() == at::kFloat && rstd.is_contiguous() && rstd.numel() * h.size(-1) == h.numel();
  if (ok) {
    c10::DeviceGuard guard(dy.device());
    const at::Tensor dyr = as_rows(dy), hr = as_rows(h);
    const at::Tensor dhr = has(dh) ? as_rows(*dh) : at::Tensor();
    at::Tensor dx = at::empty(h.sizes(), h.options());
    at::Tensor dw = has(weight) ? at::empty({h.size(-1)}, weight->options()) : at::empty({0}, h.options());
    const int64_t N = h.size(-1), M = h.numel() / N;
    const fly_tensor tdy = row_desc(dyr), th = row_desc(hr), tdx = row_desc(dx);
    const fly_tensor tdh = has(dh) ? row_desc(dhr) : fly_tensor{};
    const fly_tensor tw = has(weight) ? desc_1d(*weight, N) : fly_tensor{};
    const fly_tensor tdw = has(weight) ? desc_1d(dw, N) : fly_tensor{};
    const fly_tensor trs = desc_1d(rstd, M);
    size_t bytes = 0;
    fly_status st = fly_add_rms_norm_bwd_workspace_size(&th, has(weight) ? &tw : nullptr, &bytes);
    at::Tensor ws;
    if (st == FLY_SUCCESS) {
      if (bytes) ws = at::empty({int64_t(bytes)}, h.options().dtype(at::kByte));
      st = fly_add_rms_norm_bwd(&tdy, has(dh) ? &tdh : nullptr, &th, has(weight) ? &tw : nullptr, &trs, &tdx,
                                has(weight) ? &tdw : nullptr, bytes ? ws.data_ptr() : nullptr, bytes,
                                current_stream(dy.device()));
    }
    if (st == FLY_SUCCESS) {
      note_ours(kAddRmsNormBwd);
      return {dx, dw};
    }
    TORCH_CHECK(status_means_fallback(st), "flykernels add_rms_norm_backward: ", fly_status_string(st), ": ",
                fly_get_last_error());
    note_fallback(kAddRmsNormBwd, fly_get_last_error());
  } else {
    note_fallback(kAddRmsNormBwd, "operands the fused kernel does not take (dtype, device, weight or rstd)");
  }
  return add_rms_backward_composite(dy, dh, h, weight, rstd);
}

std::tuple<at::Tensor, at::Tensor> add_rms_cpu(const at::Tensor& x, const at::Tensor& residual,
                                               const std::optional<at::Tensor>& weight, double eps) {
  check_add_rms_args(x, residual, weight);
  auto [y, h, rstd] = add_rms_composite(x, residual, weight, eps);
  return {y, h};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_train_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                                 const std::optional<at::Tensor>& weight, double eps) {
  check_add_rms_args(x, residual, weight);
  return add_rms_composite(x, residual, weight, eps);
}
std::tuple<at::Tensor, at::Tensor> add_rms_backward_cpu(const at::Tensor& dy, const std::optional<at::Tensor>& dh,
                                                        const at::Tensor& h, const std::optional<at::Tensor>& weight,
                                                        const at::Tensor& rstd) {
  return add_rms_backward_composite(dy, dh, h, weight, rstd);
}

at::ScalarType y_dtype(const at::Tensor& x, const std::optional<at::Tensor>& weight) {
  return has(weight) ? at::promote_types(weight->scalar_type(), x.scalar_type()) : x.scalar_type();
}
std::tuple<at::Tensor, at::Tensor> add_rms_meta(const at::Tensor& x, const at::Tensor& residual,
                                                const std::optional<at::Tensor>& weight, double eps) {
  check_add_rms_args(x, residual, weight);
  return {at::empty(x.sizes(), x.options().dtype(y_dtype(x, weight))), at::empty(x.sizes(), x.options())};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_train_meta(const at::Tensor& x, const at::Tensor& residual,
                                                                  const std::optional<at::Tensor>& weight, double eps) {
  check_add_rms_args(x, residual, weight);
  return {at::empty(x.sizes(), x.options().dtype(y_dtype(x, weight))), at::empty(x.sizes(), x.options()),
          at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(acc_type(x)))};
}
std::tuple<at::Tensor, at::Tensor> add_rms_backward_meta(const at::Tensor& dy, const std::optional<at::Tensor>& dh,
                                                         const at::Tensor& h, const std::optional<at::Tensor>& weight,
                                                         const at::Tensor& rstd) {
  return {at::empty(h.sizes(), h.options()),
          has(weight) ? at::empty({h.size(-1)}, weight->options()) : at::empty({0}, h.options())};
}

using AddRmsTrainFn = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                     const std::optional<at::Tensor>&, double);
using AddRmsFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const std::optional<at::Tensor>&, double);
using AddRmsBwdFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const std::optional<at::Tensor>&,
                                                       const at::Tensor&, const std::optional<at::Tensor>&,
                                                       const at::Tensor&);

class AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor& residual, const std::optional<at::Tensor>& weight,
                                                double eps) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("flykernels::add_rms_norm_train", "").typed<AddRmsTrainFn>();
    auto [y, h, rstd] = op.call(x, residual, weight, eps);
    ctx->save_for_backward({h, has(weight) ? *weight : at::Tensor(), rstd});
    ctx->saved_data["has_w"] = has(weight);
    return {y, h};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool has_w = ctx->saved_data["has_w"].toBool();
    at::Tensor dy = grads[0], dh = grads[1];
    if (!dy.defined() && !dh.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    if (!dy.defined()) dy = at::zeros_like(saved[0]);  // only h reached the loss
    static auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("flykernels::add_rms_norm_backward", "").typed<AddRmsBwdFn>();
    const std::optional<at::Tensor> w = has_w ? std::optional<at::Tensor>(saved[1]) : std::nullopt;
    const std::optional<at::Tensor> dho = dh.defined() ? std::optional<at::Tensor>(dh) : std::nullopt;
    auto [dx, dw] = op.call(dy, dho, saved[0], w, saved[2]);
    // x and residual get the same gradient (h = x + residual); the engine copies before it adds in place.
    return {dx, dx, has_w ? dw : at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> add_rms_autograd(const at::Tensor& x, const at::Tensor& residual,
                                                    const std::optional<at::Tensor>& weight, double eps) {
  const bool grad = at::GradMode::is_enabled() &&
                    (x.requires_grad() || residual.requires_grad() || (has(weight) && weight->requires_grad()));
  // A weight of another dtype, which the composition promotes: differentiated by autograd.
  if (grad && has(weight) && weight->scalar_type() != x.scalar_type()) {
    check_add_rms_args(x, residual, weight);
    auto [y, h, rstd] = add_rms_composite(x, residual, weight, eps);
    return {y, h};
  }
  if (!grad) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("flykernels::add_rms_norm", "").typed<AddRmsFn>();
    return op.call(x, residual, weight, eps);
  }
  auto out = AddRmsNormFunction::apply(x, residual, weight, eps);
  return {out[0], out[1]};
}

}  // namespace
}  // namespace flyk

TORCH_LIBRARY_FRAGMENT(flykernels, m) {
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor? weight, float eps) -> (Tensor, Tensor)");
  m.def("add_rms_norm_train(Tensor x, Tensor residual, Tensor? weight, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("add_rms_norm_backward(Tensor dy, Tensor? dh, Tensor h, Tensor? weight, Tensor rstd) -> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(flykernels, CUDA, m) {
  m.impl("add_rms_norm", &flyk::add_rms_cuda);
  m.impl("add_rms_norm_train", &flyk::add_rms_train_cuda);
  m.impl("add_rms_norm_backward", &flyk::add_rms_backward_cuda);
}
TORCH_LIBRARY_IMPL(flykernels, CPU, m) {
  m.impl("add_rms_norm", &flyk::add_rms_cpu);
  m.impl("add_rms_norm_train", &flyk::add_rms_train_cpu);
  m.impl("add_rms_norm_backward", &flyk::add_rms_backward_cpu);
}
TORCH_LIBRARY_IMPL(flykernels, Meta, m) {
  m.impl("add_rms_norm", &flyk::add_rms_meta);
  m.impl("add_rms_norm_train", &flyk::add_rms_train_meta);
  m.impl("add_rms_norm_backward", &flyk::add_rms_backward_meta);
}
TORCH_LIBRARY_IMPL(flykernels, Autograd, m) { m.impl("add_rms_norm", &flyk::add_rms_autograd); }
