// SPDX-License-Identifier: Apache-2.0
// Weight-only MX decode GEMM on the CPU (kernels/mx/mx_decode.h, src/ops/mx.cpp): the kernel's
// exact widenings over every input (E2M1 nibble pairs to FP16 / BF16 bit patterns, E8M0 bytes to
// the FP32 block multiplier), the launch plan (cluster split of K), and fly_scaled_gemm's weight-only
// validation: every bad argument's status and message before any device query, the dispatch
// decision's boundary (M <= 64 runs the decode kernels, M = 65 the prefill kernel with BF16 activations
// and is refused with a message with FP16), and the workspace query.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "gemm/gemm_mx.h"
#include "mx/mx_decode.h"
#include "mx/mx_prefill.h"
#include "mx/mx_unpack.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;
using fly_test::mentions;
using fly_test::vec;

void* const kA = fly_test::fake_address(0);
void* const kB = fly_test::fake_address(1);
void* const kSB = fly_test::fake_address(2);
void* const kC = fly_test::fake_address(3);
void* const kBias = fly_test::fake_address(4);

}  // namespace

TEST_CASE("mx_decode: the E2M1 table is exact and its lookups conflict-free", "[mx_decode][mx]") {
  namespace mxd = fly::mxd;
  // every packed byte: both elements exact in FP16 and BF16, element 0 in the low half
  for (uint32_t byte = 0; byte < 256; ++byte) {
    const double w0 = fly::mx::decode_e2m1(uint8_t(byte & 15)), w1 = fly::mx::decode_e2m1(uint8_t(byte >> 4));
    const uint32_t f = mxd::e2m1_lut_entry(byte, false), b = mxd::e2m1_lut_entry(byte, true);
    INFO("byte " << byte);
    CHECK(mxd::f16_bits_value(f & 0xFFFFu) == w0);
    CHECK(mxd::f16_bits_value(f >> 16) == w1);
    CHECK(mxd::bf16_bits_value(b & 0xFFFFu) == w0);
    CHECK(mxd::bf16_bits_value(b >> 16) == w1);
    CHECK(((f >> 15) & 1) == ((byte >> 3) & 1));  // -0 keeps its sign
    CHECK(((b >> 31) & 1) == ((byte >> 7) & 1));
  }
  // the address of byte b of a word: table + entry (the byte) * 256 + lane * 4, whatever the other
  // bytes; the kernel fills byte 256 e + 4 l with entry e: lane l's copy, bank l
  const uint32_t fillers[] = {0x00000000u, 0xFFFFFFFFu, 0x5A5A5A5Au, 0x96C3A51Eu};
  int checked = 0;
  for (int bpos = 0; bpos < 4; ++bpos)
    for (uint32_t byte = 0; byte < 256; ++byte)
      for (uint32_t fill : fillers)
        for (uint32_t lane = 0; lane < 32; ++lane) {
          const uint32_t q = (fill & ~(0xFFu << (8 * bpos))) | (byte << (8 * bpos));
          const uint32_t base = 0x20000u;  // a 64 KiB-aligned table
          const uint32_t addr = mxd::e2m1_lut_addr(q, bpos, base | (lane << 2));
          if (addr != base + byte * 256 + lane * 4) {
            INFO("q " << std::hex << q << " b " << bpos << " lane " << lane << " addr " << addr);
            CHECK(addr == base + byte * 256 + lane * 4);
          }
          ++checked;
        }
  CHECK(checked == 4 * 256 * 4 * 32);
  CHECK(mxd::kLutSpan == 256 * 256);
}

TEST_CASE("mx_decode: E8M0 block multiplier for all 256 bytes", "[mx_decode][mx]") {
  for (uint32_t b = 0; b < 256; ++b) {
    const uint32_t u = fly::mxd::e8m0_mult_bits(b);
    float f;
    std::memcpy(&f, &u, 4);
    INFO("byte " << b << " bits " << std::hex << u);
    if (b == 255) {
      CHECK(std::isnan(f));
    } else {
      CHECK(f == fly::mx::decode_e8m0(uint8_t(b)));  // b = 0: 2^-127, an FP32 subnormal
      CHECK(f == std::ldexp(1.0f, int(b) - 127));
    }
  }
}

