// SPDX-License-Identifier: Apache-2.0
// Cross-entropy with its gradient over logit rows, as PyTorch ops of our own (the loss half of
// flykernels.linear_cross_entropy, python/flykernels/_lce.py):
//   flykernels::cross_entropy_fwd_bwd(Tensor logits, Tensor labels, int ignore_index, float scale)
//       -> (Tensor loss, Tensor lse, Tensor dlogits)
//   flykernels::cross_entropy_fwd_bwd_(Tensor(a!) logits, ...same...) -> (Tensor loss, Tensor lse)
//       the same, the gradient written over the logits (in place: no second [M, V] buffer)
//   flykernels::cross_entropy_loss(Tensor logits, Tensor labels, int ignore_index) -> (Tensor loss, Tensor lse)
// logits [M, V] (FP16/BF16/FP32 on the kernel; any float on the composition), labels [M] integer.
// loss and lse FP32 (FP64 for FP64 logits) [M]; loss = lse - logits[label], 0 and lse 0 for
// ignore_index rows; dlogits = (softmax - onehot(label)) * scale, 0 rows where ignored; a label
// outside [0, V) that is not ignore_index gives a NaN loss and gradient row (never an index).
// CUDA runs fly_cross_entropy_fwd_bwd where it takes the call and the ATen composition otherwise
// (CPU too, with the same rules); Meta gives shapes for torch.compile. The ops are not
// differentiable themselves: they compute a gradient (linear_cross_entropy's autograd.Function
// calls them).
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <limits>

#include "common.hpp"

