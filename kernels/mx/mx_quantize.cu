// SPDX-License-Identifier: Apache-2.0
// MX quantizer: rows of FP16/BF16/FP32 to E4M3 or packed E2M1 codes with one E8M0 scale per 32
// elements (OCP MX v1.0; the rules and the bit-exact reference are in gemm/gemm_mx.h, the
// encoders shared with the host test in mx/mx_encode.h). One thread per 32-element block: it
// loads the block (16-byte vectors when aligned), takes amax, the scale byte, divides by the
// scale (exact: a power of two) and encodes with nearest-even and saturation.
// Variant constants (tools/flygen): FLY_THREADS (threads per CTA); FLY_HW_CVT = 1 (variants
// `_hw`): the block is scaled by multiplying with the exact reciprocal of its power-of-two scale
// (the same correctly rounded value as the division: x / 2^e and x * 2^-e are one real number,
// and 2^-e is an FP32 value for every scale byte) and, on the GPU, E4M3 codes come from
// `cvt.rn.satfinite.e4m3x2.f32` (nearest-even, saturating to +-448: the encoder's rules for the
// finite values it gets; the host emulation runs the software encoder there) and E2M1 codes from
// the branch-free integer rounding of mx_encode.h (e2m1_top16 / e2m1_top32, host and GPU alike).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "mx/mx_encode.h"
#include "mx/mx_params.h"

namespace {

__device__ __forceinline__ void load_block(const MxQuantizeParams& p, int64_t row, int64_t k0, float (&v)[32]) {
  if (p.src == 2) {
    const float* x = static_cast<const float*>(p.x) + row * p.ldx + k0;
    if (p.vec_x) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float4 f = reinterpret_cast<const float4*>(x)[i];
        v[4 * i] = f.x; v[4 * i + 1] = f.y; v[4 * i + 2] = f.z; v[4 * i + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) v[i] = x[i];
    }
    return;
  }
  const uint16_t* x = static_cast<const uint16_t*>(p.x) + row * p.ldx + k0;
  uint16_t h[32];
  if (p.vec_x) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 u = reinterpret_cast<const uint4*>(x)[i];
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) { h[8 * i + 2 * j] = uint16_t(w[j] & 0xFFFF); h[8 * i + 2 * j + 1] = uint16_t(w[j] >> 16); }
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) h[i] = x[i];
  }
  if (p.src == 1) {
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = __uint_as_float(uint32_t(h[i]) << 16);
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = __half2float(__ushort_as_half(h[i]));
  }
}

// The 16-bit vector path in two steps (variants `_pf1`): the block's 64 bytes as raw words (issued
// one block ahead), then widened to floats as load_block does.
__device__ __forceinline__ void load_raw16(const MxQuantizeParams& p, int64_t row, int64_t k0, uint4 (&r)[4]) {
  const uint4* x = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.x) + row * p.ldx + k0);
#pragma unroll
  for (int i = 0; i < 4; ++i) r[i] = x[i];
}
__device__ __forceinline__ void raw16_to_float(const MxQuantizeParams& p, const uint4 (&r)[4], float (&v)[32]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w[4] = {r[i].x, r[i].y, r[i].z, r[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint16_t lo = uint16_t(w[j] & 0xFFFF), hi = uint16_t(w[j] >> 16);
      if (p.src == 1) {
        v[8 * i + 2 * j] = __uint_as_float(uint32_t(lo) << 16);
        v[8 * i + 2 * j + 1] = __uint_as_float(uint32_t(hi) << 16);
      } else {
        v[8 * i + 2 * j] = __half2float(__ushort_as_half(lo));
        v[8 * i + 2 * j + 1] = __half2float(__ushort_as_half(hi));
      }
    }
  }
}

#if defined(FLY_HW_CVT) && FLY_HW_CVT && !defined(FLY_MX_HOST_EMU)
// Two E4M3 codes of the finite x0 (low byte) and x1 (high byte), nearest-even, saturating.
__device__ __forceinline__ uint32_t e4m3x2(float x0, float x1) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(x1), "f"(x0));
  return r;
}
#endif

}  // namespace

