// SPDX-License-Identifier: Apache-2.0
// Host-side planning of one launch of the cp.async GEMM kernel (kernels/gemm/gemm_odd_sm90.cu):
// the path fly_gemm takes when TMA cannot address an operand (src/ops/gemm.cpp). Host-only,
// header-only; the CPU tests call it directly.
#pragma once

#include <stdint.h>

#include <algorithm>
#include <cstring>

#include "gemm/gemm_odd_params.h"
#include "gemm/gemm_plan.h"

namespace fly::gemm {

// The widest load granule (bytes) an operand allows: 16, 8, 4 or the element (2). Every line of
// the operand (a row when K-major, a k row when MN-major) must start on a granule boundary, so the
// granule divides the base address and, when there is more than one line, ld * element bytes.
inline int operand_granule(const Operand& o, int64_t k, Dtype dt) {
  const int eb = elem_bytes(dt);
  const uintptr_t base = reinterpret_cast<uintptr_t>(o.data);
  const int64_t outer = o.kmajor ? o.rows : k;  // lines of the strided dimension
  for (int g = 16; g > eb; g /= 2)
    if (base % uintptr_t(g) == 0 && (outer <= 1 || (o.ld * eb) % g == 0)) return g;
  return eb;
}

struct OddLaunch {
  OddGemmParams params;
  unsigned grid;
  unsigned cluster;  // == params.core.split
  unsigned smem;
};

// Whether the problem needs this path: TMA cannot address A or B (gemm_plan.h's 16-byte rules).
inline bool needs_odd_path(const Problem& pr) {
  return operand_tma_problem(pr.a, pr.K, pr.dtype) != nullptr || operand_tma_problem(pr.bt, pr.K, pr.dtype) != nullptr;
}

// 128 x bn tiles, no swap-AB, no stream-K, no multicast. Persistent (grid <= SMs) unless the tiles
// fill less than half the GPU: then split-K clusters as the TMA kernel plans them (choose_split:
// the largest split up to 8 whose clusters fit one wave, each slice keeping 4 k steps). The raster
// strip as the TMA kernel picks it.
inline void plan_odd(const Problem& pr, int bn, int stages, int sm_count, OddLaunch* out) {
  std::memset(&out->params, 0, sizeof(out->params));
  GemmParams& p = out->params.core;
  p.c = pr.c;
  p.bias = pr.bias;
  p.ldc = pr.ldc;
  p.rows = static_cast<int32_t>(pr.M);
  p.cols = static_cast<int32_t>(pr.N);
  p.k = static_cast<int32_t>(pr.K);
  p.p_kmajor = pr.a.kmajor;
  p.q_kmajor = pr.bt.kmajor;
  p.swap = 0;
  p.tiles_m = static_cast<int32_t>((pr.M + kBM - 1) / kBM);
  p.tiles_n = static_cast<int32_t>((pr.N + bn - 1) / bn);
  const int64_t bk = kRowBytes / elem_bytes(pr.dtype);
  const int64_t kb_total = (pr.K + bk - 1) / bk;
  const int64_t tiles = int64_t(p.tiles_m) * p.tiles_n;
  int split = std::max(1, std::min(choose_split(tiles, kb_total, sm_count), 8));
  const int64_t kbps = (kb_total + split - 1) / split;
  if (split > 1) split = static_cast<int>((kb_total + kbps - 1) / kbps);  // no empty slice
  p.split = split;
  p.kb_per_split = static_cast<int32_t>(split > 1 ? kbps : kb_total);
  p.c_vec = (reinterpret_cast<uintptr_t>(pr.c) % 8 == 0) && (pr.ldc % 4 == 0);
  p.mc = 1;
  out->cluster = static_cast<unsigned>(split);
  out->grid = split > 1 ? static_cast<unsigned>(tiles * split)
                        : static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(tiles, sm_count)));
  const int64_t wave = split > 1 ? std::max<int64_t>(1, sm_count / split) : int64_t(out->grid);
  p.strip_m = raster_group(p.tiles_m, p.tiles_n, kBM, bn, std::min<int64_t>(wave, tiles));
  OddTail& t = out->params.tail;
  t.p = {pr.a.data, pr.a.ld, static_cast<int32_t>(pr.M), operand_granule(pr.a, pr.K, pr.dtype)};
  t.q = {pr.bt.data, pr.bt.ld, static_cast<int32_t>(pr.N), operand_granule(pr.bt, pr.K, pr.dtype)};
  out->smem = static_cast<unsigned>(odd_smem_bytes(bn, stages));
}

// ---- the packed path: an aligned copy in the workspace, then the TMA kernel ----------------------
// Lines and line length of an operand as it lies in memory (gemm_odd_params.h PackParams).
inline int64_t operand_lines(const Operand& o, int64_t k) { return o.kmajor ? o.rows : k; }
inline int64_t operand_line_len(const Operand& o, int64_t k) { return o.kmajor ? k : o.rows; }
inline int64_t pack_ld(int64_t len) { return (len + 7) / 8 * 8; }
// Workspace bytes of the operand's aligned copy (a multiple of 256, so copies can follow each other).
inline int64_t pack_bytes(const Operand& o, int64_t k, Dtype dt) {
  return (operand_lines(o, k) * pack_ld(operand_line_len(o, k)) * elem_bytes(dt) + 255) / 256 * 256;
}
// The copy's launch (fly_pack_lines_sm90, grid {grid, 1, 1}): one thread per 16-byte chunk of the
// copy, grid-stride over at most 8 blocks per SM; `dst` 256-byte aligned. `packed` is the operand
// as the TMA kernel then reads it.
struct PackLaunch {
  PackParams params;
  unsigned grid;
  Operand packed;
};
inline void plan_pack(const Operand& o, int64_t k, void* dst, int sm_count, PackLaunch* out) {
  PackParams& p = out->params;
  p = PackParams{};  // one plane: src_sz, src_sy, dst_plane stay 0
  p.src = o.data;
  p.dst = dst;
  p.lines = operand_lines(o, k);
  p.len = operand_line_len(o, k);
  p.sld = p.lines > 1 ? o.ld : p.len;
  p.dld = pack_ld(p.len);
  const int64_t chunks = p.lines * (p.dld / 8);
  const int64_t blocks = (chunks + kPackThreads - 1) / kPackThreads;
  out->grid = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t(sm_count) * 8)));
  out->packed = Operand{dst, o.rows, p.dld, o.kmajor};
}

}  // namespace fly::gemm
