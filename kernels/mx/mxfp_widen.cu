// SPDX-License-Identifier: Apache-2.0
// MX block-scaled GEMM on 16-bit wgmma, the widening design (MXFP8 / MXFP4, NT; docs/mxfp.md
// "BF16-widening design"):
//   C[M,N] = sum over k32 blocks kb of sa[m,kb] * sb[n,kb] * (A[m, 32kb..+32] . B[n, 32kb..+32]) (+ bias[n])
// Each element is widened to FP16 or BF16 with its block's scale folded in, q * 2^E exactly (E4M3
// and E2M1 values times a power of two are FP16 / BF16 values while the exponent stays in range),
// so the tensor core accumulates the scaled products in FP32 and no per-k32 promotion is needed: the
// FP32 work per k step is O(rows + columns) of widening instead of O(rows x columns) of promotion.
//
// Persistent, warp-specialized, CTA tile 128 x 128, a ring of kStages stages of 128 k elements:
// - producer warpgroup: per tile, every scale of the tile's rows and columns (a min / max over the
//   warpgroup) picks the tile's plan (mx_widen.h choose_plan): the FP16 path when each operand's
//   exponents fit FP16's window, else BF16, else the CUDA-core fallback, with independent exponent
//   shifts for A and B that the epilogue undoes. Per stage one thread TMA-loads A and B as stored
//   (MXFP8: 128B-swizzled E4M3; MXFP4: packed bytes); all 128 threads store the multipliers
//   (16-bit pairs, scale words read two stages ahead) or, for the fallback, the decoded scales, and
//   the tile's path / rescale.
// - consumer warpgroups (64 rows each): per stage each thread widens its A fragment straight into
//   registers (one 16-byte load per row and k64: the k order inside each k64 group is permuted so
//   that 16 consecutive bytes are exactly one thread's fragment slots, mx_widen.h slot_of_logical)
//   and one row x k64 of B into a 16-bit tile in shared memory, written in the same permuted order
//   (128B-swizzled, the wgmma B operand; three such tiles rotate). A proxy fence, a named barrier
//   between the two warpgroups (B complete), the FP8 stage's release (after the barrier: see
//   tile_mma), 8 wgmma m64n128k16 with A from registers, one stage's wgmma left in flight while
//   the next is widened (the probe `_ov0`, FLY_OVERLAP=0, retires each before widening the next).
// - the fallback (an operand whose exponents span more than BF16 holds, e.g. 0x00 beside 0xFE with
//   nonzero elements; real data does not get there, the tests do): FP32 dot products per k32 block
//   on the CUDA cores, acc += dot * (sa * sb), as the FP8 design promotes.
// - E4M3 NaN elements: the BF16 re-bias maps them to finite values whose low mantissa bits are set
//   (every other widened value has them clear), so the rows / columns that met one are tracked and
//   their outputs set to NaN in the epilogue; the FP16 path keeps the NaN. A NaN scale widens to NaN.
// - epilogue from the accumulators (mx_store.cuh), the next tile's stages already loading.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include "common/convert.cuh"
#include "common/pipeline.cuh"
#include "common/sm90.h"
#include "common/wgmma_ops.h"
#include "mx/mx_encode.h"
#include "mx/mx_store.cuh"
#include "mx/mx_unpack.h"
#include "mx/mx_wgmma_params.h"
#include "mx/mx_widen.h"

