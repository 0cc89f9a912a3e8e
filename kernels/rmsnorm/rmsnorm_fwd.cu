// SPDX-License-Identifier: Apache-2.0
// RMSNorm forward: y = x * rsqrt(mean(x^2) + eps) * w, one row per group of kTpr threads.
//
// Variant constants (tools/flygen): FLY_DTYPE_IS_{FP16,BF16,FP32}, FLY_TPR (threads per row),
// FLY_RPC (rows in flight per CTA), FLY_CACHE (16-byte vectors per thread kept in registers),
// FLY_PF (1: load the group's next row into registers while finishing this one; >= 2: a ring of
// that many row slots in shared memory per group, filled by cp.async.bulk (TMA) ahead of use).
//
// Memory plan: a row whose aligned body fits in kTpr * kCache vectors is read once into
// registers, reduced, scaled and written (one HBM read + one write per element). Longer rows take
// a two-pass path (the second read mostly hits L2). Rows need not be 16-byte aligned: each row
// has a scalar head up to its first 16-byte boundary, a vector body and a scalar tail. Rows of
// one alignment class share the weight's shifted view, which each thread loads once into
// registers, because the grid walks rows class by class.
#include "common/pipeline.cuh"
#include "common/sm90.h"
#include "common/vec.cuh"
#include "common/variant_elem.cuh"
#include "rmsnorm/rmsnorm_params.h"

using T = fly::VariantElem;

namespace {

struct Config {
  static constexpr int kTpr = FLY_TPR;
  static constexpr int kRpc = FLY_RPC;
  static constexpr int kCache = FLY_CACHE;
  static constexpr int kThreads = kTpr * kRpc;
  static constexpr int kV = fly::Vec16<T>::kElems;
  static constexpr int kWarps = kTpr / 32;
  static_assert(kTpr % 32 == 0 && kTpr >= 32 && kTpr <= 1024, "threads per row: a multiple of 32");
  static_assert(kThreads <= 1024, "CTA too large");
  static_assert(kTpr == 32 || kRpc <= 15, "one named barrier per row group (ids 1..15)");
  static_assert(kCache >= 1 && kCache <= 16, "register cache of 1..16 vectors per thread");
  // NOTE: the shifted weight stays in registers only when the register budget under
  // __launch_bounds__ (65536 / threads) leaves room for both caches; otherwise each row reloads
  // it (an L1/L2 hit: it is the same N elements for every row).
  static constexpr bool kPrefetch = FLY_PF == 1;
  // NOTE: the ring keeps kRing rows per group in flight without registers: the register-prefetch
  // variants need twice the row cache (~120 registers, one CTA per SM) for one row ahead.
  static constexpr int kRing = FLY_PF >= 2 ? FLY_PF : 0;
  static constexpr bool kWeightInRegs = 65536 / kThreads >= (kPrefetch ? 12 : 8) * kCache + 40;
};

// Sum over the row group; `red` holds two slots (alternating by row) so one barrier per row
// suffices: a group cannot rewrite a slot before every thread has passed the next row's barrier.
__device__ __forceinline__ float group_sum(float v, float* red, int lane, int group, int parity) {
  v = fly::warp_sum(v);
  if constexpr (Config::kWarps == 1) {
    return v;
  } else {
    float* slot = red + parity * Config::kWarps;
    if ((lane & 31) == 0) slot[lane >> 5] = v;
    fly::named_bar_sync(1 + group, Config::kTpr);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < Config::kWarps; ++i) s += slot[i];
    return s;
  }
}

__device__ __forceinline__ float weight_at(const T* w, int i) {
  return w ? fly::to_float(w[i]) : 1.f;
}

