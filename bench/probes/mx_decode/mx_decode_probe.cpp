// SPDX-License-Identifier: Apache-2.0
// Probe: how close does the weight-only MX decode GEMM (fly_scaled_gemm with BF16/FP16
// activations, scale_a = NULL; kernels/mx/mx_decode.cu) come to the HBM byte floor, and how does
// it compare with cuBLAS BF16 (cublasGemmEx) on the same, dequantized weights in the same run?
//
// Per shape (N x K, Llama-8B/70B projections by default) and M: MXFP8 and MXFP4 weights (random
// codes, scales 2^-8..2^0), activations uniform in [-1, 1]; each rep flushes the L2 with a memset
// of a 256 MiB buffer (not timed), then times one call with CUDA events; the three methods are
// interleaved rep by rep; median over reps after warm-up. Bytes = packed W + scales + A + C (cuBLAS:
// BF16 W + A + C). Reports us, GB/s, the fraction of the HBM peak (from the device's memory clock
// and bus width, or --peak-gbs) and of a measured device-to-device copy, the speedup over cuBLAS,
// and the max relative difference to cuBLAS's result (a sanity check, not the test: the GPU tests
// [mx_decode] are).
//
// Build (from the repository root, after building the library in build/):
//   ninja -C build fly_mx_decode_probe        (CMake target, EXCLUDE_FROM_ALL)
// Run:
//   build/bench/fly_mx_decode_probe [--m 1,4,16,32,64] [--shapes 14336x4096,4096x14336,...]
//        [--act bf16|fp16] [--fmt e4m3,e2m1] [--reps 30] [--warmup 5] [--variant NAME]
//        [--peak-gbs X] [--no-cublas] [--tsv out.tsv]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flykernels/flykernels.hpp"

namespace {

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));  \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

struct Shape {
  int64_t N, K;
};

std::vector<std::string> split(const std::string& s, char d) {
  std::vector<std::string> r;
  size_t p = 0;
  while (p <= s.size()) {
    const size_t q = s.find(d, p);
    r.push_back(s.substr(p, q == std::string::npos ? std::string::npos : q - p));
    if (q == std::string::npos) break;
    p = q + 1;
  }
  return r;
}


uint64_t g_rng = 0x9E3779B97F4A7C15ull;
uint32_t rnd() {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return uint32_t(g_rng >> 16);
}