namespace {

using namespace fly::mxw;
using namespace fly::mxw::widen;
namespace sm90 = fly::sm90;
using Regs = fly::RegSplit<2, kProducerRegs, kConsumerRegs>;  // mx_wgmma_params.h

// The tile's N width: 128, or 64 / 32 for the swapped decode variants (`_t1`: the weights as A,
// the few tokens as B). The shared-memory plan is always the 128-wide one (mx_widen.h); a
// narrower tile uses the first BN rows of its B parts.
#if defined(FLY_BN)
constexpr int BN = FLY_BN;
#else
constexpr int BN = kBN;
#endif
static_assert(BN == 32 || BN == 64 || BN == 128, "BN");
constexpr int ACC = BN / 2;
// B's widening per stage: BN rows x 2 k64 halves over the 256 consumer threads, each taking
// kS4 of a half's four 16-byte column groups (BN 128: all four; 64: two; 32: one).
constexpr int kS4 = BN / 32;
// Swapped operands (FLY_SWAP, `_t1`): the launcher passes B (N x K) as the kernel's A and A as its
// B, so the kernel computes C^T; the epilogue stores it transposed (mx_store.cuh, TRANS).
#if defined(FLY_SWAP) && FLY_SWAP
constexpr bool TRANS = true;
#else
constexpr bool TRANS = false;
#endif
using W = Layout<BN>;  // this width's shared-memory plan (mx_widen.h)
#if defined(FLY_SPLIT) && FLY_SPLIT > 1
using KParams = SplitParams;  // split-K (`_s<split>`): work units (tile, k range), FP32 partials, mxfp_splitk_reduce
#else
using KParams = Params;
#endif

// The tile's output: rounded with the bias into c, or (a split unit) its FP32 partial into ws.
template <class Fix = KeepAcc>
__device__ __forceinline__ void store_unit(const KParams& p, int q, int64_t row0, int64_t col0, int ct,
                                           const float (&acc)[ACC], Fix fix = Fix()) {
#if defined(FLY_SPLIT) && FLY_SPLIT > 1
  if (p.splits > 1) {
    store_partial_tile<BN, Fix, TRANS>(p, q, row0, col0, ct, acc, fix);
    return;
  }
#else
  (void)q;
#endif
  if (p.out_bf16) store_acc_tile<BN, __nv_bfloat16, Fix, TRANS>(p, row0, col0, ct, acc, fix);
  else store_acc_tile<BN, __half, Fix, TRANS>(p, row0, col0, ct, acc, fix);
}

template <int P> using Par = std::integral_constant<int, P>;  // a stage body's register set

// Four E4M3 bytes -> two 16-bit pairs (bytes 0,1 -> lo; 2,3 -> hi), each q * 2^E' exactly (E'
// inside the path's window, mx_widen.h). FP16: the cvt and one FP16 multiply by mul = 2^E'. BF16:
// the cvt, the re-bias of the FP16 bits to BF16 bits (q * 2^-112) and one BF16 multiply by
// mul = 2^(E' + 112).
template <bool F16> __device__ __forceinline__ void widen4(uint32_t x, uint32_t mul, uint32_t& lo, uint32_t& hi) {
  uint32_t h0, h1;
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n cvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
      : "=r"(h0), "=r"(h1)
      : "r"(x));
  if constexpr (F16) {
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(lo) : "r"(h0), "r"(mul));
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(hi) : "r"(h1), "r"(mul));
  } else {
    const uint32_t m0 = f16x2_to_bf16x2_m112(h0), m1 = f16x2_to_bf16x2_m112(h1);
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(lo) : "r"(m0), "r"(mul));
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(hi) : "r"(m1), "r"(mul));
  }
}

// Keeps a register-A fragment set live in the front end's view up to this point (a wgmma reads its
// A registers until the wait_group that retires it). Defensive: ptxas tracks wgmma operands itself,
// and the intermittent mismatch it was written against came from the stage release (tile_mma). It
// stays because the validated form (repeated GPU tests, the sanitizers) has it: removing it needs
// those runs again (PROBE=mx_widen_repeat tools/device_python.sh).
__device__ __forceinline__ void hold(uint32_t (&a)[2][4][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int s4 = 0; s4 < 4; ++s4)
      asm volatile("" ::"r"(a[h][s4][0]), "r"(a[h][s4][1]), "r"(a[h][s4][2]), "r"(a[h][s4][3]) : "memory");
}

// acc * 2^s for the epilogue's rescale (|s| <= 3 * 126: three exact power-of-two steps, each
// intermediate between acc and the result).
__device__ __forceinline__ float rescale(float v, int s) {
  const int s1 = s / 3, s2 = (s - s1) / 2, s3 = s - s1 - s2;
  return v * __int_as_float((s1 + 127) << 23) * __int_as_float((s2 + 127) << 23) * __int_as_float((s3 + 127) << 23);
}

