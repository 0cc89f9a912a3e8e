// SPDX-License-Identifier: Apache-2.0
// Internal runtime interface shared by the per-op launchers (src/ops/*.cpp).
// Nothing here is exported from libflykernels.so: only fly_* C functions are.
#pragma once

#include <cuda.h>  // types only: the driver is reached through dlopen (driver.cpp)

#include <cstdarg>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dispatch_key.hpp"  // DispatchKey, KeyDim and every op's key (keys::)
#include "flykernels/flykernels.h"

namespace fly {

// ---- errors ----------------------------------------------------------------------------
// Sets the thread-local message (printf-style) and returns `s`, so `return fail(...)` reads well.
fly_status fail(fly_status s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void clear_error();
// `s` as it may appear in a message: control and non-ASCII bytes escaped (\xNN), at most `max`
// bytes of it, then "...(N bytes)". Caller strings are never echoed whole.
std::string printable(const char* s, size_t max = 96);
#define FLY_TRY(expr)                          \
  do {                                         \
    fly_status fly_try_s_ = (expr);            \
    if (fly_try_s_ != FLY_SUCCESS) return fly_try_s_; \
  } while (0)

// ---- logging (FLYKERNELS_LOG=info|debug) -------------------------------------------------
enum class LogLevel { kOff = 0, kInfo = 1, kDebug = 2 };
LogLevel log_level();
void log(LogLevel lvl, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// ---- dtypes and tensor validation --------------------------------------------------------
size_t dtype_size(fly_dtype dt);      // 0 for invalid
// The descriptor's dtype field as the integer a C caller stored (any int): read without loading
// it as fly_dtype, which is undefined in C++ for values outside the enum.
int32_t dtype_value(const fly_tensor& t);
const char* dtype_name(fly_dtype dt);  // "fp16", "bf16", "fp32", ... ("invalid")

// Checks a descriptor is well formed: non-null descriptor and data (unless numel == 0), valid
// dtype, rank as expected, sizes >= 0, strides >= 0, element alignment of data, and no int64
// overflow of the byte extent. `what` names the argument in the message ("x", "weight", ...).
fly_status check_tensor(const fly_tensor* t, const char* what, int rank);
int64_t numel(const fly_tensor& t);
// A rank-1 tensor of exactly n elements of dtype dt with unit stride (any stride when n <= 1).
fly_status check_vector(const fly_tensor* t, const char* what, int64_t n, fly_dtype dt);
// Rows of a rank-2 tensor: unit inner stride (or one column), rows not overlapping. A layout no
// kernel reads (another inner stride, an input's overlapping rows) is FLY_ERROR_UNSUPPORTED; an
// output whose rows overlap is a mistake, FLY_ERROR_INVALID_ARGUMENT (docs/robustness.md).
fly_status check_row_layout(const fly_tensor& t, const char* what, bool output);
// One [M, N] operand of a row-wise op: a well-formed rank-2 tensor of the call's dtype and shape
// (those of the argument named `lead`) whose rows pass check_row_layout.
fly_status check_row_operand(const fly_tensor* t, const char* what, const char* lead, fly_dtype dt, int64_t M,
                             int64_t N, bool output);
// Bytes from data to one past the furthest element (0 when numel == 0).
int64_t extent_bytes(const fly_tensor& t);
// A workspace argument (every op that takes one): NULL only with 0 bytes (else
// FLY_ERROR_INVALID_ARGUMENT), a size below the 48-bit address space (so int64 arithmetic on it
// stays exact), `align`-byte alignment (FLY_ERROR_MISALIGNED). Whether it is large enough is the
// op's business: a required workspace that is too small is FLY_ERROR_WORKSPACE (docs/robustness.md).
fly_status check_optional_workspace(const void* workspace, size_t bytes, size_t align = 256);
// Whether the byte ranges [first element, last element] of two tensors intersect (false when
// either holds no element). Conservative: interleaved views whose elements never coincide count.
bool tensors_overlap(const fly_tensor& a, const fly_tensor& b);
// An output must not share memory with another argument (FLY_ERROR_INVALID_ARGUMENT naming both).
// `in` may be NULL (an optional argument). With `same_ok`, an `in` that is exactly `out` (same
// data, dtype, sizes and strides: in place) passes. Host arithmetic only: run before the device
// check, so a call is refused the same way with or without a GPU.
fly_status check_disjoint(const fly_tensor* out, const char* out_name, const fly_tensor* in, const char* in_name,
                          bool same_ok = false);
// The same for a workspace of `bytes` bytes and a tensor argument.
fly_status check_workspace_disjoint(const void* workspace, size_t bytes, const fly_tensor* t, const char* what);

// ---- driver (dlopen'd libcuda.so.1) -------------------------------------------------------
struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetAttribute)(int*, CUdevice_attribute, CUdevice);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*cuFuncGetAttribute)(int*, CUfunction_attribute, CUfunction);
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*cuMemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr);
  CUresult (*cuPointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr);
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                     const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                     const cuuint32_t*, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion,
                                     CUtensorMapFloatOOBfill);
};
// Loads libcuda.so.1 and cuInit(0) once. FLY_ERROR_NO_DEVICE when there is no driver/device.
fly_status driver(const Driver** out);
// Turns a failed CUresult into FLY_ERROR_CUDA with "<call>: <name> (<description>)".
fly_status cuda_fail(CUresult r, const char* call);
#define FLY_CU(call_expr, name)                                  \
  do {                                                           \
    CUresult fly_cu_r_ = (call_expr);                            \
    if (fly_cu_r_ != CUDA_SUCCESS) return ::fly::cuda_fail(fly_cu_r_, name); \
  } while (0)

