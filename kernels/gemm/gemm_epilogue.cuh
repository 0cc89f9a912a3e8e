// SPDX-License-Identifier: Apache-2.0
// Epilogues of the sm_90a GEMM.
//  * store_tile: bias + convert + bounds-checked stores straight from the wgmma accumulators
//    (persistent path). Accumulator (m64nN layout): thread t of the warpgroup holds rows
//    16*(t/32) + (t%32)/4 (+8) and column pairs 8*j + 2*(t%4), for j < N/8.
//  * store_tile_smem (Config::EPI == 1, persistent path): each consumer warpgroup stages its
//    64 x BN block in shared memory laid out as C's block (BN = 256: in 4 passes of 64 columns),
//    then writes C in 16-byte row chunks.
//  * split-K: each CTA of the cluster parks its fp32 partial tile in its own shared memory; after
//    a cluster barrier CTA r sums rows slice r over all CTAs through DSMEM and writes C
//    (gemm_reduce.cuh, shared with the decode kernel).
#pragma once

#include <type_traits>

#include "common/sm90.h"
#include "gemm/gemm_config.cuh"
#include "gemm/gemm_reduce.cuh"
#include "gemm/gemm_scheduler.cuh"

namespace fly::gemm {

#if defined(FLY_DTYPE_IS_FP16)
__device__ __forceinline__ float to_f(Elem v) { return __half2float(v); }
__device__ __forceinline__ Elem from_f(float v) { return __float2half_rn(v); }
// Two values to one packed pair (one cvt.rn.f16x2.f32 / cvt.rn.bf16x2.f32 instead of two), a
// in the low half: the lower address.
__device__ __forceinline__ __half2 pack_f(float a, float b) { return __floats2half2_rn(a, b); }
#else
__device__ __forceinline__ float to_f(Elem v) { return __bfloat162float(v); }
__device__ __forceinline__ Elem from_f(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ __nv_bfloat162 pack_f(float a, float b) { return __floats2bfloat162_rn(a, b); }
#endif
__device__ __forceinline__ uint32_t pack_u32(float a, float b) {
  const auto pr = pack_f(a, b);
  return *reinterpret_cast<const uint32_t*>(&pr);
}

// Output view: D(i, j) lives at C[i*ldc + j] (no swap) or C[j*ldc + i] (swap).
struct OutView {
  using Elem2 = typename std::conditional<kBF16, __nv_bfloat162, __half2>::type;
  using Elem = fly::gemm::Elem;
  Elem* c;
  const Elem* bias;
  int64_t ldc;
  int rows, cols;  // D's extent
  bool swap, vec;
  __device__ explicit OutView(const GemmParams& p)
      : c(static_cast<Elem*>(p.c)), bias(static_cast<const Elem*>(p.bias)), ldc(p.ldc),
        rows(p.rows), cols(p.cols), swap(p.swap != 0), vec(p.c_vec != 0) {}

  // Two horizontally adjacent D values (i, j), (i, j+1).
  __device__ __forceinline__ void store_pair(int i, int j, float v0, float v1) const {
    if (i >= rows || j >= cols) return;
    if (!swap) {
      if (bias) {
        v0 += to_f(bias[j]);
        if (j + 1 < cols) v1 += to_f(bias[j + 1]);
      }
      Elem* dst = c + static_cast<int64_t>(i) * ldc + j;
      if (vec && j + 1 < cols) {
        *reinterpret_cast<Elem2*>(dst) = pack_f(v0, v1);
      } else {
        dst[0] = from_f(v0);
        if (j + 1 < cols) dst[1] = from_f(v1);
      }
    } else {
      const float b = bias ? to_f(bias[i]) : 0.f;
      c[static_cast<int64_t>(j) * ldc + i] = from_f(v0 + b);
      if (j + 1 < cols) c[static_cast<int64_t>(j + 1) * ldc + i] = from_f(v1 + b);
    }
  }
};

// Stores one warpgroup's 64 x NCOL accumulator block (NCOL / 2 values from `acc`, in the m64nN
// layout) whose first element is D(i_base, j_base).
template <int NCOL = Config::WG_N>
__device__ __forceinline__ void store_block(const OutView& out, int i_base, int j_base, const float* acc) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int i0 = i_base + warp * 16 + lane / 4;
  const int j0 = j_base + 2 * (lane % 4);
#pragma unroll
  for (int j8 = 0; j8 < NCOL / 8; ++j8) {
    out.store_pair(i0, j0 + 8 * j8, acc[4 * j8 + 0], acc[4 * j8 + 1]);
    out.store_pair(i0 + 8, j0 + 8 * j8, acc[4 * j8 + 2], acc[4 * j8 + 3]);
  }
}

__device__ __forceinline__ void store_tile(const OutView& out, const WorkUnit& u, int wg,
                                           const float (&acc)[Config::ACC]) {
  const int i_base = u.tm * Config::BM, j_base = u.tn * Config::BN;
  if constexpr (Config::PP) {
    // Ping-pong: the warpgroup holds the whole tile, its two 64-row halves one after the other.
#pragma unroll
    for (int h = 0; h < Config::MH; ++h) store_block(out, i_base + 64 * h, j_base, acc + h * (Config::ACC / Config::MH));
  } else if constexpr (Config::BM == 128) {
    store_block(out, i_base + wg * 64, j_base, acc);  // the warpgroup owns rows wg*64.. of the tile
  } else if constexpr (Config::KW == 2) {
    // After kw_exchange: the warpgroup's columns wg*BN/2.. are its accumulators wg*ACC/2.. (a
    // constant offset in each branch, so the accumulators stay in registers)
    constexpr int H = Config::BN / 2;
    if (wg == 0) store_block<H>(out, i_base, j_base, acc);
    else store_block<H>(out, i_base, j_base + H, acc + Config::ACC / 2);
  } else {
    store_block(out, i_base, j_base + wg * Config::WG_N, acc);  // BM = 64: columns wg*WG_N..
  }
}

// KW = 2 (gemm_config.cuh): both warpgroups hold partial sums of the whole 64 x BN tile, thread t
// of each the same elements. Warpgroup w keeps columns [w BN/2, (w+1) BN/2), its accumulators
// [w ACC/2, (w+1) ACC/2), and hands the other half to the other warpgroup through `xchg`
// (kw_exchange_bytes: float4 j of thread t of warpgroup w at [w][j][t], so each warp's stores and
// loads are 512 contiguous bytes). Named barrier kConsumers (256 threads; narrow tiles have no split-K,
// whose barrier it is) orders the hand-over, and a second one keeps a next tile's hand-over from
// overwriting what the other warpgroup is still reading.
template <int WG>
__device__ __forceinline__ void kw_exchange_as(float (&acc)[Config::ACC], float4* x) {
  constexpr int H = Config::ACC / 2, H4 = H / 4, GIVE = (1 - WG) * H, KEEP = WG * H;
  static_assert(H % 4 == 0, "float4 hand-over");
  const int t = threadIdx.x % 128;
#pragma unroll
  for (int j = 0; j < H4; ++j)
    x[(WG * H4 + j) * 128 + t] = make_float4(acc[GIVE + 4 * j], acc[GIVE + 4 * j + 1], acc[GIVE + 4 * j + 2],
                                             acc[GIVE + 4 * j + 3]);
  consumers_sync_unaligned();
#pragma unroll
  for (int j = 0; j < H4; ++j) {
    const float4 v = x[((1 - WG) * H4 + j) * 128 + t];
    acc[KEEP + 4 * j] += v.x;
    acc[KEEP + 4 * j + 1] += v.y;
    acc[KEEP + 4 * j + 2] += v.z;
    acc[KEEP + 4 * j + 3] += v.w;
  }
  consumers_sync_unaligned();
}
// The warpgroup index as a template argument: constant accumulator indices keep them in registers.
__device__ __forceinline__ void kw_exchange(float (&acc)[Config::ACC], int wg, float* xchg) {
  if (wg == 0) kw_exchange_as<0>(acc, reinterpret_cast<float4*>(xchg));
  else kw_exchange_as<1>(acc, reinterpret_cast<float4*>(xchg));
}

// ---- shared-memory epilogue (Config::EPI == 1) ---------------------------------------------------
// Copies a staged NROWS x NCOLS block of C (rows padded to NCOLS + 8) whose first element is
// C(crow0, ccol0) out to C in 16-byte chunks, clipped to C; run by the warpgroup's 128 threads.
template <int NROWS, int NCOLS, bool SWAP>
__device__ __forceinline__ void copy_staged(const OutView& out, const Elem* s, int crow0, int ccol0, int t) {
  constexpr int LDS = NCOLS + 8;
  constexpr int CHUNKS = NCOLS / 8;
  const int c_rows = SWAP ? out.cols : out.rows, c_cols = SWAP ? out.rows : out.cols;  // C's M, N
  const bool vec16 = (reinterpret_cast<uintptr_t>(out.c) & 15) == 0 && out.ldc % 8 == 0;
  for (int e = t; e < NROWS * CHUNKS; e += 128) {
    const int r = e / CHUNKS, cc = (e % CHUNKS) * 8;
    const int crow = crow0 + r, ccol = ccol0 + cc;
    if (crow >= c_rows || ccol >= c_cols) continue;
    const Elem* src = s + r * LDS + cc;
    Elem* dst = out.c + static_cast<int64_t>(crow) * out.ldc + ccol;
    if (vec16 && ccol + 8 <= c_cols) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    } else {
      for (int q = 0; q < 8 && ccol + q < c_cols; ++q) dst[q] = src[q];
    }
  }
}

