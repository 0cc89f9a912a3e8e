// SPDX-License-Identifier: Apache-2.0
// fly_grouped_gemm's ragged-K mode behind the device check, on the stand-in driver (CPU only):
// every bundled mode-k variant forced plans the two template maps (a and b^T over all of Ktot,
// MN-major: K the outer dimension; K-contiguous operands are refused), launches the maps kernel (one
// thread per group) and then one persistent launch of the main kernel, both with the workspace
// and offsets in their parameters. Ktot = 0 launches only the main kernel (zeros, no maps).
#include <cstring>
#include <string>

#include "catch_compat.hpp"
#include "core.hpp"
#include "fake_cuda.h"
#include "flykernels/flykernels.h"
#include "flykernels/flykernels.hpp"
#include "gemm/gemm_grouped_k_params.h"

namespace {

const fake_cuda_tensor_map* map_of(const CUtensorMap& m) {
  const int i = fake_cuda_tensor_map_index(&m);
  REQUIRE(i >= 0);
  return fake_cuda_get_tensor_map(i);
}

}  // namespace

TEST_CASE("grouped gemm k: every bundled mode-k variant plans its maps and two launches", "[fake][grouped_gemm]") {
  void* s = fake_cuda_stream_create(0);
  struct Shape { int64_t M, Kt, N, G; bool ak, bk; };
  // ak / bk: a K contiguous, b K contiguous (refused: the ragged K must be the maps' outer dimension).
  const Shape shapes[] = {{4096, 8192, 2048, 8, false, false}, {136, 460, 264, 6, false, false},
                          {136, 464, 264, 6, true, false}, {136, 464, 264, 6, false, true},
                          {64, 104, 64, 3, true, true}, {1, 1, 8, 1, false, false}, {8, 460, 8, 2, false, false}};
  int variants = 0, launched_variants = 0;
  for (const fly::Variant* v : fly::variants_of("grouped_gemm")) {
    if (v->get("mode") != "k") continue;
    ++variants;
    const fly_dtype dt = v->get("dtype") == "bf16" ? FLY_BF16 : FLY_F16;
    const int bm = int(v->get_int("bm", 128)), bn = int(v->get_int("bn", 128));
    bool launched = false;
    for (const Shape& sh : shapes) {
      void* da = fake_cuda_malloc(size_t(sh.M * sh.Kt * 2));
      void* db = fake_cuda_malloc(size_t(sh.Kt * sh.N * 2));
      void* dc = fake_cuda_malloc(size_t(sh.G * sh.M * sh.N * 2));
      void* doffs = fake_cuda_malloc(size_t(sh.G * 4));
      void* dws = fake_cuda_malloc(size_t(sh.G * 256));
      fly_tensor a = sh.ak ? flykernels::tensor(da, dt, {sh.M, sh.Kt}, {sh.Kt, 1})
                           : flykernels::tensor(da, dt, {sh.M, sh.Kt}, {1, sh.M});
      fly_tensor b = sh.bk ? flykernels::tensor(db, dt, {sh.Kt, sh.N}, {1, sh.Kt})
                           : flykernels::tensor(db, dt, {sh.Kt, sh.N}, {sh.N, 1});
      fly_tensor c = flykernels::tensor(dc, dt, {sh.G, sh.M, sh.N}, {sh.M * sh.N, sh.N, 1});
      fly_tensor offs = flykernels::tensor(doffs, FLY_I32, {sh.G}, {1});
      REQUIRE(fly_force_variant(v->name.c_str()) == FLY_SUCCESS);
      fake_cuda_clear_records();
      const fly_status st = fly_grouped_gemm(&a, &b, &offs, nullptr, &c, dws, size_t(sh.G * 256), s);
      fly_force_variant(nullptr);
      const bool a_ok = !sh.ak && (sh.M % 8 == 0 || sh.Kt == 1);
      const bool b_ok = !sh.bk && (sh.N % 8 == 0 || sh.Kt == 1);
      INFO(v->name << " M=" << sh.M << " Kt=" << sh.Kt << " N=" << sh.N << " G=" << sh.G << " a " << (sh.ak ? "k" : "m")
                   << "-contig, b " << (sh.bk ? "k" : "n") << "-contig: " << fly_status_string(st) << ": "
                   << fly_get_last_error() << " / " << fake_cuda_last_refusal());
      if (!a_ok || !b_ok || (!sh.bk && (bm == 128 ? bn : bn / 2) % 64 != 0)) {
        CHECK(st == FLY_ERROR_UNSUPPORTED);  // a K-contiguous operand, or an MN-major tile of partial chunks
        continue;
      }
      REQUIRE(st == FLY_SUCCESS);
      launched = true;
      REQUIRE(fake_cuda_launch_count() == 2);
      const fake_cuda_launch* L0 = fake_cuda_get_launch(0);
      const fake_cuda_launch* L = fake_cuda_get_launch(1);
      CHECK(std::string(L0->kernel) == "fly_grouped_gemm_k_maps");
      CHECK(L0->grid[0] * L0->block[0] >= unsigned(sh.G));
      CHECK(L0->stream == s);
      CHECK(std::string(L->kernel) == "fly_grouped_gemm_k_sm90");
      CHECK(L->stream == s);
      CHECK(L->block[0] == unsigned(fly::gemm::kThreads));
      CHECK(L->cluster[0] == 1u);
      CHECK(L->grid[0] >= 1u);
      CHECK(L->grid[0] <= 132u);
      CHECK(L->smem <= 232448u);
      fly::gemm::GroupedKParams p, p0;
      REQUIRE(L->param_bytes >= sizeof(p));
      std::memcpy(&p, L->params, sizeof(p));
      std::memcpy(&p0, L0->params, sizeof(p0));
      CHECK(std::memcmp(&p, &p0, sizeof(p)) == 0);  // both kernels see the same parameters
      CHECK(p.maps == dws);
      CHECK(p.offs == doffs);
      CHECK(p.groups == sh.G);
      CHECK(p.ktot == sh.Kt);
      CHECK(p.c_group_stride == sh.M * sh.N);
      CHECK(p.core.c == dc);
      CHECK(p.core.bias == nullptr);
      CHECK(p.core.rows == sh.M);
      CHECK(p.core.cols == sh.N);
      const bool ak = false, bk = false;  // both operands MN-major
      CHECK(p.core.p_kmajor == (ak ? 1 : 0));
      CHECK(p.core.q_kmajor == (bk ? 1 : 0));
      CHECK(p.units == sh.G * p.core.tiles_m * p.core.tiles_n);
      CHECK(p.core.tiles_m == (sh.M + bm - 1) / bm);
      CHECK(p.core.tiles_n == (sh.N + bn - 1) / bn);
      // Template maps: K is dimension 0 of a K-major map, 1 of an MN-major one (the kernel's
      // tensormap.replace sets that extent per group).
      const fake_cuda_tensor_map* A = map_of(p.core.tm_p);
      CHECK(A->rank == 2u);
      CHECK(A->address == reinterpret_cast<uintptr_t>(da));
      CHECK(A->dims[ak ? 0 : 1] == uint64_t(sh.Kt));
      CHECK(A->dims[ak ? 1 : 0] == uint64_t(sh.M));
      CHECK(A->box[0] == 64u);
      CHECK(A->box[1] == uint32_t(ak ? bm : 64));
      const fake_cuda_tensor_map* B = map_of(p.core.tm_q);
      CHECK(B->rank == 2u);
      CHECK(B->address == reinterpret_cast<uintptr_t>(db));
      CHECK(B->dims[bk ? 0 : 1] == uint64_t(sh.Kt));
      CHECK(B->dims[bk ? 1 : 0] == uint64_t(sh.N));
      CHECK(B->box[1] == uint32_t(bk ? bn : 64));
    }
    INFO(v->name);
    CHECK(launched);
    launched_variants += launched;
  }
  CHECK(variants >= 4);  // the mode's defaults
  CHECK(launched_variants == variants);

  // Ktot = 0: no maps, no maps kernel; the main kernel writes zeros. Null operands are fine.
  const int64_t G = 4, M = 100, N = 72;
  void* dc = fake_cuda_malloc(size_t(G * M * N * 2));
  void* doffs = fake_cuda_malloc(size_t(G * 4));
  void* dws = fake_cuda_malloc(size_t(G * 256));
  fly_tensor a = flykernels::tensor(nullptr, FLY_BF16, {M, 0}, {1, M});
  fly_tensor b = flykernels::tensor(nullptr, FLY_BF16, {0, N}, {N, 1});
  fly_tensor c = flykernels::tensor(dc, FLY_BF16, {G, M, N}, {M * N, N, 1});
  fly_tensor offs = flykernels::tensor(doffs, FLY_I32, {G}, {1});
  fake_cuda_clear_records();
  const fly_status st = fly_grouped_gemm(&a, &b, &offs, nullptr, &c, dws, size_t(G * 256), s);
  INFO(fly_get_last_error());
  REQUIRE(st == FLY_SUCCESS);
  REQUIRE(fake_cuda_launch_count() == 1);
  CHECK(std::string(fake_cuda_get_launch(0)->kernel) == "fly_grouped_gemm_k_sm90");
  CHECK(fake_cuda_tensor_map_count() == 0);
  // G = 0: nothing to write, nothing launched.
  fly_tensor offs0 = flykernels::tensor(doffs, FLY_I32, {0}, {1});
  fly_tensor c0 = flykernels::tensor(dc, FLY_BF16, {0, M, N}, {M * N, N, 1});
  fake_cuda_clear_records();
  CHECK(fly_grouped_gemm(&a, &b, &offs0, nullptr, &c0, nullptr, 0, s) == FLY_SUCCESS);
  CHECK(fake_cuda_launch_count() == 0);
}

