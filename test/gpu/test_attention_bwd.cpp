// SPDX-License-Identifier: Apache-2.0
// Attention backward on the GPU against an FP64 host reference on fresh random data: compiled and
// odd head dims, Sq != Sk with and without causal (top-left), lengths off the tile (1, 17, 1000),
// GQA (dK/dV summed over the group), BHSD and BSHD views with padded rows, both dtypes, every
// bundled variant; dQ, dK, dV poisoned with NaN beforehand (row padding must stay untouched);
// bit-identical repeat runs. O and LSE come from the host reference (rounded as a forward's would).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
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
  bool bshd = false;
  int64_t ld = 0;     // row length in memory (>= D, multiple of 8); 0: D rounded up to 8
  double scale = 0;   // 0: 1/sqrt(D)
  const char* force = nullptr;
  int repeats = 1;    // > 1: rerun and compare bits
};

struct Ref {
  std::vector<double> o, lse, dq, dk, dv;  // dense [B, H, S, D] / [B, H, S]
};

// Forward and backward of one (b, h) in double; dk, dv of the query head (summed over the group
// by the caller).
void ref_head(const Case& c, double scale, const std::vector<float>& q, const std::vector<float>& k,
              const std::vector<float>& v, const std::vector<float>& dout, const Layout& lq, const Layout& lk, int64_t b,
              int64_t h, Ref& r, std::vector<double>& dk_h, std::vector<double>& dv_h) {
  const int64_t hk = h / (c.Hq / c.Hkv);
  const int64_t D = c.D;
  std::vector<double> p(size_t(std::max<int64_t>(c.Sk, 1))), dp(p.size());
  dk_h.assign(size_t(c.Sk * D), 0.0);
  dv_h.assign(size_t(c.Sk * D), 0.0);
  for (int64_t i = 0; i < c.Sq; ++i) {
    const float* qi = &q[size_t(b * lq.sb + h * lq.sh + i * lq.ss)];
    const float* doi = &dout[size_t(b * lq.sb + h * lq.sh + i * lq.ss)];
    const int64_t nk = c.causal ? std::min(c.Sk, i + 1) : c.Sk;
    double mx = -INFINITY;
    for (int64_t j = 0; j < nk; ++j) {
      const float* kj = &k[size_t(b * lk.sb + hk * lk.sh + j * lk.ss)];
      double acc = 0;
      for (int64_t d = 0; d < D; ++d) acc += double(qi[d]) * kj[d];
      p[size_t(j)] = acc * scale;
      mx = std::max(mx, p[size_t(j)]);
    }
    double sum = 0;
    for (int64_t j = 0; j < nk; ++j) sum += std::exp(p[size_t(j)] - mx);
    const double lse = nk > 0 ? mx + std::log(sum) : -INFINITY;
    const int64_t row = (b * c.Hq + h) * c.Sq + i;
    r.lse[size_t(row)] = lse;
    double* oi = &r.o[size_t(row * D)];
    double* dqi = &r.dq[size_t(row * D)];
    for (int64_t d = 0; d < D; ++d) oi[d] = dqi[d] = 0;
    for (int64_t j = 0; j < nk; ++j) {
      p[size_t(j)] = std::exp(p[size_t(j)] - lse);
      const float* vj = &v[size_t(b * lk.sb + hk * lk.sh + j * lk.ss)];
      double acc = 0;
      for (int64_t d = 0; d < D; ++d) {
        oi[d] += p[size_t(j)] * vj[d];
        acc += double(doi[d]) * vj[d];
      }
      dp[size_t(j)] = acc;
    }
    double delta = 0;
    for (int64_t d = 0; d < D; ++d) delta += double(doi[d]) * oi[d];
    for (int64_t j = 0; j < nk; ++j) {
      const double ds = p[size_t(j)] * (dp[size_t(j)] - delta);
      const float* kj = &k[size_t(b * lk.sb + hk * lk.sh + j * lk.ss)];
      for (int64_t d = 0; d < D; ++d) {
        dqi[d] += scale * ds * kj[d];
        dk_h[size_t(j * D + d)] += scale * ds * qi[d];
        dv_h[size_t(j * D + d)] += p[size_t(j)] * doi[d];
      }
    }
  }
}

