// The flykernels._C extension: boxed CUDA-key overrides of aten ops and Inductor GEMM entry
// points, each calling libflykernels only through its C ABI (include/flykernels/flykernels.h).
// Every override checks eligibility first and otherwise calls the kernel that was registered
// before it (captured at registration), so what we do not cover behaves exactly as stock.
#include <torch/extension.h>
#include <torch/library.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "flykernels/flykernels.h"

namespace {

// ---- ops we override, their counters and switches -------------------------------------------
enum OpId {
  kRmsNorm = 0, kTopk, kTopkValues, kMm, kAddmm, kSdpaFlash, kSdpaEfficient, kSdpaCudnn,
  kSdpaFlashBwd, kSdpaEfficientBwd, kGroupedMm, kScaledMm, kScaledMmV1, kOpCount
};
const char* const kOpNames[kOpCount] = {"rms_norm",       "topk",       "topk.values",       "mm",
                                        "addmm",          "sdpa_flash", "sdpa_efficient",    "sdpa_cudnn",
                                        "sdpa_flash_bwd", "sdpa_efficient_bwd", "grouped_mm",
                                        "scaled_mm",      "scaled_mm_v1"};

struct OpCounts {
  std::atomic<uint64_t> ours{0};
  std::atomic<uint64_t> stock{0};
};
OpCounts g_counts[kOpCount];

std::atomic<bool> g_log{false};
std::mutex g_log_mutex;
std::set<std::string> g_logged_reasons;

// Counts a fallback and, with logging on, prints each (op, reason) once.
void note_fallback(OpId op, const char* reason) {
  g_counts[op].stock.fetch_add(1, std::memory_order_relaxed);
  if (!g_log.load(std::memory_order_relaxed)) return;
  std::string key = std::string(kOpNames[op]) + ": " + reason;
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (g_logged_reasons.insert(key).second)
    std::fprintf(stderr, "flykernels: %s -> stock kernel (%s)\n", kOpNames[op], reason);
}

void note_ours(OpId op) { g_counts[op].ours.fetch_add(1, std::memory_order_relaxed); }

// ---- device support, cached per device (the arch query is a driver round trip) ---------------
constexpr int kMaxDevices = 64;
std::array<std::atomic<int8_t>, kMaxDevices> g_device_ok{};  // 0 unknown, 1 yes, -1 no
std::mutex g_device_mutex;
std::array<std::string, kMaxDevices> g_device_reason;

// The raw cudaStream_t of torch's current stream on `device`, without CUDA headers.
void* current_stream(const c10::Device& device) {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
}

// nullptr when our kernels can run on this CUDA device, else the reason (stable pointer).
const char* device_unsupported(const c10::Device& device) {
  int idx = device.index();
  if (idx < 0 || idx >= kMaxDevices) return "device index out of range";
  int8_t state = g_device_ok[idx].load(std::memory_order_acquire);
  if (state == 1) return nullptr;
  std::lock_guard<std::mutex> lock(g_device_mutex);
  state = g_device_ok[idx].load(std::memory_order_acquire);
  if (state == 0) {
    c10::DeviceGuard guard(device);
    const char* arch = nullptr;
    fly_status st = fly_device_arch(current_stream(device), &arch);
    if (st == FLY_SUCCESS) {
      state = 1;
    } else {
      g_device_reason[idx] = std::string("device not supported: ") + fly_get_last_error();
      state = -1;
    }
    g_device_ok[idx].store(state, std::memory_order_release);
  }
  return state == 1 ? nullptr : g_device_reason[idx].c_str();
}

// ---- descriptors ----------------------------------------------------------------------------
fly_dtype fly_dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return FLY_F16;
    case at::kBFloat16: return FLY_BF16;
    case at::kFloat: return FLY_F32;
    case at::kDouble: return FLY_F64;
    case at::kInt: return FLY_I32;
    case at::kLong: return FLY_I64;
    case at::kByte: return FLY_U8;
    case at::kFloat8_e4m3fn: return FLY_F8_E4M3;
    case at::kFloat4_e2m1fn_x2: return FLY_F4_E2M1X2;
    case at::kFloat8_e8m0fnu: return FLY_E8M0;
    default: return FLY_DTYPE_INVALID;
  }
}

// A rank-2 view [rows, cols] with row stride `ld` and unit inner stride.
fly_tensor desc_2d(const at::Tensor& t, int64_t rows, int64_t cols, int64_t ld) {
  fly_tensor d{};
  d.data = t.data_ptr();
  d.dtype = fly_dtype_of(t.scalar_type());
  d.rank = 2;
  d.sizes[0] = rows;
  d.sizes[1] = cols;
  d.strides[0] = ld;
  d.strides[1] = 1;
  return d;
}

fly_tensor desc_1d(const at::Tensor& t, int64_t n) {
  fly_tensor d{};
  d.data = t.data_ptr();
  d.dtype = fly_dtype_of(t.scalar_type());
  d.rank = 1;
  d.sizes[0] = n;
  d.strides[0] = 1;
  return d;
}

// An uninitialised tensor from torch's CUDA caching allocator (current device). Unlike at::empty it
// skips deterministic mode's NaN fill, a kernel per tensor: our kernels write every element.
at::Tensor empty_unfilled(c10::IntArrayRef sizes, at::ScalarType dtype) {
  return at::Tensor(at::detail::empty_generic(sizes, c10::GetAllocator(c10::DeviceType::CUDA),
                                              c10::DispatchKeySet(c10::DispatchKey::CUDA), dtype,
                                              c10::MemoryFormat::Contiguous));
}

// Library statuses that mean "valid for torch, not for us": the stock kernel takes the call.
bool status_means_fallback(fly_status st) {
  return st == FLY_ERROR_UNSUPPORTED || st == FLY_ERROR_INVALID_ARGUMENT || st == FLY_ERROR_MISALIGNED ||
         st == FLY_ERROR_ARCH_NOT_BUILT || st == FLY_ERROR_NO_DEVICE;
}

bool is_fly_float(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat; }

// ---- eligibility (shared by the overrides and the Python-side explain_* used in tests) -------
// Each returns nullptr when our kernel takes the call, else a static reason. check_device=false
// skips the device checks so the shape/dtype/layout logic is testable on CPU tensors.

const char* rms_norm_ineligible(const at::Tensor& x, c10::ArrayRef<int64_t> normalized_shape,
                                const at::Tensor* weight, std::optional<double> eps, bool check_device) {
  if (check_device && !x.is_cuda()) return "input is not a CUDA tensor";
  if (!is_fly_float(x.scalar_type())) return "dtype not covered (fp16, bf16, fp32)";
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  if (nd == 0 || nd > x.dim()) return "normalized_shape does not match the input";
  int64_t N = 1;
  for (int64_t i = 0; i < nd; ++i) {
    if (x.size(x.dim() - nd + i) != normalized_shape[i]) return "normalized_shape does not match the input";
    N *= normalized_shape[i];
  }
  if (x.numel() == 0) return "empty input";
  if (!x.is_contiguous()) return "input is not contiguous";
  if (N > std::numeric_limits<int32_t>::max()) return "rows longer than 2^31 elements";
  if (eps.has_value() && !(std::isfinite(*eps) && *eps >= 0)) return "eps negative or not finite";
  if (weight != nullptr && weight->defined()) {
    if (weight->scalar_type() != x.scalar_type()) return "weight dtype differs from the input's";
    if (weight->sizes() != normalized_shape) return "weight shape differs from normalized_shape";
    if (!weight->is_contiguous()) return "weight is not contiguous";
    if (check_device && weight->device() != x.device()) return "weight on another device";
  }
  if (check_device) return device_unsupported(x.device());
  return nullptr;
}

const char* topk_ineligible(const at::Tensor& x, int64_t k, int64_t dim, bool check_device) {
  if (check_device && !x.is_cuda()) return "input is not a CUDA tensor";
  if (x.scalar_type() != at::kFloat) return "dtype not covered (fp32)";
  if (x.dim() == 0) return "zero-dimensional input";
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  if (d != x.dim() - 1) return "dim is not the last dimension";
  const int64_t C = x.size(-1);
  if (k < 1 || k > C) return "k outside 1..size(dim)";
  if (x.numel() == 0) return "empty input";
  const int64_t R = x.numel() / C;
  const bool rows_strided = x.dim() == 2 && x.stride(1) == 1 && x.stride(0) >= C;
  if (!x.is_contiguous() && !rows_strided) return "input is not contiguous";
  if (R > std::numeric_limits<int32_t>::max() || C > std::numeric_limits<int32_t>::max())
    return "more than 2^31 rows or columns";
  if (check_device) return device_unsupported(x.device());
  return nullptr;
}

// ---- RMSNorm: aten::_fused_rms_norm -----------------------------------------------------------
std::optional<c10::SafeKernelFunction> g_prev_rms_norm;

// Runs our forward; returns false (nothing written) when the library declines.
bool rms_norm_run(const at::Tensor& x, c10::ArrayRef<int64_t> normalized_shape, const at::Tensor* weight,
                  std::optional<double> eps, at::Tensor& y, at::Tensor& rstd, std::string& why) {
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  int64_t N = 1;
  for (int64_t v : normalized_shape) N *= v;
  const int64_t M = x.numel() / N;
  c10::DeviceGuard guard(x.device());
  y = empty_unfilled(x.sizes(), x.scalar_type());
  std::vector<int64_t> stat_shape(x.sizes().begin(), x.sizes().end());
  for (int64_t i = x.dim() - nd; i < x.dim(); ++i) stat_shape[i] = 1;
  rstd = empty_unfilled(stat_shape, at::kFloat);
  fly_tensor xd = desc_2d(x, M, N, N), yd = desc_2d(y, M, N, N), rd = desc_1d(rstd, M);
  fly_tensor wd{};
  const bool has_w = weight != nullptr && weight->defined();
  if (has_w) wd = desc_1d(*weight, N);
  // PyTorch's default eps is the epsilon of the accumulation type (fp32 here).
  const double eps_val = eps.value_or(static_cast<double>(std::numeric_limits<float>::epsilon()));
  fly_status st = fly_rms_norm_fwd(&xd, has_w ? &wd : nullptr, eps_val, &yd, &rd, current_stream(x.device()));
  if (st == FLY_SUCCESS) return true;
  if (status_means_fallback(st)) {
    why = fly_get_last_error();
    return false;
  }
  TORCH_CHECK(false, "flykernels rms_norm: ", fly_status_string(st), ": ", fly_get_last_error());
}