// Writes the warpgroup's D columns 8 j8_0 .. 8 j8_0 + W - 1 (biased, converted; the first is D
// column j_base) into the staging tile `s` in C's orientation: 64 rows of W + 8, or with SWAP
// (C = D^T) W rows of 64 + 8. r0, c0: this thread's first local D row and column.
template <bool SWAP, int W>
__device__ __forceinline__ void stage_columns(const OutView& out, Elem* s, const float (&acc)[Config::ACC], int j8_0,
                                              int i_base, int j_base, int r0, int c0) {
  using Elem2 = OutView::Elem2;
  if constexpr (!SWAP) {
    constexpr int LD = W + 8;
#pragma unroll
    for (int jj = 0; jj < W / 8; ++jj) {
      const int j8 = j8_0 + jj;
      const int c = c0 + 8 * jj, j = j_base + c;
      const float b0 = out.bias && j < out.cols ? to_f(out.bias[j]) : 0.f;
      const float b1 = out.bias && j + 1 < out.cols ? to_f(out.bias[j + 1]) : 0.f;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<Elem2*>(s + (r0 + 8 * h) * LD + c) =
            pack_f(acc[4 * j8 + 2 * h] + b0, acc[4 * j8 + 2 * h + 1] + b1);
    }
  } else {
    constexpr int LD = 64 + 8;
    float brow[2];  // bias by D row
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = i_base + r0 + 8 * h;
      brow[h] = out.bias && i < out.rows ? to_f(out.bias[i]) : 0.f;
    }
#pragma unroll
    for (int jj = 0; jj < W / 8; ++jj) {
      const int j8 = j8_0 + jj;
      const int c = c0 + 8 * jj;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        s[c * LD + r0 + 8 * h] = from_f(acc[4 * j8 + 2 * h] + brow[h]);
        s[(c + 1) * LD + r0 + 8 * h] = from_f(acc[4 * j8 + 2 * h + 1] + brow[h]);
      }
    }
  }
}

