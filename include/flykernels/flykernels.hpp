// SPDX-License-Identifier: Apache-2.0
// C++ convenience layer over the FlyKernels C ABI (header-only; the ABI stays the C one).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

#include "flykernels/flykernels.h"

namespace flykernels {

// Thrown by check() with the status and the library's message.
class Error : public std::runtime_error {
 public:
  Error(fly_status s, const std::string& msg)
      : std::runtime_error(std::string(fly_status_string(s)) + ": " + msg), status_(s) {}
  fly_status status() const { return status_; }

 private:
  fly_status status_;
};

inline void check(fly_status s) {
  if (s != FLY_SUCCESS) throw Error(s, fly_get_last_error());
}

// A descriptor from sizes and strides (elements); strides default to row-major contiguous.
inline fly_tensor tensor(void* data, fly_dtype dt, std::initializer_list<int64_t> sizes,
                         std::initializer_list<int64_t> strides = {}) {
  fly_tensor t{};
  t.data = data;
  t.dtype = dt;
  t.rank = int32_t(sizes.size());
  if (t.rank > FLY_MAX_RANK) throw std::invalid_argument("flykernels::tensor: rank too large");
  int i = 0;
  for (int64_t s : sizes) t.sizes[i++] = s;
  if (strides.size() == sizes.size()) {
    i = 0;
    for (int64_t s : strides) t.strides[i++] = s;
  } else {
    int64_t st = 1;
    for (int d = t.rank - 1; d >= 0; --d) { t.strides[d] = st; st *= t.sizes[d]; }
  }
  return t;
}

// ---- errors, version ------------------------------------------------------------------
namespace detail {
// A null C string (no message, no variant yet) reads as "".
inline std::string to_string_or_empty(const char* s) { return s ? std::string(s) : std::string(); }
}  // namespace detail
inline std::string last_error() { return detail::to_string_or_empty(fly_get_last_error()); }
inline std::string status_string(fly_status s) { return detail::to_string_or_empty(fly_status_string(s)); }
struct Version {
  int major = 0, minor = 0, patch = 0;
};
// The library's version at run time (FLY_VERSION_* give the header's).
inline Version version() {
  Version v;
  fly_version(&v.major, &v.minor, &v.patch);
  return v;
}
inline std::string version_string() { return detail::to_string_or_empty(fly_version_string()); }

// ---- tuning database ---------------------------------------------------------------------
// Overlay database read before the embedded one; nullptr clears it.
inline void set_tuning_db(const char* path) { check(fly_set_tuning_db(path)); }
inline void set_tuning_db(const std::string& path) { set_tuning_db(path.c_str()); }

// ---- introspection -----------------------------------------------------------------------
inline int variant_count() { return fly_variant_count(); }
// Throws std::out_of_range outside [0, variant_count()).
inline std::string variant_name(int index) {
  const char* n = fly_variant_name(index);
  if (!n) throw std::out_of_range("flykernels::variant_name: index " + std::to_string(index) + " out of range");
  return n;
}
inline std::vector<std::string> variant_names() {
  std::vector<std::string> out;
  for (int i = 0; i < fly_variant_count(); ++i) out.push_back(variant_name(i));
  return out;
}
struct VariantInfo {
  std::string family;  // "rmsnorm", "topk", "gemm", ...
  std::string params;  // "key=value;key=value"
};
inline VariantInfo variant_info(const std::string& name) {
  const char* family = nullptr;
  const char* params = nullptr;
  check(fly_variant_info(name.c_str(), &family, &params));
  return {detail::to_string_or_empty(family), detail::to_string_or_empty(params)};
}
// Forces this thread's next dispatches to `name`; nullptr restores database dispatch.
inline void force_variant(const char* name) { check(fly_force_variant(name)); }
inline std::string last_variant() { return detail::to_string_or_empty(fly_last_variant()); }
inline std::string last_decision() { return detail::to_string_or_empty(fly_last_decision()); }
// "sm_90a" for the stream's device; throws Error (FLY_ERROR_NO_DEVICE without a GPU).
inline std::string device_arch(void* stream = nullptr) {
  const char* arch = nullptr;
  check(fly_device_arch(stream, &arch));
  return detail::to_string_or_empty(arch);
}

// ---- operations ----------------------------------------------------------------------------
inline void rms_norm_fwd(const fly_tensor& x, const fly_tensor* weight, double eps, const fly_tensor& y,
                         const fly_tensor* rstd = nullptr, void* stream = nullptr) {
  check(fly_rms_norm_fwd(&x, weight, eps, &y, rstd, stream));
}

inline void topk(const fly_tensor& x, int64_t k, bool largest, bool deterministic, const fly_tensor& values,
                 const fly_tensor& indices, void* workspace = nullptr, size_t workspace_bytes = 0,
                 void* stream = nullptr) {
  check(fly_topk(&x, k, largest, deterministic, &values, &indices, workspace, workspace_bytes, stream));
}

// Bytes of scratch fly_topk needs for this call (0: pass no workspace).
inline size_t topk_workspace_size(const fly_tensor& x, int64_t k, bool largest, bool deterministic) {
  size_t bytes = 0;
  check(fly_topk_workspace_size(&x, k, largest, deterministic, &bytes));
  return bytes;
}

// Bytes of the optional stream-K workspace of fly_gemm (shape independent; 0 when none is bundled).
inline size_t gemm_workspace_size(const fly_tensor& a, const fly_tensor& b, const fly_tensor& c) {
  size_t bytes = 0;
  check(fly_gemm_workspace_size(&a, &b, &c, &bytes));
  return bytes;
}

inline void gemm(const fly_tensor& a, const fly_tensor& b, const fly_tensor& c, const fly_tensor* bias = nullptr,
                 void* workspace = nullptr, size_t workspace_bytes = 0, void* stream = nullptr) {
  check(fly_gemm(&a, &b, &c, bias, workspace, workspace_bytes, stream));
}

// MX quantizer (format: FLY_MX_E4M3 / FLY_MX_E2M1, optionally | FLY_MX_SCALE_RCEIL) and the
// MX block-scaled GEMM (see flykernels.h).
inline void mx_quantize(const fly_tensor& x, int format, const fly_tensor& q, const fly_tensor& scales,
                        void* stream = nullptr) {
  check(fly_mx_quantize(&x, format, &q, &scales, stream));
}
// Bytes of the optional split-K workspace of fly_scaled_gemm (0: pass none).
inline size_t scaled_gemm_workspace_size(const fly_tensor& a, const fly_tensor& b, const fly_tensor& c) {
  size_t bytes = 0;
  check(fly_scaled_gemm_workspace_size(&a, &b, &c, &bytes));
  return bytes;
}
// The workspace comes after the stream (so calls written before it existed keep their meaning).
inline void scaled_gemm(const fly_tensor& a, const fly_tensor& scale_a, const fly_tensor& b, const fly_tensor& scale_b,
                        const fly_tensor& c, const fly_tensor* bias = nullptr, void* stream = nullptr,
                        void* workspace = nullptr, size_t workspace_bytes = 0) {
  check(fly_scaled_gemm(&a, &scale_a, &b, &scale_b, bias, &c, workspace, workspace_bytes, stream));
}
// Weight-only mode: BF16/FP16 activations a [M, K] (M <= 64), MX weights b with scale_b, c in a's
// dtype (fly_scaled_gemm with scale_a = NULL).
inline void scaled_gemm_weight_only(const fly_tensor& a, const fly_tensor& b, const fly_tensor& scale_b,
                                    const fly_tensor& c, const fly_tensor* bias = nullptr, void* stream = nullptr) {
  check(fly_scaled_gemm(&a, nullptr, &b, &scale_b, bias, &c, nullptr, 0, stream));
}

namespace detail {
// The versioned parameters of one attention forward call (struct_size filled in).
inline fly_attention_fwd_params attention_params(const fly_tensor& q, const fly_tensor& k, const fly_tensor& v,
                                                 const fly_tensor& o, const fly_tensor* lse, bool causal,
                                                 double softmax_scale) {
  fly_attention_fwd_params p{};
  p.struct_size = sizeof(p);
  p.q = &q;
  p.k = &k;
  p.v = &v;
  p.o = &o;
  p.lse = lse;
  p.softmax_scale = softmax_scale;
  p.causal = causal ? 1 : 0;
  return p;
}
}  // namespace detail

// Attention forward; fills struct_size. lse may be null; workspace as fly_attention_fwd_workspace_size says.
inline void attention_fwd(const fly_tensor& q, const fly_tensor& k, const fly_tensor& v, const fly_tensor& o,
                          const fly_tensor* lse = nullptr, bool causal = false, double softmax_scale = 0.0,
                          void* workspace = nullptr, size_t workspace_bytes = 0, void* stream = nullptr) {
  fly_attention_fwd_params p = detail::attention_params(q, k, v, o, lse, causal, softmax_scale);
  p.workspace = workspace;
  p.workspace_bytes = workspace_bytes;
  check(fly_attention_fwd(&p, stream));
}

// Bytes of the optional split-key workspace of attention_fwd for these tensors (0: none needed).
inline size_t attention_fwd_workspace_size(const fly_tensor& q, const fly_tensor& k, const fly_tensor& v,
                                           const fly_tensor& o, const fly_tensor* lse = nullptr,
                                           bool causal = false, double softmax_scale = 0.0) {
  const fly_attention_fwd_params p = detail::attention_params(q, k, v, o, lse, causal, softmax_scale);
  size_t bytes = 0;
  check(fly_attention_fwd_workspace_size(&p, &bytes));
  return bytes;
}

// Attention backward inputs and outputs (the forward's tensors, its LSE, dO; dQ, dK, dV written).
struct AttentionBwdTensors {
  const fly_tensor *q, *k, *v, *o, *dout, *lse, *dq, *dk, *dv;
};

namespace detail {
inline fly_attention_bwd_params attention_bwd_params(const AttentionBwdTensors& t, bool causal, double softmax_scale) {
  fly_attention_bwd_params p{};
  p.struct_size = sizeof(p);
  p.q = t.q;
  p.k = t.k;
  p.v = t.v;
  p.o = t.o;
  p.dout = t.dout;
  p.lse = t.lse;
  p.dq = t.dq;
  p.dk = t.dk;
  p.dv = t.dv;
  p.softmax_scale = softmax_scale;
  p.causal = causal ? 1 : 0;
  return p;
}
}  // namespace detail

// Bytes of the (required) workspace of attention_bwd for these tensors.
inline size_t attention_bwd_workspace_size(const AttentionBwdTensors& t, bool causal = false, double softmax_scale = 0.0) {
  const fly_attention_bwd_params p = detail::attention_bwd_params(t, causal, softmax_scale);
  size_t bytes = 0;
  check(fly_attention_bwd_workspace_size(&p, &bytes));
  return bytes;
}

// Attention backward (deterministic); fills struct_size.
inline void attention_bwd(const AttentionBwdTensors& t, void* workspace, size_t workspace_bytes, bool causal = false,
                          double softmax_scale = 0.0, void* stream = nullptr) {
  fly_attention_bwd_params p = detail::attention_bwd_params(t, causal, softmax_scale);
  p.workspace = workspace;
  p.workspace_bytes = workspace_bytes;
  check(fly_attention_bwd(&p, stream));
}

// Forces a variant for the lifetime of the object (this thread only), as the tuner does.
class ScopedVariant {
 public:
  explicit ScopedVariant(const char* name) { check(fly_force_variant(name)); }
  ~ScopedVariant() { fly_force_variant(nullptr); }
  ScopedVariant(const ScopedVariant&) = delete;
  ScopedVariant& operator=(const ScopedVariant&) = delete;
};

// Grouped GEMM (fly_grouped_gemm): C[rows of g] = A[rows of g] @ B[g] (+ bias[g]), offs int32 on the device.
inline size_t grouped_gemm_workspace_size(const fly_tensor& a, const fly_tensor& b, const fly_tensor& offs,
                                          const fly_tensor& c) {
  size_t bytes = 0;
  check(fly_grouped_gemm_workspace_size(&a, &b, &offs, &c, &bytes));
  return bytes;
}
// Host offsets (cumulative group ends): throws on a negative, decreasing or too large entry.
inline void grouped_gemm_check_offsets(const int32_t* offs, int64_t groups, int64_t rows) {
  check(fly_grouped_gemm_check_offsets(offs, groups, rows));
}
inline void grouped_gemm(const fly_tensor& a, const fly_tensor& b, const fly_tensor& offs, const fly_tensor& c,
                         const fly_tensor* bias = nullptr, void* workspace = nullptr, size_t workspace_bytes = 0,
                         void* stream = nullptr) {
  check(fly_grouped_gemm(&a, &b, &offs, bias, &c, workspace, workspace_bytes, stream));
}
// Ragged-K mode (F.grouped_mm's weight gradient): out[g] = a[:, k of g] @ b[k of g, :] for a [M, Kt]
// M contiguous, b [Kt, N] N contiguous, offs int32 [G] along K (device), out [G, M, N]; the workspace (device, 256-byte aligned)
// must hold grouped_gemm_workspace_size(a, b, offs, out) = G x 256 bytes.
inline void grouped_gemm_k(const fly_tensor& a, const fly_tensor& b, const fly_tensor& offs, const fly_tensor& out,
                           void* workspace, size_t workspace_bytes, void* stream = nullptr) {
  check(fly_grouped_gemm(&a, &b, &offs, nullptr, &out, workspace, workspace_bytes, stream));
}

}  // namespace flykernels
