// SPDX-License-Identifier: Apache-2.0
// The dispatch key of every op, defined once: the launchers (src/ops/*.cpp) look the tuning
// database up with these functions, and the tools that must know a key before any launch (flytune
// grouped_gemm groups its cases by key) call the same ones, so a row is written under exactly the
// key a call computes. Header-only and free of the CUDA and library headers: the tools reach the
// library only through its C ABI (a tool that has just launched reads the launcher's key back
// with fly_last_key instead).
//
// Each function takes the problem as its launcher has validated it (dtype by name, shape features)
// and returns the key with the names of its dimensions (for the dispatch log). Key dimensions are
// ordered most significant first: the nearest-row rule weights k[0] most (tuning_db.hpp).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace fly {

// Key of one call. k[] holds the shape features the family tunes on, most significant first.
// Missing ones are 0. kKeyDims and the field order are the C ABI's (fly_last_key) and the
// tuning table's (db/schema.sql: k0..k3).
constexpr int kKeyDims = 4;
struct DispatchKey {
  std::string op;       // "rmsnorm_fwd", "topk", "gemm"
  std::string dtype;    // "bf16"
  std::string layout;   // "row", "nt", ... ("-" when none)
  int64_t k[kKeyDims] = {0, 0, 0, 0};
  std::string str() const;  // for logs: "rmsnorm_fwd bf16 row 4096 8192 0 0" (src/dispatch.cpp)
};

// One named dimension of a dispatch key ("N" = 4096).
struct KeyDim {
  const char* name;
  int64_t value;
};

// A key and the names of its k[] dimensions ("-" where unused).
struct ShapeKey {
  DispatchKey key;
  const char* names[kKeyDims] = {"-", "-", "-", "-"};
};

// The key from its parts: dimensions in k0, k1, ... order; more than kKeyDims are dropped.
inline ShapeKey shape_key(const std::string& op, const std::string& dtype, const std::string& layout,
                          std::initializer_list<KeyDim> dims) {
  ShapeKey s;
  s.key.op = op;
  s.key.dtype = dtype;
  s.key.layout = layout;
  int i = 0;
  for (const KeyDim& d : dims) {
    if (i == kKeyDims) break;
    s.key.k[i] = d.value;
    s.names[i++] = d.name;
  }
  return s;
}

