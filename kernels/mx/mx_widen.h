// The BF16-widening MX GEMM (kernels/mx/mxfp_widen.cu, docs/mxfp.md "BF16-widening design"): its
// shared-memory plan, the k permutation that lets one 16-byte load feed a thread's A fragment, the
// exact E4M3 -> BF16 widening with the block scale, and the per-stage exponent shift that keeps
// every widened value a normal BF16. Host and device, plain integer arithmetic (test/cpu checks it).
#pragma once
#include <stdint.h>

#include "mx/mx_wgmma_params.h"

namespace fly::mxw::widen {

constexpr int kBN = 128;        // CTA tile 128 x 128: two consumer warpgroups of 64 rows
constexpr int kRows = kBM + kBN;  // scale rows of a stage: A's 128, then B's 128
constexpr int kWBufs = 3;       // widened B tiles in flight (written at stage i, read by wgmma i)

// One ring stage: the FP8 tiles [rows][128 B] (128B-swizzled, as TMA lands them) or MXFP4's packed
// tiles [rows][64 B] (unswizzled) at the same offsets; the decoded scales (float [4][kRows], for the
// rare exact fallback); the widening multipliers (bf16x2 words [4][kRows]); the stage's flag.
constexpr int kOffA = 0;
constexpr int kOffB = kBM * 128;
constexpr int kOffScale = kOffB + kBN * 128;
constexpr int kOffMul = kOffScale + 4 * kRows * 4;
constexpr int kOffFlag = kOffMul + 4 * kRows * 4;
constexpr int kStage = (kOffFlag + 16 + 1023) / 1024 * 1024;
// A widened B tile: two k64 halves [kBN][128 B] (BF16, 128B-swizzled, the wgmma B operand).
constexpr int kWHalf = kBN * 128;
constexpr int kWBuf = 2 * kWHalf;
constexpr int kStages = 3;
// Dynamic shared memory: 1024 bytes of alignment slack, the ring, the widened B tiles, 2 mbarriers
// per stage, the producer's reduction scratch ([2 parities][4 warps][4 words]), the consumers' NaN
// column flags ([2 k64 halves][kBN] words).
constexpr int smem_bytes() {
  return 1024 + kStages * kStage + kWBufs * kWBuf + kStages * 2 * 8 + 2 * 4 * 4 * 4 + 2 * kBN * 4;
}
static_assert(smem_bytes() <= 232448, "fits the 227 KiB of dynamic shared memory");

// The k permutation inside each 64-element k group. Thread t (lane % 4) of a quad holds, for k16
// step s (0..3), the A fragment slots {2t, 2t + 1} (a0 / a1) and {2t + 8, 2t + 9} (a2 / a3); it fills
// them from 16 consecutive logical k values 16t .. 16t + 15 (one 16-byte load of E4M3 bytes):
// logical 16t + 4s + e (e = 0..3) sits at MMA slot 16s + 2t + (e & 1) + 8 (e >> 1). The widened B
// rows are written in the same order, so each product still pairs A's and B's k.
FLY_MXW_HD int slot_of_logical(int l) {
  const int t = l >> 4, s = (l >> 2) & 3, e = l & 3;
  return 16 * s + 2 * t + (e & 1) + 8 * (e >> 1);
}
// The scale block (0..3 of the 128-element stage) of logical k group (h, t): 2h + (t >= 2).
FLY_MXW_HD int block_of(int h, int t) { return 2 * h + (t >> 1); }

// Exponent window of a widened value q * 2^E (q a nonzero element, E the block's scale exponent
// after the stage's shift): q * 2^E a normal BF16 (E >= elo) and the multiplier 2^(E + 112) a BF16
// (E <= 15). E4M3: |q| >= 2^-9; E2M1: |q| >= 0.5.
constexpr int kEhi = 15;
FLY_MXW_HD int elo_of(bool fp4) { return fp4 ? -125 : -117; }

// The stage's exponent shift t: A's exponents move by +t and B's by -t (every product keeps its
// value) so that both land in [elo, kEhi]. min / max: the stage's valid scale bytes other than 0xFF
// (min > max: none). Prefers t = 0. safe = false: no shift fits (the stage takes the exact fallback).
struct Shift {
  int t;
  bool safe;
};
FLY_MXW_HD Shift choose_shift(int min_a, int max_a, int min_b, int max_b, bool fp4) {
  const int elo = elo_of(fp4);
  int lo = -1024, hi = 1024;
  if (min_a <= max_a) {
    lo = lo > elo - (min_a - 127) ? lo : elo - (min_a - 127);
    hi = hi < kEhi - (max_a - 127) ? hi : kEhi - (max_a - 127);
  }
  if (min_b <= max_b) {
    lo = lo > (max_b - 127) - kEhi ? lo : (max_b - 127) - kEhi;
    hi = hi < (min_b - 127) - elo ? hi : (min_b - 127) - elo;
  }
  if (lo > hi) return Shift{0, false};
  return Shift{0 < lo ? lo : 0 > hi ? hi : 0, true};
}

// The widening multiplier of a block (bf16x2, both halves equal): 2^(E + 112) for a scale byte b
// shifted by `shift` (E = b - 127 + shift inside the window), NaN for 0xFF, 0 for a block that is
// not there (rows past M / N, blocks past K) or a stage that takes the fallback.
FLY_MXW_HD uint32_t multiplier(uint32_t b, int shift, bool present) {
  if (!present) return 0u;
  if (b == 0xFFu) return 0x7FC07FC0u;
  const uint32_t f = uint32_t(int(b) + shift - 127 + 112 + 127) << 7;
  return f | (f << 16);
}

// Two E4M3 values as an FP16 pair (cvt.rn.f16x2.e4m3x2: exact, normal or zero) -> the BF16 pair of
// q * 2^-112: the FP16 exponent field becomes the BF16 one (bias 15 -> 127), the 3-bit mantissa
// moves to the top of BF16's 7 bits. Exact for every E4M3 code (E4M3's subnormals are FP16 normals).
FLY_MXW_HD uint32_t f16x2_to_bf16x2_m112(uint32_t h) { return ((h & 0x7FFF7FFFu) >> 3) | (h & 0x80008000u); }
// Every widened value of a finite element has its low 4 mantissa bits clear (E4M3 has 3 mantissa
// bits; the multiplier is a power of two inside the window); an E4M3 NaN code becomes FP16's
// canonical NaN 0x7FFF, which maps to a finite BF16 with them set, as does a NaN multiplier's
// canonical NaN result. The kernel ORs its widened words and marks those rows and columns NaN.
constexpr uint32_t kNanBits = 0x000F000Fu;

}  // namespace fly::mxw::widen
