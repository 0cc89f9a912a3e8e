// SPDX-License-Identifier: Apache-2.0
// Attention backward for sm_90a (one variant per compile unit; constants from tools/flygen). See
// attention_bwd_params.h for the three kernels. Both main kernels follow the forward's structure
// (attention_fwd.cu): warpgroup 0 is the producer (one thread issues TMA loads through an
// mbarrier ring), the other warpgroups compute with wgmma through the forward's fragments
// (attention_tiles.cuh: mma_qk = SS product contracting the head dim, mma_pv = RS product with a
// register A operand and an MN-major B tile, pack_p = accumulator -> A fragment regroup).
//
// dK/dV kernel, transposed (a warpgroup's 64 rows are keys, the columns are the QM queries):
//   S^T = K Q^T, dP^T = V dO^T (mma_qk), P^T = exp2((S^T - A[col]) scale_log2 - LSE2[col]) (A = 0
//   but for rows fly_attn_bwd_pre recomputed exactly, attention_math.h bwd_prob_arg; 0 where causal
//   hides it or the query is padding), dV += P^T dO, dS^T = P^T (dP^T - Delta[col]),
//   dK += dS^T Q (mma_pv: dO and Q tiles as MN-major B operands). Wide heads (192, 256) split the
//   dK/dV columns over DS warpgroups that each recompute S^T and dP^T of the same 64 keys.
// dQ kernel (forward orientation): S = Q K^T, dP = dO V^T, dS = P (dP - Delta[row]), dQ += dS K.
#include <type_traits>

#include "attention/attention_bwd_params.h"
#include "attention/attention_tiles.cuh"

#ifndef FLY_HD  // a standalone compile (ptxas -v checks): one bf16 head-dim-128 variant
#define FLY_HD 128
#define FLY_KN 128
#define FLY_QM 64
#define FLY_MQ 128
#define FLY_NQ 128
#define FLY_DTYPE_IS_BF16 1
#endif
#ifndef FLY_DTYPE_IS_BF16
#define FLY_DTYPE_IS_BF16 0
#endif

namespace fly::attn {
namespace {

constexpr bool kBF16 = FLY_DTYPE_IS_BF16 != 0;
constexpr int HD = FLY_HD;
constexpr int KN = FLY_KN, QM = FLY_QM, MQ = FLY_MQ, NQ = FLY_NQ;
constexpr int ST = 2;
#if FLY_HD <= 256
constexpr int DS = bwd_dsplit(HD);
constexpr int PW = HD / DS;         // dK/dV columns per warpgroup
constexpr int KG = KN / 64;         // key groups of the dK/dV kernel
constexpr int NWG_KV = KG * DS;     // its consumer warpgroups
constexpr int NWG_Q = MQ / 64;      // consumer warpgroups of the dQ kernel
#else
// Wide-head schedule (hd 512; attention_bwd_params.h, docs/attention.md "Backward, D 257..512").
// dK/dV: a CTA owns KN = 64 keys and one of kSlices column slices (256 columns); its 2 consumer
// warpgroups each own PW = 128 dK/dV columns and compute the S^T / dP^T partials over their half of
// D (HalfS), exchanged through shared memory. dQ: 64 query rows, warpgroup w owns dQ columns
// [256 w, 256 w + 256) and the partial S / dP over the same half of D (HalfQ).
constexpr int kSlices = kBwdWideSlices;
constexpr int PW = HD / kSlices / 2;  // dK/dV columns per consumer warpgroup
constexpr int NWG_KV = 2;
constexpr int NWG_Q = 2;
#endif
// dK/dV: 24 / 240 with two consumer warpgroups, 24 / 256 with one; three fill the register file
// at 32 + 3 x 160.
using KvRegs = fly::RegSplit<NWG_KV, NWG_KV == 3 ? 32 : 24, NWG_KV == 3 ? 160 : NWG_KV == 2 ? 240 : 256>;
using QRegs = AttnRegSplit<NWG_Q>;
using Elem = typename std::conditional<kBF16, __nv_bfloat16, __half>::type;
constexpr float kLog2e = 1.4426950408889634f;
#if FLY_HD <= 256

// Fragment shapes reused from the forward: MathS contracts HD against QM columns; MathD is an
// RS product of PW output columns over QM rows of k; QCfg is the dQ kernel's tile.
using MathS = AttnConfig<HD, 1, QM, 1, kBF16>;
using MathD = AttnConfig<PW, 1, QM, 1, kBF16>;
using QCfg = AttnConfig<HD, NWG_Q, NQ, ST, kBF16>;
static_assert(KN == 64 || KN == 128, "dK/dV key block: 64 or 128");
static_assert(QM == 64 || QM == 128, "dK/dV query tile: 64 or 128");
static_assert(QM <= kBwdRowPad && MQ <= kBwdRowPad, "workspace rows padded for every tile");
static_assert(NWG_KV <= 3, "at most three consumer warpgroups");

constexpr int kKBytes = KN * HD * 2;    // resident K (and V)
constexpr int kQTBytes = QM * HD * 2;   // one streamed Q (and dO) tile
constexpr int kKvRing = 2 * kKBytes;    // offset of the Q/dO ring
constexpr int kKvBars = kKvRing + ST * 2 * kQTBytes;
constexpr int kKvSmem = kKvBars + 256 + 1024;
static_assert(kKvSmem == bwd_dkdv_smem_bytes(HD, KN, QM, ST), "host and device smem sizes (dK/dV)");
static_assert(kKvSmem <= 232448, "dK/dV shared memory over 227 KiB");
constexpr int kQBytesQ = MQ * HD * 2;   // resident Q (and dO) of the dQ kernel
constexpr int kQKVBytes = NQ * HD * 2;  // one streamed K (or V) tile
constexpr int kQRing = 2 * kQBytesQ;
constexpr int kQBars = kQRing + ST * 2 * kQKVBytes;
constexpr int kQSmem = kQBars + 256 + 1024;
static_assert(kQSmem == bwd_dq_smem_bytes(HD, MQ, NQ, ST), "host and device smem sizes (dQ)");
static_assert(kQSmem <= 232448, "dQ shared memory over 227 KiB");
#else
using HalfS = AttnConfig<256, 1, QM, 1, kBF16>;  // S^T / dP^T partial: 64 keys x QM queries over 256 of D
using MathD = AttnConfig<PW, 1, QM, 1, kBF16>;   // dV, dK += (64 x QM) x (QM x PW)
using HalfQ = AttnConfig<256, 1, NQ, 1, kBF16>;  // dQ: S / dP partial over 256 of D, dQ += (64 x NQ) x (NQ x 256)
static_assert(HD == kBwdWideHeadDim && KN == 64 && MQ == 64, "wide backward: hd 512, kn 64, mq 64");
static_assert(QM % 16 == 0 && QM <= 32 && NQ % 16 == 0 && NQ <= 32, "wide backward: qm, nq 16 or 32");
static_assert(PW == 128 && 2 * PW * kSlices == HD, "two warpgroups of 128 columns per slice");

constexpr int kKBytes = KN * HD * 2;    // resident K (and V)
constexpr int kQTBytes = QM * HD * 2;   // the Q (and dO) slot
constexpr int kWQ = 2 * kKBytes;        // Q slot
constexpr int kWDO = kWQ + kQTBytes;    // dO slot
constexpr int kWX = kWDO + kQTBytes;    // exchange: [warpgroup][S^T, dP^T][QM / 2 regs][128 threads]
constexpr int kKvBars = kWX + bwd_wide_xchg_bytes(QM);
constexpr int kKvSmem = kKvBars + 256 + 1024;
static_assert(kKvSmem == bwd_dkdv_smem_bytes(HD, KN, QM, ST), "host and device smem sizes (dK/dV)");
static_assert(kKvSmem <= 232448, "dK/dV shared memory over 227 KiB");
constexpr int kQBytesQ = MQ * HD * 2;   // resident Q (and dO) of the dQ kernel
constexpr int kQKVBytes = NQ * HD * 2;  // the K (and V) slot
constexpr int kQK = 2 * kQBytesQ;
constexpr int kQV = kQK + kQKVBytes;
constexpr int kQX = kQV + kQKVBytes;
constexpr int kQBars = kQX + bwd_wide_xchg_bytes(NQ);
constexpr int kQSmem = kQBars + 256 + 1024;
static_assert(kQSmem == bwd_dq_smem_bytes(HD, MQ, NQ, ST), "host and device smem sizes (dQ)");
static_assert(kQSmem <= 232448, "dQ shared memory over 227 KiB");
#endif

__device__ __forceinline__ uint8_t* align_smem(uint8_t* raw) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}

template <int N>
__device__ __forceinline__ void zero(float (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) a[i] = 0.f;
}

// Stores a 64-row accumulator block (fragment layout, N columns from col0) scaled by f into a
// [rows][D] tensor slice with strides (guards: row < nrows, column < D).
template <int N>
__device__ __forceinline__ void store_block(Elem* base, int64_t row_stride, int row0, int nrows, int col0, int D,
                                            const float (&acc)[N / 2], float f) {
  const int tid = threadIdx.x % 128;
  const int lane = tid % 32;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + (tid / 32) * 16 + lane / 4 + 8 * i;
    if (row >= nrows) continue;
    Elem* dst = base + row * row_stride;
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      const int col = col0 + 8 * j + 2 * (lane % 4);
      if (col < D) dst[col] = Elem(acc[4 * j + 2 * i] * f);
      if (col + 1 < D) dst[col + 1] = Elem(acc[4 * j + 2 * i + 1] * f);
    }
  }
}

