// SPDX-License-Identifier: Apache-2.0
// CUDA driver through dlopen("libcuda.so.1"): the library loads and answers without a GPU.
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "core.hpp"

#ifndef FLY_BUILT_ARCH
#define FLY_BUILT_ARCH "sm_90a"
#endif

namespace fly {

namespace {

struct DriverState {
  Driver d{};
  fly_status status = FLY_ERROR_NO_DEVICE;
  std::string message;
};

template <class F>
bool sym(void* lib, F*& out, const char* name) {
  out = reinterpret_cast<F*>(dlsym(lib, name));
  return out != nullptr;
}

const DriverState& state() {
  static const DriverState* s = [] {
    auto* st = new DriverState();
    // An empty FLYKERNELS_LIBCUDA is unset: dlopen("") would return the main program.
    const char* env = std::getenv("FLYKERNELS_LIBCUDA");
    const bool custom = env && *env;
    const std::string libname = custom ? env : "libcuda.so.1";
    const std::string shown = printable(libname.c_str(), 256);
    void* lib = dlopen(libname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      st->message = "no CUDA driver: dlopen(" + shown + ") failed: " + printable(why ? why : "?", 512) +
                    (custom ? " (from FLYKERNELS_LIBCUDA)" : " (this machine has no NVIDIA driver?)");
      return st;
    }
    dlerror();  // clear, so a failed dlsym below reports its own error
    Driver& d = st->d;
    bool ok = sym(lib, d.cuInit, "cuInit") && sym(lib, d.cuGetErrorName, "cuGetErrorName") &&
              sym(lib, d.cuGetErrorString, "cuGetErrorString") &&
              sym(lib, d.cuDeviceGetCount, "cuDeviceGetCount") && sym(lib, d.cuDeviceGet, "cuDeviceGet") &&
              sym(lib, d.cuDeviceGetAttribute, "cuDeviceGetAttribute") &&
              sym(lib, d.cuDeviceGetName, "cuDeviceGetName") &&
              sym(lib, d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
              sym(lib, d.cuCtxGetCurrent, "cuCtxGetCurrent") && sym(lib, d.cuCtxSetCurrent, "cuCtxSetCurrent") &&
              sym(lib, d.cuCtxPushCurrent, "cuCtxPushCurrent_v2") &&
              sym(lib, d.cuCtxPopCurrent, "cuCtxPopCurrent_v2") && sym(lib, d.cuCtxGetDevice, "cuCtxGetDevice") &&
              sym(lib, d.cuStreamGetCtx, "cuStreamGetCtx") && sym(lib, d.cuModuleLoadData, "cuModuleLoadData") &&
              sym(lib, d.cuModuleGetFunction, "cuModuleGetFunction") &&
              sym(lib, d.cuFuncSetAttribute, "cuFuncSetAttribute") &&
              sym(lib, d.cuFuncGetAttribute, "cuFuncGetAttribute") &&
              sym(lib, d.cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor") &&
              sym(lib, d.cuLaunchKernel, "cuLaunchKernel") && sym(lib, d.cuLaunchKernelEx, "cuLaunchKernelEx") &&
              sym(lib, d.cuMemGetAddressRange, "cuMemGetAddressRange_v2") &&
              sym(lib, d.cuPointerGetAttribute, "cuPointerGetAttribute") &&
              sym(lib, d.cuMemsetD8Async, "cuMemsetD8Async") &&
              sym(lib, d.cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled");
    if (!ok) {
      const char* why = dlerror();
      st->message = "CUDA driver " + shown + " is too old or not a CUDA driver: " + printable(why ? why : "?", 512);
      return st;
    }
    CUresult r = d.cuInit(0);
    int count = 0;
    if (r == CUDA_SUCCESS) r = d.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count == 0) {
      const char* name = "?";
      d.cuGetErrorName(r, &name);
      st->message = std::string("no CUDA device (cuInit: ") + (name ? name : "?") + ", driver " + shown + ")";
      return st;
    }
    st->status = FLY_SUCCESS;
    return st;
  }();
  return *s;
}

std::mutex g_ctx_mu;
std::map<CUcontext, std::unique_ptr<DeviceCtx>> g_ctxs;

fly_status describe(const Driver& d, CUcontext ctx, const DeviceCtx** out) {
  std::lock_guard<std::mutex> lock(g_ctx_mu);
  auto it = g_ctxs.find(ctx);
  if (it != g_ctxs.end()) { *out = it->second.get(); return FLY_SUCCESS; }
  auto dc = std::make_unique<DeviceCtx>();
  dc->ctx = ctx;
  FLY_CU(d.cuCtxGetDevice(&dc->device), "cuCtxGetDevice");
  int major = 0, minor = 0;
  FLY_CU(d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dc->device), "cuDeviceGetAttribute");
  FLY_CU(d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dc->device), "cuDeviceGetAttribute");
  FLY_CU(d.cuDeviceGetAttribute(&dc->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dc->device), "cuDeviceGetAttribute");
  FLY_CU(d.cuDeviceGetAttribute(&dc->max_smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dc->device), "cuDeviceGetAttribute");
  FLY_CU(d.cuDeviceGetAttribute(&dc->l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dc->device), "cuDeviceGetAttribute");
  char name[256] = {0};
  d.cuDeviceGetName(name, sizeof name - 1, dc->device);
  dc->name = name;
  // sm_90a code runs only on compute capability 9.0 exactly.
  dc->arch = "sm_" + std::to_string(major * 10 + minor) + (major == 9 && minor == 0 ? "a" : "");
  *out = dc.get();
  g_ctxs.emplace(ctx, std::move(dc));
  return FLY_SUCCESS;
}

}  // namespace

fly_status driver(const Driver** out) {
  const DriverState& s = state();
  if (s.status != FLY_SUCCESS) return fail(s.status, "%s", s.message.c_str());
  *out = &s.d;
  return FLY_SUCCESS;
}

fly_status cuda_fail(CUresult r, const char* call) {
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* desc = "";
  const DriverState& s = state();
  if (s.d.cuGetErrorName) s.d.cuGetErrorName(r, &name);
  if (s.d.cuGetErrorString) s.d.cuGetErrorString(r, &desc);
  return fail(FLY_ERROR_CUDA, "%s: %s (%s)", call, name, desc ? desc : "");
}

namespace {
// The device of the call this thread is in (ScopedContext::enter), for check_device_bytes.
thread_local const DeviceCtx* t_call_device = nullptr;
}  // namespace

ScopedContext::~ScopedContext() {
  if (named_) t_call_device = outer_;
  if (pushed_) {
    const Driver* d = nullptr;
    if (driver(&d) == FLY_SUCCESS) {
      CUcontext dummy;
      d->cuCtxPopCurrent(&dummy);
    }
  }
}

fly_status ScopedContext::enter(void* stream, const DeviceCtx** out) {
  const Driver* d = nullptr;
  FLY_TRY(driver(&d));
  CUcontext ctx = nullptr;
  CUstream s = static_cast<CUstream>(stream);
  bool special = s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
  if (!special) {
    FLY_CU(d->cuStreamGetCtx(s, &ctx), "cuStreamGetCtx (is the stream valid?)");
  } else {
    FLY_CU(d->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
    if (!ctx) {  // nothing current yet: use device 0's primary context, as the runtime API would
      CUdevice dev;
      FLY_CU(d->cuDeviceGet(&dev, 0), "cuDeviceGet");
      FLY_CU(d->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    }
  }
  FLY_CU(d->cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
  pushed_ = true;
  FLY_TRY(describe(*d, ctx, out));
  outer_ = t_call_device;
  t_call_device = *out;
  named_ = true;
  if ((*out)->arch != FLY_BUILT_ARCH)
    return fail(FLY_ERROR_ARCH_NOT_BUILT, "device %d (%s) is %s; this build has kernels for %s only",
                int((*out)->device), (*out)->name.c_str(), (*out)->arch.c_str(), FLY_BUILT_ARCH);
  return FLY_SUCCESS;
}

fly_status check_device_pointer(const fly_tensor& t, const char* what) {
  return check_device_bytes(t.data, extent_bytes(t), what);
}

fly_status check_device_bytes(const void* data, int64_t bytes, const char* what) {
  static const bool enabled = [] {
    const char* e = std::getenv("FLYKERNELS_CHECK_POINTERS");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  if (!enabled || bytes <= 0) return FLY_SUCCESS;
  const Driver* d = nullptr;
  FLY_TRY(driver(&d));
  CUdeviceptr base = 0;
  size_t size = 0;
  CUdeviceptr p = reinterpret_cast<CUdeviceptr>(data);
  if (d->cuMemGetAddressRange(&base, &size, p) != CUDA_SUCCESS) {
    // Not a device allocation: host memory mapped into the device's address space is fine.
    CUdeviceptr dp = 0;
    if (d->cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, p) == CUDA_SUCCESS)
      return FLY_SUCCESS;
    return fail(FLY_ERROR_INVALID_ARGUMENT,
                "%s: %p is not device memory accessible from this context", what, data);
  }
  if (p + CUdeviceptr(bytes) > base + size)
    return fail(FLY_ERROR_INVALID_ARGUMENT,
                "%s: spans %lld bytes from %p but its allocation ends %lld bytes after it",
                what, (long long)bytes, data, (long long)(base + size - p));
  // Another GPU's memory would fault in the kernel (no peer mapping is assumed); managed memory
  // migrates. A driver that cannot answer leaves the check to the range test above.
  const DeviceCtx* call = t_call_device;
  unsigned managed = 0;
  int ordinal = -1;
  if (call && d->cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p) == CUDA_SUCCESS && !managed &&
      d->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) == CUDA_SUCCESS &&
      ordinal != int(call->device))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "%s: %p is memory of device %d, but the stream belongs to device %d",
                what, data, ordinal, int(call->device));
  return FLY_SUCCESS;
}

fly_status launch(CUfunction f, const LaunchConfig& cfg, void* stream, void** args) {
  const Driver* d = nullptr;
  FLY_TRY(driver(&d));
  if (cfg.smem > 48 * 1024) {
    static std::mutex mu;
    static std::map<CUfunction, unsigned> raised;
    std::lock_guard<std::mutex> lock(mu);
    unsigned& cur = raised[f];
    if (cur < cfg.smem) {
      FLY_CU(d->cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(cfg.smem)),
             "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
      cur = cfg.smem;
    }
  }
  CUstream s = static_cast<CUstream>(stream);
  if (cfg.cluster[0] * cfg.cluster[1] * cfg.cluster[2] == 1) {
    FLY_CU(d->cuLaunchKernel(f, cfg.grid[0], cfg.grid[1], cfg.grid[2], cfg.block[0], cfg.block[1],
                             cfg.block[2], cfg.smem, s, args, nullptr),
           "cuLaunchKernel");
    return FLY_SUCCESS;
  }
  CUlaunchAttribute attr[1];
  attr[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr[0].value.clusterDim.x = cfg.cluster[0];
  attr[0].value.clusterDim.y = cfg.cluster[1];
  attr[0].value.clusterDim.z = cfg.cluster[2];
  CUlaunchConfig lc{};
  lc.gridDimX = cfg.grid[0]; lc.gridDimY = cfg.grid[1]; lc.gridDimZ = cfg.grid[2];
  lc.blockDimX = cfg.block[0]; lc.blockDimY = cfg.block[1]; lc.blockDimZ = cfg.block[2];
  lc.sharedMemBytes = cfg.smem;
  lc.hStream = s;
  lc.attrs = attr;
  lc.numAttrs = 1;
  FLY_CU(d->cuLaunchKernelEx(&lc, f, args, nullptr), "cuLaunchKernelEx");
  return FLY_SUCCESS;
}

}  // namespace fly
