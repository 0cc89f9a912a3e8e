// SPDX-License-Identifier: Apache-2.0
// fly_attention_fwd on bad input: a status and a message naming the argument, never a crash; the
// versioned struct; the host plan (head-dim padding, GQA packing, key splits, workspace).
// Runs without a GPU: validation happens before any device query, so valid input reports
// FLY_ERROR_NO_DEVICE here (FLY_SUCCESS or a launch on the GPU machine).
#include <cstring>
#include <string>

#include "attention/attention_plan.h"
#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mentions;

// Fake, well-aligned addresses: validation must reject before anything touches them.
void* const kQ = reinterpret_cast<void*>(uintptr_t(0x1) << 36);  // 64 GiB apart: large shapes never overlap
void* const kK = reinterpret_cast<void*>(uintptr_t(0x2) << 36);  // 64 GiB apart: large shapes never overlap
void* const kV = reinterpret_cast<void*>(uintptr_t(0x3) << 36);  // 64 GiB apart: large shapes never overlap
void* const kO = reinterpret_cast<void*>(uintptr_t(0x4) << 36);  // 64 GiB apart: large shapes never overlap
void* const kL = reinterpret_cast<void*>(uintptr_t(0x5) << 36);  // 64 GiB apart: large shapes never overlap

// BHSD contiguous [B, H, S, D].
fly_tensor bhsd(void* p, fly_dtype dt, int64_t b, int64_t h, int64_t s, int64_t d) {
  return flykernels::tensor(p, dt, {b, h, s, d});
}

struct Call {
  fly_tensor q, k, v, o, lse;
  fly_attention_fwd_params p{};
  explicit Call(int64_t B = 2, int64_t Hq = 8, int64_t Hkv = 2, int64_t Sq = 100, int64_t Sk = 300, int64_t D = 128,
                fly_dtype dt = FLY_BF16) {
    q = bhsd(kQ, dt, B, Hq, Sq, D);
    k = bhsd(kK, dt, B, Hkv, Sk, D);
    v = bhsd(kV, dt, B, Hkv, Sk, D);
    o = bhsd(kO, dt, B, Hq, Sq, D);
    lse = flykernels::tensor(kL, FLY_F32, {B, Hq, Sq});
    p.struct_size = sizeof(p);
    p.q = &q;
    p.k = &k;
    p.v = &v;
    p.o = &o;
    p.lse = &lse;
  }
  fly_status run() { return fly_attention_fwd(&p, nullptr); }
};

// Valid input gets past validation: no device in CI; on the GPU machine the fake pointers fail
// the device-pointer check that follows validation.
bool passes_validation(fly_status s) {
  return s == FLY_ERROR_NO_DEVICE || (s == FLY_ERROR_INVALID_ARGUMENT && mentions("is not device memory"));
}

}  // namespace

TEST_CASE("attention_fwd: the versioned params struct", "[attention][args]") {
  Call c;
  CHECK(fly_attention_fwd(nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("params: NULL"));
  c.p.struct_size = 0;
  CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("struct_size 0"));
  c.p.struct_size = sizeof(fly_attention_fwd_params) + 8;
  CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("newer header"));
  c.p.struct_size = sizeof(fly_attention_fwd_params);
  c.p.reserved = 3;
  CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("reserved"));
}

