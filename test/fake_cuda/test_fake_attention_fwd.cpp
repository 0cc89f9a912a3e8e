// SPDX-License-Identifier: Apache-2.0
// fly_attention_fwd behind the device check, on the stand-in driver: Q, K, V whose rows TMA cannot
// take run the packed path (fly_pack_lines_sm90 copies them to 16-byte rows at the end of the
// workspace, one plane per (batch, head), then fly_attn_fwd reads the copies through its maps);
// aligned operands launch no copy; without room for the copies the call is refused before any
// launch. No kernel runs (the fake records the launches).
#include <cmath>
#include <cstring>
#include <string>

#include "attention/attention_params.h"
#include "catch_compat.hpp"
#include "common/pack_params.h"
#include "fake_cuda.h"
#include "flykernels/flykernels.h"
#include "flykernels/flykernels.hpp"

namespace {

struct FwdOperands {
  fly_tensor q, k, v, o, lse;
  fly_attention_fwd_params p{};
  // BSHD memory with rows of `ld` elements (D innermost), viewed as [B, H, S, D].
  FwdOperands(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk, int64_t D, int64_t ld, fly_dtype dt) {
    auto t4 = [&](int64_t h, int64_t s) {
      void* d = fake_cuda_malloc(size_t(B * s * h * ld * 2));
      return flykernels::tensor(d, dt, {B, h, s, D}, {s * h * ld, ld, h * ld, 1});
    };
    q = t4(Hq, Sq);
    k = t4(Hkv, Sk);
    v = t4(Hkv, Sk);
    o = t4(Hq, Sq);
    lse = flykernels::tensor(fake_cuda_malloc(size_t(B * Hq * Sq * 4)), FLY_F32, {B, Hq, Sq});
    p.struct_size = sizeof(p);
    p.q = &q;
    p.k = &k;
    p.v = &v;
    p.o = &o;
    p.lse = &lse;
  }
};

int64_t copy_bytes(const fly_tensor& t) {
  return (t.sizes[0] * t.sizes[1] * t.sizes[2] * ((t.sizes[3] + 7) / 8 * 8) * 2 + 255) / 256 * 256;
}

}  // namespace

TEST_CASE("attention_fwd: rows TMA cannot take are copied to 16-byte rows first", "[fake][attention]") {
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  void* s = fake_cuda_stream_create(0);
  for (fly_dtype dt : {FLY_BF16, FLY_F16}) {
    // B 2, Hq 8, Hkv 2, Sq 77, Sk 300, D 72 in rows of 75 elements: every operand needs a copy.
    FwdOperands f(2, 8, 2, 77, 300, 72, 75, dt);
    size_t need = 0;
    REQUIRE(fly_attention_fwd_workspace_size(&f.p, &need) == FLY_SUCCESS);
    const int64_t cq = copy_bytes(f.q), ck = copy_bytes(f.k);
    REQUIRE(need >= size_t(cq + 2 * ck));
    char* ws = static_cast<char*>(fake_cuda_malloc(need));

    // No workspace: refused before any launch, saying how much would run it.
    fake_cuda_clear_records();
    CHECK(fly_attention_fwd(&f.p, s) == FLY_ERROR_WORKSPACE);
    CHECK(std::string(fly_get_last_error()).find("with a workspace of " + std::to_string(need)) != std::string::npos);
    CHECK(fake_cuda_launch_count() == 0);

    f.p.workspace = ws;
    f.p.workspace_bytes = need;
    fake_cuda_clear_records();
    const fly_status st = fly_attention_fwd(&f.p, s);
    INFO(fly_get_last_error());
    REQUIRE(st == FLY_SUCCESS);
    REQUIRE(fake_cuda_launch_count() == 4);  // three copies, then the attention kernel (no key splits here)
    const fly_tensor* src[3] = {&f.q, &f.k, &f.v};
    char* dst = ws + (int64_t(need) - cq - 2 * ck) / 256 * 256;
    const char* copies[3];
    for (int i = 0; i < 3; ++i) {
      const fake_cuda_launch* L = fake_cuda_get_launch(i);
      CHECK(std::string(L->kernel) == "fly_pack_lines_sm90");
      fly::PackParams pp;
      REQUIRE(L->param_bytes >= sizeof(pp));
      std::memcpy(&pp, L->params, sizeof(pp));
      const fly_tensor& t = *src[i];
      CHECK(pp.src == t.data);
      CHECK(pp.dst == dst);
      CHECK(pp.lines == t.sizes[2]);
      CHECK(pp.len == 72);
      CHECK(pp.sld == t.strides[2]);
      CHECK(pp.dld == 72);
      CHECK(pp.src_sz == t.strides[0]);
      CHECK(pp.src_sy == t.strides[1]);
      CHECK(pp.dst_plane == t.sizes[2] * 72);
      CHECK(L->grid[1] == unsigned(t.sizes[1]));
      CHECK(L->grid[2] == unsigned(t.sizes[0]));
      CHECK(L->block[0] == unsigned(fly::kPackThreads));
      copies[i] = dst;
      dst += copy_bytes(t);
    }
    CHECK(dst <= ws + need);
    const fake_cuda_launch* A = fake_cuda_get_launch(3);
    CHECK(std::string(A->kernel) == "fly_attn_fwd");
    fly::attn::AttnFwdParams ap;
    REQUIRE(A->param_bytes >= sizeof(ap));
    std::memcpy(&ap, A->params, sizeof(ap));
    const CUtensorMap* maps[3] = {&ap.tm_q, &ap.tm_k, &ap.tm_v};
    for (int i = 0; i < 3; ++i) {
      const int m = fake_cuda_tensor_map_index(maps[i]);
      REQUIRE(m >= 0);
      const fake_cuda_tensor_map* tm = fake_cuda_get_tensor_map(m);
      CHECK(tm->address == reinterpret_cast<uint64_t>(copies[i]));
      CHECK(tm->strides[0] == 72u * 2);  // contiguous [B, H, S, 72] copy
    }
    CHECK(ap.o == f.o.data);  // O is written in place, with its own strides
    CHECK(ap.o_ss == f.o.strides[2]);

    // Aligned rows (ld 80): no copy, the maps read the operands themselves.
    FwdOperands g(2, 8, 2, 77, 300, 72, 80, dt);
    size_t need_g = 0;
    REQUIRE(fly_attention_fwd_workspace_size(&g.p, &need_g) == FLY_SUCCESS);
    CHECK(need_g + size_t(cq + 2 * ck) <= need + 256);
    g.p.workspace = need_g ? ws : nullptr;
    g.p.workspace_bytes = need_g;
    fake_cuda_clear_records();
    REQUIRE(fly_attention_fwd(&g.p, s) == FLY_SUCCESS);
    REQUIRE(fake_cuda_launch_count() == 1);
    CHECK(std::string(fake_cuda_get_launch(0)->kernel) == "fly_attn_fwd");
  }
}

