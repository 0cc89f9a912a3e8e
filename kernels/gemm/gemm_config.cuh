// Compile-time configuration of one sm_90a GEMM variant, from the FLY_* macros tools/flygen
// writes (see tuning/gemm.json). Standalone compiles get the defaults below.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemm/gemm_params.h"

#ifndef FLY_BN
#define FLY_BN 256
#endif
#ifndef FLY_STAGES
#define FLY_STAGES 4
#endif
#ifndef FLY_MC
#define FLY_MC 1
#endif
#ifndef FLY_EPI
#define FLY_EPI 0
#endif

namespace fly::gemm {

#if defined(FLY_DTYPE_IS_FP16)
using Elem = __half;
constexpr bool kBF16 = false;
#else
using Elem = __nv_bfloat16;
constexpr bool kBF16 = true;
#endif

struct Config {
  static constexpr int BM = kBM;  // 2 consumer warpgroups x 64 rows (wgmma M is 64)
  static constexpr int BN = FLY_BN;
  static constexpr int BK = kBK;  // 64 x 2 B = 128 B rows: exactly one 128B swizzle span
  static constexpr int STAGES = FLY_STAGES;
  // MC = 2: clusters of 2 CTAs on vertically adjacent tiles (same Q columns); each CTA loads half
  // of the Q tile and multicasts it to both, halving L2->SM traffic for Q. Persistent mode only.
  static constexpr int MC = FLY_MC;
  static constexpr int P_BYTES = BM * BK * 2;
  static constexpr int Q_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = P_BYTES + Q_BYTES;
  static constexpr int RING_BYTES = STAGES * STAGE_BYTES;
  // EPI = 1: the persistent path stages each tile in shared memory and writes C with coalesced
  // 16-byte stores; 0: stores straight from the accumulators.
  static constexpr int EPI = FLY_EPI;
  // NOTE: with BN = 256 the staging code spills the 128 accumulators under the 168-register
  // compile budget (tuning/gemm.json offers epi = 1 only for bn <= 128).
  static_assert(EPI == 0 || BN <= 128, "shared-memory epilogue: BN <= 128");
  static constexpr int EPI_WG_BYTES = epi_wg_bytes(BN);
  static constexpr int SMEM_BYTES = smem_bytes(BN, STAGES, EPI);
  static constexpr int ACC = BN / 2;  // fp32 accumulators per consumer thread (64 x BN / 128)
  // Register split: producer warpgroup keeps 40, consumers get 232 (40*128 + 232*256 <= 64K).
  static constexpr int PRODUCER_REGS = 40;
  static constexpr int CONSUMER_REGS = 232;

  static_assert(BN % 64 == 0 && BN >= 64 && BN <= 256, "wgmma N: 64..256, TMA MN chunks of 64");
  static_assert(MC == 1 || (MC == 2 && BN % 128 == 0), "multicast halves must be 64-col chunks");
  static_assert(STAGES >= 2 && STAGES <= 12, "pipeline depth");
  static_assert(SMEM_BYTES <= 227 * 1024, "shared memory per block on sm_90");
  static_assert(P_BYTES % 1024 == 0 && Q_BYTES % 1024 == 0, "128B-swizzle atoms are 1024 B");
  // Split-K partials (fp32, padded rows) reuse the ring after the mainloop.
  static_assert(BM * (BN + 4) * 4 <= RING_BYTES && BN * (BM + 4) * 4 <= RING_BYTES,
                "split-K partial tile must fit in the stage ring");
  static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 256 <= 65536, "register file");
};

}  // namespace fly::gemm
