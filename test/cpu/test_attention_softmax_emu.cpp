// SPDX-License-Identifier: Apache-2.0
// Host emulation of the attention kernels' softmax arithmetic on large finite inputs (issue 46):
// the forward's online softmax over key tiles (running max, rescale factors, probabilities rounded
// to the 16-bit type for P V, the BF16 probability bias, the epilogue's clamp and LSE), the
// split-key merge, and the backward's probability recomputation (the preprocessing's exact row
// statistics for |LSE| >= kBwdExactLse), each through the functions the kernels call
// (kernels/attention/attention_math.h), against float64. The kernels' earlier forms are emulated
// next to them to pin down what failed: PyTorch's upstream case (q = k = v = 133120 in BF16, D 64)
// gave NaN, FP16 inputs of 61440 gave O = 0 and LSE = -inf.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attention/attention_math.h"
#include "catch_compat.hpp"

namespace {

using namespace fly::attn;

// Round to a binary format with p significand bits (implicit bit included), smallest normal
// exponent emin, largest finite maxv; ties to even; past the rounding threshold: inf.
double round_fmt(double x, int p, int emin, double maxv) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int lead = std::max(e - 1, emin);
  const double q = std::ldexp(1.0, lead - (p - 1));
  const double r = std::nearbyint(x / q) * q;
  return std::fabs(r) > maxv ? std::copysign(INFINITY, x) : r;
}
float to16(double x, bool bf16) {
  return float(bf16 ? round_fmt(x, 8, -126, kBf16Max) : round_fmt(x, 11, -14, kFp16Max));
}

// One query row against n keys: scores as the FP32 tensor-core product gives them for these inputs
// (every product and partial sum exact: all orders agree), V as 16-bit values.
struct Row {
  std::vector<float> s;               // [n]
  std::vector<std::vector<float>> v;  // [n][D]
  int D = 0;
};

struct Out {
  std::vector<float> o;  // rounded to the 16-bit type
  float lse = 0, m = -INFINITY, t = 0;
  bool finite = true;
};

// The forward's consumer on one row (attention_tiles.cuh OnlineSoftmax, store_output), tiles of bn
// keys; P rounded to the 16-bit type before P V (pack_p), O accumulated in FP32.
Out forward_new(const Row& r, int bn, float scale, bool bf16, int64_t sk_for_bias) {
  const float c = float(double(scale) * 1.4426950408889634);
  const float bias = prob_bias(sk_for_bias, bf16);
  float m = -INFINITY, l = 0.f;
  std::vector<float> o(size_t(r.D), 0.f);
  const int n = int(r.s.size());
  for (int n0 = 0; n0 < n; n0 += bn) {
    const int n1 = std::min(n, n0 + bn);
    float mx = m;
    for (int j = n0; j < n1; ++j) mx = std::max(mx, r.s[size_t(j)]);
    const float ref = row_ref(mx);
    const float alpha = attn_exp2(rescale_arg(m, ref, c));
    m = mx;
    float sum = 0.f;
    for (float& x : o) x *= alpha;
    for (int j = n0; j < n1; ++j) {
      const float pj = attn_exp2(prob_arg(r.s[size_t(j)], ref, c, bias));
      sum += pj;
      const float p16 = to16(pj, bf16);
      for (int d = 0; d < r.D; ++d) o[size_t(d)] += p16 * r.v[size_t(j)][size_t(d)];
    }
    l = l * alpha + sum;
  }
  Out out;
  const bool empty = !(l > 0.f);
  const float inv = empty ? 0.f : 1.f / l;
  out.m = m;
  out.t = empty ? 0.f : l;
  out.lse = row_lse(m, out.t, scale, bias);
  for (float x : o) {
    const float y = to16(clamp_out(x * inv, bf16 ? kBf16Max : kFp16Max), bf16);
    out.finite = out.finite && std::isfinite(y);
    out.o.push_back(y);
  }
  return out;
}

