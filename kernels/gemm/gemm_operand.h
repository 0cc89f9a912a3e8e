// SPDX-License-Identifier: Apache-2.0
// Operand traits of the GEMM family, shared by host and device: what each element type the
// kernels (will) take means for the layout math. Every size the planner and the kernel derive
// from a dtype comes from here, in bytes, so a new dtype is one specialisation, and a dtype
// without one is a compile error instead of silently running as another.
// Plain C++ (no CUDA types): the device-side element types live in gemm_config.cuh.
#pragma once

#include <cuda.h>  // CUtensorMapDataType
#include <stdint.h>

namespace fly::gemm {

// The dtype of the A and B operands (C has the same 16-bit type for the dense kernels).
enum class Dtype : int32_t { kFp16 = 0, kBf16 = 1, kE4m3 = 2, kE5m2 = 3 };

// One k block is one 128-byte row of a 128B-swizzled shared-memory tile: 64 16-bit elements,
// 128 8-bit ones. Tiles, TMA boxes and descriptor strides are counted in these rows.
constexpr int kRowBytes = 128;

template <Dtype D>
struct OperandTraits;  // no definition: a dtype without traits does not compile

template <>
struct OperandTraits<Dtype::kFp16> {
  static constexpr int kBytes = 2;
  static constexpr int kMmaK = 16;  // k of one wgmma (m64nNk16)
  static constexpr bool kKMajorOnly = false;  // wgmma takes 16-bit operands MN-major too
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  static constexpr const char* kName = "fp16";
};
template <>
struct OperandTraits<Dtype::kBf16> {
  static constexpr int kBytes = 2;
  static constexpr int kMmaK = 16;
  static constexpr bool kKMajorOnly = false;
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  static constexpr const char* kName = "bf16";
};
// FP8 (the MXFP8 issue builds on these): wgmma is m64nNk32 and reads both operands K-major.
template <>
struct OperandTraits<Dtype::kE4m3> {
  static constexpr int kBytes = 1;
  static constexpr int kMmaK = 32;
  static constexpr bool kKMajorOnly = true;
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  static constexpr const char* kName = "e4m3";
};
template <>
struct OperandTraits<Dtype::kE5m2> {
  static constexpr int kBytes = 1;
  static constexpr int kMmaK = 32;
  static constexpr bool kKMajorOnly = true;
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  static constexpr const char* kName = "e5m2";
};

// Elements of one 128-byte k block row, and wgmma k steps per k block.
template <Dtype D>
constexpr int k_block_elems() { return kRowBytes / OperandTraits<D>::kBytes; }
template <Dtype D>
constexpr int mma_per_k_block() { return k_block_elems<D>() / OperandTraits<D>::kMmaK; }

// Run-time forms for the host planner, which sees the dtype as a value: a field of the traits
// of whichever dtype `d` is.
template <class F>
constexpr auto with_traits(Dtype d, F f) {
  switch (d) {
    case Dtype::kFp16: return f(OperandTraits<Dtype::kFp16>{});
    case Dtype::kBf16: return f(OperandTraits<Dtype::kBf16>{});
    case Dtype::kE4m3: return f(OperandTraits<Dtype::kE4m3>{});
    default: return f(OperandTraits<Dtype::kE5m2>{});
  }
}
inline constexpr int elem_bytes(Dtype d) {
  return with_traits(d, [](auto t) { return decltype(t)::kBytes; });
}
inline constexpr CUtensorMapDataType tma_dtype(Dtype d) {
  return with_traits(d, [](auto t) { return decltype(t)::kTma; });
}

static_assert(k_block_elems<Dtype::kBf16>() == 64 && mma_per_k_block<Dtype::kBf16>() == 4, "16-bit k block");
static_assert(k_block_elems<Dtype::kE4m3>() == 128 && mma_per_k_block<Dtype::kE4m3>() == 4, "8-bit k block");
static_assert(elem_bytes(Dtype::kBf16) == 2 && elem_bytes(Dtype::kE5m2) == 1, "run-time traits");

}  // namespace fly::gemm