namespace keys {

// ---- row-wise families: (N, M), the row length first (it picks the tile) ----------------------
inline ShapeKey rmsnorm(const std::string& dtype, int64_t M, int64_t N) {
  return shape_key("rmsnorm_fwd", dtype, "row", {{"N", N}, {"M", M}});
}
inline ShapeKey add_rmsnorm(bool fwd, const std::string& dtype, int64_t M, int64_t N) {
  return shape_key(fwd ? "add_rmsnorm_fwd" : "add_rmsnorm_bwd", dtype, "row", {{"N", N}, {"M", M}});
}
inline ShapeKey glu(bool fwd, const std::string& dtype, int64_t M, int64_t N) {
  return shape_key(fwd ? "glu_fwd" : "glu_bwd", dtype, "row", {{"N", N}, {"M", M}});
}
// M rows of V logits.
inline ShapeKey cross_entropy(const std::string& dtype, int64_t M, int64_t V) {
  return shape_key("cross_entropy", dtype, "row", {{"V", V}, {"M", M}});
}
// [B, H, S, D] operands: head dim, then sequence length.
inline ShapeKey rope(const std::string& dtype, int64_t S, int64_t D) {
  return shape_key("rope", dtype, "bhsd", {{"D", D}, {"S", S}});
}
// R rows of C columns, k kept per row; the deterministic mode is keyed apart (other winners).
inline ShapeKey topk(bool deterministic, int64_t R, int64_t C, int64_t k) {
  return shape_key("topk", deterministic ? "fp32_det" : "fp32", "row", {{"C", C}, {"k", k}, {"R", R}});
}

// ---- MoE routing ------------------------------------------------------------------------------
// The router (fwd / bwd): T tokens, E experts, k chosen per token.
inline ShapeKey moe_route(bool fwd, const std::string& dtype, int64_t T, int64_t E, int64_t k) {
  return shape_key(fwd ? "moe_route_fwd" : "moe_route_bwd", dtype, "row", {{"E", E}, {"k", k}, {"T", T}});
}
// The row movers ("moe_gather", "moe_unpermute", "moe_unpermute_bwd", "moe_permute_bwd"): `rows`
// rows of H elements.
inline ShapeKey moe_rows(const std::string& op, const std::string& dtype, int64_t rows, int64_t H) {
  return shape_key(op, dtype, "row", {{"H", H}, {"rows", rows}});
}
// The sort of N expert ids (dtype: the ids') over E experts.
inline ShapeKey moe_sort(const std::string& ids_dtype, int64_t E, int64_t N) {
  return shape_key("moe_sort", ids_dtype, "-", {{"E", E}, {"N", N}});
}

// ---- GEMM -------------------------------------------------------------------------------------
// Layout field: A row- ("n") or column-major ("t"), then B, as fly_gemm reads the operands.
inline std::string gemm_layout(bool a_row, bool b_row) { return std::string(a_row ? "n" : "t") + (b_row ? "n" : "t"); }
// C[M, N] = A[M, K] B[K, N]. `odd`: the cp.async path's own key (op "gemm_odd": operands TMA
// cannot address, no workspace to copy them into).
inline ShapeKey gemm(const std::string& dtype, const std::string& layout, int64_t M, int64_t N, int64_t K,
                     bool odd = false) {
  return shape_key(odd ? "gemm_odd" : "gemm", dtype, layout, {{"N", N}, {"K", K}, {"M", M}});
}

// Mean rows per group, rounded up to a power of two (at most 2^30): grouped GEMM's M bucket. 1
// when G or T is 0.
inline int64_t mean_m_bucket(int64_t T, int64_t G) {
  const int64_t mean = G > 0 ? (T + G - 1) / G : 0;
  int64_t b = 1;
  while (b < mean && b < (int64_t(1) << 30)) b <<= 1;
  return b;
}
// G groups of T rows in all, each times its own B (K-major "nt" or N-major "nn").
inline ShapeKey grouped_gemm(const std::string& dtype, bool b_kmajor, int64_t T, int64_t G, int64_t N, int64_t K) {
  return shape_key("grouped_gemm", dtype, b_kmajor ? "nt" : "nn",
                   {{"N", N}, {"K", K}, {"M", mean_m_bucket(T, G)}, {"G", G}});
}
// The ragged-K mode (dB): G groups splitting Ktot, each an [M, N] output; layout "mn" (a's
// contiguous dimension m, b's n: the one order taken); the mean-k bucket in M's place.
inline ShapeKey grouped_gemm_k(const std::string& dtype, int64_t M, int64_t N, int64_t Ktot, int64_t G) {
  return shape_key("grouped_gemm_k", dtype, "mn", {{"N", N}, {"M", M}, {"K", mean_m_bucket(Ktot, G)}, {"G", G}});
}

// ---- MX ---------------------------------------------------------------------------------------
// Block-scaled GEMM, both operands MX (dtype the format).
inline ShapeKey scaled_gemm(bool fp4, int64_t M, int64_t N, int64_t K) {
  return shape_key("scaled_gemm", fp4 ? "mxfp4" : "mxfp8", "nt", {{"N", N}, {"K", K}, {"M", M}});
}
// Weight-only decode: activations of dtype `act` ("bf16", "fp16") times MX weights.
inline ShapeKey scaled_gemm_weight_only(const std::string& act, bool fp4, int64_t M, int64_t N, int64_t K) {
  return shape_key("scaled_gemm_wo", act + (fp4 ? "_e2m1" : "_e4m3"), "nt", {{"N", N}, {"K", K}, {"M", M}});
}
// Quantizing M rows of K elements; layout the element format.
inline ShapeKey mx_quantize(const std::string& dtype, bool fp4, int64_t M, int64_t K) {
  return shape_key("mx_quantize", dtype, fp4 ? "e2m1" : "e4m3", {{"K", K}, {"M", M}});
}

// ---- attention --------------------------------------------------------------------------------
// Layout field: compiled head dim, causal, GQA ratio ("d128_causal_g4").
inline std::string attention_layout(int hd, bool causal, int64_t Hq, int64_t Hkv) {
  return "d" + std::to_string(hd) + (causal ? "_causal" : "_full") + "_g" + std::to_string(Hq / Hkv);
}
// Forward or backward; hd the compiled head dim the call runs with (the launcher's choice for D).
inline ShapeKey attention(bool fwd, const std::string& dtype, int hd, bool causal, int64_t B, int64_t Hq, int64_t Hkv,
                          int64_t Sq, int64_t Sk) {
  return shape_key(fwd ? "attention_fwd" : "attention_bwd", dtype, attention_layout(hd, causal, Hq, Hkv),
                   {{"Sk", Sk}, {"Sq", Sq}, {"BH", B * Hq}});
}

}  // namespace keys
}  // namespace fly
