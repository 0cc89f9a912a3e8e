// SPDX-License-Identifier: Apache-2.0
// Attention forward on the GPU against an FP64 host reference on fresh random data: compiled and
// odd head dims, Sq != Sk with and without causal (top-left), lengths off the tile (1, 17, 1000),
// a single query against 8192 keys (split keys, GQA packing), GQA, BHSD and BSHD views, both
// dtypes, every bundled variant; the wide-head schedule (D 257..512) in [attention_wide]. O (padding
// included) and LSE are poisoned beforehand.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "flykernels/flykernels.hpp"
#include "attention_test_util.hpp"

namespace {

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)

using attn_test::describe;
using attn_test::from_float;
using attn_test::layout;
using attn_test::Layout;
using attn_test::to_float;

struct Case {
  fly_dtype dt = FLY_BF16;
  int64_t B = 1, Hq = 2, Hkv = 2, Sq = 128, Sk = 128, D = 64;
  bool causal = false;
  bool bshd = false;       // [B, S, H, D] memory viewed as [B, H, S, D]
  int64_t ld = 0;          // row length in memory (>= D, multiple of 8); 0: D rounded up to 8
  bool lse = true;
  bool workspace = true;
  double scale = 0;        // 0: 1/sqrt(D)
  const char* force = nullptr;
};

// O and LSE of one (b, h) in double; top-left causal; empty rows give O = 0, LSE = -inf.
void reference(const Case& c, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
               const Layout& lq, const Layout& lk, double scale, int64_t b, int64_t h, std::vector<double>& o,
               std::vector<double>& lse) {
  const int64_t hk = h / (c.Hq / c.Hkv);
  std::vector<double> s(size_t(std::max<int64_t>(c.Sk, 1)));
  for (int64_t i = 0; i < c.Sq; ++i) {
    const float* qi = &q[size_t(b * lq.sb + h * lq.sh + i * lq.ss)];
    const int64_t nk = c.causal ? std::min(c.Sk, i + 1) : c.Sk;
    double mx = -INFINITY;
    for (int64_t j = 0; j < nk; ++j) {
      const float* kj = &k[size_t(b * lk.sb + hk * lk.sh + j * lk.ss)];
      double acc = 0;
      for (int64_t d = 0; d < c.D; ++d) acc += double(qi[d]) * kj[d];
      s[size_t(j)] = acc * scale;
      mx = std::max(mx, s[size_t(j)]);
    }
    double sum = 0;
    for (int64_t j = 0; j < nk; ++j) sum += (s[size_t(j)] = std::exp(s[size_t(j)] - mx));
    double* oi = &o[size_t(((b * c.Hq + h) * c.Sq + i) * c.D)];
    for (int64_t d = 0; d < c.D; ++d) oi[d] = 0;
    for (int64_t j = 0; j < nk; ++j) {
      const float* vj = &v[size_t(b * lk.sb + hk * lk.sh + j * lk.ss)];
      const double w = s[size_t(j)] / sum;
      for (int64_t d = 0; d < c.D; ++d) oi[d] += w * vj[d];
    }
    lse[size_t((b * c.Hq + h) * c.Sq + i)] = nk > 0 ? mx + std::log(sum) : -INFINITY;
  }
}

struct Result {
  fly_status status;
  std::string msg, variant;
  double o_rel = 0, lse_abs = 0;
  bool o_finite = true, padding_untouched = true, lse_ok = true;
};

