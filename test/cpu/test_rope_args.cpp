// SPDX-License-Identifier: Apache-2.0
// fly_rope_fwd / fly_rope_bwd on bad input: a status and a message naming the argument, never a
// crash. Runs without a GPU (validation happens before any device query).
#include <string>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "flykernels/flykernels.hpp"
#include "test_tensors.hpp"

namespace {

using fly_test::mentions;

char* const kBase = reinterpret_cast<char*>(0x1000000);
void* at(int i) { return kBase + size_t(i) * (1 << 22); }

// [B, H, S, D] as Hugging Face hands q over: a [B, S, H, D] buffer transposed.
fly_tensor bhsd(void* p, fly_dtype dt, int64_t B, int64_t H, int64_t S, int64_t D) {
  return flykernels::tensor(p, dt, {B, H, S, D}, {S * H * D, D, H * D, 1});
}
fly_tensor table(void* p, fly_dtype dt, int64_t B, int64_t S, int64_t W) {
  return flykernels::tensor(p, dt, {B, S, W}, {S * W, W, 1});
}

// Valid calls reach the device check: no device here, or host memory on a machine with one.
void expect_reaches_device(fly_status s) {
  const char* arch = nullptr;
  if (fly_device_arch(nullptr, &arch) == FLY_ERROR_NO_DEVICE) CHECK(s == FLY_ERROR_NO_DEVICE);
  else CHECK((s == FLY_ERROR_INVALID_ARGUMENT && mentions("not device memory")));
}

}  // namespace

TEST_CASE("rope rejects bad descriptors with a status and a message", "[rope][args]") {
  const fly_dtype bf = FLY_BF16;
  fly_tensor q = bhsd(at(0), bf, 2, 8, 16, 128), k = bhsd(at(1), bf, 2, 2, 16, 128);
  fly_tensor c = table(at(2), bf, 2, 16, 128), s = table(at(3), bf, 2, 16, 128);
  fly_tensor qo = bhsd(at(4), bf, 2, 8, 16, 128), ko = bhsd(at(5), bf, 2, 2, 16, 128);

  SECTION("valid: q and k, q alone, the gradients") {
    expect_reaches_device(fly_rope_fwd(&q, &k, &c, &s, 128, &qo, &ko, nullptr));
    expect_reaches_device(fly_rope_fwd(&q, nullptr, &c, &s, 128, &qo, nullptr, nullptr));
    expect_reaches_device(fly_rope_bwd(&qo, &ko, &c, &s, 128, &q, &k, nullptr));
  }
  SECTION("null descriptors") {
    CHECK(fly_rope_fwd(nullptr, &k, &c, &s, 128, &qo, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("q: descriptor is NULL"));
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &qo, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("k and k_out"));
    CHECK(fly_rope_fwd(&q, nullptr, &c, &s, 128, &qo, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(fly_rope_fwd(&q, &k, nullptr, &s, 128, &qo, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("cos"));
    CHECK(fly_rope_fwd(&q, &k, &c, nullptr, 128, &qo, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("sin"));
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, nullptr, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("q_out"));
    CHECK(fly_rope_bwd(&qo, &ko, &c, &s, 128, nullptr, &k, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dq"));
  }
  SECTION("dtypes") {
    q.dtype = FLY_F64;
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &qo, &ko, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("fp64"));
    q.dtype = bf;
    s.dtype = FLY_F32;
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &qo, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("sin: dtype"));
    s.dtype = bf;
    ko.dtype = FLY_F16;
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &qo, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("k_out: dtype"));
  }
  SECTION("shapes and strides") {
    k.sizes[2] = 15;
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &qo, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("k: shape"));
    k.sizes[2] = 16;
    ko.sizes[1] = 3;
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &qo, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("k_out: 3 heads"));
    ko.sizes[1] = 2;
    q.strides[3] = 2;
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &qo, &ko, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("q: the head dim's stride"));
    q.strides[3] = 1;
    c.sizes[0] = 3;
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &qo, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("cos: shape"));
    c.sizes[0] = 1;  // one table for every batch: valid
    expect_reaches_device(fly_rope_fwd(&q, &k, &c, &s, 128, &qo, &ko, nullptr));
    qo.strides[1] = 0;  // every head written to one place
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &qo, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("q_out: strides address one element more than once"));
  }
  SECTION("rotary_dim and the tables' width") {
    for (int r : {0, -2, 7, 130}) {
      CHECK(fly_rope_fwd(&q, &k, &c, &s, r, &qo, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
      CHECK(mentions("rotary_dim"));
    }
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 96, &qo, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("cos: width 128"));
    // partial rotary with tables of width R, and tables of width R/2 (an angle per pair): valid
    fly_tensor c64 = table(at(2), bf, 2, 16, 64), s64 = table(at(3), bf, 2, 16, 64);
    expect_reaches_device(fly_rope_fwd(&q, &k, &c64, &s64, 64, &qo, &ko, nullptr));
    expect_reaches_device(fly_rope_fwd(&q, &k, &c64, &s64, 128, &qo, &ko, nullptr));
  }
  SECTION("outputs sharing memory") {
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &qo, &qo, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("k_out"));
    fly_tensor shifted = bhsd(static_cast<char*>(at(0)) + 2, bf, 2, 8, 16, 128);
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &shifted, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("q_out and q"));
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &c, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(fly_rope_fwd(&q, &k, &c, &s, 128, &k, &ko, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("q_out"));
    // in place: each output its own input, exactly
    expect_reaches_device(fly_rope_fwd(&q, &k, &c, &s, 128, &q, &k, nullptr));
  }
  SECTION("nothing to rotate") {
    fly_tensor e = bhsd(nullptr, bf, 2, 8, 0, 128), ce = table(nullptr, bf, 2, 0, 128);
    CHECK(fly_rope_fwd(&e, nullptr, &ce, &ce, 128, &e, nullptr, nullptr) == FLY_SUCCESS);
    CHECK(fly_rope_bwd(&e, nullptr, &ce, &ce, 128, &e, nullptr, nullptr) == FLY_SUCCESS);
  }
}