// The kernels' earlier form: exp2(fma(s, c, -fl(m c))) and alpha = exp2(fma(m_old, c, -fl(m c)))
// (the compiler contracts m_old * c - m_scaled), LSE = (m c + log2 l) ln 2, no bias, no clamp.
Out forward_old(const Row& r, int bn, float scale, bool bf16) {
  const float c = float(double(scale) * 1.4426950408889634);
  float m = -INFINITY, l = 0.f;
  std::vector<float> o(size_t(r.D), 0.f);
  const int n = int(r.s.size());
  for (int n0 = 0; n0 < n; n0 += bn) {
    const int n1 = std::min(n, n0 + bn);
    float mx = m;
    for (int j = n0; j < n1; ++j) mx = std::max(mx, r.s[size_t(j)]);
    const float ms = mx == -INFINITY ? 0.f : mx * c;
    const float alpha = std::exp2(std::fma(m, c, -ms));
    m = mx;
    float sum = 0.f;
    for (float& x : o) x *= alpha;
    for (int j = n0; j < n1; ++j) {
      const float pj = std::exp2(std::fma(r.s[size_t(j)], c, -ms));
      sum += pj;
      const float p16 = to16(pj, bf16);
      for (int d = 0; d < r.D; ++d) o[size_t(d)] += p16 * r.v[size_t(j)][size_t(d)];
    }
    l = l * alpha + sum;
  }
  Out out;
  const bool empty = !(l > 0.f);
  const float inv = empty ? 0.f : 1.f / l;
  out.lse = empty ? -INFINITY : (m * c + std::log2(l)) * kLn2f;
  for (float x : o) {
    const float y = to16(x * inv, bf16);
    out.finite = out.finite && std::isfinite(y);
    out.o.push_back(y);
  }
  return out;
}

// float64 reference: softmax(s * scale) V and the LSE.
void reference(const Row& r, double scale, std::vector<double>& o, double& lse) {
  double mx = -INFINITY;
  for (float x : r.s) mx = std::max(mx, double(x) * scale);
  double sum = 0;
  o.assign(size_t(r.D), 0.0);
  for (size_t j = 0; j < r.s.size(); ++j) {
    const double w = std::exp(double(r.s[j]) * scale - mx);
    sum += w;
    for (int d = 0; d < r.D; ++d) o[size_t(d)] += w * r.v[j][size_t(d)];
  }
  for (double& x : o) x /= sum;
  lse = mx + std::log(sum);
}

// max |o - ref| / max |ref| (inf when a value is not finite).
double rel_err(const std::vector<float>& o, const std::vector<double>& ref) {
  double err = 0, mag = 1e-300;
  for (size_t i = 0; i < o.size(); ++i) {
    if (!std::isfinite(o[i])) return INFINITY;
    err = std::max(err, std::fabs(double(o[i]) - ref[i]));
    mag = std::max(mag, std::fabs(ref[i]));
  }
  return err / mag;
}

// n keys, every score a (the dot product of constant rows), V random in [-vmax, vmax] (16-bit).
Row constant_scores(float a, int n, int D, float vmax, bool bf16, uint32_t seed) {
  Row r;
  r.D = D;
  r.s.assign(size_t(n), a);
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);  // scaled after: (-vmax, vmax) overflows at 3e38
  r.v.assign(size_t(n), std::vector<float>(size_t(D)));
  for (auto& row : r.v)
    for (float& x : row) x = to16(double(u(g)) * vmax, bf16);
  return r;
}

// Exact FP32 dot product of two constant rows of value x at head dim D (the inputs keep it exact).
float const_dot(float x, int D) {
  const double d = double(x) * double(x) * D;
  REQUIRE(double(float(d)) == d);
  return float(d);
}

}  // namespace

