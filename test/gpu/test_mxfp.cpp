// SPDX-License-Identifier: Apache-2.0
// MX family on the GPU: fly_mx_quantize bit for bit against the host reference (gemm/gemm_mx.h)
// over extreme exponents, subnormals, zero / NaN / Inf blocks, all source dtypes, both formats
// and scale rules, aligned and unaligned buffers; fly_scaled_gemm against an FP64 GEMM of the
// exactly dequantized operands (random codes, scales over a wide exponent range incl. 0x00 and
// 0xFE, M = 1, N and K not multiples of the tile, bias, both formats and output dtypes, output
// poisoned with NaN beforehand). Every bundled mxfp variant forced, with the queried workspace (the
// split-K variants run split: partials, then mxfp_splitk_reduce; run twice, bit-identical), and
// the split variants with none / too small a one (their unsplit fallback).
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
#include "test_tensors.hpp"
#include "variant_test_util.hpp"

namespace {

using fly_test::mat;
using fly_test::vec;
namespace mx = fly::mx;

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t n) { REQUIRE(cudaMalloc(&p, n ? n : 1) == cudaSuccess); }
  ~DevBuf() { cudaFree(p); }
  uint8_t* b() const { return static_cast<uint8_t*>(p); }
};

float round_to(fly_dtype dt, float f) {
  if (dt == FLY_F16) return __half2float(__float2half_rn(f));
  if (dt == FLY_BF16) return __bfloat162float(__float2bfloat16_rn(f));
  return f;
}
void put(std::vector<uint8_t>& h, size_t i, fly_dtype dt, float f) {
  if (dt == FLY_F32) std::memcpy(&h[i * 4], &f, 4);
  else if (dt == FLY_F16) { __half v = __float2half_rn(f); std::memcpy(&h[i * 2], &v, 2); }
  else { __nv_bfloat16 v = __float2bfloat16_rn(f); std::memcpy(&h[i * 2], &v, 2); }
}
float get(const std::vector<uint8_t>& h, size_t i, fly_dtype dt) {
  if (dt == FLY_F32) { float f; std::memcpy(&f, &h[i * 4], 4); return f; }
  if (dt == FLY_F16) { __half v; std::memcpy(&v, &h[i * 2], 2); return __half2float(v); }
  __nv_bfloat16 v; std::memcpy(&v, &h[i * 2], 2); return __bfloat162float(v);
}

