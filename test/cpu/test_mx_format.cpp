// SPDX-License-Identifier: Apache-2.0
// The MX formats (kernels/gemm/gemm_mx.h) against the OCP MX v1.0 rules: every code of E4M3,
// E5M2, E2M1 and E8M0 decodes to its value, the reference quantizer rounds to nearest even with
// saturation, and its FLOOR and RCEIL scales put each block where the rules say.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "catch_compat.hpp"
#include "gemm/gemm_mx.h"

using namespace fly::mx;

TEST_CASE("E4M3 codes: 0..448, subnormals j x 2^-9, NaN only at S.1111.111, no Inf", "[mx]") {
  CHECK(decode_e4m3(0x00) == 0.0f);
  CHECK(std::signbit(decode_e4m3(0x80)));
  CHECK(decode_e4m3(0x01) == std::ldexp(1.0f, -9));
  CHECK(decode_e4m3(0x07) == 7 * std::ldexp(1.0f, -9));
  CHECK(decode_e4m3(0x08) == std::ldexp(1.0f, -6));  // min normal
  CHECK(decode_e4m3(0x38) == 1.0f);
  CHECK(decode_e4m3(0x7E) == kE4m3Max);
  CHECK(std::isnan(decode_e4m3(0x7F)));
  CHECK(std::isnan(decode_e4m3(0xFF)));
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = decode_e4m3(uint8_t(c));
    nans += std::isnan(v);
    CHECK_FALSE(std::isinf(v));
    if (!std::isnan(v)) CHECK(decode_e4m3(uint8_t(c ^ 0x80)) == -v);
  }
  CHECK(nans == 2);
  for (int c = 1; c <= 0x7E; ++c) CHECK(decode_e4m3(uint8_t(c)) > decode_e4m3(uint8_t(c - 1)));  // monotone
}

TEST_CASE("E5M2 codes: max 57344, Inf and NaN", "[mx]") {
  CHECK(decode_e5m2(0x7B) == kE5m2Max);
  CHECK(std::isinf(decode_e5m2(0x7C)));
  CHECK(std::isnan(decode_e5m2(0x7D)));
  CHECK(decode_e5m2(0x01) == std::ldexp(1.0f, -16));
  CHECK(decode_e5m2(0x3C) == 1.0f);
}

TEST_CASE("E2M1 codes, packing two per byte with element 0 low", "[mx]") {
  const float expect[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int c = 0; c < 8; ++c) {
    CHECK(decode_e2m1(uint8_t(c)) == expect[c]);
    CHECK(decode_e2m1(uint8_t(c | 8)) == -expect[c]);
  }
  CHECK(std::signbit(decode_e2m1(0x8)));  // -0
  const uint8_t pair = pack_e2m1x2(0x3, 0xF);
  CHECK(pair == 0xF3);
  CHECK(decode_e2m1x2(pair, 0) == 1.5f);
  CHECK(decode_e2m1x2(pair, 1) == -6.0f);
}

TEST_CASE("E8M0 scales: 2^(e - 127), 0x00 is 2^-127, 0xFF NaN", "[mx]") {
  CHECK(decode_e8m0(0x7F) == 1.0f);
  CHECK(decode_e8m0(0x00) == std::ldexp(1.0f, -127));
  CHECK(decode_e8m0(0x01) == std::ldexp(1.0f, -126));
  CHECK(decode_e8m0(0xFE) == std::ldexp(1.0f, 127));
  CHECK(std::isnan(decode_e8m0(0xFF)));
}

TEST_CASE("every E2M1 value is exact in E4M3 (MXFP4 can ride the FP8 path)", "[mx]") {
  for (int c = 0; c < 16; ++c) {
    const float v = decode_e2m1(uint8_t(c));
    CHECK(decode_e4m3(encode_e4m3(v)) == v);
  }
}

TEST_CASE("element rounding: nearest, ties to even, saturation", "[mx]") {
  // Halfway between 1 (mantissa 000) and 1.125 (001): the even one.
  CHECK(decode_e4m3(encode_e4m3(1.0625f)) == 1.0f);
  // Halfway between 1.125 (001) and 1.25 (010): the even one.
  CHECK(decode_e4m3(encode_e4m3(1.1875f)) == 1.25f);
  CHECK(decode_e4m3(encode_e4m3(1.07f)) == 1.125f);
  CHECK(decode_e4m3(encode_e4m3(1000.0f)) == kE4m3Max);  // saturates (no Inf)
  CHECK(decode_e4m3(encode_e4m3(-1e30f)) == -kE4m3Max);
  CHECK(decode_e4m3(encode_e4m3(std::ldexp(1.0f, -11))) == 0.0f);  // below half the smallest subnormal
  CHECK(std::isnan(decode_e4m3(encode_e4m3(NAN))));
  // E2M1: 2.5 is halfway between 2 (100) and 3 (101): 2; 5 between 4 (110) and 6 (111): 4.
  CHECK(decode_e2m1(encode_e2m1(2.5f)) == 2.0f);
  CHECK(decode_e2m1(encode_e2m1(5.0f)) == 4.0f);
  CHECK(decode_e2m1(encode_e2m1(0.25f)) == 0.0f);  // halfway 0 / 0.5: even (0)
  CHECK(decode_e2m1(encode_e2m1(0.26f)) == 0.5f);
  CHECK(decode_e2m1(encode_e2m1(-7.0f)) == -6.0f);
  // Every representable value encodes to itself.
  for (int c = 0; c < 256; ++c) {
    const float v = decode_e4m3(uint8_t(c));
    if (!std::isnan(v)) CHECK(decode_e4m3(encode_e4m3(v)) == v);
  }
}

