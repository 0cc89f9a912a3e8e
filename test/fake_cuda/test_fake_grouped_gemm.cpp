// SPDX-License-Identifier: Apache-2.0
// fly_grouped_gemm behind the device check, on the stand-in driver (CPU only): every bundled
// grouped_gemm variant forced on a few shapes plans legal tensor maps (A 2-D over all T rows, B
// 3-D with the group outermost, C for the TMA-store variants) and one persistent launch.
#include <cstring>
#include <string>

#include "catch_compat.hpp"
#include "core.hpp"
#include "fake_cuda.h"
#include "flykernels/flykernels.h"
#include "flykernels/flykernels.hpp"
#include "gemm/gemm_grouped_params.h"

namespace {

const fake_cuda_tensor_map* map_of(const CUtensorMap& m) {
  const int i = fake_cuda_tensor_map_index(&m);
  REQUIRE(i >= 0);
  return fake_cuda_get_tensor_map(i);
}

}  // namespace

TEST_CASE("grouped gemm: every bundled variant plans its maps and one persistent launch", "[fake][grouped_gemm]") {
  void* s = fake_cuda_stream_create(0);
  struct Shape { int64_t T, K, N, G; bool kmajor; };
  const Shape shapes[] = {{4096, 4096, 4096, 8, true}, {4096, 4096, 4096, 8, false}, {37, 136, 264, 5, true},
                          {37, 136, 264, 5, false}, {1, 64, 8, 1, true}};
  int variants = 0, launched_variants = 0, tma_c = 0;
  for (const fly::Variant* v : fly::variants_of("grouped_gemm")) {
    if (v->get("mode") == "k") continue;  // the ragged-K kernel: its own test below
    ++variants;
    const fly_dtype dt = v->get("dtype") == "bf16" ? FLY_BF16 : FLY_F16;
    bool launched = false;
    for (const Shape& sh : shapes) {
      void* da = fake_cuda_malloc(size_t(sh.T * sh.K * 2));
      void* db = fake_cuda_malloc(size_t(sh.G * sh.K * sh.N * 2));
      void* dc = fake_cuda_malloc(size_t(sh.T * sh.N * 2));
      void* doffs = fake_cuda_malloc(size_t(sh.G * 4));
      void* dbias = fake_cuda_malloc(size_t(sh.G * sh.N * 2));
      fly_tensor a = flykernels::tensor(da, dt, {sh.T, sh.K}, {sh.K, 1});
      fly_tensor b = sh.kmajor ? flykernels::tensor(db, dt, {sh.G, sh.K, sh.N}, {sh.K * sh.N, 1, sh.K})
                               : flykernels::tensor(db, dt, {sh.G, sh.K, sh.N}, {sh.K * sh.N, sh.N, 1});
      fly_tensor c = flykernels::tensor(dc, dt, {sh.T, sh.N}, {sh.N, 1});
      fly_tensor offs = flykernels::tensor(doffs, FLY_I32, {sh.G}, {1});
      fly_tensor bias = flykernels::tensor(dbias, dt, {sh.G, sh.N}, {sh.N, 1});
      REQUIRE(fly_force_variant(v->name.c_str()) == FLY_SUCCESS);
      fake_cuda_clear_records();
      const fly_status st = fly_grouped_gemm(&a, &b, &offs, &bias, &c, nullptr, 0, s);
      fly_force_variant(nullptr);
      INFO(v->name << " T=" << sh.T << " K=" << sh.K << " N=" << sh.N << " G=" << sh.G << (sh.kmajor ? " k" : " n")
                   << "-contiguous B: " << fly_status_string(st) << ": " << fly_get_last_error() << " / "
                   << fake_cuda_last_refusal());
      REQUIRE((st == FLY_SUCCESS || st == FLY_ERROR_UNSUPPORTED));  // the driver never refuses what it plans
      if (st != FLY_SUCCESS) {
        CHECK_FALSE(sh.kmajor);  // only an MN-major B tile that is not whole 64-wide chunks is refused
        continue;
      }
      launched = true;
      REQUIRE(fake_cuda_launch_count() == 1);
      const fake_cuda_launch* L = fake_cuda_get_launch(0);
      CHECK(std::string(L->kernel) == "fly_grouped_gemm_sm90");
      CHECK(L->block[0] == unsigned(fly::gemm::kThreads));
      CHECK(L->cluster[0] == 1u);
      CHECK(L->grid[0] >= 1u);
      CHECK(L->grid[0] <= 132u);
      CHECK(L->smem <= 232448u);
      fly::gemm::GroupedGemmParams p;
      REQUIRE(L->param_bytes >= sizeof(p));
      std::memcpy(&p, L->params, sizeof(p));
      CHECK(p.tail.offs == doffs);
      CHECK(p.tail.groups == sh.G);
      CHECK(p.tail.rows == sh.T);
      CHECK(p.tail.bias_group_stride == sh.N);
      CHECK(p.core.c == dc);
      CHECK(p.core.bias == dbias);
      CHECK(p.core.k == sh.K);
      CHECK(p.core.cols == sh.N);
      CHECK(p.core.q_kmajor == (sh.kmajor ? 1 : 0));
      const fake_cuda_tensor_map* A = map_of(p.core.tm_p);
      CHECK(A->rank == 2u);
      CHECK(A->address == reinterpret_cast<uintptr_t>(da));
      CHECK(A->dims[0] == uint64_t(sh.K));
      CHECK(A->dims[1] == uint64_t(sh.T));
      CHECK(A->box[1] == uint32_t(v->get_int("bm", 128)));
      const fake_cuda_tensor_map* B = map_of(p.core.tm_q);
      CHECK(B->rank == 3u);
      CHECK(B->address == reinterpret_cast<uintptr_t>(db));
      CHECK(B->dims[0] == uint64_t(sh.kmajor ? sh.K : sh.N));
      CHECK(B->dims[1] == uint64_t(sh.kmajor ? sh.N : sh.K));
      CHECK(B->dims[2] == uint64_t(sh.G));
      if (sh.G > 1) CHECK(B->strides[1] == uint64_t(sh.K * sh.N * 2));
      CHECK(B->box[1] == uint32_t(sh.kmajor ? v->get_int("bn", 128) : 64));
      CHECK(B->box[2] == 1u);
      if (v->get_int("epi", 0) == 2) {
        CHECK(p.core.c_tma == 1);  // C rows of 8-element multiples, 16-byte aligned: TMA can store them
        const fake_cuda_tensor_map* C = map_of(p.core.tm_c);
        CHECK(C->rank == 2u);
        CHECK(C->dims[0] == uint64_t(sh.N));
        CHECK(C->dims[1] == uint64_t(sh.T));
        ++tma_c;
      } else {
        CHECK(p.core.c_tma == 0);
      }
    }
    INFO(v->name);
    CHECK(launched);
    launched_variants += launched;
  }
  CHECK(variants > 0);
  CHECK(launched_variants == variants);
  // Empty work launches nothing; bad offsets are the device's business (clamped there).
  fly_tensor a = flykernels::tensor(fake_cuda_malloc(64), FLY_BF16, {0, 64}, {64, 1});
  fly_tensor b = flykernels::tensor(fake_cuda_malloc(64 * 64 * 2), FLY_BF16, {1, 64, 64}, {4096, 64, 1});
  fly_tensor c = flykernels::tensor(fake_cuda_malloc(64), FLY_BF16, {0, 64}, {64, 1});
  fly_tensor offs = flykernels::tensor(fake_cuda_malloc(4), FLY_I32, {1}, {1});
  fake_cuda_clear_records();
  CHECK(fly_grouped_gemm(&a, &b, &offs, nullptr, &c, nullptr, 0, s) == FLY_SUCCESS);
  CHECK(fake_cuda_launch_count() == 0);
  (void)tma_c;
}

