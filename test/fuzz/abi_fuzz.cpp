// SPDX-License-Identifier: Apache-2.0
// One fuzz step over the C ABI: the input bytes choose an entry point and every argument
// (descriptors with hostile ranks, sizes, strides, dtypes and pointers; odd strings; NaN and
// huge scalars), then the promises of docs/robustness.md are checked; a broken one aborts.
// Shared by the seeded random driver (fuzz_driver.cpp, runs everywhere) and libFuzzer.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "flykernels/flykernels.h"

namespace {

// Reads the input as a stream of choices; an exhausted input reads as zeros.
struct Input {
  const uint8_t* p;
  size_t n;
  bool tame = false;  // well-formed descriptors of small shapes: calls that get to dispatch and launch
  uint8_t byte() { return n ? (--n, *p++) : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | byte();
    return v;
  }
  int64_t i64() {
    static const int64_t kEdges[] = {0, 1, 2, 3, 7, 8, 16, 64, 127, 128, 255, 256, 1000, 4096, 65536,
                                     (int64_t(1) << 31) - 1, int64_t(1) << 31, (int64_t(1) << 30) + 1,
                                     int64_t(1) << 47, (int64_t(1) << 47) - 1, int64_t(1) << 62,
                                     std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
                                     -1, -2};
    const uint8_t sel = byte();
    if (sel < 150) return int64_t(byte() % 64);  // small: shapes that fit the buffers
    if (sel < 215) return kEdges[byte() % (sizeof kEdges / sizeof kEdges[0])];
    if (sel < 235) return int64_t(u64() % 100000);
    return int64_t(u64());
  }
  double real() {
    static const double kEdges[] = {0.0, 1e-5, 1e-6, 1.0, -1e-5, 1e300, -1e300, 3.5e38, 3.4e38, 1e-320,
                                    std::numeric_limits<double>::infinity(),
                                    std::numeric_limits<double>::quiet_NaN()};
    return kEdges[byte() % (sizeof kEdges / sizeof kEdges[0])];
  }
};

// Device buffers: fake allocations when the stand-in driver is loaded (so calls can get past the
// pointer check to dispatch and launch), else plain fake addresses (never dereferenced).
struct Buffers {
  void* (*stream_create)(int) = nullptr;
  int (*launch_count)() = nullptr;
  void (*clear_records)() = nullptr;
  uintptr_t base[8] = {};
  void* streams[2] = {};
  Buffers() {
    const char* lib = std::getenv("FLYKERNELS_LIBCUDA");
    void* h = lib && *lib ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : nullptr;
    auto* fake_malloc = h ? reinterpret_cast<void* (*)(size_t)>(dlsym(h, "fake_cuda_malloc")) : nullptr;
    if (fake_malloc) {
      stream_create = reinterpret_cast<void* (*)(int)>(dlsym(h, "fake_cuda_stream_create"));
      launch_count = reinterpret_cast<int (*)()>(dlsym(h, "fake_cuda_launch_count"));
      clear_records = reinterpret_cast<void (*)()>(dlsym(h, "fake_cuda_clear_records"));
      auto* configure = reinterpret_cast<void (*)(int, int, int)>(dlsym(h, "fake_cuda_configure"));
      if (configure) configure(2, 8, 0);  // device 1 is an sm_80 part
    }
    for (int i = 0; i < 8; ++i) {
      const size_t bytes = size_t(1) << (10 + 3 * i);  // 1 KiB .. 2 GiB
      base[i] = fake_malloc ? reinterpret_cast<uintptr_t>(fake_malloc(bytes)) : (uintptr_t(i + 1) << 36);
    }
    if (stream_create) {
      streams[0] = stream_create(0);
      streams[1] = stream_create(1);
    }
  }
};

Buffers& buffers() {
  static Buffers b;
  return b;
}

void* pointer(Input& in) {
  const uint8_t sel = in.byte();
  static const uintptr_t kOffsets[] = {0, 0, 0, 2, 4, 8, 16, 100, 1024};
  if (sel < 200) return reinterpret_cast<void*>(buffers().base[sel % 8] + kOffsets[in.byte() % 9]);
  if (sel < 215) return nullptr;
  if (sel < 230) return reinterpret_cast<void*>(uintptr_t(1));
  return reinterpret_cast<void*>(uintptr_t(in.u64()));
}

void* stream(Input& in) {
  const uint8_t sel = in.byte() % 6;
  if (sel == 0 || sel == 1) return nullptr;
  if (sel == 2) return reinterpret_cast<void*>(uintptr_t(2));  // per-thread default stream
  if (sel <= 4 && buffers().streams[sel - 3]) return buffers().streams[sel - 3];
  return reinterpret_cast<void*>(uintptr_t(0x5000));  // not a stream
}

// A descriptor: usually well formed (contiguous, a valid dtype), each field sometimes hostile.
fly_tensor tensor(Input& in, int rank_hint, int32_t dtype_hint) {
  fly_tensor t;
  std::memset(&t, 0, sizeof t);
  if (in.tame) {
    t.data = reinterpret_cast<void*>(buffers().base[4 + in.byte() % 4]);
    t.dtype = static_cast<fly_dtype>(dtype_hint);
    t.rank = rank_hint;
    int64_t stride = 1;
    for (int i = rank_hint - 1; i >= 0; --i) {
      t.sizes[i] = 1 + in.byte() % (i == rank_hint - 1 ? 255 : 32);
      t.strides[i] = stride;
      stride *= t.sizes[i];
    }
    return t;
  }
  t.data = pointer(in);
  const uint8_t r = in.byte();
  const int32_t rank = r < 200 ? rank_hint : int32_t(r % 11) - 1;  // -1..9
  const uint8_t d = in.byte();
  const int32_t dtype = d < 170 ? dtype_hint : d < 230 ? int32_t(d % 9) : (d & 1 ? 99 : -1);
  std::memcpy(&t.dtype, &dtype, sizeof dtype);  // any int a C caller may store
  t.rank = rank;
  const int n = rank < 0 ? 0 : rank > FLY_MAX_RANK ? FLY_MAX_RANK : rank;
  for (int i = 0; i < n; ++i) t.sizes[i] = in.i64();
  int64_t stride = 1;
  for (int i = n - 1; i >= 0; --i) {
    const uint8_t s = in.byte();
    t.strides[i] = s < 180 ? stride : in.i64();
    if (t.sizes[i] > 0 && t.sizes[i] < (int64_t(1) << 40) && stride < (int64_t(1) << 40) / t.sizes[i]) stride *= t.sizes[i];
  }
  return t;
}

const fly_tensor* maybe(Input& in, const fly_tensor* t) { return in.byte() >= 236 && !in.tame ? nullptr : t; }

[[noreturn]] void broken(const char* entry, fly_status s, const char* why) {
  std::fprintf(stderr, "fuzz: %s returned %s (%d): %s; message: '%s'\n", entry, fly_status_string(s), int(s), why,
               fly_get_last_error());
  std::abort();
}

// The promises every entry keeps: a known status; a failure explains itself in one bounded
// line with no control bytes; a success leaves no stale message.
uint64_t g_status_count[FLY_ERROR_INTERNAL + 1];
uint64_t g_launching_calls = 0;

void check(const char* entry, fly_status s) {
  if (int(s) < FLY_SUCCESS || int(s) > FLY_ERROR_INTERNAL) broken(entry, s, "unknown status");
  ++g_status_count[int(s)];
  static const bool verbose = std::getenv("FLY_FUZZ_LOG") != nullptr;  // one line per call, to see what gets through
  if (verbose) std::printf("%s %s %s\n", entry, fly_status_string(s), fly_get_last_error());
  const char* m = fly_get_last_error();
  if (!m) broken(entry, s, "NULL message");
  const size_t len = std::strlen(m);
  if (s == FLY_SUCCESS && len != 0) broken(entry, s, "success left a message");
  if (s != FLY_SUCCESS && len == 0) broken(entry, s, "failure without a message");
  if (len > 2100) broken(entry, s, "message longer than 2 KiB");
  for (size_t i = 0; i < len; ++i)
    if (static_cast<unsigned char>(m[i]) < 0x20) broken(entry, s, "control byte in the message");
  // On the stand-in driver only a bad stream handle may make a driver call fail: any other
  // refusal is the library asking the driver for something illegal (a launch, a tensor map).
  if (buffers().launch_count && s == FLY_ERROR_CUDA && !std::strstr(m, "cuStreamGetCtx"))
    broken(entry, s, "the stand-in driver refused a call the library made");
}

std::string name(Input& in) {
  const uint8_t sel = in.byte();
  if (sel < 40) {
    const int i = int(in.byte()) % (fly_variant_count() + 1);
    const char* v = fly_variant_name(i);
    return v ? v : "";
  }
  std::string s;
  size_t len = sel < 250 ? in.byte() : size_t(70000);
  for (size_t i = 0; i < len; ++i) s += char(in.byte() | (sel & 1 ? 0 : 0x40));
  return s;
}

}  // namespace

