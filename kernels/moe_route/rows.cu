// SPDX-License-Identifier: Apache-2.0
// Row kernels of the MoE permutation (docs/moe_route.md), one CTA per row, grid-stride:
//   moe_gather:        x_perm[r] = x[pair_of[r] / k] for the valid rows r < offsets[E-1], zeros past
//                      them (a copy: 16-byte vectors where every row is aligned);
//   moe_combine:       y[t] = sum_j w[t, j] * src[row_of[t, j]] over valid rows, FP32 sums in slot
//                      order (unpermute; unit weights: the permute's backward);
//   moe_unpermute_bwd: dout_perm[row_of[t, j]] = w[t, j] * dy[t] and dw[t, j] = <dy[t], out_perm[row_of[t, j]]>
//                      (CTA reduction in a fixed order: deterministic).
// Every output element is written once (row_of is a permutation): no atomics.
//
// Variant constants (tools/flygen): FLY_TPB, threads per CTA.
#include <type_traits>

#include "common/vec.cuh"
#include "moe_route/moe_common.cuh"

namespace {

constexpr int kThreads = FLY_TPB;
constexpr int kWarps = kThreads / 32;

template <class T, int kE>
struct Unit {
  float f[kE];
};
template <class T, int kE>
__device__ __forceinline__ Unit<T, kE> load(const void* base, int64_t row, int64_t ld, int64_t u) {
  Unit<T, kE> r;
  const T* q = static_cast<const T*>(base) + row * ld + u * kE;
  if constexpr (kE * sizeof(T) == 16) {
    fly::Vec16<T> v;
    v.raw = *reinterpret_cast<const uint4*>(q);
#pragma unroll
    for (int i = 0; i < kE; ++i) r.f[i] = fly::to_float(v.e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kE; ++i) r.f[i] = fly::to_float(q[i]);
  }
  return r;
}
template <class T, int kE>
__device__ __forceinline__ void store(void* base, int64_t row, int64_t ld, int64_t u, const Unit<T, kE>& x) {
  T* q = static_cast<T*>(base) + row * ld + u * kE;
  if constexpr (kE * sizeof(T) == 16) {
    fly::Vec16<T> v;
#pragma unroll
    for (int i = 0; i < kE; ++i) v.e[i] = fly::from_float<T>(x.f[i]);
    *reinterpret_cast<uint4*>(q) = v.raw;
  } else {
#pragma unroll
    for (int i = 0; i < kE; ++i) q[i] = fly::from_float<T>(x.f[i]);
  }
}

// One copy unit: 16 bytes or one element of es bytes.
template <int kBytes>
struct Raw {
  using type = typename std::conditional<kBytes == 16, uint4, typename std::conditional<kBytes == 4, uint32_t, uint16_t>::type>::type;
};

template <int kBytes>
__device__ void gather(const MoeRowsParams& p) {
  using U = typename Raw<kBytes>::type;
  const int64_t total = min(int64_t(p.offsets[p.E - 1]), p.n_perm);
  // ld in elements; a unit is kBytes: convert to units (the launcher made them divisible).
  const int es = p.dtype == kMoeF32 ? 4 : 2;
  const int64_t ld_src = p.ld_src * es / kBytes, ld_dst = p.ld_dst * es / kBytes;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    U* d = static_cast<U*>(p.dst) + r * ld_dst;
    const int64_t t = r < total ? p.pair_of[r] / p.k : -1;
    if (t >= 0 && t < p.n_tok) {
      const U* s = static_cast<const U*>(p.src) + t * ld_src;
      for (int64_t u = threadIdx.x; u < p.units; u += kThreads) d[u] = s[u];
    } else {
      for (int64_t u = threadIdx.x; u < p.units; u += kThreads) d[u] = U{};
    }
  }
}