TEST_CASE("attention softmax emulation: PyTorch's upstream case (q = k = v = 133120, BF16, D 64)", "[attention][emu]") {
  const float s = const_dot(133120.f, 64);  // 1.134e12
  Row r;
  r.D = 64;
  r.s = {s};
  r.v = {std::vector<float>(64, 133120.f)};
  const float scale = 0.125f;
  // The earlier form: exp2(+7916) = inf, l = inf, O = inf * (1 / inf) = NaN: the reported failure.
  const Out old = forward_old(r, 128, scale, true);
  CHECK_FALSE(old.finite);
  CHECK(std::isnan(old.o[0]));
  const Out now = forward_new(r, 128, scale, true, 1);
  REQUIRE(now.finite);
  for (float x : now.o) CHECK(x == 133120.f);  // softmax over one key is 1: O = v exactly
  const double lse_ref = double(s) * 0.125;
  CHECK(std::fabs(now.lse - lse_ref) <= 2 * std::ldexp(1.0, std::ilogb(lse_ref) - 23));
}

TEST_CASE("attention softmax emulation: FP16 scores far past FP16's range, tiles with an unchanged max", "[attention][emu]") {
  // q = k = 61440 (15 * 2^12: squares and their sums exact in FP32): scores 2.4e11 at D 64, 1.9e12
  // at D 512; 300 keys over three tiles of 128 (the rescale factor of an unchanged max must be 1).
  for (int D : {64, 128, 256, 512}) {
    const float s = const_dot(61440.f, D);
    const Row r = constant_scores(s, 300, D, 60000.f, false, uint32_t(D));
    const float scale = float(1.0 / std::sqrt(double(D)));
    std::vector<double> ref;
    double lse_ref = 0;
    reference(r, scale, ref, lse_ref);
    const Out old = forward_old(r, 128, scale, false);
    INFO("D " << D << " old O[0] " << old.o[0] << " old LSE " << old.lse);
    CHECK(rel_err(old.o, ref) > 0.5);  // the earlier form: O = 0 (every p = 2^-592), or NaN
    const Out now = forward_new(r, 128, scale, false, 300);
    INFO("new LSE " << now.lse << " ref " << lse_ref);
    CHECK(now.finite);
    CHECK(rel_err(now.o, ref) < 2e-3);
    CHECK(std::fabs(now.lse - lse_ref) <= 4 * std::ldexp(1.0, std::ilogb(lse_ref) - 23));
  }
}

TEST_CASE("attention softmax emulation: separated large scores, the max moving across tiles", "[attention][emu]") {
  // Scores j * 2^30 (distinct by far more than 1 / scale): one-hot softmax on the largest, met in
  // the middle tile, after a smaller one in the first and before smaller ones in the last.
  for (bool bf16 : {false, true}) {
    Row r;
    r.D = 8;
    const int n = 200;
    for (int j = 0; j < n; ++j) {
      const int rank = j == 151 ? 1000 : (j < 64 ? 500 + j : j);
      r.s.push_back(std::ldexp(float(rank), 30));
      r.v.push_back(std::vector<float>(8, to16(float(j % 7) - 3.f, bf16)));
    }
    REQUIRE(r.v[151][0] == 1.f);
    const Out now = forward_new(r, 64, 0.125f, bf16, n);
    REQUIRE(now.finite);
    for (float x : now.o) CHECK(x == 1.f);
    CHECK(now.m == r.s[151]);
  }
}

