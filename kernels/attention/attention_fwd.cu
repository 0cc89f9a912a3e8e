// SPDX-License-Identifier: Apache-2.0
// Attention forward for sm_90a (one variant per compile unit; constants from tools/flygen):
// warpgroup 0 is the producer (one thread issues TMA loads of Q once and of K/V tiles through an
// ST-deep mbarrier ring), warpgroups 1..NWG each own 64 query rows: S = Q K^T by SS wgmma, mask,
// online softmax in registers, O += P V by RS wgmma with P straight from S's accumulators.
// FLY_OV = 1 overlaps each tile's softmax with the previous tile's P V product (consumer_overlap).
// A second kernel merges the per-split partials of a split-key launch (flash-decoding).
#include <type_traits>

#include "attention/attention_params.h"
#include "attention/attention_plan.h"
#include "attention/attention_scheduler.cuh"
#include "attention/attention_tiles.cuh"

#ifndef FLY_HD  // a standalone compile (ptxas -v checks): one bf16 head-dim-128 variant
#define FLY_HD 128
#define FLY_M 128
#define FLY_N 128
#define FLY_ST 2
#define FLY_DTYPE_IS_BF16 1
#define FLY_OV 1
#endif
#ifndef FLY_DTYPE_IS_BF16
#define FLY_DTYPE_IS_BF16 0
#endif
#ifndef FLY_MC  // wide variants: 2 = may run as multicast clusters of 2 CTAs (p.cluster)
#define FLY_MC 1
#endif
#ifndef FLY_PP  // 1: the two consumer warpgroups take turns issuing their wgmma (PingPong below)
#define FLY_PP 0
#endif
#ifndef FLY_PS  // 1: persistent (a CTA per SM walks the tiles longest first, persistent_tile)
#define FLY_PS 0
#endif

