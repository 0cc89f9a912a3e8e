// SPDX-License-Identifier: Apache-2.0
// One attention backward problem for flybench: the forward's problem (random Q, K, V; O and LSE
// from fly_attention_fwd), random dO, dQ/dK/dV buffers and the workspace; a launch through the
// library's dispatch; a spot check of dQ rows {0, Sq/2, Sq-1} of the last (b, h) against FP64.
#pragma once

#include "attention_check.hpp"

namespace fly::tools {

struct AttnBwdProblem {
  AttnProblem fwd;
  DeviceBuffer dout, dq, dk, dv, ws;
  fly_tensor tdo{}, tdq{}, tdk{}, tdv{};
  fly_attention_bwd_params p{};
  fly_status status = FLY_SUCCESS;

  AttnBwdProblem(const AttnCase& cs, uint64_t seed)
      : fwd(cs, seed),
        dout(size_t(cs.B * cs.Hq * cs.Sq * cs.D) * 2),
        dq(size_t(cs.B * cs.Hq * cs.Sq * cs.D) * 2),
        dk(size_t(cs.B * cs.Hkv * cs.Sk * cs.D) * 2),
        dv(size_t(cs.B * cs.Hkv * cs.Sk * cs.D) * 2) {
    const AttnCase& c = fwd.c;
    fill_random(dout.ptr, size_t(c.B * c.Hq * c.Sq * c.D), c.dt, seed + 3, -1.f, 1.f);
    tdo = flykernels::tensor(dout.ptr, c.dt, {c.B, c.Hq, c.Sq, c.D});
    tdq = flykernels::tensor(dq.ptr, c.dt, {c.B, c.Hq, c.Sq, c.D});
    tdk = flykernels::tensor(dk.ptr, c.dt, {c.B, c.Hkv, c.Sk, c.D});
    tdv = flykernels::tensor(dv.ptr, c.dt, {c.B, c.Hkv, c.Sk, c.D});
    p.struct_size = sizeof(p);
    p.q = &fwd.tq;
    p.k = &fwd.tk;
    p.v = &fwd.tv;
    p.o = &fwd.to;
    p.dout = &tdo;
    p.lse = &fwd.tl;
    p.dq = &tdq;
    p.dk = &tdk;
    p.dv = &tdv;
    p.causal = c.causal ? 1 : 0;
    size_t bytes = 0;
    status = fly_attention_bwd_workspace_size(&p, &bytes);
    if (status == FLY_SUCCESS && bytes) {
      ws = DeviceBuffer(bytes);
      p.workspace = ws.ptr;
      p.workspace_bytes = bytes;
    }
  }
  // The forward once (O, LSE), then the backward can be timed alone.
  fly_status prepare(cudaStream_t s) {
    if (status != FLY_SUCCESS) return status;
    return fwd.run(s);
  }
  fly_status run(cudaStream_t s) { return fly_attention_bwd(&p, s); }

  // max |dQ - ref| / max |ref| over three rows of the last (b, h) (NaN fails).
  double check(cudaStream_t s) {
    const AttnCase& c = fwd.c;
    TOOL_CUDA(cudaMemsetAsync(dq.ptr, 0xff, dq.bytes, s));
    TOOL_FLY(run(s));
    TOOL_CUDA(cudaStreamSynchronize(s));
    const int64_t b = c.B - 1, h = c.Hq - 1, hk = h / (c.Hq / c.Hkv);
    const size_t kv_off = size_t((b * c.Hkv + hk) * c.Sk * c.D);
    const size_t q_off = size_t((b * c.Hq + h) * c.Sq * c.D);
    auto host = [&](const DeviceBuffer& buf, size_t off, size_t n) {
      return to_host_double(static_cast<const char*>(buf.ptr) + off * 2, n, c.dt);
    };
    const auto hk_ = host(fwd.k, kv_off, size_t(c.Sk * c.D)), hv_ = host(fwd.v, kv_off, size_t(c.Sk * c.D));
    const auto hq_ = host(fwd.q, q_off, size_t(c.Sq * c.D)), ho_ = host(fwd.o, q_off, size_t(c.Sq * c.D));
    const auto hdo = host(dout, q_off, size_t(c.Sq * c.D)), hdq = host(dq, q_off, size_t(c.Sq * c.D));
    const double scale = 1.0 / std::sqrt(double(c.D));
    double err = 0, ref_max = 1e-30;
    for (int64_t i : {int64_t(0), c.Sq / 2, c.Sq - 1}) {
      const int64_t nk = c.causal ? std::min(c.Sk, i + 1) : c.Sk;
      std::vector<double> pr(static_cast<size_t>(nk)), dp(static_cast<size_t>(nk));
      double mx = -INFINITY, sum = 0, delta = 0;
      for (int64_t j = 0; j < nk; ++j) {
        double a = 0, g = 0;
        for (int64_t d = 0; d < c.D; ++d) {
          a += hq_[size_t(i * c.D + d)] * hk_[size_t(j * c.D + d)];
          g += hdo[size_t(i * c.D + d)] * hv_[size_t(j * c.D + d)];
        }
        pr[size_t(j)] = a * scale;
        dp[size_t(j)] = g;
        mx = std::max(mx, pr[size_t(j)]);
      }
      for (auto& x : pr) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < c.D; ++d) delta += hdo[size_t(i * c.D + d)] * ho_[size_t(i * c.D + d)];
      for (int64_t d = 0; d < c.D; ++d) {
        double r = 0;
        for (int64_t j = 0; j < nk; ++j) r += pr[size_t(j)] / sum * (dp[size_t(j)] - delta) * hk_[size_t(j * c.D + d)];
        r *= scale;
        ref_max = std::max(ref_max, std::fabs(r));
        const double e = std::fabs(hdq[size_t(i * c.D + d)] - r);
        err = std::isnan(e) ? INFINITY : std::max(err, e);
      }
    }
    return err / ref_max;
  }
};

}  // namespace fly::tools
