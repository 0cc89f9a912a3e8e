// SPDX-License-Identifier: Apache-2.0
// flybench topk: the suite through the library's dispatch, deterministic off and on (or one of
// them with --deterministic 0|1): time, effective TB/s (bytes of x read once / time), the variant
// and where the decision came from. --json PATH writes [{R, C, k, deterministic, us, ...}].
#include <fstream>
#include <map>
#include <memory>

#include "../kernels/topk/topk_reference.h"
#include "tool_common.hpp"

namespace fly::tools {

int bench_topk(const Args& args) {
  nlohmann::json suite = load_suite(args.get("suite", data_file("suites/topk.json")));
  std::vector<int> modes = {0, 1};
  if (args.has("deterministic")) modes = {args.get_int("deterministic", 1) != 0 ? 1 : 0};
  const int largest = args.get_int("largest", 1) != 0 ? 1 : 0;  // --largest 0: the k smallest
  cudaStream_t s = 0;
  std::printf("flybench topk on %s (FP32, %s, sorted)\n", gpu_name().c_str(), largest ? "largest" : "smallest");
  std::printf("%7s %8s %5s %3s %10s %7s  %s\n", "R", "C", "k", "det", "time_us", "TB/s", "variant (decision)");
  nlohmann::json out = nlohmann::json::array();
  bool ok = true;
  // One input and one CPU reference per (R, C): the reference for the largest k of the suite's
  // cases with that shape serves every smaller k (its rows are sorted, so a prefix is the top k).
  std::map<std::pair<int64_t, int64_t>, int64_t> kmax;
  for (auto& c : suite["cases"]) {
    auto& m = kmax[{c["R"].get<int64_t>(), c["C"].get<int64_t>()}];
    m = std::max<int64_t>(m, c["k"].get<int64_t>());
  }
  std::pair<int64_t, int64_t> have{-1, -1};
  std::unique_ptr<DeviceBuffer> xbuf;
  std::vector<float> hx;
  std::vector<uint64_t> ref_all;
  for (auto& c : suite["cases"]) {
    const int64_t R = c["R"], C = c["C"], k = c["k"];
    if (have != std::make_pair(R, C)) {
      have = {R, C};
      xbuf.reset();
      xbuf = std::make_unique<DeviceBuffer>(size_t(R * C) * 4);
      fill_random(xbuf->ptr, size_t(R * C), FLY_F32, 99 + uint64_t(R + C));
      auto hd = to_host_double(xbuf->ptr, size_t(R * C), FLY_F32);
      hx.assign(hd.begin(), hd.end());
      ref_all = topk_ref::reference(hx.data(), C, R, C, kmax[have], largest != 0);
    }
    const int64_t km = kmax[have];
    std::vector<uint64_t> ref(size_t(R * k));
    for (int64_t r = 0; r < R; ++r)
      std::copy(ref_all.begin() + r * km, ref_all.begin() + r * km + k, ref.begin() + r * k);
    DeviceBuffer& x = *xbuf;
    DeviceBuffer v(size_t(R * k) * 4), i(size_t(R * k) * 8);
    fly_tensor xt = tensor2d(x.ptr, FLY_F32, R, C, C);
    fly_tensor vt = tensor2d(v.ptr, FLY_F32, R, k, k);
    fly_tensor it = tensor2d(i.ptr, FLY_I64, R, k, k);
    size_t need = 0;
    TOOL_FLY(fly_topk_workspace_size(&xt, k, largest, 0, &need));
    DeviceBuffer ws(need);
    for (int det : modes) {
      auto run = [&] { TOOL_FLY(fly_topk(&xt, k, largest, det, &vt, &it, ws.ptr, ws.bytes, s)); };
      run();
      TOOL_CUDA(cudaDeviceSynchronize());
      const std::string variant = fly_last_variant(), decision = fly_last_decision();
      std::vector<float> hv(size_t(R * k));
      std::vector<int64_t> hi(size_t(R * k));
      TOOL_CUDA(cudaMemcpy(hv.data(), v.ptr, hv.size() * 4, cudaMemcpyDeviceToHost));
      TOOL_CUDA(cudaMemcpy(hi.data(), i.ptr, hi.size() * 8, cudaMemcpyDeviceToHost));
      std::string err = topk_ref::check(hx.data(), C, R, C, k, largest != 0, det, ref, hv.data(), k, hi.data(), k);
      if (!err.empty()) {
        std::fprintf(stderr, "flybench topk: R=%lld C=%lld k=%lld det=%d WRONG: %s\n", (long long)R, (long long)C,
                     (long long)k, det, err.c_str());
        ok = false;
      }
      const double us = time_median_us(run, s, 5, 30);
      const double tbps = double(R * C) * 4 / (us * 1e-6) / 1e12;
      std::printf("%7lld %8lld %5lld %3d %10.2f %7.3f  %s (%s)%s\n", (long long)R, (long long)C, (long long)k, det, us,
                  tbps, variant.c_str(), decision.c_str(), err.empty() ? "" : "  WRONG");
      std::fflush(stdout);
      out.push_back({{"R", R}, {"C", C}, {"k", k}, {"deterministic", det != 0}, {"largest", largest != 0}, {"us", us}, {"tbps", tbps},
                     {"variant", variant}, {"decision", decision}, {"correct", err.empty()}});
    }
  }
  if (args.has("json")) {
    std::ofstream f(args.get("json"));
    f << out.dump(1) << "\n";
  }
  if (!ok) std::fprintf(stderr, "flybench topk: some case failed its correctness check\n");
  return ok ? 0 : 1;
}

}  // namespace fly::tools
