// SPDX-License-Identifier: Apache-2.0
// The C++ side of the Python functions each family file offers (bound in module.cpp): why a call
// would not run ours (explain_*), the decision key of a call (key_*: the same function the override
// uses to build it; nullopt where the call is not ours to take) and the Inductor entry points.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "decisions.hpp"

namespace flyk {

// rmsnorm.cpp
std::string explain_rms_norm(const at::Tensor& x, std::vector<int64_t> normalized_shape,
                             std::optional<at::Tensor> weight, std::optional<double> eps, bool check_device);
std::optional<DecisionKey> key_rms_norm(const at::Tensor& x, std::vector<int64_t> normalized_shape,
                                        std::optional<at::Tensor> weight, std::optional<double> eps,
                                        bool check_device);

// topk.cpp
std::string explain_topk(const at::Tensor& x, int64_t k, int64_t dim, bool check_device);
std::optional<DecisionKey> key_topk(const at::Tensor& x, int64_t k, int64_t dim, bool largest, bool check_device);

// attention.cpp: `op` is the key's op name (sdpa_flash, sdpa_efficient, sdpa_cudnn, sdpa_flash_bwd,
// sdpa_efficient_bwd).
std::string explain_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p,
                         bool check_device);
std::optional<DecisionKey> key_sdpa(const std::string& op, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, bool is_causal, bool check_device);

// grouped_mm.cpp
std::string explain_grouped_mm(const at::Tensor& a, const at::Tensor& b, std::optional<at::Tensor> offs,
                               std::optional<at::Tensor> bias, bool check_device);
std::optional<DecisionKey> key_grouped_mm(const at::Tensor& a, const at::Tensor& b, std::optional<at::Tensor> offs,
                                          bool check_device);
void grouped_mm_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, at::Tensor out);

// scaled_mm.cpp
std::string explain_scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
                              int64_t swizzle, std::optional<at::Tensor> bias, std::optional<at::ScalarType> out_dtype,
                              bool check_device);
std::tuple<at::Tensor, at::Tensor> mx_quantize(const at::Tensor& x, const std::string& format, bool rceil);

// mx_linear.cpp: MXLinear's fly_scaled_gemm call (weight-only when scale_a is None); None when the
// library declines (the caller dequantizes + F.linear).
std::optional<at::Tensor> mx_linear_run(const at::Tensor& a, const std::optional<at::Tensor>& scale_a,
                                        const at::Tensor& wq, const at::Tensor& scales, const std::string& format,
                                        const std::optional<at::Tensor>& bias,
                                        std::optional<at::ScalarType> out_dtype);

// gemm.cpp (Inductor's candidates; the compile-time provider decides ours or not)
void mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor out, const std::optional<at::Tensor>& workspace);
void addmm_out(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b, at::Tensor out, double beta,
               double alpha, const std::optional<at::Tensor>& workspace);
int64_t gemm_workspace_size(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out);

}  // namespace flyk
