// SPDX-License-Identifier: Apache-2.0
// Host helpers the dense and grouped GEMM GPU tests share: FP16/BF16 bits of the small dyadic
// values (and inf) the tests use, exact both ways; a device buffer; 8-element rounding; the
// CUDA-graph replay of a grouped call with new device offsets.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"

namespace gemm_test {

inline uint16_t enc(float v, fly_dtype dt) {  // exact for the small dyadic values (and inf) used here
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if (dt == FLY_BF16) return uint16_t(u >> 16);
  const uint32_t sign = (u >> 16) & 0x8000;
  if (std::isinf(v)) return uint16_t(sign | 0x7C00);
  if (v == 0.f) return uint16_t(sign);
  const int e = int((u >> 23) & 0xFF) - 127 + 15;
  return uint16_t(sign | (uint32_t(e) << 10) | ((u >> 13) & 0x3FF));
}
inline float dec(uint16_t h, fly_dtype dt) {
  uint32_t u;
  if (dt == FLY_BF16) {
    u = uint32_t(h) << 16;
  } else {
    const uint32_t sign = uint32_t(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F) u = sign | 0x7F800000 | (m << 13);
    else if (e == 0) {
      const float f = std::ldexp(float(m), -24);
      return (h & 0x8000) ? -f : f;
    } else u = sign | ((e - 15 + 127) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { REQUIRE(cudaMalloc(&p, bytes ? bytes : 16) == cudaSuccess); }
  ~Dev() { cudaFree(p); }
};

inline int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

// Captures r.call(s) into a CUDA graph (after one call outside the capture: module load,
// dispatch), then for each entry of `offs_list` poisons the output, writes the offsets to the
// device buffer the call reads (r.doffs) on the stream, replays the graph and checks the result
// against them (r.check). R: the grouped tests' runners (Run, KRun).
template <class R>
void replay_with_new_offsets(R& r, const std::vector<std::vector<int32_t>>& offs_list) {
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(r.call(s) == FLY_SUCCESS);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  cudaGraph_t g;
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  const fly_status st = r.call(s);
  INFO(fly_get_last_error());
  REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
  REQUIRE(st == FLY_SUCCESS);
  cudaGraphExec_t ge;
  REQUIRE(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
  for (const std::vector<int32_t>& offs : offs_list) {
    std::string shown;
    for (int32_t o : offs) shown += (shown.empty() ? "" : ",") + std::to_string(o);
    INFO("offs " << shown);
    r.poison();
    REQUIRE(cudaMemcpyAsync(r.doffs->p, offs.data(), offs.size() * 4, cudaMemcpyHostToDevice, s) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(ge, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    r.check(offs);
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

}  // namespace gemm_test
