// SPDX-License-Identifier: Apache-2.0
// fly_moe_* on bad input: a status and a message naming the argument, never a crash; valid
// input reaches the device check; empty shapes are no-ops. Runs without a GPU (validation
// happens before any device query).
#include <string>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;
using fly_test::mentions;
using fly_test::vec;

void* at(int i) { return fly_test::fake_address(i); }
void check_valid(fly_status s) { CHECK(fly_test::reached_device(s)); }

}  // namespace

TEST_CASE("moe router rejects bad arguments with a status and a message", "[moe_route][args]") {
  fly_tensor l = mat(at(0), FLY_BF16, 16, 128, 128), w = mat(at(1), FLY_F32, 16, 8, 8), ids = mat(at(2), FLY_I64, 16, 8, 8);
  fly_tensor dw = mat(at(3), FLY_F32, 16, 8, 8), dl = mat(at(4), FLY_BF16, 16, 128, 128);
  check_valid(fly_moe_route_fwd(&l, 8, FLY_MOE_SOFTMAX, FLY_MOE_RENORMALIZE, &w, &ids, nullptr));
  check_valid(fly_moe_route_bwd(&dw, &l, &ids, FLY_MOE_SOFTMAX, FLY_MOE_RENORMALIZE, &dl, nullptr));

  SECTION("null descriptors") {
    CHECK(fly_moe_route_fwd(nullptr, 8, 0, 0, &w, &ids, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("logits"));
    CHECK(fly_moe_route_fwd(&l, 8, 0, 0, nullptr, &ids, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("weights"));
    CHECK(fly_moe_route_fwd(&l, 8, 0, 0, &w, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("ids"));
    CHECK(fly_moe_route_bwd(nullptr, &l, &ids, 0, 0, &dl, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dweights"));
    CHECK(fly_moe_route_bwd(&dw, &l, &ids, 0, 0, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dlogits"));
  }
  SECTION("k, score, flags, E") {
    CHECK(fly_moe_route_fwd(&l, 0, 0, 0, &w, &ids, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("k: 0 is outside 1..E"));
    CHECK(fly_moe_route_fwd(&l, 129, 0, 0, &w, &ids, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(fly_moe_route_fwd(&l, 8, 2, 0, &w, &ids, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("score: 2"));
    CHECK(fly_moe_route_fwd(&l, 8, 0, 4, &w, &ids, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("flags: 4"));
    fly_tensor big = mat(at(0), FLY_BF16, 16, 1025, 1025);
    CHECK(fly_moe_route_fwd(&big, 8, 0, 0, &w, &ids, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("at most 1024"));
  }
  SECTION("dtypes and shapes") {
    l.dtype = FLY_F64;
    CHECK(fly_moe_route_fwd(&l, 8, 0, 0, &w, &ids, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("logits: dtype fp64 is not supported"));
    l.dtype = FLY_BF16;
    w.dtype = FLY_F16;
    CHECK(fly_moe_route_fwd(&l, 8, 0, 0, &w, &ids, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("weights: dtype fp16, expected fp32 or the dtype of logits (bf16)"));
    w.dtype = FLY_BF16;  // the logits' dtype: fine
    check_valid(fly_moe_route_fwd(&l, 8, 0, 0, &w, &ids, nullptr));
    ids.dtype = FLY_F32;
    CHECK(fly_moe_route_fwd(&l, 8, 0, 0, &w, &ids, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("ids: dtype fp32, expected int32 or int64"));
    ids.dtype = FLY_I32;
    ids.sizes[1] = 4;
    CHECK(fly_moe_route_fwd(&l, 8, 0, 0, &w, &ids, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("ids: shape [16, 4], expected [16, 8]"));
    ids.sizes[1] = 8;
    dl.dtype = FLY_F32;
    CHECK(fly_moe_route_bwd(&dw, &l, &ids, 0, 0, &dl, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dlogits: dtype fp32 does not match logits"));
    dl.dtype = FLY_BF16;
    l.strides[1] = 2;
    CHECK(fly_moe_route_fwd(&l, 8, 0, 0, &w, &ids, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("logits: inner stride"));
  }
  SECTION("overlaps") {
    fly_tensor w2 = mat(static_cast<char*>(at(2)) + 16, FLY_F32, 16, 8, 8);
    CHECK(fly_moe_route_fwd(&l, 8, 0, 0, &w2, &ids, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("ids and weights: the output shares memory"));
    fly_tensor dl2 = mat(at(0), FLY_BF16, 16, 128, 128);
    CHECK(fly_moe_route_bwd(&dw, &l, &ids, 0, 0, &dl2, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("dlogits and logits"));
  }
  SECTION("no tokens: a no-op") {
    fly_tensor l0 = mat(nullptr, FLY_F32, 0, 64, 64), w0 = mat(nullptr, FLY_F32, 0, 4, 4);
    fly_tensor i0 = mat(nullptr, FLY_I32, 0, 4, 4), d0 = mat(nullptr, FLY_F32, 0, 64, 64);
    CHECK(fly_moe_route_fwd(&l0, 4, 0, 0, &w0, &i0, nullptr) == FLY_SUCCESS);
    CHECK(fly_moe_route_bwd(&w0, &l0, &i0, 0, 0, &d0, nullptr) == FLY_SUCCESS);
  }
}

TEST_CASE("moe permute rejects bad arguments; its workspace query", "[moe_route][args]") {
  const int64_t T = 32, k = 8, E = 64, H = 256, N = T * k;
  size_t need = 0;
  REQUIRE(fly_moe_permute_workspace_size(T, k, E, &need) == FLY_SUCCESS);
  CHECK(need >= size_t((E + 1) * 4));
  CHECK(need % 256 == 0);
  size_t none = 1;
  REQUIRE(fly_moe_permute_workspace_size(0, k, E, &none) == FLY_SUCCESS);
  CHECK(none == 0);
  CHECK(fly_moe_permute_workspace_size(T, k, 0, &none) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("num_experts"));
  CHECK(fly_moe_permute_workspace_size(T, k, 2048, &none) == FLY_ERROR_UNSUPPORTED);
  CHECK(fly_moe_permute_workspace_size(T, k, E, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(fly_moe_permute_workspace_size(int64_t(1) << 30, 8, E, &none) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("2^31"));

  fly_tensor x = mat(at(0), FLY_BF16, T, H, H), ids = mat(at(1), FLY_I64, T, k, k), xp = mat(at(2), FLY_BF16, N, H, H);
  fly_tensor offs = vec(at(3), FLY_I32, E), row = mat(at(4), FLY_I32, T, k, k), pair = vec(at(5), FLY_I32, N);
  void* ws = at(6);
  check_valid(fly_moe_permute(&x, &ids, &xp, &offs, &row, &pair, ws, need, nullptr));
  check_valid(fly_moe_permute(nullptr, &ids, nullptr, &offs, &row, &pair, ws, need, nullptr));  // indices only

  SECTION("arguments") {
    CHECK(fly_moe_permute(&x, nullptr, &xp, &offs, &row, &pair, ws, need, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("ids: descriptor is NULL"));
    CHECK(fly_moe_permute(&x, &ids, nullptr, &offs, &row, &pair, ws, need, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x_perm"));
    CHECK(fly_moe_permute(nullptr, &ids, &xp, &offs, &row, &pair, ws, need, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x_perm: given without x"));
    x.sizes[0] = T + 1;
    CHECK(fly_moe_permute(&x, &ids, &xp, &offs, &row, &pair, ws, need, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x: 33 rows"));
    x.sizes[0] = T;
    xp.dtype = FLY_F16;
    CHECK(fly_moe_permute(&x, &ids, &xp, &offs, &row, &pair, ws, need, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x_perm: dtype fp16 does not match x"));
    xp.dtype = FLY_BF16;
    offs.dtype = FLY_I64;
    CHECK(fly_moe_permute(&x, &ids, &xp, &offs, &row, &pair, ws, need, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("offsets: dtype int64, expected int32"));
    offs.dtype = FLY_I32;
    pair.sizes[0] = N - 1;
    CHECK(fly_moe_permute(&x, &ids, &xp, &offs, &row, &pair, ws, need, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("pair_of: expected 256 elements"));
    pair.sizes[0] = N;
    ids.dtype = FLY_F32;
    CHECK(fly_moe_permute(&x, &ids, &xp, &offs, &row, &pair, ws, need, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("ids: dtype fp32"));
  }
  SECTION("workspace") {
    CHECK(fly_moe_permute(&x, &ids, &xp, &offs, &row, &pair, ws, need - 1, nullptr) == FLY_ERROR_WORKSPACE);
    CHECK(mentions("fly_moe_permute_workspace_size"));
    CHECK(fly_moe_permute(&x, &ids, &xp, &offs, &row, &pair, nullptr, 0, nullptr) == FLY_ERROR_WORKSPACE);
    CHECK(fly_moe_permute(&x, &ids, &xp, &offs, &row, &pair, static_cast<char*>(ws) + 16, need, nullptr) ==
          FLY_ERROR_MISALIGNED);
    CHECK(fly_moe_permute(&x, &ids, &xp, &offs, &row, &pair, at(4), need, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("workspace and row_of"));
  }
  SECTION("outputs overlapping") {
    fly_tensor row2 = mat(at(3), FLY_I32, T, k, k);
    CHECK(fly_moe_permute(&x, &ids, &xp, &offs, &row2, &pair, ws, need, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("row_of and offsets"));
    fly_tensor xp2 = mat(at(0), FLY_BF16, N, H, H);
    CHECK(fly_moe_permute(&x, &ids, &xp2, &offs, &row, &pair, ws, need, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x_perm and x"));
  }
}

TEST_CASE("moe unpermute and the backward passes reject bad arguments", "[moe_route][args]") {
  const int64_t T = 32, k = 8, E = 64, H = 256, N = T * k;
  fly_tensor op = mat(at(0), FLY_BF16, N, H, H), w = mat(at(1), FLY_F32, T, k, k), row = mat(at(2), FLY_I32, T, k, k);
  fly_tensor offs = vec(at(3), FLY_I32, E), y = mat(at(4), FLY_BF16, T, H, H), dy = mat(at(5), FLY_BF16, T, H, H);
  fly_tensor dop = mat(at(6), FLY_BF16, N, H, H), dw = mat(at(7), FLY_F32, T, k, k);
  check_valid(fly_moe_unpermute(&op, &w, &row, &offs, &y, nullptr));
  check_valid(fly_moe_unpermute(&op, nullptr, &row, &offs, &y, nullptr));
  check_valid(fly_moe_permute_bwd(&op, &row, &offs, &y, nullptr));
  check_valid(fly_moe_unpermute_bwd(&dy, &op, &w, &row, &offs, &dop, &dw, nullptr));
  check_valid(fly_moe_unpermute_bwd(&dy, &op, &w, &row, &offs, &dop, nullptr, nullptr));

  CHECK(fly_moe_unpermute(nullptr, &w, &row, &offs, &y, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("out_perm: descriptor is NULL"));
  CHECK(fly_moe_permute_bwd(nullptr, &row, &offs, &y, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("dx_perm"));
  CHECK(fly_moe_unpermute_bwd(nullptr, &op, &w, &row, &offs, &dop, &dw, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("dy"));
  fly_tensor op_short = mat(at(0), FLY_BF16, N - 1, H, H);
  CHECK(fly_moe_unpermute(&op_short, &w, &row, &offs, &y, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("out_perm: 255 rows"));
  w.dtype = FLY_F16;
  CHECK(fly_moe_unpermute(&op, &w, &row, &offs, &y, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("weights: dtype fp16"));
  w.dtype = FLY_BF16;  // the data's dtype: fine
  check_valid(fly_moe_unpermute(&op, &w, &row, &offs, &y, nullptr));
  dw.dtype = FLY_F32;
  CHECK(fly_moe_unpermute_bwd(&dy, &op, &w, &row, &offs, &dop, &dw, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("dweights: dtype fp32 does not match weights"));
  w.dtype = FLY_F32;
  row.dtype = FLY_I64;
  CHECK(fly_moe_unpermute(&op, &w, &row, &offs, &y, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("row_of: dtype int64"));
  row.dtype = FLY_I32;
  y.dtype = FLY_F32;
  CHECK(fly_moe_unpermute(&op, &w, &row, &offs, &y, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("y: dtype fp32 does not match out_perm"));
  y.dtype = FLY_BF16;
  fly_tensor e0 = vec(at(3), FLY_I32, 0);
  CHECK(fly_moe_unpermute(&op, &w, &row, &e0, &y, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("offsets: needs one entry per expert"));
  fly_tensor y_in_op = mat(static_cast<char*>(at(0)) + 64, FLY_BF16, T, H, H);
  CHECK(fly_moe_unpermute(&op, &w, &row, &offs, &y_in_op, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("y and out_perm: the output shares memory"));
  fly_tensor dw_in_dop = mat(at(6), FLY_F32, T, k, k);
  CHECK(fly_moe_unpermute_bwd(&dy, &op, &w, &row, &offs, &dop, &dw_in_dop, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("dweights and dout_perm"));

  // No tokens: no-ops.
  fly_tensor op0 = mat(nullptr, FLY_BF16, 0, H, H), w0 = mat(nullptr, FLY_F32, 0, k, k), r0 = mat(nullptr, FLY_I32, 0, k, k);
  fly_tensor y0 = mat(nullptr, FLY_BF16, 0, H, H);
  CHECK(fly_moe_unpermute(&op0, &w0, &r0, &offs, &y0, nullptr) == FLY_SUCCESS);
  CHECK(fly_moe_permute_bwd(&op0, &r0, &offs, &y0, nullptr) == FLY_SUCCESS);
  CHECK(fly_moe_unpermute_bwd(&y0, &op0, &w0, &r0, &offs, &op0, &w0, nullptr) == FLY_SUCCESS);
}
