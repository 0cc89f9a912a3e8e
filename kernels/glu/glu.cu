// SPDX-License-Identifier: Apache-2.0
// Gated linear units, elementwise over [M, N] rows with any row strides (gate and up may be the
// two halves of one [M, 2N] projection):
//   forward:  out = act(gate) * up
//   backward: dgate = dout * up * act'(gate), dup = dout * act(gate)
// act: SiLU (SwiGLU), GELU with the tanh approximation or exact GELU (GeGLU). Math in FP32, one
// rounding per output (the unfused composition rounds act(gate) before the product as well).
//
// Variant constants (tools/flygen): FLY_DIR_IS_{FWD,BWD}, FLY_DTYPE_IS_{FP16,BF16,FP32}.
//
// Memory plan: each thread walks the flattened (row, unit) space with a grid stride, a unit being
// one 16-byte vector per operand where every row is 16-byte aligned, else one element. The row
// and column of the next unit follow from the stride by one add and one compare (no division in
// the loop). Every byte is read once and written once: the kernel is bound by HBM bandwidth.
#include "common/vec.cuh"
#include "common/variant_elem.cuh"
#include "glu/glu_params.h"

using T = fly::VariantElem;

namespace {

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoef = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// act(g), and its derivative when wanted: the formulas PyTorch's kernels use (silu: g / (1 +
// exp(-g)); gelu tanh: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))); gelu: 0.5 g (1 + erf(g /
// sqrt 2))), so the results match theirs to FP32 rounding. NaN propagates.
template <bool kGrad>
__device__ __forceinline__ float act_fn(float g, int act, float* deriv) {
  if (act == kGluSilu) {
    const float s = 1.f / (1.f + __expf(-g));
    if constexpr (kGrad) *deriv = s * (1.f + g * (1.f - s));
    return g * s;
  } else if (act == kGluGeluTanh) {
    const float g2 = g * g;
    const float t = tanhf(kSqrt2OverPi * g * (1.f + kGeluCoef * g2));
    if constexpr (kGrad)
      *deriv = 0.5f * (1.f + t) + 0.5f * g * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * kGeluCoef * g2);
    return 0.5f * g * (1.f + t);
  } else {
    const float e = erff(g * kInvSqrt2);
    if constexpr (kGrad) *deriv = 0.5f * (1.f + e) + g * kInvSqrt2Pi * __expf(-0.5f * g * g);
    return 0.5f * g * (1.f + e);
  }
}

// One unit of U (a 16-byte vector or one element) at (row r, unit c).
template <int kE>
struct Unit {
  T e[kE];
};
template <int kE>
__device__ __forceinline__ Unit<kE> load(const void* base, int64_t ld, int64_t r, int64_t c) {
  Unit<kE> u;
  const T* p = static_cast<const T*>(base) + r * ld + c * kE;
  if constexpr (kE * sizeof(T) == 16) {
    // A plain load, not the read-only (.nc) path: an output may be this very input (in place).
    fly::Vec16<T> v;
    v.raw = *reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < kE; ++i) u.e[i] = v.e[i];
  } else {
#pragma unroll
    for (int i = 0; i < kE; ++i) u.e[i] = p[i];
  }
  return u;
}
template <int kE>
__device__ __forceinline__ void store(void* base, int64_t ld, int64_t r, int64_t c, const Unit<kE>& u) {
  T* p = static_cast<T*>(base) + r * ld + c * kE;
  if constexpr (kE * sizeof(T) == 16) {
    fly::Vec16<T> v;
#pragma unroll
    for (int i = 0; i < kE; ++i) v.e[i] = u.e[i];
    *reinterpret_cast<uint4*>(p) = v.raw;
  } else {
#pragma unroll
    for (int i = 0; i < kE; ++i) p[i] = u.e[i];
  }
}

template <int kE>
__device__ __forceinline__ void run(const GluParams& p) {
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  const int64_t first = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  int64_t r = first / p.cols, c = first % p.cols;
  const int64_t dr = stride / p.cols, dc = stride % p.cols;
  for (; r < p.M;) {
    const Unit<kE> g = load<kE>(p.gate, p.ld_gate, r, c);
    const Unit<kE> u = load<kE>(p.up, p.ld_up, r, c);
#if defined(FLY_DIR_IS_FWD)
    Unit<kE> o;
#pragma unroll
    for (int i = 0; i < kE; ++i)
      o.e[i] = fly::from_float<T>(act_fn<false>(fly::to_float(g.e[i]), p.act, nullptr) * fly::to_float(u.e[i]));
    store<kE>(p.out, p.ld_out, r, c, o);
#else
    const Unit<kE> d = load<kE>(p.dout, p.ld_dout, r, c);
    Unit<kE> dg, du;
#pragma unroll
    for (int i = 0; i < kE; ++i) {
      float deriv;
      const float a = act_fn<true>(fly::to_float(g.e[i]), p.act, &deriv);
      const float dy = fly::to_float(d.e[i]);
      dg.e[i] = fly::from_float<T>(dy * fly::to_float(u.e[i]) * deriv);
      du.e[i] = fly::from_float<T>(dy * a);
    }
    store<kE>(p.out, p.ld_out, r, c, dg);
    store<kE>(p.dup, p.ld_dup, r, c, du);
#endif
    r += dr;
    c += dc;
    if (c >= p.cols) {
      c -= p.cols;
      ++r;
    }
  }
}

}  // namespace

#if defined(FLY_DIR_IS_FWD)
extern "C" __global__ void __launch_bounds__(kThreads) glu_fwd(const GluParams p)
#elif defined(FLY_DIR_IS_BWD)
extern "C" __global__ void __launch_bounds__(kThreads) glu_bwd(const GluParams p)
#else
#error "glu: FLY_DIR_IS_* not defined"
#endif
{
  if (p.vec) run<fly::Vec16<T>::kElems>(p);
  else run<1>(p);
}
