// Bounded GPU workload for compute-sanitizer (docs/robustness.md): every rmsnorm and topk variant
// and one GEMM variant of each kernel path (plain, multicast cluster, P multicast, split-K,
// stream-K with workspace, kw2, e1/e2 epilogues, swap-AB, kb2, decode when bundled, the cp.async
// kernel for strides TMA cannot take on odd leading dimensions and 2-byte aligned bases), each forced
// and run on one shape it takes, outputs checked for NaN poison left unwritten.
//   fly_gpu_subset [rmsnorm] [topk] [gemm] [--only NAME]... [--list]   (default: all three families)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "flykernels/flykernels.hpp"

namespace {

int g_failures = 0;

#define CUDA_OK(x)                                                                  \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

struct Buf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Buf(size_t n, int fill = 0x7f) : bytes(n) {
    CUDA_OK(cudaMalloc(&p, n ? n : 1));
    CUDA_OK(cudaMemset(p, fill, n));  // 0x7f7f...: NaN for fp32 and large for 16-bit types
  }
  ~Buf() { cudaFree(p); }
};

bool has(const std::string& params, const char* kv) {
  return (";" + params + ";").find(";" + std::string(kv) + ";") != std::string::npos;
}

void report(const char* name, fly_status s, const char* what) {
  const cudaError_t e = cudaDeviceSynchronize();
  const bool ok = s == FLY_SUCCESS && e == cudaSuccess;
  std::printf("%-48s %-8s %s%s%s\n", name, what, ok ? "ok" : fly_status_string(s), ok ? "" : " ",
              ok ? "" : (e != cudaSuccess ? cudaGetErrorString(e) : fly_get_last_error()));
  g_failures += !ok;
}

void run_rmsnorm(const char* name, const std::string& ps) {
  const fly_dtype dt = has(ps, "dtype=fp16") ? FLY_F16 : has(ps, "dtype=fp32") ? FLY_F32 : FLY_BF16;
  const size_t es = dt == FLY_F32 ? 4 : 2;
  const int64_t M = 67, N = 4099, ld = 4104;  // odd N, padded rows, unaligned second row
  Buf x(M * ld * es, 0x3c), y(M * ld * es), w(N * es, 0x3c), r(M * 4);
  const fly_tensor tx = flykernels::tensor(x.p, dt, {M, N}, {ld, 1}), ty = flykernels::tensor(y.p, dt, {M, N}, {ld, 1});
  const fly_tensor tw = flykernels::tensor(w.p, dt, {N}, {1}), tr = flykernels::tensor(r.p, FLY_F32, {M}, {1});
  report(name, fly_rms_norm_fwd(&tx, &tw, 1e-5, &ty, &tr, nullptr), "rows");
}

void run_topk(const char* name, const std::string& ps) {
  const bool split = has(ps, "path=split");
  int64_t chunk = 0;
  if (split) std::sscanf(std::strstr(ps.c_str(), "chunk=") + 6, "%lld", reinterpret_cast<long long*>(&chunk));
  const int64_t R = split ? 3 : 40, C = split ? 2 * chunk + 77 : 3001, k = has(ps, "path=small") ? 4 : 300;
  for (int det : {0, 1}) {
    Buf x(R * C * 4, 0x3c), v(R * k * 4), i(R * k * 8);
    const fly_tensor tx = flykernels::tensor(x.p, FLY_F32, {R, C}, {C, 1});
    const fly_tensor tv = flykernels::tensor(v.p, FLY_F32, {R, k}, {k, 1}), ti = flykernels::tensor(i.p, FLY_I64, {R, k}, {k, 1});
    size_t ws_bytes = 0;
    fly_topk_workspace_size(&tx, k, 1, det, &ws_bytes);
    Buf ws(ws_bytes, 0);
    report(name, fly_topk(&tx, k, 1, det, &tv, &ti, ws_bytes ? ws.p : nullptr, ws_bytes, nullptr), det ? "det" : "nondet");
  }
}

