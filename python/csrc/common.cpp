// SPDX-License-Identifier: Apache-2.0
// Shared parts of the flykernels._C extension (common.hpp) and the registration of the override
// table (overrides.hpp).
#include "common.hpp"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>

#include "overrides.hpp"

namespace flyk {

// ---- counters and the fallback log -------------------------------------------------------------
const char* const kOpNames[kOpCount] = {"rms_norm",       "topk",       "topk.values",       "mm",
                                        "addmm",          "sdpa_flash", "sdpa_efficient",    "sdpa_cudnn",
                                        "sdpa_flash_bwd", "sdpa_efficient_bwd", "grouped_mm",
                                        "scaled_mm",      "scaled_mm_v1", "glu",            "glu_bwd",
                                        "rope",           "rope_bwd",
                                        "add_rms_norm",   "add_rms_norm_bwd",
                                        "moe_route",      "moe_route_bwd", "moe_permute",    "moe_permute_bwd",
                                        "moe_unpermute",  "moe_unpermute_bwd",
                                        "cross_entropy",  "cross_entropy_loss",
                                        "mx_linear",      "mx_linear_mx"};

namespace {
struct OpCounts {
  std::atomic<uint64_t> ours{0};
  std::atomic<uint64_t> stock{0};
};
OpCounts g_counts[kOpCount];

std::atomic<bool> g_log{false};
std::mutex g_log_mutex;
std::set<std::string> g_logged_reasons;
}  // namespace

void note_fallback(OpId op, const char* reason) {
  g_counts[op].stock.fetch_add(1, std::memory_order_relaxed);
  if (!g_log.load(std::memory_order_relaxed)) return;
  std::string key = std::string(kOpNames[op]) + ": " + reason;
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (g_logged_reasons.insert(key).second)
    std::fprintf(stderr, "flykernels: %s -> stock kernel (%s)\n", kOpNames[op], reason);
}

void note_ours(OpId op) { g_counts[op].ours.fetch_add(1, std::memory_order_relaxed); }
uint64_t count_ours(OpId op) { return g_counts[op].ours.load(); }
uint64_t count_stock(OpId op) { return g_counts[op].stock.load(); }

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

// ---- device support, cached per device -------------------------------------------------------
namespace {
constexpr int kMaxDevices = 64;
std::array<std::atomic<int8_t>, kMaxDevices> g_device_ok{};  // 0 unknown, 1 yes, -1 no
std::mutex g_device_mutex;
std::array<std::string, kMaxDevices> g_device_reason;
}  // namespace

void* current_stream(const c10::Device& device) {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
}

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

// ---- descriptors -----------------------------------------------------------------------------
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

bool is_fly_float(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat; }

const char* dtype_key(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return "fp16";
    case at::kBFloat16: return "bf16";
    case at::kFloat: return "fp32";
    default: return "";
  }
}

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

fly_tensor desc_nd(const at::Tensor& t) {
  fly_tensor d{};
  d.data = t.data_ptr();
  d.dtype = fly_dtype_of(t.scalar_type());
  d.rank = static_cast<int>(t.dim());
  for (int64_t i = 0; i < t.dim() && i < FLY_MAX_RANK; ++i) {
    d.sizes[i] = t.size(i);
    d.strides[i] = t.stride(i);
  }
  if (t.dim() > FLY_MAX_RANK) d.rank = FLY_MAX_RANK + 1;  // the library names the rank it wants
  return d;
}

bool row_view(const at::Tensor& t, int64_t* M, int64_t* ld) {
  const int64_t d = t.dim();
  if (d == 0) return false;
  const int64_t N = t.size(d - 1);
  if (N > 1 && t.stride(d - 1) != 1) return false;
  int64_t rows = 1, stride = N, inner = -1;  // inner: the non-trivial leading dimension just inside i
  for (int64_t i = 0; i + 1 < d; ++i) rows *= t.size(i);
  for (int64_t i = d - 2; i >= 0; --i) {
    if (t.size(i) == 1) continue;
    if (inner < 0) stride = t.stride(i);  // the row stride: the innermost one's, never an outer one's
    else if (t.stride(i) != t.stride(inner) * t.size(inner)) return false;
    inner = i;
  }
  *M = rows;
  *ld = stride;
  return true;
}

fly_tensor row_desc(const at::Tensor& t) {
  int64_t M = 0, ld = 0;
  row_view(t, &M, &ld);
  return desc_2d(t, M, t.size(-1), ld);
}

at::Tensor empty_unfilled(c10::IntArrayRef sizes, at::ScalarType dtype) {
  return at::Tensor(at::detail::empty_generic(sizes, c10::GetAllocator(c10::DeviceType::CUDA),
                                              c10::DispatchKeySet(c10::DispatchKey::CUDA), dtype,
                                              c10::MemoryFormat::Contiguous));
}