// The warpgroup writes its 64 x BN block of D (biased, converted) into its staging tile in C's
// orientation (rows of C; with SWAP, C = D^T, so the tile is BN rows of 64), with rows padded by 8
// elements so the accumulator layout's stores hit distinct banks; then its 128 threads copy the tile
// to C in 16-byte chunks along C's rows: full sectors instead of the 4-byte pair stores of
// store_tile. Ragged edges and a C that is not 16-byte aligned take element stores. Named barrier
// kWarpgroup + wg (128 threads) orders the tile's reuse across tiles and its writes before its reads.
template <bool SWAP>
__device__ __forceinline__ void store_tile_smem_whole(const OutView& out, const WorkUnit& u, int wg,
                                                      const float (&acc)[Config::ACC], uint8_t* stage) {
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  Elem* s = reinterpret_cast<Elem*>(stage);
  const int bar = named_bar::kWarpgroup + wg;
  named_bar_sync<128>(bar);  // the previous tile's reads are done
  const int i_base = u.tm * Config::BM + wg * 64;  // D row of the block's first row
  const int j_base = u.tn * Config::BN;            // D column of the block's first column
  const int r0 = warp * 16 + lane / 4;             // this thread's local D rows: r0, r0 + 8
  const int c0 = 2 * (lane % 4);                   // and columns c0 + 8 * j8 (+1)
  stage_columns<SWAP, Config::BN>(out, s, acc, 0, i_base, j_base, r0, c0);
  named_bar_sync<128>(bar);  // the tile is complete
  copy_staged<SWAP ? Config::BN : 64, SWAP ? 64 : Config::BN, SWAP>(out, s, SWAP ? j_base : i_base,
                                                                   SWAP ? i_base : j_base, t);
}