// The cp.async kernel (gemm_odd_ variants) on the strides it exists for: TN 77 x 515 x 1003 with
// lda = M + 1 (4-byte lines), ldb = K + 1 (8-byte lines), ldc = N + 1 and C at a 2-byte offset, bias;
// then NN 333 x 141 x 201 with odd lda and ldb (2-byte lines, element loads) and A 2 bytes in.
void run_gemm_odd(const char* name, fly_dtype dt) {
  {
    const int64_t M = 77, N = 515, K = 1003;
    Buf a((M + 1) * K * 2, 0x3c), b((K + 1) * N * 2, 0x3c), c((M * (N + 1) + 1) * 2), bias(N * 2, 0);
    const fly_tensor ta = flykernels::tensor(a.p, dt, {M, K}, {1, M + 1});
    const fly_tensor tb = flykernels::tensor(b.p, dt, {K, N}, {1, K + 1});
    const fly_tensor tc = flykernels::tensor(static_cast<char*>(c.p) + 2, dt, {M, N}, {N + 1, 1});
    const fly_tensor tbias = flykernels::tensor(bias.p, dt, {N}, {1});
    report(name, fly_gemm(&ta, &tb, &tc, &tbias, nullptr, 0, nullptr), "tn-ld+1");
  }
  {
    const int64_t M = 333, N = 141, K = 201;
    Buf a((M * K + 1) * 2, 0x3c), b(K * N * 2, 0x3c), c(M * N * 2);
    const fly_tensor ta = flykernels::tensor(static_cast<char*>(a.p) + 2, dt, {M, K}, {K, 1});
    const fly_tensor tb = flykernels::tensor(b.p, dt, {K, N}, {N, 1});
    const fly_tensor tc = flykernels::tensor(c.p, dt, {M, N}, {N, 1});
    report(name, fly_gemm(&ta, &tb, &tc, nullptr, nullptr, 0, nullptr), "nn-2byte");
  }
}

void run_gemm(const char* name, const std::string& ps) {
  const fly_dtype dt = has(ps, "dtype=fp16") ? FLY_F16 : FLY_BF16;
  if (std::strncmp(name, "gemm_odd_", 9) == 0) return run_gemm_odd(name, dt);
  struct Shape { int64_t M, N, K; bool a_row, b_row; };
  const Shape shapes[] = {{256, 512, 640, true, false}, {64, 1024, 1024, true, false}, {8, 1024, 2048, true, false},
                          {256, 512, 640, true, true},  {256, 512, 640, false, false}, {128, 2048, 8192, true, false},
                          {2048, 2048, 512, true, false}};
  size_t ws_bytes = 0;
  {
    const fly_tensor a = flykernels::tensor(reinterpret_cast<void*>(256), dt, {8, 8}, {8, 1});
    fly_gemm_workspace_size(&a, &a, &a, &ws_bytes);
  }
  Buf ws(ws_bytes, 0);
  for (const Shape& s : shapes) {
    Buf a(s.M * s.K * 2, 0x3c), b(s.K * s.N * 2, 0x3c), c(s.M * s.N * 2), bias(s.N * 2, 0);
    const fly_tensor ta = s.a_row ? flykernels::tensor(a.p, dt, {s.M, s.K}, {s.K, 1}) : flykernels::tensor(a.p, dt, {s.M, s.K}, {1, s.M});
    const fly_tensor tb = s.b_row ? flykernels::tensor(b.p, dt, {s.K, s.N}, {s.N, 1}) : flykernels::tensor(b.p, dt, {s.K, s.N}, {1, s.K});
    const fly_tensor tc = flykernels::tensor(c.p, dt, {s.M, s.N}, {s.N, 1}), tbias = flykernels::tensor(bias.p, dt, {s.N}, {1});
    const fly_status st = fly_gemm(&ta, &tb, &tc, &tbias, ws_bytes ? ws.p : nullptr, ws_bytes, nullptr);
    if (st == FLY_ERROR_UNSUPPORTED) continue;
    char what[64];
    std::snprintf(what, sizeof what, "%lldx%lldx%lld", (long long)s.M, (long long)s.N, (long long)s.K);
    report(name, st, what);
    return;
  }
  std::printf("%-48s no shape of the subset fits\n", name);
  ++g_failures;
}

