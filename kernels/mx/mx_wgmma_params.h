// SPDX-License-Identifier: Apache-2.0
// Kernel parameters and shared-memory plan of the wgmma MX GEMM (kernels/mx/mxfp_wgmma.cu), shared
// by the launcher (src/ops/mx.cpp) and the kernel. Host and device; plain C++ plus CUtensorMap.
#pragma once
#include <cuda.h>  // CUtensorMap (a 64-byte aligned POD)
#include <stdint.h>

#if defined(__CUDACC__)
#define FLY_MXW_HD __host__ __device__ __forceinline__
#else
#define FLY_MXW_HD inline
#endif

namespace fly::mxw {

constexpr int kBM = 128;          // CTA tile rows: two consumer warpgroups of 64 rows
constexpr int kKStep = 128;       // k elements per ring stage: four k32 blocks, one 128-byte FP8 row
constexpr int kThreads = 384;     // producer warpgroup + two consumer warpgroups
constexpr int kProducerRegs = 56;  // setmaxnreg split 56 / 224 (56 * 128 + 224 * 256 = 64512)
constexpr int kConsumerRegs = 224;

// One ring stage (every part a multiple of 1024 bytes, the sb tile rounded up, so each tile keeps the 128B-swizzle atom
// alignment): A [128][128 B] and B [bn][128 B] E4M3 tiles (128B-swizzled, the wgmma operands),
// the decoded scales as floats [4 k32][128] and [4][bn], and the raw packed E2M1 tiles [128][64 B]
// and [bn][64 B] that MXFP4's TMA lands in before the producer widens them into A / B.
constexpr int a_bytes() { return kBM * 128; }
constexpr int b_bytes(int bn) { return bn * 128; }
constexpr int sa_bytes() { return 4 * kBM * 4; }
constexpr int sb_bytes(int bn) { return (4 * bn * 4 + 1023) / 1024 * 1024; }  // BN 32: 512 -> 1 KiB
constexpr int raw_bytes(int bn) { return (kBM + bn) * 64; }
// The k128 fold (variants with fold = 1, MXFP4 only): per row of the stage the folded scale (float),
// the four k32 shifts (bytes of a uint32) and the stage's fold flag, rounded up to 1 KiB.
constexpr int fold_bytes(int bn, bool fold) { return fold ? ((kBM + bn) * 8 + 16 + 1023) / 1024 * 1024 : 0; }
constexpr int stage_bytes(int bn, bool fold = false) {
  return a_bytes() + b_bytes(bn) + sa_bytes() + sb_bytes(bn) + raw_bytes(bn) + fold_bytes(bn, fold);
}
constexpr int stages(int bn) { return bn <= 32 ? 6 : bn <= 64 ? 5 : 4; }
// The producer's scale prefetch (variants with pipe = 2): per tile row (A rows, then B rows) the
// E8M0 bytes of the four stages of the current chunk, one uint32 per stage (thread-owned: each
// producer thread writes and reads only its own rows), after the barriers.
constexpr int kScaleChunk = 4;  // stages per prefetched chunk
constexpr int prefetch_bytes(int bn, bool prefetch) { return prefetch ? (kBM + bn) * kScaleChunk * 4 : 0; }
// Dynamic shared memory: 1024 bytes of alignment slack, the ring, 3 mbarriers per stage, the
// prefetch buffer.
constexpr int smem_bytes(int bn, bool fold = false, bool prefetch = false) {
  return 1024 + stages(bn) * stage_bytes(bn, fold) + stages(bn) * 3 * 8 + prefetch_bytes(bn, prefetch);
}
// Largest spread (binades) of a row's four k32 scales that the fold takes: E2M1 * 2^-d stays a
// normal E4M3 code for d <= 5 (0.5 * 2^-5 = 2^-6), so the widening just lowers exponent fields.
constexpr int kFoldMaxShift = 5;

struct Params {
  // FP8: dims {K, rows} bytes, box {128, rows of the tile}, 128B swizzle.
  // FP4: dims {K / 2, rows} bytes, box {64, rows of the tile}, no swizzle (widened in shared memory).
  // Outside the matrix TMA fills zeros.
  CUtensorMap tm_a;
  CUtensorMap tm_b;
  const uint8_t* sa;  // [M, K/32] E8M0, contiguous
  const uint8_t* sb;  // [N, K/32] E8M0, contiguous
  const void* bias;   // [N] in c's dtype, or nullptr
  void* c;            // [M, N], row stride ldc elements
  int64_t ldc;
  int32_t M, N, K;
  int32_t tiles_m, tiles_n, strip_m;  // tiles visited in column strips strip_m tile rows tall
  int32_t fp4;        // operands are packed E2M1
  int32_t out_bf16;   // 1: BF16 output, 0: FP16
};

// Split-K variants (FLY_SPLIT, `_s<split>`): work unit u = tile u / splits, split u % splits,
// which runs the tile's stages [q * ksteps / splits, (q + 1) * ksteps / splits) (ksteps =
// ceil(K / 128); an empty range writes zeros) and stores its FP32 partial to ws[q][M][N]; the
// second kernel of the module (mxfp_splitk_reduce) sums the partials in split order (fixed:
// deterministic), adds the bias and rounds to c. splits == 1: the unsplit epilogue, ws unused.
struct SplitParams : Params {
  float* ws;          // [splits][M][N] FP32 partials (splits > 1)
  int32_t splits;     // >= 1
  int32_t pad_;
};
struct SplitReduceParams {
  const float* ws;    // [splits][M][N]
  const void* bias;   // [N] in c's dtype, or nullptr
  void* c;            // [M, N], row stride ldc elements
  int64_t ldc;
  int32_t M, N, splits, out_bf16;
};
constexpr int kReduceThreads = 256;
// The split count a launch uses (src/ops/mx.cpp, fly_scaled_gemm_workspace_size): the variant's
// `split`, at most the stage count and at most the split that keeps the units in one wave of
// `sms` CTAs (tiles * splits <= sms); 1 means the unsplit path.
FLY_MXW_HD int split_count(int split, int64_t tiles, int64_t ksteps, int64_t sms) {
  int64_t s = split;
  if (ksteps < s) s = ksteps;
  const int64_t wave = tiles > 0 ? sms / tiles : 1;
  if (wave < s) s = wave;
  return s < 1 ? 1 : int(s);
}
// The split count of a launch of variant (split, bn) on M x N x K over `sms` SMs: split_count over
// its tiles and stages (1 for a variant without a split axis, split < 2).
FLY_MXW_HD int launch_splits(int split, int bn, int64_t M, int64_t N, int64_t K, int64_t sms) {
  if (split < 2) return 1;
  const int64_t tiles = ((M + kBM - 1) / kBM) * ((N + bn - 1) / bn);
  return split_count(split, tiles, (K + kKStep - 1) / kKStep, sms);
}
// Workspace bytes of a split launch: the partials, rounded up to 256.
FLY_MXW_HD int64_t split_ws_bytes(int splits, int64_t M, int64_t N) {
  return splits > 1 ? (int64_t(splits) * M * N * 4 + 255) / 256 * 256 : 0;
}

// Tile t of the persistent raster order: column strips strip_m tile rows tall (as the dense
// GEMM's scheduler walks them, so CTAs running together share A rows and B columns in L2).
struct Tile {
  int tm, tn;
};
FLY_MXW_HD Tile tile_of(int tiles_m, int tiles_n, int strip_m, int t) {
  const int strip = strip_m > 0 ? strip_m : 1;
  const int per_strip = strip * tiles_n;
  const int g = t / per_strip;
  const int first = g * strip;
  const int left = tiles_m - first;
  const int gsz = left < strip ? left : strip;
  const int r = t - g * per_strip;
  return Tile{first + r % gsz, r / gsz};
}

// The wgmma m64nN D fragment: accumulator i of thread ct (0..127) of the warpgroup holds row
// 16 (ct / 32) + (ct % 32) / 4 + 8 ((i / 2) % 2) and column 8 (i / 4) + 2 (ct % 4) + i % 2.
FLY_MXW_HD int acc_row(int ct, int i) { return 16 * (ct / 32) + (ct % 32) / 4 + 8 * ((i / 2) % 2); }
FLY_MXW_HD int acc_col(int ct, int i) { return 8 * (i / 4) + 2 * (ct % 4) + i % 2; }

}  // namespace fly::mxw