void rms_norm_boxed(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t n = s.size();
  const at::Tensor& x = s[n - 4].toTensor();
  const std::vector<int64_t> normalized_shape = s[n - 3].toIntVector();
  const at::Tensor* weight = s[n - 2].isNone() ? nullptr : &s[n - 2].toTensor();
  const std::optional<double> eps = s[n - 1].isNone() ? std::nullopt : std::optional<double>(s[n - 1].toDouble());
  const char* why = rms_norm_ineligible(x, normalized_shape, weight, eps, true);
  if (why == nullptr) {
    at::Tensor y, rstd;
    std::string lib_why;
    if (rms_norm_run(x, normalized_shape, weight, eps, y, rstd, lib_why)) {
      note_ours(kRmsNorm);
      torch::jit::drop(s, 4);
      torch::jit::push(s, std::move(y), std::move(rstd));
      return;
    }
    note_fallback(kRmsNorm, lib_why.c_str());
  } else {
    note_fallback(kRmsNorm, why);
  }
  g_prev_rms_norm->callBoxed(op, ks, stack);
}

// ---- TopK: aten::topk and aten::topk.values ----------------------------------------------------
std::optional<c10::SafeKernelFunction> g_prev_topk;
std::optional<c10::SafeKernelFunction> g_prev_topk_values;

// An out= tensor we can write directly: right dtype and device, and either already the result's
// shape and contiguous, or empty (then resized, as torch's resize_output does without a warning).
bool out_usable(const at::Tensor& out, at::ScalarType dtype, const c10::Device& device, c10::IntArrayRef shape) {
  if (out.scalar_type() != dtype || out.device() != device) return false;
  if (out.sizes() == shape) return out.is_contiguous();
  return out.numel() == 0 && out.is_contiguous();
}

bool topk_run(const at::Tensor& x, int64_t k, bool largest, at::Tensor& values, at::Tensor& indices,
              std::string& why) {
  const int64_t C = x.size(-1);
  const int64_t R = x.numel() / C;
  const int64_t ld = x.dim() == 2 ? x.stride(0) : C;
  c10::DeviceGuard guard(x.device());
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = k;
  if (!values.defined()) values = empty_unfilled(out_shape, x.scalar_type());
  else if (values.sizes() != c10::IntArrayRef(out_shape)) values.resize_(out_shape);
  if (!indices.defined()) indices = empty_unfilled(out_shape, at::kLong);
  else if (indices.sizes() != c10::IntArrayRef(out_shape)) indices.resize_(out_shape);
  const int deterministic = at::globalContext().deterministicAlgorithms() ? 1 : 0;
  fly_tensor xd = desc_2d(x, R, C, ld), vd = desc_2d(values, R, k, k), id = desc_2d(indices, R, k, k);
  size_t ws_bytes = 0;
  fly_status st = fly_topk_workspace_size(&xd, k, largest ? 1 : 0, deterministic, &ws_bytes);
  c10::DataPtr ws;  // back to the caching allocator, stream-ordered, when this returns
  if (st == FLY_SUCCESS && ws_bytes > 0) ws = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(ws_bytes);
  if (st == FLY_SUCCESS)
    st = fly_topk(&xd, k, largest ? 1 : 0, deterministic, &vd, &id, ws_bytes ? ws.get() : nullptr, ws_bytes,
                  current_stream(x.device()));
  if (st == FLY_SUCCESS) return true;
  if (status_means_fallback(st)) {
    why = fly_get_last_error();
    return false;
  }
  TORCH_CHECK(false, "flykernels topk: ", fly_status_string(st), ": ", fly_get_last_error());
}

// Both schemas start (self, k, dim, largest, sorted); topk.values adds (values, indices).
template <bool kOut>
void topk_boxed(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  constexpr size_t kArgs = kOut ? 7 : 5;
  const OpId id = kOut ? kTopkValues : kTopk;
  const size_t base = s.size() - kArgs;
  const at::Tensor& x = s[base].toTensor();
  const char* why = nullptr;
  int64_t k = 0;
  if (!s[base + 1].isInt()) why = "symbolic k";
  else k = s[base + 1].toInt();
  const int64_t dim = s[base + 2].toInt();
  const bool largest = s[base + 3].toBool();
  if (why == nullptr) why = topk_ineligible(x, k, dim, true);
  at::Tensor values, indices;
  if (why == nullptr && kOut) {
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = k;
    values = s[base + 5].toTensor();
    indices = s[base + 6].toTensor();
    if (!out_usable(values, x.scalar_type(), x.device(), shape) || !out_usable(indices, at::kLong, x.device(), shape))
      why = "out= tensors of another shape, dtype, device or layout";
    else if (values.is_same(x) || indices.is_same(x))
      why = "out= aliases the input";
  }
  if (why == nullptr) {
    std::string lib_why;
    if (topk_run(x, k, largest, values, indices, lib_why)) {
      note_ours(id);
      torch::jit::drop(s, kArgs);
      torch::jit::push(s, std::move(values), std::move(indices));
      return;
    }
    note_fallback(id, lib_why.c_str());
  } else {
    note_fallback(id, why);
  }
  (kOut ? g_prev_topk_values : g_prev_topk)->callBoxed(op, ks, stack);
}

// ---- SDPA forward: aten::_scaled_dot_product_{flash,efficient,cudnn}_attention ---------------
// What SDPA's dispatcher calls on CUDA after picking a backend. Ours takes dense fp16/bf16
// [B, H, S, D] inputs without dropout, mask or debug mask (the library says which head dims and
// strides it takes: anything it declines runs the stock kernel). Outputs follow each stock op's
// contract (layout, log-sum-exp shape), so the stock backward works on them.
std::optional<c10::SafeKernelFunction> g_prev_sdpa_flash;
std::optional<c10::SafeKernelFunction> g_prev_sdpa_efficient;
std::optional<c10::SafeKernelFunction> g_prev_sdpa_cudnn;

fly_tensor desc_nd(const at::Tensor& t) {
  fly_tensor d{};
  d.data = t.data_ptr();
  d.dtype = fly_dtype_of(t.scalar_type());
  d.rank = t.dim();
  for (int64_t i = 0; i < t.dim(); ++i) {
    d.sizes[i] = t.size(i);
    d.strides[i] = t.stride(i);
  }
  return d;
}

const char* sdpa_ineligible(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p,
                            bool check_device) {
  if (check_device && !(q.is_cuda() && k.is_cuda() && v.is_cuda())) return "inputs are not CUDA tensors";
  if (q.scalar_type() != at::kHalf && q.scalar_type() != at::kBFloat16) return "dtype not covered (fp16, bf16)";
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) return "mixed dtypes";
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return "inputs are not [B, H, S, D]";
  if (q.is_nested() || k.is_nested() || v.is_nested()) return "nested tensors";
  if (dropout_p != 0.0) return "dropout";
  if (k.size(3) != q.size(3) || v.size(3) != q.size(3)) return "value or key head dim differs from the query's";
  if (k.size(0) != q.size(0) || v.size(0) != q.size(0) || v.size(1) != k.size(1) || v.size(2) != k.size(2))
    return "key and value shapes differ";
  if (k.size(1) == 0 || q.size(1) % k.size(1) != 0) return "query heads not a multiple of key/value heads";
  if (q.stride(3) != 1 || k.stride(3) != 1 || v.stride(3) != 1) return "head dim is not innermost";
  if (check_device && (k.device() != q.device() || v.device() != q.device())) return "inputs on different devices";
  if (check_device) return device_unsupported(q.device());
  return nullptr;
}

// Runs our forward into `out` (and `lse`, FP32 [B, H, Sq] view, or undefined); false when the
// library declines (why says so), nothing written then.
bool sdpa_run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
              std::optional<double> scale, at::Tensor& out, const at::Tensor& lse, std::string& why) {
  c10::DeviceGuard guard(q.device());
  fly_tensor qd = desc_nd(q), kd = desc_nd(k), vd = desc_nd(v), od = desc_nd(out), ld{};
  if (lse.defined()) {
    ld.data = lse.data_ptr();
    ld.dtype = FLY_F32;
    ld.rank = 3;
    for (int i = 0; i < 3; ++i) {
      ld.sizes[i] = lse.size(i);
      ld.strides[i] = lse.stride(i);
    }
  }
  fly_attention_fwd_params prm{};
  prm.struct_size = sizeof(prm);
  prm.q = &qd;
  prm.k = &kd;
  prm.v = &vd;
  prm.o = &od;
  prm.lse = lse.defined() ? &ld : nullptr;
  prm.softmax_scale = scale.has_value() ? *scale : 0.0;
  prm.causal = causal ? 1 : 0;
  if (scale.has_value() && !(std::isfinite(*scale) && *scale != 0.0)) {
    why = "softmax scale zero or not finite";
    return false;
  }
  size_t ws_bytes = 0;
  fly_status st = fly_attention_fwd_workspace_size(&prm, &ws_bytes);
  c10::DataPtr ws;  // back to the caching allocator, stream-ordered, when this returns
  if (st == FLY_SUCCESS && ws_bytes > 0) {
    ws = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(ws_bytes);
    prm.workspace = ws.get();
    prm.workspace_bytes = ws_bytes;
  }
  if (st == FLY_SUCCESS) st = fly_attention_fwd(&prm, current_stream(q.device()));
  if (st == FLY_SUCCESS) return true;
  if (status_means_fallback(st)) {
    why = fly_get_last_error();
    return false;
  }
  TORCH_CHECK(false, "flykernels attention: ", fly_status_string(st), ": ", fly_get_last_error());
}