// What the calls returned so far (the driver prints it: a run that never got past validation
// would show no FLY_SUCCESS and no launching calls).
void fly_fuzz_summary(FILE* out) {
  for (int i = 0; i <= FLY_ERROR_INTERNAL; ++i)
    if (g_status_count[i]) std::fprintf(out, "  %-28s %llu\n", fly_status_string(fly_status(i)), (unsigned long long)g_status_count[i]);
  std::fprintf(out, "  calls that launched (stand-in driver) %llu\n", (unsigned long long)g_launching_calls);
}

// The MX entries (fly_mx_quantize, fly_scaled_gemm): entry 14.
void fuzz_mx(Input& in) {
  const bool fp4 = in.byte() & 1;
  const int32_t et = fp4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3;
  if (in.byte() & 1) {
    fly_tensor x = tensor(in, 2, int32_t(FLY_F16 + in.byte() % 3)), q = tensor(in, 2, et), sc = tensor(in, 2, FLY_E8M0);
    if (in.byte() < 180) {  // agreeing shapes, so calls reach dispatch
      x.sizes[1] = 32 * (1 + x.sizes[1] % 8);
      x.strides[0] = x.sizes[1];
      q.sizes[0] = sc.sizes[0] = x.sizes[0];
      q.sizes[1] = q.strides[0] = fp4 ? x.sizes[1] / 2 : x.sizes[1];
      sc.sizes[1] = sc.strides[0] = x.sizes[1] / 32;
    }
    const int fmt = in.byte() < 200 ? (fp4 ? FLY_MX_E2M1 : FLY_MX_E4M3) | (in.byte() & 1 ? FLY_MX_SCALE_RCEIL : 0)
                                    : int(int32_t(in.u64()));
    check("fly_mx_quantize", fly_mx_quantize(maybe(in, &x), fmt, maybe(in, &q), maybe(in, &sc), stream(in)));
  } else {
    fly_tensor a = tensor(in, 2, et), bm = tensor(in, 2, et), sa = tensor(in, 2, FLY_E8M0), sb = tensor(in, 2, FLY_E8M0);
    // The hint as an int: tensor() may store any value in .dtype, which C++ must not read back as
    // the enum (the library reads it as an integer).
    const int32_t out_dt = in.byte() & 1 ? FLY_BF16 : FLY_F16;
    fly_tensor c = tensor(in, 2, out_dt), bias = tensor(in, 1, out_dt);
    check("fly_scaled_gemm", fly_scaled_gemm(maybe(in, &a), maybe(in, &sa), maybe(in, &bm), maybe(in, &sb), maybe(in, &bias),
                                             maybe(in, &c), nullptr, 0, stream(in)));
  }
}