Result run_case(const Case& c) {
  const int64_t ld = c.ld ? c.ld : (c.D + 7) / 8 * 8;
  const Layout lq = layout(c, c.Hq, c.Sq, ld), lk = layout(c, c.Hkv, c.Sk, ld);
  std::mt19937 rng(uint32_t(c.B * 7919 + c.Hq * 131 + c.Sq * 17 + c.Sk * 3 + c.D + c.causal + 1000 * c.dt));
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  auto make = [&](const Layout& l, std::vector<float>& f, std::vector<uint16_t>& bits) {
    f.assign(size_t(l.elems), 0.f);
    bits.assign(size_t(l.elems), from_float(0.f, c.dt));
    for (size_t i = 0; i < f.size(); ++i) {
      bits[i] = from_float(u(rng), c.dt);
      f[i] = to_float(bits[i], c.dt);  // the reference sees exactly the rounded inputs
    }
  };
  std::vector<float> fq, fk, fv;
  std::vector<uint16_t> hq, hk, hv;
  make(lq, fq, hq);
  make(lk, fk, hk);
  make(lk, fv, hv);
  auto dev = [](const std::vector<uint16_t>& h) {
    void* p = nullptr;
    REQUIRE(cudaMalloc(&p, std::max<size_t>(h.size() * 2, 16)) == cudaSuccess);
    if (!h.empty()) REQUIRE(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    return p;
  };
  void *dq = dev(hq), *dk = dev(hk), *dv = dev(hv), *dout = nullptr, *dlse = nullptr, *dws = nullptr;
  const size_t o_bytes = std::max<size_t>(size_t(lq.elems) * 2, 16);
  CUDA_OK(cudaMalloc(&dout, o_bytes));
  CUDA_OK(cudaMemset(dout, 0xff, o_bytes));  // NaN in fp16 and bf16: unwritten elements fail
  const size_t lse_n = size_t(c.B * c.Hq * c.Sq);
  CUDA_OK(cudaMalloc(&dlse, std::max<size_t>(lse_n * 4, 16)));
  CUDA_OK(cudaMemset(dlse, 0xff, std::max<size_t>(lse_n * 4, 16)));
  const fly_tensor tq = flykernels::tensor(dq, c.dt, {c.B, c.Hq, c.Sq, c.D}, {lq.sb, lq.sh, lq.ss, 1});
  const fly_tensor tk = flykernels::tensor(dk, c.dt, {c.B, c.Hkv, c.Sk, c.D}, {lk.sb, lk.sh, lk.ss, 1});
  const fly_tensor tv = flykernels::tensor(dv, c.dt, {c.B, c.Hkv, c.Sk, c.D}, {lk.sb, lk.sh, lk.ss, 1});
  const fly_tensor to = flykernels::tensor(dout, c.dt, {c.B, c.Hq, c.Sq, c.D}, {lq.sb, lq.sh, lq.ss, 1});
  const fly_tensor tl = flykernels::tensor(dlse, FLY_F32, {c.B, c.Hq, c.Sq});
  fly_attention_fwd_params p{};
  p.struct_size = sizeof(p);
  p.q = &tq;
  p.k = &tk;
  p.v = &tv;
  p.o = &to;
  p.lse = c.lse ? &tl : nullptr;
  p.softmax_scale = c.scale;
  p.causal = c.causal;
  size_t ws = 0;
  const fly_status ws_status = fly_attention_fwd_workspace_size(&p, &ws);
  if (ws_status != FLY_SUCCESS) {
    CHECK(ws_status == fly_attention_fwd(&p, nullptr));  // the query refuses what the call refuses
    ws = 0;
  }
  if (c.workspace && ws > 0) {
    CUDA_OK(cudaMalloc(&dws, ws));
    CUDA_OK(cudaMemset(dws, 0xff, ws));
    p.workspace = dws;
    p.workspace_bytes = ws;
  }
  if (c.force) REQUIRE(fly_force_variant(c.force) == FLY_SUCCESS);
  Result r;
  r.status = fly_attention_fwd(&p, nullptr);
  r.msg = fly_get_last_error();
  r.variant = fly_last_variant() ? fly_last_variant() : "";
  if (c.force) fly_force_variant(nullptr);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  if (r.status == FLY_SUCCESS) {
    std::vector<uint16_t> ho(size_t(lq.elems));
    if (!ho.empty()) CUDA_OK(cudaMemcpy(ho.data(), dout, ho.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<float> hl(lse_n);
    if (!hl.empty()) CUDA_OK(cudaMemcpy(hl.data(), dlse, lse_n * 4, cudaMemcpyDeviceToHost));
    const double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(double(c.D));
    std::vector<double> ro(size_t(c.B * c.Hq * c.Sq * c.D)), rl(lse_n);
    std::vector<std::thread> pool;
    const int64_t bh = c.B * c.Hq;
    const int nt = int(std::min<int64_t>(bh, 16));
    for (int t = 0; t < nt; ++t)
      pool.emplace_back([&, t] {
        for (int64_t x = t; x < bh; x += nt) reference(c, fq, fk, fv, lq, lk, scale, x / c.Hq, x % c.Hq, ro, rl);
      });
    for (auto& th : pool) th.join();
    double num = 0, den = 0;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < c.Sq; ++i)
          for (int64_t d = 0; d < ld; ++d) {
            const uint16_t bits = ho[size_t(b * lq.sb + h * lq.sh + i * lq.ss + d)];
            if (d >= c.D) {
              if (bits != 0xffff) r.padding_untouched = false;
              continue;
            }
            const double got = to_float(bits, c.dt), want = ro[size_t(((b * c.Hq + h) * c.Sq + i) * c.D + d)];
            if (!std::isfinite(got)) r.o_finite = false;
            num += (got - want) * (got - want);
            den += want * want;
          }
    r.o_rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    if (c.lse)
      for (size_t i = 0; i < lse_n; ++i) {
        if (std::isinf(rl[i])) {
          if (!(std::isinf(hl[i]) && hl[i] < 0)) r.lse_ok = false;
          continue;
        }
        if (!std::isfinite(hl[i])) { r.lse_ok = false; continue; }
        r.lse_abs = std::max(r.lse_abs, std::fabs(double(hl[i]) - rl[i]));
      }
  }
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(dv);
  cudaFree(dout);
  cudaFree(dlse);
  if (dws) cudaFree(dws);
  return r;
}

void check_case(const Case& c) {
  const Result r = run_case(c);
  INFO(describe(c) << " -> " << fly_status_string(r.status) << " " << r.msg << " variant " << r.variant << " o_rel "
                   << r.o_rel << " lse_abs " << r.lse_abs);
  REQUIRE(r.status == FLY_SUCCESS);
  CHECK(r.o_finite);
  CHECK(r.padding_untouched);
  CHECK(r.o_rel < (c.dt == FLY_BF16 ? 1.5e-2 : 4e-3));
  CHECK(r.lse_ok);
  CHECK(r.lse_abs < 2e-3);
}

}  // namespace

TEST_CASE("attention_fwd: compiled and odd head dims", "[attention][gpu]") {
  for (int64_t d : {64, 128, 192, 256, 32, 96, 40, 72, 100, 200, 1, 8})
    for (bool causal : {false, true}) {
      Case c;
      c.D = d;
      c.Sq = 200;
      c.Sk = 333;
      c.causal = causal;
      c.dt = (d % 3 == 0) ? FLY_F16 : FLY_BF16;
      check_case(c);
    }
}

TEST_CASE("attention_fwd: sequence lengths off the tile, Sq != Sk", "[attention][gpu]") {
  for (auto sizes : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {17, 17}, {1000, 1000}, {100, 300}, {300, 100}, {1, 129}, {129, 1}})
    for (bool causal : {false, true})
      for (fly_dtype dt : {FLY_BF16, FLY_F16}) {
        Case c;
        c.Sq = sizes.first;
        c.Sk = sizes.second;
        c.causal = causal;
        c.dt = dt;
        c.D = sizes.first == 1000 ? 64 : 128;
        check_case(c);
      }
}

