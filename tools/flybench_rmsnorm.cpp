// SPDX-License-Identifier: Apache-2.0
// flybench rmsnorm: the suite through the library's dispatch: time, TB/s, % of copy bandwidth.
#include <fstream>

#include "rmsnorm_check.hpp"

namespace fly::tools {

int bench_rmsnorm(const Args& args) {
  nlohmann::json suite = load_suite(args.get("suite", data_file("suites/rmsnorm.json")));
  cudaStream_t s = 0;
  const double copy_bw = copy_bandwidth_bytes_per_s();
  std::printf("flybench rmsnorm on %s: measured copy bandwidth %.2f TB/s\n", gpu_name().c_str(), copy_bw / 1e12);
  std::printf("L2 flush before each timed run: %s\n", l2_flush_method());
  std::printf("%-5s %7s %7s %10s %8s %7s %8s %6s  %s\n", "dtype", "M", "N", "time_us", "TB/s", "%copy", "%copyMN",
              "err", "variant");
  nlohmann::json out = nlohmann::json::array();
  bool ok = true;
  for (auto& c : suite["cases"]) {
    fly_dtype dt = parse_dtype(c["dtype"]);
    int64_t M = c["M"], N = c["N"];
    RmsNormProblem prob(dt, M, N, 99 + uint64_t(M + N));
    double err = prob.check(s);
    std::string variant = fly_last_variant(), decision = fly_last_decision();
    // --no-flush: back-to-back runs without the L2 flush (inputs may then come from L2).
    double us = time_median_us([&] { TOOL_FLY(prob.run(s)); }, s, 5, 30, !args.has("no-flush"));
    double bw = prob.bytes() / (us * 1e-6);
    // The same bytes moved by cudaMemcpy (x's M*N elements to another buffer), timed the same
    // way: what a copy of this size achieves here, launch and ramp included.
    const size_t xbytes = size_t(M * N) * dtype_bytes(dt);
    double copy_us = 0;
    {
      DeviceBuffer cs(xbytes), cd(xbytes);
      TOOL_CUDA(cudaMemset(cs.ptr, 1, xbytes));
      copy_us = time_median_us([&] { TOOL_CUDA(cudaMemcpyAsync(cd.ptr, cs.ptr, xbytes, cudaMemcpyDeviceToDevice, s)); },
                               s, 5, 30, !args.has("no-flush"));
    }
    std::printf("%-5s %7lld %7lld %10.2f %8.3f %6.1f%% %7.1f%% %6.2f  %s (%s)\n", c["dtype"].get<std::string>().c_str(),
                (long long)M, (long long)N, us, bw / 1e12, 100 * bw / copy_bw, 100 * copy_us / us, err,
                variant.c_str(), decision.c_str());
    if (!(err <= 4.0)) ok = false;
    out.push_back({{"dtype", c["dtype"]}, {"M", M}, {"N", N}, {"us", us}, {"tbps", bw / 1e12},
                   {"copy_fraction", bw / copy_bw}, {"same_size_copy_us", copy_us}, {"err_units", err}, {"variant", variant}});
  }
  if (args.has("json")) {
    std::ofstream f(args.get("json"));
    f << nlohmann::json{{"gpu", gpu_name()}, {"copy_tbps", copy_bw / 1e12}, {"flush", l2_flush_method()}, {"cases", out}}.dump(1);
  }
  if (!ok) std::fprintf(stderr, "flybench rmsnorm: some case failed its correctness check\n");
  return ok ? 0 : 1;
}

}  // namespace fly::tools