// Shared memory through 32-bit shared-window addresses (the generic pointers of a dynamically
// aligned buffer make the compiler emit 64-bit generic loads).
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ void sts128(uint32_t a, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}
// 16 logical k values of a row (E4M3 bytes) at shared address a: MXFP8 one 16-byte load from the
// swizzled tile, MXFP4 8 packed bytes widened to E4M3 (exact).
template <bool FP4> __device__ __forceinline__ uint4 load16(uint32_t a) {
  if constexpr (!FP4) {
    return lds128(a);
  } else {
    const uint2 v = lds64(a);
    uint32_t o[4];
    fly::mxu::e2m1x16_to_e4m3x16(v.x, v.y, o);
    return make_uint4(o[0], o[1], o[2], o[3]);
  }
}
// The byte offset (inside a tile) of a row's 16 logical k values at k = 16 c: MXFP8 128B-swizzled
// rows of 128 bytes, MXFP4 plain rows of 64 bytes. For MXFP8 the offset of chunk c is
// row_off(row, 0) ^ (c << 4) (the swizzle XORs the chunk index with row % 8).
template <bool FP4> __device__ __forceinline__ uint32_t row_off(int row) {
  return FP4 ? uint32_t(row) * 64u : uint32_t(row) * 128u + (uint32_t(row & 7) << 4);
}
template <bool FP4> __device__ __forceinline__ uint32_t chunk_off(uint32_t rowoff, int c) {
  return FP4 ? rowoff + uint32_t(c) * 8u : rowoff ^ (uint32_t(c) << 4);
}

__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
  uint32_t h;
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %1;\n cvt.rn.f16x2.e4m3x2 %0, a;\n}\n" : "=r"(h) : "r"(b & 0xFFu));
  return __half2float(__ushort_as_half(uint16_t(h & 0xFFFFu)));
}
// Element k of a row of the stage as a float (exact).
__device__ __forceinline__ float elem(const uint8_t* tile, bool fp4, int row, int k) {
  if (!fp4) return e4m3_to_float(tile[fly::mxu::sw128_offset(uint32_t(row), uint32_t(k))]);
  const uint8_t pair = tile[row * 64 + k / 2];
  return e4m3_to_float(fly::mxe::e2m1_to_e4m3(uint8_t((k & 1) ? pair >> 4 : pair & 0xF)));
}

// The consumers' fixed per-thread offsets and their place in the ring (kept across tiles).
struct Cons {
  int cw, ct, t, ra, bn_row, bh, part;  // part: which kS4 column groups of B's half (BN < 128)
  uint32_t ring_a, wt_a;        // shared-window addresses of the ring and the widened B tiles
  uint32_t b_ld, b_st;          // B: the row's load offset (chunk_off) in a stage, store offset in a tile
  uint32_t a_ld0, a_ld1;        // A: rows ra, ra + 8 in a stage
  uint32_t mb_off, ma_off0;     // the multipliers of the thread's B row (block 2 bh) and A row ra (block of (0, t))
  int s, wi;
  uint32_t ph;
  __device__ __forceinline__ void next_stage() {
    if (++s == W::kStages) {
      s = 0;
      ph ^= 1;
    }
  }
};