// Query blocks a key block meets: causal skips the blocks whose queries all precede its first key.
__device__ __forceinline__ void kv_query_range(const AttnBwdParams& p, int n0, int& mb_begin, int& mb_end) {
  mb_end = (p.Sq + QM - 1) / QM;
  mb_begin = p.causal ? min(mb_end, n0 / QM) : 0;
}

__device__ __forceinline__ int dq_key_tiles(const AttnBwdParams& p, int m0) {
  const int last = min(m0 + MQ, p.Sq) - 1;
  const int kv_end = p.causal ? min(p.Sk, last + 1) : p.Sk;
  return (kv_end + NQ - 1) / NQ;
}

// FP16 inputs: dS = P (dP - Delta) is rounded to FP16 for the dK / dQ products, and |dS| can pass
// FP16's range where the outputs do not (large V or dO against small Q, K; issue 46): inf there,
// where an FP32 reference stays finite. Each accumulator row (the thread's two rows: keys in the
// dK/dV kernel, queries in the dQ kernel) keeps a power-of-two scale sig, 1 until a tile's
// max |dS| sig of the row reaches kDsLimit; then sig halves until it is below, the row's
// accumulator is rescaled by the same factor (exact), and from then on the row's dS are
// multiplied by sig before packing; finish() divides it back out before the store. While every
// sig of the warp is 1 and nothing reaches the limit (ordinary data) the tile costs one FMNMX per
// score, a quad reduction and a vote, and the results are bit for bit the unscaled ones. BF16 has
// FP32's range: compiled out.
constexpr float kDsLimit = 32768.f;
struct DsScale {
  float sig[2] = {1.f, 1.f};

  // ds: the tile's dS (fragment rows e >> 1, as acc's); acc: the row's accumulator, its previous
  // products landed.
  template <int N, int NA>
  __device__ __forceinline__ void apply(float (&ds)[N], float (&acc)[NA]) {
    if constexpr (!kBF16) {
      float mx[2] = {0.f, 0.f};
#pragma unroll
      for (int j = 0; j < N / 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], fabsf(ds[4 * j + e]));
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      }
      const bool need = mx[0] * sig[0] >= kDsLimit || mx[1] * sig[1] >= kDsLimit || sig[0] != 1.f || sig[1] != 1.f;
      if (!__any_sync(0xffffffffu, need)) return;
      slow(ds, acc, mx);
    }
  }

  template <int N, int NA>
  __device__ __forceinline__ void slow(float (&ds)[N], float (&acc)[NA], const float (&mx)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sn = sig[i];
      if (mx[i] < INFINITY)  // an inf / NaN dS overflowed FP32 itself (so does a reference): left alone
        while (mx[i] * sn >= kDsLimit) sn *= 0.5f;
      if (sn != sig[i]) {
        const float f = sn / sig[i];  // a power of two
#pragma unroll
        for (int j = 0; j < NA / 4; ++j) {
          acc[4 * j + 2 * i] *= f;
          acc[4 * j + 2 * i + 1] *= f;
        }
        sig[i] = sn;
      }
      if (sn != 1.f) {
#pragma unroll
        for (int j = 0; j < N / 4; ++j) {
          ds[4 * j + 2 * i] *= sn;
          ds[4 * j + 2 * i + 1] *= sn;
        }
      }
    }
  }

  // The accumulator back at its true scale (before the store).
  template <int NA>
  __device__ __forceinline__ void finish(float (&acc)[NA]) const {
    if constexpr (!kBF16) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (sig[i] != 1.f) {
          const float f = 1.f / sig[i];
#pragma unroll
          for (int j = 0; j < NA / 4; ++j) {
            acc[4 * j + 2 * i] *= f;
            acc[4 * j + 2 * i + 1] *= f;
          }
        }
    }
  }
};

