// SPDX-License-Identifier: Apache-2.0
// Decode-streaming probe (dev only, not part of the build): how fast can TMA stream a GEMM
// weight matrix the way the decode kernels read it, with no math at all? Each CTA owns R rows of
// W[N, K] (bf16, K-major, 128B-swizzled boxes {64 k, box rows}) and walks K in 64-wide blocks
// through a STAGES-deep mbarrier ring; one thread issues the loads, one warp waits for each
// stage and frees it. Optionally each stage also loads 32 or 64 activation rows, as the narrow
// tiles do, and optionally CTA pairs share each W tile by multicast (cuBLAS's layout). Beside it:
// a plain vectorised read of W and a cudaMemcpy, all timed after an L2 flush by a read. Tells whether the decode gap to cuBLAS (bench/RESULTS.md) is in how the
// weights are requested (box shape, L2 promotion, ring depth, CTA count) or in the GEMM kernel.
//   nvcc -O2 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I kernels -I include \
//     bench/probes/gemm/gemm_tma_stream.cu -lcuda -o /tmp/ts
//   /tmp/ts [N K]            (default 4096 4096; prints one line per configuration)
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/sm90.h"
#include "gemm/dev/dev_timing.cuh"

#define CU(x) do { CUresult e = (x); if (e != CUDA_SUCCESS) { const char* s; cuGetErrorName(e, &s); std::printf("CU %s at %d: %s\n", #x, __LINE__, s); std::exit(1);} } while (0)

struct StreamParams {
  CUtensorMap w;    // box {64, box_rows}
  CUtensorMap act;  // box {64, act_rows}
  int rows_per_cta, box_rows, act_rows, kblocks, stages;
  uint32_t stage_bytes;
  int pair;  // 1: clusters of 2 CTAs share the W tile, each loading half of it by multicast
  int act_pf;  // 1: at start, CTA i prefetches activation k blocks i, i + grid, ... into L2
  int kbox;     // > 1: 3-D maps (64, rows, k block); one box brings kbox k blocks (not with pair)
  CUtensorMap w3, act3;
  int stagger;  // 1: CTA i starts its K walk at k block i * kblocks / grid and wraps around
};


__device__ __forceinline__ void tma_prefetch_l2(const CUtensorMap* map, int x, int y) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(reinterpret_cast<uint64_t>(map)),
               "r"(x), "r"(y) : "memory");
}

__global__ void __launch_bounds__(128, 1) tma_stream(const __grid_constant__ StreamParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(base + size_t(p.stages) * p.stage_bytes);
  uint64_t* empty = full + p.stages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      fly::sm90::mbar_init(&full[s], 1);
      fly::sm90::mbar_init(&empty[s], p.pair ? 2 : 1);  // with pairs both consumers free each stage
    }
    fly::sm90::fence_barrier_init();
  }
  if (p.pair) fly::sm90::cluster_sync();
  else __syncthreads();
  const int rank = p.pair ? int(fly::sm90::cluster_ctarank()) : 0;
  const int row0 = (p.pair ? blockIdx.x / 2 : blockIdx.x) * p.rows_per_cta;
  if (threadIdx.x == 0) {  // producer
    if (p.act_pf && p.act_rows)
      for (int kb = blockIdx.x; kb < p.kblocks; kb += gridDim.x) tma_prefetch_l2(&p.act, kb * 64, 0);
    int stage = 0;
    uint32_t phase = 0;
    const int groups = p.kblocks / p.kbox;
    // Pairs share each W tile, so both CTAs of a cluster walk K in the same order.
    const unsigned unit = p.pair ? blockIdx.x / 2 : blockIdx.x, units = p.pair ? gridDim.x / 2 : gridDim.x;
    const int start = p.stagger ? int(unit * uint64_t(groups) / units) : 0;
    for (int g = 0; g < groups; ++g) {
      const int kb = ((g + start) % groups) * p.kbox;
      fly::sm90::mbar_wait(&empty[stage], phase ^ 1);
      uint8_t* dst = base + size_t(stage) * p.stage_bytes;
      fly::sm90::mbar_arrive_expect_tx(&full[stage], p.stage_bytes);
      if (p.kbox > 1) {
        fly::sm90::tma_load_3d(dst, &p.w3, &full[stage], 0, row0, kb);
        if (p.act_rows) fly::sm90::tma_load_3d(dst + p.kbox * p.rows_per_cta * 128, &p.act3, &full[stage], 0, 0, kb);
      } else if (p.pair) {  // this CTA's half of the W tile, into both CTAs
        const int half = p.rows_per_cta / 2;
        for (int r = rank * half; r < (rank + 1) * half; r += p.box_rows)
          fly::sm90::tma_load_2d_multicast(dst + r * 128, &p.w, &full[stage], kb * 64, row0 + r, 0x3);
      } else {
        for (int r = 0; r < p.rows_per_cta; r += p.box_rows)
          fly::sm90::tma_load_2d(dst + r * 128, &p.w, &full[stage], kb * 64, row0 + r);
      }
      if (p.kbox == 1 && p.act_rows) fly::sm90::tma_load_2d(dst + p.rows_per_cta * 128, &p.act, &full[stage], kb * 64, 0);
      if (++stage == p.stages) { stage = 0; phase ^= 1; }
    }
  } else if (threadIdx.x >= 32 && threadIdx.x < 64) {  // consumer warp: wait, then free
    int stage = 0;
    uint32_t phase = 0;
    for (int g = 0; g < p.kblocks / p.kbox; ++g) {
      fly::sm90::mbar_wait(&full[stage], phase);
      __syncwarp();
      if (threadIdx.x == 32) {
        if (p.pair) {
          fly::sm90::mbar_arrive_cluster(&empty[stage], 0);
          fly::sm90::mbar_arrive_cluster(&empty[stage], 1);
        } else {
          fly::sm90::mbar_arrive(&empty[stage]);
        }
      }
      if (++stage == p.stages) { stage = 0; phase ^= 1; }
    }
  }
  // Pairs: nobody leaves while the peer may still signal its barriers or write its ring.
  __syncwarp();
  if (p.pair) fly::sm90::cluster_sync();
}

