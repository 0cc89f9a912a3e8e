// sm_90a GEMM for strides TMA cannot address: C = A @ B (+bias), BF16/FP16 in/out, FP32
// accumulation, the four layouts, any leading dimension and any element-aligned base.
// One compile per variant (FLY_DTYPE_IS_*, FLY_BN, FLY_STAGES; tuning/gemm.json, gemm_odd_*).
//
// The TMA kernel (gemm_sm90.cu) with another producer. Block of 384 threads = 3 warpgroups:
//   wg 0: loads. All 128 threads copy each ring stage's P tile (128 rows of A) and Q tile (bn rows
//         of B^T) from global memory with cp.async (16, 8 or 4 bytes per copy, whatever the
//         operand's alignment allows: gemm_odd_params.h) or, for an operand whose lines are only
//         2-byte aligned, element by element through registers, into exactly the layout a
//         128B-swizzled TMA box has (so the consumers are the TMA kernel's, unchanged). Elements
//         past M, N or K are zero-filled (cp.async's src-size, or a stored zero).
//   wg 1, 2: consumers: gemm_mainloop.cuh consumer_mma (wgmma on the ring's stages) and the
//         register epilogue (gemm_epilogue.cuh store_tile: bias, convert, bounds-checked stores
//         for any ldc).
// Hand-over of a stage: each loading thread issues the stage's copies as one cp.async group; once
// the next stage's group is issued it waits for this one (cp.async.wait_group 1), makes the
// writes visible to the async proxy that wgmma reads shared memory through (fence.proxy.async)
// and arrives on the stage's full barrier (128 arrivals complete it). The lag of one stage keeps
// two stages' loads in flight per thread; it needs STAGES >= 3 (the consumers release a stage
// only after the next one has landed).
// Persistent tiles (TileScheduler: split 1, no stream-K, no multicast), no swap-AB.
#include "gemm/gemm_config.cuh"
#include "gemm/gemm_epilogue.cuh"
#include "gemm/gemm_mainloop.cuh"
#include "gemm/gemm_odd_params.h"
#include "gemm/gemm_scheduler.cuh"