Ref reference(const Case& c, double scale, const std::vector<float>& q, const std::vector<float>& k,
              const std::vector<float>& v, const std::vector<float>& dout, const Layout& lq, const Layout& lk) {
  Ref r;
  r.o.assign(size_t(c.B * c.Hq * c.Sq * c.D), 0.0);
  r.dq = r.o;
  r.lse.assign(size_t(c.B * c.Hq * c.Sq), 0.0);
  r.dk.assign(size_t(c.B * c.Hkv * c.Sk * c.D), 0.0);
  r.dv = r.dk;
  const int64_t heads = c.B * c.Hq;
  std::vector<std::vector<double>> dk_h(static_cast<size_t>(heads)), dv_h(static_cast<size_t>(heads));
  const int nt = int(std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
  std::vector<std::thread> th;
  for (int t = 0; t < nt; ++t)
    th.emplace_back([&, t] {
      for (int64_t bh = t; bh < heads; bh += nt)
        ref_head(c, scale, q, k, v, dout, lq, lk, bh / c.Hq, bh % c.Hq, r, dk_h[size_t(bh)], dv_h[size_t(bh)]);
    });
  for (auto& x : th) x.join();
  for (int64_t bh = 0; bh < heads; ++bh) {
    const int64_t b = bh / c.Hq, hk = (bh % c.Hq) / (c.Hq / c.Hkv);
    double* dk = &r.dk[size_t((b * c.Hkv + hk) * c.Sk * c.D)];
    double* dv = &r.dv[size_t((b * c.Hkv + hk) * c.Sk * c.D)];
    for (size_t i = 0; i < dk_h[size_t(bh)].size(); ++i) {
      dk[i] += dk_h[size_t(bh)][i];
      dv[i] += dv_h[size_t(bh)][i];
    }
  }
  return r;
}

struct Result {
  fly_status status = FLY_SUCCESS;
  std::string msg, variant;
  double rel[3] = {0, 0, 0};  // dq, dk, dv: max |err| / max |ref|
  bool finite = true, padding_untouched = true, repeat_identical = true;
};

void* upload(const std::vector<uint16_t>& h) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, std::max<size_t>(h.size() * 2, 16)) == cudaSuccess);
  if (!h.empty()) REQUIRE(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
  return p;
}