// FLY_MINB (variants `_o<minb>`): CTAs per SM the register allocation must allow (occupancy; the
// loop is latency-bound at 64 registers a thread: ncu in bench/RESULTS.md).
// Without it the launch bounds name the block size only (ptxas then picks 64 registers; an
// explicit minimum of 1 block lets it take 111).
#if defined(FLY_MINB)
#define FLY_MXQ_BOUNDS __launch_bounds__(FLY_THREADS, FLY_MINB)
#else
#define FLY_MXQ_BOUNDS __launch_bounds__(FLY_THREADS)
#endif
// FLY_PREFETCH (variants `_pf1`): with 16-bit sources and vector loads, each thread's next block is
// loaded while the current one is encoded (the loop waits on its loads otherwise).
extern "C" __global__ void FLY_MXQ_BOUNDS mx_quantize(MxQuantizeParams p) {
  const int64_t kb_per_row = p.K / 32;
  const int64_t blocks = p.M * kb_per_row;
#if defined(FLY_PREFETCH) && FLY_PREFETCH
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t b0 = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool ahead = p.src != 2 && p.vec_x;
  uint4 next[4];
  if (ahead && b0 < blocks) load_raw16(p, b0 / kb_per_row, (b0 % kb_per_row) * 32, next);
  for (int64_t b = b0; b < blocks; b += stride) {
    const int64_t row = b / kb_per_row, kb = b - row * kb_per_row;
    float v[32];
    if (ahead) {
      uint4 cur[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) cur[i] = next[i];
      const int64_t bn = b + stride;
      if (bn < blocks) load_raw16(p, bn / kb_per_row, (bn % kb_per_row) * 32, next);
      raw16_to_float(p, cur, v);
    } else {
      load_block(p, row, kb * 32, v);
    }
#else
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = b / kb_per_row, kb = b - row * kb_per_row;
    float v[32];
    load_block(p, row, kb * 32, v);
#endif
    // amax as the largest magnitude's bits: for non-negative floats the integer order is the
    // numeric one, and NaN / Inf are the patterns from 0x7F800000 up.
    uint32_t umax = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) umax = umax > (fly::mxe::f2u(v[i]) & 0x7FFFFFFFu) ? umax : (fly::mxe::f2u(v[i]) & 0x7FFFFFFFu);
    const bool bad = umax >= 0x7F800000u;  // NaN or Inf in the block
    const float amax = fly::mxe::u2f(umax);
    const uint8_t s = bad ? uint8_t(0xFF)
                          : fly::mxe::scale_byte(amax, p.rceil != 0, p.fp4 ? 2 : 8, p.fp4 ? 6.0f : 448.0f);
    p.scales[b] = s;
    const float scale = fly::mxe::e8m0_to_float(s);
#if defined(FLY_HW_CVT) && FLY_HW_CVT
    // 1 / 2^(s - 127) = 2^(127 - s), the E8M0 byte 254 - s (s = 0xFF: unused, the NaN codes)
    const float inv = fly::mxe::e8m0_to_float(uint8_t(s == 0xFF ? 127 : 254 - s));
#define FLY_MXQ_SCALED(x) ((x) * inv)
#else
#define FLY_MXQ_SCALED(x) __fdiv_rn((x), scale)
#endif
    if (p.fp4) {
      uint32_t w[4] = {0, 0, 0, 0};
#if defined(FLY_HW_CVT) && FLY_HW_CVT
      // branch-free encoders (mx_encode.h e2m1_top16 / e2m1_top32): code and sign at bits 28..31
      if (s == 0xFF) {
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = 0x77777777u;
      } else if (p.src != 2) {
        float pre, msub;
        fly::mxe::e2m1_sub_scale(s, pre, msub);
        if (pre != 1.0f) {
#pragma unroll
          for (int i = 0; i < 32; ++i) v[i] *= pre;
        }
#pragma unroll
        for (int i = 0; i < 32; ++i) w[i / 8] |= fly::mxe::e2m1_top16(v[i], msub) >> (28 - 4 * (i % 8));
      } else {
#pragma unroll
        for (int i = 0; i < 32; ++i) w[i / 8] |= fly::mxe::e2m1_top32(v[i], inv) >> (28 - 4 * (i % 8));
      }
#else
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const uint8_t c = s == 0xFF ? uint8_t(0x7) : fly::mxe::encode_e2m1(FLY_MXQ_SCALED(v[i]));
        w[i / 8] |= uint32_t(c) << ((i % 8) * 4);
      }
#endif
      uint8_t* q = static_cast<uint8_t*>(p.q) + row * (p.K / 2) + kb * 16;
      if (p.vec_q) {
        *reinterpret_cast<uint4*>(q) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) q[i] = uint8_t(w[i / 4] >> ((i % 4) * 8));
      }
    } else {
      uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#if defined(FLY_HW_CVT) && FLY_HW_CVT && !defined(FLY_MX_HOST_EMU)
      if (s == 0xFF) {
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = 0x7F7F7F7Fu;
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i)
          w[i] = e4m3x2(v[4 * i] * inv, v[4 * i + 1] * inv) | (e4m3x2(v[4 * i + 2] * inv, v[4 * i + 3] * inv) << 16);
      }
#else
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const uint8_t c = s == 0xFF ? uint8_t(0x7F) : fly::mxe::encode_e4m3(FLY_MXQ_SCALED(v[i]));
        w[i / 4] |= uint32_t(c) << ((i % 4) * 8);
      }
#endif
      uint8_t* q = static_cast<uint8_t*>(p.q) + row * p.K + kb * 32;
      if (p.vec_q) {
        reinterpret_cast<uint4*>(q)[0] = make_uint4(w[0], w[1], w[2], w[3]);
        reinterpret_cast<uint4*>(q)[1] = make_uint4(w[4], w[5], w[6], w[7]);
      } else {
#pragma unroll
        for (int i = 0; i < 32; ++i) q[i] = uint8_t(w[i / 4] >> ((i % 4) * 8));
      }
    }
  }
}
#undef FLY_MXQ_SCALED
#undef FLY_MXQ_BOUNDS