// One tile on the tensor core (path kF16 or kBf16): per stage widen B (this thread's row x k64)
// into the rotating BF16/FP16 tile and A into register fragments, meet the other warpgroup, release
// the FP8 stage, issue 8 wgmma (left in flight while the next stage is widened; `_ov0`: retired first). Then
// the epilogue.
template <bool FP4, bool F16>
__device__ __forceinline__ void tile_mma(const KParams& p, Cons& c, uint8_t* ring, uint64_t* full, uint64_t* empty,
                                         uint32_t* colnan, int ksteps, int resc, int q, int64_t row0, int64_t col0) {
  using Mma = sm90::WgmmaRS<BN, 0, !F16>;  // B K-major
  static_assert(Mma::kRegs == ACC, "accumulator count");
  float acc[ACC];
  uint32_t areg0[2][4][4], areg1[2][4][4];     // per stage parity: [k64 half][k16 step][fragment register]
  uint32_t nan_a0 = 0, nan_a1 = 0, nan_b = 0;  // BF16: OR of the widened words (E4M3 NaN detection)
  auto stage = [&](auto par, int ks) {
    constexpr int P = decltype(par)::value;
    uint32_t(&ar)[2][4][4] = P == 0 ? areg0 : areg1;
    sm90::mbar_wait(&full[c.s], c.ph);
    const uint32_t sb = c.ring_a + uint32_t(c.s * W::kStage);
    const uint32_t wt = c.wt_a + uint32_t(c.wi * W::kWBuf);
    // B: row bn_row, k64 half bh -> the widened tile in the permuted k order
    {
      const uint32_t mb0 = lds32(sb + c.mb_off), mb1 = lds32(sb + c.mb_off + 4u * kRows);
      uint4 x[4];
#pragma unroll
      for (int g = 0; g < 4; ++g) x[g] = load16<FP4>(sb + chunk_off<FP4>(c.b_ld, FP4 ? g : 4 * c.bh + g));
      const uint32_t dst = wt + c.b_st;
#pragma unroll
      for (int s4 = 0; s4 < 4; ++s4) {
        if (kS4 < 4 && s4 / kS4 != c.part) continue;  // warp-uniform: a warp's rows share the part
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int g = 0; g < 4; ++g) {
          const uint32_t w = s4 == 0 ? x[g].x : s4 == 1 ? x[g].y : s4 == 2 ? x[g].z : x[g].w;
          widen4<F16>(w, g < 2 ? mb0 : mb1, lo[g], hi[g]);
          if (!F16) nan_b |= lo[g] | hi[g];
        }
        sts128(dst ^ (uint32_t(2 * s4) << 4), lo[0], lo[1], lo[2], lo[3]);
        sts128(dst ^ (uint32_t(2 * s4 + 1) << 4), hi[0], hi[1], hi[2], hi[3]);
      }
    }
    // A: rows ra, ra + 8, logical k 64 h + 16 t .. + 15 -> fragment registers
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const uint4 x = load16<FP4>(sb + chunk_off<FP4>(rr ? c.a_ld1 : c.a_ld0, 4 * h + c.t));
        const uint32_t m = lds32(sb + c.ma_off0 + 4u * uint32_t(2 * h * kRows + 8 * rr));
#pragma unroll
        for (int s4 = 0; s4 < 4; ++s4) {
          const uint32_t w = s4 == 0 ? x.x : s4 == 1 ? x.y : s4 == 2 ? x.z : x.w;
          uint32_t lo, hi;
          widen4<F16>(w, m, lo, hi);
          ar[h][s4][rr] = lo;
          ar[h][s4][2 + rr] = hi;
          if (!F16) {
            if (rr == 0) nan_a0 |= lo | hi;
            else nan_a1 |= lo | hi;
          }
        }
      }
    }
    sm90::fence_proxy_async_smem();  // the widened B tile is read by wgmma (async proxy)
    fly::named_bar_sync(2, 256);                // both halves of B widened (and wgmma i - 3 retired in both)
    // The FP8 stage is released only now: an arrive placed after the A widening in the source was
    // hoisted by ptxas right behind the loads' issue (it has no data dependence on them), so the
    // producer's TMA (the async proxy) could overwrite the stage while those loads were still in
    // flight: the intermittent mismatch of the overlapped form. Here the proxy fence (a MEMBAR)
    // orders every load of the stage before the release (bench/probes/mxfp/sass_arrive_check.py).
    sm90::mbar_arrive(&empty[c.s]);
    sm90::wgmma_fence();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint64_t db = sm90::make_desc_sw128(wt + uint32_t(h * W::kWHalf), 16, 1024);
#pragma unroll
      for (int s4 = 0; s4 < 4; ++s4) Mma::mma(acc, ar[h][s4], db + 2 * s4, (ks | h | s4) != 0 ? 1 : 0);
    }
    sm90::wgmma_commit();
#if !defined(FLY_OVERLAP) || FLY_OVERLAP
    // wgmma i left in flight while stage i + 1 is widened (wgmma i - 1 retired: its A registers are
    // free, B tile i - 3 too). Safe because the release follows the fence and the barrier
    // (tile_mma); repeated GPU-test runs and the sanitizers are clean with it
    // (PROBE=mx_widen_repeat tools/device_python.sh).
    sm90::wgmma_wait<1>();
#else
    sm90::wgmma_wait<0>();  // probe `_ov0`: this stage's wgmma retired before the next is widened (2-7% slower)
