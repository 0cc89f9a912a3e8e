// SPDX-License-Identifier: Apache-2.0
// fly_cross_entropy_fwd_bwd's achieved bandwidth on the shapes of the family's workloads
// (tuning/cross_entropy.json): median of 20 timed calls (CUDA events, L2 flushed before each), in
// place and out of place, with the minimal traffic (logits read once, dlogits written once, labels,
// loss and lse) over the time. One JSON line per case on stdout.
// Build: g++ -O2 -std=c++17 ce_bandwidth.cpp -I<repo>/include -I/usr/local/cuda/include
//        -L<build> -lflykernels -L/usr/local/cuda/lib64 -lcudart -o ce_bandwidth
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "flykernels/flykernels.hpp"

#define CK(x)                                                                 \
  do {                                                                        \
    cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } \
  } while (0)

using flykernels::tensor;  // contiguous [rows, cols] / [n] descriptors

int main(int argc, char** argv) {
  const char* dts = argc > 1 ? argv[1] : "bf16";
  const fly_dtype dt = !std::strcmp(dts, "fp32") ? FLY_F32 : !std::strcmp(dts, "fp16") ? FLY_F16 : FLY_BF16;
  const int64_t es = dt == FLY_F32 ? 4 : 2;
  const int64_t Vs[] = {32000, 128256, 151936}, Ms[] = {4096, 8192};
  void *x, *g, *lab, *loss, *lse, *flush;
  const size_t maxb = size_t(8192) * 151936 * es, flush_b = size_t(256) << 20;
  CK(cudaMalloc(&x, maxb));
  CK(cudaMalloc(&g, maxb));
  CK(cudaMalloc(&lab, 8192 * 8));
  CK(cudaMalloc(&loss, 8192 * 4));
  CK(cudaMalloc(&lse, 8192 * 4));
  CK(cudaMalloc(&flush, flush_b));
  CK(cudaMemset(x, 0, maxb));  // zeros: a uniform softmax, every element takes the full path
  std::vector<int64_t> hl(8192);
  for (size_t i = 0; i < hl.size(); ++i) hl[i] = int64_t((i * 7919) % 32000);
  CK(cudaMemcpy(lab, hl.data(), hl.size() * 8, cudaMemcpyHostToDevice));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int64_t V : Vs)
    for (int64_t M : Ms)
      for (int inplace = 0; inplace < 2; ++inplace) {
        fly_tensor tx = tensor(x, dt, {M, V}), tg = inplace ? tx : tensor(g, dt, {M, V});
        fly_tensor tl = tensor(lab, FLY_I64, {M}), to = tensor(loss, FLY_F32, {M}), ts = tensor(lse, FLY_F32, {M});
        std::vector<float> ms;
        for (int it = 0; it < 23; ++it) {
          CK(cudaMemsetAsync(flush, it, flush_b));
          CK(cudaEventRecord(a));
          const fly_status st = fly_cross_entropy_fwd_bwd(&tx, &tl, -100, 1.0, &to, &ts, &tg, nullptr);
          CK(cudaEventRecord(b));
          if (st != FLY_SUCCESS) { std::fprintf(stderr, "%s\n", fly_get_last_error()); return 1; }
          CK(cudaEventSynchronize(b));
          float t = 0;
          CK(cudaEventElapsedTime(&t, a, b));
          if (it >= 3) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2] * 1e-3;
        const double bytes = double(M) * V * es * 2 + double(M) * (8 + 4 + 4);
        std::printf("{\"dtype\": \"%s\", \"M\": %lld, \"V\": %lld, \"in_place\": %d, \"variant\": \"%s\", "
                    "\"us\": %.1f, \"min_bytes_GB\": %.3f, \"TBps\": %.3f}\n",
                    dts, (long long)M, (long long)V, inplace, fly_last_variant(), med * 1e6, bytes * 1e-9,
                    bytes / med * 1e-12);
        std::fflush(stdout);
      }
  return 0;
}
