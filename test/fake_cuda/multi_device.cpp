// SPDX-License-Identifier: Apache-2.0
// Several GPUs in one process, on the stand-in driver configured with two sm_90 devices (its own
// executable: the device count is fixed before the library's first driver call). Every family on a
// stream of device 1 while device 0's context is current; the caller's context left as it was;
// modules loaded lazily on the device that uses them; memory of one device with a stream of the
// other refused; threads on both devices at once; first use racing from 16 threads.
// No kernel runs: what is checked is what the library asked the driver to do.
#include <atomic>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <cuda.h>

#include "catch_compat.hpp"
#include "fake_cuda.h"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

// The stand-in's own driver entry points (the test links it; the library reaches the same
// instance through FLYKERNELS_LIBCUDA).
extern "C" {
CUresult cuDevicePrimaryCtxRetain(CUcontext*, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxGetCurrent(CUcontext*);
}

namespace {

using fly_test::mat;
using fly_test::mentions;
using fly_test::vec;

const bool kConfigured = [] {
  fake_cuda_configure(2, 9, 0);  // two H200-like devices
  return true;
}();

CUcontext primary(int device) {
  // The stand-in creates its contexts at cuInit, which the library's first call makes.
  static const bool initialized = [] {
    const char* arch = nullptr;
    return fly_device_arch(fake_cuda_stream_create(0), &arch) == FLY_SUCCESS;
  }();
  REQUIRE(initialized);
  CUcontext c = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&c, device) == CUDA_SUCCESS);
  return c;
}

CUcontext current_ctx() {
  CUcontext c = nullptr;
  cuCtxGetCurrent(&c);
  return c;
}

std::string status_text(fly_status s) { return std::string(fly_status_string(s)) + ": " + fly_get_last_error(); }

// Buffers of every family's call on one device (fake addresses: nothing is dereferenced).
struct Calls {
  int device;
  void* stream;
  // rmsnorm bf16 [64, 4096]
  void *x, *y;
  // topk fp32 [256, 1024], k = 8 (register path: no workspace)
  void *tx, *tv, *ti;
  // gemm bf16 NT 256 x 1024 x 512
  void *ga, *gb, *gc;
  // attention bf16 B1 H2 S128 D64
  void *q, *k, *v, *o;

  explicit Calls(int dev, void* s) : device(dev), stream(s) {
    auto m = [dev](size_t bytes) { return fake_cuda_malloc_on(dev, bytes); };
    x = m(64 * 4096 * 2);
    y = m(64 * 4096 * 2);
    tx = m(256 * 1024 * 4);
    tv = m(256 * 8 * 4);
    ti = m(256 * 8 * 8);
    ga = m(256 * 512 * 2);
    gb = m(1024 * 512 * 2);
    gc = m(256 * 1024 * 2);
    q = m(2 * 128 * 64 * 2);
    k = m(2 * 128 * 64 * 2);
    v = m(2 * 128 * 64 * 2);
    o = m(2 * 128 * 64 * 2);
  }

  fly_status rmsnorm() const {
    fly_tensor tx_ = mat(x, FLY_BF16, 64, 4096, 4096), ty = mat(y, FLY_BF16, 64, 4096, 4096);
    return fly_rms_norm_fwd(&tx_, nullptr, 1e-5, &ty, nullptr, stream);
  }
  fly_status topk() const {
    fly_tensor a = mat(tx, FLY_F32, 256, 1024, 1024), val = mat(tv, FLY_F32, 256, 8, 8),
               idx = mat(ti, FLY_I64, 256, 8, 8);
    return fly_topk(&a, 8, 1, 0, &val, &idx, nullptr, 0, stream);
  }
  fly_status gemm() const {
    fly_tensor a = mat(ga, FLY_BF16, 256, 512, 512), b = mat(gb, FLY_BF16, 512, 1024, 1, 512),
               c = mat(gc, FLY_BF16, 256, 1024, 1024);
    return fly_gemm(&a, &b, &c, nullptr, nullptr, 0, stream);
  }
  fly_status attention() const {
    fly_tensor tq = flykernels::tensor(q, FLY_BF16, {1, 2, 128, 64}), tk = flykernels::tensor(k, FLY_BF16, {1, 2, 128, 64}),
               tv_ = flykernels::tensor(v, FLY_BF16, {1, 2, 128, 64}), to = flykernels::tensor(o, FLY_BF16, {1, 2, 128, 64});
    fly_attention_fwd_params p;
    std::memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.q = &tq;
    p.k = &tk;
    p.v = &tv_;
    p.o = &to;
    return fly_attention_fwd(&p, stream);
  }
  fly_status family(int i) const {
    switch (i % 4) {
      case 0: return rmsnorm();
      case 1: return topk();
      case 2: return gemm();
      default: return attention();
    }
  }
};

