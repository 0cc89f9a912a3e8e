// SPDX-License-Identifier: Apache-2.0
// Dense GEMM for Inductor's mm / addmm candidates (extern_kernels.flykernels_mm / _addmm, see
// python/flykernels/_ops/gemm.py) through fly_gemm, and the stream-K workspace size. No decision
// hook here: the compile-time provider decides whether our candidate is offered.
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include "common.hpp"
#include "families.hpp"

namespace flyk {
namespace {

// Torch's side of eligibility; the library checks shapes, strides (A/B row- or column-major, C
// row-major) and the bias vector itself.
const char* gemm_ineligible(const at::Tensor& a, const at::Tensor& b, const at::Tensor* out, const at::Tensor* bias,
                            bool check_device) {
  if (check_device && (!a.is_cuda() || !b.is_cuda() || (out && !out->is_cuda()))) return "not CUDA tensors";
  const auto dt = a.scalar_type();
  if (dt != at::kHalf && dt != at::kBFloat16) return "dtype not covered (fp16, bf16)";
  if (a.dim() != 2 || b.dim() != 2 || (out && out->dim() != 2)) return "not 2-D";
  if (a.numel() == 0 || b.numel() == 0) return "empty operand";
  if (check_device) {
    const c10::Device dev = out ? out->device() : a.device();
    if (a.device() != dev || b.device() != dev || (bias && bias->device() != dev)) return "operands on different devices";
    return device_unsupported(dev);
  }
  return nullptr;
}

// Whether TMA cannot address this operand (a base not 16-byte aligned, or a leading dimension
// that is not a multiple of 8 elements): fly_gemm then copies it into the workspace (its packed
// path) when there is room, else runs its cp.async kernel. A cheap guess of the library's rule:
// it decides; this only says when a scratch buffer is worth allocating.
bool gemm_needs_copies(const at::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return true;
  const int64_t ld = t.stride(1) == 1 ? t.stride(0) : t.stride(1);
  const int64_t lines = t.stride(1) == 1 ? t.size(0) : t.size(1);
  return lines > 1 && ld % 8 != 0;
}

// Scratch for the packed path when the caller has no workspace (Inductor's calls): 4096 bytes
// (where stream-K's flags would be: left unused, so uninitialized memory is fine) plus the copies,
// which fly_gemm_workspace_size reports beyond its shape-independent stream-K part. Freed when
// the call returns (the caching allocator reuses it in stream order). Undefined when the library
// needs no copies.
at::Tensor gemm_copy_scratch(const fly_tensor& ad, const fly_tensor& bd, const fly_tensor& cd, const c10::Device& dev) {
  size_t total = 0, aligned = 0;
  if (fly_gemm_workspace_size(&ad, &bd, &cd, &total) != FLY_SUCCESS) return {};
  fly_tensor x{};  // any aligned operand of the same dtype: the stream-K part alone
  x.data = reinterpret_cast<void*>(uintptr_t(256));
  x.dtype = ad.dtype;
  x.rank = 2;
  x.sizes[0] = x.sizes[1] = 8;
  x.strides[0] = 8;
  x.strides[1] = 1;
  if (fly_gemm_workspace_size(&x, &x, &x, &aligned) != FLY_SUCCESS || total <= aligned) return {};
  const int64_t bytes = static_cast<int64_t>(total - aligned) + 4096;
  return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(dev));
}

// Our GEMM into `out` (bias optional); false when ineligible or declined (out untouched). The
// stream-K workspace comes from Python (zero-filled, per stream, outside CUDA-graph pools).
bool gemm_try(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, const at::Tensor* bias,
              const std::optional<at::Tensor>& workspace, OpId op) {
  const char* why = gemm_ineligible(a, b, &out, bias, true);
  if (why != nullptr) {
    note_fallback(op, why);
    return false;
  }
  c10::DeviceGuard guard(out.device());
  fly_tensor ad = desc_nd(a), bd = desc_nd(b), cd = desc_nd(out), biasd{};
  if (bias != nullptr) biasd = desc_nd(*bias);
  void* ws_ptr = nullptr;
  size_t ws_bytes = 0;
  at::Tensor scratch;
  if (workspace.has_value() && workspace->defined() && workspace->is_cuda() && workspace->device() == out.device()) {
    ws_ptr = workspace->data_ptr();
    ws_bytes = static_cast<size_t>(workspace->nbytes());
  } else if (gemm_needs_copies(a) || gemm_needs_copies(b)) {
    scratch = gemm_copy_scratch(ad, bd, cd, out.device());
    if (scratch.defined()) {
      ws_ptr = scratch.data_ptr();
      ws_bytes = static_cast<size_t>(scratch.nbytes());
    }
  }
  fly_status st = fly_gemm(&ad, &bd, &cd, bias != nullptr ? &biasd : nullptr, ws_ptr, ws_bytes,
                           current_stream(out.device()));
  if (st == FLY_SUCCESS) {
    note_ours(op);
    return true;
  }
  if (status_means_fallback(st)) {
    note_fallback(op, fly_get_last_error());
    return false;
  }
  TORCH_CHECK(false, "flykernels gemm: ", fly_status_string(st), ": ", fly_get_last_error());
}

}  // namespace

// Bytes of stream-K workspace fly_gemm can use (0: none bundled); device and shape independent.
int64_t gemm_workspace_size(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  if (a.dim() != 2 || b.dim() != 2 || out.dim() != 2) return 0;
  fly_tensor ad = desc_nd(a), bd = desc_nd(b), cd = desc_nd(out);
  size_t need = 0;
  return fly_gemm_workspace_size(&ad, &bd, &cd, &need) == FLY_SUCCESS ? static_cast<int64_t>(need) : 0;
}

// out = a @ b; what we do not cover runs at::mm_out.
void mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor out, const std::optional<at::Tensor>& workspace) {
  if (!gemm_try(a, b, out, nullptr, workspace, kMm)) at::mm_out(out, a, b);
}

// out = bias + a @ b with bias a [N] vector (or its [M, N] broadcast view); else at::addmm_out.
void addmm_out(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b, at::Tensor out, double beta,
               double alpha, const std::optional<at::Tensor>& workspace) {
  at::Tensor vec;
  if (beta == 1.0 && alpha == 1.0) {
    if (bias.dim() == 1) vec = bias;
    else if (bias.dim() == 2 && bias.stride(0) == 0 && bias.size(1) == out.size(1)) vec = bias.select(0, 0);
  }
  if (!vec.defined()) {
    note_fallback(kAddmm, "bias is not an [N] vector or alpha/beta are not 1");
  } else if (gemm_try(a, b, out, &vec, workspace, kAddmm)) {
    return;
  }
  at::addmm_out(out, bias, a, b, beta, alpha);
}

}  // namespace flyk