TEST_CASE("attention_fwd: grouped-query, both layouts, padded rows, explicit scale", "[attention][gpu]") {
  for (bool bshd : {false, true})
    for (bool causal : {false, true}) {
      Case c;
      c.B = 2;
      c.Hq = 8;
      c.Hkv = 2;
      c.Sq = 150;
      c.Sk = 260;
      c.D = 128;
      c.causal = causal;
      c.bshd = bshd;
      check_case(c);
      c.ld = 136;  // padded rows: padding must stay untouched
      c.D = 72;
      c.scale = 0.3;
      c.dt = FLY_F16;
      check_case(c);
    }
  // packed GQA (group x Sq rows in one tile), causal across the packed rows
  for (bool causal : {false, true}) {
    Case c;
    c.B = 2;
    c.Hq = 16;
    c.Hkv = 2;
    c.Sq = 5;
    c.Sk = 700;
    c.causal = causal;
    check_case(c);
  }
}

TEST_CASE("attention_fwd: one query against 8192 keys (split keys), with and without workspace", "[attention][gpu]") {
  for (bool ws : {true, false})
    for (int64_t hkv : {8, 32}) {
      Case c;
      c.B = 2;
      c.Hq = 32;
      c.Hkv = hkv;
      c.Sq = 1;
      c.Sk = 8192;
      c.D = 128;
      c.workspace = ws;
      check_case(c);
    }
  Case c;  // a lone head: the most splits
  c.B = 1;
  c.Hq = 1;
  c.Hkv = 1;
  c.Sq = 3;
  c.Sk = 20000;
  c.D = 64;
  c.causal = false;
  check_case(c);
  c.causal = true;  // top-left: rows see 1..3 keys, most splits empty
  check_case(c);
}

