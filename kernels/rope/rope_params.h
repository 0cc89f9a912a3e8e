// SPDX-License-Identifier: Apache-2.0
// Kernel parameters of rope (kernels/rope/rope.cu), shared by the launcher (host) and the kernel.
#pragma once
#include <stdint.h>

// One rotated tensor (q or k) and its output, [B, H, S, D], strides in elements (inner stride 1).
struct RopeOperand {
  const void* x;
  void* out;
  int64_t H;
  int64_t rows;              // B * H * S; 0: absent (k not given)
  int64_t x_b, x_h, x_s;     // strides of x
  int64_t o_b, o_h, o_s;     // strides of out
};

struct RopeParams {
  RopeOperand t[2];          // q, k
  const void* cos;           // [B or 1, S, W]: W = R (one angle per column) or R / 2 (one per pair)
  const void* sin;
  int64_t cos_b, cos_s;      // strides of cos (cos_b 0: one table for every batch)
  int64_t sin_b, sin_s;
  int64_t S;
  int32_t half;              // R / 2: column c pairs with c + half
  int32_t half_tables;       // 1: W = R / 2, the angle of column c + half is that of c
  int32_t pair_units;        // units per row that rotate (half / V)
  int32_t units;             // units per row: pair_units + the pass-through units of columns [R, D)
  int32_t rot;               // R
  int32_t bwd;               // 1: the adjoint (the gradient of x from the gradient of out)
  int32_t vec;               // 1: units of 16 bytes (every row, table and offset 16-byte aligned)
};
