// SPDX-License-Identifier: Apache-2.0
// Stand-in for libcuda.so.1: the driver calls libflykernels makes, with the real driver's
// argument rules (launch limits, tensor-map encoding rules, context/stream checks), recording
// launches and tensor maps instead of running anything. Built with the tests only.
#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "fake_cuda.h"

namespace {

constexpr int kSmCount = 132;                 // H200
constexpr int kSmemOptin = 232448;            // 227 KiB per block with opt-in
constexpr int kSmemPerSm = 233472;            // 228 KiB
constexpr int kL2Bytes = 50 * 1024 * 1024;
constexpr int kStaticSmemDefault = 48 * 1024;  // dynamic limit before cuFuncSetAttribute

struct Context {
  int device;
};

struct Function {
  std::string name;
  int module = 0;
  std::vector<std::pair<size_t, size_t>> params;  // (offset, size) per ordinal
  size_t param_bytes = 0;
  int static_smem = 0;
  int max_dynamic_smem = kStaticSmemDefault;
  int non_portable_cluster = 0;
};

struct Module {
  int device = 0;  // of the context it was loaded in: its functions launch only there
  std::vector<unsigned char> image;
  std::map<std::string, Function*> functions;
};

struct State {
  std::mutex mu;
  int device_count = 1;
  int other_major = 8, other_minor = 0;
  bool initialized = false;
  std::deque<Context> contexts;  // primary context of each device (stable addresses)
  std::deque<Module> modules;
  std::deque<Function> functions;
  std::map<CUstream, int> streams;  // fake stream -> device
  std::deque<int> stream_storage;
  struct Allocation {
    size_t bytes;
    int device;  // -1: managed (any device may use it)
  };
  std::map<uintptr_t, Allocation> allocations;  // base -> bytes, owner
  uintptr_t next_address = uintptr_t(0x7e0000000000ull);
  std::vector<fake_cuda_launch> launches;
  std::vector<fake_cuda_tensor_map> maps;
  int memsets = 0;
  std::string refusal;
  std::string fail_function;
  CUresult fail_result = CUDA_SUCCESS;
};

State& st() {
  static State* s = new State();
  return *s;
}

thread_local std::vector<CUcontext> t_stack;

CUresult refuse(State& s, CUresult r, const std::string& why) {
  s.refusal = why;
  return r;
}

// A failure injected by fake_cuda_fail_next for `fn`, else CUDA_SUCCESS.
CUresult injected(State& s, const char* fn) {
  if (!s.fail_function.empty() && s.fail_function == fn) {
    s.fail_function.clear();
    return refuse(s, s.fail_result, std::string(fn) + ": injected failure");
  }
  return CUDA_SUCCESS;
}

Context* ctx_of(State& s, CUcontext c) {
  for (auto& x : s.contexts)
    if (reinterpret_cast<CUcontext>(&x) == c) return &x;
  return nullptr;
}

CUcontext current() { return t_stack.empty() ? nullptr : t_stack.back(); }

// ---- cubin reading (ELF64): symbols, per-kernel parameter layout, static shared memory -------
struct Elf {
  const unsigned char* d;
  size_t n;
  template <class T>
  bool get(size_t off, T* out) const {
    if (off > n || sizeof(T) > n - off) return false;
    std::memcpy(out, d + off, sizeof(T));
    return true;
  }
};

struct Section {
  uint32_t name, type;
  uint64_t off, size;
  uint32_t link;
};

bool read_sections(const Elf& e, std::vector<Section>* out, std::string* shstr) {
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0, shstrndx = 0;
  if (!e.get(0x28, &shoff) || !e.get(0x3a, &shentsize) || !e.get(0x3c, &shnum) || !e.get(0x3e, &shstrndx))
    return false;
  if (shentsize < 64 || shstrndx >= shnum) return false;
  for (uint16_t i = 0; i < shnum; ++i) {
    const size_t o = size_t(shoff) + size_t(i) * shentsize;
    Section s{};
    if (!e.get(o, &s.name) || !e.get(o + 4, &s.type) || !e.get(o + 24, &s.off) || !e.get(o + 32, &s.size) ||
        !e.get(o + 40, &s.link))
      return false;
    if (s.type != 8 /* NOBITS */ && (s.off > e.n || s.size > e.n - s.off)) return false;
    out->push_back(s);
  }
  const Section& ss = (*out)[shstrndx];
  shstr->assign(reinterpret_cast<const char*>(e.d + ss.off), size_t(ss.size));
  return true;
}

std::string str_at(const std::string& tab, uint32_t off) {
  if (off >= tab.size()) return "";
  return std::string(tab.c_str() + off);
}

// Finds kernel `name` in the image: true when a function symbol of that name exists.
bool describe_kernel(const std::vector<unsigned char>& img, const std::string& name, Function* f) {
  Elf e{img.data(), img.size()};
  std::vector<Section> secs;
  std::string shstr;
  if (!read_sections(e, &secs, &shstr)) return false;
  bool found = false;
  for (const Section& s : secs) {
    if (s.type != 2 /* SYMTAB */ || s.link >= secs.size()) continue;
    const Section& strs = secs[s.link];
    std::string strtab(reinterpret_cast<const char*>(e.d + strs.off), size_t(strs.size));
    for (uint64_t o = s.off; o + 24 <= s.off + s.size; o += 24) {
      uint32_t nm = 0;
      unsigned char info = 0;
      e.get(size_t(o), &nm);
      e.get(size_t(o + 4), &info);
      if ((info & 0xf) == 2 /* STT_FUNC */ && str_at(strtab, nm) == name) found = true;
    }
  }
  if (!found) return false;
  for (const Section& s : secs) {
    const std::string sname = str_at(shstr, s.name);
    // sm_90 cubins carry the 1 KiB the hardware reserves per block in this section; the opt-in
    // limit already excludes it (the e2 GEMM tiles launch on the H200 with 231488 dynamic bytes).
    if (sname == ".nv.shared." + name) f->static_smem = int(s.size > 1024 ? s.size - 1024 : 0);
    if (sname != ".nv.info." + name) continue;
    // EIATTR records: format byte, attribute byte, then a 16-bit value or a sized payload.
    for (uint64_t o = s.off; o + 4 <= s.off + s.size;) {
      unsigned char fmt = e.d[o], attr = e.d[o + 1];
      uint16_t v = 0;
      e.get(size_t(o + 2), &v);
      if (fmt != 4) {
        if (attr == 0x19) f->param_bytes = v;  // EIATTR_CBANK_PARAM_SIZE
        o += 4;
        continue;
      }
      if (attr == 0x17 && v >= 12) {  // EIATTR_KPARAM_INFO: ordinal, offset, size (bits 18..31)
        uint16_t ordinal = 0, offset = 0;
        uint32_t packed = 0;
        e.get(size_t(o + 8), &ordinal);
        e.get(size_t(o + 10), &offset);
        e.get(size_t(o + 12), &packed);
        if (f->params.size() <= ordinal) f->params.resize(size_t(ordinal) + 1);
        f->params[ordinal] = {offset, (packed >> 18) & 0x3fff};
      }
      o += 4 + v;
    }
  }
  return true;
}

size_t dtype_bytes(CUtensorMapDataType t) {
  switch (t) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16: case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32: case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32: case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ: return 4;
    case CU_TENSOR_MAP_DATA_TYPE_INT64: case CU_TENSOR_MAP_DATA_TYPE_UINT64:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64: return 8;
    default: return 0;
  }
}

