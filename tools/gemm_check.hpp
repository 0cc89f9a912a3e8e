// SPDX-License-Identifier: Apache-2.0
// GEMM helpers shared by flytune and flybench: one problem's buffers in a layout, a launch
// through the library, and a sampled check against an FP64 reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tool_common.hpp"

namespace fly::tools {

inline float half_bits_to_float(uint16_t h, fly_dtype dt) {
  if (dt == FLY_BF16) { __nv_bfloat16 b; std::memcpy(&b, &h, 2); return __bfloat162float(b); }
  __half x; std::memcpy(&x, &h, 2); return __half2float(x);
}

// A[M,K], B[K,N] in a given layout ("nt": A row-major, B column-major, ...), C[M,N] row-major.
struct GemmBuffers {
  fly_dtype dt;
  int64_t M, N, K;
  bool a_row, b_row;
  DeviceBuffer a, b, c, ws;  // ws: fly_gemm's workspace (stream-K), zero-filled once
  GemmBuffers(fly_dtype dt_, int64_t M_, int64_t N_, int64_t K_, const std::string& layout, uint64_t seed)
      : dt(dt_), M(M_), N(N_), K(K_), a_row(layout[0] == 'n'), b_row(layout[1] == 'n'),
        a(size_t(M_ * K_) * 2), b(size_t(K_ * N_) * 2), c(size_t(M_ * N_) * 2) {
    fill_random(a.ptr, size_t(M * K), dt, seed, -1.f, 1.f);
    fill_random(b.ptr, size_t(K * N), dt, seed + 1, -1.f, 1.f);
    fly_tensor ta, tb, tc;
    tensors(&ta, &tb, &tc);
    // A shape the kernels refuse (UNSUPPORTED: a leading dimension breaking TMA's rule) gets no
    // workspace; run() then reports the refusal, which the tools handle.
    size_t bytes = 0;
    if (fly_gemm_workspace_size(&ta, &tb, &tc, &bytes) != FLY_SUCCESS) bytes = 0;
    ws = DeviceBuffer(bytes);
    if (bytes) TOOL_CUDA(cudaMemset(ws.ptr, 0, bytes));
  }
  int64_t lda() const { return a_row ? K : M; }
  int64_t ldb() const { return b_row ? N : K; }
  void tensors(fly_tensor* ta, fly_tensor* tb, fly_tensor* tc) const {
    *ta = a_row ? tensor2d(a.ptr, dt, M, K, K) : tensor2d(a.ptr, dt, M, K, 1);
    if (!a_row) { ta->strides[0] = 1; ta->strides[1] = M; }
    *tb = b_row ? tensor2d(b.ptr, dt, K, N, N) : tensor2d(b.ptr, dt, K, N, 1);
    if (!b_row) { tb->strides[0] = 1; tb->strides[1] = K; }
    *tc = tensor2d(c.ptr, dt, M, N, N);
  }
  fly_status run(cudaStream_t s) const {
    fly_tensor ta, tb, tc;
    tensors(&ta, &tb, &tc);
    return fly_gemm(&ta, &tb, &tc, nullptr, ws.ptr, ws.bytes, s);
  }
  // Largest error over sampled elements in units of the tolerance (<= 1 passes).
  double check(cudaStream_t s, uint64_t seed) const {
    TOOL_CUDA(cudaMemsetAsync(c.ptr, 0xFF, size_t(M * N) * 2, s));
    TOOL_FLY(run(s));
    TOOL_CUDA(cudaStreamSynchronize(s));
    std::mt19937_64 rng(seed);
    const int samples = 24;
    std::vector<int64_t> ms, ns;
    for (int i = 0; i < samples; ++i) {
      ms.push_back(i == 0 ? M - 1 : int64_t(rng() % uint64_t(M)));
      ns.push_back(i == 0 ? N - 1 : int64_t(rng() % uint64_t(N)));
    }
    std::vector<uint16_t> arow(static_cast<size_t>(K)), bcol(static_cast<size_t>(K));
    double worst = 0;
    for (int i = 0; i < samples; ++i) {
      const int64_t m = ms[i], n = ns[i];
      const uint16_t* ap = static_cast<const uint16_t*>(a.ptr);
      const uint16_t* bp = static_cast<const uint16_t*>(b.ptr);
      if (a_row) TOOL_CUDA(cudaMemcpy(arow.data(), ap + m * K, size_t(K) * 2, cudaMemcpyDeviceToHost));
      else TOOL_CUDA(cudaMemcpy2D(arow.data(), 2, ap + m, size_t(M) * 2, 2, size_t(K), cudaMemcpyDeviceToHost));
      if (!b_row) TOOL_CUDA(cudaMemcpy(bcol.data(), bp + n * K, size_t(K) * 2, cudaMemcpyDeviceToHost));
      else TOOL_CUDA(cudaMemcpy2D(bcol.data(), 2, bp + n, size_t(N) * 2, 2, size_t(K), cudaMemcpyDeviceToHost));
      uint16_t hc;
      TOOL_CUDA(cudaMemcpy(&hc, static_cast<const uint16_t*>(c.ptr) + m * N + n, 2, cudaMemcpyDeviceToHost));
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(half_bits_to_float(arow[size_t(k)], dt)) * half_bits_to_float(bcol[size_t(k)], dt);
        ref += p;
        mag += std::fabs(p);
      }
      const double got = half_bits_to_float(hc, dt);
      const double tol = (dt == FLY_BF16 ? 1.0 / 128 : 1.0 / 1024) * std::fabs(ref) + 1e-5 * mag + 1e-6;
      const double e = std::fabs(got - ref) / tol;
      worst = std::max(worst, std::isfinite(e) ? e : 1e30);
    }
    return worst;
  }
};

inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}


}  // namespace fly::tools