namespace fly::attn {
namespace {

#if FLY_HD > 256
using Cfg = WideConfig<FLY_N, FLY_DTYPE_IS_BF16 != 0>;  // the wide-head schedule (consumer_wide)
static_assert(FLY_HD == 512 && FLY_M == 64 && FLY_ST == 1, "wide variants: hd 512, m 64, st 1");
#else
using Cfg = AttnConfig<FLY_HD, FLY_M / 64, FLY_N, FLY_ST, FLY_DTYPE_IS_BF16 != 0>;
#endif
using Regs = AttnRegSplit<Cfg::kNWG>;
static_assert(Cfg::kSmemBytes == attn_smem_bytes(FLY_HD, FLY_M, FLY_N, FLY_ST), "host and device smem sizes");
using Elem = typename std::conditional<Cfg::kBF16, __nv_bfloat16, __half>::type;
#if FLY_HD <= 256
static_assert(FLY_PP == 0 || (FLY_OV == 1 && Cfg::kNWG == 2), "ping-pong: the overlapped consumer, two warpgroups");
#else
static_assert(FLY_PP == 0, "ping-pong: not in the wide-head schedule");
static_assert(FLY_PS == 0, "persistent: not in the wide-head schedule");
#endif

struct Ring {
  uint64_t* q_full;
  uint64_t* k_full;  // [ST]
  uint64_t* v_full;  // [ST]
  uint64_t* empty;   // [ST]: every consumer warp arrives once it has read the stage's K and V
  uint64_t* q_empty;  // persistent only: every consumer warp arrives once its products that read Q are done
};

// The producer's start on a tile, both schedules: prefetch the three maps, then the tile's Q
// (BM rows; packed GQA: box {64, Sq, group, 1}, rows g * Sq + s dense from row 0, chunks still BM
// rows apart) onto q_full.
__device__ __forceinline__ void load_q_tile(const AttnFwdParams& p, const TileCoord& t, uint8_t* sq, uint64_t* q_full) {
  sm90::tma_prefetch_desc(&p.tm_q);
  sm90::tma_prefetch_desc(&p.tm_k);
  sm90::tma_prefetch_desc(&p.tm_v);
  sm90::mbar_arrive_expect_tx(q_full, p.q_bytes);
  if (p.pack_gqa) {
#pragma unroll
    for (int c = 0; c < Cfg::kChunks; ++c)
      tma_load_4d(sq + c * Cfg::BM * 128, &p.tm_q, q_full, c * 64, 0, t.kv_head * p.group, t.batch);
  } else {
    load_tile<Cfg::kHD>(sq, &p.tm_q, q_full, Cfg::BM, t.m0, t.head_y, t.batch);
  }
}

#if FLY_HD <= 256
// g0: ring iterations before this tile (persistent CTAs continue the ring's stages and phases
// across their tiles; 0 otherwise).
__device__ __forceinline__ void producer(const AttnFwdParams& p, const TileCoord& t, uint8_t* smem, const Ring& r,
                                         int g0 = 0) {
  uint8_t* sq = smem;
  uint8_t* sk = smem + Cfg::kQBytes;
  uint8_t* sv = sk + Cfg::kST * Cfg::kKVBytes;
  load_q_tile(p, t, sq, r.q_full);
  for (int n = t.n_begin, it = g0; n < t.n_end; ++n, ++it) {
    const int stage = it % Cfg::kST;
    const uint32_t phase = (it / Cfg::kST) & 1;
    sm90::mbar_wait(&r.empty[stage], phase ^ 1);
    sm90::mbar_arrive_expect_tx(&r.k_full[stage], Cfg::kKVBytes);
    load_tile<Cfg::kHD>(sk + stage * Cfg::kKVBytes, &p.tm_k, &r.k_full[stage], Cfg::kBN, n * Cfg::kBN, t.kv_head,
                        t.batch);
    sm90::mbar_arrive_expect_tx(&r.v_full[stage], Cfg::kKVBytes);
    load_tile<Cfg::kHD>(sv + stage * Cfg::kKVBytes, &p.tm_v, &r.v_full[stage], Cfg::kBN, n * Cfg::kBN, t.kv_head,
                        t.batch);
  }
}

#endif  // FLY_HD <= 256

// Where the thread's two rows go: query head, position, validity.
struct RowMap {
  int head[2], pos[2];
  bool valid[2];
};

__device__ __forceinline__ RowMap map_rows(const AttnFwdParams& p, const TileCoord& t, int cw) {
  RowMap rm;
  const int tid = threadIdx.x % 128;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int v = t.m0 + cw * 64 + (tid / 32) * 16 + (tid % 32) / 4 + 8 * i;
    if (p.pack_gqa) {
      const int g = v / p.Sq;
      rm.pos[i] = v - g * p.Sq;
      rm.head[i] = t.kv_head * p.group + g;
      rm.valid[i] = g < p.group;
    } else {
      rm.pos[i] = v;
      rm.head[i] = t.head_y;
      rm.valid[i] = v < p.Sq;
    }
  }
  return rm;
}

// o: the thread's part of NC output columns starting at column col0 (the whole head dim, or a wide
// consumer's half); only the warpgroup with write_lse stores the LSE (split partials: the row's max
// and biased sum, the merge's exact weights). Values are clamped to the type's range (clamp_out).
template <int NC = Cfg::kHD>
__device__ __forceinline__ void store_output(const AttnFwdParams& p, const TileCoord& t, const RowMap& rm,
                                             const float (&o)[NC / 2], const float (&inv)[2],
                                             const float (&lse)[2], const float (&mrow)[2], const float (&tsum)[2],
                                             int col0 = 0, bool write_lse = true) {
  const int lane = threadIdx.x % 32;
  const int c0 = col0 + 2 * (lane % 4);
  if (p.splits > 1) {
    const int64_t rows = int64_t(p.B) * p.Hq * p.Sq;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (!rm.valid[i]) continue;
      const int64_t row = (int64_t(t.batch) * p.Hq + rm.head[i]) * p.Sq + rm.pos[i];
      float* dst = p.ws_o + (t.split * rows + row) * Cfg::kHD;
#pragma unroll
      for (int j = 0; j < NC / 8; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j + c0) = make_float2(o[4 * j + 2 * i] * inv[i], o[4 * j + 2 * i + 1] * inv[i]);
      if (write_lse && lane % 4 == 0)
        reinterpret_cast<float2*>(p.ws_ml)[t.split * rows + row] = make_float2(mrow[i], tsum[i]);
    }
    return;
  }
  constexpr float kMax = Cfg::kBF16 ? kBf16Max : kFp16Max;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!rm.valid[i]) continue;
    Elem* dst = static_cast<Elem*>(p.o) + t.batch * p.o_sb + rm.head[i] * p.o_sh + rm.pos[i] * p.o_ss;
#pragma unroll
    for (int j = 0; j < NC / 8; ++j) {
      const int col = 8 * j + c0;
      const float a = clamp_out(o[4 * j + 2 * i] * inv[i], kMax), b = clamp_out(o[4 * j + 2 * i + 1] * inv[i], kMax);
      if (p.o_vec2 && col + 1 < p.D) {
        *reinterpret_cast<uint32_t*>(dst + col) = pack2<Cfg::kBF16>(a, b);
      } else {
        if (col < p.D) dst[col] = Elem(a);
        if (col + 1 < p.D) dst[col + 1] = Elem(b);
      }
    }
    if (write_lse && p.lse && lane % 4 == 0)
      p.lse[t.batch * p.lse_sb + rm.head[i] * p.lse_sh + rm.pos[i] * p.lse_ss] = lse[i];
  }
}

