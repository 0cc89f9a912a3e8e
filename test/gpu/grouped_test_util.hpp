// Host helpers the grouped GEMM GPU tests share (both modes): FP16/BF16 bits of the small dyadic
// values (and inf) the tests use, exact both ways; a device buffer; 8-element rounding.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"

namespace grouped_test {

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

}  // namespace grouped_test
