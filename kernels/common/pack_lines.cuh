// SPDX-License-Identifier: Apache-2.0
// The line-packing copy (pack_params.h): one thread per 16-byte chunk of the copy. A chunk whose
// source lies inside its line reads the one or two aligned 16-byte words around it (never outside
// the line, so never outside the tensor) and shifts the wanted 16 bytes out of them (the
// misalignment is a multiple of 2 bytes: by 8, 4 and 2 in three selects); a chunk at a line's ends
// loads its elements one by one, zeros past the line's end. Included by the cubins of the families
// with a packed path (gemm_odd_sm90.cu, attention_fwd.cu); the launcher takes the kernel from the
// cubin of the variant it runs with.
#pragma once

#include <stdint.h>

#include "common/pack_params.h"

namespace fly::pack {

__device__ __forceinline__ uint4 ldg16(const char* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

// The 16 bytes of elements [e0, e0 + 8) of the line at `src` (len elements), zeros past its end.
__device__ __forceinline__ uint4 chunk(const uint16_t* src, int64_t len, int64_t e0) {
  const char* s = reinterpret_cast<const char*>(src + e0);
  const int off = static_cast<int>(reinterpret_cast<uintptr_t>(s) & 15);
  const char* w = s - off;
  const char* begin = reinterpret_cast<const char*>(src);
  const char* end = reinterpret_cast<const char*>(src + len);
  if (w >= begin && w + (off ? 32 : 16) <= end) {
    const uint4 lo = ldg16(w);
    if (off == 0) return lo;
    const uint4 hi = ldg16(w + 16);
    const uint32_t x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    uint32_t y[6], z[5], o[4];  // words from the chunk's start: shifted by 8 bytes, then by 4
#pragma unroll
    for (int i = 0; i < 6; ++i) y[i] = (off & 8) ? x[i + 2] : x[i];
#pragma unroll
    for (int i = 0; i < 5; ++i) z[i] = (off & 4) ? y[i + 1] : y[i];
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = (off & 2) ? __funnelshift_r(z[i], z[i + 1], 16) : z[i];
    return make_uint4(o[0], o[1], o[2], o[3]);
  }
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t e = e0 + 2 * i;
    const uint32_t v0 = e < len ? __ldg(src + e) : 0u;
    const uint32_t v1 = e + 1 < len ? __ldg(src + e + 1) : 0u;
    o[i] = v0 | (v1 << 16);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

}  // namespace fly::pack

extern "C" __global__ void __launch_bounds__(fly::kPackThreads) fly_pack_lines_sm90(const __grid_constant__ fly::PackParams pp) {
  const int64_t chunks = pp.dld / 8, total = pp.lines * chunks;
  const int64_t z = blockIdx.z, y = blockIdx.y;
  const uint16_t* src = static_cast<const uint16_t*>(pp.src) + z * pp.src_sz + y * pp.src_sy;
  uint16_t* dst = static_cast<uint16_t*>(pp.dst) + (z * int64_t(gridDim.y) + y) * pp.dst_plane;
  for (int64_t i = int64_t(blockIdx.x) * fly::kPackThreads + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * fly::kPackThreads) {
    const int64_t line = i / chunks, c = i - line * chunks;
    const uint4 v = fly::pack::chunk(src + line * pp.sld, pp.len, c * 8);
    *reinterpret_cast<uint4*>(dst + line * pp.dld + c * 8) = v;
  }
}
