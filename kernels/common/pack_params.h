// SPDX-License-Identifier: Apache-2.0
// Parameters of the line-packing copy (kernels/common/pack_lines.cuh, fly_pack_lines_sm90), shared
// by host and device: the packed paths of the GEMM (src/ops/gemm.cpp) and the attention forward
// (src/ops/attention.cpp) copy an operand TMA cannot address (a base not 16-byte aligned, or line
// strides that are not multiples of 16 bytes) into a workspace with 16-byte lines, then run their
// TMA kernels on the copy.
#pragma once

#include <stdint.h>

namespace fly {

// Lines of `len` 16-bit elements. In plane (z = blockIdx.z, y = blockIdx.y) line i starts at
// src + z * src_sz + y * src_sy + i * sld (elements; any values, any element-aligned src) and is
// copied to dst + (z * gridDim.y + y) * dst_plane + i * dld, with dld = len rounded up to 8 (the
// copy's elements [len, dld) are zeros) and dst 256-byte aligned. The GEMM copies one plane (a
// matrix); the attention one plane per (batch, head) of a [B, H, S, D] tensor.
struct PackParams {
  const void* src;
  void* dst;
  int64_t lines, len, sld, dld;
  int64_t src_sz, src_sy, dst_plane;
};
constexpr int kPackThreads = 256;

}  // namespace fly