TEST_CASE("attention_fwd: Sk = 0 writes O = 0 and LSE = -inf; unsupported input says why", "[attention][gpu]") {
  Case c;
  c.Sk = 0;
  const Result r = run_case(c);
  INFO(r.msg);
  REQUIRE(r.status == FLY_SUCCESS);
  CHECK(r.o_finite);
  CHECK(r.o_rel == 0.0);
  CHECK(r.lse_ok);
  Case wide;
  wide.D = 520;
  wide.Sq = wide.Sk = 64;
  const Result w = run_case(wide);
  CHECK(w.status == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(w.msg.find("head dim D = 520 exceeds the maximum 512") != std::string::npos);
  Case wide0;  // Sk = 0 through the wide schedule
  wide0.D = 512;
  wide0.Sk = 0;
  const Result w0 = run_case(wide0);
  REQUIRE(w0.status == FLY_SUCCESS);
  CHECK(w0.o_finite);
  CHECK(w0.o_rel == 0.0);
  CHECK(w0.lse_ok);
  Case odd;
  odd.D = 100;
  odd.ld = 100;  // 200-byte rows: not a TMA stride; without a workspace there is no room to copy them
  odd.workspace = false;
  const Result o = run_case(odd);
  CHECK(o.status == FLY_ERROR_WORKSPACE);
  CHECK(o.msg.find("multiple of 8") != std::string::npos);
  CHECK(o.msg.find("with a workspace of") != std::string::npos);
}

// Rows TMA cannot take (a row length in memory that is not a multiple of 8 elements): with the
// queried workspace Q, K and V are copied to 16-byte rows first (the packed path), O is written in
// place with its own strides. Odd and compiled head dims, BSHD and BHSD, GQA, causal, both dtypes,
// the wide-head schedule, and a decode shape whose key splits share the workspace with the copies.
TEST_CASE("attention_fwd: strides TMA cannot take run on aligned copies", "[attention][gpu]") {
  struct Odd {
    int64_t B, Hq, Hkv, Sq, Sk, D, ld;
    bool causal, bshd;
    fly_dtype dt;
  };
  const Odd cases[] = {
      {1, 2, 2, 128, 128, 100, 100, false, false, FLY_BF16}, {2, 4, 2, 77, 300, 72, 75, true, true, FLY_BF16},
      {1, 8, 2, 64, 200, 64, 65, false, true, FLY_F16},      {1, 2, 1, 33, 129, 40, 41, true, false, FLY_F16},
      {1, 2, 2, 70, 70, 128, 129, true, false, FLY_BF16},    {1, 2, 2, 64, 96, 512, 513, false, false, FLY_BF16},
      {2, 8, 2, 1, 4096, 128, 131, false, true, FLY_BF16}};
  for (const Odd& o : cases) {
    Case c;
    c.B = o.B;
    c.Hq = o.Hq;
    c.Hkv = o.Hkv;
    c.Sq = o.Sq;
    c.Sk = o.Sk;
    c.D = o.D;
    c.ld = o.ld;
    c.causal = o.causal;
    c.bshd = o.bshd;
    c.dt = o.dt;
    check_case(c);
  }
}

TEST_CASE("attention_fwd: every bundled variant", "[attention][gpu]") {
  int n = 0;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const std::string name = fly_variant_name(i);
    if (name.rfind("attention_fwd_", 0) != 0) continue;
    const auto hd_at = name.find("_hd");
    const int hd = std::atoi(name.c_str() + hd_at + 3);
    for (bool causal : {false, true}) {
      Case c;
      c.dt = name.find("_bf16_") != std::string::npos ? FLY_BF16 : FLY_F16;
      c.D = hd - 8;
      c.Sq = 190;
      c.Sk = 300;
      c.causal = causal;
      c.force = name.c_str();
      check_case(c);
    }
    ++n;
  }
  CHECK(n >= 8);
}