bool status_means_fallback(fly_status st) {
  // WORKSPACE too: the overrides size workspaces from the library's query, so a refusal means a
  // path (e.g. aligned copies of odd strides) they did not provide for; stock runs the call.
  return st == FLY_ERROR_UNSUPPORTED || st == FLY_ERROR_INVALID_ARGUMENT || st == FLY_ERROR_MISALIGNED ||
         st == FLY_ERROR_ARCH_NOT_BUILT || st == FLY_ERROR_NO_DEVICE || st == FLY_ERROR_WORKSPACE;
}

std::optional<double> opt_double(const c10::IValue& v) {
  return v.isNone() ? std::nullopt : std::optional<double>(v.toDouble());
}

bool symbolic(const at::Tensor& t) { return t.unsafeGetTensorImpl()->has_symbolic_sizes_strides(); }

// ---- registration of the override table --------------------------------------------------------
namespace {

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

// The registered kernel of one table entry: forwards to its BoxedOverride with the entry itself.
class TableKernel final : public c10::OperatorKernel {
 public:
  explicit TableKernel(const Impl* impl) : impl_(impl) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    impl_->kernel(*impl_, op, ks, stack);
  }

 private:
  const Impl* impl_;
};

std::mutex g_reg_mutex;

// What the dispatcher's table names as the registering file of our kernels ("registered at
// flykernels._C:<family file>:0"; python/tests match the "flykernels._C" part).
const char* registration_label(const Override& ov) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<std::string>> labels;  // stable c-strings for torch::Library
  std::lock_guard<std::mutex> lock(mu);
  std::string file = ov.file ? ov.file : "?";
  const size_t slash = file.find_last_of('/');
  if (slash != std::string::npos) file = file.substr(slash + 1);
  const std::string label = "flykernels._C:" + file;
  for (const auto& l : labels)
    if (*l == label) return l->c_str();
  labels.push_back(std::make_unique<std::string>(label));
  return labels.back()->c_str();
}

void append(std::vector<Override>& table, std::vector<Override> rows) {
  for (auto& r : rows) table.push_back(std::move(r));
}

Override* find_override(const std::string& family) {
  for (auto& ov : override_table())
    if (family == ov.family) return &ov;
  return nullptr;
}

Override& known_override(const std::string& family) {
  Override* ov = find_override(family);
  if (ov == nullptr) {
    std::string names;
    for (const auto& n : override_names()) names += (names.empty() ? "" : ", ") + n;
    TORCH_CHECK_VALUE(false, "flykernels: no eager override named '", family, "' (", names, ")");
  }
  return *ov;
}

}  // namespace

std::vector<Override>& override_table() {
  static std::vector<Override> table = [] {
    std::vector<Override> t;
    append(t, rmsnorm_overrides());
    append(t, topk_overrides());
    append(t, attention_overrides());
    append(t, grouped_mm_overrides());
    append(t, scaled_mm_overrides());
    return t;
  }();
  return table;
}

std::vector<std::string> override_names() {
  std::vector<std::string> names;
  for (const auto& ov : override_table()) names.emplace_back(ov.family);
  return names;
}

bool enable_op(const std::string& family) {
  std::lock_guard<std::mutex> lock(g_reg_mutex);
  Override& ov = known_override(family);
  if (!ov.libs.empty()) return true;
  OverrideWarningFilter filter(c10::WarningUtils::get_warning_handler());
  c10::WarningUtils::WarningHandlerGuard guard(&filter);
  for (Impl& impl : ov.impls)
    impl.prev.emplace(c10::Dispatcher::singleton()
                          .findSchemaOrThrow(impl.op, impl.overload)
                          .getComputedKernelForDispatchKey(impl.key));
  std::vector<std::unique_ptr<torch::Library>> libs;
  std::vector<c10::DispatchKey> keys;
  for (const Impl& impl : ov.impls)
    if (std::find(keys.begin(), keys.end(), impl.key) == keys.end()) keys.push_back(impl.key);
  const char* label = registration_label(ov);
  for (c10::DispatchKey key : keys) {
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key, label, 0);
    for (const Impl& impl : ov.impls) {
      if (impl.key != key) continue;
      std::string name = impl.op;
      if (name.rfind("aten::", 0) == 0) name = name.substr(6);
      if (impl.overload[0] != '\0') name += std::string(".") + impl.overload;
      lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<TableKernel>(&impl)));
    }
    libs.push_back(std::move(lib));
  }
  ov.libs = std::move(libs);
  return true;
}

void disable_op(const std::string& family) {
  std::lock_guard<std::mutex> lock(g_reg_mutex);
  known_override(family).libs.clear();  // ~Library deregisters our kernels; the previous ones are current again
}

bool op_enabled(const std::string& family) {
  std::lock_guard<std::mutex> lock(g_reg_mutex);
  return !known_override(family).libs.empty();
}

}  // namespace flyk