// One CUDA context (normally a device's primary context) as seen by the library.
struct DeviceCtx {
  CUcontext ctx = nullptr;
  CUdevice device = 0;
  std::string arch;          // "sm_90a"
  std::string name;          // "NVIDIA H200"
  int sm_count = 0;
  int max_smem_optin = 0;    // bytes per block with opt-in
  int l2_bytes = 0;
};

// Makes the stream's context current for the lifetime of the guard (restores on destruction),
// and names it this thread's call device for the pointer checks below.
class ScopedContext {
 public:
  ScopedContext() = default;
  ~ScopedContext();
  fly_status enter(void* stream, const DeviceCtx** out);  // resolve + push
 private:
  bool pushed_ = false;
  bool named_ = false;                // enter() named the call device (the destructor restores outer_)
  const DeviceCtx* outer_ = nullptr;
};

// Checks that [t.data, t.data + extent) lies inside one device allocation of the call's device
// (catches host pointers, buffers that are too small, and memory of another GPU than the
// stream's; managed memory may be any device's). Call after ScopedContext::enter. Skipped when
// FLYKERNELS_CHECK_POINTERS=0.
fly_status check_device_pointer(const fly_tensor& t, const char* what);
// The same for a raw byte range (workspace buffers).
fly_status check_device_bytes(const void* data, int64_t bytes, const char* what);

// ---- variants: the archive's directory is the registry ------------------------------------
struct Variant {
  std::string name;     // canonical, encodes every parameter: "rmsnorm_bf16_t256_r1_c4"
  std::string family;   // "rmsnorm"
  std::string params;   // "dtype=bf16;tpr=256;rpc=1;cache=4"
  std::map<std::string, std::string> kv;
  int64_t get_int(const std::string& key, int64_t dflt = -1) const;
  std::string get(const std::string& key, const std::string& dflt = "") const;
};
const std::vector<Variant>& all_variants();                 // empty when the archive is broken
const Variant* find_variant(const std::string& name);       // nullptr when not bundled
std::vector<const Variant*> variants_of(const std::string& family);

// CUfunction `kernel` of variant `v` in the given context: decompresses, verifies the checksum,
// loads the module once per (context, variant) and caches it. Thread-safe.
fly_status get_function(const DeviceCtx& dc, const Variant& v, const char* kernel, CUfunction* out);