Result run_case(const Case& c) {
  const int64_t ld = c.ld ? c.ld : (c.D + 7) / 8 * 8;
  const Layout lq = layout(c, c.Hq, c.Sq, ld), lk = layout(c, c.Hkv, c.Sk, ld);
  std::mt19937 rng(uint32_t(c.B * 7919 + c.Hq * 131 + c.Hkv * 29 + c.Sq * 17 + c.Sk * 3 + c.D + c.causal + 1000 * c.dt +
                            std::random_device{}() % 1000));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto make = [&](const Layout& l, std::vector<float>& f, std::vector<uint16_t>& bits) {
    f.assign(size_t(l.elems), 0.f);
    bits.assign(size_t(l.elems), 0);
    for (size_t i = 0; i < f.size(); ++i) {
      bits[i] = from_float(u(rng), c.dt);
      f[i] = to_float(bits[i], c.dt);
    }
  };
  std::vector<float> fq, fk, fv, fdo;
  std::vector<uint16_t> hq, hk, hv, hdo;
  make(lq, fq, hq);
  make(lk, fk, hk);
  make(lk, fv, hv);
  make(lq, fdo, hdo);
  const double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(double(c.D));
  const Ref ref = reference(c, scale, fq, fk, fv, fdo, lq, lk);
  // O rounded to the dtype in q's layout (padding: random), LSE as fp32.
  std::vector<uint16_t> ho = hdo;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Sq; ++i)
        for (int64_t d = 0; d < c.D; ++d)
          ho[size_t(b * lq.sb + h * lq.sh + i * lq.ss + d)] =
              from_float(float(ref.o[size_t(((b * c.Hq + h) * c.Sq + i) * c.D + d)]), c.dt);
  std::vector<float> hl(ref.lse.size());
  for (size_t i = 0; i < hl.size(); ++i) hl[i] = float(ref.lse[i]);

  void *dq_in = upload(hq), *dk_in = upload(hk), *dv_in = upload(hv), *ddo = upload(hdo), *dO = upload(ho);
  void* dl = nullptr;
  CUDA_OK(cudaMalloc(&dl, std::max<size_t>(hl.size() * 4, 16)));
  if (!hl.empty()) CUDA_OK(cudaMemcpy(dl, hl.data(), hl.size() * 4, cudaMemcpyHostToDevice));
  const size_t gq_bytes = std::max<size_t>(size_t(lq.elems) * 2, 16), gk_bytes = std::max<size_t>(size_t(lk.elems) * 2, 16);
  void *gdq = nullptr, *gdk = nullptr, *gdv = nullptr;
  CUDA_OK(cudaMalloc(&gdq, gq_bytes));
  CUDA_OK(cudaMalloc(&gdk, gk_bytes));
  CUDA_OK(cudaMalloc(&gdv, gk_bytes));
  const fly_tensor tq = flykernels::tensor(dq_in, c.dt, {c.B, c.Hq, c.Sq, c.D}, {lq.sb, lq.sh, lq.ss, 1});
  const fly_tensor tk = flykernels::tensor(dk_in, c.dt, {c.B, c.Hkv, c.Sk, c.D}, {lk.sb, lk.sh, lk.ss, 1});
  const fly_tensor tv = flykernels::tensor(dv_in, c.dt, {c.B, c.Hkv, c.Sk, c.D}, {lk.sb, lk.sh, lk.ss, 1});
  const fly_tensor to = flykernels::tensor(dO, c.dt, {c.B, c.Hq, c.Sq, c.D}, {lq.sb, lq.sh, lq.ss, 1});
  const fly_tensor tdo = flykernels::tensor(ddo, c.dt, {c.B, c.Hq, c.Sq, c.D}, {lq.sb, lq.sh, lq.ss, 1});
  const fly_tensor tl = flykernels::tensor(dl, FLY_F32, {c.B, c.Hq, c.Sq});
  const fly_tensor tdq = flykernels::tensor(gdq, c.dt, {c.B, c.Hq, c.Sq, c.D}, {lq.sb, lq.sh, lq.ss, 1});
  const fly_tensor tdk = flykernels::tensor(gdk, c.dt, {c.B, c.Hkv, c.Sk, c.D}, {lk.sb, lk.sh, lk.ss, 1});
  const fly_tensor tdv = flykernels::tensor(gdv, c.dt, {c.B, c.Hkv, c.Sk, c.D}, {lk.sb, lk.sh, lk.ss, 1});
  fly_attention_bwd_params p{};
  p.struct_size = sizeof(p);
  p.q = &tq;
  p.k = &tk;
  p.v = &tv;
  p.o = &to;
  p.dout = &tdo;
  p.lse = &tl;
  p.dq = &tdq;
  p.dk = &tdk;
  p.dv = &tdv;
  p.softmax_scale = c.scale;
  p.causal = c.causal ? 1 : 0;
  size_t ws = 0;
  Result r;
  r.status = fly_attention_bwd_workspace_size(&p, &ws);
  if (r.status != FLY_SUCCESS) r.msg = fly_get_last_error();
  void* dws = nullptr;
  if (r.status == FLY_SUCCESS && ws > 0) {
    CUDA_OK(cudaMalloc(&dws, ws));
    CUDA_OK(cudaMemset(dws, 0xff, ws));  // contents need no initialization
  }
  p.workspace = dws;
  p.workspace_bytes = ws;
  std::vector<std::vector<uint16_t>> first(3);
  for (int rep = 0; rep < c.repeats && r.status == FLY_SUCCESS; ++rep) {
    CUDA_OK(cudaMemset(gdq, 0xff, gq_bytes));  // NaN in fp16 and bf16
    CUDA_OK(cudaMemset(gdk, 0xff, gk_bytes));
    CUDA_OK(cudaMemset(gdv, 0xff, gk_bytes));
    if (c.force) REQUIRE(fly_force_variant(c.force) == FLY_SUCCESS);
    r.status = fly_attention_bwd(&p, nullptr);
    r.msg = fly_get_last_error();
    r.variant = fly_last_variant() ? fly_last_variant() : "";
    if (c.force) fly_force_variant(nullptr);
    if (r.status != FLY_SUCCESS) break;
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint16_t> out[3] = {std::vector<uint16_t>(gq_bytes / 2), std::vector<uint16_t>(gk_bytes / 2),
                                    std::vector<uint16_t>(gk_bytes / 2)};
    CUDA_OK(cudaMemcpy(out[0].data(), gdq, gq_bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(out[1].data(), gdk, gk_bytes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(out[2].data(), gdv, gk_bytes, cudaMemcpyDeviceToHost));
    if (rep == 0) {
      const std::vector<double>* refs[3] = {&ref.dq, &ref.dk, &ref.dv};
      const Layout* ls[3] = {&lq, &lk, &lk};
      const int64_t H[3] = {c.Hq, c.Hkv, c.Hkv}, S[3] = {c.Sq, c.Sk, c.Sk};
      for (int t = 0; t < 3; ++t) {
        double err = 0, mag = 0;
        std::vector<bool> touched(out[t].size(), false);
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t h = 0; h < H[t]; ++h)
            for (int64_t i = 0; i < S[t]; ++i)
              for (int64_t d = 0; d < c.D; ++d) {
                const size_t at = size_t(b * ls[t]->sb + h * ls[t]->sh + i * ls[t]->ss + d);
                touched[at] = true;
                const double got = to_float(out[t][at], c.dt), want = (*refs[t])[size_t(((b * H[t] + h) * S[t] + i) * c.D + d)];
                if (!std::isfinite(got)) r.finite = false;
                err = std::max(err, std::fabs(got - want));
                mag = std::max(mag, std::fabs(want));
              }
        for (size_t i = 0; i < out[t].size(); ++i)
          if (!touched[i] && out[t][i] != 0xffff) r.padding_untouched = false;
        r.rel[t] = mag > 0 ? err / mag : err;
      }
      for (int t = 0; t < 3; ++t) first[t] = out[t];
    } else {
      for (int t = 0; t < 3; ++t)
        if (out[t] != first[t]) r.repeat_identical = false;
    }
  }
  for (void* x : {dq_in, dk_in, dv_in, ddo, dO, dl, gdq, gdk, gdv, dws}) cudaFree(x);
  return r;
}

