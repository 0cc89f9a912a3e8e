// SPDX-License-Identifier: Apache-2.0
// Host emulation harness of the wgmma MX GEMM (kernels/mx/mxfp_wgmma.cu): the kernel's own source
// compiled as C++, one host thread per CUDA thread (384 per CTA, CTAs one after the other), with
// fly::sm90 replaced by emulations written from the PTX ISA, not from the kernel:
// - mbarrier: arrival count, transaction bytes, phase; try_wait.parity(P) succeeds once the
//   phase of parity P has completed (current phase parity != P);
// - TMA 2-D tile loads: the box from global (zero outside the tensor), written at the shared
//   address with SWIZZLE_128B applied to the absolute address bits (bits 4-6 ^= bits 7-9), the
//   bytes completed on the mbarrier;
// - wgmma m64nNk32 E4M3 x E4M3 from two shared-memory descriptors (start address, SBO, 128B
//   swizzle mode): K-major rows at start + (r / 8) SBO + (r % 8) 128 + k, the same swizzle, each
//   thread's D fragment per the ISA's m64nN layout, summed exactly (FP64) and rounded to FP32.
// Included by test_mx_wgmma_emu*.cpp with FLY_BN set; everything has internal linkage.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "catch_compat.hpp"
#include "gemm/gemm_mx.h"

namespace {
namespace emu {
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local Dim3 thread_idx, block_idx;
Dim3 block_dim, grid_dim;
uint8_t* smem_base = nullptr;  // 1024-aligned
size_t smem_size = 0;
bool hung = false;           // a wait timed out (a protocol bug): every later wait returns at once
bool smem_oob = false;       // an emulated access left the shared buffer
int over_arrivals = 0;       // arrivals beyond a barrier's count in one phase

struct Bar {
  uint32_t count = 0, arrivals = 0;
  int64_t tx = 0;
  uint32_t phase = 0;
};
std::mutex mu;
std::condition_variable cv;
std::map<const void*, Bar> bars;

struct MapInfo {  // what the test stores in a CUtensorMap's bytes
  const uint8_t* base;
  uint64_t dim0, dim1, stride;
  uint32_t box0, box1;
  int swizzle128;
};
static_assert(sizeof(MapInfo) <= sizeof(CUtensorMap), "fits");

class Barrier {  // __syncthreads: every thread of the CTA
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> l(m_);
    const unsigned gen = gen_;
    if (++count_ == n_) { count_ = 0; ++gen_; cv_.notify_all(); return; }
    cv_.wait(l, [&] { return gen != gen_; });
  }
 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  unsigned gen_ = 0;
};
Barrier* cta_bar = nullptr;
// bar.red.and.pred over the 128 producer threads
class AndBarrier {
 public:
  bool reduce(bool v) {
    std::unique_lock<std::mutex> l(m_);
    const unsigned gen = gen_;
    acc_ = acc_ && v;
    if (++count_ == 128) {
      result_ = acc_;
      acc_ = true;
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return result_;
    }
    cv_.wait(l, [&] { return gen != gen_; });
    return result_;
  }
 private:
  std::mutex m_;
  std::condition_variable cv_;
  int count_ = 0;
  bool acc_ = true, result_ = true;
  unsigned gen_ = 0;
};
AndBarrier* producer_and = nullptr;
int folded_stages = 0;  // stages the producers decided to fold (test coverage)
inline float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t swz(uint32_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }
inline uint8_t& smem_at(uint32_t addr) {
  if (addr >= smem_size) { smem_oob = true; static uint8_t sink; return sink; }
  return smem_base[addr];
}
inline void complete_if_done(Bar& b) {
  if (b.arrivals == b.count && b.tx == 0) {
    b.arrivals = 0;
    ++b.phase;
    cv.notify_all();
  }
}
}  // namespace emu
}  // namespace

