// SPDX-License-Identifier: Apache-2.0
// fly_cross_entropy_fwd_bwd behind the device check, on the stand-in driver: the default variants,
// launch geometry and the parameters the kernel receives (no kernel runs): the vector / element
// path choice, the shared-memory stash sized to the row and to the opt-in limit, in place, loss only.
#include <algorithm>
#include <cstring>
#include <string>

#include "catch_compat.hpp"
#include "core.hpp"
#include "fake_cuda.h"
#include "flykernels/flykernels.h"
#include "cross_entropy/cross_entropy_params.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;
using fly_test::vec;

CrossEntropyParams ce_params_of(const fake_cuda_launch* L) {
  CrossEntropyParams p;
  REQUIRE(L->param_bytes >= sizeof(CrossEntropyParams));
  std::memcpy(&p, L->params, sizeof(CrossEntropyParams));
  return p;
}

bool ce_built() { return fly::find_variant("cross_entropy_bf16_t512_c16") != nullptr; }

constexpr int64_t kOptin = 232448;       // the stand-in's per-block opt-in shared memory

}  // namespace

TEST_CASE("cross_entropy: variant, launch and parameters", "[fake][cross_entropy]") {
  if (!ce_built()) { WARN("cross_entropy not in this build"); return; }
  void* s = fake_cuda_stream_create(0);
  for (fly_dtype dt : {FLY_F16, FLY_BF16, FLY_F32})
    for (int64_t M : {int64_t(1), int64_t(37), int64_t(8192)})
      for (int64_t V : {int64_t(32000), int64_t(128256), int64_t(151936), int64_t(1001)})
        for (int mode = 0; mode < 3; ++mode) {  // 0: out of place, 1: in place, 2: loss only
          const int64_t es = dt == FLY_F32 ? 4 : 2, per = 16 / es, ld = V + 8;
          void* xd = fake_cuda_malloc(size_t(M * ld * es));
          void* dd = fake_cuda_malloc(size_t(M * V * es));
          void* ld_ = fake_cuda_malloc(size_t(M * 8));
          void* od = fake_cuda_malloc(size_t(M * 4));
          void* sd = fake_cuda_malloc(size_t(M * 4));
          fly_tensor x = mat(xd, dt, M, V, ld), d = mode == 1 ? x : mat(dd, dt, M, V, V);
          fly_tensor lab = vec(ld_, FLY_I64, M), loss = vec(od, FLY_F32, M), lse = vec(sd, FLY_F32, M);
          fake_cuda_clear_records();
          const fly_status st =
              fly_cross_entropy_fwd_bwd(&x, &lab, -100, 0.5, &loss, &lse, mode == 2 ? nullptr : &d, s);
          INFO(fly_get_last_error() << " " << fake_cuda_last_refusal() << " M " << M << " V " << V << " mode "
                                    << mode);
          REQUIRE(st == FLY_SUCCESS);
          // rows of at most 4096 units: 256 threads (two CTAs per SM), else 512
          const int64_t cols = (V + per - 1) / per, threads = cols <= 4096 ? 256 : 512, kRegUnits = threads * 16;
          CHECK(std::string(fly_last_variant()) ==
                std::string("cross_entropy_") + fly::dtype_name(dt) + (threads == 256 ? "_t256_c16" : "_t512_c16"));
          REQUIRE(fake_cuda_launch_count() == 1);
          const fake_cuda_launch* L = fake_cuda_get_launch(0);
          CHECK(std::string(L->kernel) == "cross_entropy_fwd_bwd");
          CHECK(L->block[0] == unsigned(threads));
          CHECK(L->stream == s);
          CHECK(L->grid[0] >= 1u);
          CHECK(int64_t(L->grid[0]) <= M);
          CHECK(int64_t(L->grid[0]) <= 132 * 8);  // at most the resident CTAs: the kernel walks the rest
          const CrossEntropyParams p = ce_params_of(L);
          CHECK(p.logits == xd);
          CHECK(p.dlogits == (mode == 2 ? nullptr : mode == 1 ? xd : dd));
          CHECK(p.labels == ld_);
          CHECK(p.loss == od);
          CHECK(p.lse == sd);
          CHECK(p.M == M);
          CHECK(p.V == V);
          CHECK(p.cols == (V + per - 1) / per);
          CHECK(p.ldl == (M > 1 ? ld : V));
          CHECK(p.ldd == (mode == 2 ? 0 : mode == 1 ? p.ldl : V));
          CHECK(p.ignore_index == -100);
          CHECK(p.scale == 0.5f);
          // vector units only where every row of both operands is 16-byte aligned and V whole units
          const bool aligned = V % per == 0 && (M == 1 || (ld * es) % 16 == 0);
          CHECK(p.vec == (aligned ? 1 : 0));
          // the stash: units past the registers, bounded by the opt-in limit; none without a gradient
          const int64_t want = mode == 2 ? 0 : std::min(std::max<int64_t>(0, p.cols - kRegUnits), (kOptin - 1024) / 16);
          CHECK(p.smem_units == want);
          CHECK(L->smem == unsigned(want * 16));
          CHECK(int64_t(L->smem) + 1024 <= kOptin);
          if (dt == FLY_BF16 && V == 151936 && mode == 0) CHECK(p.smem_units == p.cols - kRegUnits);  // whole row kept
          if (dt == FLY_F32 && V == 151936 && mode == 0) CHECK(p.smem_units == (kOptin - 1024) / 16);  // capped
        }
}

TEST_CASE("cross_entropy: no rows launches nothing; a driver failure is FLY_ERROR_CUDA", "[fake][cross_entropy]") {
  if (!ce_built()) { WARN("cross_entropy not in this build"); return; }
  void* s = fake_cuda_stream_create(0);
  fly_tensor x = mat(nullptr, FLY_BF16, 0, 1000, 1000), lab = vec(nullptr, FLY_I64, 0), loss = vec(nullptr, FLY_F32, 0);
  fake_cuda_clear_records();
  CHECK(fly_cross_entropy_fwd_bwd(&x, &lab, -100, 1.0, &loss, nullptr, &x, s) == FLY_SUCCESS);
  CHECK(fake_cuda_launch_count() == 0);
  void* xd = fake_cuda_malloc(4 * 1000 * 2);
  void* ld_ = fake_cuda_malloc(4 * 8);
  void* od = fake_cuda_malloc(4 * 4);
  x = mat(xd, FLY_BF16, 4, 1000, 1000);
  lab = vec(ld_, FLY_I64, 4);
  loss = vec(od, FLY_F32, 4);
  fake_cuda_fail_next("cuLaunchKernel", 1);
  const fly_status st = fly_cross_entropy_fwd_bwd(&x, &lab, -100, 1.0, &loss, nullptr, &x, s);
  CHECK(st == FLY_ERROR_CUDA);
  CHECK(std::string(fly_get_last_error()).find("cuLaunch") != std::string::npos);
  fake_cuda_clear_records();
  CHECK(fly_cross_entropy_fwd_bwd(&x, &lab, -100, 1.0, &loss, nullptr, &x, s) == FLY_SUCCESS);
  // a host pointer (no allocation) after the device check: refused, nothing launched
  float host[4];
  fly_tensor hl = vec(host, FLY_F32, 4);
  fake_cuda_clear_records();
  CHECK(fly_cross_entropy_fwd_bwd(&x, &lab, -100, 1.0, &hl, nullptr, &x, s) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(fly_get_last_error()).find("loss") != std::string::npos);
  CHECK(fake_cuda_launch_count() == 0);
}