// P^T and dS^T of a transposed tile in place: s (S^T) becomes P^T = exp2((S^T - A[col]) scale_log2 -
// LSE2[col]) (attention_math.h bwd_prob_arg; A = 0 but for rows the preprocessing recomputed), 0 where
// causal hides query m0 + col from the thread's keys; dp (dP^T) becomes P^T (dP^T - Delta[col]).
// l2s / dls / ams: the thread's column pairs' LSE2, Delta and A; kmax: the tile's last key (causal check).
__device__ __forceinline__ void p_ds_transposed(const AttnBwdParams& p, float (&s)[QM / 2], float (&dp)[QM / 2],
                                                const float2 (&l2s)[QM / 8], const float2 (&dls)[QM / 8],
                                                const float2 (&ams)[QM / 8], const int (&key)[2], int m0, int kmax,
                                                int lane) {
  const bool mask = p.causal && m0 < kmax;
#pragma unroll
  for (int j = 0; j < QM / 8; ++j) {
    const int c = 8 * j + 2 * (lane % 4);
    const float2 l2 = l2s[j], dl = dls[j], am = ams[j];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float lse2 = (e & 1) ? l2.y : l2.x;
      const float delta = (e & 1) ? dl.y : dl.x;
      const float a = (e & 1) ? am.y : am.x;
      float pr = ex2(bwd_prob_arg(s[4 * j + e], a, p.scale_log2, lse2));
      if (mask && key[e >> 1] > m0 + c + (e & 1)) pr = 0.f;
      s[4 * j + e] = pr;
      dp[4 * j + e] = pr * (dp[4 * j + e] - delta);
    }
  }
}

#if FLY_HD <= 256
// ---- dK / dV ----------------------------------------------------------------------------------
struct KvRing {
  uint64_t* kv_full;
  uint64_t* full;   // [ST]: Q, dO, LSE2, Delta of a stage
  uint64_t* empty;  // [ST]: every consumer warp arrives once done with the stage
};

__device__ __forceinline__ void dkdv_producer(const AttnBwdParams& p, uint8_t* smem, const KvRing& r, int n0, int kvh,
                                              int b) {
  sm90::tma_prefetch_desc(&p.tm_q_kv);
  sm90::tma_prefetch_desc(&p.tm_do_kv);
  sm90::mbar_arrive_expect_tx(r.kv_full, 2 * kKBytes);
  load_tile<HD>(smem, &p.tm_k_kv, r.kv_full, KN, n0, kvh, b);
  load_tile<HD>(smem + kKBytes, &p.tm_v_kv, r.kv_full, KN, n0, kvh, b);
  int mb_begin, mb_end;
  kv_query_range(p, n0, mb_begin, mb_end);
  int it = 0;
  for (int g = 0; g < p.group; ++g) {
    const int h = kvh * p.group + g;
    for (int mb = mb_begin; mb < mb_end; ++mb, ++it) {
      const int stage = it % ST;
      const uint32_t phase = (it / ST) & 1;
      sm90::mbar_wait(&r.empty[stage], phase ^ 1);
      uint8_t* sq = smem + kKvRing + stage * 2 * kQTBytes;
      sm90::mbar_arrive_expect_tx(&r.full[stage], 2 * kQTBytes);
      load_tile<HD>(sq, &p.tm_q_kv, &r.full[stage], QM, mb * QM, h, b);
      load_tile<HD>(sq + kQTBytes, &p.tm_do_kv, &r.full[stage], QM, mb * QM, h, b);
    }
  }
}

