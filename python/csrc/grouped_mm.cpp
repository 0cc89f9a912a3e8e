// SPDX-License-Identifier: Apache-2.0
// Grouped GEMM: aten::_grouped_mm(self, mat2, offs?, bias?, out_dtype?) -> Tensor on CUDA (eager),
// and Inductor's grouped_mm candidate (grouped_mm_out), through fly_grouped_gemm.
// Ours: the 2-D x 3-D forward form (A [T, K], B [G, K, N], int32 offs [G] on the same device, no
// bias, out dtype = input dtype, N a multiple of 8 so the output is the plain row-major [T, N] the
// stock op allocates). Autograd's dA (dC @ B^T) is this form again. Also the 2-D x 2-D ragged-K
// form, autograd's dB (a = X.t() [M, Ktot], b = dC [Ktot, N], offs along K, out [G, M, N]). The
// library decides the strides it takes (A row-major, B N- or K-contiguous, TMA alignment, ...).
// Other forms (3-D x 3-D, 3-D x 2-D) run the stock kernel.
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include "common.hpp"
#include "decisions.hpp"
#include "families.hpp"
#include "overrides.hpp"

namespace flyk {
namespace {

const char* grouped_mm_ineligible(const at::Tensor& a, const at::Tensor& b, const at::Tensor* offs,
                                  const at::Tensor* bias, std::optional<at::ScalarType> out_dtype, bool check_device) {
  if (check_device && !(a.is_cuda() && b.is_cuda())) return "inputs are not CUDA tensors";
  if (a.scalar_type() != at::kHalf && a.scalar_type() != at::kBFloat16) return "dtype not covered (fp16, bf16)";
  if (b.scalar_type() != a.scalar_type()) return "mixed dtypes";
  if (out_dtype.has_value() && *out_dtype != a.scalar_type()) return "out_dtype differs from the inputs'";
  const bool ragged_k = a.dim() == 2 && b.dim() == 2;
  if (!ragged_k && (a.dim() != 2 || b.dim() != 3)) return "not the 2-D x 3-D or 2-D x 2-D form";
  if (offs == nullptr || !offs->defined()) return "no offsets";
  if (offs->scalar_type() != at::kInt || offs->dim() != 1 || (!ragged_k && offs->size(0) != b.size(0)))
    return "offs not int32 [G]";
  if (a.size(1) != b.size(ragged_k ? 0 : 1)) return "K of A and B differ";
  if (ragged_k) {
    // The ragged-K form (autograd's dB = X^T @ dC per group): a M-contiguous (X.t()), b
    // N-contiguous (dC). The library refuses other orders as well; kept here so explain_grouped_mm
    // words it as the tests expect.
    if (a.stride(0) != 1 && a.size(0) > 1) return "A not M-contiguous (the ragged-K form takes X.t())";
    if (b.stride(1) != 1 && b.size(1) > 1) return "B not N-contiguous (the ragged-K form takes dC)";
  }
  // The output is allocated as the stock op does (plain row-major) only for N % 8 == 0.
  if (b.size(-1) % 8 != 0) return "N not a multiple of 8";
  // The stock op's own rules for a bias (it refuses one in 2.11) stay the stock op's.
  if (bias != nullptr && bias->defined()) return "bias (left to the stock op)";
  if (check_device) {
    if (b.device() != a.device() || offs->device() != a.device()) return "inputs on different devices";
    return device_unsupported(a.device());
  }
  return nullptr;
}

// The decision key (decisions.hpp): dtype; "b_kn" | "b_nk" (3-D B, N- or K-contiguous) | "ragged_k";
// N, K, T, G. The ragged-K form computes [M, T_g] x [T_g, N] per group (a = X.t(): M is the
// forward's K, the ragged dimension T the tokens): N = b.size(1), K = a.size(0), T = a.size(1).
DecisionKey grouped_mm_key(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
  DecisionKey key;
  key.op = "grouped_mm";
  key.dtype = dtype_key(a.scalar_type());
  if (b.dim() == 2) {
    key.layout = "ragged_k";
    key.k[0] = b.size(1);
    key.k[1] = a.size(0);
    key.k[2] = a.size(1);
  } else {
    const int64_t K = b.size(1), N = b.size(2);
    const bool k_major = N <= 1 ? true : K <= 1 ? false : b.stride(2) != 1;  // as the library orders B
    key.layout = k_major ? "b_nk" : "b_kn";
    key.k[0] = N;
    key.k[1] = K;
    key.k[2] = a.size(0);
  }
  key.k[3] = offs.size(0);
  return key;
}

// The output the stock op allocates: 2-D x 3-D [T, N]; 2-D x 2-D (ragged K) [G, M, N].
std::vector<int64_t> grouped_mm_out_shape(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs) {
  if (b.dim() == 3) return {a.size(0), b.size(2)};
  return {offs.size(0), a.size(0), b.size(1)};
}

// fly_grouped_gemm of a, b, offs into c (no bias); false, with the reason noted, where the library
// declines the call (fallback statuses), an error for anything else.
bool grouped_mm_run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, const at::Tensor& c) {
  c10::DeviceGuard guard(a.device());
  fly_tensor ad = desc_nd(a), bd = desc_nd(b), od = desc_nd(offs), cd = desc_nd(c);
  // The ragged-K form needs a workspace (two tensor maps per group, written by the call itself).
  size_t ws_bytes = 0;
  fly_status st = fly_grouped_gemm_workspace_size(&ad, &bd, &od, &cd, &ws_bytes);
  c10::DataPtr ws;  // back to the caching allocator, stream-ordered, when this returns
  if (st == FLY_SUCCESS && ws_bytes > 0) ws = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(ws_bytes);
  if (st == FLY_SUCCESS)
    st = fly_grouped_gemm(&ad, &bd, &od, nullptr, &cd, ws_bytes ? ws.get() : nullptr, ws_bytes,
                          current_stream(a.device()));
  if (st == FLY_SUCCESS) {
    note_ours(kGroupedMm);
    return true;
  }
  TORCH_CHECK(status_means_fallback(st), "flykernels grouped_mm: ", fly_status_string(st), ": ", fly_get_last_error());
  note_fallback(kGroupedMm, fly_get_last_error());
  return false;
}

void grouped_mm_boxed(const Impl& self, const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t b0 = s.size() - 5;
  const at::Tensor& a = s[b0].toTensor();
  const at::Tensor& b = s[b0 + 1].toTensor();
  const at::Tensor* offs = s[b0 + 2].isNone() ? nullptr : &s[b0 + 2].toTensor();
  const at::Tensor* bias = s[b0 + 3].isNone() ? nullptr : &s[b0 + 3].toTensor();
  const std::optional<at::ScalarType> out_dtype =
      s[b0 + 4].isNone() ? std::nullopt : std::optional<at::ScalarType>(s[b0 + 4].toScalarType());
  const char* why = grouped_mm_ineligible(a, b, offs, bias, out_dtype, true);
  if (why == nullptr) {
    if (!take_ours(grouped_mm_key(a, b, *offs), [&] { return timing_call("aten::_grouped_mm", "", *stack, 5); })) {
      note_fallback(kGroupedMm, "decision: stock");
      return self.call_prev(op, ks, stack);
    }
    c10::DeviceGuard guard(a.device());  // the output is allocated on a's device
    at::Tensor c = empty_unfilled(grouped_mm_out_shape(a, b, *offs), a.scalar_type());
    if (grouped_mm_run(a, b, *offs, c)) {
      torch::jit::drop(s, 5);
      torch::jit::push(s, std::move(c));
      return;
    }
  } else {
    note_fallback(kGroupedMm, why);
  }
  self.call_prev(op, ks, stack);
}

}  // namespace