// One quantizer case: M rows of K (row stride ldx), q at byte offset q_off of its allocation.
void quantize_case(fly_dtype dt, bool fp4, bool rceil, int64_t M, int64_t K, int64_t ldx, int64_t q_off) {
  const size_t es = dt == FLY_F32 ? 4 : 2;
  std::mt19937 rng(uint32_t(M * 7 + K + dt * 3 + fp4 * 11 + rceil * 13 + ldx));
  std::normal_distribution<float> nd(0.f, 1.f);
  const int emin = dt == FLY_F16 ? -24 : -149, emax = dt == FLY_F16 ? 14 : 126;
  std::uniform_int_distribution<int> ue(emin, emax);
  std::vector<uint8_t> hx(size_t(M * ldx) * es, 0);
  std::vector<float> xv(size_t(M * K));
  const int64_t kbs = K / 32;
  for (int64_t r = 0; r < M; ++r)
    for (int64_t kb = 0; kb < kbs; ++kb) {
      const int64_t blk = r * kbs + kb;
      const int e = ue(rng);
      for (int i = 0; i < 32; ++i) {
        float v = std::ldexp(nd(rng), e);
        if (blk % 17 == 3) v = 0.0f;                                 // zero block
        if (blk % 23 == 5 && i == 7) v = NAN;                        // NaN block
        if (blk % 29 == 9 && i == 30) v = -INFINITY;                 // Inf block
        if (blk % 31 == 11) v = (i % 2 ? -1.f : 1.f) * (dt == FLY_F16 ? 65504.f : 3.0e38f);  // top of the range
        if (blk % 37 == 13 && i > 0) v = 0.0f;                       // one element carries the block
        put(hx, size_t(r * ldx + kb * 32 + i), dt, v);
        xv[size_t(r * K + kb * 32 + i)] = get(hx, size_t(r * ldx + kb * 32 + i), dt);  // exactly as stored
      }
    }
  const int64_t qcols = fp4 ? K / 2 : K;
  std::vector<uint8_t> codes(size_t(M * K)), want_s(size_t(M * kbs)), want_q(size_t(M * qcols));
  for (int64_t r = 0; r < M; ++r)
    mx::quantize(&xv[size_t(r * K)], K, fp4, rceil ? mx::ScaleMode::kRceil : mx::ScaleMode::kFloor,
                 &codes[size_t(r * K)], &want_s[size_t(r * kbs)]);
  for (int64_t i = 0; i < M * qcols; ++i)
    want_q[size_t(i)] = fp4 ? mx::pack_e2m1x2(codes[size_t(2 * i)], codes[size_t(2 * i + 1)]) : codes[size_t(i)];

  DevBuf dx(hx.size()), dq(size_t(M * qcols + q_off)), ds(size_t(M * kbs));
  CUDA_OK(cudaMemcpy(dx.p, hx.data(), hx.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dq.p, 0xA5, size_t(M * qcols + q_off)));
  CUDA_OK(cudaMemset(ds.p, 0xA5, size_t(M * kbs)));
  fly_tensor x = mat(dx.p, dt, M, K, ldx);
  fly_tensor q = mat(dq.b() + q_off, fp4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3, M, qcols, qcols);
  fly_tensor s = mat(ds.p, FLY_E8M0, M, kbs, kbs);
  const int fmt = (fp4 ? FLY_MX_E2M1 : FLY_MX_E4M3) | (rceil ? FLY_MX_SCALE_RCEIL : 0);
  REQUIRE(fly_mx_quantize(&x, fmt, &q, &s, nullptr) == FLY_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> got_q(size_t(M * qcols)), got_s(size_t(M * kbs));
  CUDA_OK(cudaMemcpy(got_q.data(), dq.b() + q_off, got_q.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(got_s.data(), ds.p, got_s.size(), cudaMemcpyDeviceToHost));
  size_t bad_q = 0, bad_s = 0, nan_blocks = 0, zero_blocks = 0;
  for (size_t i = 0; i < got_q.size(); ++i) bad_q += got_q[i] != want_q[i];
  for (size_t i = 0; i < got_s.size(); ++i) {
    bad_s += got_s[i] != want_s[i];
    nan_blocks += want_s[i] == 0xFF;
    zero_blocks += want_s[i] == 0x00;
  }
  INFO("dtype " << dt << " fp4 " << fp4 << " rceil " << rceil << " M " << M << " K " << K << " ldx " << ldx);
  CHECK(bad_q == 0);
  CHECK(bad_s == 0);
  CHECK(nan_blocks > 0);
  CHECK(zero_blocks > 0);
}

// ---- scaled GEMM ------------------------------------------------------------------------
struct GemmCase {
  int64_t M, N, K;
  bool fp4;
  fly_dtype out;
  bool bias;
  int a_lo, a_hi, b_lo, b_hi;  // scale exponent ranges (row / column bases), jitter +-jit per block
  int jit;
  bool nan_scale = false;  // row 2 of A and column 5 of B get one 0xFF (NaN) block scale: NaN out there
  bool nan_elem = false;   // MXFP8: row 3 of A and column 7 of B get one E4M3 NaN element: NaN out there
};

// How a case passes the workspace: none (NULL, 0), the size fly_scaled_gemm_workspace_size
// returns (a buffer poisoned with NaN: a partial the kernel failed to write shows up in c), or
// half of it (the split variants' too-small fallback: unsplit).
enum class Ws { kNone, kQueried, kHalf };

// The split count the header documents for variant `name` (mxfp_wgmma_n<bn>_..._s<split>) on this
// shape: min(split, ceil(K / 128), min(SMs, 132) / tiles), 1 when not a split variant.
int expected_splits(const std::string& name, int64_t M, int64_t N, int64_t K) {
  const size_t us = name.find("_s", 12);
  if (name.rfind("mxfp_wgmma_n", 0) != 0 || us == std::string::npos) return 1;
  const int64_t bn = std::stoll(name.substr(12)), split = std::stoll(name.substr(us + 2));
  int sms = 132;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int64_t tiles = ((M + 127) / 128) * ((N + bn - 1) / bn);
  const int64_t S = std::min({split, (K + 127) / 128, std::min<int64_t>(sms, 132) / tiles});
  return S < 2 ? 1 : int(S);
}
const char* g_forced = nullptr;  // the forced variant's name (the every-variant case), else nullptr
int g_split_cases = 0;           // cases of the forced variant that ran with splits >= 2

// sabs_log2: the tolerance's term in the sum of |products| (2^-12: FP32 accumulation of exact
// k32 partials). The wgmma variants sum each k32 block on the FP8 tensor core, which keeps about
// 14 bits of the aligned products (docs/mxfp.md), so they are checked at 2^-10; the worst
// |err| / sum|products| measured is reported either way.
double g_worst_rel_sabs = 0;
void gemm_case(const GemmCase& g, int sabs_log2 = -12, Ws wsm = Ws::kQueried) {
  const int64_t M = g.M, N = g.N, K = g.K, kbs = K / 32;
  std::mt19937 rng(uint32_t(M * 131 + N * 7 + K + g.fp4 * 5 + g.out));
  std::uniform_int_distribution<int> ub(0, 255);
  auto code = [&]() -> uint8_t {
    if (g.fp4) return uint8_t(ub(rng) & 0xF);
    uint8_t c;
    do c = uint8_t(ub(rng)); while ((c & 0x7F) == 0x7F);  // no NaN codes
    return c;
  };
  std::vector<uint8_t> ca(size_t(M * K)), cb(size_t(N * K));
  for (auto& c : ca) c = code();
  for (auto& c : cb) c = code();
  auto scales = [&](int64_t rows, int lo, int hi) {
    std::vector<uint8_t> s(size_t(rows * kbs));
    std::uniform_int_distribution<int> base(lo, hi), jit(-g.jit, g.jit);
    for (int64_t r = 0; r < rows; ++r) {
      const int b = base(rng);
      for (int64_t kb = 0; kb < kbs; ++kb) {
        int e = b + jit(rng);
        e = e < -127 ? -127 : e > 127 ? 127 : e;
        s[size_t(r * kbs + kb)] = uint8_t(e + 127);
      }
    }
    return s;
  };
  std::vector<uint8_t> sa = scales(M, g.a_lo, g.a_hi), sb = scales(N, g.b_lo, g.b_hi);
  // the extremes: first row of A at 0xFE (2^127) or 0x00 (2^-127) when asked by the range
  if (g.a_hi >= 127) for (int64_t kb = 0; kb < kbs; ++kb) sa[size_t(kb)] = 0xFE;
  if (g.a_lo <= -127 && M > 1) for (int64_t kb = 0; kb < kbs; ++kb) sa[size_t(kbs + kb)] = 0x00;
  const int64_t nan_row = g.nan_scale && M > 2 ? 2 : -1, nan_col = g.nan_scale && N > 5 ? 5 : -1;
  const int64_t nan_erow = g.nan_elem && !g.fp4 && M > 3 ? 3 : -1, nan_ecol = g.nan_elem && !g.fp4 && N > 7 ? 7 : -1;
  if (nan_erow >= 0) ca[size_t(nan_erow * K + K / 2 + 5)] = 0x7F;  // +NaN
  if (nan_ecol >= 0) cb[size_t(nan_ecol * K + 40)] = 0xFF;          // -NaN
  if (nan_row >= 0) sa[size_t(nan_row * kbs + kbs - 1)] = 0xFF;
  if (nan_col >= 0) sb[size_t(nan_col * kbs)] = 0xFF;
  const int64_t acols = g.fp4 ? K / 2 : K;
  auto pack = [&](const std::vector<uint8_t>& c, int64_t rows) {
    std::vector<uint8_t> p(size_t(rows * acols));
    for (int64_t i = 0; i < rows * acols; ++i)
      p[size_t(i)] = g.fp4 ? mx::pack_e2m1x2(c[size_t(2 * i)], c[size_t(2 * i + 1)]) : c[size_t(i)];
    return p;
  };
  std::vector<uint8_t> pa = pack(ca, M), pb = pack(cb, N);
  std::uniform_real_distribution<float> ubias(-4.f, 4.f);
  std::vector<uint8_t> hbias(size_t(N) * 2);
  std::vector<float> fbias(size_t(N), 0.f);
  if (g.bias)
    for (int64_t n = 0; n < N; ++n) { put(hbias, size_t(n), g.out, ubias(rng)); fbias[size_t(n)] = get(hbias, size_t(n), g.out); }

  DevBuf da(pa.size()), db(pb.size()), dsa(sa.size()), dsb(sb.size()), dc(size_t(M * N) * 2), dbias(hbias.size());
  CUDA_OK(cudaMemcpy(da.p, pa.data(), pa.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db.p, pb.data(), pb.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dsa.p, sa.data(), sa.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dsb.p, sb.data(), sb.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dbias.p, hbias.data(), hbias.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dc.p, 0xFF, size_t(M * N) * 2));  // NaN in both FP16 and BF16
  const fly_dtype et = g.fp4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3;
  fly_tensor a = mat(da.p, et, M, acols, acols), b = mat(db.p, et, N, acols, acols);
  fly_tensor tsa = mat(dsa.p, FLY_E8M0, M, kbs, kbs), tsb = mat(dsb.p, FLY_E8M0, N, kbs, kbs);
  fly_tensor c = mat(dc.p, g.out, M, N, N), bias = vec(dbias.p, g.out, N);
  size_t need = 0;
  REQUIRE(fly_scaled_gemm_workspace_size(&a, &b, &c, &need) == FLY_SUCCESS);
  CHECK(need % 256 == 0);
  const int splits = g_forced ? expected_splits(g_forced, M, N, K) : 1;
  const size_t mine = size_t(splits) * size_t(M * N) * 4;  // this variant's S x M x N FP32 partials
  if (splits > 1) {
    CHECK(need >= mine);  // the query covers the forced variant's split launch
    if (wsm == Ws::kQueried) ++g_split_cases;
  }
  // kHalf: half of what this variant's launch needs (the query's size may cover a larger split
  // of another bundled variant), so it must run unsplit
  const size_t ws_bytes = wsm == Ws::kQueried ? need : wsm == Ws::kHalf ? (splits > 1 ? mine / 2 : need / 2) : 0;
  DevBuf dws(ws_bytes);
  CUDA_OK(cudaMemset(dws.p, 0xFF, ws_bytes ? ws_bytes : 1));  // NaN partials until written
  void* const ws = ws_bytes ? dws.p : nullptr;
  REQUIRE(fly_scaled_gemm(&a, &tsa, &b, &tsb, g.bias ? &bias : nullptr, &c, ws, ws_bytes, nullptr) == FLY_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> hc(size_t(M * N) * 2);
  CUDA_OK(cudaMemcpy(hc.data(), dc.p, hc.size(), cudaMemcpyDeviceToHost));
  if (ws) {
    // again into a re-poisoned c with the workspace as the first call left it: the partials are
    // summed in a fixed order, so the result is bit for bit the same
    CUDA_OK(cudaMemset(dc.p, 0xFF, size_t(M * N) * 2));
    REQUIRE(fly_scaled_gemm(&a, &tsa, &b, &tsb, g.bias ? &bias : nullptr, &c, ws, ws_bytes, nullptr) == FLY_SUCCESS);
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> hc2(hc.size());
    CUDA_OK(cudaMemcpy(hc2.data(), dc.p, hc2.size(), cudaMemcpyDeviceToHost));
    CHECK(std::memcmp(hc.data(), hc2.data(), hc.size()) == 0);
  }

  // FP64 reference of the exactly dequantized operands
  std::vector<double> da_(size_t(M * K)), db_(size_t(N * K));
  auto dec = [&](uint8_t c) { return g.fp4 ? double(mx::decode_e2m1(c)) : double(mx::decode_e4m3(c)); };
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      da_[size_t(m * K + k)] = dec(ca[size_t(m * K + k)]) * std::ldexp(1.0, int(sa[size_t(m * kbs + k / 32)]) - 127);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      db_[size_t(n * K + k)] = dec(cb[size_t(n * K + k)]) * std::ldexp(1.0, int(sb[size_t(n * kbs + k / 32)]) - 127);
  const double rel = g.out == FLY_BF16 ? 1.0 / 256 : 1.0 / 1024;
  const double abs_tol = g.out == FLY_BF16 ? std::ldexp(1.0, -126) : std::ldexp(1.0, -23);
  // Where round-to-nearest-even to the output dtype goes to inf: its largest finite value plus
  // half an ulp (FP16 65504 + 16; BF16 (2 - 2^-7) 2^127 + 2^119).
  const double lim = g.out == FLY_BF16 ? std::ldexp(1.0, 128) - std::ldexp(1.0, 119) : 65520.0;
  size_t bad = 0, nonfinite = 0, checked = 0;
  double worst = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = fbias[size_t(n)], sabs = std::fabs(ref);
      for (int64_t k = 0; k < K; ++k) {
        const double p = da_[size_t(m * K + k)] * db_[size_t(n * K + k)];
        ref += p;
        sabs += std::fabs(p);
      }
      const double got = get(hc, size_t(m * N + n), g.out);
      ++checked;
      if (m == nan_row || n == nan_col || m == nan_erow || n == nan_ecol) {  // NaN scale or element: NaN products
        if (!std::isnan(got)) ++bad;
        continue;
      }
      const double tol = rel * std::fabs(ref) + std::ldexp(sabs, sabs_log2) + abs_tol;
      const bool inf_ok = std::isinf(got) && (got > 0) == (ref > 0);
      if (std::fabs(ref) - tol >= lim) {  // the output dtype cannot hold it, whatever the summation order
        if (!inf_ok) ++bad;
        continue;
      }
      // Within the tolerance of the rounding threshold: FP32 sums in another order may land on
      // either side of it, so the same-signed inf is right as well as a finite value near ref.
      if (inf_ok && std::fabs(ref) + tol >= lim) continue;
      if (!std::isfinite(got)) { ++nonfinite; ++bad; continue; }
      const double err = std::fabs(got - ref);
      if (sabs > 0 && err / sabs > g_worst_rel_sabs) g_worst_rel_sabs = err / sabs;
      if (err > tol) ++bad;
      if (tol > 0 && err / tol > worst) worst = err / tol;
    }
  INFO("M " << M << " N " << N << " K " << K << " fp4 " << g.fp4 << " out " << g.out << " bias " << g.bias
            << " workspace " << ws_bytes << " of " << need << " bytes, splits " << (wsm == Ws::kQueried ? splits : 1)
            << " worst err/tol " << worst << " nonfinite " << nonfinite);
  CHECK(checked == size_t(M * N));
  CHECK(bad == 0);
}

}  // namespace

static void quantize_suite() {
  for (fly_dtype dt : {FLY_BF16, FLY_F16, FLY_F32})
    for (bool fp4 : {false, true})
      for (bool rceil : {false, true}) {
        quantize_case(dt, fp4, rceil, 37, 320, 320, 0);
        quantize_case(dt, fp4, rceil, 5, 96, 101, 1);  // unaligned rows and q: scalar paths
      }
  quantize_case(FLY_BF16, false, false, 4099, 1024, 1024, 0);  // a grid that walks rows
}

TEST_CASE("mx_quantize matches the reference bit for bit", "[gpu][mx][quantize]") { quantize_suite(); }

// Every bundled mx_quantize variant forced (the `_hw` ones, hardware E4M3 cvt, are in
// -DFLY_ALL_VARIANTS=ON builds only).
TEST_CASE("mx_quantize: every bundled variant is bit for bit the reference", "[gpu][mx][quantize]") {
  struct Unforce {
    ~Unforce() { fly_force_variant(nullptr); }
  } unforce;
  const int forced = fly_test::for_each_variant("mx_quantize", [](const char* name, const char*) {
    INFO("forced variant " << name);
    REQUIRE(fly_force_variant(name) == FLY_SUCCESS);
    quantize_suite();
  });
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  CHECK(forced >= 1);
}

static void gemm_suite(int sabs_log2, bool many_tiles, Ws wsm = Ws::kQueried) {
  for (bool fp4 : {false, true}) {
    // FP16 out: moderate scales; BF16 out: scales over most of E8M0's range
    gemm_case({1, 192, 512, fp4, FLY_F16, true, -12, -4, -12, -4, 2}, sabs_log2, wsm);
    gemm_case({1, 192, 512, fp4, FLY_BF16, false, -90, 70, -15, 15, 5}, sabs_log2, wsm);
    gemm_case({37, 100, 96, fp4, FLY_BF16, true, -90, 70, -15, 15, 5}, sabs_log2, wsm);
    gemm_case({37, 100, 96, fp4, FLY_F16, false, -12, -4, -12, -4, 2}, sabs_log2, wsm);
    gemm_case({130, 257, 1056, fp4, FLY_BF16, true, -60, 60, -10, 10, 4}, sabs_log2, wsm);
    gemm_case({64, 64, 32, fp4, FLY_F16, true, -9, -3, -9, -3, 1}, sabs_log2, wsm);
    gemm_case({200, 320, 4096, fp4, FLY_BF16, false, -20, 20, -20, 20, 6}, sabs_log2, wsm);
    // the extreme scales: row 0 at 2^127, row 1 at 2^-127, columns small enough that the
    // block products sa * sb stay inside FP32
    gemm_case({3, 96, 160, fp4, FLY_BF16, true, -127, 127, -127, -31, 0}, sabs_log2, wsm);
    // NaN (0xFF) block scales: the rows / columns they touch are NaN, the rest exact
    gemm_case({37, 100, 288, fp4, FLY_BF16, true, -3, 3, -3, 3, 1, true}, sabs_log2, wsm);
    // E4M3 NaN elements (MXFP8 only: E2M1 has none): their rows / columns are NaN, the rest exact
    if (!fp4) gemm_case({37, 100, 288, fp4, FLY_BF16, true, -3, 3, -3, 3, 1, false, true}, sabs_log2, wsm);
    // more tiles than SMs (the persistent loop and the ring lapping across tiles), M and N tails
    if (many_tiles) gemm_case({520, 4200, 288, fp4, FLY_F16, true, -10, -2, -10, -2, 3}, sabs_log2, wsm);
  }
}

TEST_CASE("scaled_gemm equals the FP64 GEMM of the dequantized operands", "[gpu][mx][gemm]") {
  gemm_suite(-12, false, Ws::kQueried);
  gemm_suite(-12, false, Ws::kNone);
}

// Every bundled variant of the mxfp family forced (the wgmma variants are not in the defaults or
// the DB: built with -DFLY_ALL_VARIANTS=ON, e.g. by kernels/mx/dev/device_wgmma.sh).
TEST_CASE("scaled_gemm: every bundled mxfp variant is right", "[gpu][mx][gemm]") {
  struct Unforce {
    ~Unforce() { fly_force_variant(nullptr); }
  } unforce;
  const int forced = fly_test::for_each_variant("mxfp", [](const char* name, const char*) {
    const bool wgmma = std::string(name).rfind("mxfp_wgmma", 0) == 0;
    const bool split = expected_splits(name, 1, 192, 512) > 1;  // a split-K variant
    INFO("forced variant " << name);
    REQUIRE(fly_force_variant(name) == FLY_SUCCESS);
    g_worst_rel_sabs = 0;
    g_forced = name;
    g_split_cases = 0;
    gemm_suite(wgmma ? -10 : -12, true, Ws::kQueried);
    if (split) {
      CHECK(g_split_cases >= 10);  // the suite's cases with K > 128 and few tiles ran split
      // the fallback: unsplit with no workspace or half the queried one (two cases each)
      for (Ws w : {Ws::kNone, Ws::kHalf}) {
        gemm_case({130, 257, 1056, false, FLY_BF16, true, -60, 60, -10, 10, 4}, -10, w);
        gemm_case({37, 100, 288, true, FLY_F16, true, -3, 3, -3, 3, 1, true}, -10, w);
      }
    }
    g_forced = nullptr;
    WARN("variant " << name << ": worst |err| / sum|products| = " << g_worst_rel_sabs << " (2^"
                    << (g_worst_rel_sabs > 0 ? std::log2(g_worst_rel_sabs) : -999.0) << ")"
                    << (split ? ", split-K cases " + std::to_string(g_split_cases) : std::string()));
  });
  g_forced = nullptr;
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  CHECK(forced >= 1);
}
