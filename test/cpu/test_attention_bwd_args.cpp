// SPDX-License-Identifier: Apache-2.0
// fly_attention_bwd on bad input: a status and a message naming the argument, never a crash; the
// versioned struct; the workspace query and its size formula. Runs without a GPU: validation
// happens before any device query, so valid input reports FLY_ERROR_NO_DEVICE here.
#include <cmath>
#include <cstring>
#include <exception>
#include <string>

#include "attention/attention_bwd_params.h"
#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mentions;

void* const kQ = reinterpret_cast<void*>(uintptr_t(0x1) << 36);  // 64 GiB apart: large shapes never overlap
void* const kK = reinterpret_cast<void*>(uintptr_t(0x2) << 36);  // 64 GiB apart: large shapes never overlap
void* const kV = reinterpret_cast<void*>(uintptr_t(0x3) << 36);  // 64 GiB apart: large shapes never overlap
void* const kO = reinterpret_cast<void*>(uintptr_t(0x4) << 36);  // 64 GiB apart: large shapes never overlap
void* const kDO = reinterpret_cast<void*>(uintptr_t(0x5) << 36);  // 64 GiB apart: large shapes never overlap
void* const kL = reinterpret_cast<void*>(uintptr_t(0x6) << 36);  // 64 GiB apart: large shapes never overlap
void* const kDQ = reinterpret_cast<void*>(uintptr_t(0x7) << 36);  // 64 GiB apart: large shapes never overlap
void* const kDK = reinterpret_cast<void*>(uintptr_t(0x8) << 36);  // 64 GiB apart: large shapes never overlap
void* const kDV = reinterpret_cast<void*>(uintptr_t(0x9) << 36);  // 64 GiB apart: large shapes never overlap
void* const kWS = reinterpret_cast<void*>(uintptr_t(0xa) << 36);  // 64 GiB apart: large shapes never overlap

fly_tensor bhsd(void* p, fly_dtype dt, int64_t b, int64_t h, int64_t s, int64_t d) {
  return flykernels::tensor(p, dt, {b, h, s, d});
}

struct Call {
  fly_tensor q, k, v, o, dout, lse, dq, dk, dv;
  fly_attention_bwd_params p{};
  explicit Call(int64_t B = 2, int64_t Hq = 8, int64_t Hkv = 2, int64_t Sq = 100, int64_t Sk = 300, int64_t D = 128,
                fly_dtype dt = FLY_BF16) {
    q = bhsd(kQ, dt, B, Hq, Sq, D);
    k = bhsd(kK, dt, B, Hkv, Sk, D);
    v = bhsd(kV, dt, B, Hkv, Sk, D);
    o = bhsd(kO, dt, B, Hq, Sq, D);
    dout = bhsd(kDO, dt, B, Hq, Sq, D);
    lse = flykernels::tensor(kL, FLY_F32, {B, Hq, Sq});
    dq = bhsd(kDQ, dt, B, Hq, Sq, D);
    dk = bhsd(kDK, dt, B, Hkv, Sk, D);
    dv = bhsd(kDV, dt, B, Hkv, Sk, D);
    p.struct_size = sizeof(p);
    p.q = &q;
    p.k = &k;
    p.v = &v;
    p.o = &o;
    p.dout = &dout;
    p.lse = &lse;
    p.dq = &dq;
    p.dk = &dk;
    p.dv = &dv;
    p.workspace = kWS;
    p.workspace_bytes = size_t(fly::attn::bwd_ws_bytes(B, Hq, Sq));
  }
  fly_status run() { return fly_attention_bwd(&p, nullptr); }
};

bool passes_validation(fly_status s) {
  return s == FLY_ERROR_NO_DEVICE || (s == FLY_ERROR_INVALID_ARGUMENT && mentions("is not device memory"));
}