// out = F.grouped_mm(a, b, offs) for Inductor's grouped GEMM candidate: fly_grouped_gemm into
// Inductor's [T, N] row-major buffer where it covers the call, else the stock op's result copied.
// No decision hook here: the compile-time provider decided.
void grouped_mm_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, at::Tensor out) {
  const char* why = grouped_mm_ineligible(a, b, &offs, nullptr, out.scalar_type(), true);
  if (why == nullptr && b.dim() != 3) why = "not the 2-D x 3-D form (Inductor's candidate)";
  if (why == nullptr && !(out.dim() == 2 && out.size(0) == a.size(0) && out.size(1) == b.size(2)))
    why = "output not [T, N]";
  if (why == nullptr) {
    if (grouped_mm_run(a, b, offs, out)) return;  // the library checks out's layout
  } else {
    note_fallback(kGroupedMm, why);
  }
  out.copy_(at::_grouped_mm(a, b, offs));
}

std::string explain_grouped_mm(const at::Tensor& a, const at::Tensor& b, std::optional<at::Tensor> offs,
                               std::optional<at::Tensor> bias, bool check_device) {
  const at::Tensor* o = offs ? &*offs : nullptr;
  if (const char* why = grouped_mm_ineligible(a, b, o, bias ? &*bias : nullptr, std::nullopt, check_device)) return why;
  // The library's own rules (strides, TMA alignment, size limits), from its size query: validation
  // only, no device and no memory touched. The output is described as the override allocates it.
  const std::vector<int64_t> shape = grouped_mm_out_shape(a, b, *o);
  fly_tensor ad = desc_nd(a), bd = desc_nd(b), od = desc_nd(*o), cd = ad;
  cd.rank = static_cast<int>(shape.size());
  for (int i = cd.rank - 1; i >= 0; --i) {
    cd.sizes[i] = shape[i];
    cd.strides[i] = i == cd.rank - 1 ? 1 : cd.strides[i + 1] * shape[i + 1];
  }
  size_t bytes = 0;
  if (fly_grouped_gemm_workspace_size(&ad, &bd, &od, &cd, &bytes) != FLY_SUCCESS) return fly_get_last_error();
  return "";
}

std::optional<DecisionKey> key_grouped_mm(const at::Tensor& a, const at::Tensor& b, std::optional<at::Tensor> offs,
                                          bool check_device) {
  const at::Tensor* o = offs ? &*offs : nullptr;
  if (grouped_mm_ineligible(a, b, o, nullptr, std::nullopt, check_device) != nullptr) return std::nullopt;
  return grouped_mm_key(a, b, *o);
}

std::vector<Override> grouped_mm_overrides() {
  std::vector<Override> rows(1);
  rows[0].family = "grouped_mm";
  rows[0].file = __FILE__;
  rows[0].impls.push_back(Impl{"aten::_grouped_mm", "", c10::DispatchKey::CUDA, &grouped_mm_boxed, std::nullopt});
  return rows;
}

}  // namespace flyk
