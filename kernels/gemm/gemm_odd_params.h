// SPDX-License-Identifier: Apache-2.0
// Parameters of the cp.async GEMM kernel (kernels/gemm/gemm_odd_sm90.cu), shared by host and
// device: the dense kernel's GemmParams core (tile counts, raster strip, C, bias, the layout
// bits; its tensor maps unused, zero) plus where the two operands are and the widest load granule
// each one's alignment allows. This is the path for strides TMA cannot address: leading
// dimensions that are not multiples of 16 bytes, bases that are only element-aligned.
#pragma once

#include <stdint.h>

#include "common/pack_params.h"
#include "gemm/gemm_params.h"

namespace fly::gemm {

// One operand as the loads see it: element (r, k) of the logical [rows, K] matrix (P = A, Q = B^T)
// at data[r * ld + k] (K-major) or data[r + k * ld] (MN-major: which one is GemmParams::p_kmajor /
// q_kmajor). `gran` is the bytes of one load: 16, 8 or 4 (one cp.async each) or 2 (one element,
// loaded through a register): the largest power of two dividing the base address and, when the
// strided dimension has more than one line, ld * 2.
struct OddOperand {
  const void* data;
  int64_t ld;
  int32_t rows;
  int32_t gran;
};

struct OddTail {
  OddOperand p, q;
};

struct OddGemmParams {
  GemmParams core;
  OddTail tail;
};

// Threads of the kernel: a loading warpgroup and two consumer warpgroups, as the TMA kernel.
constexpr int kOddThreads = 384;

// Dynamic shared memory: the TMA kernel's ring and barriers (gemm_params.h smem_bytes, no staged
// epilogue) plus, per stage, one word per tile row: the 33rd word of each row's window when an
// operand's lines are only 2-byte aligned (gemm_odd_sm90.cu copy_tile_e2).
inline constexpr int odd_smem_bytes(int bn, int stages) { return smem_bytes(bn, stages) + stages * (kBM + bn) * 4; }

// The packed path (fly_gemm with a large enough workspace): an operand TMA cannot address is first
// copied by fly_pack_lines_sm90 (kernels/common/pack_lines.cuh, in the cp.async variants' cubins)
// into the workspace with 16-byte lines, then the TMA kernel reads the copy (one plane: the matrix).
using fly::kPackThreads;
using fly::PackParams;

}  // namespace fly::gemm