__device__ __forceinline__ void dkdv_consumer(const AttnBwdParams& p, uint8_t* smem, const KvRing& r, int n0, int kvh,
                                              int b, int w) {
  const int kg = w / DS, part = w % DS;
  const uint32_t base = sm90::smem_u32(smem);
  const uint32_t sk = base + kg * 64 * 128;            // this warpgroup's 64 keys of each K chunk
  const uint32_t sv = base + kKBytes + kg * 64 * 128;
  const int tid = threadIdx.x % 128, lane = tid % 32;
  const int key0 = n0 + kg * 64;
  int key[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) key[i] = key0 + (tid / 32) * 16 + lane / 4 + 8 * i;

  float dk[PW / 2], dv[PW / 2];
  zero(dk);
  zero(dv);
  DsScale dss;
  int mb_begin, mb_end;
  kv_query_range(p, n0, mb_begin, mb_end);
  const int per_head = mb_end - mb_begin;
  const int iters = per_head * p.group;
  sm90::mbar_wait(r.kv_full, 0);
  for (int it = 0; it < iters; ++it) {
    const int stage = it % ST;
    const uint32_t phase = (it / ST) & 1;
    const int m0 = (mb_begin + it % per_head) * QM;
    const uint32_t sq = base + kKvRing + stage * 2 * kQTBytes;
    const uint32_t sdo = sq + kQTBytes;
    // LSE2 and Delta of the tile's queries, read by each thread from the (L2-resident) workspace
    // while the two products run: plain loads of memory the previous kernel wrote.
    const int64_t rb = (int64_t(b) * p.Hq + kvh * p.group + it / per_head) * p.sq_pad + m0;
    const float2* lg = reinterpret_cast<const float2*>(p.ws_lse2 + rb) + lane % 4;
    const float2* dg = reinterpret_cast<const float2*>(p.ws_delta + rb) + lane % 4;
    const float2* ag = reinterpret_cast<const float2*>(p.ws_max + rb) + lane % 4;
    float s[QM / 2], dp[QM / 2];
    sm90::mbar_wait(&r.full[stage], phase);
    mma_qk<MathS>(s, sk, KN, sq);
    mma_qk<MathS>(dp, sv, KN, sdo);
    float2 l2s[QM / 8], dls[QM / 8], ams[QM / 8];
#pragma unroll
    for (int j = 0; j < QM / 8; ++j) {
      l2s[j] = __ldg(lg + 4 * j);  // columns 8 j + 2 (lane % 4) + {0, 1}
      dls[j] = __ldg(dg + 4 * j);
      ams[j] = __ldg(ag + 4 * j);
    }
    sm90::wgmma_wait<0>();
    fence_regs(s);
    fence_regs(dp);
    // P^T: column c of the tile is query m0 + c.
    p_ds_transposed(p, s, dp, l2s, dls, ams, key, m0, key0 + 63, lane);
    uint32_t pf[QM / 16][4], df[QM / 16][4];
    dss.apply(dp, dk);  // FP16: dS within FP16's range (the row's scale)
    pack_p<MathS>(s, pf);
    pack_p<MathS>(dp, df);
    mma_pv<MathD>(dv, pf, sdo + part * (PW / 64) * QM * 128);
    mma_pv<MathD>(dk, df, sq + part * (PW / 64) * QM * 128);
    sm90::wgmma_wait<0>();
    fence_regs(dv);
    fence_regs(dk);
    if (lane == 0) sm90::mbar_arrive(&r.empty[stage]);
  }
  Elem* gdk = static_cast<Elem*>(p.dk) + b * p.dk_s[0] + kvh * p.dk_s[1];
  Elem* gdv = static_cast<Elem*>(p.dv) + b * p.dv_s[0] + kvh * p.dv_s[1];
  dss.finish(dk);
  store_block<PW>(gdk, p.dk_s[2], key0, p.Sk, part * PW, p.D, dk, p.scale);
  store_block<PW>(gdv, p.dv_s[2], key0, p.Sk, part * PW, p.D, dv, 1.f);
}

// ---- dQ -----------------------------------------------------------------------------------------
struct QRing {
  uint64_t* q_full;
  uint64_t* k_full;  // [ST]
  uint64_t* v_full;  // [ST]
  uint64_t* empty;   // [ST]
};

__device__ __forceinline__ void dq_producer(const AttnBwdParams& p, uint8_t* smem, const QRing& r, int m0, int h,
                                            int b) {
  const int kvh = h / p.group;
  sm90::tma_prefetch_desc(&p.tm_k_dq);
  sm90::tma_prefetch_desc(&p.tm_v_dq);
  sm90::mbar_arrive_expect_tx(r.q_full, 2 * kQBytesQ);
  load_tile<HD>(smem, &p.tm_q_dq, r.q_full, MQ, m0, h, b);
  load_tile<HD>(smem + kQBytesQ, &p.tm_do_dq, r.q_full, MQ, m0, h, b);
  const int n_tiles = dq_key_tiles(p, m0);
  for (int n = 0; n < n_tiles; ++n) {
    const int stage = n % ST;
    const uint32_t phase = (n / ST) & 1;
    sm90::mbar_wait(&r.empty[stage], phase ^ 1);
    uint8_t* sk = smem + kQRing + stage * 2 * kQKVBytes;
    sm90::mbar_arrive_expect_tx(&r.k_full[stage], kQKVBytes);
    load_tile<HD>(sk, &p.tm_k_dq, &r.k_full[stage], NQ, n * NQ, kvh, b);
    sm90::mbar_arrive_expect_tx(&r.v_full[stage], kQKVBytes);
    load_tile<HD>(sk + kQKVBytes, &p.tm_v_dq, &r.v_full[stage], NQ, n * NQ, kvh, b);
  }
}

__device__ __forceinline__ void dq_consumer(const AttnBwdParams& p, uint8_t* smem, const QRing& r, int m0, int h,
                                            int b, int w) {
  const uint32_t base = sm90::smem_u32(smem);
  const uint32_t sq = base + w * 64 * 128;
  const uint32_t sdo = base + kQBytesQ + w * 64 * 128;
  const int tid = threadIdx.x % 128, lane = tid % 32;
  const int row0 = m0 + w * 64;
  int pos[2];
  float lse2[2], delta[2], amax[2];
  const int64_t row_base = (int64_t(b) * p.Hq + h) * p.sq_pad;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    pos[i] = row0 + (tid / 32) * 16 + lane / 4 + 8 * i;  // < sq_pad: the workspace is padded
    lse2[i] = p.ws_lse2[row_base + pos[i]];
    delta[i] = p.ws_delta[row_base + pos[i]];
    amax[i] = p.ws_max[row_base + pos[i]];
  }
  float dq[HD / 2];
  zero(dq);
  DsScale dss;
  const int n_tiles = dq_key_tiles(p, m0);
  sm90::mbar_wait(r.q_full, 0);
  for (int n = 0; n < n_tiles; ++n) {
    const int stage = n % ST;
    const uint32_t phase = (n / ST) & 1;
    const uint32_t sk = base + kQRing + stage * 2 * kQKVBytes;
    const uint32_t sv = sk + kQKVBytes;
    const int n0 = n * NQ;
    float s[NQ / 2], dp[NQ / 2];
    sm90::mbar_wait(&r.k_full[stage], phase);
    mma_qk<QCfg>(s, sq, MQ, sk);
    sm90::mbar_wait(&r.v_full[stage], phase);
    mma_qk<QCfg>(dp, sdo, MQ, sv);
    sm90::wgmma_wait<0>();
    fence_regs(s);
    fence_regs(dp);
    if (n0 + NQ > p.Sk || (p.causal && n0 + NQ - 1 > row0)) mask_tile<NQ>(s, n0, p.Sk, p.causal, pos);
#pragma unroll
    for (int j = 0; j < NQ / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pr = ex2(bwd_prob_arg(s[4 * j + e], amax[e >> 1], p.scale_log2, lse2[e >> 1]));
        dp[4 * j + e] = pr * (dp[4 * j + e] - delta[e >> 1]);
      }
    dss.apply(dp, dq);  // FP16: dS within FP16's range (the row's scale)
    uint32_t df[NQ / 16][4];
    pack_p<QCfg>(dp, df);
    mma_pv<QCfg>(dq, df, sk);  // K as the MN-major B operand (as V in the forward's P V)
    sm90::wgmma_wait<0>();
    fence_regs(dq);
    if (lane == 0) sm90::mbar_arrive(&r.empty[stage]);
  }
  Elem* gdq = static_cast<Elem*>(p.dq) + b * p.dq_s[0] + h * p.dq_s[1];
  dss.finish(dq);
  store_block<HD>(gdq, p.dq_s[2], row0, p.Sq, 0, p.D, dq, p.scale);
}

