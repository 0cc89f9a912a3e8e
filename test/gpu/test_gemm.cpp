// SPDX-License-Identifier: Apache-2.0
// fly_gemm on the GPU against a CPU reference: all four layouts (A, B each row- or column-major),
// ragged and tiny sizes, padded leading dimensions, bias, BF16 and FP16, split-K / swap-AB
// shapes, the decode kernel, and every bundled gemm variant forced at least once. C is poisoned with 0xFF bytes
// (NaN) first, so any element the kernel fails to write fails the check, and the padding
// between rows must stay untouched.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "gemm_test_util.hpp"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;

// Exact encodings of small dyadic values (k/8, |k| <= 32) in both 16-bit formats, and decoding.
using gemm_test::dec;
using gemm_test::Dev;
using gemm_test::enc;
using gemm_test::round8;

struct Case {
  int64_t M, N, K;
  bool a_row, b_row;  // layout: A row-major (n) / column-major (t); B likewise
  int64_t pad;        // extra elements on every leading dimension (A, B and C)
  bool bias;
  fly_dtype dt;
  // Odd strides ([gemm][odd]): nonzero leading dimensions replace the rounded ones above, and
  // each base is moved this many elements into its buffer (1: only 2-byte aligned).
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t a_off = 0, b_off = 0, c_off = 0;
  // No workspace (NULL, 0): odd strides then take the cp.async kernel instead of the packed path.
  bool no_ws = false;
};

std::string describe(const Case& c) {
  return std::string(c.dt == FLY_BF16 ? "bf16 " : "fp16 ") + (c.a_row ? "n" : "t") + (c.b_row ? "n" : "t") +
         " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
         " pad=" + std::to_string(c.pad) + (c.bias ? " bias" : "") +
         (c.lda || c.ldb || c.ldc ? " ld=" + std::to_string(c.lda) + "/" + std::to_string(c.ldb) + "/" + std::to_string(c.ldc) : "") +
         (c.a_off || c.b_off || c.c_off
              ? " off=" + std::to_string(c.a_off) + "/" + std::to_string(c.b_off) + "/" + std::to_string(c.c_off)
              : "");
}

