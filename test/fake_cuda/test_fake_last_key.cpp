// SPDX-License-Identifier: Apache-2.0
// fly_last_key after launches on the stand-in driver: each launcher leaves exactly the key its
// family's function in src/dispatch_key.hpp computes (what flytune writes rows under), a refused
// call leaves the previous key, and the key is per thread.
#include <string>
#include <thread>

#include "catch_compat.hpp"
#include "core.hpp"
#include "dispatch_key.hpp"
#include "fake_cuda.h"
#include "flykernels/flykernels.h"
#include "flykernels/flykernels.hpp"
#include "test_tensors.hpp"

namespace {

// This thread's fly_last_key equals `want` (op, dtype, layout, k[0..3]).
bool last_key_is(const fly::ShapeKey& want) {
  const char *op = nullptr, *dt = nullptr, *layout = nullptr;
  int64_t k[4] = {-1, -1, -1, -1};
  fly_last_key(&op, &dt, &layout, k);
  const fly::DispatchKey& w = want.key;
  const bool ok = w.op == op && w.dtype == dt && w.layout == layout && k[0] == w.k[0] && k[1] == w.k[1] &&
                  k[2] == w.k[2] && k[3] == w.k[3];
  if (!ok)
    UNSCOPED_INFO("fly_last_key " << op << " " << dt << " " << layout << " " << k[0] << " " << k[1] << " " << k[2]
                                  << " " << k[3] << ", expected " << w.str());
  return ok;
}

// A contiguous [r, c] matrix, row- or column-major.
fly_tensor matrix(fly_dtype dt, int64_t r, int64_t c, bool row) {
  void* d = fake_cuda_malloc(size_t(r * c * 2));
  return row ? fly_test::mat(d, dt, r, c, c) : flykernels::tensor(d, dt, {r, c}, {1, r});
}

}  // namespace

TEST_CASE("fly_last_key: gemm leaves keys::gemm of the layout it reads the operands in", "[fake][last_key]") {
  void* s = fake_cuda_stream_create(0);
  struct Shape {
    int64_t M, N, K;
  };
  for (fly_dtype dt : {FLY_F16, FLY_BF16})
    for (Shape sh : {Shape{1, 4096, 4096}, Shape{8, 1024, 512}, Shape{4096, 14336, 4096}, Shape{304, 136, 64}})
      for (bool a_row : {true, false})
        for (bool b_row : {true, false}) {
          fly_tensor a = matrix(dt, sh.M, sh.K, a_row), b = matrix(dt, sh.K, sh.N, b_row),
                     c = matrix(dt, sh.M, sh.N, true);
          const fly_status st = fly_gemm(&a, &b, &c, nullptr, nullptr, 0, s);
          INFO("M=" << sh.M << " N=" << sh.N << " K=" << sh.K << " a_row " << a_row << " b_row " << b_row << " "
                    << fly_get_last_error());
          REQUIRE(st == FLY_SUCCESS);
          // A one-row A is read row-major whatever its strides say: a "tn" call with M = 1 looks
          // up "nn", which is why flytune records the launcher's key rather than the layout it asked for.
          const bool read_row = a_row || sh.M == 1;
          CHECK(last_key_is(fly::keys::gemm(fly::dtype_name(dt), fly::keys::gemm_layout(read_row, b_row), sh.M, sh.N,
                                            sh.K)));
        }
}

TEST_CASE("fly_last_key: a gemm TMA cannot address, without a workspace, leaves the cp.async path's key", "[fake][last_key]") {
  void* s = fake_cuda_stream_create(0);
  // B [64, 129] row-major: 258-byte rows break TMA's 16-byte rule.
  fly_tensor a = matrix(FLY_BF16, 300, 64, true), b = matrix(FLY_BF16, 64, 129, true), c = matrix(FLY_BF16, 300, 129, true);
  const fly_status st = fly_gemm(&a, &b, &c, nullptr, nullptr, 0, s);
  INFO(fly_get_last_error());
  REQUIRE(st == FLY_SUCCESS);
  CHECK(last_key_is(fly::keys::gemm("bf16", "nn", 300, 129, 64, true)));
}

