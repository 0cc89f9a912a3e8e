// flytune attention: times every bundled attention variant of the case's dtype and head dim on the
// suite (and the decode cases of tuning/attention.json) and writes the winners as DB rows.
#include <algorithm>
#include <fstream>

#include "../kernels/attention/attention_plan.h"  // padded_head_dim: the dispatch key
#include "attention_check.hpp"

namespace fly::tools {

int tune_attention(const Args& args) {
  nlohmann::json space = nlohmann::json::parse(std::ifstream(data_file("tuning/attention.json")));
  nlohmann::json suite = load_suite(args.get("suite", "suites/attention.json"));
  std::vector<std::string> dtypes;
  if (args.has("dtype")) dtypes.push_back(args.get("dtype"));
  else for (auto& d : suite["dtype"]) dtypes.push_back(d);
  std::vector<AttnCase> cases = attention_cases(suite["cases"], dtypes);
  for (auto& c : attention_cases(space["workloads"]["extra_cases"], dtypes)) cases.push_back(c);
  const bool quick = args.has("quick");
  cudaStream_t s = 0;
  auto candidates = [&](const AttnCase& c) {
    const std::string dname = c.dt == FLY_F16 ? "fp16" : "bf16";
    const int hd = fly::attn::padded_head_dim(c.D);
    std::vector<std::string> fit;
    for (auto& v : bundled_variants("attention"))
      if (v.find("_" + dname + "_") != std::string::npos && variant_param(v, "hd") == hd) fit.push_back(v);
    return fit;
  };
  size_t total = 0;
  for (auto& c : cases) total += candidates(c).size();
  Progress bar(total, "flytune attention");
  std::vector<TuneRow> rows;
  int rejected = 0;
  for (auto& c : cases) {
    AttnProblem prob(c, 4321 + uint64_t(c.Sq + c.Sk * 3 + c.D));
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
    TuneRow r;
    r.op = "attention_fwd";
    r.dtype = c.dt == FLY_F16 ? "fp16" : "bf16";
    // The dispatch key of src/ops/attention.cpp: layout d<hd>_<causal|full>_g<group>, (Sk, Sq, B*Hq).
    r.layout = "d" + std::to_string(fly::attn::padded_head_dim(c.D)) + (c.causal ? "_causal" : "_full") + "_g" +
               std::to_string(c.Hq / c.Hkv);
    r.k0 = c.Sk;
    r.k1 = c.Sq;
    r.k2 = c.B * c.Hq;
    set_winners(r, timed);
    rows.push_back(r);
  }
  bar.done();
  const std::string db = args.get("db", "flykernels_tuning.sqlite");
  return finish_tuning(args, "attention", db, rows, rejected);
}

}  // namespace fly::tools
