// SPDX-License-Identifier: Apache-2.0
// The element type of a variant compiled for one dtype (tools/flygen defines FLY_DTYPE_IS_<D> for
// the "dtype" axis): fly::VariantElem is __half, __nv_bfloat16 or float. For the families with one
// dtype per image (rmsnorm, glu, rope); a unit without the define is a build error.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fly {
#if defined(FLY_DTYPE_IS_FP16)
using VariantElem = __half;
#elif defined(FLY_DTYPE_IS_BF16)
using VariantElem = __nv_bfloat16;
#elif defined(FLY_DTYPE_IS_FP32)
using VariantElem = float;
#else
#error "FLY_DTYPE_IS_{FP16,BF16,FP32} not defined: compile a generated unit (build/gen/*.cu), not the source"
#endif
}  // namespace fly
