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

TEST_CASE("mx widen: E4M3 and E2M1 values widened with the multiplier are exact over the window", "[mx][widen]") {
  int checked = 0, bad = 0;
  for (int fp4 = 0; fp4 < 2; ++fp4) {
    for (int E = w::elo_of(fp4 != 0); E <= w::kEhi; ++E) {
      // the multiplier of scale byte b with shift t: 2^(b - 127 + t + 112); here b - 127 + t = E
      const uint32_t mul = w::multiplier(uint32_t(E + 127), 0, true);
      CHECK((mul >> 16) == (mul & 0xFFFFu));
      CHECK(bf16_bits_to_float(mul) == std::ldexp(1.0f, E + 112));
      for (int c = 0; c < (fp4 ? 16 : 256); ++c) {
        const uint8_t code = fp4 ? fly::mxe::e2m1_to_e4m3(uint8_t(c)) : uint8_t(c);
        if ((code & 0x7F) == 0x7F) continue;  // NaN: below
        const float q = fly::mx::decode_e4m3(code);
        const uint32_t pair = f16_bits(q) | (f16_bits(-q) << 16);
        const uint32_t m = w::f16x2_to_bf16x2_m112(pair);
        CHECK(bf16_bits_to_float(m) == std::ldexp(q, -112));
        CHECK(bf16_bits_to_float(m >> 16) == std::ldexp(-q, -112));
        const float v = bf16_mul(m, mul);
        ++checked;
        if (v != std::ldexp(q, E) || !is_normal_bf16(v)) ++bad;
        // finite elements never set the NaN marker bits
        if ((m & w::kNanBits) != 0u) ++bad;
      }
    }
  }
  CHECK(checked > 30000);
  CHECK(bad == 0);
  // one below the window: the smallest E4M3 value no longer widens to a normal BF16
  CHECK(!is_normal_bf16(std::ldexp(fly::mx::decode_e4m3(0x01), w::elo_of(false) - 1)));
  // FP16's canonical NaN (what the cvt gives for an E4M3 NaN code) sets the marker bits
  CHECK((w::f16x2_to_bf16x2_m112(0x7FFFu) & w::kNanBits) != 0u);
  CHECK((w::f16x2_to_bf16x2_m112(0x7FFFu << 16) & w::kNanBits) != 0u);
  // a NaN scale's multiplier is a BF16 NaN in both halves; an absent block's is zero
  CHECK(std::isnan(bf16_bits_to_float(w::multiplier(0xFF, 0, true))));
  CHECK(std::isnan(bf16_bits_to_float(w::multiplier(0xFF, 0, true) >> 16)));
  CHECK(w::multiplier(0x7F, 0, false) == 0u);
}

TEST_CASE("mx widen: the tile's exponent shift keeps every scale inside the window, or says none can", "[mx][widen]") {
  // typical data: no shift
  w::Shift s = w::choose_shift(127 - 20, 127 + 5, 127 - 18, 127 - 3, false);
  CHECK(s.safe);
  CHECK(s.t == 0);
  // zero blocks (0x00) beside ordinary rows: a shift up for A, down for B
  s = w::choose_shift(0x00, 127 + 3, 127 - 12, 127 - 2, false);
  CHECK(s.safe);
  CHECK(s.t == w::elo_of(false) + 127);
  // 0x00 and 0xFE rows in one tile: no shift fits
  CHECK(!w::choose_shift(0x00, 0xFE, 127, 127, false).safe);
  // nothing valid anywhere: safe, no shift
  s = w::choose_shift(255, 0, 255, 0, true);
  CHECK(s.safe);
  CHECK(s.t == 0);
  // brute force over random ranges: safe <=> some integer shift fits, and the chosen one does
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 254), coin(0, 3);
  int safe = 0, unsafe = 0;
  for (int i = 0; i < 20000; ++i) {
    int a0 = byte(rng), a1 = byte(rng), b0 = byte(rng), b1 = byte(rng);
    if (a0 > a1) std::swap(a0, a1);
    if (b0 > b1) std::swap(b0, b1);
    if (coin(rng) == 0) a0 = 255, a1 = 0;  // no valid A scales
    if (coin(rng) == 0) b0 = 255, b1 = 0;
    const bool fp4 = coin(rng) & 1;
    const int lo = w::elo_of(fp4), hi = w::kEhi;
    auto fits = [&](int t) {
      const bool fa = a0 > a1 || (a0 - 127 + t >= lo && a1 - 127 + t <= hi);
      const bool fb = b0 > b1 || (b0 - 127 - t >= lo && b1 - 127 - t <= hi);
      return fa && fb;
    };
    bool any = false;
    for (int t = -400; t <= 400 && !any; ++t) any = fits(t);
    const w::Shift sh = w::choose_shift(a0, a1, b0, b1, fp4);
    REQUIRE(sh.safe == any);
    if (sh.safe) {
      REQUIRE(fits(sh.t));
      if (fits(0)) CHECK(sh.t == 0);
      ++safe;
    } else {
      ++unsafe;
    }
  }
  CHECK(safe > 1000);
  CHECK(unsafe > 1000);
}

TEST_CASE("mx widen: the shared-memory plan fits and keeps the swizzle atoms aligned", "[mx][widen]") {
  CHECK(w::smem_bytes() <= 232448);
  CHECK(w::kStage % 1024 == 0);
  CHECK(w::kOffB % 1024 == 0);
  CHECK(w::kWBuf % 1024 == 0);
  CHECK(w::kWHalf == w::kBN * 128);
  CHECK(w::kOffFlag + 4 <= w::kStage);
  CHECK(w::kStages >= 3);
}