// kV weights starting at element i: one 16-byte load where aligned, scalars otherwise.
__device__ __forceinline__ fly::Vec16<T> weight_vec(const T* w, int i, bool aligned) {
  fly::Vec16<T> v;
  if (!w) {
#pragma unroll
    for (int e = 0; e < fly::Vec16<T>::kElems; ++e) v.e[e] = fly::from_float<T>(1.f);
  } else if (aligned) {
    v.raw = fly::ld16(w + i);
  } else {
#pragma unroll
    for (int e = 0; e < fly::Vec16<T>::kElems; ++e) v.e[e] = w[i + e];
  }
  return v;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(Config::kThreads)
rmsnorm_fwd(const RmsNormParams p) {
  constexpr int kV = Config::kV;
  constexpr int kTpr = Config::kTpr;
  constexpr int kCache = Config::kCache;
  __shared__ float red_all[Config::kRpc][2][Config::kWarps];

  const int group = threadIdx.x / kTpr;
  const int lane = threadIdx.x % kTpr;
  const int64_t g = int64_t(blockIdx.x) * Config::kRpc + group;
  if (g >= p.groups) return;  // whole groups leave together, so named barriers stay matched
  float* red = &red_all[group][0][0];

  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);
  T* y = static_cast<T*>(p.y);
  const int64_t N = p.N;

  // This group's alignment class and the row layout shared by all its rows.
  const int cls = int(g % p.period);
  const int64_t first_row = cls + int64_t(p.period) * (g / p.period);
  const uintptr_t row0 = reinterpret_cast<uintptr_t>(x + int64_t(cls) * p.ldx);
  // NOTE: in-row offsets are 32-bit (the launcher guarantees N < 2^31): 64-bit offsets for every
  // cached vector cost registers that the row cache needs.
  const int n = int(N);
  int head = p.vec_io ? int(((16 - (row0 & 15)) & 15) / sizeof(T)) : n;
  if (head > n) head = n;
  const int nvec = (n - head) / kV;
  const int tail0 = head + nvec * kV;
  const bool in_regs = nvec <= kTpr * kCache;

  const bool w_aligned = ((reinterpret_cast<uintptr_t>(w + head)) & 15) == 0;
  // The weight, shifted to this class's alignment, once per group (packed in T).
  constexpr int kWRegs = Config::kWeightInRegs ? kCache : 1;
  fly::Vec16<T> wv[kWRegs];
  if constexpr (Config::kWeightInRegs) {
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int j = lane + i * kTpr;
      if (in_regs && j < nvec) wv[i] = weight_vec(w, head + j * kV, w_aligned);
      else wv[i].raw = make_uint4(0, 0, 0, 0);
    }
  }

  const float inv_n = 1.f / float(N);
  auto load_row = [&](fly::Vec16<T>(&buf)[kCache], int64_t r) {
    const T* xb = x + r * p.ldx + head;
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int j = lane + i * kTpr;
      if (j < nvec) buf[i].raw = fly::ld16_stream(xb + j * kV);
      else buf[i].raw = make_uint4(0, 0, 0, 0);
    }
  };
  // ss plus the sum of squares of the cached row body (zero-filled past nvec).
  auto sum_squares = [&](const fly::Vec16<T>(&cur)[kCache], float ss) {
#pragma unroll
    for (int i = 0; i < kCache; ++i)
#pragma unroll
      for (int e = 0; e < kV; ++e) {
        const float f = fly::to_float(cur[i].e[e]);
        ss = fmaf(f, f, ss);
      }
    return ss;
  };
  // Scales the cached row body by rs and the weight and stores it to yr's body.
  auto store_cached = [&](fly::Vec16<T>(&cur)[kCache], float rs, T* yr) {
    // NOTE: re-converting the packed row to float is cheaper than holding the unpacked copy from
    // the sum of squares until here (it would double the row's registers); this pin keeps it packed.
#pragma unroll
    for (int i = 0; i < kCache; ++i)
      asm volatile("" : "+r"(cur[i].raw.x), "+r"(cur[i].raw.y), "+r"(cur[i].raw.z), "+r"(cur[i].raw.w));
    if constexpr (Config::kWeightInRegs) {
      // NOTE: keeps the weight packed across rows: without this the compiler hoists its
      // conversion to float out of the row loop, doubling the registers it occupies.
#pragma unroll
      for (int i = 0; i < kCache; ++i)
        asm volatile("" : "+r"(wv[i].raw.x), "+r"(wv[i].raw.y), "+r"(wv[i].raw.z), "+r"(wv[i].raw.w));
    }
#pragma unroll
    for (int i = 0; i < kCache; ++i) {
      const int j = lane + i * kTpr;
      if (j < nvec) {
        fly::Vec16<T> o;
        const fly::Vec16<T> wi =
            Config::kWeightInRegs ? wv[Config::kWeightInRegs ? i : 0] : weight_vec(w, head + j * kV, w_aligned);
#pragma unroll
        for (int e = 0; e < kV; ++e)
          o.e[e] = fly::from_float<T>(fly::to_float(cur[i].e[e]) * rs * fly::to_float(wi.e[e]));
        fly::st16_out(yr + head + j * kV, o.raw);
      }
    }
  };
  // One row: sum of squares, reduction, scaled store. With kPrefetch the next row of this group
  // is loaded into `nxt` before the reduction, so its loads are in flight while this row's
  // barrier and stores proceed.
  auto row = [&](fly::Vec16<T>(&cur)[kCache], fly::Vec16<T>(&nxt)[kCache], int64_t r, int parity) {
    const T* xr = x + r * p.ldx;
    T* yr = y + r * p.ldy;
    float ss = 0.f;
    if (in_regs) {
      if constexpr (!Config::kPrefetch) load_row(cur, r);
      ss = sum_squares(cur, ss);
      if constexpr (Config::kPrefetch)
        if (r + p.groups < p.M) load_row(nxt, r + p.groups);
    } else {
      for (int j = lane; j < nvec; j += kTpr) {
        fly::Vec16<T> v;
        v.raw = fly::ld16(xr + head + j * kV);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          const float f = fly::to_float(v.e[e]);
          ss = fmaf(f, f, ss);
        }
      }
    }
    for (int i = lane; i < head; i += kTpr) { const float f = fly::to_float(xr[i]); ss = fmaf(f, f, ss); }
    for (int i = tail0 + lane; i < n; i += kTpr) { const float f = fly::to_float(xr[i]); ss = fmaf(f, f, ss); }

    const float total = group_sum(ss, red, lane, group, parity);
    const float rs = rsqrtf(total * inv_n + p.eps);
    if (lane == 0 && p.rstd) p.rstd[r] = rs;

    if (in_regs) {
      store_cached(cur, rs, yr);
    } else {
      for (int j = lane; j < nvec; j += kTpr) {
        fly::Vec16<T> v, o;
        v.raw = fly::ld16(xr + head + j * kV);
        const fly::Vec16<T> wi = weight_vec(w, head + j * kV, w_aligned);
#pragma unroll
        for (int e = 0; e < kV; ++e)
          o.e[e] = fly::from_float<T>(fly::to_float(v.e[e]) * rs * fly::to_float(wi.e[e]));
        fly::st16_out(yr + head + j * kV, o.raw);
      }
    }
    for (int i = lane; i < head; i += kTpr)
      yr[i] = fly::from_float<T>(fly::to_float(xr[i]) * rs * weight_at(w, i));
    for (int i = tail0 + lane; i < n; i += kTpr)
      yr[i] = fly::from_float<T>(fly::to_float(xr[i]) * rs * weight_at(w, i));
  };

  if constexpr (Config::kRing > 0) if (in_regs && p.vec_io && p.stage_bytes > 0) {
    // Ring path (the launcher sets stage_bytes > 0 only when x and y share their alignment, every
    // row's body fits the register cache and the slots fit shared memory; otherwise the p0 path
    // below runs). The group's leader streams the 16-byte-aligned bodies of rows r, r + groups,
    // ... into kRing slots with cp.async.bulk; all threads wait on the slot's mbarrier and copy
    // their vectors into registers; after the group's reduction barrier (every thread has read
    // the slot) the leader refills it with the row kRing steps ahead. Head and tail elements
    // (fewer than one vector each) come from global memory, so no byte outside the row is read.
    extern __shared__ __align__(16) uint8_t ring_smem[];
    __shared__ uint64_t full_bar[Config::kRpc][Config::kRing > 0 ? Config::kRing : 1];
    uint8_t* slots = ring_smem + size_t(group) * Config::kRing * p.stage_bytes;
    uint64_t* bars = full_bar[group];
    const bool leader = lane == 0;
    const uint32_t body_bytes = uint32_t(nvec) * 16u;
    auto issue = [&](int64_t r, int slot) {
      fly::sm90::mbar_arrive_expect_tx(&bars[slot], body_bytes);
      if (body_bytes)
        fly::sm90::bulk_load(slots + size_t(slot) * p.stage_bytes, x + r * p.ldx + head, body_bytes, &bars[slot]);
    };
    if (leader) {
      for (int i = 0; i < Config::kRing; ++i) fly::sm90::mbar_init(&bars[i], 1);
      fly::sm90::fence_barrier_init();
      for (int i = 0; i < Config::kRing; ++i)
        if (first_row + int64_t(i) * p.groups < p.M) issue(first_row + int64_t(i) * p.groups, i);
    }
    if constexpr (Config::kWarps == 1) __syncwarp();
    else fly::named_bar_sync(1 + group, kTpr);  // barriers initialised before anyone waits

    fly::Vec16<T> cur[kCache];
    int slot = 0;
    uint32_t phase = 0;
    int parity = 0;
    for (int64_t r = first_row; r < p.M; r += p.groups, parity ^= 1) {
      // Head and tail hold fewer than kV <= kTpr elements each: one per lane at most, loaded
      // before the wait so their latency overlaps it.
      const T* xr = x + r * p.ldx;
      const bool has_h = lane < head, has_t = tail0 + lane < n;
      const float hv = has_h ? fly::to_float(xr[lane]) : 0.f;
      const float tv = has_t ? fly::to_float(xr[tail0 + lane]) : 0.f;
      fly::sm90::mbar_wait(&bars[slot], phase);
      const uint8_t* st = slots + size_t(slot) * p.stage_bytes;
#pragma unroll
      for (int i = 0; i < kCache; ++i) {
        const int j = lane + i * kTpr;
        if (j < nvec) cur[i].raw = *reinterpret_cast<const uint4*>(st + j * 16);
        else cur[i].raw = make_uint4(0, 0, 0, 0);
      }
      const float ss = sum_squares(cur, fmaf(hv, hv, tv * tv));
      const float total = group_sum(ss, red, lane, group, parity);
      if constexpr (Config::kWarps == 1) __syncwarp();  // group_sum has no barrier for one warp
      if (leader) {
        const int64_t rn = r + int64_t(Config::kRing) * p.groups;
        if (rn < p.M) {
          fly::sm90::fence_proxy_async_smem();  // our generic reads of the slot before TMA rewrites it
          issue(rn, slot);
        }
      }
      if (++slot == Config::kRing) { slot = 0; phase ^= 1; }

      const float rs = rsqrtf(total * inv_n + p.eps);
      if (leader && p.rstd) p.rstd[r] = rs;
      T* yr = y + r * p.ldy;
      store_cached(cur, rs, yr);
      if (has_h) yr[lane] = fly::from_float<T>(hv * rs * weight_at(w, lane));
      if (has_t) yr[tail0 + lane] = fly::from_float<T>(tv * rs * weight_at(w, tail0 + lane));
    }
    return;
  }

  // Two buffers (one when not prefetching) used alternately; the loop is unrolled by two so
  // every register array index stays a compile-time constant.
  fly::Vec16<T> bufA[kCache];
  if constexpr (Config::kPrefetch) {
    fly::Vec16<T> bufB[kCache];
    if (in_regs && first_row < p.M) load_row(bufA, first_row);
    for (int64_t r = first_row; r < p.M;) {
      row(bufA, bufB, r, 0);
      r += p.groups;
      if (r >= p.M) break;
      row(bufB, bufA, r, 1);
      r += p.groups;
    }
  } else {
    int parity = 0;
    for (int64_t r = first_row; r < p.M; r += p.groups, parity ^= 1) row(bufA, bufA, r, parity);
  }
}
