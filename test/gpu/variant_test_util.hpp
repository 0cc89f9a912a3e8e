// The GPU tests' walk over the bundled variants of one family (the "every bundled variant" cases).
#pragma once

#include <string>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"

namespace fly_test {

// Calls f(name, params) for each bundled variant of `family`, in registry order; returns how many.
template <class F>
int for_each_variant(const char* family, F&& f) {
  int n = 0;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const char* name = fly_variant_name(i);
    const char *fam = nullptr, *params = nullptr;
    REQUIRE(fly_variant_info(name, &fam, &params) == FLY_SUCCESS);
    if (std::string(fam) != family) continue;
    f(name, params);
    ++n;
  }
  return n;
}

}  // namespace fly_test
