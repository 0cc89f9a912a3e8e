// Standalone device harness for the sm_90a GEMM (dev only, not part of the build): loads the
// variant cubins from kernels/gemm/dev/bin, checks them against a naive fp32 GPU reference over
// layouts/edge sizes, and times the gemm_bf16 suite. nvcc -O2 -std=c++17 -I kernels -I include
// kernels/gemm/dev/harness.cu -lcuda -o /tmp/h && /tmp/h kernels/gemm/dev/bin
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "gemm/gemm_plan.h"

using namespace fly::gemm;

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
#define CU(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { const char* s; cuGetErrorName(e, &s); printf("CU %s at %d: %s\n", #x, __LINE__, s); exit(1);} } while (0)

template <class T> __device__ float tof(T v);
template <> __device__ float tof(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ float tof(__half v) { return __half2float(v); }

template <class T>
__global__ void ref_gemm(const T* a, int64_t ars, int64_t acs, const T* b, int64_t brs, int64_t bcs,
                         const T* bias, float* c, int M, int N, int K) {
  int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= N) return;
  float s = 0;
  for (int k = 0; k < K; ++k) s += tof(a[m * ars + k * acs]) * tof(b[k * brs + n * bcs]);
  if (bias) s += tof(bias[n]);
  c[(int64_t)m * N + n] = s;
}
template <class T>
__global__ void init_rand(T* p, size_t n, uint32_t seed) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t x = (uint32_t)i * 2654435761u ^ seed;
  x ^= x >> 13; x *= 0x5bd1e995; x ^= x >> 15;
  p[i] = T((float)((int)(x % 2001) - 1000) / 1000.f);
}
template <class T>
__global__ void cmp(const T* c, int64_t ldc, const float* ref, int M, int N, float* maxerr, int* bad) {
  int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= N) return;
  float v = tof(c[(int64_t)m * ldc + n]), r = ref[(int64_t)m * N + n];
  float e = fabsf(v - r), tol = 2e-2f * (fabsf(r) + 1.f);
  if (!(e <= tol)) atomicAdd(bad, 1);
  if (e == e) atomicMax((int*)maxerr, __float_as_int(e));
  else atomicMax((int*)maxerr, 0x7f000000);
}

struct Var { std::string name; int bn, stages; bool swap; bool bf16; int mc; CUfunction f; };
static int g_sms;
static bool g_readflush = false;
__global__ void read_flush(const int4* p, size_t n, int* out) {
  int4 acc = make_int4(0, 0, 0, 0);
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    int4 v = p[i]; acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678) *out = 1;
}

