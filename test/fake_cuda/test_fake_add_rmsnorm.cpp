// SPDX-License-Identifier: Apache-2.0
// The add_rmsnorm entries behind the device check, on the stand-in driver: the default variants,
// launch geometry and the parameters the kernels receive (no kernel runs): the vector / element
// path choice, the backward's grid bounded by its workspace, the dweight reduction's launch.
#include <algorithm>
#include <cstring>
#include <string>

#include "catch_compat.hpp"
#include "core.hpp"
#include "fake_cuda.h"
#include "flykernels/flykernels.h"
#include "add_rmsnorm/add_rmsnorm_params.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;
using fly_test::vec;

template <class P>
P addnorm_params_of(const fake_cuda_launch* L) {
  P p;
  REQUIRE(L->param_bytes >= sizeof(P));
  std::memcpy(&p, L->params, sizeof(P));
  return p;
}

bool addnorm_built() { return fly::find_variant("add_rmsnorm_fwd_bf16_t128_c2") != nullptr; }

// Threads per CTA of the variant the last dispatch ran.
int64_t last_threads() {
  const fly::Variant* v = fly::find_variant(fly_last_variant());
  return v ? v->get_int("threads") : -1;
}

}  // namespace

TEST_CASE("add_rms_norm forward: variant, launch and parameters", "[fake][add_rmsnorm]") {
  if (!addnorm_built()) { WARN("add_rmsnorm not in this build"); return; }
  void* s = fake_cuda_stream_create(0);
  for (fly_dtype dt : {FLY_F16, FLY_BF16, FLY_F32})
    for (int64_t M : {int64_t(1), int64_t(37), int64_t(100000)})
      for (int64_t N : {int64_t(4096), int64_t(1001)}) {
        const int64_t es = dt == FLY_F32 ? 4 : 2, ld = N + 8;
        void* xd = fake_cuda_malloc(size_t(M * ld * es));
        void* rd = fake_cuda_malloc(size_t(M * N * es));
        void* yd = fake_cuda_malloc(size_t(M * N * es));
        void* hd = fake_cuda_malloc(size_t(M * N * es));
        void* wd = fake_cuda_malloc(size_t(N * es));
        void* sd = fake_cuda_malloc(size_t(M * 4));
        fly_tensor x = mat(xd, dt, M, N, ld), r = mat(rd, dt, M, N, N), y = mat(yd, dt, M, N, N),
                   h = mat(hd, dt, M, N, N), w = vec(wd, dt, N), rs = vec(sd, FLY_F32, M);
        fake_cuda_clear_records();
        const fly_status st = fly_add_rms_norm_fwd(&x, &r, &w, 1e-6, &y, &h, &rs, s);
        INFO(fly_get_last_error() << " " << fake_cuda_last_refusal() << " M " << M << " N " << N);
        REQUIRE(st == FLY_SUCCESS);
        const std::string ran = fly_last_variant();
        CHECK(ran.rfind(std::string("add_rmsnorm_fwd_") + fly::dtype_name(dt) + "_t", 0) == 0);
        // No FP16 or FP32 rows in the embedded database: the family's default for the dtype.
        if (dt == FLY_F16) CHECK(ran == "add_rmsnorm_fwd_fp16_t128_c2");
        if (dt == FLY_F32) CHECK(ran == "add_rmsnorm_fwd_fp32_t256_c8");
        REQUIRE(fake_cuda_launch_count() == 1);
        const fake_cuda_launch* L = fake_cuda_get_launch(0);
        CHECK(std::string(L->kernel) == "add_rmsnorm_fwd");
        CHECK(int64_t(L->block[0]) == last_threads());
        CHECK(L->stream == s);
        CHECK(L->grid[0] >= 1u);
        CHECK(int64_t(L->grid[0]) <= M);
        const auto p = addnorm_params_of<AddRmsNormFwdParams>(L);
        CHECK(p.x == xd);
        CHECK(p.residual == rd);
        CHECK(p.w == wd);
        CHECK(p.y == yd);
        CHECK(p.h == hd);
        CHECK(p.rstd == sd);
        CHECK(p.M == M);
        CHECK(p.N == N);
        CHECK(p.cols == (N + 16 / es - 1) / (16 / es));
        CHECK(p.ldx == (M > 1 ? ld : N));
        CHECK(p.ldr == N);
        CHECK(p.eps == 1e-6f);
        // vector units only where every row of every operand is 16-byte aligned and N whole units
        const bool aligned = N % (16 / es) == 0 && (M == 1 || (ld * es) % 16 == 0);
        CHECK(p.vec == (aligned ? 1 : 0));
      }
}

