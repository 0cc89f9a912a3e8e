// SPDX-License-Identifier: Apache-2.0
// flytune topk: for the suite cases (plus tuning/topk.json's extra cases), deterministic off and
// on, runs every bundled topk variant that can take the shape (fly_force_variant), checks it
// against a CPU reference, times it, and writes the fastest per key to the tuning database.
#include <algorithm>
#include <fstream>
#include <regex>

#include "../kernels/topk/topk_reference.h"
#include "tool_common.hpp"

namespace fly::tools {
namespace {

struct TopkCase {
  int64_t R, C, k;
};

// One problem on the device: x random in [-1, 1), outputs, workspace, and the CPU reference.
size_t topk_workspace(void* x, int64_t R, int64_t C, int64_t k) {
  fly_tensor xt = tensor2d(x, FLY_F32, R, C, C);
  size_t need = 0;
  TOOL_FLY(fly_topk_workspace_size(&xt, k, 1, 1, &need));
  return need;
}

struct TopkProblem {
  int64_t R, C, k;
  DeviceBuffer x, v, i, ws;
  std::vector<float> hx;
  std::vector<uint64_t> ref;
  TopkProblem(int64_t R_, int64_t C_, int64_t k_, uint64_t seed)
      : R(R_), C(C_), k(k_), x(size_t(R_ * C_) * 4), v(size_t(R_ * k_) * 4), i(size_t(R_ * k_) * 8),
        ws(topk_workspace(x.ptr, R_, C_, k_)) {
    fill_random(x.ptr, size_t(R * C), FLY_F32, seed);
    auto hd = to_host_double(x.ptr, size_t(R * C), FLY_F32);
    hx.assign(hd.begin(), hd.end());  // exact: the doubles came from floats
    ref = topk_ref::reference(hx.data(), C, R, C, k, true);
  }
  fly_status run(bool det, cudaStream_t s) {
    fly_tensor xt = tensor2d(x.ptr, FLY_F32, R, C, C);
    fly_tensor vt = tensor2d(v.ptr, FLY_F32, R, k, k);
    fly_tensor it = tensor2d(i.ptr, FLY_I64, R, k, k);
    return fly_topk(&xt, k, 1, det, &vt, &it, ws.ptr, ws.bytes, s);
  }
  // "" when the last run's result is right.
  std::string check(bool det) {
    std::vector<float> hv(size_t(R * k));
    std::vector<int64_t> hi(size_t(R * k));
    TOOL_CUDA(cudaMemcpy(hv.data(), v.ptr, hv.size() * 4, cudaMemcpyDeviceToHost));
    TOOL_CUDA(cudaMemcpy(hi.data(), i.ptr, hi.size() * 8, cudaMemcpyDeviceToHost));
    return topk_ref::check(hx.data(), C, R, C, k, true, det, ref, hv.data(), k, hi.data(), k);
  }
};

}  // namespace

int tune_topk(const Args& args) {
  nlohmann::json suite = load_suite(args.get("suite", data_file("suites/topk.json")));
  const bool quick = args.has("quick");
  std::vector<TopkCase> cases;
  for (auto& c : suite["cases"])
    cases.push_back({c["R"].get<int64_t>(), c["C"].get<int64_t>(), c["k"].get<int64_t>()});
  if (!quick) {
    std::ifstream f(data_file("tuning/topk.json"));
    if (f) {
      nlohmann::json space = nlohmann::json::parse(f);
      if (space.contains("workloads") && space["workloads"].contains("extra_cases"))
        for (auto& c : space["workloads"]["extra_cases"])
          cases.push_back({c["R"].get<int64_t>(), c["C"].get<int64_t>(), c["k"].get<int64_t>()});
    }
  }
  // --variants REGEX: only the bundled variants whose name it matches (as gemm's option).
  std::vector<std::string> variants;
  const std::regex only(args.get("variants", ".*"));
  for (auto& name : bundled_variants("topk"))
    if (std::regex_search(name, only)) variants.push_back(name);
  if (variants.empty()) {
    std::fprintf(stderr, "flytune topk: no topk variants in this build\n");
    return 1;
  }
  cudaStream_t s = 0;
  std::vector<TuneRow> rows;
  Progress bar(cases.size() * 2 * variants.size(), "flytune topk");
  int rejected = 0;
  for (auto& c : cases) {
    TopkProblem prob(c.R, c.C, c.k, 4242 + uint64_t(c.R * 7 + c.C * 3 + c.k));
    for (int det = 0; det < 2; ++det) {
      std::vector<std::pair<double, std::string>> timed;
      for (auto& name : variants) {
        bar.step((det ? "det " : "") + std::string("R=") + std::to_string(c.R) + " C=" + std::to_string(c.C) +
                 " k=" + std::to_string(c.k) + " " + name);
        TOOL_FLY(fly_force_variant(name.c_str()));
        TOOL_CUDA(cudaMemset(prob.v.ptr, 0xff, prob.v.bytes));
        TOOL_CUDA(cudaMemset(prob.i.ptr, 0xff, prob.i.bytes));
        fly_status st = prob.run(det, s);
        if (st == FLY_ERROR_UNSUPPORTED) continue;  // this variant cannot take the shape
        if (st != FLY_SUCCESS)
          throw std::runtime_error(name + ": " + fly_status_string(st) + ": " + fly_get_last_error());
        TOOL_CUDA(cudaDeviceSynchronize());
        std::string err = prob.check(det);
        if (!err.empty()) {
          std::fprintf(stderr, "\nflytune: %s rejected on R=%lld C=%lld k=%lld det=%d: %s\n", name.c_str(),
                       (long long)c.R, (long long)c.C, (long long)c.k, det, err.c_str());
          ++rejected;
          continue;
        }
        double us = time_median_us([&] { TOOL_FLY(prob.run(det, s)); }, s, 3, quick ? 7 : 15);
        timed.emplace_back(us, name);
      }
      TOOL_FLY(fly_force_variant(nullptr));
      if (timed.empty()) continue;
      std::sort(timed.begin(), timed.end());
      append_times(args, std::string(det ? "det " : "") + "R=" + std::to_string(c.R) + " C=" + std::to_string(c.C) +
                             " k=" + std::to_string(c.k), timed);
      TuneRow r = launcher_row("topk", std::string(det ? "det " : "") + "R=" + std::to_string(c.R) + " C=" +
                                           std::to_string(c.C) + " k=" + std::to_string(c.k));
      set_winners(r, timed);
      rows.push_back(r);
    }
  }
  bar.done();
  const std::string db = args.get("db", "flykernels_tuning.sqlite");
  return finish_tuning(args, "topk", db, rows, rejected);
}

}  // namespace fly::tools
