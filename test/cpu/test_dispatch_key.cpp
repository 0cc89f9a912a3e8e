// SPDX-License-Identifier: Apache-2.0
// src/dispatch_key.hpp, the one definition of every op's dispatch key: the same keys (op, dtype,
// layout, k[], dimension names) as the formulas each launcher spelled out before it, over many
// shapes, and the grouped GEMM M bucket as flytune grouped_gemm computed it.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "core.hpp"
#include "dispatch_key.hpp"

namespace {

// The request as make_request built it from an op's spelled-out parts before dispatch_key.hpp
// (kept here as it was, so the comparison does not go through the code under test).
fly::DispatchRequest old_request(const char* family, const char* op, const std::string& dtype, const char* layout,
                                 std::initializer_list<fly::KeyDim> dims) {
  fly::DispatchRequest req;
  req.family = family;
  req.key.op = op;
  req.key.dtype = dtype;
  req.key.layout = layout;
  int i = 0;
  for (const fly::KeyDim& d : dims) {
    if (i == fly::kKeyDims) break;
    req.key.k[i] = d.value;
    req.key_names[i++] = d.name;
  }
  for (; i < fly::kKeyDims; ++i) req.key_names[i] = "-";
  return req;
}

// The request as the key function builds it, and as the old inline formula built it.
bool same(const fly::ShapeKey& got, const fly::DispatchRequest& want) {
  const fly::DispatchRequest g = fly::make_request(want.family, got);
  bool ok = g.key.op == want.key.op && g.key.dtype == want.key.dtype && g.key.layout == want.key.layout;
  for (int i = 0; i < fly::kKeyDims; ++i)
    ok = ok && g.key.k[i] == want.key.k[i] && std::string(g.key_names[i]) == want.key_names[i];
  if (!ok) {
    UNSCOPED_INFO("got  " << g.key.str() << " names " << g.key_names[0] << "," << g.key_names[1] << ","
                          << g.key_names[2] << "," << g.key_names[3]);
    UNSCOPED_INFO("want " << want.key.str() << " names " << want.key_names[0] << "," << want.key_names[1] << ","
                          << want.key_names[2] << "," << want.key_names[3]);
  }
  return ok;
}

// Sizes that exercise the buckets: 0, 1, odd, powers of two and their neighbours, large.
std::vector<int64_t> sizes() {
  std::vector<int64_t> v = {0, 1, 2, 3, 7, 8, 9, 31, 64, 100, 127, 128, 129, 1000, 4095, 4096, 4097, 14336, 32000,
                            151936, int64_t(1) << 20, (int64_t(1) << 31) - 1};
  return v;
}

// The launchers' bucket (src/ops/grouped_gemm.cpp before dispatch_key.hpp).
int64_t old_mean_m_bucket(int64_t T, int64_t G) {
  const int64_t mean = G > 0 ? (T + G - 1) / G : 0;
  int64_t b = 1;
  while (b < mean && b < (int64_t(1) << 30)) b <<= 1;
  return b;
}
// flytune grouped_gemm's own copy (its cases have G >= 1 and a mean below 2^30).
int64_t old_tool_bucket(int64_t T, int64_t G) {
  int64_t bucket = 1;
  const int64_t mean = (T + G - 1) / G;
  while (bucket < mean) bucket <<= 1;
  return bucket;
}
std::string old_attention_layout(int hd, bool causal, int64_t hq, int64_t hkv) {
  return "d" + std::to_string(hd) + (causal ? "_causal" : "_full") + "_g" + std::to_string(hq / hkv);
}

}  // namespace