// Split keys (flash-decoding): one kernel launch, no separate combine. The launcher zeroes the
// tiles' arrival counters (one memset inside the workspace, after the partial O and LSE), and the
// last split of each tile merges in the kernel. Without a workspace the call runs unsplit.
TEST_CASE("attention_fwd: split keys launch one kernel after zeroing the tiles' counters", "[fake][attention]") {
  void* s = fake_cuda_stream_create(0);
  FwdOperands f(8, 32, 8, 1, 8192, 128, 128, FLY_BF16);  // the suite's decode shape
  size_t need = 0;
  REQUIRE(fly_attention_fwd_workspace_size(&f.p, &need) == FLY_SUCCESS);
  REQUIRE(need > 0);
  char* ws = static_cast<char*>(fake_cuda_malloc(need));
  f.p.workspace = ws;
  f.p.workspace_bytes = need;
  fake_cuda_clear_records();
  const fly_status st = fly_attention_fwd(&f.p, s);
  INFO(fly_get_last_error() << " " << fake_cuda_last_refusal());
  REQUIRE(st == FLY_SUCCESS);
  REQUIRE(fake_cuda_launch_count() == 1);
  CHECK(fake_cuda_memset_count() == 1);
  const fake_cuda_launch* A = fake_cuda_get_launch(0);
  CHECK(std::string(A->kernel) == "fly_attn_fwd");
  fly::attn::AttnFwdParams ap;
  REQUIRE(A->param_bytes >= sizeof(ap));
  std::memcpy(&ap, A->params, sizeof(ap));
  REQUIRE(ap.splits > 1);
  // the softmax's constants (attention_math.h, issue 46): the natural scale for the LSE, and BF16
  // probabilities at 2^-(floor(log2 8192) + 2) so that a row's sum stays at most 1/2
  CHECK(ap.scale == float(1.0 / std::sqrt(128.0)));
  CHECK(ap.prob_bias == 15.f);
  const int64_t rows = 8 * 32 * 1;
  CHECK(reinterpret_cast<char*>(ap.ws_o) == ws);
  CHECK(reinterpret_cast<char*>(ap.ws_ml) == ws + fly::attn::attn_ws_o_bytes(ap.splits, rows, 128));
  CHECK(reinterpret_cast<char*>(ap.ws_cnt) == reinterpret_cast<char*>(ap.ws_ml) + fly::attn::attn_ws_ml_bytes(ap.splits, rows));
  CHECK(reinterpret_cast<char*>(ap.ws_cnt) + fly::attn::attn_ws_cnt_bytes(rows) <= ws + need);
  // no workspace: unsplit, nothing to zero
  f.p.workspace = nullptr;
  f.p.workspace_bytes = 0;
  fake_cuda_clear_records();
  REQUIRE(fly_attention_fwd(&f.p, s) == FLY_SUCCESS);
  REQUIRE(fake_cuda_launch_count() == 1);
  CHECK(fake_cuda_memset_count() == 0);
  std::memcpy(&ap, fake_cuda_get_launch(0)->params, sizeof(ap));
  CHECK(ap.splits == 1);
}