namespace {
// Whether x is exactly a BF16 value (normal or subnormal, |x| <= max): its significand fits 8 bits
// at its exponent, and no bit lies below 2^-133.
bool bf16_exact(double x) {
  if (x == 0) return true;
  if (!std::isfinite(x) || std::fabs(x) > 0x1.FEp127) return false;
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int lsb = std::max(e - 8, -133);
  const double scaled = std::ldexp(x, -lsb);
  return scaled == std::trunc(scaled);
}
}  // namespace

TEST_CASE("mx_decode wide: the prescaled BF16 weights are exact where the fast path takes them", "[mx_decode][mx]") {
  namespace mxd = fly::mxd;
  // MXFP4: every code times the multiplier of every scale byte is a BF16 value: the kernel's
  // product (one mul.rn.bf16x2) is exact, and times 2^pre it is the dequantized weight
  for (uint32_t e = 0; e < 256; ++e) {
    const uint32_t m16 = mxd::wide_mult16(e, true);
    const double mult = mxd::bf16_bits_value(m16);
    INFO("e " << e);
    if (e == 255) {
      CHECK(std::isnan(mult));
      continue;
    }
    CHECK(mult == std::ldexp(1.0, int(e) - 127 - mxd::kPreE2M1));
    for (uint32_t code = 0; code < 16; ++code) {
      const double w = fly::mx::decode_e2m1(uint8_t(code));
      CHECK(bf16_exact(w * mult));
      CHECK(std::ldexp(w * mult, mxd::kPreE2M1) == w * std::ldexp(1.0, int(e) - 127));
    }
  }
  // MXFP8: the placed bits are the E4M3 value times 2^-120 for every non-NaN byte (subnormals
  // included), both halves of both pairs of a word
  for (uint32_t byte = 0; byte < 256; ++byte) {
    if ((byte & 0x7Fu) == 0x7Fu) continue;  // NaN: the kernel flags these for the exact path
    const double v = fly::mx::decode_e4m3(uint8_t(byte));
    for (int pos = 0; pos < 4; ++pos) {
      const uint32_t w = (0xA5C3961Eu & ~(0xFFu << (8 * pos))) | (byte << (8 * pos));
      const uint32_t placed = mxd::e4m3x2_place_bf16(w, pos >= 2);
      const uint32_t half = (pos & 1) ? placed >> 16 : placed & 0xFFFFu;
      INFO("byte " << byte << " pos " << pos);
      CHECK(mxd::bf16_bits_value(half) == std::ldexp(v, -120));
      if (v == 0) CHECK(((half >> 15) & 1) == ((byte >> 7) & 1));  // -0 keeps its sign
    }
  }
  // ... and times the multiplier of an in-range scale byte, exact; the range's edges are tight
  int in_range = 0;
  for (uint32_t e = 0; e < 256; ++e) {
    const bool ok = mxd::wide_e4m3_scale_ok(e);
    CHECK(ok == (e == 255 || (e >= 3 && e <= 134)));
    if (!ok || e == 255) continue;
    ++in_range;
    const double mult = mxd::bf16_bits_value(mxd::wide_mult16(e, false));
    CHECK(mult == std::ldexp(1.0, int(e) - 7 - mxd::kPreE4M3));
    for (uint32_t byte = 0; byte < 256; ++byte) {
      if ((byte & 0x7Fu) == 0x7Fu) continue;
      const double placed = std::ldexp(fly::mx::decode_e4m3(uint8_t(byte)), -120);
      INFO("e " << e << " byte " << byte);
      CHECK(bf16_exact(placed * mult));
      CHECK(std::ldexp(placed * mult, mxd::kPreE4M3) == fly::mx::decode_e4m3(uint8_t(byte)) * std::ldexp(1.0, int(e) - 127));
    }
  }
  CHECK(in_range == 132);
  CHECK(std::isnan(mxd::bf16_bits_value(mxd::wide_mult16(255, false))));
  // just outside: E4M3's smallest subnormal times 2^(2 - 127) is below BF16's 2^-133, and at 135 the
  // multiplier 2^(135 - 7) is past BF16's largest value
  CHECK(!bf16_exact(std::ldexp(1.0, -9) * std::ldexp(1.0, 2 - 127)));
  CHECK(!bf16_exact(std::ldexp(1.0, 135 - 7)));
}