TEST_CASE("dispatch keys: row-wise, routing and MX families match the launchers' former formulas", "[dispatch_key]") {
  namespace keys = fly::keys;
  for (const char* dt : {"fp16", "bf16", "fp32"})
    for (int64_t a : sizes())
      for (int64_t b : sizes()) {
        CHECK(same(keys::rmsnorm(dt, a, b), old_request("rmsnorm", "rmsnorm_fwd", dt, "row", {{"N", b}, {"M", a}})));
        for (bool fwd : {true, false}) {
          CHECK(same(keys::add_rmsnorm(fwd, dt, a, b),
                     old_request("add_rmsnorm", fwd ? "add_rmsnorm_fwd" : "add_rmsnorm_bwd", dt, "row",
                                  {{"N", b}, {"M", a}})));
          CHECK(same(keys::glu(fwd, dt, a, b),
                     old_request("glu", fwd ? "glu_fwd" : "glu_bwd", dt, "row", {{"N", b}, {"M", a}})));
          CHECK(same(keys::moe_route(fwd, dt, a, b, 8),
                     old_request("moe_route", fwd ? "moe_route_fwd" : "moe_route_bwd", dt, "row",
                                  {{"E", b}, {"k", 8}, {"T", a}})));
        }
        CHECK(same(keys::cross_entropy(dt, a, b),
                   old_request("cross_entropy", "cross_entropy", dt, "row", {{"V", b}, {"M", a}})));
        CHECK(same(keys::rope(dt, a, b), old_request("rope", "rope", dt, "bhsd", {{"D", b}, {"S", a}})));
        for (const char* op : {"moe_gather", "moe_unpermute", "moe_unpermute_bwd", "moe_permute_bwd"})
          CHECK(same(keys::moe_rows(op, dt, a, b), old_request("moe_route", op, dt, "row", {{"H", b}, {"rows", a}})));
        CHECK(same(keys::moe_sort(dt, a, b), old_request("moe_route", "moe_sort", dt, "-", {{"E", a}, {"N", b}})));
        for (bool fp4 : {false, true}) {
          CHECK(same(keys::mx_quantize(dt, fp4, a, b),
                     old_request("mx_quantize", "mx_quantize", dt, fp4 ? "e2m1" : "e4m3", {{"K", b}, {"M", a}})));
          CHECK(same(keys::scaled_gemm_weight_only(dt, fp4, a, b, 4096),
                     old_request("mx_decode", "scaled_gemm_wo", std::string(dt) + "_" + (fp4 ? "e2m1" : "e4m3"), "nt",
                                  {{"N", b}, {"K", 4096}, {"M", a}})));
        }
      }
  for (int64_t R : sizes())
    for (int64_t C : sizes())
      for (int64_t k : {int64_t(1), int64_t(8), int64_t(64), int64_t(2048)})
        for (bool det : {false, true})
          CHECK(same(keys::topk(det, R, C, k),
                     old_request("topk", "topk", det ? "fp32_det" : "fp32", "row", {{"C", C}, {"k", k}, {"R", R}})));
}

