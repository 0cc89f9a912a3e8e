// SPDX-License-Identifier: Apache-2.0
// fly_gemm on strides TMA cannot address, behind the device check on the stand-in driver: the
// call launches the cp.async kernel (kernels/gemm/gemm_odd_sm90.cu) with the planned loads, not
// FLY_ERROR_UNSUPPORTED; aligned calls keep the TMA kernel; a forced TMA variant cannot take an
// odd call. No kernel runs (the fake records the launch).
#include <algorithm>
#include <cstring>
#include <string>

#include "catch_compat.hpp"
#include "core.hpp"
#include "fake_cuda.h"
#include "flykernels/flykernels.h"
#include "gemm/gemm_odd_params.h"
#include "gemm/gemm_params.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;
using fly_test::mentions;
using fly_test::vec;

struct ForceGuard {
  ~ForceGuard() { fly_force_variant(nullptr); }
};

const fake_cuda_launch* only_launch() {
  REQUIRE(fake_cuda_launch_count() == 1);
  return fake_cuda_get_launch(0);
}

}  // namespace

TEST_CASE("gemm odd strides launch the cp.async kernel, not UNSUPPORTED", "[fake][gemm][odd]") {
  ForceGuard guard;
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  void* s = fake_cuda_stream_create(0);
  const int64_t M = 77, N = 515, K = 1003;
  for (fly_dtype dt : {FLY_BF16, FLY_F16}) {
    const std::string d = dt == FLY_BF16 ? "bf16" : "fp16";
    // TN: A column-major with lda = M + 1 (4-byte lines), B column-major with ldb = K + 1 (8-byte
    // lines), C with ldc = N + 1 at a 2-byte offset, bias.
    char* abuf = static_cast<char*>(fake_cuda_malloc(size_t((M + 1) * K * 2)));
    char* bbuf = static_cast<char*>(fake_cuda_malloc(size_t(K * 520 * 2)));  // also [K, N] with ldb 520
    char* cbuf = static_cast<char*>(fake_cuda_malloc(size_t(M * (N + 1) * 2 + 2)));
    fly_tensor a = mat(abuf, dt, M, K, 1, M + 1), b = mat(bbuf, dt, K, N, 1, K + 1);
    fly_tensor c = mat(cbuf + 2, dt, M, N, N + 1, 1);
    fly_tensor bias = vec(fake_cuda_malloc(size_t(N * 2)), dt, N);
    fake_cuda_clear_records();
    const fly_status st = fly_gemm(&a, &b, &c, &bias, nullptr, 0, s);
    INFO(fly_get_last_error());
    REQUIRE(st == FLY_SUCCESS);
    CHECK(std::string(fly_last_variant()) == "gemm_odd_" + d + "_bn128_st6");
    CHECK(std::string(fly_last_decision()).find("default") != std::string::npos);
    const fake_cuda_launch* L = only_launch();
    CHECK(std::string(L->kernel) == "fly_gemm_odd_sm90");
    CHECK(L->block[0] == unsigned(fly::gemm::kOddThreads));
    // 1 x 5 tiles of 128 x 128 over 16 k steps: split-K clusters of 4 (4 k steps each)
    CHECK(L->cluster[0] == 4u);
    CHECK(L->grid[0] == 20u);
    CHECK(L->smem == unsigned(fly::gemm::odd_smem_bytes(128, 6)));
    CHECK(L->smem <= 232448u);
    CHECK(fake_cuda_tensor_map_count() == 0);  // no TMA
    fly::gemm::OddGemmParams p;
    REQUIRE(L->param_bytes >= sizeof(p));
    std::memcpy(&p, L->params, sizeof(p));
    CHECK(p.tail.p.data == a.data);
    CHECK(p.tail.p.ld == M + 1);
    CHECK(p.tail.p.gran == 4);
    CHECK(p.tail.q.data == b.data);
    CHECK(p.tail.q.ld == K + 1);
    CHECK(p.tail.q.gran == 8);
    CHECK(p.core.c == c.data);
    CHECK(p.core.ldc == N + 1);
    CHECK(p.core.bias == bias.data);
    CHECK(p.core.p_kmajor == 0);
    CHECK(p.core.q_kmajor == 1);
    CHECK(p.core.c_vec == 0);
    CHECK(p.core.k == K);
    CHECK(p.core.split == 4);
    CHECK(p.core.kb_per_split == 4);

    // A base only 2-byte aligned (row-major A, lda 16-byte legal): 2-byte loads for A only.
    fly_tensor a2 = mat(abuf + 2, dt, M, K, 1008, 1), b2 = mat(bbuf, dt, K, N, 520, 1);
    fly_tensor c2 = mat(cbuf, dt, M, N, N, 1);
    fake_cuda_clear_records();
    REQUIRE(fly_gemm(&a2, &b2, &c2, nullptr, nullptr, 0, s) == FLY_SUCCESS);
    L = only_launch();
    CHECK(std::string(L->kernel) == "fly_gemm_odd_sm90");
    std::memcpy(&p, L->params, sizeof(p));
    CHECK(p.tail.p.gran == 2);
    CHECK(p.tail.q.gran == 16);
    CHECK(p.core.p_kmajor == 1);
    CHECK(p.core.q_kmajor == 0);

    // The same shape with TMA-legal strides keeps the TMA kernel.
    fly_tensor a3 = mat(abuf, dt, M, K, 1008, 1);
    fake_cuda_clear_records();
    REQUIRE(fly_gemm(&a3, &b2, &c2, nullptr, nullptr, 0, s) == FLY_SUCCESS);
    CHECK(std::string(only_launch()->kernel) == "fly_gemm_sm90");
    CHECK(std::string(fly_last_variant()).rfind("gemm_odd_", 0) == std::string::npos);

    // A forced TMA variant cannot take the odd call; a forced cp.async one can.
    REQUIRE(fly_force_variant(("gemm_" + d + "_bn128_st6_sw0_mc1").c_str()) == FLY_SUCCESS);
    fake_cuda_clear_records();
    CHECK(fly_gemm(&a, &b, &c, &bias, nullptr, 0, s) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("cannot run"));
    CHECK(fake_cuda_launch_count() == 0);
    REQUIRE(fly_force_variant(("gemm_odd_" + d + "_bn128_st6").c_str()) == FLY_SUCCESS);
    fake_cuda_clear_records();
    CHECK(fly_gemm(&a3, &b2, &c2, nullptr, nullptr, 0, s) == FLY_SUCCESS);
    CHECK(std::string(only_launch()->kernel) == "fly_gemm_odd_sm90");
    REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  }
}