// Whether this build bundles a wide (hd 512) backward variant of dt: they are not defaults (unmeasured
// when written), so only -DFLY_ALL_VARIANTS=ON builds serve D 257..512.
bool wide_bundled(fly_dtype dt) {
  const std::string want = std::string("attention_bwd_") + (dt == FLY_BF16 ? "bf16" : "fp16") + "_hd512_";
  for (int i = 0; i < fly_variant_count(); ++i)
    if (std::string(fly_variant_name(i)).rfind(want, 0) == 0) return true;
  return false;
}

Result check_case(const Case& c) {
  const Result r = run_case(c);
  INFO(describe(c) << " -> " << fly_status_string(r.status) << " " << r.msg << " variant " << r.variant << " rel dq "
                   << r.rel[0] << " dk " << r.rel[1] << " dv " << r.rel[2]);
  REQUIRE(r.status == FLY_SUCCESS);
  CHECK(r.finite);
  CHECK(r.padding_untouched);
  CHECK(r.repeat_identical);
  const double tol = c.dt == FLY_BF16 ? 2e-2 : 5e-3;
  CHECK(r.rel[0] < tol);
  CHECK(r.rel[1] < tol);
  CHECK(r.rel[2] < tol);
  return r;
}

}  // namespace

TEST_CASE("attention_bwd: compiled and odd head dims", "[attention_bwd][gpu]") {
  for (int64_t d : {64, 128, 192, 256, 40, 72, 8, 200})
    for (bool causal : {false, true}) {
      Case c;
      c.D = d;
      c.Sq = 200;
      c.Sk = 200;
      c.causal = causal;
      c.dt = (d % 3 == 0) ? FLY_F16 : FLY_BF16;
      check_case(c);
    }
}

TEST_CASE("attention_bwd: sequence lengths off the tile, Sq != Sk", "[attention_bwd][gpu]") {
  const int64_t lens[][2] = {{1, 1}, {17, 17}, {1, 1000}, {1000, 17}, {17, 1000}, {1000, 1000}, {333, 130}};
  for (auto& l : lens)
    for (bool causal : {false, true})
      for (fly_dtype dt : {FLY_BF16, FLY_F16}) {
        Case c;
        c.Sq = l[0];
        c.Sk = l[1];
        c.D = 128;
        c.causal = causal;
        c.dt = dt;
        check_case(c);
      }
}

