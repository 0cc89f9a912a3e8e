// SPDX-License-Identifier: Apache-2.0
// Rotary position embeddings as PyTorch ops of our own (flykernels.patch puts them into Hugging
// Face attention):
//   flykernels::rope(Tensor q, Tensor k, Tensor cos, Tensor sin, int rotary_dim) -> (Tensor, Tensor)
//   flykernels::rope_backward(Tensor dq_out, Tensor dk_out, Tensor cos, Tensor sin, int rotary_dim)
//       -> (Tensor, Tensor)
// q [B, Hq, S, D], k [B, Hk, S, D] (any strides, unit stride in D), cos and sin [B or 1, S, W] with
// W = rotary_dim (an angle per column) or rotary_dim / 2 (one per pair); the rotate-half layout,
// columns [rotary_dim, D) unchanged (fly_rope_fwd). CUDA runs fly_rope_fwd / fly_rope_bwd where
// they take the call and the ATen composition otherwise (CPU too); Meta gives shapes for
// torch.compile; Autograd differentiates q and k through rope_backward (the tables are constants
// of the model: where cos or sin requires grad, the composition runs under autograd instead).
// The composition reads and writes each of q and k five times; the fused op once.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "common.hpp"

namespace flyk {
namespace {

void check_rope_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                     int64_t rot) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, "flykernels::rope: q and k must be [B, H, S, D], got ", q.sizes(),
              " and ", k.sizes());
  TORCH_CHECK(cos.dim() == 3 && sin.dim() == 3 && cos.sizes() == sin.sizes(),
              "flykernels::rope: cos and sin must be [B or 1, S, W] of one shape, got ", cos.sizes(), " and ",
              sin.sizes());
  const int64_t D = q.size(3);
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2) && k.size(3) == D,
              "flykernels::rope: q ", q.sizes(), " and k ", k.sizes(), " differ in batch, sequence or head dim");
  TORCH_CHECK(rot > 0 && rot % 2 == 0 && rot <= D, "flykernels::rope: rotary_dim must be even, positive and at most ",
              D, ", got ", rot);
  const int64_t W = cos.size(2);
  TORCH_CHECK(W == rot || 2 * W == rot, "flykernels::rope: cos and sin have width ", W, ", neither rotary_dim (", rot,
              ") nor half of it");
  TORCH_CHECK((cos.size(0) == q.size(0) || cos.size(0) == 1) && cos.size(1) == q.size(2),
              "flykernels::rope: cos and sin ", cos.sizes(), " do not match q's batch and sequence ", q.sizes());
}

// The tables as [B or 1, 1, S, R]: per column (a table of width R/2 repeated for both halves).
std::pair<at::Tensor, at::Tensor> full_tables(const at::Tensor& cos, const at::Tensor& sin, int64_t rot) {
  at::Tensor c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  if (cos.size(2) * 2 == rot && cos.size(2) != rot) c = at::cat({c, c}, -1), s = at::cat({s, s}, -1);
  return {c, s};
}

// x [.., D] rotated in its first `rot` columns: x c + rotate_half(x) s (bwd: the adjoint,
// x c + rotate_half^T(x s)), in x's dtype as the unfused Hugging Face code computes it.
at::Tensor rope_composite_one(const at::Tensor& x, const at::Tensor& c, const at::Tensor& s, int64_t rot, bool bwd) {
  const int64_t D = x.size(-1), h = rot / 2;
  const at::Tensor xr = rot == D ? x : x.narrow(-1, 0, rot);
  at::Tensor out;
  if (!bwd) {
    const at::Tensor rh = at::cat({-xr.narrow(-1, h, h), xr.narrow(-1, 0, h)}, -1);
    out = xr * c + rh * s;
  } else {
    const at::Tensor z = xr * s;
    out = xr * c + at::cat({z.narrow(-1, h, h), -z.narrow(-1, 0, h)}, -1);
  }
  return rot == D ? out : at::cat({out, x.narrow(-1, rot, D - rot)}, -1);
}

std::tuple<at::Tensor, at::Tensor> rope_composite(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                  const at::Tensor& sin, int64_t rot, bool bwd) {
  auto [c, s] = full_tables(cos, sin, rot);
  return {rope_composite_one(q, c, s, rot, bwd), rope_composite_one(k, c, s, rot, bwd)};
}

bool eligible(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  if (!q.is_cuda() || !is_fly_float(q.scalar_type()) || device_unsupported(q.device()) != nullptr) return false;
  for (const at::Tensor* t : {&k, &cos, &sin})
    if (t->scalar_type() != q.scalar_type() || t->device() != q.device()) return false;
  return true;
}

