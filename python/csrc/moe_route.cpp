// SPDX-License-Identifier: Apache-2.0
// Mixture-of-experts routing as PyTorch ops of our own (flykernels.patch puts them into Hugging
// Face's sparse-MoE blocks; docs/moe_route.md):
//   flykernels::moe_route(Tensor logits, int k, int score, int flags, ScalarType? weight_dtype)
//       -> (Tensor weights, Tensor ids)                       router: scores, top-k, renorm
//   flykernels::moe_permute(Tensor x, Tensor ids, int num_experts)
//       -> (Tensor x_perm, Tensor offsets, Tensor row_of, Tensor pair_of)
//   flykernels::moe_unpermute(Tensor out_perm, Tensor weights, Tensor row_of, Tensor offsets) -> Tensor
// and their backward ops (moe_route_backward, moe_permute_backward, moe_unpermute_backward).
// score: 0 softmax, 1 sigmoid; flags: 1 renormalize, 2 top-k first (fly_moe_route_flags). ids are
// int64 (torch.topk's), row_of / pair_of / offsets int32 (offsets is F.grouped_mm's `offs`).
// CUDA runs fly_moe_* where they take the call and an ATen composition otherwise (CPU too: the
// same results, ties to the lower expert id through a stable sort); Meta gives shapes for
// torch.compile (every output's size is static: no host sync); Autograd differentiates logits,
// x, out_perm and weights through the backward ops.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "common.hpp"

