// SPDX-License-Identifier: Apache-2.0
// The line-packing copy's own source (kernels/common/pack_lines.cuh, the packed paths of the GEMM
// and the attention forward) run on the host: CUDA's indices become loop variables, __ldg a
// checked load, __funnelshift_r its definition from the PTX ISA (shf.r.clamp: the low 32 bits of
// (hi:lo) >> min(shift, 32)). Every base misalignment (0..7 elements into a 16-byte word), line
// lengths 1..70, odd and even line strides, several planes: the copy equals the source with zeros
// in each line's padding, and no load leaves the source tensor (a short window at a line's ends
// must take the element path). The GPU runs: test/gpu/test_gemm.cpp [odd], test_attention.cpp.
#include <vector_functions.h>
#include <vector_types.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "catch_compat.hpp"

namespace pemu {
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
Dim3 thread_idx, block_idx, grid_dim;
const char* lo = nullptr;  // the source tensor's bytes, [lo, hi)
const char* hi = nullptr;
long bad_loads = 0;
template <class T>
T ldg(const T* p) {
  const char* c = reinterpret_cast<const char*>(p);
  if (c < lo || c + sizeof(T) > hi) {
    ++bad_loads;
    return T{};
  }
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
inline uint32_t funnelshift_r(uint32_t l, uint32_t h, uint32_t s) {
  const uint32_t n = s < 32 ? s : 32;
  return uint32_t(((uint64_t(h) << 32) | l) >> n);
}
}  // namespace pemu

#define threadIdx pemu::thread_idx
#define blockIdx pemu::block_idx
#define gridDim pemu::grid_dim
#undef __global__
#undef __device__
#undef __forceinline__
#undef __launch_bounds__
#undef __grid_constant__
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __grid_constant__
#define __ldg(p) pemu::ldg(p)
#define __funnelshift_r(l, h, s) pemu::funnelshift_r(l, h, s)
#include "common/pack_lines.cuh"

namespace {

// Runs the kernel over grid {gx, gy, gz} x kPackThreads, one emulated thread after another (it has
// no barriers).
void run(const fly::PackParams& pp, unsigned gx, unsigned gy, unsigned gz) {
  pemu::grid_dim = {gx, gy, gz};
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x)
        for (unsigned t = 0; t < unsigned(fly::kPackThreads); ++t) {
          pemu::block_idx = {x, y, z};
          pemu::thread_idx = {t, 0, 0};
          fly_pack_lines_sm90(pp);
        }
}

}  // namespace

TEST_CASE("pack_lines: every misalignment, short and long lines, planes, no load outside the tensor", "[pack]") {
  std::mt19937 rng(7);
  int cases = 0;
  for (int64_t off = 0; off < 8; ++off)
    for (int64_t len : {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 70})
      for (int64_t extra : {0, 1, 3, 8}) {
        const int64_t lines = 5, planes_y = 2, planes_z = 2;
        const int64_t sld = len + extra;  // element stride between lines
        const int64_t sy = lines * sld + 1, sz = planes_y * sy + 3;  // odd plane strides
        const int64_t elems = (planes_z - 1) * sz + (planes_y - 1) * sy + (lines - 1) * sld + len;
        // A 16-byte aligned allocation; the tensor starts `off` elements in and ends exactly at `hi`.
        std::vector<uint4> store(size_t((off + elems) * 2 + 15) / 16 + 1);
        uint16_t* base = reinterpret_cast<uint16_t*>(store.data()) + off;
        for (int64_t i = 0; i < elems; ++i) base[i] = uint16_t(rng());
        pemu::lo = reinterpret_cast<const char*>(base);
        pemu::hi = reinterpret_cast<const char*>(base + elems);
        pemu::bad_loads = 0;
        const int64_t dld = (len + 7) / 8 * 8;
        std::vector<uint4> out(size_t(planes_z * planes_y * lines * dld * 2 + 15) / 16 + 1);
        std::memset(out.data(), 0xAB, out.size() * 16);
        fly::PackParams pp{};
        pp.src = base;
        pp.dst = out.data();
        pp.lines = lines;
        pp.len = len;
        pp.sld = sld;
        pp.dld = dld;
        pp.src_sz = sz;
        pp.src_sy = sy;
        pp.dst_plane = lines * dld;
        run(pp, 1, unsigned(planes_y), unsigned(planes_z));
        INFO("off " << off << " len " << len << " sld " << sld);
        CHECK(pemu::bad_loads == 0);
        const uint16_t* got = reinterpret_cast<const uint16_t*>(out.data());
        int64_t wrong = 0;
        for (int64_t z = 0; z < planes_z; ++z)
          for (int64_t y = 0; y < planes_y; ++y)
            for (int64_t l = 0; l < lines; ++l)
              for (int64_t e = 0; e < dld; ++e) {
                const uint16_t want = e < len ? base[z * sz + y * sy + l * sld + e] : uint16_t(0);
                wrong += got[((z * planes_y + y) * lines + l) * dld + e] != want;
              }
        CHECK(wrong == 0);
        ++cases;
      }
  CHECK(cases == 8 * 13 * 4);
}

TEST_CASE("pack_lines: a grid smaller than the chunks strides over them (one plane, the GEMM's form)", "[pack]") {
  const int64_t lines = 300, len = 77, sld = 79;
  std::vector<uint4> store(size_t(lines * sld * 2 + 15) / 16 + 2);
  uint16_t* base = reinterpret_cast<uint16_t*>(store.data()) + 3;
  for (int64_t i = 0; i < (lines - 1) * sld + len; ++i) base[i] = uint16_t(i * 2654435761u >> 7);
  pemu::lo = reinterpret_cast<const char*>(base);
  pemu::hi = reinterpret_cast<const char*>(base + (lines - 1) * sld + len);
  pemu::bad_loads = 0;
  const int64_t dld = 80;
  std::vector<uint16_t> out(size_t(lines * dld), 0xFFFF);
  fly::PackParams pp{};
  pp.src = base;
  pp.dst = out.data();
  pp.lines = lines;
  pp.len = len;
  pp.sld = sld;
  pp.dld = dld;
  run(pp, 2, 1, 1);  // 512 threads for 3000 chunks
  CHECK(pemu::bad_loads == 0);
  int64_t wrong = 0;
  for (int64_t l = 0; l < lines; ++l)
    for (int64_t e = 0; e < dld; ++e) wrong += out[size_t(l * dld + e)] != (e < len ? base[l * sld + e] : uint16_t(0));
  CHECK(wrong == 0);
}
