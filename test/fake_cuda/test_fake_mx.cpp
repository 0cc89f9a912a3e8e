// SPDX-License-Identifier: Apache-2.0
// The MX entries behind the device check, on the stand-in driver: dispatch to the bundled
// variants, launch geometry and the parameters the kernels receive (no kernel runs).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "catch_compat.hpp"
#include "core.hpp"
#include "fake_cuda.h"
#include "flykernels/flykernels.h"
#include "mx/mx_decode.h"
#include "mx/mx_params.h"
#include "mx/mx_prefill.h"
#include "mx/mx_wgmma_params.h"
#include "mx/mx_widen.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;
using fly_test::vec;

template <class P>
P mx_params_of(const fake_cuda_launch* L) {
  P p;
  REQUIRE(L->param_bytes >= sizeof(P));
  std::memcpy(&p, L->params, sizeof(P));
  return p;
}

const fake_cuda_launch* mx_last_launch() {
  const int n = fake_cuda_launch_count();
  REQUIRE(n > 0);
  return fake_cuda_get_launch(n - 1);
}

// Stand-in device buffers and descriptors of one scaled GEMM: a [M, K] and b [N, K] in the format
// (packed K/2 bytes per row for MXFP4), their E8M0 scales, c [M, N] and bias [N] of `out`.
struct MxOperands {
  int64_t M, N, K, cols;
  void *ad, *bd, *sad, *sbd, *cd, *biasd;
  fly_tensor a, b, sa, sb, c, bias;
  MxOperands(int64_t m, int64_t n, int64_t k, bool fp4, fly_dtype out) : M(m), N(n), K(k), cols(fp4 ? k / 2 : k) {
    const fly_dtype et = fp4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3;
    ad = fake_cuda_malloc(size_t(M * cols));
    bd = fake_cuda_malloc(size_t(N * cols));
    sad = fake_cuda_malloc(size_t(M * K / 32));
    sbd = fake_cuda_malloc(size_t(N * K / 32));
    cd = fake_cuda_malloc(size_t(M * N * 2));
    biasd = fake_cuda_malloc(size_t(N * 2));
    a = mat(ad, et, M, cols, cols);
    b = mat(bd, et, N, cols, cols);
    sa = mat(sad, FLY_E8M0, M, K / 32, K / 32);
    sb = mat(sbd, FLY_E8M0, N, K / 32, K / 32);
    c = mat(cd, out, M, N, N);
    bias = vec(biasd, out, N);
  }
  fly_status run(void* stream, bool with_bias) {
    fake_cuda_clear_records();
    return fly_scaled_gemm(&a, &sa, &b, &sb, with_bias ? &bias : nullptr, &c, nullptr, 0, stream);
  }
  // The fields both GEMM kernels' parameters share (MxGemmParams, mxw::Params), after run(s, true).
  template <class P>
  void check_common(const P& p) const {
    CHECK(p.sa == sad);
    CHECK(p.sb == sbd);
    CHECK(p.c == cd);
    CHECK(p.bias == biasd);
    CHECK(p.M == M);
    CHECK(p.N == N);
    CHECK(p.K == K);
    CHECK(p.ldc == N);
  }
};

}  // namespace

TEST_CASE("mx_quantize: launch configuration and parameters", "[fake][mx]") {
  if (!fly::find_variant("mx_quantize_t256_hw1")) { WARN("mx_quantize not in this build"); return; }
  void* s = fake_cuda_stream_create(0);
  for (fly_dtype dt : {FLY_F16, FLY_BF16, FLY_F32})
    for (int fp4 = 0; fp4 < 2; ++fp4)
      for (int64_t M : {1, 37, 20000}) {
        const int64_t K = 256, es = dt == FLY_F32 ? 4 : 2, qc = fp4 ? K / 2 : K;
        void* xd = fake_cuda_malloc(size_t(M * K * es));
        void* qd = fake_cuda_malloc(size_t(M * qc));
        void* sd = fake_cuda_malloc(size_t(M * K / 32));
        fly_tensor x = mat(xd, dt, M, K, K), q = mat(qd, fp4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3, M, qc, qc),
                   sc = mat(sd, FLY_E8M0, M, K / 32, K / 32);
        fake_cuda_clear_records();
        const fly_status st = fly_mx_quantize(&x, fp4 ? FLY_MX_E2M1 : (FLY_MX_E4M3 | FLY_MX_SCALE_RCEIL), &q, &sc, s);
        INFO(fly_get_last_error() << " " << fake_cuda_last_refusal());
        REQUIRE(st == FLY_SUCCESS);
        REQUIRE(fake_cuda_launch_count() == 1);
        const fake_cuda_launch* L = mx_last_launch();
        CHECK(std::string(L->kernel) == "mx_quantize");
        CHECK(L->block[0] == 256u);
        CHECK(L->stream == s);
        const auto p = mx_params_of<MxQuantizeParams>(L);
        CHECK(p.x == xd);
        CHECK(p.q == qd);
        CHECK(p.scales == sd);
        CHECK(p.M == M);
        CHECK(p.K == K);
        CHECK(p.ldx == K);
        CHECK(p.fp4 == fp4);
        CHECK(p.rceil == (fp4 ? 0 : 1));
        CHECK(p.src == (dt == FLY_F16 ? 0 : dt == FLY_BF16 ? 1 : 2));
        // every 32-element block has a thread (grid-stride loop beyond the cap)
        CHECK(int64_t(L->grid[0]) * 256 >= std::min<int64_t>(M * K / 32, int64_t(L->grid[0]) * 256));
        CHECK(L->grid[0] >= 1u);
        if (M * K / 32 <= 256) CHECK(L->grid[0] == 1u);
      }
}