// Split keys (splits > 1), fused merge: after a tile's consumers stored their partials, the CTA
// counts its arrival on the tile's counter (ws_cnt, zeroed by the launcher before the kernel); the
// last split of the tile to arrive merges every split's partial O and (max, sum) of the tile's rows
// into o and lse, one warp per row, in split order (the same sums whichever CTA merges), weights
// sum_s 2^((max_s - max) c) (split_weight: exact whatever the scores' magnitude, where weights from
// the splits' FP32 LSEs lost the sums once scores reach ~1e11); rows whose splits all saw nothing
// get O = 0, LSE = -inf. Classic
// last-block reduction: each thread's stores are fenced (gpu scope) before the CTA's arrival, the
// merging CTA fences after it and reads the partials through L2 (ld.global.cg).
// ctid / nthreads: the consumer thread's index and the consumer thread count (named barrier 5);
// flag: a word of the CTA's barrier area used to broadcast the arrival's result.
constexpr int kMergeBar = 5;
// The flag's word: 8-byte slot 30 of the 256-byte barrier area (attn_smem_bytes), past every ring's
// mbarriers (at most 2 + 3 kST of them).
constexpr int kMergeFlagBar = 30;
static_assert(2 + 3 * Cfg::kST <= kMergeFlagBar, "the merge flag is clear of the mbarriers");
__device__ __forceinline__ void merge_splits_if_last(const AttnFwdParams& p, const TileCoord& t, uint32_t* flag,
                                                     int ctid, int nthreads) {
  __threadfence();
  named_bar_sync(kMergeBar, nthreads);
  const int heads_y = p.pack_gqa ? p.Hkv : p.Hq;
  const int mb = t.m0 / Cfg::BM;
  if (ctid == 0) {
    uint32_t* cnt = p.ws_cnt + (int64_t(t.batch) * heads_y + t.head_y) * p.m_blocks + mb;
    const uint32_t before = atomicAdd(cnt, 1u);
    const uint32_t last = before == uint32_t(p.splits - 1) ? 1u : 0u;
    if (last) *cnt = 0u;  // every split has arrived: ready for the next launch on this workspace
    *flag = last;
  }
  named_bar_sync(kMergeBar, nthreads);
  const bool last = *flag != 0u;
  named_bar_sync(kMergeBar, nthreads);  // flag read by all before a later tile rewrites it
  if (!last) return;
  __threadfence();
  const int64_t rows = int64_t(p.B) * p.Hq * p.Sq;
  const int lane = ctid % 32;
  for (int r = ctid / 32; r < Cfg::BM; r += nthreads / 32) {
    const int v = t.m0 + r;
    int head, pos;
    if (p.pack_gqa) {
      const int g = v / p.Sq;
      if (g >= p.group) break;  // rows grow with r: the rest are past the group too
      pos = v - g * p.Sq;
      head = t.kv_head * p.group + g;
    } else {
      if (v >= p.Sq) break;
      pos = v;
      head = t.head_y;
    }
    const int64_t row = (int64_t(t.batch) * p.Hq + head) * p.Sq + pos;
    const float2 part = lane < p.splits ? __ldcg(reinterpret_cast<const float2*>(p.ws_ml) + lane * rows + row)
                                        : make_float2(-INFINITY, 0.f);
    float mx = part.x;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float w = split_weight(part.x, part.y, mx, p.scale_log2);  // 0 for a split without keys
    float sum = w;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float wn = sum > 0.f ? w / sum : 0.f;
    constexpr float kMax = Cfg::kBF16 ? kBf16Max : kFp16Max;
    Elem* dst = static_cast<Elem*>(p.o) + t.batch * p.o_sb + head * p.o_sh + pos * p.o_ss;
    for (int c0 = 0; c0 < p.D; c0 += 32) {  // whole-warp steps: the shuffles need every lane
      const int col = c0 + lane;
      float acc = 0.f;
      for (int sp = 0; sp < p.splits; ++sp) {
        const float ws = __shfl_sync(0xffffffffu, wn, sp);
        if (ws != 0.f && col < p.D) acc += ws * __ldcg(p.ws_o + (sp * rows + row) * Cfg::kHD + col);
      }
      if (col < p.D) dst[col] = Elem(clamp_out(acc, kMax));
    }
    if (lane == 0 && p.lse)
      p.lse[t.batch * p.lse_sb + head * p.lse_sh + pos * p.lse_ss] = row_lse(mx, sum, p.scale, p.prob_bias);
  }
}