#else
// ---- wide-head schedule (hd 512) --------------------------------------------------------------
// Both consumer warpgroups of a CTA hold the same fragment positions (same 64 rows, same columns):
// each adds the other's partial of two products, written at [register][thread] (conflict-free).
// a + b == b + a bit for bit, so both end with identical S / dP values.
template <int N>
__device__ __forceinline__ void exchange_pair(float (&a)[N], float (&b)[N], float* xbuf, int w) {
  const int tid = threadIdx.x % 128;
  float* mine = xbuf + w * (2 * N * 128);
  const float* other = xbuf + (1 - w) * (2 * N * 128);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    mine[i * 128 + tid] = a[i];
    mine[(N + i) * 128 + tid] = b[i];
  }
  named_bar_sync(1, 256);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    a[i] += other[i * 128 + tid];
    b[i] += other[(N + i) * 128 + tid];
  }
  named_bar_sync(2, 256);  // both have read: the next tile may overwrite the buffers
}

// A [rows][HD] tile as load_tile lays it out, the chunk loop kept rolled: the wide producers run
// under setmaxnreg 24, where the unrolled 8-chunk form spills.
__device__ __forceinline__ void load_tile_rolled(uint8_t* dst, const CUtensorMap* map, uint64_t* bar, int rows,
                                                 int row0, int head, int batch) {
#pragma unroll 1
  for (int c = 0; c < HD / 64; ++c) tma_load_4d(dst + c * rows * 128, map, bar, c * 64, row0, head, batch);
}

// One single-slot refill of the wide producers: wait until the consumers released the slot (its
// empty barrier's phase `phase`), then load the tile onto its full barrier.
__device__ __forceinline__ void refill_slot(uint64_t* empty, uint64_t* full, uint32_t phase, uint32_t bytes, uint8_t* dst,
                                            const CUtensorMap* map, int rows, int row0, int head, int batch) {
  sm90::mbar_wait(empty, phase ^ 1);
  sm90::mbar_arrive_expect_tx(full, bytes);
  load_tile_rolled(dst, map, full, rows, row0, head, batch);
}

// dK/dV: K and V resident (kv_full), one Q slot and one dO slot with their own full / empty
// barriers. The consumers release dO after dV's product and Q after dK's, so the producer loads
// dO of the next tile first (under dK += dS^T Q), then Q.
struct KvWideRing {
  uint64_t* kv_full;
  uint64_t* q_full;
  uint64_t* q_empty;  // every consumer warp arrives once its dK product has landed
  uint64_t* do_full;
  uint64_t* do_empty;  // ... once its dV product has landed
};

__device__ __forceinline__ void dkdv_producer_wide(const AttnBwdParams& p, uint8_t* smem, const KvWideRing& r, int n0,
                                                   int kvh, int b) {
  sm90::tma_prefetch_desc(&p.tm_q_kv);
  sm90::tma_prefetch_desc(&p.tm_do_kv);
  sm90::mbar_arrive_expect_tx(r.kv_full, 2 * kKBytes);
  load_tile_rolled(smem, &p.tm_k_kv, r.kv_full, KN, n0, kvh, b);
  load_tile_rolled(smem + kKBytes, &p.tm_v_kv, r.kv_full, KN, n0, kvh, b);
  int mb_begin, mb_end;
  kv_query_range(p, n0, mb_begin, mb_end);
  int it = 0;
  for (int g = 0; g < p.group; ++g) {
    const int h = kvh * p.group + g;
    for (int mb = mb_begin; mb < mb_end; ++mb, ++it) {
      const uint32_t phase = it & 1;
      refill_slot(r.do_empty, r.do_full, phase, kQTBytes, smem + kWDO, &p.tm_do_kv, QM, mb * QM, h, b);
      refill_slot(r.q_empty, r.q_full, phase, kQTBytes, smem + kWQ, &p.tm_q_kv, QM, mb * QM, h, b);
    }
  }
}