constexpr uint64_t kMapMagic = 0x46414b45544d4150ull;  // "FAKETMAP": the first word of a fake map

// The launch rules both entry points check; records the launch on success.
CUresult do_launch(State& s, CUfunction fn, const unsigned g[3], const unsigned b[3], const unsigned c[3],
                   unsigned smem, CUstream stream, void** args, void** extra, int ex) {
  if (CUresult r = injected(s, ex ? "cuLaunchKernelEx" : "cuLaunchKernel")) return r;
  Function* f = reinterpret_cast<Function*>(fn);
  bool known = false;
  for (auto& x : s.functions) known |= &x == f;
  if (!known) return refuse(s, CUDA_ERROR_INVALID_HANDLE, "launch: unknown function");
  if (!current()) return refuse(s, CUDA_ERROR_INVALID_CONTEXT, "launch: no current context");
  if (s.modules[size_t(f->module)].device != ctx_of(s, current())->device)
    return refuse(s, CUDA_ERROR_INVALID_HANDLE, "launch: a function of another device's module");
  if (stream && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD) {
    auto it = s.streams.find(stream);
    if (it == s.streams.end()) return refuse(s, CUDA_ERROR_INVALID_HANDLE, "launch: unknown stream");
    if (ctx_of(s, current())->device != it->second)
      return refuse(s, CUDA_ERROR_INVALID_CONTEXT, "launch: stream of another context");
  }
  if (extra) return refuse(s, CUDA_ERROR_INVALID_VALUE, "launch: 'extra' is not used by the library");
  if (!args && !f->params.empty()) return refuse(s, CUDA_ERROR_INVALID_VALUE, "launch: no kernel parameters");
  const uint64_t threads = uint64_t(b[0]) * b[1] * b[2];
  if (threads == 0 || threads > 1024 || b[0] > 1024 || b[1] > 1024 || b[2] > 64)
    return refuse(s, CUDA_ERROR_INVALID_VALUE, "launch: block " + std::to_string(b[0]) + "x" +
                                                    std::to_string(b[1]) + "x" + std::to_string(b[2]));
  if (g[0] == 0 || g[1] == 0 || g[2] == 0 || g[0] > 0x7fffffffu || g[1] > 65535 || g[2] > 65535)
    return refuse(s, CUDA_ERROR_INVALID_VALUE, "launch: grid " + std::to_string(g[0]) + "x" +
                                                    std::to_string(g[1]) + "x" + std::to_string(g[2]));
  if (int64_t(smem) > f->max_dynamic_smem)
    return refuse(s, CUDA_ERROR_INVALID_VALUE, "launch: " + std::to_string(smem) +
                                                    " bytes of dynamic shared memory above the function's limit " +
                                                    std::to_string(f->max_dynamic_smem));
  const unsigned cl = c[0] * c[1] * c[2];
  if (cl == 0 || cl > (f->non_portable_cluster ? 16u : 8u))
    return refuse(s, CUDA_ERROR_INVALID_CLUSTER_SIZE, "launch: cluster of " + std::to_string(cl));
  for (int i = 0; i < 3; ++i)
    if (g[i] % c[i] != 0) return refuse(s, CUDA_ERROR_INVALID_CLUSTER_SIZE, "launch: grid not a multiple of the cluster");
  fake_cuda_launch L;
  std::memset(&L, 0, sizeof L);
  std::snprintf(L.kernel, sizeof L.kernel, "%s", f->name.c_str());
  L.module = f->module;
  for (int i = 0; i < 3; ++i) { L.grid[i] = g[i]; L.block[i] = b[i]; L.cluster[i] = c[i]; }
  L.smem = smem;
  L.stream = stream;
  L.ex = ex;
  L.device = ctx_of(s, current())->device;
  // Offsets relative to the first parameter (the constant bank aligns it, e.g. 64 B for a CUtensorMap).
  const size_t origin = f->params.empty() ? 0 : f->params[0].first;
  for (size_t i = 0; i < f->params.size(); ++i) {
    const auto& p = f->params[i];
    if (p.first < origin || p.first - origin + p.second > FAKE_CUDA_MAX_PARAM_BYTES || !args[i]) continue;
    std::memcpy(L.params + (p.first - origin), args[i], p.second);
    L.param_bytes = std::max(L.param_bytes, p.first - origin + p.second);
  }
  s.launches.push_back(L);
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

// ---- control API (fake_cuda.h) --------------------------------------------------------------
void fake_cuda_configure(int device_count, int other_cc_major, int other_cc_minor) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  s.device_count = device_count;
  s.other_major = other_cc_major;
  s.other_minor = other_cc_minor;
}