#if FLY_HD <= 256
// g0 as in producer; qph: the parity of this tile's q_full phase (the CTA's tile count & 1).
__device__ __forceinline__ void consumer(const AttnFwdParams& p, const TileCoord& t, uint8_t* smem, const Ring& r,
                                         int cw, int g0 = 0, uint32_t qph = 0) {
  const uint32_t sq = sm90::smem_u32(smem) + cw * 64 * 128;  // this warpgroup's 64 rows of each chunk
  const uint32_t sk = sm90::smem_u32(smem) + Cfg::kQBytes;
  const uint32_t sv = sk + Cfg::kST * Cfg::kKVBytes;
  const RowMap rm = map_rows(p, t, cw);
  // Smallest query position among the warpgroup's rows: tiles past it need the causal mask.
  const int min_pos = p.pack_gqa ? 0 : t.m0 + cw * 64;

  float o[Cfg::kHD / 2];
#pragma unroll
  for (int i = 0; i < Cfg::kHD / 2; ++i) o[i] = 0.f;
  OnlineSoftmax sm(p.prob_bias);
  sm90::mbar_wait(r.q_full, qph);
  for (int n = t.n_begin, it = g0; n < t.n_end; ++n, ++it) {
    const int stage = it % Cfg::kST;
    const uint32_t phase = (it / Cfg::kST) & 1;
    const int n0 = n * Cfg::kBN;
    float s[Cfg::kBN / 2];
    sm90::mbar_wait(&r.k_full[stage], phase);
    mma_qk<Cfg>(s, sq, Cfg::BM, sk + stage * Cfg::kKVBytes);
    sm90::wgmma_wait<0>();
    fence_regs(s);
    if (n0 + Cfg::kBN > p.Sk || (p.causal && n0 + Cfg::kBN - 1 > min_pos)) mask_tile<Cfg::kBN>(s, n0, p.Sk, p.causal, rm.pos);
    float alpha[2];
    sm.step<Cfg::kBN>(s, p.scale_log2, alpha);
    scale_rows(o, alpha);
    uint32_t pf[Cfg::kBN / 16][4];
    pack_p<Cfg>(s, pf);
    sm90::mbar_wait(&r.v_full[stage], phase);
    mma_pv<Cfg>(o, pf, sv + stage * Cfg::kKVBytes);
    sm90::wgmma_wait<0>();
    fence_regs(o);
    if (threadIdx.x % 32 == 0) sm90::mbar_arrive(&r.empty[stage]);
  }
  if constexpr (FLY_PS != 0)
    if (threadIdx.x % 32 == 0) sm90::mbar_arrive(r.q_empty);  // every product reading Q is done
  float inv[2], lse[2], tsum[2];
  sm.finish(p.scale, inv, lse, tsum);
  store_output(p, t, rm, o, inv, lse, sm.m, tsum);
}

// FLY_PP = 1 (with FLY_OV = 1 and two consumer warpgroups): inter-warpgroup ping-pong. Each
// warpgroup's wgmma issue blocks (its first S, each S_{j+1} + P_j V_j pair, its last P V) alternate
// with the other's through two named barriers, warpgroup 0 first, so one warpgroup's softmax runs
// under the other's products instead of both exponentiating at once. Barrier kTurnBar + w is
// "warpgroup w may issue": w syncs on it (128 threads) and the other warpgroup arrives on it
// (128) once it has issued. Both warpgroups issue iters + 1 blocks of the same tile; warpgroup 1
// arrives once up front and skips its last arrive, so every barrier ends with no arrival pending.
constexpr int kTurnBar = 3;  // ids 3 and 4 (the wide schedule's 1 and 2 are not in these variants)
struct PingPong {
  int cw;
  __device__ __forceinline__ void start(int iters) const {
    if constexpr (FLY_PP != 0)
      if (cw == 1 && iters > 0) named_bar_arrive(kTurnBar, 256);
  }
  __device__ __forceinline__ void begin() const {
    if constexpr (FLY_PP != 0) named_bar_sync(kTurnBar + cw, 256);
  }
  __device__ __forceinline__ void end(bool last) const {
    if constexpr (FLY_PP != 0)
      if (!(last && cw == 1)) named_bar_arrive(kTurnBar + (cw ^ 1), 256);
  }
};

