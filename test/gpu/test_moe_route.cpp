// SPDX-License-Identifier: Apache-2.0
// The moe_route family on the GPU against host references (FP64 math, the stable counting sort
// done on the host): router forward and backward (softmax / sigmoid, renormalized or not, top-k
// first, every logits dtype, int32 and int64 ids, E up to 1000, k = 1 .. E, ties to the lower id,
// NaN), the permutation (skewed loads, empty experts, ids outside [0, E), T = 1, k = 1, E = 256,
// padded and unaligned rows), the weighted unpermute, its backward and the permute's backward.
// Outputs are poisoned (NaN / 0xFF bytes) before every call.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "host_elems.hpp"
#include "test_tensors.hpp"

namespace {

using fly_test::esize;
using fly_test::load;
using fly_test::mat;
using fly_test::store;
using fly_test::vec;

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)

// A device buffer with its host copy.
struct Dev {
  std::vector<uint8_t> h;
  void* d = nullptr;
  explicit Dev(size_t bytes, int fill = -1) : h(bytes, uint8_t(fill < 0 ? 0 : fill)) {
    REQUIRE(cudaMalloc(&d, bytes ? bytes : 1) == cudaSuccess);
    if (fill >= 0) REQUIRE(cudaMemset(d, fill, bytes) == cudaSuccess);
  }
  ~Dev() { cudaFree(d); }
  void up() { REQUIRE(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice) == cudaSuccess); }
  void down() { REQUIRE(cudaMemcpy(h.data(), d, h.size(), cudaMemcpyDeviceToHost) == cudaSuccess); }
  int64_t id(size_t i, fly_dtype dt) const {
    if (dt == FLY_I64) { int64_t v; std::memcpy(&v, &h[i * 8], 8); return v; }
    int32_t v; std::memcpy(&v, &h[i * 4], 4); return v;
  }
  void set_id(size_t i, fly_dtype dt, int64_t v) {
    if (dt == FLY_I64) std::memcpy(&h[i * 8], &v, 8);
    else { int32_t w = int32_t(v); std::memcpy(&h[i * 4], &w, 4); }
  }
  int32_t i32(size_t i) const { int32_t v; std::memcpy(&v, &h[i * 4], 4); return v; }
};

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- router ---------------------------------------------------------------------------------
struct RouteCase {
  fly_dtype dt, wdt, idt;
  int score, flags;
  int64_t T, E, k;
  bool ties = false;  // logits from a few values: many exact ties
  int64_t pad = 0;
};

