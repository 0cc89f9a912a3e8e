// SPDX-License-Identifier: Apache-2.0
// fly_cross_entropy_fwd_bwd on the GPU against an FP64 reference: every dtype, vocabulary sizes of
// real models (rows held in registers, in the shared-memory stash, and past it), tails (V not a
// whole number of 16-byte vectors), row strides and unaligned bases (element path), in place and
// out of place, loss only, ignored rows, an all-ignored batch, labels outside [0, V), NaN / Inf
// propagation, more rows than one grid pass, M = 0, outputs and row padding poisoned (NaN) first,
// repeated calls bit-identical.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "catch_compat.hpp"
#include "host_elems.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

namespace {

using fly_test::esize;
using fly_test::load;
using fly_test::mat;
using fly_test::store;
using fly_test::vec;

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)

struct Case {
  fly_dtype dt;
  int64_t M, V;
  int64_t pad = 0;          // extra elements per row (logits and a separate dlogits)
  int64_t off = 0;          // element offset of the first row
  bool in_place = false;    // dlogits is the logits
  bool grad = true;         // false: loss only (dlogits NULL)
  bool lse = true;
  int ignore_every = 0;     // every n-th row's label is ignore_index (0: none)
  int invalid_every = 0;    // every n-th row's label is outside [0, V)
  double scale = 1.0;
  int64_t ignore_index = -100;
};

template <class E>
struct Dev {
  E* p = nullptr;
  explicit Dev(size_t n) { REQUIRE(cudaMalloc(&p, n ? n * sizeof(E) : 1) == cudaSuccess); }
  ~Dev() { cudaFree(p); }
};

double rel_of(fly_dtype dt) { return dt == FLY_BF16 ? 1.0 / 256 : dt == FLY_F16 ? 1.0 / 1024 : 2e-5; }
// The absolute error a gradient of scale `scale` may carry beyond the relative one: FP16 stores
// values below 6.1e-5 as subnormals of step 6e-8 whatever the scale (a scaled-down gradient of
// 1e-9 is 0 or 6e-8 there); the other dtypes' rounding is relative down to far smaller values.
double floor_of(fly_dtype dt, double scale) { return dt == FLY_F16 ? 6e-8 : (dt == FLY_BF16 ? 1e-30 : 1e-9) * scale; }