namespace {
// BF16 round-to-nearest-even of an exact double (subnormals down to 2^-133, overflow to inf).
double bf16_rn(double x) {
  if (!std::isfinite(x) || x == 0) return x;
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const double quantum = std::ldexp(1.0, std::max(e - 1, -126) - 7);
  const double r = std::nearbyint(x / quantum) * quantum;  // the default rounding: to nearest even
  return std::fabs(r) >= std::ldexp(1.0, 128) ? std::copysign(INFINITY, x) : r;
}
// BF16 multiply as mul.rn.bf16x2 does it on one half: the exact product rounded once.
uint32_t bf16_mul_bits(uint32_t a, uint32_t b) {
  const double p = fly::mxd::bf16_bits_value(a) * fly::mxd::bf16_bits_value(b);
  if (std::isnan(p)) return 0x7FC0u;
  const float f = float(bf16_rn(p));  // exact in FP32
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u >> 16;
}
// The prefill producer's widening of one element (mx_prefill.cu widen_word), given its E4M3 code.
double prefill_widen(uint32_t e4m3, uint32_t scale) {
  namespace mxp = fly::mxp;
  const uint32_t placed = fly::mxd::e4m3x2_place_bf16(e4m3, false) & 0xFFFFu;
  uint32_t v = bf16_mul_bits(placed, mxp::mult_first16(scale));
  if (scale > mxp::kOneMulMax && scale < 255u) v = bf16_mul_bits(v, mxp::mult_second16(scale));
  if (mxp::e4m3_nan_mask(e4m3) & 0x80u) v = 0x7FC0u;
  return fly::mxd::bf16_bits_value(v);
}
bool same_value(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }
}  // namespace

TEST_CASE("mx_prefill: the widened weight is bf16(dequant) for every code and scale byte", "[mx_decode][mx]") {
  namespace mxp = fly::mxp;
  // the multipliers: 2^(e - 7) up to 134, else 2^127 then 2^(e - 134); NaN for 0xFF
  for (uint32_t e = 0; e < 255; ++e) {
    INFO("e " << e);
    const double m1 = fly::mxd::bf16_bits_value(mxp::mult_first16(e));
    if (e <= mxp::kOneMulMax) {
      CHECK(m1 == std::ldexp(1.0, int(e) - 7));
    } else {
      CHECK(m1 == std::ldexp(1.0, 127));
      CHECK(fly::mxd::bf16_bits_value(mxp::mult_second16(e)) == std::ldexp(1.0, int(e) - 134));
    }
  }
  CHECK(std::isnan(fly::mxd::bf16_bits_value(mxp::mult_first16(255))));
  // MXFP8: every E4M3 byte (NaN codes too) times every scale byte
  for (uint32_t scale = 0; scale < 256; ++scale)
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const double want = bf16_rn(double(fly::mx::decode_e4m3(uint8_t(byte))) * double(fly::mx::decode_e8m0(uint8_t(scale))));
      INFO("e4m3 byte " << byte << " scale " << scale);
      CHECK(same_value(prefill_widen(byte, scale), want));
    }
  // MXFP4: every code through the E2M1 -> E4M3 permute, times every scale byte
  for (uint32_t scale = 0; scale < 256; ++scale)
    for (uint32_t code = 0; code < 16; ++code) {
      const uint32_t e4 = fly::mxu::e2m1x4_to_e4m3x4(code) & 0xFFu;
      const double want = bf16_rn(double(fly::mx::decode_e2m1(uint8_t(code))) * double(fly::mx::decode_e8m0(uint8_t(scale))));
      INFO("e2m1 code " << code << " scale " << scale);
      CHECK(same_value(prefill_widen(e4, scale), want));
    }
  // the NaN mask marks exactly the bytes 0x7F and 0xFF, in any lane of the word
  for (uint32_t byte = 0; byte < 256; ++byte)
    for (int pos = 0; pos < 4; ++pos) {
      const uint32_t w = (0x01020304u & ~(0xFFu << (8 * pos))) | (byte << (8 * pos));
      CHECK(mxp::e4m3_nan_mask(w) == ((byte & 0x7Fu) == 0x7Fu ? 0x80u << (8 * pos) : 0u));
    }
}

