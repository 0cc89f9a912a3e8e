// SPDX-License-Identifier: Apache-2.0
// Weight-only MX GEMM on the GPU (fly_scaled_gemm with BF16/FP16 activations and scale_a = NULL):
// the decode kernels (M <= 64, kernels/mx/mx_decode.cu) against an FP64 GEMM of the exactly
// dequantized weights, the prefill kernel (M > 64, BF16, kernels/mx/mx_prefill.cu) against one of
// the weights dequantized to BF16 (what it computes: mx_prefill.h); fresh random inputs per case,
// the output poisoned with NaN beforehand and every element checked. Tails (M = 1, M not a multiple of 8, N not a multiple of the CTA's rows, K = 32, K not a
// multiple of the 64-k stage), bias, a NaN scale (0xFF: that column of C is NaN), wide scale
// exponents incl. 0x00 and 0xFE (BF16), both activation dtypes, both weight formats, the
// dispatch's pick and every bundled mx_decode variant forced, cluster split-K (long K, few tiles;
// cluster sizes 1, 3, 4, 5, 7, 8 on a 132-SM part).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "gemm/gemm_mx.h"
#include "gemm_test_util.hpp"
#include "test_tensors.hpp"
#include "variant_test_util.hpp"

namespace {

using fly_test::mat;
using fly_test::vec;
namespace mx = fly::mx;

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)

using gemm_test::Dev;

uint16_t to_bits(fly_dtype dt, float f) {
  uint16_t r;
  if (dt == FLY_F16) {
    const __half h = __float2half_rn(f);
    std::memcpy(&r, &h, 2);
  } else {
    const __nv_bfloat16 h = __float2bfloat16_rn(f);
    std::memcpy(&r, &h, 2);
  }
  return r;
}
double from_bits(fly_dtype dt, uint16_t r) {
  if (dt == FLY_F16) {
    __half h;
    std::memcpy(&h, &r, 2);
    return double(__half2float(h));
  }
  __nv_bfloat16 h;
  std::memcpy(&h, &r, 2);
  return double(__bfloat162float(h));
}

enum class Scales { kNarrow, kWide };

struct Case {
  fly_dtype act;
  bool fp4;
  int64_t M, N, K;
  bool bias;
  Scales scales;
  int64_t nan_row;  // W row (C column) whose first block has scale 0xFF, or -1
  int64_t nan_code_row = -1;  // MXFP8: W row (C column) with one E4M3 NaN code (0x7F), or -1
};

// The prefill kernel's weight: the exact value rounded to BF16 (round to nearest even).
double round_bf16(double w) { return double(__bfloat162float(__float2bfloat16_rn(float(w)))); }

