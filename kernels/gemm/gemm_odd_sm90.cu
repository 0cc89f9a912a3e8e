// SPDX-License-Identifier: Apache-2.0
// sm_90a GEMM for strides TMA cannot address: C = A @ B (+bias), BF16/FP16 in/out, FP32
// accumulation, the four layouts, any leading dimension and any element-aligned base.
// One compile per variant (FLY_DTYPE_IS_*, FLY_BN, FLY_STAGES; tuning/gemm.json, gemm_odd_*).
//
// The TMA kernel (gemm_sm90.cu) with another producer. Block of 384 threads = 3 warpgroups:
//   wg 0: loads. All 128 threads copy each ring stage's P tile (128 rows of A) and Q tile (bn rows
//         of B^T) from global memory with cp.async (16, 8 or 4 bytes per copy, whatever the
//         operand's alignment allows: gemm_odd_params.h) into exactly the layout a 128B-swizzled
//         TMA box has (so the consumers are the TMA kernel's, unchanged); an operand whose lines
//         are only 2-byte aligned comes in 4-byte copies of each row's aligned window and is
//         shifted into place in shared memory (copy_tile_e2). Elements past M, N or K are
//         zeros (cp.async src-size 0, or element copies for a granule straddling the end).
//   wg 1, 2: consumers: gemm_mainloop.cuh consumer_mma (wgmma on the ring's stages) and the
//         register epilogue (gemm_epilogue.cuh store_tile: bias, convert, bounds-checked stores
//         for any ldc).
// Hand-over of a stage: each loading thread issues the stage's copies as one cp.async group; once
// kLag more groups are issued it waits for this one (cp.async.wait_group), makes the writes
// (and the 2-byte operands' shifts) visible to the async proxy that wgmma reads shared memory
// through (fence.proxy.async) and arrives on the stage's full barrier (128 arrivals complete it).
// With the lag of one stage (kLag) two stages' copies are in flight per thread; it needs
// STAGES >= 3 (the consumers release a stage only after the next one has landed).
// Persistent tiles (TileScheduler, split 1), or for few tiles over a long K split-K clusters of
// up to 8 CTAs reducing through distributed shared memory (gemm_plan.h choose_split); no
// stream-K, no multicast, no swap-AB.
#include "gemm/gemm_config.cuh"
#include "gemm/gemm_epilogue.cuh"
#include "gemm/gemm_mainloop.cuh"
#include "gemm/gemm_odd_params.h"
#include "gemm/gemm_scheduler.cuh"

