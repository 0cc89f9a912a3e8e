// SPDX-License-Identifier: Apache-2.0
// flybench grouped_gemm: the grouped GEMM suite (suites/grouped_gemm.json: uniform, projection and
// ragged mixture-of-experts shapes) through the library's dispatch: time (median, L2 flushed),
// TFLOP/s over the real rows (sum M_g x N x K x 2), and a spot check of 64 outputs per case
// against a double reference.
//   flybench grouped_gemm [--suite FILE] [--layouts nt,nn] [--json PATH] [--warm-ms 30]
// Layouts: nt = B [G, K, N] with K contiguous (w.transpose(-2, -1) of [G, N, K] weights, what
// F.grouped_mm's CUTLASS path is fastest with), nn = B with N contiguous. A case with its own
// "layout" (suites/moe.json) runs in that one only, and the default --layouts is then every layout
// the cases carry; its ragged-K (dB, "mn") cases are skipped (grouped_suite.hpp).
// --json writes [{"case","kind","G","T","K","N","layout","us","tflops","variant","decision"}].
#include <fstream>

#include "grouped_gemm_check.hpp"

namespace fly::tools {

int bench_grouped_gemm(const Args& args) {
  nlohmann::json suite = load_suite(args.get("suite", data_file("suites/grouped_gemm.json")));
  const fly_dtype dt = parse_dtype(args.get("dtype", suite.value("dtype", std::string("bf16"))));
  const std::vector<std::string> layouts = split_csv(args.get("layouts", grouped_default_layouts(suite)));
  const double warm_ms = args.get_double("warm-ms", 30);
  cudaStream_t s = 0;
  std::printf("flybench grouped_gemm on %s (%s), L2 flush: %s\n", gpu_name().c_str(), dt == FLY_BF16 ? "bf16" : "fp16",
              l2_flush_method());
  std::printf("%4s %-10s %-6s %4s %6s %6s %6s %10s %8s %6s  %s\n", "case", "kind", "layout", "G", "T", "K", "N",
              "time_us", "TFLOP/s", "check", "variant");
  nlohmann::json out = nlohmann::json::array();
  bool ok = true;
  for (const auto& layout : layouts) {
    if (layout != "nt" && layout != "nn") throw UsageError("--layouts: nt or nn, got '" + layout + "'");
    int idx = 0;
    for (auto& c : suite["cases"]) {
      if (!grouped_case_in_layout(c, layout)) {
        ++idx;
        continue;
      }
      const std::vector<int64_t> sizes = c["M"].get<std::vector<int64_t>>();
      const int64_t K = c["K"], N = c["N"], G = int64_t(sizes.size());
      GroupedProblem p(dt, sizes, K, N, layout == "nt", 31 + uint64_t(idx));
      const double err = p.check(s, uint64_t(idx) * 13 + 1);
      const bool good = err <= 1.0;
      ok = ok && good;
      const std::string variant = fly_last_variant(), decision = fly_last_decision();
      const double us = time_median_us([&] { TOOL_FLY(p.run(s)); }, s, 3, 20, true, warm_ms);
      const double tflops = 2.0 * double(p.T) * N * K / (us * 1e-6) / 1e12;
      const std::string kind = c.value("kind", std::string("-"));
      std::printf("%4d %-10s %-6s %4lld %6lld %6lld %6lld %10.1f %8.1f %6.2f  %s (%s)%s\n", idx, kind.c_str(),
                  layout.c_str(), (long long)G, (long long)p.T, (long long)K, (long long)N, us, tflops, err,
                  variant.c_str(), decision.c_str(), good ? "" : "  WRONG RESULT");
      out.push_back({{"case", idx}, {"kind", kind}, {"G", G}, {"T", p.T}, {"K", K}, {"N", N}, {"M", sizes},
                     {"layout", layout}, {"us", us}, {"tflops", tflops}, {"variant", variant}, {"decision", decision}});
      ++idx;
    }
  }
  if (const int skipped = grouped_cases_skipped(suite, layouts))
    std::printf("%d cases not run: ragged-K (dB) or of a layout not in --layouts (bench/grouped_gemm_torch.py times "
                "the dB ones)\n", skipped);
  if (args.has("json")) std::ofstream(args.get("json")) << out.dump(1);
  if (!ok) std::fprintf(stderr, "flybench grouped_gemm: some case failed its spot check\n");
  return ok ? 0 : 1;
}

}  // namespace fly::tools