TEST_CASE("scaled_gemm: launch configuration and parameters", "[fake][mx]") {
  if (!fly::find_variant("mxfp_gemm_m64_n64")) { WARN("mxfp not in this build"); return; }
  void* s = fake_cuda_stream_create(0);
  // The mma.sync kernel's launcher, forced (the DB sends most suite shapes to the wgmma variants,
  // whose launch the next test checks).
  REQUIRE(fly_force_variant("mxfp_gemm_m64_n64") == FLY_SUCCESS);
  struct Shape { int64_t M, N, K; };
  for (Shape sh : {Shape{1, 4096, 4096}, Shape{37, 100, 96}, Shape{130, 257, 1056}})
    for (int fp4 = 0; fp4 < 2; ++fp4)
      for (fly_dtype out : {FLY_F16, FLY_BF16}) {
        MxOperands o(sh.M, sh.N, sh.K, fp4 != 0, out);
        const int64_t M = o.M, N = o.N, K = o.K, cols = o.cols;
        const fly_status st = o.run(s, true);
        INFO("M " << M << " N " << N << " K " << K << " " << fly_get_last_error() << " " << fake_cuda_last_refusal());
        REQUIRE(st == FLY_SUCCESS);
        REQUIRE(fake_cuda_launch_count() == 1);
        const fake_cuda_launch* L = mx_last_launch();
        CHECK(std::string(L->kernel) == "mxfp_gemm");
        CHECK(L->block[0] == 128u);
        CHECK(L->grid[0] == unsigned((N + 63) / 64));
        CHECK(L->grid[1] == unsigned((M + 63) / 64));
        CHECK(L->stream == s);
        const auto p = mx_params_of<MxGemmParams>(L);
        CHECK(p.a == o.ad);
        CHECK(p.b == o.bd);
        o.check_common(p);
        CHECK(p.lda == cols);
        CHECK(p.ldb == cols);
        CHECK(p.fp4 == fp4);
        CHECK(p.out_bf16 == (out == FLY_BF16 ? 1 : 0));
      }
  // a buffer too small for the operand is refused by the pointer check, naming it
  void* small = fake_cuda_malloc(64);
  void* ok = fake_cuda_malloc(1 << 20);
  fly_tensor a = mat(small, FLY_F8_E4M3, 8, 128, 128), b = mat(ok, FLY_F8_E4M3, 64, 128, 128);
  fly_tensor sa = mat(ok, FLY_E8M0, 8, 4, 4), sb = mat(ok, FLY_E8M0, 64, 4, 4), c = mat(ok, FLY_BF16, 8, 64, 64);
  CHECK(fly_scaled_gemm(&a, &sa, &b, &sb, nullptr, &c, nullptr, 0, s) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(fly_test::mentions("a"));
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
}

// The shipped rows (db/sm_90a.sql, op scaled_gemm): a suite shape runs its row's variant, a shape
// far from every row the nearest row's, and the launch is that variant's (384 threads: wgmma).
TEST_CASE("scaled_gemm: the database picks the variant", "[fake][mx]") {
  for (const char* v : {"mxfp_widen_n128", "mxfp_wgmma_n32_f0"})
    if (!fly::find_variant(v)) {
      WARN("the DB's mxfp variants are not in this build");
      return;
    }
  void* s = fake_cuda_stream_create(0);
  struct Case { int64_t M, N, K; int fp4; const char* want; };
  // rows: mxfp8 2048 x 14336 x 4096 -> widen_n128; mxfp4 64 x 8192 x 8192 -> widen_n128;
  // mxfp8 128 x 4096 x 4096 -> n32_f0; mxfp8 3000 x 5000 x 6016 (no row) -> the nearest, widen_n128
  for (Case cs : {Case{2048, 14336, 4096, 0, "mxfp_widen_n128"}, Case{64, 8192, 8192, 1, "mxfp_widen_n128"},
                  Case{128, 4096, 4096, 0, "mxfp_wgmma_n32_f0"}, Case{3000, 5000, 6016, 0, "mxfp_widen_n128"}}) {
    MxOperands o(cs.M, cs.N, cs.K, cs.fp4 != 0, FLY_BF16);
    const fly_status st = o.run(s, false);
    INFO("M " << cs.M << " N " << cs.N << " K " << cs.K << " fp4 " << cs.fp4 << " " << fly_get_last_error());
    REQUIRE(st == FLY_SUCCESS);
    CHECK(std::string(fly_last_variant()) == cs.want);
    REQUIRE(fake_cuda_launch_count() == 1);
    const bool wgmma = std::string(cs.want).rfind("mxfp_wgmma", 0) == 0 || std::string(cs.want).rfind("mxfp_widen", 0) == 0;
    CHECK(mx_last_launch()->block[0] == (wgmma ? 384u : 128u));
    CHECK(std::string(mx_last_launch()->kernel) == (std::string(cs.want).rfind("mxfp_widen", 0) == 0 ? "mxfp_widen" : "mxfp_wgmma"));
  }
}

// The wgmma variants (not in the defaults: present in -DFLY_ALL_VARIANTS=ON builds), forced: the
// persistent grid, 384 threads, the planned shared memory, and the TMA maps of both operands
// (MXFP8: K bytes x rows, box {128, tile rows}, 128B swizzle; MXFP4: K/2 bytes, box {64, ..}, none).
TEST_CASE("scaled_gemm: the wgmma variants' launch, maps and parameters", "[fake][mx]") {
  void* s = fake_cuda_stream_create(0);
  int seen = 0;
  for (int bn : {32, 64, 128})
  for (int fold : {0, 1}) {
    const std::string name = "mxfp_wgmma_n" + std::to_string(bn) + "_f" + std::to_string(fold);
    if (!fly::find_variant(name)) continue;
    ++seen;
    struct Shape { int64_t M, N, K; };
    for (Shape sh : {Shape{1, 4096, 4096}, Shape{37, 100, 96}, Shape{1030, 2570, 1056}})
      for (int fp4 = 0; fp4 < 2; ++fp4) {
        MxOperands o(sh.M, sh.N, sh.K, fp4 != 0, FLY_BF16);
        const int64_t M = o.M, N = o.N, K = o.K, cols = o.cols;
        REQUIRE(fly_force_variant(name.c_str()) == FLY_SUCCESS);
        const fly_status st = o.run(s, true);
        fly_force_variant(nullptr);
        INFO(name << " M " << M << " N " << N << " K " << K << " fp4 " << fp4 << " " << fly_get_last_error() << " "
                  << fake_cuda_last_refusal());
        REQUIRE(st == FLY_SUCCESS);
        REQUIRE(fake_cuda_launch_count() == 1);
        const fake_cuda_launch* L = mx_last_launch();
        CHECK(std::string(L->kernel) == "mxfp_wgmma");
        CHECK(L->block[0] == unsigned(fly::mxw::kThreads));
        CHECK(L->smem == unsigned(fly::mxw::smem_bytes(bn, fold != 0)));
        const int64_t tiles_m = (M + 127) / 128, tiles_n = (N + bn - 1) / bn;
        CHECK(L->grid[0] == unsigned(std::min<int64_t>(tiles_m * tiles_n, 132)));
        CHECK(L->grid[1] == 1u);
        const auto p = mx_params_of<fly::mxw::Params>(L);
        o.check_common(p);
        CHECK(p.tiles_m == tiles_m);
        CHECK(p.tiles_n == tiles_n);
        CHECK(p.strip_m >= 1);
        CHECK(p.fp4 == fp4);
        CHECK(p.out_bf16 == 1);
        const int ia = fake_cuda_tensor_map_index(&p.tm_a), ib = fake_cuda_tensor_map_index(&p.tm_b);
        REQUIRE(ia >= 0);
        REQUIRE(ib >= 0);
        const fake_cuda_tensor_map* ma = fake_cuda_get_tensor_map(ia);
        const fake_cuda_tensor_map* mb = fake_cuda_get_tensor_map(ib);
        CHECK(ma->address == uint64_t(reinterpret_cast<uintptr_t>(o.ad)));
        CHECK(mb->address == uint64_t(reinterpret_cast<uintptr_t>(o.bd)));
        CHECK(ma->rank == 2u);
        CHECK(ma->dims[0] == uint64_t(cols));
        CHECK(ma->dims[1] == uint64_t(M));
        CHECK(mb->dims[0] == uint64_t(cols));
        CHECK(mb->dims[1] == uint64_t(N));
        CHECK(ma->strides[0] == uint64_t(cols));
        CHECK(ma->box[0] == (fp4 ? 64u : 128u));
        CHECK(ma->box[1] == 128u);
        CHECK(mb->box[1] == unsigned(bn));
        CHECK(ma->swizzle == int(fp4 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B));
        CHECK(mb->swizzle == ma->swizzle);
      }
  }
  if (!seen) WARN("no mxfp_wgmma variant in this build");
}

// The BF16-widening variant (kernels/mx/mxfp_widen.cu), forced: its own kernel and shared-memory
// plan, the wgmma design's parameters and TMA maps (B boxes of 128 rows), one CTA per tile up to
// the SMs, no split launch and no workspace use.
TEST_CASE("scaled_gemm: the widening variant's launch, maps and parameters", "[fake][mx]") {
  const char* name = "mxfp_widen_n128";
  if (!fly::find_variant(name)) {
    WARN("no " << name << " in this build");
    return;
  }
  void* s = fake_cuda_stream_create(0);
  struct Shape { int64_t M, N, K; };
  for (Shape sh : {Shape{1, 4096, 4096}, Shape{200, 320, 4096}, Shape{1030, 2570, 1056}})
    for (int fp4 = 0; fp4 < 2; ++fp4) {
      MxOperands o(sh.M, sh.N, sh.K, fp4 != 0, FLY_F16);
      REQUIRE(fly_force_variant(name) == FLY_SUCCESS);
      const fly_status st = o.run(s, true);
      fly_force_variant(nullptr);
      INFO(name << " M " << o.M << " N " << o.N << " K " << o.K << " fp4 " << fp4 << " " << fly_get_last_error() << " "
                << fake_cuda_last_refusal());
      REQUIRE(st == FLY_SUCCESS);
      REQUIRE(fake_cuda_launch_count() == 1);
      const fake_cuda_launch* L = mx_last_launch();
      CHECK(std::string(L->kernel) == "mxfp_widen");
      CHECK(L->block[0] == unsigned(fly::mxw::kThreads));
      CHECK(L->smem == unsigned(fly::mxw::widen::smem_bytes()));
      const int64_t tiles = ((o.M + 127) / 128) * ((o.N + 127) / 128);
      CHECK(L->grid[0] == unsigned(std::min<int64_t>(tiles, 132)));
      const auto p = mx_params_of<fly::mxw::Params>(L);
      o.check_common(p);
      CHECK(p.fp4 == fp4);
      CHECK(p.out_bf16 == 0);
      const fake_cuda_tensor_map* mb = fake_cuda_get_tensor_map(fake_cuda_tensor_map_index(&p.tm_b));
      REQUIRE(mb != nullptr);
      CHECK(mb->box[1] == unsigned(fly::mxw::widen::kBN));
      CHECK(mb->box[0] == (fp4 ? 64u : 128u));
    }
}

// Split-K variants (FLY_ALL_VARIANTS builds): the workspace query's formula, the split launch
// (GEMM with splits and ws, then mxfp_splitk_reduce) and the NULL / too-small workspace fallback.
TEST_CASE("scaled_gemm: split-K variants' workspace, launches and fallback", "[fake][mx][splitk]") {
  // the FP8 design's and the widening design's split variants: the same launch protocol
  for (const char* name : {"mxfp_wgmma_n128_f0_p2_s4", "mxfp_widen_n128_s4"}) {
  const bool widen = std::string(name).rfind("mxfp_widen", 0) == 0;
  if (!fly::find_variant(name)) { WARN("no split-K variant " << name << " in this build"); continue; }
  INFO(name);
  void* s = fake_cuda_stream_create(0);
  MxOperands o(32, 4096, 4096, false, FLY_BF16);
  size_t need = 0;
  REQUIRE(fly_scaled_gemm_workspace_size(&o.a, &o.b, &o.c, &need) == FLY_SUCCESS);
  CHECK(need >= size_t(4) * 32 * 4096 * 4);  // s4 at BN 128: 32 tiles, S = 4
  CHECK(fly_scaled_gemm_workspace_size(&o.a, &o.b, &o.c, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  void* ws = fake_cuda_malloc(need);
  REQUIRE(fly_force_variant(name) == FLY_SUCCESS);
  fake_cuda_clear_records();
  const fly_status st = fly_scaled_gemm(&o.a, &o.sa, &o.b, &o.sb, &o.bias, &o.c, ws, need, s);
  INFO(fly_get_last_error() << " " << fake_cuda_last_refusal());
  CHECK(st == FLY_SUCCESS);
  REQUIRE(fake_cuda_launch_count() == 2);
  const fake_cuda_launch* G = fake_cuda_get_launch(0);
  CHECK(std::string(G->kernel) == (widen ? "mxfp_widen" : "mxfp_wgmma"));
  CHECK(G->grid[0] == 128u);
  if (widen) CHECK(G->smem == unsigned(fly::mxw::widen::smem_bytes()));
  const auto p = mx_params_of<fly::mxw::SplitParams>(G);
  CHECK(p.splits == 4);
  CHECK(static_cast<void*>(p.ws) == ws);
  const fake_cuda_launch* R = fake_cuda_get_launch(1);
  CHECK(std::string(R->kernel) == "mxfp_splitk_reduce");
  const auto r = mx_params_of<fly::mxw::SplitReduceParams>(R);
  CHECK(r.splits == 4);
  CHECK(r.c == o.cd);
  CHECK(r.bias == o.biasd);
  // NULL and too small a workspace: one unsplit launch
  for (size_t bytes : {size_t(0), need / 2}) {
    fake_cuda_clear_records();
    CHECK(fly_scaled_gemm(&o.a, &o.sa, &o.b, &o.sb, nullptr, &o.c, bytes ? ws : nullptr, bytes, s) == FLY_SUCCESS);
    REQUIRE(fake_cuda_launch_count() == 1);
    CHECK(mx_params_of<fly::mxw::SplitParams>(mx_last_launch()).splits == 1);
    CHECK(mx_last_launch()->grid[0] == 32u);
  }
  fly_force_variant(nullptr);
  }
}

// The shipped dispatch at a decode key whose DB row names a split-K winner (db/sm_90a.sql:
// N = K = 4096, M = 32: mxfp8 -> mxfp_wgmma_n128_f0_p2_s4, mxfp4 -> mxfp_widen_n32_t1_s4, both with
// the runner-up mxfp_wgmma_n32_f0): with the queried workspace the split launch and its reduction;
// with none or too little, the row's runner-up (unsplit, one launch), not the split variant run unsplit.
TEST_CASE("scaled_gemm: a split-K row without its workspace runs the row's runner-up", "[fake][mx][splitk]") {
  const char* unsplit = "mxfp_wgmma_n32_f0";
  void* s = fake_cuda_stream_create(0);
  for (bool fp4 : {false, true}) {
    const char* split = fp4 ? "mxfp_widen_n32_t1_s4" : "mxfp_wgmma_n128_f0_p2_s4";
    if (!fly::find_variant(split) || !fly::find_variant(unsplit)) {
      WARN("the decode rows' variants are not both bundled in this build");
      continue;
    }
    MxOperands o(32, 4096, 4096, fp4, FLY_BF16);
    size_t need = 0;
    REQUIRE(fly_scaled_gemm_workspace_size(&o.a, &o.b, &o.c, &need) == FLY_SUCCESS);
    REQUIRE(need >= size_t(4) * 32 * 4096 * 4);
    void* ws = fake_cuda_malloc(need);
    fake_cuda_clear_records();
    REQUIRE(fly_scaled_gemm(&o.a, &o.sa, &o.b, &o.sb, nullptr, &o.c, ws, need, s) == FLY_SUCCESS);
    CHECK(std::string(fly_last_variant()) == split);
    CHECK(std::string(fly_last_decision()) == "db:exact");
    REQUIRE(fake_cuda_launch_count() == 2);
    CHECK(mx_params_of<fly::mxw::SplitParams>(fake_cuda_get_launch(0)).splits == 4);
    CHECK(std::string(fake_cuda_get_launch(1)->kernel) == "mxfp_splitk_reduce");
    for (size_t bytes : {size_t(0), need / 2}) {
      INFO("fp4 " << fp4 << ", workspace bytes " << bytes);
      fake_cuda_clear_records();
      REQUIRE(fly_scaled_gemm(&o.a, &o.sa, &o.b, &o.sb, nullptr, &o.c, bytes ? ws : nullptr, bytes, s) == FLY_SUCCESS);
      CHECK(std::string(fly_last_variant()) == unsplit);
      CHECK(std::string(fly_last_decision()) == "db:exact:runner-up");
      CHECK(fake_cuda_launch_count() == 1);
      CHECK(std::string(mx_last_launch()->kernel) == "mxfp_wgmma");
    }
    // the decision cache keeps the two calls apart: with the workspace again, the split winner
    fake_cuda_clear_records();
    REQUIRE(fly_scaled_gemm(&o.a, &o.sa, &o.b, &o.sb, nullptr, &o.c, ws, need, s) == FLY_SUCCESS);
    CHECK(std::string(fly_last_variant()) == split);
    CHECK(fake_cuda_launch_count() == 2);
  }
}

// The workspace's checks (any variant: they come before dispatch) and the split count per shape:
// capped by the stage count, 1 for one stage, the reduction's grid and output dtype; an unsplit
// variant ignores a workspace.
TEST_CASE("scaled_gemm: workspace outside device memory rejected; split count per shape", "[fake][mx][splitk]") {
  void* s = fake_cuda_stream_create(0);
  MxOperands o(32, 4096, 4096, false, FLY_F16);
  void* dev = fake_cuda_malloc(1 << 20);
  // host memory, 256-byte aligned: not device memory
  std::unique_ptr<void, void (*)(void*)> host(std::aligned_alloc(256, 1 << 16), std::free);
  CHECK(fly_scaled_gemm(&o.a, &o.sa, &o.b, &o.sb, nullptr, &o.c, host.get(), 1 << 16, s) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(fly_get_last_error()).find("workspace: ") != std::string::npos);
  CHECK(std::string(fly_get_last_error()).find("not device memory") != std::string::npos);
  // inside an allocation but running past its end
  CHECK(fly_scaled_gemm(&o.a, &o.sa, &o.b, &o.sb, nullptr, &o.c, static_cast<char*>(dev) + 256, 1 << 20, s) ==
        FLY_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(fly_get_last_error()).find("workspace: ") != std::string::npos);
  CHECK(std::string(fly_get_last_error()).find("allocation ends") != std::string::npos);
  // misaligned inside an allocation
  CHECK(fly_scaled_gemm(&o.a, &o.sa, &o.b, &o.sb, nullptr, &o.c, static_cast<char*>(dev) + 64, 4096, s) ==
        FLY_ERROR_MISALIGNED);
  CHECK(std::string(fly_get_last_error()).find("256-byte aligned") != std::string::npos);
  fake_cuda_clear_records();
  CHECK(fake_cuda_launch_count() == 0);  // none of them launched

  // an unsplit BN 64 wgmma variant (the default build has some) takes the Params block and one
  // launch, whatever the workspace
  const char* plain_name = nullptr;
  for (const char* n : {"mxfp_wgmma_n64_f0_p2", "mxfp_wgmma_n64_f0", "mxfp_wgmma_n64_f1"})
    if (!plain_name && fly::find_variant(n)) plain_name = n;
  if (plain_name) {
    MxOperands q(32, 1024, 4096, false, FLY_BF16);
    void* ws = fake_cuda_malloc(1 << 22);
    REQUIRE(fly_force_variant(plain_name) == FLY_SUCCESS);
    fake_cuda_clear_records();
    CHECK(fly_scaled_gemm(&q.a, &q.sa, &q.b, &q.sb, nullptr, &q.c, ws, 1 << 22, s) == FLY_SUCCESS);
    fly_force_variant(nullptr);
    CHECK(fake_cuda_launch_count() == 1);
    CHECK(mx_last_launch()->grid[0] == 16u);
    CHECK(mx_last_launch()->param_bytes == sizeof(fly::mxw::Params));
  } else {
    WARN("no unsplit BN 64 mxfp_wgmma variant in this build");
  }

  const char* split_name = "mxfp_wgmma_n64_f0_p2_s4";
  if (!fly::find_variant(split_name)) {
    WARN("no " << split_name << " in this build");
    return;
  }
  struct Shape { int64_t M, N, K; int splits; };
  // BN 64: M 32, N 1024: 16 tiles, S = 4; K = 256: 2 stages, S = 2; K = 128: one stage, S = 1;
  // N 4096: 64 tiles, 132 / 64 = 2; N 8448: 132 tiles, S = 1; M 130, N 300, K 288: 2 x 5 tiles, 3 stages, S = 3
  for (Shape sh : {Shape{32, 1024, 4096, 4}, Shape{32, 1024, 256, 2}, Shape{32, 1024, 128, 1}, Shape{32, 4096, 4096, 2},
                   Shape{32, 8448, 1024, 1}, Shape{130, 300, 288, 3}})
    for (fly_dtype out : {FLY_F16, FLY_BF16}) {
      MxOperands q(sh.M, sh.N, sh.K, false, out);
      size_t need = 0;
      REQUIRE(fly_scaled_gemm_workspace_size(&q.a, &q.b, &q.c, &need) == FLY_SUCCESS);
      const size_t mine = sh.splits > 1 ? size_t((int64_t(sh.splits) * sh.M * sh.N * 4 + 255) / 256 * 256) : 0;
      CHECK(need >= mine);  // the largest over the bundled split variants
      // a workspace larger than needed, inside a larger allocation
      void* ws = fake_cuda_malloc(need + 4096);
      REQUIRE(fly_force_variant(split_name) == FLY_SUCCESS);
      fake_cuda_clear_records();
      const fly_status st = fly_scaled_gemm(&q.a, &q.sa, &q.b, &q.sb, &q.bias, &q.c, need ? ws : nullptr,
                                            need ? need + 4096 : 0, s);
      fly_force_variant(nullptr);
      INFO("M " << sh.M << " N " << sh.N << " K " << sh.K << " " << fly_get_last_error() << " " << fake_cuda_last_refusal());
      REQUIRE(st == FLY_SUCCESS);
      const int64_t tiles = ((sh.M + 127) / 128) * ((sh.N + 63) / 64);
      const fake_cuda_launch* G = fake_cuda_get_launch(0);
      const auto p = mx_params_of<fly::mxw::SplitParams>(G);
      CHECK(p.splits == sh.splits);
      CHECK(G->grid[0] == unsigned(std::min<int64_t>(tiles * sh.splits, 132)));
      CHECK(p.out_bf16 == (out == FLY_BF16 ? 1 : 0));
      if (sh.splits == 1) {
        CHECK(fake_cuda_launch_count() == 1);
        CHECK(p.ws == nullptr);
        CHECK(p.bias == q.biasd);  // the unsplit epilogue adds it
        continue;
      }
      REQUIRE(fake_cuda_launch_count() == 2);
      CHECK(static_cast<void*>(p.ws) == ws);
      const fake_cuda_launch* R = fake_cuda_get_launch(1);
      CHECK(std::string(R->kernel) == "mxfp_splitk_reduce");
      CHECK(R->block[0] == unsigned(fly::mxw::kReduceThreads));
      CHECK(R->grid[0] == unsigned(std::min<int64_t>((sh.M * ((sh.N + 1) / 2) + 255) / 256, 132 * 8)));
      CHECK(R->stream == G->stream);  // stream-ordered after the GEMM
      const auto r = mx_params_of<fly::mxw::SplitReduceParams>(R);
      CHECK(r.ws == p.ws);
      CHECK(r.splits == sh.splits);
      CHECK(r.M == sh.M);
      CHECK(r.N == sh.N);
      CHECK(r.ldc == sh.N);
      CHECK(r.c == q.cd);
      CHECK(r.bias == q.biasd);
      CHECK(r.out_bf16 == (out == FLY_BF16 ? 1 : 0));
    }
}

// The widening design's swapped decode variants (`_t1`): B is the kernel's A (TMA map over N rows,
// 128-row boxes, B's scales), A its B (M rows, BN-row boxes), the kernel's M / N are N / M, the grid
// covers N / 128 x ceil(M / BN) tiles times the splits, and the reduction gets C's own shape.
TEST_CASE("scaled_gemm: swapped widening variants tile N x M and reduce into C's shape", "[fake][mx][splitk]") {
  for (const char* name : {"mxfp_widen_n32_t1_s4", "mxfp_widen_n64_t1_s1"}) {
    if (!fly::find_variant(name)) { WARN("no " << name << " in this build"); continue; }
    INFO(name);
    const bool split = std::string(name).find("_s4") != std::string::npos;
    const int bn = std::string(name).find("_n32") != std::string::npos ? 32 : 64;
    void* s = fake_cuda_stream_create(0);
    for (int fp4 = 0; fp4 < 2; ++fp4) {
      MxOperands o(32, 4096, 4096, fp4 != 0, FLY_BF16);
      size_t need = 0;
      REQUIRE(fly_scaled_gemm_workspace_size(&o.a, &o.b, &o.c, &need) == FLY_SUCCESS);
      void* ws = need ? fake_cuda_malloc(need) : nullptr;
      REQUIRE(fly_force_variant(name) == FLY_SUCCESS);
      fake_cuda_clear_records();
      const fly_status st = fly_scaled_gemm(&o.a, &o.sa, &o.b, &o.sb, &o.bias, &o.c, ws, need, s);
      fly_force_variant(nullptr);
      INFO(fly_get_last_error() << " " << fake_cuda_last_refusal());
      REQUIRE(st == FLY_SUCCESS);
      REQUIRE(fake_cuda_launch_count() == (split ? 2 : 1));
      const fake_cuda_launch* G = fake_cuda_get_launch(0);
      CHECK(std::string(G->kernel) == "mxfp_widen");
      CHECK(G->smem == unsigned(fly::mxw::widen::smem_bytes_for(bn)));
      CHECK(G->grid[0] == (split ? 128u : 32u));  // 4096 / 128 tiles of N, one of M, x 4 splits
      const auto p = mx_params_of<fly::mxw::Params>(G);
      CHECK(p.M == 4096);
      CHECK(p.N == 32);
      CHECK(p.sa == o.sbd);
      CHECK(p.sb == o.sad);
      CHECK(p.c == o.cd);
      CHECK(p.ldc == 4096);
      CHECK(p.bias == o.biasd);
      const fake_cuda_tensor_map* ma = fake_cuda_get_tensor_map(fake_cuda_tensor_map_index(&p.tm_a));
      const fake_cuda_tensor_map* mb = fake_cuda_get_tensor_map(fake_cuda_tensor_map_index(&p.tm_b));
      REQUIRE(ma != nullptr);
      REQUIRE(mb != nullptr);
      CHECK(ma->address == reinterpret_cast<uint64_t>(o.bd));
      CHECK(mb->address == reinterpret_cast<uint64_t>(o.ad));
      CHECK(ma->box[1] == 128u);
      CHECK(mb->box[1] == unsigned(bn));
      if (split) {
        CHECK(mx_params_of<fly::mxw::SplitParams>(G).splits == 4);
        const auto r = mx_params_of<fly::mxw::SplitReduceParams>(fake_cuda_get_launch(1));
        CHECK(r.M == 32);
        CHECK(r.N == 4096);
        CHECK(r.c == o.cd);
      }
    }
  }
}

// Stand-in device buffers and descriptors of one weight-only call: a [M, K] and c [M, N] in `act`,
// the MX weights b [N, K] (packed K/2 bytes per row for MXFP4), their scales and bias [N].
struct WeightOnlyOperands {
  int64_t cols;
  void *ad, *bd, *sd, *cd, *biasd;
  fly_tensor a, b, sb, c, bias;
  WeightOnlyOperands(fly_dtype act, bool fp4, int64_t M, int64_t N, int64_t K) : cols(fp4 ? K / 2 : K) {
    ad = fake_cuda_malloc(size_t(M * K * 2));
    bd = fake_cuda_malloc(size_t(N * cols));
    sd = fake_cuda_malloc(size_t(N * K / 32));
    cd = fake_cuda_malloc(size_t(M * N * 2));
    biasd = fake_cuda_malloc(size_t(N * 2));
    a = mat(ad, act, M, K, K);
    b = mat(bd, fp4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3, N, cols, cols);
    sb = mat(sd, FLY_E8M0, N, K / 32, K / 32);
    c = mat(cd, act, M, N, N);
    bias = vec(biasd, act, N);
  }
  fly_status run(void* stream) { return fly_scaled_gemm(&a, nullptr, &b, &sb, &bias, &c, nullptr, 0, stream); }
};

// The weight-only mode (fly_scaled_gemm with BF16/FP16 a and scale_a NULL; kernels/mx/mx_decode.cu):
// the variant per M class (the wide kernel for BF16 at M <= 16), the launch (grid = tiles x cluster, the cluster split of
// K, threads, shared memory) and the parameters and activation map the kernel receives.
TEST_CASE("scaled_gemm weight-only: dispatch, launch, maps and parameters", "[fake][mx][mx_decode]") {
  if (!fly::find_variant("mx_decode_bf16_e4m3_w8_r32_m1_d4")) {
    WARN("mx_decode not in this build");
    return;
  }
  void* s = fake_cuda_stream_create(0);
  struct Shape {
    int64_t M, N, K;
  };
  int launched = 0;
  for (fly_dtype act : {FLY_BF16, FLY_F16})
    for (int fp4 = 0; fp4 < 2; ++fp4)
      for (Shape sh : {Shape{1, 4096, 4096}, Shape{8, 14336, 4096}, Shape{9, 300, 96}, Shape{16, 4096, 14336},
                       Shape{17, 28672, 8192}, Shape{32, 6144, 4096}, Shape{33, 4096, 4096}, Shape{64, 64, 32}}) {
        const int64_t M = sh.M, N = sh.N, K = sh.K;
        WeightOnlyOperands o(act, fp4 != 0, M, N, K);
        const int64_t cols = o.cols;
        void *const ad = o.ad, *const bd = o.bd, *const sd = o.sd, *const cd = o.cd, *const biasd = o.biasd;
        fake_cuda_clear_records();
        const fly_status st = o.run(s);
        INFO("act " << int(act) << " fp4 " << fp4 << " M " << M << " N " << N << " K " << K << " "
                    << fly_get_last_error() << " " << fake_cuda_last_refusal());
        REQUIRE(st == FLY_SUCCESS);
        // FP16, or M > 16: the quad-block kernel by the default rule (the smallest activation tile
        // holding M); BF16 at M <= 16: a wide variant (the shipped rows' pick or the default rule's)
        const std::string act_s = act == FLY_BF16 ? "bf16" : "fp16", fmt = fp4 ? "e2m1" : "e4m3";
        const std::string name = fly_last_variant();
        const char *fam = nullptr, *params = nullptr;
        REQUIRE(fly_variant_info(name.c_str(), &fam, &params) == FLY_SUCCESS);
        const std::string ps = std::string(";") + params + ";";
        auto axis = [&](const char* key) {
          const size_t at = ps.find(std::string(";") + key + "=");
          REQUIRE(at != std::string::npos);
          const size_t b = at + std::strlen(key) + 2;
          return ps.substr(b, ps.find(';', b) - b);
        };
        CHECK(std::string(fam) == "mx_decode");
        CHECK(axis("act") == act_s);
        CHECK(axis("fmt") == fmt);
        const int mt = std::stoi(axis("mt")), rpw = std::stoi(axis("rpw")), nw = std::stoi(axis("nw"));
        const bool wide = act == FLY_BF16 && M <= 16;
        if (wide) {
          CHECK(name.rfind("mx_decode_wide", 0) == 0);
          CHECK(8 * mt >= M);
        } else {
          const int want_mt = M <= 8 ? 1 : M <= 16 ? 2 : M <= 32 ? 4 : 8;
          const int want_rpw = (M <= 16 || (fp4 && M <= 32)) ? 32 : 16;
          const int depth = fp4 ? (want_mt == 4 ? 4 : 8) : (M <= 16 ? 4 : 6);
          CHECK(name == "mx_decode_" + act_s + "_" + fmt + "_w8_r" + std::to_string(want_rpw) + "_m" +
                            std::to_string(want_mt) + "_d" + std::to_string(depth));
        }
        REQUIRE(fake_cuda_launch_count() == 1);
        const fake_cuda_launch* L = mx_last_launch();
        CHECK(std::string(L->kernel) == "fly_mx_decode_sm90");
        fly::mxd::Shape v;
        v.nw = nw;
        v.rpw = rpw;
        v.mt = mt;
        v.fp4 = fp4 != 0;
        v.wide = wide;
        v.nsub = wide && axis("ld") == "wide2" ? 2 : 1;
        const fly::mxd::Launch plan = fly::mxd::plan(N, K, v, 132);
        CHECK(L->grid[0] == plan.grid);
        CHECK(L->cluster[0] == plan.cluster);
        CHECK(L->block[0] == unsigned(32 * nw));
        CHECK(L->smem == plan.smem);
        const int64_t tiles = (N + nw * rpw - 1) / (nw * rpw), sk = fly::mxd::stage_k(v.wide, v.nsub);
        CHECK(int64_t(L->grid[0]) == tiles * plan.cl);
        CHECK(int64_t(L->grid[0]) <= std::max<int64_t>(tiles, 132));  // one wave unless the tiles alone exceed it
        CHECK(plan.cl * plan.kst_per_cta >= (K + sk - 1) / sk);
        CHECK((plan.cl - 1) * plan.kst_per_cta < (K + sk - 1) / sk);  // no CTA without stages
        const auto p = mx_params_of<fly::mxd::DecodeParams>(L);
        CHECK(p.w == bd);
        CHECK(p.sw == sd);
        CHECK(p.c == cd);
        CHECK(p.bias == biasd);
        CHECK(p.M == M);
        CHECK(p.N == N);
        CHECK(p.K == K);
        CHECK(p.ldw == cols);
        CHECK(p.ldc == N);
        CHECK(p.a == ad);  // the wide kernel's exact fallback reads A directly
        CHECK(p.lda == K);
        CHECK(p.cl == plan.cl);
        CHECK(p.kst_per_cta == plan.kst_per_cta);
        const int ia = fake_cuda_tensor_map_index(&p.tm_a);
        REQUIRE(ia >= 0);
        const fake_cuda_tensor_map* ma = fake_cuda_get_tensor_map(ia);
        CHECK(ma->address == uint64_t(reinterpret_cast<uintptr_t>(ad)));
        CHECK(ma->rank == 2u);
        CHECK(ma->dims[0] == uint64_t(K));
        CHECK(ma->dims[1] == uint64_t(M));
        CHECK(ma->box[0] == 64u);
        CHECK(ma->box[1] == unsigned(8 * mt));
        CHECK(ma->swizzle == int(CU_TENSOR_MAP_SWIZZLE_128B));
        CHECK(ma->dtype == int(act == FLY_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16));
        ++launched;
      }
  CHECK(launched == 2 * 2 * 8);
  // a forced variant whose activation tile is smaller than M: unsupported, by name
  REQUIRE(fly_force_variant("mx_decode_bf16_e4m3_w8_r32_m1_d4") == FLY_SUCCESS);
  {
    const int64_t M = 9, N = 64, K = 64;
    void* ad = fake_cuda_malloc(size_t(M * K * 2));
    void* bd = fake_cuda_malloc(size_t(N * K));
    void* sd = fake_cuda_malloc(size_t(N * K / 32));
    void* cd = fake_cuda_malloc(size_t(M * N * 2));
    const fly_tensor a = mat(ad, FLY_BF16, M, K, K), b = mat(bd, FLY_F8_E4M3, N, K, K),
                     sb = mat(sd, FLY_E8M0, N, K / 32, K / 32), c = mat(cd, FLY_BF16, M, N, N);
    CHECK(fly_scaled_gemm(&a, nullptr, &b, &sb, nullptr, &c, nullptr, 0, s) == FLY_ERROR_UNSUPPORTED);
    CHECK(std::string(fly_get_last_error()).find("mx_decode_bf16_e4m3_w8_r32_m1_d4") != std::string::npos);
  }
  fly_force_variant(nullptr);
}

// The weight-only prefill kernel (kernels/mx/mx_prefill.cu, variants mx_decode_prefill_*): not
// dispatched unforced until verified on a GPU (src/ops/mx.cpp kPrefillDispatch: then UNSUPPORTED
// with the reason), a forced variant's launch (persistent grid, or split-K clusters for few tiles),
// shared memory, parameters and the activation map.
TEST_CASE("scaled_gemm weight-only prefill: gate, launch, maps and parameters", "[fake][mx][mx_decode]") {
  if (!fly::find_variant("mx_decode_prefill_bf16_e4m3_n256_s3_r4")) {
    WARN("mx_decode prefill variants not in this build");
    return;
  }
  void* s = fake_cuda_stream_create(0);
  struct Shape {
    int64_t M, N, K;
  };
  int launched = 0;
  for (const char* vname : {"mx_decode_prefill_bf16_e4m3_n256_s3_r4", "mx_decode_prefill_bf16_e2m1_n128_s4_r4"})
    for (Shape sh : {Shape{300, 4096, 4096}, Shape{4096, 14336, 4096}, Shape{256, 4096, 14336}, Shape{65, 300, 1056},
                     Shape{129, 17, 32}, Shape{16, 6144, 4096}}) {
      const bool fp4 = std::strstr(vname, "e2m1") != nullptr;
      const int bn = std::strstr(vname, "_n256_") ? 256 : 128, stages = fp4 ? 4 : 3, rd = 4;
      const int64_t M = sh.M, N = sh.N, K = sh.K;
      WeightOnlyOperands o(FLY_BF16, fp4, M, N, K);
      const int64_t cols = o.cols;
      void *const ad = o.ad, *const bd = o.bd, *const sd = o.sd, *const cd = o.cd, *const biasd = o.biasd;
      INFO(vname << " M " << M << " N " << N << " K " << K);
      if (M > 64) {  // unforced: the gate (or, once on, the prefill kernel)
        fake_cuda_clear_records();
        const fly_status st = o.run(s);
        if (st != FLY_SUCCESS) {
          CHECK(st == FLY_ERROR_UNSUPPORTED);
          CHECK(std::string(fly_get_last_error()).find("only when forced") != std::string::npos);
          CHECK(fake_cuda_launch_count() == 0);
        }
      }
      REQUIRE(fly_force_variant(vname) == FLY_SUCCESS);
      fake_cuda_clear_records();
      const fly_status st = o.run(s);
      INFO(fly_get_last_error() << " " << fake_cuda_last_refusal());
      REQUIRE(st == FLY_SUCCESS);
      REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
      CHECK(std::string(fly_last_variant()) == vname);
      REQUIRE(fake_cuda_launch_count() == 1);
      const fake_cuda_launch* L = mx_last_launch();
      CHECK(std::string(L->kernel) == "fly_mx_prefill_sm90");
      CHECK(L->block[0] == 384u);
      CHECK(L->smem == unsigned(fly::mxp::smem_bytes(bn, stages, rd, fp4)));
      CHECK(L->stream == s);
      const int64_t tiles_m = (M + 127) / 128, tiles_n = (N + bn - 1) / bn, tiles = tiles_m * tiles_n;
      const int64_t kb_total = (K + 63) / 64;
      const auto p = mx_params_of<fly::mxp::PrefillParams>(L);
      CHECK(p.g.tiles_m == tiles_m);
      CHECK(p.g.tiles_n == tiles_n);
      CHECK(p.g.rows == M);
      CHECK(p.g.cols == N);
      CHECK(p.g.k == K);
      CHECK(p.g.c == cd);
      CHECK(p.g.bias == biasd);
      CHECK(p.g.ldc == N);
      CHECK(p.g.swap == 0);
      CHECK(p.g.sk_tiles == 0);
      CHECK(p.w == bd);
      CHECK(p.sw == sd);
      CHECK(p.ldw == cols);
      CHECK(p.n == N);
      CHECK(p.k == K);
      const int split = p.g.split;
      if (split > 1) {
        // few tiles: clusters of `split` CTAs, one per k range, every range >= 4 k steps, none empty
        CHECK(split <= 8);
        CHECK(tiles * split <= 132);
        CHECK(L->cluster[0] == unsigned(split));
        CHECK(int64_t(L->grid[0]) == tiles * split);
        CHECK(p.g.kb_per_split >= 4);
        CHECK(int64_t(split) * p.g.kb_per_split >= kb_total);
        CHECK(int64_t(split - 1) * p.g.kb_per_split < kb_total);
      } else {
        // persistent: one CTA per tile up to the SMs
        CHECK(L->cluster[0] == 1u);
        CHECK(int64_t(L->grid[0]) == std::min<int64_t>(tiles, 132));
        CHECK((tiles * 2 > 132 || kb_total < 8));  // else the plan would have split
      }
      const int ia = fake_cuda_tensor_map_index(&p.g.tm_p);
      REQUIRE(ia >= 0);
      const fake_cuda_tensor_map* ma = fake_cuda_get_tensor_map(ia);
      CHECK(ma->address == uint64_t(reinterpret_cast<uintptr_t>(ad)));
      CHECK(ma->rank == 2u);
      CHECK(ma->dims[0] == uint64_t(K));
      CHECK(ma->dims[1] == uint64_t(M));
      CHECK(ma->box[0] == 64u);
      CHECK(ma->box[1] == 128u);
      CHECK(ma->swizzle == int(CU_TENSOR_MAP_SWIZZLE_128B));
      CHECK(ma->dtype == int(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16));
      ++launched;
    }
  CHECK(launched == 2 * 6);
  fly_force_variant(nullptr);
}
