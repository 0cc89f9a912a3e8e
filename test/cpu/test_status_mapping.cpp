// SPDX-License-Identifier: Apache-2.0
// One status per mistake (docs/robustness.md "Statuses"): the same mistake gets the same
// fly_status from every C entry point that can make it. Each test builds a valid call of every
// entry (fake, well separated addresses), makes one mistake in it and checks the status. Runs
// without a GPU: everything here is decided before the device check, so a valid call reports
// FLY_ERROR_NO_DEVICE (ctest runs this file once more with FLYKERNELS_LIBCUDA pointing nowhere:
// `status_no_driver`), and an output overlapping an input is refused the same way as on a GPU.
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mentions;

// Every argument its own 64 MiB slot: no two overlap unless a test says so.
void* slot(int i) { return reinterpret_cast<void*>(uintptr_t(0x10000000) + uintptr_t(i) * (uintptr_t(64) << 20)); }
void* shifted(void* p, int64_t bytes) { return static_cast<char*>(p) + bytes; }

fly_tensor t2(int i, fly_dtype dt, int64_t r, int64_t c) { return flykernels::tensor(slot(i), dt, {r, c}); }
fly_tensor t1(int i, fly_dtype dt, int64_t n) { return flykernels::tensor(slot(i), dt, {n}); }
fly_tensor t3(int i, fly_dtype dt, int64_t b, int64_t s, int64_t w) { return flykernels::tensor(slot(i), dt, {b, s, w}); }
fly_tensor t4(int i, fly_dtype dt, int64_t b, int64_t h, int64_t s, int64_t d) {
  return flykernels::tensor(slot(i), dt, {b, h, s, d});
}

// One entry point's call: its tensors (first the input whose dtype keys the call, then the
// others), which of them is an output, its workspace, and how to call it.
struct Call {
  std::string name;
  std::vector<fly_tensor> t;     // t[0]: the leading input
  int out = -1;                  // index of an output
  int in_overlap = 0;            // the input that output is made to overlap
  bool takes_workspace = false;
  bool workspace_required = false;  // the shape below needs one (its size query says > 0)
  size_t ws_align = 256;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  std::function<fly_status(Call&)> run;
  std::function<fly_status(Call&, size_t*)> query;  // the workspace size query, if any
};

fly_attention_fwd_params fwd_params(Call& c) {
  fly_attention_fwd_params p{};
  p.struct_size = sizeof p;
  p.q = &c.t[0];
  p.k = &c.t[1];
  p.v = &c.t[2];
  p.o = &c.t[3];
  p.lse = &c.t[4];
  p.workspace = c.ws;
  p.workspace_bytes = c.ws_bytes;
  return p;
}
fly_attention_bwd_params bwd_params(Call& c) {
  fly_attention_bwd_params p{};
  p.struct_size = sizeof p;
  p.q = &c.t[0];
  p.k = &c.t[1];
  p.v = &c.t[2];
  p.o = &c.t[3];
  p.dout = &c.t[4];
  p.lse = &c.t[5];
  p.dq = &c.t[6];
  p.dk = &c.t[7];
  p.dv = &c.t[8];
  p.workspace = c.ws;
  p.workspace_bytes = c.ws_bytes;
  return p;
}