namespace fly::gemm {

static_assert(Config::BM == 128 && Config::MC == 1 && Config::MP == 1 && Config::KB == 1 && Config::KW == 1 &&
                  !Config::PP && Config::EPI == 0,
              "cp.async GEMM: 128-row tiles, one k block per stage, no multicast, register epilogue");
static_assert(Config::STAGES >= 3, "the hand-over lag needs three stages");
static_assert(Config::BN % 64 == 0, "MN-major Q tiles come in 64-wide chunks");

// Register split of the cp.async kernel: gemm_config.cuh kOddRegisterSplit.
using OddRegs = RegSplit<2, kOddRegisterSplit.producer, kOddRegisterSplit.consumer>;
static_assert(Config::ACC + 32 <= OddRegs::kConsumer, "accumulators fit the consumers' registers");

template <int G>
__device__ __forceinline__ void cp_async(uint32_t dst, const void* src, int bytes) {
  if constexpr (G == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(G), "r"(bytes) : "memory");
}
// A granule only partly inside the operand (its first `bytes` bytes, 0 < bytes < G, even): element
// loads and shared stores, zeros after them. cp.async with a short src-size would read (and
// compute-sanitizer reports) the whole granule, which can run past the allocation's end.
template <int G>
__device__ __forceinline__ void copy_partial(uint32_t dst, const char* src, int bytes) {
#pragma unroll
  for (int b = 0; b < G; b += 2) {
    const uint16_t v = b < bytes ? __ldg(reinterpret_cast<const uint16_t*>(src + b)) : uint16_t(0);
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(dst + b), "h"(v) : "memory");
  }
}
// One 4-byte granule: a cp.async when wholly inside (or wholly outside: zero-filled, nothing read;
// the source is then any aligned address), else (2 bytes inside) one element and a zero.
__device__ __forceinline__ void copy_word(uint32_t dst, const char* src, const char* dummy, int bytes) {
  if (bytes == 2) {
    const uint32_t v = __ldg(reinterpret_cast<const uint16_t*>(src));
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst), "r"(v) : "memory");
  } else {
    cp_async<4>(dst, bytes > 0 ? src : dummy, bytes);
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Shared-memory row j of an operand tile (ROWS rows of 128 bytes: 64 elements contiguous in
// global memory) and where it comes from. K-major: tile row j is operand row row0 + j from k0.
// MN-major: the tile is ROWS / 64 chunks of [64 k][64 mn]; row j is k row k0 + j % 64 from
// column row0 + 64 (j / 64). `valid` counts the row's elements inside the operand (0..64).
struct RowSrc {
  int64_t line;
  int off, valid;
};
__device__ __forceinline__ RowSrc row_src(bool kmajor, int j, int row0, int k0, int rows, int k) {
  RowSrc s;
  if (kmajor) {
    s.line = row0 + j;
    s.off = k0;
    s.valid = s.line < rows ? min(64, k - k0) : 0;
  } else {
    s.line = k0 + (j & 63);
    s.off = row0 + 64 * (j >> 6);
    s.valid = s.line < k ? min(64, rows - s.off) : 0;
  }
  return s;
}

// Byte (128B swizzle, as TMA writes a box whose rows are 128 bytes): 16-byte chunk c of row j
// lands in chunk c ^ (j % 8). The tile is 1024-byte aligned (Ring::at).
__device__ __forceinline__ uint32_t swz(uint32_t tile, int j, int byte) {
  return tile + j * kRowBytes + ((((byte >> 4) ^ (j & 7)) << 4) | (byte & 15));
}

// One operand tile of ROWS rows, G-byte copies, spread over the 128 loading threads: a row is
// 128 / G granules, so a pass of the warpgroup covers G rows, consecutive threads taking
// consecutive granules of a row (coalesced). Thread t always takes granule q = t % (128 / G) of
// rows j0 + G * it (j0 = t / (128 / G) < G): its source advances by G lines per pass and its
// swizzled destination chunk is (q16 ^ (j & 7)), j & 7 = (j0 & 7) ^ ((G * it) & 7).
template <int G, int ROWS>
__device__ __forceinline__ void load_tile_cp(uint32_t tile, const OddOperand& o, bool kmajor, int row0, int k0,
                                             int k, int tid) {
  constexpr int PER_ROW = kRowBytes / G, PASSES = ROWS / G;
  static_assert(ROWS % G == 0 && 64 % G == 0, "whole passes of the warpgroup, inside one 64-row chunk");
  const char* base = static_cast<const char*>(o.data);
  const int q = tid % PER_ROW, j0 = tid / PER_ROW;
  const int e0 = q * (G / 2);  // first element of the granule in its row
  const uint32_t dst0 = tile + j0 * kRowBytes + ((q * G) & 15);
  const int qc = (q * G) >> 4, sw0 = j0 & 7;
  const int64_t ld2 = o.ld * 2;
  if (kmajor) {
    // Row j: operand row row0 + j from k0; all rows have the same k extent.
    const int bytes_k = max(0, min(G, (min(64, k - k0) - e0) * 2));
    const int rows_left = o.rows - row0 - j0;  // pass it is inside the operand when G * it < rows_left
    const char* src = base + (int64_t(row0 + j0) * o.ld + k0 + e0) * 2;
    if (bytes_k == G || bytes_k == 0) {
#pragma unroll 8
      for (int it = 0; it < PASSES; ++it) {
        const int bytes = G * it < rows_left ? bytes_k : 0;
        const uint32_t dst = dst0 + G * it * kRowBytes + ((qc ^ sw0 ^ ((G * it) & 7)) << 4);
        cp_async<G>(dst, bytes > 0 ? src : base, bytes);  // nothing is read when bytes == 0
        src += G * ld2;
      }
    } else {  // this thread's granule straddles K's end (the last k step only)
#pragma unroll 1
      for (int it = 0; it < PASSES; ++it) {
        const int bytes = G * it < rows_left ? bytes_k : 0;
        const uint32_t dst = dst0 + G * it * kRowBytes + ((qc ^ sw0 ^ ((G * it) & 7)) << 4);
        copy_partial<G>(dst, src, bytes);
        src += G * ld2;
      }
    }
  } else {
    // Chunk c (64 MN elements from row0 + 64 c), row r: k line k0 + r.
    const int k_left = k - k0 - j0;  // row r = j0 + G * it2 is inside K when G * it2 < k_left
#pragma unroll
    for (int c = 0; c < ROWS / 64; ++c) {
      const int bytes_c = max(0, min(G, (min(64, o.rows - row0 - 64 * c) - e0) * 2));
      const char* src = base + (int64_t(k0 + j0) * o.ld + row0 + 64 * c + e0) * 2;
      if (bytes_c == G || bytes_c == 0) {
#pragma unroll 8
        for (int it2 = 0; it2 < 64 / G; ++it2) {
          const int it = c * (64 / G) + it2;
          const int bytes = G * it2 < k_left ? bytes_c : 0;
          const uint32_t dst = dst0 + G * it * kRowBytes + ((qc ^ sw0 ^ ((G * it) & 7)) << 4);
          cp_async<G>(dst, bytes > 0 ? src : base, bytes);
          src += G * ld2;
        }
      } else {  // this thread's granule straddles the operand's last row (M or N edge)
#pragma unroll 1
        for (int it2 = 0; it2 < 64 / G; ++it2) {
          const int it = c * (64 / G) + it2;
          const int bytes = G * it2 < k_left ? bytes_c : 0;
          const uint32_t dst = dst0 + G * it * kRowBytes + ((qc ^ sw0 ^ ((G * it) & 7)) << 4);
          copy_partial<G>(dst, src, bytes);
          src += G * ld2;
        }
      }
    }
  }
}

// Lines only 2-byte aligned (an odd leading dimension, or a base 2 bytes off): 4-byte copies of
// each row's aligned window, then a shift in shared memory. Row j's 64 elements start at a (2-byte
// aligned); a4 = a rounded down to 4 bytes, sh = 1 when a != a4. Words 0..31 of the 33-word window
// from a4 land unswizzled at row j of the stage tile, word 32 in the stage's side buffer (one word
// per row); bytes past the row's valid elements are zeros (copy_word). When all
// have landed, the 16-byte chunk c of the row is words 4c..4c+4 shifted by sh elements (prmt),
// stored swizzled in place. The 8 threads of a warp that copied row j also shift it (thread t
// takes rows t / 8 + 16 i, chunk and words t % 8 + 8 m), so a __syncwarp orders a row's copies,
// its reads and its in-place writes. The window's first word of a shifted row holds the element
// before the row (discarded): its 2 bytes lie in the same allocation, which is at least 256-byte
// aligned while the row starts 2 bytes past a 4-byte boundary.
struct RowWindow {
  const char* a4;
  int sh, end;  // end: bytes of the window to read from a4 (0 for a row outside the operand)
};
__device__ __forceinline__ RowWindow row_window(const OddOperand& o, bool kmajor, int j, int row0, int k0, int k) {
  const RowSrc s = row_src(kmajor, j, row0, k0, o.rows, k);
  RowWindow w{static_cast<const char*>(o.data), 0, 0};
  if (s.valid > 0) {
    const char* a = static_cast<const char*>(o.data) + (s.line * o.ld + s.off) * 2;
    w.sh = static_cast<int>((reinterpret_cast<uintptr_t>(a) >> 1) & 1);
    w.a4 = a - 2 * w.sh;
    w.end = 2 * w.sh + 2 * s.valid;
  }
  return w;
}

template <int ROWS>
__device__ __forceinline__ void copy_tile_e2(uint32_t tile, uint32_t side, const OddOperand& o, bool kmajor, int row0,
                                             int k0, int k, int tid) {
  static_assert(ROWS % 16 == 0, "16 rows per pass");
  // Source of the copies that read nothing: 16-byte aligned, inside the operand's allocation.
  const char* dummy = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(o.data) & ~uintptr_t(15));
  const int g = tid >> 3, l = tid & 7;
#pragma unroll 1
  for (int it = 0; it < ROWS / 16; ++it) {
    const int j = g + 16 * it;
    const RowWindow w = row_window(o, kmajor, j, row0, k0, k);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int wd = l + 8 * m;
      const int nb = max(0, min(4, w.end - 4 * wd));
      copy_word(tile + j * kRowBytes + 4 * wd, w.a4 + 4 * wd, dummy, nb);
    }
    if (l == 0) {
      const int nb = max(0, min(4, w.end - 128));
      copy_word(side + 4 * j, w.a4 + 128, dummy, nb);
    }
  }
}