void* fake_cuda_malloc(size_t bytes) { return fake_cuda_malloc_on(0, bytes); }
void* fake_cuda_malloc_managed(size_t bytes) { return fake_cuda_malloc_on(-1, bytes); }

void* fake_cuda_malloc_on(int device, size_t bytes) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  const uintptr_t p = s.next_address;
  s.allocations[p] = State::Allocation{bytes, device};
  s.next_address += (bytes + 511) / 512 * 512 + 512;  // a gap: one past the end is not another buffer
  return reinterpret_cast<void*>(p);
}

void* fake_cuda_stream_create(int device) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  s.stream_storage.push_back(device);
  CUstream h = reinterpret_cast<CUstream>(&s.stream_storage.back());
  s.streams[h] = device;
  return h;
}

void fake_cuda_fail_next(const char* function, int result) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  s.fail_function = function ? function : "";
  s.fail_result = CUresult(result);
}

int fake_cuda_launch_count(void) { std::lock_guard<std::mutex> l(st().mu); return int(st().launches.size()); }
const fake_cuda_launch* fake_cuda_get_launch(int i) {
  std::lock_guard<std::mutex> l(st().mu);
  return i >= 0 && size_t(i) < st().launches.size() ? &st().launches[size_t(i)] : nullptr;
}
int fake_cuda_tensor_map_count(void) { std::lock_guard<std::mutex> l(st().mu); return int(st().maps.size()); }
const fake_cuda_tensor_map* fake_cuda_get_tensor_map(int i) {
  std::lock_guard<std::mutex> l(st().mu);
  return i >= 0 && size_t(i) < st().maps.size() ? &st().maps[size_t(i)] : nullptr;
}
int fake_cuda_tensor_map_index(const void* m) {
  uint64_t w[2];
  std::memcpy(w, m, sizeof w);
  std::lock_guard<std::mutex> l(st().mu);
  return w[0] == kMapMagic && w[1] < st().maps.size() ? int(w[1]) : -1;
}
int fake_cuda_module_count(void) { std::lock_guard<std::mutex> l(st().mu); return int(st().modules.size()); }
int fake_cuda_module_device(int index) {
  std::lock_guard<std::mutex> l(st().mu);
  return index >= 0 && size_t(index) < st().modules.size() ? st().modules[size_t(index)].device : -1;
}
int fake_cuda_memset_count(void) { std::lock_guard<std::mutex> l(st().mu); return st().memsets; }
const char* fake_cuda_last_refusal(void) { return st().refusal.c_str(); }
void fake_cuda_clear_records(void) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  s.launches.clear();
  s.maps.clear();
  s.memsets = 0;
  s.refusal.clear();
}