// ---- launch -----------------------------------------------------------------------------
struct LaunchConfig {
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned smem = 0;          // dynamic shared memory bytes (attribute raised when > 48 KiB)
  unsigned cluster[3] = {1, 1, 1};
};
// A grid-stride kernel's launch (memory-bound elementwise families): CTAs of `threads`, enough to
// give every unit of work a thread but at most `per_sm` per SM: that many resident threads keep HBM
// busy, and the kernel's grid-stride loop walks the rest.
inline LaunchConfig grid_stride_launch(int64_t units, int threads, int sm_count, int per_sm) {
  const int64_t want = (units + threads - 1) / threads, cap = int64_t(sm_count) * per_sm;
  LaunchConfig cfg;
  cfg.grid[0] = unsigned(want < 1 ? 1 : want < cap ? want : cap);
  cfg.block[0] = unsigned(threads);
  return cfg;
}
// Launches `f` on `stream` with one or more kernel parameters (pointers to the values).
fly_status launch(CUfunction f, const LaunchConfig& cfg, void* stream, void** args);
// Convenience: a single by-value parameter struct.
template <class P>
fly_status launch1(CUfunction f, const LaunchConfig& cfg, void* stream, const P& params) {
  void* args[] = {const_cast<P*>(&params)};
  return launch(f, cfg, stream, args);
}

// ---- dispatch -------------------------------------------------------------------------------
// Decides the variant for one call:
//   forced (fly_force_variant) -> overlay DB exact -> embedded DB exact -> nearest bucket in
//   either (log2 distance, k[0] weighted most) -> `fallback()` (the family's default rule).
// Candidates from the DB are skipped when not bundled, of another family, or when
// `supports(v)` is false. Results are cached per (device arch, key). Logs at info level.
// `key_names` names k[] for logs ("N","M").
struct DispatchRequest {
  DispatchKey key;
  const char* family;
  const char* key_names[kKeyDims] = {"k0", "k1", "k2", "k3"};
  std::function<bool(const Variant&)> supports;        // may be empty: everything supported
  std::function<std::string()> fallback;               // name of the default variant
  // Everything `supports` depends on beyond `key` (alignment, workspace size, flags), so that
  // the per-shape cache never hands a decision to a call it does not fit. May be empty.
  std::string cache_tag;
  // May be empty. A row whose winner can run the call but fails `prefer` (e.g. a split-K winner
  // called without its workspace: it would run unsplit, slower than the row's runner-up) takes
  // the row's runner-up when that one is bundled and passes both; else the winner still. A forced
  // variant ignores it. Part of the cache key's inputs like `supports` (cache_tag).
  std::function<bool(const Variant&)> prefer;
  // May be empty. Profile rows (the database's `profile` table, tuning_db.hpp ProfileRow, rows of
  // op `profile_op`, the op they serve, e.g. "gemm": one row per (shape, variant) of a profiling
  // run, k0..k2 the shape in this key's order, layout the shape's layout, variant the name
  // measured, rel_time its time over the best time on that shape): where no exact row exists, the
  // kProfileNeighbours profiled shapes nearest the key (log2 distance, +1 for another layout)
  // vote before the nearest-row rule. Each variant listed at one of them (mapped to this call's
  // name by `profile_name`; it must be bundled and pass `supports`) scores the mean log of its
  // relative time over the neighbours, capped at kProfileCap (also where a neighbour lacks it);
  // the lowest score wins ("db:profile").
  std::string profile_op;
  std::function<std::string(const std::string&)> profile_name;
};
constexpr int kProfileNeighbours = 5;
constexpr double kProfileCap = 1.3;
constexpr double kProfileLayoutPenalty = 1.0;
fly_status choose_variant(const DeviceCtx& dc, const DispatchRequest& req, const Variant** out);

// The single-kernel call path in one step: the variant `req` decides, its CUfunction `kernel`
// in dc's context and the driver table, or the first failure's status.
struct ResolvedKernel {
  const Variant* v = nullptr;
  CUfunction f = nullptr;
  const Driver* d = nullptr;
};
fly_status resolve_kernel(const DeviceCtx& dc, const DispatchRequest& req, const char* kernel, ResolvedKernel* out);

// The request every op starts from: the op's key (dispatch_key.hpp keys::) and family. The op adds
// `supports`, `fallback` and `cache_tag`.
DispatchRequest make_request(const char* family, const ShapeKey& key);
// The same from the key's parts (op, dtype, layout, up to kKeyDims dimensions in the DB's k0, k1,
// ... order; missing ones hold 0 and log as "-"): tests, and keys no op computes.
DispatchRequest make_request(const char* family, const char* op, const std::string& dtype, const char* layout,
                             std::initializer_list<KeyDim> dims);

}  // namespace fly
