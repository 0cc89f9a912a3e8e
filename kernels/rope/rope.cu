// SPDX-License-Identifier: Apache-2.0
// Rotary position embeddings applied to q and k in one pass, the rotate-half layout of Llama,
// Mistral, Qwen, Gemma and gpt-oss (column c rotates with c + R/2), partial rotary (columns
// [R, D) pass through):
//   forward:  out[c]     = x[c] cos[c]          - x[c + R/2] sin[c]
//             out[c+R/2] = x[c + R/2] cos[c+R/2] + x[c] sin[c+R/2]          (c < R/2)
//   backward (the adjoint, x = dout):
//             dx[c]      = dy[c] cos[c]          + dy[c + R/2] sin[c+R/2]
//             dx[c+R/2]  = dy[c + R/2] cos[c+R/2] - dy[c] sin[c]
// Tables of width R hold an angle per column (Hugging Face's cat(freqs, freqs)); of width R/2 one
// per pair. Math in FP32 with one rounding per output (the unfused composition rounds both
// products as well), NaN and infinities propagate as there.
//
// Variant constants (tools/flygen): FLY_DTYPE_IS_{FP16,BF16,FP32}. The direction is a parameter:
// one image per dtype, the two directions differ by two signs and an index.
//
// Memory plan: the unit of work is one 16-byte vector of each half of a rotated pair (or one
// vector of the pass-through columns) where every row is 16-byte aligned, else one element. Units
// are numbered over the rows of q then k and walked with a grid stride; x and out are read and
// written once (HBM bound), the tables are read per row of every head (L1 / L2 hits after the
// first head).
#include "common/vec.cuh"
#include "common/variant_elem.cuh"
#include "rope/rope_params.h"

using T = fly::VariantElem;

namespace {

constexpr int kThreads = 256;

template <int kE>
struct Unit {
  float e[kE];
};

// x and out may be one tensor (in place): plain loads for x. The tables are never written.
template <int kE, bool kReadOnly>
__device__ __forceinline__ Unit<kE> load(const T* p) {
  Unit<kE> u;
  if constexpr (kE * sizeof(T) == 16) {
    fly::Vec16<T> v;
    if constexpr (kReadOnly) v.raw = fly::ld16(p);
    else v.raw = *reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int i = 0; i < kE; ++i) u.e[i] = fly::to_float(v.e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kE; ++i) u.e[i] = fly::to_float(p[i]);
  }
  return u;
}
template <int kE>
__device__ __forceinline__ void store(T* p, const Unit<kE>& u) {
  if constexpr (kE * sizeof(T) == 16) {
    fly::Vec16<T> v;
#pragma unroll
    for (int i = 0; i < kE; ++i) v.e[i] = fly::from_float<T>(u.e[i]);
    *reinterpret_cast<uint4*>(p) = v.raw;
  } else {
#pragma unroll
    for (int i = 0; i < kE; ++i) p[i] = fly::from_float<T>(u.e[i]);
  }
}

// I: the index type of the unit numbering (32-bit where the units fit: no 64-bit division).
template <int kE, class I>
__device__ __forceinline__ void run(const RopeParams& p) {
  const I U = I(p.units);
  const I q_units = I(p.t[0].rows) * U;
  const I total = q_units + I(p.t[1].rows) * U;
  const I S = I(p.S);
  for (I g = I(blockIdx.x) * kThreads + threadIdx.x; g < total; g += I(gridDim.x) * kThreads) {
    const int which = g < q_units ? 0 : 1;
    const RopeOperand& t = p.t[which];
    const I gg = which ? g - q_units : g;
    const I row = gg / U;
    const int u = int(gg - row * U);
    const I s = row % S;
    const I bh = row / S;
    const I H = I(t.H);
    const I h = bh % H;
    const I b = bh / H;
    const T* x = static_cast<const T*>(t.x) + int64_t(b) * t.x_b + int64_t(h) * t.x_h + int64_t(s) * t.x_s;
    T* out = static_cast<T*>(t.out) + int64_t(b) * t.o_b + int64_t(h) * t.o_h + int64_t(s) * t.o_s;
    if (u >= p.pair_units) {  // columns [R, D): carried over unchanged
      const int c = p.rot + (u - p.pair_units) * kE;
      store<kE>(out + c, load<kE, false>(x + c));
      continue;
    }
    const int c = u * kE, c2 = c + p.half;
    const int tc2 = p.half_tables ? c : c2;  // the table column of c + R/2
    const T* ct = static_cast<const T*>(p.cos) + int64_t(b) * p.cos_b + int64_t(s) * p.cos_s;
    const T* st = static_cast<const T*>(p.sin) + int64_t(b) * p.sin_b + int64_t(s) * p.sin_s;
    const Unit<kE> x1 = load<kE, false>(x + c), x2 = load<kE, false>(x + c2);
    const Unit<kE> cos1 = load<kE, true>(ct + c), cos2 = load<kE, true>(ct + tc2);
    const Unit<kE> sin1 = load<kE, true>(st + c), sin2 = load<kE, true>(st + tc2);
    Unit<kE> o1, o2;
    if (!p.bwd) {
#pragma unroll
      for (int i = 0; i < kE; ++i) {
        o1.e[i] = fmaf(x1.e[i], cos1.e[i], -(x2.e[i] * sin1.e[i]));
        o2.e[i] = fmaf(x2.e[i], cos2.e[i], x1.e[i] * sin2.e[i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kE; ++i) {
        o1.e[i] = fmaf(x1.e[i], cos1.e[i], x2.e[i] * sin2.e[i]);
        o2.e[i] = fmaf(x2.e[i], cos2.e[i], -(x1.e[i] * sin1.e[i]));
      }
    }
    store<kE>(out + c, o1);
    store<kE>(out + c2, o2);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) rope(const RopeParams p) {
  const int64_t total = (p.t[0].rows + p.t[1].rows) * int64_t(p.units);
  const bool small = total + int64_t(gridDim.x) * kThreads < (int64_t(1) << 31);
  if (p.vec) {
    if (small) run<fly::Vec16<T>::kElems, uint32_t>(p);
    else run<fly::Vec16<T>::kElems, uint64_t>(p);
  } else {
    if (small) run<1, uint32_t>(p);
    else run<1, uint64_t>(p);
  }
}