TEST_CASE("fly_last_key: grouped gemm leaves keys::grouped_gemm (mean-M bucket, G)", "[fake][last_key]") {
  void* s = fake_cuda_stream_create(0);
  const int64_t K = 1024, N = 768;
  for (bool kmajor : {true, false})
    for (int64_t G : {1, 3, 8, 64})
      for (int64_t T : {1, 100, 1000, 4097}) {
        void* da = fake_cuda_malloc(size_t(T * K * 2));
        void* db = fake_cuda_malloc(size_t(G * K * N * 2));
        void* dc = fake_cuda_malloc(size_t(T * N * 2));
        void* doffs = fake_cuda_malloc(size_t(G * 4));
        fly_tensor a = flykernels::tensor(da, FLY_BF16, {T, K}, {K, 1});
        fly_tensor b = kmajor ? flykernels::tensor(db, FLY_BF16, {G, K, N}, {K * N, 1, K})
                              : flykernels::tensor(db, FLY_BF16, {G, K, N}, {K * N, N, 1});
        fly_tensor c = flykernels::tensor(dc, FLY_BF16, {T, N}, {N, 1});
        fly_tensor offs = flykernels::tensor(doffs, FLY_I32, {G}, {1});
        const fly_status st = fly_grouped_gemm(&a, &b, &offs, nullptr, &c, nullptr, 0, s);
        INFO("kmajor " << kmajor << " G=" << G << " T=" << T << " " << fly_get_last_error());
        REQUIRE(st == FLY_SUCCESS);
        CHECK(last_key_is(fly::keys::grouped_gemm("bf16", kmajor, T, G, N, K)));
      }
}

TEST_CASE("fly_last_key: scaled_gemm leaves keys::scaled_gemm; a refused call keeps the last key", "[fake][last_key]") {
  if (!fly::find_variant("mxfp_gemm_m64_n64")) {
    WARN("mxfp not in this build");
    return;
  }
  void* s = fake_cuda_stream_create(0);
  for (bool fp4 : {false, true})
    for (int64_t M : {1, 37, 4096}) {
      const int64_t N = 2048, K = 1024, cols = fp4 ? K / 2 : K;
      const fly_dtype et = fp4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3;
      fly_tensor a = fly_test::mat(fake_cuda_malloc(size_t(M * cols)), et, M, cols, cols);
      fly_tensor b = fly_test::mat(fake_cuda_malloc(size_t(N * cols)), et, N, cols, cols);
      fly_tensor sa = fly_test::mat(fake_cuda_malloc(size_t(M * K / 32)), FLY_E8M0, M, K / 32, K / 32);
      fly_tensor sb = fly_test::mat(fake_cuda_malloc(size_t(N * K / 32)), FLY_E8M0, N, K / 32, K / 32);
      fly_tensor c = fly_test::mat(fake_cuda_malloc(size_t(M * N * 2)), FLY_BF16, M, N, N);
      size_t ws = 0;
      REQUIRE(fly_scaled_gemm_workspace_size(&a, &b, &c, &ws) == FLY_SUCCESS);
      void* wsd = ws ? fake_cuda_malloc(ws) : nullptr;
      const fly_status st = fly_scaled_gemm(&a, &sa, &b, &sb, nullptr, &c, wsd, ws, s);
      INFO("fp4 " << fp4 << " M=" << M << " " << fly_get_last_error());
      REQUIRE(st == FLY_SUCCESS);
      CHECK(last_key_is(fly::keys::scaled_gemm(fp4, M, N, K)));
      // Refused before dispatch (c of another shape): the key stays the last dispatch's.
      fly_tensor bad = fly_test::mat(fake_cuda_malloc(size_t(M * N * 2)), FLY_BF16, M, N + 1, N + 1);
      CHECK(fly_scaled_gemm(&a, &sa, &b, &sb, nullptr, &bad, wsd, ws, s) != FLY_SUCCESS);
      CHECK(last_key_is(fly::keys::scaled_gemm(fp4, M, N, K)));
    }
}

TEST_CASE("fly_last_key: per thread (another thread's launch leaves this thread's key)", "[fake][last_key]") {
  void* s = fake_cuda_stream_create(0);
  fly_tensor a = matrix(FLY_BF16, 64, 256, true), b = matrix(FLY_BF16, 256, 512, true), c = matrix(FLY_BF16, 64, 512, true);
  REQUIRE(fly_gemm(&a, &b, &c, nullptr, nullptr, 0, s) == FLY_SUCCESS);
  const fly::ShapeKey mine = fly::keys::gemm("bf16", "nn", 64, 512, 256);
  CHECK(last_key_is(mine));
  bool other_ok = false;
  std::thread t([&] {
    fly_tensor a2 = matrix(FLY_F16, 8, 128, true), b2 = matrix(FLY_F16, 128, 256, false), c2 = matrix(FLY_F16, 8, 256, true);
    other_ok = fly_gemm(&a2, &b2, &c2, nullptr, nullptr, 0, s) == FLY_SUCCESS &&
               last_key_is(fly::keys::gemm("fp16", "nt", 8, 256, 128));
  });
  t.join();
  CHECK(other_ok);
  CHECK(last_key_is(mine));
}