#endif
    // Keep the other set's registers live up to here: wgmma i - 1 read them asynchronously until
    // the wait above, so the allocator must not hand them to this stage's temporaries before.
    hold(P == 0 ? areg1 : areg0);
    c.next_stage();
    if (++c.wi == kWBufs) c.wi = 0;
  };
  for (int ks = 0;;) {
    stage(Par<0>{}, ks);
    if (++ks == ksteps) break;
    stage(Par<1>{}, ks);
    if (++ks == ksteps) break;
  }
  sm90::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < ACC; ++i) sm90::reg_fence(acc[i]);
  hold(areg0);
  hold(areg1);
  bool rn0 = false, rn1 = false;
  if (!F16) {
    // E4M3 NaN elements (BF16 path): a widened word with low mantissa bits set (mx_widen.h
    // kNanBits). Rows: the quad's four threads hold their k ranges; columns: through shared memory.
    rn0 = (nan_a0 & kNanBits) != 0u;
    rn1 = (nan_a1 & kNanBits) != 0u;
    rn0 = __shfl_xor_sync(0xFFFFFFFFu, rn0, 1) || rn0;
    rn0 = __shfl_xor_sync(0xFFFFFFFFu, rn0, 2) || rn0;
    rn1 = __shfl_xor_sync(0xFFFFFFFFu, rn1, 1) || rn1;
    rn1 = __shfl_xor_sync(0xFFFFFFFFu, rn1, 2) || rn1;
    colnan[(c.part * 2 + c.bh) * BN + c.bn_row] = (nan_b & kNanBits) != 0u ? 1u : 0u;  // [4 / kS4][2][BN]
    fly::named_bar_sync(2, 256);
  }
  const int ct = c.ct;
  auto fix = [&](int i, float v) {
    if (!F16) {
      const int col = acc_col(ct, i);
      uint32_t cn = 0u;
#pragma unroll
      for (int k = 0; k < 8 / kS4; ++k) cn |= colnan[k * BN + col];
      if (cn != 0u || ((i & 2) ? rn1 : rn0)) return __uint_as_float(0x7FC00000u);
    }
    return resc != 0 ? rescale(v, resc) : v;
  };
  store_unit(p, q, row0, col0, ct, acc, fix);
  if (!F16) fly::named_bar_sync(2, 256);  // colnan read by both warpgroups before the next tile writes it
}

// Exact fallback for a tile whose scales no path holds: FP32 dot products per k32 block on the
// CUDA cores, acc += dot * (sa * sb) as the FP8 design promotes, the accumulators in the widened-B
// tiles' shared memory (unused by such a tile: [64][256 consumer threads] floats), so the fast
// paths' registers stay as they are. Slow; real data does not get here (the tests do). Takes and
// returns the ring position.
template <bool FP4>
__device__ __forceinline__ int2 tile_scalar(const KParams& p, uint8_t* ring, uint8_t* wtiles, uint64_t* full,
                                            uint64_t* empty, int ks0, int ks1, int q, int64_t row0, int64_t col0,
                                            int ra, int ct, int s, uint32_t ph) {
  const int kbs = p.K / 32;
  float* sacc = reinterpret_cast<float*>(wtiles) + (threadIdx.x - 128);
  fly::named_bar_sync(2, 256);  // the other warpgroup's last wgmma (reading these tiles) has retired
#pragma unroll 1
  for (int i = 0; i < ACC; ++i) sacc[i * 256] = 0.0f;
#pragma unroll 1
  for (int ks = ks0; ks < ks1; ++ks) {
    sm90::mbar_wait(&full[s], ph);
    const uint8_t* st = ring + s * W::kStage;
    const float* fs = reinterpret_cast<const float*>(st + W::kOffScale);
#pragma unroll 1
    for (int j = 0; j < 4 && ks * 4 + j < kbs; ++j) {
#pragma unroll 1
      for (int i = 0; i < ACC; ++i) {
        const int row = ra + 8 * ((i / 2) % 2), col = acc_col(ct, i);
        float dot = 0.0f;
#pragma unroll 1
        for (int k = 32 * j; k < 32 * j + 32; ++k)
          dot = fmaf(elem(st + W::kOffA, FP4, row, k), elem(st + W::kOffB, FP4, col, k), dot);
        sacc[i * 256] = fmaf(dot, fs[j * kRows + row] * fs[j * kRows + kBM + col], sacc[i * 256]);
      }
    }
    fly::named_bar_sync(2, 256);  // keeps the arrive behind this stage's loads (see tile_mma)
    sm90::mbar_arrive(&empty[s]);
    if (++s == W::kStages) {
      s = 0;
      ph ^= 1;
    }
  }
  float v[ACC];
#pragma unroll
  for (int i = 0; i < ACC; ++i) v[i] = sacc[i * 256];
  store_unit(p, q, row0, col0, ct, v);
  fly::named_bar_sync(2, 256);  // both warpgroups' accumulators read before the next tile widens into these tiles
  return make_int2(s, int(ph));
}

