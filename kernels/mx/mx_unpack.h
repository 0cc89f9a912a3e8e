// SPDX-License-Identifier: Apache-2.0
// E2M1 -> E4M3 widening of packed FP4 (torch.float4_e2m1fn_x2: element 2i in the low nibble of
// byte i), four values per byte permute: every E2M1 value is exact in E4M3. Host and device
// (test/cpu/test_mx_format.cpp checks it against mxe::e2m1_to_e4m3 for every 16-bit input).
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define FLY_MXU_HD __host__ __device__ __forceinline__
#else
#define FLY_MXU_HD inline
#endif

namespace fly::mxu {

// prmt's default mode on bytes {lo (0-3), hi (4-7)}, selector nibbles with bit 3 clear.
FLY_MXU_HD uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(lo, hi, sel);
#else
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (4 * i)) & 7;
    const uint32_t b = s < 4 ? (lo >> (8 * s)) & 0xFF : (hi >> (8 * (s - 4))) & 0xFF;
    r |= b << (8 * i);
  }
  return r;
#endif
}

// Four E2M1 codes (the nibbles of h's low 16 bits, element 0 lowest) -> four E4M3 bytes.
// Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 as E4M3 codes 0x00 0x30 0x38 0x3C 0x40 0x44 0x48 0x4C by
// one byte permute; the sign bits (bit 4i + 3 of nibble i) go to bit 8i + 7 by a second permute:
// s = h & 0x8888 holds nibble 1's and 3's signs at bit 7 of its bytes 0 and 1, s << 4 nibble 0's
// and 2's; bytes {t0, s0, t1, s1} (selector 0x5140) put nibble i's sign at bit 7 of byte i, and
// the mask drops the other sign bit each byte carries. About 6 ALU operations per 4 values.
constexpr uint32_t kMagLo = 0x3C383000u, kMagHi = 0x4C484440u;  // E4M3 codes of magnitudes 0..7
FLY_MXU_HD uint32_t e2m1x4_to_e4m3x4(uint32_t h, uint32_t lo = kMagLo, uint32_t hi = kMagHi) {
  const uint32_t mag = byte_perm(lo, hi, h & 0x7777u);
  const uint32_t s = h & 0x8888u;
  const uint32_t sg = byte_perm(s << 4, s, 0x5140u);
  return mag | (sg & 0x80808080u);
}

// The magnitude table of E2M1 * 2^-d (the k128 fold), 0 <= d <= 5: every nonzero code stays a
// normal E4M3 value, so its exponent field just drops by d (8 d in the byte); code 0 stays 0.
FLY_MXU_HD void e2m1_table_shifted(uint32_t d, uint32_t* lo, uint32_t* hi) {
  *lo = kMagLo - (d << 3) * 0x01010100u;
  *hi = kMagHi - (d << 3) * 0x01010101u;
}

// Eight packed bytes (16 codes) -> 16 E4M3 bytes (optionally through a shifted table).
FLY_MXU_HD void e2m1x16_to_e4m3x16(uint32_t w0, uint32_t w1, uint32_t (&o)[4], uint32_t lo = kMagLo,
                                   uint32_t hi = kMagHi) {
  o[0] = e2m1x4_to_e4m3x4(w0 & 0xFFFFu, lo, hi);
  o[1] = e2m1x4_to_e4m3x4(w0 >> 16, lo, hi);
  o[2] = e2m1x4_to_e4m3x4(w1 & 0xFFFFu, lo, hi);
  o[3] = e2m1x4_to_e4m3x4(w1 >> 16, lo, hi);
}

// Byte offset of (row r, byte k) in a 128B-swizzled K-major tile of 128-byte rows (1024-aligned
// base): the 16-byte chunk index is XORed with r mod 8, as TMA's SWIZZLE_128B writes it and the
// wgmma descriptor's swizzle mode 1 reads it.
FLY_MXU_HD uint32_t sw128_offset(uint32_t r, uint32_t k) {
  return r * 128u + ((((k >> 4) ^ (r & 7u)) & 7u) << 4) + (k & 15u);
}

}  // namespace fly::mxu