TEST_CASE("mx_prefill: shared memory and launch plan", "[mx_decode][mx]") {
  namespace mxp = fly::mxp;
  // the default variants fit sm_90's 227 KiB (the tuning space's constraint is this formula)
  CHECK(mxp::smem_bytes(256, 3, 4, false) == 3 * (128 + 256) * 128 + 16 * 3 + 1024 + 4 * 256 * 64);
  CHECK(mxp::smem_bytes(256, 4, 4, true) <= 227 * 1024);
  CHECK(mxp::smem_bytes(256, 3, 4, false) <= 227 * 1024);
  CHECK(mxp::smem_bytes(128, 4, 4, false) <= 227 * 1024);
  // persistent: at most one CTA per SM, tiles of 128 rows
  const mxp::Launch big = mxp::plan(4096, 14336, 4096, 256, 3, 4, false, 132);
  CHECK(big.tiles_m == 32);
  CHECK(big.tiles_n == 56);
  CHECK(big.grid == 132);
  CHECK(big.split == 1);
  const mxp::Launch small = mxp::plan(65, 300, 128, 128, 4, 4, true, 132);  // 2 k steps: no split
  CHECK(small.tiles_m == 1);
  CHECK(small.tiles_n == 3);
  CHECK(small.grid == 3);
  CHECK(small.split == 1);
  CHECK(small.threads == 384);
  // few tiles, long K: split-K clusters of up to 8, every range >= 4 k steps, none empty
  const mxp::Launch few = mxp::plan(65, 300, 1056, 128, 4, 4, true, 132);  // 3 tiles, 17 k steps
  CHECK(few.split == 4);
  CHECK(few.kb_per_split == 5);
  CHECK(few.grid == 12);
  const mxp::Launch deep = mxp::plan(256, 256, 8192, 256, 3, 4, false, 132);  // 2 tiles, 128 k steps
  CHECK(deep.split == 8);
  CHECK(deep.kb_per_split == 16);
  CHECK(deep.grid == 16);
}

TEST_CASE("mx_decode: launch plan splits K over a cluster within one wave", "[mx_decode][mx]") {
  namespace mxd = fly::mxd;
  mxd::Shape v;  // 8 warps x 32 rows = 256 rows per CTA
  // N = 4096: 16 tiles, K = 4096: 64 stages -> 8 CTAs per tile, 128 CTAs on 132 SMs
  mxd::Launch L = mxd::plan(4096, 4096, v, 132);
  CHECK(L.cl == 8);
  CHECK(L.grid == 128u);
  CHECK(L.kst_per_cta == 8);
  CHECK(L.threads == 256u);
  CHECK(L.smem == unsigned(mxd::smem_bytes(8, 32, 2, false)));
  v.fp4 = true;
  CHECK(mxd::plan(4096, 4096, v, 132).smem == unsigned(mxd::smem_bytes(8, 32, 2, false) + 2 * mxd::kLutSpan));
  v.fp4 = false;
  // N = 14336: 56 tiles -> 2 per tile (112 CTAs), 4 would need 224 > 132
  L = mxd::plan(14336, 4096, v, 132);
  CHECK(L.cl == 2);
  CHECK(L.grid == 112u);
  // N = 6144: 24 tiles -> 5 per tile (120 CTAs; 4 would leave 36 SMs idle, 6 need 144)
  L = mxd::plan(6144, 4096, v, 132);
  CHECK(L.cl == 5);
  CHECK(L.grid == 120u);
  CHECK(L.kst_per_cta == 13);  // 64 stages: 4 CTAs of 13, the last of 12
  // N = 28672: 112 tiles already fill the wave
  L = mxd::plan(28672, 8192, v, 132);
  CHECK(L.cl == 1);
  CHECK(L.grid == 112u);
  CHECK(L.kst_per_cta == 128);
  // K = 32: one stage, one CTA per tile whatever the SMs
  L = mxd::plan(300, 32, v, 132);
  CHECK(L.cl == 1);
  CHECK(L.grid == 2u);
  CHECK(L.kst_per_cta == 1);
  // every CTA of a cluster has stages: K = 8192 (128 stages), 2 tiles -> 8 CTAs of 16 stages
  L = mxd::plan(257, 8192, v, 132);
  CHECK(L.cl == 8);
  CHECK(L.kst_per_cta == 16);
  // a forced cluster larger than the stages shrinks to them
  v.cl = 8;
  L = mxd::plan(64, 128, v, 132);
  CHECK(L.cl == 2);
  CHECK(L.kst_per_cta == 1);
  // the plan's shared memory fits the 227 KiB opt-in for every shape of the space
  for (int nw : {4, 8})
    for (int rpw : {16, 32})
      for (int mt : {1, 2, 4, 8}) CHECK(mxd::smem_bytes(nw, rpw, mt, true) <= 232448);
}

