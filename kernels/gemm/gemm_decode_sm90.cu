// SPDX-License-Identifier: Apache-2.0
// Decode GEMM for sm_90a: C[M, N] = A[M, K] * W[N, K]^T (+ bias), M <= 64, NT layout
// (kernels/gemm/gemm_decode.h has the parameters and the host planning).
//
// Why a second kernel: at decode sizes the GEMM is a stream of the weights W, and the TMA +
// wgmma kernel (gemm_sm90.cu) streams them at ~75% of a plain 16-byte read (bench/RESULTS.md,
// the streaming probe). Here W never touches shared memory: each warp owns RPW rows of W and
// loads them with 16-byte loads straight into the registers that mma.sync.m16n8k16 takes as its
// A operand, DEPTH 64-wide k blocks ahead. The activations (the small operand, read by every CTA)
// arrive through a TMA ring of 64-wide k blocks, filled by one thread.
//
// Register layout (the trick that lets one 16-byte load per row feed mma.sync): for every 32-wide
// k slice, lane (g = lane / 4, c = lane % 4) loads elements [8c, 8c + 8) of its W rows g and g + 8
// (of each 16-row m tile) and of its activation row; those 4 pairs are the logical k positions
// {2c, 2c+1} (pair 2s) and {2c+8, 2c+9} (pair 2s+1) of k16 step s = 0, 1. The same permutation of
// k on both operands leaves the sum unchanged. The mma's column index q (= B's n, lane / 4 on the
// B side) maps to activation row 8t + (q >> 1) + 4 (q & 1) of n tile t, which makes the 16-byte
// shared-memory reads of the 128B-swizzled activation tile conflict-free.
//
// K split: the cluster's CTAs take consecutive ranges of k blocks; each parks its fp32 partial
// tile in its shared memory and CTA r sums rows slice r over the cluster through DSMEM, in rank
// order (deterministic), adds the bias and writes C.
//
// The activation ring and the reduction are the main kernel's (gemm_ring.cuh StageRing / RingPos,
// gemm_reduce.cuh reduce_partials_t): the partial tile is C's [ACT_ROWS][ROWS] block, rows of C
// padded by 4 floats, as the main kernel's unswapped partials.
//
// Variant constants (tools/flygen): FLY_DTYPE_IS_{BF16,FP16}, FLY_NW (warps), FLY_RPW
// (W rows per warp: 16 or 32), FLY_MT (activation rows / 8: M <= 8 MT), FLY_DEPTH (k blocks of W
// in flight per warp beyond the one in use).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/sm90.h"
#include "common/vec.cuh"
#include "gemm/gemm_decode.h"
#include "gemm/gemm_reduce.cuh"
#include "gemm/gemm_ring.cuh"

#if defined(FLY_DTYPE_IS_BF16)
using T = __nv_bfloat16;
#define FLY_MMA_TYPE "bf16"
#elif defined(FLY_DTYPE_IS_FP16)
using T = __half;
#define FLY_MMA_TYPE "f16"
#else
#error "gemm_decode_sm90: FLY_DTYPE_IS_BF16 or FLY_DTYPE_IS_FP16 must be defined"
#endif

