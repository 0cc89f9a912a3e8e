// SPDX-License-Identifier: Apache-2.0
// RMSNorm with a fused residual add, over [M, N] rows with any row strides (unit inner stride):
//   forward:  h = x + residual (rounded to the dtype: the new residual stream, written out)
//             y = h * rstd * w,  rstd = rsqrt(mean(h^2) + eps)  (optionally written, FP32)
//   backward: g = dy * w, hh = h * rstd
//             dx = rstd * (g - hh * mean(g * hh)) + dh      (= dresidual: h is x + residual)
//             dw = sum over rows of dy * hh                (FP32 partials per CTA, then add_rmsnorm_dw)
// Math in FP32, one rounding per output. NaN and Inf propagate as in the unfused composition (a
// row holding either gets rstd NaN or 0, so its y is NaN where h is not finite).
//
// Variant constants (tools/flygen): FLY_DIR_IS_{FWD,BWD}, FLY_DTYPE_IS_{FP16,BF16,FP32},
// FLY_THREADS (one CTA per row), FLY_CACHE (16-byte vectors per thread of a row kept in registers).
//
// Memory plan: CTA b walks rows b, b + gridDim.x, ... A row is read once into registers (the
// forward caches h, the backward dy and h as raw elements), reduced over the CTA, then written:
// one HBM read and one write per element. A row longer than the cache (N > THREADS * CACHE
// vectors) takes a second pass over the part beyond the cache that reads back what the first pass
// wrote (forward: h) or read (backward: dy, h), mostly L2 hits. Each element of a row belongs to
// one thread in both passes, so an output may be an input exactly (in place). A unit is 16 bytes
// of a row (8 FP16/BF16 or 4 FP32 elements): one vector load where every row is 16-byte aligned
// and N a whole number of vectors, else element loads with the row's end masked (so both paths
// keep the same registers: the cache holds units either way). The backward's dweight partials stay in registers when the row fits the
// cache (written once per CTA at the end), else are accumulated in the CTA's own workspace row.
// Determinism: every sum runs in an order fixed by the launch (grid size, thread mapping), no
// atomics, so repeated calls give the same bits.
#include "common/vec.cuh"
#include "common/variant_elem.cuh"
#include "add_rmsnorm/add_rmsnorm_params.h"

using T = fly::VariantElem;

namespace {

constexpr int kThreads = FLY_THREADS;
constexpr int kCache = FLY_CACHE;
constexpr int kV = fly::Vec16<T>::kElems;
constexpr int kWarps = kThreads / 32;
static_assert(kThreads % 32 == 0 && kThreads >= 64 && kThreads <= 1024, "threads per CTA: a multiple of 32");
static_assert(kCache >= 1 && kCache <= 16, "register cache of 1..16 vectors per thread");
constexpr int kDwThreads = 256;  // add_rmsnorm_dw: 32 columns x 8 slices of the partial rows
constexpr int kDwCols = 32;
constexpr int kDwSlices = kDwThreads / kDwCols;

// One unit as the 16 bytes it occupies (four registers, however many elements: a cache of
// unpacked FP16/BF16 elements would take one register each).
template <int kE>
using Unit = fly::Vec16<T>;
static_assert(sizeof(Unit<kV>) == 16, "a unit is 16 bytes");
// Unit c of row r: one 16-byte load (kVec), else the elements below N (zeros past the row's end,
// which add nothing to the sums). Plain loads, not the read-only (.nc) path: an output may be
// this very input (in place).
template <bool kVec>
__device__ __forceinline__ Unit<kV> load(const void* base, int64_t ld, int64_t r, int64_t c, int64_t N) {
  Unit<kV> u;
  const T* p = static_cast<const T*>(base) + r * ld + c * kV;
  if constexpr (kVec) {
    u.raw = *reinterpret_cast<const uint4*>(p);
  } else {
#pragma unroll
    for (int i = 0; i < kV; ++i) u.e[i] = c * kV + i < N ? p[i] : fly::from_float<T>(0.f);
  }
  return u;
}
template <bool kVec>
__device__ __forceinline__ void store(void* base, int64_t ld, int64_t r, int64_t c, int64_t N, const Unit<kV>& u) {
  T* p = static_cast<T*>(base) + r * ld + c * kV;
  if constexpr (kVec) {
    *reinterpret_cast<uint4*>(p) = u.raw;
  } else {
#pragma unroll
    for (int i = 0; i < kV; ++i)
      if (c * kV + i < N) p[i] = u.e[i];
  }
}
// The weight's unit c as floats (ones without a weight). Read-only for the whole call.
template <bool kVec>
__device__ __forceinline__ void weight(const void* w, int64_t c, int64_t N, float (&out)[kV]) {
  if (!w) {
#pragma unroll
    for (int i = 0; i < kV; ++i) out[i] = 1.f;
    return;
  }
  const T* p = static_cast<const T*>(w) + c * kV;
  if constexpr (kVec) {
    fly::Vec16<T> v;
    v.raw = fly::ld16(p);
#pragma unroll
    for (int i = 0; i < kV; ++i) out[i] = fly::to_float(v.e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kV; ++i) out[i] = c * kV + i < N ? fly::to_float(p[i]) : 0.f;
  }
}

// Sum over the CTA, the same value (and the same summation order) in every thread. `red` is
// reused by the next row: the second barrier keeps a fast warp from overwriting it early.
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = fly::warp_sum(v);
  if constexpr (kWarps == 1) {
    return v;
  } else {
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) s += red[i];
    __syncthreads();
    return s;
  }
}