TEST_CASE("attention_bwd: grouped-query, both layouts, padded rows, explicit scale, repeat runs bit-identical",
          "[attention_bwd][gpu]") {
  for (int64_t d : {64, 128, 256})
    for (bool bshd : {false, true})
      for (bool causal : {false, true}) {
        Case c;
        c.B = 2;
        c.Hq = 8;
        c.Hkv = 2;
        c.Sq = 300;
        c.Sk = 257;
        c.D = d;
        c.bshd = bshd;
        c.ld = d + 8;
        c.causal = causal;
        c.scale = 0.07;
        c.dt = bshd ? FLY_F16 : FLY_BF16;
        c.repeats = 3;
        check_case(c);
      }
}

// Rows TMA cannot take (a row length in memory that is not a multiple of 8 elements, for every
// operand): with the queried workspace q, k, v and dout are copied to 16-byte rows first (the packed
// path); o, dq, dk, dv keep their strides. Odd and compiled head dims, both layouts, GQA, causal.
TEST_CASE("attention_bwd: strides TMA cannot take run on aligned copies", "[attention_bwd][gpu]") {
  struct Odd {
    int64_t B, Hq, Hkv, Sq, Sk, D, ld;
    bool causal, bshd;
    fly_dtype dt;
  };
  const Odd cases[] = {{1, 2, 2, 200, 200, 72, 75, false, true, FLY_BF16},
                       {2, 8, 2, 130, 257, 128, 129, true, false, FLY_BF16},
                       {1, 4, 1, 100, 77, 40, 41, true, true, FLY_F16},
                       {1, 2, 2, 64, 64, 256, 259, false, false, FLY_F16}};
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
    c.repeats = 2;
    check_case(c);
  }
}

TEST_CASE("attention_bwd: Sk = 0 writes dq = 0; unsupported and missing workspace say why", "[attention_bwd][gpu]") {
  {
    Case c;
    c.Sk = 0;
    const Result r = run_case(c);
    INFO(r.msg);
    REQUIRE(r.status == FLY_SUCCESS);
    CHECK(r.finite);
    CHECK(r.rel[0] == 0.0);  // the reference dq is 0: any nonzero output is an error
  }
  if (!wide_bundled(FLY_BF16)) {  // with a wide variant bundled, D 320 runs ([attention_bwd_wide])
    Case c;
    c.D = 320;
    const Result r = run_case(c);
    CHECK(r.status == FLY_ERROR_UNSUPPORTED);
    CHECK(r.msg.find("head dim") != std::string::npos);
  }
}

TEST_CASE("attention_bwd: every bundled variant", "[attention_bwd][gpu]") {
  int tested = 0;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const std::string name = fly_variant_name(i);
    if (name.rfind("attention_bwd_", 0) != 0) continue;
    const int hd = std::stoi(name.substr(name.find("_hd") + 3));
    for (bool causal : {false, true}) {
      Case c;
      c.dt = name.find("_bf16_") != std::string::npos ? FLY_BF16 : FLY_F16;
      c.D = hd;
      c.Hq = 4;
      c.Hkv = 2;
      c.Sq = 333;
      c.Sk = 270;
      c.causal = causal;
      c.force = name.c_str();
      check_case(c);
    }
    ++tested;
  }
  CHECK(tested >= 8);
}

// Bounded shapes for compute-sanitizer racecheck (slow: it serializes the mbarrier spin loops):
// every compiled head dim, causal (64, 192) and not, GQA, Sq != Sk, partial tiles.
TEST_CASE("attention_bwd: small shapes for the sanitizers", "[attention_bwd_small]") {
  for (int64_t d : {64, 128, 192, 256}) {
    Case c;
    c.Hq = 2;
    c.Hkv = 1;
    c.Sq = 65;
    c.Sk = 80;
    c.D = d;
    c.causal = d == 64 || d == 192;
    c.dt = d <= 128 ? FLY_F16 : FLY_BF16;
    check_case(c);
  }
}