namespace flyk {
namespace moe {

void check_route(const at::Tensor& logits, int64_t k, int64_t score, int64_t flags) {
  TORCH_CHECK(logits.dim() == 2, "flykernels::moe_route: logits must be [T, E], got ", logits.sizes());
  TORCH_CHECK(k >= 1 && k <= logits.size(1), "flykernels::moe_route: k = ", k, " outside 1..E (E = ", logits.size(1),
              ")");
  TORCH_CHECK(score == FLY_MOE_SOFTMAX || score == FLY_MOE_SIGMOID,
              "flykernels::moe_route: score must be 0 (softmax) or 1 (sigmoid), got ", score);
  TORCH_CHECK((flags & ~int64_t(FLY_MOE_RENORMALIZE | FLY_MOE_TOPK_FIRST)) == 0,
              "flykernels::moe_route: flags must be a combination of 1 (renormalize) and 2 (top-k first), got ", flags);
}

at::ScalarType weight_type(const std::optional<at::ScalarType>& wd) { return wd.value_or(at::kFloat); }

// A 2-D tensor the kernels read as rows: unit inner stride.
bool rows_ok(const at::Tensor& t) { return t.dim() == 2 && (t.size(1) <= 1 || t.stride(1) == 1); }
int64_t ld(const at::Tensor& t) { return t.size(0) > 1 ? t.stride(0) : t.size(1); }
fly_tensor d2(const at::Tensor& t) { return desc_2d(t, t.size(0), t.size(1), ld(t)); }

bool on_our_device(const at::Tensor& t) {
  return t.is_cuda() && device_unsupported(t.device()) == nullptr && !symbolic(t);
}

// ---- compositions (CPU, and CUDA where the library declines) ---------------------------------
// Math in FP32 at least (FP64 stays FP64: gradcheck runs the compositions in double).
at::ScalarType acc(const at::Tensor& t) { return at::promote_types(t.scalar_type(), at::kFloat); }

std::tuple<at::Tensor, at::Tensor> route_composite(const at::Tensor& logits, int64_t k, int64_t score, int64_t flags,
                                                   at::ScalarType wt) {
  const at::Tensor l = logits.to(acc(logits));
  at::Tensor w, ids;
  if (flags & FLY_MOE_TOPK_FIRST) {
    auto [v, i] = at::sort(l, /*stable=*/true, -1, /*descending=*/true);
    ids = i.narrow(-1, 0, k);
    v = v.narrow(-1, 0, k);
    w = score == FLY_MOE_SOFTMAX ? at::softmax(v, -1) : at::sigmoid(v);
  } else {
    const at::Tensor s = score == FLY_MOE_SOFTMAX ? at::softmax(l, -1) : at::sigmoid(l);
    auto [v, i] = at::sort(s, /*stable=*/true, -1, /*descending=*/true);
    ids = i.narrow(-1, 0, k);
    w = v.narrow(-1, 0, k);
  }
  if (flags & FLY_MOE_RENORMALIZE) w = w / w.sum(-1, true);
  return {w.to(wt).contiguous(), ids.contiguous()};
}

at::Tensor route_backward_composite(const at::Tensor& dweights, const at::Tensor& logits, const at::Tensor& ids,
                                    int64_t score, int64_t flags) {
  const at::Tensor l = logits.to(acc(logits)), idx = ids.to(at::kLong), dw = dweights.to(acc(logits));
  const bool topk_first = flags & FLY_MOE_TOPK_FIRST, softmax = score == FLY_MOE_SOFTMAX;
  at::Tensor s, p;
  if (topk_first) {
    const at::Tensor sel = l.gather(-1, idx);
    s = softmax ? at::softmax(sel, -1) : at::sigmoid(sel);
  } else {
    p = softmax ? at::softmax(l, -1) : at::sigmoid(l);
    s = p.gather(-1, idx);
  }
  at::Tensor ds = dw;
  if (flags & FLY_MOE_RENORMALIZE) {
    const at::Tensor S = s.sum(-1, true);
    ds = (dw - (dw * (s / S)).sum(-1, true)) / S;
  }
  const at::Tensor C = (ds * s).sum(-1, true);
  at::Tensor dl, g;
  if (softmax && !topk_first) {
    dl = -p * C;
    g = ds * s;
  } else {
    dl = at::zeros_like(l);
    g = softmax ? s * (ds - C) : ds * s * (1 - s);
  }
  return dl.scatter_add(-1, idx, g).to(logits.scalar_type());
}

// Whether row r (of the expert order) holds a routed pair: r < offsets[E - 1].
at::Tensor valid_of(const at::Tensor& row_of, const at::Tensor& offsets) {
  return row_of.to(at::kLong) < offsets.narrow(0, offsets.size(0) - 1, 1).to(at::kLong);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> permute_composite(const at::Tensor& x, const at::Tensor& ids,
                                                                             int64_t E) {
  const int64_t T = ids.size(0), k = ids.size(1), N = T * k;
  const at::Tensor flat = ids.reshape({N}).to(at::kLong);
  const at::Tensor bucket = at::where((flat >= 0).logical_and(flat < E), flat, at::full({}, E, flat.options()));
  const at::Tensor order = std::get<1>(at::sort(bucket, /*stable=*/true, 0, false));
  const at::Tensor pos = at::arange(N, flat.options());
  const at::Tensor row_of = at::empty({N}, flat.options()).index_put_({order}, pos);
  const at::Tensor counts = at::bincount(bucket, {}, E + 1).narrow(0, 0, E);
  const at::Tensor offsets = at::cumsum(counts, 0, at::kInt);
  at::Tensor x_perm = x.index_select(0, at::div(order, k, "floor"));
  if (N > 0) {
    const at::Tensor keep = pos < offsets.narrow(0, E - 1, 1).to(at::kLong);
    x_perm = x_perm.masked_fill(keep.logical_not().unsqueeze(-1), 0);
  }
  return {x_perm, offsets, row_of.to(at::kInt).view({T, k}), order.to(at::kInt)};
}

at::Tensor unpermute_composite(const at::Tensor& out_perm, const std::optional<at::Tensor>& weights,
                               const at::Tensor& row_of, const at::Tensor& offsets) {
  const int64_t T = row_of.size(0), k = row_of.size(1), H = out_perm.size(1);
  const at::Tensor valid = valid_of(row_of, offsets).unsqueeze(-1);
  at::Tensor g = out_perm.index_select(0, row_of.reshape({T * k}).to(at::kLong)).view({T, k, H}).to(acc(out_perm));
  if (weights) g = g * weights->to(acc(out_perm)).unsqueeze(-1);
  return g.masked_fill(valid.logical_not(), 0).sum(1).to(out_perm.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> unpermute_backward_composite(const at::Tensor& dy, const at::Tensor& out_perm,
                                                                const at::Tensor& weights, const at::Tensor& row_of,
                                                                const at::Tensor& offsets) {
  const int64_t T = row_of.size(0), k = row_of.size(1), H = out_perm.size(1);
  const at::Tensor valid = valid_of(row_of, offsets);
  const at::Tensor rows = row_of.reshape({T * k}).to(at::kLong);
  const at::ScalarType ct = acc(out_perm);
  const at::Tensor wv = weights.to(ct).masked_fill(valid.logical_not(), 0);
  const at::Tensor d = (dy.to(ct).unsqueeze(1) * wv.unsqueeze(-1)).to(out_perm.scalar_type()).view({T * k, H});
  const at::Tensor dop = at::zeros(out_perm.sizes(), out_perm.options()).index_copy_(0, rows, d);
  const at::Tensor g = out_perm.index_select(0, rows).view({T, k, H}).to(ct);
  const at::Tensor dw = (g * dy.to(ct).unsqueeze(1)).sum(-1).masked_fill(valid.logical_not(), 0).to(weights.scalar_type());
  return {dop, dw};
}

// ---- CUDA: the library where it takes the call -------------------------------------------------
std::tuple<at::Tensor, at::Tensor> route_cuda(const at::Tensor& logits, int64_t k, int64_t score, int64_t flags,
                                              std::optional<at::ScalarType> weight_dtype) {
  check_route(logits, k, score, flags);
  const at::ScalarType wt = weight_type(weight_dtype);
  if (on_our_device(logits) && is_fly_float(logits.scalar_type()) && rows_ok(logits) &&
      (wt == at::kFloat || wt == logits.scalar_type())) {
    c10::DeviceGuard guard(logits.device());
    at::Tensor w = at::empty({logits.size(0), k}, logits.options().dtype(wt));
    at::Tensor ids = at::empty({logits.size(0), k}, logits.options().dtype(at::kLong));
    const fly_tensor tl = d2(logits), tw = d2(w), ti = d2(ids);
    const fly_status st = fly_moe_route_fwd(&tl, k, int(score), int(flags), &tw, &ti, current_stream(logits.device()));
    if (st == FLY_SUCCESS) {
      note_ours(kMoeRoute);
      return {w, ids};
    }
    TORCH_CHECK(status_means_fallback(st), "flykernels moe_route: ", fly_status_string(st), ": ", fly_get_last_error());
    note_fallback(kMoeRoute, fly_get_last_error());
  } else {
    note_fallback(kMoeRoute, "logits the fused router does not take (dtype, device, layout or weight dtype)");
  }
  return route_composite(logits, k, score, flags, wt);
}

at::Tensor route_backward_cuda(const at::Tensor& dweights, const at::Tensor& logits, const at::Tensor& ids,
                               int64_t score, int64_t flags) {
  if (on_our_device(logits) && is_fly_float(logits.scalar_type()) && rows_ok(logits) && rows_ok(dweights) &&
      rows_ok(ids) && (ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt) &&
      (dweights.scalar_type() == at::kFloat || dweights.scalar_type() == logits.scalar_type())) {
    c10::DeviceGuard guard(logits.device());
    at::Tensor dl = at::empty(logits.sizes(), logits.options());
    const fly_tensor tdw = d2(dweights), tl = d2(logits), ti = d2(ids), tdl = d2(dl);
    const fly_status st =
        fly_moe_route_bwd(&tdw, &tl, &ti, int(score), int(flags), &tdl, current_stream(logits.device()));
    if (st == FLY_SUCCESS) {
      note_ours(kMoeRouteBwd);
      return dl;
    }
    TORCH_CHECK(status_means_fallback(st), "flykernels moe_route_backward: ", fly_status_string(st), ": ",
                fly_get_last_error());
    note_fallback(kMoeRouteBwd, fly_get_last_error());
  } else {
    note_fallback(kMoeRouteBwd, "operands the fused router backward does not take");
  }
  return route_backward_composite(dweights, logits, ids, score, flags);
}

void check_permute(const at::Tensor& x, const at::Tensor& ids, int64_t E) {
  TORCH_CHECK(x.dim() == 2 && ids.dim() == 2 && x.size(0) == ids.size(0),
              "flykernels::moe_permute: x must be [T, H] and ids [T, k], got ", x.sizes(), " and ", ids.sizes());
  TORCH_CHECK(E >= 1, "flykernels::moe_permute: num_experts must be >= 1, got ", E);
  TORCH_CHECK(!at::isFloatingType(ids.scalar_type()) && !ids.is_complex(),
              "flykernels::moe_permute: ids must be an integer tensor");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> permute_cuda(const at::Tensor& x, const at::Tensor& ids,
                                                                        int64_t E) {
  check_permute(x, ids, E);
  const int64_t T = ids.size(0), k = ids.size(1), N = T * k, H = x.size(1);
  if (on_our_device(x) && ids.device() == x.device() && is_fly_float(x.scalar_type()) && rows_ok(x) &&
      rows_ok(ids) && (ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt)) {
    size_t bytes = 0;
    fly_status st = fly_moe_permute_workspace_size(T, k, E, &bytes);
    if (st == FLY_SUCCESS) {
      c10::DeviceGuard guard(x.device());
      const auto io = x.options().dtype(at::kInt);
      at::Tensor x_perm = at::empty({N, H}, x.options()), offsets = at::empty({E}, io);
      at::Tensor row_of = at::empty({T, k}, io), pair_of = at::empty({N}, io);
      at::Tensor ws = at::empty({int64_t(bytes)}, x.options().dtype(at::kByte));
      const fly_tensor tx = d2(x), ti = d2(ids), txp = d2(x_perm), to = desc_1d(offsets, E), tr = d2(row_of),
                       tp = desc_1d(pair_of, N);
      st = fly_moe_permute(&tx, &ti, &txp, &to, &tr, &tp, bytes ? ws.data_ptr() : nullptr, bytes,
                           current_stream(x.device()));
      if (st == FLY_SUCCESS) {
        note_ours(kMoePermute);
        return {x_perm, offsets, row_of, pair_of};
      }
    }
    TORCH_CHECK(status_means_fallback(st), "flykernels moe_permute: ", fly_status_string(st), ": ",
                fly_get_last_error());
    note_fallback(kMoePermute, fly_get_last_error());
  } else {
    note_fallback(kMoePermute, "operands the fused permute does not take (dtype, device or layout)");
  }
  return permute_composite(x, ids, E);
}

bool rows_operands(std::initializer_list<const at::Tensor*> ts) {
  const at::Tensor& a = **ts.begin();
  if (!on_our_device(a) || !is_fly_float(a.scalar_type())) return false;
  for (const at::Tensor* t : ts)
    if (!rows_ok(*t) || t->device() != a.device()) return false;
  return true;
}
bool index_operands(const at::Tensor& row_of, const at::Tensor& offsets) {
  return row_of.scalar_type() == at::kInt && offsets.scalar_type() == at::kInt && offsets.dim() == 1 &&
         offsets.size(0) >= 1 && offsets.is_contiguous() && offsets.device() == row_of.device();
}

void check_rows(const at::Tensor& src, const at::Tensor& row_of, const at::Tensor& offsets, const char* op) {
  TORCH_CHECK(src.dim() == 2 && row_of.dim() == 2 && src.size(0) == row_of.size(0) * row_of.size(1), "flykernels::", op,
              ": expected [T*k, H] rows and row_of [T, k], got ", src.sizes(), " and ", row_of.sizes());
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) >= 1, "flykernels::", op, ": offsets must be [E], E >= 1");
}

at::Tensor combine_cuda(const at::Tensor& src, const std::optional<at::Tensor>& weights, const at::Tensor& row_of,
                        const at::Tensor& offsets, OpId id) {
  const int64_t T = row_of.size(0), H = src.size(1);
  const bool w_ok = !weights || (rows_ok(*weights) && weights->device() == src.device() &&
                                 (weights->scalar_type() == at::kFloat || weights->scalar_type() == src.scalar_type()));
  if (rows_operands({&src, &row_of}) && w_ok && index_operands(row_of, offsets)) {
    c10::DeviceGuard guard(src.device());
    at::Tensor y = at::empty({T, H}, src.options());
    const fly_tensor ts = d2(src), tr = d2(row_of), to = desc_1d(offsets, offsets.size(0)), ty = d2(y);
    fly_tensor tw{};
    if (weights) tw = d2(*weights);
    const fly_status st = weights ? fly_moe_unpermute(&ts, &tw, &tr, &to, &ty, current_stream(src.device()))
                                  : fly_moe_permute_bwd(&ts, &tr, &to, &ty, current_stream(src.device()));
    if (st == FLY_SUCCESS) {
      note_ours(id);
      return y;
    }
    TORCH_CHECK(status_means_fallback(st), "flykernels ", kOpNames[id], ": ", fly_status_string(st), ": ",
                fly_get_last_error());
    note_fallback(id, fly_get_last_error());
  } else {
    note_fallback(id, "operands the fused unpermute does not take (dtype, device or layout)");
  }
  return unpermute_composite(src, weights, row_of, offsets);
}

at::Tensor unpermute_cuda(const at::Tensor& out_perm, const at::Tensor& weights, const at::Tensor& row_of,
                          const at::Tensor& offsets) {
  check_rows(out_perm, row_of, offsets, "moe_unpermute");
  return combine_cuda(out_perm, weights, row_of, offsets, kMoeUnpermute);
}
at::Tensor permute_backward_cuda(const at::Tensor& dx_perm, const at::Tensor& row_of, const at::Tensor& offsets) {
  check_rows(dx_perm, row_of, offsets, "moe_permute_backward");
  return combine_cuda(dx_perm, std::nullopt, row_of, offsets, kMoePermuteBwd);
}

std::tuple<at::Tensor, at::Tensor> unpermute_backward_cuda(const at::Tensor& dy, const at::Tensor& out_perm,
                                                           const at::Tensor& weights, const at::Tensor& row_of,
                                                           const at::Tensor& offsets) {
  check_rows(out_perm, row_of, offsets, "moe_unpermute_backward");
  if (rows_operands({&dy, &out_perm, &row_of, &weights}) && dy.scalar_type() == out_perm.scalar_type() &&
      (weights.scalar_type() == at::kFloat || weights.scalar_type() == dy.scalar_type()) &&
      index_operands(row_of, offsets)) {
    c10::DeviceGuard guard(dy.device());
    at::Tensor dop = at::empty(out_perm.sizes(), out_perm.options());
    at::Tensor dw = at::empty(weights.sizes(), weights.options());
    const fly_tensor tdy = d2(dy), top = d2(out_perm), tw = d2(weights), tr = d2(row_of),
                     to = desc_1d(offsets, offsets.size(0)), tdop = d2(dop), tdw = d2(dw);
    const fly_status st = fly_moe_unpermute_bwd(&tdy, &top, &tw, &tr, &to, &tdop, &tdw, current_stream(dy.device()));
    if (st == FLY_SUCCESS) {
      note_ours(kMoeUnpermuteBwd);
      return {dop, dw};
    }
    TORCH_CHECK(status_means_fallback(st), "flykernels moe_unpermute_backward: ", fly_status_string(st), ": ",
                fly_get_last_error());
    note_fallback(kMoeUnpermuteBwd, fly_get_last_error());
  } else {
    note_fallback(kMoeUnpermuteBwd, "operands the fused unpermute backward does not take");
  }
  return unpermute_backward_composite(dy, out_perm, weights, row_of, offsets);
}

// ---- CPU ---------------------------------------------------------------------------------------
std::tuple<at::Tensor, at::Tensor> route_cpu(const at::Tensor& logits, int64_t k, int64_t score, int64_t flags,
                                             std::optional<at::ScalarType> weight_dtype) {
  check_route(logits, k, score, flags);
  return route_composite(logits, k, score, flags, weight_type(weight_dtype));
}
at::Tensor route_backward_cpu(const at::Tensor& dweights, const at::Tensor& logits, const at::Tensor& ids,
                              int64_t score, int64_t flags) {
  return route_backward_composite(dweights, logits, ids, score, flags);
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> permute_cpu(const at::Tensor& x, const at::Tensor& ids,
                                                                       int64_t E) {
  check_permute(x, ids, E);
  return permute_composite(x, ids, E);
}
at::Tensor unpermute_cpu(const at::Tensor& out_perm, const at::Tensor& weights, const at::Tensor& row_of,
                         const at::Tensor& offsets) {
  check_rows(out_perm, row_of, offsets, "moe_unpermute");
  return unpermute_composite(out_perm, weights, row_of, offsets);
}
at::Tensor permute_backward_cpu(const at::Tensor& dx_perm, const at::Tensor& row_of, const at::Tensor& offsets) {
  check_rows(dx_perm, row_of, offsets, "moe_permute_backward");
  return unpermute_composite(dx_perm, std::nullopt, row_of, offsets);
}
std::tuple<at::Tensor, at::Tensor> unpermute_backward_cpu(const at::Tensor& dy, const at::Tensor& out_perm,
                                                          const at::Tensor& weights, const at::Tensor& row_of,
                                                          const at::Tensor& offsets) {
  check_rows(out_perm, row_of, offsets, "moe_unpermute_backward");
  return unpermute_backward_composite(dy, out_perm, weights, row_of, offsets);
}

// ---- Meta: shapes only ------------------------------------------------------------------------
std::tuple<at::Tensor, at::Tensor> route_meta(const at::Tensor& logits, int64_t k, int64_t score, int64_t flags,
                                              std::optional<at::ScalarType> weight_dtype) {
  check_route(logits, k, score, flags);
  return {at::empty({logits.size(0), k}, logits.options().dtype(weight_type(weight_dtype))),
          at::empty({logits.size(0), k}, logits.options().dtype(at::kLong))};
}
at::Tensor route_backward_meta(const at::Tensor& dweights, const at::Tensor& logits, const at::Tensor& ids,
                               int64_t score, int64_t flags) {
  return at::empty(logits.sizes(), logits.options());
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> permute_meta(const at::Tensor& x, const at::Tensor& ids,
                                                                        int64_t E) {
  check_permute(x, ids, E);
  const int64_t T = ids.size(0), k = ids.size(1);
  const auto io = x.options().dtype(at::kInt);
  return {at::empty({T * k, x.size(1)}, x.options()), at::empty({E}, io), at::empty({T, k}, io),
          at::empty({T * k}, io)};
}
at::Tensor unpermute_meta(const at::Tensor& out_perm, const at::Tensor& weights, const at::Tensor& row_of,
                          const at::Tensor& offsets) {
  check_rows(out_perm, row_of, offsets, "moe_unpermute");
  return at::empty({row_of.size(0), out_perm.size(1)}, out_perm.options());
}
at::Tensor permute_backward_meta(const at::Tensor& dx_perm, const at::Tensor& row_of, const at::Tensor& offsets) {
  check_rows(dx_perm, row_of, offsets, "moe_permute_backward");
  return at::empty({row_of.size(0), dx_perm.size(1)}, dx_perm.options());
}
std::tuple<at::Tensor, at::Tensor> unpermute_backward_meta(const at::Tensor& dy, const at::Tensor& out_perm,
                                                           const at::Tensor& weights, const at::Tensor& row_of,
                                                           const at::Tensor& offsets) {
  return {at::empty(out_perm.sizes(), out_perm.options()), at::empty(weights.sizes(), weights.options())};
}

// ---- Autograd -------------------------------------------------------------------------------------
template <class F>
auto op_of(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<F>();
}

class RouteFunction : public torch::autograd::Function<RouteFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                                                int64_t k, int64_t score, int64_t flags,
                                                std::optional<at::ScalarType> weight_dtype) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op = op_of<decltype(route_cpu)>("flykernels::moe_route");
    auto [w, ids] = op.call(logits, k, score, flags, weight_dtype);
    ctx->save_for_backward({logits, ids});
    ctx->saved_data["score"] = score;
    ctx->saved_data["flags"] = flags;
    ctx->mark_non_differentiable({ids});
    return {w, ids};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor none;
    if (!grads[0].defined()) return {none, none, none, none, none};
    const auto saved = ctx->get_saved_variables();
    static auto op = op_of<decltype(route_backward_cpu)>("flykernels::moe_route_backward");
    return {op.call(grads[0].contiguous(), saved[0], saved[1], ctx->saved_data["score"].toInt(),
                    ctx->saved_data["flags"].toInt()),
            none, none, none, none};
  }
};

class PermuteFunction : public torch::autograd::Function<PermuteFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor& ids, int64_t E) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op = op_of<decltype(permute_cpu)>("flykernels::moe_permute");
    auto [x_perm, offsets, row_of, pair_of] = op.call(x, ids, E);
    ctx->save_for_backward({row_of, offsets});
    ctx->mark_non_differentiable({offsets, row_of, pair_of});
    return {x_perm, offsets, row_of, pair_of};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor none;
    if (!grads[0].defined()) return {none, none, none};
    const auto saved = ctx->get_saved_variables();
    static auto op = op_of<decltype(permute_backward_cpu)>("flykernels::moe_permute_backward");
    return {op.call(grads[0].contiguous(), saved[0], saved[1]), none, none};
  }
};