// ---- the driver API ----------------------------------------------------------------------------
CUresult cuInit(unsigned flags) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (flags != 0) return refuse(s, CUDA_ERROR_INVALID_VALUE, "cuInit: flags must be 0");
  if (CUresult r = injected(s, "cuInit")) return r;
  if (!s.initialized) {
    for (int i = 0; i < s.device_count; ++i) s.contexts.push_back(Context{i});
    s.initialized = true;
  }
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult r, const char** out) {
  switch (r) {
    case CUDA_SUCCESS: *out = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *out = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *out = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NO_DEVICE: *out = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *out = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_INVALID_IMAGE: *out = "CUDA_ERROR_INVALID_IMAGE"; break;
    case CUDA_ERROR_INVALID_HANDLE: *out = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NOT_FOUND: *out = "CUDA_ERROR_NOT_FOUND"; break;
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: *out = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"; break;
    default: *out = "CUDA_ERROR_FAKE"; return CUDA_SUCCESS;
  }
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult, const char** out) {
  *out = "stand-in driver error";
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* n) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (!s.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *n = s.device_count;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (ordinal < 0 || ordinal >= s.device_count) return refuse(s, CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet: ordinal");
  *d = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (d < 0 || d >= s.device_count) return refuse(s, CUDA_ERROR_INVALID_DEVICE, "cuDeviceGetAttribute: device");
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = d == 0 ? 9 : s.other_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = d == 0 ? 0 : s.other_minor; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = kSmCount; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = kSmemOptin; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = kL2Bytes; break;
    default: return refuse(s, CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute: attribute not in the stand-in");
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  if (len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, size_t(len), "%s", d == 0 ? "Fake H200" : "Fake other GPU");
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (d < 0 || size_t(d) >= s.contexts.size()) return refuse(s, CUDA_ERROR_INVALID_DEVICE, "retain: device");
  *c = reinterpret_cast<CUcontext>(&s.contexts[size_t(d)]);
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* c) { *c = current(); return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext c) {
  if (t_stack.empty()) t_stack.push_back(c);
  else t_stack.back() = c;
  return CUDA_SUCCESS;
}
CUresult cuCtxPushCurrent_v2(CUcontext c) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (!ctx_of(s, c)) return refuse(s, CUDA_ERROR_INVALID_CONTEXT, "cuCtxPushCurrent: unknown context");
  t_stack.push_back(c);
  return CUDA_SUCCESS;
}
CUresult cuCtxPopCurrent_v2(CUcontext* c) {
  if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (c) *c = t_stack.back();
  t_stack.pop_back();
  return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice* d) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  Context* c = ctx_of(s, current());
  if (!c) return refuse(s, CUDA_ERROR_INVALID_CONTEXT, "cuCtxGetDevice: no current context");
  *d = c->device;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCtx(CUstream h, CUcontext* c) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.streams.find(h);
  if (it == s.streams.end()) return refuse(s, CUDA_ERROR_INVALID_HANDLE, "cuStreamGetCtx: unknown stream");
  *c = reinterpret_cast<CUcontext>(&s.contexts[size_t(it->second)]);
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule* m, const void* image) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (CUresult r = injected(s, "cuModuleLoadData")) return r;
  if (!current()) return refuse(s, CUDA_ERROR_INVALID_CONTEXT, "cuModuleLoadData: no current context");
  const unsigned char* p = static_cast<const unsigned char*>(image);
  // An ELF64 header for EM_CUDA (190); the size comes from its section table.
  if (!p || std::memcmp(p, "\x7f" "ELF\x02", 5) != 0 || p[18] != 190)
    return refuse(s, CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData: not a 64-bit CUDA ELF image");
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0;
  std::memcpy(&shoff, p + 0x28, 8);
  std::memcpy(&shentsize, p + 0x3a, 2);
  std::memcpy(&shnum, p + 0x3c, 2);
  size_t size = size_t(shoff) + size_t(shentsize) * shnum;
  s.modules.emplace_back();
  s.modules.back().device = ctx_of(s, current())->device;
  s.modules.back().image.assign(p, p + size);
  *m = reinterpret_cast<CUmodule>(&s.modules.back());
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* out, CUmodule hm, const char* name) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  Module* m = reinterpret_cast<Module*>(hm);
  int index = -1;
  for (size_t i = 0; i < s.modules.size(); ++i)
    if (&s.modules[i] == m) index = int(i);
  if (index < 0) return refuse(s, CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction: unknown module");
  auto it = m->functions.find(name);
  if (it == m->functions.end()) {
    Function f;
    f.name = name;
    f.module = index;
    if (!describe_kernel(m->image, name, &f))
      return refuse(s, CUDA_ERROR_NOT_FOUND, std::string("cuModuleGetFunction: no kernel ") + name + " in the image");
    s.functions.push_back(f);
    it = m->functions.emplace(name, &s.functions.back()).first;
  }
  *out = reinterpret_cast<CUfunction>(it->second);
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction fn, CUfunction_attribute a, int v) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  Function* f = reinterpret_cast<Function*>(fn);
  if (a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    if (v < 0 || v + f->static_smem > kSmemOptin)
      return refuse(s, CUDA_ERROR_INVALID_VALUE, "cuFuncSetAttribute: " + std::to_string(v) +
                                                      " bytes of dynamic shared memory above the opt-in limit");
    f->max_dynamic_smem = v;
    return CUDA_SUCCESS;
  }
  if (a == CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED) {
    f->non_portable_cluster = v;
    return CUDA_SUCCESS;
  }
  return refuse(s, CUDA_ERROR_INVALID_VALUE, "cuFuncSetAttribute: attribute not in the stand-in");
}

