// The C++ layer: descriptors and exceptions.
#include "catch_compat.hpp"
#include "flykernels/flykernels.hpp"

TEST_CASE("flykernels.hpp builds descriptors and throws on errors", "[cpp]") {
  fly_tensor t = flykernels::tensor(reinterpret_cast<void*>(0x1000), FLY_BF16, {3, 5, 7});
  CHECK(t.rank == 3);
  CHECK(t.strides[0] == 35);
  CHECK(t.strides[1] == 7);
  CHECK(t.strides[2] == 1);
  fly_tensor u = flykernels::tensor(nullptr, FLY_F32, {2, 3}, {1, 2});
  CHECK(u.strides[0] == 1);
  CHECK(u.strides[1] == 2);
  bool threw = false;
  try {
    flykernels::rms_norm_fwd(t, nullptr, 1e-5, t);  // rank 3: invalid
  } catch (const flykernels::Error& e) {
    threw = true;
    CHECK(e.status() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("rank") != std::string::npos);
  }
  CHECK(threw);
  CHECK_THROWS_AS(flykernels::ScopedVariant("no_such_variant"), flykernels::Error);
}