// Valid calls of every entry (with the workspace their size query asks for).
std::vector<Call> calls() {
  std::vector<Call> v;
  {
    Call c;
    c.name = "rms_norm_fwd";
    c.t = {t2(0, FLY_BF16, 8, 64), t1(1, FLY_BF16, 64), t2(2, FLY_BF16, 8, 64), t1(3, FLY_F32, 8)};
    c.out = 2;
    c.run = [](Call& c) { return fly_rms_norm_fwd(&c.t[0], &c.t[1], 1e-5, &c.t[2], &c.t[3], nullptr); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "topk";  // few long rows: the split path's per-row state needs a workspace
    c.t = {t2(0, FLY_F32, 4, 100000), t2(1, FLY_F32, 4, 10), t2(2, FLY_I64, 4, 10)};
    c.out = 1;
    c.takes_workspace = c.workspace_required = true;
    c.ws_align = 16;
    c.run = [](Call& c) { return fly_topk(&c.t[0], 10, 1, 0, &c.t[1], &c.t[2], c.ws, c.ws_bytes, nullptr); };
    c.query = [](Call& c, size_t* b) { return fly_topk_workspace_size(&c.t[0], 10, 1, 0, b); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "gemm";
    c.t = {t2(0, FLY_BF16, 64, 128), t2(1, FLY_BF16, 128, 32), t2(2, FLY_BF16, 64, 32)};
    c.out = 2;
    c.takes_workspace = true;
    c.run = [](Call& c) { return fly_gemm(&c.t[0], &c.t[1], &c.t[2], nullptr, c.ws, c.ws_bytes, nullptr); };
    c.query = [](Call& c, size_t* b) { return fly_gemm_workspace_size(&c.t[0], &c.t[1], &c.t[2], b); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "grouped_gemm";
    c.t = {t2(0, FLY_BF16, 64, 128), flykernels::tensor(slot(1), FLY_BF16, {2, 128, 32}), t1(2, FLY_I32, 2),
           t2(3, FLY_BF16, 64, 32)};
    c.out = 3;
    c.takes_workspace = true;
    c.run = [](Call& c) {
      return fly_grouped_gemm(&c.t[0], &c.t[1], &c.t[2], nullptr, &c.t[3], c.ws, c.ws_bytes, nullptr);
    };
    c.query = [](Call& c, size_t* b) { return fly_grouped_gemm_workspace_size(&c.t[0], &c.t[1], &c.t[2], &c.t[3], b); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "grouped_gemm (ragged K)";  // a [M, Ktot] M contiguous, b [Ktot, N], c [G, M, N]
    c.t = {flykernels::tensor(slot(0), FLY_BF16, {32, 64}, {1, 32}), t2(1, FLY_BF16, 64, 32), t1(2, FLY_I32, 2),
           flykernels::tensor(slot(3), FLY_BF16, {2, 32, 32})};
    c.out = 3;
    c.takes_workspace = c.workspace_required = true;
    c.run = [](Call& c) {
      return fly_grouped_gemm(&c.t[0], &c.t[1], &c.t[2], nullptr, &c.t[3], c.ws, c.ws_bytes, nullptr);
    };
    c.query = [](Call& c, size_t* b) { return fly_grouped_gemm_workspace_size(&c.t[0], &c.t[1], &c.t[2], &c.t[3], b); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "attention_fwd";
    c.t = {t4(0, FLY_BF16, 1, 2, 16, 64), t4(1, FLY_BF16, 1, 2, 16, 64), t4(2, FLY_BF16, 1, 2, 16, 64),
           t4(3, FLY_BF16, 1, 2, 16, 64), flykernels::tensor(slot(4), FLY_F32, {1, 2, 16})};
    c.out = 3;
    c.takes_workspace = true;
    c.run = [](Call& c) {
      fly_attention_fwd_params p = fwd_params(c);
      return fly_attention_fwd(&p, nullptr);
    };
    c.query = [](Call& c, size_t* b) {
      fly_attention_fwd_params p = fwd_params(c);
      return fly_attention_fwd_workspace_size(&p, b);
    };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "attention_bwd";
    c.t = {t4(0, FLY_BF16, 1, 2, 16, 64), t4(1, FLY_BF16, 1, 2, 16, 64), t4(2, FLY_BF16, 1, 2, 16, 64),
           t4(3, FLY_BF16, 1, 2, 16, 64), t4(4, FLY_BF16, 1, 2, 16, 64), flykernels::tensor(slot(5), FLY_F32, {1, 2, 16}),
           t4(6, FLY_BF16, 1, 2, 16, 64), t4(7, FLY_BF16, 1, 2, 16, 64), t4(8, FLY_BF16, 1, 2, 16, 64)};
    c.out = 6;
    c.takes_workspace = c.workspace_required = true;
    c.run = [](Call& c) {
      fly_attention_bwd_params p = bwd_params(c);
      return fly_attention_bwd(&p, nullptr);
    };
    c.query = [](Call& c, size_t* b) {
      fly_attention_bwd_params p = bwd_params(c);
      return fly_attention_bwd_workspace_size(&p, b);
    };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "mx_quantize";
    c.t = {t2(0, FLY_BF16, 8, 64), t2(1, FLY_F8_E4M3, 8, 64), t2(2, FLY_E8M0, 8, 2)};
    c.out = 1;
    c.run = [](Call& c) { return fly_mx_quantize(&c.t[0], FLY_MX_E4M3, &c.t[1], &c.t[2], nullptr); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "scaled_gemm";
    c.t = {t2(0, FLY_F8_E4M3, 64, 64), t2(1, FLY_F8_E4M3, 32, 64), t2(2, FLY_E8M0, 64, 2), t2(3, FLY_E8M0, 32, 2),
           t2(4, FLY_BF16, 64, 32)};
    c.out = 4;
    c.takes_workspace = true;
    c.run = [](Call& c) {
      return fly_scaled_gemm(&c.t[0], &c.t[2], &c.t[1], &c.t[3], nullptr, &c.t[4], c.ws, c.ws_bytes, nullptr);
    };
    c.query = [](Call& c, size_t* b) { return fly_scaled_gemm_workspace_size(&c.t[0], &c.t[1], &c.t[4], b); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "glu_fwd";
    c.t = {t2(0, FLY_BF16, 8, 64), t2(1, FLY_BF16, 8, 64), t2(2, FLY_BF16, 8, 64)};
    c.out = 2;
    c.run = [](Call& c) { return fly_glu_fwd(&c.t[0], &c.t[1], FLY_GLU_SILU, &c.t[2], nullptr); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "glu_bwd";  // gate, up, dout, dgate, dup
    c.t = {t2(0, FLY_BF16, 8, 64), t2(1, FLY_BF16, 8, 64), t2(2, FLY_BF16, 8, 64), t2(3, FLY_BF16, 8, 64),
           t2(4, FLY_BF16, 8, 64)};
    c.out = 3;
    c.run = [](Call& c) {
      return fly_glu_bwd(&c.t[2], &c.t[0], &c.t[1], FLY_GLU_GELU_TANH, &c.t[3], &c.t[4], nullptr);
    };
    v.push_back(c);
  }
  for (bool bwd : {false, true}) {
    Call c;
    c.name = bwd ? "rope_bwd" : "rope_fwd";  // q (dq_out), k, cos, sin, q_out (dq), k_out
    c.t = {t4(0, FLY_BF16, 2, 4, 8, 64), t4(1, FLY_BF16, 2, 2, 8, 64), t3(2, FLY_BF16, 2, 8, 64),
           t3(3, FLY_BF16, 2, 8, 64), t4(4, FLY_BF16, 2, 4, 8, 64), t4(5, FLY_BF16, 2, 2, 8, 64)};
    c.out = 4;
    if (bwd)
      c.run = [](Call& c) { return fly_rope_bwd(&c.t[0], &c.t[1], &c.t[2], &c.t[3], 64, &c.t[4], &c.t[5], nullptr); };
    else
      c.run = [](Call& c) { return fly_rope_fwd(&c.t[0], &c.t[1], &c.t[2], &c.t[3], 64, &c.t[4], &c.t[5], nullptr); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "add_rms_norm_fwd";  // x, residual, weight, y, h, rstd
    c.t = {t2(0, FLY_BF16, 8, 64), t2(1, FLY_BF16, 8, 64), t1(2, FLY_BF16, 64), t2(3, FLY_BF16, 8, 64),
           t2(4, FLY_BF16, 8, 64), t1(5, FLY_F32, 8)};
    c.out = 3;
    c.run = [](Call& c) {
      return fly_add_rms_norm_fwd(&c.t[0], &c.t[1], &c.t[2], 1e-6, &c.t[3], &c.t[4], &c.t[5], nullptr);
    };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "add_rms_norm_bwd";  // dy, dh, h, weight, rstd, dx, dweight
    c.t = {t2(0, FLY_BF16, 8, 64), t2(1, FLY_BF16, 8, 64), t2(2, FLY_BF16, 8, 64), t1(3, FLY_BF16, 64),
           t1(4, FLY_F32, 8),      t2(5, FLY_BF16, 8, 64), t1(6, FLY_BF16, 64)};
    c.out = 5;
    c.takes_workspace = true;
    c.workspace_required = true;
    c.run = [](Call& c) {
      return fly_add_rms_norm_bwd(&c.t[0], &c.t[1], &c.t[2], &c.t[3], &c.t[4], &c.t[5], &c.t[6], c.ws, c.ws_bytes,
                                  nullptr);
    };
    c.query = [](Call& c, size_t* b) { return fly_add_rms_norm_bwd_workspace_size(&c.t[2], &c.t[3], b); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "cross_entropy_fwd_bwd";  // logits, labels, loss, lse, dlogits
    c.t = {t2(0, FLY_BF16, 8, 64), t1(1, FLY_I64, 8), t1(2, FLY_F32, 8), t1(3, FLY_F32, 8), t2(4, FLY_BF16, 8, 64)};
    c.out = 4;
    c.run = [](Call& c) {
      return fly_cross_entropy_fwd_bwd(&c.t[0], &c.t[1], -100, 1.0, &c.t[2], &c.t[3], &c.t[4], nullptr);
    };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "moe_route_fwd";  // logits, weights, ids
    c.t = {t2(0, FLY_BF16, 16, 64), t2(1, FLY_F32, 16, 8), t2(2, FLY_I64, 16, 8)};
    c.out = 1;
    c.run = [](Call& c) {
      return fly_moe_route_fwd(&c.t[0], 8, FLY_MOE_SOFTMAX, FLY_MOE_RENORMALIZE, &c.t[1], &c.t[2], nullptr);
    };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "moe_route_bwd";  // logits, dweights, ids, dlogits
    c.t = {t2(0, FLY_BF16, 16, 64), t2(1, FLY_F32, 16, 8), t2(2, FLY_I64, 16, 8), t2(3, FLY_BF16, 16, 64)};
    c.out = 3;
    c.run = [](Call& c) {
      return fly_moe_route_bwd(&c.t[1], &c.t[0], &c.t[2], FLY_MOE_SOFTMAX, FLY_MOE_RENORMALIZE, &c.t[3], nullptr);
    };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "moe_permute";  // x, ids, x_perm, offsets, row_of, pair_of
    c.t = {t2(0, FLY_BF16, 16, 64), t2(1, FLY_I64, 16, 8), t2(2, FLY_BF16, 128, 64), t1(3, FLY_I32, 32),
           t2(4, FLY_I32, 16, 8), t1(5, FLY_I32, 128)};
    c.out = 2;
    c.takes_workspace = true;
    c.workspace_required = true;
    c.run = [](Call& c) {
      return fly_moe_permute(&c.t[0], &c.t[1], &c.t[2], &c.t[3], &c.t[4], &c.t[5], c.ws, c.ws_bytes, nullptr);
    };
    c.query = [](Call&, size_t* b) { return fly_moe_permute_workspace_size(16, 8, 32, b); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "moe_unpermute";  // out_perm, weights, row_of, offsets, y
    c.t = {t2(0, FLY_BF16, 128, 64), t2(1, FLY_F32, 16, 8), t2(2, FLY_I32, 16, 8), t1(3, FLY_I32, 32),
           t2(4, FLY_BF16, 16, 64)};
    c.out = 4;
    c.run = [](Call& c) { return fly_moe_unpermute(&c.t[0], &c.t[1], &c.t[2], &c.t[3], &c.t[4], nullptr); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "moe_permute_bwd";  // dx_perm, row_of, offsets, dx
    c.t = {t2(0, FLY_BF16, 128, 64), t2(1, FLY_I32, 16, 8), t1(2, FLY_I32, 32), t2(3, FLY_BF16, 16, 64)};
    c.out = 3;
    c.run = [](Call& c) { return fly_moe_permute_bwd(&c.t[0], &c.t[1], &c.t[2], &c.t[3], nullptr); };
    v.push_back(c);
  }
  {
    Call c;
    c.name = "moe_unpermute_bwd";  // dy, out_perm, weights, row_of, offsets, dout_perm, dweights
    c.t = {t2(0, FLY_BF16, 16, 64), t2(1, FLY_BF16, 128, 64), t2(2, FLY_F32, 16, 8), t2(3, FLY_I32, 16, 8),
           t1(4, FLY_I32, 32), t2(5, FLY_BF16, 128, 64), t2(6, FLY_F32, 16, 8)};
    c.out = 5;
    c.run = [](Call& c) {
      return fly_moe_unpermute_bwd(&c.t[0], &c.t[1], &c.t[2], &c.t[3], &c.t[4], &c.t[5], &c.t[6], nullptr);
    };
    v.push_back(c);
  }
  // The workspace each size query asks for, in a slot of its own.
  for (Call& c : v)
    if (c.query) {
      size_t bytes = 0;
      REQUIRE(c.query(c, &bytes) == FLY_SUCCESS);
      c.ws = bytes ? slot(20) : nullptr;
      c.ws_bytes = bytes;
      if (c.workspace_required) REQUIRE(bytes > 0);
    }
  return v;
}

std::string said(fly_status s) { return std::string(fly_status_string(s)) + ": " + fly_get_last_error(); }

}  // namespace

TEST_CASE("status mapping: every valid call reaches the device check", "[status]") {
  for (Call& c : calls()) {
    INFO(c.name);
    const fly_status s = c.run(c);
    CHECK(s == FLY_ERROR_NO_DEVICE);
    INFO(said(s));
  }
}

TEST_CASE("status mapping: NULL descriptor or data pointer -> FLY_ERROR_INVALID_ARGUMENT", "[status]") {
  for (Call& c : calls()) {
    INFO(c.name);
    c.t[0].data = nullptr;
    CHECK(c.run(c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("data pointer is NULL"));
  }
  CHECK(fly_rms_norm_fwd(nullptr, nullptr, 1e-5, nullptr, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(fly_attention_fwd(nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(fly_attention_bwd(nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  size_t bytes = 0;
  CHECK(fly_gemm_workspace_size(nullptr, nullptr, nullptr, &bytes) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(fly_topk_workspace_size(nullptr, 1, 1, 0, &bytes) == FLY_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("status mapping: a dtype value outside the enum -> FLY_ERROR_INVALID_ARGUMENT", "[status]") {
  for (Call& c : calls()) {
    INFO(c.name);
    const int32_t bad = 99;
    std::memcpy(&c.t[0].dtype, &bad, sizeof bad);
    CHECK(c.run(c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("invalid dtype"));
  }
}

TEST_CASE("status mapping: a valid dtype the family has no kernel for -> FLY_ERROR_UNSUPPORTED", "[status]") {
  for (Call& c : calls()) {
    INFO(c.name);
    c.t[0].dtype = FLY_F64;
    const fly_status s = c.run(c);
    CHECK(s == FLY_ERROR_UNSUPPORTED);
    INFO(said(s));
    CHECK(mentions("not supported"));
  }
}

TEST_CASE("status mapping: a dtype that disagrees with another argument -> FLY_ERROR_INVALID_ARGUMENT", "[status]") {
  for (Call& c : calls()) {
    INFO(c.name);
    // The output's dtype is fixed by the inputs, except the MX GEMM's (fp16 or bf16, the caller's
    // choice: another one is unsupported): there, a scale's dtype (e8m0, fixed by the API).
    const size_t i = c.name == "scaled_gemm" ? 2 : size_t(c.out);
    c.t[i].dtype = FLY_F64;
    const fly_status s = c.run(c);
    CHECK(s == FLY_ERROR_INVALID_ARGUMENT);
    INFO(said(s));
  }
}

TEST_CASE("status mapping: a pointer breaking an alignment rule -> FLY_ERROR_MISALIGNED", "[status]") {
  for (Call& c : calls()) {
    INFO(c.name);
    // One byte off: breaks element alignment (2-byte and wider dtypes) or, for the 1-byte MX
    // elements, the 16-byte rule of the MX GEMM.
    c.t[0].data = shifted(c.t[0].data, 1);
    const fly_status s = c.run(c);
    CHECK(s == FLY_ERROR_MISALIGNED);
    INFO(said(s));
  }
  // Element aligned but not 16-byte aligned, where the op needs 16 (TMA): grouped GEMM's a, both
  // modes (it was FLY_ERROR_UNSUPPORTED before the mapping was settled).
  for (Call& c : calls()) {
    if (c.name.rfind("grouped_gemm", 0) != 0) continue;
    INFO(c.name);
    c.t[0].data = shifted(c.t[0].data, 2);
    CHECK(c.run(c) == FLY_ERROR_MISALIGNED);
    CHECK(mentions("a: base address is not 16-byte aligned"));
  }
}

TEST_CASE("status mapping: an input layout no kernel reads (inner stride 2) -> FLY_ERROR_UNSUPPORTED", "[status]") {
  for (Call& c : calls()) {
    INFO(c.name);
    fly_tensor& x = c.t[0];
    if (c.name == "grouped_gemm (ragged K)") {  // its a is M contiguous: break that instead
      x.strides[0] = 2;
      x.strides[1] = 64;
    } else {
      x.strides[x.rank - 1] = 2;
      for (int i = x.rank - 2; i >= 0; --i) x.strides[i] = x.strides[i + 1] * x.sizes[i + 1];
    }
    const fly_status s = c.run(c);
    CHECK(s == FLY_ERROR_UNSUPPORTED);
    INFO(said(s));
  }
}

TEST_CASE("status mapping: an output whose own elements overlap -> FLY_ERROR_INVALID_ARGUMENT", "[status]") {
  for (Call& c : calls()) {
    INFO(c.name);
    fly_tensor& o = c.t[c.out];
    o.strides[o.rank - 2] = 1;  // rows (or lines) one element apart: they overlap
    const fly_status s = c.run(c);
    CHECK(s == FLY_ERROR_INVALID_ARGUMENT);
    INFO(said(s));
  }
}

TEST_CASE("status mapping: an output overlapping an input -> FLY_ERROR_INVALID_ARGUMENT, before the device check",
          "[status]") {
  for (Call& c : calls()) {
    INFO(c.name);
    // The output starts 16 bytes into its input: partly overlapping (no GPU needed to see it).
    c.t[c.out].data = shifted(c.t[c.in_overlap].data, 16);
    const fly_status s = c.run(c);
    CHECK(s == FLY_ERROR_INVALID_ARGUMENT);
    INFO(said(s));
    CHECK(mentions("shares memory"));
  }
  SECTION("RMSNorm: exactly in place (y is x) is allowed, a shifted y is not") {
    std::vector<Call> v = calls();
    Call& c = v[0];
    REQUIRE(c.name == "rms_norm_fwd");
    c.t[2] = c.t[0];
    CHECK(c.run(c) == FLY_ERROR_NO_DEVICE);
    c.t[2].data = shifted(c.t[0].data, 64 * 2);  // one row further: y's row r is x's row r + 1
    CHECK(c.run(c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("y and x: the output shares memory"));
    c.t[2] = c.t[0];
    c.t[2].strides[0] = 128;  // the same base, another row stride: not the same view
    c.t[0].strides[0] = 64;
    CHECK(c.run(c) == FLY_ERROR_INVALID_ARGUMENT);
    c.t[2].strides[0] = 64;
    c.t[3].data = shifted(c.t[0].data, 0);  // rstd inside x
    CHECK(c.run(c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("rstd and x"));
  }
  SECTION("cross-entropy: dlogits exactly the logits (in place) is allowed, a shifted view is not") {
    std::vector<Call> v = calls();
    for (Call& c : v) {
      if (c.name != "cross_entropy_fwd_bwd") continue;
      c.t[4] = c.t[0];
      CHECK(c.run(c) == FLY_ERROR_NO_DEVICE);
      c.t[4].data = shifted(c.t[0].data, 64 * 2);
      CHECK(c.run(c) == FLY_ERROR_INVALID_ARGUMENT);
      CHECK(mentions("dlogits and logits"));
      c.t[4] = c.t[0];
      c.t[2].data = shifted(c.t[3].data, 4);  // loss inside lse
      CHECK(c.run(c) == FLY_ERROR_INVALID_ARGUMENT);
      CHECK(mentions("loss and lse"));
    }
  }
  SECTION("outputs overlapping each other") {
    std::vector<Call> v = calls();
    Call& topk = v[1];
    topk.t[2].data = topk.t[1].data;
    CHECK(topk.run(topk) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("indices and values"));
    Call& fwd = v[5];
    fwd.t[4].data = fwd.t[3].data;  // lse inside o
    CHECK(fwd.run(fwd) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("lse and o"));
    Call& mx = v[7];
    mx.t[2].data = shifted(mx.t[1].data, 32);  // scales inside q
    CHECK(mx.run(mx) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("scales and q"));
  }
}

TEST_CASE("status mapping: a workspace that is too small -> FLY_ERROR_WORKSPACE", "[status]") {
  for (Call& c : calls()) {
    if (!c.workspace_required) continue;
    INFO(c.name);
    c.ws_bytes -= 1;
    fly_status s = c.run(c);
    CHECK(s == FLY_ERROR_WORKSPACE);
    INFO(said(s));
    CHECK(mentions("workspace"));
    c.ws = nullptr;  // none at all
    c.ws_bytes = 0;
    s = c.run(c);
    CHECK(s == FLY_ERROR_WORKSPACE);
    INFO(said(s));
  }
  SECTION("the attention packed path: room for the call but not for the copies the query counted") {
    std::vector<Call> v = calls();
    for (int which : {5, 6}) {
      Call& c = v[size_t(which)];
      INFO(c.name);
      fly_tensor& q = c.t[0];  // a sequence stride that is not a multiple of 8: q is copied first
      q.strides[2] = 68;
      q.strides[1] = 68 * 16;
      q.strides[0] = 68 * 16 * 2;
      size_t need = 0;
      REQUIRE(c.query(c, &need) == FLY_SUCCESS);
      c.ws = slot(20);
      c.ws_bytes = need;
      CHECK(c.run(c) == FLY_ERROR_NO_DEVICE);
      // The forward's workspace is optional (its split partials shrink to fit), the copies are
      // not; the backward needs its own part and the copies.
      c.ws_bytes = which == 5 ? 256 : need - 256;
      CHECK(c.run(c) == FLY_ERROR_WORKSPACE);
      CHECK(mentions("aligned copies"));
    }
  }
}

TEST_CASE("status mapping: workspace NULL with a size -> INVALID_ARGUMENT, misaligned -> MISALIGNED, "
          "overlapping an argument -> INVALID_ARGUMENT", "[status]") {
  for (Call& c : calls()) {
    if (!c.takes_workspace) continue;
    INFO(c.name);
    const size_t bytes = c.ws_bytes ? c.ws_bytes : 4096;
    c.ws = nullptr;
    c.ws_bytes = bytes;
    CHECK(c.run(c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("workspace: NULL"));
    c.ws = shifted(slot(20), int64_t(c.ws_align / 2));
    fly_status s = c.run(c);
    CHECK(s == FLY_ERROR_MISALIGNED);
    INFO(said(s));
    c.ws = c.t[c.out].data;  // the workspace on top of the output
    s = c.run(c);
    CHECK(s == FLY_ERROR_INVALID_ARGUMENT);
    INFO(said(s));
    CHECK(mentions("workspace and"));
    c.ws = slot(20);
    c.ws_bytes = size_t(1) << 47;  // larger than any allocation
    CHECK(c.run(c) == FLY_ERROR_INVALID_ARGUMENT);
  }
}