// The same with the softmax of key tile j + 1 under the P V product of tile j (FA3's intra-warpgroup
// overlap): S_{j+1} = Q K_{j+1}^T and O += P_j V_j are in flight together; S_{j+1} is exponentiated
// while P_j V_j still runs, and O is rescaled once that product has landed.
__device__ __forceinline__ void consumer_overlap(const AttnFwdParams& p, const TileCoord& t, uint8_t* smem,
                                                 const Ring& r, int cw, int g0 = 0, uint32_t qph = 0) {
  const uint32_t sq = sm90::smem_u32(smem) + cw * 64 * 128;
  const uint32_t sk = sm90::smem_u32(smem) + Cfg::kQBytes;
  const uint32_t sv = sk + Cfg::kST * Cfg::kKVBytes;
  const RowMap rm = map_rows(p, t, cw);
  const int min_pos = p.pack_gqa ? 0 : t.m0 + cw * 64;
  auto needs_mask = [&](int n0) { return n0 + Cfg::kBN > p.Sk || (p.causal && n0 + Cfg::kBN - 1 > min_pos); };

  float o[Cfg::kHD / 2];
#pragma unroll
  for (int i = 0; i < Cfg::kHD / 2; ++i) o[i] = 0.f;
  OnlineSoftmax sm(p.prob_bias);
  float inv[2], lse[2];
  const int iters = t.n_end - t.n_begin;
  const PingPong pp{cw};
  pp.start(iters);
  sm90::mbar_wait(r.q_full, qph);
  if (iters > 0) {
    uint32_t pf[Cfg::kBN / 16][4];
    float s[Cfg::kBN / 2];
    float alpha[2];
    const int s0 = g0 % Cfg::kST;
    sm90::mbar_wait(&r.k_full[s0], (g0 / Cfg::kST) & 1);
    pp.begin();
    mma_qk<Cfg>(s, sq, Cfg::BM, sk + s0 * Cfg::kKVBytes);
    pp.end(false);
    sm90::wgmma_wait<0>();
    fence_regs(s);
    if (needs_mask(t.n_begin * Cfg::kBN)) mask_tile<Cfg::kBN>(s, t.n_begin * Cfg::kBN, p.Sk, p.causal, rm.pos);
    sm.step<Cfg::kBN>(s, p.scale_log2, alpha);  // O is still zero: no rescale
    pack_p<Cfg>(s, pf);
    for (int it = 1; it < iters; ++it) {
      const int g = g0 + it;
      const int stage = g % Cfg::kST, prev = (g - 1) % Cfg::kST;
      const uint32_t phase = (g / Cfg::kST) & 1, prev_phase = ((g - 1) / Cfg::kST) & 1;
      const int n0 = (t.n_begin + it) * Cfg::kBN;
      sm90::mbar_wait(&r.k_full[stage], phase);
      pp.begin();
      mma_qk<Cfg>(s, sq, Cfg::BM, sk + stage * Cfg::kKVBytes);
      sm90::mbar_wait(&r.v_full[prev], prev_phase);
      mma_pv<Cfg>(o, pf, sv + prev * Cfg::kKVBytes);
      pp.end(false);
      sm90::wgmma_wait<1>();  // S of this tile is in; P V of the previous one may still run
      fence_regs(s);
      if (needs_mask(n0)) mask_tile<Cfg::kBN>(s, n0, p.Sk, p.causal, rm.pos);
      sm.step<Cfg::kBN>(s, p.scale_log2, alpha);
      sm90::wgmma_wait<0>();
      fence_regs(o);
      if (threadIdx.x % 32 == 0) sm90::mbar_arrive(&r.empty[prev]);
      scale_rows(o, alpha);
      pack_p<Cfg>(s, pf);  // pf was the in-flight product's operand until the wait above
    }
    const int last = (g0 + iters - 1) % Cfg::kST;
    sm90::mbar_wait(&r.v_full[last], ((g0 + iters - 1) / Cfg::kST) & 1);
    pp.begin();
    mma_pv<Cfg>(o, pf, sv + last * Cfg::kKVBytes);
    pp.end(true);
    sm90::wgmma_wait<0>();
    fence_regs(o);
    if (threadIdx.x % 32 == 0) sm90::mbar_arrive(&r.empty[last]);
  }
  if constexpr (FLY_PS != 0)
    if (threadIdx.x % 32 == 0) sm90::mbar_arrive(r.q_empty);  // every product reading Q is done
  float tsum[2];
  sm.finish(p.scale, inv, lse, tsum);
  store_output(p, t, rm, o, inv, lse, sm.m, tsum);
}

#endif  // FLY_HD <= 256

#if FLY_HD > 256
// ---- wide-head schedule (Cfg = WideConfig): see attention_tiles.cuh ----------------------------
struct WideRing {
  uint64_t* q_full;
  uint64_t* k_full;
  uint64_t* k_empty;  // every consumer warp arrives once its part of S = Q K^T has landed
  uint64_t* v_full;
  uint64_t* v_empty;  // ... once its P V product has landed
};

// Multicast clusters (FLY_MC 2, p.cluster): CTAs 2i and 2i + 1 own adjacent m blocks of one head.
// For the key tiles both need (it < shared), CTA rank r loads chunks 4r..4r+3 of each K / V tile
// into both CTAs; each empty barrier then collects the 8 local and the 8 peer warps (16), so a
// slot is refilled only when both CTAs have read it. Tiles only the longer (causal) CTA needs it
// loads alone; its warps then arrive twice locally. A padded CTA past m_blocks has no tiles.
struct WideCluster {
  bool on = false;
  uint32_t rank = 0;
  int shared = 0;  // key tiles both CTAs read
};