// Consumer warpgroup w (0, 1) of column slice cs: dK/dV columns [256 cs + 128 w, + 128) of the
// CTA's 64 keys; S^T and dP^T partials over D chunks 4 w .. 4 w + 3, exchanged with the other.
__device__ __forceinline__ void dkdv_consumer_wide(const AttnBwdParams& p, uint8_t* smem, const KvWideRing& r, int n0,
                                                   int cs, int kvh, int b, int w) {
  const uint32_t base = sm90::smem_u32(smem);
  const uint32_t sk = base + w * 4 * KN * 128;  // this warpgroup's half of D of K (and V)
  const uint32_t sv = base + kKBytes + w * 4 * KN * 128;
  const uint32_t sq = base + kWQ, sdo = base + kWDO;
  const uint32_t half = w * 4 * QM * 128;              // the same half of the Q / dO slot
  const uint32_t own = (cs * 4 + w * 2) * QM * 128;    // the 2 chunks of this warpgroup's output columns
  float* xbuf = reinterpret_cast<float*>(smem + kWX);
  const int tid = threadIdx.x % 128, lane = tid % 32;
  int key[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) key[i] = n0 + (tid / 32) * 16 + lane / 4 + 8 * i;

  float dk[PW / 2], dv[PW / 2];
  zero(dk);
  zero(dv);
  DsScale dss;
  int mb_begin, mb_end;
  kv_query_range(p, n0, mb_begin, mb_end);
  const int per_head = mb_end - mb_begin;
  const int iters = per_head * p.group;
  sm90::mbar_wait(r.kv_full, 0);
  for (int it = 0; it < iters; ++it) {
    const uint32_t phase = it & 1;
    const int m0 = (mb_begin + it % per_head) * QM;
    const int64_t rb = (int64_t(b) * p.Hq + kvh * p.group + it / per_head) * p.sq_pad + m0;
    const float2* lg = reinterpret_cast<const float2*>(p.ws_lse2 + rb) + lane % 4;
    const float2* dg = reinterpret_cast<const float2*>(p.ws_delta + rb) + lane % 4;
    const float2* ag = reinterpret_cast<const float2*>(p.ws_max + rb) + lane % 4;
    float s[QM / 2], dp[QM / 2];
    sm90::mbar_wait(r.do_full, phase);
    mma_qk<HalfS>(dp, sv, KN, sdo + half);
    sm90::mbar_wait(r.q_full, phase);
    mma_qk<HalfS>(s, sk, KN, sq + half);
    sm90::wgmma_wait<0>();
    fence_regs(s);
    fence_regs(dp);
    exchange_pair<QM / 2>(s, dp, xbuf, w);
    float2 l2s[QM / 8], dls[QM / 8], ams[QM / 8];  // read after the exchange: fewer registers live across it
#pragma unroll
    for (int j = 0; j < QM / 8; ++j) {
      l2s[j] = __ldg(lg + 4 * j);
      dls[j] = __ldg(dg + 4 * j);
      ams[j] = __ldg(ag + 4 * j);
    }
    p_ds_transposed(p, s, dp, l2s, dls, ams, key, m0, n0 + 63, lane);
    uint32_t pf[QM / 16][4], df[QM / 16][4];
    dss.apply(dp, dk);  // FP16: dS within FP16's range (the row's scale)
    pack_p<HalfS>(s, pf);
    pack_p<HalfS>(dp, df);
    mma_pv<MathD>(dv, pf, sdo + own);
    mma_pv<MathD>(dk, df, sq + own);
    sm90::wgmma_wait<1>();  // dV's product has landed: the dO slot is free
    fence_regs(dv);
    if (lane == 0) sm90::mbar_arrive(r.do_empty);
    sm90::wgmma_wait<0>();
    fence_regs(dk);
    if (lane == 0) sm90::mbar_arrive(r.q_empty);
  }
  const int col0 = cs * (HD / kSlices) + w * PW;
  Elem* gdk = static_cast<Elem*>(p.dk) + b * p.dk_s[0] + kvh * p.dk_s[1];
  Elem* gdv = static_cast<Elem*>(p.dv) + b * p.dv_s[0] + kvh * p.dv_s[1];
  dss.finish(dk);
  store_block<PW>(gdk, p.dk_s[2], n0, p.Sk, col0, p.D, dk, p.scale);
  store_block<PW>(gdv, p.dv_s[2], n0, p.Sk, col0, p.D, dv, 1.f);
}

// dQ: Q and dO resident (q_full), one K slot and one V slot. V is released as soon as the dP
// partials have landed, K after dQ += dS K; the producer loads V of the next tile first.
struct QWideRing {
  uint64_t* q_full;
  uint64_t* k_full;
  uint64_t* k_empty;
  uint64_t* v_full;
  uint64_t* v_empty;
};

__device__ __forceinline__ void dq_producer_wide(const AttnBwdParams& p, uint8_t* smem, const QWideRing& r, int m0,
                                                 int h, int b) {
  const int kvh = h / p.group;
  sm90::tma_prefetch_desc(&p.tm_k_dq);
  sm90::tma_prefetch_desc(&p.tm_v_dq);
  sm90::mbar_arrive_expect_tx(r.q_full, 2 * kQBytesQ);
  load_tile_rolled(smem, &p.tm_q_dq, r.q_full, MQ, m0, h, b);
  load_tile_rolled(smem + kQBytesQ, &p.tm_do_dq, r.q_full, MQ, m0, h, b);
  const int n_tiles = dq_key_tiles(p, m0);
  for (int n = 0; n < n_tiles; ++n) {
    const uint32_t phase = n & 1;
    refill_slot(r.v_empty, r.v_full, phase, kQKVBytes, smem + kQV, &p.tm_v_dq, NQ, n * NQ, kvh, b);
    refill_slot(r.k_empty, r.k_full, phase, kQKVBytes, smem + kQK, &p.tm_k_dq, NQ, n * NQ, kvh, b);
  }
}

// Consumer warpgroup w (0, 1): dQ columns [256 w, 256 w + 256) of the CTA's 64 query rows; S and
// dP partials over the same half of D, exchanged with the other warpgroup.
__device__ __forceinline__ void dq_consumer_wide(const AttnBwdParams& p, uint8_t* smem, const QWideRing& r, int m0,
                                                 int h, int b, int w) {
  const uint32_t base = sm90::smem_u32(smem);
  const uint32_t sq = base + w * 4 * MQ * 128;  // this warpgroup's half of D of Q (and dO)
  const uint32_t sdo = base + kQBytesQ + w * 4 * MQ * 128;
  const uint32_t sk = base + kQK + w * 4 * NQ * 128;  // ... of the K and V slots
  const uint32_t sv = base + kQV + w * 4 * NQ * 128;
  float* xbuf = reinterpret_cast<float*>(smem + kQX);
  const int tid = threadIdx.x % 128, lane = tid % 32;
  int pos[2];
  float lse2[2], delta[2], amax[2];
  const int64_t row_base = (int64_t(b) * p.Hq + h) * p.sq_pad;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    pos[i] = m0 + (tid / 32) * 16 + lane / 4 + 8 * i;  // < sq_pad: the workspace is padded
    lse2[i] = p.ws_lse2[row_base + pos[i]];
    delta[i] = p.ws_delta[row_base + pos[i]];
    amax[i] = p.ws_max[row_base + pos[i]];
  }
  float dq[128];
  zero(dq);
  DsScale dss;
  const int n_tiles = dq_key_tiles(p, m0);
  sm90::mbar_wait(r.q_full, 0);
  for (int n = 0; n < n_tiles; ++n) {
    const uint32_t phase = n & 1;
    const int n0 = n * NQ;
    float s[NQ / 2], dp[NQ / 2];
    sm90::mbar_wait(r.v_full, phase);
    mma_qk<HalfQ>(dp, sdo, MQ, sv);
    sm90::mbar_wait(r.k_full, phase);
    mma_qk<HalfQ>(s, sq, MQ, sk);
    sm90::wgmma_wait<0>();
    fence_regs(s);
    fence_regs(dp);
    if (lane == 0) sm90::mbar_arrive(r.v_empty);
    exchange_pair<NQ / 2>(s, dp, xbuf, w);
    if (n0 + NQ > p.Sk || (p.causal && n0 + NQ - 1 > m0)) mask_tile<NQ>(s, n0, p.Sk, p.causal, pos);
#pragma unroll
    for (int j = 0; j < NQ / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pr = ex2(bwd_prob_arg(s[4 * j + e], amax[e >> 1], p.scale_log2, lse2[e >> 1]));
        dp[4 * j + e] = pr * (dp[4 * j + e] - delta[e >> 1]);
      }
    dss.apply(dp, dq);  // FP16: dS within FP16's range (the row's scale)
    uint32_t df[NQ / 16][4];
    pack_p<HalfQ>(dp, df);
    mma_pv<HalfQ>(dq, df, sk);  // this warpgroup's 256 columns of K as the MN-major B operand
    sm90::wgmma_wait<0>();
    fence_regs(dq);
    if (lane == 0) sm90::mbar_arrive(r.k_empty);
  }
  Elem* gdq = static_cast<Elem*>(p.dq) + b * p.dq_s[0] + h * p.dq_s[1];
  dss.finish(dq);
  store_block<256>(gdq, p.dq_s[2], m0, p.Sq, w * 256, p.D, dq, p.scale);
}
#endif  // FLY_HD <= 256

}  // namespace
}  // namespace fly::attn