// s_row, s_w: the token's slot table, shared memory of the entry (one copy for every dtype body).
template <class T, int kE>
__device__ void combine(const MoeRowsParams& p, int* s_row, float* s_w) {
  const int64_t total = min(int64_t(p.offsets[p.E - 1]), p.n_perm);
  for (int64_t t = blockIdx.x; t < p.rows; t += gridDim.x) {
    __syncthreads();  // the previous token's table is read
    for (int j = threadIdx.x; j < p.k; j += kThreads) {
      const int r = p.row_of[t * p.ld_row + j];
      const bool ok = r >= 0 && r < total;
      s_row[j] = ok ? r : -1;
      s_w[j] = !ok ? 0.f : p.w ? moe::load_f(p.w, p.w_dtype, t * p.ld_w + j) : 1.f;
    }
    __syncthreads();
    for (int64_t u = threadIdx.x; u < p.units; u += kThreads) {
      Unit<T, kE> acc;
#pragma unroll
      for (int i = 0; i < kE; ++i) acc.f[i] = 0.f;
      for (int j = 0; j < p.k; ++j) {
        const int r = s_row[j];
        if (r < 0) continue;
        const Unit<T, kE> v = load<T, kE>(p.src, r, p.ld_src, u);
        const float w = s_w[j];
#pragma unroll
        for (int i = 0; i < kE; ++i) acc.f[i] += w * v.f[i];
      }
      store<T, kE>(p.dst, t, p.ld_dst, u, acc);
    }
  }
}

template <class T, int kE>
__device__ void unpermute_bwd(const MoeRowsParams& p, float* red) {
  const int64_t total = min(int64_t(p.offsets[p.E - 1]), p.n_perm);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t t = blockIdx.x; t < p.rows; t += gridDim.x) {
    for (int j = 0; j < p.k; ++j) {
      const int r = p.row_of[t * p.ld_row + j];
      const bool ok = r >= 0 && r < total;
      const float w = ok && p.w ? moe::load_f(p.w, p.w_dtype, t * p.ld_w + j) : ok ? 1.f : 0.f;
      float dot = 0.f;
      for (int64_t u = threadIdx.x; u < p.units; u += kThreads) {
        const Unit<T, kE> g = load<T, kE>(p.dy, t, p.ld_dy, u);
        Unit<T, kE> d;
        if (ok) {
          const Unit<T, kE> o = load<T, kE>(p.src, r, p.ld_src, u);
#pragma unroll
          for (int i = 0; i < kE; ++i) {
            dot += g.f[i] * o.f[i];
            d.f[i] = w * g.f[i];
          }
        } else {
#pragma unroll
          for (int i = 0; i < kE; ++i) d.f[i] = 0.f;
        }
        if (r >= 0 && r < p.n_perm) store<T, kE>(p.dst, r, p.ld_dst, u, d);
      }
      if (p.dw) {
        dot = moe::warp_sum(dot);
        if (lane == 0) red[warp] = dot;
        __syncthreads();
        if (threadIdx.x == 0) {
          float s = 0.f;
#pragma unroll
          for (int w2 = 0; w2 < kWarps; ++w2) s += red[w2];
          moe::store_f(p.dw, p.w_dtype, t * p.ld_dw + j, ok ? s : 0.f);
        }
        __syncthreads();
      }
    }
  }
}


}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) moe_gather(const MoeRowsParams p) {
  const int es = p.dtype == kMoeF32 ? 4 : 2;
  if (p.vec) gather<16>(p);
  else if (es == 4) gather<4>(p);
  else gather<2>(p);
}

#define MOE_BY_DTYPE(fn, ...)                               \
  do {                                                      \
    if (p.dtype == kMoeF32) {                               \
      if (p.vec) fn<float, 4>(p, __VA_ARGS__);              \
      else fn<float, 1>(p, __VA_ARGS__);                    \
    } else if (p.dtype == kMoeBF16) {                       \
      if (p.vec) fn<__nv_bfloat16, 8>(p, __VA_ARGS__);      \
      else fn<__nv_bfloat16, 1>(p, __VA_ARGS__);            \
    } else {                                                \
      if (p.vec) fn<__half, 8>(p, __VA_ARGS__);             \
      else fn<__half, 1>(p, __VA_ARGS__);                   \
    }                                                       \
  } while (0)

extern "C" __global__ void __launch_bounds__(kThreads) moe_combine(const MoeRowsParams p) {
  __shared__ int s_row[kMoeMaxK];
  __shared__ float s_w[kMoeMaxK];
  MOE_BY_DTYPE(combine, s_row, s_w);
}

extern "C" __global__ void __launch_bounds__(kThreads) moe_unpermute_bwd(const MoeRowsParams p) {
  __shared__ float red[kWarps];
  MOE_BY_DTYPE(unpermute_bwd, red);
}
