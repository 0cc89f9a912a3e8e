// SPDX-License-Identifier: Apache-2.0
// Per-tile trace of the sm_90a GEMM (dev only, not part of the build): where does each tile's
// time go? Runs one variant compiled with -DFLY_GEMM_TRACE (its consumer warpgroups record, per
// tile, clock64 at the mainloop's start and end, after the epilogue, and the cycles spent in
// full-barrier waits: gemm_mainloop.cuh) on one NT bf16 shape, planned exactly as the library plans
// it (gemm_plan.h), and prints per-tile averages beside the tensor-core ideal of the mainloop.
// Any variant of the 128-row or narrow spaces: compile its generated unit (build/gen/, or
// flygen --all --match NAME) with the trace on, and name it on the command line.
//   nvcc -cubin -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr \
//     -I kernels -I include -DFLY_GEMM_TRACE -o /tmp/t.cubin build/gen/gemm_bf16_bn256_st4_sw0_mc2_e2.cu
//   nvcc -O2 -std=c++17 -I kernels -I include kernels/gemm/dev/trace.cu -lcuda -o /tmp/trace
//   /tmp/trace /tmp/t.cubin M N K gemm_bf16_bn256_st4_sw0_mc2_e2 [gm]
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gemm/dev/dev_timing.cuh"
#include "gemm/gemm_plan.h"

using namespace fly::gemm;

#define CU(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { const char* s; cuGetErrorName(e, &s); printf("CU %s: %s\n", #x, s); exit(1); } } while (0)

constexpr int kTiles = 32;  // gemm_mainloop.cuh kTraceTiles

__global__ void fill(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    p[i] = __float2bfloat16(float(h & 0xFFFF) / 32768.0f - 1.0f);
  }
}

// The tile of a canonical variant name (tuning/gemm.json): gemm_<dtype>[_bm<r>]_bn<n>_st<s>_sw<0|1>
// [_mc<c>][_mp<p>][_kb<k>][_kw<w>][_e<epi>][_pp<1>]; launch-axis suffixes (_sk, _g) are ignored.
bool parse_variant(const char* name, VariantShape* v) {
  if (std::strncmp(name, "gemm_bf16_", 10) != 0) return false;  // the trace fills bf16 operands
  *v = VariantShape{128, 4, false};
  std::string s(name + 10);
  size_t at = 0;
  bool bn_seen = false;
  while (at < s.size()) {
    size_t end = s.find('_', at);
    if (end == std::string::npos) end = s.size();
    const std::string tok = s.substr(at, end - at);
    auto num = [&](size_t skip) { return std::atoi(tok.c_str() + skip); };
    if (tok.rfind("bm", 0) == 0) v->bm = num(2);
    else if (tok.rfind("bn", 0) == 0) v->bn = num(2), bn_seen = true;
    else if (tok.rfind("st", 0) == 0) v->stages = num(2);
    else if (tok.rfind("sw", 0) == 0) v->swap = num(2) == 1;
    else if (tok.rfind("mc", 0) == 0) v->mc = num(2);
    else if (tok.rfind("mp", 0) == 0) v->mp = num(2);
    else if (tok.rfind("kb", 0) == 0) v->kb = num(2);
    else if (tok.rfind("kw", 0) == 0) v->kw = num(2);
    else if (tok.rfind("pp", 0) == 0) v->pp = num(2);
    else if (tok[0] == 'e') v->epi = num(1);
    else if (tok[0] == 'g') v->gm = num(1);
    else if (tok.rfind("sk", 0) != 0 && tok[0] != 'l' && tok[0] != 's') return false;
    at = end + 1;
  }
  return bn_seen && tile_legal(tile_shape(*v));
}

