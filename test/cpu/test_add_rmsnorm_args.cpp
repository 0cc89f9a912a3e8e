// SPDX-License-Identifier: Apache-2.0
// fly_add_rms_norm_fwd / _bwd / _bwd_workspace_size on bad input: a status and a message naming
// the argument, never a crash. Runs without a GPU (validation happens before any device query).
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

struct Fwd {
  fly_tensor x = mat(at(0), FLY_BF16, 8, 64, 64), r = mat(at(1), FLY_BF16, 8, 64, 64);
  fly_tensor w = vec(at(2), FLY_BF16, 64), y = mat(at(3), FLY_BF16, 8, 64, 64), h = mat(at(4), FLY_BF16, 8, 64, 64);
  fly_tensor rstd = vec(at(5), FLY_F32, 8);
  double eps = 1e-6;
  fly_status run() { return fly_add_rms_norm_fwd(&x, &r, &w, eps, &y, &h, &rstd, nullptr); }
};

struct Bwd {
  fly_tensor dy = mat(at(0), FLY_BF16, 8, 64, 64), dh = mat(at(1), FLY_BF16, 8, 64, 64);
  fly_tensor h = mat(at(2), FLY_BF16, 8, 64, 64), w = vec(at(3), FLY_BF16, 64), rstd = vec(at(4), FLY_F32, 8);
  fly_tensor dx = mat(at(5), FLY_BF16, 8, 64, 64), dw = vec(at(6), FLY_BF16, 64);
  void* ws = at(7);
  size_t ws_bytes = 8 * 64 * 4;
  const fly_tensor* pdh = &dh;
  const fly_tensor* pw = &w;
  const fly_tensor* pdw = &dw;
  fly_status run() { return fly_add_rms_norm_bwd(&dy, pdh, &h, pw, &rstd, &dx, pdw, ws, ws_bytes, nullptr); }
};

}  // namespace

TEST_CASE("add_rms_norm forward: a valid call, and every bad argument named", "[add_rmsnorm][args]") {
  Fwd f;
  check_reaches_device(f.run());
  SECTION("optional weight and rstd") {
    check_reaches_device(fly_add_rms_norm_fwd(&f.x, &f.r, nullptr, 1e-6, &f.y, &f.h, nullptr, nullptr));
  }
  SECTION("null descriptors") {
    CHECK(fly_add_rms_norm_fwd(nullptr, &f.r, &f.w, 1e-6, &f.y, &f.h, &f.rstd, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x"));
    CHECK(fly_add_rms_norm_fwd(&f.x, nullptr, &f.w, 1e-6, &f.y, &f.h, &f.rstd, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("residual"));
    CHECK(fly_add_rms_norm_fwd(&f.x, &f.r, &f.w, 1e-6, nullptr, &f.h, &f.rstd, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("y"));
    CHECK(fly_add_rms_norm_fwd(&f.x, &f.r, &f.w, 1e-6, &f.y, nullptr, &f.rstd, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("h"));
  }
  SECTION("dtypes") {
    f.x.dtype = FLY_F64;
    CHECK(f.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("x: dtype fp64 is not supported"));
    f.x.dtype = FLY_BF16;
    f.r.dtype = FLY_F16;
    CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("residual: dtype"));
    f.r.dtype = FLY_BF16;
    f.w.dtype = FLY_F32;
    CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("weight: dtype"));
    f.w.dtype = FLY_BF16;
    f.rstd.dtype = FLY_BF16;
    CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("rstd: dtype"));
  }
  SECTION("shapes, strides, eps") {
    f.h.sizes[1] = 63;
    CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("h: shape"));
    f.h.sizes[1] = 64;
    f.w.sizes[0] = 65;
    CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("weight: expected 64 elements"));
    f.w.sizes[0] = 64;
    f.rstd.sizes[0] = 7;
    CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("rstd: expected 8 elements"));
    f.rstd.sizes[0] = 8;
    f.r.strides[1] = 2;
    CHECK(f.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("residual: inner stride"));
    f.r.strides[1] = 1;
    f.r.strides[0] = 32;
    CHECK(f.run() == FLY_ERROR_UNSUPPORTED);  // an input whose rows overlap: a layout, not a mistake
    CHECK(mentions("residual: row stride 32"));
    f.r.strides[0] = 64;
    f.y.strides[0] = 32;
    CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);  // an output's: a mistake
    CHECK(mentions("y: row stride 32"));
    f.y.strides[0] = 64;
    for (double bad : {-1.0, 1e300, std::stod("nan")}) {
      f.eps = bad;
      CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);
      CHECK(mentions("eps"));
    }
  }
  SECTION("empty work") {
    fly_tensor e = mat(nullptr, FLY_F32, 0, 4096, 4096), er = vec(nullptr, FLY_F32, 0);
    fly_tensor ew = vec(at(9), FLY_F32, 4096);
    CHECK(fly_add_rms_norm_fwd(&e, &e, &ew, 1e-6, &e, &e, &er, nullptr) == FLY_SUCCESS);
    fly_tensor z = mat(at(0), FLY_F32, 4, 0, 0);
    CHECK(fly_add_rms_norm_fwd(&z, &z, nullptr, 1e-6, &z, &z, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("N = 0"));
  }
}

