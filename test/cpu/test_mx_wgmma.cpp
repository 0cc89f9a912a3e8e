// SPDX-License-Identifier: Apache-2.0
// Host-checkable pieces of the wgmma MX GEMM (kernels/mx/mxfp_wgmma.cu): the E2M1 -> E4M3
// widening by byte permute (every 16-bit input against mxe::e2m1_to_e4m3), the 128B-swizzle
// offsets the widened tiles are written at (a bijection that keeps 16-byte chunks whole and
// matches TMA's SWIZZLE_128B pattern), the accumulator fragment map the promotion and the
// epilogue index with (each of the 64 x N cells exactly once), the persistent raster (every
// tile exactly once), and the shared-memory plan (fits, alignment).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "catch_compat.hpp"
#include "gemm/gemm_mx.h"
#include "mx/mx_encode.h"
#include "mx/mx_unpack.h"
#include "mx/mx_wgmma_params.h"

TEST_CASE("mxw: E2M1x4 -> E4M3x4 by byte permute equals the per-code table for every input", "[mx][mxw]") {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t got = fly::mxu::e2m1x4_to_e4m3x4(h);
    uint32_t want = 0;
    for (int i = 0; i < 4; ++i) want |= uint32_t(fly::mxe::e2m1_to_e4m3(uint8_t((h >> (4 * i)) & 0xF))) << (8 * i);
    bad += got != want;
  }
  CHECK(bad == 0);
  // upper bits of the argument are ignored (the kernel passes w >> 16 and w & 0xFFFF)
  CHECK(fly::mxu::e2m1x4_to_e4m3x4(0xABCD0000u | 0x1234u) == fly::mxu::e2m1x4_to_e4m3x4(0x1234u));
  // 8 packed bytes -> 16 bytes in element order (element 2i low nibble of byte i)
  uint8_t packed[8];
  for (int i = 0; i < 8; ++i) packed[i] = uint8_t(0x10 * ((2 * i + 1) & 0xF) + ((2 * i) & 0xF));
  uint32_t w0, w1, o[4];
  std::memcpy(&w0, packed, 4);
  std::memcpy(&w1, packed + 4, 4);
  fly::mxu::e2m1x16_to_e4m3x16(w0, w1, o);
  uint8_t out[16];
  std::memcpy(out, o, 16);
  for (int e = 0; e < 16; ++e) CHECK(out[e] == fly::mxe::e2m1_to_e4m3(uint8_t(e & 0xF)));
}

TEST_CASE("mxw: the k128 fold's shifted tables give E2M1 * 2^-d exactly, d <= kFoldMaxShift", "[mx][mxw]") {
  for (uint32_t d = 0; d <= uint32_t(fly::mxw::kFoldMaxShift); ++d) {
    uint32_t lo, hi;
    fly::mxu::e2m1_table_shifted(d, &lo, &hi);
    for (uint32_t c = 0; c < 16; ++c) {
      const uint32_t h = c | (c << 4) | (c << 8) | (c << 12);
      const uint32_t out = fly::mxu::e2m1x4_to_e4m3x4(h, lo, hi);
      for (int i = 0; i < 4; ++i) {
        const uint8_t b = uint8_t(out >> (8 * i));
        INFO("d " << d << " code " << c);
        CHECK(double(fly::mx::decode_e4m3(b)) == std::ldexp(double(fly::mx::decode_e2m1(uint8_t(c))), -int(d)));
        if ((c & 7) != 0) CHECK((b & 0x78) != 0);  // still a normal E4M3 code
      }
    }
  }
  uint32_t lo, hi;
  fly::mxu::e2m1_table_shifted(0, &lo, &hi);
  CHECK(lo == fly::mxu::kMagLo);
  CHECK(hi == fly::mxu::kMagHi);
}

