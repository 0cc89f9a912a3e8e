// SPDX-License-Identifier: Apache-2.0
// Kernel parameters of add_rmsnorm_fwd / add_rmsnorm_bwd / add_rmsnorm_dw, shared by the launcher
// (host) and the kernels (device).
#pragma once
#include <stdint.h>

// The backward writes one FP32 partial row of dweight per CTA (workspace [ctas, N]) and reduces
// them in a fixed order: at most this many CTAs, so the workspace size is a function of the shape
// alone (fly_add_rms_norm_bwd_workspace_size needs no device).
#define FLY_ADD_RMSNORM_BWD_MAX_CTAS 512

struct AddRmsNormFwdParams {
  const void* x;         // [M, N], row stride ldx (elements)
  const void* residual;  // [M, N]
  const void* w;         // [N] or nullptr (a weight of ones)
  void* y;               // [M, N]: h * rstd * w
  void* h;               // [M, N]: x + residual, rounded to the dtype
  float* rstd;           // [M] or nullptr
  int64_t M, N;
  int64_t cols;          // 16-byte units per row: ceil(N / elements per 16 bytes)
  int64_t ldx, ldr, ldy, ldh;
  float eps;
  int32_t vec;           // 1: every row of every operand (and w) 16-byte aligned, N a whole number of units;
                         // 0: element loads, the row end masked
};

struct AddRmsNormBwdParams {
  const void* dy;        // [M, N]
  const void* dh;        // [M, N] or nullptr: the gradient arriving on h (the residual stream)
  const void* h;         // [M, N]
  const void* w;         // [N] or nullptr
  const float* rstd;     // [M]
  void* dx;              // [M, N]: the gradient of x and of residual (they are equal)
  float* partial;        // [gridDim.x, N] FP32 partial sums of dweight (nullptr without a weight)
  int64_t M, N;
  int64_t cols;
  int64_t lddy, lddh, ldh, lddx;
  int32_t vec;
};

struct AddRmsNormDwParams {
  const float* partial;  // [parts, N]
  void* dw;              // [N]
  int64_t N;
  int32_t parts;
};