TEST_CASE("scaled_gemm weight-only mode rejects bad arguments before any device query", "[mx_decode][mx][args]") {
  const int64_t M = 8, N = 64, K = 128;
  fly_tensor a = mat(kA, FLY_BF16, M, K, K), ah = mat(kA, FLY_F16, M, K, K);
  fly_tensor b8 = mat(kB, FLY_F8_E4M3, N, K, K), b4 = mat(kB, FLY_F4_E2M1X2, N, K / 2, K / 2);
  fly_tensor sb = mat(kSB, FLY_E8M0, N, K / 32, K / 32);
  fly_tensor c = mat(kC, FLY_BF16, M, N, N), ch = mat(kC, FLY_F16, M, N, N), bias = vec(kBias, FLY_BF16, N);
  // valid: both formats, both activation dtypes, with and without bias, M = 1 and M = 64
  CHECK(fly_test::reached_device(fly_scaled_gemm(&a, nullptr, &b8, &sb, &bias, &c, nullptr, 0, nullptr)));
  CHECK(fly_test::reached_device(fly_scaled_gemm(&a, nullptr, &b4, &sb, nullptr, &c, nullptr, 0, nullptr)));
  CHECK(fly_test::reached_device(fly_scaled_gemm(&ah, nullptr, &b8, &sb, nullptr, &ch, nullptr, 0, nullptr)));
  CHECK(fly_test::reached_device(fly_scaled_gemm(&ah, nullptr, &b4, &sb, nullptr, &ch, nullptr, 0, nullptr)));
  fly_tensor a1 = mat(kA, FLY_BF16, 1, K, K), c1 = mat(kC, FLY_BF16, 1, N, N);
  CHECK(fly_test::reached_device(fly_scaled_gemm(&a1, nullptr, &b8, &sb, nullptr, &c1, nullptr, 0, nullptr)));
  fly_tensor a64 = mat(kA, FLY_BF16, 64, K, K), c64 = mat(kC, FLY_BF16, 64, N, N);
  CHECK(fly_test::reached_device(fly_scaled_gemm(&a64, nullptr, &b4, &sb, nullptr, &c64, nullptr, 0, nullptr)));
  // a workspace is accepted and unused
  CHECK(fly_test::reached_device(fly_scaled_gemm(&a, nullptr, &b8, &sb, nullptr, &c, fly_test::fake_address(5), 256,
                                          nullptr)));

  // M > 64 with BF16 activations: the prefill kernel, dispatched only once verified on a GPU
  // (src/ops/mx.cpp kPrefillDispatch); until then UNSUPPORTED with the reason unless forced, and a
  // forced prefill variant reaches the device (both formats, bias, any M). FP16 is refused with the
  // reason, before the device.
  fly_tensor a65 = mat(kA, FLY_BF16, 65, K, K), c65 = mat(kC, FLY_BF16, 65, N, N);
  const fly_status s65 = fly_scaled_gemm(&a65, nullptr, &b8, &sb, &bias, &c65, nullptr, 0, nullptr);
  const bool gated = s65 == FLY_ERROR_UNSUPPORTED && mentions("only when forced");  // (before reached_device's query)
  CHECK((gated || fly_test::reached_device(s65)));
  REQUIRE(fly_force_variant("mx_decode_prefill_bf16_e2m1_n256_s4_r4") == FLY_SUCCESS);
  fly_tensor a4k = mat(kA, FLY_BF16, 4096, K, K), c4k = mat(kC, FLY_BF16, 4096, N, N);
  CHECK(fly_test::reached_device(fly_scaled_gemm(&a4k, nullptr, &b4, &sb, nullptr, &c4k, nullptr, 0, nullptr)));
  CHECK(fly_test::reached_device(fly_scaled_gemm(&a1, nullptr, &b4, &sb, nullptr, &c1, nullptr, 0, nullptr)));
  REQUIRE(fly_force_variant(nullptr) == FLY_SUCCESS);
  fly_tensor ah65 = mat(kA, FLY_F16, 65, K, K), ch65 = mat(kC, FLY_F16, 65, N, N);
  CHECK(fly_scaled_gemm(&ah65, nullptr, &b8, &sb, nullptr, &ch65, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("M <= 64"));
  CHECK(mentions("BF16 activations only"));
  // empty: no-op before the device; K = 0 with work: unsupported
  fly_tensor a0 = mat(kA, FLY_BF16, 0, K, K), c0 = mat(kC, FLY_BF16, 0, N, N);
  CHECK(fly_scaled_gemm(&a0, nullptr, &b8, &sb, nullptr, &c0, nullptr, 0, nullptr) == FLY_SUCCESS);
  fly_tensor ak0 = mat(kA, FLY_BF16, M, 0, 1), bk0 = mat(kB, FLY_F8_E4M3, N, 0, 1), sk0 = mat(kSB, FLY_E8M0, N, 0, 0);
  CHECK(fly_scaled_gemm(&ak0, nullptr, &bk0, &sk0, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("K = 0"));

  // scale_a given with 16-bit activations: the MX-activation entry refuses the dtype and says how
  fly_tensor sa = mat(kSB, FLY_E8M0, M, K / 32, K / 32);
  CHECK(fly_scaled_gemm(&a, &sa, &b8, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("a: dtype bf16"));
  CHECK(mentions("scale_a = NULL"));
  // weights that are not MX
  fly_tensor bbf = mat(kB, FLY_BF16, N, K, K);
  CHECK(fly_scaled_gemm(&a, nullptr, &bbf, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("b: dtype bf16"));
  CHECK(fly_scaled_gemm(&a, nullptr, nullptr, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("b"));
  // b's columns against K (E4M3: K bytes; E2M1: K/2)
  fly_tensor b4w = mat(kB, FLY_F4_E2M1X2, N, K, K);
  CHECK(fly_scaled_gemm(&a, nullptr, &b4w, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("b: 128 columns"));
  fly_tensor b8n = mat(kB, FLY_F8_E4M3, N, K / 2, K / 2);
  CHECK(fly_scaled_gemm(&a, nullptr, &b8n, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("b: 64 columns"));
  // c: shape, dtype other than a's
  fly_tensor cw = mat(kC, FLY_BF16, M, N + 1, N + 1);
  CHECK(fly_scaled_gemm(&a, nullptr, &b8, &sb, nullptr, &cw, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("c: shape"));
  CHECK(fly_scaled_gemm(&a, nullptr, &b8, &sb, nullptr, &ch, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("c: dtype fp16"));
  CHECK(fly_scaled_gemm(&a, nullptr, &b8, &sb, nullptr, nullptr, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("c"));
  // K % 32
  fly_tensor a48 = mat(kA, FLY_BF16, M, 48, 48), b48 = mat(kB, FLY_F8_E4M3, N, 48, 48), s48 = mat(kSB, FLY_E8M0, N, 1, 1);
  CHECK(fly_scaled_gemm(&a48, nullptr, &b48, &s48, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("multiple of 32"));
  // scale_b: missing, dtype, shape, padding
  CHECK(fly_scaled_gemm(&a, nullptr, &b8, nullptr, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("scale_b"));
  fly_tensor sbu = mat(kSB, FLY_U8, N, K / 32, K / 32);
  CHECK(fly_scaled_gemm(&a, nullptr, &b8, &sbu, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("scale_b: dtype uint8"));
  fly_tensor sbw = mat(kSB, FLY_E8M0, N, K / 16, K / 16);
  CHECK(fly_scaled_gemm(&a, nullptr, &b8, &sbw, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("scale_b: shape"));
  fly_tensor sbp = mat(kSB, FLY_E8M0, N, K / 32, 8);
  CHECK(fly_scaled_gemm(&a, nullptr, &b8, &sbp, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("scale_b: must be contiguous"));
  // bias in another dtype than c
  fly_tensor bias16 = vec(kBias, FLY_F16, N);
  CHECK(fly_scaled_gemm(&a, nullptr, &b8, &sb, &bias16, &c, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("bias: dtype fp16"));
  // layouts: column-major a, a row stride off the 16-byte rule, b's row stride, misaligned bases
  fly_tensor at = mat(kA, FLY_BF16, M, K, 1, M);
  CHECK(fly_scaled_gemm(&at, nullptr, &b8, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("a: inner stride"));
  fly_tensor apad = mat(kA, FLY_BF16, M, K, K + 4);
  CHECK(fly_scaled_gemm(&apad, nullptr, &b8, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("a: row stride"));
  fly_tensor bpad = mat(kB, FLY_F8_E4M3, N, K, K + 8);
  CHECK(fly_scaled_gemm(&a, nullptr, &bpad, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("b: row stride"));
  fly_tensor amis = mat(reinterpret_cast<char*>(kA) + 8, FLY_BF16, M, K, K);
  CHECK(fly_scaled_gemm(&amis, nullptr, &b8, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_MISALIGNED);
  CHECK(mentions("a: data pointer"));
  fly_tensor bmis = mat(reinterpret_cast<char*>(kB) + 8, FLY_F8_E4M3, N, K, K);
  CHECK(fly_scaled_gemm(&a, nullptr, &bmis, &sb, nullptr, &c, nullptr, 0, nullptr) == FLY_ERROR_MISALIGNED);
  CHECK(mentions("b: data pointer"));
  // c overlapping an input; a workspace size without a pointer
  fly_tensor cov = mat(kA, FLY_BF16, M, N, N);
  CHECK(fly_scaled_gemm(&a, nullptr, &b8, &sb, nullptr, &cov, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("c"));
  CHECK(fly_scaled_gemm(&a, nullptr, &b8, &sb, nullptr, &c, nullptr, 64, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("workspace"));
}

TEST_CASE("scaled_gemm workspace query: the weight-only mode needs none", "[mx_decode][mx][args]") {
  const int64_t M = 8, N = 64, K = 128;
  fly_tensor a = mat(kA, FLY_BF16, M, K, K), b8 = mat(kB, FLY_F8_E4M3, N, K, K), b4 = mat(kB, FLY_F4_E2M1X2, N, K / 2, K / 2);
  fly_tensor c = mat(kC, FLY_BF16, M, N, N);
  size_t bytes = 99;
  CHECK(fly_scaled_gemm_workspace_size(&a, &b8, &c, &bytes) == FLY_SUCCESS);
  CHECK(bytes == 0);
  bytes = 99;
  CHECK(fly_scaled_gemm_workspace_size(&a, &b4, &c, &bytes) == FLY_SUCCESS);
  CHECK(bytes == 0);
  fly_tensor ch = mat(kC, FLY_F16, M, N, N);
  CHECK(fly_scaled_gemm_workspace_size(&a, &b8, &ch, &bytes) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("c: dtype fp16"));
  CHECK(bytes == 0);
  fly_tensor b4w = mat(kB, FLY_F4_E2M1X2, N, K, K);
  CHECK(fly_scaled_gemm_workspace_size(&a, &b4w, &c, &bytes) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("b: 128 columns"));
}
