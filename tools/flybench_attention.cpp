// SPDX-License-Identifier: Apache-2.0
// flybench attention: the suite (and the decode cases of tuning/attention.json) through the
// library's dispatch: time, TFLOP/s, and for short queries the time against reading K and V once.
#include <fstream>

#include "attention_bwd_check.hpp"
#include "attention_check.hpp"

namespace fly::tools {

// --bwd: the backward on the suite's cases (O and LSE from the forward, run once), TFLOP/s with
// 2.5x the forward's FLOPs (the suite's convention), a dQ spot check per case.
int bench_attention_bwd(const Args& args) {
  nlohmann::json suite = load_suite(args.get("suite", "suites/attention.json"));
  const std::vector<std::string> dtypes = attention_dtypes(args, suite);
  std::vector<AttnCase> cases = attention_cases(suite["cases"], dtypes);
  const std::string force = args.get("variant", "");
  cudaStream_t s = 0;
  std::printf("flybench attention --bwd on %s; L2 flush: %s\n", gpu_name().c_str(), l2_flush_method());
  std::printf("%-58s %10s %8s %8s  %s\n", "case", "time_us", "TFLOP/s", "err", "variant");
  nlohmann::json out = nlohmann::json::array();
  bool ok = true;
  for (auto& c : cases) {
    AttnBwdProblem prob(c, 11 + uint64_t(c.Sq * 3 + c.Sk + c.D));
    fly_status st = prob.prepare(s);
    if (st == FLY_SUCCESS) {
      if (!force.empty()) TOOL_FLY(fly_force_variant(force.c_str()));
      st = prob.run(s);
    }
    if (st != FLY_SUCCESS) {
      std::printf("%-58s %10s  %s\n", c.str().c_str(), "-", fly_get_last_error());
      if (!force.empty()) fly_force_variant(nullptr);
      continue;
    }
    const std::string variant = fly_last_variant();
    const double err = prob.check(s);
    const double us = time_median_us([&] { TOOL_FLY(prob.run(s)); }, s, 3, int(args.get_int("reps", 10)),
                                     !args.has("no-flush"), 20);
    if (!force.empty()) fly_force_variant(nullptr);
    const double tflops = 2.5 * c.flops() / (us * 1e-6) / 1e12;
    std::printf("%-58s %10.2f %8.1f %8.4f  %s\n", c.str().c_str(), us, tflops, err, variant.c_str());
    if (!(err < 0.05)) ok = false;
    out.push_back({{"dtype", c.dt == FLY_F16 ? "fp16" : "bf16"}, {"B", c.B}, {"Hq", c.Hq}, {"Hkv", c.Hkv}, {"Sq", c.Sq},
                   {"Sk", c.Sk}, {"D", c.D}, {"causal", c.causal}, {"us", us}, {"tflops", tflops}, {"err", err},
                   {"variant", variant}, {"direction", "bwd"}});
  }
  if (args.has("json")) {
    std::ofstream f(args.get("json"));
    f << nlohmann::json{{"gpu", gpu_name()}, {"flush", l2_flush_method()}, {"direction", "bwd"}, {"cases", out}}.dump(1);
  }
  if (!ok) std::fprintf(stderr, "flybench attention --bwd: some case failed its correctness check\n");
  return ok ? 0 : 1;
}

int bench_attention(const Args& args) {
  if (args.has("bwd")) return bench_attention_bwd(args);
  nlohmann::json suite = load_suite(args.get("suite", "suites/attention.json"));
  const std::vector<std::string> dtypes = attention_dtypes(args, suite);
  std::vector<AttnCase> cases = attention_cases(suite["cases"], dtypes);
  if (!args.has("no-decode")) {
    std::ifstream sf(data_file("tuning/attention.json"));
    if (sf) {
      nlohmann::json space = nlohmann::json::parse(sf);
      for (auto& c : attention_cases(space["workloads"]["extra_cases"], dtypes)) cases.push_back(c);
    }
  }
  const std::string force = args.get("variant", "");
  cudaStream_t s = 0;
  const double copy_bw = copy_bandwidth_bytes_per_s();
  std::printf("flybench attention on %s: copy bandwidth %.2f TB/s (read + write); L2 flush: %s\n", gpu_name().c_str(),
              copy_bw / 1e12, l2_flush_method());
  std::printf("%-58s %10s %8s %9s %8s  %s\n", "case", "time_us", "TFLOP/s", "kv_read%", "err", "variant");
  nlohmann::json out = nlohmann::json::array();
  bool ok = true;
  for (auto& c : cases) {
    AttnProblem prob(c, 7 + uint64_t(c.Sq * 3 + c.Sk + c.D));
    if (!force.empty()) TOOL_FLY(fly_force_variant(force.c_str()));
    const fly_status st = prob.run(s);
    if (st != FLY_SUCCESS) {
      std::printf("%-58s %10s  %s\n", c.str().c_str(), "-", fly_get_last_error());
      if (!force.empty()) fly_force_variant(nullptr);
      continue;
    }
    const double err = prob.check(s);
    const std::string variant = fly_last_variant();
    const double us = time_median_us([&] { TOOL_FLY(prob.run(s)); }, s, 5, int(args.get_int("reps", 20)),
                                     !args.has("no-flush"), 20);
    if (!force.empty()) fly_force_variant(nullptr);
    const double tflops = c.flops() / (us * 1e-6) / 1e12;
    // Reading K and V once at the copy rate (bytes read + written per second: a read-only stream
    // reaches about the same total).
    const double kv_us = c.kv_bytes() / copy_bw * 1e6;
    std::printf("%-58s %10.2f %8.1f %8.1f%% %8.4f  %s\n", c.str().c_str(), us, tflops, 100 * kv_us / us, err,
                variant.c_str());
    if (!(err < 0.05)) ok = false;
    out.push_back({{"dtype", c.dt == FLY_F16 ? "fp16" : "bf16"}, {"B", c.B}, {"Hq", c.Hq}, {"Hkv", c.Hkv}, {"Sq", c.Sq},
                   {"Sk", c.Sk}, {"D", c.D}, {"causal", c.causal}, {"us", us}, {"tflops", tflops}, {"kv_read_us", kv_us},
                   {"err", err}, {"variant", variant}});
  }
  if (args.has("json")) {
    std::ofstream f(args.get("json"));
    f << nlohmann::json{{"gpu", gpu_name()}, {"copy_tbps", copy_bw / 1e12}, {"flush", l2_flush_method()}, {"cases", out}}.dump(1);
  }
  if (!ok) std::fprintf(stderr, "flybench attention: some case failed its correctness check\n");
  return ok ? 0 : 1;
}

}  // namespace fly::tools