// The philox seed / offset tensors the stock ops return (dtype and shape as their meta functions
// say, so compiled graphs see the same); without dropout nothing reads them.
at::Tensor no_rng(c10::IntArrayRef sizes, at::ScalarType dtype = at::kUInt64) { return empty_unfilled(sizes, dtype); }

std::optional<double> opt_double(const c10::IValue& v) {
  return v.isNone() ? std::nullopt : std::optional<double>(v.toDouble());
}

// _scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, return_debug_mask, *, scale)
//   -> (out, logsumexp [B,H,Sq], cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_mask)
void sdpa_flash_boxed(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t b = s.size() - 7;
  const at::Tensor& q = s[b].toTensor();
  const at::Tensor& k = s[b + 1].toTensor();
  const at::Tensor& v = s[b + 2].toTensor();
  const double dropout_p = s[b + 3].toDouble();
  const bool causal = s[b + 4].toBool();
  const char* why = s[b + 5].toBool() ? "debug mask requested" : sdpa_ineligible(q, k, v, dropout_p, true);
  // SDPA never sends these (its causal mask is top-left, flash's own bottom-right); a direct call
  // keeps the stock op's meaning.
  if (why == nullptr && causal && q.size(2) != k.size(2)) why = "causal with Sq != Sk (flash's own rule)";
  if (why == nullptr) {
    at::Tensor out = at::empty_like(q);  // the query's layout, as the stock op
    at::Tensor lse = empty_unfilled({q.size(0), q.size(1), q.size(2)}, at::kFloat);
    std::string lib_why;
    if (sdpa_run(q, k, v, causal, opt_double(s[b + 6]), out, lse, lib_why)) {
      note_ours(kSdpaFlash);
      const int64_t max_q = q.size(2), max_k = k.size(2);
      at::Tensor rng = no_rng({2}), unused = no_rng({}), debug = at::empty({0}, q.options());
      torch::jit::drop(s, 7);
      torch::jit::push(s, std::move(out), std::move(lse), at::Tensor(), at::Tensor(), c10::SymInt(max_q),
                       c10::SymInt(max_k), std::move(rng), std::move(unused), std::move(debug));
      return;
    }
    note_fallback(kSdpaFlash, lib_why.c_str());
  } else {
    note_fallback(kSdpaFlash, why);
  }
  g_prev_sdpa_flash->callBoxed(op, ks, stack);
}

// _scaled_dot_product_efficient_attention(q, k, v, attn_bias, compute_log_sumexp, dropout_p,
//   is_causal, *, scale) -> (out [B,Sq,H,D] transposed, log_sumexp [B,H,ceil(Sq/32)*32] or
//   [B,H,0], philox_seed, philox_offset)
void sdpa_efficient_boxed(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t b = s.size() - 8;
  const at::Tensor& q = s[b].toTensor();
  const at::Tensor& k = s[b + 1].toTensor();
  const at::Tensor& v = s[b + 2].toTensor();
  const bool with_lse = s[b + 4].toBool();
  const double dropout_p = s[b + 5].toDouble();
  const bool causal = s[b + 6].toBool();
  const char* why = !s[b + 3].isNone() ? "attention bias" : sdpa_ineligible(q, k, v, dropout_p, true);
  if (why == nullptr) {
    const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3);
    at::Tensor out = empty_unfilled({B, Sq, H, D}, q.scalar_type()).transpose(1, 2);
    const int64_t padded = with_lse ? (Sq + 31) / 32 * 32 : 0;
    at::Tensor lse_all = with_lse ? at::full({B, H, padded}, std::numeric_limits<float>::infinity(),
                                             q.options().dtype(at::kFloat))
                                  : at::empty({B, H, 0}, q.options().dtype(at::kFloat));
    at::Tensor lse = with_lse ? lse_all.narrow(2, 0, Sq) : at::Tensor();
    std::string lib_why;
    if (sdpa_run(q, k, v, causal, opt_double(s[b + 7]), out, lse, lib_why)) {
      note_ours(kSdpaEfficient);
      at::Tensor seed = no_rng({}, at::kLong), offset = no_rng({}, at::kLong);
      torch::jit::drop(s, 8);
      torch::jit::push(s, std::move(out), std::move(lse_all), std::move(seed), std::move(offset));
      return;
    }
    note_fallback(kSdpaEfficient, lib_why.c_str());
  } else {
    note_fallback(kSdpaEfficient, why);
  }
  g_prev_sdpa_efficient->callBoxed(op, ks, stack);
}

// _scaled_dot_product_cudnn_attention(q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal,
//   return_debug_mask, *, scale) -> (out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
//   philox_seed, philox_offset, debug_mask). Taken only when no log-sum-exp is asked for (no
//   gradient): cuDNN's own backward reads its own statistics, so training stays with cuDNN.
void sdpa_cudnn_boxed(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t b = s.size() - 9;
  const at::Tensor& q = s[b].toTensor();
  const at::Tensor& k = s[b + 1].toTensor();
  const at::Tensor& v = s[b + 2].toTensor();
  const double dropout_p = s[b + 5].toDouble();
  const bool causal = s[b + 6].toBool();
  const char* why = !s[b + 3].isNone() ? "attention bias"
                    : s[b + 4].toBool() ? "log-sum-exp for cuDNN's backward requested (training)"
                    : s[b + 7].toBool() ? "debug mask requested"
                                        : sdpa_ineligible(q, k, v, dropout_p, true);
  if (why == nullptr) {
    at::Tensor out = at::empty_like(q);
    std::string lib_why;
    if (sdpa_run(q, k, v, causal, opt_double(s[b + 8]), out, at::Tensor(), lib_why)) {
      note_ours(kSdpaCudnn);
      const int64_t max_q = q.size(2), max_k = k.size(2);
      // as the meta function: [B, H, Sq, 1] statistics (not computed: nothing reads them), no mask
      at::Tensor lse = empty_unfilled({q.size(0), q.size(1), q.size(2), 1}, at::kFloat);
      at::Tensor seed = no_rng({}, at::kLong), offset = no_rng({}, at::kLong);
      torch::jit::drop(s, 9);
      torch::jit::push(s, std::move(out), std::move(lse), at::Tensor(), at::Tensor(), c10::SymInt(max_q),
                       c10::SymInt(max_k), std::move(seed), std::move(offset), at::Tensor());
      return;
    }
    note_fallback(kSdpaCudnn, lib_why.c_str());
  } else {
    note_fallback(kSdpaCudnn, why);
  }
  g_prev_sdpa_cudnn->callBoxed(op, ks, stack);
}

// ---- SDPA backward: aten::_scaled_dot_product_{flash,efficient}_attention_backward ------------
// fly_attention_bwd from the forward's output and natural-log LSE, whoever ran the forward (the
// stock ops' LSE has the same meaning: flash [B, H, Sq], memory-efficient padded [B, H, >= Sq]).
std::optional<c10::SafeKernelFunction> g_prev_sdpa_flash_bwd;
std::optional<c10::SafeKernelFunction> g_prev_sdpa_efficient_bwd;

const char* sdpa_bwd_ineligible(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                double dropout_p) {
  const char* why = sdpa_ineligible(q, k, v, dropout_p, true);
  if (why != nullptr) return why;
  for (const at::Tensor* t : {&dout, &out}) {
    if (!t->defined() || !t->is_cuda() || t->scalar_type() != q.scalar_type()) return "grad_out or out dtype/device";
    if (t->sizes() != q.sizes() || t->stride(3) != 1) return "grad_out or out shape or layout";
  }
  if (!lse.defined() || lse.scalar_type() != at::kFloat || lse.dim() != 3 || lse.size(0) != q.size(0) ||
      lse.size(1) != q.size(1) || lse.size(2) < q.size(2))
    return "log-sum-exp not FP32 [B, H, >= Sq]";
  return nullptr;
}

bool sdpa_bwd_run(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& out, const at::Tensor& lse, bool causal, std::optional<double> scale,
                  at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, std::string& why) {
  if (scale.has_value() && !(std::isfinite(*scale) && *scale != 0.0)) {
    why = "softmax scale zero or not finite";
    return false;
  }
  c10::DeviceGuard guard(q.device());
  const at::Tensor l = lse.narrow(2, 0, q.size(2));
  fly_tensor qd = desc_nd(q), kd = desc_nd(k), vd = desc_nd(v), od = desc_nd(out), gd = desc_nd(dout);
  fly_tensor dqd = desc_nd(dq), dkd = desc_nd(dk), dvd = desc_nd(dv), ld{};
  ld.data = l.data_ptr();
  ld.dtype = FLY_F32;
  ld.rank = 3;
  for (int i = 0; i < 3; ++i) {
    ld.sizes[i] = l.size(i);
    ld.strides[i] = l.stride(i);
  }
  fly_attention_bwd_params prm{};
  prm.struct_size = sizeof(prm);
  prm.q = &qd;
  prm.k = &kd;
  prm.v = &vd;
  prm.o = &od;
  prm.dout = &gd;
  prm.lse = &ld;
  prm.dq = &dqd;
  prm.dk = &dkd;
  prm.dv = &dvd;
  prm.softmax_scale = scale.has_value() ? *scale : 0.0;
  prm.causal = causal ? 1 : 0;
  size_t ws_bytes = 0;
  fly_status st = fly_attention_bwd_workspace_size(&prm, &ws_bytes);
  c10::DataPtr ws;
  if (st == FLY_SUCCESS && ws_bytes > 0) {
    ws = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(ws_bytes);
    prm.workspace = ws.get();
    prm.workspace_bytes = ws_bytes;
  }
  if (st == FLY_SUCCESS) st = fly_attention_bwd(&prm, current_stream(q.device()));
  if (st == FLY_SUCCESS) return true;
  if (status_means_fallback(st)) {
    why = fly_get_last_error();
    return false;
  }
  TORCH_CHECK(false, "flykernels attention backward: ", fly_status_string(st), ": ", fly_get_last_error());
}