__device__ __forceinline__ int wide_n_end(const AttnFwdParams& p, int bx) {
  if (bx >= p.m_blocks) return 0;
  const int mb = p.causal ? p.m_blocks - 1 - bx : bx;
  const int last_pos = min((mb + 1) * Cfg::BM, p.Sq) - 1;
  const int kv_end = p.causal ? min(p.Sk, last_pos + 1) : p.Sk;
  return (kv_end + Cfg::kBN - 1) / Cfg::kBN;
}

__device__ __forceinline__ void load_kv_wide(uint8_t* dst, const CUtensorMap* map, uint64_t* bar, int row0,
                                             const TileCoord& t, const WideCluster& cl, int it) {
  if (FLY_MC == 2 && cl.on && it < cl.shared) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int ch = 4 * int(cl.rank) + c;
      tma_load_4d_multicast(dst + ch * Cfg::kBN * 128, map, bar, ch * 64, row0, t.kv_head, t.batch, 0x3);
    }
  } else {
    load_tile<Cfg::kHD>(dst, map, bar, Cfg::kBN, row0, t.kv_head, t.batch);
  }
}

// A consumer warp hands a K or V slot back (see WideCluster).
__device__ __forceinline__ void release_wide(uint64_t* bar, const WideCluster& cl, int it) {
  if (threadIdx.x % 32 != 0) return;
  sm90::mbar_arrive(bar);
  if (FLY_MC == 2 && cl.on) {
    if (it < cl.shared) sm90::mbar_arrive_cluster(bar, cl.rank ^ 1);
    else sm90::mbar_arrive(bar);
  }
}

__device__ __forceinline__ void producer_wide(const AttnFwdParams& p, const TileCoord& t, uint8_t* smem,
                                              const WideRing& r, const WideCluster& cl) {
  uint8_t* sq = smem;
  uint8_t* sk = smem + Cfg::kQBytes;
  uint8_t* sv = sk + Cfg::kKVBytes;
  load_q_tile(p, t, sq, r.q_full);
  for (int n = t.n_begin, it = 0; n < t.n_end; ++n, ++it) {
    const uint32_t phase = it & 1;
    sm90::mbar_wait(r.k_empty, phase ^ 1);
    sm90::mbar_arrive_expect_tx(r.k_full, Cfg::kKVBytes);  // all of it: half may come from the peer
    load_kv_wide(sk, &p.tm_k, r.k_full, n * Cfg::kBN, t, cl, it);
    sm90::mbar_wait(r.v_empty, phase ^ 1);
    sm90::mbar_arrive_expect_tx(r.v_full, Cfg::kKVBytes);
    load_kv_wide(sv, &p.tm_v, r.v_full, n * Cfg::kBN, t, cl, it);
  }
}

// Partial scores of this warpgroup's half of D plus the other's: thread t of both warpgroups holds
// the same fragment positions, so each writes its registers at [i][t] and reads the other's there.
// a + b == b + a bit for bit: both warpgroups end with identical scores, maxima and probabilities.
__device__ __forceinline__ void exchange_scores(float (&s)[Cfg::kBN / 2], float* xbuf, int cw) {
  const int tid = threadIdx.x % 128;
  float* mine = xbuf + cw * (64 * Cfg::kBN);
  const float* other = xbuf + (1 - cw) * (64 * Cfg::kBN);
#pragma unroll
  for (int i = 0; i < Cfg::kBN / 2; ++i) mine[i * 128 + tid] = s[i];
  named_bar_sync(1, 256);
#pragma unroll
  for (int i = 0; i < Cfg::kBN / 2; ++i) s[i] += other[i * 128 + tid];
  named_bar_sync(2, 256);  // both have read: the next tile may overwrite the buffers
}