TEST_CASE("add_rms_norm backward: launches, workspace partials and the dweight reduction",
          "[fake][add_rmsnorm]") {
  if (!addnorm_built()) { WARN("add_rmsnorm not in this build"); return; }
  void* s = fake_cuda_stream_create(0);
  for (bool with_weight : {true, false})
    for (int64_t M : {int64_t(3), int64_t(5000)}) {
      const int64_t N = 2048, es = 2;
      void* dyd = fake_cuda_malloc(size_t(M * N * es));
      void* hd = fake_cuda_malloc(size_t(M * N * es));
      void* dxd = fake_cuda_malloc(size_t(M * N * es));
      void* wd = fake_cuda_malloc(size_t(N * es));
      void* dwd = fake_cuda_malloc(size_t(N * es));
      void* sd = fake_cuda_malloc(size_t(M * 4));
      fly_tensor dy = mat(dyd, FLY_BF16, M, N, N), h = mat(hd, FLY_BF16, M, N, N), dx = mat(dxd, FLY_BF16, M, N, N);
      fly_tensor w = vec(wd, FLY_BF16, N), dw = vec(dwd, FLY_BF16, N), rs = vec(sd, FLY_F32, M);
      size_t bytes = 0;
      REQUIRE(fly_add_rms_norm_bwd_workspace_size(&h, with_weight ? &w : nullptr, &bytes) == FLY_SUCCESS);
      CHECK(bytes == (with_weight ? size_t(std::min<int64_t>(M, 512) * N * 4) : 0u));
      void* ws = bytes ? fake_cuda_malloc(bytes) : nullptr;
      fake_cuda_clear_records();
      const fly_status st = fly_add_rms_norm_bwd(&dy, nullptr, &h, with_weight ? &w : nullptr, &rs, &dx,
                                                 with_weight ? &dw : nullptr, ws, bytes, s);
      INFO(fly_get_last_error() << " " << fake_cuda_last_refusal() << " M " << M);
      REQUIRE(st == FLY_SUCCESS);
      CHECK(std::string(fly_last_variant()).rfind("add_rmsnorm_bwd_bf16_t256_c", 0) == 0);
      REQUIRE(fake_cuda_launch_count() == (with_weight ? 2 : 1));
      const fake_cuda_launch* L = fake_cuda_get_launch(0);
      CHECK(std::string(L->kernel) == "add_rmsnorm_bwd");
      CHECK(int64_t(L->block[0]) == last_threads());
      CHECK(int64_t(L->grid[0]) <= std::min<int64_t>(M, FLY_ADD_RMSNORM_BWD_MAX_CTAS));
      const auto p = addnorm_params_of<AddRmsNormBwdParams>(L);
      CHECK(p.dy == dyd);
      CHECK(p.dh == nullptr);
      CHECK(p.h == hd);
      CHECK(p.dx == dxd);
      CHECK(p.rstd == sd);
      CHECK(p.vec == 1);
      CHECK(p.cols == N / 8);
      CHECK(p.partial == (with_weight ? ws : nullptr));
      if (!with_weight) continue;
      const fake_cuda_launch* R = fake_cuda_get_launch(1);
      CHECK(std::string(R->kernel) == "add_rmsnorm_dw");
      CHECK(R->block[0] == 256u);
      CHECK(R->grid[0] == unsigned(N / 32));
      CHECK(R->stream == s);
      const auto q = addnorm_params_of<AddRmsNormDwParams>(R);
      CHECK(q.partial == ws);
      CHECK(q.dw == dwd);
      CHECK(q.N == N);
      CHECK(q.parts == int32_t(L->grid[0]));  // every partial row the backward wrote, no more
    }
}

TEST_CASE("add_rms_norm dispatch: the database's picks, and a backward takes only a variant that holds its row",
          "[fake][add_rmsnorm]") {
  if (!addnorm_built()) { WARN("add_rmsnorm not in this build"); return; }
  void* s = fake_cuda_stream_create(0);
  struct Case { bool fwd; int64_t M, N; const char* expect; };
  const Case cases[] = {
      {true, 4096, 4096, "add_rmsnorm_fwd_bf16_t128_c2"},   // exact rows (H100 sweep)
      {true, 32, 4096, "add_rmsnorm_fwd_bf16_t512_c2"},
      {true, 4096, 8192, "add_rmsnorm_fwd_bf16_t512_c2"},
      {false, 4096, 4096, "add_rmsnorm_bwd_bf16_t256_c2"},
      {false, 4096, 8192, "add_rmsnorm_bwd_bf16_t256_c4"},
      // nearest row (4096 x 4096) names t256_c2, whose registers hold 4096 elements: not 5120
      {false, 4096, 5120, "add_rmsnorm_bwd_bf16_t256_c4"},
      {false, 2048, 3072, "add_rmsnorm_bwd_bf16_t256_c2"},
  };
  for (const Case& c : cases) {
    const int64_t M = c.M, N = c.N, es = 2;
    void* a = fake_cuda_malloc(size_t(M * N * es));
    void* b = fake_cuda_malloc(size_t(M * N * es));
    void* o = fake_cuda_malloc(size_t(M * N * es));
    void* o2 = fake_cuda_malloc(size_t(M * N * es));
    void* wd = fake_cuda_malloc(size_t(N * es));
    void* dwd = fake_cuda_malloc(size_t(N * es));
    void* sd = fake_cuda_malloc(size_t(M * 4));
    fly_tensor A = mat(a, FLY_BF16, M, N, N), B = mat(b, FLY_BF16, M, N, N), O = mat(o, FLY_BF16, M, N, N),
               O2 = mat(o2, FLY_BF16, M, N, N), w = vec(wd, FLY_BF16, N), dw = vec(dwd, FLY_BF16, N),
               rs = vec(sd, FLY_F32, M);
    fly_status st;
    if (c.fwd) {
      st = fly_add_rms_norm_fwd(&A, &B, &w, 1e-6, &O, &O2, &rs, s);
    } else {
      size_t bytes = 0;
      REQUIRE(fly_add_rms_norm_bwd_workspace_size(&B, &w, &bytes) == FLY_SUCCESS);
      void* ws = fake_cuda_malloc(bytes);
      st = fly_add_rms_norm_bwd(&A, nullptr, &B, &w, &rs, &O, &dw, ws, bytes, s);
    }
    INFO(fly_get_last_error() << " M " << M << " N " << N << " " << fly_last_decision());
    REQUIRE(st == FLY_SUCCESS);
    CHECK(std::string(fly_last_variant()) == c.expect);
  }
}
