// SPDX-License-Identifier: Apache-2.0
// fly_grouped_gemm in the ragged-K mode (2-D a [M, Ktot], 2-D b [Ktot, N], offs along K, c
// [G, M, N]) on bad input: a status and a message naming the argument, before any device query
// (runs without a GPU); fly_grouped_gemm_workspace_size reports G x 256 bytes. Also the work
// decomposition of kernels/gemm/gemm_grouped_k_params.h (every tile of every group once, the
// clamped k ranges).
#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "flykernels/flykernels.hpp"
#include "gemm/gemm_grouped_k_params.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mentions;

void* const kA = reinterpret_cast<void*>(0x100000);
void* const kB = reinterpret_cast<void*>(0x200000);
void* const kC = reinterpret_cast<void*>(0x300000);
void* const kBias = reinterpret_cast<void*>(0x400000);
void* const kOffs = reinterpret_cast<void*>(0x500000);
void* const kWs = reinterpret_cast<void*>(0x600000);

// A valid problem as autograd's dB passes it: M = 256, Ktot = 1000, N = 384, G = 4; a = X.t()
// (M contiguous), b = dC (N contiguous), out [G, M, N] contiguous. (The K-contiguous orders are
// refused: the ragged K must be the outer dimension of the TMA maps.)
struct P {
  fly_tensor a = flykernels::tensor(kA, FLY_BF16, {256, 1000}, {1, 256});
  fly_tensor b = flykernels::tensor(kB, FLY_BF16, {1000, 384}, {384, 1});
  fly_tensor offs = flykernels::tensor(kOffs, FLY_I32, {4}, {1});
  fly_tensor c = flykernels::tensor(kC, FLY_BF16, {4, 256, 384}, {256 * 384, 384, 1});
  fly_tensor bias = flykernels::tensor(kBias, FLY_BF16, {4, 384}, {384, 1});
  void* ws = kWs;
  size_t ws_bytes = 4 * 256;
  fly_status run(bool with_bias = false) {
    return fly_grouped_gemm(&a, &b, &offs, with_bias ? &bias : nullptr, &c, ws, ws_bytes, nullptr);
  }
  fly_status wsq(size_t* bytes) { return fly_grouped_gemm_workspace_size(&a, &b, &offs, &c, bytes); }
};

// Valid input gets past validation: in CI (no driver) NO_DEVICE; on a GPU machine the fake
// pointers fail the pointer check. Never SUCCESS, never a validation status.
void check_passes_validation(P& p) {
  const fly_status s = p.run();
  INFO(fly_status_string(s) << ": " << fly_get_last_error());
  CHECK(s != FLY_SUCCESS);
  CHECK(s != FLY_ERROR_UNSUPPORTED);
  CHECK(s != FLY_ERROR_MISALIGNED);
  if (s == FLY_ERROR_INVALID_ARGUMENT) CHECK_FALSE(mentions("workspace: "));
}

}  // namespace

TEST_CASE("grouped gemm k args: valid layouts pass validation, workspace G x 256 bytes", "[cpu][grouped_gemm]") {
  P p;
  size_t bytes = 1;
  REQUIRE(p.wsq(&bytes) == FLY_SUCCESS);
  CHECK(bytes == 4 * 256);
  check_passes_validation(p);
  // Padded lines of a and b.
  {
    P q;
    q.a = flykernels::tensor(kA, FLY_BF16, {256, 1000}, {1, 264});
    q.b = flykernels::tensor(kB, FLY_BF16, {1000, 384}, {392, 1});
    REQUIRE(q.wsq(&bytes) == FLY_SUCCESS);
    check_passes_validation(q);
  }
  // Padded output rows and groups; fp16; a single group.
  P r;
  r.a.dtype = r.b.dtype = r.c.dtype = FLY_F16;
  r.c = flykernels::tensor(kC, FLY_F16, {4, 256, 384}, {256 * 400 + 64, 400, 1});
  REQUIRE(r.wsq(&bytes) == FLY_SUCCESS);
  check_passes_validation(r);
  P s;
  s.offs = flykernels::tensor(kOffs, FLY_I32, {1}, {1});
  s.c = flykernels::tensor(kC, FLY_BF16, {1, 256, 384}, {0, 384, 1});
  REQUIRE(s.wsq(&bytes) == FLY_SUCCESS);
  CHECK(bytes == 256);
  s.ws_bytes = 256;
  check_passes_validation(s);
  // Ktot = 0 is not a no-op (every out[g] is zeros): it reaches the device like any call.
  P z;
  z.a = flykernels::tensor(kA, FLY_BF16, {256, 0}, {1, 256});
  z.b = flykernels::tensor(kB, FLY_BF16, {0, 384}, {384, 1});
  REQUIRE(z.wsq(&bytes) == FLY_SUCCESS);
  CHECK(bytes == 4 * 256);
  check_passes_validation(z);
  // ... and needs no aligned operands (none is read): null a and b.
  z.a.data = nullptr;
  z.b.data = nullptr;
  check_passes_validation(z);
}

