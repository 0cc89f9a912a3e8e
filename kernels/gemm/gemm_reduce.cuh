// SPDX-License-Identifier: Apache-2.0
// Split-K reduction through distributed shared memory, shared by the sm_90a GEMM kernels: every
// CTA of a cluster has parked its fp32 partial tile in its own shared memory (the caller syncs the
// cluster), then CTA `rank` sums its slice of the tile's outer rows over the cluster's `split`
// partials, in rank order (deterministic: the same bits every run, whichever CTA sums an element),
// adds the bias and writes C. The main kernel (gemm_epilogue.cuh reduce_partials, also the cp.async
// kernel's) and the decode kernel (gemm_decode_sm90.cu) use it; independent of the variant's Config.
#pragma once

#include <stdint.h>

#include "common/convert.cuh"
#include "common/sm90.h"

namespace fly::gemm {

// Partial tile layout (fp32) of a TM x TN tile of D: "outer" rows of "inner" contiguous values,
// inner = C's contiguous direction (D's columns j without swap, its rows i with swap), rows padded
// by 4 floats against bank conflicts.
template <int TM, int TN>
struct PartialLayoutT {
  static constexpr int kTileM = TM, kTileN = TN;
  bool swap;
  __device__ int outer_n() const { return swap ? TN : TM; }
  __device__ int inner_n() const { return swap ? TM : TN; }
  __device__ int stride() const { return inner_n() + 4; }
  __device__ int index(int i, int j) const { return swap ? j * stride() + i : i * stride() + j; }
};
// Bytes of a partial tile (either orientation's rows), host and device.
__host__ __device__ constexpr int partial_tile_bytes(int tm, int tn) {
  return (tm * (tn + 4) > tn * (tm + 4) ? tm * (tn + 4) : tn * (tm + 4)) * 4;
}

// Sums slice `rank` of the outer rows of the cluster's `split` partials (layout L, unit u's tile:
// D rows u.tm * TM.., columns u.tn * TN..) and writes C through `out` (View: Elem, c, bias[C's N],
// ldc, rows and cols of D, swap (C = D^T), vec: 8-byte stores of 4 elements allowed). NT threads,
// ct = 0 .. NT - 1.
template <int NT, class View, class Unit, class Layout>
__device__ __forceinline__ void reduce_partials_t(const View& out, const Unit& u, const float* part, const Layout& L,
                                                  int rank, int split, int ct) {
  using E = typename View::Elem;
  const int outer_n = L.outer_n(), inner4 = L.inner_n() / 4;
  const int o_begin = rank * outer_n / split, o_end = (rank + 1) * outer_n / split;
  const uint32_t base = sm90::smem_u32(part);
  // C coordinates of the tile origin: row (m) and column (n) of C.
  const int crow0 = out.swap ? u.tn * Layout::kTileN : u.tm * Layout::kTileM;
  const int ccol0 = out.swap ? u.tm * Layout::kTileM : u.tn * Layout::kTileN;
  const int c_rows = out.swap ? out.cols : out.rows;  // C's M
  const int c_cols = out.swap ? out.rows : out.cols;  // C's N
  const int count = (o_end - o_begin) * inner4;
  for (int e = ct; e < count; e += NT) {
    const int o = o_begin + e / inner4, in = (e % inner4) * 4;
    const int crow = crow0 + o, ccol = ccol0 + in;
    if (crow >= c_rows || ccol >= c_cols) continue;
    const uint32_t off = static_cast<uint32_t>(o * L.stride() + in) * 4;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int r = 0; r < split; ++r) {
      const float4 v = sm90::ld_cluster_f4(sm90::mapa(base + off, r));
      s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
    }
    float v[4] = {s.x, s.y, s.z, s.w};
    auto* dst = out.c + static_cast<int64_t>(crow) * out.ldc + ccol;
    if (out.vec && ccol + 3 < c_cols) {
      E h[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) h[q] = fly::from_float<E>(v[q] + (out.bias ? fly::to_float(out.bias[ccol + q]) : 0.f));
      *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(h);
    } else {
      for (int q = 0; q < 4 && ccol + q < c_cols; ++q)
        dst[q] = fly::from_float<E>(v[q] + (out.bias ? fly::to_float(out.bias[ccol + q]) : 0.f));
    }
  }
}

}  // namespace fly::gemm
