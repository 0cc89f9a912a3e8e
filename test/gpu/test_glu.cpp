// SPDX-License-Identifier: Apache-2.0
// Gated linear units on the GPU against an FP64 reference: every dtype and activation, forward
// and backward, aligned and unaligned rows, row strides, gate and up as the halves of one
// projection, in place, tails (N not a whole number of vectors), NaN propagation.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "host_elems.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)

constexpr double kPi = 3.14159265358979323846;

using fly_test::esize;
using fly_test::load;
using fly_test::store;

// act(g) and act'(g) in FP64, and the sums of the absolute values of their terms (am, dm): the
// scale an FP32 evaluation's rounding is relative to (d cancels to near 0 where act has its
// minimum, a where GELU's 1 + tanh or 1 + erf does).
void act_ref(int act, double g, double* a, double* d, double* am, double* dm) {
  if (act == FLY_GLU_SILU) {
    const double s = 1.0 / (1.0 + std::exp(-g));
    *a = g * s;
    *d = s * (1.0 + g * (1.0 - s));
    *am = std::fabs(*a);
    *dm = s + std::fabs(s * g * (1.0 - s));
  } else if (act == FLY_GLU_GELU_TANH) {
    const double k = std::sqrt(2.0 / kPi), c = 0.044715;
    const double t = std::tanh(k * (g + c * g * g * g));
    *a = 0.5 * g * (1.0 + t);
    *d = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * c * g * g);
    *am = 0.5 * std::fabs(g) * (1.0 + std::fabs(t));
    *dm = 0.5 * (1.0 + std::fabs(t)) + std::fabs(0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * c * g * g));
  } else {
    const double e = std::erf(g / std::sqrt(2.0));
    *a = 0.5 * g * (1.0 + e);
    *d = 0.5 * (1.0 + e) + g * std::exp(-0.5 * g * g) / std::sqrt(2.0 * kPi);
    *am = 0.5 * std::fabs(g) * (1.0 + std::fabs(e));
    *dm = 0.5 * (1.0 + std::fabs(e)) + std::fabs(g * std::exp(-0.5 * g * g) / std::sqrt(2.0 * kPi));
  }
}

// Layouts of one case: each operand lives in its own buffer at an element offset with a row
// stride, except `halves` (gate and up are the two halves of one [M, 2N] buffer) and `in_place`
// (the outputs are the inputs: out = gate forward; dgate = gate, dup = up backward).
struct Case {
  fly_dtype dt;
  int act;
  bool fwd;
  int64_t M, N;
  int64_t pad = 0;   // extra elements per row
  int64_t off = 0;   // element offset of every operand's first row
  bool halves = false;
  bool in_place = false;
};

struct Buf {
  std::vector<uint8_t> h;
  void* d = nullptr;
  int64_t ld = 0, off = 0;
};