TEST_CASE("grouped gemm k args: empty output is a no-op without a device", "[cpu][grouped_gemm]") {
  {
    P p;  // G = 0: c [0, M, N]
    p.offs = flykernels::tensor(kOffs, FLY_I32, {0}, {1});
    p.c = flykernels::tensor(kC, FLY_BF16, {0, 256, 384}, {256 * 384, 384, 1});
    p.ws = nullptr;
    p.ws_bytes = 0;
    size_t bytes = 1;
    REQUIRE(p.wsq(&bytes) == FLY_SUCCESS);
    CHECK(bytes == 0);
    CHECK(p.run() == FLY_SUCCESS);
  }
  {
    P p;  // M = 0
    p.a = flykernels::tensor(kA, FLY_BF16, {0, 1000}, {1, 1});
    p.c = flykernels::tensor(kC, FLY_BF16, {4, 0, 384}, {0, 384, 1});
    p.ws = nullptr;
    p.ws_bytes = 0;
    CHECK(p.run() == FLY_SUCCESS);
  }
  {
    P p;  // N = 0
    p.b = flykernels::tensor(kB, FLY_BF16, {1000, 0}, {1, 1});
    p.c = flykernels::tensor(kC, FLY_BF16, {4, 256, 0}, {0, 1, 1});
    CHECK(p.run() == FLY_SUCCESS);
  }
}

TEST_CASE("grouped gemm k args: shape, dtype, stride and bias errors name the argument", "[cpu][grouped_gemm]") {
  {
    P p;  // c of rank 2 with 2-D a and b
    p.c = flykernels::tensor(kC, FLY_BF16, {256, 384}, {384, 1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c: rank 2"));
  }
  {
    P p;
    CHECK(p.run(true) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("bias"));
  }
  {
    P p;
    p.a.dtype = FLY_F32;
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("a: dtype"));
  }
  {
    P p;
    p.b.dtype = FLY_F16;
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("b: dtype"));
  }
  {
    P p;
    p.c.dtype = FLY_F16;
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c: dtype"));
  }
  {
    P p;
    p.offs = flykernels::tensor(kOffs, FLY_I64, {4}, {1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("offs: dtype"));
  }
  {
    P p;  // Ktot mismatch
    p.b = flykernels::tensor(kB, FLY_BF16, {999, 384}, {384, 1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("b: shape"));
  }
  {
    P p;  // c not [G, M, N]
    p.c = flykernels::tensor(kC, FLY_BF16, {3, 256, 384}, {256 * 384, 384, 1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c: shape"));
    p.c = flykernels::tensor(kC, FLY_BF16, {4, 384, 256}, {256 * 384, 256, 1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c: shape"));
  }
  {
    P p;  // c transposed inner dimension
    p.c = flykernels::tensor(kC, FLY_BF16, {4, 256, 384}, {256 * 384, 1, 256});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("c: inner stride"));
  }
  {
    P p;  // overlapping rows / groups of c
    p.c = flykernels::tensor(kC, FLY_BF16, {4, 256, 384}, {256 * 384, 300, 1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c: row stride"));
    p.c = flykernels::tensor(kC, FLY_BF16, {4, 256, 384}, {1000, 384, 1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c: group stride"));
  }
  {
    P p;  // a not M contiguous: neither dimension, K contiguous (refused: docs/grouped_gemm.md), overlapping
    p.a = flykernels::tensor(kA, FLY_BF16, {256, 1000}, {2, 512});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("a: strides"));
    p.a = flykernels::tensor(kA, FLY_BF16, {256, 1000}, {1000, 1});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("a: strides"));
    CHECK(mentions("M contiguous"));
    p.a = flykernels::tensor(kA, FLY_BF16, {256, 1000}, {1, 100});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("a: strides"));
  }
  {
    P p;  // b not N contiguous: neither, K contiguous, overlapping
    p.b = flykernels::tensor(kB, FLY_BF16, {1000, 384}, {768, 2});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("b: strides"));
    p.b = flykernels::tensor(kB, FLY_BF16, {1000, 384}, {1, 1000});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("b: strides"));
    CHECK(mentions("N contiguous"));
    p.b = flykernels::tensor(kB, FLY_BF16, {1000, 384}, {200, 1});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("b: strides"));
  }
  {
    P p;  // offs with a stride
    p.offs = flykernels::tensor(kOffs, FLY_I32, {4}, {2});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("offs: stride"));
  }
  {
    P p;  // TMA: line stride not a 16-byte multiple, misaligned bases
    p.a = flykernels::tensor(kA, FLY_BF16, {256, 1000}, {1, 260});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("a: stride"));
    P q;
    q.b = flykernels::tensor(kB, FLY_BF16, {1000, 384}, {388, 1});
    CHECK(q.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("b: stride"));
    P r;
    r.a.data = reinterpret_cast<char*>(kA) + 8;
    CHECK(r.run() == FLY_ERROR_MISALIGNED);
    CHECK(mentions("a: base address"));
    P t;
    t.b.data = reinterpret_cast<char*>(kB) + 2;
    CHECK(t.run() == FLY_ERROR_MISALIGNED);
    CHECK(mentions("b: base address"));
  }
  {
    P p;  // dimensions past 2^31
    p.a = flykernels::tensor(kA, FLY_BF16, {256, int64_t(1) << 31}, {1, 256});
    p.b = flykernels::tensor(kB, FLY_BF16, {int64_t(1) << 31, 384}, {384, 1});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("2^31"));
  }
}

