// SPDX-License-Identifier: Apache-2.0
// flytune attention: times every bundled attention variant of the case's dtype and head dim on the
// suite (and the decode cases of tuning/attention.json) and writes the winners as DB rows.
// --bwd: the same over the attention_bwd variants on the suite's cases (O and LSE from one forward
// per case), rows of op attention_bwd.
#include <algorithm>
#include <fstream>

#include "../kernels/attention/attention_plan.h"  // padded_head_dim: the variants a case can run
#include "attention_bwd_check.hpp"

namespace fly::tools {

namespace {

// Problem: AttnProblem (forward) or AttnBwdProblem (backward): run(s), check(s), prepare(s).
fly_status prepare(AttnProblem&, cudaStream_t) { return FLY_SUCCESS; }
fly_status prepare(AttnBwdProblem& p, cudaStream_t s) { return p.prepare(s); }

template <class Problem>
int tune(const Args& args, const std::vector<AttnCase>& cases, const char* family, const char* op) {
  const bool quick = args.has("quick");
  cudaStream_t s = 0;
  auto candidates = [&](const AttnCase& c) {
    const std::string dname = c.dt == FLY_F16 ? "fp16" : "bf16";
    const int hd = fly::attn::padded_head_dim(c.D);
    std::vector<std::string> fit;
    for (auto& v : bundled_variants(family))
      if (v.find("_" + dname + "_") != std::string::npos && variant_param(v, "hd") == hd) fit.push_back(v);
    return fit;
  };
  size_t total = 0;
  for (auto& c : cases) total += candidates(c).size();
  const std::string title = std::string("flytune ") + family;
  Progress bar(total, title);
  std::vector<TuneRow> rows;
  int rejected = 0;
  for (auto& c : cases) {
    Problem prob(c, 4321 + uint64_t(c.Sq + c.Sk * 3 + c.D));
    if (prepare(prob, s) != FLY_SUCCESS) {
      std::fprintf(stderr, "\nflytune: %s skipped: %s\n", c.str().c_str(), fly_get_last_error());
      for (size_t i = 0; i < candidates(c).size(); ++i) bar.step(c.str());
      continue;
    }
    std::vector<std::pair<double, std::string>> timed;
    for (auto& v : candidates(c)) {
      bar.step(c.str() + " " + v);
      TOOL_FLY(fly_force_variant(v.c_str()));
      if (prob.run(s) != FLY_SUCCESS) continue;  // the variant cannot take this shape
      const double err = prob.check(s);
      if (!(err < 0.05)) {
        std::fprintf(stderr, "\nflytune: %s rejected on %s: error %.4f\n", v.c_str(), c.str().c_str(), err);
        ++rejected;
        continue;
      }
      timed.emplace_back(time_median_us([&] { TOOL_FLY(prob.run(s)); }, s, 2, quick ? 5 : 11), v);
    }
    TOOL_FLY(fly_force_variant(nullptr));
    if (timed.empty()) continue;
    std::sort(timed.begin(), timed.end());
    append_times(args, c.str(), timed);
    TuneRow r = launcher_row(op, c.str());
    set_winners(r, timed);
    rows.push_back(r);
  }
  bar.done();
  const std::string db = args.get("db", "flykernels_tuning.sqlite");
  return finish_tuning(args, family, db, rows, rejected);
}

}  // namespace

int tune_attention(const Args& args) {
  nlohmann::json suite = load_suite(args.get("suite", "suites/attention.json"));
  const std::vector<std::string> dtypes = attention_dtypes(args, suite);
  std::vector<AttnCase> cases = attention_cases(suite["cases"], dtypes);
  if (args.has("bwd")) return tune<AttnBwdProblem>(args, cases, "attention_bwd", "attention_bwd");
  nlohmann::json space = nlohmann::json::parse(std::ifstream(data_file("tuning/attention.json")));
  for (auto& c : attention_cases(space["workloads"]["extra_cases"], dtypes)) cases.push_back(c);
  return tune<AttnProblem>(args, cases, "attention", "attention_fwd");
}

}  // namespace fly::tools