#if defined(FLY_DIR_IS_FWD)

// h = x + residual of unit (r, c), stored, with its squares added to ss.
template <bool kVec>
__device__ __forceinline__ Unit<kV> add_unit(const AddRmsNormFwdParams& p, int64_t r, int64_t c, float& ss) {
  const Unit<kV> a = load<kVec>(p.x, p.ldx, r, c, p.N);
  const Unit<kV> b = load<kVec>(p.residual, p.ldr, r, c, p.N);
  Unit<kV> h;
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    h.e[i] = fly::from_float<T>(fly::to_float(a.e[i]) + fly::to_float(b.e[i]));
    const float f = fly::to_float(h.e[i]);
    ss += f * f;
  }
  store<kVec>(p.h, p.ldh, r, c, p.N, h);
  return h;
}
template <bool kVec>
__device__ __forceinline__ void norm_unit(const AddRmsNormFwdParams& p, int64_t r, int64_t c, const Unit<kV>& h,
                                          float rs) {
  float w[kV];
  weight<kVec>(p.w, c, p.N, w);
  Unit<kV> y;
#pragma unroll
  for (int i = 0; i < kV; ++i) y.e[i] = fly::from_float<T>(fly::to_float(h.e[i]) * rs * w[i]);
  store<kVec>(p.y, p.ldy, r, c, p.N, y);
}

template <bool kVec>
__device__ __forceinline__ void run_fwd(const AddRmsNormFwdParams& p, float* red) {
  const int64_t tid = threadIdx.x;
  for (int64_t r = blockIdx.x; r < p.M; r += gridDim.x) {
    Unit<kV> hc[kCache];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int64_t c = tid + int64_t(i) * kThreads;
      if (c < p.cols) hc[i] = add_unit<kVec>(p, r, c, ss);
    }
    for (int64_t c = tid + int64_t(kCache) * kThreads; c < p.cols; c += kThreads) add_unit<kVec>(p, r, c, ss);
    const float rs = rsqrtf(block_sum(ss, red) / float(p.N) + p.eps);
    if (p.rstd && tid == 0) p.rstd[r] = rs;
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int64_t c = tid + int64_t(i) * kThreads;
      if (c < p.cols) norm_unit<kVec>(p, r, c, hc[i], rs);
    }
    // Beyond the cache: h as this thread stored it above (same thread, program order).
    for (int64_t c = tid + int64_t(kCache) * kThreads; c < p.cols; c += kThreads)
      norm_unit<kVec>(p, r, c, load<kVec>(p.h, p.ldh, r, c, p.N), rs);
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) add_rmsnorm_fwd(const AddRmsNormFwdParams p) {
  __shared__ float red[kWarps];
  if (p.vec) run_fwd<true>(p, red);
  else run_fwd<false>(p, red);
}

#elif defined(FLY_DIR_IS_BWD)

// sum over the unit of g * hh = dy * w * h * rstd
__device__ __forceinline__ float dot_unit(const Unit<kV>& dy, const Unit<kV>& h, const float (&w)[kV], float rs) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kV; ++i) s += fly::to_float(dy.e[i]) * w[i] * (fly::to_float(h.e[i]) * rs);
  return s;
}
// dx of one unit; dw[] gets dy * hh added.
template <bool kVec>
__device__ __forceinline__ void dx_unit(const AddRmsNormBwdParams& p, int64_t r, int64_t c, const Unit<kV>& dy,
                                        const Unit<kV>& h, float rs, float c1, float (&dw)[kV]) {
  float w[kV];
  weight<kVec>(p.w, c, p.N, w);
  Unit<kV> dh;
  if (p.dh) dh = load<kVec>(p.dh, p.lddh, r, c, p.N);
  Unit<kV> dx;
#pragma unroll
  for (int i = 0; i < kV; ++i) {
    const float d = fly::to_float(dy.e[i]), hh = fly::to_float(h.e[i]) * rs;
    float v = rs * (d * w[i] - hh * c1);
    if (p.dh) v += fly::to_float(dh.e[i]);
    dx.e[i] = fly::from_float<T>(v);
    dw[i] += d * hh;
  }
  store<kVec>(p.dx, p.lddx, r, c, p.N, dx);
}