// BN = 256: the same in 4 passes of W = 64 D columns (epi_pass_cols), each staged, then copied
// out, so that the two staging tiles fit beside a 4-stage ring. The first barrier of each pass
// waits for the previous pass's (or tile's) reads of the staging tile.
// NOTE: a separate function, not a 1-pass instance of it for BN <= 128: ptxas spilled 56-88 B of
// the BN = 128 kernel when its epilogue took the pass structure.
template <bool SWAP>
__device__ __forceinline__ void store_tile_smem_passes(const OutView& out, const WorkUnit& u, int wg,
                                                       const float (&acc)[Config::ACC], uint8_t* stage) {
  constexpr int W = epi_pass_cols(Config::BN);  // D columns per pass
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  Elem* s = reinterpret_cast<Elem*>(stage);
  const int bar = named_bar::kWarpgroup + wg;
  const int i_base = u.tm * Config::BM + wg * 64;  // D row of the block's first row
  const int r0 = warp * 16 + lane / 4;             // this thread's local D rows: r0, r0 + 8
  const int c0 = 2 * (lane % 4);                   // and columns c0 + 8 * j8 (+1)
#pragma unroll
  for (int pass = 0; pass < Config::BN / W; ++pass) {
    const int j_base = u.tn * Config::BN + pass * W;  // D column of the pass's first column
    named_bar_sync<128>(bar);  // the previous pass's reads are done
    stage_columns<SWAP, W>(out, s, acc, pass * (W / 8), i_base, j_base, r0, c0);
    named_bar_sync<128>(bar);  // the pass's tile is complete
    copy_staged<SWAP ? W : 64, SWAP ? 64 : W, SWAP>(out, s, SWAP ? j_base : i_base, SWAP ? i_base : j_base, t);
  }
}

template <bool SWAP>
__device__ __forceinline__ void store_tile_smem(const OutView& out, const WorkUnit& u, int wg,
                                                const float (&acc)[Config::ACC], uint8_t* stage) {
  if constexpr (epi_pass_cols(Config::BN) == Config::BN) store_tile_smem_whole<SWAP>(out, u, wg, acc, stage);
  else store_tile_smem_passes<SWAP>(out, u, wg, acc, stage);
}

// ---- TMA-store epilogues (Config::EPI == 2, 3; GemmParams::c_tma) -------------------------------
// Per warp, with no warpgroup barrier: warp w of the consumer warpgroup owns rows 16 w .. 16 w + 15
// of the warpgroup's 64 x BN block. In passes of 64 columns it writes its 16 x 64 piece (biased,
// converted to packed pairs) with stmatrix into the next box of its own ring of NBOX 16 x 64 boxes
// (2 KiB, laid out as tm_c's 128B swizzle wants it: 16-byte chunk k of row r at chunk k ^ (r % 8),
// so each 8-row matrix hits all 32 banks), and lane 0 stores the box with cp.async.bulk.tensor,
// which clips it to C. The stores run on asynchronously: the warp goes on to its next pass or tile
// (mainloop included) and waits, before writing a box again, only until the store issued from it
// NBOX passes back has read it. EPI = 2: NBOX = 2; EPI = 3: NBOX = BN / 64, one box per pass, so
// the waits are for the previous tile's stores (issued a whole mainloop ago). `npass` counts the
// warp's passes (which box is next; every warp of the warpgroup counts the same).
// Each warp issues its own stores because the waits cost nothing and issuing the 4 stores of a tile
// costs the warp ~600 cycles, while issuing them from lanes of one producer warp (mbarriers per box)
// is slower: a lane blocked in try_wait holds up the others (H200, bench/RESULTS.md, "a per-warp
// TMA-store epilogue").

