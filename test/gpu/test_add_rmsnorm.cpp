// SPDX-License-Identifier: Apache-2.0
// RMSNorm with a fused residual add on the GPU against an FP64 reference: every dtype, forward
// and backward (dx and dweight), aligned and unaligned rows, row strides, tails (N not a whole
// number of vectors), rows longer than the register cache, more rows than one grid pass, in
// place, no weight, no dh, poisoned (NaN) outputs and padding, repeat runs bit-identical, and
// NaN / Inf propagation as the unfused ops.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
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
  int64_t M, N;
  int64_t pad = 0;        // extra elements per row
  int64_t off = 0;        // element offset of every operand's first row
  bool weight = true;
  bool in_place = false;  // fwd: y over x, h over residual; bwd: dx over dy (dx over dh with swap)
  bool dh = true;         // bwd: a gradient arriving on h
  bool swap = false;      // fwd: y over residual, h over x; bwd: dx over dh
};

// An [M, N] buffer of dt with row stride ld, starting `off` elements in; host copy and device copy.
struct Buf {
  std::vector<uint8_t> h;
  void* d = nullptr;
  int64_t ld = 0, off = 0;
  fly_dtype dt = FLY_F32;
  size_t at(int64_t r, int64_t j) const { return size_t(off + r * ld + j); }
  double get(int64_t r, int64_t j) const { return load(h, at(r, j), dt); }
};

struct Bufs {
  std::vector<void*> owned;
  ~Bufs() {
    for (void* p : owned) cudaFree(p);
  }
  Buf make(fly_dtype dt, int64_t rows, int64_t ld, int64_t off, std::mt19937* rng, float lo = -3.f, float hi = 3.f) {
    Buf b;
    b.ld = ld;
    b.off = off;
    b.dt = dt;
    const size_t n = size_t(off + rows * ld);
    b.h.resize(n * esize(dt));
    std::uniform_real_distribution<float> uni(lo, hi);
    for (size_t i = 0; i < n; ++i) store(b.h, i, dt, rng ? uni(*rng) : NAN);  // no rng: poisoned
    if (cudaMalloc(&b.d, b.h.size() ? b.h.size() : 1) != cudaSuccess) return b;
    owned.push_back(b.d);
    cudaMemcpy(b.d, b.h.data(), b.h.size(), cudaMemcpyHostToDevice);
    return b;
  }
};

void fetch(Buf& b) { REQUIRE(cudaMemcpy(b.h.data(), b.d, b.h.size(), cudaMemcpyDeviceToHost) == cudaSuccess); }
fly_tensor view(const Buf& b, int64_t M, int64_t N) {
  return mat(static_cast<char*>(b.d) + b.off * esize(b.dt), b.dt, M, N, b.ld);
}
double rel_of(fly_dtype dt) { return dt == FLY_BF16 ? 1.0 / 128 : dt == FLY_F16 ? 1.0 / 1024 : 2e-5; }

