// SPDX-License-Identifier: Apache-2.0
// flytune mxfp: for the MX suite (suites/mxfp.json: M, N, K; both formats), quantizes random BF16
// operands with fly_mx_quantize, runs every bundled mxfp variant forced, spot-checks each against
// the FP64 GEMM of the exactly dequantized operands, times it (median, L2 flushed) and writes the
// fastest per dispatch key to the tuning database, under the key the launcher computed
// (fly_last_key; src/dispatch_key.hpp keys::scaled_gemm: dtype "mxfp8" | "mxfp4", layout "nt",
// N, K, M). Every variant gets the workspace fly_scaled_gemm_workspace_size asks for (allocated
// once per problem), so split-K variants are checked and timed on their split path
// (FLYKERNELS_LOG=info prints each launch's split count).
//   flytune mxfp [--suite FILE] [--formats mxfp8,mxfp4] [--variants REGEX] [--quick] [--db F] [--dump F] [--times F]
#include <algorithm>
#include <cmath>
#include <random>
#include <regex>

#include "../kernels/gemm/gemm_mx.h"  // exact E4M3 / E2M1 / E8M0 decoders
#include "tool_common.hpp"

namespace fly::tools {
namespace {

struct MxProblem {
  int64_t M, N, K, cols;
  bool fp4;
  DeviceBuffer qa, qb, sa, sb, c, ws;
  size_t ws_bytes = 0;
  fly_tensor tqa{}, tqb{}, tsa{}, tsb{}, tc{};
  std::vector<uint8_t> hqa, hqb, hsa, hsb;  // host copies for the reference

  MxProblem(int64_t m, int64_t n, int64_t k, bool f4, uint64_t seed)
      : M(m), N(n), K(k), cols(f4 ? k / 2 : k), fp4(f4), qa(size_t(m * cols)), qb(size_t(n * cols)),
        sa(size_t(m * k / 32)), sb(size_t(n * k / 32)), c(size_t(m * n) * 2) {
    const fly_dtype et = fp4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3;
    const int fmt = fp4 ? FLY_MX_E2M1 : FLY_MX_E4M3;
    cudaStream_t s = 0;
    DeviceBuffer xa(size_t(M * K) * 2), xb(size_t(N * K) * 2);
    fill_random(xa.ptr, size_t(M * K), FLY_BF16, seed, -2.f, 2.f);
    fill_random(xb.ptr, size_t(N * K), FLY_BF16, seed + 1, -2.f, 2.f);
    fly_tensor ta = tensor2d(xa.ptr, FLY_BF16, M, K, K), tb = tensor2d(xb.ptr, FLY_BF16, N, K, K);
    tqa = tensor2d(qa.ptr, et, M, cols, cols);
    tqb = tensor2d(qb.ptr, et, N, cols, cols);
    tsa = tensor2d(sa.ptr, FLY_E8M0, M, K / 32, K / 32);
    tsb = tensor2d(sb.ptr, FLY_E8M0, N, K / 32, K / 32);
    tc = tensor2d(c.ptr, FLY_BF16, M, N, N);
    TOOL_FLY(fly_mx_quantize(&ta, fmt, &tqa, &tsa, s));
    TOOL_FLY(fly_mx_quantize(&tb, fmt, &tqb, &tsb, s));
    TOOL_CUDA(cudaStreamSynchronize(s));
    auto fetch = [](const DeviceBuffer& d, size_t n) {
      std::vector<uint8_t> h(n);
      TOOL_CUDA(cudaMemcpy(h.data(), d.ptr, n, cudaMemcpyDeviceToHost));
      return h;
    };
    hqa = fetch(qa, size_t(M * cols));
    hqb = fetch(qb, size_t(N * cols));
    hsa = fetch(sa, size_t(M * K / 32));
    hsb = fetch(sb, size_t(N * K / 32));
    TOOL_FLY(fly_scaled_gemm_workspace_size(&tqa, &tqb, &tc, &ws_bytes));
    ws = DeviceBuffer(ws_bytes);
  }
  void run(cudaStream_t s) { TOOL_FLY(fly_scaled_gemm(&tqa, &tsa, &tqb, &tsb, nullptr, &tc, ws.ptr, ws_bytes, s)); }
  double value(const std::vector<uint8_t>& q, const std::vector<uint8_t>& sc, int64_t row, int64_t k) const {
    const uint8_t b = q[size_t(row * cols + (fp4 ? k / 2 : k))];
    const double v = fp4 ? mx::decode_e2m1x2(b, int(k % 2)) : mx::decode_e4m3(b);
    return v * double(mx::decode_e8m0(sc[size_t(row * (K / 32) + k / 32)]));
  }
  // Runs once (output poisoned first) and returns the worst error over `samples` outputs in units
  // of the tolerance (BF16 rounding of the result plus FP32 summation: 2^-7 |ref| + 2^-12 sum |p|).
  double check(cudaStream_t s, int samples) {
    TOOL_CUDA(cudaMemset(c.ptr, 0xFF, size_t(M * N) * 2));  // NaN
    run(s);
    TOOL_CUDA(cudaStreamSynchronize(s));
    const std::vector<double> got = to_host_double(c.ptr, size_t(M * N), FLY_BF16);
    std::mt19937_64 rng(uint64_t(M * 31 + N * 7 + K));
    double worst = 0;
    for (int i = 0; i < samples; ++i) {
      const int64_t m = int64_t(rng() % uint64_t(M)), n = int64_t(rng() % uint64_t(N));
      double ref = 0, sabs = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = value(hqa, hsa, m, k) * value(hqb, hsb, n, k);
        ref += p;
        sabs += std::fabs(p);
      }
      const double g = got[size_t(m * N + n)];
      if (!std::isfinite(g)) return INFINITY;
      const double tol = std::ldexp(std::fabs(ref), -7) + std::ldexp(sabs, -12) + 1e-30;
      worst = std::max(worst, std::fabs(g - ref) / tol);
    }
    return worst;
  }
};

}  // namespace

