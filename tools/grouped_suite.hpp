// SPDX-License-Identifier: Apache-2.0
// Which cases of a grouped GEMM suite flybench / flytune grouped_gemm run in which B layout.
// suites/grouped_gemm.json's cases carry no layout: each runs in every --layouts entry (default nt).
// suites/moe.json's carry their own, in the dispatch key's vocabulary: "nt" (B K-contiguous: the
// forward), "nn" (B N-contiguous: dA = dY @ W^T) run in that layout only; "mn" (the ragged-K weight
// gradient, dB) is another mode these tools do not run (bench/grouped_gemm_torch.py --suite moe
// times it). Header-only, no CUDA: the CPU tests check it on the shipped suites.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace fly::tools {

// The case runs when B is in `layout` ("nt" or "nn").
inline bool grouped_case_in_layout(const nlohmann::json& c, const std::string& layout) {
  const auto it = c.find("layout");
  return it == c.end() || it->get<std::string>() == layout;
}

// The default --layouts: "nt" for a suite without per-case layouts, else the row-mode layouts its
// cases carry, nt before nn ("nt,nn" for suites/moe.json).
inline std::string grouped_default_layouts(const nlohmann::json& suite) {
  bool any = false, nt = false, nn = false;
  for (const auto& c : suite.at("cases")) {
    const auto it = c.find("layout");
    if (it == c.end()) continue;
    any = true;
    nt = nt || *it == "nt";
    nn = nn || *it == "nn";
  }
  if (!any) return "nt";
  return nt && nn ? "nt,nn" : nn ? "nn" : "nt";
}

// Cases that none of `layouts` runs (the ragged-K ones, or a layout left out of --layouts).
inline int grouped_cases_skipped(const nlohmann::json& suite, const std::vector<std::string>& layouts) {
  int n = 0;
  for (const auto& c : suite.at("cases"))
    if (std::none_of(layouts.begin(), layouts.end(), [&](const std::string& l) { return grouped_case_in_layout(c, l); }))
      ++n;
  return n;
}

}  // namespace fly::tools