// (grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
//  philox_seed, philox_offset, *, scale) -> (dq, dk, dv), each empty_like its input (meta).
void sdpa_flash_bwd_boxed(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t b = s.size() - 15;
  const at::Tensor& dout = s[b].toTensor();
  const at::Tensor& q = s[b + 1].toTensor();
  const at::Tensor& k = s[b + 2].toTensor();
  const at::Tensor& v = s[b + 3].toTensor();
  const at::Tensor& out = s[b + 4].toTensor();
  const at::Tensor& lse = s[b + 5].toTensor();
  const bool causal = s[b + 11].toBool();
  const char* why = sdpa_bwd_ineligible(dout, q, k, v, out, lse, s[b + 10].toDouble());
  if (why == nullptr && q.size(2) != k.size(2) && causal) why = "causal with Sq != Sk (flash's own rule)";
  if (why == nullptr) {
    at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
    std::string lib_why;
    if (sdpa_bwd_run(dout, q, k, v, out, lse, causal, opt_double(s[b + 14]), dq, dk, dv, lib_why)) {
      note_ours(kSdpaFlashBwd);
      torch::jit::drop(s, 15);
      torch::jit::push(s, std::move(dq), std::move(dk), std::move(dv));
      return;
    }
    note_fallback(kSdpaFlashBwd, lib_why.c_str());
  } else {
    note_fallback(kSdpaFlashBwd, why);
  }
  g_prev_sdpa_flash_bwd->callBoxed(op, ks, stack);
}

// (grad_out, q, k, v, attn_bias, out, logsumexp, philox_seed, philox_offset, dropout_p,
//  grad_input_mask[4], is_causal, *, scale) -> (dq, dk, dv, dbias); grads [B, S, H, D] transposed
//  (meta), no bias gradient (we take no bias).
void sdpa_efficient_bwd_boxed(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t b = s.size() - 13;
  const at::Tensor& dout = s[b].toTensor();
  const at::Tensor& q = s[b + 1].toTensor();
  const at::Tensor& k = s[b + 2].toTensor();
  const at::Tensor& v = s[b + 3].toTensor();
  const bool has_bias = !s[b + 4].isNone() && s[b + 4].toTensor().defined();
  const at::Tensor& out = s[b + 5].toTensor();
  const at::Tensor& lse = s[b + 6].toTensor();
  const bool causal = s[b + 11].toBool();
  const char* why = has_bias ? "attention bias" : sdpa_bwd_ineligible(dout, q, k, v, out, lse, s[b + 9].toDouble());
  if (why == nullptr && k.size(1) != q.size(1)) why = "grouped-query heads (the memory-efficient op has none)";
  if (why == nullptr) {
    auto bshd = [](const at::Tensor& t) {
      return empty_unfilled({t.size(0), t.size(2), t.size(1), t.size(3)}, t.scalar_type()).transpose(1, 2);
    };
    at::Tensor dq = bshd(q), dk = bshd(k), dv = bshd(v);
    std::string lib_why;
    if (sdpa_bwd_run(dout, q, k, v, out, lse, causal, opt_double(s[b + 12]), dq, dk, dv, lib_why)) {
      note_ours(kSdpaEfficientBwd);
      torch::jit::drop(s, 13);
      torch::jit::push(s, std::move(dq), std::move(dk), std::move(dv), at::Tensor());
      return;
    }
    note_fallback(kSdpaEfficientBwd, lib_why.c_str());
  } else {
    note_fallback(kSdpaEfficientBwd, why);
  }
  g_prev_sdpa_efficient_bwd->callBoxed(op, ks, stack);
}

// ---- grouped GEMM: aten::_grouped_mm (self, mat2, offs?, bias?, out_dtype?) -> Tensor ----------
// Ours: the 2-D x 3-D forward form (A [T, K] row-major, B [G, K, N] N- or K-contiguous, int32 offs
// [G] on the same device, no bias, out dtype = input dtype, N a multiple of 8 so the output is the
// plain row-major [T, N] the stock op allocates). Autograd's dA (dC @ B^T) is this form again.
// Also the 2-D x 2-D ragged-K form, autograd's dB (a = X.t() [M, Ktot], b = dC [Ktot, N], offs along
// K, out [G, M, N] contiguous; a M-contiguous, b N-contiguous, N % 8 == 0, no bias).
// Other forms (3-D x 3-D, 3-D x 2-D) run the stock kernel.
std::optional<c10::SafeKernelFunction> g_prev_grouped_mm;

const char* grouped_mm_ineligible(const at::Tensor& a, const at::Tensor& b, const at::Tensor* offs,
                                  const at::Tensor* bias, std::optional<at::ScalarType> out_dtype, bool check_device) {
  if (check_device && !(a.is_cuda() && b.is_cuda())) return "inputs are not CUDA tensors";
  if (a.scalar_type() != at::kHalf && a.scalar_type() != at::kBFloat16) return "dtype not covered (fp16, bf16)";
  if (b.scalar_type() != a.scalar_type()) return "mixed dtypes";
  if (out_dtype.has_value() && *out_dtype != a.scalar_type()) return "out_dtype differs from the inputs'";
  if (a.dim() == 2 && b.dim() == 2) {
    // The ragged-K form (autograd's dB = X^T @ dC per group): a [M, Ktot] M-contiguous (X.t()), b
    // [Ktot, N] N-contiguous (dC), offs along K, out [G, M, N] (the library checks TMA's rules).
    if (offs == nullptr || !offs->defined()) return "no offsets";
    if (offs->scalar_type() != at::kInt || offs->dim() != 1) return "offs not int32 [G]";
    if (offs->stride(0) != 1 && offs->size(0) > 1) return "offs not contiguous";
    if (a.size(1) != b.size(0)) return "K of A and B differ";
    if (a.stride(0) != 1 && a.size(0) > 1) return "A not M-contiguous (the ragged-K form takes X.t())";
    if (b.stride(1) != 1 && b.size(1) > 1) return "B not N-contiguous (the ragged-K form takes dC)";
    if (b.size(1) % 8 != 0) return "N not a multiple of 8";
    if (bias != nullptr && bias->defined()) return "bias (left to the stock op)";
    if (check_device) {
      if (b.device() != a.device() || offs->device() != a.device()) return "inputs on different devices";
      return device_unsupported(a.device());
    }
    return nullptr;
  }
  if (a.dim() != 2 || b.dim() != 3) return "not the 2-D x 3-D or 2-D x 2-D form";
  if (offs == nullptr || !offs->defined()) return "no offsets";
  if (offs->scalar_type() != at::kInt || offs->dim() != 1 || offs->size(0) != b.size(0)) return "offs not int32 [G]";
  if (offs->stride(0) != 1 && offs->size(0) > 1) return "offs not contiguous";
  if (a.size(1) != b.size(1)) return "K of A and B differ";
  if (a.stride(1) != 1) return "A not row-major";
  if (b.stride(2) != 1 && b.stride(1) != 1) return "B neither N- nor K-contiguous";
  if (b.size(2) % 8 != 0) return "N not a multiple of 8";
  // The stock op's own rules for a bias (it refuses one in 2.11) stay the stock op's.
  if (bias != nullptr && bias->defined()) return "bias (left to the stock op)";
  if (check_device) {
    if (b.device() != a.device() || offs->device() != a.device()) return "inputs on different devices";
    return device_unsupported(a.device());
  }
  return nullptr;
}

// fly_grouped_gemm of a, b, offs into c (no bias); false, with the reason noted, where the library
// declines the call (fallback statuses), an error for anything else.
bool grouped_mm_run(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, const at::Tensor& c) {
  c10::DeviceGuard guard(a.device());
  fly_tensor ad = desc_nd(a), bd = desc_nd(b), od = desc_nd(offs), cd = desc_nd(c);
  // The ragged-K form needs a workspace (two tensor maps per group, written by the call itself).
  size_t ws_bytes = 0;
  fly_status st = fly_grouped_gemm_workspace_size(&ad, &bd, &od, &cd, &ws_bytes);
  c10::DataPtr ws;  // back to the caching allocator, stream-ordered, when this returns
  if (st == FLY_SUCCESS && ws_bytes > 0) ws = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(ws_bytes);
  if (st == FLY_SUCCESS)
    st = fly_grouped_gemm(&ad, &bd, &od, nullptr, &cd, ws_bytes ? ws.get() : nullptr, ws_bytes,
                          current_stream(a.device()));
  if (st == FLY_SUCCESS) {
    note_ours(kGroupedMm);
    return true;
  }
  TORCH_CHECK(status_means_fallback(st), "flykernels grouped_mm: ", fly_status_string(st), ": ", fly_get_last_error());
  note_fallback(kGroupedMm, fly_get_last_error());
  return false;
}