using namespace fly::attn;

// sum_d a[d] b[d] in FP32 (products of 16-bit values are exact), rows 8-byte aligned (TMA's
// 16-byte rule for the tensors the maps address): 4-element vector loads, then the tail.
__device__ __forceinline__ float dot_row(const Elem* a, const Elem* b, int D) {
  float acc = 0.f;
  int d = 0;
#pragma unroll 1
  for (; d + 4 <= D; d += 4) {
    const uint2 va = __ldg(reinterpret_cast<const uint2*>(a + d));
    const uint2 vb = __ldg(reinterpret_cast<const uint2*>(b + d));
    const Elem* ea = reinterpret_cast<const Elem*>(&va);
    const Elem* eb = reinterpret_cast<const Elem*>(&vb);
#pragma unroll
    for (int e = 0; e < 4; ++e) acc = fmaf(float(ea[e]), float(eb[e]), acc);
  }
#pragma unroll 1
  for (; d < D; ++d) acc = fmaf(float(a[d]), float(b[d]), acc);
  return acc;
}

// A row's exact softmax statistics, for rows whose FP32 LSE cannot give their probabilities
// (|LSE| >= kBwdExactLse: at LSE ~ 1e11 an ulp is 8192): the warp's lanes take keys j = lane,
// lane + 32, ... of the row's visible ones, each an FP32 dot product and an online (max, sum) as the
// forward's (attention_math.h), then the warp merges them. *a = the max score, *r = log2 of the sum
// of exp2((s - max) scale_log2): P = exp2((s - a) scale_log2 - r) (bwd_prob_arg). A row with no
// visible key (an LSE inconsistent with the shapes) keeps P = 0: (0, +inf). Lane 0 stores (a, r) at
// workspace row `row` over the preprocessing's (0, LSE log2 e). O(Sk D) per row: the rare path, out
// of line and last (nothing of the caller lives across it) so that the common one keeps its registers.
__device__ __noinline__ void exact_row_stats(const AttnBwdParams& p, int64_t row, int b, int h, int s, int lane) {
  const Elem* q = static_cast<const Elem*>(p.q) + b * p.q_s[0] + h * p.q_s[1] + int64_t(s) * p.q_s[2];
  const Elem* kb = static_cast<const Elem*>(p.k) + b * p.k_s[0] + (h / p.group) * p.k_s[1];
  const int nk = p.causal ? min(p.Sk, s + 1) : p.Sk;
  const float c = p.scale_log2;
  float m = -INFINITY, t = 0.f;
  for (int j = lane; j < nk; j += 32) {
    const float x = dot_row(q, kb + int64_t(j) * p.k_s[2], p.D);
    if (x > m) {
      t = t * ex2(rescale_arg(m, x, c)) + 1.f;  // m = -inf: 0 * 0 + 1
      m = x;
    } else {
      t += ex2(prob_arg(x, m, c, 0.f));  // NaN x: NaN, kept
    }
  }
  float M = m;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
  float sum = split_weight(m, t, M, c);  // a lane without keys: 0
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const bool none = M == -INFINITY || !(sum > 0.f || sum != sum);  // no visible key: P = 0
  if (lane == 0) {
    p.ws_max[row] = none ? 0.f : M;
    p.ws_lse2[row] = none ? INFINITY : log2f(sum);
  }
}