// The persistent (`_ps1`) and ping-pong (`_pp1`) schedules (off the defaults: in builds with every
// variant) on grids of more tiles than SMs, so each persistent CTA walks several tiles: the ring's
// stages and phases carried across tiles, Q reloaded per tile, the turns balanced per tile. Causal
// and not (longest tiles first), Sq off the tile, a GQA split-key decode (split partials + combine).
TEST_CASE("attention_fwd: persistent and ping-pong variants over many tiles", "[attention][gpu][attention_ps]") {
  int n = 0;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const std::string name = fly_variant_name(i);
    if (name.rfind("attention_fwd_", 0) != 0 || (name.find("_ps1") == std::string::npos && name.find("_pp1") == std::string::npos))
      continue;
    const int hd = std::atoi(name.c_str() + name.find("_hd") + 3);
    auto run = [&](int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk, int64_t D, bool causal) {
      Case c;
      c.dt = name.find("_bf16_") != std::string::npos ? FLY_BF16 : FLY_F16;
      c.B = B, c.Hq = Hq, c.Hkv = Hkv, c.Sq = Sq, c.Sk = Sk, c.D = D, c.causal = causal;
      c.force = name.c_str();
      check_case(c);
    };
    run(2, 48, 48, 260, 150, hd - 8, false);  // 2 x 48 heads x 3 m blocks = 288 tiles
    run(2, 48, 48, 260, 150, hd - 8, true);
    run(4, 32, 8, 1, 3000, hd, false);  // one query per head, many keys: each key split a tile of the stream
    ++n;
  }
  if (n == 0) WARN("no _ps1 / _pp1 variant in this build (they need -DFLY_ALL_VARIANTS=ON)");
}

// The wide-head schedule (compiled head dim 512, two consumer warpgroups splitting D): D 512 and
// the odd head dims it serves (TMA zero-fills past D), causal and not, Sq != Sk, lengths off the
// tile, GQA packed and unpacked, both layouts, padded rows, explicit scale, split-key decode.
TEST_CASE("attention_fwd: wide head dims 257..512", "[attention][gpu][attention_wide]") {
  for (int64_t d : {512, 300, 400, 257, 504})
    for (bool causal : {false, true}) {
      Case c;
      c.D = d;
      c.Sq = 200;
      c.Sk = 333;
      c.causal = causal;
      c.dt = (d % 2 == 0) ? FLY_BF16 : FLY_F16;
      check_case(c);
    }
  for (auto sizes : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {17, 17}, {1000, 1000}, {100, 300}, {300, 100}, {1, 129}, {129, 1}, {64, 64}})
    for (bool causal : {false, true}) {
      Case c;
      c.Sq = sizes.first;
      c.Sk = sizes.second;
      c.causal = causal;
      c.dt = causal ? FLY_F16 : FLY_BF16;
      c.D = 512;
      check_case(c);
    }
  for (bool bshd : {false, true})
    for (bool causal : {false, true}) {
      Case c;
      c.B = 2;
      c.Hq = 8;
      c.Hkv = 2;
      c.Sq = 150;
      c.Sk = 260;
      c.D = 512;
      c.causal = causal;
      c.bshd = bshd;
      check_case(c);
      c.ld = 424;  // padded rows: padding must stay untouched
      c.D = 400;
      c.scale = 0.03;
      c.dt = FLY_F16;
      check_case(c);
    }
  for (bool causal : {false, true}) {  // packed GQA: 8 heads x 5 positions in one 64-row tile
    Case c;
    c.B = 2;
    c.Hq = 16;
    c.Hkv = 2;
    c.Sq = 5;
    c.Sk = 700;
    c.D = 512;
    c.causal = causal;
    check_case(c);
  }
  for (bool ws : {true, false}) {  // decode: split keys (with a workspace) and unsplit
    Case c;
    c.B = 2;
    c.Hq = 8;
    c.Hkv = 2;
    c.Sq = 1;
    c.Sk = 8192;
    c.D = 512;
    c.workspace = ws;
    check_case(c);
  }
}

