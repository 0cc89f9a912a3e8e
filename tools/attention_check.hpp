// SPDX-License-Identifier: Apache-2.0
// One attention forward problem for flybench / flytune: BHSD buffers with random data, a launch
// through the library's dispatch, and a spot check of a few rows against an FP64 host reference.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "flykernels/flykernels.hpp"
#include "tool_common.hpp"

namespace fly::tools {

struct AttnCase {
  fly_dtype dt = FLY_BF16;
  int64_t B = 1, Hq = 1, Hkv = 1, Sq = 1, Sk = 1, D = 64;
  bool causal = false;
  std::string str() const {
    return std::string(dt == FLY_F16 ? "fp16" : "bf16") + " B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) +
           " Hkv=" + std::to_string(Hkv) + " Sq=" + std::to_string(Sq) + " Sk=" + std::to_string(Sk) +
           " D=" + std::to_string(D) + (causal ? " causal" : "");
  }
  // Matmul FLOPs (SDPA's convention): 4 B Hq Sq Sk D, halved when causal and Sq == Sk.
  double flops() const {
    const double f = 4.0 * double(B * Hq) * double(Sq) * double(Sk) * double(D);
    return causal ? f / 2 : f;
  }
  double kv_bytes() const { return 2.0 * double(B * Hkv * Sk * D) * 2; }
};

inline std::vector<AttnCase> attention_cases(const nlohmann::json& cases, const std::vector<std::string>& dtypes) {
  std::vector<AttnCase> out;
  for (auto& d : dtypes)
    for (auto& c : cases) {
      AttnCase a;
      a.dt = parse_dtype(d);
      a.B = c["B"];
      a.Hq = c["Hq"];
      a.Hkv = c["Hkv"];
      a.Sq = c["Sq"];
      a.Sk = c["Sk"];
      a.D = c["D"];
      a.causal = c["causal"];
      out.push_back(a);
    }
  return out;
}

// The dtypes a run covers: --dtype, else the suite's "dtype" list.
inline std::vector<std::string> attention_dtypes(const Args& args, const nlohmann::json& suite) {
  std::vector<std::string> dtypes;
  if (args.has("dtype")) dtypes.push_back(args.get("dtype"));
  else for (auto& d : suite["dtype"]) dtypes.push_back(d);
  return dtypes;
}

struct AttnProblem {
  AttnCase c;
  DeviceBuffer q, k, v, o, lse, ws;
  fly_tensor tq{}, tk{}, tv{}, to{}, tl{};
  fly_attention_fwd_params p{};
  fly_status query_status = FLY_SUCCESS;

  AttnProblem(const AttnCase& cs, uint64_t seed)
      : c(cs),
        q(size_t(cs.B * cs.Hq * cs.Sq * cs.D) * 2),
        k(size_t(cs.B * cs.Hkv * cs.Sk * cs.D) * 2),
        v(size_t(cs.B * cs.Hkv * cs.Sk * cs.D) * 2),
        o(size_t(cs.B * cs.Hq * cs.Sq * cs.D) * 2),
        lse(size_t(cs.B * cs.Hq * cs.Sq) * 4) {
    fill_random(q.ptr, size_t(c.B * c.Hq * c.Sq * c.D), c.dt, seed, -2.f, 2.f);
    fill_random(k.ptr, size_t(c.B * c.Hkv * c.Sk * c.D), c.dt, seed + 1, -2.f, 2.f);
    fill_random(v.ptr, size_t(c.B * c.Hkv * c.Sk * c.D), c.dt, seed + 2, -2.f, 2.f);
    tq = flykernels::tensor(q.ptr, c.dt, {c.B, c.Hq, c.Sq, c.D});
    tk = flykernels::tensor(k.ptr, c.dt, {c.B, c.Hkv, c.Sk, c.D});
    tv = flykernels::tensor(v.ptr, c.dt, {c.B, c.Hkv, c.Sk, c.D});
    to = flykernels::tensor(o.ptr, c.dt, {c.B, c.Hq, c.Sq, c.D});
    tl = flykernels::tensor(lse.ptr, FLY_F32, {c.B, c.Hq, c.Sq});
    p.struct_size = sizeof(p);
    p.q = &tq;
    p.k = &tk;
    p.v = &tv;
    p.o = &to;
    p.lse = &tl;
    p.causal = c.causal ? 1 : 0;
    size_t bytes = 0;
    query_status = fly_attention_fwd_workspace_size(&p, &bytes);  // UNSUPPORTED: run() says so again
    if (query_status == FLY_SUCCESS && bytes) {
      ws = DeviceBuffer(bytes);
      p.workspace = ws.ptr;
      p.workspace_bytes = bytes;
    }
  }
  fly_status run(cudaStream_t s) { return fly_attention_fwd(&p, s); }