void grouped_mm_boxed(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t b0 = s.size() - 5;
  const at::Tensor& a = s[b0].toTensor();
  const at::Tensor& b = s[b0 + 1].toTensor();
  const at::Tensor* offs = s[b0 + 2].isNone() ? nullptr : &s[b0 + 2].toTensor();
  const at::Tensor* bias = s[b0 + 3].isNone() ? nullptr : &s[b0 + 3].toTensor();
  const std::optional<at::ScalarType> out_dtype =
      s[b0 + 4].isNone() ? std::nullopt : std::optional<at::ScalarType>(s[b0 + 4].toScalarType());
  const char* why = grouped_mm_ineligible(a, b, offs, bias, out_dtype, true);
  if (why == nullptr) {
    c10::DeviceGuard guard(a.device());  // the output is allocated on a's device
    // 2-D x 3-D: [T, N]; 2-D x 2-D (ragged K): [G, M, N], as the stock op allocates them (N % 8 == 0).
    at::Tensor c = b.dim() == 3 ? empty_unfilled({a.size(0), b.size(2)}, a.scalar_type())
                                : empty_unfilled({offs->size(0), a.size(0), b.size(1)}, a.scalar_type());
    if (grouped_mm_run(a, b, *offs, c)) {
      torch::jit::drop(s, 5);
      torch::jit::push(s, std::move(c));
      return;
    }
  } else {
    note_fallback(kGroupedMm, why);
  }
  g_prev_grouped_mm->callBoxed(op, ks, stack);
}

// ---- MX block-scaled GEMM: aten::_scaled_mm_v2 and aten::_scaled_mm ---------------------------
// Ours: MXFP8 (float8_e4m3fn) or MXFP4 (float4_e2m1fn_x2) operands, both the same, A [M, K] row-major
// and B [K, N] column-major (a transposed view of a row-major [N, K]; FP4 counts packed bytes: K/2),
// one float8_e8m0fnu scale per 32 values of K (BlockWise1x32), scales either unswizzled (NO_SWIZZLE:
// [M, K/32] and [N, K/32] row-major, any shape with that many contiguous elements) or cuBLAS's
// SWIZZLE_32_4_4 blocked layout (unswizzled here with one small copy), output bf16/fp16, optional
// bias [N] in the output dtype. Everything else (other recipes, fp32 output, e5m2, tensorwise,
// rowwise) runs the stock kernel. v1 (_scaled_mm) with E8M0 scales means the blocked layout.
std::optional<c10::SafeKernelFunction> g_prev_scaled_mm, g_prev_scaled_mm_v1;
std::optional<c10::SafeKernelFunction> g_prev_scaled_mm_meta, g_prev_scaled_mm_v1_meta;

constexpr int64_t kRecipeBlockWise1x32 = 3;  // at::blas::ScalingType::BlockWise1x32
constexpr int64_t kSwizzleNone = 0, kSwizzle32_4_4 = 1;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The logical K of an MX operand pair (FP4 packs two values per byte), or -1.
int64_t mx_k(const at::Tensor& a) {
  if (a.dim() != 2) return -1;
  return a.scalar_type() == at::kFloat4_e2m1fn_x2 ? 2 * a.size(1) : a.size(1);
}

// nullptr when a scale tensor holds `rows` x K/32 scales in the layout `swizzle` names, else why not.
const char* mx_scale_ineligible(const at::Tensor& sc, int64_t rows, int64_t kb, int64_t swizzle) {
  if (sc.scalar_type() != at::kFloat8_e8m0fnu) return "scales not float8_e8m0fnu";
  if (!sc.is_contiguous()) return "scales not contiguous";
  const int64_t want = swizzle == kSwizzleNone ? rows * kb : round_up(rows, 128) * round_up(kb, 4);
  if (sc.numel() != want) return swizzle == kSwizzleNone ? "scale count is not rows * K/32 (NO_SWIZZLE)"
                                                         : "scale count is not the padded SWIZZLE_32_4_4 size";
  return nullptr;
}

// True when a tensor's sizes or strides are symbolic (dynamic-shape tracing): only dtypes and ranks
// can be checked then; the CUDA override checks the rest on the concrete call.
bool symbolic(const at::Tensor& t) { return t.unsafeGetTensorImpl()->has_symbolic_sizes_strides(); }

const char* scaled_mm_ineligible(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
                                 int64_t swizzle, const at::Tensor* bias, std::optional<at::ScalarType> out_dtype,
                                 bool check_device) {
  if (check_device && !(a.is_cuda() && b.is_cuda() && sa.is_cuda() && sb.is_cuda())) return "inputs are not CUDA tensors";
  if (a.scalar_type() != at::kFloat8_e4m3fn && a.scalar_type() != at::kFloat4_e2m1fn_x2)
    return "operands not float8_e4m3fn / float4_e2m1fn_x2 (MXFP8 / MXFP4)";
  if (b.scalar_type() != a.scalar_type()) return "mixed operand dtypes";
  if (a.dim() != 2 || b.dim() != 2) return "operands not 2-D";
  if (sa.scalar_type() != at::kFloat8_e8m0fnu || sb.scalar_type() != at::kFloat8_e8m0fnu) return "scales not float8_e8m0fnu";
  if (!out_dtype.has_value() || (*out_dtype != at::kBFloat16 && *out_dtype != at::kHalf))
    return "output dtype not bf16 / fp16";
  if (bias != nullptr && bias->defined() && bias->scalar_type() != *out_dtype) return "bias dtype differs from the output's";
  if (swizzle != kSwizzleNone && swizzle != kSwizzle32_4_4) return "unknown scale swizzle";
  if (!check_device && (symbolic(a) || symbolic(b) || symbolic(sa) || symbolic(sb) ||
                        (bias != nullptr && bias->defined() && symbolic(*bias))))
    return nullptr;  // shape inference with symbolic sizes (the Meta kernel): the dtypes say MX
  if (a.size(1) != b.size(0)) return "K of A and B differ";
  const int64_t M = a.size(0), N = b.size(1), K = mx_k(a);
  if (K % 32 != 0) return "K not a multiple of 32";
  if (a.stride(1) != 1 || (M > 1 && a.stride(0) < a.size(1))) return "A not row-major";
  if (b.stride(0) != 1 || (N > 1 && b.stride(1) < b.size(0))) return "B not column-major";
  if (const char* why = mx_scale_ineligible(sa, M, K / 32, swizzle)) return why;
  if (const char* why = mx_scale_ineligible(sb, N, K / 32, swizzle)) return why;
  if (bias != nullptr && bias->defined() && (bias->dim() != 1 || bias->size(0) != N || (N > 1 && bias->stride(0) != 1)))
    return "bias not a contiguous [N]";
  if (check_device) {
    const c10::Device d = a.device();
    if (b.device() != d || sa.device() != d || sb.device() != d || (bias && bias->defined() && bias->device() != d))
      return "inputs on different devices";
    return device_unsupported(d);
  }
  return nullptr;
}

// [rows, kb] row-major scales from cuBLAS's blocked layout: [rows/128 tiles][kb/4 tiles] of 512 bytes,
// (r, c) of a tile at byte 16 * (r % 32) + 4 * (r / 32) + c.
at::Tensor unswizzle_scales(const at::Tensor& sc, int64_t rows, int64_t kb) {
  const int64_t R = round_up(rows, 128), C = round_up(kb, 4);
  return sc.view(at::kByte)
      .reshape({R / 128, C / 4, 32, 4, 4})
      .permute({0, 3, 2, 1, 4})
      .reshape({R, C})
      .slice(0, 0, rows)
      .slice(1, 0, kb)
      .contiguous()
      .view(at::kFloat8_e8m0fnu);
}

// Runs ours; false (with the reason noted) when the library declines the call.
bool scaled_mm_run(OpId id, const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa_in, const at::Tensor& sb_in,
                   int64_t swizzle, const at::Tensor* bias, at::ScalarType out_dtype, at::Tensor* out) {
  c10::DeviceGuard guard(a.device());
  const int64_t M = a.size(0), N = b.size(1), K = mx_k(a), kb = K / 32;
  const at::Tensor sa = swizzle == kSwizzleNone ? sa_in : unswizzle_scales(sa_in, M, kb);
  const at::Tensor sb = swizzle == kSwizzleNone ? sb_in : unswizzle_scales(sb_in, N, kb);
  at::Tensor c = empty_unfilled({M, N}, out_dtype);
  const at::Tensor bt = b.t();  // [N, K(bytes)] row-major
  fly_tensor ad = desc_2d(a, M, a.size(1), M > 1 ? a.stride(0) : a.size(1));
  fly_tensor bd = desc_2d(bt, N, bt.size(1), N > 1 ? bt.stride(0) : bt.size(1));
  fly_tensor sad = desc_2d(sa, M, kb, kb), sbd = desc_2d(sb, N, kb, kb), cd = desc_2d(c, M, N, N), biasd{};
  if (bias) biasd = desc_1d(*bias, N);
  // The split-K variants' FP32 partials (docs/mxfp.md "Split-K"; 0 bytes unless one is bundled and
  // would split this shape): a call-scoped buffer from the caching allocator, back to it
  // (stream-ordered) when this returns, as the attention workspace above. Unlike the dense GEMM's
  // stream-K workspace (_ops/gemm.py: a persistent zero-filled per-stream tensor from Python, which
  // CUDA-graph trees reject because it outlives the run), it needs no initialization and keeps no
  // state between calls, so the same code serves eager calls and Inductor's / CUDA-graph captured
  // ones (an allocation made during capture comes from the graph's pool and is freed inside it).
  // Should a captured run ever need otherwise, NULL is the fallback the C API defines: the split
  // variants then run unsplit (correct, only slower).
  size_t ws_bytes = 0;
  c10::DataPtr ws;
  if (fly_scaled_gemm_workspace_size(&ad, &bd, &cd, &ws_bytes) != FLY_SUCCESS) ws_bytes = 0;  // the GEMM says why
  if (ws_bytes > 0) ws = c10::GetAllocator(c10::DeviceType::CUDA)->allocate(ws_bytes);
  const fly_status st = fly_scaled_gemm(&ad, &sad, &bd, &sbd, bias ? &biasd : nullptr, &cd, ws_bytes ? ws.get() : nullptr,
                                        ws_bytes, current_stream(a.device()));
  if (st == FLY_SUCCESS) {
    note_ours(id);
    *out = std::move(c);
    return true;
  }
  TORCH_CHECK(status_means_fallback(st), "flykernels scaled_mm: ", fly_status_string(st), ": ", fly_get_last_error());
  note_fallback(id, fly_get_last_error());
  return false;
}