TEST_CASE("block scales: FLOOR puts the block max in the top binade, RCEIL never clips", "[mx]") {
  // amax = 1.5 x 2^10: FLOOR 2^(10 - 8); the max becomes 384, inside E4M3's range.
  CHECK(scale_e8m0(1536.0f, ScaleMode::kFloor, kE4m3Emax, kE4m3Max) == 127 + 2);
  // amax = 1.9 x 2^10: FLOOR gives the same scale and the max (486.4) saturates to 448; RCEIL one more.
  CHECK(scale_e8m0(1945.6f, ScaleMode::kFloor, kE4m3Emax, kE4m3Max) == 127 + 2);
  CHECK(scale_e8m0(1945.6f, ScaleMode::kRceil, kE4m3Emax, kE4m3Max) == 127 + 3);
  // E2M1: amax 6 gives scale 1 both ways (FLOOR: ilogb(6) = 2 minus emax 2; RCEIL: 6 / 6 = 1).
  CHECK(scale_e8m0(6.0f, ScaleMode::kFloor, kE2m1Emax, kE2m1Max) == 127);
  CHECK(scale_e8m0(6.0f, ScaleMode::kRceil, kE2m1Emax, kE2m1Max) == 127);
  CHECK(scale_e8m0(0.0f, ScaleMode::kFloor, kE4m3Emax, kE4m3Max) == 0x00);
  CHECK(scale_e8m0(INFINITY, ScaleMode::kRceil, kE4m3Emax, kE4m3Max) == 0xFF);
  CHECK(scale_e8m0(std::ldexp(1.0f, -140), ScaleMode::kFloor, kE4m3Emax, kE4m3Max) == 0x00);  // clamped at 2^-127

  std::mt19937 rng(7);
  std::lognormal_distribution<float> mag(0.0f, 3.0f);
  for (int fp4 = 0; fp4 < 2; ++fp4)
    for (ScaleMode mode : {ScaleMode::kFloor, ScaleMode::kRceil}) {
      std::vector<float> v(kBlock * 64);
      for (auto& x : v) x = (rng() & 1 ? -1.0f : 1.0f) * mag(rng);
      std::vector<uint8_t> codes(v.size()), scales(v.size() / kBlock);
      quantize(v.data(), int64_t(v.size()), fp4 != 0, mode, codes.data(), scales.data());
      const float vmax = fp4 ? kE2m1Max : kE4m3Max;
      for (size_t b = 0; b < scales.size(); ++b) {
        const float scale = decode_e8m0(scales[b]);
        float amax = 0.0f;
        for (int i = 0; i < kBlock; ++i) amax = std::fmax(amax, std::fabs(v[b * kBlock + i]));
        const float top = amax / scale;
        const float binade = std::ldexp(1.0f, fp4 ? kE2m1Emax : kE4m3Emax);  // 256 (E4M3), 4 (E2M1)
        if (mode == ScaleMode::kFloor) CHECK((top >= binade && top < 2 * binade));
        else CHECK((top <= vmax && top > vmax / 2));
        for (int i = 0; i < kBlock; ++i) {
          const float x = v[b * kBlock + i] / scale;
          const float q = fp4 ? decode_e2m1(codes[b * kBlock + i]) : decode_e4m3(codes[b * kBlock + i]);
          // Saturation at vmax; otherwise within half a step of the element grid at x's binade.
          const float clipped = std::fmax(-vmax, std::fmin(vmax, x));
          const int e = std::max(std::ilogb(std::fabs(clipped) > 0 ? std::fabs(clipped) : 1.0f), fp4 ? 0 : -6);
          const float half_step = std::ldexp(1.0f, e - (fp4 ? 1 : 3)) / 2;
          CHECK(std::fabs(q - clipped) <= half_step);
        }
      }
    }
}

TEST_CASE("special blocks: zeros, NaN", "[mx]") {
  std::vector<float> v(2 * kBlock, 0.0f);
  v[kBlock + 5] = NAN;
  v[kBlock + 6] = 3.0f;
  std::vector<uint8_t> codes(v.size()), scales(2);
  quantize(v.data(), int64_t(v.size()), false, ScaleMode::kFloor, codes.data(), scales.data());
  CHECK(scales[0] == 0x00);
  for (int i = 0; i < kBlock; ++i) CHECK(decode_e4m3(codes[i]) == 0.0f);
  CHECK(scales[1] == 0xFF);
  CHECK(std::isnan(decode_e8m0(scales[1]) * decode_e4m3(codes[kBlock + 6])));
}