// Scores the selection ranks by (all E), in FP64.
std::vector<double> rank_keys(const std::vector<double>& l, int score, int flags) {
  const int64_t E = int64_t(l.size());
  std::vector<double> s(static_cast<size_t>(E), 0.0);
  if (flags & FLY_MOE_TOPK_FIRST) return l;
  if (score == FLY_MOE_SIGMOID) {
    for (int64_t e = 0; e < E; ++e) s[size_t(e)] = sigmoid(l[size_t(e)]);
    return s;
  }
  const double m = *std::max_element(l.begin(), l.end());
  double z = 0;
  for (double v : l) z += std::exp(v - m);
  for (int64_t e = 0; e < E; ++e) s[size_t(e)] = std::exp(l[size_t(e)] - m) / z;
  return s;
}
// Weights of a given selection, in FP64.
std::vector<double> weights_of(const std::vector<double>& l, const std::vector<int64_t>& ids, int score, int flags) {
  const size_t k = ids.size();
  std::vector<double> w(k);
  if (flags & FLY_MOE_TOPK_FIRST) {
    double m = -INFINITY, z = 0;
    for (int64_t e : ids) m = std::max(m, l[size_t(e)]);
    for (size_t j = 0; j < k; ++j) {
      const double v = l[size_t(ids[j])];
      w[j] = score == FLY_MOE_SOFTMAX ? std::exp(v - m) : sigmoid(v);
      z += w[j];
    }
    if (score == FLY_MOE_SOFTMAX)
      for (double& v : w) v /= z;
  } else {
    const std::vector<double> s = rank_keys(l, score, flags);
    for (size_t j = 0; j < k; ++j) w[j] = s[size_t(ids[j])];
  }
  if (flags & FLY_MOE_RENORMALIZE) {
    double S = 0;
    for (double v : w) S += v;
    for (double& v : w) v /= S;
  }
  return w;
}
// dlogits of L = <dw, w(l)> for a fixed selection: central differences would be too coarse in
// FP64 for a check at 1e-6, so the analytic chain (the kernel's formulas, in FP64).
std::vector<double> dlogits_of(const std::vector<double>& l, const std::vector<int64_t>& ids,
                               const std::vector<double>& dw, int score, int flags) {
  const size_t E = l.size(), k = ids.size();
  const bool topk_first = flags & FLY_MOE_TOPK_FIRST, softmax = score == FLY_MOE_SOFTMAX;
  std::vector<double> s(k), p;
  if (topk_first && softmax) {
    double m = -INFINITY, z = 0;
    for (int64_t e : ids) m = std::max(m, l[size_t(e)]);
    for (size_t j = 0; j < k; ++j) z += s[j] = std::exp(l[size_t(ids[j])] - m);
    for (double& v : s) v /= z;
  } else if (softmax) {
    p = rank_keys(l, score, flags);
    for (size_t j = 0; j < k; ++j) s[j] = p[size_t(ids[j])];
  } else {
    for (size_t j = 0; j < k; ++j) s[j] = sigmoid(l[size_t(ids[j])]);
  }
  std::vector<double> ds(dw);
  if (flags & FLY_MOE_RENORMALIZE) {
    double S = 0, g = 0;
    for (double v : s) S += v;
    for (size_t j = 0; j < k; ++j) g += dw[j] * s[j] / S;
    for (size_t j = 0; j < k; ++j) ds[j] = (dw[j] - g) / S;
  }
  double C = 0;
  for (size_t j = 0; j < k; ++j) C += ds[j] * s[j];
  std::vector<double> dl(E, 0.0);
  if (softmax && !topk_first)
    for (size_t e = 0; e < E; ++e) dl[e] = -p[e] * C;
  for (size_t j = 0; j < k; ++j) {
    double g;
    if (softmax && !topk_first) g = ds[j] * s[j];
    else if (softmax) g = s[j] * (ds[j] - C);
    else g = ds[j] * s[j] * (1 - s[j]);
    dl[size_t(ids[j])] += g;
  }
  return dl;
}

double tol_of(fly_dtype dt) { return dt == FLY_BF16 ? 1.0 / 128 : dt == FLY_F16 ? 1.0 / 1024 : 1e-5; }

