// SPDX-License-Identifier: Apache-2.0
// RMSNorm forward on the GPU against an FP64 reference: dtypes, odd N, strided and unaligned rows,
// no weight, every bundled variant, and 16 threads on 16 streams racing to the first call.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "catch_compat.hpp"
#include "host_elems.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;
using fly_test::vec;

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)

using fly_test::esize;
using fly_test::load;
using fly_test::store;


struct Case {
  fly_dtype dt;
  int64_t M, N;
  int64_t ldx = 0, ldy = 0;     // 0: N
  int64_t x_off = 0, y_off = 0; // element offsets of the first row (unaligned bases)
  bool weight = true;
  bool rstd = true;
  const char* force = nullptr;
};

// Runs one case on `stream` and checks every element (poisoned beforehand) and rstd.
void run_case(const Case& c, cudaStream_t stream = nullptr, bool use_require = true) {
  const int64_t ldx = c.ldx ? c.ldx : c.N, ldy = c.ldy ? c.ldy : c.N;
  const size_t es = esize(c.dt);
  const size_t xn = size_t(c.x_off + (c.M - 1) * ldx + c.N), yn = size_t(c.y_off + (c.M - 1) * ldy + c.N);
  std::mt19937 rng(uint32_t(c.M * 131 + c.N * 7 + c.dt));
  std::uniform_real_distribution<float> ux(-3.f, 3.f), uw(0.25f, 2.f);
  std::vector<uint8_t> hx(xn * es), hw(size_t(c.N) * es), hy(yn * es);
  for (size_t i = 0; i < xn; ++i) store(hx, i, c.dt, ux(rng));
  for (int64_t i = 0; i < c.N; ++i) store(hw, size_t(i), c.dt, uw(rng));
  void *dx, *dw, *dy, *dr;
  CUDA_OK(cudaMalloc(&dx, hx.size()));
  CUDA_OK(cudaMalloc(&dw, hw.size()));
  CUDA_OK(cudaMalloc(&dy, hy.size()));
  CUDA_OK(cudaMalloc(&dr, size_t(c.M) * 4));
  CUDA_OK(cudaMemcpy(dx, hx.data(), hx.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dw, hw.data(), hw.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dy, 0xff, hy.size()));  // NaN poison: unwritten elements fail
  CUDA_OK(cudaMemset(dr, 0xff, size_t(c.M) * 4));
  fly_tensor tx = mat(static_cast<char*>(dx) + c.x_off * es, c.dt, c.M, c.N, ldx);
  fly_tensor ty = mat(static_cast<char*>(dy) + c.y_off * es, c.dt, c.M, c.N, ldy);
  fly_tensor tw = vec(dw, c.dt, c.N), tr = vec(dr, FLY_F32, c.M);
  if (c.force) REQUIRE(fly_force_variant(c.force) == FLY_SUCCESS);
  fly_status s = fly_rms_norm_fwd(&tx, c.weight ? &tw : nullptr, 1e-5, &ty, c.rstd ? &tr : nullptr, stream);
  std::string msg = fly_get_last_error();
  std::string variant = fly_last_variant();
  if (c.force) fly_force_variant(nullptr);
  INFO("dtype " << c.dt << " M " << c.M << " N " << c.N << " ldx " << ldx << " ldy " << ldy << " x_off "
                << c.x_off << " y_off " << c.y_off << " variant " << variant << " msg " << msg);
  REQUIRE(s == FLY_SUCCESS);
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(hy.data(), dy, hy.size(), cudaMemcpyDeviceToHost));
  std::vector<float> hr(size_t(c.M));
  CUDA_OK(cudaMemcpy(hr.data(), dr, hr.size() * 4, cudaMemcpyDeviceToHost));
  // One rounding of the output plus FP32 accumulation error.
  const double rel = c.dt == FLY_F32 ? 2e-5 : c.dt == FLY_F16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
  int64_t bad = 0;
  double worst = 0;
  for (int64_t r = 0; r < c.M; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < c.N; ++j) { double v = load(hx, size_t(c.x_off + r * ldx + j), c.dt); ss += v * v; }
    const double rs = 1.0 / std::sqrt(ss / double(c.N) + 1e-5);
    if (c.rstd && !(std::fabs(hr[size_t(r)] - rs) <= 2e-5 * rs)) ++bad;
    for (int64_t j = 0; j < c.N; ++j) {
      const double ref = load(hx, size_t(c.x_off + r * ldx + j), c.dt) * rs *
                         (c.weight ? load(hw, size_t(j), c.dt) : 1.0);
      const double got = load(hy, size_t(c.y_off + r * ldy + j), c.dt);
      const double err = std::fabs(got - ref);
      if (!(err <= rel * std::fabs(ref) + 1e-6)) ++bad;
      if (err > worst || err != err) worst = err;
    }
  }
  INFO("bad elements " << bad << " worst abs error " << worst);
  if (use_require) REQUIRE(bad == 0); else CHECK(bad == 0);
  cudaFree(dx); cudaFree(dw); cudaFree(dy); cudaFree(dr);
}