// Every bundled hd512 variant (mc2: multicast clusters of adjacent m blocks, padded to an even grid
// when m_blocks is odd; the longer causal CTA's unshared key tiles) on shapes that reach each path.
TEST_CASE("attention_fwd: wide head dims, every bundled hd512 variant", "[attention][gpu][attention_wide]") {
  struct Shape { int64_t B, Hq, Hkv, Sq, Sk, D; bool causal; };
  const Shape shapes[] = {{1, 2, 2, 150, 333, 512, false}, {1, 2, 2, 150, 333, 512, true}, {1, 2, 2, 1000, 1000, 512, true},
                          {1, 2, 2, 130, 70, 400, true},   {2, 4, 2, 193, 17, 512, false}, {1, 1, 1, 256, 2000, 300, true},
                          {1, 2, 2, 64, 500, 512, false}};
  int n = 0;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const std::string name = fly_variant_name(i);
    if (name.rfind("attention_fwd_", 0) != 0 || name.find("_hd512_") == std::string::npos) continue;
    for (const Shape& sh : shapes) {
      Case c;
      c.dt = name.find("_bf16_") != std::string::npos ? FLY_BF16 : FLY_F16;
      c.B = sh.B, c.Hq = sh.Hq, c.Hkv = sh.Hkv, c.Sq = sh.Sq, c.Sk = sh.Sk, c.D = sh.D, c.causal = sh.causal;
      c.force = name.c_str();
      check_case(c);
    }
    ++n;
  }
  CHECK(n >= 2);
}

// Bounded shapes for racecheck: every wide code path once (masked tiles, causal, packed GQA,
// split keys and the combine), both dtypes.
TEST_CASE("attention_fwd: wide head dims, small (sanitizers)", "[attention_wide_small]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F16})
    for (bool causal : {false, true}) {
      Case c;
      c.dt = dt;
      c.D = dt == FLY_BF16 ? 512 : 300;
      c.Sq = 65;
      c.Sk = 130;
      c.causal = causal;
      check_case(c);
    }
  Case c;
  c.Hq = 4;
  c.Hkv = 1;
  c.Sq = 1;
  c.Sk = 2048;
  c.D = 512;
  check_case(c);
  for (fly_dtype dt : {FLY_BF16, FLY_F16}) {  // the multicast cluster path: 3 m blocks (one padding CTA), causal
    Case m;
    m.dt = dt;
    m.Hq = m.Hkv = 1;
    m.Sq = 150;
    m.Sk = 200;
    m.D = 512;
    m.causal = true;
    m.force = dt == FLY_BF16 ? "attention_fwd_bf16_hd512_m64_n64_st1_ov0_mc2" : "attention_fwd_fp16_hd512_m64_n64_st1_ov0_mc2";
    bool bundled = false;
    for (int i = 0; i < fly_variant_count(); ++i) bundled |= std::string(fly_variant_name(i)) == m.force;
    if (bundled) check_case(m);
  }
}