TEST_CASE("attention softmax emulation: BF16 V near BF16's maximum, FP16 V at 65504", "[attention][emu]") {
  // BF16: 1000 keys of equal scores and V = +-3.3e38: the unnormalized sum_j p_j v_j (p = 1 each)
  // overflows FP32 without the bias; with it p = 2^-11 and the sum stays within max |v|.
  Row r = constant_scores(const_dot(1.f, 64), 1000, 16, 3.3e38f, true, 7);
  for (auto& row : r.v) row[0] = to16(3.38e38, true);  // every V row's first column at BF16's max
  std::vector<double> ref;
  double lse_ref = 0;
  reference(r, 0.125, ref, lse_ref);
  const Out old = forward_old(r, 128, 0.125f, true);
  CHECK_FALSE(old.finite);
  const Out now = forward_new(r, 128, 0.125f, true, 1000);
  CHECK(now.finite);
  CHECK(rel_err(now.o, ref) < 1e-2);
  CHECK(now.o[0] == to16(3.38e38, true));  // the mean of equal values, clamped into range
  // FP16: V = 65504 everywhere; one key at p = 1 and 1000 at p = 0.500245 (just above the FP16
  // midpoint 0.5 + 2^-12: rounded up to 0.5 + 2^-11 for P V). O = 65504 (1 + 4.9e-4) = 65535 in FP32,
  // inf in FP16; the clamp gives 65504. The GPU test builds the same row (scale c = -log2 0.500245).
  {
    Row f;
    f.D = 4;
    const float delta = std::log2(0.5f + std::ldexp(1.f, -12) + std::ldexp(1.f, -20));
    f.s.push_back(0.f);
    f.v.push_back(std::vector<float>(4, 65504.f));
    for (int j = 0; j < 1000; ++j) {
      f.s.push_back(delta);
      f.v.push_back(std::vector<float>(4, 65504.f));
    }
    const float ln2 = float(std::log(2.0));  // scale ln 2: c = 1
    const Out old16 = forward_old(f, 128, ln2, false);
    CHECK_FALSE(old16.finite);
    const Out o16 = forward_new(f, 128, ln2, false, 1001);
    REQUIRE(o16.finite);
    for (float x : o16.o) CHECK(x == 65504.f);
  }
}

TEST_CASE("attention softmax emulation: the split-key merge weighs splits by their key counts", "[attention][emu]") {
  // Decode: one query, Sk = 8269 keys of one huge score (q = k = 133120), V random; splits of
  // unequal key counts (the last one shorter). Weights from the splits' LSEs lose the counts (an
  // LSE ulp is 16384 there), so the merge averaged the splits' means; split_weight keeps them.
  const int D = 64, sk = 8269, splits = 8, bn = 128;
  const float s = const_dot(133120.f, D);
  const Row r = constant_scores(s, sk, D, 4.f, true, 11);
  const float scale = 0.125f, c = float(0.125 * 1.4426950408889634);
  std::vector<double> ref;
  double lse_ref = 0;
  reference(r, scale, ref, lse_ref);
  const int n_tiles = (sk + bn - 1) / bn, per = (n_tiles + splits - 1) / splits;
  std::vector<Out> parts;
  std::vector<std::vector<float>> part_o;  // FP32 normalized partials (the workspace)
  for (int sp = 0; sp < splits; ++sp) {
    Row pr;
    pr.D = D;
    const int k0 = std::min(sk, sp * per * bn), k1 = std::min(sk, (sp + 1) * per * bn);
    for (int j = k0; j < k1; ++j) {
      pr.s.push_back(r.s[size_t(j)]);
      pr.v.push_back(r.v[size_t(j)]);
    }
    // store_output of a split: o * inv unrounded; emulate by the FP32 mean of its rows
    const Out o = forward_new(pr, bn, scale, true, sk);
    std::vector<float> mean(size_t(D), 0.f);
    for (size_t j = 0; j < pr.s.size(); ++j)
      for (int d = 0; d < D; ++d) mean[size_t(d)] += pr.v[j][size_t(d)] / float(pr.s.size());
    parts.push_back(o);
    part_o.push_back(mean);
  }
  float M = -INFINITY;
  for (const Out& o : parts) M = std::max(M, o.m);
  std::vector<float> w;
  float sum = 0.f;
  for (const Out& o : parts) {
    w.push_back(split_weight(o.m, o.t, M, c));
    sum += w.back();
  }
  std::vector<float> merged(size_t(D), 0.f), by_lse(size_t(D), 0.f);
  float lmax = -INFINITY, lsum = 0.f;
  for (const Out& o : parts) lmax = std::max(lmax, o.lse);
  for (const Out& o : parts) lsum += std::exp(o.lse - lmax);
  for (int sp = 0; sp < splits; ++sp)
    for (int d = 0; d < D; ++d) {
      merged[size_t(d)] += w[size_t(sp)] / sum * part_o[size_t(sp)][size_t(d)];
      by_lse[size_t(d)] += std::exp(parts[size_t(sp)].lse - lmax) / lsum * part_o[size_t(sp)][size_t(d)];
    }
  const float lse = row_lse(M, sum, scale, prob_bias(sk, true));
  CHECK(rel_err(merged, ref) < 1e-4);
  CHECK(rel_err(by_lse, ref) > 1e-3);  // the earlier merge: wrong past BF16's precision
  CHECK(std::fabs(lse - lse_ref) <= 4 * std::ldexp(1.0, std::ilogb(lse_ref) - 23));
}