std::vector<std::string> rmsnorm_variants() {
  std::vector<std::string> out;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const char* fam = nullptr;
    fly_variant_info(fly_variant_name(i), &fam, nullptr);
    if (std::string(fam) == "rmsnorm") out.push_back(fly_variant_name(i));
  }
  return out;
}

}  // namespace

// First, so that the threads race to the first load of the modules and the database.
TEST_CASE("16 threads on 16 streams race to the first call", "[rmsnorm][gpu][threads]") {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  std::atomic<bool> go{false};
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      cudaStream_t s;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) { ++failures; return; }
      const fly_dtype dts[3] = {FLY_F16, FLY_BF16, FLY_F32};
      const fly_dtype dt = dts[t % 3];
      const int64_t M = 64 + t, N = 1000 + 97 * t;
      const size_t es = dt == FLY_F32 ? 4 : 2;
      void *x, *y;
      cudaMalloc(&x, size_t(M * N) * es);
      cudaMalloc(&y, size_t(M * N) * es);
      cudaMemsetAsync(x, 0x3c, size_t(M * N) * es, s);
      fly_tensor tx = mat(x, dt, M, N, N), ty = mat(y, dt, M, N, N);
      while (!go.load()) {}
      for (int rep = 0; rep < 20; ++rep)
        if (fly_rms_norm_fwd(&tx, nullptr, 1e-5, &ty, nullptr, s) != FLY_SUCCESS) ++failures;
      if (cudaStreamSynchronize(s) != cudaSuccess) ++failures;
      cudaFree(x); cudaFree(y);
      cudaStreamDestroy(s);
    });
  }
  go = true;
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
  // And the results are right after the race, on a fresh stream.
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  run_case({FLY_BF16, 33, 1291}, s);
  cudaStreamDestroy(s);
}

TEST_CASE("rms_norm matches an FP64 reference for every dtype and awkward N", "[rmsnorm][gpu]") {
  const int64_t Ns[] = {1, 7, 128, 4095, 4096, 4097, 8193, 65539};
  for (fly_dtype dt : {FLY_F16, FLY_BF16, FLY_F32})
    for (int64_t N : Ns) {
      DYNAMIC_SECTION("dtype " << dt << " N " << N) {
        run_case({dt, N >= 65536 ? 9 : 67, N});
      }
    }
}

TEST_CASE("rms_norm handles strided, unaligned rows and absent weight/rstd", "[rmsnorm][gpu]") {
  for (fly_dtype dt : {FLY_F16, FLY_BF16, FLY_F32}) {
    Case strided{dt, 45, 4096};
    strided.ldx = 4096 + 3;   // every row at another alignment
    strided.ldy = 4096 + 8;
    run_case(strided);
    Case base{dt, 31, 777};
    base.x_off = 1;           // unaligned base, y aligned differently (scalar-store path)
    base.ldx = 800;
    run_case(base);
    Case same{dt, 31, 4097};
    same.x_off = same.y_off = 3;  // both unaligned the same way: vector body, scalar head/tail
    run_case(same);
    Case now{dt, 50, 3000};
    now.weight = false;
    now.rstd = false;
    run_case(now);
  }
  // A single row with a huge leading stride is fine (the stride is never used).
  Case one{FLY_BF16, 1, 513};
  one.ldx = int64_t(1) << 40;
  one.ldy = 513;
  run_case(one);
}

