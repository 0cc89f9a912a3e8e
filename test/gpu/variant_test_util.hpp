// SPDX-License-Identifier: Apache-2.0
// The GPU tests' walk over the bundled variants of one family (the "every bundled variant" cases).
#pragma once

#include <cstdlib>
#include <regex>
#include <string>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"

namespace fly_test {

// Calls f(name, params) for each bundled variant of `family`, in registry order; returns how many.
// FLY_TEST_VARIANTS (optional, a regex searched in the name): only matching variants run (device
// scripts narrowing a run to the variants they are about; a WARN names the filter).
template <class F>
int for_each_variant(const char* family, F&& f) {
  const char* filter = std::getenv("FLY_TEST_VARIANTS");
  const bool filtered = filter && *filter;
  const std::regex match(filtered ? filter : "");
  if (filtered) WARN("FLY_TEST_VARIANTS=" << filter << ": only matching " << family << " variants run");
  int n = 0;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const char* name = fly_variant_name(i);
    const char *fam = nullptr, *params = nullptr;
    REQUIRE(fly_variant_info(name, &fam, &params) == FLY_SUCCESS);
    if (std::string(fam) != family) continue;
    if (filtered && !std::regex_search(name, match)) continue;
    f(name, params);
    ++n;
  }
  return n;
}

}  // namespace fly_test
