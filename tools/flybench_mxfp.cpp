// SPDX-License-Identifier: Apache-2.0
// flybench mxfp: the MX suite (suites/mxfp.json) through the library: fly_mx_quantize of BF16
// operands (time and bandwidth against a copy of the same bytes), then fly_scaled_gemm from the
// quantized operands (time, TFLOP/s, effective bandwidth of the bytes it must read), MXFP8 and
// MXFP4, BF16 output. bench/mxfp_torch.py runs this with --json beside the torch baselines.
// --variant NAME forces that mxfp variant for the GEMM (fly_force_variant; e.g. mxfp_wgmma_n128_f1,
// built with -DFLY_ALL_VARIANTS=ON); the output is then also compared with the default kernel's
// on the same operands ("vs_default": max |forced - default| / max |default|).
// --quant-variant NAME forces that mx_quantize variant for the quantizer's timing (e.g.
// mx_quantize_t256_hw1), whose output is compared byte for byte with the default quantizer's.
// The GEMM gets the workspace fly_scaled_gemm_workspace_size asks for (allocated once per case,
// outside the timing), so split-K variants are timed on their split path; column "splits": the
// split count the timed variant's launch used (1: unsplit).
#include <algorithm>
#include <cmath>
#include <fstream>

#include "tool_common.hpp"