template <bool kVec, bool kFits>
__device__ __forceinline__ void run_bwd(const AddRmsNormBwdParams& p, float* red) {
  constexpr int kU = kFits ? kCache : 1;
  const int64_t tid = threadIdx.x;
  Unit<kV> dyc[kU], hc[kU];
  float dwa[kU][kV];
#pragma unroll
  for (int i = 0; i < kU; ++i)
#pragma unroll
    for (int e = 0; e < kV; ++e) dwa[i][e] = 0.f;
  float* part = p.partial ? p.partial + int64_t(blockIdx.x) * p.N : nullptr;
  bool first = true;
  for (int64_t r = blockIdx.x; r < p.M; r += gridDim.x) {
    const float rs = p.rstd[r];
    float s = 0.f;
    if constexpr (kFits) {
#pragma unroll
      for (int i = 0; i < kU; ++i) {
        const int64_t c = tid + int64_t(i) * kThreads;
        if (c < p.cols) {
          dyc[i] = load<kVec>(p.dy, p.lddy, r, c, p.N);
          hc[i] = load<kVec>(p.h, p.ldh, r, c, p.N);
          float w[kV];
          weight<kVec>(p.w, c, p.N, w);
          s += dot_unit(dyc[i], hc[i], w, rs);
        }
      }
    } else {
      for (int64_t c = tid; c < p.cols; c += kThreads) {
        float w[kV];
        weight<kVec>(p.w, c, p.N, w);
        s += dot_unit(load<kVec>(p.dy, p.lddy, r, c, p.N), load<kVec>(p.h, p.ldh, r, c, p.N), w, rs);
      }
    }
    const float c1 = block_sum(s, red) / float(p.N);
    if constexpr (kFits) {
#pragma unroll
      for (int i = 0; i < kU; ++i) {
        const int64_t c = tid + int64_t(i) * kThreads;
        if (c < p.cols) dx_unit<kVec>(p, r, c, dyc[i], hc[i], rs, c1, dwa[i]);
      }
    } else {
      // Second pass: dy and h again (this thread's own elements: a dx written in place of dy
      // replaces only what this thread has read already).
      for (int64_t c = tid; c < p.cols; c += kThreads) {
        float dw[kV];
#pragma unroll
        for (int e = 0; e < kV; ++e) dw[e] = 0.f;
        dx_unit<kVec>(p, r, c, load<kVec>(p.dy, p.lddy, r, c, p.N), load<kVec>(p.h, p.ldh, r, c, p.N), rs, c1, dw);
        if (part) {
#pragma unroll
          for (int e = 0; e < kV; ++e) {
            const int64_t j = c * kV + e;
            if (j < p.N) part[j] = first ? dw[e] : part[j] + dw[e];
          }
        }
      }
    }
    first = false;
  }
  if constexpr (kFits) {
    if (part) {
#pragma unroll
      for (int i = 0; i < kU; ++i) {
        const int64_t c = tid + int64_t(i) * kThreads;
        if (c < p.cols) {
#pragma unroll
          for (int e = 0; e < kV; ++e) {
            const int64_t j = c * kV + e;
            if (j < p.N) part[j] = dwa[i][e];
          }
        }
      }
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) add_rmsnorm_bwd(const AddRmsNormBwdParams p) {
  __shared__ float red[kWarps];
  const bool fits = p.cols <= int64_t(kThreads) * kCache;
  if (p.vec) {
    if (fits) run_bwd<true, true>(p, red);
    else run_bwd<true, false>(p, red);
  } else {
    if (fits) run_bwd<false, true>(p, red);
    else run_bwd<false, false>(p, red);
  }
}

// dweight[c] = the sum over the partial rows, in a fixed order: slice j of a column adds rows
// j, j + 8, ..., then slice sums are added in slice order.
extern "C" __global__ void __launch_bounds__(kDwThreads) add_rmsnorm_dw(const AddRmsNormDwParams p) {
  __shared__ float red[kDwSlices][kDwCols];
  const int col = threadIdx.x % kDwCols, slice = threadIdx.x / kDwCols;
  const int64_t c = int64_t(blockIdx.x) * kDwCols + col;
  float s = 0.f;
  if (c < p.N)
    for (int k = slice; k < p.parts; k += kDwSlices) s += p.partial[int64_t(k) * p.N + c];
  red[slice][col] = s;
  __syncthreads();
  if (slice == 0 && c < p.N) {
    float t = 0.f;
#pragma unroll
    for (int j = 0; j < kDwSlices; ++j) t += red[j][col];
    static_cast<T*>(p.dw)[c] = fly::from_float<T>(t);
  }
}

#else
#error "add_rmsnorm: FLY_DIR_IS_* not defined"
#endif