// Stages pass `pass` of the warp's 16 rows (64 columns from D column j_base) into the box at
// shared address `box`: one stmatrix .x4 per 16 columns, its matrices (rows 0-7 | 8-15) x (columns
// 8 g | 8 g + 8) being the accumulator pairs acc[4 j8 + 0, 1], [4 j8 + 2, 3], [4 (j8 + 1) + 0, 1],
// [4 (j8 + 1) + 2, 3]; lane l gives the address of row (l % 8) + 8 ((l / 8) % 2) of column group
// 2 q + l / 16.
__device__ __forceinline__ void stage_pass_sw128(const OutView& out, const float (&acc)[Config::ACC], int pass,
                                                 int j_base, uint32_t box, int lane) {
  const int sr = (lane & 7) + 8 * ((lane >> 3) & 1), sg = lane >> 4;  // stmatrix row and group offset
  const int c0 = 2 * (lane % 4);                                       // this lane's columns c0 + 8 j8 (+1)
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int j8 = pass * 8 + 2 * q;
    float b[4] = {0.f, 0.f, 0.f, 0.f};  // bias of this lane's columns in groups 2 q, 2 q + 1
    if (out.bias) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j_base + 16 * q + 8 * (e / 2) + c0 + e % 2;
        b[e] = j < out.cols ? to_f(out.bias[j]) : 0.f;
      }
    }
    const uint32_t addr = box + sr * 128 + (((2 * q + sg) ^ (sr & 7)) << 4);
    sm90::stmatrix_x4(addr, pack_u32(acc[4 * j8 + 0] + b[0], acc[4 * j8 + 1] + b[1]),
                      pack_u32(acc[4 * j8 + 2] + b[0], acc[4 * j8 + 3] + b[1]),
                      pack_u32(acc[4 * j8 + 4] + b[2], acc[4 * j8 + 5] + b[3]),
                      pack_u32(acc[4 * j8 + 6] + b[2], acc[4 * j8 + 7] + b[3]));
  }
}

// The warp's part of it: its 16 rows from C row `row0`, tile column `tn` (grouped mode calls this
// for the warps whose rows lie inside their group: gemm_grouped_sm90.cu).
__device__ __forceinline__ void store_warp_rows_tma(const GemmParams& p, const OutView& out, int row0, int tn,
                                                    const float (&acc)[Config::ACC], uint8_t* boxes, uint32_t& npass) {
  constexpr int NBOX = epi_warp_boxes(Config::BN, Config::EPI);
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const uint32_t ring = sm90::smem_u32(boxes) + warp * NBOX * kEpiWarpBox;
#pragma unroll
  for (int pass = 0; pass < Config::BN / 64; ++pass, ++npass) {
    const uint32_t box = ring + (npass % NBOX) * kEpiWarpBox;
    const int j_base = tn * Config::BN + pass * 64;  // C column of the pass's first column
    if (lane == 0) sm90::bulk_wait_group_read<NBOX - 1>();  // the store from this box NBOX passes back read it
    __syncwarp();
    stage_pass_sw128(out, acc, pass, j_base, box, lane);
    sm90::fence_proxy_async_smem();  // the box's generic-proxy writes, visible to the TMA
    __syncwarp();
    if (lane == 0) {
      sm90::tma_store_2d(&p.tm_c, box, j_base, row0);
      sm90::bulk_commit_group();
    }
  }
}
__device__ __forceinline__ void store_tile_tma(const GemmParams& p, const OutView& out, const WorkUnit& u, int wg,
                                               const float (&acc)[Config::ACC], uint8_t* boxes, uint32_t& npass) {
  const int warp = (threadIdx.x % 128) / 32;
  const int row0 = u.tm * Config::BM + wg * 64 + warp * kEpiWarpRows;  // C row of the warp's first row
  store_warp_rows_tma(p, out, row0, u.tn, acc, boxes, npass);
}

