// SPDX-License-Identifier: Apache-2.0
// Kernel parameters of the MX family (mx_quantize, mxfp scaled GEMM), shared by the launchers
// (src/ops/mx.cpp) and the kernels (kernels/mx/*.cu). Plain C++.
#pragma once
#include <stdint.h>

struct MxQuantizeParams {
  const void* x;     // [M, K], row stride ldx elements
  void* q;           // [M, K] E4M3 bytes or [M, K/2] packed E2M1 bytes, contiguous rows
  uint8_t* scales;   // [M, K/32] E8M0, contiguous
  int64_t M, K, ldx;
  int32_t src;       // 0 fp16, 1 bf16, 2 fp32
  int32_t fp4;       // 1: E2M1 output
  int32_t rceil;     // 1: RCEIL scale rule, 0: OCP FLOOR
  int32_t vec_x;     // 1: x base and row stride allow 16-byte loads
  int32_t vec_q;     // 1: q base allows 16-byte stores
};

struct MxGemmParams {
  const uint8_t* a;      // [M, K] E4M3 or [M, K/2] E2M1x2, row stride lda bytes
  const uint8_t* b;      // [N, K] E4M3 or [N, K/2] E2M1x2, row stride ldb bytes
  const uint8_t* sa;     // [M, K/32] E8M0
  const uint8_t* sb;     // [N, K/32] E8M0
  const void* bias;      // [N] in c's dtype, or nullptr
  void* c;               // [M, N], row stride ldc elements
  int64_t M, N, K, lda, ldb, ldc;
  int32_t fp4;           // operands are packed E2M1
  int32_t out_bf16;      // 1: BF16 output, 0: FP16
};