TEST_CASE("add_rms_norm forward: in place and overlaps", "[add_rmsnorm][args]") {
  Fwd f;
  SECTION("y over x and h over residual (vLLM's in-place form), and the swapped pairing") {
    f.y = f.x;
    f.h = f.r;
    check_reaches_device(f.run());
    f.y = f.r;
    f.h = f.x;
    check_reaches_device(f.run());
  }
  SECTION("a shifted view of an input") {
    f.h = mat(static_cast<char*>(at(1)) + 128, FLY_BF16, 8, 64, 64);  // one row into residual
    CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("h and residual: the output shares memory"));
  }
  SECTION("the same base, another row stride") {
    f.x = mat(at(0), FLY_BF16, 8, 64, 128);
    f.y = mat(at(0), FLY_BF16, 8, 64, 64);
    CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("y and x"));
  }
  SECTION("y and h the same buffer") {
    f.h = f.y;
    CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("h and y"));
  }
  SECTION("rstd inside an operand, outputs over the weight") {
    f.rstd.data = at(4);
    CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("rstd and h"));
    f.rstd.data = at(5);
    f.y = mat(at(2), FLY_BF16, 8, 64, 64);
    CHECK(f.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("y and weight"));
  }
}

TEST_CASE("add_rms_norm backward: workspace query", "[add_rmsnorm][args]") {
  fly_tensor h = mat(at(0), FLY_BF16, 8, 64, 64), w = vec(at(1), FLY_BF16, 64);
  size_t bytes = 1;
  CHECK(fly_add_rms_norm_bwd_workspace_size(&h, &w, &bytes) == FLY_SUCCESS);
  CHECK(bytes == 8 * 64 * 4);
  CHECK(fly_add_rms_norm_bwd_workspace_size(&h, nullptr, &bytes) == FLY_SUCCESS);
  CHECK(bytes == 0);  // no weight, no dweight partials
  fly_tensor big = mat(at(0), FLY_F16, 100000, 4096, 4096);
  fly_tensor bw = vec(at(1), FLY_F16, 4096);
  CHECK(fly_add_rms_norm_bwd_workspace_size(&big, &bw, &bytes) == FLY_SUCCESS);
  CHECK(bytes == size_t(512) * 4096 * 4);  // at most 512 partial rows, whatever M
  fly_tensor odd = mat(at(0), FLY_F32, 3, 5, 5);
  fly_tensor ow = vec(at(1), FLY_F32, 5);
  CHECK(fly_add_rms_norm_bwd_workspace_size(&odd, &ow, &bytes) == FLY_SUCCESS);
  CHECK(bytes == 256);  // rounded up to 256
  CHECK(fly_add_rms_norm_bwd_workspace_size(&h, &w, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("bytes"));
  w.sizes[0] = 63;
  CHECK(fly_add_rms_norm_bwd_workspace_size(&h, &w, &bytes) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("weight"));
  h.dtype = FLY_F64;
  CHECK(fly_add_rms_norm_bwd_workspace_size(&h, nullptr, &bytes) == FLY_ERROR_UNSUPPORTED);
}

TEST_CASE("add_rms_norm backward: a valid call, and every bad argument named", "[add_rmsnorm][args]") {
  Bwd b;
  check_reaches_device(b.run());
  SECTION("optional dh, no weight") {
    b.pdh = nullptr;
    check_reaches_device(b.run());
    b.pw = nullptr;
    b.pdw = nullptr;
    b.ws = nullptr;
    b.ws_bytes = 0;
    check_reaches_device(b.run());
  }
  SECTION("null descriptors and the weight / dweight pairing") {
    CHECK(fly_add_rms_norm_bwd(nullptr, &b.dh, &b.h, &b.w, &b.rstd, &b.dx, &b.dw, b.ws, b.ws_bytes, nullptr) ==
          FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dy"));
    CHECK(fly_add_rms_norm_bwd(&b.dy, &b.dh, nullptr, &b.w, &b.rstd, &b.dx, &b.dw, b.ws, b.ws_bytes, nullptr) ==
          FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("h"));
    CHECK(fly_add_rms_norm_bwd(&b.dy, &b.dh, &b.h, &b.w, nullptr, &b.dx, &b.dw, b.ws, b.ws_bytes, nullptr) ==
          FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("rstd"));
    CHECK(fly_add_rms_norm_bwd(&b.dy, &b.dh, &b.h, &b.w, &b.rstd, nullptr, &b.dw, b.ws, b.ws_bytes, nullptr) ==
          FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dx"));
    b.pdw = nullptr;
    CHECK(b.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dweight: NULL with a weight"));
    b.pdw = &b.dw;
    b.pw = nullptr;
    CHECK(b.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dweight: given without a weight"));
  }
  SECTION("dtypes, shapes, strides") {
    b.dh.dtype = FLY_F16;
    CHECK(b.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dh: dtype"));
    b.dh.dtype = FLY_BF16;
    b.dw.dtype = FLY_F32;
    CHECK(b.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dweight: dtype"));
    b.dw.dtype = FLY_BF16;
    b.h.sizes[0] = 9;
    CHECK(b.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("h: shape"));
    b.h.sizes[0] = 8;
    b.h.strides[1] = 2;
    CHECK(b.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("h: inner stride"));
    b.h.strides[1] = 1;
    b.dx.strides[0] = 8;
    CHECK(b.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dx: row stride"));
  }
  SECTION("workspace") {
    b.ws_bytes -= 1;
    CHECK(b.run() == FLY_ERROR_WORKSPACE);
    CHECK(mentions("workspace"));
    b.ws = nullptr;
    b.ws_bytes = 0;
    CHECK(b.run() == FLY_ERROR_WORKSPACE);
    b.ws = static_cast<char*>(at(7)) + 8;
    b.ws_bytes = 8 * 64 * 4;
    CHECK(b.run() == FLY_ERROR_MISALIGNED);
    b.ws = at(5);  // on top of dx
    CHECK(b.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("workspace and dx"));
  }
  SECTION("in place and overlaps") {
    b.dx = b.dy;
    check_reaches_device(b.run());
    b.dx = b.dh;
    check_reaches_device(b.run());
    b.dx = b.h;
    CHECK(b.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dx and h: the output shares memory"));
    b.dx = mat(static_cast<char*>(at(0)) + 64, FLY_BF16, 8, 64, 64);  // half a row into dy
    CHECK(b.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dx and dy"));
    b.dx = mat(at(5), FLY_BF16, 8, 64, 64);
    b.dw.data = at(3);  // over the weight
    CHECK(b.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dweight and weight"));
  }
  SECTION("empty work") {
    fly_tensor e = mat(nullptr, FLY_F16, 0, 64, 64), er = vec(nullptr, FLY_F32, 0);
    fly_tensor ew = vec(at(3), FLY_F16, 64), edw = vec(at(6), FLY_F16, 64);
    CHECK(fly_add_rms_norm_bwd(&e, nullptr, &e, &ew, &er, &e, &edw, nullptr, 0, nullptr) == FLY_SUCCESS);
  }
}