// One case: inputs, FP64 reference, then the dispatch's pick and every bundled mx_decode variant of
// this act / fmt that takes M, each on a NaN-poisoned C.
void run_case(const Case& g, std::mt19937& rng) {
  const int64_t M = g.M, N = g.N, K = g.K, kbs = K / 32;
  const int64_t bcols = g.fp4 ? K / 2 : K;
  std::uniform_real_distribution<float> ux(-1.f, 1.f);
  std::uniform_int_distribution<int> ub(0, 255);
  std::vector<uint16_t> ha(size_t(M * K));
  for (auto& v : ha) v = to_bits(g.act, ux(rng));
  std::vector<uint8_t> hb(size_t(N * bcols)), hs(size_t(N * kbs));
  for (auto& v : hb) {
    v = uint8_t(ub(rng));
    if (!g.fp4 && (v & 0x7F) == 0x7F) v = uint8_t(v - 1);  // no E4M3 NaN codes (the NaN case is the scale's)
  }
  const int lo = g.scales == Scales::kNarrow ? (g.act == FLY_F16 ? 119 : 110) : 20;
  const int hi = g.scales == Scales::kNarrow ? (g.act == FLY_F16 ? 127 : 135) : 234;
  std::uniform_int_distribution<int> us(lo, hi);
  for (auto& v : hs) v = uint8_t(us(rng));
  if (g.scales == Scales::kWide && N > 3) {
    // the extremes: row 1 at 2^-127 (random codes), row 2 at 2^127 with one nonzero element (0.5:
    // 2^126 times an activation stays finite in FP32 and BF16 whatever the order of the sums)
    for (int64_t b = 0; b < kbs; ++b) hs[size_t(1 * kbs + b)] = 0x00;
    for (int64_t b = 0; b < kbs; ++b) hs[size_t(2 * kbs + b)] = 0xFE;
    for (int64_t j = 0; j < bcols; ++j) hb[size_t(2 * bcols + j)] = 0;
    hb[size_t(2 * bcols)] = g.fp4 ? 0x01 : 0x30;
  }
  if (g.nan_row >= 0) hs[size_t(g.nan_row * kbs)] = 0xFF;
  if (g.nan_code_row >= 0 && !g.fp4) hb[size_t(g.nan_code_row * bcols + (K > 40 ? 37 : 3))] = 0x7F;
  // the prefill kernel (M > 64, or forced at any M with BF16) multiplies the weights as BF16
  const bool any_prefill = g.act == FLY_BF16;
  std::vector<uint16_t> hbias(static_cast<size_t>(N));
  for (auto& v : hbias) v = to_bits(g.act, ux(rng));

  // FP64 references: of the exactly dequantized weights (decode kernels), and of those rounded to
  // BF16 (prefill kernel)
  std::vector<double> w(size_t(N * K)), wr(any_prefill ? size_t(N * K) : 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t code = g.fp4 ? uint8_t((hb[size_t(n * bcols + k / 2)] >> (4 * (k & 1))) & 0xF) : hb[size_t(n * bcols + k)];
      const double e = g.fp4 ? double(mx::decode_e2m1(code)) : double(mx::decode_e4m3(code));
      const double x = e * double(mx::decode_e8m0(hs[size_t(n * kbs + k / 32)]));
      w[size_t(n * K + k)] = x;
      if (any_prefill) wr[size_t(n * K + k)] = round_bf16(x);
    }
  struct Ref {
    std::vector<double> v, sabs;
  };
  auto reference = [&](const std::vector<double>& wt) {
    Ref out{std::vector<double>(size_t(M * N)), std::vector<double>(size_t(M * N))};
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double r = g.bias ? from_bits(g.act, hbias[size_t(n)]) : 0.0, s = std::fabs(r);
        for (int64_t k = 0; k < K; ++k) {
          const double p = from_bits(g.act, ha[size_t(m * K + k)]) * wt[size_t(n * K + k)];
          r += p;
          s += std::fabs(p);
        }
        out.v[size_t(m * N + n)] = r;
        out.sabs[size_t(m * N + n)] = s;
      }
    return out;
  };
  const bool only_prefill = M > 64;
  const Ref exact = only_prefill ? Ref{} : reference(w), rounded = any_prefill ? reference(wr) : Ref{};

  Dev da(ha.size() * 2), db(hb.size()), ds(hs.size()), dbias(hbias.size() * 2), dc(size_t(M * N) * 2);
  CUDA_OK(cudaMemcpy(da.p, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db.p, hb.data(), hb.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(ds.p, hs.data(), hs.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dbias.p, hbias.data(), hbias.size() * 2, cudaMemcpyHostToDevice));
  const fly_tensor a = mat(da.p, g.act, M, K, K);
  const fly_tensor b = mat(db.p, g.fp4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3, N, bcols, bcols);
  const fly_tensor sb = mat(ds.p, FLY_E8M0, N, kbs, kbs);
  const fly_tensor bias = vec(dbias.p, g.act, N);
  const fly_tensor c = mat(dc.p, g.act, M, N, N);

  const double rel = g.act == FLY_BF16 ? 1.0 / 256 : 1.0 / 1024;
  const double abs_tol = g.act == FLY_BF16 ? std::ldexp(1.0, -126) : std::ldexp(1.0, -24);
  const double lim = g.act == FLY_BF16 ? std::ldexp(1.0, 128) - std::ldexp(1.0, 119) : 65520.0;
  auto check = [&](const std::string& who, bool prefill) {
    const std::vector<double>& ref = prefill ? rounded.v : exact.v;
    const std::vector<double>& sabs = prefill ? rounded.sabs : exact.sabs;
    CUDA_OK(cudaMemset(dc.p, 0xFF, size_t(M * N) * 2));  // NaN in both dtypes
    const fly_status st = fly_scaled_gemm(&a, nullptr, &b, &sb, g.bias ? &bias : nullptr, &c, nullptr, 0, nullptr);
    INFO(who << ": " << fly_get_last_error());
    REQUIRE(st == FLY_SUCCESS);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> hc(size_t(M * N));
    CUDA_OK(cudaMemcpy(hc.data(), dc.p, hc.size() * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    double worst = 0;
    int64_t first_bad = -1;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const size_t i = size_t(m * N + n);
        const double got = from_bits(g.act, hc[i]);
        bool ok;
        if (n == g.nan_row || (n == g.nan_code_row && !g.fp4)) {
          ok = std::isnan(got);
        } else {
          const double r = ref[i], tol = rel * std::fabs(r) + std::ldexp(sabs[i], -16) + abs_tol;
          const bool inf_ok = std::isinf(got) && (got > 0) == (r > 0);
          if (std::fabs(r) - tol >= lim) ok = inf_ok;
          else if (inf_ok && std::fabs(r) + tol >= lim) ok = true;
          else {
            ok = std::isfinite(got) && std::fabs(got - r) <= tol;
            if (std::isfinite(got) && tol > 0) worst = std::max(worst, std::fabs(got - r) / tol);
          }
        }
        if (!ok) {
          ++bad;
          if (first_bad < 0) first_bad = int64_t(i);
        }
      }
    INFO(who << " act " << (g.act == FLY_BF16 ? "bf16" : "fp16") << " fmt " << (g.fp4 ? "e2m1" : "e4m3") << " M " << M
             << " N " << N << " K " << K << " bias " << g.bias << " wide " << (g.scales == Scales::kWide) << " nan_row "
             << g.nan_row << " worst err/tol " << worst << " first bad " << first_bad
             << (first_bad >= 0 ? " got " + std::to_string(from_bits(g.act, hc[size_t(first_bad)])) + " ref " +
                                      std::to_string(ref[size_t(first_bad)])
                                : std::string()));
    CHECK(bad == 0);
  };
  {
    // the dispatch: the prefill kernel at M > 64 only once src/ops/mx.cpp kPrefillDispatch is on
    CUDA_OK(cudaMemset(dc.p, 0xFF, size_t(M * N) * 2));
    const bool gated = only_prefill &&
                       fly_scaled_gemm(&a, nullptr, &b, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED &&
                       fly_test::mentions("only when forced");
    if (gated) WARN("M " << M << ": the prefill kernel is not dispatched unforced yet (kPrefillDispatch); forced below");
    else check(std::string("dispatch"), only_prefill);
  }
  const std::string act = g.act == FLY_BF16 ? "bf16" : "fp16", fmt = g.fp4 ? "e2m1" : "e4m3";
  int forced = 0;
  fly_test::for_each_variant("mx_decode", [&](const char* name, const char* params) {
    const std::string ps(params);
    if ((";" + ps + ";").find(";act=" + act + ";") == std::string::npos ||
        (";" + ps + ";").find(";fmt=" + fmt + ";") == std::string::npos)
      return;
    const bool prefill_variant = std::string(name).rfind("mx_decode_prefill_", 0) == 0;
    if (!prefill_variant && only_prefill) return;
    if (!prefill_variant) {
      const size_t mp = (";" + ps).find(";mt=");  // (not the "mt=" inside "fmt=")
      if (mp == std::string::npos || 8 * std::stoll(ps.substr(mp + 3)) < M) return;
    }
    REQUIRE(fly_force_variant(name) == FLY_SUCCESS);
    check(name, prefill_variant);
    REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
    ++forced;
  });
  CHECK(forced > 0);
}

}  // namespace

TEST_CASE("mx_decode: weight-only GEMM against the FP64 reference", "[mx_decode][mx]") {
  std::mt19937 rng(4801);
  const struct {
    int64_t M, N, K;
  } shapes[] = {
      {1, 256, 4096},  // M = 1, whole stages
      {5, 300, 96},    // M not a multiple of 8, N tail, K = 1.5 stages
      {16, 1000, 1056},
      {7, 64, 32},     // K = 32: one block
      {1, 1, 32},
      {33, 17, 224},   // M > 16: the 64-row tile
      {64, 513, 2080},
      {3, 257, 8192},  // two CTA tiles, long K: clusters split K
      {12, 4096, 1024},
      {2, 6144, 1280},   // 24 tiles of 256 rows: clusters of 5 on 132 SMs
      {1, 11264, 768},   // 44 tiles: clusters of 3
      {4, 4608, 1792},   // 18 tiles: clusters of 7
  };
  for (const fly_dtype act : {FLY_BF16, FLY_F16})
    for (const bool fp4 : {false, true})
      for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); ++s) {
        const auto& sh = shapes[s];
        Case g{act, fp4, sh.M, sh.N, sh.K, s % 2 == 0, Scales::kNarrow, sh.N > 8 ? int64_t(sh.N / 3) : -1};
        run_case(g, rng);
      }
}

