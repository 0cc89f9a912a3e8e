// SPDX-License-Identifier: Apache-2.0
// MX block-scaled GEMM (MXFP8 / MXFP4, NT): C[M,N] = sum over k32 blocks of
//   sa[m,kb] * sb[n,kb] * (A[m, kb*32 .. +32] . B[n, kb*32 .. +32])  (+ bias[n]).
// First design (docs/mxfp.md): FP8 tensor-core MMA (mma.sync m16n8k32 E4M3 x E4M3 -> FP32, both
// operands K-major) per 32-wide k block into a temporary accumulator, promoted into the FP32
// main accumulator with sa * sb (one FP32 multiply and one FMA per element per k32). MXFP4 is
// widened to E4M3 on the way into shared memory (every E2M1 value is exact in E4M3), so it
// reads a quarter of BF16's bytes and reuses the FP8 MMA.
// CTA tile BM x BN, stage of BK = 128 elements (four k32 blocks), 4 warps (2 x 2, 32 x 32 per
// warp); the next stage is loaded into registers while the current one is computed.
// Variant constants (tools/flygen): FLY_BM, FLY_BN (64).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/convert.cuh"
#include "mx/mx_encode.h"
#include "mx/mx_params.h"

namespace {

constexpr int BM = FLY_BM, BN = FLY_BN, BK = 128, KB = BK / 32;
constexpr int kThreads = 128;
constexpr int kRow = BK + 16;  // bytes per shared row: 144 = 36 words, conflict-free fragment reads
static_assert(BM == 64 && BN == 64, "warp layout assumes a 64 x 64 CTA tile");

struct Smem {
  alignas(16) uint8_t a[BM][kRow];
  alignas(16) uint8_t b[BN][kRow];
  float sa[BM][KB];
  float sb[BN][KB];
};

// 16 bytes of the stage per thread-chunk; A and B each have BM*8 / BN*8 chunks of 16 elements.
constexpr int kChunksA = BM * (BK / 16), kChunksB = BN * (BK / 16);
constexpr int kPerThreadA = kChunksA / kThreads, kPerThreadB = kChunksB / kThreads;

struct StageRegs {
  uint4 a[kPerThreadA];
  uint4 b[kPerThreadB];
  uint8_t sa[BM * KB / kThreads];
  uint8_t sb[BN * KB / kThreads];
};

__device__ __forceinline__ uint4 widen_fp4(uint2 packed) {
  const uint32_t w[2] = {packed.x, packed.y};
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t src = w[i / 2] >> ((i % 2) * 16);
    uint32_t r = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) r |= uint32_t(fly::mxe::e2m1_to_e4m3(uint8_t((src >> (4 * j)) & 0xF))) << (8 * j);
    o[i] = r;
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// Loads one operand chunk (16 elements at row r, element offset kk) as 16 E4M3 bytes; zero
// outside [rows, K).
__device__ __forceinline__ uint4 load_chunk(const uint8_t* base, int64_t ld, int64_t r, int64_t rows, int64_t kk,
                                            int64_t K, bool fp4) {
  if (r >= rows || kk >= K) return make_uint4(0, 0, 0, 0);
  if (fp4) {
    const uint2 v = *reinterpret_cast<const uint2*>(base + r * ld + kk / 2);
    return widen_fp4(v);
  }
  return *reinterpret_cast<const uint4*>(base + r * ld + kk);
}

__device__ __forceinline__ void load_stage(const MxGemmParams& p, int64_t m0, int64_t n0, int64_t k0, StageRegs& s) {
  const int tid = threadIdx.x;
  const bool fp4 = p.fp4 != 0;
#pragma unroll
  for (int i = 0; i < kPerThreadA; ++i) {
    const int idx = tid + i * kThreads, r = idx / (BK / 16), c = idx % (BK / 16);
    s.a[i] = load_chunk(p.a, p.lda, m0 + r, p.M, k0 + c * 16, p.K, fp4);
  }
#pragma unroll
  for (int i = 0; i < kPerThreadB; ++i) {
    const int idx = tid + i * kThreads, r = idx / (BK / 16), c = idx % (BK / 16);
    s.b[i] = load_chunk(p.b, p.ldb, n0 + r, p.N, k0 + c * 16, p.K, fp4);
  }
  const int64_t kbs = p.K / 32, kb0 = k0 / 32;
#pragma unroll
  for (int i = 0; i < BM * KB / kThreads; ++i) {
    const int idx = tid + i * kThreads, r = idx / KB, j = idx % KB;
    s.sa[i] = (m0 + r < p.M && kb0 + j < kbs) ? p.sa[(m0 + r) * kbs + kb0 + j] : uint8_t(127);
  }
#pragma unroll
  for (int i = 0; i < BN * KB / kThreads; ++i) {
    const int idx = tid + i * kThreads, r = idx / KB, j = idx % KB;
    s.sb[i] = (n0 + r < p.N && kb0 + j < kbs) ? p.sb[(n0 + r) * kbs + kb0 + j] : uint8_t(127);
  }
}

__device__ __forceinline__ void store_stage(Smem& sm, const StageRegs& s) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < kPerThreadA; ++i) {
    const int idx = tid + i * kThreads, r = idx / (BK / 16), c = idx % (BK / 16);
    *reinterpret_cast<uint4*>(&sm.a[r][c * 16]) = s.a[i];
  }