namespace flyk {
namespace {

void check_ce_args(const at::Tensor& logits, const at::Tensor& labels) {
  TORCH_CHECK(logits.dim() == 2, "flykernels::cross_entropy: logits must be [M, V], got ", logits.sizes());
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == logits.size(0), "flykernels::cross_entropy: labels ",
              labels.sizes(), " is not [", logits.size(0), "]");
  TORCH_CHECK(!at::isFloatingType(labels.scalar_type()) && labels.scalar_type() != at::kBool,
              "flykernels::cross_entropy: labels must be an integer tensor, got ", labels.scalar_type());
  TORCH_CHECK(at::isFloatingType(logits.scalar_type()), "flykernels::cross_entropy: logits must be floating point");
  TORCH_CHECK(logits.size(0) == 0 || logits.size(1) > 0, "flykernels::cross_entropy: V = 0 (no classes)");
}

at::ScalarType ce_acc(const at::Tensor& t) { return at::promote_types(t.scalar_type(), at::kFloat); }

// The composition with the kernel's rules, in FP32 (FP64 for FP64 logits).
std::tuple<at::Tensor, at::Tensor, at::Tensor> ce_composite(const at::Tensor& logits, const at::Tensor& labels,
                                                            int64_t ignore_index, double scale, bool want_grad) {
  const at::ScalarType acc = ce_acc(logits);
  const at::Tensor x = logits.to(acc);
  const int64_t V = logits.size(1);
  const at::Tensor lab = labels.to(at::kLong);
  const at::Tensor ignored = lab.eq(ignore_index);
  const at::Tensor valid = lab.ge(0).logical_and(lab.lt(V)).logical_and(ignored.logical_not());
  const at::Tensor invalid = valid.logical_or(ignored).logical_not();
  const at::Tensor safe = at::where(valid, lab, at::zeros_like(lab));
  // lse as the kernel forms it: max + log(sum(exp(x - max))), so a +Inf logit makes the row NaN as
  // torch's cross_entropy (at::logsumexp would say +Inf there); an all -Inf row gives -Inf.
  at::Tensor lse_all = at::empty({0}, x.options());
  if (logits.size(0)) {
    at::Tensor m = std::get<0>(x.max(1, /*keepdim=*/true));
    m = at::where(m.eq(-std::numeric_limits<double>::infinity()), at::zeros_like(m), m);
    lse_all = (m + at::exp(x - m).sum(1, /*keepdim=*/true).log()).squeeze(1);
  }
  const at::Tensor picked = logits.size(0) ? x.gather(1, safe.unsqueeze(1)).squeeze(1) : at::empty({0}, x.options());
  const at::Tensor zero = at::zeros({}, x.options());
  const at::Tensor nan = at::full({}, std::numeric_limits<double>::quiet_NaN(), x.options());
  const at::Tensor loss = at::where(ignored, zero, at::where(valid, lse_all - picked, nan));
  const at::Tensor lse = at::where(ignored, zero, lse_all);
  if (!want_grad) return {loss, lse, at::Tensor()};
  at::Tensor g = at::exp(x - lse_all.unsqueeze(1));
  if (logits.size(0)) g.scatter_add_(1, safe.unsqueeze(1), valid.to(acc).neg().unsqueeze(1));
  g = g * scale;
  g = at::where(ignored.unsqueeze(1), zero, at::where(invalid.unsqueeze(1), nan, g));
  return {loss, lse, g.to(logits.scalar_type())};
}

// Whether fly_cross_entropy_fwd_bwd can take the call (CUDA, a kernel dtype, labels int64 on the
// same device, unit inner stride); the library checks the rest and may still decline.
bool ce_eligible(const at::Tensor& logits, const at::Tensor& labels) {
  if (!logits.is_cuda() || !is_fly_float(logits.scalar_type()) || device_unsupported(logits.device()) != nullptr)
    return false;
  if (labels.device() != logits.device() || labels.scalar_type() != at::kLong) return false;
  if (logits.size(1) > 1 && logits.stride(1) != 1) return false;
  return logits.size(0) > 0;
}

// Runs the kernel: dlogits `out` (undefined: loss only); false when the library declined.
bool ce_kernel(const at::Tensor& logits, const at::Tensor& labels, int64_t ignore_index, double scale,
               const at::Tensor& out, at::Tensor* loss, at::Tensor* lse, OpId op) {
  c10::DeviceGuard guard(logits.device());
  const int64_t M = logits.size(0);
  const at::Tensor lab = labels.contiguous();
  *loss = at::empty({M}, logits.options().dtype(at::kFloat));
  *lse = at::empty({M}, logits.options().dtype(at::kFloat));
  const fly_tensor tx = row_desc(logits), tl = desc_1d(lab, M), to = desc_1d(*loss, M), ts = desc_1d(*lse, M);
  const fly_tensor td = out.defined() ? row_desc(out) : fly_tensor{};
  const fly_status st = fly_cross_entropy_fwd_bwd(&tx, &tl, ignore_index, scale, &to, &ts,
                                                  out.defined() ? &td : nullptr, current_stream(logits.device()));
  if (st == FLY_SUCCESS) {
    note_ours(op);
    return true;
  }
  TORCH_CHECK(status_means_fallback(st), "flykernels cross_entropy: ", fly_status_string(st), ": ",
              fly_get_last_error());
  note_fallback(op, fly_get_last_error());
  return false;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ce_fwd_bwd_cuda(const at::Tensor& logits, const at::Tensor& labels,
                                                               int64_t ignore_index, double scale) {
  check_ce_args(logits, labels);
  if (ce_eligible(logits, labels)) {
    at::Tensor loss, lse;
    at::Tensor g = at::empty(logits.sizes(), logits.options());
    if (ce_kernel(logits, labels, ignore_index, scale, g, &loss, &lse, kCrossEntropy)) return {loss, lse, g};
  } else {
    note_fallback(kCrossEntropy, "operands the fused kernel does not take (dtype, device, labels or layout)");
  }
  return ce_composite(logits, labels, ignore_index, scale, true);
}

std::tuple<at::Tensor, at::Tensor> ce_fwd_bwd_inplace_cuda(at::Tensor& logits, const at::Tensor& labels,
                                                           int64_t ignore_index, double scale) {
  check_ce_args(logits, labels);
  if (ce_eligible(logits, labels)) {
    at::Tensor loss, lse;
    if (ce_kernel(logits, labels, ignore_index, scale, logits, &loss, &lse, kCrossEntropy)) return {loss, lse};
  } else {
    note_fallback(kCrossEntropy, "operands the fused kernel does not take (dtype, device, labels or layout)");
  }
  auto [loss, lse, g] = ce_composite(logits, labels, ignore_index, scale, true);
  logits.copy_(g);
  return {loss, lse};
}

std::tuple<at::Tensor, at::Tensor> ce_loss_cuda(const at::Tensor& logits, const at::Tensor& labels,
                                                int64_t ignore_index) {
  check_ce_args(logits, labels);
  if (ce_eligible(logits, labels)) {
    at::Tensor loss, lse;
    if (ce_kernel(logits, labels, ignore_index, 1.0, at::Tensor(), &loss, &lse, kCrossEntropyLoss)) return {loss, lse};
  } else {
    note_fallback(kCrossEntropyLoss, "operands the fused kernel does not take (dtype, device, labels or layout)");
  }
  auto [loss, lse, g] = ce_composite(logits, labels, ignore_index, 1.0, false);
  return {loss, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ce_fwd_bwd_cpu(const at::Tensor& logits, const at::Tensor& labels,
                                                              int64_t ignore_index, double scale) {
  check_ce_args(logits, labels);
  return ce_composite(logits, labels, ignore_index, scale, true);
}
std::tuple<at::Tensor, at::Tensor> ce_fwd_bwd_inplace_cpu(at::Tensor& logits, const at::Tensor& labels,
                                                          int64_t ignore_index, double scale) {
  check_ce_args(logits, labels);
  auto [loss, lse, g] = ce_composite(logits, labels, ignore_index, scale, true);
  logits.copy_(g);
  return {loss, lse};
}
std::tuple<at::Tensor, at::Tensor> ce_loss_cpu(const at::Tensor& logits, const at::Tensor& labels,
                                               int64_t ignore_index) {
  check_ce_args(logits, labels);
  auto [loss, lse, g] = ce_composite(logits, labels, ignore_index, 1.0, false);
  return {loss, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ce_fwd_bwd_meta(const at::Tensor& logits, const at::Tensor& labels,
                                                               int64_t ignore_index, double scale) {
  check_ce_args(logits, labels);
  const auto o = logits.options().dtype(ce_acc(logits));
  return {at::empty({logits.size(0)}, o), at::empty({logits.size(0)}, o), at::empty(logits.sizes(), logits.options())};
}
std::tuple<at::Tensor, at::Tensor> ce_fwd_bwd_inplace_meta(at::Tensor& logits, const at::Tensor& labels,
                                                           int64_t ignore_index, double scale) {
  check_ce_args(logits, labels);
  const auto o = logits.options().dtype(ce_acc(logits));
  return {at::empty({logits.size(0)}, o), at::empty({logits.size(0)}, o)};
}
std::tuple<at::Tensor, at::Tensor> ce_loss_meta(const at::Tensor& logits, const at::Tensor& labels,
                                                int64_t ignore_index) {
  check_ce_args(logits, labels);
  const auto o = logits.options().dtype(ce_acc(logits));
  return {at::empty({logits.size(0)}, o), at::empty({logits.size(0)}, o)};
}

}  // namespace
}  // namespace flyk

TORCH_LIBRARY_FRAGMENT(flykernels, m) {
  m.def("cross_entropy_fwd_bwd(Tensor logits, Tensor labels, int ignore_index=-100, float scale=1.0) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("cross_entropy_fwd_bwd_(Tensor(a!) logits, Tensor labels, int ignore_index=-100, float scale=1.0) "
        "-> (Tensor, Tensor)");
  m.def("cross_entropy_loss(Tensor logits, Tensor labels, int ignore_index=-100) -> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(flykernels, CUDA, m) {
  m.impl("cross_entropy_fwd_bwd", &flyk::ce_fwd_bwd_cuda);
  m.impl("cross_entropy_fwd_bwd_", &flyk::ce_fwd_bwd_inplace_cuda);
  m.impl("cross_entropy_loss", &flyk::ce_loss_cuda);
}
TORCH_LIBRARY_IMPL(flykernels, CPU, m) {
  m.impl("cross_entropy_fwd_bwd", &flyk::ce_fwd_bwd_cpu);
  m.impl("cross_entropy_fwd_bwd_", &flyk::ce_fwd_bwd_inplace_cpu);
  m.impl("cross_entropy_loss", &flyk::ce_loss_cpu);
}
TORCH_LIBRARY_IMPL(flykernels, Meta, m) {
  m.impl("cross_entropy_fwd_bwd", &flyk::ce_fwd_bwd_meta);
  m.impl("cross_entropy_fwd_bwd_", &flyk::ce_fwd_bwd_inplace_meta);
  m.impl("cross_entropy_loss", &flyk::ce_loss_meta);
}
