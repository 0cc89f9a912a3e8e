// SPDX-License-Identifier: Apache-2.0
// TopK: aten::topk(self, k, dim, largest, sorted) and aten::topk.values(..., values, indices) on
// CUDA, through fly_topk (sorted results; deterministic mode honoured).
#include <ATen/Context.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include "common.hpp"
#include "decisions.hpp"
#include "families.hpp"
#include "overrides.hpp"

namespace flyk {
namespace {

// nullptr when ours takes the call as far as torch's side can tell (the library may still decline
// it: its own limits, e.g. 2^31 rows or columns), else a static reason.
const char* topk_ineligible(const at::Tensor& x, int64_t k, int64_t dim, bool check_device) {
  if (check_device && !x.is_cuda()) return "input is not a CUDA tensor";
  if (x.scalar_type() != at::kFloat) return "dtype not covered (fp32)";
  if (x.dim() == 0) return "zero-dimensional input";
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  if (d != x.dim() - 1) return "dim is not the last dimension";
  const int64_t C = x.size(-1);
  // The outputs are allocated with k before the library sees the call: an invalid k stays the
  // stock op's (its error, or its empty result for k = 0).
  if (k < 1 || k > C) return "k outside 1..size(dim)";
  if (x.numel() == 0) return "empty input";
  const bool rows_strided = x.dim() == 2 && x.stride(1) == 1 && x.stride(0) >= C;
  if (!x.is_contiguous() && !rows_strided) return "input is not contiguous";  // viewed as [R, C] rows
  if (check_device) return device_unsupported(x.device());
  return nullptr;
}

// The decision key (decisions.hpp): "fp32" | "fp32_det"; "largest" | "smallest"; C, k, R.
DecisionKey topk_key(const at::Tensor& x, int64_t k, bool largest) {
  DecisionKey key;
  key.op = "topk";
  key.dtype = at::globalContext().deterministicAlgorithms() ? "fp32_det" : "fp32";
  key.layout = largest ? "largest" : "smallest";
  const int64_t C = x.size(-1);
  key.k[0] = C;
  key.k[1] = k;
  key.k[2] = C > 0 ? x.numel() / C : 0;
  return key;
}

// torch's view of x as [R, C] rows, for the library.
fly_tensor topk_input(const at::Tensor& x) {
  const int64_t C = x.size(-1);
  return desc_2d(x, x.numel() / C, C, x.dim() == 2 ? x.stride(0) : C);
}

// An out= tensor we can write directly: right dtype and device, and either already the result's
// shape and contiguous, or empty (then resized, as torch's resize_output does without a warning).
bool out_usable(const at::Tensor& out, at::ScalarType dtype, const c10::Device& device, c10::IntArrayRef shape) {
  if (out.scalar_type() != dtype || out.device() != device) return false;
  if (out.sizes() == shape) return out.is_contiguous();
  return out.numel() == 0 && out.is_contiguous();
}

bool topk_run(const at::Tensor& x, int64_t k, bool largest, at::Tensor& values, at::Tensor& indices,
              std::string& why) {
  const int64_t C = x.size(-1);
  const int64_t R = x.numel() / C;
  c10::DeviceGuard guard(x.device());
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = k;
  if (!values.defined()) values = empty_unfilled(out_shape, x.scalar_type());
  else if (values.sizes() != c10::IntArrayRef(out_shape)) values.resize_(out_shape);
  if (!indices.defined()) indices = empty_unfilled(out_shape, at::kLong);
  else if (indices.sizes() != c10::IntArrayRef(out_shape)) indices.resize_(out_shape);
  const int deterministic = at::globalContext().deterministicAlgorithms() ? 1 : 0;
  fly_tensor xd = topk_input(x), vd = desc_2d(values, R, k, k), id = desc_2d(indices, R, k, k);
  size_t ws_bytes = 0;
  fly_status st = fly_topk_workspace_size(&xd, k, largest ? 1 : 0, deterministic, &ws_bytes);
  c10::DataPtr ws;  // back to the caching allocator, stream-ordered, when this returns
  if (st == FLY_SUCCESS && ws_bytes > 0) ws = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(ws_bytes);
  if (st == FLY_SUCCESS)
    st = fly_topk(&xd, k, largest ? 1 : 0, deterministic, &vd, &id, ws_bytes ? ws.get() : nullptr, ws_bytes,
                  current_stream(x.device()));
  if (st == FLY_SUCCESS) return true;
  if (status_means_fallback(st)) {
    why = fly_get_last_error();
    return false;
  }
  TORCH_CHECK(false, "flykernels topk: ", fly_status_string(st), ": ", fly_get_last_error());
}

// Both schemas start (self, k, dim, largest, sorted); topk.values adds (values, indices).
template <bool kOut>
void topk_boxed(const Impl& self, const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  constexpr size_t kArgs = kOut ? 7 : 5;
  const OpId id = kOut ? kTopkValues : kTopk;
  const size_t base = s.size() - kArgs;
  const at::Tensor& x = s[base].toTensor();
  const char* why = nullptr;
  int64_t k = 0;
  if (!s[base + 1].isInt()) why = "symbolic k";
  else k = s[base + 1].toInt();
  const int64_t dim = s[base + 2].toInt();
  const bool largest = s[base + 3].toBool();
  if (why == nullptr) why = topk_ineligible(x, k, dim, true);
  at::Tensor values, indices;
  if (why == nullptr && kOut) {
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = k;
    values = s[base + 5].toTensor();
    indices = s[base + 6].toTensor();
    if (!out_usable(values, x.scalar_type(), x.device(), shape) || !out_usable(indices, at::kLong, x.device(), shape))
      why = "out= tensors of another shape, dtype, device or layout";
    else if (values.is_same(x) || indices.is_same(x))
      why = "out= aliases the input";
  }
  if (why == nullptr) {
    // topk.values is timed as plain topk on its first five arguments: timing never writes the
    // caller's out= tensors.
    const DecisionKey key = topk_key(x, k, largest);
    if (!take_ours(key, [&] {
          const torch::jit::Stack args(s.begin() + base, s.begin() + base + 5);
          return timing_call("aten::topk", "", args, 5);
        })) {
      note_fallback(id, "decision: stock");
      return self.call_prev(op, ks, stack);
    }
    std::string lib_why;
    if (topk_run(x, k, largest, values, indices, lib_why)) {
      note_ours(id);
      torch::jit::drop(s, kArgs);
      torch::jit::push(s, std::move(values), std::move(indices));
      return;
    }
    note_fallback(id, lib_why.c_str());
  } else {
    note_fallback(id, why);
  }
  self.call_prev(op, ks, stack);
}

}  // namespace

std::string explain_topk(const at::Tensor& x, int64_t k, int64_t dim, bool check_device) {
  if (const char* why = topk_ineligible(x, k, dim, check_device)) return why;
  // The library's own rules, from its size query (validation only: no device, no memory touched).
  const fly_tensor xd = topk_input(x);
  size_t bytes = 0;
  const int det = at::globalContext().deterministicAlgorithms() ? 1 : 0;
  if (fly_topk_workspace_size(&xd, k, 1, det, &bytes) != FLY_SUCCESS) return fly_get_last_error();
  return "";
}

std::optional<DecisionKey> key_topk(const at::Tensor& x, int64_t k, int64_t dim, bool largest, bool check_device) {
  if (topk_ineligible(x, k, dim, check_device) != nullptr) return std::nullopt;
  return topk_key(x, k, largest);
}

std::vector<Override> topk_overrides() {
  std::vector<Override> rows(1);
  rows[0].family = "topk";
  rows[0].file = __FILE__;
  rows[0].impls.push_back(Impl{"aten::topk", "", c10::DispatchKey::CUDA, &topk_boxed<false>, std::nullopt});
  rows[0].impls.push_back(Impl{"aten::topk", "values", c10::DispatchKey::CUDA, &topk_boxed<true>, std::nullopt});
  return rows;
}

}  // namespace flyk
