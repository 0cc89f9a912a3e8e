// SPDX-License-Identifier: Apache-2.0
// The one table of the extension's PyTorch overrides. Each family file (rmsnorm.cpp, topk.cpp,
// attention.cpp, grouped_mm.cpp, scaled_mm.cpp) contributes its rows through the function declared
// below; enable_op / disable_op / op_enabled (common.cpp) iterate the table.
//
// A row (Override) is one switch of flykernels.torch ("rms_norm", "sdpa", ...); its Impls are the
// boxed kernels it installs, one per (aten op, overload, dispatch key). Enabling captures, per Impl,
// the kernel registered before ours for that key (Impl::prev) and registers ours through a
// torch::Library per dispatch key; disabling destroys the libraries, which makes the captured
// kernels current again. An override that does not take a call runs Impl::prev, so everything we
// do not cover behaves exactly as stock.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKey.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace flyk {

struct Impl;

// Our boxed kernel: `self` is its table entry (where the previous kernel is stored).
using BoxedOverride = void (*)(const Impl& self, const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                               torch::jit::Stack* stack);

struct Impl {
  const char* op = nullptr;        // schema name, "aten::topk"
  const char* overload = "";       // "" or e.g. "values"
  c10::DispatchKey key = c10::DispatchKey::CUDA;  // CUDA, or Meta (shape inference)
  BoxedOverride kernel = nullptr;
  // The kernel registered for (op, key) before ours, captured at enable: the fallback.
  std::optional<c10::SafeKernelFunction> prev;

  // Runs the previous kernel on the stack (the stock kernel, or whatever was registered before us).
  void call_prev(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) const {
    prev->callBoxed(op, ks, stack);
  }
};

struct Override {
  const char* family = nullptr;  // the name enable_op takes
  std::vector<Impl> impls;
  const char* file = nullptr;    // the family's source file (__FILE__), named in the dispatcher's table
  // Set while enabled (under the registry's lock): one library per dispatch key of impls.
  std::vector<std::unique_ptr<torch::Library>> libs;
};

// The rows of each family, in the order enable_op's error message lists them.
std::vector<Override> rmsnorm_overrides();
std::vector<Override> topk_overrides();
std::vector<Override> attention_overrides();
std::vector<Override> grouped_mm_overrides();
std::vector<Override> scaled_mm_overrides();

// The table (built once; its entries never move, so kernels may keep pointers to them).
std::vector<Override>& override_table();

// Installs / removes the override named `family`; an unknown name raises ValueError listing the
// table's names.
bool enable_op(const std::string& family);
void disable_op(const std::string& family);
bool op_enabled(const std::string& family);
std::vector<std::string> override_names();

}  // namespace flyk
