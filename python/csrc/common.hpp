// SPDX-License-Identifier: Apache-2.0
// What every file of the flykernels._C extension shares: the dispatch counters and fallback log,
// device support, descriptors of torch tensors for the C ABI (include/flykernels/flykernels.h),
// allocation helpers, and the statuses that send a call back to the stock kernel.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>

#include "flykernels/flykernels.h"

namespace flyk {

// ---- ops we count: the eager overrides and the Inductor entry points ------------------------
enum OpId {
  kRmsNorm = 0, kTopk, kTopkValues, kMm, kAddmm, kSdpaFlash, kSdpaEfficient, kSdpaCudnn,
  kSdpaFlashBwd, kSdpaEfficientBwd, kGroupedMm, kScaledMm, kScaledMmV1, kGlu, kGluBwd, kRope, kRopeBwd,
  kAddRmsNorm, kAddRmsNormBwd, kMoeRoute, kMoeRouteBwd, kMoePermute, kMoePermuteBwd, kMoeUnpermute, kMoeUnpermuteBwd,
  kCrossEntropy, kCrossEntropyLoss, kMxLinear, kMxLinearMx, kOpCount
};
extern const char* const kOpNames[kOpCount];  // the keys of counts(): "rms_norm", "topk.values", ...

// Counts a call that ran the stock kernel and, with logging on, prints each (op, reason) once.
void note_fallback(OpId op, const char* reason);
void note_ours(OpId op);
uint64_t count_ours(OpId op);
uint64_t count_stock(OpId op);
void reset_counts();
void set_log(bool on);  // also forgets which reasons were printed

// ---- device ----------------------------------------------------------------------------------
// The raw cudaStream_t of torch's current stream on `device`, without CUDA headers.
void* current_stream(const c10::Device& device);
// nullptr when our kernels can run on this CUDA device, else the reason (a stable pointer). The
// answer is cached per device (the arch query is a driver round trip).
const char* device_unsupported(const c10::Device& device);

// ---- descriptors -----------------------------------------------------------------------------
fly_dtype fly_dtype_of(at::ScalarType t);
bool is_fly_float(at::ScalarType t);  // fp16, bf16, fp32
// "fp16" | "bf16" | "fp32" (the dtype field of a DecisionKey), "" for others.
const char* dtype_key(at::ScalarType t);
// A rank-2 view [rows, cols] with row stride `ld` and unit inner stride (the caller checked it).
fly_tensor desc_2d(const at::Tensor& t, int64_t rows, int64_t cols, int64_t ld);
// A contiguous vector of n elements (the caller checked the unit stride).
fly_tensor desc_1d(const at::Tensor& t, int64_t n);
// The tensor as it is: every size and stride (the library checks the layout it needs).
fly_tensor desc_nd(const at::Tensor& t);
// The [M, N] row view of t: its leading dimensions as M rows of one stride `ld` (the innermost
// non-trivial leading dimension's; each outer one tiles the next), last dimension unit-stride;
// false when they do not collapse that way.
bool row_view(const at::Tensor& t, int64_t* M, int64_t* ld);
// The [M, N] descriptor of t's row view (the caller checked row_view holds).
fly_tensor row_desc(const at::Tensor& t);

// ---- allocation ------------------------------------------------------------------------------
// An uninitialised tensor from torch's CUDA caching allocator (current device). Unlike at::empty it
// skips deterministic mode's NaN fill, a kernel per tensor: our kernels write every element.
at::Tensor empty_unfilled(c10::IntArrayRef sizes, at::ScalarType dtype);

// ---- statuses --------------------------------------------------------------------------------
// Library statuses that mean "valid for torch, not for us": the stock kernel takes the call.
// The library's own argument rules (head dims, strides, alignment, size limits) reach the
// overrides this way; they are not repeated on the torch side.
bool status_means_fallback(fly_status st);

// ---- stack helpers ---------------------------------------------------------------------------
std::optional<double> opt_double(const c10::IValue& v);
// True when a tensor's sizes or strides are symbolic (dynamic-shape tracing).
bool symbolic(const at::Tensor& t);

}  // namespace flyk
