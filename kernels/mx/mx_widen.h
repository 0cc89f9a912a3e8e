// SPDX-License-Identifier: Apache-2.0
// The widening MX GEMM (kernels/mx/mxfp_widen.cu, docs/mxfp.md "BF16-widening design"): its
// shared-memory plan, the k permutation that lets one 16-byte load feed a thread's A fragment, the
// per-tile plan (FP16 / BF16 path, per-operand exponent shifts that keep every widened value a
// normal number), the multipliers and the exact FP16 -> BF16 re-bias. Host and device, plain
// integer arithmetic (test/cpu/test_mx_widen.cpp checks it).
#pragma once
#include <stdint.h>

#include "mx/mx_wgmma_params.h"

namespace fly::mxw::widen {

constexpr int kBN = 128;        // CTA tile 128 x 128: two consumer warpgroups of 64 rows
constexpr int kRows = kBM + kBN;  // scale rows of a stage: A's 128, then B's 128
constexpr int kWBufs = 3;       // widened B tiles in flight (written at stage i, read by wgmma i)

// The shared-memory plan of a tile bn columns wide (128; 64 / 32 for the swapped decode variants,
// whose smaller B parts leave room for more ring stages).
// One ring stage: the FP8 tiles [rows][128 B] (128B-swizzled, as TMA lands them) or MXFP4's packed
// tiles [rows][64 B] (unswizzled) at the same offsets; the decoded scales (float [4][kRows], for the
// rare exact fallback); the widening multipliers (16-bit pairs [4][kRows]); the tile's path and rescale.
// A widened B tile: two k64 halves [bn][128 B] (BF16, 128B-swizzled, the wgmma B operand).
// Dynamic shared memory: 1024 bytes of alignment slack, the ring, the widened B tiles, 2 mbarriers
// per stage, the producer's reduction scratch ([2 parities][4 warps][4 words]), the consumers' NaN
// column flags (256 words).
template <int BN>
struct Layout {
  static constexpr int kOffA = 0;
  static constexpr int kOffB = kBM * 128;
  static constexpr int kOffScale = kOffB + BN * 128;
  static constexpr int kOffMul = kOffScale + 4 * kRows * 4;
  static constexpr int kOffFlag = kOffMul + 4 * kRows * 4;
  static constexpr int kStage = (kOffFlag + 16 + 1023) / 1024 * 1024;
  static constexpr int kWHalf = BN * 128;
  static constexpr int kWBuf = 2 * kWHalf;
  static constexpr int kStages = BN == 128 ? 3 : BN == 64 ? 5 : 6;
  static constexpr int smem_bytes() {
    return 1024 + kStages * kStage + kWBufs * kWBuf + kStages * 2 * 8 + 2 * 4 * 4 * 4 + 2 * kBN * 4;
  }
  static_assert(smem_bytes() <= 232448, "fits the 227 KiB of dynamic shared memory");
};
// The 128-wide plan under its old names (the launcher's and the tests' default).
constexpr int kOffA = Layout<kBN>::kOffA;
constexpr int kOffB = Layout<kBN>::kOffB;
constexpr int kOffScale = Layout<kBN>::kOffScale;
constexpr int kOffMul = Layout<kBN>::kOffMul;
constexpr int kOffFlag = Layout<kBN>::kOffFlag;
constexpr int kStage = Layout<kBN>::kStage;
constexpr int kWHalf = Layout<kBN>::kWHalf;
constexpr int kWBuf = Layout<kBN>::kWBuf;
constexpr int kStages = Layout<kBN>::kStages;
constexpr int smem_bytes() { return Layout<kBN>::smem_bytes(); }
// The plan's dynamic shared memory for a variant's bn (0 for a width the kernel does not build).
constexpr int smem_bytes_for(int bn) {
  return bn == 128 ? Layout<128>::smem_bytes() : bn == 64 ? Layout<64>::smem_bytes() : bn == 32 ? Layout<32>::smem_bytes() : 0;
}

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

// Each tile takes one of three paths, chosen from its scales (choose_plan):
// - kF16: elements widened to FP16, q * 2^(E + ta) (A) and q * 2^(E + tb) (B), FP16 wgmma; the
//   cvt from E4M3 and one FP16 multiply per pair of elements. FP16's exponent range is narrow, so
//   this needs every scale exponent of the tile's A rows (B columns) inside a window of
//   kF16Span[fmt] binades.
// - kBf16: the same in BF16 (a window of about 130 binades per operand): an integer re-bias of
//   the FP16 pair to BF16 bits, then a BF16 multiply.
// - kScalar: an operand's scales span more than BF16 can hold (e.g. 2^-127 beside 2^127 with
//   nonzero elements): exact FP32 dot products on the CUDA cores.
// The shifts are independent (ta for A, tb for B: every widened value stays a normal number) and
// the epilogue multiplies the FP32 accumulators by 2^-(ta + tb), exact powers of two.
enum Path : int { kScalar = 0, kBf16 = 1, kF16 = 2 };
// Window [lo, hi] of the shifted exponent E' = E + t of a widened value q * 2^E':
//   FP16: q * 2^E' a normal FP16 (>= 2^-14, < 65504): E4M3 (2^-9 <= |q| <= 448) E' in [-5, 7];
//         E2M1 (0.5 <= |q| <= 6) E' in [-13, 13]. The multiplier 2^E' is an FP16.
//   BF16: q * 2^E' a normal BF16 (E4M3 E' >= -117, E2M1 >= -125) and the multiplier 2^(E' + 112)
//         of the re-biased pair (q * 2^-112) a BF16: E' <= 15.
FLY_MXW_HD int win_lo(bool fp4, bool f16) { return f16 ? (fp4 ? -13 : -5) : (fp4 ? -125 : -117); }
FLY_MXW_HD int win_hi(bool fp4, bool f16) { return f16 ? (fp4 ? 13 : 7) : 15; }

struct Plan {
  int path;    // Path
  int ta, tb;  // exponent shifts of A's and B's scales
};
// The tile's plan from the min / max of its valid scale bytes other than 0xFF (min > max: none):
// the narrowest path whose window holds each operand's span, each operand's largest exponent
// shifted to the window's top.
FLY_MXW_HD Plan choose_plan(int min_a, int max_a, int min_b, int max_b, bool fp4) {
  for (int f16 = 1; f16 >= 0; --f16) {
    const int lo = win_lo(fp4, f16 != 0), hi = win_hi(fp4, f16 != 0);
    const bool ok_a = min_a > max_a || max_a - min_a <= hi - lo;
    const bool ok_b = min_b > max_b || max_b - min_b <= hi - lo;
    if (ok_a && ok_b)
      return Plan{f16 ? kF16 : kBf16, min_a > max_a ? 0 : hi - (max_a - 127), min_b > max_b ? 0 : hi - (max_b - 127)};
  }
  return Plan{kScalar, 0, 0};
}

// The widening multiplier of a block (two equal halves) for scale byte b shifted by t
// (E' = b - 127 + t inside the path's window): FP16 2^E'; BF16 2^(E' + 112) (the re-biased pair is
// q * 2^-112). NaN for 0xFF; 0 for a block that is not there (rows past M / N, blocks past K).
FLY_MXW_HD uint32_t multiplier(uint32_t b, int t, bool present, bool f16) {
  if (!present) return 0u;
  if (b == 0xFFu) return f16 ? 0x7E007E00u : 0x7FC07FC0u;
  const int e = int(b) - 127 + t;
  const uint32_t f = f16 ? uint32_t(e + 15) << 10 : uint32_t(e + 112 + 127) << 7;
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
