// SPDX-License-Identifier: Apache-2.0
// flytune grouped_gemm: for the suite cases (suites/grouped_gemm.json), runs every bundled
// grouped_gemm variant of the dtype that can take the shape (fly_force_variant), spot-checks it
// against a double reference, times it (median, L2 flushed) and writes the fastest per dispatch
// key to the tuning database. The key is the launcher's own function (src/dispatch_key.hpp
// keys::grouped_gemm: N, K, mean rows per group rounded up to a power of two, G), computed before
// the runs because cases sharing a key (the suite's G = 8, 4096 x 4096 uniform and ragged cases)
// get the variant with the smallest total time over them; each case's runs then check it against
// the key the launcher computed (fly_last_key).
// A case with its own "layout" (suites/moe.json) is tuned in that one only (default --layouts: every
// layout the cases carry); ragged-K (dB, "mn") cases are skipped (grouped_suite.hpp).
//   flytune grouped_gemm [--suite FILE] [--layouts nt,nn] [--dtype bf16] [--quick] [--db F] [--dump F] [--times F]
#include <algorithm>
#include <map>

#include "grouped_gemm_check.hpp"

namespace fly::tools {

int tune_grouped_gemm(const Args& args) {
  nlohmann::json suite = load_suite(args.get("suite", data_file("suites/grouped_gemm.json")));
  const fly_dtype dt = parse_dtype(args.get("dtype", suite.value("dtype", std::string("bf16"))));
  const std::string dts = dt == FLY_BF16 ? "bf16" : "fp16";
  const std::vector<std::string> layouts = split_csv(args.get("layouts", grouped_default_layouts(suite)));
  const bool quick = args.has("quick");
  std::vector<std::string> variants;
  for (const auto& v : bundled_variants("grouped_gemm"))
    if (v.find("_" + dts + "_") != std::string::npos && v.rfind("grouped_gemm_k_", 0) != 0)  // mode k: not this op
      variants.push_back(v);
  if (variants.empty()) {
    std::fprintf(stderr, "flytune grouped_gemm: no %s grouped_gemm variants in this build\n", dts.c_str());
    return 1;
  }
  cudaStream_t s = 0;
  struct KeyTimes {
    TuneRow key;
    std::map<std::string, double> total;  // variant -> summed time over the key's cases
    std::map<std::string, int> runs;      // variant -> cases it ran
    int cases = 0;
  };
  std::map<std::string, KeyTimes> keys;
  size_t runs = 0;
  for (const auto& layout : layouts)
    for (const auto& c : suite["cases"]) runs += grouped_case_in_layout(c, layout) ? 1 : 0;
  if (const int skipped = grouped_cases_skipped(suite, layouts))
    std::printf("flytune grouped_gemm: %d cases not tuned: ragged-K (dB) or of a layout not in --layouts\n", skipped);
  Progress bar(runs * variants.size(), "flytune grouped_gemm");
  int rejected = 0, idx = 0;
  for (const auto& layout : layouts) {
    if (layout != "nt" && layout != "nn") throw UsageError("--layouts: nt or nn, got '" + layout + "'");
    for (auto& c : suite["cases"]) {
      if (!grouped_case_in_layout(c, layout)) {
        ++idx;
        continue;
      }
      const std::vector<int64_t> sizes = c["M"].get<std::vector<int64_t>>();
      const int64_t K = c["K"], N = c["N"], G = int64_t(sizes.size());
      GroupedProblem p(dt, sizes, K, N, layout == "nt", 777 + uint64_t(idx++));
      const TuneRow row = key_row(fly::keys::grouped_gemm(dts, layout == "nt", p.T, G, N, K));
      const std::string key = layout + " " + std::to_string(N) + " " + std::to_string(K) + " " + std::to_string(row.k2) +
                              " G" + std::to_string(G);
      KeyTimes& kt = keys[key];
      kt.key = row;
      ++kt.cases;
      std::vector<std::pair<double, std::string>> timed;
      for (const auto& name : variants) {
        bar.step(key + " " + name);
        TOOL_FLY(fly_force_variant(name.c_str()));
        double err = 0;
        try {
          err = p.check(s, 5);
        } catch (const std::runtime_error& e) {
          if (std::string(e.what()).find("FLY_ERROR_UNSUPPORTED") != std::string::npos) continue;  // cannot take it
          throw;
        }
        if (!(err <= 1.0)) {
          std::fprintf(stderr, "\nflytune: %s rejected on %s: spot check %.3g tolerances off\n", name.c_str(),
                       key.c_str(), err);
          ++rejected;
          continue;
        }
        const double us = time_median_us([&] { TOOL_FLY(p.run(s)); }, s, 2, quick ? 7 : 15);
        timed.emplace_back(us, name);
        kt.total[name] += us;
        ++kt.runs[name];
      }
      TOOL_FLY(fly_force_variant(nullptr));
      if (!timed.empty()) expect_launcher_key(row, dts + " " + key + " case " + std::to_string(idx - 1));
      std::sort(timed.begin(), timed.end());
      append_times(args, dts + " " + key + " case " + std::to_string(idx - 1), timed);
    }
  }
  bar.done();
  std::vector<TuneRow> rows;
  for (auto& kv : keys) {
    std::vector<std::pair<double, std::string>> ranked;
    for (auto& t : kv.second.total)
      if (kv.second.runs[t.first] == kv.second.cases) ranked.emplace_back(t.second, t.first);  // ran every case
    if (ranked.empty()) continue;
    std::sort(ranked.begin(), ranked.end());
    TuneRow r = kv.second.key;
    r.variant = ranked[0].second;
    r.time_us = ranked[0].first / kv.second.cases;
    if (ranked.size() > 1) {
      r.runner_up = ranked[1].second;
      r.runner_up_us = ranked[1].first / kv.second.cases;
    }
    std::printf("%s %-28s %-36s %10.1f us  (runner-up %s %.1f us)\n", dts.c_str(), kv.first.c_str(), r.variant.c_str(),
                r.time_us, r.runner_up.c_str(), r.runner_up_us);
    rows.push_back(r);
  }
  const std::string db = args.get("db", "flykernels_tuning.sqlite");
  return finish_tuning(args, "grouped_gemm", db, rows, rejected);
}

}  // namespace fly::tools