// fly_cross_entropy_fwd_bwd: half of entry 10 (the other half stays fly_variant_name, so the
// other entries' share of the inputs is what it was before the family came).
void fuzz_cross_entropy(Input& in) {
  Buffers& b = buffers();
  const int launches_before = b.launch_count ? b.launch_count() : 0;
  const int32_t dt = int32_t(FLY_F16 + in.byte() % 3);
  fly_tensor x = tensor(in, 2, dt), lab = tensor(in, 1, FLY_I64), loss = tensor(in, 1, FLY_F32),
             lse = tensor(in, 1, FLY_F32), d = tensor(in, 2, dt);
  if (in.byte() < 180) {  // agreeing shapes, so calls reach dispatch and launch
    lab.sizes[0] = loss.sizes[0] = lse.sizes[0] = x.sizes[0];
    std::memcpy(d.sizes, x.sizes, sizeof x.sizes);
    if (in.byte() < 80) d = x;  // in place
  }
  const double scale = in.tame ? 1.0 : in.real();
  const int64_t ignore = in.byte() < 128 ? -100 : in.i64();
  const fly_tensor* lp = in.byte() & 1 ? maybe(in, &lse) : nullptr;
  const fly_tensor* dp = in.byte() & 1 ? maybe(in, &d) : nullptr;
  const fly_status s =
      fly_cross_entropy_fwd_bwd(maybe(in, &x), maybe(in, &lab), ignore, scale, maybe(in, &loss), lp, dp, stream(in));
  check("fly_cross_entropy_fwd_bwd", s);
  if (s == FLY_SUCCESS && !(std::fabs(scale) <= 3.4028234663852886e38))
    broken("fly_cross_entropy_fwd_bwd", s, "accepted scale");
  if (s == FLY_SUCCESS && b.launch_count && x.sizes[0] > 0 && b.launch_count() == launches_before)
    broken("fly_cross_entropy_fwd_bwd", s, "succeeded on rows without a launch");
}