TEST_CASE("grouped gemm: G is the key's fourth dimension (exact rows per G, nearest G otherwise)", "[fake][grouped_gemm]") {
  void* s = fake_cuda_stream_create(0);
  // Shipped rows: bf16, B K-contiguous, N = K = 4096, mean 512 rows per group, G = 8.
  auto run = [&](int64_t G) {
    const int64_t T = 512 * G, K = 4096, N = 4096;
    void* da = fake_cuda_malloc(size_t(T * K * 2));
    void* db = fake_cuda_malloc(size_t(G * K * N * 2));
    void* dc = fake_cuda_malloc(size_t(T * N * 2));
    void* doffs = fake_cuda_malloc(size_t(G * 4));
    fly_tensor a = flykernels::tensor(da, FLY_BF16, {T, K}, {K, 1});
    fly_tensor b = flykernels::tensor(db, FLY_BF16, {G, K, N}, {K * N, 1, K});
    fly_tensor c = flykernels::tensor(dc, FLY_BF16, {T, N}, {N, 1});
    fly_tensor offs = flykernels::tensor(doffs, FLY_I32, {G}, {1});
    const fly_status st = fly_grouped_gemm(&a, &b, &offs, nullptr, &c, nullptr, 0, s);
    INFO(fly_get_last_error());
    REQUIRE(st == FLY_SUCCESS);
    return std::string(fly_last_decision()) + " " + fly_last_variant();
  };
  CHECK(run(8) == "db:exact grouped_gemm_bf16_bm128_bn256_st4_e2");
  // G = 16 has no row of its own: the nearest is the G = 8 row (one octave away), not the default rule.
  CHECK(run(16) == "db:nearest grouped_gemm_bf16_bm128_bn256_st4_e2");
}