namespace fly::tools {

int bench_mxfp(const Args& args) {
  nlohmann::json suite = load_suite(args.get("suite", data_file("suites/mxfp.json")));
  cudaStream_t s = 0;
  const double copy_bw = copy_bandwidth_bytes_per_s();
  const bool flush = !args.has("no-flush");
  const std::string force = args.get("variant", "");
  const std::string qforce = args.get("quant-variant", "");
  std::printf("flybench mxfp on %s: copy bandwidth %.2f TB/s, L2 flush: %s\n", gpu_name().c_str(), copy_bw / 1e12,
              l2_flush_method());
  std::printf("%-5s %6s %6s %6s %10s %9s %8s %10s %8s %6s  %s\n", "fmt", "M", "N", "K", "gemm_us", "TFLOP/s", "TB/s",
              "quant_us", "%copy", "splits", "variant");
  nlohmann::json out = nlohmann::json::array();
  for (auto& c : suite["cases"]) {
    const int64_t M = c["M"], N = c["N"], K = c["K"];
    if (K % 32 != 0) continue;
    for (int fp4 = 0; fp4 < 2; ++fp4) {
      const int fmt = fp4 ? FLY_MX_E2M1 : FLY_MX_E4M3;
      const fly_dtype et = fp4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3;
      const int64_t cols = fp4 ? K / 2 : K;
      DeviceBuffer xa(size_t(M * K) * 2), xb(size_t(N * K) * 2);
      fill_random(xa.ptr, size_t(M * K), FLY_BF16, 11 + uint64_t(M), -2.f, 2.f);
      fill_random(xb.ptr, size_t(N * K), FLY_BF16, 13 + uint64_t(N), -2.f, 2.f);
      DeviceBuffer qa(size_t(M * cols)), qb(size_t(N * cols)), sa(size_t(M * K / 32)), sb(size_t(N * K / 32));
      DeviceBuffer cbuf(size_t(M * N) * 2);
      fly_tensor ta = tensor2d(xa.ptr, FLY_BF16, M, K, K), tb = tensor2d(xb.ptr, FLY_BF16, N, K, K);
      fly_tensor tqa = tensor2d(qa.ptr, et, M, cols, cols), tqb = tensor2d(qb.ptr, et, N, cols, cols);
      fly_tensor tsa = tensor2d(sa.ptr, FLY_E8M0, M, K / 32, K / 32), tsb = tensor2d(sb.ptr, FLY_E8M0, N, K / 32, K / 32);
      fly_tensor tc = tensor2d(cbuf.ptr, FLY_BF16, M, N, N);
      size_t ws_bytes = 0;
      TOOL_FLY(fly_scaled_gemm_workspace_size(&tqa, &tqb, &tc, &ws_bytes));
      DeviceBuffer ws(ws_bytes);
      TOOL_FLY(fly_mx_quantize(&ta, fmt, &tqa, &tsa, s));
      // the quantizer on the weight operand (the larger one): bytes read + written vs a copy
      if (!qforce.empty()) {  // the forced quantizer must give the default's bytes
        TOOL_FLY(fly_mx_quantize(&tb, fmt, &tqb, &tsb, s));
        TOOL_CUDA(cudaStreamSynchronize(s));
        std::vector<uint8_t> want(size_t(N * cols)), got(size_t(N * cols));
        TOOL_CUDA(cudaMemcpy(want.data(), qb.ptr, want.size(), cudaMemcpyDeviceToHost));
        TOOL_FLY(fly_force_variant(qforce.c_str()));
        TOOL_FLY(fly_mx_quantize(&tb, fmt, &tqb, &tsb, s));
        TOOL_CUDA(cudaStreamSynchronize(s));
        TOOL_CUDA(cudaMemcpy(got.data(), qb.ptr, got.size(), cudaMemcpyDeviceToHost));
        if (want != got) throw std::runtime_error("flybench mxfp: " + qforce + " quantizes differently from the default");
      }
      const double qus = time_median_us([&] { TOOL_FLY(fly_mx_quantize(&tb, fmt, &tqb, &tsb, s)); }, s, 3, 15, flush);
      if (!qforce.empty()) TOOL_FLY(fly_force_variant(nullptr));
      const double qbytes = double(N * K) * 2 + double(N * cols) + double(N * K / 32);
      double vs_default = -1;
      if (!force.empty()) {
        TOOL_FLY(fly_scaled_gemm(&tqa, &tsa, &tqb, &tsb, nullptr, &tc, ws.ptr, ws_bytes, s));
        TOOL_CUDA(cudaStreamSynchronize(s));
        const std::vector<double> ref = to_host_double(cbuf.ptr, size_t(M * N), FLY_BF16);
        TOOL_FLY(fly_force_variant(force.c_str()));
        TOOL_FLY(fly_scaled_gemm(&tqa, &tsa, &tqb, &tsb, nullptr, &tc, ws.ptr, ws_bytes, s));
        TOOL_CUDA(cudaStreamSynchronize(s));
        const std::vector<double> got = to_host_double(cbuf.ptr, size_t(M * N), FLY_BF16);
        double dmax = 0, rmax = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          const double d = std::fabs(got[i] - ref[i]);
          dmax = std::isnan(d) ? INFINITY : std::max(dmax, d);
          rmax = std::max(rmax, std::fabs(ref[i]));
        }
        vs_default = rmax > 0 ? dmax / rmax : dmax;
      }
      const double us = time_median_us(
          [&] { TOOL_FLY(fly_scaled_gemm(&tqa, &tsa, &tqb, &tsb, nullptr, &tc, ws.ptr, ws_bytes, s)); }, s, 3, 15, flush, 20);
      const std::string variant = fly_last_variant();
      const int splits = mx_launch_splits(variant, M, N, K, ws_bytes);
      if (!force.empty()) TOOL_FLY(fly_force_variant(nullptr));
      const double tflops = 2.0 * M * N * K / (us * 1e-6) / 1e12;
      const double gbytes = double((M + N) * cols) + double((M + N) * K / 32) + double(M * N) * 2;
      std::printf("%-5s %6lld %6lld %6lld %10.2f %9.1f %8.3f %10.2f %7.1f%% %6d  %s", fp4 ? "mxfp4" : "mxfp8",
                  (long long)M, (long long)N, (long long)K, us, tflops, gbytes / (us * 1e-6) / 1e12, qus,
                  100 * qbytes / (qus * 1e-6) / copy_bw, splits, variant.c_str());
      if (vs_default >= 0) std::printf("  vs_default %.2e", vs_default);
      std::printf("\n");
      out.push_back({{"format", fp4 ? "mxfp4" : "mxfp8"}, {"M", M}, {"N", N}, {"K", K}, {"us", us}, {"tflops", tflops},
                     {"quant_us", qus}, {"quant_copy_fraction", qbytes / (qus * 1e-6) / copy_bw}, {"variant", variant},
                     {"splits", splits}, {"workspace_bytes", ws_bytes}, {"vs_default", vs_default}});
    }
  }
  if (args.has("json")) {
    std::ofstream f(args.get("json"));
    f << nlohmann::json{{"gpu", gpu_name()}, {"copy_tbps", copy_bw / 1e12}, {"flush", l2_flush_method()}, {"cases", out}}.dump(1);
  }
  return 0;
}

}  // namespace fly::tools