// Every launch recorded since `from` ran on `device`, from a module loaded on `device`, on `stream`.
void check_launches_since(int from, int device, void* stream) {
  const int n = fake_cuda_launch_count();
  REQUIRE(n > from);
  for (int i = from; i < n; ++i) {
    const fake_cuda_launch* L = fake_cuda_get_launch(i);
    INFO(L->kernel);
    CHECK(L->device == device);
    CHECK(L->stream == stream);
    CHECK(fake_cuda_module_device(L->module) == device);
  }
}

}  // namespace

TEST_CASE("every family runs on a stream of device 1 while device 0 is current", "[multi]") {
  REQUIRE(kConfigured);
  const CUcontext c0 = primary(0), c1 = primary(1);
  REQUIRE(c0 != c1);
  REQUIRE(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
  void* s1 = fake_cuda_stream_create(1);
  const Calls d1(1, s1);
  const int modules_before = fake_cuda_module_count();
  for (int f = 0; f < 4; ++f) {
    const int from = fake_cuda_launch_count();
    const fly_status st = d1.family(f);
    INFO("family " << f << ": " << status_text(st));
    REQUIRE(st == FLY_SUCCESS);
    check_launches_since(from, 1, s1);
    CHECK(current_ctx() == c0);  // the caller's context, as it was
  }
  // Lazily: the first uses loaded modules, all of them on device 1.
  REQUIRE(fake_cuda_module_count() > modules_before);
  for (int m = modules_before; m < fake_cuda_module_count(); ++m) CHECK(fake_cuda_module_device(m) == 1);

  // The same variants on device 0 load again there (a module belongs to one context).
  void* s0 = fake_cuda_stream_create(0);
  const Calls d0(0, s0);
  const int loaded_d1 = fake_cuda_module_count();
  for (int f = 0; f < 4; ++f) {
    const int from = fake_cuda_launch_count();
    REQUIRE(d0.family(f) == FLY_SUCCESS);
    check_launches_since(from, 0, s0);
  }
  CHECK(fake_cuda_module_count() > loaded_d1);
  for (int m = loaded_d1; m < fake_cuda_module_count(); ++m) CHECK(fake_cuda_module_device(m) == 0);
  // And again on device 1: nothing new to load.
  const int loaded = fake_cuda_module_count();
  for (int f = 0; f < 4; ++f) REQUIRE(d1.family(f) == FLY_SUCCESS);
  CHECK(fake_cuda_module_count() == loaded);
  cuCtxSetCurrent(nullptr);
}

TEST_CASE("the null stream means the current context's device", "[multi]") {
  const CUcontext c1 = primary(1);
  REQUIRE(cuCtxSetCurrent(c1) == CUDA_SUCCESS);
  const Calls d1(1, nullptr);
  const int from = fake_cuda_launch_count();
  REQUIRE(d1.rmsnorm() == FLY_SUCCESS);
  check_launches_since(from, 1, nullptr);
  CHECK(current_ctx() == c1);
  const char* arch = nullptr;
  CHECK(fly_device_arch(nullptr, &arch) == FLY_SUCCESS);
  CHECK(current_ctx() == c1);
  cuCtxSetCurrent(nullptr);
}

TEST_CASE("memory of one device with a stream of the other is refused with a message", "[multi]") {
  void* s0 = fake_cuda_stream_create(0);
  void* s1 = fake_cuda_stream_create(1);
  // Device-1 buffers, device-0 stream; then the reverse.
  for (int dev = 0; dev < 2; ++dev) {
    const Calls wrong(1 - dev, dev == 0 ? s0 : s1);
    for (int f = 0; f < 4; ++f) {
      const int from = fake_cuda_launch_count();
      const fly_status st = wrong.family(f);
      INFO("family " << f << " on device " << dev << ": " << status_text(st));
      CHECK(st == FLY_ERROR_INVALID_ARGUMENT);
      CHECK(mentions(("is memory of device " + std::to_string(1 - dev)).c_str()));
      CHECK(mentions(("the stream belongs to device " + std::to_string(dev)).c_str()));
      CHECK(fake_cuda_launch_count() == from);  // nothing launched
    }
  }
  // Managed memory may be used from either device.
  void* mx = fake_cuda_malloc_managed(64 * 4096 * 2);
  void* my = fake_cuda_malloc_managed(64 * 4096 * 2);
  fly_tensor x = mat(mx, FLY_BF16, 64, 4096, 4096), y = mat(my, FLY_BF16, 64, 4096, 4096);
  CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, s0) == FLY_SUCCESS);
  CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, s1) == FLY_SUCCESS);
  // A mixed call: x on device 0, y on device 1.
  void* y1 = fake_cuda_malloc_on(1, 64 * 4096 * 2);
  fly_tensor ty1 = mat(y1, FLY_BF16, 64, 4096, 4096);
  CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &ty1, nullptr, s0) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("y:"));
}