// Runs one case through fly_gemm and checks every element (and that padding is untouched).
// Returns fly_gemm's status; checks values only on success.
// With `repeat`, runs it a second time into a freshly poisoned C and checks the two results are
// bitwise equal (stream-K's fixed reduction order) and that the call left the workspace's first
// `zero_words` 32-bit words (stream-K's flags) zero.
fly_status run_case(const Case& cs, uint64_t seed = 1, bool repeat = false, int zero_words = 0) {
  INFO(describe(cs));
  const int64_t M = cs.M, N = cs.N, K = cs.K;
  const fly_dtype dt = cs.dt;
  // Leading dimensions: the contiguous extent rounded to 8 elements (TMA's 16-byte rule) + pad.
  const int64_t lda = cs.lda ? cs.lda : round8(cs.a_row ? K : M) + cs.pad;
  const int64_t ldb = cs.ldb ? cs.ldb : round8(cs.b_row ? N : K) + cs.pad;
  const int64_t ldc = cs.ldc ? cs.ldc : N + cs.pad;
  const int64_t ao = cs.a_off, bo = cs.b_off, co = cs.c_off;  // element offsets of the bases
  const int64_t a_lines = cs.a_row ? M : K, b_lines = cs.b_row ? K : N;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-4, 4);
  std::vector<float> A(static_cast<size_t>(M * K)), B(static_cast<size_t>(K * N)), bias(static_cast<size_t>(N));
  for (auto& v : A) v = d(rng) / 8.f;
  for (auto& v : B) v = d(rng) / 8.f;
  for (auto& v : bias) v = d(rng) / 4.f;
  std::vector<uint16_t> ha(static_cast<size_t>(lda * a_lines), 0), hb(static_cast<size_t>(ldb * b_lines), 0),
      hbias(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) ha[size_t(cs.a_row ? m * lda + k : k * lda + m)] = enc(A[size_t(m * K + k)], dt);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) hb[size_t(cs.b_row ? k * ldb + n : n * ldb + k)] = enc(B[size_t(k * N + n)], dt);
  for (int64_t n = 0; n < N; ++n) hbias[size_t(n)] = enc(bias[size_t(n)], dt);
  Dev da((ha.size() + size_t(ao)) * 2), db((hb.size() + size_t(bo)) * 2), dc(size_t(M * ldc + co) * 2),
      dbias(size_t(N) * 2);
  uint16_t* pa = static_cast<uint16_t*>(da.p) + ao;
  uint16_t* pb = static_cast<uint16_t*>(db.p) + bo;
  uint16_t* pc = static_cast<uint16_t*>(dc.p) + co;
  REQUIRE(cudaMemcpy(pa, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(pb, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(dbias.p, hbias.data(), hbias.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemset(dc.p, 0xFF, size_t(M * ldc + co) * 2) == cudaSuccess);
  fly_tensor ta = cs.a_row ? mat(pa, dt, M, K, lda, 1) : mat(pa, dt, M, K, 1, lda);
  fly_tensor tb = cs.b_row ? mat(pb, dt, K, N, ldb, 1) : mat(pb, dt, K, N, 1, ldb);
  fly_tensor tc = mat(pc, dt, M, N, ldc, 1);
  fly_tensor tbias;
  std::memset(&tbias, 0, sizeof tbias);
  tbias.data = dbias.p;
  tbias.dtype = dt;
  tbias.rank = 1;
  tbias.sizes[0] = N;
  tbias.strides[0] = 1;
  size_t ws = 1;
  REQUIRE(fly_gemm_workspace_size(&ta, &tb, &tc, &ws) == FLY_SUCCESS);
  Dev dws(ws);
  // The documented contract: zero-filled before first use (each call leaves it so).
  REQUIRE(cudaMemset(dws.p, 0, ws ? ws : 16) == cudaSuccess);
  const fly_status st =
      fly_gemm(&ta, &tb, &tc, cs.bias ? &tbias : nullptr, cs.no_ws ? nullptr : dws.p, cs.no_ws ? 0 : ws, nullptr);
  INFO(fly_get_last_error());
  if (st != FLY_SUCCESS) return st;
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  if (zero_words > 0) {
    REQUIRE(ws >= size_t(zero_words) * 4);
    std::vector<uint32_t> flags(static_cast<size_t>(zero_words));
    REQUIRE(cudaMemcpy(flags.data(), dws.p, flags.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    int64_t raised = 0;
    for (uint32_t f : flags) raised += f != 0;
    CHECK(raised == 0);
  }
  INFO("variant " << fly_last_variant() << " (" << fly_last_decision() << ")");
  std::vector<uint16_t> hc(static_cast<size_t>(M * ldc));
  REQUIRE(cudaMemcpy(hc.data(), pc, hc.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  if (co > 0) {  // the elements before an offset C stay poisoned too
    std::vector<uint16_t> pre(static_cast<size_t>(co));
    REQUIRE(cudaMemcpy(pre.data(), dc.p, pre.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::all_of(pre.begin(), pre.end(), [](uint16_t h) { return h == 0xFFFF; }));
  }
  const double rel = dt == FLY_BF16 ? 1.0 / 128 : 1.0 / 1024;
  int64_t bad = 0, first_m = -1, first_n = -1;
  double first_got = 0, first_want = 0;
  std::vector<double> row(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) row[size_t(n)] = cs.bias ? bias[size_t(n)] : 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const double av = A[size_t(m * K + k)];
      if (av == 0) continue;
      const float* brow = &B[size_t(k * N)];
      for (int64_t n = 0; n < N; ++n) row[size_t(n)] += av * brow[n];
    }
    for (int64_t n = 0; n < ldc; ++n) {
      const uint16_t h = hc[size_t(m * ldc + n)];
      bool ok;
      double got = dec(h, dt), want = 0;
      if (n < N) {
        want = row[size_t(n)];
        ok = std::fabs(got - want) <= rel * std::fabs(want) + 1e-6;
      } else {
        ok = h == 0xFFFF;  // padding stays poisoned
      }
      if (!ok && bad++ == 0) { first_m = m; first_n = n; first_got = got; first_want = want; }
    }
  }
  INFO("first mismatch at (" << first_m << ", " << first_n << "): got " << first_got << ", want " << first_want);
  CHECK(bad == 0);
  if (repeat) {
    REQUIRE(cudaMemset(dc.p, 0xFF, size_t(M * ldc + co) * 2) == cudaSuccess);
    REQUIRE(fly_gemm(&ta, &tb, &tc, cs.bias ? &tbias : nullptr, dws.p, ws, nullptr) == FLY_SUCCESS);
    std::vector<uint16_t> hc2(hc.size());
    REQUIRE(cudaMemcpy(hc2.data(), pc, hc2.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::memcmp(hc.data(), hc2.data(), hc.size() * 2) == 0);
  }
  return st;
}

const bool kRow = true, kCol = false;

// Integer parameter `key` of a variant's "k=v;k=v" parameter string (-1 when absent).
int64_t param_of(const std::string& params, const std::string& key) {
  size_t at = 0;
  while (at < params.size()) {
    size_t end = params.find(';', at);
    if (end == std::string::npos) end = params.size();
    if (params.compare(at, key.size() + 1, key + "=") == 0) return std::stoll(params.substr(at + key.size() + 1, end - at - key.size() - 1));
    at = end + 1;
  }
  return -1;
}

// Which MN-major operands a TMA-tile variant takes, from its parameters: the test's own statement
// of gemm_plan.h layout_fits. MN-major tiles come in 64-wide chunks, so the Q columns of each
// consumer warpgroup (bn, or bn / 2 on narrow tiles unless kw = 2) and the rows each multicast CTA
// loads (one k block per stage) must be whole chunks.
struct MnFits {
  bool p, q;  // an MN-major P operand (A, or B^T with swap) / Q operand
};
MnFits mn_fits(const std::string& ps) {
  const int64_t bm = param_of(ps, "bm") > 0 ? param_of(ps, "bm") : 128, bn = param_of(ps, "bn");
  const int64_t mc = std::max<int64_t>(1, param_of(ps, "mc")), mp = std::max<int64_t>(1, param_of(ps, "mp"));
  const int64_t kb = std::max<int64_t>(1, param_of(ps, "kb"));
  const int64_t kw = std::max<int64_t>(1, param_of(ps, "kw"));
  // per wgmma (bn = 320: two n160; narrow tiles split bn over the warpgroups unless kw = 2)
  const int64_t q_cols = (bm == 128 && bn <= 256) || (bm == 64 && kw == 2) ? bn : bn / 2;
  return {mp == 1 || kb > 1 || (bm / mp) % 64 == 0, q_cols % 64 == 0 && (mc == 1 || kb > 1 || (bn / mc) % 64 == 0)};
}
}  // namespace

TEST_CASE("gemm matches the reference in all four layouts", "[gemm][gpu]") {
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  for (fly_dtype dt : {FLY_BF16, FLY_F16})
    for (bool ar : {kRow, kCol})
      for (bool br : {kRow, kCol}) {
        CHECK(run_case({256, 512, 320, ar, br, 0, false, dt}) == FLY_SUCCESS);
        CHECK(run_case({1000, 129, 200, ar, br, 8, true, dt}) == FLY_SUCCESS);
      }
}

TEST_CASE("gemm handles edge sizes, padding and bias", "[gemm][gpu]") {
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  const int64_t sizes[] = {1, 7, 17, 129, 1000};
  for (bool ar : {kRow, kCol})
    for (bool br : {kRow, kCol})
      for (int64_t m : sizes)
        for (int64_t n : {int64_t(1), int64_t(17), int64_t(129), int64_t(1000)}) {
          int64_t k = (m * 7 + n) % 3 == 0 ? 7 : (m + n) % 2 ? 129 : 1000;
          if (m * n * k > 200000000) k = 129;  // keep the CPU reference quick
          CHECK(run_case({m, n, k, ar, br, (m + n) % 2 ? 8 : 0, (m + n) % 3 != 0, FLY_BF16}) == FLY_SUCCESS);
        }
}

TEST_CASE("gemm small-M (split-K / swap-AB) and K tails", "[gemm][gpu]") {
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  for (int64_t m : {1, 16, 64, 100, 128})
    CHECK(run_case({m, 1024, 2048, kRow, kCol, 0, true, FLY_BF16}) == FLY_SUCCESS);
  CHECK(run_case({64, 4096, 1000, kCol, kRow, 0, true, FLY_F16}) == FLY_SUCCESS);
  CHECK(run_case({300, 600, 1, kRow, kRow, 0, false, FLY_BF16}) == FLY_SUCCESS);
  CHECK(run_case({33, 70, 65, kCol, kCol, 8, true, FLY_BF16}) == FLY_SUCCESS);
}

TEST_CASE("gemm: every bundled variant is right", "[gemm][gpu]") {
  // FLY_TEST_GEMM_ONLY=SUBSTRING: only the variants whose name contains it (the sanitizer runs of
  // PROBE=gemm_core_ab of tools/device_python.sh take the decode variants this way); unset: all.
  const char* only = std::getenv("FLY_TEST_GEMM_ONLY");
  int forced = 0;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const char* name = fly_variant_name(i);
    const char *family = nullptr, *params = nullptr;
    REQUIRE(fly_variant_info(name, &family, &params) == FLY_SUCCESS);
    if (std::string(family) != "gemm") continue;
    if (only && *only && std::string(name).find(only) == std::string::npos) continue;
    const fly_dtype dt = std::string(params).find("dtype=fp16") != std::string::npos ? FLY_F16 : FLY_BF16;
    INFO("forced variant " << name);
    REQUIRE(fly_force_variant(name) == FLY_SUCCESS);
    const std::string ps(params);
    if (ps.find("rpw=") != std::string::npos) {
      // Decode kernel: NT only, M <= 8 mt, K % 8 == 0. A full and a ragged M, a K tail inside the
      // last 64-wide block, N not a multiple of the CTA's rows, bias, padded leading dimensions,
      // a K long enough for the ring to lap many times; then what it must refuse (another layout,
      // M past its tile, K % 8 != 0). A forced cluster needs at least that many k blocks.
      const int64_t mmax = 8 * param_of(ps, "mt"), cl = param_of(ps, "cl");
      CHECK(run_case({mmax, 1000, 712, kRow, kCol, 8, true, dt}, 7) == FLY_SUCCESS);
      CHECK(run_case({3, 300, 2048, kRow, kCol, 0, false, dt}, 8) == FLY_SUCCESS);
      CHECK(run_case({1, 129, 8, kRow, kCol, 0, true, dt}, 9) == (cl <= 1 ? FLY_SUCCESS : FLY_ERROR_UNSUPPORTED));
      CHECK(run_case({mmax, 520, 512, kCol, kRow, 0, false, dt}, 10) == FLY_ERROR_UNSUPPORTED);
      CHECK(run_case({mmax + 1, 520, 512, kRow, kCol, 0, false, dt}, 11) == FLY_ERROR_UNSUPPORTED);
      CHECK(run_case({mmax, 520, 700, kRow, kCol, 0, false, dt}, 12) == FLY_ERROR_UNSUPPORTED);
      CHECK(run_case({mmax, 256, 8192, kRow, kCol, 0, true, dt}, 13) == FLY_SUCCESS);
    } else if (ps.find("bm=64") != std::string::npos) {
      // Narrow tiles: K-major Q always; an MN-major Q only with whole 64-wide chunks per warpgroup
      // (bn = 128) and per multicast CTA (mc = 2); with P multicast (mp = 2) the P operand must be
      // K-major as well, unless kb = 2 (each CTA then brings a whole k block of P). K = 700 ends on
      // a partial k block and, at kb = 2 or 4, one wholly past K (with mp = 2: the peer's box).
      const MnFits f = mn_fits(ps);
      const bool mn_ok = f.p && f.q;
      CHECK(run_case({200, 300, 256, kRow, kCol, 0, true, dt}, 7) == FLY_SUCCESS);
      CHECK(run_case({64, 1000, 700, kRow, kCol, 8, false, dt}, 10) == FLY_SUCCESS);  // decode-like, ragged
      CHECK(run_case({40, 520, 512, kCol, kRow, 8, false, dt}, 8) == (mn_ok ? FLY_SUCCESS : FLY_ERROR_UNSUPPORTED));
      if (param_of(ps, "kw") == 2) {
        // k split over the warpgroups: several tiles per CTA (N / 128 and N / 64 > 132) whose
        // k-step counts are odd (5 k blocks at kb = 1, 3 steps at kb = 2), so the warpgroups'
        // turns carry over from tile to tile; a single k step (the second warpgroup adds nothing);
        // an MN-major A.
        CHECK(run_case({16, 17000, 300, kRow, kCol, 0, true, dt}, 14) == FLY_SUCCESS);
        CHECK(run_case({50, 3000, 64, kRow, kCol, 8, false, dt}, 15) == FLY_SUCCESS);
        const bool a_ok = param_of(ps, "swap") == 1 ? f.q : f.p;  // A is Q with swap-AB
        CHECK(run_case({64, 600, 300, kCol, kCol, 0, true, dt}, 16) == (a_ok ? FLY_SUCCESS : FLY_ERROR_UNSUPPORTED));
      }
      if (!mn_ok) {  // the refused call named no variant: run one it takes so the check below holds
        CHECK(run_case({17, 129, 1000, kRow, kCol, 0, true, dt}, 11) == FLY_SUCCESS);
      }
    } else if (ps.find("pp=1") != std::string::npos) {
      // Ping-pong consumers: enough tiles that every CTA runs two or more, so the warpgroups take
      // turns and skip each other's stages (2-4 k blocks each, fewer than the ring's stages),
      // ragged edges and a K tail; then an MN-major pair.
      CHECK(run_case({200, 300, 256, kRow, kCol, 0, true, dt}, 7) == FLY_SUCCESS);
      CHECK(run_case({1100, 2900, 200, kRow, kCol, 8, true, dt}, 12) == FLY_SUCCESS);
      CHECK(run_case({1000, 1100, 100, kCol, kRow, 0, false, dt}, 13) == FLY_SUCCESS);
    } else if (param_of(ps, "split") == 1) {
      // Stream-K: ranges inside one tile (8 tiles over 132 CTAs), 1-2 steps per CTA with ragged
      // edges, bias and an MN-major pair; a shape with nothing to cut is refused (whole waves).
      CHECK(run_case({256, 1000, 4096, kRow, kCol, 0, true, dt}, 7, true) == FLY_SUCCESS);
      const MnFits f = mn_fits(ps);  // bn = 96 / 112 take no MN-major Q
      CHECK(run_case({1000, 1100, 300, kCol, kRow, 8, true, dt}, 8, true) ==
            (f.p && f.q ? FLY_SUCCESS : FLY_ERROR_UNSUPPORTED));
      CHECK(run_case({128, 128, 64, kRow, kCol, 0, false, dt}, 9) == FLY_ERROR_UNSUPPORTED);
      CHECK(run_case({200, 300, 256, kRow, kCol, 0, true, dt}, 10) == FLY_SUCCESS);
    } else if (param_of(ps, "split") > 1) {
      // Forced split-K (launch axis): shapes with few tiles and a K of at least 16 k blocks, which
      // every split factor up to 8 accepts; a big shape is refused (other variants serve it).
      CHECK(run_case({40, 520, 2048, kRow, kCol, 0, true, dt}, 7) == FLY_SUCCESS);
      const MnFits f = mn_fits(ps);  // bn = 96 / 112 take no MN-major Q
      CHECK(run_case({100, 300, 2100, kCol, kRow, 8, false, dt}, 8) ==
            (f.p && f.q ? FLY_SUCCESS : FLY_ERROR_UNSUPPORTED));  // 17+ k steps at kb = 2
      CHECK(run_case({4096, 4096, 256, kRow, kCol, 0, false, dt}, 9) == FLY_ERROR_UNSUPPORTED);
    } else {
      // 128-row tiles, also with P multicast (mp = 2) and bn = 96 / 112 / 320; those bn need a
      // K-major Q, so they refuse the MN-major cases (and then run one they take).
      const MnFits f = mn_fits(ps);
      const bool swap = param_of(ps, "swap") == 1;
      CHECK(run_case({200, 300, 256, kRow, kCol, 0, true, dt}, 7) == FLY_SUCCESS);
      CHECK(run_case({40, 520, 512, kCol, kRow, 8, false, dt}, 8) ==
            (f.p && f.q ? FLY_SUCCESS : FLY_ERROR_UNSUPPORTED));
      // A K tail: with kb = 2 the last k step holds a partial k block and one wholly past K. B is
      // MN-major: the Q operand without swap, P with it.
      const bool nn_ok = swap ? f.p : f.q;
      CHECK(run_case({130, 200, 300, kRow, kRow, 0, false, dt}, 14) == (nn_ok ? FLY_SUCCESS : FLY_ERROR_UNSUPPORTED));
      if (!nn_ok) {
        CHECK(run_case({130, 200, 300, kRow, kCol, 8, true, dt}, 15) == FLY_SUCCESS);
      }
      if (param_of(ps, "epi") >= 2) {
        // TMA-store epilogues: several tiles per CTA (e2: the two staging boxes in turn across tiles),
        // ragged M and a last pass of 16 columns; then a C whose rows TMA cannot address (ldc = 129
        // elements: 258 bytes), stored from the registers instead.
        CHECK(run_case({1000, 1104, 300, kRow, kCol, 0, true, dt}, 18) == FLY_SUCCESS);
        CHECK(run_case({300, 129, 200, kRow, kCol, 0, true, dt}, 19) == FLY_SUCCESS);
        CHECK(run_case({1000, 1104, 300, kRow, kCol, 0, false, dt}, 20) == FLY_SUCCESS);
      }
      if (param_of(ps, "bn") > 256) {  // 320-wide tiles: several per CTA, ragged in both directions
        CHECK(run_case({1000, 1100, 300, kRow, kCol, 8, true, dt}, 16) == FLY_SUCCESS);
        CHECK(run_case({1000, 1100, 300, kCol, kCol, 0, false, dt}, 17) == FLY_SUCCESS);
      }
    }
    CHECK(std::string(fly_last_variant()) == name);
    ++forced;
  }
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  CHECK(forced >= (only && *only ? 1 : 6));
}

TEST_CASE("gemm stream-K: right, deterministic, and leaves its flags zero", "[gemm][gpu]") {
  int sms = 0;
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  for (const char* name : {"gemm_bf16_bn256_st4_sw0_mc1_sk1", "gemm_bf16_bn128_st6_sw0_mc1_sk1",
                           "gemm_fp16_bn256_st4_sw0_mc1_sk1"}) {
    INFO("forced variant " << name);
    REQUIRE(fly_force_variant(name) == FLY_SUCCESS);
    const fly_dtype dt = std::string(name).find("fp16") != std::string::npos ? FLY_F16 : FLY_BF16;
    // Every shape has >= sms k steps, so the grid is the SM count and its flags are 2 x sms words.
    // 256 x 1024 x 4096: 8 (or 16) tiles, each cut over 8-17 CTAs (middle parts).
    CHECK(run_case({256, 1024, 4096, kRow, kCol, 0, true, dt}, 21, true, 2 * sms) == FLY_SUCCESS);
    // 2048 x 2304 x 512: 144 (288) tiles between one and two waves: all stream-K, 8 steps each.
    CHECK(run_case({2048, 2304, 512, kRow, kCol, 0, false, dt}, 22, true, 2 * sms) == FLY_SUCCESS);
    // 2176 x 4096 x 128: 272 (544) tiles: whole waves first, then 140 (148) tiles of 2 steps cut
    // over the grid; TN, padded, bias.
    CHECK(run_case({2176, 4096, 128, kCol, kCol, 8, true, dt}, 23, true, 2 * sms) == FLY_SUCCESS);
    CHECK(std::string(fly_last_variant()) == name);
  }
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
}

// The launcher's raster (raster_group, gemm_plan.h) walks 2944 x 4096 at 128 x 256 tiles (23 x 16
// tiles, 132 in flight) in strips of 16 tile rows: a whole strip, then a ragged one of 7 rows (of
// 4 super rows with Q multicast). K = 16: one k block, zero-filled past K.
TEST_CASE("gemm: raster strips taller than 8, the last one ragged", "[gemm][gpu]") {
  for (const char* name : {"gemm_bf16_bn256_st4_sw0_mc1", "gemm_bf16_bn256_st4_sw0_mc2_e2"}) {
    INFO("forced variant " << name);
    REQUIRE(fly_force_variant(name) == FLY_SUCCESS);
    CHECK(run_case({2944, 4096, 16, kRow, kCol, 0, true, FLY_BF16}, 31) == FLY_SUCCESS);
    CHECK(run_case({2944, 4096, 16, kCol, kRow, 8, false, FLY_BF16}, 32) == FLY_SUCCESS);
    CHECK(std::string(fly_last_variant()) == name);
  }
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
}

// ---- strides TMA cannot take: the packed path and the cp.async kernel (gemm_odd_sm90.cu) ----------
// Leading dimensions of extent + 1 / + 3 elements (lines 2- or 4-byte aligned, or 8 where the
// extent + 1 is a multiple of 4), bases moved 1-3 elements (2-byte aligned), an odd ldc and C base,
// all four layouts, both dtypes, bias. Each case runs twice: with the queried workspace the
// default dispatch must take the packed path (aligned copies, then the TMA kernel), without one
// the cp.async kernel.
namespace {
Case odd_case(int64_t M, int64_t N, int64_t K, bool ar, bool br, int64_t extra, int64_t off, bool bias, fly_dtype dt) {
  Case c{M, N, K, ar, br, 0, bias, dt};
  c.lda = (ar ? K : M) + extra;
  c.ldb = (br ? N : K) + extra;
  c.ldc = N + extra;
  c.a_off = off;
  c.b_off = off ? off + 1 : 0;
  c.c_off = off;
  return c;
}
bool picked_odd() { return std::string(fly_last_variant()).rfind("gemm_odd_", 0) == 0; }
bool picked_packed() { return std::string(fly_last_decision()).find(":packed") != std::string::npos; }
// Both odd-stride paths on one case: the packed path (queried workspace), then the cp.async kernel.
void run_odd_both(Case c, uint64_t seed) {
  c.no_ws = false;
  CHECK(run_case(c, seed) == FLY_SUCCESS);
  CHECK(picked_packed());
  CHECK_FALSE(picked_odd());
  c.no_ws = true;
  CHECK(run_case(c, seed) == FLY_SUCCESS);
  CHECK(picked_odd());
}
}  // namespace

TEST_CASE("gemm odd strides: all four layouts, both dtypes, bias, unaligned bases", "[gemm][odd]") {
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  for (fly_dtype dt : {FLY_BF16, FLY_F16})
    for (bool ar : {kRow, kCol})
      for (bool br : {kRow, kCol}) {
        // 77 x 515 x 1003: ld = extent + 1 (78, 516, 1004: 4- and 8-byte lines), bias
        run_odd_both(odd_case(77, 515, 1003, ar, br, 1, 0, true, dt), 41);
        // extent + 3 (80 is TMA-legal for a TN A of M = 77, so B decides: 518 / 1006), no bias, bases
        // 1-2 elements in (2-byte aligned)
        run_odd_both(odd_case(77, 515, 1003, ar, br, 3, 1, false, dt), 42);
      }
}

TEST_CASE("gemm odd strides: 2-byte lines, several tiles per CTA, K tails", "[gemm][odd]") {
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  for (bool ar : {kRow, kCol})
    for (bool br : {kRow, kCol}) {
      // ld = extent exactly, odd: every other line starts 2 bytes off a 4-byte boundary
      Case c{333, 141, 201, ar, br, 0, true, FLY_BF16};
      c.lda = ar ? 201 : 333;
      c.ldb = br ? 141 : 201;
      c.ldc = 141;
      run_odd_both(c, 43);
    }
  // More tiles than SMs (persistent CTAs take several, the ring laps across tiles), K = 1 and
  // K = 65 (a k block of one element), M = 1; lines of 1..7 elements (the copy's element path
  // only) and a 4-element pad.
  run_odd_both(odd_case(1500, 1700, 130, kCol, kRow, 1, 0, true, FLY_F16), 44);
  run_odd_both(odd_case(1500, 1700, 130, kRow, kCol, 3, 3, false, FLY_BF16), 45);
  run_odd_both(odd_case(100, 200, 1, kCol, kCol, 1, 1, true, FLY_BF16), 46);
  run_odd_both(odd_case(129, 257, 65, kRow, kRow, 1, 1, true, FLY_F16), 47);
  run_odd_both(odd_case(1, 300, 777, kRow, kCol, 1, 1, true, FLY_BF16), 48);
  run_odd_both(odd_case(5, 3, 7, kCol, kRow, 1, 1, true, FLY_BF16), 52);
  run_odd_both(odd_case(640, 520, 1000, kRow, kRow, 4, 2, false, FLY_F16), 53);
}

TEST_CASE("gemm odd strides: aligned calls keep the TMA kernel; a forced cp.async variant runs them", "[gemm][odd]") {
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  CHECK(run_case({256, 512, 320, kCol, kRow, 0, true, FLY_BF16}, 49) == FLY_SUCCESS);
  CHECK_FALSE(picked_odd());
  for (const char* name : {"gemm_odd_bf16_bn128_st6", "gemm_odd_fp16_bn128_st6"}) {
    INFO("forced variant " << name);
    const fly_dtype dt = std::string(name).find("fp16") != std::string::npos ? FLY_F16 : FLY_BF16;
    REQUIRE(fly_force_variant(name) == FLY_SUCCESS);
    CHECK(run_case({256, 512, 320, kCol, kRow, 0, true, dt}, 50) == FLY_SUCCESS);  // 16-byte copies
    CHECK(run_case({1000, 129, 200, kRow, kCol, 8, true, dt}, 51) == FLY_SUCCESS);
    CHECK(std::string(fly_last_variant()) == name);
  }
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
}
