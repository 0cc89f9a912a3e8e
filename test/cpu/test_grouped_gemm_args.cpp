// SPDX-License-Identifier: Apache-2.0
// fly_grouped_gemm / fly_grouped_gemm_workspace_size on bad input: a status and a message naming
// the argument, before any device query (runs without a GPU). Valid input passes validation
// (fly_grouped_gemm_workspace_size: SUCCESS, 0 bytes, no device touched); empty work is a
// successful no-op without a device.
#include <cstring>
#include <string>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "flykernels/flykernels.hpp"
#include "test_tensors.hpp"

namespace {

using fly_test::mentions;

void* const kA = reinterpret_cast<void*>(0x100000);
void* const kB = reinterpret_cast<void*>(0x200000);
void* const kC = reinterpret_cast<void*>(0x300000);
void* const kBias = reinterpret_cast<void*>(0x400000);
void* const kOffs = reinterpret_cast<void*>(0x500000);

// A valid problem: T = 256, K = 512, N = 384, G = 4, B N-contiguous.
struct P {
  fly_tensor a = flykernels::tensor(kA, FLY_BF16, {256, 512}, {512, 1});
  fly_tensor b = flykernels::tensor(kB, FLY_BF16, {4, 512, 384}, {512 * 384, 384, 1});
  fly_tensor offs = flykernels::tensor(kOffs, FLY_I32, {4}, {1});
  fly_tensor c = flykernels::tensor(kC, FLY_BF16, {256, 384}, {384, 1});
  fly_tensor bias = flykernels::tensor(kBias, FLY_BF16, {4, 384}, {384, 1});
  fly_status run(bool with_bias = false) { return fly_grouped_gemm(&a, &b, &offs, with_bias ? &bias : nullptr, &c, nullptr, 0, nullptr); }
  fly_status ws() {
    size_t bytes = 123;
    const fly_status s = fly_grouped_gemm_workspace_size(&a, &b, &offs, &c, &bytes);
    if (s == FLY_SUCCESS) CHECK(bytes == 0);
    return s;
  }
};

}  // namespace

TEST_CASE("grouped gemm args: valid input passes validation", "[cpu][grouped_gemm]") {
  P p;
  CHECK(p.ws() == FLY_SUCCESS);
  // B K-contiguous (w.transpose(-2, -1) of a [G, N, K] tensor), padded lines and groups.
  p.b = flykernels::tensor(kB, FLY_BF16, {4, 512, 384}, {384 * 520 + 8, 1, 520});
  CHECK(p.ws() == FLY_SUCCESS);
  // fp16, one group, padded A and C rows.
  P q;
  q.a = flykernels::tensor(kA, FLY_F16, {256, 512}, {520, 1});
  q.b = flykernels::tensor(kB, FLY_F16, {1, 512, 384}, {0, 384, 1});
  q.offs = flykernels::tensor(kOffs, FLY_I32, {1}, {1});
  q.c = flykernels::tensor(kC, FLY_F16, {256, 384}, {400, 1});
  CHECK(q.ws() == FLY_SUCCESS);
  // A call that does get past validation needs a device: NO_DEVICE in CI (on the GPU machine the
  // fake pointers fail the pointer check instead); never a validation status.
  const fly_status s = p.run(true);
  CHECK(s != FLY_SUCCESS);
  CHECK(s != FLY_ERROR_UNSUPPORTED);
}

TEST_CASE("grouped gemm args: empty work is a no-op without a device", "[cpu][grouped_gemm]") {
  P p;
  p.a = flykernels::tensor(kA, FLY_BF16, {0, 512}, {512, 1});
  p.c = flykernels::tensor(kC, FLY_BF16, {0, 384}, {384, 1});
  CHECK(p.run() == FLY_SUCCESS);
  // G = 0 with T = 0 too.
  p.b = flykernels::tensor(kB, FLY_BF16, {0, 512, 384}, {512 * 384, 384, 1});
  p.offs = flykernels::tensor(kOffs, FLY_I32, {0}, {1});
  p.bias = flykernels::tensor(kBias, FLY_BF16, {0, 384}, {384, 1});
  CHECK(p.run(true) == FLY_SUCCESS);
  // N = 0.
  P q;
  q.b = flykernels::tensor(kB, FLY_BF16, {4, 512, 0}, {0, 1, 1});
  q.c = flykernels::tensor(kC, FLY_BF16, {256, 0}, {1, 1});
  CHECK(q.run() == FLY_SUCCESS);
}