TEST_CASE("a thread per device, each running every family, at the same time", "[multi]") {
  fake_cuda_clear_records();
  void* streams[2] = {fake_cuda_stream_create(0), fake_cuda_stream_create(1)};
  const CUcontext ctxs[2] = {primary(0), primary(1)};  // here: Catch's assertions are not thread-safe
  std::atomic<int> failures{0};
  std::vector<std::string> first_error(2);
  std::vector<std::thread> threads;
  for (int dev = 0; dev < 2; ++dev)
    threads.emplace_back([&, dev] {
      // Each thread makes the other device's context current, so the stream alone says where.
      cuCtxSetCurrent(ctxs[1 - dev]);
      const Calls calls(dev, streams[dev]);
      for (int i = 0; i < 2000; ++i) {
        const fly_status st = calls.family(i);
        if (st != FLY_SUCCESS && failures++ == 0) first_error[size_t(dev)] = status_text(st);
        if (i % 500 == 499 && current_ctx() != ctxs[1 - dev]) failures++;
      }
    });
  for (auto& t : threads) t.join();
  INFO(first_error[0] << " | " << first_error[1]);
  CHECK(failures == 0);
  // Every launch ran on its stream's device, from a module of that device.
  const int n = fake_cuda_launch_count();
  CHECK(n >= 4000);
  int on[2] = {0, 0};
  for (int i = 0; i < n; ++i) {
    const fake_cuda_launch* L = fake_cuda_get_launch(i);
    const int dev = L->stream == streams[0] ? 0 : L->stream == streams[1] ? 1 : -1;
    REQUIRE(dev >= 0);
    CHECK(L->device == dev);
    CHECK(fake_cuda_module_device(L->module) == dev);
    ++on[dev];
  }
  CHECK(on[0] == on[1]);
  fake_cuda_clear_records();
}

TEST_CASE("first use racing from 16 threads over both devices loads each module once per device", "[multi]") {
  // A GEMM tile no earlier test loaded: not the one the database picks for Calls::gemm's shape
  // (the forced variant is per thread).
  void* streams[2] = {fake_cuda_stream_create(0), fake_cuda_stream_create(1)};
  REQUIRE(Calls(0, streams[0]).gemm() == FLY_SUCCESS);
  const std::string picked = fly_last_variant();
  std::string fresh;
  for (const char* name : {"gemm_bf16_bn128_st5_sw0_mc1_e1", "gemm_bf16_bn256_st4_sw0_mc1"})
    if (fresh.empty() && picked != name && fly_variant_info(name, nullptr, nullptr) == FLY_SUCCESS) fresh = name;
  REQUIRE_FALSE(fresh.empty());
  const int before = fake_cuda_module_count();
  std::atomic<int> go{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t)
    threads.emplace_back([&, t] {
      const int dev = t % 2;
      const Calls calls(dev, streams[dev]);
      if (fly_force_variant(fresh.c_str()) != FLY_SUCCESS) failures++;
      go++;
      while (go.load() < 16) std::this_thread::yield();
      for (int i = 0; i < 50; ++i)
        if (calls.gemm() != FLY_SUCCESS) failures++;
      fly_force_variant(nullptr);
    });
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  // Exactly one new module per device (the variant's), however the threads raced.
  const int after = fake_cuda_module_count();
  CHECK(after - before == 2);
  std::set<int> devices;
  for (int m = before; m < after; ++m) devices.insert(fake_cuda_module_device(m));
  CHECK(devices == std::set<int>{0, 1});
}
