// SPDX-License-Identifier: Apache-2.0
// The grouped GEMM suites as flybench / flytune grouped_gemm read them (tools/grouped_suite.hpp):
// suites/grouped_gemm.json runs every case in each --layouts entry; suites/moe.json (issue 49)
// runs its forward cases in nt and its dA cases in nn by default and skips the ragged-K dB cases,
// and every case has what GroupedProblem needs (rows per group, K, N) consistent with its model.
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "catch_compat.hpp"
#include "grouped_suite.hpp"

namespace {

nlohmann::json read_suite(const std::string& name) {
  std::ifstream in(std::string(FLY_SOURCE_DIR) + "/suites/" + name);
  REQUIRE(in.is_open());
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("grouped suite: grouped_gemm.json runs every case in every layout", "[tools][grouped_suite]") {
  const nlohmann::json suite = read_suite("grouped_gemm.json");
  CHECK(fly::tools::grouped_default_layouts(suite) == "nt");
  for (const auto& c : suite["cases"]) {
    CHECK(fly::tools::grouped_case_in_layout(c, "nt"));
    CHECK(fly::tools::grouped_case_in_layout(c, "nn"));
  }
  CHECK(fly::tools::grouped_cases_skipped(suite, {"nt"}) == 0);
}

TEST_CASE("grouped suite: moe.json's cases by layout, dB skipped", "[tools][grouped_suite]") {
  const nlohmann::json suite = read_suite("moe.json");
  CHECK(fly::tools::grouped_default_layouts(suite) == "nt,nn");
  std::map<std::string, int> by_pass;
  int in_nt = 0, in_nn = 0;
  for (const auto& c : suite["cases"]) {
    const std::string what = c.at("pass");
    ++by_pass[what];
    const bool nt = fly::tools::grouped_case_in_layout(c, "nt"), nn = fly::tools::grouped_case_in_layout(c, "nn");
    CHECK(nt == (what == "fwd"));
    CHECK(nn == (what == "dA"));
    in_nt += nt;
    in_nn += nn;
    // What GroupedProblem reads: rows per group (one per expert), K, N; the rows are the routed tokens.
    const nlohmann::json& model = suite.at("models").at(c.at("model").get<std::string>());
    const std::vector<int64_t> rows = c.at("M").get<std::vector<int64_t>>();
    CHECK(int64_t(rows.size()) == model.at("experts").get<int64_t>());
    int64_t total = 0;
    for (int64_t m : rows) {
      CHECK(m >= 0);
      total += m;
    }
    CHECK(total == c.at("tokens").get<int64_t>() * model.at("topk").get<int64_t>());
    const int64_t hidden = model.at("hidden"), inter = model.at("moe_intermediate");
    const bool down = c.at("proj") == "down";
    int64_t K = down ? inter : hidden, N = down ? hidden : 2 * inter;  // the forward's
    if (what == "dA") std::swap(K, N);
    CHECK(c.at("K").get<int64_t>() == K);
    CHECK(c.at("N").get<int64_t>() == N);
  }
  CHECK(by_pass["dA"] == by_pass["dB"]);
  CHECK(in_nt == by_pass["fwd"]);
  CHECK(in_nn == by_pass["dA"]);
  CHECK(fly::tools::grouped_cases_skipped(suite, {"nt", "nn"}) == by_pass["dB"]);
  CHECK(fly::tools::grouped_cases_skipped(suite, {"nt"}) == by_pass["dB"] + by_pass["dA"]);
}