// Whether this build bundles a wide (hd 512) backward variant of the dtype (not a default: only
// -DFLY_ALL_VARIANTS=ON builds have one; D 257..512 is refused as unsupported otherwise).
bool wide_bwd_bundled(const char* dtype) {
  const std::string want = std::string("attention_bwd_") + dtype + "_hd512_";
  for (int i = 0; i < fly_variant_count(); ++i) {
    const char* n = fly_variant_name(i);
    if (n && std::string(n).rfind(want, 0) == 0) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("attention_bwd: the versioned params struct", "[attention_bwd][args]") {
  Call c;
  CHECK(fly_attention_bwd(nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("params: NULL"));
  c.p.struct_size = 0;
  CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("struct_size 0"));
  c.p.struct_size = sizeof(fly_attention_bwd_params) + 8;
  CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("newer header"));
  c.p.struct_size = sizeof(fly_attention_bwd_params);
  c.p.nondeterministic = 2;
  CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("nondeterministic"));
  c.p.nondeterministic = 1;
  CHECK(passes_validation(c.run()));
}

TEST_CASE("attention_bwd rejects bad descriptors with a status and a message", "[attention_bwd][args]") {
  Call c;
  SECTION("valid input passes validation, fp16 and bf16, causal") {
    CHECK(passes_validation(c.run()));
    c.p.causal = 1;
    CHECK(passes_validation(c.run()));
    Call h(1, 4, 4, 17, 1000, 40, FLY_F16);
    CHECK(passes_validation(h.run()));
  }
  SECTION("null descriptors, each named") {
    const fly_tensor** slots[] = {&c.p.q, &c.p.k, &c.p.v, &c.p.o, &c.p.dout, &c.p.lse, &c.p.dq, &c.p.dk, &c.p.dv};
    const char* names[] = {"q", "k", "v", "o", "dout", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 9; ++i) {
      const fly_tensor* keep = *slots[i];
      *slots[i] = nullptr;
      CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
      CHECK(mentions((std::string(names[i]) + ": descriptor is NULL").c_str()));
      *slots[i] = keep;
    }
  }
  SECTION("dtypes") {
    c.q.dtype = FLY_F32;
    CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("q: dtype"));
    c.q.dtype = FLY_BF16;
    fly_tensor* ts[] = {&c.k, &c.v, &c.o, &c.dout, &c.dq, &c.dk, &c.dv};
    const char* names[] = {"k", "v", "o", "dout", "dq", "dk", "dv"};
    for (int i = 0; i < 7; ++i) {
      ts[i]->dtype = FLY_F16;
      CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
      CHECK(mentions((std::string(names[i]) + ": dtype fp16 does not match q").c_str()));
      ts[i]->dtype = FLY_BF16;
    }
    c.lse.dtype = FLY_BF16;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("lse: dtype"));
  }
  SECTION("shapes") {
    c.k.sizes[3] = 64;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("k: shape"));
    c.k.sizes[3] = 128;
    fly_tensor* ts[] = {&c.v, &c.dk, &c.dv, &c.o, &c.dout, &c.dq};
    const char* names[] = {"v: shape", "dk: shape", "dv: shape", "o: shape", "dout: shape", "dq: shape"};
    for (int i = 0; i < 6; ++i) {
      ts[i]->sizes[2] += 1;
      CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
      CHECK(mentions(names[i]));
      ts[i]->sizes[2] -= 1;
    }
    c.lse.sizes[2] = 99;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("lse: shape"));
    c.lse.sizes[2] = 100;
    c.lse.rank = 4;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
  }
  SECTION("grouped-query ratio, head dims") {
    Call g(2, 8, 3, 100, 300, 128);
    CHECK(g.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("not a multiple of Hkv"));
    Call z(2, 8, 2, 100, 300, 0);
    CHECK(z.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("D = 0"));
    Call w(1, 2, 2, 16, 16, 320);
    if (wide_bwd_bundled("bf16")) {
      CHECK(passes_validation(w.run()));
    } else {
      CHECK(w.run() == FLY_ERROR_UNSUPPORTED);
      CHECK(mentions("head dim D = 320"));
      CHECK(mentions("-DFLY_ALL_VARIANTS=ON"));
    }
    Call r(1024, 1024, 1024, int64_t(1) << 17, 16, 8);  // 2^37 rows (the descriptors pass: 2^40 elements)
    r.dq.data = reinterpret_cast<void*>(uintptr_t(1) << 44);  // outputs far apart: no overlap
    r.dk.data = reinterpret_cast<void*>(uintptr_t(2) << 44);
    r.dv.data = reinterpret_cast<void*>(uintptr_t(3) << 44);
    void** ins[] = {&r.q.data, &r.k.data, &r.v.data, &r.o.data, &r.dout.data, &r.lse.data};
    for (int j = 0; j < 6; ++j) *ins[j] = reinterpret_cast<void*>(uintptr_t(8 + j) << 43);  // 2^43 apart too
    CHECK(r.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("query rows"));
    size_t rb = 1;
    CHECK(fly_attention_bwd_workspace_size(&r.p, &rb) == FLY_ERROR_UNSUPPORTED);
    CHECK(rb == 0);
    Call x(1, 2, 2, 16, 16, 1024);
    CHECK(x.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("exceeds the maximum"));
  }
  SECTION("scalars") {
    c.p.causal = 2;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("causal: 2"));
    c.p.causal = 0;
    c.p.softmax_scale = INFINITY;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("softmax_scale"));
    c.p.softmax_scale = NAN;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    c.p.softmax_scale = -0.5;
    CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("negative"));
  }
  SECTION("strides") {
    c.q.strides[3] = 2;
    CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("q: the head dim must be innermost"));
    c.q.strides[3] = 1;
    c.dv.strides[3] = 2;
    CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("dv: the head dim must be innermost"));
    c.dv.strides[3] = 1;
    c.dout.strides[2] = 129;  // TMA: multiples of 8 elements; the workspace has no room for a copy
    CHECK(c.run() == FLY_ERROR_WORKSPACE);
    CHECK(mentions("dout: sequence stride 129"));
    CHECK(mentions("with a workspace of"));
    {  // the packed path: the query adds dout's copy ([2, 8, 100, 128] 16-bit elements), which runs it
      size_t need = 0;
      REQUIRE(fly_attention_bwd_workspace_size(&c.p, &need) == FLY_SUCCESS);
      const size_t own = size_t(fly::attn::bwd_ws_bytes(2, 8, 100));
      CHECK(need == (own + 255) / 256 * 256 + (2 * 8 * 100 * 128 * 2 + 255) / 256 * 256);
      const size_t before = c.p.workspace_bytes;
      c.p.workspace_bytes = need;
      CHECK(passes_validation(c.run()));
      c.p.workspace_bytes = before;
    }
    c.dout.strides[2] = 128;
    c.k.data = static_cast<char*>(kK) + 8;
    CHECK(c.run() == FLY_ERROR_WORKSPACE);
    CHECK(mentions("k: base address"));
    c.k.data = kK;
    c.dq.strides[1] = 64;  // heads overlap rows
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dq: strides make elements overlap"));
    c.dq.strides[1] = 100 * 128;
    c.dk.data = kDV;  // dk and dv the same memory
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dk and dv: the outputs share memory"));
    c.dk.data = kK;  // dk in place of k
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dk and k: an output shares memory with an input"));
    c.dk.data = kDK;
    c.dq.data = static_cast<char*>(kL) + 256;  // inside lse's bytes
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dq and lse"));
    c.dq.data = kDQ;
    CHECK(passes_validation(c.run()));
  }
  SECTION("workspace") {
    c.p.workspace_bytes -= 1;
    CHECK(c.run() == FLY_ERROR_WORKSPACE);
    CHECK(mentions("workspace:"));
    c.p.workspace = nullptr;
    CHECK(c.run() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("workspace: NULL"));
    c.p.workspace_bytes = 0;
    CHECK(c.run() == FLY_ERROR_WORKSPACE);
    CHECK(mentions("the backward needs"));
    c.p.workspace = reinterpret_cast<void*>(0xa00010);
    c.p.workspace_bytes = 1 << 20;
    CHECK(c.run() == FLY_ERROR_MISALIGNED);
  }
  SECTION("empty problems are no-ops without a device or workspace") {
    Call e(0, 8, 2, 100, 300, 128);
    e.p.workspace = nullptr;
    e.p.workspace_bytes = 0;
    CHECK(e.run() == FLY_SUCCESS);
    Call s(2, 8, 2, 0, 300, 128);
    s.p.workspace = nullptr;
    s.p.workspace_bytes = 0;
    CHECK(s.run() == FLY_SUCCESS);
  }
}

