// SPDX-License-Identifier: Apache-2.0
// MX family on the CPU: the kernels' fast encoders (mx/mx_encode.h) equal the reference quantizer
// (gemm/gemm_mx.h) bit for bit, the MX dtypes are accepted by descriptor validation, and
// fly_mx_quantize / fly_scaled_gemm reject bad input with a status and a message naming the
// argument before any device query (valid input reaches the device step: NO_DEVICE in CI).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "gemm/gemm_mx.h"
#include "mx/mx_encode.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;
using fly_test::mentions;
using fly_test::vec;

void* const kA = reinterpret_cast<void*>(0x100000);
void* const kB = reinterpret_cast<void*>(0x200000);
void* const kSA = reinterpret_cast<void*>(0x300000);
void* const kSB = reinterpret_cast<void*>(0x400000);
void* const kC = reinterpret_cast<void*>(0x500000);
void* const kBias = reinterpret_cast<void*>(0x600000);

float bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
float half_bits_to_float(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const float mag = e == 0x1F ? (m ? NAN : INFINITY) : e == 0 ? std::ldexp(float(m), -24) : std::ldexp(float(m | 0x400), e - 25);
  return h & 0x8000 ? -mag : mag;
}

// Valid input gets past validation: NO_DEVICE without a GPU; with one, the fake pointers fail the
// device-pointer check, which names no argument problem of shape/dtype.
bool passed_validation(fly_status s) {
  return s == FLY_ERROR_NO_DEVICE || s == FLY_ERROR_CUDA ||
         (s == FLY_ERROR_INVALID_ARGUMENT && (mentions("allocation") || mentions("is not device memory")));
}

}  // namespace

TEST_CASE("mx fast encoders equal the reference quantizer bit for bit", "[mx][encode]") {
  using namespace fly;
  std::mt19937 rng(26);
  std::vector<float> xs;
  // every E4M3 / E2M1 value, their midpoints and neighbours (the tie and saturation cases)
  for (int c = 0; c < 256; ++c) {
    const float v = mx::decode_e4m3(uint8_t(c));
    if (std::isnan(v)) continue;
    xs.push_back(v);
    xs.push_back(std::nextafter(v, 1e9f));
    xs.push_back(std::nextafter(v, -1e9f));
    const float w = mx::decode_e4m3(uint8_t(c + 1 < 256 ? c + 1 : c));
    if (!std::isnan(w)) xs.push_back(0.5f * (v + w));
  }
  for (float v : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f, 448.0f, 464.0f, 480.0f, 1e30f, 3.4e38f})
    for (float s : {1.0f, -1.0f}) {
      xs.push_back(s * v);
      xs.push_back(s * std::nextafter(v, 0.0f));
      xs.push_back(s * std::nextafter(v, 1e38f));
    }
  xs.push_back(0.0f);
  xs.push_back(-0.0f);
  xs.push_back(bits(1));           // smallest subnormal
  xs.push_back(bits(0x80000001));
  for (int i = 0; i < 400000; ++i) {  // random bit patterns, finite
    float f = bits(uint32_t(rng()));
    if (std::isfinite(f)) xs.push_back(f);
  }
  std::uniform_real_distribution<float> u(-500.f, 500.f);
  for (int i = 0; i < 400000; ++i) xs.push_back(u(rng));
  size_t bad8 = 0, bad4 = 0;
  for (float x : xs) {
    bad8 += mxe::encode_e4m3(x) != mx::encode_e4m3(x);
    bad4 += mxe::encode_e2m1(x) != mx::encode_e2m1(x);
  }
  CHECK(xs.size() > 790000);
  CHECK(bad8 == 0);
  CHECK(bad4 == 0);
  // the E2M1 -> E4M3 widening is exact for all 16 codes
  for (int n = 0; n < 16; ++n) CHECK(mx::decode_e4m3(mxe::e2m1_to_e4m3(uint8_t(n))) == mx::decode_e2m1(uint8_t(n)));
  // e8m0 decode, every byte
  for (int b = 0; b < 255; ++b) CHECK(mxe::e8m0_to_float(uint8_t(b)) == mx::decode_e8m0(uint8_t(b)));
  CHECK(std::isnan(mxe::e8m0_to_float(0xFF)));
}