namespace fly::gemm {

static_assert(Config::BM == 128 && Config::MC == 1 && Config::MP == 1 && Config::KB == 1 && Config::KW == 1 &&
                  !Config::PP && Config::EPI == 0,
              "cp.async GEMM: 128-row tiles, one k block per stage, no multicast, register epilogue");
static_assert(Config::STAGES >= 3, "the one-stage hand-over lag needs three stages");
static_assert(Config::BN % 64 == 0, "MN-major Q tiles come in 64-wide chunks");

// Register split: the loading warpgroup computes addresses for many copies in flight.
constexpr int kOddLoadRegs = 56, kOddMmaRegs = 224;
static_assert(kOddLoadRegs * 128 + kOddMmaRegs * 256 <= 65536, "register file");
static_assert(Config::ACC + 32 <= kOddMmaRegs, "accumulators fit the consumers' registers");

template <int G>
__device__ __forceinline__ void cp_async(uint32_t dst, const void* src, int bytes) {
  if constexpr (G == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(G), "r"(bytes) : "memory");
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

// One operand tile of ROWS rows, G-byte loads, spread over the 128 loading threads: consecutive
// threads take consecutive granules of a row (coalesced).
template <int G, int ROWS>
__device__ __forceinline__ void load_tile_cp(uint32_t tile, uint8_t* tile_ptr, const OddOperand& o, bool kmajor,
                                             int row0, int k0, int k, int tid) {
  constexpr int PER_ROW = kRowBytes / G;
  constexpr int ITEMS = ROWS * PER_ROW;
  static_assert(ITEMS % 128 == 0, "whole passes of the warpgroup");
  const char* base = static_cast<const char*>(o.data);
  if constexpr (G >= 4) {
#pragma unroll 4
    for (int it = 0; it < ITEMS / 128; ++it) {
      const int i = it * 128 + tid;
      const int j = i / PER_ROW, q = i % PER_ROW;
      const RowSrc s = row_src(kmajor, j, row0, k0, o.rows, k);
      const int e0 = q * (G / 2);
      const int bytes = max(0, min(G, (s.valid - e0) * 2));
      // Nothing is read when bytes == 0 (all zero-fill); the base keeps the address valid anyway.
      const char* src = bytes > 0 ? base + (s.line * o.ld + s.off + e0) * 2 : base;
      cp_async<G>(swz(tile, j, q * G), src, bytes);
    }
  } else {
    // 2-byte lines: element loads through registers, 8 in flight per thread, then the stores.
    static_assert((ITEMS / 128) % 8 == 0, "batches of 8");
    const uint16_t* b16 = static_cast<const uint16_t*>(o.data);
#pragma unroll 1
    for (int it = 0; it < ITEMS / 128; it += 8) {
      uint16_t v[8];
      uint32_t d[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int i = (it + u) * 128 + tid;
        const int j = i / PER_ROW, q = i % PER_ROW;
        const RowSrc s = row_src(kmajor, j, row0, k0, o.rows, k);
        v[u] = q < s.valid ? __ldg(b16 + s.line * o.ld + s.off + q) : uint16_t(0);
        d[u] = swz(0, j, 2 * q);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) *reinterpret_cast<uint16_t*>(tile_ptr + d[u]) = v[u];
    }
  }
}

template <int ROWS>
__device__ __forceinline__ void load_operand_odd(uint8_t* tile_ptr, const OddOperand& o, bool kmajor, int row0,
                                                 int k0, int k, int tid) {
  const uint32_t tile = sm90::smem_u32(tile_ptr);
  switch (o.gran) {
    case 16: load_tile_cp<16, ROWS>(tile, tile_ptr, o, kmajor, row0, k0, k, tid); break;
    case 8: load_tile_cp<8, ROWS>(tile, tile_ptr, o, kmajor, row0, k0, k, tid); break;
    case 4: load_tile_cp<4, ROWS>(tile, tile_ptr, o, kmajor, row0, k0, k, tid); break;
    default: load_tile_cp<2, ROWS>(tile, tile_ptr, o, kmajor, row0, k0, k, tid); break;
  }
}

__device__ __forceinline__ void odd_producer_loop(const OddGemmParams& op, const Ring& ring, int tid) {
  const GemmParams& p = op.core;
  TileScheduler<1, 1, 1> sched(p);
  PipeState ps;
  WorkUnit u;
  const bool pk = p.p_kmajor != 0, qk = p.q_kmajor != 0;
  int pending = -1;  // the stage whose copies were issued last and not yet handed over
  while (sched.fetch(u)) {
    for (int kb = u.kb_begin; kb < u.kb_end; ++kb) {
      // A fresh barrier counts as having completed the phase before phase 0 (parity 1 passes).
      sm90::mbar_wait(&ring.empty[ps.stage], ps.phase ^ 1);
      const int k0 = kb * Config::BK;
      load_operand_odd<Config::BM>(ring.p_tile(ps.stage), op.tail.p, pk, u.tm * Config::BM, k0, p.k, tid);
      load_operand_odd<Config::BN>(ring.q_tile(ps.stage), op.tail.q, qk, u.tn * Config::BN, k0, p.k, tid);
      cp_async_commit();
      if (pending >= 0) {
        cp_async_wait<1>();  // the previous stage's copies (this thread's) have landed
        sm90::fence_proxy_async_smem();
        sm90::mbar_arrive(&ring.full[pending]);
      }
      pending = ps.stage;
      ps.advance();
    }
  }
  if (pending >= 0) {
    cp_async_wait<0>();
    sm90::fence_proxy_async_smem();
    sm90::mbar_arrive(&ring.full[pending]);
  }
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
    store_tile(out, u, wg, acc);
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
    fly::sm90::setmaxnreg_dec<kOddLoadRegs>();
    odd_producer_loop(op, ring, threadIdx.x);
  } else {
    fly::sm90::setmaxnreg_inc<kOddMmaRegs>();
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