// The one-element recipe / swizzle of a v2 call, or -1 when the list is not that.
int64_t single(const c10::IValue& v, int64_t if_empty) {
  const auto l = v.toIntList();
  if (l.size() == 0) return if_empty;
  return l.size() == 1 ? l.get(0) : -1;
}

// v2's eligibility from its stack (12 arguments from b0); sets the tensors it read.
const char* scaled_mm_v2_ineligible(const torch::jit::Stack& s, size_t b0, int64_t* swizzle, bool check_device) {
  const at::Tensor& a = s[b0].toTensor();
  const at::Tensor& b = s[b0 + 1].toTensor();
  const auto scale_a = s[b0 + 2].toTensorList(), scale_b = s[b0 + 5].toTensorList();
  if (single(s[b0 + 3], -1) != kRecipeBlockWise1x32 || single(s[b0 + 6], -1) != kRecipeBlockWise1x32)
    return "scale recipe not BlockWise1x32";
  if (scale_a.size() != 1 || scale_b.size() != 1) return "not one scale tensor per operand";
  const int64_t swa = single(s[b0 + 4], kSwizzleNone), swb = single(s[b0 + 7], kSwizzleNone);
  if (swa != swb) return "the operands' scale swizzles differ";
  *swizzle = swa;
  if (s[b0 + 10].toIntList().size() != 0) {
    const auto cd = s[b0 + 10].toIntList();
    if (!(cd.size() == 2 && cd.get(0) == 1 && cd.get(1) == 0)) return "contraction_dim not the plain (1, 0)";
  }
  const at::Tensor* bias = s[b0 + 8].isNone() ? nullptr : &s[b0 + 8].toTensor();
  const std::optional<at::ScalarType> od =
      s[b0 + 9].isNone() ? std::nullopt : std::optional<at::ScalarType>(s[b0 + 9].toScalarType());
  return scaled_mm_ineligible(a, b, scale_a.get(0), scale_b.get(0), swa, bias, od, check_device);
}

// v1: (self, mat2, scale_a, scale_b, bias?, scale_result?, out_dtype?, use_fast_accum); E8M0 scales
// there are cuBLAS's blocked layout.
const char* scaled_mm_v1_ineligible(const torch::jit::Stack& s, size_t b0, bool check_device) {
  if (!s[b0 + 5].isNone()) return "scale_result given";
  const at::Tensor* bias = s[b0 + 4].isNone() ? nullptr : &s[b0 + 4].toTensor();
  const std::optional<at::ScalarType> od =
      s[b0 + 6].isNone() ? std::nullopt : std::optional<at::ScalarType>(s[b0 + 6].toScalarType());
  return scaled_mm_ineligible(s[b0].toTensor(), s[b0 + 1].toTensor(), s[b0 + 2].toTensor(), s[b0 + 3].toTensor(),
                              kSwizzle32_4_4, bias, od, check_device);
}

constexpr size_t kScaledMmV2Args = 12, kScaledMmV1Args = 8;

// CUDA: the calls we take run ours (argument positions per schema: v2's bias 8 and out dtype 9,
// its scales as one-element lists at 2 and 5; v1's scales 2 and 3, bias 4, out dtype 6, always
// the blocked 32_4_4 layout); every other call, or one our library refuses, runs the stock kernel.
template <bool kV1>
void scaled_mm_cuda_boxed(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t n = kV1 ? kScaledMmV1Args : kScaledMmV2Args;
  const size_t b0 = s.size() - n;
  const OpId id = kV1 ? kScaledMmV1 : kScaledMm;
  int64_t swizzle = kSwizzle32_4_4;
  const char* why = kV1 ? scaled_mm_v1_ineligible(s, b0, true) : scaled_mm_v2_ineligible(s, b0, &swizzle, true);
  if (why == nullptr) {
    const c10::IValue& bias_v = s[b0 + (kV1 ? 4 : 8)];
    const at::Tensor* bias = bias_v.isNone() ? nullptr : &bias_v.toTensor();
    const at::Tensor sa = kV1 ? s[b0 + 2].toTensor() : s[b0 + 2].toTensorList().get(0);
    const at::Tensor sb = kV1 ? s[b0 + 3].toTensor() : s[b0 + 5].toTensorList().get(0);
    at::Tensor c;
    if (scaled_mm_run(id, s[b0].toTensor(), s[b0 + 1].toTensor(), sa, sb, swizzle, bias,
                      s[b0 + (kV1 ? 6 : 9)].toScalarType(), &c)) {
      torch::jit::drop(s, n);
      torch::jit::push(s, std::move(c));
      return;
    }
  } else {
    note_fallback(id, why);
  }
  (kV1 ? g_prev_scaled_mm_v1 : g_prev_scaled_mm)->callBoxed(op, ks, stack);
}

// Meta (shape inference under FakeTensor / torch.compile): the stock Meta kernels refuse NO_SWIZZLE
// MX scales on CUDA, so for the calls we take the result is a [M, N] tensor of the output dtype;
// every other call gets the stock Meta kernel's checks and result.
template <bool kV1>
void scaled_mm_meta_boxed(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  auto& s = *stack;
  const size_t n = kV1 ? kScaledMmV1Args : kScaledMmV2Args;
  const size_t b0 = s.size() - n;
  int64_t swizzle = -1;
  const char* why = kV1 ? scaled_mm_v1_ineligible(s, b0, false) : scaled_mm_v2_ineligible(s, b0, &swizzle, false);
  if (why == nullptr) {
    const at::Tensor& a = s[b0].toTensor();
    const at::ScalarType od = s[b0 + (kV1 ? 6 : 9)].toScalarType();
    at::Tensor c = at::empty_symint({a.sym_size(0), s[b0 + 1].toTensor().sym_size(1)}, a.options().dtype(od));
    torch::jit::drop(s, n);
    torch::jit::push(s, std::move(c));
    return;
  }
  (kV1 ? g_prev_scaled_mm_v1_meta : g_prev_scaled_mm_meta)->callBoxed(op, ks, stack);
}

// fly_mx_quantize for the Python side: (q, scales) of x [M, K] (bf16/fp16/fp32, unit inner stride).
std::tuple<at::Tensor, at::Tensor> mx_quantize(const at::Tensor& x, const std::string& format, bool rceil) {
  TORCH_CHECK_VALUE(format == "e4m3" || format == "e2m1", "flykernels mx_quantize: format must be 'e4m3' or 'e2m1', got '",
                    format, "'");
  TORCH_CHECK_VALUE(x.is_cuda(), "flykernels mx_quantize: x must be a CUDA tensor");
  TORCH_CHECK_VALUE(x.dim() == 2, "flykernels mx_quantize: x must be 2-D [M, K], got ", x.dim(), " dimensions");
  TORCH_CHECK_VALUE(is_fly_float(x.scalar_type()), "flykernels mx_quantize: x must be bf16, fp16 or fp32, got ",
                    x.scalar_type());
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK_VALUE(K % 32 == 0, "flykernels mx_quantize: K = ", K, " is not a multiple of 32");
  const bool f4 = format == "e2m1";
  c10::DeviceGuard guard(x.device());
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  at::Tensor q = empty_unfilled({M, f4 ? K / 2 : K}, f4 ? at::kFloat4_e2m1fn_x2 : at::kFloat8_e4m3fn);
  at::Tensor sc = empty_unfilled({M, K / 32}, at::kFloat8_e8m0fnu);
  fly_tensor xd = desc_2d(xc, M, K, M > 1 ? xc.stride(0) : K), qd = desc_2d(q, M, q.size(1), q.size(1)),
             sd = desc_2d(sc, M, K / 32, K / 32);
  const int fmt = (f4 ? FLY_MX_E2M1 : FLY_MX_E4M3) | (rceil ? FLY_MX_SCALE_RCEIL : 0);
  const fly_status st = fly_mx_quantize(&xd, fmt, &qd, &sd, current_stream(x.device()));
  TORCH_CHECK(st == FLY_SUCCESS, "flykernels mx_quantize: ", fly_status_string(st), ": ", fly_get_last_error());
  return {q, sc};
}

// ---- registration: one torch::Library per op, reset to restore the stock kernel --------------
// The dispatcher warns once per process when a kernel is overridden; we override on purpose, so
// that one message is dropped and any other warning goes to the handler that was in place.
class OverrideWarningFilter : public c10::WarningHandler {
 public:
  explicit OverrideWarningFilter(c10::WarningHandler* prev) : prev_(prev) {}
  void process(const c10::Warning& w) override {
    if (w.msg().find("Overriding a previously registered kernel") != std::string::npos) return;
    if (prev_ != nullptr) prev_->process(w);
  }

 private:
  c10::WarningHandler* prev_;
};

std::mutex g_reg_mutex;
std::unordered_map<std::string, std::unique_ptr<torch::Library>> g_overrides;  // "rms_norm", "topk"

c10::OperatorHandle find_op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

std::unique_ptr<torch::Library> new_cuda_impl_library() {
  return std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::CUDA, __FILE__, __LINE__);
}

