// SPDX-License-Identifier: Apache-2.0
// Host-checkable pieces of the BF16-widening MX GEMM (kernels/mx/mxfp_widen.cu, kernels/mx/mx_widen.h):
// the k permutation (a bijection that keeps each thread's 16 values in one k32 block and pairs them
// with the wgmma A fragment slots), the E4M3 -> BF16 widening with the block scale (exact for every
// code over the whole exponent window), the NaN marker bits, the per-tile exponent shift (every
// shifted exponent inside the window when it says safe, no shift at all fits when it says not),
// and the shared-memory plan.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>

#include <cuda_fp16.h>

#include "catch_compat.hpp"
#include "gemm/gemm_mx.h"
#include "mx/mx_encode.h"
#include "mx/mx_widen.h"

namespace {
namespace w = fly::mxw::widen;

float bf16_bits_to_float(uint32_t b) {
  const uint32_t u = (b & 0xFFFFu) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// FP16 bits of an E4M3 value (exact: every E4M3 value is an FP16 value), as cvt.rn.f16x2.e4m3x2 gives.
uint32_t f16_bits(float v) {
  const __half h = __float2half_rn(v);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
// The BF16 product of two BF16 values, exact here (one is a power of two, the result in range).
float bf16_mul(uint32_t a, uint32_t b) { return bf16_bits_to_float(a) * bf16_bits_to_float(b); }
bool is_normal_bf16(float v) { return v == 0.0f || (std::fabs(v) >= std::ldexp(1.0f, -126) && std::isfinite(v)); }
bool is_normal_f16(float v) { return v == 0.0f || (std::fabs(v) >= std::ldexp(1.0f, -14) && std::fabs(v) <= 65504.0f); }
float f16_bits_to_float(uint32_t b) {
  const uint16_t u = uint16_t(b & 0xFFFFu);
  __half h;
  std::memcpy(&h, &u, 2);
  return __half2float(h);
}
}  // namespace

TEST_CASE("mx widen: the k permutation pairs 16 consecutive bytes with one thread's fragment slots", "[mx][widen]") {
  std::set<int> slots;
  for (int l = 0; l < 64; ++l) {
    const int p = w::slot_of_logical(l);
    REQUIRE(p >= 0);
    REQUIRE(p < 64);
    slots.insert(p);
    const int t = l / 16, s = (l / 4) % 4, e = l % 4;
    // k16 step s of the group, and inside it the slots of thread t: {2t, 2t+1} (a0/a1), {2t+8, 2t+9} (a2/a3)
    CHECK(p / 16 == s);
    const int in = p % 16;
    CHECK(in == 2 * t + (e & 1) + 8 * (e >> 1));
    // every value of the thread's 16 lies in the scale block block_of(h, t) for both k64 halves
    for (int h = 0; h < 2; ++h) CHECK((64 * h + l) / 32 == w::block_of(h, t));
  }
  CHECK(slots.size() == 64u);
}

TEST_CASE("mx widen: E4M3 and E2M1 values widened with the multiplier are exact over each path's window", "[mx][widen]") {
  int checked = 0, bad = 0;
  for (int fp4 = 0; fp4 < 2; ++fp4) {
    for (int f16 = 0; f16 < 2; ++f16) {
      for (int E = w::win_lo(fp4 != 0, f16 != 0); E <= w::win_hi(fp4 != 0, f16 != 0); ++E) {
        // the multiplier of scale byte b with shift t (b - 127 + t = E)
        const uint32_t mul = w::multiplier(uint32_t(E + 127), 0, true, f16 != 0);
        CHECK((mul >> 16) == (mul & 0xFFFFu));
        const float mv = f16 ? f16_bits_to_float(mul) : bf16_bits_to_float(mul);
        CHECK(mv == std::ldexp(1.0f, f16 ? E : E + 112));
        for (int c = 0; c < (fp4 ? 16 : 256); ++c) {
          const uint8_t code = fp4 ? fly::mxe::e2m1_to_e4m3(uint8_t(c)) : uint8_t(c);
          if ((code & 0x7F) == 0x7F) continue;  // NaN: below
          const float q = fly::mx::decode_e4m3(code);
          const uint32_t pair = f16_bits(q) | (f16_bits(-q) << 16);
          float v;
          if (f16) {
            v = f16_bits_to_float(pair) * mv;  // the FP16 multiply: exact when the result is a normal FP16
            ++checked;
            if (v != std::ldexp(q, E) || !is_normal_f16(v)) ++bad;
          } else {
            const uint32_t m = w::f16x2_to_bf16x2_m112(pair);
            CHECK(bf16_bits_to_float(m) == std::ldexp(q, -112));
            CHECK(bf16_bits_to_float(m >> 16) == std::ldexp(-q, -112));
            v = bf16_mul(m, mul);
            ++checked;
            if (v != std::ldexp(q, E) || !is_normal_bf16(v)) ++bad;
            if ((m & w::kNanBits) != 0u) ++bad;  // finite elements never set the NaN marker bits
          }
        }
      }
    }
  }
  CHECK(checked > 30000);
  CHECK(bad == 0);
  // one past each window: some value no longer widens to a normal number
  CHECK(!is_normal_bf16(std::ldexp(fly::mx::decode_e4m3(0x01), w::win_lo(false, false) - 1)));
  CHECK(!is_normal_f16(std::ldexp(fly::mx::decode_e4m3(0x01), w::win_lo(false, true) - 1)));
  CHECK(!is_normal_f16(std::ldexp(448.0f, w::win_hi(false, true) + 1)));
  CHECK(!is_normal_f16(std::ldexp(6.0f, w::win_hi(true, true) + 1)));
  // FP16's canonical NaN (what the cvt gives for an E4M3 NaN code) sets the marker bits
  CHECK((w::f16x2_to_bf16x2_m112(0x7FFFu) & w::kNanBits) != 0u);
  CHECK((w::f16x2_to_bf16x2_m112(0x7FFFu << 16) & w::kNanBits) != 0u);
  // a NaN scale's multiplier is a NaN in both halves; an absent block's is zero
  CHECK(std::isnan(bf16_bits_to_float(w::multiplier(0xFF, 0, true, false))));
  CHECK(std::isnan(bf16_bits_to_float(w::multiplier(0xFF, 0, true, false) >> 16)));
  CHECK(std::isnan(f16_bits_to_float(w::multiplier(0xFF, 0, true, true))));
  CHECK(w::multiplier(0x7F, 0, false, true) == 0u);
}

TEST_CASE("mx widen: the tile's plan holds every scale inside its path's window, narrowest path first", "[mx][widen]") {
  // typical data: FP16, each operand's largest exponent at the window's top
  w::Plan pl = w::choose_plan(127 - 12, 127 - 4, 127 - 18, 127 - 9, false);
  CHECK(pl.path == w::kF16);
  CHECK(pl.ta == w::win_hi(false, true) + 4);
  CHECK(pl.tb == w::win_hi(false, true) + 9);
  // zero blocks (0x00) beside ordinary rows: too wide for FP16, BF16 holds it
  pl = w::choose_plan(0x00, 127 + 3, 127 - 12, 127 - 2, false);
  CHECK(pl.path == w::kBf16);
  // 0x00 and 0xFE rows in one operand: no path holds it
  CHECK(w::choose_plan(0x00, 0xFE, 127, 127, false).path == w::kScalar);
  // ... but the operands are independent: 0x00 rows of A against 0xFE columns of B are fine
  CHECK(w::choose_plan(0x00, 0x00, 0xFE, 0xFE, false).path == w::kF16);
  // nothing valid anywhere: FP16, no shift
  pl = w::choose_plan(255, 0, 255, 0, true);
  CHECK(pl.path == w::kF16);
  CHECK(pl.ta == 0);
  CHECK(pl.tb == 0);
  // brute force over random ranges: the chosen path's window holds both shifted ranges, no
  // narrower path could, and the rescale exponent stays inside what the epilogue takes (3 x 126)
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 254), coin(0, 3), narrow(0, 30);
  int paths[3] = {0, 0, 0};
  for (int i = 0; i < 20000; ++i) {
    int a0 = byte(rng), a1 = coin(rng) ? std::min(254, a0 + narrow(rng)) : byte(rng);
    int b0 = byte(rng), b1 = coin(rng) ? std::min(254, b0 + narrow(rng)) : byte(rng);
    if (a0 > a1) std::swap(a0, a1);
    if (b0 > b1) std::swap(b0, b1);
    if (coin(rng) == 0) a0 = 255, a1 = 0;  // no valid A scales
    if (coin(rng) == 0) b0 = 255, b1 = 0;
    const bool fp4 = coin(rng) & 1;
    const w::Plan p = w::choose_plan(a0, a1, b0, b1, fp4);
    REQUIRE(p.path >= 0);
    REQUIRE(p.path <= 2);
    ++paths[p.path];
    auto holds = [&](bool f16, int lo_b, int hi_b, int t) {
      return lo_b > hi_b || (lo_b - 127 + t >= w::win_lo(fp4, f16) && hi_b - 127 + t <= w::win_hi(fp4, f16));
    };
    auto fits = [&](bool f16) {
      const int span = w::win_hi(fp4, f16) - w::win_lo(fp4, f16);
      return (a0 > a1 || a1 - a0 <= span) && (b0 > b1 || b1 - b0 <= span);
    };
    if (p.path == w::kScalar) {
      CHECK(!fits(false));
      continue;
    }
    const bool f16 = p.path == w::kF16;
    CHECK(holds(f16, a0, a1, p.ta));
    CHECK(holds(f16, b0, b1, p.tb));
    if (!f16) CHECK(!fits(true));
    CHECK(std::abs(p.ta + p.tb) <= 3 * 126);
  }
  CHECK(paths[0] > 100);
  CHECK(paths[1] > 100);
  CHECK(paths[2] > 100);
}

template <int BN>
void check_layout() {
  using L = w::Layout<BN>;
  INFO("bn " << BN);
  CHECK(L::smem_bytes() <= 232448);
  CHECK(w::smem_bytes_for(BN) == L::smem_bytes());
  CHECK(L::kStage % 1024 == 0);
  CHECK(L::kOffB % 1024 == 0);  // TMA's 128B-swizzled destination
  CHECK(L::kOffScale >= L::kOffB + BN * 128);
  CHECK(L::kWBuf % 1024 == 0);
  CHECK(L::kWHalf == BN * 128);
  CHECK(L::kWHalf % 1024 == 0);  // each widened half starts on a swizzle atom (the wgmma descriptor)
  CHECK(L::kOffFlag + 16 <= L::kStage);
  CHECK(L::kStages >= 3);
  // the exact fallback's accumulators ([BN / 2][256] floats) fit in the widened tiles
  CHECK(BN / 2 * 256 * 4 <= w::kWBufs * L::kWBuf);
}

TEST_CASE("mx widen: the shared-memory plan fits and keeps the swizzle atoms aligned", "[mx][widen]") {
  check_layout<128>();
  check_layout<64>();
  check_layout<32>();
  CHECK(w::smem_bytes() == w::Layout<128>::smem_bytes());
  CHECK(w::kStage == w::Layout<128>::kStage);
  CHECK(w::smem_bytes_for(96) == 0);
  // the narrow plans buy ring stages with their smaller B parts
  CHECK(w::Layout<64>::kStages > w::Layout<128>::kStages);
  CHECK(w::Layout<32>::kStages > w::Layout<64>::kStages);
}