TEST_CASE("every bundled rmsnorm variant is correct", "[rmsnorm][gpu][variants]") {
  auto names = rmsnorm_variants();
  REQUIRE(!names.empty());
  for (auto& name : names) {
    const fly_dtype dt = name.find("_fp16_") != std::string::npos ? FLY_F16
                       : name.find("_bf16_") != std::string::npos ? FLY_BF16 : FLY_F32;
    DYNAMIC_SECTION(name) {
      for (int64_t N : {int64_t(1), int64_t(300), int64_t(4097), int64_t(20000)}) {
        Case c{dt, 19, N};
        c.force = name.c_str();
        run_case(c, nullptr, false);
      }
    }
  }
}

// Ring variants (pf >= 2) stream each row's 16-byte-aligned body into shared memory with TMA and
// read its head and tail from global memory: rows at every alignment class, rows shorter than
// one vector, rings that wrap many times (M >> rows in flight), and no weight; plus a row too long
// for the ring (the variant's register path then runs).
TEST_CASE("every bundled shared-memory ring rmsnorm variant is correct on unaligned rows",
          "[rmsnorm][gpu][variants][ring]") {
  auto names = rmsnorm_variants();
  int tested = 0;
  for (auto& name : names) {
    if (name.find("_p2") == std::string::npos && name.find("_p3") == std::string::npos) continue;
    ++tested;
    const fly_dtype dt = name.find("_fp16_") != std::string::npos ? FLY_F16
                       : name.find("_bf16_") != std::string::npos ? FLY_BF16 : FLY_F32;
    DYNAMIC_SECTION(name) {
      Case odd{dt, 37, 4097};        // contiguous: 4 or 8 alignment classes
      odd.force = name.c_str();
      Case tiny{dt, 300, 7};         // rows shorter than a vector: head only
      tiny.force = name.c_str();
      Case off{dt, 29, 1000};        // both bases unaligned the same way, padded rows
      off.x_off = off.y_off = 3;
      off.ldx = off.ldy = 1005;
      off.weight = false;
      off.force = name.c_str();
      Case many{dt, 3000, 250};      // the ring wraps many times per group
      many.force = name.c_str();
      Case longrow{dt, 5, 70001};    // beyond every register cache: no ring
      longrow.force = name.c_str();
      // Every variant takes every shape: where the ring cannot serve, the register path runs.
      for (const Case* c : {&odd, &tiny, &off, &many, &longrow}) {
        run_case(*c, nullptr, false);
      }
    }
  }
  if (tested == 0) WARN("no ring variant bundled in this build: nothing to test here");
}

TEST_CASE("rms_norm rejects host memory and short buffers on the GPU", "[rmsnorm][gpu][args]") {
  std::vector<float> host(64 * 64);
  void* dev;
  // 2 MiB exactly: the driver's allocation granularity, so one row more is past its end.
  CUDA_OK(cudaMalloc(&dev, 512 * 1024 * 4));
  fly_tensor hx = mat(host.data(), FLY_F32, 64, 64, 64), dy = mat(dev, FLY_F32, 64, 64, 64);
  CHECK(fly_rms_norm_fwd(&hx, nullptr, 1e-5, &dy, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(fly_get_last_error()).find("x:") != std::string::npos);
  fly_tensor big = mat(dev, FLY_F32, 513, 1024, 1024);  // one row more than the allocation holds
  CHECK(fly_rms_norm_fwd(&big, nullptr, 1e-5, &big, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(fly_get_last_error()).find("allocation") != std::string::npos);
  fly_tensor ok = mat(dev, FLY_F32, 64, 64, 64);
  CHECK(fly_rms_norm_fwd(&ok, nullptr, 1e-5, &ok, nullptr, nullptr) == FLY_SUCCESS);  // in place
  CUDA_OK(cudaDeviceSynchronize());
  cudaFree(dev);
}
