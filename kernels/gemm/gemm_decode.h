// SPDX-License-Identifier: Apache-2.0
// Decode GEMM (kernels/gemm/gemm_decode_sm90.cu): parameters shared by host and device, and the
// host-side planning of one launch (header-only; the planner is host code).
//
// C[M, N] = A[M, K] * B[K, N] (+ bias) for small M (<= 64) in the NT layout: A row-major
// (K-major) and B column-major, i.e. W = B^T [N, K] K-major, the way a linear layer stores its
// weights. The weights are read once, straight from global memory into registers (16-byte loads,
// no TMA, no shared memory), and fed to mma.sync as its A operand; the activations stream through
// a small TMA ring in shared memory. A cluster of `cl` CTAs splits K and reduces through
// distributed shared memory. See the kernel for the register layout.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <stdint.h>

#include <algorithm>
#include <cstring>

#include "gemm/gemm_params.h"  // encode_sw128

namespace fly::gemm {

struct DecodeParams {
  CUtensorMap tm_a;   // A [M, K] K-major: dims {K, M}, box {64, 8 * mt}, 128-byte swizzle
  const void* w;      // W = B^T [N, K], K-major, rows ldw elements apart, 16-byte aligned
  void* c;            // C [M, N] row-major, rows ldc elements apart
  const void* bias;   // bias[N] or nullptr
  int64_t ldw, ldc;
  int32_t M, N, K;
  int32_t kb_per_cta;  // 64-wide k blocks per CTA of a cluster (the cluster splits K)
  int32_t cl;          // CTAs per cluster (== the launch's cluster size)
};

constexpr int kDecStages = 8;  // activation ring depth (64-wide k blocks)

// Rows of W per CTA, threads per CTA (nw warps) and shared memory: the activation ring, reused
// after the main loop for the fp32 partial tile, C's [8 mt][rows] block with rows of C padded by 4
// floats (gemm_reduce.cuh, as the main kernel's), then the ring's barriers (gemm_ring.cuh).
inline constexpr int decode_rows(int nw, int rpw) { return nw * rpw; }
inline constexpr int decode_threads(int nw) { return nw * 32; }
inline constexpr int decode_region_bytes(int nw, int rpw, int mt) {
  return std::max(kDecStages * mt * 8 * 128, mt * 8 * (decode_rows(nw, rpw) + 4) * 4);
}
inline constexpr int decode_smem_bytes(int nw, int rpw, int mt) {
  return decode_region_bytes(nw, rpw, mt) + 2 * kDecStages * 8 + 1024;
}

struct DecodeShape {
  int nw = 8;   // warps
  int rpw = 16;  // W rows per warp (16 or 32)
  int mt = 8;   // activation rows / 8 (M <= 8 mt)
  int cl = 0;   // cluster size (K split); 0: chosen by choose_decode_cluster
};

// Whether a decode variant takes the problem: NT layout (both operands K-major), M within the
// variant's activation tile, K a multiple of 8 (each thread loads whole 8-element chunks of W
// rows), and a forced cluster no larger than K's 64-wide blocks. (Both operands' 16-byte rules
// were checked by the caller's validation.)
template <class Problem>
inline bool decode_fits(const Problem& pr, const DecodeShape& v) {
  if (!pr.a.kmajor || !pr.bt.kmajor) return false;
  if (pr.M < 1 || pr.M > 8 * v.mt || pr.K % 8 != 0) return false;
  const int64_t kbs = (pr.K + 63) / 64;
  return v.cl == 0 || (v.cl >= 1 && v.cl <= 8 && kbs >= v.cl);
}

// Cluster size when the variant does not force one: the largest of 1, 2, 4, 8 whose CTAs still
// fit about one wave (5/4 of the SMs) while every CTA keeps at least 4 k blocks.
inline int choose_decode_cluster(int64_t tiles, int64_t kbs, int sm_count) {
  int best = 1;
  for (int cl = 2; cl <= 8; cl *= 2)
    if (tiles * cl * 4 <= int64_t(sm_count) * 5 && kbs >= 4 * cl) best = cl;
  return best;
}

struct DecodeLaunch {
  DecodeParams params;
  unsigned grid, cluster, threads, smem;
};

// encode: the driver's cuTensorMapEncodeTiled (see encode_operand in gemm_plan.h).
template <class Problem, class Encode>
CUresult plan_decode(const Problem& pr, const DecodeShape& v, int sm_count, Encode encode, DecodeLaunch* out) {
  DecodeParams& p = out->params;
  std::memset(&p, 0, sizeof(p));
  const cuuint64_t dims[2] = {cuuint64_t(pr.K), cuuint64_t(pr.M)};
  const cuuint64_t strides[1] = {cuuint64_t(pr.M > 1 ? pr.a.ld * 2 : ((pr.K * 2 + 15) / 16) * 16)};
  const cuuint32_t box[2] = {64, cuuint32_t(8 * v.mt)};
  const CUresult r = encode_sw128(encode, &p.tm_a, 2, pr.a.data, dims, strides, box, pr.dtype,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
  if (r != CUDA_SUCCESS) return r;
  const int rows = decode_rows(v.nw, v.rpw);
  const int64_t tiles = (pr.N + rows - 1) / rows;
  const int64_t kbs = (pr.K + 63) / 64;
  int cl = v.cl > 0 ? v.cl : choose_decode_cluster(tiles, kbs, sm_count);
  const int64_t per = (kbs + cl - 1) / cl;
  cl = int((kbs + per - 1) / per);  // no CTA without k blocks
  p.w = pr.bt.data;
  p.c = pr.c;
  p.bias = pr.bias;
  p.ldw = pr.N > 1 ? pr.bt.ld : pr.K;
  p.ldc = pr.ldc;
  p.M = int32_t(pr.M);
  p.N = int32_t(pr.N);
  p.K = int32_t(pr.K);
  p.kb_per_cta = int32_t(per);
  p.cl = cl;
  out->grid = unsigned(tiles * cl);
  out->cluster = unsigned(cl);
  out->threads = unsigned(decode_threads(v.nw));
  out->smem = unsigned(decode_smem_bytes(v.nw, v.rpw, v.mt));
  return CUDA_SUCCESS;
}

}  // namespace fly::gemm
