// SPDX-License-Identifier: Apache-2.0
// Ours or stock, per call: the never-slower decision of every override (docs/pytorch.md,
// "Decisions"). An override first checks eligibility; an eligible call then asks decide() with
// its DecisionKey, and runs the stock kernel unless the answer is kOurs.
//
// Where answers come from, first match wins:
//   forced    a force, this thread's else the process's (flykernels.torch.forced("ours"|"stock"), the tuner's timing runs)
//   tuned     a decision row with exactly this key (rows are loaded from Python: the shipped file,
//             FLYKERNELS_TUNING_DB, the autotune cache); ours where its row measured it faster
//   autotune  FLYKERNELS_AUTOTUNE=1: the first call of an unseen key times both through the Python
//             callback (never while a CUDA graph is captured) and caches the answer
//   nearest   the nearest row of the same (op, dtype, layout) by log2 distance of the key; ours
//             only where that row measured ours at least kNearestMargin faster
//   no row    stock
//
// Keys (op, dtype, layout, k0..k3), one per override, most significant feature first:
//   rms_norm             dtype of x; "w" | "nw" (weight or none); N, M
//   topk                 "fp32" | "fp32_det" (deterministic mode); "largest" | "smallest"; C, k, R
//   sdpa_flash | sdpa_efficient | sdpa_cudnn, and sdpa_flash_bwd | sdpa_efficient_bwd
//                        dtype; "causal" | "full"; Sk, Sq, B * Hq, D
//   grouped_mm           dtype; "b_kn" | "b_nk" (3-D B, N- or K-contiguous) | "ragged_k" (2-D x 2-D); N, K, T, G
//   mm | addmm           dtype; "nn" | "nt" | "tn" | "tt"; N, K, M
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace flyk {

struct DecisionKey {
  std::string op;      // one of the names above
  std::string dtype;   // "fp16" | "bf16" | "fp32" (| "fp32_det")
  std::string layout;  // categorical part of the key: must match exactly
  int64_t k[4] = {0, 0, 0, 0};

  std::string str() const;  // "rms_norm bf16 w [4096, 8192, 0, 0]"
};

// What timing both would run: the op (schema name and overload) and its arguments, called twice
// through the dispatcher under forced("ours") and forced("stock"). Built only when autotune needs it.
struct TimingCall {
  std::string op;        // e.g. "aten::topk"
  std::string overload;  // e.g. ""
  std::vector<c10::IValue> args;
};

enum class Choice { kOurs, kStock };

struct Decided {
  Choice choice = Choice::kStock;
  std::string rule;  // "tuned: ours 1.31x", "tuned: stock, ours 0.93x", "autotune: ...", "nearest: ...", "no row: stock", "forced: ours"
};

inline constexpr double kNearestMargin = 1.02;

// The decision for an eligible call. `timing` is called only when autotune must measure.
Decided decide(const DecisionKey& key, const std::function<TimingCall()>& timing = {});

// The thread's force: 0 none, 1 ours, 2 stock (set by the Python side around timing runs).
int forced();
void set_forced(int mode);
void set_forced_process(int mode);

// Shorthand for overrides: true when the call should run ours (and logs the rule once per key
// with FLYKERNELS_LOG=info).
bool take_ours(const DecisionKey& key, const std::function<TimingCall()>& timing = {});

// Boxed overrides: the last n IValues of the stack as a TimingCall of `op`.
TimingCall timing_call(const char* op, const char* overload, const torch::jit::Stack& stack, size_t n);

// Adds this module's Python bindings (rows, device tag, autotune callback, force, decide, log) to
// the extension module; called from the module definition.
void register_decision_bindings(pybind11::module_& m);
}  // namespace flyk