class UnpermuteFunction : public torch::autograd::Function<UnpermuteFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& out_perm,
                            const at::Tensor& weights, const at::Tensor& row_of, const at::Tensor& offsets) {
    at::AutoDispatchBelowADInplaceOrView below;
    static auto op = op_of<decltype(unpermute_cpu)>("flykernels::moe_unpermute");
    ctx->save_for_backward({out_perm, weights, row_of, offsets});
    return op.call(out_perm, weights, row_of, offsets);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor none;
    if (!grads[0].defined()) return {none, none, none, none};
    const auto s = ctx->get_saved_variables();
    static auto op = op_of<decltype(unpermute_backward_cpu)>("flykernels::moe_unpermute_backward");
    auto [dop, dw] = op.call(grads[0].contiguous(), s[0], s[1], s[2], s[3]);
    return {dop, dw, none, none};
  }
};

std::tuple<at::Tensor, at::Tensor> route_autograd(const at::Tensor& logits, int64_t k, int64_t score, int64_t flags,
                                                  std::optional<at::ScalarType> weight_dtype) {
  auto out = RouteFunction::apply(logits, k, score, flags, weight_dtype);
  return {out[0], out[1]};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> permute_autograd(const at::Tensor& x, const at::Tensor& ids,
                                                                            int64_t E) {
  auto out = PermuteFunction::apply(x, ids, E);
  return {out[0], out[1], out[2], out[3]};
}
at::Tensor unpermute_autograd(const at::Tensor& out_perm, const at::Tensor& weights, const at::Tensor& row_of,
                              const at::Tensor& offsets) {
  return UnpermuteFunction::apply(out_perm, weights, row_of, offsets);
}

}  // namespace moe
}  // namespace flyk

