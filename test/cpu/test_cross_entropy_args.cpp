// SPDX-License-Identifier: Apache-2.0
// fly_cross_entropy_fwd_bwd on bad input: a status and a message naming the argument, never a
// crash. Runs without a GPU (validation happens before any device query).
#include <cmath>
#include <limits>
#include <string>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;
using fly_test::mentions;
using fly_test::vec;

void* at(int i) { return fly_test::fake_address(i); }
void check_reaches_device(fly_status s) { CHECK(fly_test::reached_device(s)); }

struct Call {
  fly_tensor logits = mat(at(0), FLY_BF16, 8, 1000, 1024), labels = vec(at(1), FLY_I64, 8);
  fly_tensor loss = vec(at(2), FLY_F32, 8), lse = vec(at(3), FLY_F32, 8), dlogits = mat(at(4), FLY_BF16, 8, 1000, 1000);
  int64_t ignore = -100;
  double scale = 1.0;
  const fly_tensor* plse = &lse;
  const fly_tensor* pd = &dlogits;
  fly_status run() { return fly_cross_entropy_fwd_bwd(&logits, &labels, ignore, scale, &loss, plse, pd, nullptr); }
};

}  // namespace

TEST_CASE("cross_entropy: a valid call, and every bad argument named", "[cross_entropy][args]") {
  Call c;
  check_reaches_device(c.run());
  SECTION("optional lse and dlogits; in place; any ignore_index") {
    c.plse = nullptr;
    check_reaches_device(c.run());
    c.pd = nullptr;
    check_reaches_device(c.run());
    c.pd = &c.dlogits;
    c.dlogits = c.logits;  // the very same view: in place
    check_reaches_device(c.run());
    for (int64_t ig : {int64_t(0), int64_t(999), std::numeric_limits<int64_t>::min()}) {
      c.ignore = ig;
      check_reaches_device(c.run());
    }
  }
  SECTION("null descriptors") {
    CHECK(fly_cross_entropy_fwd_bwd(nullptr, &c.labels, -100, 1.0, &c.loss, nullptr, nullptr, nullptr) ==
          FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("logits"));
    CHECK(fly_cross_entropy_fwd_bwd(&c.logits, nullptr, -100, 1.0, &c.loss, nullptr, nullptr, nullptr) ==
          FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("labels"));
    CHECK(fly_cross_entropy_fwd_bwd(&c.logits, &c.labels, -100, 1.0, nullptr, nullptr, nullptr, nullptr) ==
          FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("loss"));
    c.labels.data = nullptr;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("labels: data pointer is NULL"));
  }
  SECTION("dtypes") {
    c.logits.dtype = FLY_F64;
    CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("logits: dtype fp64 is not supported"));
    c.logits.dtype = FLY_BF16;
    c.labels.dtype = FLY_I32;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("labels: dtype int32, expected int64"));
    c.labels.dtype = FLY_I64;
    c.loss.dtype = FLY_BF16;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("loss: dtype"));
    c.loss.dtype = FLY_F32;
    c.lse.dtype = FLY_F16;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("lse: dtype"));
    c.lse.dtype = FLY_F32;
    c.dlogits.dtype = FLY_F32;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dlogits: dtype fp32 does not match logits (bf16)"));
  }
  SECTION("shapes and strides") {
    c.labels.sizes[0] = 7;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("labels: expected 8 elements"));
    c.labels.sizes[0] = 8;
    c.labels.strides[0] = 2;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("labels: stride must be 1"));
    c.labels.strides[0] = 1;
    c.loss.sizes[0] = 9;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("loss: expected 8 elements"));
    c.loss.sizes[0] = 8;
    c.lse.sizes[0] = 1;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("lse: expected 8 elements"));
    c.lse.sizes[0] = 8;
    c.dlogits.sizes[1] = 999;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dlogits: shape [8, 999] does not match logits [8, 1000]"));
    c.dlogits.sizes[1] = 1000;
    c.logits.strides[1] = 2;
    CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("logits: inner stride"));
    c.logits.strides[1] = 1;
    c.logits.strides[0] = 999;
    CHECK(c.run() == FLY_ERROR_UNSUPPORTED);  // an input whose rows overlap: a layout, not a mistake
    CHECK(mentions("logits: row stride 999"));
    c.logits.strides[0] = 1024;
    c.dlogits.strides[0] = 500;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);  // an output's: a mistake
    CHECK(mentions("dlogits: row stride 500"));
    c.dlogits.strides[0] = 1000;
    c.dlogits.strides[1] = 3;
    CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("dlogits: inner stride"));
    c.dlogits.strides[1] = 1;
    c.logits.rank = 3;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("logits"));
  }
  SECTION("scale") {
    for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL, 1e300}) {
      c.scale = bad;
      CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
      CHECK(mentions("scale"));
    }
    c.scale = -2.5;  // a negative scale is a valid (if unusual) gradient weight
    check_reaches_device(c.run());
  }
  SECTION("overlaps") {
    c.dlogits.data = static_cast<char*>(c.logits.data) + 2 * 1024;  // dlogits row r is logits row r + 1
    c.dlogits.strides[0] = 1024;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dlogits and logits"));
    c.dlogits = c.logits;
    c.dlogits.strides[0] = 1000;  // the same base, another row stride: not the same view
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    c.dlogits = mat(at(4), FLY_BF16, 8, 1000, 1000);
    c.loss.data = c.lse.data;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("loss and lse"));
    c.loss.data = c.labels.data;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("loss and labels"));
    c.loss.data = at(2);
    c.lse.data = static_cast<char*>(c.logits.data) + 64;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("lse and logits"));
    c.lse.data = at(3);
    c.labels.data = static_cast<char*>(c.dlogits.data) + 16;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dlogits and labels"));
  }
  SECTION("sizes: empty work, empty rows, rows too long") {
    fly_tensor e = mat(nullptr, FLY_F32, 0, 128256, 128256), el = vec(nullptr, FLY_I64, 0), ef = vec(nullptr, FLY_F32, 0);
    CHECK(fly_cross_entropy_fwd_bwd(&e, &el, -100, 1.0, &ef, nullptr, &e, nullptr) == FLY_SUCCESS);
    CHECK(std::string(fly_get_last_error()).empty());
    c.logits.sizes[1] = c.dlogits.sizes[1] = 0;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("V = 0"));
    fly_tensor big = mat(at(0), FLY_BF16, 1, int64_t(1) << 31, int64_t(1) << 31);
    char* far = static_cast<char*>(at(0)) + (size_t(8) << 30);  // past the 4 GiB the row spans
    fly_tensor l1 = vec(far, FLY_I64, 1), f1 = vec(far + (1 << 20), FLY_F32, 1);
    CHECK(fly_cross_entropy_fwd_bwd(&big, &l1, -100, 1.0, &f1, nullptr, nullptr, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("2^31"));
  }
}
