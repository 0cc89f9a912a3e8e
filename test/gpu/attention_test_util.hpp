// SPDX-License-Identifier: Apache-2.0
// Host helpers the attention forward and backward GPU tests share: 16-bit values as raw bits,
// [B, H, S, D] views over padded rows, and a case's one-line description.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "flykernels/flykernels.h"

namespace attn_test {

inline float to_float(uint16_t bits, fly_dtype dt) {
  if (dt == FLY_F16) { __half h; std::memcpy(&h, &bits, 2); return __half2float(h); }
  __nv_bfloat16 b; std::memcpy(&b, &bits, 2); return __bfloat162float(b);
}
inline uint16_t from_float(float f, fly_dtype dt) {
  uint16_t bits;
  if (dt == FLY_F16) { __half h = __float2half(f); std::memcpy(&bits, &h, 2); }
  else { __nv_bfloat16 b = __float2bfloat16(f); std::memcpy(&bits, &b, 2); }
  return bits;
}

// A [B, H, S, D] view over a buffer with rows of `ld` elements: BHSD, or BSHD memory (c.bshd).
struct Layout {
  int64_t sb, sh, ss, elems;
};
template <class Case>
Layout layout(const Case& c, int64_t H, int64_t S, int64_t ld) {
  if (c.bshd) return {S * H * ld, ld, H * ld, c.B * S * H * ld};
  return {H * S * ld, S * ld, ld, c.B * H * S * ld};
}

template <class Case>
std::string describe(const Case& c) {
  return std::string(c.dt == FLY_BF16 ? "bf16" : "fp16") + " B" + std::to_string(c.B) + " Hq" + std::to_string(c.Hq) +
         " Hkv" + std::to_string(c.Hkv) + " Sq" + std::to_string(c.Sq) + " Sk" + std::to_string(c.Sk) + " D" +
         std::to_string(c.D) + (c.causal ? " causal" : "") + (c.bshd ? " bshd" : " bhsd") + " ld" + std::to_string(c.ld) +
         (c.force ? std::string(" force ") + c.force : "");
}

}  // namespace attn_test