TEST_CASE("grouped gemm k args: the workspace is required, large enough and aligned", "[cpu][grouped_gemm]") {
  {
    P p;
    p.ws = nullptr;
    p.ws_bytes = 0;
    CHECK(p.run() == FLY_ERROR_WORKSPACE);
    CHECK(mentions("workspace"));
    CHECK(mentions("1024"));
  }
  {
    P p;
    p.ws_bytes = 4 * 256 - 1;
    CHECK(p.run() == FLY_ERROR_WORKSPACE);
    CHECK(mentions("workspace"));
  }
  {
    P p;
    p.ws = reinterpret_cast<char*>(kWs) + 128;
    CHECK(p.run() == FLY_ERROR_MISALIGNED);
    CHECK(mentions("workspace"));
  }
  {
    P p;
    p.ws = nullptr;
    p.ws_bytes = 1024;
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("workspace"));
  }
  {
    P p;  // Ktot = 0 needs it as well (one rule for every call with output)
    p.a = flykernels::tensor(kA, FLY_BF16, {256, 0}, {1, 256});
    p.b = flykernels::tensor(kB, FLY_BF16, {0, 384}, {384, 1});
    p.ws = nullptr;
    p.ws_bytes = 0;
    CHECK(p.run() == FLY_ERROR_WORKSPACE);
    CHECK(mentions("workspace"));
  }
}

TEST_CASE("grouped gemm k: the decomposition covers every tile of every group once", "[cpu][grouped_gemm]") {
  using fly::gemm::grouped_k_unit;
  for (const auto& tiles : std::vector<std::pair<int, int>>{{1, 1}, {3, 5}, {32, 16}, {7, 1}, {1, 9}}) {
    const int tm = tiles.first, tn = tiles.second, G = 5;
    std::set<std::tuple<int, int, int>> seen;
    const int64_t units = int64_t(G) * tm * tn;
    for (int ctas : {1, 7, 132})
      for (int b = 0; b < ctas; ++b)
        for (int64_t t = b; t < units; t += ctas) {
          const fly::gemm::GroupedKUnit u = grouped_k_unit(t, tm, tn);
          REQUIRE(u.group >= 0);
          REQUIRE(u.group < G);
          REQUIRE(u.tm >= 0);
          REQUIRE(u.tm < tm);
          REQUIRE(u.tn >= 0);
          REQUIRE(u.tn < tn);
          if (ctas == 7) CHECK(seen.emplace(u.group, u.tm, u.tn).second);
        }
    CHECK(int64_t(seen.size()) == units);
    // Down the tile rows first inside a group.
    CHECK(grouped_k_unit(1, tm, tn).tm == (tm > 1 ? 1 : 0));
  }
}

TEST_CASE("grouped gemm k: k ranges are clamped into the tensor, decreasing entries are empty", "[cpu][grouped_gemm]") {
  auto ranges = [](std::vector<int32_t> offs, int32_t ktot) {
    std::vector<std::pair<int32_t, int32_t>> r;
    for (int32_t g = 0; g < int32_t(offs.size()); ++g) {
      int32_t b, e;
      fly::gemm::grouped_k_range(offs.data(), g, ktot, &b, &e);
      CHECK(0 <= b);
      CHECK(b <= e);
      CHECK(e <= ktot);
      r.emplace_back(b, e);
    }
    return r;
  };
  using R = std::vector<std::pair<int32_t, int32_t>>;
  CHECK(ranges({10, 10, 30, 100}, 100) == R{{0, 10}, {10, 10}, {10, 30}, {30, 100}});
  CHECK(ranges({50, 20, 150}, 100) == R{{0, 50}, {50, 50}, {20, 100}});  // decreasing: empty; past Ktot: clamped
  CHECK(ranges({-5, 70, INT32_MAX}, 100) == R{{0, 0}, {0, 70}, {70, 100}});
  CHECK(ranges({0, 0}, 0) == R{{0, 0}, {0, 0}});
  CHECK(fly::gemm::grouped_k_blocks(0, 64) == 0);
  CHECK(fly::gemm::grouped_k_blocks(1, 64) == 1);
  CHECK(fly::gemm::grouped_k_blocks(64, 64) == 1);
  CHECK(fly::gemm::grouped_k_blocks(65, 64) == 2);
}