CUresult cuFuncGetAttribute(int* v, CUfunction_attribute a, CUfunction fn) {
  const Function* f = reinterpret_cast<const Function*>(fn);
  switch (a) {
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *v = f->static_smem; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = f->max_dynamic_smem; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 32; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction fn, int threads, size_t smem) {
  const Function* f = reinterpret_cast<const Function*>(fn);
  if (threads <= 0 || threads > 1024) return CUDA_ERROR_INVALID_VALUE;
  if (int64_t(smem) > f->max_dynamic_smem) { *n = 0; return CUDA_SUCCESS; }
  int by_threads = 2048 / threads;
  // 1 KiB per block is reserved by the hardware on sm_90.
  int by_smem = int(kSmemPerSm / (int64_t(smem) + f->static_smem + 1024));
  *n = std::min(32, std::min(by_threads, by_smem));
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream stream, void** args, void** extra) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz}, c[3] = {1, 1, 1};
  return do_launch(s, f, g, b, c, smem, stream, args, extra, 0);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* cfg, CUfunction f, void** args, void** extra) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  unsigned c[3] = {1, 1, 1};
  for (unsigned i = 0; i < cfg->numAttrs; ++i) {
    if (cfg->attrs[i].id != CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
      return refuse(s, CUDA_ERROR_INVALID_VALUE, "cuLaunchKernelEx: attribute not in the stand-in");
    c[0] = cfg->attrs[i].value.clusterDim.x;
    c[1] = cfg->attrs[i].value.clusterDim.y;
    c[2] = cfg->attrs[i].value.clusterDim.z;
  }
  const unsigned g[3] = {cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ};
  const unsigned b[3] = {cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ};
  return do_launch(s, f, g, b, c, cfg->sharedMemBytes, cfg->hStream, args, extra, 1);
}

