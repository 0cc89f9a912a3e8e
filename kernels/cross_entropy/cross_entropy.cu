// SPDX-License-Identifier: Apache-2.0
// Cross-entropy over [M, V] logit rows (any row stride, unit inner stride) with int64 labels:
//   lse[r]  = log(sum_j exp(x[r, j]))                               (FP32, optional output)
//   loss[r] = lse[r] - x[r, label[r]]                               (FP32)
//   dlogits[r, j] = (exp(x[r, j] - lse[r]) - (j == label[r])) * scale   (the logits' dtype, optional)
// A row whose label is ignore_index gets loss 0, lse 0 and a zero gradient row, and its logits are
// not read. A label outside [0, V) (other than ignore_index) is never used as an index: the row's
// loss and gradient are NaN (torch raises a device-side assert there; NaN reaches the caller's
// loss instead of an out-of-bounds read), its lse is still computed.
// NaN and Inf propagate as torch's cross_entropy: a NaN or +Inf logit makes the row's loss, lse and
// gradient NaN; -Inf logits contribute nothing (a -Inf label logit gives loss +Inf); an all -Inf
// row is NaN.
//
// Variant constants (tools/flygen): FLY_DTYPE_IS_{FP16,BF16,FP32}, FLY_THREADS (one CTA per row),
// FLY_CACHE (16-byte units per thread of a row kept in registers between the passes).
//
// Memory plan: CTA b walks rows b, b + gridDim.x, ... Pass 1 reads the row once, keeping an online
// (max, sum of exp) per thread in the log2 domain, then one CTA reduction. Pass 2 writes the
// gradient from what pass 1 kept: units in registers (THREADS x CACHE), then units in dynamic
// shared memory (p.smem_units, sized by the launcher), and only past both does it read the row
// again (mostly L2 hits). So a row that fits both is one HBM read and one write per element, the
// minimum. Each unit of a row belongs to one thread in both passes, so dlogits may be the logits
// themselves (in place): a unit is overwritten only by the thread that has read it, after it did.
// Math in FP32 (exp2/log2 with the logits prescaled by log2(e)), one rounding per output.
#include <math.h>

#include "common/vec.cuh"
#include "common/variant_elem.cuh"
#include "cross_entropy/cross_entropy_params.h"

using T = fly::VariantElem;

namespace {

constexpr int kThreads = FLY_THREADS;
constexpr int kCache = FLY_CACHE;
constexpr int kV = fly::Vec16<T>::kElems;
constexpr int kWarps = kThreads / 32;
// Units past the register cache are loaded in batches of this many independent 16-byte loads (a
// serial load -> reduce loop would keep one load in flight per thread).
constexpr int kBatch = 4;
static_assert(kThreads % 32 == 0 && kThreads >= 64 && kThreads <= 1024, "threads per CTA: a multiple of 32");
static_assert(kCache >= 1 && kCache <= 32, "register cache of 1..32 units per thread");
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

using Unit = fly::Vec16<T>;

// Unit c of a row: one 16-byte load (kVec), else the elements below V. Plain loads, not the
// read-only (.nc) path: dlogits may be these very logits. Column indices are 32-bit (V < 2^31,
// checked by the launcher): 64-bit compares in every unrolled unit cost registers.
template <bool kVec>
__device__ __forceinline__ Unit load(const T* row, int c, int V) {
  Unit u;
  const T* p = row + c * kV;
  if constexpr (kVec) {
    u.raw = *reinterpret_cast<const uint4*>(p);
  } else {
#pragma unroll
    for (int i = 0; i < kV; ++i) u.e[i] = c * kV + i < V ? p[i] : fly::from_float<T>(0.f);
  }
  return u;
}
template <bool kVec>
__device__ __forceinline__ void store(T* row, int c, int V, const Unit& u) {
  T* p = row + c * kV;
  if constexpr (kVec) {
    *reinterpret_cast<uint4*>(p) = u.raw;
  } else {
#pragma unroll
    for (int i = 0; i < kV; ++i)
      if (c * kV + i < V) p[i] = u.e[i];
  }
}

// max that propagates NaN from either side (fmaxf drops it, and a NaN logit must poison the row).
__device__ __forceinline__ float nanmax(float a, float b) { return (a > b || a != a) ? a : b; }

// Online softmax state of a set of logits, log2 domain: m = max of x * log2(e), s = sum of
// 2^(x * log2(e) - m). The empty set (or only -Inf logits) is (-Inf, 0).
struct MaxSum {
  float m, s;
};
// Merges (m, s) into a. Symmetric in its two sides bit for bit (max and + commute), so a butterfly
// of shuffles leaves the same value in every lane.
__device__ __forceinline__ void merge(MaxSum& a, float m, float s) {
  const float nm = nanmax(a.m, m);
  if (nm == -INFINITY) return;  // both empty: exp2(-Inf - -Inf) would be NaN
  a.s = a.s * exp2f(a.m - nm) + s * exp2f(m - nm);
  a.m = nm;
}
// Adds unit c's elements (those below V).
template <bool kVec>
__device__ __forceinline__ void absorb(MaxSum& st, const Unit& u, int c, int V) {
  float y[kV];
  float lm = -INFINITY;
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    y[i] = (kVec || c * kV + i < V) ? fly::to_float(u.e[i]) * kLog2e : -INFINITY;
    lm = nanmax(lm, y[i]);
  }
  const float nm = nanmax(st.m, lm);
  if (nm == -INFINITY) return;
  float s = st.s * exp2f(st.m - nm);
#pragma unroll
  for (int i = 0; i < kV; ++i) s += exp2f(y[i] - nm);
  st.m = nm;
  st.s = s;
}