TEST_CASE("branch-free E2M1 encoders equal the reference for every BF16 and FP16 value at every scale", "[mx][encode]") {
  using namespace fly;
  // the reference: x / 2^(s - 127) rounded to FP32, then nearest-even E2M1 with saturation
  auto ref = [](float x, uint8_t s) { return uint32_t(mx::encode_e2m1(x / mx::decode_e8m0(s))); };
  auto code = [](uint32_t top, int) { return top >> 28; };  // sign and code, as encode_e2m1
  size_t bad16 = 0, bad32 = 0, n = 0;
  for (int s = 0; s < 255; ++s) {
    float pre, msub;
    mxe::e2m1_sub_scale(uint8_t(s), pre, msub);
    const float inv = mxe::e8m0_to_float(uint8_t(254 - s));
    for (uint32_t h = 0; h < 0x10000; ++h) {
      const float xb = bits(h << 16);  // BF16
      if (std::isfinite(xb)) {
        bad16 += code(mxe::e2m1_top16(xb * pre, msub), s) != ref(xb, uint8_t(s));
        bad32 += code(mxe::e2m1_top32(xb, inv), s) != ref(xb, uint8_t(s));
        ++n;
      }
      const float xh = half_bits_to_float(uint16_t(h));  // FP16
      if (std::isfinite(xh)) {
        bad16 += code(mxe::e2m1_top16(xh * pre, msub), s) != ref(xh, uint8_t(s));
        ++n;
      }
    }
  }
  // FP32 sources: E2M1 values, midpoints and their FP32 neighbours, and random patterns, scaled
  std::mt19937 rng(126);
  std::vector<float> mags;
  for (float v : {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f})
    for (float w : {v, std::nextafter(v, 0.0f), std::nextafter(v, 100.0f)}) { mags.push_back(w); mags.push_back(-w); }
  for (int i = 0; i < 2000; ++i) mags.push_back(bits(0x3E000000u + uint32_t(rng() % 0x2000000u)) * (rng() & 1 ? 1.0f : -1.0f));
  for (int s = 0; s < 255; ++s) {
    const float inv = mxe::e8m0_to_float(uint8_t(254 - s));
    for (float m : mags) {
      const float x = std::ldexp(m, s - 127);
      if (!std::isfinite(x)) continue;
      bad32 += code(mxe::e2m1_top32(x, inv), s) != ref(x, uint8_t(s));
      ++n;
    }
    for (int i = 0; i < 2000; ++i) {
      const float x = bits(uint32_t(rng()));
      if (std::isfinite(x)) { bad32 += code(mxe::e2m1_top32(x, inv), s) != ref(x, uint8_t(s)); ++n; }
    }
  }
  CHECK(n > 33000000);
  CHECK(bad16 == 0);
  CHECK(bad32 == 0);
}

TEST_CASE("mx fast scale rule equals the reference for FLOOR and RCEIL", "[mx][encode]") {
  using namespace fly;
  std::mt19937 rng(7);
  size_t bad = 0, n = 0;
  auto check = [&](float amax) {
    for (int fp4 = 0; fp4 < 2; ++fp4)
      for (int rc = 0; rc < 2; ++rc) {
        const int emax = fp4 ? mx::kE2m1Emax : mx::kE4m3Emax;
        const float vmax = fp4 ? mx::kE2m1Max : mx::kE4m3Max;
        const auto mode = rc ? mx::ScaleMode::kRceil : mx::ScaleMode::kFloor;
        bad += mxe::scale_byte(amax, rc != 0, emax, vmax) != mx::scale_e8m0(amax, mode, emax, vmax);
        ++n;
      }
  };
  for (uint32_t e = 0; e < 255; ++e)
    for (uint32_t m : {0u, 1u, 0x400000u, 0x7FFFFFu, 0x600000u, 0x5FFFFFu}) check(bits((e << 23) | m));
  for (int i = 0; i < 200000; ++i) {
    const float f = std::fabs(bits(uint32_t(rng())));
    if (std::isfinite(f)) check(f);
  }
  for (int c = 0; c < 127; ++c) check(mx::decode_e4m3(uint8_t(c)) * 64.0f);
  CHECK(n > 100000);
  CHECK(bad == 0);
}