std::tuple<at::Tensor, at::Tensor> rope_cuda_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                  const at::Tensor& sin, int64_t rot, bool bwd) {
  check_rope_args(q, k, cos, sin, rot);
  const OpId id = bwd ? kRopeBwd : kRope;
  if (eligible(q, k, cos, sin)) {
    c10::DeviceGuard guard(q.device());
    // The outputs in the inputs' layout (Hugging Face's q is a transposed [B, S, H, D] buffer).
    at::Tensor qo = at::empty_like(q), ko = at::empty_like(k);
    const fly_tensor tq = desc_nd(q), tk = desc_nd(k), tc = desc_nd(cos), ts = desc_nd(sin);
    const fly_tensor tqo = desc_nd(qo), tko = desc_nd(ko);
    const fly_status st = bwd ? fly_rope_bwd(&tq, &tk, &tc, &ts, int(rot), &tqo, &tko, current_stream(q.device()))
                              : fly_rope_fwd(&tq, &tk, &tc, &ts, int(rot), &tqo, &tko, current_stream(q.device()));
    if (st == FLY_SUCCESS) {
      note_ours(id);
      return {qo, ko};
    }
    TORCH_CHECK(status_means_fallback(st), "flykernels rope: ", fly_status_string(st), ": ", fly_get_last_error());
    note_fallback(id, fly_get_last_error());
  } else {
    note_fallback(id, "operands the fused kernel does not take (dtype or device)");
  }
  return rope_composite(q, k, cos, sin, rot, bwd);
}

std::tuple<at::Tensor, at::Tensor> rope_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                             const at::Tensor& sin, int64_t rot) {
  return rope_cuda_impl(q, k, cos, sin, rot, false);
}
std::tuple<at::Tensor, at::Tensor> rope_backward_cuda(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& cos,
                                                      const at::Tensor& sin, int64_t rot) {
  return rope_cuda_impl(dq, dk, cos, sin, rot, true);
}
std::tuple<at::Tensor, at::Tensor> rope_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                            const at::Tensor& sin, int64_t rot) {
  check_rope_args(q, k, cos, sin, rot);
  return rope_composite(q, k, cos, sin, rot, false);
}
std::tuple<at::Tensor, at::Tensor> rope_backward_cpu(const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& cos,
                                                     const at::Tensor& sin, int64_t rot) {
  check_rope_args(dq, dk, cos, sin, rot);
  return rope_composite(dq, dk, cos, sin, rot, true);
}
std::tuple<at::Tensor, at::Tensor> rope_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                             const at::Tensor& sin, int64_t rot) {
  check_rope_args(q, k, cos, sin, rot);
  return {at::empty_like(q), at::empty_like(k)};
}

using RopeFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                  const at::Tensor&, int64_t);

class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                                                int64_t rot) {
    ctx->save_for_backward({cos, sin});  // the backward needs the tables only, not q or k
    ctx->saved_data["rot"] = rot;
    ctx->saved_data["q_shape"] = q.sizes().vec();
    ctx->saved_data["k_shape"] = k.sizes().vec();
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("flykernels::rope", "").typed<RopeFn>();
    auto [qo, ko] = op.call(q, k, cos, sin, rot);
    return {qo, ko};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t rot = ctx->saved_data["rot"].toInt();
    if (!grads[0].defined() && !grads[1].defined())
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("flykernels::rope_backward", "").typed<RopeFn>();
    // An output that did not reach the loss has no gradient: zeros of its shape.
    at::Tensor dq_out = grads[0], dk_out = grads[1];
    if (!dq_out.defined()) dq_out = at::zeros(ctx->saved_data["q_shape"].toIntVector(), dk_out.options());
    if (!dk_out.defined()) dk_out = at::zeros(ctx->saved_data["k_shape"].toIntVector(), dq_out.options());
    auto [dq, dk] = op.call(dq_out, dk_out, saved[0], saved[1], rot);
    return {dq, dk, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> rope_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                 const at::Tensor& sin, int64_t rot) {
  if (cos.requires_grad() || sin.requires_grad()) {  // gradients of the tables: the composition, differentiated
    check_rope_args(q, k, cos, sin, rot);
    return rope_composite(q, k, cos, sin, rot, false);
  }
  auto out = RopeFunction::apply(q, k, cos, sin, rot);
  return {out[0], out[1]};
}

}  // namespace
}  // namespace flyk

TORCH_LIBRARY_FRAGMENT(flykernels, m) {
  m.def("rope(Tensor q, Tensor k, Tensor cos, Tensor sin, int rotary_dim) -> (Tensor, Tensor)");
  m.def("rope_backward(Tensor dq_out, Tensor dk_out, Tensor cos, Tensor sin, int rotary_dim) -> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(flykernels, CUDA, m) {
  m.impl("rope", &flyk::rope_cuda);
  m.impl("rope_backward", &flyk::rope_backward_cuda);
}
TORCH_LIBRARY_IMPL(flykernels, CPU, m) {
  m.impl("rope", &flyk::rope_cpu);
  m.impl("rope_backward", &flyk::rope_backward_cpu);
}
TORCH_LIBRARY_IMPL(flykernels, Meta, m) {
  m.impl("rope", &flyk::rope_meta);
  m.impl("rope_backward", &flyk::rope_meta);
}
TORCH_LIBRARY_IMPL(flykernels, Autograd, m) { m.impl("rope", &flyk::rope_autograd); }
