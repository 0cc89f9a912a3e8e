// SPDX-License-Identifier: Apache-2.0
// Kernel parameters of rmsnorm_fwd, shared by the launcher (host) and the kernel (device).
#pragma once
#include <stdint.h>

struct RmsNormParams {
  const void* x;   // [M, N], row stride ldx (elements)
  const void* w;   // [N] or nullptr (no weight)
  void* y;         // [M, N], row stride ldy
  float* rstd;     // [M] or nullptr
  int64_t M, N, ldx, ldy;
  float eps;
  // Rows fall into `period` alignment classes (row r has class r % period): every row of a class
  // starts at the same offset modulo 16 bytes, so one row group serves one class and keeps the
  // weight, shifted to that class's alignment, in registers across all its rows.
  int32_t period;
  int32_t groups;  // row groups in the grid (a multiple of period)
  int32_t vec_io;  // 1: x and y rows share their alignment, so 16-byte vectors serve both
  // Ring variants (FLY_PF >= 2): bytes of one shared-memory row slot (it holds the row's
  // 16-byte-aligned body), or 0: the ring cannot be used for this call and the kernel runs its
  // register path (as pf = 0).
  int32_t stage_bytes;
};

// Shared memory of a ring variant: rpc groups x ring slots of stage_bytes.
inline int64_t rmsnorm_ring_stage_bytes(int64_t n, int64_t es) { return n * es / 16 * 16 + 16; }
