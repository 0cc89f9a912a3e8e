// SPDX-License-Identifier: Apache-2.0
// The MX (OCP Microscaling v1.0) formats the block-scaled GEMM takes: element codes E4M3 ("fn":
// no Inf, NaN = S.1111.111), E5M2, E2M1 (FP4, two per byte, element 0 in the low nibble, as
// torch.float4_e2m1fn_x2) and the E8M0 block scale (2^(e - 127), 0xFF = NaN, no zero), with one
// scale per 32 elements along K. Exact decoders for kernels and references, and the reference
// quantizer (host): scale from the block's amax (FLOOR, the spec's rule, or RCEIL, NVIDIA's), then
// each element divided by the scale and rounded to nearest even with saturation.
// Plain C++ (host and device). The rules are OCP MX v1.0's (E8M0 in its section 5.4.1, the scale
// from amax in 6.3); elements round to nearest even with saturation, as torchao and cuDNN do;
// docs/mxfp.md ("Quantizer") states them.
#pragma once

#include <stdint.h>

#include <cmath>

#if defined(__CUDACC__)
#define FLY_MX_HD __host__ __device__ __forceinline__
#else
#define FLY_MX_HD inline
#endif

namespace fly::mx {

constexpr int kBlock = 32;          // elements per E8M0 scale, along K
constexpr float kE4m3Max = 448.0f;  // 1.75 x 2^8
constexpr float kE5m2Max = 57344.0f;
constexpr float kE2m1Max = 6.0f;
constexpr int kE4m3Emax = 8;  // exponent of the largest binade (for the FLOOR scale)
constexpr int kE2m1Emax = 2;

FLY_MX_HD float decode_e4m3(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  const float mag = e == 15 && m == 7 ? NAN : e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}
FLY_MX_HD float decode_e5m2(uint8_t b) {
  const int e = (b >> 2) & 0x1F, m = b & 3;
  const float mag = e == 31 ? (m == 0 ? INFINITY : NAN) : e == 0 ? std::ldexp(float(m), -16) : std::ldexp(1.0f + m / 4.0f, e - 15);
  return (b & 0x80) ? -mag : mag;
}
// One E2M1 code (the low 4 bits of `n`).
FLY_MX_HD float decode_e2m1(uint8_t n) {
  const int e = (n >> 1) & 3, m = n & 1;
  const float mag = e == 0 ? 0.5f * m : std::ldexp(1.0f + 0.5f * m, e - 1);
  return (n & 0x8) ? -mag : mag;
}
// Element i (0 or 1) of a packed pair.
FLY_MX_HD float decode_e2m1x2(uint8_t pair, int i) { return decode_e2m1(uint8_t(i == 0 ? pair & 0xF : pair >> 4)); }
FLY_MX_HD uint8_t pack_e2m1x2(uint8_t first, uint8_t second) { return uint8_t((first & 0xF) | (second << 4)); }
// 2^(b - 127); 0x00 is 2^-127 (an FP32 subnormal), 0xFF NaN.
FLY_MX_HD float decode_e8m0(uint8_t b) { return b == 0xFF ? NAN : std::ldexp(1.0f, int(b) - 127); }

// ---- reference quantizer (host; written for clarity, not speed) -----------------------------
enum class ScaleMode { kFloor, kRceil };

// The nearest of the positive codes 0 .. top (monotone in value under `decode`), ties to the code
// with an even mantissa (its lowest bit clear), larger magnitudes saturating to `top`, the sign
// bit `sign_bit` added for negative x. NaN gives `nan_code`.
template <class Decode>
uint8_t encode_nearest_even(float x, uint8_t top, uint8_t sign_bit, uint8_t nan_code, Decode decode) {
  if (std::isnan(x)) return nan_code;
  const float a = std::fabs(x);
  // saturation first: far above `top`, float distances all round to a and would tie
  if (a >= decode(top)) return uint8_t(top | (std::signbit(x) ? sign_bit : 0));
  uint8_t best = 0;
  for (uint8_t c = 1; c <= top; ++c) {
    const float dc = std::fabs(decode(c) - a), db = std::fabs(decode(best) - a);
    if (dc < db || (dc == db && (c & 1) == 0)) best = c;
    if (decode(c) > a) break;  // past x: later codes are only farther
  }
  return uint8_t(best | (std::signbit(x) ? sign_bit : 0));
}
inline uint8_t encode_e4m3(float x) { return encode_nearest_even(x, 0x7E, 0x80, 0x7F, decode_e4m3); }
inline uint8_t encode_e2m1(float x) { return encode_nearest_even(x, 0x7, 0x8, 0x7, decode_e2m1); }  // no NaN code: saturates

// The E8M0 scale byte of a block whose largest magnitude is amax, for elements whose largest
// binade has exponent emax and whose largest value is vmax. FLOOR: 2^(floor(log2 amax) - emax)
// (the block max lands in the top binade, clipped above vmax); RCEIL: 2^ceil(log2(amax / vmax))
// (never clips). A zero block gets 0x00; a NaN or Inf amax 0xFF (the block decodes as NaN).
inline uint8_t scale_e8m0(float amax, ScaleMode mode, int emax, float vmax) {
  if (std::isnan(amax) || std::isinf(amax)) return 0xFF;
  if (amax == 0.0f) return 0x00;
  int e;
  if (mode == ScaleMode::kFloor) {
    e = std::ilogb(amax) - emax;
  } else {
    const double q = double(amax) / vmax;
    e = int(std::ceil(std::log2(q)));
    if (std::ldexp(1.0, e) < q) ++e;  // log2's rounding must not leave the scale below q
    if (e > -127 && std::ldexp(1.0, e - 1) >= q) --e;
  }
  if (e < -127) e = -127;
  if (e > 127) return 0xFF;
  return uint8_t(e + 127);
}

// Quantizes `n` values (a multiple of kBlock) into E4M3 or E2M1 codes (one byte each; pack E2M1
// with pack_e2m1x2) and one E8M0 scale per block.
inline void quantize(const float* v, int64_t n, bool fp4, ScaleMode mode, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = 0; b * kBlock < n; ++b) {
    float amax = 0.0f;
    bool nan = false;
    for (int i = 0; i < kBlock; ++i) {
      const float x = v[b * kBlock + i];
      nan |= std::isnan(x);
      amax = std::fmax(amax, std::fabs(x));
    }
    const uint8_t s = nan ? 0xFF : scale_e8m0(amax, mode, fp4 ? kE2m1Emax : kE4m3Emax, fp4 ? kE2m1Max : kE4m3Max);
    scales[b] = s;
    const float scale = decode_e8m0(s);
    for (int i = 0; i < kBlock; ++i) {
      const float x = s == 0xFF ? NAN : v[b * kBlock + i] / scale;
      codes[b * kBlock + i] = fp4 ? encode_e2m1(x) : encode_e4m3(x);
    }
  }
}

}  // namespace fly::mx