TEST_CASE("attention_fwd rejects bad descriptors with a status and a message", "[attention][args]") {
  Call c;
  SECTION("valid input passes validation") { CHECK(passes_validation(c.run())); }
  SECTION("null descriptors and data") {
    c.p.q = nullptr;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("q: descriptor is NULL"));
    c.p.q = &c.q;
    c.p.o = nullptr;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("o: descriptor is NULL"));
    c.p.o = &c.o;
    c.v.data = nullptr;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("v"));
  }
  SECTION("lse is optional") {
    c.p.lse = nullptr;
    CHECK(passes_validation(c.run()));
  }
  SECTION("dtypes") {
    c.q.dtype = FLY_F32;
    CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("fp32"));
    c.q.dtype = FLY_BF16;
    c.k.dtype = FLY_F16;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("k: dtype fp16 does not match q (bf16)"));
    c.k.dtype = FLY_BF16;
    c.o.dtype = FLY_F16;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("o: dtype"));
    c.o.dtype = FLY_BF16;
    c.lse.dtype = FLY_BF16;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("lse: dtype bf16, expected fp32"));
  }
  SECTION("ranks and shapes") {
    c.q.rank = 3;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("q: expected rank 4"));
    c.q = bhsd(kQ, FLY_BF16, 2, 8, 100, 128);
    c.k = bhsd(kK, FLY_BF16, 2, 2, 300, 64);
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("k: shape"));
    c.k = bhsd(kK, FLY_BF16, 2, 2, 300, 128);
    c.v = bhsd(kV, FLY_BF16, 2, 2, 299, 128);
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("v: shape"));
    c.v = bhsd(kV, FLY_BF16, 2, 2, 300, 128);
    c.o = bhsd(kO, FLY_BF16, 2, 8, 101, 128);
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("o: shape"));
    c.o = bhsd(kO, FLY_BF16, 2, 8, 100, 128);
    c.lse = flykernels::tensor(kL, FLY_F32, {2, 8, 99});
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("lse: shape"));
  }
  SECTION("Hq must be a multiple of Hkv") {
    Call g(2, 8, 3);
    CHECK(g.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("not a multiple of Hkv = 3"));
  }
  SECTION("head dim innermost, within 1..512") {
    c.q.strides[3] = 2;
    CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("q: the head dim must be innermost"));
    Call big(1, 2, 2, 16, 16, 513);
    CHECK(big.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("exceeds the maximum 512"));
    Call zero(1, 2, 2, 16, 16, 0);
    CHECK(zero.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("D = 0"));
  }
  SECTION("head dims 257..512 (the wide-head schedule) pass validation; 513 does not") {
    for (int64_t d : {257, 300, 384, 400, 504, 512}) {
      Call wide(1, 2, 2, 16, 16, d);
      const int64_t ld = (d + 7) / 8 * 8;  // rows padded to 16 bytes, as SDPA pads D
      for (fly_tensor* t : {&wide.q, &wide.k, &wide.v, &wide.o}) {
        t->strides[2] = ld;
        t->strides[1] = 16 * ld;
        t->strides[0] = 2 * 16 * ld;
      }
      INFO("D = " << d);
      CHECK(passes_validation(wide.run()));
      size_t bytes = 1;
      CHECK(fly_attention_fwd_workspace_size(&wide.p, &bytes) == FLY_SUCCESS);
      CHECK(bytes == 0);  // one tile per head, too few keys to split
    }
    Call over(1, 2, 2, 16, 16, 520);
    CHECK(over.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("q: head dim D = 520 exceeds the maximum 512"));
    Call odd(1, 2, 2, 16, 16, 300);  // the TMA rule still applies: contiguous 600-byte rows
    CHECK(odd.run() == FLY_ERROR_WORKSPACE);
    CHECK(mentions("q: sequence stride 300 elements is not a multiple of 8"));
  }
  SECTION("TMA rules: 16-byte strides and bases; without room for the copies, refused") {
    Call odd(1, 2, 2, 16, 16, 100);  // contiguous rows of 200 bytes
    CHECK(odd.run() == FLY_ERROR_WORKSPACE);
    CHECK(mentions("q: sequence stride 100 elements is not a multiple of 8"));
    CHECK(mentions("with a workspace of"));
    c.k.data = reinterpret_cast<char*>(kK) + 2;
    CHECK(c.run() == FLY_ERROR_WORKSPACE);
    CHECK(mentions("k: base address is not 16-byte aligned"));
  }
  SECTION("the packed path: the query adds the copies, a workspace that holds them passes validation") {
    Call aligned(1, 2, 2, 16, 16, 104), odd(1, 2, 2, 16, 16, 100);
    size_t base = 1, need = 1;
    REQUIRE(fly_attention_fwd_workspace_size(&aligned.p, &base) == FLY_SUCCESS);
    REQUIRE(fly_attention_fwd_workspace_size(&odd.p, &need) == FLY_SUCCESS);
    // q, k and v each copied as [1, 2, 16, 104] 16-bit elements, 256-byte rounded; o needs none.
    const size_t copy = (2 * 16 * 104 * 2 + 255) / 256 * 256;
    CHECK(need == (base + 255) / 256 * 256 + 3 * copy);
    odd.p.workspace = reinterpret_cast<void*>(uintptr_t(1) << 20);
    odd.p.workspace_bytes = need;
    CHECK(passes_validation(odd.run()));
    odd.p.workspace_bytes = 3 * copy - 256;  // one chunk short
    CHECK(odd.run() == FLY_ERROR_WORKSPACE);
    CHECK(mentions("q: sequence stride 100"));
    // Only K misaligned: one copy.
    c.k.data = reinterpret_cast<char*>(kK) + 2;
    size_t ck = 0, c0 = 0;
    Call plain;
    REQUIRE(fly_attention_fwd_workspace_size(&plain.p, &c0) == FLY_SUCCESS);
    REQUIRE(fly_attention_fwd_workspace_size(&c.p, &ck) == FLY_SUCCESS);
    CHECK(ck == (c0 + 255) / 256 * 256 + size_t((c.k.sizes[0] * c.k.sizes[1] * c.k.sizes[2] * 128 * 2 + 255) / 256 * 256));
  }
  SECTION("outputs must not overlap themselves") {
    c.o.strides[2] = 64;  // rows of 128 elements, 64 apart
    c.o.strides[1] = 100 * 64;
    c.o.strides[0] = 8 * 100 * 64;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("o: strides make elements overlap"));
    c.o = bhsd(kO, FLY_BF16, 2, 8, 100, 128);
    c.lse.strides[2] = 0;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("lse: strides make elements overlap"));
  }
  SECTION("scalars and workspace") {
    c.p.causal = 2;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("causal: 2"));
    c.p.causal = 1;
    c.p.softmax_scale = 1.0 / 0.0;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("softmax_scale"));
    c.p.softmax_scale = -0.5;
    CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("negative scales"));
    c.p.softmax_scale = 0.125;
    c.p.workspace_bytes = 1024;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("workspace: NULL with workspace_bytes = 1024"));
    c.p.workspace = reinterpret_cast<void*>(0x600010);
    CHECK(c.run() == FLY_ERROR_MISALIGNED);
    CHECK(mentions("256-byte aligned"));
  }
  SECTION("BSHD views validate like BHSD") {
    // q [B, S, H, D] memory viewed as [B, H, S, D]
    c.q = flykernels::tensor(kQ, FLY_BF16, {2, 8, 100, 128}, {100 * 8 * 128, 128, 8 * 128, 1});
    c.o = flykernels::tensor(kO, FLY_BF16, {2, 8, 100, 128}, {100 * 8 * 128, 128, 8 * 128, 1});
    CHECK(passes_validation(c.run()));
  }
}