TEST_CASE("dispatch keys: GEMM, grouped GEMM and scaled GEMM match the launchers' former formulas", "[dispatch_key]") {
  namespace keys = fly::keys;
  for (bool a_row : {true, false})
    for (bool b_row : {true, false}) {
      const std::string layout = std::string(a_row ? "n" : "t") + (b_row ? "n" : "t");
      CHECK(keys::gemm_layout(a_row, b_row) == layout);
      for (int64_t M : sizes())
        for (int64_t N : {int64_t(1), int64_t(129), int64_t(4096), int64_t(151936)})
          for (int64_t K : {int64_t(7), int64_t(4096), int64_t(14336)})
            for (const char* dt : {"fp16", "bf16"}) {
              CHECK(same(keys::gemm(dt, layout, M, N, K),
                         old_request("gemm", "gemm", dt, layout.c_str(), {{"N", N}, {"K", K}, {"M", M}})));
              CHECK(same(keys::gemm(dt, layout, M, N, K, true),
                         old_request("gemm", "gemm_odd", dt, layout.c_str(), {{"N", N}, {"K", K}, {"M", M}})));
            }
    }
  for (int64_t M : sizes())
    for (int64_t N : {int64_t(1), int64_t(2048), int64_t(4096)})
      for (int64_t K : {int64_t(32), int64_t(7168)})
        for (bool fp4 : {false, true})
          CHECK(same(keys::scaled_gemm(fp4, M, N, K),
                     old_request("mxfp", "scaled_gemm", fp4 ? "mxfp4" : "mxfp8", "nt", {{"N", N}, {"K", K}, {"M", M}})));
  for (int64_t T : sizes())
    for (int64_t G : {int64_t(0), int64_t(1), int64_t(3), int64_t(8), int64_t(64), int64_t(128), int64_t(256)})
      for (const char* dt : {"fp16", "bf16"}) {
        CHECK(keys::mean_m_bucket(T, G) == old_mean_m_bucket(T, G));
        // The tool's copy had no 2^30 cap (a mean that large never reaches a launch: T < 2^31).
        if (G > 0 && (T + G - 1) / G <= (int64_t(1) << 30)) CHECK(keys::mean_m_bucket(T, G) == old_tool_bucket(T, G));
        for (bool kmajor : {true, false})
          CHECK(same(keys::grouped_gemm(dt, kmajor, T, G, 4096, 7168),
                     old_request("grouped_gemm", "grouped_gemm", dt, kmajor ? "nt" : "nn",
                                  {{"N", 4096}, {"K", 7168}, {"M", old_mean_m_bucket(T, G)}, {"G", G}})));
        CHECK(same(keys::grouped_gemm_k(dt, 2048, 768, T, G),
                   old_request("grouped_gemm", "grouped_gemm_k", dt, "mn",
                                {{"N", 768}, {"M", 2048}, {"K", old_mean_m_bucket(T, G)}, {"G", G}})));
      }
}

TEST_CASE("dispatch keys: attention forward and backward match the launchers' former formula", "[dispatch_key]") {
  for (int hd : {64, 128, 192, 256, 512})
    for (bool causal : {false, true})
      for (int64_t hkv : {int64_t(1), int64_t(2), int64_t(8), int64_t(32)})
        for (int64_t g : {int64_t(1), int64_t(4), int64_t(7)})
          for (int64_t B : {int64_t(1), int64_t(3), int64_t(16)})
            for (int64_t S : {int64_t(1), int64_t(63), int64_t(512), int64_t(4096), int64_t(131072)})
              for (bool fwd : {true, false}) {
                const int64_t hq = hkv * g, Sq = S, Sk = S == 1 ? 8192 : S;
                const std::string layout = old_attention_layout(hd, causal, hq, hkv);
                CHECK(fly::keys::attention_layout(hd, causal, hq, hkv) == layout);
                CHECK(same(fly::keys::attention(fwd, "bf16", hd, causal, B, hq, hkv, Sq, Sk),
                           old_request(fwd ? "attention" : "attention_bwd", fwd ? "attention_fwd" : "attention_bwd",
                                        "bf16", layout.c_str(), {{"Sk", Sk}, {"Sq", Sq}, {"BH", B * hq}})));
              }
}

TEST_CASE("dispatch keys: shape_key keeps at most kKeyDims dimensions and names the rest \"-\"", "[dispatch_key]") {
  const fly::ShapeKey s = fly::shape_key("op", "bf16", "row", {{"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}, {"e", 5}});
  CHECK((s.key.k[0] == 1 && s.key.k[3] == 4));
  CHECK(std::string(s.names[3]) == "d");
  const fly::ShapeKey t = fly::shape_key("op", "bf16", "row", {{"a", 9}});
  CHECK((t.key.k[0] == 9 && t.key.k[1] == 0 && t.key.k[3] == 0));
  CHECK((std::string(t.names[0]) == "a" && std::string(t.names[1]) == "-" && std::string(t.names[3]) == "-"));
}