void run_route(const RouteCase& c) {
  const int64_t T = c.T, E = c.E, k = c.k, ld = E + c.pad;
  INFO("route dt " << c.dt << " wdt " << c.wdt << " idt " << c.idt << " score " << c.score << " flags " << c.flags
                   << " T " << T << " E " << E << " k " << k << (c.ties ? " ties" : ""));
  std::mt19937 rng(uint32_t(T * 131 + E * 7 + k + c.flags * 1000 + c.score * 5000 + c.dt));
  std::normal_distribution<float> nrm(0.f, 2.f);
  std::uniform_int_distribution<int> few(0, 3);
  Dev lg(size_t(T * ld) * esize(c.dt)), w(size_t(T * k) * esize(c.wdt), 0xFF);
  Dev ids(size_t(T * k) * (c.idt == FLY_I64 ? 8 : 4), 0xFF);
  std::vector<std::vector<double>> L(static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(E)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < ld; ++e) {
      const float v = c.ties ? 0.5f * float(few(rng)) : nrm(rng);
      store(lg.h, size_t(t * ld + e), c.dt, e < E ? v : NAN);
      if (e < E) L[size_t(t)][size_t(e)] = load(lg.h, size_t(t * ld + e), c.dt);
    }
  lg.up();
  const fly_tensor tl = mat(lg.d, c.dt, T, E, ld), tw = mat(w.d, c.wdt, T, k, k), ti = mat(ids.d, c.idt, T, k, k);
  REQUIRE(fly_moe_route_fwd(&tl, k, c.score, c.flags, &tw, &ti, nullptr) == FLY_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  w.down();
  ids.down();
  int64_t bad = 0;
  std::vector<std::vector<int64_t>> got_ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double>& l = L[size_t(t)];
    const std::vector<double> key = rank_keys(l, c.score, c.flags);
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key[size_t(a)] > key[size_t(b)]; });
    std::vector<int64_t> g(static_cast<size_t>(k));
    std::vector<bool> seen(static_cast<size_t>(E), false);
    for (int64_t j = 0; j < k; ++j) {
      g[size_t(j)] = ids.id(size_t(t * k + j), c.idt);
      const int64_t e = g[size_t(j)];
      if (e < 0 || e >= E || seen[size_t(e)]) {
        if (bad++ < 5) UNSCOPED_INFO("token " << t << " slot " << j << ": id " << e << " out of range or repeated");
        g[size_t(j)] = 0;
        continue;
      }
      seen[size_t(e)] = true;
      const int64_t want = order[size_t(j)];
      // Exact ties (equal keys): the lower id first, so the exact id; otherwise the key of the
      // id chosen must equal the reference's j-th key to within FP32 evaluation.
      const double dk = std::fabs(key[size_t(e)] - key[size_t(want)]);
      const bool ok = c.ties ? e == want : (e == want || dk <= 1e-6 * std::max(1.0, std::fabs(key[size_t(want)])));
      if (!ok && bad++ < 5) UNSCOPED_INFO("token " << t << " slot " << j << ": id " << e << " want " << want);
    }
    got_ids[size_t(t)] = g;
    const std::vector<double> wr = weights_of(l, g, c.score, c.flags);
    for (int64_t j = 0; j < k; ++j) {
      const double gw = load(w.h, size_t(t * k + j), c.wdt), want = wr[size_t(j)];
      if (!(std::fabs(gw - want) <= tol_of(c.wdt) * std::fabs(want) + 1e-7) && bad++ < 5)
        UNSCOPED_INFO("token " << t << " slot " << j << ": weight " << gw << " want " << want);
    }
  }
  CHECK(bad == 0);

  // Backward from random dweights, for the selection the forward made.
  Dev dw(size_t(T * k) * esize(c.wdt)), dl(size_t(T * E) * esize(c.dt), 0xFF);
  std::vector<std::vector<double>> DW(static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(k)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      store(dw.h, size_t(t * k + j), c.wdt, nrm(rng));
      DW[size_t(t)][size_t(j)] = load(dw.h, size_t(t * k + j), c.wdt);
    }
  dw.up();
  const fly_tensor tdw = mat(dw.d, c.wdt, T, k, k), tdl = mat(dl.d, c.dt, T, E, E);
  REQUIRE(fly_moe_route_bwd(&tdw, &tl, &ti, c.score, c.flags, &tdl, nullptr) == FLY_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  dl.down();
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> want = dlogits_of(L[size_t(t)], got_ids[size_t(t)], DW[size_t(t)], c.score, c.flags);
    double mag = 0;
    for (int64_t j = 0; j < k; ++j) mag = std::max(mag, std::fabs(DW[size_t(t)][size_t(j)]));
    for (int64_t e = 0; e < E; ++e) {
      const double g = load(dl.h, size_t(t * E + e), c.dt);
      if (!(std::fabs(g - want[size_t(e)]) <= tol_of(c.dt) * std::fabs(want[size_t(e)]) + 4e-6 * mag) && bad++ < 5)
        UNSCOPED_INFO("token " << t << " expert " << e << ": dlogit " << g << " want " << want[size_t(e)]);
    }
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("moe router forward and backward against FP64", "[moe_route]") {
  for (fly_dtype dt : {FLY_F32, FLY_BF16, FLY_F16})
    for (int score : {int(FLY_MOE_SOFTMAX), int(FLY_MOE_SIGMOID)})
      for (int flags : {0, int(FLY_MOE_RENORMALIZE), int(FLY_MOE_TOPK_FIRST), FLY_MOE_TOPK_FIRST | FLY_MOE_RENORMALIZE}) {
        const fly_dtype wdt = flags & 1 ? FLY_F32 : dt;
        run_route({dt, wdt, FLY_I64, score, flags, 257, 128, 8});    // Qwen3-MoE / OLMoE-like
        run_route({dt, FLY_F32, FLY_I32, score, flags, 64, 8, 2});   // Mixtral
        run_route({dt, dt, FLY_I64, score, flags, 1, 256, 8});       // T = 1, E = 256
        run_route({dt, FLY_F32, FLY_I64, score, flags, 33, 64, 1});  // k = 1
      }
}

TEST_CASE("moe router: ties go to the lower id, k = E, E up to 1000, padded rows", "[moe_route]") {
  for (int flags : {0, int(FLY_MOE_RENORMALIZE), int(FLY_MOE_TOPK_FIRST)}) {
    run_route({FLY_F32, FLY_F32, FLY_I64, FLY_MOE_SOFTMAX, flags, 100, 64, 8, /*ties=*/true});
    run_route({FLY_BF16, FLY_F32, FLY_I32, FLY_MOE_SIGMOID, flags, 50, 256, 8, /*ties=*/true, 3});
    run_route({FLY_F32, FLY_F32, FLY_I64, FLY_MOE_SOFTMAX, flags, 20, 40, 40});  // k = E
    run_route({FLY_F32, FLY_F32, FLY_I32, FLY_MOE_SOFTMAX, flags, 9, 1000, 70});
    run_route({FLY_F16, FLY_F16, FLY_I64, FLY_MOE_SOFTMAX, flags, 5000, 32, 4});
  }
}

TEST_CASE("moe router: a NaN logit poisons its row like torch's softmax and no other row", "[moe_route]") {
  const int64_t T = 2, E = 16, k = 4;
  std::vector<float> h(static_cast<size_t>(T * E));
  for (int64_t i = 0; i < T * E; ++i) h[size_t(i)] = float(i % E) * 0.1f;
  h[5] = NAN;
  float *dl, *dw;
  int64_t* di;
  CUDA_OK(cudaMalloc(&dl, h.size() * 4));
  CUDA_OK(cudaMalloc(&dw, size_t(T * k) * 4));
  CUDA_OK(cudaMalloc(&di, size_t(T * k) * 8));
  CUDA_OK(cudaMemcpy(dl, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  const fly_tensor tl = mat(dl, FLY_F32, T, E, E), tw = mat(dw, FLY_F32, T, k, k), ti = mat(di, FLY_I64, T, k, k);
  REQUIRE(fly_moe_route_fwd(&tl, k, FLY_MOE_SOFTMAX, FLY_MOE_RENORMALIZE, &tw, &ti, nullptr) == FLY_SUCCESS);
  std::vector<float> w(static_cast<size_t>(T * k));
  std::vector<int64_t> ids(static_cast<size_t>(T * k));
  CUDA_OK(cudaMemcpy(w.data(), dw, w.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(ids.data(), di, ids.size() * 8, cudaMemcpyDeviceToHost));
  for (int64_t j = 0; j < k; ++j) CHECK(std::isnan(w[size_t(j)]));
  CHECK(ids[0] == 0);  // every score NaN: the lowest ids, in order
  CHECK(ids[3] == 3);
  for (int64_t j = 0; j < k; ++j) {
    CHECK(ids[size_t(k + j)] == E - 1 - j);  // the other row: the largest logits
    CHECK(std::isfinite(w[size_t(k + j)]));
  }
  cudaFree(dl);
  cudaFree(dw);
  cudaFree(di);
}

namespace {

// ---- permutation ------------------------------------------------------------------------------
struct PermCase {
  fly_dtype dt, idt;
  int64_t T, k, E, H;
  int skew = 0;          // 0 uniform, 1 most pairs on a few experts, 2 only even experts (empty odd ones)
  bool sentinels = false;  // some ids -1 or E (expert parallelism's dropped pairs)
  int64_t pad = 0, off = 0;  // row padding and element offset of x / x_perm / y (unaligned rows)
  fly_dtype wdt = FLY_F32;
};

void run_perm(const PermCase& c) {
  const int64_t T = c.T, k = c.k, E = c.E, H = c.H, N = T * k, ld = H + c.pad, es = int64_t(esize(c.dt));
  INFO("permute dt " << c.dt << " idt " << c.idt << " T " << T << " k " << k << " E " << E << " H " << H << " skew "
                     << c.skew << (c.sentinels ? " sentinels" : "") << " pad " << c.pad << " off " << c.off);
  std::mt19937 rng(uint32_t(T * 17 + k * 3 + E * 101 + H + c.skew * 7 + c.dt));
  std::uniform_int_distribution<int64_t> any(0, E - 1);
  std::uniform_real_distribution<float> uni(-2.f, 2.f), u01(0.f, 1.f);
  const size_t isz = c.idt == FLY_I64 ? 8 : 4;
  Dev ids(size_t(N) * isz), x(size_t(c.off + T * ld) * size_t(es));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> row;
    while (int64_t(row.size()) < k) {
      int64_t e = any(rng);
      if (c.skew == 1 && u01(rng) < 0.7f) e = any(rng) % std::min<int64_t>(E, 3);
      if (c.skew == 2) e = (e / 2) * 2;
      if (c.sentinels && u01(rng) < 0.1f) e = u01(rng) < 0.5f ? -1 : E;
      if (e >= 0 && e < E && std::find(row.begin(), row.end(), e) != row.end() && int64_t(row.size()) < E / 2) continue;
      row.push_back(e);
    }
    for (int64_t j = 0; j < k; ++j) ids.set_id(size_t(t * k + j), c.idt, row[size_t(j)]);
  }
  for (size_t i = 0; i < x.h.size() / size_t(es); ++i) store(x.h, i, c.dt, uni(rng));
  ids.up();
  x.up();
  // Host reference: stable order by bucket (E for ids outside [0, E)).
  auto bucket = [&](int64_t i) {
    const int64_t e = ids.id(size_t(i), c.idt);
    return e >= 0 && e < E ? e : E;
  };
  std::vector<int64_t> order(static_cast<size_t>(N));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return bucket(a) < bucket(b); });
  std::vector<int64_t> ends(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < N; ++i)
    if (bucket(i) < E) ++ends[size_t(bucket(i))];
  for (int64_t e = 1; e < E; ++e) ends[size_t(e)] += ends[size_t(e - 1)];
  const int64_t total = E ? ends[size_t(E - 1)] : 0;

  size_t ws_bytes = 0;
  REQUIRE(fly_moe_permute_workspace_size(T, k, E, &ws_bytes) == FLY_SUCCESS);
  Dev ws(ws_bytes, 0xFF), xp(size_t(c.off + N * ld) * size_t(es), 0xFF), offs(size_t(E) * 4, 0xFF);
  Dev row_of(size_t(N) * 4, 0xFF), pair_of(size_t(N) * 4, 0xFF);
  const fly_tensor tx = mat(static_cast<char*>(x.d) + c.off * es, c.dt, T, H, ld);
  const fly_tensor tid = mat(ids.d, c.idt, T, k, k);
  const fly_tensor txp = mat(static_cast<char*>(xp.d) + c.off * es, c.dt, N, H, ld);
  const fly_tensor to = vec(offs.d, FLY_I32, E), tr = mat(row_of.d, FLY_I32, T, k, k), tp = vec(pair_of.d, FLY_I32, N);
  REQUIRE(fly_moe_permute(&tx, &tid, &txp, &to, &tr, &tp, ws_bytes ? ws.d : nullptr, ws_bytes, nullptr) ==
          FLY_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  offs.down();
  row_of.down();
  pair_of.down();
  xp.down();
  int64_t bad = 0;
  for (int64_t e = 0; e < E; ++e)
    if (offs.i32(size_t(e)) != ends[size_t(e)] && bad++ < 5)
      UNSCOPED_INFO("offsets[" << e << "] = " << offs.i32(size_t(e)) << ", want " << ends[size_t(e)]);
  for (int64_t r = 0; r < N; ++r) {
    const int64_t i = order[size_t(r)];
    if ((pair_of.i32(size_t(r)) != i || row_of.i32(size_t(i)) != r) && bad++ < 5)
      UNSCOPED_INFO("row " << r << ": pair_of " << pair_of.i32(size_t(r)) << " want " << i << ", row_of "
                           << row_of.i32(size_t(i)));
    for (int64_t h = 0; h < H; ++h) {
      const double want = r < total ? load(x.h, size_t(c.off + (i / k) * ld + h), c.dt) : 0.0;
      const double got = load(xp.h, size_t(c.off + r * ld + h), c.dt);
      if (!(got == want) && bad++ < 5) UNSCOPED_INFO("x_perm row " << r << " col " << h << ": " << got << " want " << want);
    }
    for (int64_t h = H; h < ld && r + 1 < N; ++h)  // the padding between rows stays as it was
      if (xp.h[size_t((c.off + r * ld + h) * es)] != 0xFF && bad++ < 5) UNSCOPED_INFO("x_perm padding written, row " << r);
  }
  CHECK(bad == 0);

  // out_perm: random rows (garbage past the valid ones, as grouped_mm leaves them).
  Dev op(size_t(c.off + N * ld) * size_t(es)), w(size_t(N) * esize(c.wdt)), dy(size_t(c.off + T * ld) * size_t(es));
  for (size_t i = 0; i < op.h.size() / size_t(es); ++i) store(op.h, i, c.dt, uni(rng));
  for (int64_t r = total; r < N; ++r) store(op.h, size_t(c.off + r * ld), c.dt, NAN);
  for (int64_t i = 0; i < N; ++i) store(w.h, size_t(i), c.wdt, u01(rng));
  for (size_t i = 0; i < dy.h.size() / size_t(es); ++i) store(dy.h, i, c.dt, uni(rng));
  op.up();
  w.up();
  dy.up();
  Dev y(size_t(c.off + T * ld) * size_t(es), 0xFF), dx(size_t(c.off + T * ld) * size_t(es), 0xFF);
  Dev dop(size_t(c.off + N * ld) * size_t(es), 0xFF), dw(size_t(N) * esize(c.wdt), 0xFF);
  auto rows = [&](const Dev& b, int64_t n) { return mat(static_cast<char*>(b.d) + c.off * es, c.dt, n, H, ld); };
  const fly_tensor top = rows(op, N), ty = rows(y, T), tdy = rows(dy, T), tdx = rows(dx, T), tdop = rows(dop, N);
  const fly_tensor tw = mat(w.d, c.wdt, T, k, k), tdw = mat(dw.d, c.wdt, T, k, k);
  REQUIRE(fly_moe_unpermute(&top, &tw, &tr, &to, &ty, nullptr) == FLY_SUCCESS);
  REQUIRE(fly_moe_permute_bwd(&top, &tr, &to, &tdx, nullptr) == FLY_SUCCESS);
  REQUIRE(fly_moe_unpermute_bwd(&tdy, &top, &tw, &tr, &to, &tdop, &tdw, nullptr) == FLY_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  y.down();
  dx.down();
  dop.down();
  dw.down();
  const double tol = tol_of(c.dt);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      double ys = 0, ym = 0, xs = 0, xm = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = row_of.i32(size_t(t * k + j));
        if (r >= total) continue;
        const double v = load(op.h, size_t(c.off + r * ld + h), c.dt), wj = load(w.h, size_t(t * k + j), c.wdt);
        ys += wj * v;
        ym += std::fabs(wj * v);
        xs += v;
        xm += std::fabs(v);
      }
      const double gy = load(y.h, size_t(c.off + t * ld + h), c.dt), gx = load(dx.h, size_t(c.off + t * ld + h), c.dt);
      if (!(std::fabs(gy - ys) <= tol * ym + 1e-6) && bad++ < 5)
        UNSCOPED_INFO("y[" << t << ", " << h << "] = " << gy << " want " << ys);
      if (!(std::fabs(gx - xs) <= tol * xm + 1e-6) && bad++ < 5)
        UNSCOPED_INFO("dx[" << t << ", " << h << "] = " << gx << " want " << xs);
    }
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = row_of.i32(size_t(t * k + j));
      const bool ok = r < total;
      const double wj = load(w.h, size_t(t * k + j), c.wdt);
      double dot = 0, mag = 0;
      for (int64_t h = 0; h < H; ++h) {
        const double g = load(dy.h, size_t(c.off + t * ld + h), c.dt);
        const double want = ok ? wj * g : 0.0;
        const double got = load(dop.h, size_t(c.off + r * ld + h), c.dt);
        if (!(std::fabs(got - want) <= tol * std::fabs(want) + 1e-7) && bad++ < 5)
          UNSCOPED_INFO("dout_perm[" << r << ", " << h << "] = " << got << " want " << want);
        if (ok) {
          const double o = load(op.h, size_t(c.off + r * ld + h), c.dt);
          dot += g * o;
          mag += std::fabs(g * o);
        }
      }
      const double got = load(dw.h, size_t(t * k + j), c.wdt);
      if (!(std::fabs(got - dot) <= tol_of(c.wdt) * std::fabs(dot) + 1e-5 * mag + 1e-6) && bad++ < 5)
        UNSCOPED_INFO("dweights[" << t << ", " << j << "] = " << got << " want " << dot);
    }
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("moe permute and unpermute and their backward against the host", "[moe_route]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F16, FLY_F32}) {
    run_perm({dt, FLY_I64, 300, 8, 128, 256, 1});                              // Qwen3-MoE-like, skewed
    run_perm({dt, FLY_I32, 129, 2, 8, 512, 0, false, 0, 0, dt});               // Mixtral-like, weights in dt
    run_perm({dt, FLY_I64, 1, 8, 256, 64});                                    // T = 1, E = 256
    run_perm({dt, FLY_I64, 77, 1, 16, 40, 2});                                 // k = 1, empty experts, element path
    run_perm({dt, FLY_I32, 200, 4, 32, 96, 0, /*sentinels=*/true, 8, 3});      // sentinels, padded unaligned rows
  }
}

TEST_CASE("moe permute: many pairs (several sort chunks), E = 1024, k = 1 with E = 1", "[moe_route]") {
  run_perm({FLY_BF16, FLY_I64, 20000, 8, 128, 64, 1});   // 160000 pairs: 157 chunks
  run_perm({FLY_BF16, FLY_I64, 300000, 8, 64, 8, 1});    // 2.4M pairs: chunks of more than 1024
  run_perm({FLY_F32, FLY_I32, 3000, 4, 1024, 16, 2});
  run_perm({FLY_F16, FLY_I32, 50, 1, 1, 24});
}

TEST_CASE("moe permute: no tokens zeroes the offsets", "[moe_route]") {
  int32_t* offs;
  CUDA_OK(cudaMalloc(&offs, 64 * 4));
  CUDA_OK(cudaMemset(offs, 0xFF, 64 * 4));
  const fly_tensor ids = mat(nullptr, FLY_I64, 0, 8, 8), to = vec(offs, FLY_I32, 64);
  const fly_tensor tr = mat(nullptr, FLY_I32, 0, 8, 8), tp = vec(nullptr, FLY_I32, 0);
  REQUIRE(fly_moe_permute(nullptr, &ids, nullptr, &to, &tr, &tp, nullptr, 0, nullptr) == FLY_SUCCESS);
  std::vector<int32_t> h(64, -1);
  CUDA_OK(cudaMemcpy(h.data(), offs, 64 * 4, cudaMemcpyDeviceToHost));
  for (int32_t v : h) CHECK(v == 0);
  cudaFree(offs);
}