namespace {

using fly::gemm::DecodeParams;
using fly::gemm::kDecStages;

constexpr int NW = FLY_NW;
constexpr int RPW = FLY_RPW;
constexpr int MT = FLY_MT;
constexpr int DEPTH = FLY_DEPTH;
constexpr int MI = RPW / 16;                 // 16-row m tiles per warp
constexpr int ROWS = NW * RPW;               // W rows per CTA
constexpr int ACT_ROWS = 8 * MT;             // activation rows in the ring (TMA zero-fills past M)
constexpr int STAGE_BYTES = ACT_ROWS * 128;  // one 64-wide k block of them, 128B-swizzled
constexpr int THREADS = fly::gemm::decode_threads(NW);
// The fp32 partial tile reuses the ring after the main loop: C's [ACT_ROWS][ROWS] block
// (gemm_reduce.cuh layout, unswapped); the ring's barriers follow the larger of the two.
using PartialLayout = fly::gemm::PartialLayoutT<ACT_ROWS, ROWS>;
constexpr int PS = ROWS + 4;  // partial row stride (floats): PartialLayout::stride()
constexpr int REGION = fly::gemm::decode_region_bytes(NW, RPW, MT);
using ActRing = fly::gemm::StageRing<kDecStages, STAGE_BYTES, REGION>;
using RingPos = fly::gemm::RingPos<kDecStages>;
static_assert(REGION >= STAGE_BYTES * kDecStages && REGION >= ACT_ROWS * PS * 4, "the ring and the partial tile");
static_assert(RPW == 16 || RPW == 32, "W rows per warp: 16 or 32");
static_assert(MT == 1 || MT == 2 || MT == 4 || MT == 8, "activation tile: 8, 16, 32 or 64 rows");
static_assert(DEPTH >= 1 && DEPTH <= 6, "k blocks in flight");
static_assert(fly::gemm::decode_smem_bytes(NW, RPW, MT) == REGION + 2 * kDecStages * 8 + 1024, "host sizing");

// C as the shared reduction writes it (gemm_reduce.cuh reduce_partials_t): D = C, row-major.
struct DecodeOut {
  using Elem = T;
  T* c;
  const T* bias;
  int64_t ldc;
  int rows, cols;  // M, N
  bool swap, vec;
};
struct DecodeUnit {
  int tm, tn;  // the tile: rows 0.. of C (tm = 0), columns tn * ROWS..
};

// One 64-wide k block of a warp's W rows in registers: [m tile][row g, g + 8][32-wide half].
struct WBlock {
  uint4 v[MI][2][2];
};

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." FLY_MMA_TYPE "." FLY_MMA_TYPE ".f32"
               " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, 1) fly_gemm_decode_sm90(const __grid_constant__ DecodeParams p) {
  extern __shared__ uint8_t smem_raw[];
  const ActRing ring = ActRing::at_as<ActRing>(smem_raw);

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int rank = p.cl > 1 ? int(fly::sm90::cluster_ctarank()) : 0;
  const int tile = int(blockIdx.x) / p.cl;
  const int row0 = tile * ROWS;
  const int kbs = (p.K + 63) / 64;
  const int kb0 = rank * p.kb_per_cta;
  const int nkb = max(0, min(kbs, kb0 + p.kb_per_cta) - kb0);

  if (threadIdx.x == 0) ring.init_barriers(NW);  // empty: one arrival per warp
  __syncthreads();

  float acc[MI][MT][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][t][e] = 0.f;