TEST_CASE("mx_decode: wide scale exponents (0x00, 0xFE, 2^-107..2^107)", "[mx_decode][mx]") {
  std::mt19937 rng(4802);
  for (const bool fp4 : {false, true}) {
    run_case(Case{FLY_BF16, fp4, 9, 130, 320, true, Scales::kWide, 5}, rng);
    run_case(Case{FLY_BF16, fp4, 40, 70, 4096, false, Scales::kWide, -1}, rng);
  }
}

TEST_CASE("mx_prefill: weight-only GEMM, M > 64 (BF16), against the FP64 reference of the BF16 weights",
          "[mx_decode][mx_prefill][mx]") {
  std::mt19937 rng(4803);
  const struct {
    int64_t M, N, K;
  } shapes[] = {
      {65, 256, 4096},    // one row past the decode kernels
      {200, 300, 96},     // M, N tails, K = 1.5 stages
      {256, 1000, 1056},  // K % 64 = 32
      {129, 17, 32},      // K = 32: one block; N < 128
      {300, 513, 2080},
      {1000, 4096, 1024},  // more tiles than SMs
      {384, 130, 8192},    // long K, few tiles
  };
  for (const bool fp4 : {false, true})
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); ++s) {
      const auto& sh = shapes[s];
      Case g{FLY_BF16, fp4, sh.M, sh.N, sh.K, s % 2 == 0, Scales::kNarrow, sh.N > 8 ? int64_t(sh.N / 3) : -1};
      g.nan_code_row = sh.N > 8 ? int64_t(sh.N / 2) : -1;
      run_case(g, rng);
    }
  // every scale byte class: 0x00 (BF16 subnormal weights, rounded), 0xFE and 20..234 (two
  // multiplies above 134), 0xFF
  for (const bool fp4 : {false, true}) {
    run_case(Case{FLY_BF16, fp4, 90, 130, 320, true, Scales::kWide, 5}, rng);
    run_case(Case{FLY_BF16, fp4, 257, 300, 4096, false, Scales::kWide, -1}, rng);
  }
}