// Consumer warpgroup cw (0, 1) of the wide schedule: columns [256 cw, 256 cw + 256) of O.
// FLY_OV = 1: S of tile j + 1 is issued before P V of tile j and exchanged / exponentiated while
// that product runs (the K and V tiles have separate slots, so both are resident).
__device__ __forceinline__ void consumer_wide(const AttnFwdParams& p, const TileCoord& t, uint8_t* smem,
                                              const WideRing& r, const WideCluster& cl, int cw) {
  using Half = Cfg::Half;
  const uint32_t base = sm90::smem_u32(smem);
  const uint32_t sq = base + cw * 4 * Cfg::BM * 128;  // chunks 4 cw .. 4 cw + 3 of each tile
  const uint32_t sk = base + Cfg::kQBytes + cw * 4 * Cfg::kBN * 128;
  const uint32_t sv = base + Cfg::kQBytes + Cfg::kKVBytes + cw * 4 * Cfg::kBN * 128;
  float* xbuf = reinterpret_cast<float*>(smem + Cfg::kXOffset);
  const RowMap rm = map_rows(p, t, 0);  // both warpgroups hold the same 64 rows
  const int min_pos = p.pack_gqa ? 0 : t.m0;
  auto needs_mask = [&](int n0) { return n0 + Cfg::kBN > p.Sk || (p.causal && n0 + Cfg::kBN - 1 > min_pos); };

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  OnlineSoftmax sm(p.prob_bias);
  float alpha[2];
  uint32_t pf[Cfg::kBN / 16][4];
  const int iters = t.n_end - t.n_begin;
  sm90::mbar_wait(r.q_full, 0);
  if constexpr (FLY_OV == 0) {
    for (int it = 0; it < iters; ++it) {
      const uint32_t phase = it & 1;
      const int n0 = (t.n_begin + it) * Cfg::kBN;
      float s[Cfg::kBN / 2];
      sm90::mbar_wait(r.k_full, phase);
      mma_qk<Half>(s, sq, Cfg::BM, sk);
      sm90::wgmma_wait<0>();
      fence_regs(s);
      release_wide(r.k_empty, cl, it);
      exchange_scores(s, xbuf, cw);
      if (needs_mask(n0)) mask_tile<Cfg::kBN>(s, n0, p.Sk, p.causal, rm.pos);
      sm.step<Cfg::kBN>(s, p.scale_log2, alpha);
      scale_rows(o, alpha);
      pack_p<Half>(s, pf);
      sm90::mbar_wait(r.v_full, phase);
      mma_pv<Half>(o, pf, sv);
      sm90::wgmma_wait<0>();
      fence_regs(o);
      release_wide(r.v_empty, cl, it);
    }
  } else if (iters > 0) {
    float s[Cfg::kBN / 2];
    sm90::mbar_wait(r.k_full, 0);
    mma_qk<Half>(s, sq, Cfg::BM, sk);
    sm90::wgmma_wait<0>();
    fence_regs(s);
    release_wide(r.k_empty, cl, 0);
    exchange_scores(s, xbuf, cw);
    if (needs_mask(t.n_begin * Cfg::kBN)) mask_tile<Cfg::kBN>(s, t.n_begin * Cfg::kBN, p.Sk, p.causal, rm.pos);
    sm.step<Cfg::kBN>(s, p.scale_log2, alpha);  // O is still zero: no rescale
    pack_p<Half>(s, pf);
    for (int it = 1; it < iters; ++it) {
      const uint32_t phase = it & 1, prev_phase = (it - 1) & 1;
      const int n0 = (t.n_begin + it) * Cfg::kBN;
      sm90::mbar_wait(r.k_full, phase);
      mma_qk<Half>(s, sq, Cfg::BM, sk);
      sm90::mbar_wait(r.v_full, prev_phase);
      mma_pv<Half>(o, pf, sv);
      sm90::wgmma_wait<1>();  // S of this tile is in; P V of the previous one may still run
      fence_regs(s);
      release_wide(r.k_empty, cl, it);
      exchange_scores(s, xbuf, cw);
      if (needs_mask(n0)) mask_tile<Cfg::kBN>(s, n0, p.Sk, p.causal, rm.pos);
      sm.step<Cfg::kBN>(s, p.scale_log2, alpha);
      sm90::wgmma_wait<0>();
      fence_regs(o);
      release_wide(r.v_empty, cl, it - 1);
      scale_rows(o, alpha);
      pack_p<Half>(s, pf);  // pf was the in-flight product's operand until the wait above
    }
    sm90::mbar_wait(r.v_full, (iters - 1) & 1);
    mma_pv<Half>(o, pf, sv);
    sm90::wgmma_wait<0>();
    fence_regs(o);
    release_wide(r.v_empty, cl, iters - 1);
  }
  float inv[2], lse[2], tsum[2];
  sm.finish(p.scale, inv, lse, tsum);
  store_output<256>(p, t, rm, o, inv, lse, sm.m, tsum, cw * 256, cw == 0);
}
#endif  // FLY_HD > 256

}  // namespace
}  // namespace fly::attn

using namespace fly::attn;