// ---- stream-K fixup through global memory (GemmParams::sk_tiles) ------------------------------
// A cut tile's contributors store their accumulators, as each thread holds them, in their CTA's
// slot of sk_ws (float4 j of thread t at [j][t]: each warp store is 512 contiguous bytes) and
// raise their flag to the launch's epoch; the owner adds the slots of its contributors (the same
// member of lower CTA groups: every sk_group-th CTA) in CTA order into its own accumulators, then
// stores the tile like any other. The flag protocol is CUTLASS's barrier pattern: the warpgroup's
// named barrier orders its 128 threads' stores before thread 0's gpu-scope release; thread 0 of
// the owner's warpgroup acquires, and the barrier orders the others' loads after.
__device__ __forceinline__ float4* sk_slot(const GemmParams& p, int cta, int wg) {
  return reinterpret_cast<float4*>(p.sk_ws + (static_cast<size_t>(cta) * 2 + wg) * 128 * Config::ACC);
}

__device__ __forceinline__ void sk_park(const GemmParams& p, int wg, const float (&acc)[Config::ACC]) {
  const int t = threadIdx.x % 128;
  float4* dst = sk_slot(p, blockIdx.x, wg);
#pragma unroll
  for (int j = 0; j < Config::ACC / 4; ++j)
    __stcg(dst + j * 128 + t, make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
  warpgroup_sync(wg);
  if (t == 0) sm90::st_release_gpu(p.sk_flags + 2 * blockIdx.x + wg, p.sk_epoch);
}

__device__ __forceinline__ void sk_gather(const GemmParams& p, const WorkUnit& u, int wg, float (&acc)[Config::ACC]) {
  const int t = threadIdx.x % 128;
  for (int c = u.first_contrib; c < static_cast<int>(blockIdx.x); c += p.sk_group) {
    if (t == 0) {
      uint32_t* flag = p.sk_flags + 2 * c + wg;
      while (sm90::ld_acquire_gpu(flag) != p.sk_epoch) __nanosleep(32);
      *reinterpret_cast<volatile uint32_t*>(flag) = 0u;  // for the next launch (stream-ordered)
    }
    warpgroup_sync(wg);
    const float4* src = sk_slot(p, c, wg);
#pragma unroll
    for (int j = 0; j < Config::ACC / 4; ++j) {
      const float4 v = __ldcg(src + j * 128 + t);
      acc[4 * j] += v.x;
      acc[4 * j + 1] += v.y;
      acc[4 * j + 2] += v.z;
      acc[4 * j + 3] += v.w;
    }
  }
}

// ---- split-K through distributed shared memory (gemm_reduce.cuh) ----------------------------------
using PartialLayout = PartialLayoutT<Config::BM, Config::BN>;

// Both consumer warpgroups write their halves; the caller syncs the cluster afterwards.
// NOTE: SWAP is a template parameter so every store is a constant offset from one base address;
// with a run-time layout the address arithmetic of 2*BN stores spilled accumulators.
template <bool SWAP>
__device__ __forceinline__ void park_partial(float* part, int wg, const float (&acc)[Config::ACC]) {
  const PartialLayout L{SWAP};
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  float* b = part + L.index(wg * 64 + warp * 16 + lane / 4, 2 * (lane % 4));
#pragma unroll
  for (int j8 = 0; j8 < Config::BN / 8; ++j8) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (SWAP) {
        constexpr int S = Config::BM + 4;
        b[(8 * j8) * S + 8 * h] = acc[4 * j8 + 2 * h];
        b[(8 * j8 + 1) * S + 8 * h] = acc[4 * j8 + 2 * h + 1];
      } else {
        constexpr int S = Config::BN + 4;
        *reinterpret_cast<float2*>(b + (8 * h) * S + 8 * j8) =
            make_float2(acc[4 * j8 + 2 * h], acc[4 * j8 + 2 * h + 1]);
      }
    }
  }
}

// Sums slice `rank` of the outer rows over the cluster's `split` partials and writes C.
// Runs on the 256 consumer threads (ct = 0..255).
__device__ __forceinline__ void reduce_partials(const OutView& out, const WorkUnit& u,
                                                const float* part, const PartialLayout& L,
                                                int rank, int split, int ct) {
  reduce_partials_t<256>(out, u, part, L, rank, split, ct);
}

}  // namespace fly::gemm
