// SPDX-License-Identifier: Apache-2.0
// The scalar arithmetic of the attention kernels' softmax, split merge and backward probability
// recomputation, host and device (the CPU test test/cpu/test_attention_softmax_emu.cpp runs these
// same functions over large finite inputs, issue 46).
//
// Why each form (docs/attention.md "Large finite inputs"): scores are FP32 and may be as large as
// ~1e12 for finite FP16 / BF16 inputs (q = k = 133120 at D 64 gives 1.1e12). An exponent written
// as fma(s, c, -fl(m c)) is the rounding error of fl(m c) at s = m, up to half an ulp of m c
// (8192 at m c = 2e11), so the row's largest probability came out as 2^+-8192: inf (then
// inf * 0 = NaN) or 0 (then an "empty" row, O = 0). Here every exponent is (s - m) c - bias: s - m
// is exact near the max (Sterbenz) and 0 at it, so the max key's probability is exactly 2^-bias
// and no exponent of a visible key is positive, whatever the magnitude of the scores.
#pragma once

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define FLY_ATTN_FN __host__ __device__ __forceinline__
#else
#define FLY_ATTN_FN inline
#endif

namespace fly::attn {

constexpr float kLn2f = 0.69314718055994531f;
constexpr float kLog2ef = 1.4426950408889634f;
// Largest finite FP16 and BF16 values (0x7BFF, 0x7F7F).
constexpr float kFp16Max = 65504.f;
constexpr float kBf16Max = 3.38953139e38f;
// The backward recomputes a row's softmax statistics exactly (fly_attn_bwd_pre) when its |LSE|
// reaches this. Below it P = exp2(s c - LSE log2 e) is off by the roundings of the LSE (FP32, ulp
// 2^-12 under 2048), of its log2 e multiple and of c = scale log2 e against the forward's scale:
// together under ~4e-4 relative, within FP16's half ulp (test_attention_softmax_emu.cpp measures it).
// Above it the error grows with |LSE| (at 1e11 the LSE has no precision left for P at all).
constexpr float kBwdExactLse = 2048.f;

// exp2: MUFU ex2.approx.ftz on the device (2 ulp, flushes subnormal results to 0), exp2f on the host.
FLY_ATTN_FN float attn_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// min(x, 0) that keeps a NaN x (fminf would return 0 for it).
FLY_ATTN_FN float min0_nan(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("min.NaN.f32 %0, %1, %2;\n" : "=f"(y) : "f"(x), "f"(0.f));
  return y;
#else
  return x != x ? x : (x < 0.f ? x : 0.f);
#endif
}

// The value a row's exponents are measured from: its running max, or 0 while the row has seen no
// visible key (max -inf: every score is -inf then and every exponent stays -inf).
FLY_ATTN_FN float row_ref(float mx) { return mx == -INFINITY ? 0.f : mx; }

// log2 of a probability numerator: (s - ref) c - bias. s = -inf (masked): -inf. One FADD, one FFMA.
FLY_ATTN_FN float prob_arg(float s, float ref, float c, float bias) { return fmaf(s - ref, c, -bias); }

// log2 of the factor that rescales a row's accumulators when its max moves from m_old to ref
// (m_old = -inf: -inf, the factor 0; unchanged max: exactly 0, the factor 1).
FLY_ATTN_FN float rescale_arg(float m_old, float ref, float c) { return (m_old - ref) * c; }

// floor(log2(n)) of n >= 1.
FLY_ATTN_FN int floor_log2(int64_t n) {
  int b = 0;
  while (n > 1) {
    n >>= 1;
    ++b;
  }
  return b;
}

// The forward's probability bias: BF16 probabilities are computed as 2^-bias of their value, so a
// row's sum over its (at most sk) keys stays at or below 1/2 and O's unnormalized FP32 accumulator
// sum_j p_j v_j stays within max |v| even for V near BF16's maximum (3.39e38, within 2^-8 of FP32's).
// The scaling is a power of two: the normalized O and the LSE (bias added back) are unchanged. FP16
// needs none (sk * 65504 < 2^47) and keeps its probabilities out of FP16's subnormal range.
FLY_ATTN_FN float prob_bias(int64_t sk, bool bf16) { return bf16 ? float(floor_log2(sk > 1 ? sk : 1) + 2) : 0.f; }

// Natural-log LSE of a row with max m (a raw score) and biased probability sum t (0: no visible
// key, -inf). m * scale + ln(t) + bias ln 2 with m * scale in one FFMA (never through m * c, which
// overflows before the LSE does when scale > ln 2).
FLY_ATTN_FN float row_lse(float m, float t, float scale, float bias) {
  return t > 0.f ? fmaf(m, scale, (log2f(t) + bias) * kLn2f) : -INFINITY;
}

// One split's weight in the split-key merge: its biased sum t scaled from its max m to the merged
// max M (t * 2^((m - M) c); a split that saw no key, m = -inf, weighs 0).
FLY_ATTN_FN float split_weight(float m, float t, float M, float c) {
  return m == -INFINITY ? 0.f : t * attn_exp2(rescale_arg(m, M, c));
}

// A finite output value past the 16-bit type's largest one becomes that largest one. O is a convex
// combination of V rows, so |O| <= max |v| exactly; only rounding (P rounded to 16 bits, the FP32
// sums) can push it past, e.g. to 65520 (which rounds to inf in FP16) for V = 65504. inf and NaN
// pass unchanged.
FLY_ATTN_FN float clamp_out(float x, float maxv) {
  const float a = fabsf(x);
  return (a > maxv && a < INFINITY) ? copysignf(maxv, x) : x;
}

// The backward's probability exp2 argument: (s - a) c - r with (a, r) = (0, LSE log2 e) for an
// ordinary row and (max score, log2 of the exact sum) for a row recomputed by the preprocessing
// (|LSE| >= kBwdExactLse); at most 0 (P <= 1 always holds exactly, and a score recomputed in another
// summation order than the preprocessing's may land a few ulps above its max); NaN stays NaN.
FLY_ATTN_FN float bwd_prob_arg(float s, float a, float c, float r) { return min0_nan(fmaf(s - a, c, -r)); }

}  // namespace fly::attn