TEST_CASE("grouped gemm k: the default rule and the log name the mode's variants", "[fake][grouped_gemm]") {
  void* s = fake_cuda_stream_create(0);
  auto run = [&](int64_t N, fly_dtype dt) {
    const int64_t G = 8, M = 2048, Kt = 4096;
    void* da = fake_cuda_malloc(size_t(M * Kt * 2));
    void* db = fake_cuda_malloc(size_t(Kt * N * 2));
    void* dc = fake_cuda_malloc(size_t(G * M * N * 2));
    void* doffs = fake_cuda_malloc(size_t(G * 4));
    void* dws = fake_cuda_malloc(size_t(G * 256));
    fly_tensor a = flykernels::tensor(da, dt, {M, Kt}, {1, M});
    fly_tensor b = flykernels::tensor(db, dt, {Kt, N}, {N, 1});
    fly_tensor c = flykernels::tensor(dc, dt, {G, M, N}, {M * N, N, 1});
    fly_tensor offs = flykernels::tensor(doffs, FLY_I32, {G}, {1});
    const fly_status st = fly_grouped_gemm(&a, &b, &offs, nullptr, &c, dws, size_t(G * 256), s);
    INFO(fly_get_last_error());
    REQUIRE(st == FLY_SUCCESS);
    return std::string(fly_last_variant());
  };
  CHECK(run(4096, FLY_BF16) == "grouped_gemm_k_bf16_bm128_bn256_st4_e1");
  CHECK(run(128, FLY_BF16) == "grouped_gemm_k_bf16_bm128_bn128_st5_e1");
  CHECK(run(2048, FLY_F16) == "grouped_gemm_k_fp16_bm128_bn256_st4_e1");
}
