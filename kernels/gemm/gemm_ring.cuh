// SPDX-License-Identifier: Apache-2.0
// The shared-memory stage ring of the sm_90a GEMM kernels: S stages filled by TMA, each guarded by
// a full barrier (one arrival, the filler's expect_tx, plus the bytes) and an empty barrier (one
// arrival per reader). One implementation for the main kernel (gemm_mainloop.cuh Ring: P and Q
// tiles per stage; also the grouped and cp.async kernels) and the decode kernel
// (gemm_decode_sm90.cu: one activation k block per stage). Independent of the variant's Config.
#pragma once

#include <stdint.h>

#include "common/sm90.h"

namespace fly::gemm {

// Ring position over S stages: stage index and the parity of the mbarrier phase it is in.
template <int S>
struct RingPos {
  int stage = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    if (++stage == S) {
      stage = 0;
      phase ^= 1;
    }
  }
  // Skips n stages (ping-pong: the other consumer warpgroup's tile).
  __device__ void advance(int n) {
    stage += n;
    const int wraps = stage / S;
    stage -= wraps * S;
    phase ^= static_cast<uint32_t>(wraps & 1);
  }
};

// S stages of STAGE_BYTES from the first 1024-byte boundary of the kernel's dynamic shared memory
// (128-byte swizzle atoms), then the full and the empty barriers, one each per stage, REGION bytes
// after the ring's base: a kernel that reuses the ring's memory after its main loop for something
// larger (the decode kernel's partial tile) puts them past that.
template <int S, int STAGE_BYTES, int REGION = S * STAGE_BYTES>
struct StageRing {
  static_assert(REGION >= S * STAGE_BYTES && REGION % 8 == 0, "the barriers follow the stages, 8-byte aligned");
  static constexpr int kStages = S;
  uint8_t* base;    // 1024-aligned
  uint64_t* full;   // TMA bytes landed (count 1 + tx)
  uint64_t* empty;  // the stage's readers released it
  __device__ uint8_t* stage_ptr(int s) const { return base + s * STAGE_BYTES; }
  // The ring in dynamic shared memory `smem_raw`, as R (StageRing or a kernel's ring derived from
  // it, which adds its stage layout).
  template <class R = StageRing>
  __device__ __forceinline__ static R at_as(uint8_t* smem_raw) {
    R r;
    r.base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
    r.full = reinterpret_cast<uint64_t*>(r.base + REGION);
    r.empty = r.full + S;
    return r;
  }
  // One thread: every stage's full barrier (one arrival: the filler's expect_tx) and empty
  // barrier (`readers` arrivals), made visible to the async proxy.
  __device__ __forceinline__ void init_barriers(uint32_t readers) const {
    for (int s = 0; s < S; ++s) {
      sm90::mbar_init(&full[s], 1);
      sm90::mbar_init(&empty[s], readers);
    }
    sm90::fence_barrier_init();
  }
  // Filler: waits until the stage at `pos` is free (a fresh barrier counts as having completed
  // the phase before phase 0, so the first pass does not block), then arms its full barrier for
  // `tx` bytes and returns it for the loads.
  __device__ __forceinline__ uint64_t* acquire(const RingPos<S>& pos, uint32_t tx) const {
    sm90::mbar_wait(&empty[pos.stage], pos.phase ^ 1);
    uint64_t* fb = &full[pos.stage];
    sm90::mbar_arrive_expect_tx(fb, tx);  // OOB zero-fill bytes count too
    return fb;
  }
  // Reader: waits until the stage at `pos` has landed.
  __device__ __forceinline__ void wait_full(const RingPos<S>& pos) const { sm90::mbar_wait(&full[pos.stage], pos.phase); }
  // Reader: one arrival on the stage's empty barrier (this CTA's).
  __device__ __forceinline__ void release_local(int stage) const { sm90::mbar_arrive(&empty[stage]); }
};

}  // namespace fly::gemm