// Installs the override named `op` ("rms_norm" or "topk", the latter covering topk.values).
bool enable_op(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_reg_mutex);
  if (g_overrides.count(op)) return true;
  OverrideWarningFilter filter(c10::WarningUtils::get_warning_handler());
  c10::WarningUtils::WarningHandlerGuard guard(&filter);
  std::unique_ptr<torch::Library> lib;
  if (op == "rms_norm") {
    auto h = find_op("aten::_fused_rms_norm", "");
    g_prev_rms_norm.emplace(h.getComputedKernelForDispatchKey(c10::DispatchKey::CUDA));
    lib = new_cuda_impl_library();
    lib->impl("_fused_rms_norm", torch::CppFunction::makeFromBoxedFunction<&rms_norm_boxed>());
  } else if (op == "topk") {
    auto h = find_op("aten::topk", "");
    auto hv = find_op("aten::topk", "values");
    g_prev_topk.emplace(h.getComputedKernelForDispatchKey(c10::DispatchKey::CUDA));
    g_prev_topk_values.emplace(hv.getComputedKernelForDispatchKey(c10::DispatchKey::CUDA));
    lib = new_cuda_impl_library();
    lib->impl("topk", torch::CppFunction::makeFromBoxedFunction<&topk_boxed<false>>());
    lib->impl("topk.values", torch::CppFunction::makeFromBoxedFunction<&topk_boxed<true>>());
  } else if (op == "sdpa") {  // flash and memory-efficient forward
    g_prev_sdpa_flash.emplace(find_op("aten::_scaled_dot_product_flash_attention", "")
                                  .getComputedKernelForDispatchKey(c10::DispatchKey::CUDA));
    g_prev_sdpa_efficient.emplace(find_op("aten::_scaled_dot_product_efficient_attention", "")
                                      .getComputedKernelForDispatchKey(c10::DispatchKey::CUDA));
    lib = new_cuda_impl_library();
    lib->impl("_scaled_dot_product_flash_attention", torch::CppFunction::makeFromBoxedFunction<&sdpa_flash_boxed>());
    lib->impl("_scaled_dot_product_efficient_attention",
              torch::CppFunction::makeFromBoxedFunction<&sdpa_efficient_boxed>());
  } else if (op == "sdpa_cudnn") {  // cuDNN forward without log-sum-exp (inference)
    g_prev_sdpa_cudnn.emplace(find_op("aten::_scaled_dot_product_cudnn_attention", "")
                                  .getComputedKernelForDispatchKey(c10::DispatchKey::CUDA));
    lib = new_cuda_impl_library();
    lib->impl("_scaled_dot_product_cudnn_attention", torch::CppFunction::makeFromBoxedFunction<&sdpa_cudnn_boxed>());
  } else if (op == "sdpa_bwd") {  // flash and memory-efficient backward
    g_prev_sdpa_flash_bwd.emplace(find_op("aten::_scaled_dot_product_flash_attention_backward", "")
                                      .getComputedKernelForDispatchKey(c10::DispatchKey::CUDA));
    g_prev_sdpa_efficient_bwd.emplace(find_op("aten::_scaled_dot_product_efficient_attention_backward", "")
                                          .getComputedKernelForDispatchKey(c10::DispatchKey::CUDA));
    lib = new_cuda_impl_library();
    lib->impl("_scaled_dot_product_flash_attention_backward",
              torch::CppFunction::makeFromBoxedFunction<&sdpa_flash_bwd_boxed>());
    lib->impl("_scaled_dot_product_efficient_attention_backward",
              torch::CppFunction::makeFromBoxedFunction<&sdpa_efficient_bwd_boxed>());
  } else if (op == "grouped_mm") {
    g_prev_grouped_mm.emplace(find_op("aten::_grouped_mm", "").getComputedKernelForDispatchKey(c10::DispatchKey::CUDA));
    lib = new_cuda_impl_library();
    lib->impl("_grouped_mm", torch::CppFunction::makeFromBoxedFunction<&grouped_mm_boxed>());
  } else if (op == "scaled_mm") {  // MX F.scaled_mm (v2) and _scaled_mm with E8M0 scales (v1): CUDA and Meta
    auto h2 = find_op("aten::_scaled_mm_v2", ""), h1 = find_op("aten::_scaled_mm", "");
    g_prev_scaled_mm.emplace(h2.getComputedKernelForDispatchKey(c10::DispatchKey::CUDA));
    g_prev_scaled_mm_v1.emplace(h1.getComputedKernelForDispatchKey(c10::DispatchKey::CUDA));
    g_prev_scaled_mm_meta.emplace(h2.getComputedKernelForDispatchKey(c10::DispatchKey::Meta));
    g_prev_scaled_mm_v1_meta.emplace(h1.getComputedKernelForDispatchKey(c10::DispatchKey::Meta));
    lib = new_cuda_impl_library();
    lib->impl("_scaled_mm_v2", torch::CppFunction::makeFromBoxedFunction<&scaled_mm_cuda_boxed<false>>());
    lib->impl("_scaled_mm", torch::CppFunction::makeFromBoxedFunction<&scaled_mm_cuda_boxed<true>>());
    auto meta = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
    meta->impl("_scaled_mm_v2", torch::CppFunction::makeFromBoxedFunction<&scaled_mm_meta_boxed<false>>());
    meta->impl("_scaled_mm", torch::CppFunction::makeFromBoxedFunction<&scaled_mm_meta_boxed<true>>());
    g_overrides["scaled_mm/meta"] = std::move(meta);
  } else {
    TORCH_CHECK_VALUE(false, "flykernels: no eager override named '", op,
                      "' (rms_norm, topk, sdpa, sdpa_cudnn, sdpa_bwd, grouped_mm, scaled_mm)");
  }
  g_overrides[op] = std::move(lib);
  return true;
}

void disable_op(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_reg_mutex);
  g_overrides.erase(op);  // ~Library deregisters our kernels; the stock ones are current again
  g_overrides.erase(op + "/meta");
}

bool op_enabled(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_reg_mutex);
  return g_overrides.count(op) > 0;
}

// ---- dense GEMM for Inductor's candidates -----------------------------------------------------
// A/B as the library sees them: rows-major [r, c] with leading dim, or transposed (col-major).
bool gemm_operand(const at::Tensor& t, fly_tensor& d) {
  if (t.dim() != 2) return false;
  d = fly_tensor{};
  d.data = t.data_ptr();
  d.dtype = fly_dtype_of(t.scalar_type());
  d.rank = 2;
  d.sizes[0] = t.size(0);
  d.sizes[1] = t.size(1);
  d.strides[0] = t.stride(0);
  d.strides[1] = t.stride(1);
  return true;
}

const char* gemm_ineligible(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out, const at::Tensor* bias) {
  if (!a.is_cuda() || !b.is_cuda() || !out.is_cuda()) return "not CUDA tensors";
  const auto dt = a.scalar_type();
  if (dt != at::kHalf && dt != at::kBFloat16) return "dtype not covered (fp16, bf16)";
  if (b.scalar_type() != dt || out.scalar_type() != dt) return "mixed dtypes";
  if (a.dim() != 2 || b.dim() != 2 || out.dim() != 2) return "not 2-D";
  if (a.size(1) != b.size(0) || out.size(0) != a.size(0) || out.size(1) != b.size(1)) return "shape mismatch";
  if (a.numel() == 0 || b.numel() == 0) return "empty operand";
  if (out.stride(1) != 1 || out.stride(0) < out.size(1)) return "out is not row-major";
  if (bias != nullptr) {
    if (bias->scalar_type() != dt || bias->dim() != 1 || bias->size(0) != out.size(1) || bias->stride(0) != 1)
      return "bias is not a contiguous [N] vector of the same dtype";
  }
  if (a.device() != out.device() || b.device() != out.device()) return "operands on different devices";
  return device_unsupported(out.device());
}

// Whether TMA cannot address this operand (a base not 16-byte aligned, or a leading dimension
// that is not a multiple of 8 elements): fly_gemm then copies it into the workspace (its packed
// path) when there is room, else runs its cp.async kernel. A cheap guess of the library's rule:
// it decides; this only says when a scratch buffer is worth allocating.
bool gemm_needs_copies(const at::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return true;
  const int64_t ld = t.stride(1) == 1 ? t.stride(0) : t.stride(1);
  const int64_t lines = t.stride(1) == 1 ? t.size(0) : t.size(1);
  return lines > 1 && ld % 8 != 0;
}

// Scratch for the packed path when the caller has no workspace (Inductor's calls): 4096 bytes
// (where stream-K's flags would be: left unused, so uninitialized memory is fine) plus the copies,
// which fly_gemm_workspace_size reports beyond its shape-independent stream-K part. Freed when
// the call returns (the caching allocator reuses it in stream order). Undefined when the library
// needs no copies.
at::Tensor gemm_copy_scratch(const fly_tensor& ad, const fly_tensor& bd, const fly_tensor& cd, const c10::Device& dev) {
  size_t total = 0, aligned = 0;
  if (fly_gemm_workspace_size(&ad, &bd, &cd, &total) != FLY_SUCCESS) return {};
  fly_tensor x{};  // any aligned operand of the same dtype: the stream-K part alone
  x.data = reinterpret_cast<void*>(uintptr_t(256));
  x.dtype = ad.dtype;
  x.rank = 2;
  x.sizes[0] = x.sizes[1] = 8;
  x.strides[0] = 8;
  x.strides[1] = 1;
  if (fly_gemm_workspace_size(&x, &x, &x, &aligned) != FLY_SUCCESS || total <= aligned) return {};
  const int64_t bytes = static_cast<int64_t>(total - aligned) + 4096;
  return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(dev));
}