template <int ROWS>
__device__ __forceinline__ void shift_tile_e2(uint32_t tile, uint32_t side, const OddOperand& o, bool kmajor, int row0,
                                              int k0, int k, int tid) {
  const int g = tid >> 3, c = tid & 7;
#pragma unroll 1
  for (int it = 0; it < ROWS / 16; ++it) {
    const int j = g + 16 * it;
    const RowWindow w = row_window(o, kmajor, j, row0, k0, k);
    const uint32_t row = tile + j * kRowBytes;
    uint32_t x0, x1, x2, x3, x4;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3)
                 : "r"(row + 16 * c)
                 : "memory");
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(x4) : "r"(c < 7 ? row + 16 * c + 16 : side + 4 * j) : "memory");
    __syncwarp();  // every chunk of the row read before any is overwritten
    if (w.sh) {
      x0 = __byte_perm(x0, x1, 0x5432);
      x1 = __byte_perm(x1, x2, 0x5432);
      x2 = __byte_perm(x2, x3, 0x5432);
      x3 = __byte_perm(x3, x4, 0x5432);
    }
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(swz(tile, j, 16 * c)), "r"(x0), "r"(x1), "r"(x2),
                 "r"(x3)
                 : "memory");
  }
}

template <int ROWS>
__device__ __forceinline__ void load_operand_odd(uint32_t tile, uint32_t side, const OddOperand& o, bool kmajor,
                                                 int row0, int k0, int k, int tid) {
  switch (o.gran) {
    case 16: load_tile_cp<16, ROWS>(tile, o, kmajor, row0, k0, k, tid); break;
    case 8: load_tile_cp<8, ROWS>(tile, o, kmajor, row0, k0, k, tid); break;
    case 4: load_tile_cp<4, ROWS>(tile, o, kmajor, row0, k0, k, tid); break;
    default: copy_tile_e2<ROWS>(tile, side, o, kmajor, row0, k0, k, tid); break;
  }
}

