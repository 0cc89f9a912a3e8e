// SPDX-License-Identifier: Apache-2.0
// fly_topk / fly_topk_workspace_size on bad input: a status and a message naming the argument.
// Runs without a GPU: validation (workspace size included) happens before any device query.
#include <cstring>
#include <string>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;
using fly_test::mentions;

// Fake, well-aligned addresses: validation must reject before anything touches them.
void* const kX = reinterpret_cast<void*>(0x100000);
void* const kV = reinterpret_cast<void*>(0x200000);
void* const kI = reinterpret_cast<void*>(0x300000);
void* const kW = reinterpret_cast<void*>(0x400000);


}  // namespace

TEST_CASE("topk rejects bad x and k", "[topk][args]") {
  fly_tensor x = mat(kX, FLY_F32, 8, 128, 128), v = mat(kV, FLY_F32, 8, 4, 4), i = mat(kI, FLY_I64, 8, 4, 4);

  SECTION("null x") {
    CHECK(fly_topk(nullptr, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x"));
    x.data = nullptr;
    CHECK(fly_topk(&x, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x: data pointer is NULL"));
  }
  SECTION("x rank, dtype, inner stride, alignment") {
    x.rank = 1;
    CHECK(fly_topk(&x, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x: expected rank 2"));
    x.rank = 2;
    x.dtype = FLY_F64;
    CHECK(fly_topk(&x, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("x: dtype fp64"));
    x.dtype = static_cast<fly_dtype>(77);
    CHECK(fly_topk(&x, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x: invalid dtype"));
    x.dtype = FLY_F32;
    x.strides[1] = 2;
    x.strides[0] = 256;
    CHECK(fly_topk(&x, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("x: inner stride must be 1"));
    x = mat(reinterpret_cast<void*>(0x100002), FLY_F32, 8, 128, 128);
    CHECK(fly_topk(&x, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_MISALIGNED);
    CHECK(mentions("x"));
  }
  SECTION("k outside 1..C") {
    for (int64_t bad : {int64_t(0), int64_t(-3), int64_t(129)}) {
      INFO("k = " << bad);
      CHECK(fly_topk(&x, bad, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
      CHECK(mentions("k: "));
      size_t bytes = 1;
      CHECK(fly_topk_workspace_size(&x, bad, 1, 0, &bytes) == FLY_ERROR_INVALID_ARGUMENT);
      CHECK(mentions("k: "));
    }
  }
}

TEST_CASE("topk rejects bad outputs", "[topk][args]") {
  fly_tensor x = mat(kX, FLY_F32, 8, 128, 128), v = mat(kV, FLY_F32, 8, 4, 4), i = mat(kI, FLY_I64, 8, 4, 4);

  SECTION("null outputs") {
    CHECK(fly_topk(&x, 4, 1, 0, nullptr, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("values"));
    CHECK(fly_topk(&x, 4, 1, 0, &v, nullptr, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("indices"));
    v.data = nullptr;
    CHECK(fly_topk(&x, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("values: data pointer is NULL"));
  }
  SECTION("shapes must be [R, k]") {
    fly_tensor v2 = mat(kV, FLY_F32, 8, 5, 5);
    CHECK(fly_topk(&x, 4, 1, 0, &v2, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("values: shape"));
    fly_tensor i2 = mat(kI, FLY_I64, 7, 4, 4);
    CHECK(fly_topk(&x, 4, 1, 0, &v, &i2, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("indices: shape"));
    v2 = v;
    v2.rank = 1;
    CHECK(fly_topk(&x, 4, 1, 0, &v2, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("values"));
  }
  SECTION("dtypes") {
    v.dtype = FLY_BF16;
    CHECK(fly_topk(&x, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("values: dtype"));
    v.dtype = FLY_F32;
    i.dtype = FLY_I32;
    CHECK(fly_topk(&x, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("indices: dtype int32"));
  }
  SECTION("strides") {
    v.strides[1] = 2;
    v.strides[0] = 8;
    CHECK(fly_topk(&x, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("values: inner stride"));
    v = mat(kV, FLY_F32, 8, 4, 4);
    i.strides[0] = 3;
    CHECK(fly_topk(&x, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("indices: row stride"));
  }
}

TEST_CASE("topk workspace query and checks", "[topk][args]") {
  SECTION("query arguments") {
    fly_tensor x = mat(kX, FLY_F32, 8, 128, 128);
    CHECK(fly_topk_workspace_size(&x, 4, 1, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("bytes"));
    size_t bytes = 1;
    CHECK(fly_topk_workspace_size(nullptr, 4, 1, 0, &bytes) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x"));
    // Short rows, small k: no path needs scratch.
    REQUIRE(fly_topk_workspace_size(&x, 4, 1, 0, &bytes) == FLY_SUCCESS);
    CHECK(bytes == 0);
  }
  SECTION("too small or missing workspace") {
    // Few long rows (the split path's per-row state) and a k too large to sort in shared memory
    // (the radix path's candidate buffer) both need scratch.
    struct Shape { int64_t R, C, k; };
    for (Shape s : {Shape{4, 100000, 10}, Shape{2, 40000, 10000}}) {
      INFO("R=" << s.R << " C=" << s.C << " k=" << s.k);
      fly_tensor x = mat(kX, FLY_F32, s.R, s.C, s.C);
      fly_tensor v = mat(kV, FLY_F32, s.R, s.k, s.k), i = mat(kI, FLY_I64, s.R, s.k, s.k);
      size_t bytes = 0;
      REQUIRE(fly_topk_workspace_size(&x, s.k, 1, 0, &bytes) == FLY_SUCCESS);
      REQUIRE(bytes > 0);
      CHECK(fly_topk(&x, s.k, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_WORKSPACE);
      CHECK(mentions("workspace"));
      CHECK(fly_topk(&x, s.k, 1, 1, &v, &i, kW, bytes - 1, nullptr) == FLY_ERROR_WORKSPACE);
      CHECK(mentions("workspace"));
      CHECK(fly_topk(&x, s.k, 1, 0, &v, &i, reinterpret_cast<void*>(0x400004), bytes, nullptr) ==
            FLY_ERROR_MISALIGNED);
      CHECK(mentions("workspace"));
    }
  }
}

TEST_CASE("topk with no rows is a successful no-op", "[topk][args]") {
  fly_tensor x = mat(nullptr, FLY_F32, 0, 128, 128), v = mat(nullptr, FLY_F32, 0, 4, 4),
             i = mat(nullptr, FLY_I64, 0, 4, 4);
  CHECK(fly_topk(&x, 4, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_SUCCESS);
  CHECK(fly_topk(&x, 4, 0, 1, &v, &i, nullptr, 0, nullptr) == FLY_SUCCESS);
  size_t bytes = 7;
  CHECK(fly_topk_workspace_size(&x, 4, 1, 0, &bytes) == FLY_SUCCESS);
  CHECK(bytes == 0);
  // k is still checked against C.
  CHECK(fly_topk(&x, 129, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
}