// The consumer warpgroups (64 tile rows each), for one operand format: per tile the path the
// producer chose (the first stage's flag words) and the epilogue's rescale.
template <bool FP4>
__device__ __forceinline__ void consume(const KParams& p, uint8_t* ring, uint8_t* wtiles, uint64_t* full, uint64_t* empty,
                                        uint32_t* colnan) {
  const int total = p.tiles_m * p.tiles_n * splits_of(p);
  const int ksteps = (p.K + kKStep - 1) / kKStep;
  Cons c;
  c.cw = threadIdx.x / 128 - 1;
  c.ct = threadIdx.x % 128;
  c.t = c.ct & 3;
  c.ra = c.cw * 64 + acc_row(c.ct, 0);
  if constexpr (BN == 128) {
    c.bn_row = c.cw * 64 + (c.ct & 63);
    c.bh = c.ct >> 6;
    c.part = 0;
  } else {  // consumer thread i: row i % BN, half (i / BN) % 2, part i / (2 BN)
    const int i = threadIdx.x - 128;
    c.bn_row = i % BN;
    c.bh = (i / BN) & 1;
    c.part = i / (2 * BN);
  }
  c.ring_a = sm90::smem_u32(ring);
  c.wt_a = sm90::smem_u32(wtiles);
  c.b_ld = uint32_t(W::kOffB) + row_off<FP4>(c.bn_row) + (FP4 ? 32u * c.bh : 0u);
  c.b_st = uint32_t(c.bh * W::kWHalf) + row_off<false>(c.bn_row);
  c.a_ld0 = uint32_t(W::kOffA) + row_off<FP4>(c.ra);
  c.a_ld1 = uint32_t(W::kOffA) + row_off<FP4>(c.ra + 8);
  c.mb_off = uint32_t(W::kOffMul) + 4u * uint32_t(2 * c.bh * kRows + kBM + c.bn_row);
  c.ma_off0 = uint32_t(W::kOffMul) + 4u * uint32_t(block_of(0, c.t) * kRows + c.ra);
  c.s = 0;
  c.wi = 0;
  c.ph = 0;
  for (int u = blockIdx.x; u < total; u += gridDim.x) {
    const Unit un = unit_of(p, u, ksteps);
    const Tile tl = tile_of(p.tiles_m, p.tiles_n, p.strip_m, un.t);
    const int64_t row0 = int64_t(tl.tm) * kBM + c.cw * 64, col0 = int64_t(tl.tn) * BN;
    sm90::mbar_wait(&full[c.s], c.ph);
    const int* flag = reinterpret_cast<const int*>(ring + c.s * W::kStage + W::kOffFlag);
    const int path = flag[0], resc = flag[1];  // the whole unit's
    const int n = un.ks1 - un.ks0;
    if (path == kF16) tile_mma<FP4, true>(p, c, ring, full, empty, colnan, n, resc, un.q, row0, col0);
    else if (path == kBf16) tile_mma<FP4, false>(p, c, ring, full, empty, colnan, n, resc, un.q, row0, col0);
    else {
      const int2 r =
          tile_scalar<FP4>(p, ring, wtiles, full, empty, un.ks0, un.ks1, un.q, row0, col0, c.ra, c.ct, c.s, c.ph);
      c.s = r.x;
      c.ph = uint32_t(r.y);
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1) mxfp_widen(const __grid_constant__ KParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* wtiles = ring + W::kStages * W::kStage;
  uint64_t* full = reinterpret_cast<uint64_t*>(wtiles + kWBufs * W::kWBuf);
  uint64_t* empty = full + W::kStages;
  uint32_t* scratch = reinterpret_cast<uint32_t*>(empty + W::kStages);  // [2][4 warps][4], then colnan

  const int wg = threadIdx.x / 128;
  const bool fp4 = p.fp4 != 0;
  if (threadIdx.x == 0) {
    sm90::tma_prefetch_desc(&p.tm_a);
    sm90::tma_prefetch_desc(&p.tm_b);
    for (int s = 0; s < W::kStages; ++s) {
      sm90::mbar_init(&full[s], 129);  // 128 producer threads + the TMA thread's expect_tx arrival
      sm90::mbar_init(&empty[s], 256);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();

  const int total = p.tiles_m * p.tiles_n * splits_of(p);  // work units
  const int kbs = p.K / 32;
  const int ksteps = (p.K + kKStep - 1) / kKStep;

  if (wg == 0) {
    // ---------------- producer warpgroup ----------------
    Regs::producer();
    const int pt = threadIdx.x, warp = pt / 32;
    const uintptr_t al = reinterpret_cast<uintptr_t>(p.sa) | reinterpret_cast<uintptr_t>(p.sb) | uintptr_t(kbs);
    const bool words = (al & 3u) == 0, quads = (al & 15u) == 0;
    // This thread's A row (pt) and B row (pt) of unit u's tile: their scale rows, or null past M / N.
    auto rows_of = [&](int u, const uint8_t*& ra, const uint8_t*& rb) {
      ra = rb = nullptr;
      if (u >= total) return;
      const Tile tl = tile_of(p.tiles_m, p.tiles_n, p.strip_m, unit_of(p, u, ksteps).t);
      const int64_t ga = int64_t(tl.tm) * kBM + pt, gb = int64_t(tl.tn) * BN + pt;
      if (ga < p.M) ra = p.sa + ga * kbs;
      if (pt < BN && gb < p.N) rb = p.sb + gb * kbs;
    };
    // Scale bytes of stage kk from a row (byte j = block 4 kk + j; 0 past K or for a null row).
    auto word = [&](const uint8_t* r, int kk) -> uint32_t {
      if (!r) return 0u;
      if (words) return *reinterpret_cast<const uint32_t*>(r + kk * 4);
      uint32_t w = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (kk * 4 + j < kbs) w |= uint32_t(r[kk * 4 + j]) << (8 * j);
      return w;
    };
    // min / max of a row's scale bytes other than 0xFF over blocks [kb0, kb1) (min 255 > max 0: none)
    auto scan = [&](const uint8_t* row, int kb0, int kb1, uint32_t& mn, uint32_t& mx) {
      if (!row) return;
      auto take = [&](uint32_t e) {
        if (e != 0xFFu) {
          mn = e < mn ? e : mn;
          mx = e > mx ? e : mx;
        }
      };
      if (quads && kb0 % 16 == 0 && (kb1 % 16 == 0 || kb1 == kbs)) {  // kbs is a multiple of 16 here
#pragma unroll 4
        for (int kb = kb0; kb < kb1; kb += 16) {
          const uint4 v = *reinterpret_cast<const uint4*>(row + kb);
          const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int q = 0; q < 16; ++q) take((w[q / 4] >> (8 * (q % 4))) & 0xFFu);
        }
      } else {
#pragma unroll 8
        for (int kb = kb0; kb < kb1; ++kb) take(row[kb]);
      }
    };
    // The look-ahead: the scale words of the stage two ahead (unit u1, stage k1 of [k1, e1), rows ra1 / rb1).
    int u1 = blockIdx.x, k1 = 0, e1 = 0;
    const uint8_t *ra1, *rb1;
    auto enter = [&]() {
      rows_of(u1, ra1, rb1);
      if (u1 < total) {
        const Unit n1 = unit_of(p, u1, ksteps);
        k1 = n1.ks0;
        e1 = n1.ks1;
      }
    };
    enter();
    auto ahead = [&](uint32_t& wa, uint32_t& wb) {
      wa = u1 < total ? word(ra1, k1) : 0u;
      wb = u1 < total ? word(rb1, k1) : 0u;
      if (++k1 >= e1) {
        u1 += gridDim.x;
        enter();
      }
    };
    uint32_t wa0, wb0, wa1, wb1;
    ahead(wa0, wb0);
    ahead(wa1, wb1);
    int s = 0, it = 0;
    uint32_t ph = 0;
    for (int u = blockIdx.x; u < total; u += gridDim.x, ++it) {
      const Unit un = unit_of(p, u, ksteps);
      const Tile tl = tile_of(p.tiles_m, p.tiles_n, p.strip_m, un.t);
      const int m0 = tl.tm * kBM, n0 = tl.tn * BN;
      const bool ina = m0 + pt < p.M, inb = pt < BN && n0 + pt < p.N;
      // The tile's plan (mx_widen.h choose_plan): path and shifts from the min / max over the
      // producer warpgroup of every scale of the tile's rows and columns.
      uint32_t mina = 255, maxa = 0, minb = 255, maxb = 0;
      {
        const uint8_t *ra, *rb;
        rows_of(u, ra, rb);
        const int kb0 = 4 * un.ks0, kb1 = 4 * un.ks1 < kbs ? 4 * un.ks1 : kbs;  // the unit's k32 blocks
        scan(ra, kb0, kb1, mina, maxa);
        scan(rb, kb0, kb1, minb, maxb);
      }
      mina = __reduce_min_sync(0xFFFFFFFFu, mina);
      maxa = __reduce_max_sync(0xFFFFFFFFu, maxa);
      minb = __reduce_min_sync(0xFFFFFFFFu, minb);
      maxb = __reduce_max_sync(0xFFFFFFFFu, maxb);
      uint32_t* sc = scratch + (it & 1) * 16;
      if ((pt & 31) == 0) {
        sc[warp * 4 + 0] = mina;
        sc[warp * 4 + 1] = maxa;
        sc[warp * 4 + 2] = minb;
        sc[warp * 4 + 3] = maxb;
      }
      fly::named_bar_sync(1, 128);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        mina = sc[w * 4 + 0] < mina ? sc[w * 4 + 0] : mina;
        maxa = sc[w * 4 + 1] > maxa ? sc[w * 4 + 1] : maxa;
        minb = sc[w * 4 + 2] < minb ? sc[w * 4 + 2] : minb;
        maxb = sc[w * 4 + 3] > maxb ? sc[w * 4 + 3] : maxb;
      }
      const Plan pl = choose_plan(int(mina), int(maxa), int(minb), int(maxb), fp4);
      const bool f16 = pl.path == kF16;
      for (int ks = un.ks0; ks < un.ks1; ++ks) {
        const uint32_t wa = wa0, wb = wb0;
        wa0 = wa1;
        wb0 = wb1;
        ahead(wa1, wb1);  // two stages ahead
        sm90::mbar_wait(&empty[s], ph ^ 1);
        uint8_t* st = ring + s * W::kStage;
        if (pt == 0) {
          sm90::mbar_arrive_expect_tx(&full[s], uint32_t(fp4 ? (kBM + BN) * 64 : (kBM + BN) * 128));
          const int kc = fp4 ? ks * (kKStep / 2) : ks * kKStep;
          sm90::tma_load_2d(st + W::kOffA, &p.tm_a, &full[s], kc, m0);
          sm90::tma_load_2d(st + W::kOffB, &p.tm_b, &full[s], kc, n0);
        }
        if (pl.path != kScalar) {
          uint32_t* mul = reinterpret_cast<uint32_t*>(st + W::kOffMul);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const bool kin = ks * 4 + j < kbs;
            mul[j * kRows + pt] = multiplier((wa >> (8 * j)) & 0xFFu, pl.ta, ina && kin, f16);
            mul[j * kRows + kBM + pt] = multiplier((wb >> (8 * j)) & 0xFFu, pl.tb, inb && kin, f16);
          }
        } else {
          float* fs = reinterpret_cast<float*>(st + W::kOffScale);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const bool kin = ks * 4 + j < kbs;
            fs[j * kRows + pt] = ina && kin ? fly::mxe::e8m0_to_float(uint8_t(wa >> (8 * j))) : 0.0f;
            fs[j * kRows + kBM + pt] = inb && kin ? fly::mxe::e8m0_to_float(uint8_t(wb >> (8 * j))) : 0.0f;
          }
        }
        if (pt == 0) {
          int* flag = reinterpret_cast<int*>(st + W::kOffFlag);
          flag[0] = pl.path;
          flag[1] = -(pl.ta + pl.tb);  // the epilogue's rescale exponent
        }
        sm90::mbar_arrive(&full[s]);
        if (++s == W::kStages) {
          s = 0;
          ph ^= 1;
        }
      }
    }
  } else {
    // ---------------- consumer warpgroups ----------------
    Regs::consumer();
    if (fp4) consume<true>(p, ring, wtiles, full, empty, scratch + 2 * 16);
    else consume<false>(p, ring, wtiles, full, empty, scratch + 2 * 16);
  }
}