TEST_CASE("attention softmax emulation: LSE and edge values", "[attention][emu]") {
  // m * scale_log2 overflows FP32 before the LSE does when scale > ln 2.
  const float m = 3e38f, scale = 1.f;
  CHECK(std::isinf(m * float(scale * 1.4426950408889634)));
  CHECK(row_lse(m, 1.f, scale, 0.f) == m);
  CHECK(row_lse(-INFINITY, 0.f, scale, 0.f) == -INFINITY);  // an empty row
  CHECK(row_lse(5.f, 0.f, scale, 3.f) == -INFINITY);
  // bias: BF16 only, floor(log2 sk) + 2 (a row's biased sum stays <= 1/2)
  CHECK(prob_bias(1, true) == 2.f);
  CHECK(prob_bias(8192, true) == 15.f);
  CHECK(prob_bias(8193, true) == 15.f);
  CHECK(prob_bias(int64_t(1) << 31, true) == 33.f);
  CHECK(prob_bias(100000, false) == 0.f);
  for (int64_t sk : {1, 2, 3, 1000, 8192, 8193, 1 << 20})
    CHECK(double(sk) * std::exp2(-double(prob_bias(sk, true))) <= 0.5);
  // masked scores: -inf exponent, also for a row with nothing visible yet (ref 0)
  CHECK(prob_arg(-INFINITY, row_ref(-INFINITY), 0.18f, 0.f) == -INFINITY);
  CHECK(prob_arg(-INFINITY, 1e12f, 0.18f, 15.f) == -INFINITY);
  CHECK(attn_exp2(rescale_arg(-INFINITY, row_ref(-INFINITY), 0.18f)) == 0.f);
  CHECK(attn_exp2(rescale_arg(-INFINITY, 1e12f, 0.18f)) == 0.f);
  CHECK(rescale_arg(1e12f, 1e12f, 0.18f) == 0.f);  // an unchanged max: factor exactly 1
  CHECK(prob_arg(1e12f, 1e12f, 0.18f, 15.f) == -15.f);
  // the clamp: finite values past the type's max only
  CHECK(clamp_out(65530.f, kFp16Max) == 65504.f);
  CHECK(clamp_out(-70000.f, kFp16Max) == -65504.f);
  CHECK(clamp_out(100.f, kFp16Max) == 100.f);
  CHECK(std::isinf(clamp_out(INFINITY, kFp16Max)));
  CHECK(std::isnan(clamp_out(NAN, kFp16Max)));
  CHECK(clamp_out(3.4e38f, kBf16Max) == kBf16Max);
  CHECK(to16(kBf16Max, true) == kBf16Max);
  CHECK(std::isinf(to16(3.397e38, true)));
  // min(x, 0) keeps NaN (P = NaN for NaN scores, as the reference)
  CHECK(std::isnan(min0_nan(NAN)));
  CHECK(min0_nan(3.f) == 0.f);
  CHECK(min0_nan(-3.f) == -3.f);
  CHECK(bwd_prob_arg(-INFINITY, 0.f, 0.18f, INFINITY) == -INFINITY);
}