int main(int argc, char** argv) {
  if (argc < 6) { printf("usage: trace CUBIN M N K VARIANT_NAME [gm]  (a gemm_bf16_ variant)\n"); return 2; }
  const int64_t M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]);
  VariantShape v;
  if (!parse_variant(argv[5], &v)) { printf("trace: %s is not a gemm_bf16_ tile variant\n", argv[5]); return 2; }
  if (argc > 6) v.gm = atoi(argv[6]);
  CU(cuInit(0));
  CK(cudaFree(0));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  __nv_bfloat16 *a, *w, *c;
  CK(cudaMalloc(&a, M * K * 2)); CK(cudaMalloc(&w, N * K * 2)); CK(cudaMalloc(&c, M * N * 2));
  fill<<<1024, 256>>>(a, M * K, 1); fill<<<1024, 256>>>(w, N * K, 2);
  Problem pr{};
  pr.M = M; pr.N = N; pr.K = K;
  pr.a = {a, M, K, true};
  pr.bt = {w, N, K, true};  // NT: B^T = W [N, K], K-major
  pr.c = c; pr.ldc = N; pr.dtype = Dtype::kBf16;
  Launch L{};
  CU(plan_gemm(pr, v, sms, cuTensorMapEncodeTiled, &L));
  CUmodule mod; CUfunction f;
  CU(cuModuleLoad(&mod, argv[1]));
  CU(cuModuleGetFunction(&f, mod, "fly_gemm_sm90"));
  CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(L.smem)));
  CUdeviceptr trace; size_t trace_bytes;
  CU(cuModuleGetGlobal(&trace, &trace_bytes, mod, "fly_gemm_trace"));
  CUlaunchConfig cfg{};
  cfg.gridDimX = L.grid; cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = kThreads; cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = L.smem;
  CUlaunchAttribute at[1];
  at[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  at[0].value.clusterDim.x = L.cluster; at[0].value.clusterDim.y = 1; at[0].value.clusterDim.z = 1;
  cfg.attrs = at; cfg.numAttrs = 1;
  void* args[] = {(void*)&L.params};
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int i = 0; i < 40; ++i) {  // back to back: the clock settles as in sustained use
    CK(cudaEventRecord(e0)); CU(cuLaunchKernelEx(&cfg, f, args, nullptr)); CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms * 1000.f);
  }
  CU(cuMemsetD8(trace, 0, trace_bytes));
  CK(cudaEventRecord(e0)); CU(cuLaunchKernelEx(&cfg, f, args, nullptr)); CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float traced_ms; CK(cudaEventElapsedTime(&traced_ms, e0, e1));
  std::vector<unsigned long long> h(trace_bytes / 8);
  CU(cuMemcpyDtoH(h.data(), trace, trace_bytes));
  std::sort(ts.begin(), ts.end());

  // Per record: mainloop (t1 - t0), its full-barrier waits (t3), epilogue (t2 - t1), and the gap
  // from the previous tile's epilogue end to this mainloop's start; per warpgroup: the span.
  double ml = 0, wt = 0, ep = 0, gap = 0, span = 0;
  long n = 0, ngap = 0, nwg = 0;
  double ml_first = 0; long n_first = 0;
  for (int cta = 0; cta < 132; ++cta)
    for (int wg = 0; wg < 2; ++wg) {
      const unsigned long long* r = &h[size_t((cta * 2 + wg) * kTiles) * 4];
      int tiles = 0;
      for (int t = 0; t < kTiles && r[t * 4] != 0 && r[t * 4 + 2] != 0; ++t, ++tiles) {
        const unsigned long long* q = r + t * 4;
        ml += double(q[1] - q[0]); wt += double(q[3]); ep += double(q[2] - q[1]); ++n;
        if (t == 0) { ml_first += double(q[1] - q[0]); ++n_first; }
        if (t > 0) { gap += double(q[0] - r[(t - 1) * 4 + 2]); ++ngap; }
      }
      if (tiles > 0) { span += double(r[(tiles - 1) * 4 + 2] - r[0]); ++nwg; }
    }
  if (n == 0) { printf("no trace records (was the cubin built with -DFLY_GEMM_TRACE?)\n"); return 1; }
  const int64_t kb = (K + 63) / 64;
  // Cycles of one tile's (one consumer warpgroup's share of it) wgmma at 4096 flop/clk/SM.
  const double ideal = double(kb) * v.bm * v.bn * 64 * 2 / 4096.0;
  printf("%lldx%lldx%lld %s (gm %d): grid %u, cluster %u, strip_m %d; %.1f us median of 40 "
         "back-to-back (traced %.1f us)\n",
         (long long)M, (long long)N, (long long)K, argv[5], v.gm, L.grid, L.cluster, L.params.strip_m,
         ts[ts.size() / 2], traced_ms * 1000.0);
  printf("  per tile (%ld tiles traced, cycles): mainloop %.0f (ideal %.0f: %.1f%%; first tile %.0f), "
         "full-barrier waits %.0f, epilogue %.0f, gap to next mainloop %.0f\n",
         n, ml / n, ideal, 100.0 * ideal / (ml / n), ml_first / std::max(1L, n_first), wt / n, ep / n,
         ngap ? gap / ngap : 0.0);
  printf("  per warpgroup: span %.0f cycles over %.2f tiles; clock ~ %.0f MHz (span / traced time)\n",
         span / nwg, double(n) / nwg, span / nwg / (traced_ms * 1000.0));
  return 0;
}