float e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  const float mag = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}
float e2m1_value(uint8_t n) {
  const int e = (n >> 1) & 3, m = n & 1;
  const float mag = e == 0 ? 0.5f * m : std::ldexp(1.0f + 0.5f * m, e - 1);
  return (n & 0x8) ? -mag : mag;
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ms = {1, 4, 16, 32, 64};
  std::vector<Shape> shapes = {{14336, 4096}, {4096, 14336}, {6144, 4096}, {28672, 8192}, {4096, 4096}, {8192, 28672}};
  std::vector<std::string> fmts = {"e4m3", "e2m1"};
  std::string act = "bf16", variant, tsv;
  int reps = 30, warmup = 5;
  double peak_gbs = 0;
  bool cublas = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--m") {
      ms.clear();
      for (auto& s : split(next(), ',')) ms.push_back(std::stoll(s));
    } else if (a == "--shapes") {
      shapes.clear();
      for (auto& s : split(next(), ',')) {
        const auto nk = split(s, 'x');
        shapes.push_back({std::stoll(nk.at(0)), std::stoll(nk.at(1))});
      }
    } else if (a == "--fmt") {
      fmts = split(next(), ',');
    } else if (a == "--act") {
      act = next();
    } else if (a == "--reps") {
      reps = std::stoi(next());
    } else if (a == "--warmup") {
      warmup = std::stoi(next());
    } else if (a == "--variant") {
      variant = next();
    } else if (a == "--peak-gbs") {
      peak_gbs = std::stod(next());
    } else if (a == "--no-cublas") {
      cublas = false;
    } else if (a == "--tsv") {
      tsv = next();
    } else {
      std::fprintf(stderr, "usage: %s [--m 1,4,16] [--shapes NxK,...] [--act bf16|fp16] [--fmt e4m3,e2m1] [--reps R] "
                   "[--warmup W] [--variant NAME] [--peak-gbs X] [--no-cublas] [--tsv FILE]\n", argv[0]);
      return 2;
    }
  }
  const fly_dtype adt = act == "fp16" ? FLY_F16 : FLY_BF16;
  const cudaDataType_t cdt = act == "fp16" ? CUDA_R_16F : CUDA_R_16BF;

  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  if (peak_gbs <= 0) {
    int clk_khz = 0, bus_bits = 0;
    cudaDeviceGetAttribute(&clk_khz, cudaDevAttrMemoryClockRate, 0);
    cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0);
    peak_gbs = 2.0 * clk_khz * 1e3 * (bus_bits / 8) / 1e9;
    if (peak_gbs <= 0) peak_gbs = std::strstr(prop.name, "H200") ? 4800 : 3350;
  }
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  const size_t flush_bytes = size_t(256) << 20;
  void* flush = nullptr;
  CK(cudaMalloc(&flush, flush_bytes));
  Timer tm;
  auto flush_l2 = [&] { CK(cudaMemsetAsync(flush, rnd() & 0xFF, flush_bytes, st)); };

  // measured copy bandwidth (device to device, 1 GiB read + 1 GiB written)
  double copy_gbs = 0;
  {
    const size_t cb = size_t(1) << 30;
    void *s0 = nullptr, *s1 = nullptr;
    CK(cudaMalloc(&s0, cb));
    CK(cudaMalloc(&s1, cb));
    std::vector<double> t;
    for (int r = 0; r < 7; ++r) {
      CK(cudaEventRecord(tm.a, st));
      CK(cudaMemcpyAsync(s1, s0, cb, cudaMemcpyDeviceToDevice, st));
      CK(cudaEventRecord(tm.b, st));
      CK(cudaEventSynchronize(tm.b));
      float ms_ = 0;
      CK(cudaEventElapsedTime(&ms_, tm.a, tm.b));
      if (r > 1) t.push_back(ms_ * 1e-3);
    }
    copy_gbs = 2.0 * double(cb) / median(t) / 1e9;
    cudaFree(s0);
    cudaFree(s1);
  }
  std::printf("# %s, %d SMs, HBM peak %.0f GB/s, D2D copy %.0f GB/s; act %s; reps %d (median), L2 flushed (256 MiB memset) before each\n",
              prop.name, prop.multiProcessorCount, peak_gbs, copy_gbs, act.c_str(), reps);
  if (!variant.empty()) {
    if (fly_force_variant(variant.c_str()) != FLY_SUCCESS) {
      std::fprintf(stderr, "--variant %s: %s\n", variant.c_str(), fly_get_last_error());
      return 2;
    }
    std::printf("# forced variant %s\n", variant.c_str());
  }
  std::printf("%-12s %4s %5s %10s %9s %7s %7s %11s %9s %8s %9s  %s\n", "NxK", "M", "fmt", "us", "GB/s", "%peak", "%copy",
              "cublas_us", "cb_%peak", "speedup", "max_rdiff", "variant");
  FILE* tf = tsv.empty() ? nullptr : std::fopen(tsv.c_str(), "w");
  if (tf)
    std::fprintf(tf, "N\tK\tM\tfmt\tus\tgbs\tpeak_frac\tcopy_frac\tcublas_us\tcublas_peak_frac\tspeedup\tmax_rdiff\tvariant\tgpu\n");

  cublasHandle_t h = nullptr;
  if (cublas) {
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "cublasCreate failed\n");
      return 1;
    }
    cublasSetStream(h, st);
  }
  const int64_t mmax = *std::max_element(ms.begin(), ms.end());
  for (const Shape& sh : shapes) {
    const int64_t N = sh.N, K = sh.K, kbs = K / 32;
    // activations [mmax, K], uniform in [-1, 1]
    std::vector<uint16_t> ha(size_t(mmax * K));
    for (auto& v : ha) {
      const float f = (rnd() % 20001) / 10000.0f - 1.0f;
      if (adt == FLY_BF16) {
        const __nv_bfloat16 b = __float2bfloat16_rn(f);
        std::memcpy(&v, &b, 2);
      } else {
        const __half b = __float2half_rn(f);
        std::memcpy(&v, &b, 2);
      }
    }
    void *da = nullptr, *dc = nullptr, *dcb = nullptr, *dwd = nullptr;
    CK(cudaMalloc(&da, ha.size() * 2));
    CK(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dc, size_t(mmax * N) * 2));
    CK(cudaMalloc(&dcb, size_t(mmax * N) * 2));
    if (cublas) CK(cudaMalloc(&dwd, size_t(N * K) * 2));
    for (const std::string& fmt : fmts) {
      const bool fp4 = fmt == "e2m1";
      const int64_t bcols = fp4 ? K / 2 : K;
      std::vector<uint8_t> hb(size_t(N * bcols)), hs(size_t(N * kbs));
      for (auto& v : hb) {
        v = uint8_t(rnd());
        if (!fp4 && (v & 0x7F) == 0x7F) v = uint8_t(v - 1);
      }
      for (auto& v : hs) v = uint8_t(119 + rnd() % 9);
      void *db = nullptr, *ds = nullptr;
      CK(cudaMalloc(&db, hb.size()));
      CK(cudaMalloc(&ds, hs.size()));
      CK(cudaMemcpy(db, hb.data(), hb.size(), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(ds, hs.data(), hs.size(), cudaMemcpyHostToDevice));
      if (cublas) {  // the same values, dequantized (exact in BF16; FP16 may round the smallest)
        std::vector<uint16_t> hw(size_t(N * K));
        float lut[256];
        for (int i = 0; i < 256; ++i) lut[i] = fp4 ? e2m1_value(uint8_t(i & 0xF)) : e4m3_value(uint8_t(i));
        float sc[256];
        for (int i = 0; i < 256; ++i) sc[i] = std::ldexp(1.0f, i - 127);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k) {
            const uint8_t code = fp4 ? uint8_t((hb[size_t(n * bcols + k / 2)] >> (4 * (k & 1))) & 0xF)
                                     : hb[size_t(n * bcols + k)];
            const float v = lut[code] * sc[hs[size_t(n * kbs + k / 32)]];
            uint16_t u;
            if (adt == FLY_BF16) {
              const __nv_bfloat16 b = __float2bfloat16_rn(v);
              std::memcpy(&u, &b, 2);
            } else {
              const __half b = __float2half_rn(v);
              std::memcpy(&u, &b, 2);
            }
            hw[size_t(n * K + k)] = u;
          }
        CK(cudaMemcpy(dwd, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
      }
      for (const int64_t M : ms) {
        const fly_tensor a = flykernels::tensor(da, adt, {M, K}), b = flykernels::tensor(db, fp4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3, {N, bcols}),
                         sb = flykernels::tensor(ds, FLY_E8M0, {N, kbs}), c = flykernels::tensor(dc, adt, {M, N});
        auto ours = [&]() -> bool {
          const fly_status s = fly_scaled_gemm(&a, nullptr, &b, &sb, nullptr, &c, nullptr, 0, st);
          if (s != FLY_SUCCESS) {
            std::fprintf(stderr, "N %lld K %lld M %lld %s: %s\n", (long long)N, (long long)K, (long long)M, fmt.c_str(),
                         fly_get_last_error());
            return false;
          }
          return true;
        };
        const float one = 1.f, zero = 0.f;
        auto theirs = [&] {
          const cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &one, dwd, cdt,
                                                int(K), da, cdt, int(K), &zero, dcb, cdt, int(N), CUBLAS_COMPUTE_32F,
                                                CUBLAS_GEMM_DEFAULT);
          if (s != CUBLAS_STATUS_SUCCESS) std::fprintf(stderr, "cublasGemmEx: %d\n", int(s));
        };
        if (!ours()) continue;
        const std::string vname = fly_last_variant() ? fly_last_variant() : "?";
        std::vector<double> t_ours, t_cb;
        for (int r = 0; r < warmup + reps; ++r) {
          for (int which = 0; which < (cublas ? 2 : 1); ++which) {
            const bool mine = !cublas || (which == 0) == (r % 2 == 0);  // alternate which goes first
            flush_l2();
            CK(cudaEventRecord(tm.a, st));
            if (mine) ours();
            else theirs();
            CK(cudaEventRecord(tm.b, st));
            CK(cudaEventSynchronize(tm.b));
            float ms_ = 0;
            CK(cudaEventElapsedTime(&ms_, tm.a, tm.b));
            if (r >= warmup) (mine ? t_ours : t_cb).push_back(ms_ * 1e3);
          }
        }
        CK(cudaStreamSynchronize(st));
        double rdiff = -1;
        if (cublas) {
          std::vector<uint16_t> x(size_t(M * N)), y(size_t(M * N));
          CK(cudaMemcpy(x.data(), dc, x.size() * 2, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(y.data(), dcb, y.size() * 2, cudaMemcpyDeviceToHost));
          double mx = 0, ref = 0;
          for (size_t i = 0; i < x.size(); ++i) {
            float fx, fy;
            if (adt == FLY_BF16) {
              __nv_bfloat16 bx, by;
              std::memcpy(&bx, &x[i], 2);
              std::memcpy(&by, &y[i], 2);
              fx = __bfloat162float(bx);
              fy = __bfloat162float(by);
            } else {
              __half bx, by;
              std::memcpy(&bx, &x[i], 2);
              std::memcpy(&by, &y[i], 2);
              fx = __half2float(bx);
              fy = __half2float(by);
            }
            mx = std::max(mx, double(std::fabs(fx - fy)));
            ref = std::max(ref, double(std::fabs(fy)));
            if (std::isnan(fx) != std::isnan(fy)) mx = INFINITY;
          }
          rdiff = ref > 0 ? mx / ref : mx;
        }
        const double us = median(t_ours), cus = cublas ? median(t_cb) : 0;
        const double bytes = double(N) * bcols + double(N) * kbs + double(M) * K * 2 + double(M) * N * 2;
        const double cbytes = double(N) * K * 2 + double(M) * K * 2 + double(M) * N * 2;
        const double gbs = bytes / (us * 1e-6) / 1e9;
        const double cb_frac = cublas ? cbytes / (cus * 1e-6) / 1e9 / peak_gbs : 0;
        char nk[32];
        std::snprintf(nk, sizeof(nk), "%lldx%lld", (long long)N, (long long)K);
        std::printf("%-12s %4lld %5s %10.2f %9.0f %6.1f%% %6.1f%% %11.2f %8.1f%% %7.2fx %9.2e  %s\n", nk, (long long)M,
                    fp4 ? "mxfp4" : "mxfp8", us, gbs, 100 * gbs / peak_gbs, 100 * gbs / copy_gbs, cus, 100 * cb_frac,
                    cublas ? cus / us : 0.0, rdiff, vname.c_str());
        std::fflush(stdout);
        if (tf)
          std::fprintf(tf, "%lld\t%lld\t%lld\t%s\t%.3f\t%.1f\t%.4f\t%.4f\t%.3f\t%.4f\t%.3f\t%.3e\t%s\t%s\n", (long long)N,
                       (long long)K, (long long)M, fp4 ? "mxfp4" : "mxfp8", us, gbs, gbs / peak_gbs, gbs / copy_gbs, cus,
                       cb_frac, cublas ? cus / us : 0.0, rdiff, vname.c_str(), prop.name);
      }
      cudaFree(db);
      cudaFree(ds);
    }
    cudaFree(da);
    cudaFree(dc);
    cudaFree(dcb);
    if (dwd) cudaFree(dwd);
  }
  if (tf) std::fclose(tf);
  if (h) cublasDestroy(h);
  fly_force_variant(nullptr);
  cudaFree(flush);
  return 0;
}