TORCH_LIBRARY_FRAGMENT(flykernels, m) {
  m.def("moe_route(Tensor logits, int k, int score=0, int flags=0, ScalarType? weight_dtype=None) -> (Tensor, Tensor)");
  m.def("moe_route_backward(Tensor dweights, Tensor logits, Tensor ids, int score, int flags) -> Tensor");
  m.def("moe_permute(Tensor x, Tensor ids, int num_experts) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("moe_permute_backward(Tensor dx_perm, Tensor row_of, Tensor offsets) -> Tensor");
  m.def("moe_unpermute(Tensor out_perm, Tensor weights, Tensor row_of, Tensor offsets) -> Tensor");
  m.def("moe_unpermute_backward(Tensor dy, Tensor out_perm, Tensor weights, Tensor row_of, Tensor offsets) -> "
        "(Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(flykernels, CUDA, m) {
  m.impl("moe_route", &flyk::moe::route_cuda);
  m.impl("moe_route_backward", &flyk::moe::route_backward_cuda);
  m.impl("moe_permute", &flyk::moe::permute_cuda);
  m.impl("moe_permute_backward", &flyk::moe::permute_backward_cuda);
  m.impl("moe_unpermute", &flyk::moe::unpermute_cuda);
  m.impl("moe_unpermute_backward", &flyk::moe::unpermute_backward_cuda);
}
TORCH_LIBRARY_IMPL(flykernels, CPU, m) {
  m.impl("moe_route", &flyk::moe::route_cpu);
  m.impl("moe_route_backward", &flyk::moe::route_backward_cpu);
  m.impl("moe_permute", &flyk::moe::permute_cpu);
  m.impl("moe_permute_backward", &flyk::moe::permute_backward_cpu);
  m.impl("moe_unpermute", &flyk::moe::unpermute_cpu);
  m.impl("moe_unpermute_backward", &flyk::moe::unpermute_backward_cpu);
}
TORCH_LIBRARY_IMPL(flykernels, Meta, m) {
  m.impl("moe_route", &flyk::moe::route_meta);
  m.impl("moe_route_backward", &flyk::moe::route_backward_meta);
  m.impl("moe_permute", &flyk::moe::permute_meta);
  m.impl("moe_permute_backward", &flyk::moe::permute_backward_meta);
  m.impl("moe_unpermute", &flyk::moe::unpermute_meta);
  m.impl("moe_unpermute_backward", &flyk::moe::unpermute_backward_meta);
}
TORCH_LIBRARY_IMPL(flykernels, Autograd, m) {
  m.impl("moe_route", &flyk::moe::route_autograd);
  m.impl("moe_permute", &flyk::moe::permute_autograd);
  m.impl("moe_unpermute", &flyk::moe::unpermute_autograd);
}