TEST_CASE("gemm odd strides with a workspace take the packed path: aligned copies, then the TMA kernel",
          "[fake][gemm][odd]") {
  ForceGuard guard;
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  void* s = fake_cuda_stream_create(0);
  const int64_t M = 77, N = 515, K = 1003;
  for (fly_dtype dt : {FLY_BF16, FLY_F16}) {
    const std::string d = dt == FLY_BF16 ? "bf16" : "fp16";
    // TN: A column-major with lda = M + 1 (K lines of M), B column-major with ldb = K + 1 (N lines
    // of K); C contiguous.
    char* abuf = static_cast<char*>(fake_cuda_malloc(size_t(80 * K * 2)));  // room for the aligned views below
    char* bbuf = static_cast<char*>(fake_cuda_malloc(size_t(1008 * N * 2)));
    char* cbuf = static_cast<char*>(fake_cuda_malloc(size_t(M * N * 2)));
    fly_tensor a = mat(abuf, dt, M, K, 1, M + 1), b = mat(bbuf, dt, K, N, 1, K + 1);
    fly_tensor c = mat(cbuf, dt, M, N, N, 1);
    fly_tensor a_ok = mat(abuf, dt, M, K, 1, 80), b_ok = mat(bbuf, dt, K, N, 1, 1008);
    size_t need = 0, need_aligned = 0;
    REQUIRE(fly_gemm_workspace_size(&a, &b, &c, &need) == FLY_SUCCESS);
    REQUIRE(fly_gemm_workspace_size(&a_ok, &b_ok, &c, &need_aligned) == FLY_SUCCESS);
    // The copies: K lines of round8(M) = 80 elements, N lines of round8(K) = 1008 elements.
    const size_t copy_a = size_t((K * 80 * 2 + 255) / 256 * 256), copy_b = size_t((N * 1008 * 2 + 255) / 256 * 256);
    CHECK(need == std::max<size_t>(need_aligned, 4096) + copy_a + copy_b);
    char* ws = static_cast<char*>(fake_cuda_malloc(need));

    fake_cuda_clear_records();
    REQUIRE(fly_gemm(&a, &b, &c, nullptr, ws, need, s) == FLY_SUCCESS);
    CHECK(std::string(fly_last_decision()).find(":packed") != std::string::npos);
    CHECK(std::string(fly_last_variant()).rfind("gemm_" + d + "_", 0) == 0);
    CHECK(std::string(fly_last_variant()).rfind("gemm_odd_", 0) == std::string::npos);
    REQUIRE(fake_cuda_launch_count() == 3);
    const size_t front = need - copy_a - copy_b;
    for (int i = 0; i < 2; ++i) {
      const fake_cuda_launch* L = fake_cuda_get_launch(i);
      CHECK(std::string(L->kernel) == "fly_pack_lines_sm90");
      CHECK(L->block[0] == unsigned(fly::gemm::kPackThreads));
      fly::gemm::PackParams p;
      REQUIRE(L->param_bytes >= sizeof(p));
      std::memcpy(&p, L->params, sizeof(p));
      CHECK(p.src == (i == 0 ? a.data : b.data));
      CHECK(p.dst == ws + front + (i == 0 ? 0 : copy_a));
      CHECK(p.lines == (i == 0 ? K : N));
      CHECK(p.len == (i == 0 ? M : K));
      CHECK(p.sld == (i == 0 ? M + 1 : K + 1));
      CHECK(p.dld == (i == 0 ? 80 : 1008));
    }
    const fake_cuda_launch* G = fake_cuda_get_launch(2);
    CHECK(std::string(G->kernel).find("fly_gemm_") == 0);
    CHECK(std::string(G->kernel) != "fly_gemm_odd_sm90");
    // The TMA maps read the copies, none the originals.
    bool saw_a = false, saw_b = false;
    for (int i = 0; i < fake_cuda_tensor_map_count(); ++i) {
      const fake_cuda_tensor_map* m = fake_cuda_get_tensor_map(i);
      CHECK(m->address != reinterpret_cast<uint64_t>(abuf));
      CHECK(m->address != reinterpret_cast<uint64_t>(bbuf));
      saw_a |= m->address == reinterpret_cast<uint64_t>(ws + front);
      saw_b |= m->address == reinterpret_cast<uint64_t>(ws + front + copy_a);
    }
    CHECK(saw_a);
    CHECK(saw_b);

    // Only A odd: one copy. 4096 bytes plus the copy are enough (no stream-K then).
    size_t need_a = 0;
    REQUIRE(fly_gemm_workspace_size(&a, &b_ok, &c, &need_a) == FLY_SUCCESS);
    CHECK(need_a == std::max<size_t>(need_aligned, 4096) + copy_a);
    fake_cuda_clear_records();
    const fly_status st = fly_gemm(&a, &b_ok, &c, nullptr, ws, 4096 + copy_a, s);
    INFO(fly_get_last_error());
    REQUIRE(st == FLY_SUCCESS);
    CHECK(fake_cuda_launch_count() == 2);
    CHECK(std::string(fake_cuda_get_launch(0)->kernel) == "fly_pack_lines_sm90");
    CHECK(std::string(fly_last_decision()).find(":packed") != std::string::npos);
    // 256 bytes short: the cp.async kernel, with no workspace writes.
    fake_cuda_clear_records();
    REQUIRE(fly_gemm(&a, &b_ok, &c, nullptr, ws, 4096 + copy_a - 256, s) == FLY_SUCCESS);
    CHECK(std::string(only_launch()->kernel) == "fly_gemm_odd_sm90");
    CHECK(std::string(fly_last_decision()).find(":packed") == std::string::npos);
    // A forced cp.async variant keeps the cp.async kernel even with room for the copies.
    REQUIRE(fly_force_variant(("gemm_odd_" + d + "_bn128_st6").c_str()) == FLY_SUCCESS);
    fake_cuda_clear_records();
    REQUIRE(fly_gemm(&a, &b, &c, nullptr, ws, need, s) == FLY_SUCCESS);
    CHECK(std::string(only_launch()->kernel) == "fly_gemm_odd_sm90");
    // A forced TMA variant runs on the copies.
    REQUIRE(fly_force_variant(("gemm_" + d + "_bn128_st6_sw0_mc1").c_str()) == FLY_SUCCESS);
    fake_cuda_clear_records();
    REQUIRE(fly_gemm(&a, &b, &c, nullptr, ws, need, s) == FLY_SUCCESS);
    CHECK(fake_cuda_launch_count() == 3);
    CHECK(std::string(fly_last_decision()) == "forced:packed");
    REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  }
}