void run_fwd(const Case& c) {
  std::mt19937 rng(uint32_t(c.M * 977 + c.N * 31 + c.dt * 7 + c.pad));
  Bufs bufs;
  const int64_t ld = c.N + c.pad;
  Buf bx = bufs.make(c.dt, c.M, ld, c.off, &rng), br = bufs.make(c.dt, c.M, ld, c.off, &rng);
  Buf bw = bufs.make(c.dt, 1, c.N, 0, &rng, 0.5f, 1.5f);
  Buf by = bufs.make(c.dt, c.M, ld, c.off, nullptr), bh = bufs.make(c.dt, c.M, ld, c.off, nullptr);
  Buf brs = bufs.make(FLY_F32, 1, c.M, 0, nullptr);
  const Buf x0 = bx, r0 = br;  // the inputs as they were (in place overwrites them)
  fly_tensor tx = view(bx, c.M, c.N), tr = view(br, c.M, c.N), tw = vec(bw.d, c.dt, c.N);
  fly_tensor ty = view(by, c.M, c.N), th = view(bh, c.M, c.N), trs = vec(brs.d, FLY_F32, c.M);
  Buf* yb = &by;
  Buf* hb = &bh;
  if (c.in_place) ty = tx, th = tr, yb = &bx, hb = &br;
  if (c.swap) ty = tr, th = tx, yb = &br, hb = &bx;
  const double eps = 1e-5;
  const fly_status s = fly_add_rms_norm_fwd(&tx, &tr, c.weight ? &tw : nullptr, eps, &ty, &th, &trs, nullptr);
  INFO("fwd dtype " << c.dt << " M " << c.M << " N " << c.N << " pad " << c.pad << " off " << c.off
                    << (c.weight ? "" : " no weight") << (c.in_place ? " in place" : "") << (c.swap ? " swapped" : "")
                    << " variant " << fly_last_variant() << " msg " << fly_get_last_error());
  REQUIRE(s == FLY_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  fetch(*yb);
  fetch(*hb);
  fetch(brs);
  const double rel = rel_of(c.dt);
  int64_t bad = 0;
  std::vector<uint8_t> hround(esize(c.dt));
  for (int64_t r = 0; r < c.M; ++r) {
    // h as the kernel must round it: the FP32 sum rounded to the dtype, bit for bit.
    std::vector<double> hv(size_t(c.N));
    double ss = 0;
    for (int64_t j = 0; j < c.N; ++j) {
      store(hround, 0, c.dt, float(x0.get(r, j)) + float(r0.get(r, j)));
      hv[size_t(j)] = load(hround, 0, c.dt);
      ss += hv[size_t(j)] * hv[size_t(j)];
    }
    const double rs = 1.0 / std::sqrt(ss / double(c.N) + eps);
    const double got_rs = load(brs.h, size_t(r), FLY_F32);
    if (!(std::fabs(got_rs - rs) <= 1e-5 * rs) && bad++ < 5) UNSCOPED_INFO("row " << r << " rstd " << got_rs << " want " << rs);
    for (int64_t j = 0; j < c.N; ++j) {
      const double w = c.weight ? bw.get(0, j) : 1.0;
      const double want = hv[size_t(j)] * rs * w, got = yb->get(r, j), goth = hb->get(r, j);
      if (!(std::fabs(got - want) <= rel * std::fabs(want) + 1e-6) && bad++ < 5)
        UNSCOPED_INFO("row " << r << " col " << j << " y " << got << " want " << want);
      if (!(goth == hv[size_t(j)]) && bad++ < 5)
        UNSCOPED_INFO("row " << r << " col " << j << " h " << goth << " want " << hv[size_t(j)]);
    }
  }
  if (!c.in_place && !c.swap && c.pad > 0)  // padding of the outputs untouched (still NaN)
    for (int64_t r = 0; r < c.M; ++r)
      for (int64_t j = c.N; j < ld; ++j)
        if ((!std::isnan(by.get(r, j)) || !std::isnan(bh.get(r, j))) && bad++ < 5)
          UNSCOPED_INFO("padding written at row " << r << " col " << j);
  CHECK(bad == 0);
}

void run_bwd(const Case& c) {
  std::mt19937 rng(uint32_t(c.M * 131 + c.N * 17 + c.dt * 5 + c.pad + 1));
  Bufs bufs;
  const int64_t ld = c.N + c.pad;
  Buf bdy = bufs.make(c.dt, c.M, ld, c.off, &rng), bdh = bufs.make(c.dt, c.M, ld, c.off, &rng);
  Buf bh = bufs.make(c.dt, c.M, ld, c.off, &rng), bw = bufs.make(c.dt, 1, c.N, 0, &rng, 0.5f, 1.5f);
  Buf bdx = bufs.make(c.dt, c.M, ld, c.off, nullptr), bdw = bufs.make(c.dt, 1, c.N, 0, nullptr);
  // rstd as the forward would have written it (FP32), from h
  Buf brs = bufs.make(FLY_F32, 1, c.M, 0, nullptr);
  for (int64_t r = 0; r < c.M; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < c.N; ++j) ss += bh.get(r, j) * bh.get(r, j);
    store(brs.h, size_t(r), FLY_F32, float(1.0 / std::sqrt(ss / double(c.N) + 1e-5)));
  }
  CUDA_OK(cudaMemcpy(brs.d, brs.h.data(), brs.h.size(), cudaMemcpyHostToDevice));
  const Buf dy0 = bdy, dh0 = bdh;
  fly_tensor tdy = view(bdy, c.M, c.N), tdh = view(bdh, c.M, c.N), th = view(bh, c.M, c.N);
  fly_tensor tw = vec(bw.d, c.dt, c.N), trs = vec(brs.d, FLY_F32, c.M);
  fly_tensor tdx = view(bdx, c.M, c.N), tdw = vec(bdw.d, c.dt, c.N);
  Buf* dxb = &bdx;
  if (c.in_place) tdx = tdy, dxb = &bdy;
  if (c.swap) tdx = tdh, dxb = &bdh;
  const fly_tensor* pw = c.weight ? &tw : nullptr;
  size_t ws_bytes = 0;
  REQUIRE(fly_add_rms_norm_bwd_workspace_size(&th, pw, &ws_bytes) == FLY_SUCCESS);
  void* ws = nullptr;
  if (ws_bytes) {
    CUDA_OK(cudaMalloc(&ws, ws_bytes));
    bufs.owned.push_back(ws);
    CUDA_OK(cudaMemset(ws, 0xff, ws_bytes));  // poisoned: the kernel must not read what it did not write
  }
  auto call = [&] {
    return fly_add_rms_norm_bwd(&tdy, c.dh ? &tdh : nullptr, &th, pw, &trs, &tdx, c.weight ? &tdw : nullptr, ws,
                                ws_bytes, nullptr);
  };
  const fly_status s = call();
  INFO("bwd dtype " << c.dt << " M " << c.M << " N " << c.N << " pad " << c.pad << " off " << c.off
                    << (c.weight ? "" : " no weight") << (c.dh ? "" : " no dh") << (c.in_place ? " in place" : "")
                    << (c.swap ? " dx over dh" : "") << " variant " << fly_last_variant() << " msg "
                    << fly_get_last_error());
  REQUIRE(s == FLY_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  fetch(*dxb);
  fetch(bdw);
  const double rel = rel_of(c.dt);
  int64_t bad = 0;
  std::vector<double> dw(size_t(c.N), 0.0), dwmag(size_t(c.N), 0.0);
  for (int64_t r = 0; r < c.M; ++r) {
    const double rs = load(brs.h, size_t(r), FLY_F32);
    double c1 = 0, c1mag = 0;
    for (int64_t j = 0; j < c.N; ++j) {
      const double w = c.weight ? bw.get(0, j) : 1.0;
      const double t = dy0.get(r, j) * w * bh.get(r, j) * rs;
      c1 += t;
      c1mag += std::fabs(t);
    }
    c1 /= double(c.N);
    c1mag /= double(c.N);
    for (int64_t j = 0; j < c.N; ++j) {
      const double w = c.weight ? bw.get(0, j) : 1.0, dy = dy0.get(r, j), hh = bh.get(r, j) * rs;
      const double dh = c.dh ? dh0.get(r, j) : 0.0;
      const double want = rs * (dy * w - hh * c1) + dh;
      const double mag = rs * (std::fabs(dy * w) + std::fabs(hh) * c1mag) + std::fabs(dh);
      const double got = dxb->get(r, j);
      if (!(std::fabs(got - want) <= rel * mag + 1e-6) && bad++ < 5)
        UNSCOPED_INFO("row " << r << " col " << j << " dx " << got << " want " << want);
      dw[size_t(j)] += dy * hh;
      dwmag[size_t(j)] += std::fabs(dy * hh);
    }
  }
  if (c.weight)
    for (int64_t j = 0; j < c.N; ++j) {
      const double got = bdw.get(0, j), want = dw[size_t(j)];
      if (!(std::fabs(got - want) <= (rel + 1e-5) * dwmag[size_t(j)] + 1e-6) && bad++ < 5)
        UNSCOPED_INFO("col " << j << " dweight " << got << " want " << want);
    }
  if (!c.in_place && !c.swap && c.pad > 0)
    for (int64_t r = 0; r < c.M; ++r)
      for (int64_t j = c.N; j < ld; ++j)
        if (!std::isnan(bdx.get(r, j)) && bad++ < 5) UNSCOPED_INFO("padding written at row " << r << " col " << j);
  CHECK(bad == 0);
  // Deterministic: a second run gives the same bits (dx and dweight), inputs permitting.
  if (!c.in_place && !c.swap) {
    const std::vector<uint8_t> dx1 = bdx.h, dw1 = bdw.h;
    REQUIRE(call() == FLY_SUCCESS);
    CUDA_OK(cudaDeviceSynchronize());
    fetch(bdx);
    fetch(bdw);
    CHECK(bdx.h == dx1);
    CHECK(bdw.h == dw1);
  }
}

void both(const Case& c) {
  run_fwd(c);
  run_bwd(c);
}

}  // namespace