// The stage's side buffers (word 32 of each row of 2-byte operands): after the ring's barriers,
// BM + BN words per stage (gemm_odd_params.h odd_smem_bytes).
__device__ __forceinline__ uint32_t side_words(const Ring& ring, int stage) {
  return sm90::smem_u32(ring.empty + Config::STAGES) + stage * (Config::BM + Config::BN) * 4;
}

// A stage whose copies have landed (this thread's: cp.async.wait_group): shifts its 2-byte
// operands into place, makes the writes visible to wgmma (async proxy) and hands it over.
struct Pending {
  int stage = -1, tm = 0, tn = 0, k0 = 0;
};
__device__ __forceinline__ void hand_over(const OddGemmParams& op, const Ring& ring, const Pending& pd, int tid) {
  const GemmParams& p = op.core;
  if (op.tail.p.gran == 2 || op.tail.q.gran == 2) {
    __syncwarp();  // the warp's copies (a row's 8 threads) visible to each other
    const uint32_t st = sm90::smem_u32(ring.p_tile(pd.stage)), side = side_words(ring, pd.stage);
    if (op.tail.p.gran == 2)
      shift_tile_e2<Config::BM>(st, side, op.tail.p, p.p_kmajor != 0, pd.tm * Config::BM, pd.k0, p.k, tid);
    if (op.tail.q.gran == 2)
      shift_tile_e2<Config::BN>(st + Config::P_BYTES, side + Config::BM * 4, op.tail.q, p.q_kmajor != 0,
                                pd.tn * Config::BN, pd.k0, p.k, tid);
  }
  sm90::fence_proxy_async_smem();
  sm90::mbar_arrive(&ring.full[pd.stage]);
}

// Stages whose copies are still landing while a loading thread issues the newest one: it hands a
// stage over once kLag newer ones are issued. The consumers release a stage only once they have
// started on the next one, so any kLag <= STAGES - 2 is deadlock-free: the stage a producer waits
// to refill (n - STAGES) is released once stage n - STAGES + 1 <= n - 1 - kLag is handed over.
// NOTE: measured on the H200 (bench/RESULTS.md "GEMM odd strides"): kLag = STAGES - 2 = 4 was
// 25-50% slower than kLag = 1 (4096^3 bf16, 16-byte copies 273 against 368 TFLOP/s, 2-byte lines
// 24 against 50): a stage then reaches the consumers only after four more are issued, and issuing
// needs free stages, so the consumers wait on the producer's issue every stage. More loads in
// flight would need the hand-over decoupled from issuing (cp.async.mbarrier.arrive), open.
constexpr int kLag = 1;

