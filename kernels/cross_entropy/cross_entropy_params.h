// SPDX-License-Identifier: Apache-2.0
// Kernel parameters of cross_entropy (kernels/cross_entropy/cross_entropy.cu), shared by the
// launcher (host) and the kernel (device).
#pragma once
#include <stdint.h>

struct CrossEntropyParams {
  const void* logits;     // [M, V], row stride ldl (elements)
  void* dlogits;          // [M, V], row stride ldd, or nullptr (loss only); may be logits itself
  const int64_t* labels;  // [M]
  float* loss;            // [M]: lse - logit[label]; 0 for ignored rows, NaN for labels outside [0, V)
  float* lse;             // [M] or nullptr: logsumexp of the row (0 for ignored rows)
  int64_t M, V;
  int64_t cols;           // 16-byte units per row: ceil(V / elements per 16 bytes)
  int64_t ldl, ldd;
  int64_t ignore_index;
  float scale;            // dlogits = (softmax - onehot(label)) * scale
  int32_t vec;            // 1: every row of logits and dlogits 16-byte aligned, V a whole number of
                          // units; 0: element loads, the row end masked
  int32_t smem_units;     // units of a row past the register cache that stay in dynamic shared
                          // memory between the two passes (the launcher sizes it; 0: none)
};