// ---- D 257..512: the wide (hd 512) schedule ----------------------------------------------------
// Without a bundled wide variant (the default build) every case must be refused as unsupported,
// naming the head dim; with one, the full comparison against the FP64 reference.
void check_wide(const Case& c) {
  if (!wide_bundled(c.dt)) {
    const Result r = run_case(c);
    INFO(describe(c) << " -> " << fly_status_string(r.status) << " " << r.msg);
    CHECK(r.status == FLY_ERROR_UNSUPPORTED);
    CHECK(r.msg.find("head dim") != std::string::npos);
    return;
  }
  const Result r = check_case(c);
  CHECK(r.variant.find("_hd512_") != std::string::npos);  // served by the wide schedule
}

TEST_CASE("attention_bwd wide: head dims 257..512, causal and not", "[attention_bwd_wide][gpu]") {
  int i = 0;
  for (int64_t d : {512, 300, 400, 257, 504, 320})
    for (bool causal : {false, true}) {
      Case c;
      c.D = d;
      c.Sq = 200;
      c.Sk = 200;
      c.causal = causal;
      c.dt = (i++ % 2) ? FLY_F16 : FLY_BF16;
      check_wide(c);
    }
}

TEST_CASE("attention_bwd wide: sequence lengths off the tile, Sq != Sk", "[attention_bwd_wide][gpu]") {
  const int64_t lens[][2] = {{1, 1}, {17, 17}, {1, 300}, {300, 17}, {100, 300}, {300, 100}, {129, 1}, {64, 64}, {33, 65}};
  for (auto& l : lens)
    for (bool causal : {false, true})
      for (fly_dtype dt : {FLY_BF16, FLY_F16}) {
        Case c;
        c.Sq = l[0];
        c.Sk = l[1];
        c.D = 512;
        c.causal = causal;
        c.dt = dt;
        check_wide(c);
      }
}

TEST_CASE("attention_bwd wide: grouped-query, both layouts, padded rows, explicit scale, repeat runs bit-identical",
          "[attention_bwd_wide][gpu]") {
  for (int64_t d : {512, 400})
    for (bool bshd : {false, true})
      for (bool causal : {false, true}) {
        Case c;
        c.B = 2;
        c.Hq = 8;
        c.Hkv = 2;
        c.Sq = 300;
        c.Sk = 257;
        c.D = d;
        c.bshd = bshd;
        c.ld = d == 400 ? 424 : d + 8;
        c.causal = causal;
        c.scale = 0.05;
        c.dt = bshd ? FLY_F16 : FLY_BF16;
        c.repeats = 3;
        check_wide(c);
      }
}

TEST_CASE("attention_bwd wide: Sk = 0 writes dq = 0; D = 520 is refused", "[attention_bwd_wide][gpu]") {
  if (wide_bundled(FLY_BF16)) {
    Case c;
    c.D = 512;
    c.Sk = 0;
    const Result r = run_case(c);
    INFO(r.msg);
    REQUIRE(r.status == FLY_SUCCESS);
    CHECK(r.finite);
    CHECK(r.rel[0] == 0.0);
  }
  Case c;
  c.D = 520;
  const Result r = run_case(c);
  CHECK(r.status == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(r.msg.find("exceeds the maximum") != std::string::npos);
}

// Bounded shapes for compute-sanitizer (memcheck, racecheck) over the wide kernels: both dtypes,
// causal with Sq > Sk and Sq < Sk, GQA, partial tiles, a head dim with whole zero-filled chunks.
TEST_CASE("attention_bwd wide: small shapes for the sanitizers", "[attention_bwd_wide_small]") {
  const struct {
    fly_dtype dt;
    int64_t hq, hkv, sq, sk, d;
    bool causal;
  } cases[] = {{FLY_BF16, 2, 1, 65, 80, 512, true},
               {FLY_F16, 1, 1, 33, 70, 300, false},
               {FLY_F16, 2, 1, 100, 40, 512, true},
               {FLY_BF16, 1, 1, 17, 17, 400, false}};
  for (const auto& k : cases) {
    Case c;
    c.dt = k.dt;
    c.Hq = k.hq;
    c.Hkv = k.hkv;
    c.Sq = k.sq;
    c.Sk = k.sk;
    c.D = k.d;
    c.causal = k.causal;
    check_wide(c);
  }
}
