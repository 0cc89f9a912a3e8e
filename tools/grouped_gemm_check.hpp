// SPDX-License-Identifier: Apache-2.0
// Grouped GEMM problems on the device for flybench / flytune grouped_gemm: A [T, K], B [G, K, N]
// (K or N contiguous), int32 offsets from the group sizes, C [T, N]; a spot check of 64 outputs
// against a double reference.
#pragma once

#include <cmath>
#include <random>
#include <sstream>

#include "grouped_suite.hpp"
#include "tool_common.hpp"

namespace fly::tools {

inline std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) if (!item.empty()) out.push_back(item);
  return out;
}

struct GroupedProblem {
  fly_dtype dt;
  int64_t G, T, K, N;
  bool kmajor;
  std::vector<int32_t> offs;
  DeviceBuffer a, b, c, doffs;
  fly_tensor ta{}, tb{}, tc{}, to{};
  GroupedProblem(fly_dtype d, const std::vector<int64_t>& sizes, int64_t k, int64_t n, bool km, uint64_t seed)
      : dt(d), G(int64_t(sizes.size())), K(k), N(n), kmajor(km) {
    int64_t run = 0;
    for (int64_t m : sizes) offs.push_back(int32_t(run += m));
    T = run;
    a = DeviceBuffer(size_t(std::max<int64_t>(T, 1) * K) * 2);
    b = DeviceBuffer(size_t(G * K * N) * 2);
    c = DeviceBuffer(size_t(std::max<int64_t>(T, 1) * N) * 2);
    doffs = DeviceBuffer(offs.size() * 4);
    if (T > 0) fill_random(a.ptr, size_t(T * K), dt, seed);
    fill_random(b.ptr, size_t(G * K * N), dt, seed + 1);
    TOOL_CUDA(cudaMemcpy(doffs.ptr, offs.data(), offs.size() * 4, cudaMemcpyHostToDevice));
    ta = fly_tensor{};
    ta.data = a.ptr;
    ta.dtype = dt;
    ta.rank = 2;
    ta.sizes[0] = T;
    ta.sizes[1] = K;
    ta.strides[0] = K;
    ta.strides[1] = 1;
    tb = fly_tensor{};
    tb.data = b.ptr;
    tb.dtype = dt;
    tb.rank = 3;
    tb.sizes[0] = G;
    tb.sizes[1] = K;
    tb.sizes[2] = N;
    tb.strides[0] = K * N;
    tb.strides[1] = km ? 1 : N;
    tb.strides[2] = km ? K : 1;
    tc = tensor2d(c.ptr, dt, T, N, N);
    to = tensor1d(doffs.ptr, FLY_I32, G);
  }
  fly_status run(cudaStream_t s) { return fly_grouped_gemm(&ta, &tb, &to, nullptr, &tc, nullptr, 0, s); }
  // Worst error of 64 sampled outputs in units of the tolerance (<= 1 passes).
  double check(cudaStream_t s, uint64_t seed) {
    TOOL_CUDA(cudaMemsetAsync(c.ptr, 0xFF, size_t(std::max<int64_t>(T, 1) * N) * 2, s));
    TOOL_FLY(run(s));
    TOOL_CUDA(cudaStreamSynchronize(s));
    if (T == 0) return 0;
    std::mt19937_64 rng(seed);
    DeviceBuffer col(size_t(K) * 2);
    double worst = 0;
    for (int i = 0; i < 64; ++i) {
      const int64_t t = int64_t(rng() % uint64_t(T)), n = int64_t(rng() % uint64_t(N));
      int64_t g = 0;
      while (offs[size_t(g)] <= t) ++g;
      const std::vector<double> arow = to_host_double(static_cast<char*>(a.ptr) + size_t(t * K) * 2, size_t(K), dt);
      const char* bg = static_cast<const char*>(b.ptr) + size_t(g * K * N) * 2;
      if (kmajor) {
        TOOL_CUDA(cudaMemcpy(col.ptr, bg + size_t(n * K) * 2, size_t(K) * 2, cudaMemcpyDeviceToDevice));
      } else {
        TOOL_CUDA(cudaMemcpy2D(col.ptr, 2, bg + size_t(n) * 2, size_t(N) * 2, 2, size_t(K), cudaMemcpyDeviceToDevice));
      }
      const std::vector<double> bcol = to_host_double(col.ptr, size_t(K), dt);
      double want = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        want += arow[size_t(k)] * bcol[size_t(k)];
        mag += std::fabs(arow[size_t(k)] * bcol[size_t(k)]);
      }
      const double got = to_host_double(static_cast<char*>(c.ptr) + size_t(t * N + n) * 2, 1, dt)[0];
      const double tol = std::fabs(want) / 128 + 1e-4 * mag + 1e-3;
      const double e = std::isfinite(got) ? std::fabs(got - want) / tol : 1e9;
      worst = std::max(worst, e);
    }
    return worst;
  }
};

}  // namespace fly::tools