void run_case(const Case& c) {
  const size_t es = esize(c.dt);
  const int64_t ld = c.halves ? 2 * c.N + c.pad : c.N + c.pad;
  std::mt19937 rng(uint32_t(c.M * 977 + c.N * 31 + c.act * 7 + c.dt + (c.fwd ? 1 : 0)));
  std::uniform_real_distribution<float> uni(-4.f, 4.f);
  auto make = [&](bool input) {
    Buf b;
    b.ld = ld;
    b.off = c.off;
    const size_t n = size_t(c.off + c.M * ld);
    b.h.resize(n * es);
    for (size_t i = 0; i < n; ++i) store(b.h, i, c.dt, input ? uni(rng) : NAN);
    CUDA_OK(cudaMalloc(&b.d, b.h.size()));
    CUDA_OK(cudaMemcpy(b.d, b.h.data(), b.h.size(), cudaMemcpyHostToDevice));
    return b;
  };
  Buf bg = make(true), bu = c.halves ? bg : make(true), bd = make(true);
  const int64_t up_off = c.halves ? c.off + c.N : c.off;
  Buf bo = c.in_place ? bg : make(false), bdu = c.in_place ? bu : make(false);
  auto t = [&](const Buf& b, int64_t off) { return mat(static_cast<char*>(b.d) + off * es, c.dt, c.M, c.N, b.ld); };
  fly_tensor tg = t(bg, c.off), tu = t(bu, up_off), td = t(bd, c.off);
  fly_tensor to = c.in_place ? tg : t(bo, c.off), tdu = c.in_place ? tu : t(bdu, c.off);
  const fly_status s = c.fwd ? fly_glu_fwd(&tg, &tu, c.act, &to, nullptr)
                             : fly_glu_bwd(&td, &tg, &tu, c.act, &to, &tdu, nullptr);
  INFO("dtype " << c.dt << " act " << c.act << (c.fwd ? " fwd" : " bwd") << " M " << c.M << " N " << c.N << " pad "
                << c.pad << " off " << c.off << (c.halves ? " halves" : "") << (c.in_place ? " in place" : "")
                << " variant " << fly_last_variant() << " msg " << fly_get_last_error());
  REQUIRE(s == FLY_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> ho(bo.h.size()), hdu(bdu.h.size());
  CUDA_OK(cudaMemcpy(ho.data(), bo.d, ho.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hdu.data(), bdu.d, hdu.size(), cudaMemcpyDeviceToHost));
  const double rel = c.dt == FLY_BF16 ? 1.0 / 128 : c.dt == FLY_F16 ? 1.0 / 1024 : 1e-5;
  int64_t bad = 0;
  for (int64_t r = 0; r < c.M; ++r)
    for (int64_t j = 0; j < c.N; ++j) {
      const size_t ig = size_t(c.off + r * ld + j), iu = size_t(up_off + r * ld + j);
      const double g = load(bg.h, ig, c.dt), u = load(bu.h, iu, c.dt), dy = load(bd.h, ig, c.dt);
      double a, d, am, dm;
      act_ref(c.act, g, &a, &d, &am, &dm);
      // want within rel of the magnitude of its terms (mag >= |want|)
      auto check = [&](const std::vector<uint8_t>& h, size_t i, double want, double mag) {
        const double got = load(h, i, c.dt);
        if (!(std::fabs(got - want) <= rel * mag + 1e-6) && bad++ < 5)
          UNSCOPED_INFO("row " << r << " col " << j << " got " << got << " want " << want);
      };
      if (c.fwd) {
        check(ho, ig, a * u, am * std::fabs(u));
      } else {
        check(ho, ig, dy * u * d, std::fabs(dy * u) * dm);
        check(hdu, c.in_place ? iu : ig, dy * a, std::fabs(dy) * am);
      }
    }
  // Bytes outside the [M, N] views (padding, the other half) are untouched.
  if (!c.in_place && c.pad > 0)
    for (int64_t r = 0; r < c.M; ++r)
      for (int64_t j = c.N; j < ld; ++j)
        if (!std::isnan(load(ho, size_t(c.off + r * ld + j), c.dt)) && bad++ < 5)
          UNSCOPED_INFO("padding written at row " << r << " col " << j);
  CHECK(bad == 0);
  for (void* p : {bg.d, bu.d, bd.d, bo.d, bdu.d}) {
    if (p == bu.d && c.halves) continue;
    if ((p == bo.d || p == bdu.d) && c.in_place) continue;
    cudaFree(p);
  }
}

}  // namespace

TEST_CASE("glu forward and backward against FP64", "[glu]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F16, FLY_F32})
    for (int act : {FLY_GLU_SILU, FLY_GLU_GELU_TANH, FLY_GLU_GELU})
      for (bool fwd : {true, false}) {
        run_case({dt, act, fwd, 64, 768});                          // aligned, vector path
        run_case({dt, act, fwd, 37, 1000, 0, 0});                   // N % 8 != 0: element path
        run_case({dt, act, fwd, 33, 512, 24, 3});                   // padded rows, unaligned base
        run_case({dt, act, fwd, 129, 256, 0, 0, /*halves=*/true});  // halves of one projection
        run_case({dt, act, fwd, 16, 4096, 0, 0, false, /*in_place=*/true});
        run_case({dt, act, fwd, 1, 7});
      }
}

TEST_CASE("glu: large rows and many rows", "[glu]") {
  run_case({FLY_BF16, FLY_GLU_SILU, true, 4096, 14336});
  run_case({FLY_BF16, FLY_GLU_SILU, false, 4096, 1536});
  run_case({FLY_F16, FLY_GLU_GELU_TANH, true, 70000, 64});  // more rows than one grid pass
}

TEST_CASE("glu propagates NaN and infinities as the unfused ops do", "[glu]") {
  const int64_t N = 16;
  float h[4][N];
  for (int64_t j = 0; j < N; ++j) {
    h[0][j] = j == 3 ? NAN : 1.f;       // gate
    h[1][j] = j == 5 ? INFINITY : 2.f;  // up
  }
  float *dg, *du, *dout;
  CUDA_OK(cudaMalloc(&dg, N * 4));
  CUDA_OK(cudaMalloc(&du, N * 4));
  CUDA_OK(cudaMalloc(&dout, N * 4));
  CUDA_OK(cudaMemcpy(dg, h[0], N * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(du, h[1], N * 4, cudaMemcpyHostToDevice));
  fly_tensor g = mat(dg, FLY_F32, 1, N, N), u = mat(du, FLY_F32, 1, N, N), o = mat(dout, FLY_F32, 1, N, N);
  REQUIRE(fly_glu_fwd(&g, &u, FLY_GLU_SILU, &o, nullptr) == FLY_SUCCESS);
  CUDA_OK(cudaMemcpy(h[2], dout, N * 4, cudaMemcpyDeviceToHost));
  CHECK(std::isnan(h[2][3]));
  CHECK(std::isinf(h[2][5]));
  CHECK(std::fabs(h[2][0] - 2.0 / (1.0 + std::exp(-1.0))) < 1e-6);
  cudaFree(dg);
  cudaFree(du);
  cudaFree(dout);
}