  // The ring: lane 0 of warp 0 fills it. First the first kDecStages k blocks; then, at each
  // iteration it >= 1, the slot of block it - 1 (freed once every warp has used that block) with
  // block it - 1 + kDecStages. (No producer warp: one more warp would cut every thread's register
  // budget from 255 to 168, the allocation granularity being 4 warps.)
  const bool issuer = warp == 0 && lane == 0;
  RingPos fill;  // the issuer's next fill (k block i goes to stage i % kDecStages)
  auto issue = [&](int i) {
    uint64_t* fb = ring.acquire(fill, STAGE_BYTES);
    fly::sm90::tma_load_2d(ring.stage_ptr(fill.stage), &p.tm_a, fb, (kb0 + i) * 64, 0);
    fill.advance();
  };
  if (issuer) {
    fly::sm90::tma_prefetch_desc(&p.tm_a);
    for (int i = 0; i < min(nkb, kDecStages); ++i) issue(i);
  }
  {
    const int g = lane >> 2, c = lane & 3;
    const T* w = static_cast<const T*>(p.w);
    // Row of W for m tile i, half h (g or g + 8), and whether it exists.
    auto load_w = [&](WBlock& b, int it) {
      const int k = (kb0 + it) * 64 + 8 * c;
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int n = row0 + warp * RPW + i * 16 + g + 8 * h;
          const T* src = w + int64_t(n) * p.ldw + k;
#pragma unroll
          for (int kh = 0; kh < 2; ++kh) {
            if (it < nkb && n < p.N && k + 32 * kh < p.K) b.v[i][h][kh] = fly::ld16_stream(src + 32 * kh);
            else b.v[i][h][kh] = make_uint4(0, 0, 0, 0);
          }
        }
    };
    // The B side: activation row of this lane's mma column in n tile t, and its 16-byte chunk of
    // 32-wide half kh in the 128B-swizzled [ACT_ROWS][64] tile.
    auto compute = [&](const WBlock& b, const uint8_t* st) {
#pragma unroll
      for (int kh = 0; kh < 2; ++kh)
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          const int m = 8 * t + (g >> 1) + 4 * (g & 1);
          const uint4 x = *reinterpret_cast<const uint4*>(st + m * 128 + (((kh * 4 + c) ^ (m & 7)) << 4));
#pragma unroll
          for (int i = 0; i < MI; ++i) {
            const uint4 r0 = b.v[i][0][kh], r1 = b.v[i][1][kh];
            mma16816(acc[i][t], r0.x, r1.x, r0.y, r1.y, x.x, x.y);  // k16 step 0: pairs 0, 1
            mma16816(acc[i][t], r0.z, r1.z, r0.w, r1.w, x.z, x.w);  // k16 step 1: pairs 2, 3
          }
        }
    };
    // W blocks rotate through DEPTH + 1 register buffers; the loop is unrolled by DEPTH + 1 so
    // every buffer index is a compile-time constant.
    WBlock buf[DEPTH + 1];
    RingPos pos;  // the stage of block it
#pragma unroll
    for (int j = 0; j < DEPTH; ++j) load_w(buf[j], j);
    for (int it0 = 0; it0 < nkb; it0 += DEPTH + 1) {
#pragma unroll
      for (int j = 0; j <= DEPTH; ++j) {
        const int it = it0 + j;
        if (it < nkb) {
          load_w(buf[(j + DEPTH) % (DEPTH + 1)], it + DEPTH);
          // the slot of block it - 1, once every warp has released it (acquire waits), gets
          // block it - 1 + kDecStages
          if (issuer && it >= 1 && it - 1 + kDecStages < nkb) issue(it - 1 + kDecStages);
          __syncwarp();  // warp 0 reconverges before its mma.sync
          ring.wait_full(pos);
          __syncwarp();
          compute(buf[j], ring.stage_ptr(pos.stage));
          __syncwarp();
          if (lane == 0) ring.release_local(pos.stage);
          pos.advance();
        }
      }
    }
  }

  // Every warp has finished reading the ring (and waited for every TMA issued into it): the
  // ring's memory now holds the fp32 partial tile, C's [ACT_ROWS][ROWS] block.
  __syncthreads();
  float* part = reinterpret_cast<float*>(ring.base);
  {
    const PartialLayout L{false};
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const int n = warp * RPW + i * 16 + g, m = 8 * t + c;  // W row (C column), A row (C row)
        part[L.index(m, n)] = acc[i][t][0];
        part[L.index(m + 4, n)] = acc[i][t][1];
        part[L.index(m, n + 8)] = acc[i][t][2];
        part[L.index(m + 4, n + 8)] = acc[i][t][3];
      }
  }
  if (p.cl > 1) fly::sm90::cluster_sync();
  else __syncthreads();

  // CTA `rank` reduces its slice of the tile's rows (rows of C) over the cluster, adds the bias and
  // writes C: the main kernel's reduction (4 consecutive columns of a C row per item).
  const DecodeOut out{static_cast<T*>(p.c), static_cast<const T*>(p.bias), p.ldc, p.M, p.N, false,
                      (reinterpret_cast<uintptr_t>(p.c) & 7) == 0 && p.ldc % 4 == 0};
  fly::gemm::reduce_partials_t<THREADS>(out, DecodeUnit{0, tile}, part, PartialLayout{false}, rank, p.cl,
                                        int(threadIdx.x));
  // Nobody leaves while a peer may still read its partial tile.
  if (p.cl > 1) fly::sm90::cluster_sync();
}