TEST_CASE("grouped gemm args: null, rank, dtype and shape errors name the argument", "[cpu][grouped_gemm]") {
  {
    P p;
    CHECK(fly_grouped_gemm(nullptr, &p.b, &p.offs, nullptr, &p.c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("a"));
    CHECK(fly_grouped_gemm(&p.a, &p.b, nullptr, nullptr, &p.c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("offs"));
    size_t bytes;
    CHECK(fly_grouped_gemm_workspace_size(&p.a, &p.b, &p.offs, &p.c, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("bytes"));
    CHECK(fly_grouped_gemm_workspace_size(&p.a, nullptr, &p.offs, &p.c, &bytes) == FLY_ERROR_INVALID_ARGUMENT);
  }
  {
    P p;  // b of rank 2 (a dense GEMM's B)
    p.b = flykernels::tensor(kB, FLY_BF16, {512, 384}, {384, 1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("b"));
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
    p.bias.dtype = FLY_F16;
    CHECK(p.run(true) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("bias: dtype"));
  }
  {
    P p;  // offs of int64 (torch's default integer type)
    p.offs = flykernels::tensor(kOffs, FLY_I64, {4}, {1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("offs: dtype"));
  }
  {
    P p;  // K mismatch
    p.b = flykernels::tensor(kB, FLY_BF16, {4, 256, 384}, {256 * 384, 384, 1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("b: shape"));
  }
  {
    P p;  // offs not G entries
    p.offs = flykernels::tensor(kOffs, FLY_I32, {3}, {1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("offs"));
  }
  {
    P p;
    p.c = flykernels::tensor(kC, FLY_BF16, {256, 380}, {384, 1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c: shape"));
  }
  {
    P p;
    p.bias = flykernels::tensor(kBias, FLY_BF16, {384}, {1});  // a dense GEMM's bias
    CHECK(p.run(true) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("bias"));
    p.bias = flykernels::tensor(kBias, FLY_BF16, {3, 384}, {384, 1});
    CHECK(p.run(true) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("bias: shape"));
  }
  {
    P p;  // rows but no groups
    p.b = flykernels::tensor(kB, FLY_BF16, {0, 512, 384}, {512 * 384, 384, 1});
    p.offs = flykernels::tensor(kOffs, FLY_I32, {0}, {1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("G = 0"));
  }
  {
    P p;  // K = 0 with work
    p.a = flykernels::tensor(kA, FLY_BF16, {256, 0}, {1, 1});
    p.b = flykernels::tensor(kB, FLY_BF16, {4, 0, 384}, {384, 384, 1});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("K = 0"));
  }
}

TEST_CASE("grouped gemm args: strides and TMA alignment", "[cpu][grouped_gemm]") {
  {
    P p;  // A column-major
    p.a = flykernels::tensor(kA, FLY_BF16, {256, 512}, {1, 256});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("a: inner stride"));
  }
  {
    P p;  // A rows overlap
    p.a = flykernels::tensor(kA, FLY_BF16, {256, 512}, {256, 1});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("a: row stride"));
  }
  {
    P p;  // A row stride not a multiple of 8 elements
    p.a = flykernels::tensor(kA, FLY_BF16, {256, 512}, {515, 1});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("a: row stride"));
  }
  {
    P p;  // misaligned base of A (element aligned, not 16-byte)
    p.a.data = reinterpret_cast<char*>(kA) + 2;
    CHECK(p.run() == FLY_ERROR_MISALIGNED);
    CHECK(mentions("a: base address"));
  }
  {
    P p;
    p.b.data = reinterpret_cast<char*>(kB) + 8;
    CHECK(p.run() == FLY_ERROR_MISALIGNED);
    CHECK(mentions("b: base address"));
  }
  {
    P p;  // B with neither N nor K contiguous
    p.b = flykernels::tensor(kB, FLY_BF16, {4, 512, 384}, {2 * 512 * 384, 2 * 384, 2});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("b: strides"));
  }
  {
    P p;  // B lines not 8-element multiples
    p.b = flykernels::tensor(kB, FLY_BF16, {4, 512, 384}, {512 * 390, 390, 1});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("b: stride"));
  }
  {
    P p;  // B groups overlap
    p.b = flykernels::tensor(kB, FLY_BF16, {4, 512, 384}, {384, 384, 1});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("groups overlap"));
  }
  {
    P p;  // B group stride not a multiple of 8 elements
    p.b = flykernels::tensor(kB, FLY_BF16, {4, 512, 384}, {512 * 384 + 4, 384, 1});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("b: group stride"));
  }
  {
    P p;  // C column-major
    p.c = flykernels::tensor(kC, FLY_BF16, {256, 384}, {1, 256});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("c: inner stride"));
  }
  {
    P p;
    p.c = flykernels::tensor(kC, FLY_BF16, {256, 384}, {300, 1});
    CHECK(p.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c: row stride"));
  }
  {
    P p;  // strided offsets
    p.offs = flykernels::tensor(kOffs, FLY_I32, {4}, {2});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("offs: stride"));
  }
  {
    P p;
    p.bias = flykernels::tensor(kBias, FLY_BF16, {4, 384}, {1, 4});
    CHECK(p.run(true) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("bias: inner stride"));
  }
  {
    P p;  // workspace: NULL with a size, misaligned
    CHECK(fly_grouped_gemm(&p.a, &p.b, &p.offs, nullptr, &p.c, nullptr, 64, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("workspace"));
    CHECK(fly_grouped_gemm(&p.a, &p.b, &p.offs, nullptr, &p.c, reinterpret_cast<void*>(0x1010), 64, nullptr) ==
          FLY_ERROR_MISALIGNED);
    CHECK(mentions("workspace"));
  }
  {
    P p;  // dimensions past 2^31
    p.a = flykernels::tensor(kA, FLY_BF16, {int64_t(1) << 31, 512}, {512, 1});
    p.c = flykernels::tensor(kC, FLY_BF16, {int64_t(1) << 31, 384}, {384, 1});
    CHECK(p.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("2^31"));
  }
}

TEST_CASE("grouped gemm args: host offsets checked", "[cpu][grouped_gemm]") {
  const int32_t good[4] = {0, 10, 10, 100};
  CHECK(fly_grouped_gemm_check_offsets(good, 4, 100) == FLY_SUCCESS);
  CHECK(fly_grouped_gemm_check_offsets(good, 4, 200) == FLY_SUCCESS);  // rows past the last end: unwritten
  CHECK(fly_grouped_gemm_check_offsets(nullptr, 0, 5) == FLY_SUCCESS);
  const int32_t decreasing[3] = {50, 20, 100};
  CHECK(fly_grouped_gemm_check_offsets(decreasing, 3, 100) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("offs[1] = 20"));
  const int32_t negative[2] = {-1, 5};
  CHECK(fly_grouped_gemm_check_offsets(negative, 2, 100) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("offs[0] = -1"));
  const int32_t big[2] = {5, 101};
  CHECK(fly_grouped_gemm_check_offsets(big, 2, 100) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("exceeds"));
  CHECK(fly_grouped_gemm_check_offsets(nullptr, 2, 100) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("offs"));
  CHECK(fly_grouped_gemm_check_offsets(good, -1, 100) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(fly_grouped_gemm_check_offsets(good, 4, -1) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK_THROWS(flykernels::grouped_gemm_check_offsets(decreasing, 3, 100));
}
