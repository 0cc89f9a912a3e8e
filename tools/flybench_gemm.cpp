// SPDX-License-Identifier: Apache-2.0
// flybench gemm: the gemm suite through the library's dispatch, NT first, then NN, TN and TT on the
// same shapes: time (median, L2 flushed), TFLOP/s, and for M <= 128 the fraction of the
// weight-read floor (bytes of B / measured copy bandwidth).
//   flybench gemm [--suite FILE] [--layouts nt,nn,tn,tt] [--json PATH] [--warm-ms 30]
// --json writes [{"M","N","K","layout","us","tflops","floor_us","variant"}].
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "gemm_check.hpp"

namespace fly::tools {
int bench_gemm(const Args& args) {
  nlohmann::json suite = load_suite(args.get("suite", data_file("suites/gemm_bf16.json")));
  const fly_dtype dt = parse_dtype(args.get("dtype", suite.value("dtype", std::string("bf16"))));
  const std::vector<std::string> layouts = split_list(args.get("layouts", "nt,nn,tn,tt"));
  cudaStream_t s = 0;
  const double copy_bw = copy_bandwidth_bytes_per_s();  // bytes read + written per second
  std::printf("flybench gemm on %s (%s): copy bandwidth %.2f TB/s\n", gpu_name().c_str(),
              dt == FLY_BF16 ? "bf16" : "fp16", copy_bw / 1e12);
  std::printf("%-6s %6s %6s %6s %10s %8s %8s  %s\n", "layout", "M", "N", "K", "time_us", "TFLOP/s", "%floor",
              "variant");
  nlohmann::json out = nlohmann::json::array();
  // --warm-ms: warm-up in ms of back-to-back calls before timing (bench/gemm_torch.py's WARM_MS).
  const double warm_ms = args.get_double("warm-ms", 30);
  bool ok = true;
  for (auto& layout : layouts)
    for (auto& c : suite["cases"]) {
      const int64_t M = c["M"], N = c["N"], K = c["K"];
      GemmBuffers buf(dt, M, N, K, layout, 11 + uint64_t(M + N));
      const bool good = buf.check(s, uint64_t(M * 7 + N)) <= 1.0;
      ok = ok && good;
      const std::string variant = fly_last_variant(), decision = fly_last_decision();
      const double us = time_median_us([&] { TOOL_FLY(buf.run(s)); }, s, 3, 20, true, warm_ms);
      const double tflops = 2.0 * double(M) * N * K / (us * 1e-6) / 1e12;
      // Weight-read floor: B's bytes at the measured copy bandwidth (copy bandwidth counts read +
      // write bytes, so it is the rate at which the memory moves bytes; a pure read runs as fast).
      const double floor_us = double(K) * N * 2 / copy_bw * 1e6;
      char frac[16] = "";
      if (M <= 128) std::snprintf(frac, sizeof frac, "%.0f%%", 100 * floor_us / us);
      std::printf("%-6s %6lld %6lld %6lld %10.1f %8.1f %8s  %s (%s)%s\n", layout.c_str(), (long long)M, (long long)N,
                  (long long)K, us, tflops, frac, variant.c_str(), decision.c_str(), good ? "" : "  WRONG RESULT");
      out.push_back({{"M", M}, {"N", N}, {"K", K}, {"layout", layout}, {"us", us}, {"tflops", tflops},
                     {"floor_us", floor_us}, {"variant", variant}});
    }
  if (args.has("json")) std::ofstream(args.get("json")) << out.dump(1);
  if (!ok) std::fprintf(stderr, "flybench gemm: some case failed its spot check\n");
  return ok ? 0 : 1;
}

}  // namespace fly::tools