TEST_CASE("attention_fwd: empty problems are no-ops", "[attention][args]") {
  Call b0(0, 8, 2, 100, 300);
  CHECK(b0.run() == FLY_SUCCESS);
  Call h0(2, 0, 0, 100, 300);
  CHECK(h0.run() == FLY_SUCCESS);
  Call s0(2, 8, 2, 0, 300);
  CHECK(s0.run() == FLY_SUCCESS);
  // Sk = 0 is not a no-op (O = 0, LSE = -inf must be written): it reaches the device.
  Call k0(2, 8, 2, 100, 0);
  CHECK(passes_validation(k0.run()));
}

TEST_CASE("attention_fwd_workspace_size", "[attention][args]") {
  size_t bytes = 1;
  Call c(2, 8, 2, 4096, 4096, 128);
  CHECK(fly_attention_fwd_workspace_size(&c.p, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(fly_attention_fwd_workspace_size(&c.p, &bytes) == FLY_SUCCESS);
  CHECK(bytes == 0);  // enough tiles to fill the GPU: never split
  Call dec(8, 32, 8, 1, 8192, 128);
  CHECK(fly_attention_fwd_workspace_size(&dec.p, &bytes) == FLY_SUCCESS);
  CHECK(bytes > 0);
  CHECK(bytes < (size_t(64) << 20));
  dec.k.dtype = FLY_F16;
  CHECK(fly_attention_fwd_workspace_size(&dec.p, &bytes) == FLY_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("attention plan: head dims, GQA packing, key splits", "[attention][plan]") {
  using namespace fly::attn;
  CHECK(padded_head_dim(1) == 64);
  CHECK(padded_head_dim(64) == 64);
  CHECK(padded_head_dim(65) == 128);
  CHECK(padded_head_dim(200) == 256);
  CHECK(padded_head_dim(257) == 512);
  CHECK(padded_head_dim(512) == 512);
  CHECK(padded_head_dim(513) == 0);
  // the wide schedule: 64-row tiles, two 64-key slots, the 2 x 16 KiB score exchange, 384 threads
  CHECK(attn_smem_bytes(512, 64, 64, 1) == 64 * 512 * 2 + 2 * 64 * 512 * 2 + 2 * 64 * 64 * 4 + 1280);
  CHECK(attn_smem_bytes(512, 64, 64, 1) <= 232448);
  CHECK(attn_threads(512, 64) == 384);
  CHECK(attn_threads(128, 128) == 384);
  CHECK(attn_threads(64, 64) == 256);
  // decode at D 512 splits keys like the others; the size query covers it
  const Shape wdec{1, 8, 1, 1, 16384, 512, false};
  CHECK(use_pack_gqa(wdec, 64));
  CHECK(choose_splits(wdec, 64, 64, 132) > 1);
  CHECK(split_workspace_bytes(wdec, choose_splits(wdec, 64, 64, 132), 512) <= max_workspace_bytes(wdec));
  CHECK(padded_head_dim(0) == 0);
  // decode with GQA: the 4 query heads of a kv head share one CTA
  const Shape dec{8, 32, 8, 1, 8192, 128, false};
  CHECK(use_pack_gqa(dec, 128));
  const Grid g = tile_grid(dec, 128);
  CHECK(g.m_blocks == 1);
  CHECK(g.heads_y == 8);
  CHECK(g.tiles == 64);
  const int splits = choose_splits(dec, 128, 128, 132);
  CHECK(splits == 2);  // 64 tiles x 2 = one wave of 128 CTAs on 132 SMs
  CHECK(split_workspace_bytes(dec, splits, 128) <= max_workspace_bytes(dec));
  // long prefill: no packing, no split
  const Shape pre{4, 16, 16, 4096, 4096, 128, true};
  CHECK_FALSE(use_pack_gqa(pre, 128));
  CHECK(choose_splits(pre, 128, 128, 132) == 1);
  CHECK(max_workspace_bytes(pre) == 0);
  // a single query against a long key sequence, no GQA: splits up to the cap
  const Shape one{1, 1, 1, 1, 65536, 64, false};
  CHECK(choose_splits(one, 128, 128, 132) == kMaxSplits);
  // few keys: nothing to split
  const Shape short_k{1, 1, 1, 1, 200, 64, false};
  CHECK(choose_splits(short_k, 128, 128, 132) == 1);
  CHECK(attn_smem_bytes(128, 128, 128, 2) == 128 * 128 * 2 + 4 * 128 * 128 * 2 + 1280);
}