static CUresult launch(const Var& v, const Launch& L, CUstream st) {
  CUlaunchConfig cfg = {};
  cfg.gridDimX = L.grid; cfg.gridDimY = 1; cfg.gridDimZ = 1;
  cfg.blockDimX = kThreads; cfg.blockDimY = 1; cfg.blockDimZ = 1;
  cfg.sharedMemBytes = L.smem;
  cfg.hStream = st;
  CUlaunchAttribute at[1];
  at[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  at[0].value.clusterDim.x = L.cluster; at[0].value.clusterDim.y = 1; at[0].value.clusterDim.z = 1;
  cfg.attrs = at; cfg.numAttrs = 1;
  void* args[] = {(void*)&L.params};
  return cuLaunchKernelEx(&cfg, v.f, args, nullptr);
}

struct Case { int M, N, K; char la, lb; int pad; bool bias; int force_split; };

// la: 'n' = A row-major, 't' = A col-major; lb: 'n' = B row-major [K,N], 't' = B col-major.
template <class T>
static bool run_case(const Var& v, const Case& cs, bool verbose) {
  const int M = cs.M, N = cs.N, K = cs.K;
  auto r8 = [](int64_t x) { return (x + 7) / 8 * 8; };
  int64_t lda = r8(cs.la == 'n' ? K : M) + cs.pad, ldb = r8(cs.lb == 'n' ? N : K) + cs.pad, ldc = N + cs.pad;
  size_t asz = (size_t)lda * (cs.la == 'n' ? M : K), bsz = (size_t)ldb * (cs.lb == 'n' ? K : N);
  T *a, *b, *c, *bias = nullptr; float* ref; float* dmax; int* dbad;
  CK(cudaMalloc(&a, asz * 2)); CK(cudaMalloc(&b, bsz * 2)); CK(cudaMalloc(&c, (size_t)M * ldc * 2));
  CK(cudaMalloc(&ref, (size_t)M * N * 4)); CK(cudaMalloc(&dmax, 4)); CK(cudaMalloc(&dbad, 4));
  init_rand<<<(asz + 255) / 256, 256>>>(a, asz, 1234); init_rand<<<(bsz + 255) / 256, 256>>>(b, bsz, 777);
  if (cs.bias) { CK(cudaMalloc(&bias, N * 2)); init_rand<<<(N + 255) / 256, 256>>>(bias, N, 99); }
  CK(cudaMemset(c, 0xFF, (size_t)M * ldc * 2)); CK(cudaMemset(dmax, 0, 4)); CK(cudaMemset(dbad, 0, 4));
  int64_t ars = cs.la == 'n' ? lda : 1, acs = cs.la == 'n' ? 1 : lda;
  int64_t brs = cs.lb == 'n' ? ldb : 1, bcs = cs.lb == 'n' ? 1 : ldb;
  ref_gemm<T><<<dim3((N + 127) / 128, M), 128>>>(a, ars, acs, b, brs, bcs, bias, ref, M, N, K);
  Problem pr;
  pr.M = M; pr.N = N; pr.K = K;
  pr.a = {a, M, lda, cs.la == 'n'};
  pr.bt = {b, N, ldb, cs.lb == 't'};
  pr.c = c; pr.ldc = ldc; pr.bias = bias; pr.bf16 = v.bf16;
  Launch L;
  CU(plan_gemm(pr, {v.bn, v.stages, v.swap, v.mc}, g_sms, cuTensorMapEncodeTiled, &L, cs.force_split));
  CUresult r = launch(v, L, 0);
  CK(cudaDeviceSynchronize());
  bool ok = r == CUDA_SUCCESS;
  float mx = 0; int bad = 0;
  if (ok) {
    cmp<T><<<dim3((N + 127) / 128, M), 128>>>(c, ldc, ref, M, N, dmax, dbad);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(&mx, dmax, 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(&bad, dbad, 4, cudaMemcpyDeviceToHost));
    ok = bad == 0;
  }
  if (!ok || verbose)
    printf("%s %-28s M=%d N=%d K=%d %c%c pad=%d bias=%d split=%d grid=%u: %s maxerr=%g bad=%d\n",
           ok ? "ok  " : "FAIL", v.name.c_str(), M, N, K, cs.la, cs.lb, cs.pad, cs.bias, L.params.split,
           L.grid, r == CUDA_SUCCESS ? "" : "launch error", mx, bad);
  cudaFree(a); cudaFree(b); cudaFree(c); cudaFree(ref); cudaFree(dmax); cudaFree(dbad); if (bias) cudaFree(bias);
  return ok;
}

static double time_case(const Var& v, int M, int N, int K, char la, char lb, int force_split, void* flush,
                        int* split_out) {
  int64_t lda = la == 'n' ? K : M, ldb = lb == 'n' ? N : K;
  __nv_bfloat16 *a, *b, *c;
  CK(cudaMalloc(&a, (size_t)M * K * 2)); CK(cudaMalloc(&b, (size_t)K * N * 2)); CK(cudaMalloc(&c, (size_t)M * N * 2));
  init_rand<<<((size_t)M * K + 255) / 256, 256>>>(a, (size_t)M * K, 1);
  init_rand<<<((size_t)N * K + 255) / 256, 256>>>(b, (size_t)N * K, 2);
  Problem pr;
  pr.M = M; pr.N = N; pr.K = K;
  pr.a = {a, M, lda, la == 'n'}; pr.bt = {b, N, ldb, lb == 't'};
  pr.c = c; pr.ldc = N; pr.bias = nullptr; pr.bf16 = true;
  Launch L;
  CU(plan_gemm(pr, {v.bn, v.stages, v.swap, v.mc}, g_sms, cuTensorMapEncodeTiled, &L, force_split));
  *split_out = L.params.split;
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> ts;
  for (int i = 0; i < 3; ++i) CU(launch(v, L, 0));
  int reps = (double)M * N * K > 1e11 ? 10 : 30;
  for (int i = 0; i < reps; ++i) {
    if (g_readflush) read_flush<<<528, 512>>>((const int4*)flush, (256 << 20) / 16, (int*)flush);
    else CK(cudaMemsetAsync(flush, i, 256 << 20));
    cudaEventRecord(e0); CU(launch(v, L, 0)); cudaEventRecord(e1);
    CK(cudaEventSynchronize(e1));
    float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms * 1000);
  }
  std::sort(ts.begin(), ts.end());
  cudaFree(a); cudaFree(b); cudaFree(c);
  return ts[ts.size() / 2];
}

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "kernels/gemm/dev/bin";
  std::string mode = argc > 2 ? argv[2] : "all";
  CU(cuInit(0)); CK(cudaFree(0));
  CUcontext ctx; CU(cuCtxGetCurrent(&ctx));
  CUdevice dev; CU(cuCtxGetDevice(&dev));
  CU(cuDeviceGetAttribute(&g_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  std::vector<Var> vars = {
      {"gemm_bf16_bn256_st4_sw0_mc1", 256, 4, false, true, 1},
      {"gemm_bf16_bn256_st4_sw0_mc2", 256, 4, false, true, 2},
      {"gemm_bf16_bn128_st6_sw0_mc1", 128, 6, false, true, 1},
      {"gemm_bf16_bn128_st6_sw0_mc2", 128, 6, false, true, 2},
      {"gemm_bf16_bn64_st8_sw1_mc1", 64, 8, true, true, 1},
      {"gemm_bf16_bn128_st6_sw1_mc2", 128, 6, true, true, 2},
      {"gemm_fp16_bn256_st4_sw0_mc2", 256, 4, false, false, 2},
  };
  std::map<std::string, Var*> by;
  for (auto& v : vars) {
    CUmodule mod;
    std::string path = dir + "/" + v.name + ".cubin";
    CUresult r = cuModuleLoad(&mod, path.c_str());
    if (r != CUDA_SUCCESS) { printf("cannot load %s\n", path.c_str()); v.f = nullptr; continue; }
    CU(cuModuleGetFunction(&v.f, mod, "fly_gemm_sm90"));
    CU(cuFuncSetAttribute(v.f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes(v.bn, v.stages)));
    by[v.name] = &v;
  }
  int fails = 0, total = 0;
  if (mode == "all" || mode == "occ") {
    for (auto& v : vars) {
      if (!v.f) continue;
      printf("OCC %s:", v.name.c_str());
      for (int cl = 1; cl <= 8; ++cl) {
        CUlaunchConfig cfg = {};
        cfg.gridDimX = cl * 64; cfg.gridDimY = 1; cfg.gridDimZ = 1; cfg.blockDimX = kThreads; cfg.blockDimY = 1; cfg.blockDimZ = 1;
        cfg.sharedMemBytes = smem_bytes(v.bn, v.stages);
        CUlaunchAttribute at[1]; at[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        at[0].value.clusterDim.x = cl; at[0].value.clusterDim.y = 1; at[0].value.clusterDim.z = 1;
        cfg.attrs = at; cfg.numAttrs = 1;
        int n = -1; CUresult r = cuOccupancyMaxActiveClusters(&n, v.f, &cfg);
        printf(" c%d=%d%s", cl, n, r == CUDA_SUCCESS ? "" : "(err)");
      }
      printf("\n");
    }
  }
  if (mode == "all" || mode == "check") {
    std::vector<Case> cases;
    const char* lays[4] = {"nt", "nn", "tn", "tt"};
    for (auto l : lays) {
      cases.push_back({256, 512, 256, l[0], l[1], 0, false, 0});
      cases.push_back({1000, 777, 300, l[0], l[1], 8, true, 0});
      cases.push_back({7, 129, 1000, l[0], l[1], 0, true, 0});
      cases.push_back({129, 17, 65, l[0], l[1], 0, false, 0});
      cases.push_back({1, 1, 1, l[0], l[1], 0, true, 0});
      cases.push_back({64, 1024, 2048, l[0], l[1], 0, true, 0});   // split path
      cases.push_back({300, 600, 2000, l[0], l[1], 0, true, 3});  // forced split, ragged
    }
    for (auto& v : vars) {
      if (!v.f) continue;
      for (auto& cs : cases) {
        ++total;
        bool ok = v.bf16 ? run_case<__nv_bfloat16>(v, cs, false) : run_case<__half>(v, cs, false);
        fails += !ok;
      }
    }
    printf("CHECK: %d/%d passed\n", total - fails, total);
  }
  if (mode == "mc") {
    void* flush; CK(cudaMalloc(&flush, 256 << 20));
    int shapes[3][3] = {{8192, 8192, 8192}, {4096, 4096, 4096}, {2048, 14336, 4096}};
    for (auto& s : shapes)
      for (auto nm : {"gemm_bf16_bn256_st4_sw0_mc1", "gemm_bf16_bn256_st4_sw0_mc2", "gemm_bf16_bn128_st6_sw0_mc1", "gemm_bf16_bn128_st6_sw0_mc2"}) {
        int sp; double us = time_case(*by[nm], s[0], s[1], s[2], 'n', 't', 0, flush, &sp);
        printf("MC %s M=%d N=%d K=%d %.1fus %.0fTF\n", nm, s[0], s[1], s[2], us, 2.0 * s[0] * s[1] * s[2] / us * 1e-6);
      }
  }
  if (mode == "all" || mode == "perf" || mode == "split") {
    void* flush; CK(cudaMalloc(&flush, 256 << 20));
    int suite[15][3] = {{64,4096,4096},{128,6144,4096},{128,14336,4096},{128,4096,14336},{256,28672,8192},{512,4096,4096},{1024,8192,8192},{2048,6144,4096},{2048,14336,4096},{2048,4096,14336},{4096,4096,4096},{4096,28672,8192},{8192,8192,8192},{8192,14336,4096},{16384,4096,4096}};
    for (auto& s : suite) {
      if (mode == "split") break;
      int M = s[0], N = s[1], K = s[2];
      printf("PERF M=%d N=%d K=%d:", M, N, K);
      for (auto& v : vars) {
        if (!v.f || !v.bf16) continue;
        if (v.swap && M > 256) continue;
        int sp; double us = time_case(v, M, N, K, 'n', 't', 0, flush, &sp);
        printf("  %s(s%d) %.1fus %.0fTF", v.name.c_str() + 10, sp, us, 2.0 * M * N * K / us * 1e-6);
      }
      printf("\n");
    }
    int dec[4][3] = {{64,4096,4096},{128,6144,4096},{128,4096,14336},{16,4096,4096}};
    for (auto& s : dec) {
      printf("SPLIT M=%d N=%d K=%d:", s[0], s[1], s[2]);
      for (auto nm : {"gemm_bf16_bn64_st8_sw1_mc1"}) {
        if (s[0] > 64 && std::string(nm).find("bn64") != std::string::npos) continue;
        for (int fs = 1; fs <= 6; ++fs) {
          int sp; double us = time_case(*by[nm], s[0], s[1], s[2], 'n', 't', fs, flush, &sp);
          printf(" %s/s%d %.1f", nm + 10, sp, us);
        }
      }
      printf("\n");
    }
    g_readflush = true;
    for (auto& s : dec) {
      int sp; double us = time_case(*by["gemm_bf16_bn64_st8_sw1_mc1"], s[0], s[1], s[2], 'n', 't', 0, flush, &sp);
      printf("READFLUSH M=%d N=%d K=%d split=%d %.1fus floor %.1fus\n", s[0], s[1], s[2], sp, us, (double)s[1] * s[2] * 2 / 4.3e6 * 2);
    }
    g_readflush = false;
    for (auto l : {"nn", "tn", "tt"}) {
      if (mode == "split") break;
      int sp;
      double us1 = time_case(*by["gemm_bf16_bn256_st4_sw0_mc2"], 8192, 8192, 8192, l[0], l[1], 0, flush, &sp);
      double us2 = time_case(*by["gemm_bf16_bn64_st8_sw1_mc1"], 64, 4096, 4096, l[0], l[1], 0, flush, &sp);
      printf("PERF %s 8192^3 %.1fus  64x4096x4096 swap %.1fus\n", l, us1, us2);
    }
  }
  return fails ? 1 : 0;
}
