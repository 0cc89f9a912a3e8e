// SPDX-License-Identifier: Apache-2.0
// Fast MX encoders (host and device): the same results as gemm/gemm_mx.h's reference quantizer,
// bit for bit (test/cpu/test_mx_args.cpp checks them against it), written with integer and
// rint arithmetic so the GPU kernel can use them.
#pragma once
#include <stdint.h>
#include <string.h>

#include <cmath>

#if defined(__CUDACC__)
#define FLY_MXE_HD __host__ __device__ __forceinline__
#else
#define FLY_MXE_HD inline
#endif

namespace fly::mxe {

FLY_MXE_HD uint32_t f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u; memcpy(&u, &f, 4); return u;
#endif
}
FLY_MXE_HD float u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f; memcpy(&f, &u, 4); return f;
#endif
}
FLY_MXE_HD int clz32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return __clz(v);
#else
  return v ? __builtin_clz(v) : 32;
#endif
}
// floor(log2(a)) of a finite a > 0 (subnormals included), as std::ilogb.
FLY_MXE_HD int ilogb_pos(float a) {
  const uint32_t u = f2u(a);
  const int ef = int((u >> 23) & 0xFF);
  if (ef != 0) return ef - 127;
  return (31 - clz32(u & 0x7FFFFF)) - 149;
}
// 2^e as a float for -149 <= e <= 127.
FLY_MXE_HD float pow2f(int e) {
  return e >= -126 ? u2f(uint32_t(e + 127) << 23) : u2f(uint32_t(1) << (e + 149));
}
// E8M0 byte to float: 0xFF NaN, 0x00 = 2^-127.
FLY_MXE_HD float e8m0_to_float(uint8_t b) { return b == 0xFF ? u2f(0x7FC00000u) : pow2f(int(b) - 127); }

// Scale byte of a block of largest magnitude amax (finite, >= 0); emax / vmax of the element type.
FLY_MXE_HD uint8_t scale_byte(float amax, bool rceil, int emax, float vmax) {
  if (amax == 0.0f) return 0x00;
  int e;
  if (!rceil) {
    e = ilogb_pos(amax) - emax;
  } else {
    // smallest e with 2^e >= q, q = amax / vmax rounded in double (as the reference)
    const double q = double(amax) / double(vmax);
    int ex;
    const double fr = std::frexp(q, &ex);  // q = fr * 2^ex, fr in [0.5, 1)
    e = fr == 0.5 ? ex - 1 : ex;
  }
  if (e < -127) e = -127;
  if (e > 127) return 0xFF;
  return uint8_t(e + 127);
}

// Nearest-even E4M3 code of a non-NaN x, saturating to +-448 (0x7E / 0xFE).
FLY_MXE_HD uint8_t encode_e4m3(float x) {
  const uint8_t sign = (f2u(x) >> 24) & 0x80;
  const float a = std::fabs(x);
  if (!(a < 448.0f)) return uint8_t(sign | 0x7E);
  if (a < 0.015625f) {  // below 2^-6: subnormal codes m * 2^-9
    return uint8_t(sign | int(rintf(a * 512.0f)));
  }
  const int e = ilogb_pos(a);                        // -6 .. 8
  const int m = int(rintf(a * pow2f(3 - e)));        // 8 .. 16
  return uint8_t(sign | (((e + 7) << 3) + (m - 8)));
}
// Nearest-even E2M1 code (low 4 bits) of a non-NaN x, saturating to +-6.
FLY_MXE_HD uint8_t encode_e2m1(float x) {
  const uint8_t sign = (f2u(x) >> 28) & 0x8;
  const float a = std::fabs(x);
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return uint8_t(sign | c);
}
// Branch-free E2M1 encoding for the quantizer (kernels/mx/mx_quantize.cu, the `_hw` variants),
// the same codes as encode_e2m1. The scaled magnitude a = |x| * 2^(127 - s) is mapped to
// a * 2^-126, where FP32's gradual underflow makes bit 22 of the representation mean 0.5 in a for
// every a < 8 (subnormal a < 1 and normal a alike): E2M1's grid. Nearest-even at that bit is one
// integer add, and (bits >> 22) is the code (0.5 -> 1, 1 -> 2, ..., 6 -> 7), with a clamped to 6
// first for saturation. The code is returned at bits 28..30 and x's sign at bit 31.
// e2m1_top16: x with at most 11 significant bits (a BF16 or FP16 source) times msub = 2^(1 - s),
// from e2m1_sub_scale, in one rounding: exact wherever the code can be nonzero (a >= 2^-13 has
// an ulp of at least 2^-23, the subnormal grid), and anything smaller stays below 0.25.
// e2m1_top32: any finite x (an FP32 source) with inv = 2^(127 - s): a is exact, a * 2^-126 too for
// a >= 1, and a < 1 takes the two comparisons of its grid (0.25 -> 0, 0.75 -> 1 by nearest-even).
// test/cpu/test_mx_args.cpp checks both against the reference for every BF16 and FP16 value at
// every scale byte.
FLY_MXE_HD uint32_t e2m1_round_top(float asub, uint32_t sign) {
  const uint32_t b = f2u(asub);
  const uint32_t r = b + 0x1FFFFFu + ((b >> 22) & 1u);
  return ((r << 6) & 0x70000000u) | sign;
}
// Pre-scale and multiplier for e2m1_top16: pre * msub = 2^(1 - s); pre = 1 unless s > 150, where
// 2^(1 - s) is below FP32's range (x * 2^-104 is exact for every x whose code can be nonzero).
FLY_MXE_HD void e2m1_sub_scale(uint8_t s, float& pre, float& msub) {
  pre = s > 150 ? pow2f(-104) : 1.0f;
  msub = pow2f(s > 150 ? 105 - int(s) : 1 - int(s));
}
FLY_MXE_HD uint32_t e2m1_top16(float x, float msub) {
  const float lim = u2f(0x01C00000u);  // 6 * 2^-126
  return e2m1_round_top(std::fmin(std::fabs(x * msub), lim), f2u(x) & 0x80000000u);
}
FLY_MXE_HD uint32_t e2m1_top32(float x, float inv) {
  const float a = std::fabs(x * inv);
  const uint32_t big = e2m1_round_top(std::fmin(a, 6.0f) * pow2f(-126), f2u(x) & 0x80000000u);
  const uint32_t small = (uint32_t(a > 0.25f) + uint32_t(a >= 0.75f)) << 28 | (f2u(x) & 0x80000000u);
  return a < 1.0f ? small : big;
}
// E4M3 byte of an E2M1 code (exact: every E2M1 value is an E4M3 value).
FLY_MXE_HD uint8_t e2m1_to_e4m3(uint8_t n) {
  // magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as E4M3 codes
  const uint32_t lo = 0x3C383000u, hi = 0x4C484440u;
  const int i = n & 7;
  const uint8_t mag = uint8_t(((i < 4 ? lo : hi) >> ((i & 3) * 8)) & 0xFF);
  return uint8_t(mag | ((n & 8) << 4));
}

}  // namespace fly::mxe