__device__ __forceinline__ void odd_producer_loop(const OddGemmParams& op, const Ring& ring, int tid) {
  const GemmParams& p = op.core;
  TileScheduler<1, 1, 1> sched(p);
  PipeState ps;
  WorkUnit u;
  const bool pk = p.p_kmajor != 0, qk = p.q_kmajor != 0;
  // The last kLag stages issued and not yet handed over, oldest first (stage -1: none); constant
  // indices only, so it stays in registers.
  Pending q[kLag];
  while (sched.fetch(u)) {
    for (int kb = u.kb_begin; kb < u.kb_end; ++kb) {
      // A fresh barrier counts as having completed the phase before phase 0 (parity 1 passes).
      sm90::mbar_wait(&ring.empty[ps.stage], ps.phase ^ 1);
      const int k0 = kb * Config::BK;
      const uint32_t st = sm90::smem_u32(ring.p_tile(ps.stage)), side = side_words(ring, ps.stage);
      load_operand_odd<Config::BM>(st, side, op.tail.p, pk, u.tm * Config::BM, k0, p.k, tid);
      load_operand_odd<Config::BN>(st + Config::P_BYTES, side + Config::BM * 4, op.tail.q, qk, u.tn * Config::BN, k0,
                                   p.k, tid);
      cp_async_commit();
      if (q[0].stage >= 0) {
        cp_async_wait<kLag>();  // kLag + 1 groups outstanding: the oldest (q[0]) has landed
        hand_over(op, ring, q[0], tid);
      }
#pragma unroll
      for (int i = 0; i + 1 < kLag; ++i) q[i] = q[i + 1];
      q[kLag - 1] = Pending{ps.stage, u.tm, u.tn, k0};
      ps.advance();
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < kLag; ++i)
    if (q[i].stage >= 0) hand_over(op, ring, q[i], tid);
}

template <int TA, int TB>
__device__ __forceinline__ void odd_consumer_role(const GemmParams& p, const Ring& ring, int wg) {
  TileScheduler<1, 1, 1> sched(p);
  PipeState ps;
  WorkUnit u;
  const OutView out(p);
  float acc[Config::ACC];
  while (sched.fetch(u)) {
    consumer_mma<TA, TB>(ring, ps, u, wg, acc);
    if (p.split > 1) {
      // Split-K (few tiles, long K): a cluster of `split` CTAs per tile, one k slice each; the
      // partials meet in the ring through distributed shared memory, as in the TMA kernel
      // (gemm_epilogue.cuh park_partial, reduce_partials). Every stage has been handed over and
      // consumed, so no copy still lands in the ring.
      consumers_sync();
      float* part = reinterpret_cast<float*>(ring.base);
      park_partial<false>(part, wg, acc);
      sm90::cluster_sync();  // partials of every CTA visible cluster-wide
      reduce_partials(out, u, part, PartialLayout{false}, sched.rank, p.split, threadIdx.x - 128);
      sm90::cluster_sync();  // nobody leaves while others still read its shared memory
    } else {
      store_tile(out, u, wg, acc);
    }
  }
}

}  // namespace fly::gemm

using namespace fly::gemm;

extern "C" __global__ void __launch_bounds__(kOddThreads, 1)
    fly_gemm_odd_sm90(const __grid_constant__ OddGemmParams op) {
  extern __shared__ uint8_t smem_raw[];
  const Ring ring = Ring::at(smem_raw);
  const int wg = fly::sm90::warp_uniform(threadIdx.x / 128);
  if (threadIdx.x == 0) {
    for (int s = 0; s < Config::STAGES; ++s) {
      fly::sm90::mbar_init(&ring.full[s], 128);  // every loading thread arrives once per fill
      fly::sm90::mbar_init(&ring.empty[s], Config::STAGE_READERS);
    }
    fly::sm90::fence_barrier_init();
  }
  __syncthreads();
  if (wg == 0) {
    OddRegs::producer();
    odd_producer_loop(op, ring, threadIdx.x);
    if (op.core.split > 1) {  // match the consumers' two cluster barriers
      fly::sm90::cluster_sync();
      fly::sm90::cluster_sync();
    }
  } else {
    OddRegs::consumer();
    const int cw = wg - 1;
    const GemmParams& p = op.core;
    const int sel = (p.p_kmajor ? 0 : 2) + (p.q_kmajor ? 0 : 1);
    switch (sel) {
      case 0: odd_consumer_role<0, 0>(p, ring, cw); break;
      case 1: odd_consumer_role<0, 1>(p, ring, cw); break;
      case 2: odd_consumer_role<1, 0>(p, ring, cw); break;
      default: odd_consumer_role<1, 1>(p, ring, cw); break;
    }
  }
}

// ---- the packed path's copy (fly_gemm with a large enough workspace, src/ops/gemm.cpp): the shared
// line-packing kernel, fly_pack_lines_sm90 ------------------------------------------------------------
#include "common/pack_lines.cuh"