namespace fly {
namespace sm90 {
namespace {
inline uint32_t smem_u32(const void* p) { return uint32_t(static_cast<const uint8_t*>(p) - emu::smem_base); }
inline void mbar_init(uint64_t* bar, uint32_t count) {
  std::lock_guard<std::mutex> l(emu::mu);
  emu::Bar b;
  b.count = count;
  emu::bars[bar] = b;
}
inline void fence_barrier_init() {}
inline void mbar_arrive(uint64_t* bar) {
  std::lock_guard<std::mutex> l(emu::mu);
  emu::Bar& b = emu::bars.at(bar);
  if (++b.arrivals > b.count) ++emu::over_arrivals;
  emu::complete_if_done(b);
}
inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  std::lock_guard<std::mutex> l(emu::mu);
  emu::Bar& b = emu::bars.at(bar);
  b.tx += bytes;
  if (++b.arrivals > b.count) ++emu::over_arrivals;
  emu::complete_if_done(b);
}
inline void mbar_wait(uint64_t* bar, uint32_t parity) {
  std::unique_lock<std::mutex> l(emu::mu);
  if (emu::hung) return;
  const bool ok = emu::cv.wait_for(l, std::chrono::seconds(30),
                                   [&] { return emu::hung || (emu::bars.at(bar).phase & 1u) != parity; });
  if (!ok) {
    emu::hung = true;
    emu::cv.notify_all();
  }
}
inline void tma_prefetch_desc(const CUtensorMap*) {}
inline void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  emu::MapInfo mi;
  std::memcpy(&mi, map, sizeof mi);
  const uint32_t d = smem_u32(dst);
  for (uint32_t r = 0; r < mi.box1; ++r)
    for (uint32_t c = 0; c < mi.box0; ++c) {
      const int64_t g0 = int64_t(c0) + c, g1 = int64_t(c1) + r;
      const bool in = g0 >= 0 && g1 >= 0 && uint64_t(g0) < mi.dim0 && uint64_t(g1) < mi.dim1;
      const uint8_t v = in ? mi.base[uint64_t(g1) * mi.stride + uint64_t(g0)] : 0;
      const uint32_t a = d + r * mi.box0 + c;
      emu::smem_at(mi.swizzle128 ? emu::swz(a) : a) = v;
    }
  std::lock_guard<std::mutex> l(emu::mu);
  emu::Bar& b = emu::bars.at(bar);
  b.tx -= int64_t(mi.box0) * mi.box1;
  emu::complete_if_done(b);
}
inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <int N> inline void wgmma_wait() {}
inline void reg_fence(float&) {}
inline void fence_proxy_async_smem() {}
inline uint64_t make_desc_sw128(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((saddr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}
enum class F8 { kE4m3, kE5m2 };
// Byte (row r, k) of a K-major operand through its descriptor.
inline uint8_t desc_byte(uint64_t desc, uint32_t r, uint32_t k) {
  const uint32_t start = uint32_t(desc & 0x3FFF) << 4, sbo = uint32_t((desc >> 32) & 0x3FFF) << 4;
  const bool sw = ((desc >> 62) & 3) == 1;
  const uint32_t a = start + (r / 8) * sbo + (r % 8) * 128 + k;
  return emu::smem_at(sw ? emu::swz(a) : a);
}
template <int N, F8 A, F8 B>
struct WgmmaF8 {
  static constexpr int kRegs = N / 2;
  static void mma(float* d, uint64_t da, uint64_t db, int scale_d) {
    const int ct = int(emu::thread_idx.x % 128), w = ct / 32, lane = ct % 32;
    for (int i = 0; i < N / 2; ++i) {
      // PTX ISA, wgmma m64nNk32 D fragment: row 16 w + lane / 4 + 8 (i / 2 % 2), column 8 (i / 4) + 2 (lane % 4) + i % 2
      const uint32_t row = uint32_t(16 * w + lane / 4 + 8 * ((i / 2) % 2));
      const uint32_t col = uint32_t(8 * (i / 4) + 2 * (lane % 4) + i % 2);
      double s = 0;
      for (uint32_t k = 0; k < 32; ++k)
        s += double(fly::mx::decode_e4m3(desc_byte(da, row, k))) * double(fly::mx::decode_e4m3(desc_byte(db, col, k)));
      d[i] = scale_d ? float(double(d[i]) + s) : float(s);
    }
  }
};
}  // namespace
}  // namespace sm90
}  // namespace fly

#define threadIdx emu::thread_idx
#define blockIdx emu::block_idx
#define blockDim emu::block_dim
#define gridDim emu::grid_dim
#undef __global__
#undef __device__
#undef __forceinline__
#undef __launch_bounds__
#undef __grid_constant__
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __uint_as_float(u) emu::u2f(u)
#define __syncthreads() emu::cta_bar->wait()
#define FLY_MX_HOST_EMU 1
