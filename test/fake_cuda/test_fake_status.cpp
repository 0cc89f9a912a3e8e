// SPDX-License-Identifier: Apache-2.0
// One status per mistake, with a device (the stand-in driver): an output overlapping an input is
// refused exactly as without one (test/cpu/test_status_mapping.cpp), before anything is launched;
// the same buffers laid out apart run, and RMSNorm exactly in place runs.
#include <cstring>
#include <string>

#include "catch_compat.hpp"
#include "fake_cuda.h"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

namespace {
using fly_test::mat;
using fly_test::mentions;
using fly_test::vec;
std::string said(fly_status s) { return std::string(fly_status_string(s)) + ": " + fly_get_last_error(); }
}  // namespace

TEST_CASE("status mapping with a device: overlapping outputs are refused as without one", "[fake][status]") {
  char* buf = static_cast<char*>(fake_cuda_malloc(1 << 20));
  REQUIRE(buf);
  SECTION("rmsnorm") {
    fly_tensor x = mat(buf, FLY_BF16, 8, 64, 64), y = mat(buf + 4096, FLY_BF16, 8, 64, 64);
    int before = fake_cuda_launch_count();
    fly_status s = fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, nullptr);
    CHECK(s == FLY_SUCCESS);
    INFO(said(s));
    CHECK(fake_cuda_launch_count() == before + 1);
    s = fly_rms_norm_fwd(&x, nullptr, 1e-5, &x, nullptr, nullptr);  // exactly in place
    CHECK(s == FLY_SUCCESS);
    before = fake_cuda_launch_count();
    y.data = buf + 16;  // partly over x
    CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("y and x: the output shares memory"));
    CHECK(fake_cuda_launch_count() == before);
  }
  SECTION("gemm: c over a, the workspace over c") {
    fly_tensor a = mat(buf, FLY_BF16, 64, 64, 64), b = mat(buf + 65536, FLY_BF16, 64, 64, 64);
    fly_tensor c = mat(buf + 2 * 65536, FLY_BF16, 64, 64, 64);
    fly_status s = fly_gemm(&a, &b, &c, nullptr, nullptr, 0, nullptr);
    CHECK(s == FLY_SUCCESS);
    INFO(said(s));
    const int before = fake_cuda_launch_count();
    c.data = buf + 256;
    CHECK(fly_gemm(&a, &b, &c, nullptr, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c and a"));
    c.data = buf + 2 * 65536;
    CHECK(fly_gemm(&a, &b, &c, nullptr, buf + 2 * 65536, 4096, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("workspace and c"));
    CHECK(fake_cuda_launch_count() == before);
  }
  SECTION("topk: a too small workspace is FLY_ERROR_WORKSPACE here too") {
    fly_tensor x = mat(buf, FLY_F32, 2, 40000, 40000);
    char* out = static_cast<char*>(fake_cuda_malloc(1 << 20));
    fly_tensor v = mat(out, FLY_F32, 2, 10, 10), i = mat(out + 4096, FLY_I64, 2, 10, 10);
    size_t bytes = 0;
    REQUIRE(fly_topk_workspace_size(&x, 10, 1, 0, &bytes) == FLY_SUCCESS);
    if (bytes > 0) CHECK(fly_topk(&x, 10, 1, 0, &v, &i, nullptr, 0, nullptr) == FLY_ERROR_WORKSPACE);
    v.data = buf + 64;  // values inside x
    CHECK(fly_topk(&x, 10, 1, 0, &v, &i, nullptr, 0, nullptr) == (bytes > 0 ? FLY_ERROR_WORKSPACE : FLY_ERROR_INVALID_ARGUMENT));
  }
}
