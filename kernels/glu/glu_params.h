// SPDX-License-Identifier: Apache-2.0
// Kernel parameters of glu_fwd / glu_bwd, shared by the launcher (host) and the kernels (device).
#pragma once
#include <stdint.h>

// act(g) of the gated linear unit: the values of fly_glu_activation (flykernels.h).
enum GluAct : int32_t { kGluSilu = 0, kGluGeluTanh = 1, kGluGelu = 2 };

struct GluParams {
  const void* gate;  // [M, N], row stride ld_gate (elements)
  const void* up;    // [M, N], row stride ld_up
  const void* dout;  // backward: the output's gradient [M, N]; forward: unused
  void* out;         // forward: act(gate) * up; backward: the gate's gradient
  void* dup;         // backward: the up operand's gradient; forward: unused
  int64_t M;
  int64_t cols;      // units per row: 16-byte vectors when vec, else elements
  int64_t ld_gate, ld_up, ld_dout, ld_out, ld_dup;  // row strides in units of elements
  int32_t act;       // GluAct
  int32_t vec;       // 1: every row of every operand starts 16-byte aligned and N is a whole number of vectors
};