TEST_CASE("mx_quantize rejects bad arguments before any device query", "[mx][args]") {
  fly_tensor x = mat(kA, FLY_BF16, 4, 64, 64);
  fly_tensor q8 = mat(kB, FLY_F8_E4M3, 4, 64, 64), q4 = mat(kB, FLY_F4_E2M1X2, 4, 32, 32);
  fly_tensor s = mat(kSA, FLY_E8M0, 4, 2, 2);
  CHECK(passed_validation(fly_mx_quantize(&x, FLY_MX_E4M3, &q8, &s, nullptr)));
  CHECK(passed_validation(fly_mx_quantize(&x, FLY_MX_E2M1 | FLY_MX_SCALE_RCEIL, &q4, &s, nullptr)));
  fly_tensor xf = mat(kA, FLY_F32, 4, 64, 96);
  CHECK(passed_validation(fly_mx_quantize(&xf, FLY_MX_E4M3, &q8, &s, nullptr)));

  CHECK(fly_mx_quantize(&x, 3, &q8, &s, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("format"));
  CHECK(fly_mx_quantize(&x, FLY_MX_E4M3 | 0x200, &q8, &s, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("format"));
  CHECK(fly_mx_quantize(nullptr, FLY_MX_E4M3, &q8, &s, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("x"));
  CHECK(fly_mx_quantize(&x, FLY_MX_E2M1, &q8, &s, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("q: dtype e4m3"));
  CHECK(fly_mx_quantize(&x, FLY_MX_E4M3, &q4, &s, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("q: dtype"));
  fly_tensor x40 = mat(kA, FLY_BF16, 4, 40, 40);
  CHECK(fly_mx_quantize(&x40, FLY_MX_E4M3, &q8, &s, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("multiple of 32"));
  fly_tensor xi = mat(kA, FLY_I32, 4, 64, 64);
  CHECK(fly_mx_quantize(&xi, FLY_MX_E4M3, &q8, &s, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("x: dtype int32"));
  fly_tensor xs = mat(kA, FLY_BF16, 4, 64, 32);  // overlapping rows
  CHECK(fly_mx_quantize(&xs, FLY_MX_E4M3, &q8, &s, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("x: row stride"));
  fly_tensor qp = mat(kB, FLY_F8_E4M3, 4, 64, 128);  // padded q rows
  CHECK(fly_mx_quantize(&x, FLY_MX_E4M3, &qp, &s, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("q: must be contiguous"));
  fly_tensor sw = mat(kSA, FLY_E8M0, 4, 4, 4);
  CHECK(fly_mx_quantize(&x, FLY_MX_E4M3, &q8, &sw, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("scales: shape"));
  fly_tensor su = mat(kSA, FLY_U8, 4, 2, 2);
  CHECK(fly_mx_quantize(&x, FLY_MX_E4M3, &q8, &su, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("scales: dtype uint8"));
  // M == 0: a no-op before any device query
  fly_tensor x0 = mat(kA, FLY_BF16, 0, 64, 64), q0 = mat(kB, FLY_F8_E4M3, 0, 64, 64), s0 = mat(kSA, FLY_E8M0, 0, 2, 2);
  CHECK(fly_mx_quantize(&x0, FLY_MX_E4M3, &q0, &s0, nullptr) == FLY_SUCCESS);
}

TEST_CASE("scaled_gemm rejects bad arguments before any device query", "[mx][args]") {
  const int64_t M = 8, N = 64, K = 128;
  fly_tensor a8 = mat(kA, FLY_F8_E4M3, M, K, K), b8 = mat(kB, FLY_F8_E4M3, N, K, K);
  fly_tensor a4 = mat(kA, FLY_F4_E2M1X2, M, K / 2, K / 2), b4 = mat(kB, FLY_F4_E2M1X2, N, K / 2, K / 2);
  fly_tensor sa = mat(kSA, FLY_E8M0, M, K / 32, K / 32), sb = mat(kSB, FLY_E8M0, N, K / 32, K / 32);
  fly_tensor c = mat(kC, FLY_BF16, M, N, N), bias = vec(kBias, FLY_BF16, N);
  CHECK(passed_validation(fly_scaled_gemm(&a8, &sa, &b8, &sb, &bias, &c, nullptr, 0, nullptr)));
  CHECK(passed_validation(fly_scaled_gemm(&a4, &sa, &b4, &sb, nullptr, &c, nullptr, 0, nullptr)));

  CHECK(fly_scaled_gemm(nullptr, &sa, &b8, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("a"));
  CHECK(fly_scaled_gemm(&a8, &sa, &b4, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("b: dtype e2m1x2 does not match a"));
  fly_tensor abf = mat(kA, FLY_BF16, M, K, K);
  CHECK(fly_scaled_gemm(&abf, &sa, &b8, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("a: dtype bf16"));
  fly_tensor c32 = mat(kC, FLY_F32, M, N, N);
  CHECK(fly_scaled_gemm(&a8, &sa, &b8, &sb, nullptr, &c32, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("c: dtype fp32"));
  fly_tensor bk = mat(kB, FLY_F8_E4M3, N, 96, 96);
  CHECK(fly_scaled_gemm(&a8, &sa, &bk, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("b: 96 columns"));
  fly_tensor a48 = mat(kA, FLY_F8_E4M3, M, 48, 48), b48 = mat(kB, FLY_F8_E4M3, N, 48, 48);
  CHECK(fly_scaled_gemm(&a48, &sa, &b48, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("multiple of 32"));
  fly_tensor cw = mat(kC, FLY_BF16, M, N + 1, N + 1);
  CHECK(fly_scaled_gemm(&a8, &sa, &b8, &sb, nullptr, &cw, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("c: shape"));
  fly_tensor sau = mat(kSA, FLY_U8, M, K / 32, K / 32);
  CHECK(fly_scaled_gemm(&a8, &sau, &b8, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("scale_a: dtype uint8"));
  fly_tensor sbw = mat(kSB, FLY_E8M0, N, K / 16, K / 16);
  CHECK(fly_scaled_gemm(&a8, &sa, &b8, &sbw, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("scale_b: shape"));
  fly_tensor sap = mat(kSA, FLY_E8M0, M, K / 32, 8);  // padded scale rows
  CHECK(fly_scaled_gemm(&a8, &sap, &b8, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("scale_a: must be contiguous"));
  fly_tensor bias16 = vec(kBias, FLY_F16, N);
  CHECK(fly_scaled_gemm(&a8, &sa, &b8, &sb, &bias16, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("bias: dtype fp16"));
  fly_tensor at = mat(kA, FLY_F8_E4M3, M, K, 1, M);  // column-major A
  CHECK(fly_scaled_gemm(&at, &sa, &b8, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("a: inner stride"));
  CHECK(fly_scaled_gemm(&a8, &sa, &b8, &sb, nullptr, &c, nullptr, 64, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("workspace"));
  // padded rows whose byte stride breaks the 16-byte rule: unsupported, not wrong
  fly_tensor apad = mat(kA, FLY_F8_E4M3, M, K, K + 8);
  CHECK(fly_scaled_gemm(&apad, &sa, &b8, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("a: row stride"));
  fly_tensor bmis = mat(reinterpret_cast<char*>(kB) + 8, FLY_F8_E4M3, N, K, K);
  CHECK(fly_scaled_gemm(&a8, &sa, &bmis, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_MISALIGNED);
  CHECK(mentions("b: data pointer"));
  // empty output: no-op
  fly_tensor a0 = mat(kA, FLY_F8_E4M3, 0, K, K), sa0 = mat(kSA, FLY_E8M0, 0, K / 32, K / 32),
             c0 = mat(kC, FLY_BF16, 0, N, N);
  CHECK(fly_scaled_gemm(&a0, &sa0, &b8, &sb, nullptr, &c0, nullptr, 0, nullptr) == FLY_SUCCESS);
}

// The header's formula, from the bundled variants' names (mxfp_wgmma_n<bn>_..._s<split>):
// max over them of S x M x N x 4 rounded up to 256, S = min(split, ceil(K / 128), 132 / tiles)
// when S >= 2; 0 in builds without split variants (the default build).
static size_t expected_ws(int64_t M, int64_t N, int64_t K) {
  size_t need = 0;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const std::string name = fly_variant_name(i);
    if (name.rfind("mxfp_wgmma_n", 0) != 0) continue;
    const size_t us = name.find("_s", 12);
    if (us == std::string::npos) continue;
    const int64_t bn = std::stoll(name.substr(12)), split = std::stoll(name.substr(us + 2));
    const int64_t tiles = ((M + 127) / 128) * ((N + bn - 1) / bn);
    const int64_t S = std::min({split, (K + 127) / 128, 132 / tiles});
    if (S >= 2) need = std::max(need, size_t((S * M * N * 4 + 255) / 256 * 256));
  }
  return need;
}

TEST_CASE("scaled_gemm_workspace_size: the header's formula, bad arguments rejected, no device needed", "[mx][args][splitk]") {
  const int64_t M = 32, N = 4096, K = 4096;
  fly_tensor a8 = mat(kA, FLY_F8_E4M3, M, K, K), b8 = mat(kB, FLY_F8_E4M3, N, K, K);
  fly_tensor a4 = mat(kA, FLY_F4_E2M1X2, M, K / 2, K / 2), b4 = mat(kB, FLY_F4_E2M1X2, N, K / 2, K / 2);
  fly_tensor c = mat(kC, FLY_BF16, M, N, N), c16 = mat(kC, FLY_F16, M, N, N);
  size_t bytes = 1;
  // valid: answered without a device (CI has none), the same for both formats and outputs
  REQUIRE(fly_scaled_gemm_workspace_size(&a8, &b8, &c, &bytes) == FLY_SUCCESS);
  CHECK(bytes == expected_ws(M, N, K));
  CHECK(bytes % 256 == 0);
  size_t b4bytes = 1;
  REQUIRE(fly_scaled_gemm_workspace_size(&a4, &b4, &c16, &b4bytes) == FLY_SUCCESS);
  CHECK(b4bytes == bytes);
  struct Shape { int64_t M, N, K; };
  for (Shape sh : {Shape{1, 100, 96}, Shape{200, 300, 640}, Shape{4096, 4096, 4096}, Shape{7, 130, 8192},
                   Shape{1, 1, 32}}) {
    fly_tensor a = mat(kA, FLY_F8_E4M3, sh.M, sh.K, sh.K), b = mat(kB, FLY_F8_E4M3, sh.N, sh.K, sh.K);
    fly_tensor cc = mat(kC, FLY_F16, sh.M, sh.N, sh.N);
    bytes = 1;
    INFO("M " << sh.M << " N " << sh.N << " K " << sh.K);
    REQUIRE(fly_scaled_gemm_workspace_size(&a, &b, &cc, &bytes) == FLY_SUCCESS);
    CHECK(bytes == expected_ws(sh.M, sh.N, sh.K));
  }
  // one stage (K <= 128) or one wave of tiles already: nothing to split
  {
    fly_tensor a = mat(kA, FLY_F8_E4M3, 64, 128, 128), b = mat(kB, FLY_F8_E4M3, 4096, 128, 128);
    fly_tensor cc = mat(kC, FLY_BF16, 64, 4096, 4096);
    bytes = 1;
    CHECK(fly_scaled_gemm_workspace_size(&a, &b, &cc, &bytes) == FLY_SUCCESS);
    CHECK(bytes == 0);
  }
  // empty output: 0 bytes
  fly_tensor a0 = mat(kA, FLY_F8_E4M3, 0, K, K), c0 = mat(kC, FLY_BF16, 0, N, N);
  bytes = 1;
  CHECK(fly_scaled_gemm_workspace_size(&a0, &b8, &c0, &bytes) == FLY_SUCCESS);
  CHECK(bytes == 0);
  // bad arguments: a status naming the argument, and bytes = 0
  auto rejects = [&](const fly_tensor* a, const fly_tensor* b, const fly_tensor* cc, const char* what) {
    bytes = 77;
    const fly_status st = fly_scaled_gemm_workspace_size(a, b, cc, &bytes);
    INFO(what << ": " << fly_get_last_error());
    // a dtype no kernel takes: UNSUPPORTED; a shape or dtype at odds with another argument: INVALID
    CHECK((st == FLY_ERROR_UNSUPPORTED || st == FLY_ERROR_INVALID_ARGUMENT));
    CHECK(mentions(what));
    CHECK(bytes == 0);
  };
  CHECK(fly_scaled_gemm_workspace_size(&a8, &b8, &c, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("bytes: NULL"));
  rejects(nullptr, &b8, &c, "a: descriptor is NULL");
  rejects(&a8, nullptr, &c, "b: descriptor is NULL");
  rejects(&a8, &b8, nullptr, "c: descriptor is NULL");
  // (BF16 / FP16 a is the weight-only mode, which needs no workspace: test_mx_decode_args.cpp)
  fly_tensor af32 = mat(kA, FLY_F32, M, K, K);
  rejects(&af32, &b8, &c, "a: dtype fp32");
  rejects(&a8, &b4, &c, "b: dtype e2m1x2 does not match a");
  fly_tensor bk = mat(kB, FLY_F8_E4M3, N, K - 32, K - 32);
  rejects(&a8, &bk, &c, "b: 4064 columns");
  fly_tensor cw = mat(kC, FLY_BF16, M, N + 1, N + 1);
  rejects(&a8, &b8, &cw, "c: shape");
  fly_tensor c32 = mat(kC, FLY_F32, M, N, N);
  rejects(&a8, &b8, &c32, "c: dtype fp32");
  fly_tensor a48 = mat(kA, FLY_F8_E4M3, M, 48, 48), b48 = mat(kB, FLY_F8_E4M3, N, 48, 48);
  rejects(&a48, &b48, &c, "multiple of 32");
  fly_tensor a3 = a8;
  a3.rank = 3;
  rejects(&a3, &b8, &c, "a: expected rank 2");
  fly_tensor aneg = mat(kA, FLY_F8_E4M3, -1, K, K);
  rejects(&aneg, &b8, &c, "a: size[0] = -1 is negative");
  fly_tensor bnull = mat(nullptr, FLY_F8_E4M3, N, K, K);
  rejects(&a8, &bnull, &c, "b: data pointer is NULL");
}

TEST_CASE("scaled_gemm rejects a misaligned or oversized workspace before any device query", "[mx][args][splitk]") {
  const int64_t M = 8, N = 64, K = 128;
  fly_tensor a8 = mat(kA, FLY_F8_E4M3, M, K, K), b8 = mat(kB, FLY_F8_E4M3, N, K, K);
  fly_tensor sa = mat(kSA, FLY_E8M0, M, K / 32, K / 32), sb = mat(kSB, FLY_E8M0, N, K / 32, K / 32);
  fly_tensor c = mat(kC, FLY_BF16, M, N, N);
  void* const ws = reinterpret_cast<void*>(0x700000);
  // aligned with a size: validated, then the device step (NO_DEVICE here)
  CHECK(passed_validation(fly_scaled_gemm(&a8, &sa, &b8, &sb, nullptr, &c, ws, 4096, nullptr)));
  // a non-NULL pointer with 0 bytes is "no workspace": the same as NULL
  CHECK(passed_validation(fly_scaled_gemm(&a8, &sa, &b8, &sb, nullptr, &c, reinterpret_cast<char*>(ws) + 8, 0, nullptr)));
  for (int off : {4, 16, 128}) {
    INFO("offset " << off);
    CHECK(fly_scaled_gemm(&a8, &sa, &b8, &sb, nullptr, &c, reinterpret_cast<char*>(ws) + off, 4096, nullptr) ==
          FLY_ERROR_MISALIGNED);
    CHECK(mentions("workspace"));
    CHECK(mentions("256-byte aligned"));
  }
  CHECK(fly_scaled_gemm(&a8, &sa, &b8, &sb, nullptr, &c, ws, size_t(1) << 50, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("workspace_bytes"));
  CHECK(fly_scaled_gemm(&a8, &sa, &b8, &sb, nullptr, &c, nullptr, 256, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("workspace: NULL"));
}

TEST_CASE("MX dtypes are valid descriptor dtypes of one byte", "[mx][dtype]") {
  CHECK(int(FLY_F8_E4M3) == 8);
  CHECK(int(FLY_F4_E2M1X2) == 9);
  CHECK(int(FLY_E8M0) == 10);
  // an E8M0 tensor whose byte extent overflows is rejected as such (its element size is 1)
  fly_tensor x = mat(kA, FLY_BF16, 4, 64, 64), q8 = mat(kB, FLY_F8_E4M3, 4, 64, 64);
  fly_tensor s = mat(kSA, FLY_E8M0, int64_t(1) << 46, 2, int64_t(1) << 46);
  CHECK(fly_mx_quantize(&x, FLY_MX_E4M3, &q8, &s, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("scales"));
}