TEST_CASE("mxw: 128B-swizzle offsets are a chunk-preserving bijection with TMA's pattern", "[mx][mxw]") {
  const int rows = 256;
  std::vector<int> seen(size_t(rows) * 128, 0);
  for (uint32_t r = 0; r < uint32_t(rows); ++r)
    for (uint32_t k = 0; k < 128; ++k) {
      const uint32_t off = fly::mxu::sw128_offset(r, k);
      REQUIRE(off < uint32_t(rows) * 128);
      ++seen[off];
      CHECK(off / 128 == r);                            // stays in its 128-byte row
      CHECK(off % 16 == k % 16);                        // 16-byte chunks stay whole
      CHECK((off % 128) / 16 == ((k / 16) ^ (r % 8)));  // chunk index XOR row mod 8 (SWIZZLE_128B)
    }
  int bad = 0;
  for (int v : seen) bad += v != 1;
  CHECK(bad == 0);
}

TEST_CASE("mxw: the accumulator fragment map covers the 64 x N block exactly once", "[mx][mxw]") {
  for (int n : {32, 64, 128}) {
    std::vector<int> cnt(size_t(64) * n, 0);
    for (int ct = 0; ct < 128; ++ct)
      for (int i = 0; i < n / 2; ++i) {
        const int r = fly::mxw::acc_row(ct, i), c = fly::mxw::acc_col(ct, i);
        REQUIRE(r >= 0);
        REQUIRE(r < 64);
        REQUIRE(c >= 0);
        REQUIRE(c < n);
        ++cnt[size_t(r) * n + c];
        // the kernel's promotion reads sa at acc_row(ct, 0) (+8 for i % 4 >= 2) and the sb pair at
        // acc_col(ct, 4 (i / 4)) (+1 for odd i)
        CHECK(r == fly::mxw::acc_row(ct, 0) + ((i % 4) >= 2 ? 8 : 0));
        CHECK(c == fly::mxw::acc_col(ct, 4 * (i / 4)) + (i % 2));
      }
    int bad = 0;
    for (int v : cnt) bad += v != 1;
    INFO("n " << n);
    CHECK(bad == 0);
  }
}

TEST_CASE("mxw: the persistent raster visits every tile once", "[mx][mxw]") {
  for (int tm : {1, 2, 7, 8, 9, 33})
    for (int tn : {1, 3, 64})
      for (int strip : {1, 8}) {
        const int s = tm < strip ? tm : strip;
        std::set<std::pair<int, int>> got;
        for (int t = 0; t < tm * tn; ++t) {
          const fly::mxw::Tile x = fly::mxw::tile_of(tm, tn, s, t);
          REQUIRE(x.tm >= 0);
          REQUIRE(x.tm < tm);
          REQUIRE(x.tn >= 0);
          REQUIRE(x.tn < tn);
          got.insert({x.tm, x.tn});
        }
        INFO("tiles " << tm << " x " << tn << " strip " << s);
        CHECK(got.size() == size_t(tm * tn));
      }
}

TEST_CASE("mxw: the shared-memory plan fits and keeps the swizzle atoms aligned", "[mx][mxw]") {
  using namespace fly::mxw;
  for (int bn : {32, 64, 128}) {
    INFO("bn " << bn);
    CHECK(smem_bytes(bn) <= 232448);
    CHECK(smem_bytes(bn, true) <= 232448);
    CHECK(stage_bytes(bn, true) % 1024 == 0);
    CHECK(fold_bytes(bn, true) >= (kBM + bn) * 8 + 4);
    CHECK(stage_bytes(bn) % 1024 == 0);
    CHECK(a_bytes() % 1024 == 0);
    CHECK((a_bytes() + b_bytes(bn)) % 1024 == 0);
    CHECK((a_bytes() + b_bytes(bn) + sa_bytes() + sb_bytes(bn)) % 1024 == 0);
    CHECK(raw_bytes(bn) == (kBM + bn) * kKStep / 2);
    CHECK(stages(bn) >= 4);
  }
  CHECK(kProducerRegs * 128 + kConsumerRegs * 256 <= 65536);
  CHECK(sizeof(Params) % 64 == 0);  // CUtensorMap members: 64-byte aligned by value
}
