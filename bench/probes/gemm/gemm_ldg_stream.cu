// SPDX-License-Identifier: Apache-2.0
// Decode-streaming probe, plain loads (dev only, not part of the build): how fast do 16-byte
// loads stream W[N, K] (bf16, K-major) when each warp owns 16 rows of it, as a register-fed
// decode kernel (kernels/gemm/gemm_decode_sm90.cu) must, depending on how many rows one load
// instruction spans? mma.sync's A operand puts 4 lanes on each row (8 rows x 64 contiguous bytes
// per instruction: SEG = 4 below); a kernel that shuffled or staged W could use 8, 16 or 32 lanes
// per row (4 rows x 128 B, 2 x 256 B, 1 x 512 B). Every configuration keeps BATCH loads in flight
// per thread (double-buffered) and visits a warp's row groups at the same k before moving along K.
// Beside them: the linear grid-stride read (bench/probes/gemm/gemm_tma_stream.cu's baseline). Timed with
// CUDA events after an L2 flush by a read, median of 25.
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I kernels bench/probes/gemm/gemm_ldg_stream.cu -o /tmp/ls
//   /tmp/ls [N K]   (default 4096 4096)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/vec.cuh"
#include "gemm/dev/dev_timing.cuh"


// SEG lanes per row segment (32 / SEG rows per instruction); each warp owns 16 rows; the CTA's
// warps own consecutive row blocks; blockIdx.x % split picks the CTA's K range.
template <int SEG, int BATCH>
__global__ void stream_rows(const uint4* w, int64_t ld16, int k16, int split, unsigned* sink) {
  constexpr int RPI = 32 / SEG;     // rows per instruction
  constexpr int GROUPS = 16 / RPI;  // instructions per k chunk (row groups of the warp)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps = blockDim.x / 32;
  const int tile = blockIdx.x / split, part = blockIdx.x % split;
  const int row0 = (tile * warps + warp) * 16;
  const int per = (k16 + split - 1) / split;
  const int kb = part * per, ke = min(k16, kb + per);
  const int chunks = (ke - kb + SEG - 1) / SEG;
  const int total = chunks * GROUPS;  // load slots of this warp
  const int r_in = lane / SEG, c_in = lane % SEG;
  auto addr = [&](int s) {
    const int rg = s % GROUPS, kc = s / GROUPS;
    const int k = kb + kc * SEG + c_in;
    return k < ke ? w + int64_t(row0 + rg * RPI + r_in) * ld16 + k : nullptr;
  };
  unsigned acc = 0;
  uint4 a[BATCH], b[BATCH];
  auto load = [&](uint4 (&buf)[BATCH], int s0) {
#pragma unroll
    for (int j = 0; j < BATCH; ++j) {
      const uint4* p = s0 + j < total ? addr(s0 + j) : nullptr;
      buf[j] = p ? fly::ld16_stream(p) : make_uint4(0, 0, 0, 0);
    }
  };
  auto use = [&](const uint4 (&buf)[BATCH]) {
#pragma unroll
    for (int j = 0; j < BATCH; ++j) acc ^= buf[j].x ^ buf[j].y ^ buf[j].z ^ buf[j].w;
  };
  load(a, 0);
  for (int s = BATCH; s < total + BATCH; s += 2 * BATCH) {
    load(b, s);
    use(a);
    load(a, s + BATCH);
    use(b);
  }
  if (acc == 0x12345678u) *sink = acc;
}

template <int SEG, int BATCH>
static void run_cfg(const uint4* w, int N, int K, const uint4* fb, size_t fn, unsigned* sink) {
  const int64_t ld16 = K / 8;
  for (int warps : {4, 8})
    for (int split : {1, 2, 4, 8}) {
      const int tiles = N / (16 * warps);
      const double us = median_us([&] { stream_rows<SEG, BATCH><<<tiles * split, warps * 32>>>(w, ld16, int(ld16), split, sink); },
                                  fb, fn, sink);
      std::printf("rows/instr %2d (%3d B each)  batch %2d  warps %d  split %d  CTAs %4d  %7.2f us  %.2f TB/s\n", 32 / SEG,
                  SEG * 16, BATCH, warps, split, tiles * split, us, double(N) * K * 2 / us / 1e6);
    }
}

int main(int argc, char** argv) {
  const int N = argc > 2 ? std::atoi(argv[1]) : 4096, K = argc > 2 ? std::atoi(argv[2]) : 4096;
  uint4 *w, *fb;
  unsigned* sink;
  const size_t fn = (256u << 20) / 16;
  CK(cudaMalloc(&w, size_t(N) * K * 2));
  CK(cudaMalloc(&fb, fn * 16));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(w, 1, size_t(N) * K * 2));
  CK(cudaMemset(fb, 2, fn * 16));
  const size_t wn = size_t(N) * K / 8;
  std::printf("W %d x %d bf16 (%.1f MB)\n", N, K, N * double(K) * 2 / 1e6);
  for (int g : {132 * 2, 132 * 4, 132 * 8}) {
    const double us = median_us([&] { read_all<<<g, 512>>>(w, wn, sink); }, fb, fn, sink);
    std::printf("linear grid-stride read, %4d CTAs x 512        %7.2f us  %.2f TB/s\n", g, us, double(N) * K * 2 / us / 1e6);
  }
  run_cfg<4, 8>(w, N, K, fb, fn, sink);
  run_cfg<4, 16>(w, N, K, fb, fn, sink);
  run_cfg<8, 8>(w, N, K, fb, fn, sink);
  run_cfg<16, 8>(w, N, K, fb, fn, sink);
  run_cfg<32, 8>(w, N, K, fb, fn, sink);
  run_cfg<32, 16>(w, N, K, fb, fn, sink);
  return 0;
}