// One warp per padded row: Delta = sum_d dO O (fp32) and the row's probability reference (a, r):
// (0, LSE log2(e)), or for |LSE| >= kBwdExactLse the exact statistics above; padding rows and rows
// without a visible key (LSE -inf) get r = +inf, so every P of theirs is 0.
// (256, 8): the common path in 32 registers, full occupancy as before the exact path existed.
extern "C" __global__ void __launch_bounds__(256, 8) fly_attn_bwd_pre(const __grid_constant__ AttnBwdParams p) {
  const int64_t rows = int64_t(p.B) * p.Hq * p.sq_pad;
  const int64_t row = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int s = int(row % p.sq_pad);
  const int h = int((row / p.sq_pad) % p.Hq);
  const int b = int(row / (int64_t(p.sq_pad) * p.Hq));
  float acc = 0.f, l = -INFINITY;
  if (s < p.Sq) {
    const Elem* o = static_cast<const Elem*>(p.o) + b * p.o_s[0] + h * p.o_s[1] + s * p.o_s[2];
    const Elem* d = static_cast<const Elem*>(p.dout) + b * p.do_s[0] + h * p.do_s[1] + s * p.do_s[2];
    for (int c = lane; c < p.D; c += 32) acc += float(o[c]) * float(d[c]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    l = p.lse[b * p.lse_s[0] + h * p.lse_s[1] + s * p.lse_s[2]];
  }
  if (lane == 0) {
    p.ws_delta[row] = acc;
    p.ws_lse2[row] = l == -INFINITY ? INFINITY : l * kLog2e;
    p.ws_max[row] = 0.f;
  }
  // Warp-uniform (one warp per row) and rare; lane 0's stores above are overwritten in its order.
  if (fabsf(l) >= kBwdExactLse && fabsf(l) < INFINITY) exact_row_stats(p, row, b, h, s, lane);
}

#if FLY_HD <= 256
// blockIdx.x: key block, y: kv head, z: batch.
extern "C" __global__ void __launch_bounds__(128 * (NWG_KV + 1), 1)
    fly_attn_bwd_dkdv(const __grid_constant__ AttnBwdParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_smem(smem_raw);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kKvBars);
  KvRing r{bars, bars + 1, bars + 1 + ST};
  if (threadIdx.x == 0) {
    fly::sm90::mbar_init(r.kv_full, 1);
    for (int s = 0; s < ST; ++s) {
      fly::sm90::mbar_init(&r.full[s], 1);
      fly::sm90::mbar_init(&r.empty[s], 4 * NWG_KV);
    }
    fly::sm90::fence_barrier_init();
  }
  __syncthreads();
  const int n0 = int(blockIdx.x) * KN, kvh = int(blockIdx.y), b = int(blockIdx.z);
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    KvRegs::producer();
    if (threadIdx.x < 32 && fly::sm90::elect_one()) dkdv_producer(p, smem, r, n0, kvh, b);
  } else {
    KvRegs::consumer();
    dkdv_consumer(p, smem, r, n0, kvh, b, wg - 1);
  }
}

// blockIdx.x: query block (causal: the longest, last blocks first), y: query head, z: batch.
extern "C" __global__ void __launch_bounds__(128 * (NWG_Q + 1), 1) fly_attn_bwd_dq(const __grid_constant__ AttnBwdParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_smem(smem_raw);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kQBars);
  QRing r{bars, bars + 1, bars + 1 + ST, bars + 1 + 2 * ST};
  if (threadIdx.x == 0) {
    fly::sm90::mbar_init(r.q_full, 1);
    for (int s = 0; s < ST; ++s) {
      fly::sm90::mbar_init(&r.k_full[s], 1);
      fly::sm90::mbar_init(&r.v_full[s], 1);
      fly::sm90::mbar_init(&r.empty[s], 4 * NWG_Q);
    }
    fly::sm90::fence_barrier_init();
  }
  __syncthreads();
  int mb = int(blockIdx.x);
  if (p.causal) mb = int(gridDim.x) - 1 - mb;
  const int m0 = mb * MQ, h = int(blockIdx.y), b = int(blockIdx.z);
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    QRegs::producer();
    if (threadIdx.x < 32 && fly::sm90::elect_one()) dq_producer(p, smem, r, m0, h, b);
  } else {
    QRegs::consumer();
    dq_consumer(p, smem, r, m0, h, b, wg - 1);
  }
}
#else
// Wide (hd 512). blockIdx.x: key block * kSlices + column slice, y: kv head, z: batch.
extern "C" __global__ void __launch_bounds__(384, 1) fly_attn_bwd_dkdv(const __grid_constant__ AttnBwdParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_smem(smem_raw);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kKvBars);
  const KvWideRing r{bars, bars + 1, bars + 2, bars + 3, bars + 4};
  if (threadIdx.x == 0) {
    fly::sm90::mbar_init(r.kv_full, 1);
    fly::sm90::mbar_init(r.q_full, 1);
    fly::sm90::mbar_init(r.do_full, 1);
    fly::sm90::mbar_init(r.q_empty, 4 * NWG_KV);
    fly::sm90::mbar_init(r.do_empty, 4 * NWG_KV);
    fly::sm90::fence_barrier_init();
  }
  __syncthreads();
  const int n0 = int(blockIdx.x) / kSlices * KN, cs = int(blockIdx.x) % kSlices;
  const int kvh = int(blockIdx.y), b = int(blockIdx.z);
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    KvRegs::producer();
    if (threadIdx.x < 32 && fly::sm90::elect_one()) dkdv_producer_wide(p, smem, r, n0, kvh, b);
  } else {
    KvRegs::consumer();
    dkdv_consumer_wide(p, smem, r, n0, cs, kvh, b, wg - 1);
  }
}

// Wide (hd 512). blockIdx.x: query block (causal: the longest, last blocks first), y: query head,
// z: batch.
extern "C" __global__ void __launch_bounds__(384, 1) fly_attn_bwd_dq(const __grid_constant__ AttnBwdParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = align_smem(smem_raw);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kQBars);
  const QWideRing r{bars, bars + 1, bars + 2, bars + 3, bars + 4};
  if (threadIdx.x == 0) {
    fly::sm90::mbar_init(r.q_full, 1);
    fly::sm90::mbar_init(r.k_full, 1);
    fly::sm90::mbar_init(r.v_full, 1);
    fly::sm90::mbar_init(r.k_empty, 4 * NWG_Q);
    fly::sm90::mbar_init(r.v_empty, 4 * NWG_Q);
    fly::sm90::fence_barrier_init();
  }
  __syncthreads();
  int mb = int(blockIdx.x);
  if (p.causal) mb = int(gridDim.x) - 1 - mb;
  const int m0 = mb * MQ, h = int(blockIdx.y), b = int(blockIdx.z);
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    QRegs::producer();
    if (threadIdx.x < 32 && fly::sm90::elect_one()) dq_producer_wide(p, smem, r, m0, h, b);
  } else {
    QRegs::consumer();
    dq_consumer_wide(p, smem, r, m0, h, b, wg - 1);
  }
}
#endif  // FLY_HD <= 256

// The packed path's copy (src/ops/attention_bwd.cpp: Q, K, V or dO whose strides or base TMA
// cannot take, copied to 16-byte rows in the workspace first): the shared line-packing kernel.
#include "common/pack_lines.cuh"