#if FLY_HD > 256
extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1) fly_attn_fwd(const __grid_constant__ AttnFwdParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Cfg::kBarOffset);
  const WideRing r{bars, bars + 1, bars + 2, bars + 3, bars + 4};
  const bool clustered = FLY_MC == 2 && p.cluster != 0;
  if (threadIdx.x == 0) {
    fly::sm90::mbar_init(r.q_full, 1);
    fly::sm90::mbar_init(r.k_full, 1);
    fly::sm90::mbar_init(r.v_full, 1);
    fly::sm90::mbar_init(r.k_empty, clustered ? 16 : 8);
    fly::sm90::mbar_init(r.v_empty, clustered ? 16 : 8);
    fly::sm90::fence_barrier_init();
  }
  if (clustered) fly::sm90::cluster_sync();  // the peer's barriers exist before any multicast
  else __syncthreads();
  TileCoord t = schedule_tile<Cfg::BM, Cfg::kBN>(p);
  WideCluster cl;
  if (clustered) {
    cl.on = true;
    cl.rank = fly::sm90::cluster_ctarank();
    if (int(blockIdx.x) >= p.m_blocks) {  // the padding CTA of an odd m_blocks: rows past Sq, no keys
      t.m0 = p.m_blocks * Cfg::BM;
      t.n_begin = t.n_end = 0;
    }
    cl.shared = min(t.n_end, wide_n_end(p, int(blockIdx.x ^ 1u)));
  }
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    Regs::producer();
    if (threadIdx.x < 32 && fly::sm90::elect_one()) producer_wide(p, t, smem, r, cl);
  } else {
    Regs::consumer();
    consumer_wide(p, t, smem, r, cl, wg - 1);
    if (p.splits > 1) merge_splits_if_last(p, t, reinterpret_cast<uint32_t*>(bars + kMergeFlagBar), threadIdx.x - 128, 256);
  }
  // No CTA leaves while its peer may still multicast into it or arrive on its barriers.
  if (clustered) fly::sm90::cluster_sync();
}
#else
extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1) fly_attn_fwd(const __grid_constant__ AttnFwdParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + Cfg::kBarOffset);
  Ring r{bars, bars + 1, bars + 1 + Cfg::kST, bars + 1 + 2 * Cfg::kST, bars + 1 + 3 * Cfg::kST};
  if (threadIdx.x == 0) {
    fly::sm90::mbar_init(r.q_full, 1);
    for (int s = 0; s < Cfg::kST; ++s) {
      fly::sm90::mbar_init(&r.k_full[s], 1);
      fly::sm90::mbar_init(&r.v_full[s], 1);
      fly::sm90::mbar_init(&r.empty[s], 4 * Cfg::kNWG);
    }
    if constexpr (FLY_PS != 0) fly::sm90::mbar_init(r.q_empty, 4 * Cfg::kNWG);
    fly::sm90::fence_barrier_init();
  }
  __syncthreads();
#if FLY_PS
  const int wg = threadIdx.x / 128;
  // Persistent: the same tile stream for the producer and the consumers; the ring's iteration count
  // g carries over, Q is reloaded per tile once the consumers have released the last one.
  const int total = attn_tile_count(p);
  if (wg == 0) {
    Regs::producer();
    if (threadIdx.x < 32 && fly::sm90::elect_one()) {
      int g = 0, k = 0;
      for (int L = int(blockIdx.x); L < total; L += int(gridDim.x), ++k) {
        const TileCoord t = persistent_tile<Cfg::BM, Cfg::kBN>(p, L);
        if (k > 0) fly::sm90::mbar_wait(r.q_empty, uint32_t(k - 1) & 1);
        producer(p, t, smem, r, g);
        g += t.n_end - t.n_begin;
      }
    }
  } else {
    Regs::consumer();
    int g = 0, k = 0;
    for (int L = int(blockIdx.x); L < total; L += int(gridDim.x), ++k) {
      const TileCoord t = persistent_tile<Cfg::BM, Cfg::kBN>(p, L);
      if constexpr (FLY_OV != 0) consumer_overlap(p, t, smem, r, wg - 1, g, uint32_t(k) & 1);
      else consumer(p, t, smem, r, wg - 1, g, uint32_t(k) & 1);
      if (p.splits > 1)
        merge_splits_if_last(p, t, reinterpret_cast<uint32_t*>(bars + kMergeFlagBar), threadIdx.x - 128, 128 * Cfg::kNWG);
      g += t.n_end - t.n_begin;
    }
  }
#else
  const TileCoord t = schedule_tile<Cfg::BM, Cfg::kBN>(p);
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    Regs::producer();
    if (threadIdx.x < 32 && fly::sm90::elect_one()) producer(p, t, smem, r);
  } else {
    Regs::consumer();
    if constexpr (FLY_OV != 0) consumer_overlap(p, t, smem, r, wg - 1);
    else consumer(p, t, smem, r, wg - 1);
    if (p.splits > 1)
      merge_splits_if_last(p, t, reinterpret_cast<uint32_t*>(bars + kMergeFlagBar), threadIdx.x - 128, 128 * Cfg::kNWG);
  }
#endif
}

#endif  // FLY_HD > 256

// The packed path's copy (src/ops/attention.cpp: Q, K or V whose strides or base TMA cannot take,
// copied to 16-byte lines in the workspace before the attention kernel): the shared line-packing
// kernel, fly_pack_lines_sm90.
#include "common/pack_lines.cuh"
