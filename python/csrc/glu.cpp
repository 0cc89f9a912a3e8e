// SPDX-License-Identifier: Apache-2.0
// Gated linear units as PyTorch ops of our own (flykernels.patch puts them into Hugging Face MLPs):
//   flykernels::glu(Tensor gate, Tensor up, int act) -> Tensor              act(gate) * up
//   flykernels::glu_backward(Tensor dout, Tensor gate, Tensor up, int act) -> (Tensor, Tensor)
// act: 0 SiLU, 1 GELU (tanh approximation), 2 GELU (erf), as fly_glu_activation. CUDA runs
// fly_glu_fwd / fly_glu_bwd where they take the call and the unfused ATen composition otherwise
// (CPU too); Meta gives shapes for torch.compile; Autograd differentiates through glu_backward.
// There is no stock fused op to decide against: the composition moves 5 tensors' bytes where
// the fused op moves 3 (forward), so the fused op runs wherever the library takes the call.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "common.hpp"

namespace flyk {
namespace {

at::Tensor act_of(const at::Tensor& g, int64_t act) {
  if (act == FLY_GLU_SILU) return at::silu(g);
  return at::gelu(g, act == FLY_GLU_GELU_TANH ? "tanh" : "none");
}

void check_act(int64_t act) {
  TORCH_CHECK(act == FLY_GLU_SILU || act == FLY_GLU_GELU_TANH || act == FLY_GLU_GELU,
              "flykernels::glu: act must be 0 (silu), 1 (gelu tanh) or 2 (gelu), got ", act);
}

// Whether fly_glu_* can take these operands (same shape, dtype and CUDA device, rows of one
// stride); the library checks the rest and may still decline.
bool eligible(std::initializer_list<const at::Tensor*> ts) {
  const at::Tensor& g = **ts.begin();
  if (!g.is_cuda() || !is_fly_float(g.scalar_type()) || device_unsupported(g.device()) != nullptr) return false;
  for (const at::Tensor* t : ts) {
    if (t->scalar_type() != g.scalar_type() || t->sizes() != g.sizes() || t->device() != g.device()) return false;
    int64_t M, ld;
    if (!row_view(*t, &M, &ld)) return false;
  }
  return true;
}

at::Tensor glu_cuda(const at::Tensor& gate, const at::Tensor& up, int64_t act) {
  check_act(act);
  if (eligible({&gate, &up})) {
    c10::DeviceGuard guard(gate.device());
    at::Tensor out = at::empty(gate.sizes(), gate.options());
    const fly_tensor g = row_desc(gate), u = row_desc(up), o = row_desc(out);
    const fly_status st = fly_glu_fwd(&g, &u, int(act), &o, current_stream(gate.device()));
    if (st == FLY_SUCCESS) {
      note_ours(kGlu);
      return out;
    }
    TORCH_CHECK(status_means_fallback(st), "flykernels glu: ", fly_status_string(st), ": ", fly_get_last_error());
    note_fallback(kGlu, fly_get_last_error());
  } else {
    note_fallback(kGlu, "operands the fused kernel does not take (dtype, device, shapes or strides)");
  }
  return act_of(gate, act) * up;
}

std::tuple<at::Tensor, at::Tensor> glu_backward_composite(const at::Tensor& dout, const at::Tensor& gate,
                                                          const at::Tensor& up, int64_t act) {
  at::Tensor dup = dout * act_of(gate, act);
  at::Tensor dact = dout * up;
  at::Tensor dgate = act == FLY_GLU_SILU ? at::silu_backward(dact, gate)
                                          : at::gelu_backward(dact, gate, act == FLY_GLU_GELU_TANH ? "tanh" : "none");
  return {dgate, dup};
}

std::tuple<at::Tensor, at::Tensor> glu_backward_cuda(const at::Tensor& dout, const at::Tensor& gate,
                                                     const at::Tensor& up, int64_t act) {
  check_act(act);
  if (eligible({&gate, &up, &dout})) {
    c10::DeviceGuard guard(gate.device());
    at::Tensor dgate = at::empty(gate.sizes(), gate.options()), dup = at::empty(up.sizes(), up.options());
    const fly_tensor d = row_desc(dout), g = row_desc(gate), u = row_desc(up);
    const fly_tensor dg = row_desc(dgate), du = row_desc(dup);
    const fly_status st = fly_glu_bwd(&d, &g, &u, int(act), &dg, &du, current_stream(gate.device()));
    if (st == FLY_SUCCESS) {
      note_ours(kGluBwd);
      return {dgate, dup};
    }
    TORCH_CHECK(status_means_fallback(st), "flykernels glu_backward: ", fly_status_string(st), ": ",
                fly_get_last_error());
    note_fallback(kGluBwd, fly_get_last_error());
  } else {
    note_fallback(kGluBwd, "operands the fused kernel does not take (dtype, device, shapes or strides)");
  }
  return glu_backward_composite(dout, gate, up, act);
}

at::Tensor glu_cpu(const at::Tensor& gate, const at::Tensor& up, int64_t act) {
  check_act(act);
  return act_of(gate, act) * up;
}
std::tuple<at::Tensor, at::Tensor> glu_backward_cpu(const at::Tensor& dout, const at::Tensor& gate,
                                                    const at::Tensor& up, int64_t act) {
  check_act(act);
  return glu_backward_composite(dout, gate, up, act);
}

at::Tensor glu_meta(const at::Tensor& gate, const at::Tensor& up, int64_t act) {
  check_act(act);
  TORCH_CHECK(gate.sizes() == up.sizes(), "flykernels::glu: gate ", gate.sizes(), " and up ", up.sizes(),
              " differ in shape");
  TORCH_CHECK(gate.scalar_type() == up.scalar_type(), "flykernels::glu: gate and up differ in dtype");
  return at::empty(gate.sizes(), gate.options());
}
std::tuple<at::Tensor, at::Tensor> glu_backward_meta(const at::Tensor& dout, const at::Tensor& gate,
                                                     const at::Tensor& up, int64_t act) {
  check_act(act);
  return {at::empty(gate.sizes(), gate.options()), at::empty(up.sizes(), up.options())};
}

class GluFunction : public torch::autograd::Function<GluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            int64_t act) {
    ctx->save_for_backward({gate, up});
    ctx->saved_data["act"] = act;
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("flykernels::glu", "").typed<decltype(glu_cpu)>();
    return op.call(gate, up, act);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    const int64_t act = ctx->saved_data["act"].toInt();
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("flykernels::glu_backward", "")
                         .typed<decltype(glu_backward_cpu)>();
    auto [dgate, dup] = op.call(grads[0].contiguous(), saved[0], saved[1], act);
    return {dgate, dup, at::Tensor()};
  }
};

at::Tensor glu_autograd(const at::Tensor& gate, const at::Tensor& up, int64_t act) {
  return GluFunction::apply(gate, up, act);
}

}  // namespace
}  // namespace flyk

TORCH_LIBRARY(flykernels, m) {
  m.def("glu(Tensor gate, Tensor up, int act) -> Tensor");
  m.def("glu_backward(Tensor dout, Tensor gate, Tensor up, int act) -> (Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(flykernels, CUDA, m) {
  m.impl("glu", &flyk::glu_cuda);
  m.impl("glu_backward", &flyk::glu_backward_cuda);
}
TORCH_LIBRARY_IMPL(flykernels, CPU, m) {
  m.impl("glu", &flyk::glu_cpu);
  m.impl("glu_backward", &flyk::glu_backward_cpu);
}
TORCH_LIBRARY_IMPL(flykernels, Meta, m) {
  m.impl("glu", &flyk::glu_meta);
  m.impl("glu_backward", &flyk::glu_backward_meta);
}
TORCH_LIBRARY_IMPL(flykernels, Autograd, m) { m.impl("glu", &flyk::glu_autograd); }