namespace {

// The backward preprocessing's exact statistics (attention_bwd.cu exact_row_stats): 32 lanes take
// keys lane, lane + 32, ...; online (max, sum) per lane; warp merge. Returns (a, r).
std::pair<float, float> exact_stats(const std::vector<float>& s, float c) {
  float ml[32], tl[32];
  for (int lane = 0; lane < 32; ++lane) {
    float m = -INFINITY, t = 0.f;
    for (size_t j = size_t(lane); j < s.size(); j += 32) {
      const float x = s[j];
      if (x > m) {
        t = t * attn_exp2(rescale_arg(m, x, c)) + 1.f;
        m = x;
      } else {
        t += attn_exp2(prob_arg(x, m, c, 0.f));
      }
    }
    ml[lane] = m;
    tl[lane] = t;
  }
  float M = -INFINITY;
  for (float m : ml) M = std::max(M, m);
  float sum = 0.f;
  for (int lane = 0; lane < 32; ++lane) sum += split_weight(ml[lane], tl[lane], M, c);
  return {M, std::log2(sum)};
}

}  // namespace

TEST_CASE("attention softmax emulation: the backward's probabilities from the forward's LSE", "[attention][emu]") {
  // Rows of n equal huge scores (P = 1 / n) and of separated ones (one-hot): from the LSE alone
  // (the earlier form, P = exp2(fma(s, c, -LSE log2 e))) the exponent is off by up to an ulp of the
  // LSE (thousands): P = inf or 0. The preprocessing's exact (a, r) gives P to FP32 precision.
  const float scale = 0.125f, c = float(0.125 * 1.4426950408889634);
  for (int n : {1, 3, 100, 1000}) {
    const Row r = constant_scores(const_dot(133120.f, 64), n, 4, 1.f, true, 5);
    const Out fwd = forward_new(r, 128, scale, true, n);
    REQUIRE(std::fabs(fwd.lse) >= kBwdExactLse);  // the preprocessing recomputes this row
    const float lse2 = fwd.lse * kLog2ef;
    const float old_p = attn_exp2(std::fma(r.s[0], c, -lse2));
    INFO("n " << n << " old P " << old_p);
    CHECK(std::fabs(old_p * n - 1.0) > 0.5);  // inf or 0 (or garbage), not 1 / n
    const auto ar = exact_stats(r.s, c);
    const float p = attn_exp2(bwd_prob_arg(r.s[0], ar.first, c, ar.second));
    CHECK(std::fabs(double(p) * n - 1.0) < 1e-5);
  }
  {
    std::vector<float> s;
    for (int j = 0; j < 100; ++j) s.push_back(std::ldexp(float(j == 42 ? 500 : j), 30));
    const auto ar = exact_stats(s, c);
    for (int j = 0; j < 100; ++j) {
      const float p = attn_exp2(bwd_prob_arg(s[size_t(j)], ar.first, c, ar.second));
      CHECK(p == (j == 42 ? 1.f : 0.f));
    }
    // a score a few ulps above the recomputed max (another summation order): P clamped to 1
    CHECK(attn_exp2(bwd_prob_arg(std::nextafter(s[42], INFINITY), ar.first, c, ar.second)) == 1.f);
  }
  // Below the threshold the LSE path stays accurate: rows of 64 equal scores with LSEs up to just
  // under kBwdExactLse, both signs, P within 4e-4 of 1 / 64 (the worst over the sweep).
  double worst = 0;
  for (int i = 0; i < 4000; ++i) {
    const float sc = (i % 2 ? -1.f : 1.f) * (kBwdExactLse - 5.f) / scale * float(i / 2 + 1) / 2000.f;
    const Row r = constant_scores(sc, 64, 4, 1.f, false, 9);
    const Out fwd = forward_new(r, 128, scale, false, 64);
    REQUIRE(std::fabs(fwd.lse) < kBwdExactLse);
    const float p = attn_exp2(bwd_prob_arg(sc, 0.f, c, fwd.lse * kLog2ef));
    worst = std::max(worst, std::fabs(double(p) * 64 - 1.0));
  }
  INFO("worst relative error of P below the threshold: " << worst);
  CHECK(worst < 4e-4);
}