// The CTA's (max, sum), the same value in every thread. `red` is reused by the next row: the
// second barrier keeps a fast warp from overwriting it early.
__device__ __forceinline__ MaxSum block_merge(MaxSum v, float2* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m = __shfl_xor_sync(0xffffffffu, v.m, o), s = __shfl_xor_sync(0xffffffffu, v.s, o);
    merge(v, m, s);
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = make_float2(v.m, v.s);
  __syncthreads();
  MaxSum t{-INFINITY, 0.f};
#pragma unroll
  for (int i = 0; i < kWarps; ++i) merge(t, red[i].x, red[i].y);
  __syncthreads();
  return t;
}

// The gradient of unit c: (2^(y - l2) - onehot(label)) * scale; `label` is -1 for an invalid
// one, whose row is NaN (scale NaN).
template <bool kVec>
__device__ __forceinline__ void grad_unit(T* grow, int c, int V, const Unit& x, float l2, int label, float scale) {
  Unit g;
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    float v = exp2f(fly::to_float(x.e[i]) * kLog2e - l2);
    if (c * kV + i == label) v -= 1.f;
    g.e[i] = fly::from_float<T>(v * scale);
  }
  store<kVec>(grow, c, V, g);
}

template <bool kVec>
__device__ __forceinline__ void run(const CrossEntropyParams& p, float2* red, uint4* stash) {
  const int tid = threadIdx.x;
  const int V = int(p.V), cols = int(p.cols), smem_units = p.smem_units;
  constexpr int kReg = kThreads * kCache;  // units of a row held in registers
  for (int64_t r = blockIdx.x; r < p.M; r += gridDim.x) {
    const T* xrow = static_cast<const T*>(p.logits) + r * p.ldl;
    T* grow = p.dlogits ? static_cast<T*>(p.dlogits) + r * p.ldd : nullptr;
    const int64_t label64 = p.labels[r];
    if (label64 == p.ignore_index) {
      if (tid == 0) {
        p.loss[r] = 0.f;
        if (p.lse) p.lse[r] = 0.f;
      }
      if (grow) {
        Unit z;
        z.raw = make_uint4(0u, 0u, 0u, 0u);
        for (int c = tid; c < cols; c += kThreads) store<kVec>(grow, c, V, z);
      }
      continue;  // uniform over the CTA: every thread read the same label
    }
    const bool valid = label64 >= 0 && label64 < p.V;
    const int label = valid ? int(label64) : -1;
    // The label's logit, read before the barrier in block_merge: every gradient store of this row
    // (which may overwrite it in place) comes after that barrier.
    float x_label = 0.f;
    if (tid == 0 && valid) x_label = fly::to_float(xrow[label]);

    // ---- pass 1: online max / sum over the row ----
    Unit rc[kCache];
    MaxSum st{-INFINITY, 0.f};
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int c = tid + i * kThreads;
      if (c < cols) rc[i] = load<kVec>(xrow, c, V);
    }
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int c = tid + i * kThreads;
      if (c < cols) absorb<kVec>(st, rc[i], c, V);
    }
    // Past the registers: this thread's units c = kReg + tid + k * kThreads, their shared-memory
    // slots c - kReg (this thread's own in both passes: no barrier needed).
    for (int c0 = kReg + tid; c0 < cols; c0 += kBatch * kThreads) {
      Unit b[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int c = c0 + k * kThreads;
        if (c < cols) b[k] = load<kVec>(xrow, c, V);
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int c = c0 + k * kThreads;
        if (c < cols) {
          absorb<kVec>(st, b[k], c, V);
          if (c - kReg < smem_units) stash[c - kReg] = b[k].raw;
        }
      }
    }
    st = block_merge(st, red);
    const float l2 = st.m + log2f(st.s);  // log2(e) * lse
    if (tid == 0) {
      const float lse = l2 * kLn2;
      p.loss[r] = valid ? lse - x_label : NAN;
      if (p.lse) p.lse[r] = lse;
    }
    if (!grow) continue;

    // ---- pass 2: the gradient ----
    const float scale = valid ? p.scale : NAN;
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int c = tid + i * kThreads;
      if (c < cols) grad_unit<kVec>(grow, c, V, rc[i], l2, label, scale);
    }
    for (int c0 = kReg + tid; c0 < cols; c0 += kBatch * kThreads) {
      Unit b[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int c = c0 + k * kThreads;
        if (c < cols) {
          if (c - kReg < smem_units) b[k].raw = stash[c - kReg];
          else b[k] = load<kVec>(xrow, c, V);  // this thread's own unit, not yet overwritten
        }
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int c = c0 + k * kThreads;
        if (c < cols) grad_unit<kVec>(grow, c, V, b[k], l2, label, scale);
      }
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) cross_entropy_fwd_bwd(const CrossEntropyParams p) {
  __shared__ float2 red[kWarps];
  extern __shared__ uint4 stash[];
  if (p.vec) run<true>(p, red, stash);
  else run<false>(p, red, stash);
}
