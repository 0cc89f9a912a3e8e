// SPDX-License-Identifier: Apache-2.0
// flytune rmsnorm: times every bundled rmsnorm variant on the suite shapes plus an N x M grid.
#include <fstream>

#include "rmsnorm_check.hpp"

namespace fly::tools {

int tune_rmsnorm(const Args& args) {
  nlohmann::json space = nlohmann::json::parse(std::ifstream(data_file("tuning/rmsnorm.json")));
  nlohmann::json suite = load_suite(args.get("suite", data_file("suites/rmsnorm.json")));
  const bool quick = args.has("quick");
  struct Case { fly_dtype dt; int64_t M, N; };
  std::vector<Case> cases;
  for (auto& c : suite["cases"])
    cases.push_back({parse_dtype(c["dtype"]), c["M"].get<int64_t>(), c["N"].get<int64_t>()});
  if (!quick) {
    auto& w = space["workloads"];
    for (auto& d : w["dtypes"])
      for (auto& n : w["grid_n"])
        for (auto& m : w["grid_m"]) {
          int64_t N = n.get<int64_t>(), M = m.get<int64_t>();
          if (M * N > (int64_t(1) << 28)) continue;  // keep each grid point under 1 GiB
          cases.push_back({parse_dtype(d), M, N});
        }
  }
  const double tol = args.get_double("tolerance", 4.0);
  cudaStream_t s = 0;
  std::vector<TuneRow> rows;
  size_t total = 0;
  // Candidates of one case: its dtype, and a register cache that holds the row's vectors without
  // leaving most threads idle (cap in [nvec, 4 nvec]); the largest caches when none holds it.
  auto candidates = [&](const Case& c) {
    const std::string dname = c.dt == FLY_F16 ? "fp16" : c.dt == FLY_BF16 ? "bf16" : "fp32";
    const int64_t nvec = std::max<int64_t>(1, c.N / int64_t(16 / dtype_bytes(c.dt)));
    std::vector<std::string> all, fit;
    int64_t biggest = 0;
    for (auto& v : bundled_variants("rmsnorm")) {
      if (v.find("_" + dname + "_") == std::string::npos) continue;
      all.push_back(v);
      const int64_t cap = variant_param(v, "tpr") * variant_param(v, "cache");
      biggest = std::max(biggest, cap);
      if (args.has("exhaustive") || (cap >= nvec && cap <= 4 * std::max<int64_t>(nvec, 128))) fit.push_back(v);
    }
    if (fit.empty())
      for (auto& v : all)
        if (variant_param(v, "tpr") * variant_param(v, "cache") == biggest) fit.push_back(v);
    return fit;
  };
  for (auto& c : cases) total += candidates(c).size();
  Progress bar(total, "flytune rmsnorm");
  int rejected = 0;
  for (auto& c : cases) {
    const char* dname = c.dt == FLY_F16 ? "fp16" : c.dt == FLY_BF16 ? "bf16" : "fp32";
    RmsNormProblem prob(c.dt, c.M, c.N, 1234 + uint64_t(c.M * 31 + c.N));
    std::vector<std::pair<double, std::string>> timed;
    for (auto& v : candidates(c)) {
      bar.step(std::string(dname) + " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " " + v);
      TOOL_FLY(fly_force_variant(v.c_str()));
      if (prob.run(s) == FLY_ERROR_UNSUPPORTED) continue;  // the variant cannot take this shape
      double err = prob.check(s);
      if (!(err <= tol)) {
        std::fprintf(stderr, "\nflytune: %s rejected on M=%lld N=%lld: error %.2f units\n", v.c_str(),
                     (long long)c.M, (long long)c.N, err);
        ++rejected;
        continue;
      }
      double us = time_median_us([&] { TOOL_FLY(prob.run(s)); }, s, 2, quick ? 5 : 9);
      timed.emplace_back(us, v);
    }
    TOOL_FLY(fly_force_variant(nullptr));
    if (timed.empty()) continue;
    std::sort(timed.begin(), timed.end());
    append_times(args, std::string(dname) + " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N), timed);
    TuneRow r = launcher_row("rmsnorm_fwd", std::string(dname) + " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N));
    set_winners(r, timed);
    rows.push_back(r);
  }
  bar.done();
  const std::string db = args.get("db", "flykernels_tuning.sqlite");
  return finish_tuning(args, "rmsnorm", db, rows, rejected);
}

}  // namespace fly::tools