#pragma unroll
  for (int i = 0; i < kPerThreadB; ++i) {
    const int idx = tid + i * kThreads, r = idx / (BK / 16), c = idx % (BK / 16);
    *reinterpret_cast<uint4*>(&sm.b[r][c * 16]) = s.b[i];
  }
#pragma unroll
  for (int i = 0; i < BM * KB / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    sm.sa[idx / KB][idx % KB] = fly::mxe::e8m0_to_float(s.sa[i]);
  }
#pragma unroll
  for (int i = 0; i < BN * KB / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    sm.sb[idx / KB][idx % KB] = fly::mxe::e8m0_to_float(s.sb[i]);
  }
}

#if defined(FLY_MX_HOST_EMU)
// test/cpu/test_mx_kernel_emu.cpp runs this file on the host: the warp's MMA from its lanes' fragments.
void fly_mx_emu_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
#endif

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(FLY_MX_HOST_EMU)
  fly_mx_emu_mma(d, a, b);
  return;
#endif
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

using fly::from_float;  // common/convert.cuh
using fly::to_float;

template <class T>
__device__ __forceinline__ void epilogue(const MxGemmParams& p, int64_t m0, int64_t n0, const float (&acc)[2][4][4]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp / 2, wn = warp % 2, g = lane / 4, t = lane % 4;
  T* c = static_cast<T*>(p.c);
  const T* bias = static_cast<const T*>(p.bias);
#pragma unroll
  for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
      const int64_t col = n0 + wn * 32 + ni * 8 + t * 2 + cc;
      if (col >= p.N) continue;
      const float bv = bias ? to_float<T>(bias[col]) : 0.0f;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t row = m0 + wm * 32 + mi * 16 + g + h * 8;
          if (row < p.M) c[row * p.ldc + col] = from_float<T>(acc[mi][ni][h * 2 + cc] + bv);
        }
      }
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) mxfp_gemm(MxGemmParams p) {
  __shared__ Smem sm;
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int wm = warp / 2, wn = warp % 2, g = lane / 4, t = lane % 4;
  const int64_t kbs = p.K / 32;
  const int64_t stages = (p.K + BK - 1) / BK;

  float acc[2][4][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  StageRegs regs;
  if (stages > 0) {
    load_stage(p, m0, n0, 0, regs);
    store_stage(sm, regs);
  }
  __syncthreads();
  for (int64_t st = 0; st < stages; ++st) {
    if (st + 1 < stages) load_stage(p, m0, n0, (st + 1) * BK, regs);
    const int64_t left = kbs - st * KB;
    const int jmax = left < KB ? int(left) : KB;
    for (int j = 0; j < jmax; ++j) {
      float tmp[2][4][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e) tmp[mi][ni][e] = 0.0f;
      uint32_t af[2][4], bf[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int r = wm * 32 + mi * 16 + g;
        af[mi][0] = *reinterpret_cast<const uint32_t*>(&sm.a[r][j * 32 + t * 4]);
        af[mi][1] = *reinterpret_cast<const uint32_t*>(&sm.a[r + 8][j * 32 + t * 4]);
        af[mi][2] = *reinterpret_cast<const uint32_t*>(&sm.a[r][j * 32 + 16 + t * 4]);
        af[mi][3] = *reinterpret_cast<const uint32_t*>(&sm.a[r + 8][j * 32 + 16 + t * 4]);
      }
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int r = wn * 32 + ni * 8 + g;
        bf[ni][0] = *reinterpret_cast<const uint32_t*>(&sm.b[r][j * 32 + t * 4]);
        bf[ni][1] = *reinterpret_cast<const uint32_t*>(&sm.b[r][j * 32 + 16 + t * 4]);
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_e4m3(tmp[mi][ni], af[mi], bf[ni]);
      // promotion: acc += tmp * (sa[row] * sb[col])
      float sa[2][2], sb[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) sa[mi][h] = sm.sa[wm * 32 + mi * 16 + g + h * 8][j];
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) sb[ni][cc] = sm.sb[wn * 32 + ni * 8 + t * 2 + cc][j];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            acc[mi][ni][e] = fmaf(tmp[mi][ni][e], sa[mi][e / 2] * sb[ni][e % 2], acc[mi][ni][e]);
    }
    __syncthreads();
    if (st + 1 < stages) {
      store_stage(sm, regs);
      __syncthreads();
    }
  }
  if (p.out_bf16) epilogue<__nv_bfloat16>(p, m0, n0, acc);
  else epilogue<__half>(p, m0, n0, acc);
}