TEST_CASE("add_rms_norm forward and backward against FP64", "[add_rmsnorm]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F16, FLY_F32}) {
    both({dt, 64, 4096});                  // aligned: vector path
    both({dt, 37, 1000});                  // N % 8 != 0 (FP16/BF16 element path)
    both({dt, 33, 512, 24, 3});            // padded rows, unaligned base: element path
    both({dt, 40, 768, 8, 0});             // padded rows, 16-byte aligned: vector path with a row stride
    both({dt, 1, 7});
    both({dt, 5, 20000});                  // rows longer than the register cache: two passes
    both({dt, 4, 20001});                  // the same on the element path
    both({dt, 16, 2048, 0, 0, /*weight=*/false});
    both({dt, 16, 2048, 0, 0, true, /*in_place=*/true});
    both({dt, 16, 2048, 0, 0, true, false, true, /*swap=*/true});
    run_bwd({dt, 24, 1536, 0, 0, true, false, /*dh=*/false});
    run_bwd({dt, 24, 1536, 0, 0, false, false, false});
  }
}

TEST_CASE("add_rms_norm: many rows (more than one grid pass), long rows with many rows", "[add_rmsnorm]") {
  both({FLY_BF16, 3000, 256});
  both({FLY_F16, 2500, 4096});
  run_bwd({FLY_BF16, 600, 20000});  // two-pass rows, several rows per CTA: the workspace partials
  run_bwd({FLY_F32, 1100, 9000, 3, 1});
}

