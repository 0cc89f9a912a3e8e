// SPDX-License-Identifier: Apache-2.0
// Shared by the standalone GEMM probes (kernels/gemm/dev/trace.cu, bench/probes/gemm/gemm_tma_stream.cu,
// bench/probes/gemm/gemm_ldg_stream.cu; not part of the build): error checks, the linear 16-byte read
// of a buffer (a probe's baseline and the L2 flush), and the median of CUDA-event timings taken
// after a flush by a read.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); std::exit(1);} } while (0)

// Grid-stride read of n 16-byte vectors, summed so the compiler keeps the loads.
__global__ void read_all(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

static void flush_l2(const uint4* buf, size_t n, unsigned* sink) {
  read_all<<<132 * 8, 512>>>(buf, n, sink);
}

// Median microseconds of run() over `reps` calls (after 3 untimed ones), each after an L2 flush
// by reading fbuf and then pre() (untimed: e.g. warming the activations into L2).
template <class F, class Pre = void (*)()>
static double median_us(F&& run, const uint4* fbuf, size_t fn, unsigned* sink, Pre pre = [] {}, int reps = 25) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < reps + 3; ++i) {
    flush_l2(fbuf, fn, sink);
    pre();
    CK(cudaEventRecord(a));
    run();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) t.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return 1000.0 * t[t.size() / 2];
}
