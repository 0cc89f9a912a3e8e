// C++ convenience layer over the FlyKernels C ABI (header-only; the ABI stays the C one).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

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

inline void rms_norm_fwd(const fly_tensor& x, const fly_tensor* weight, double eps, const fly_tensor& y,
                         const fly_tensor* rstd = nullptr, void* stream = nullptr) {
  check(fly_rms_norm_fwd(&x, weight, eps, &y, rstd, stream));
}

inline void topk(const fly_tensor& x, int64_t k, bool largest, bool deterministic, const fly_tensor& values,
                 const fly_tensor& indices, void* workspace = nullptr, size_t workspace_bytes = 0,
                 void* stream = nullptr) {
  check(fly_topk(&x, k, largest, deterministic, &values, &indices, workspace, workspace_bytes, stream));
}

inline void gemm(const fly_tensor& a, const fly_tensor& b, const fly_tensor& c, const fly_tensor* bias = nullptr,
                 void* workspace = nullptr, size_t workspace_bytes = 0, void* stream = nullptr) {
  check(fly_gemm(&a, &b, &c, bias, workspace, workspace_bytes, stream));
}

// Forces a variant for the lifetime of the object (this thread only), as the tuner does.
class ScopedVariant {
 public:
  explicit ScopedVariant(const char* name) { check(fly_force_variant(name)); }
  ~ScopedVariant() { fly_force_variant(nullptr); }
  ScopedVariant(const ScopedVariant&) = delete;
  ScopedVariant& operator=(const ScopedVariant&) = delete;
};

}  // namespace flykernels