// The allocation holding p (call with s.mu held), or null.
const std::pair<const uintptr_t, State::Allocation>* find_allocation(State& s, CUdeviceptr p) {
  auto it = s.allocations.upper_bound(uintptr_t(p));
  if (it == s.allocations.begin()) return nullptr;
  --it;
  return uintptr_t(p) < it->first + it->second.bytes ? &*it : nullptr;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  const auto* it = find_allocation(s, p);
  if (!it) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = CUdeviceptr(it->first);
  if (size) *size = it->second.bytes;
  return CUDA_SUCCESS;
}

// IS_MANAGED and DEVICE_ORDINAL of fake allocations, as the library asks them; anything else (and
// any pointer outside an allocation: host memory) is not answered.
CUresult cuPointerGetAttribute(void* out, CUpointer_attribute a, CUdeviceptr p) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  const auto* it = find_allocation(s, p);
  if (!it) return CUDA_ERROR_INVALID_VALUE;
  if (a == CU_POINTER_ATTRIBUTE_IS_MANAGED) {
    *static_cast<unsigned*>(out) = it->second.device < 0;
    return CUDA_SUCCESS;
  }
  if (a == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
    *static_cast<int*>(out) = it->second.device < 0 ? 0 : it->second.device;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char, size_t n, CUstream) {
  CUdeviceptr base = 0;
  size_t size = 0;
  if (cuMemGetAddressRange_v2(&base, &size, p) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (p + n > base + size) return refuse(s, CUDA_ERROR_INVALID_VALUE, "cuMemsetD8Async: past the allocation");
  ++s.memsets;
  return CUDA_SUCCESS;
}

// The documented rules of cuTensorMapEncodeTiled (CUDA driver API reference).
CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType dt, cuuint32_t rank, void* addr,
                                const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                const cuuint32_t* estr, CUtensorMapInterleave il, CUtensorMapSwizzle sw,
                                CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  State& s = st();
  std::lock_guard<std::mutex> l(s.mu);
  if (CUresult r = injected(s, "cuTensorMapEncodeTiled")) return r;
  auto bad = [&](const std::string& why) { return refuse(s, CUDA_ERROR_INVALID_VALUE, "cuTensorMapEncodeTiled: " + why); };
  if (!map || reinterpret_cast<uintptr_t>(map) % 64) return bad("map not 64-byte aligned");
  const size_t es = dtype_bytes(dt);
  if (es == 0) return bad("data type");
  if (rank < 1 || rank > 5 || (il != CU_TENSOR_MAP_INTERLEAVE_NONE && rank < 3)) return bad("rank");
  if (reinterpret_cast<uintptr_t>(addr) % (il == CU_TENSOR_MAP_INTERLEAVE_32B ? 32 : 16)) return bad("address alignment");
  for (unsigned i = 0; i < rank; ++i) {
    if (dims[i] == 0 || dims[i] > (uint64_t(1) << 32)) return bad("dim " + std::to_string(i));
    if (box[i] == 0 || box[i] > 256) return bad("box " + std::to_string(i));
    if (estr[i] == 0 || estr[i] > 8) return bad("element stride " + std::to_string(i));
  }
  for (unsigned i = 0; i + 1 < rank; ++i)
    if (strides[i] % 16 || strides[i] >= (uint64_t(1) << 40)) return bad("stride " + std::to_string(i));
  if (rank > 1 && strides[0] < dims[0] * es) return bad("stride 0 shorter than a row");
  if (il == CU_TENSOR_MAP_INTERLEAVE_NONE) {
    const uint64_t inner = uint64_t(box[0]) * es;
    if (inner % 16) return bad("inner box bytes not a multiple of 16");
    const uint64_t span = sw == CU_TENSOR_MAP_SWIZZLE_32B ? 32 : sw == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                          : sw == CU_TENSOR_MAP_SWIZZLE_128B ? 128 : 0;
    if (span && inner > span) return bad("inner box wider than the swizzle span");
  }
  if (oob == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA && es == 1) return bad("NaN fill of an integer type");
  fake_cuda_tensor_map t;
  std::memset(&t, 0, sizeof t);
  t.dtype = int(dt);
  t.rank = rank;
  t.address = uint64_t(reinterpret_cast<uintptr_t>(addr));
  for (unsigned i = 0; i < rank; ++i) { t.dims[i] = dims[i]; t.box[i] = box[i]; t.element_strides[i] = estr[i]; }
  for (unsigned i = 0; i + 1 < rank; ++i) t.strides[i] = strides[i];
  t.interleave = int(il);
  t.swizzle = int(sw);
  t.l2promotion = int(l2);
  t.oob_fill = int(oob);
  const uint64_t words[2] = {kMapMagic, uint64_t(s.maps.size())};
  std::memset(map, 0, sizeof *map);
  std::memcpy(map, words, sizeof words);
  s.maps.push_back(t);
  return CUDA_SUCCESS;
}

}  // extern "C"