  // Runs once on poisoned outputs and compares rows {0, Sq/2, Sq-1} of the last (b, h) with an FP64
  // reference: max |O - ref| / max |ref| over those rows plus max |LSE - ref| (NaN fails).
  double check(cudaStream_t s) {
    TOOL_CUDA(cudaMemsetAsync(o.ptr, 0xff, o.bytes, s));
    TOOL_CUDA(cudaMemsetAsync(lse.ptr, 0xff, lse.bytes, s));
    TOOL_FLY(run(s));
    TOOL_CUDA(cudaStreamSynchronize(s));
    const int64_t b = c.B - 1, h = c.Hq - 1, hk = h / (c.Hq / c.Hkv);
    const size_t kv_off = size_t((b * c.Hkv + hk) * c.Sk * c.D);
    const auto hk_ = to_host_double(static_cast<char*>(k.ptr) + kv_off * 2, size_t(c.Sk * c.D), c.dt);
    const auto hv_ = to_host_double(static_cast<char*>(v.ptr) + kv_off * 2, size_t(c.Sk * c.D), c.dt);
    const size_t q_off = size_t((b * c.Hq + h) * c.Sq * c.D);
    const auto hq_ = to_host_double(static_cast<char*>(q.ptr) + q_off * 2, size_t(c.Sq * c.D), c.dt);
    const auto ho_ = to_host_double(static_cast<char*>(o.ptr) + q_off * 2, size_t(c.Sq * c.D), c.dt);
    const auto hl_ = to_host_double(static_cast<char*>(lse.ptr) + size_t((b * c.Hq + h) * c.Sq) * 4, size_t(c.Sq), FLY_F32);
    const double scale = 1.0 / std::sqrt(double(c.D));
    double err = 0, ref_max = 1e-30, lse_err = 0;
    for (int64_t i : {int64_t(0), c.Sq / 2, c.Sq - 1}) {
      const int64_t nk = c.causal ? std::min(c.Sk, i + 1) : c.Sk;
      std::vector<double> sc(static_cast<size_t>(nk));
      double mx = -INFINITY;
      for (int64_t j = 0; j < nk; ++j) {
        double a = 0;
        for (int64_t d = 0; d < c.D; ++d) a += hq_[size_t(i * c.D + d)] * hk_[size_t(j * c.D + d)];
        sc[size_t(j)] = a * scale;
        mx = std::max(mx, sc[size_t(j)]);
      }
      double sum = 0;
      for (auto& x : sc) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < c.D; ++d) {
        double r = 0;
        for (int64_t j = 0; j < nk; ++j) r += sc[size_t(j)] * hv_[size_t(j * c.D + d)];
        r /= sum;
        ref_max = std::max(ref_max, std::fabs(r));
        const double e = std::fabs(ho_[size_t(i * c.D + d)] - r);
        err = std::isnan(e) ? INFINITY : std::max(err, e);
      }
      const double le = std::fabs(hl_[size_t(i)] - (mx + std::log(sum)));
      lse_err = std::isnan(le) ? INFINITY : std::max(lse_err, le);
    }
    return err / ref_max + lse_err;
  }
};

}  // namespace fly::tools