// Our GEMM into `out` (bias optional); false when ineligible or declined (out untouched). The
// stream-K workspace comes from Python (zero-filled, per stream, outside CUDA-graph pools).
bool gemm_try(const at::Tensor& a, const at::Tensor& b, at::Tensor& out, const at::Tensor* bias,
              const std::optional<at::Tensor>& workspace, OpId op) {
  const char* why = gemm_ineligible(a, b, out, bias);
  if (why != nullptr) {
    note_fallback(op, why);
    return false;
  }
  c10::DeviceGuard guard(out.device());
  fly_tensor ad, bd, cd, biasd;
  gemm_operand(a, ad);
  gemm_operand(b, bd);
  cd = desc_2d(out, out.size(0), out.size(1), out.stride(0));
  if (bias != nullptr) biasd = desc_1d(*bias, bias->size(0));
  void* ws_ptr = nullptr;
  size_t ws_bytes = 0;
  at::Tensor scratch;
  if (workspace.has_value() && workspace->defined() && workspace->is_cuda() && workspace->device() == out.device()) {
    ws_ptr = workspace->data_ptr();
    ws_bytes = static_cast<size_t>(workspace->nbytes());
  } else if (gemm_needs_copies(a) || gemm_needs_copies(b)) {
    scratch = gemm_copy_scratch(ad, bd, cd, out.device());
    if (scratch.defined()) {
      ws_ptr = scratch.data_ptr();
      ws_bytes = static_cast<size_t>(scratch.nbytes());
    }
  }
  fly_status st = fly_gemm(&ad, &bd, &cd, bias != nullptr ? &biasd : nullptr, ws_ptr, ws_bytes,
                           current_stream(out.device()));
  if (st == FLY_SUCCESS) {
    note_ours(op);
    return true;
  }
  if (status_means_fallback(st)) {
    note_fallback(op, fly_get_last_error());
    return false;
  }
  TORCH_CHECK(false, "flykernels gemm: ", fly_status_string(st), ": ", fly_get_last_error());
}

// Bytes of stream-K workspace fly_gemm can use (0: none bundled); device and shape independent.
int64_t gemm_workspace_size(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  fly_tensor ad, bd;
  if (!gemm_operand(a, ad) || !gemm_operand(b, bd) || out.dim() != 2) return 0;
  fly_tensor cd = desc_2d(out, out.size(0), out.size(1), out.stride(0));
  size_t need = 0;
  return fly_gemm_workspace_size(&ad, &bd, &cd, &need) == FLY_SUCCESS ? static_cast<int64_t>(need) : 0;
}

// out = a @ b; what we do not cover runs at::mm_out.
void mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor out, const std::optional<at::Tensor>& workspace) {
  if (!gemm_try(a, b, out, nullptr, workspace, kMm)) at::mm_out(out, a, b);
}

// out = bias + a @ b with bias a [N] vector (or its [M, N] broadcast view); else at::addmm_out.
void addmm_out(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b, at::Tensor out, double beta,
               double alpha, const std::optional<at::Tensor>& workspace) {
  at::Tensor vec;
  if (beta == 1.0 && alpha == 1.0) {
    if (bias.dim() == 1) vec = bias;
    else if (bias.dim() == 2 && bias.stride(0) == 0 && bias.size(1) == out.size(1)) vec = bias.select(0, 0);
  }
  if (!vec.defined()) {
    note_fallback(kAddmm, "bias is not an [N] vector or alpha/beta are not 1");
  } else if (gemm_try(a, b, out, &vec, workspace, kAddmm)) {
    return;
  }
  at::addmm_out(out, bias, a, b, beta, alpha);
}

// out = F.grouped_mm(a, b, offs) for Inductor's grouped GEMM candidate: fly_grouped_gemm into
// Inductor's [T, N] row-major buffer where it covers the call, else the stock op's result copied.
void grouped_mm_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, at::Tensor out) {
  const char* why = grouped_mm_ineligible(a, b, &offs, nullptr, out.scalar_type(), true);
  if (why == nullptr && b.dim() != 3) why = "not the 2-D x 3-D form (Inductor's candidate)";
  if (why == nullptr && !(out.dim() == 2 && out.size(0) == a.size(0) && out.size(1) == b.size(2) &&
                          out.stride(1) == 1 && (out.size(0) <= 1 || out.stride(0) == out.size(1))))
    why = "output not a row-major [T, N]";
  if (why == nullptr) {
    if (grouped_mm_run(a, b, offs, out)) return;
  } else {
    note_fallback(kGroupedMm, why);
  }
  out.copy_(at::_grouped_mm(a, b, offs));
}

// ---- Python-facing helpers --------------------------------------------------------------------
std::string explain_rms_norm(const at::Tensor& x, std::vector<int64_t> normalized_shape,
                             std::optional<at::Tensor> weight, std::optional<double> eps, bool check_device) {
  const char* why = rms_norm_ineligible(x, normalized_shape, weight ? &*weight : nullptr, eps, check_device);
  return why ? why : "";
}

std::string explain_topk(const at::Tensor& x, int64_t k, int64_t dim, bool check_device) {
  const char* why = topk_ineligible(x, k, dim, check_device);
  return why ? why : "";
}

std::string explain_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double dropout_p,
                         bool check_device) {
  const char* why = sdpa_ineligible(q, k, v, dropout_p, check_device);
  return why ? why : "";
}

// '' when our MX GEMM takes an F.scaled_mm call with these operands (swizzle 0: NO_SWIZZLE, 1:
// SWIZZLE_32_4_4; out_dtype None: the call's default), else why not.
std::string explain_scaled_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& sa, const at::Tensor& sb,
                              int64_t swizzle, std::optional<at::Tensor> bias, std::optional<at::ScalarType> out_dtype,
                              bool check_device) {
  const char* why = scaled_mm_ineligible(a, b, sa, sb, swizzle, bias ? &*bias : nullptr, out_dtype, check_device);
  return why ? why : "";
}

std::string explain_grouped_mm(const at::Tensor& a, const at::Tensor& b, std::optional<at::Tensor> offs,
                               std::optional<at::Tensor> bias, bool check_device) {
  const char* why = grouped_mm_ineligible(a, b, offs ? &*offs : nullptr, bias ? &*bias : nullptr, std::nullopt,
                                          check_device);
  return why ? why : "";
}

py::dict counts() {
  py::dict d;
  for (int i = 0; i < kOpCount; ++i)
    d[kOpNames[i]] = py::make_tuple(g_counts[i].ours.load(), g_counts[i].stock.load());
  return d;
}

void reset_counts() {
  for (auto& c : g_counts) {
    c.ours = 0;
    c.stock = 0;
  }
}

void set_log(bool on) {
  g_log = on;
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_logged_reasons.clear();
}

py::dict library_info() {
  py::dict d;
  d["version"] = std::string(fly_version_string());
  const int n = fly_variant_count();
  d["variant_count"] = n;
  py::dict families;
  for (int i = 0; i < n; ++i) {
    const char* fam = nullptr;
    const char* params = nullptr;
    const char* name = fly_variant_name(i);
    if (name && fly_variant_info(name, &fam, &params) == FLY_SUCCESS && fam) {
      py::str key(fam);
      families[key] = families.contains(key) ? py::int_(families[key].cast<int>() + 1) : py::int_(1);
    }
  }
  d["families"] = families;
  return d;
}

// (ok, arch-or-reason) for CUDA device `index`, or for "no device" when index < 0.
py::tuple device_status(int64_t index) {
  const char* arch = nullptr;
  fly_status st;
  if (index < 0) {
    st = fly_device_arch(nullptr, &arch);
  } else {
    c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
    c10::DeviceGuard guard(dev);
    st = fly_device_arch(current_stream(dev), &arch);
  }
  if (st == FLY_SUCCESS) return py::make_tuple(true, std::string(arch ? arch : ""));
  return py::make_tuple(false, std::string(fly_status_string(st)) + ": " + fly_get_last_error());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "FlyKernels' PyTorch extension (calls libflykernels through its C ABI only)";
  m.def("enable_op", &enable_op, "install the CUDA-key override named op (rms_norm, topk, sdpa, sdpa_cudnn, sdpa_bwd, grouped_mm, scaled_mm)");
  m.def("disable_op", &disable_op, "remove the override named op; the stock kernel is current again");
  m.def("op_enabled", &op_enabled);
  m.def("explain_rms_norm", &explain_rms_norm, py::arg("x"), py::arg("normalized_shape"), py::arg("weight"),
        py::arg("eps"), py::arg("check_device") = true, "'' when our RMSNorm takes the call, else why not");
  m.def("explain_topk", &explain_topk, py::arg("x"), py::arg("k"), py::arg("dim") = -1,
        py::arg("check_device") = true, "'' when our TopK takes the call, else why not");
  m.def("explain_sdpa", &explain_sdpa, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dropout_p") = 0.0,
        py::arg("check_device") = true);
  m.def("explain_grouped_mm", &explain_grouped_mm, py::arg("a"), py::arg("b"), py::arg("offs"), py::arg("bias"),
        py::arg("check_device") = true);
  m.def("explain_scaled_mm", &explain_scaled_mm, py::arg("a"), py::arg("b"), py::arg("scale_a"), py::arg("scale_b"),
        py::arg("swizzle") = 0, py::arg("bias") = py::none(), py::arg("out_dtype") = py::none(),
        py::arg("check_device") = true);
  m.def("mx_quantize", &mx_quantize, py::arg("x"), py::arg("format") = "e4m3", py::arg("rceil") = false,
        "(q, scales) of x [M, K]: float8_e4m3fn [M, K] or float4_e2m1fn_x2 [M, K/2], float8_e8m0fnu [M, K/32]");
  m.def("mm_out", &mm_out, py::arg("a"), py::arg("b"), py::arg("out"), py::arg("workspace") = py::none());
  m.def("addmm_out", &addmm_out, py::arg("bias"), py::arg("a"), py::arg("b"), py::arg("out"), py::arg("beta") = 1.0,
        py::arg("alpha") = 1.0, py::arg("workspace") = py::none());
  m.def("grouped_mm_out", &grouped_mm_out, py::arg("a"), py::arg("b"), py::arg("offs"), py::arg("out"));
  m.def("gemm_workspace_size", &gemm_workspace_size, py::arg("a"), py::arg("b"), py::arg("out"));
  m.def("counts", &counts, "{op: (ours, stock)} dispatch counts since the last reset");
  m.def("reset_counts", &reset_counts);
  m.def("set_log", &set_log, "print each fallback reason once (FLYKERNELS_LOG=info)");
  m.def("library_info", &library_info);
  m.def("device_status", &device_status);
}