TEST_CASE("mx_decode: what the weight-only mode refuses on the device", "[mx_decode][mx]") {
  const int64_t N = 64, K = 128;
  Dev da(65 * K * 2), db(N * K), ds(N * K / 32), dc(65 * N * 2);
  // FP16 activations past M = 64: no prefill kernel (FP16 cannot hold the scaled weights)
  const fly_tensor a65 = mat(da.p, FLY_F16, 65, K, K), c65 = mat(dc.p, FLY_F16, 65, N, N);
  const fly_tensor b = mat(db.p, FLY_F8_E4M3, N, K, K), sb = mat(ds.p, FLY_E8M0, N, K / 32, K / 32);
  CHECK(fly_scaled_gemm(&a65, nullptr, &b, &sb, nullptr, &c65, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(fly_test::mentions("M <= 64"));
  // a forced variant whose activation tile is smaller than M
  const fly_tensor a17 = mat(da.p, FLY_BF16, 17, K, K), c17 = mat(dc.p, FLY_BF16, 17, N, N);
  bool tried = false;
  fly_test::for_each_variant("mx_decode", [&](const char* name, const char* params) {
    const std::string ps(params);
    if (tried || (";" + ps + ";").find(";act=bf16;") == std::string::npos ||
        (";" + ps + ";").find(";fmt=e4m3;") == std::string::npos ||
        (";" + ps + ";").find(";mt=2;") == std::string::npos)
      return;
    tried = true;
    REQUIRE(fly_force_variant(name) == FLY_SUCCESS);
    CHECK(fly_scaled_gemm(&a17, nullptr, &b, &sb, nullptr, &c17, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
    REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  });
  CHECK(tried);
  // a forced prefill variant with FP16 activations (M <= 64: the decode kernels' request)
  const fly_tensor a8 = mat(da.p, FLY_F16, 8, K, K), c8 = mat(dc.p, FLY_F16, 8, N, N);
  bool tried_prefill = false;
  fly_test::for_each_variant("mx_decode", [&](const char* name, const char*) {
    if (tried_prefill || std::string(name).rfind("mx_decode_prefill_bf16_e4m3", 0) != 0) return;
    tried_prefill = true;
    REQUIRE(fly_force_variant(name) == FLY_SUCCESS);
    CHECK(fly_scaled_gemm(&a8, nullptr, &b, &sb, nullptr, &c8, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
    REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  });
  CHECK(tried_prefill);
}
