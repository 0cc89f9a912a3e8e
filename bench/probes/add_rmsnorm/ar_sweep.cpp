// SPDX-License-Identifier: Apache-2.0
// fly_add_rms_norm_fwd / _bwd per bundled variant (fly_force_variant) and under the default
// dispatch, on the rows of the models bench/add_rmsnorm_torch.py measures: median of 20 calls
// (CUDA events, L2 flushed before each), with the minimal traffic over the time against the
// card's HBM peak (memory clock x bus width) and a device-to-device copy of the same bytes in the
// same run. One JSON line per (shape, variant) on stdout. Build against a library built with
// -DFLY_ALL_VARIANTS=ON (and FLY_FAMILIES=add_rmsnorm) to see every variant:
//   g++ -O2 -std=c++17 ar_sweep.cpp -I<repo>/include -I/usr/local/cuda/include \
//       -L<build> -lflykernels -L/usr/local/cuda/lib64 -lcudart -o ar_sweep && ./ar_sweep [bf16|fp16|fp32]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flykernels/flykernels.hpp"

#define CK(x)                                                                                          \
  do {                                                                                                 \
    cudaError_t e_ = (x);                                                                              \
    if (e_ != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } \
  } while (0)

using flykernels::tensor;  // contiguous [rows, cols] / [n] descriptors

static void* g_flush;
static const size_t kFlush = size_t(256) << 20;

// Median microseconds of 20 calls of f, each after an L2 flush; -1 when f fails.
template <class F>
static double time_us(F f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  if (!f()) return -1;
  CK(cudaDeviceSynchronize());
  std::vector<float> ts;
  for (int i = 0; i < 20; ++i) {
    CK(cudaMemsetAsync(g_flush, i, kFlush));
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1e3f);
  }
  std::sort(ts.begin(), ts.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ts[ts.size() / 2];
}

int main(int argc, char** argv) {
  const char* dts = argc > 1 ? argv[1] : "bf16";
  const fly_dtype dt = !std::strcmp(dts, "fp32") ? FLY_F32 : !std::strcmp(dts, "fp16") ? FLY_F16 : FLY_BF16;
  const int64_t es = dt == FLY_F32 ? 4 : 2;
  struct Shape { const char* name; int64_t M, N; };
  const Shape shapes[] = {{"llama8b 4096", 4096, 4096}, {"qwen3moe 8192", 8192, 2048},
                          {"llama70b 4096", 4096, 8192}, {"llama8b 16384", 16384, 4096},
                          {"decode 32", 32, 4096}};
  int dev = 0;
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  int clk_khz = 0, bus = 0;
  CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, dev));
  CK(cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev));
  const double peak = 2.0 * clk_khz * 1e3 * (bus / 8) / 1e9;  // GB/s
  const size_t maxe = size_t(16384) * 8192;
  void *x, *r, *y, *h, *w, *dw, *rstd, *dy, *dh, *ws, *cp;
  for (void** p : {&x, &r, &y, &h, &dy, &dh}) CK(cudaMalloc(p, maxe * es));
  CK(cudaMalloc(&w, 8192 * es));
  CK(cudaMalloc(&dw, 8192 * es));
  CK(cudaMalloc(&rstd, 16384 * 4));
  CK(cudaMalloc(&ws, size_t(512) * 8192 * 4 + 4096));
  CK(cudaMalloc(&cp, maxe * es * 2));
  CK(cudaMalloc(&g_flush, kFlush));
  // Small finite values everywhere (bytes 0x3c: ~0.0115 in BF16, ~1.06 in FP16, ~0.0115 in FP32).
  for (void* p : {x, r, y, h, dy, dh}) CK(cudaMemset(p, 0x3c, maxe * es));
  CK(cudaMemset(w, 0x3c, 8192 * es));
  std::printf("{\"device\": \"%s\", \"hbm_peak_gbs\": %.0f}\n", prop.name, peak);

  std::vector<std::string> fwd, bwd;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const char* n = fly_variant_name(i);
    const char *fam = nullptr, *params = nullptr;
    if (fly_variant_info(n, &fam, &params) != FLY_SUCCESS || std::strcmp(fam, "add_rmsnorm") != 0) continue;
    const std::string ps = params;
    if (ps.find(std::string("dtype=") + dts) == std::string::npos) continue;
    (ps.find("dir=fwd") != std::string::npos ? fwd : bwd).push_back(n);
  }
  fwd.insert(fwd.begin(), "");  // "": the default dispatch
  bwd.insert(bwd.begin(), "");
  for (const Shape& s : shapes) {
    const fly_tensor X = tensor(x, dt, {s.M, s.N}), R = tensor(r, dt, {s.M, s.N}), Y = tensor(y, dt, {s.M, s.N}),
                     H = tensor(h, dt, {s.M, s.N}), DY = tensor(dy, dt, {s.M, s.N}), DH = tensor(dh, dt, {s.M, s.N}),
                     W = tensor(w, dt, {s.N}), DW = tensor(dw, dt, {s.N}), RS = tensor(rstd, FLY_F32, {s.M});
    const double eb = double(s.M) * s.N * es;
    const double fwd_bytes = 4 * eb + s.N * es + s.M * 4;  // x, r read; y, h written; w; rstd
    const double bwd_bytes = 4 * eb + 2 * s.N * es + s.M * 4;  // dy, dh, h read; dx written; w, dw; rstd
    // A copy of the same bytes: half read, half written.
    const size_t cbytes = size_t(fwd_bytes / 2);
    const double copy_us = time_us([&] { return cudaMemcpyAsync(cp, static_cast<char*>(cp) + cbytes, cbytes, cudaMemcpyDeviceToDevice) == cudaSuccess; });
    size_t wsb = 0;
    fly_add_rms_norm_bwd_workspace_size(&H, &W, &wsb);
    for (int dir = 0; dir < 2; ++dir) {
      for (const std::string& v : dir ? bwd : fwd) {
        if (fly_force_variant(v.empty() ? nullptr : v.c_str()) != FLY_SUCCESS) continue;
        const double us = time_us([&] {
          const fly_status st = dir ? fly_add_rms_norm_bwd(&DY, &DH, &H, &W, &RS, &X, &DW, ws, wsb, nullptr)
                                    : fly_add_rms_norm_fwd(&X, &R, &W, 1e-6, &Y, &H, &RS, nullptr);
          return st == FLY_SUCCESS;
        });
        const std::string ran = fly_last_variant() ? fly_last_variant() : "";
        fly_force_variant(nullptr);
        if (us < 0) continue;
        const double bytes = dir ? bwd_bytes : fwd_bytes;
        std::printf("{\"case\": \"%s\", \"dir\": \"%s\", \"M\": %lld, \"N\": %lld, \"variant\": \"%s\", \"us\": %.2f, "
                    "\"gbs\": %.0f, \"hbm_fraction\": %.3f, \"of_copy\": %.3f}\n",
                    s.name, dir ? "bwd" : "fwd", (long long)s.M, (long long)s.N, v.empty() ? ("default:" + ran).c_str() : v.c_str(),
                    us, bytes / us / 1e3, bytes / us / 1e3 / peak, copy_us / us);
      }
    }
    std::printf("{\"case\": \"%s\", \"copy_us\": %.2f, \"copy_gbs\": %.0f, \"copy_fraction\": %.3f}\n", s.name, copy_us,
                fwd_bytes / copy_us / 1e3, fwd_bytes / copy_us / 1e3 / peak);
  }
  return 0;
}