TEST_CASE("attention_bwd_workspace_size: shape-only formula, validated input", "[attention_bwd][args]") {
  Call c(2, 8, 2, 100, 300, 128);
  c.p.workspace = nullptr;  // the query needs no buffer
  c.p.workspace_bytes = 0;
  size_t bytes = 1;
  REQUIRE(fly_attention_bwd_workspace_size(&c.p, &bytes) == FLY_SUCCESS);
  CHECK(bytes == 3 * 2 * 8 * 128 * 4);  // 3 arrays (LSE2, Delta, row max) x B Hq x Sq rounded up to 128 x fp32
  CHECK(bytes == size_t(fly::attn::bwd_ws_bytes(2, 8, 100)));
  Call d(1, 1, 1, 129, 5, 64);
  REQUIRE(fly_attention_bwd_workspace_size(&d.p, &bytes) == FLY_SUCCESS);
  CHECK(bytes == 3 * 256 * 4);
  CHECK(fly_attention_bwd_workspace_size(&c.p, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(fly_attention_bwd_workspace_size(nullptr, &bytes) == FLY_ERROR_INVALID_ARGUMENT);
  c.k.sizes[3] = 64;
  CHECK(fly_attention_bwd_workspace_size(&c.p, &bytes) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(bytes == 0);
  Call e(0, 8, 2, 100, 300, 128);
  REQUIRE(fly_attention_bwd_workspace_size(&e.p, &bytes) == FLY_SUCCESS);
  CHECK(bytes == 0);
}

TEST_CASE("flykernels.hpp: attention_bwd_workspace_size answers as the C entry; errors throw", "[attention_bwd][args]") {
  Call c(2, 8, 2, 100, 300, 128);
  const flykernels::AttentionBwdTensors t{&c.q, &c.k, &c.v, &c.o, &c.dout, &c.lse, &c.dq, &c.dk, &c.dv};
  size_t bytes = 0;
  REQUIRE(fly_attention_bwd_workspace_size(&c.p, &bytes) == FLY_SUCCESS);
  CHECK(flykernels::attention_bwd_workspace_size(t) == bytes);
  c.dk.sizes[2] = 5;
  bool threw = false;
  try {
    flykernels::attention_bwd_workspace_size(t);
  } catch (const std::exception&) {
    threw = true;
  }
  CHECK(threw);
}

// The wide (hd 512) plan: shared memory, threads, grids (attention_bwd_params.h; the kernel
// static_asserts the same sizes), and D 257..512 through validation and the workspace query.
TEST_CASE("attention_bwd: the wide (hd 512) plan", "[attention_bwd][args][attention_bwd_wide]") {
  using namespace fly::attn;
  CHECK(bwd_is_wide(512));
  CHECK_FALSE(bwd_is_wide(256));
  // dK/dV: K + V of 64 keys (128 KiB), one Q and one dO slot of 32 rows (64 KiB), the exchange of
  // two warpgroups' S^T and dP^T partials (32 KiB), barriers and alignment slack.
  CHECK(bwd_wide_xchg_bytes(32) == 32768);
  CHECK(bwd_dkdv_smem_bytes(512, 64, 32, 2) == 131072 + 65536 + 32768 + 1280);
  CHECK(bwd_dq_smem_bytes(512, 64, 32, 2) == 131072 + 65536 + 32768 + 1280);
  CHECK(bwd_dkdv_smem_bytes(512, 64, 32, 2) <= 232448);  // the H200's opt-in limit
  CHECK(bwd_dkdv_smem_bytes(512, 64, 64, 2) > 232448);   // why the Q / dO slots hold 32 rows
  // The narrower head dims keep their formula (st stages of Q and dO).
  CHECK(bwd_dkdv_smem_bytes(256, 64, 64, 2) == 2 * 64 * 256 * 2 + 2 * 2 * 64 * 256 * 2 + 1280);
  CHECK(bwd_dq_smem_bytes(128, 128, 128, 2) == 2 * 128 * 128 * 2 + 2 * 2 * 128 * 128 * 2 + 1280);
  CHECK(bwd_dkdv_threads(512, 64) == 384);
  CHECK(bwd_dq_threads(512, 64) == 384);
  CHECK(bwd_dq_threads(128, 128) == 384);
  CHECK(bwd_dq_threads(256, 64) == 256);
  CHECK(bwd_dkdv_threads(256, 64) == 384);
  // Grid x of the dK/dV kernel: key blocks times the 2 column slices when wide.
  CHECK(bwd_dkdv_grid_x(512, 4096, 64) == 128);
  CHECK(bwd_dkdv_grid_x(512, 1, 64) == 2);
  CHECK(bwd_dkdv_grid_x(512, 65, 64) == 4);
  CHECK(bwd_dkdv_grid_x(256, 65, 64) == 2);
  CHECK(bwd_dkdv_grid_x(128, 4096, 128) == 32);
  CHECK(kBwdWideSlices * 2 * 128 == kBwdWideHeadDim);  // 2 slices x 2 warpgroups x 128 columns

  // D 257..512: the workspace is the same shape-only formula; the call passes validation when a
  // wide variant is bundled, and is refused as unsupported (naming the head dim) otherwise.
  // (Shapes below 1 MiB per tensor: the fake pointers are 1 MiB apart. Contiguous rows of D
  // elements: multiples of 8 for the TMA stride rule.)
  for (int64_t d : {264, 400, 504, 512}) {
    for (fly_dtype dt : {FLY_BF16, FLY_F16}) {
      Call c(1, 4, 2, 100, 300, d, dt);
      const bool bundled = wide_bwd_bundled(dt == FLY_BF16 ? "bf16" : "fp16");
      size_t bytes = 1;
      const fly_status ws = fly_attention_bwd_workspace_size(&c.p, &bytes);
      if (bundled) {
        CHECK(ws == FLY_SUCCESS);
        CHECK(bytes == size_t(bwd_ws_bytes(1, 4, 100)));
        CHECK(passes_validation(c.run()));
      } else {
        CHECK(ws == FLY_ERROR_UNSUPPORTED);
        CHECK(bytes == 0);
        CHECK(c.run() == FLY_ERROR_UNSUPPORTED);
        CHECK(mentions(("head dim D = " + std::to_string(d)).c_str()));
      }
    }
  }
  // The wide path keeps the other rules: D 300 in contiguous rows (a stride of 300 elements is not a
  // multiple of 8) is refused naming q's stride when bundled, the head dim otherwise.
  Call m(1, 2, 2, 16, 16, 300);
  CHECK(m.run() == FLY_ERROR_WORKSPACE);
  CHECK(mentions(wide_bwd_bundled("bf16") ? "q:" : "head dim D = 300"));
  // 513 stays invalid whatever is bundled.
  Call x(1, 2, 2, 16, 16, 513);
  CHECK(x.run() == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("exceeds the maximum"));
}