// Runs the case; logits come from `fill` (default: uniform in [-8, 8]) as stored (rounded to dt).
void run_case(const Case& c, uint32_t seed = 1) {
  INFO("dt " << c.dt << " M " << c.M << " V " << c.V << " pad " << c.pad << " off " << c.off << " in_place "
             << c.in_place << " grad " << c.grad << " ignore " << c.ignore_every << " invalid " << c.invalid_every);
  std::mt19937 rng(seed + uint32_t(c.M * 131 + c.V * 7 + c.dt));
  const int64_t ld = c.V + c.pad, es = int64_t(esize(c.dt));
  const size_t n = size_t(c.off + c.M * ld);
  std::vector<uint8_t> hx(n * size_t(es));
  std::uniform_real_distribution<float> uni(-8.f, 8.f);
  for (size_t i = 0; i < n; ++i) store(hx, i, c.dt, uni(rng));
  std::vector<int64_t> labels(size_t(c.M));
  std::uniform_int_distribution<int64_t> lab(0, c.V - 1);
  for (int64_t r = 0; r < c.M; ++r) {
    labels[size_t(r)] = lab(rng);
    if (c.ignore_every && r % c.ignore_every == 1 % c.ignore_every) labels[size_t(r)] = c.ignore_index;
    if (c.invalid_every && r % c.invalid_every == 0) labels[size_t(r)] = (r / c.invalid_every) % 2 ? c.V : -7;
  }
  // FP64 reference from the stored logits
  std::vector<double> ref_loss(size_t(c.M)), ref_lse(size_t(c.M)), ref_g(size_t(c.M * c.V));
  for (int64_t r = 0; r < c.M; ++r) {
    const int64_t L = labels[size_t(r)];
    if (L == c.ignore_index) {
      ref_loss[size_t(r)] = ref_lse[size_t(r)] = 0;
      for (int64_t j = 0; j < c.V; ++j) ref_g[size_t(r * c.V + j)] = 0;
      continue;
    }
    double m = -INFINITY;
    for (int64_t j = 0; j < c.V; ++j) m = std::max(m, load(hx, size_t(c.off + r * ld + j), c.dt));
    double s = 0;
    for (int64_t j = 0; j < c.V; ++j) s += std::exp(load(hx, size_t(c.off + r * ld + j), c.dt) - m);
    const double lse = m + std::log(s);
    const bool valid = L >= 0 && L < c.V;
    ref_lse[size_t(r)] = lse;
    ref_loss[size_t(r)] = valid ? lse - load(hx, size_t(c.off + r * ld + L), c.dt) : NAN;
    for (int64_t j = 0; j < c.V; ++j)
      ref_g[size_t(r * c.V + j)] =
          valid ? (std::exp(load(hx, size_t(c.off + r * ld + j), c.dt) - lse) - (j == L ? 1 : 0)) * c.scale : NAN;
  }

  Dev<uint8_t> dx(n * size_t(es)), dd(n * size_t(es));
  Dev<int64_t> dl(size_t(c.M));
  Dev<float> dloss(size_t(c.M)), dlse(size_t(c.M));
  CUDA_OK(cudaMemcpy(dx.p, hx.data(), hx.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dl.p, labels.data(), labels.size() * 8, cudaMemcpyHostToDevice));
  // poison: every output byte NaN (0xFF.. is a NaN in every float dtype), the separate dlogits'
  // padding included, so an unwritten element or a write into the padding shows
  CUDA_OK(cudaMemset(dd.p, 0xFF, n * size_t(es)));
  CUDA_OK(cudaMemset(dloss.p, 0xFF, size_t(c.M) * 4));
  CUDA_OK(cudaMemset(dlse.p, 0xFF, size_t(c.M) * 4));
  uint8_t* gbase = c.in_place ? dx.p : dd.p;
  const fly_tensor tx = mat(dx.p + c.off * es, c.dt, c.M, c.V, ld);
  const fly_tensor td = c.in_place ? tx : mat(dd.p + c.off * es, c.dt, c.M, c.V, ld);
  const fly_tensor tl = vec(dl.p, FLY_I64, c.M), tloss = vec(dloss.p, FLY_F32, c.M), tlse = vec(dlse.p, FLY_F32, c.M);
  const fly_status st = fly_cross_entropy_fwd_bwd(&tx, &tl, c.ignore_index, c.scale, &tloss, c.lse ? &tlse : nullptr,
                                                  c.grad ? &td : nullptr, nullptr);
  INFO(fly_get_last_error());
  REQUIRE(st == FLY_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> loss(size_t(c.M)), lse(size_t(c.M));
  std::vector<uint8_t> hg(n * size_t(es));
  CUDA_OK(cudaMemcpy(loss.data(), dloss.p, loss.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(lse.data(), dlse.p, lse.size() * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hg.data(), gbase, hg.size(), cudaMemcpyDeviceToHost));

  int64_t bad_loss = 0, bad_lse = 0, bad_g = 0, bad_pad = 0;
  for (int64_t r = 0; r < c.M; ++r) {
    const double rl = ref_loss[size_t(r)], got = loss[size_t(r)];
    if (std::isnan(rl) ? !std::isnan(got) : !(std::fabs(got - rl) <= 1e-4 + 2e-5 * std::fabs(ref_lse[size_t(r)])))
      ++bad_loss;
    if (c.lse && !(std::fabs(lse[size_t(r)] - ref_lse[size_t(r)]) <= 1e-4 + 2e-5 * std::fabs(ref_lse[size_t(r)])))
      ++bad_lse;
  }
  if (c.grad) {
    for (int64_t r = 0; r < c.M; ++r) {
      for (int64_t j = 0; j < c.V; ++j) {
        const double want = ref_g[size_t(r * c.V + j)], got = load(hg, size_t(c.off + r * ld + j), c.dt);
        const double tol = rel_of(c.dt) * std::fabs(want) + floor_of(c.dt, std::fabs(c.scale));
        if (std::isnan(want) ? !std::isnan(got) : !(std::fabs(got - want) <= tol)) {
          if (bad_g < 5) WARN("row " << r << " col " << j << " got " << got << " want " << want);
          ++bad_g;
        }
      }
      if (!c.in_place)  // the separate dlogits' row padding: never written (still the poison)
        for (int64_t j = c.V; j < ld; ++j)
          if (!std::isnan(load(hg, size_t(c.off + r * ld + j), c.dt))) ++bad_pad;
    }
  } else {  // loss only: logits untouched, the separate buffer too
    std::vector<uint8_t> hx2(hx.size());
    CUDA_OK(cudaMemcpy(hx2.data(), dx.p, hx2.size(), cudaMemcpyDeviceToHost));
    CHECK(std::memcmp(hx2.data(), hx.data(), hx.size()) == 0);
  }
  CHECK(bad_loss == 0);
  CHECK(bad_lse == 0);
  CHECK(bad_g == 0);
  CHECK(bad_pad == 0);
  if (c.in_place && c.pad) {  // in place: the logits' padding keeps the logits
    for (int64_t r = 0; r < c.M; ++r)
      for (int64_t j = c.V; j < ld; ++j)
        if (load(hg, size_t(c.off + r * ld + j), c.dt) != load(hx, size_t(c.off + r * ld + j), c.dt)) ++bad_pad;
    CHECK(bad_pad == 0);
  }

  // A second call on the same inputs (out of place only: in place consumed them) is bit-identical.
  if (!c.in_place && c.grad) {
    CUDA_OK(cudaMemset(dd.p, 0xFF, n * size_t(es)));
    REQUIRE(fly_cross_entropy_fwd_bwd(&tx, &tl, c.ignore_index, c.scale, &tloss, c.lse ? &tlse : nullptr, &td,
                                      nullptr) == FLY_SUCCESS);
    std::vector<uint8_t> hg2(hg.size());
    std::vector<float> loss2(loss.size());
    CUDA_OK(cudaMemcpy(hg2.data(), dd.p, hg2.size(), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(loss2.data(), dloss.p, loss2.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(std::memcmp(hg2.data(), hg.data(), hg.size()) == 0);
    CHECK(std::memcmp(loss2.data(), loss.data(), loss.size() * 4) == 0);
  }
}

}  // namespace

TEST_CASE("cross_entropy against FP64 - dtypes tails strides in place loss only", "[cross_entropy]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F16, FLY_F32}) {
    run_case({dt, 64, 32000});                                 // whole rows in registers, vector path
    run_case({dt, 37, 1001});                                  // V % 8 != 0: element path
    run_case({dt, 33, 4096, 24, 3});                           // padded rows, unaligned base: element path
    run_case({dt, 40, 768, 8, 0});                             // padded rows, 16-byte aligned: vector path
    run_case({dt, 24, 2048, 0, 0, /*in_place=*/true});
    run_case({dt, 19, 5003, 5, 1, /*in_place=*/true});         // in place on the element path
    run_case({dt, 12, 3000, 0, 0, false, /*grad=*/false});     // loss only
    run_case({dt, 12, 3000, 0, 0, false, true, /*lse=*/false});
    run_case({dt, 1, 7});
    run_case({dt, 3, 1});                                      // one class: loss 0, gradient 0
    run_case({dt, 20, 4096, 0, 0, false, true, true, 0, 0, /*scale=*/1.0 / 3000});
  }
}

TEST_CASE("cross_entropy - vocabularies of real models in registers shared memory and reread",
          "[cross_entropy]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F16, FLY_F32}) {
    run_case({dt, 6, 128256});                             // Llama 3
    run_case({dt, 5, 151936, 0, 0, /*in_place=*/true});    // Qwen 2 / 3, in place
    run_case({dt, 4, 151937, 3, 1});                       // the same plus a tail, element path
  }
  run_case({FLY_BF16, 300, 128256, 0, 0, false, true, true, /*ignore_every=*/4});  // several rows per CTA
}

TEST_CASE("cross_entropy - ignored rows all ignored and labels outside the vocabulary", "[cross_entropy]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F32}) {
    run_case({dt, 50, 4096, 0, 0, false, true, true, /*ignore_every=*/3});
    run_case({dt, 50, 4096, 0, 0, true, true, true, 3});                       // in place
    run_case({dt, 16, 1000, 0, 0, false, true, true, /*ignore_every=*/1});    // every row ignored
    run_case({dt, 16, 1000, 0, 0, false, true, true, 1, 0, 1.0, /*ignore_index=*/5});  // an in-range ignore_index
    run_case({dt, 30, 2000, 0, 0, false, true, true, 0, /*invalid_every=*/4}); // NaN rows, no OOB access
    run_case({dt, 30, 20000, 0, 0, true, true, true, 5, 7});
  }
}

TEST_CASE("cross_entropy - many rows more than one grid pass", "[cross_entropy]") {
  run_case({FLY_BF16, 3000, 512, 0, 0, false, true, true, 7});
  run_case({FLY_F16, 2000, 4100, 4, 2});
  run_case({FLY_F32, 1500, 700, 0, 0, true});
}

TEST_CASE("cross_entropy - M = 0 is a no-op", "[cross_entropy]") {
  Dev<float> d(16);
  const fly_tensor x = mat(nullptr, FLY_BF16, 0, 128256, 128256), l = vec(nullptr, FLY_I64, 0),
                   o = vec(nullptr, FLY_F32, 0);
  CHECK(fly_cross_entropy_fwd_bwd(&x, &l, -100, 1.0, &o, &o, &x, nullptr) == FLY_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
}

TEST_CASE("cross_entropy propagates NaN and infinities as torch", "[cross_entropy]") {
  const int64_t M = 6, V = 64;
  std::vector<float> x(size_t(M * V));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 17) - 8) * 0.25f;
  std::vector<int64_t> lab = {1, 2, 3, 4, 5, 6};
  const float inf = std::numeric_limits<float>::infinity();
  x[0 * V + 9] = NAN;                                      // row 0: NaN -> loss, lse, gradient NaN
  x[1 * V + 9] = inf;                                      // row 1: +Inf -> NaN
  x[2 * V + 9] = -inf;                                     // row 2: -Inf elsewhere: finite, its gradient 0
  x[3 * V + 4] = -inf;                                     // row 3: -Inf at the label -> loss +Inf
  for (int64_t j = 0; j < V; ++j) x[size_t(4 * V + j)] = -inf;  // row 4: all -Inf -> NaN
  x[5 * V + 0] = 80.f;                                     // row 5: large logits stay finite
  Dev<float> dx(size_t(M * V)), dg(size_t(M * V)), dloss(M), dlse(M);
  Dev<int64_t> dl(M);
  CUDA_OK(cudaMemcpy(dx.p, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dl.p, lab.data(), lab.size() * 8, cudaMemcpyHostToDevice));
  const fly_tensor tx = mat(dx.p, FLY_F32, M, V, V), tg = mat(dg.p, FLY_F32, M, V, V), tl = vec(dl.p, FLY_I64, M);
  const fly_tensor to = vec(dloss.p, FLY_F32, M), ts = vec(dlse.p, FLY_F32, M);
  REQUIRE(fly_cross_entropy_fwd_bwd(&tx, &tl, -100, 1.0, &to, &ts, &tg, nullptr) == FLY_SUCCESS);
  std::vector<float> loss(M), lse(M), g(size_t(M * V));
  CUDA_OK(cudaMemcpy(loss.data(), dloss.p, M * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(lse.data(), dlse.p, M * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(g.data(), dg.p, g.size() * 4, cudaMemcpyDeviceToHost));
  auto row_all = [&](int64_t r, auto pred) {
    for (int64_t j = 0; j < V; ++j)
      if (!pred(g[size_t(r * V + j)])) return false;
    return true;
  };
  auto isnan_f = [](float v) { return std::isnan(v); };
  auto finite_f = [](float v) { return std::isfinite(v); };
  CHECK(std::isnan(loss[0]));
  CHECK(std::isnan(lse[0]));
  CHECK(row_all(0, isnan_f));
  CHECK(std::isnan(loss[1]));
  CHECK(row_all(1, isnan_f));
  CHECK(std::isfinite(loss[2]));
  CHECK(row_all(2, finite_f));
  CHECK(g[size_t(2 * V + 9)] == 0.f);
  CHECK(std::isinf(loss[3]));
  CHECK(loss[3] > 0);
  CHECK(std::isnan(loss[4]));
  CHECK(row_all(4, isnan_f));
  CHECK(std::isfinite(loss[5]));
  CHECK(std::fabs(lse[5] - 80.f) < 1e-3);
  CHECK(row_all(5, finite_f));
  CHECK(std::fabs(g[size_t(5 * V)] - 1.f) < 1e-5);  // softmax ~1 at the large logit (label 6 elsewhere)
}
