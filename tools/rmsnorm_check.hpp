// SPDX-License-Identifier: Apache-2.0
// RMSNorm helpers shared by flytune and flybench: one problem's buffers, a launch through the
// library, and a check of sampled rows against an FP64 reference.
#pragma once

#include <cmath>

#include "tool_common.hpp"

namespace fly::tools {

struct RmsNormProblem {
  fly_dtype dt;
  int64_t M, N;
  double eps = 1e-5;
  DeviceBuffer x, w, y, rstd;
  RmsNormProblem(fly_dtype dt_, int64_t M_, int64_t N_, uint64_t seed)
      : dt(dt_), M(M_), N(N_), x(size_t(M_ * N_) * dtype_bytes(dt_)), w(size_t(N_) * dtype_bytes(dt_)),
        y(size_t(M_ * N_) * dtype_bytes(dt_)), rstd(size_t(M_) * 4) {
    fill_random(x.ptr, size_t(M * N), dt, seed, -2.f, 2.f);
    fill_random(w.ptr, size_t(N), dt, seed + 1, 0.5f, 1.5f);
  }
  fly_status run(cudaStream_t s) const {
    fly_tensor tx = tensor2d(x.ptr, dt, M, N, N), ty = tensor2d(y.ptr, dt, M, N, N);
    fly_tensor tw = tensor1d(w.ptr, dt, N), tr = tensor1d(rstd.ptr, FLY_F32, M);
    return fly_rms_norm_fwd(&tx, &tw, eps, &ty, &tr, s);
  }
  // Bytes a single pass must move: read x and w, write y and rstd.
  double bytes() const { return double(M * N * 2 + N) * double(dtype_bytes(dt)) + double(M) * 4; }
  // Max error on up to 16 sampled rows, in units of the dtype's rounding (half an ulp at 1.0,
  // relative): <= ~2 means "matches to rounding".
  double check(cudaStream_t s) const {
    TOOL_CUDA(cudaMemsetAsync(y.ptr, 0xff, size_t(M * N) * dtype_bytes(dt), s));  // poison
    TOOL_FLY(run(s));
    TOOL_CUDA(cudaStreamSynchronize(s));
    const double unit = dt == FLY_F32 ? std::ldexp(1.0, -23) : dt == FLY_F16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
    std::vector<double> wh = to_host_double(w.ptr, size_t(N), dt);
    double worst = 0;
    const int64_t samples = std::min<int64_t>(M, 16);
    for (int64_t i = 0; i < samples; ++i) {
      int64_t r = samples == 1 ? 0 : i * (M - 1) / (samples - 1);
      size_t es = dtype_bytes(dt);
      std::vector<double> xr = to_host_double(static_cast<char*>(x.ptr) + size_t(r * N) * es, size_t(N), dt);
      std::vector<double> yr = to_host_double(static_cast<char*>(y.ptr) + size_t(r * N) * es, size_t(N), dt);
      double ss = 0;
      for (double v : xr) ss += v * v;
      double rs = 1.0 / std::sqrt(ss / double(N) + eps);
      for (int64_t j = 0; j < N; ++j) {
        double ref = xr[size_t(j)] * rs * wh[size_t(j)];
        double err = std::fabs(yr[size_t(j)] - ref) / (std::fabs(ref) * unit + 1e-30 + unit * 1e-3);
        if (!(err == err)) return INFINITY;  // NaN: unwritten or broken
        worst = std::max(worst, err);
      }
    }
    return worst;
  }
};

}  // namespace fly::tools
