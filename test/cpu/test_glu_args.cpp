// SPDX-License-Identifier: Apache-2.0
// fly_glu_fwd / fly_glu_bwd on bad input: a status and a message naming the argument, never a
// crash. Runs without a GPU (validation happens before any device query).
#include <string>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;
using fly_test::mentions;

// Fake, well-aligned addresses a megabyte apart: validation must reject before anything touches them.
char* const kBase = reinterpret_cast<char*>(0x1000000);
void* at(int i) { return kBase + size_t(i) * (1 << 20); }

}  // namespace

TEST_CASE("glu rejects bad descriptors with a status and a message", "[glu][args]") {
  fly_tensor g = mat(at(0), FLY_BF16, 8, 64, 64), u = mat(at(1), FLY_BF16, 8, 64, 64);
  fly_tensor o = mat(at(2), FLY_BF16, 8, 64, 64), d = mat(at(3), FLY_BF16, 8, 64, 64);
  fly_tensor dg = mat(at(4), FLY_BF16, 8, 64, 64), du = mat(at(5), FLY_BF16, 8, 64, 64);

  SECTION("null descriptors") {
    CHECK(fly_glu_fwd(nullptr, &u, FLY_GLU_SILU, &o, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("gate"));
    CHECK(fly_glu_fwd(&g, nullptr, FLY_GLU_SILU, &o, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("up"));
    CHECK(fly_glu_fwd(&g, &u, FLY_GLU_SILU, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("out"));
    CHECK(fly_glu_bwd(nullptr, &g, &u, FLY_GLU_SILU, &dg, &du, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dout"));
    CHECK(fly_glu_bwd(&d, &g, &u, FLY_GLU_SILU, &dg, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dup"));
  }
  SECTION("dtypes") {
    g.dtype = FLY_F64;
    CHECK(fly_glu_fwd(&g, &u, FLY_GLU_SILU, &o, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("fp64"));
    g.dtype = FLY_BF16;
    u.dtype = FLY_F16;
    CHECK(fly_glu_fwd(&g, &u, FLY_GLU_SILU, &o, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("up: dtype"));
    u.dtype = FLY_BF16;
    du.dtype = FLY_F32;
    CHECK(fly_glu_bwd(&d, &g, &u, FLY_GLU_SILU, &dg, &du, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dup: dtype"));
  }
  SECTION("shapes, strides, activation") {
    o.sizes[1] = 63;
    CHECK(fly_glu_fwd(&g, &u, FLY_GLU_SILU, &o, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("out: shape"));
    o.sizes[1] = 64;
    u.strides[1] = 2;
    CHECK(fly_glu_fwd(&g, &u, FLY_GLU_SILU, &o, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("up: inner stride"));
    u.strides[1] = 1;
    o.strides[0] = 32;
    CHECK(fly_glu_fwd(&g, &u, FLY_GLU_SILU, &o, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("rows overlap"));
    o.strides[0] = 64;
    CHECK(fly_glu_fwd(&g, &u, 3, &o, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("activation"));
    CHECK(fly_glu_fwd(&g, &u, -1, &o, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  }
  SECTION("overlapping outputs") {
    fly_tensor shifted = mat(static_cast<char*>(at(0)) + 2, FLY_BF16, 8, 64, 64);
    CHECK(fly_glu_fwd(&g, &u, FLY_GLU_SILU, &shifted, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("out and gate: the output shares memory"));
    CHECK(fly_glu_bwd(&d, &g, &u, FLY_GLU_SILU, &dg, &dg, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dup and dgate: the outputs share memory"));
  }
}

TEST_CASE("glu: in place, the halves of one projection, and empty work", "[glu][args]") {
  // gate and up as the two halves of one [8, 128] projection; out in place of gate.
  fly_tensor g = mat(at(0), FLY_BF16, 8, 64, 128), u = mat(static_cast<char*>(at(0)) + 128, FLY_BF16, 8, 64, 128);
  fly_tensor o = g;
  const char* arch = nullptr;
  const fly_status dev = fly_device_arch(nullptr, &arch);
  const fly_status s = fly_glu_fwd(&g, &u, FLY_GLU_GELU_TANH, &o, nullptr);
  if (dev == FLY_ERROR_NO_DEVICE) CHECK(s == FLY_ERROR_NO_DEVICE);  // valid: it reached the device check
  else CHECK((s == FLY_ERROR_INVALID_ARGUMENT && mentions("not device memory")));
  fly_tensor e = mat(nullptr, FLY_F32, 0, 4096, 4096);
  CHECK(fly_glu_fwd(&e, &e, FLY_GLU_SILU, &e, nullptr) == FLY_SUCCESS);
  CHECK(fly_glu_bwd(&e, &e, &e, FLY_GLU_SILU, &e, &e, nullptr) == FLY_SUCCESS);
}

TEST_CASE("glu: outputs interleaved with inputs are told apart from overlapping ones", "[glu][args]") {
  // out = the gate half of a [8, 128] buffer, up = the other half: they share no byte.
  fly_tensor g = mat(at(0), FLY_BF16, 8, 64, 128), u = mat(static_cast<char*>(at(0)) + 128, FLY_BF16, 8, 64, 128);
  fly_tensor o = mat(static_cast<char*>(at(0)) + 64, FLY_BF16, 8, 64, 128);  // half a row into gate: overlaps both
  CHECK(fly_glu_fwd(&g, &u, FLY_GLU_SILU, &o, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("out and gate: the output shares memory"));
  fly_tensor d = mat(at(1), FLY_BF16, 8, 64, 128), du = mat(static_cast<char*>(at(1)) + 128, FLY_BF16, 8, 64, 128);
  fly_tensor dg = d;  // dgate in place of dout, dup in its other half: valid
  const char* arch = nullptr;
  const fly_status dev = fly_device_arch(nullptr, &arch);
  const fly_status s = fly_glu_bwd(&d, &g, &u, FLY_GLU_SILU, &dg, &du, nullptr);
  if (dev == FLY_ERROR_NO_DEVICE) CHECK(s == FLY_ERROR_NO_DEVICE);
  else CHECK((s == FLY_ERROR_INVALID_ARGUMENT && mentions("not device memory")));
  du.data = static_cast<char*>(at(1)) + 64;  // now half a row into dgate
  CHECK(fly_glu_bwd(&d, &g, &u, FLY_GLU_SILU, &dg, &du, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
}