// 3-D view of a K-major [rows, k] matrix: (64 elements, rows, k block), k block stride 128 bytes.
static void encode3(CUtensorMap* m, void* base, int64_t rows, int64_t k, int box_rows, int kbox, CUtensorMapL2promotion l2) {
  cuuint64_t dims[3] = {64, cuuint64_t(rows), cuuint64_t(k / 64)};
  cuuint64_t strides[2] = {cuuint64_t(k * 2), 128};
  cuuint32_t box[3] = {64, cuuint32_t(box_rows), cuuint32_t(kbox)}, es[3] = {1, 1, 1};
  CU(cuTensorMapEncodeTiled(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, dims, strides, box, es,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, l2,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

static void encode(CUtensorMap* m, void* base, int64_t rows, int64_t k, int box_rows, CUtensorMapL2promotion l2) {
  cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
  cuuint64_t strides[1] = {cuuint64_t(k * 2)};
  cuuint32_t box[2] = {64, cuuint32_t(box_rows)}, es[2] = {1, 1};
  CU(cuTensorMapEncodeTiled(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, es,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, l2,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

int main(int argc, char** argv) {
  const int64_t N = argc > 1 ? std::atoll(argv[1]) : 4096, K = argc > 2 ? std::atoll(argv[2]) : 4096;
  if (N % 128 || K % 64) { std::printf("N must be a multiple of 128 and K of 64\n"); return 2; }
  CK(cudaFree(nullptr));
  const size_t wbytes = size_t(N) * K * 2;
  void *w = nullptr, *act = nullptr, *dst = nullptr;
  uint4* fbuf = nullptr;
  unsigned* sink = nullptr;
  const size_t fbytes = size_t(256) << 20;
  CK(cudaMalloc(&w, wbytes));
  CK(cudaMalloc(&dst, wbytes));
  CK(cudaMalloc(&act, size_t(64) * K * 2));
  CK(cudaMalloc(&fbuf, fbytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(w, 1, wbytes));
  CK(cudaMemset(act, 1, size_t(64) * K * 2));
  CK(cudaMemset(fbuf, 2, fbytes));
  const size_t fn = fbytes / 16;
  CK(cudaFuncSetAttribute(tma_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));

  const double copy_us = median_us([&] { CK(cudaMemcpyAsync(dst, w, wbytes, cudaMemcpyDeviceToDevice)); }, fbuf, fn, sink);
  const double read_us = median_us([&] { read_all<<<132 * 4, 512>>>(static_cast<const uint4*>(w), wbytes / 16, sink); }, fbuf, fn, sink);
  std::printf("W = %lld x %lld bf16 (%.1f MB); times by CUDA events after an L2 flush (read), median\n",
              (long long)N, (long long)K, wbytes / 1e6);
  std::printf("%-44s %8.2f us  %6.2f TB/s (read+write)\n", "cudaMemcpy W -> W'", copy_us, 2 * wbytes / copy_us / 1e6);
  std::printf("%-44s %8.2f us  %6.2f TB/s\n", "plain 16-byte read of W (528 x 512 thr)", read_us, wbytes / read_us / 1e6);

  struct Cfg { int rows, box, act, stages; CUtensorMapL2promotion l2; const char* l2n; int pair = 0; int mode = 0; int kbox = 1; int stagger = 0; };
  const CUtensorMapL2promotion P256 = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  std::vector<Cfg> cfgs;
  // mode: 0 activations cold (flushed with everything), 1 warmed into L2 before the launch,
  // 2 prefetched into L2 by the kernel itself, each CTA a distinct slice, before its ring starts.
  // kbox: k blocks per (3-D) box; stagger: CTAs start their K walks spread over K.
  for (int rows : {32, 64})
    for (int act_rows : {0, 32})
      for (int stagger : {0, 1})
        for (int kbox : {1, 2, 4}) {
          const int stages = 10 / kbox;
          cfgs.push_back({rows, rows, act_rows, stages, P256, "256", 0, 0, kbox, stagger});
        }
  cfgs.push_back({32, 32, 32, 16, P256, "256", 0, 0, 1, 1});
  cfgs.push_back({32, 32, 32, 8, P256, "256", 0, 0, 2, 1});
  cfgs.push_back({32, 32, 32, 6, P256, "256", 0, 0, 4, 1});
  for (int act_rows : {0, 32})
    for (int stagger : {0, 1}) cfgs.push_back({64, 32, act_rows, 10, P256, "256", 1, 0, 1, stagger});
  for (const Cfg& c : cfgs) {
    StreamParams p{};
    p.rows_per_cta = c.rows;
    p.box_rows = c.box;
    p.act_rows = c.act;
    p.kblocks = int(K / 64);
    p.stages = c.stages;
    p.stage_bytes = uint32_t((c.rows + c.act) * 128 * c.kbox);
    p.kbox = c.kbox;
    p.stagger = c.stagger;
    const size_t smem = size_t(c.stages) * p.stage_bytes + 16 * c.stages + 1024;
    if (smem > 227 * 1024) continue;
    p.pair = c.pair;
    p.act_pf = c.mode == 2;
    encode(&p.w, w, N, K, c.box, c.l2);
    encode(&p.act, act, 64, K, c.act ? c.act : 64, c.l2);
    if (c.kbox > 1) {
      encode3(&p.w3, w, N, K, c.box, c.kbox, c.l2);
      encode3(&p.act3, act, 64, K, c.act ? c.act : 64, c.kbox, c.l2);
    }
    const unsigned grid = unsigned(N / c.rows) * (c.pair ? 2 : 1);
    cudaLaunchConfig_t lc{};
    lc.gridDim = dim3(grid);
    lc.blockDim = dim3(128);
    lc.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = c.pair ? 2 : 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    lc.attrs = attr;
    lc.numAttrs = 1;
    const auto warm = [&] {
      if (c.mode == 1) read_all<<<64, 512>>>(static_cast<const uint4*>(act), size_t(64) * K * 2 / 16, sink);
    };
    const double us = median_us([&] { CK(cudaLaunchKernelEx(&lc, tma_stream, p)); }, fbuf, fn, sink, warm);
    char what[96];
    std::snprintf(what, sizeof what, "TMA R=%d box=%d act=%d%s kbox=%d st=%d%s%s (%u CTAs)", c.rows, c.box, c.act,
                  c.mode == 1 ? "(warm)" : c.mode == 2 ? "(pf)" : "", c.kbox, c.stages, c.stagger ? " stagger" : "",
                  c.pair ? " pair" : "", grid);
    std::printf("%-58s %8.2f us  %6.2f TB/s of W  (%.0f%% of the plain read)\n", what, us, wbytes / us / 1e6,
                100.0 * read_us / us);
  }
  return 0;
}
