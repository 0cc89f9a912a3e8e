// SPDX-License-Identifier: Apache-2.0
// Pipeline primitives shared by the warp-specialized kernels (GEMM, MX, grouped GEMM, attention)
// and the row kernels that split a CTA into groups (RMSNorm): named (hardware) barriers and the
// warp-specialized register split.
//
// A named barrier `id` (1..15; 0 is __syncthreads) synchronizes `count` threads, a multiple of 32
// (whole warps). Each family keeps its own table of ids (gemm_config.cuh `named_bar`, attention's
// merge and turn barriers) so two uses in one kernel never share one by accident. The forms differ
// only in which operands are immediates: an id or count known at compile time is written as one
// (ptxas emits the same instruction either way where it can fold the register, but the immediate
// form never depends on that).
#pragma once

namespace fly {

// bar.sync: wait until `count` threads (this one included) have arrived at barrier `id`.
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
template <int Count>
__device__ __forceinline__ void named_bar_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(Count) : "memory");
}
template <int Id, int Count>
__device__ __forceinline__ void named_bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(Id), "n"(Count) : "memory");
}
// The same without .aligned (barrier.sync): legal when the lanes of a warp arrive apart.
template <int Id, int Count>
__device__ __forceinline__ void named_bar_sync_unaligned() {
  asm volatile("barrier.sync %0, %1;\n" ::"n"(Id), "n"(Count) : "memory");
}

// bar.arrive: count this thread at barrier `id` without waiting (the producer side of a pairing
// whose consumers bar.sync with the same count).
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
template <int Count>
__device__ __forceinline__ void named_bar_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(Count) : "memory");
}

// Register split of a warp-specialized CTA: one producer warpgroup (warpgroup 0) and ConsumerWGs
// consumer warpgroups, launched with __launch_bounds__(128 * (1 + ConsumerWGs), 1). The producer
// gives registers back (setmaxnreg.dec to ProducerRegs a thread) and the consumers take them
// (setmaxnreg.inc to ConsumerRegs); each is called first thing in its branch, by every thread of
// the warpgroup. A kernel names its split once as a type; the counts stay the family's own.
// Host compiles of a kernel source (test/cpu's MX emulation) see no-ops.
template <int ConsumerWGs, int ProducerRegs, int ConsumerRegs>
struct RegSplit {
  static constexpr int kConsumerWGs = ConsumerWGs;
  static constexpr int kProducer = ProducerRegs;
  static constexpr int kConsumer = ConsumerRegs;
  static_assert(ProducerRegs % 8 == 0 && ProducerRegs >= 24 && ProducerRegs <= 256 && ConsumerRegs % 8 == 0 &&
                    ConsumerRegs >= 24 && ConsumerRegs <= 256,
                "setmaxnreg counts: multiples of 8 in [24, 256]");
  static_assert(ProducerRegs <= ConsumerRegs, "the producer gives registers to the consumers");
  static_assert(128 * (ProducerRegs + ConsumerWGs * ConsumerRegs) <= 65536, "register file (64K a CTA)");

  __device__ __forceinline__ static void producer() {
#if defined(__CUDA_ARCH__)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(ProducerRegs));
#endif
  }
  __device__ __forceinline__ static void consumer() {
#if defined(__CUDA_ARCH__)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(ConsumerRegs));
#endif
  }
};

}  // namespace fly
