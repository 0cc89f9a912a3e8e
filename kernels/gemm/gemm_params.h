// SPDX-License-Identifier: Apache-2.0
// Parameters of the sm_90a GEMM kernel (kernels/gemm/gemm_sm90.cu), shared by host and device.
//
// The kernel computes D[rows, cols] = P[rows, K] * Q[K, cols] (+ bias), FP32 accumulation, and
// stores D into C. Normally P = A, Q = B and D = C. With swap-AB (small M) P = B^T, Q = A^T and
// D = C^T, so the large N dimension fills wgmma's 64-row M side and the small M sits on its N side.
// P and Q each come through a 128B-swizzled TMA tensor map, K-major or MN-major (the kernel picks
// the wgmma transpose bits from p_kmajor / q_kmajor).
#pragma once

#include <cuda.h>  // CUtensorMap (a 64-byte aligned POD): fine on host and device
#include <stdint.h>

#include "gemm/gemm_operand.h"

namespace fly::gemm {

struct GemmParams {
  CUtensorMap tm_p;  // K-major: dims {K, rows}, box {64, BM}; MN-major: dims {rows, K}, box {64, 64}
  CUtensorMap tm_q;  // K-major: dims {K, cols}, box {64, BN}; MN-major: dims {cols, K}, box {64, 64}
  // Variants with KB > 1 k blocks per stage (FLY_KB): MN-major maps above have boxes {64, 64 KB};
  // a K-major operand also gets a 3-D view (64, rows, K / 64) with box {64, rows, KB}, so one TMA
  // instruction brings a stage's KB k blocks (each a plain 128B-swizzled [rows][64] tile). Stages
  // that run past K use the 2-D map (per k block, zero-filled). Unused (zero) when KB == 1; tm_p3
  // also with P multicast (MP = 2), whose CTAs each bring one k block through tm_p ({64, BM} box).
  CUtensorMap tm_p3;
  CUtensorMap tm_q3;
  // The TMA-store epilogues (epi = 2, 3) write C through this map: dims {N, M}, box {64, 16} (one
  // warp's rows of one pass), 128B-swizzled. Encoded only when c_tma is 1 (no swap-AB, C 16-byte
  // aligned, ldc * 2 a multiple of 16); otherwise those variants store straight from the
  // accumulators.
  CUtensorMap tm_c;
  void* c;           // C[M, N] row-major, leading stride ldc (elements)
  const void* bias;  // bias[N] or nullptr
  int64_t ldc;
  int32_t rows, cols, k;   // D's shape and the reduction length
  int32_t p_kmajor, q_kmajor;
  int32_t swap;            // 1: D[i][j] -> C[j][i]; bias indexed by i
  int32_t tiles_m, tiles_n;  // tiles of D (BM x BN)
  int32_t strip_m;         // rasterization: tiles visited in column strips strip_m tiles tall
  int32_t split;           // split-K factor == cluster size along x (1: persistent, no split)
  int32_t kb_per_split;    // k steps (KB x 64 wide: one ring stage each) per split
  int32_t c_vec;           // 1: C base 8-byte aligned and ldc % 4 == 0 (vector stores allowed)
  int32_t c_tma;           // 1: tm_c is valid (epi = 2, 3 variants store C with TMA)
  int32_t mc;              // CTAs per multicast cluster along M (must equal the variant's FLY_MC)
  int32_t k_stagger;       // 1: units spanning all of K start their k walk at an offset spread
                           // over the CTAs (clusters) and wrap around, so the CTAs do not all
                           // read the same k block at once (launch axis "ks" of tuning/gemm.json)
  // Stream-K (split == 1 only; launch axis split = 1 of tuning/gemm.json; gemm_plan.h
  // plan_stream_k, gemm_streamk.h sk_cta_unit): the last sk_tiles tiles of the raster order are
  // not given whole to CTAs. In super tiles of sk_group tiles (one column, sk_group rows) and
  // groups of sk_group CTAs (each CTA of a group takes one row of its group's super tiles), their
  // k steps are cut into gridDim.x / sk_group contiguous ranges of equal length (+-1), one per
  // group, after the group's data-parallel super tiles (a multiple of the groups). A tile cut
  // between CTAs is finished by the CTA holding its last k step (the owner): the others
  // (contributors, lower CTA indices) leave fp32 partials in sk_ws, slot blockIdx.x, and raise
  // sk_flags[2 * blockIdx.x + consumer warpgroup] to sk_epoch; the owner adds them in CTA order
  // (deterministic), resets the flags to 0 and stores the tile. A CTA only ever waits for
  // lower-indexed CTAs. sk_tiles == 0: no stream-K (sk_ws, sk_flags unused).
  int32_t sk_tiles;
  int32_t sk_group;    // tiles per stream-K super tile = CTAs per group (gemm_scheduler.cuh)
  uint32_t sk_epoch;   // the value contributors raise a flag to: nonzero, new for every launch
  uint32_t* sk_flags;  // 2 per CTA; 0 between launches (each launch leaves them 0)
  float* sk_ws;        // one BM x BN fp32 slot per CTA (2 x 128 threads x Config::ACC floats)
};

// Constants the host needs to size launches (must match the kernel's Config).
constexpr int kThreads = 384;  // 1 producer + 2 consumer warpgroups
constexpr int kBM = 128;  // tile rows of P (the default; narrow variants use 64)
constexpr int kBK = 64;   // k elements of one k block of the 16-bit dense kernel (one 128-byte row)
constexpr int kCBytes = 2;  // the dense kernels' C element (FP16 / BF16)

// Rows of one TMA box of an operand tile of `rows` rows (`rows` / cluster when multicast): a box
// spans at most 256 rows, so a 320-row Q tile comes in two boxes of 160.
inline constexpr int tma_box_rows(int rows) { return rows > 256 ? rows / 2 : rows; }

// Staging tile of one consumer warpgroup for the shared-memory epilogue (epi = 1): its 64 x bn
// block of D as 16-bit C elements, rows padded by 8 elements against bank conflicts, staged in
// passes of epi_pass_cols(bn) D columns (all of them up to bn = 128, else 64). Without swap a pass
// is 64 rows of cols + 8; with swap (C = D^T) cols rows of 64 + 8; the latter is never smaller.
inline constexpr int epi_pass_cols(int bn) { return bn <= 128 ? bn : 64; }
// epi = 2, 3 (TMA stores): each warp of a consumer warpgroup stages its 16 rows of the warpgroup's
// 64 x bn block in passes of 64 columns, into a ring of its own 16 x 64 boxes (2 KiB each,
// 128B-swizzled, tm_c's box), and stores each with TMA (gemm_epilogue.cuh store_tile_tma). epi = 2:
// 2 boxes per warp, used in turn; epi = 3: one per 64 columns (bn / 64), so a warp stages its whole
// row band before reusing any. The area is 1 KiB-aligned first (smem_bytes adds the slack).
inline constexpr int kEpiWarpRows = 16;
inline constexpr int kEpiWarpBox = kEpiWarpRows * kRowBytes;  // 16 rows of 64 C elements
inline constexpr int epi_warp_boxes(int bn, int epi) { return epi == 3 ? bn / 64 : 2; }
inline constexpr int epi_wg_bytes(int bn, int epi = 1) {
  return epi >= 2 ? 4 * epi_warp_boxes(bn, epi) * kEpiWarpBox : epi_pass_cols(bn) * (64 + 8) * kCBytes;
}

// Stream-K workspace: the flags (2 per CTA, padded to 256 bytes), then one BM x BN fp32 slot per CTA.
inline constexpr int64_t sk_flags_bytes(int64_t ctas) { return (ctas * 8 + 255) / 256 * 256; }
inline constexpr int64_t sk_workspace_bytes(int64_t ctas, int bm, int bn) {
  return sk_flags_bytes(ctas) + ctas * int64_t(bm) * bn * 4;
}

// Host planning (gemm_plan.h, gemm_decode.h): one 128B-swizzled tiled tensor map of elements of
// `dt` (operand_traits), which every map of both GEMM kernels is. `encode` is the driver's
// cuTensorMapEncodeTiled (or a test's stand-in); dims, the outer dims' byte strides and the box
// are the caller's, innermost first.
template <class Encode>
CUresult encode_sw128(Encode encode, CUtensorMap* map, cuuint32_t rank, const void* data, const cuuint64_t* dims,
                      const cuuint64_t* strides, const cuuint32_t* box, Dtype dt, CUtensorMapL2promotion l2) {
  const cuuint32_t estr[3] = {1, 1, 1};
  return encode(map, tma_dtype(dt), rank,
                const_cast<void*>(data), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, l2, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// kw = 2 (narrow tiles whose consumer warpgroups split the k steps): the exchange area where each
// warpgroup leaves the half of its fp32 64 x bn partial tile that the other one stores.
inline constexpr int kw_exchange_bytes(int bn) { return 64 * bn * 4; }

inline constexpr int smem_bytes(int bn, int stages, int epi = 0, int bm = kBM, int kb = 1, int kw = 1) {
  // stages * (P tile + Q tile, kb k blocks of each) + barriers + 1 KiB for aligning the base to
  // 1024 bytes, then the two consumer warpgroups' epilogue staging tiles (epi = 1, or epi = 2 and 3
  // with 1 KiB of alignment slack), or the kw = 2 exchange area.
  return stages * kb * (bm + bn) * kRowBytes + 2 * stages * 8 + 1024 +
         (epi >= 2 ? 1024 + 2 * epi_wg_bytes(bn, epi) : epi ? 2 * epi_wg_bytes(bn) : 0) +
         (kw == 2 ? kw_exchange_bytes(bn) : 0);
}

}  // namespace fly::gemm
