// SPDX-License-Identifier: Apache-2.0
// MoE router, one warp per token (docs/moe_route.md):
//   forward:  logits [T, E] -> the k best experts (ids) and their weights, in one pass: scores in
//             FP32 registers (softmax / sigmoid over E, or the raw logits with TOPK_FIRST), k
//             rounds of a warp argmax (ties to the lower id, NaN above every number), then the
//             scores of the k (softmax over them with TOPK_FIRST) and the renormalization.
//   backward: dlogits from dweights, recomputing the scores from the logits (nothing saved but
//             the ids): the chain through renorm, the selection (a constant) and the score.
// Expert e lives in lane e % 32, register e / 32 (coalesced row loads). PL registers per lane:
// E <= 32 * PL; the launcher picks the entry of PL in {2, 4, 8, 32} (one image, four bodies).
//
// Variant constants (tools/flygen): FLY_WPC, warps per CTA.
#include <math.h>

#include "moe_route/moe_common.cuh"

namespace {

constexpr int kWarps = FLY_WPC;
constexpr int kThreads = 32 * kWarps;
constexpr int kNone = 0x7fffffff;  // "no candidate" id: loses to every real one

// Whether (ka, ia) ranks before (kb, ib): NaN first, then larger, then the lower id.
__device__ __forceinline__ bool better(float ka, int ia, float kb, int ib) {
  if (ib == kNone) return ia != kNone;
  if (ia == kNone) return false;
  const bool na = isnan(ka), nb = isnan(kb);
  if (na != nb) return na;
  if (!na && ka != kb) return ka > kb;
  return ia < ib;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// The row's logits into registers (invalid slots: 0, never read as candidates) and, for softmax
// over E, the row max and the sum of exp(l - max).
template <int PL>
__device__ __forceinline__ void load_row(const MoeRouteParams& p, int64_t t, int lane, float (&l)[PL], float* m,
                                         float* z, bool softmax_all) {
  const int64_t base = t * p.ld_logits;
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    const int e = i * 32 + lane;
    l[i] = e < p.E ? moe::load_f(p.logits, p.logit_dtype, base + e) : 0.f;
    if (e < p.E) mx = fmaxf(mx, l[i]);
  }
  if (!softmax_all) return;
  mx = moe::warp_max(mx);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < PL; ++i)
    if (i * 32 + lane < p.E) s += expf(l[i] - mx);
  *m = mx;
  *z = moe::warp_sum(s);
}

template <int PL>
__device__ void route_fwd(const MoeRouteParams& p, int64_t t, int lane) {
  const bool topk_first = p.flags & kMoeTopkFirst, softmax = p.score == kMoeSoftmax;
  float l[PL], m = 0.f, z = 1.f;
  load_row<PL>(p, t, lane, l, &m, &z, softmax && !topk_first);
  // Ranking keys in place of the logits.
  if (!topk_first) {
#pragma unroll
    for (int i = 0; i < PL; ++i) l[i] = softmax ? expf(l[i] - m) / z : sigmoid(l[i]);
  }
  uint32_t taken = 0;
  float sel_key[PL];
  int sel_id[PL];
#pragma unroll
  for (int c = 0; c < PL; ++c) {
    sel_key[c] = 0.f;
    sel_id[c] = kNone;
  }
#pragma unroll
  for (int c = 0; c < PL; ++c) {
    if (c * 32 >= p.k) break;
    for (int s = 0; s < 32; ++s) {
      const int r = c * 32 + s;
      if (r >= p.k) break;
      float bk = 0.f;
      int bi = kNone;
#pragma unroll
      for (int i = 0; i < PL; ++i) {
        const int e = i * 32 + lane;
        if (e < p.E && !(taken >> i & 1u) && better(l[i], e, bk, bi)) {
          bk = l[i];
          bi = e;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ok = __shfl_xor_sync(0xffffffffu, bk, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ok, oi, bk, bi)) {
          bk = ok;
          bi = oi;
        }
      }
      if (lane == s) {
        sel_key[c] = bk;
        sel_id[c] = bi;
      }
      if (lane == (bi & 31)) {
#pragma unroll
        for (int i = 0; i < PL; ++i)
          if (i == (bi >> 5)) taken |= 1u << i;
      }
    }
  }
  // Scores of the selected (slot r = c * 32 + lane), then the weights.
  float sc[PL];
  if (topk_first && softmax) {
    const float mk = __shfl_sync(0xffffffffu, sel_key[0], 0);  // slot 0 holds the largest logit
    float zs = 0.f;
#pragma unroll
    for (int c = 0; c < PL; ++c) {
      sc[c] = c * 32 + lane < p.k ? expf(sel_key[c] - mk) : 0.f;
      zs += sc[c];
    }
    zs = moe::warp_sum(zs);
#pragma unroll
    for (int c = 0; c < PL; ++c) sc[c] /= zs;
  } else {
#pragma unroll
    for (int c = 0; c < PL; ++c) sc[c] = c * 32 + lane < p.k ? (topk_first ? sigmoid(sel_key[c]) : sel_key[c]) : 0.f;
  }
  if (p.flags & kMoeRenorm) {
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < PL; ++c) s += sc[c];
    s = moe::warp_sum(s);
#pragma unroll
    for (int c = 0; c < PL; ++c) sc[c] /= s;
  }
#pragma unroll
  for (int c = 0; c < PL; ++c) {
    const int r = c * 32 + lane;
    if (r < p.k) {
      moe::store_f(p.weights, p.weight_dtype, t * p.ld_weights + r, sc[c]);
      moe::store_id(p.ids, p.id_dtype, t * p.ld_ids + r, sel_id[c]);
    }
  }
}