int fly_fuzz_one(const uint8_t* data, size_t size) {
  Input in{data, size};
  Buffers& b = buffers();
  if (b.clear_records && b.launch_count() > 1000) b.clear_records();  // records are 4 KiB each
  const int launches_before = b.launch_count ? b.launch_count() : 0;
  const uint8_t entry = in.byte() % 16;
  in.tame = in.byte() >= 160;
  switch (entry) {
    case 0: {  // rms_norm
      const int32_t dt = int32_t(FLY_F16 + in.byte() % 3);
      fly_tensor x = tensor(in, 2, dt), y = tensor(in, 2, dt), w = tensor(in, 1, dt), r = tensor(in, 1, FLY_F32);
      if (in.byte() < 180) {  // agreeing shapes, so calls reach dispatch and launch
        std::memcpy(y.sizes, x.sizes, sizeof x.sizes);
        std::memcpy(y.strides, x.strides, sizeof x.strides);
        w.sizes[0] = x.sizes[1];
        r.sizes[0] = x.sizes[0];
      }
      const double eps = in.tame ? 1e-5 : in.real();
      const fly_tensor* wp = maybe(in, &w);
      const fly_tensor* rp = maybe(in, &r);
      const fly_status s = fly_rms_norm_fwd(maybe(in, &x), wp, eps, maybe(in, &y), rp, stream(in));
      check("fly_rms_norm_fwd", s);
      if (s == FLY_SUCCESS && b.launch_count && x.sizes[0] > 0 && b.launch_count() == launches_before)
        broken("fly_rms_norm_fwd", s, "succeeded on rows without a launch");
      if (s == FLY_SUCCESS && !(eps >= 0 && eps <= 3.4028234663852886e38)) broken("fly_rms_norm_fwd", s, "accepted eps");
      break;
    }
    case 1:
    case 2: {  // topk and its size query
      fly_tensor x = tensor(in, 2, FLY_F32);
      const int64_t k = in.tame ? 1 + in.byte() % std::max<int64_t>(1, x.sizes[1]) : in.i64();
      const int largest = in.byte() & 1, det = in.byte() & 1;
      if (entry == 1) {
        size_t bytes = 12345;
        const fly_status s = fly_topk_workspace_size(maybe(in, &x), k, largest, det, in.byte() < 10 ? nullptr : &bytes);
        check("fly_topk_workspace_size", s);
        if (s != FLY_SUCCESS && bytes != 12345 && bytes != 0) broken("fly_topk_workspace_size", s, "wrote a size on failure");
        if (s == FLY_SUCCESS && bytes >= (size_t(1) << 62)) broken("fly_topk_workspace_size", s, "absurd size");
      } else {
        fly_tensor v = tensor(in, 2, FLY_F32), i = tensor(in, 2, FLY_I64);
        if (in.byte() < 180) {
          v.sizes[0] = i.sizes[0] = x.sizes[0];
          v.sizes[1] = i.sizes[1] = k;
          v.strides[0] = i.strides[0] = k;
          v.strides[1] = i.strides[1] = 1;
        }
        void* ws = pointer(in);
        const size_t ws_bytes = size_t(in.i64());
        const fly_status s = fly_topk(maybe(in, &x), k, largest, det, maybe(in, &v), maybe(in, &i), ws, ws_bytes, stream(in));
        check("fly_topk", s);
        if (s == FLY_SUCCESS && b.launch_count && x.sizes[0] > 0 && b.launch_count() == launches_before)
          broken("fly_topk", s, "succeeded on rows without a launch");
      }
      break;
    }
    case 3:
    case 4: {  // gemm and its size query
      const int32_t dt = int32_t(in.byte() & 1 ? FLY_BF16 : FLY_F16);
      fly_tensor a = tensor(in, 2, dt), bm = tensor(in, 2, dt), c = tensor(in, 2, dt), bias = tensor(in, 1, dt);
      if (in.byte() < 180) {  // make the shapes agree more often than chance would
        bm.sizes[0] = a.sizes[1];
        c.sizes[0] = a.sizes[0];
        c.sizes[1] = bm.sizes[1];
        c.strides[0] = c.sizes[1];
        c.strides[1] = 1;
        bias.sizes[0] = bm.sizes[1];
        if (in.byte() < 128) {  // TMA-friendly multiples of 8
          a.sizes[0] = c.sizes[0] = 8 * (a.sizes[0] % 64 + 1);
          a.sizes[1] = bm.sizes[0] = 8 * (a.sizes[1] % 64 + 1);
          bm.sizes[1] = c.sizes[1] = bias.sizes[0] = 8 * (bm.sizes[1] % 64 + 1);
          a.strides[0] = a.sizes[1];
          bm.strides[0] = bm.sizes[1];
          c.strides[0] = c.sizes[1];
          a.strides[1] = bm.strides[1] = 1;
        }
      }
      if (entry == 3) {
        size_t bytes = 12345;
        const fly_status s = fly_gemm_workspace_size(maybe(in, &a), maybe(in, &bm), maybe(in, &c), in.byte() < 10 ? nullptr : &bytes);
        check("fly_gemm_workspace_size", s);
        if (s == FLY_SUCCESS && bytes >= (size_t(1) << 40)) broken("fly_gemm_workspace_size", s, "absurd size");
      } else {
        void* ws = in.byte() < 128 ? nullptr : pointer(in);
        const size_t ws_bytes = ws ? size_t(in.i64()) : 0;
        const fly_status s = fly_gemm(maybe(in, &a), maybe(in, &bm), maybe(in, &c), maybe(in, &bias), ws, ws_bytes, stream(in));
        check("fly_gemm", s);
        if (s == FLY_SUCCESS && b.launch_count && a.sizes[0] > 0 && bm.sizes[1] > 0 && b.launch_count() == launches_before)
          broken("fly_gemm", s, "succeeded without a launch");
      }
      break;
    }
    case 5: {
      const std::string n = name(in);
      const char *fam = nullptr, *params = nullptr;
      const fly_status s = fly_variant_info(in.byte() < 10 ? nullptr : n.c_str(), &fam, &params);
      check("fly_variant_info", s);
      if (s == FLY_SUCCESS && (!fam || !params)) broken("fly_variant_info", s, "no family/params");
      break;
    }
    case 6: {  // forcing a variant, then one op under it, then back to the database
      const std::string n = name(in);
      const fly_status s = fly_force_variant(n.c_str());
      check("fly_force_variant", s);
      break;
    }
    case 7: {
      const fly_status s = fly_force_variant(nullptr);
      check("fly_force_variant(NULL)", s);
      if (s != FLY_SUCCESS) broken("fly_force_variant(NULL)", s, "clearing failed");
      break;
    }
    case 8: {
      const char* arch = nullptr;
      const fly_status s = fly_device_arch(stream(in), in.byte() < 20 ? nullptr : &arch);
      check("fly_device_arch", s);
      if (s == FLY_SUCCESS && (!arch || std::strcmp(arch, "sm_90a") != 0)) broken("fly_device_arch", s, "arch");
      break;
    }
    case 9: {  // overlay databases that are not databases; always back to none
      static const char* kPaths[] = {"/nonexistent/x.sqlite", "/dev/null", "/tmp", "/dev/zero", "", "/proc/self/status"};
      const fly_status s = fly_set_tuning_db(kPaths[in.byte() % 6]);
      check("fly_set_tuning_db", s);
      const fly_status s2 = fly_set_tuning_db(nullptr);
      check("fly_set_tuning_db(NULL)", s2);
      break;
    }
    case 11:
    case 12: {  // attention backward and its size query
      const int32_t dt = int32_t(in.byte() & 1 ? FLY_BF16 : FLY_F16);
      fly_tensor q = tensor(in, 4, dt), k = tensor(in, 4, dt), v = tensor(in, 4, dt), o = tensor(in, 4, dt);
      fly_tensor dout = tensor(in, 4, dt), lse = tensor(in, 3, FLY_F32), dq = tensor(in, 4, dt), dk = tensor(in, 4, dt),
                 dv = tensor(in, 4, dt);
      if (in.byte() < 180) {  // agreeing shapes, D a multiple of 8, contiguous
        const int64_t B = 1 + q.sizes[0] % 2, Hkv = 1 + k.sizes[1] % 2, Hq = Hkv * (1 + q.sizes[1] % 2);
        const int64_t Sq = q.sizes[2] % 70, Sk = k.sizes[2] % 70, D = 8 * (1 + q.sizes[3] % 40);
        auto shape = [](fly_tensor& t, int64_t b, int64_t h, int64_t s, int64_t d) {
          t.rank = 4;
          t.sizes[0] = b, t.sizes[1] = h, t.sizes[2] = s, t.sizes[3] = d;
          t.strides[3] = 1, t.strides[2] = d, t.strides[1] = s * d, t.strides[0] = h * s * d;
        };
        for (fly_tensor* t : {&q, &o, &dout, &dq}) shape(*t, B, Hq, Sq, D);
        for (fly_tensor* t : {&k, &v, &dk, &dv}) shape(*t, B, Hkv, Sk, D);
        lse.rank = 3;
        lse.sizes[0] = B, lse.sizes[1] = Hq, lse.sizes[2] = Sq;
        lse.strides[2] = 1, lse.strides[1] = Sq, lse.strides[0] = Hq * Sq;
      }
      fly_attention_bwd_params p;
      std::memset(&p, 0, sizeof p);
      p.struct_size = in.byte() < 240 ? sizeof p : size_t(in.i64());
      p.q = maybe(in, &q), p.k = maybe(in, &k), p.v = maybe(in, &v), p.o = maybe(in, &o), p.dout = maybe(in, &dout);
      p.lse = maybe(in, &lse), p.dq = maybe(in, &dq), p.dk = maybe(in, &dk), p.dv = maybe(in, &dv);
      p.softmax_scale = in.tame ? 0.0 : in.real();
      p.causal = in.byte() < 240 ? in.byte() & 1 : int32_t(in.i64());
      p.nondeterministic = in.byte() < 240 ? in.byte() & 1 : int32_t(in.i64());
      if (entry == 11) {
        size_t bytes = 12345;
        const fly_status s = fly_attention_bwd_workspace_size(&p, in.byte() < 10 ? nullptr : &bytes);
        check("fly_attention_bwd_workspace_size", s);
        if (s != FLY_SUCCESS && bytes != 12345 && bytes != 0) broken("fly_attention_bwd_workspace_size", s, "wrote a size on failure");
        if (s == FLY_SUCCESS && bytes >= (size_t(1) << 50)) broken("fly_attention_bwd_workspace_size", s, "absurd size");
      } else {
        p.workspace = in.byte() < 40 ? nullptr : pointer(in);
        p.workspace_bytes = in.byte() < 128 ? size_t(1) << 20 : size_t(in.i64());
        const fly_status s = fly_attention_bwd(&p, stream(in));
        check("fly_attention_bwd", s);
        if (s == FLY_SUCCESS && b.launch_count && q.sizes[0] > 0 && q.sizes[1] > 0 && q.sizes[2] > 0 &&
            b.launch_count() == launches_before)
          broken("fly_attention_bwd", s, "succeeded without a launch");
      }
      break;
    }
    case 13: {  // grouped gemm (and its size query): offs int32 [G], b [G, K, N], bias [G, N]
      const int32_t dt = int32_t(in.byte() & 1 ? FLY_BF16 : FLY_F16);
      fly_tensor a = tensor(in, 2, dt), bg = tensor(in, 3, dt), offs = tensor(in, 1, FLY_I32), c = tensor(in, 2, dt),
                 bias = tensor(in, 2, dt);
      if (in.byte() < 180) {  // agreeing shapes, TMA-friendly multiples of 8
        const int64_t T = 8 * (a.sizes[0] % 16), K = 8 * (a.sizes[1] % 16 + 1), N = 8 * (bg.sizes[2] % 16 + 1),
                      G = 1 + bg.sizes[0] % 4;
        a.sizes[0] = c.sizes[0] = T;
        a.sizes[1] = bg.sizes[1] = K;
        bg.sizes[0] = offs.sizes[0] = bias.sizes[0] = G;
        bg.sizes[2] = c.sizes[1] = bias.sizes[1] = N;
        a.strides[0] = K;
        c.strides[0] = bias.strides[0] = N;
        a.strides[1] = c.strides[1] = bias.strides[1] = offs.strides[0] = 1;
        const bool km = in.byte() & 1;
        bg.strides[0] = K * N;
        bg.strides[1] = km ? 1 : N;
        bg.strides[2] = km ? K : 1;
      }
      if (in.byte() < 64) {
        size_t bytes = 12345;
        const fly_status s = fly_grouped_gemm_workspace_size(maybe(in, &a), maybe(in, &bg), maybe(in, &offs), maybe(in, &c),
                                                             in.byte() < 10 ? nullptr : &bytes);
        check("fly_grouped_gemm_workspace_size", s);
        // 2-D a and b (a random rank can make them so) are the ragged-K mode: G x 256 bytes.
        const bool kmode = a.rank == 2 && bg.rank == 2;
        if (s == FLY_SUCCESS && bytes != (kmode ? size_t(offs.sizes[0]) * 256 : 0))
          broken("fly_grouped_gemm_workspace_size", s, "wrong size");
      } else {
        void* ws = in.byte() < 200 ? nullptr : pointer(in);
        const size_t ws_bytes = ws ? size_t(in.i64()) : 0;
        const fly_status s = fly_grouped_gemm(maybe(in, &a), maybe(in, &bg), maybe(in, &offs), maybe(in, &bias),
                                              maybe(in, &c), ws, ws_bytes, stream(in));
        check("fly_grouped_gemm", s);
        if (s == FLY_SUCCESS && b.launch_count && a.sizes[0] > 0 && bg.sizes[2] > 0 && b.launch_count() == launches_before)
          broken("fly_grouped_gemm", s, "succeeded without a launch");
      }
      break;
    }
    case 14:  // the MX entries
      fuzz_mx(in);
      break;
    case 15: {  // grouped gemm, ragged-K mode: a [M, Kt], b [Kt, N], offs int32 [G] along K, c [G, M, N]
      const int32_t dt = int32_t(in.byte() & 1 ? FLY_BF16 : FLY_F16);
      fly_tensor a = tensor(in, 2, dt), bk = tensor(in, 2, dt), offs = tensor(in, 1, FLY_I32), c = tensor(in, 3, dt),
                 bias = tensor(in, 2, dt);
      if (in.byte() < 180) {  // agreeing shapes, TMA-friendly multiples of 8, every operand order (K-contiguous refused)
        const int64_t M = 8 * (a.sizes[0] % 16), Kt = 8 * (a.sizes[1] % 16), N = 8 * (bk.sizes[1] % 16 + 1),
                      G = offs.sizes[0] % 5;
        const bool ak = in.byte() < 40, bkc = in.byte() < 40;
        a.sizes[0] = c.sizes[1] = M;
        a.sizes[1] = bk.sizes[0] = Kt;
        bk.sizes[1] = c.sizes[2] = N;
        offs.sizes[0] = c.sizes[0] = G;
        a.strides[0] = ak ? Kt : 1;
        a.strides[1] = ak ? 1 : M;
        bk.strides[0] = bkc ? 1 : N;
        bk.strides[1] = bkc ? Kt : 1;
        c.strides[0] = M * N;
        c.strides[1] = N;
        c.strides[2] = offs.strides[0] = 1;
      }
      if (in.byte() < 64) {
        size_t bytes = 12345;
        const fly_status s = fly_grouped_gemm_workspace_size(maybe(in, &a), maybe(in, &bk), maybe(in, &offs), maybe(in, &c),
                                                             in.byte() < 10 ? nullptr : &bytes);
        check("fly_grouped_gemm_workspace_size", s);
        if (s == FLY_SUCCESS && a.rank == 2 && bk.rank == 2 && bytes != size_t(offs.sizes[0]) * 256)
          broken("fly_grouped_gemm_workspace_size", s, "ragged-K mode: not G x 256 bytes");
      } else {
        void* ws = in.byte() < 60 ? nullptr : pointer(in);
        const size_t ws_bytes = ws ? (in.byte() < 128 ? size_t(offs.sizes[0]) * 256 : size_t(in.i64())) : 0;
        const fly_status s = fly_grouped_gemm(maybe(in, &a), maybe(in, &bk), maybe(in, &offs),
                                              in.byte() < 20 ? &bias : nullptr, maybe(in, &c), ws, ws_bytes, stream(in));
        check("fly_grouped_gemm", s);
        if (s == FLY_SUCCESS && b.launch_count && c.sizes[0] > 0 && c.sizes[1] > 0 && c.sizes[2] > 0 &&
            b.launch_count() == launches_before)
          broken("fly_grouped_gemm (k)", s, "succeeded without a launch");
      }
      break;
    }
    case 10:
      if (in.byte() & 1) {
        fuzz_cross_entropy(in);
        break;
      }
      [[fallthrough]];
    default: {
      const int i = int(int32_t(in.u64()));
      const char* v = fly_variant_name(i);
      if ((i < 0 || i >= fly_variant_count()) != (v == nullptr)) broken("fly_variant_name", FLY_SUCCESS, "range");
      break;
    }
  }
  if (b.launch_count && b.launch_count() != launches_before) ++g_launching_calls;
  return 0;
}