TEST_CASE("add_rms_norm propagates NaN and infinities as the unfused ops do", "[add_rmsnorm]") {
  const int64_t M = 3, N = 64;
  std::vector<float> x(size_t(M * N), 1.f), r(size_t(M * N), 0.5f), out(size_t(M * N)), hout(size_t(M * N));
  x[3] = NAN;           // row 0: a NaN in x
  r[N + 5] = INFINITY;  // row 1: an infinity in residual
  float *dx, *dr, *dy, *dh, *drs;
  CUDA_OK(cudaMalloc(&dx, M * N * 4));
  CUDA_OK(cudaMalloc(&dr, M * N * 4));
  CUDA_OK(cudaMalloc(&dy, M * N * 4));
  CUDA_OK(cudaMalloc(&dh, M * N * 4));
  CUDA_OK(cudaMalloc(&drs, M * 4));
  CUDA_OK(cudaMemcpy(dx, x.data(), M * N * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dr, r.data(), M * N * 4, cudaMemcpyHostToDevice));
  fly_tensor tx = mat(dx, FLY_F32, M, N, N), tr = mat(dr, FLY_F32, M, N, N), ty = mat(dy, FLY_F32, M, N, N);
  fly_tensor th = mat(dh, FLY_F32, M, N, N), trs = vec(drs, FLY_F32, M);
  REQUIRE(fly_add_rms_norm_fwd(&tx, &tr, nullptr, 1e-6, &ty, &th, &trs, nullptr) == FLY_SUCCESS);
  CUDA_OK(cudaMemcpy(out.data(), dy, M * N * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hout.data(), dh, M * N * 4, cudaMemcpyDeviceToHost));
  // row 0: mean(h^2) is NaN, so every y is NaN; h is NaN only where x was
  for (int64_t j = 0; j < N; ++j) CHECK(std::isnan(out[size_t(j)]));
  CHECK(std::isnan(hout[3]));
  CHECK(hout[4] == 1.5f);
  // row 1: mean(h^2) is inf, rstd 0: inf * 0 = NaN where h is inf, 0 elsewhere (as h * rsqrt(inf))
  CHECK(std::isinf(hout[size_t(N + 5)]));
  CHECK(std::isnan(out[size_t(N + 5)]));
  CHECK(out[size_t(N + 6)] == 0.f);
  // row 2: untouched by the others
  CHECK(std::fabs(out[size_t(2 * N)] - 1.0) < 1e-5);
  for (float* p : {dx, dr, dy, dh, drs}) cudaFree(p);
}