template <int PL>
__device__ void route_bwd(const MoeRouteParams& p, int64_t t, int lane) {
  const bool topk_first = p.flags & kMoeTopkFirst, softmax = p.score == kMoeSoftmax;
  const bool softmax_all = softmax && !topk_first;
  float l[PL], m = 0.f, z = 1.f;
  load_row<PL>(p, t, lane, l, &m, &z, softmax_all);
  // The slots this lane owns: id, logit, score, dweight. Ids outside [0, E) (not the forward's)
  // contribute nothing and read nothing.
  int id[PL];
  float sl[PL], s[PL], dw[PL];
  float mk = -INFINITY;
#pragma unroll
  for (int c = 0; c < PL; ++c) {
    const int r = c * 32 + lane;
    id[c] = -1;
    sl[c] = 0.f;
    dw[c] = 0.f;
    if (r < p.k) {
      const int64_t e = moe::load_id(p.ids, p.id_dtype, t * p.ld_ids + r);
      if (e >= 0 && e < p.E) {
        id[c] = int(e);
        sl[c] = moe::load_f(p.logits, p.logit_dtype, t * p.ld_logits + e);
        dw[c] = moe::load_f(p.dweights, p.weight_dtype, t * p.ld_dweights + r);
        mk = fmaxf(mk, sl[c]);
      }
    }
  }
  if (topk_first && softmax) {
    mk = moe::warp_max(mk);
    float zs = 0.f;
#pragma unroll
    for (int c = 0; c < PL; ++c) {
      s[c] = id[c] >= 0 ? expf(sl[c] - mk) : 0.f;
      zs += s[c];
    }
    zs = moe::warp_sum(zs);
#pragma unroll
    for (int c = 0; c < PL; ++c) s[c] /= zs;
  } else {
#pragma unroll
    for (int c = 0; c < PL; ++c)
      s[c] = id[c] < 0 ? 0.f : softmax_all ? expf(sl[c] - m) / z : sigmoid(sl[c]);
  }
  // Through the renormalization: w = s / S, ds = (dw - <dw, w>) / S.
  float ds[PL];
  if (p.flags & kMoeRenorm) {
    float S = 0.f;
#pragma unroll
    for (int c = 0; c < PL; ++c) S += s[c];
    S = moe::warp_sum(S);
    float g = 0.f;
#pragma unroll
    for (int c = 0; c < PL; ++c) g += dw[c] * (s[c] / S);
    g = moe::warp_sum(g);
#pragma unroll
    for (int c = 0; c < PL; ++c) ds[c] = (dw[c] - g) / S;
  } else {
#pragma unroll
    for (int c = 0; c < PL; ++c) ds[c] = dw[c];
  }
  float C = 0.f;
#pragma unroll
  for (int c = 0; c < PL; ++c) C += ds[c] * s[c];
  C = moe::warp_sum(C);
  // The gradient at the selected logits, and the dense part (softmax over E: -p * C).
  float g[PL];
#pragma unroll
  for (int c = 0; c < PL; ++c) {
    if (id[c] < 0) g[c] = 0.f;
    else if (softmax_all) g[c] = ds[c] * s[c];
    else if (softmax) g[c] = s[c] * (ds[c] - C);
    else g[c] = ds[c] * s[c] * (1.f - s[c]);
  }
  float dl[PL];
#pragma unroll
  for (int i = 0; i < PL; ++i) dl[i] = softmax_all ? -(expf(l[i] - m) / z) * C : 0.f;
#pragma unroll
  for (int c = 0; c < PL; ++c) {
    if (c * 32 >= p.k) break;
    for (int sl_ = 0; sl_ < 32; ++sl_) {
      if (c * 32 + sl_ >= p.k) break;
      const int e = __shfl_sync(0xffffffffu, id[c], sl_);
      const float v = __shfl_sync(0xffffffffu, g[c], sl_);
      if (e >= 0 && lane == (e & 31)) {
#pragma unroll
        for (int i = 0; i < PL; ++i)
          if (i == (e >> 5)) dl[i] += v;
      }
    }
  }
  const int64_t base = t * p.ld_dlogits;
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    const int e = i * 32 + lane;
    if (e < p.E) moe::store_f(p.dlogits, p.logit_dtype, base + e, dl[i]);
  }
}

template <bool kFwd, int PL>
__device__ __forceinline__ void run(const MoeRouteParams& p) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  for (int64_t t = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5); t < p.T; t += warps) {
    if constexpr (kFwd) route_fwd<PL>(p, t, lane);
    else route_bwd<PL>(p, t, lane);
  }
}

}  // namespace

// One entry per register budget (each gets its own register allocation: the 32-register body
// would otherwise set the occupancy of every E): moe_route_{fwd,bwd}_pl{2,4,8,32}.
#define MOE_ROUTE_ENTRY(PL)                                                                              \
  extern "C" __global__ void __launch_bounds__(kThreads) moe_route_fwd_pl##PL(const MoeRouteParams p) { \
    run<true, PL>(p);                                                                                    \
  }                                                                                                      \
  extern "C" __global__ void __launch_bounds__(kThreads) moe_route_bwd_pl##PL(const MoeRouteParams p) { \
    run<false, PL>(p);                                                                                   \
  }
MOE_ROUTE_ENTRY(2)
MOE_ROUTE_ENTRY(4)
MOE_ROUTE_ENTRY(8)
MOE_ROUTE_ENTRY(32)