int tune_mxfp(const Args& args) {
  nlohmann::json suite = load_suite(args.get("suite", data_file("suites/mxfp.json")));
  std::vector<std::string> formats;
  {
    const std::string list = args.get("formats", "mxfp8,mxfp4");
    for (size_t b = 0; b <= list.size();) {
      const size_t e = std::min(list.find(',', b), list.size());
      if (e > b) formats.push_back(list.substr(b, e - b));
      b = e + 1;
    }
  }
  for (const auto& f : formats)
    if (f != "mxfp8" && f != "mxfp4") throw UsageError("--formats: mxfp8 and/or mxfp4, got '" + f + "'");
  const std::regex match(args.get("variants", ".*"));
  std::vector<std::string> variants;
  for (const auto& v : bundled_variants("mxfp"))
    if (std::regex_search(v, match)) variants.push_back(v);
  if (variants.empty()) {
    std::fprintf(stderr, "flytune mxfp: no mxfp variant in this build matches --variants\n");
    return 1;
  }
  const bool quick = args.has("quick");
  cudaStream_t s = 0;
  size_t cases = 0;
  for (auto& c : suite["cases"])
    if (int64_t(c["K"]) % 32 == 0) ++cases;
  Progress bar(cases * formats.size() * variants.size(), "flytune mxfp");
  std::vector<TuneRow> rows;
  int rejected = 0;
  for (auto& c : suite["cases"]) {
    const int64_t M = c["M"], N = c["N"], K = c["K"];
    if (K % 32 != 0) continue;
    for (const auto& f : formats) {
      const bool fp4 = f == "mxfp4";
      MxProblem p(M, N, K, fp4, 91 + uint64_t(M + N + K));
      const std::string key = f + " " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
      std::vector<std::pair<double, std::string>> timed;
      for (const auto& v : variants) {
        bar.step(key + " " + v);
        TOOL_FLY(fly_force_variant(v.c_str()));
        const double err = p.check(s, quick ? 16 : 64);
        if (!(err <= 1.0)) {
          std::fprintf(stderr, "\nflytune: %s rejected on %s: spot check %.3g tolerances off\n", v.c_str(), key.c_str(),
                       err);
          ++rejected;
          continue;
        }
        timed.emplace_back(time_median_us([&] { p.run(s); }, s, 3, quick ? 7 : 15), v);
      }
      TOOL_FLY(fly_force_variant(nullptr));
      if (timed.empty()) continue;
      std::sort(timed.begin(), timed.end());
      append_times(args, key, timed);
      TuneRow r = launcher_row("scaled_gemm", key);
      set_winners(r, timed);
      rows.push_back(r);
    }
  }
  bar.done();
  const std::string db = args.get("db", "flykernels_tuning.sqlite");
  return finish_tuning(args, "mxfp", db, rows, rejected);
}

}  // namespace fly::tools