// One GEMM variant per kernel path: the first bundled one whose parameters hold every key.
std::vector<std::string> gemm_representatives() {
  const std::vector<std::vector<const char*>> paths = {
      {"mc=1", "swap=0", "split=0", "gm=0"}, {"mc=2"}, {"mp=2"}, {"split=2"}, {"split=3"}, {"split=4"}, {"split=1"}, {"kw=2"},
      {"epi=1"}, {"epi=2"}, {"epi=3"}, {"swap=1"}, {"kb=2"}, {"kb=4"}, {"ks=1"}, {"bm=64"}, {"gm=8"}};
  std::vector<std::string> out;
  for (const auto& keys : paths) {
    for (int i = 0; i < fly_variant_count(); ++i) {
      const char *fam = nullptr, *ps = nullptr;
      fly_variant_info(fly_variant_name(i), &fam, &ps);
      if (std::string(fam) != "gemm") continue;
      bool all = true;
      for (const char* k : keys) all = all && has(ps, k);
      if (all) {
        out.push_back(fly_variant_name(i));
        break;
      }
    }
  }
  for (int i = 0; i < fly_variant_count(); ++i) {  // the cp.async kernel
    if (std::strncmp(fly_variant_name(i), "gemm_odd_", 9) == 0) { out.push_back(fly_variant_name(i)); break; }
  }
  for (int i = 0; i < fly_variant_count(); ++i) {  // the decode kernel, when bundled
    const char *fam = nullptr, *ps = nullptr;
    fly_variant_info(fly_variant_name(i), &fam, &ps);
    if (std::string(fam) == "gemm" && std::strstr(ps, "rpw=")) { out.push_back(fly_variant_name(i)); break; }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, bool> want = {{"rmsnorm", argc == 1}, {"topk", argc == 1}, {"gemm", argc == 1}};
  std::vector<std::string> names;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--only" && i + 1 < argc) names.push_back(argv[++i]);  // one variant per process
    else if (std::string(argv[i]) == "--list") list = true;  // names only: a shell loop runs each alone
    else want[argv[i]] = true;
  }
  for (int i = 0; i < fly_variant_count(); ++i) {
    const char *fam = nullptr, *ps = nullptr;
    fly_variant_info(fly_variant_name(i), &fam, &ps);
    if ((std::string(fam) == "rmsnorm" && want["rmsnorm"]) || (std::string(fam) == "topk" && want["topk"]))
      names.push_back(fly_variant_name(i));
  }
  if (want["gemm"])
    for (auto& n : gemm_representatives()) names.push_back(n);
  if (list) {
    for (const std::string& n : names) std::printf("%s\n", n.c_str());
    return 0;
  }
  for (const std::string& n : names) {
    const char *fam = nullptr, *ps = nullptr;
    if (fly_variant_info(n.c_str(), &fam, &ps) != FLY_SUCCESS || fly_force_variant(n.c_str()) != FLY_SUCCESS) {
      std::printf("%-48s not bundled\n", n.c_str());
      ++g_failures;
      continue;
    }
    const std::string f = fam;
    if (f == "rmsnorm") run_rmsnorm(n.c_str(), ps);
    else if (f == "topk") run_topk(n.c_str(), ps);
    else run_gemm(n.c_str(), ps);
  }
  fly_force_variant(nullptr);
  std::printf("fly_gpu_subset: %zu variants, %d failures\n", names.size(), g_failures);
  return g_failures ? 1 : 0;
}
