// SPDX-License-Identifier: Apache-2.0
// Standalone check + timing of the TopK device code (no library needed): every kernel
// configuration on the suite shapes and on adversarial inputs, against a CPU reference.
// Build: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I kernels -I include
//        kernels/topk/dev/harness.cu -o topk_harness
// Run:   topk_harness suites/topk.json OUTDIR [quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "topk/topk_radix.cuh"
#include "topk/topk_small.cuh"
#include "topk/topk_split.cuh"

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e = (x);                                                                \
    if (e != cudaSuccess) {                                                             \
      fprintf(stderr, "%s: %s (%s:%d)\n", #x, cudaGetErrorString(e), __FILE__, __LINE__); \
      exit(2);                                                                          \
    }                                                                                   \
  } while (0)

template <int NT, int TPR, int KM>
__global__ void __launch_bounds__(NT) k_small(const TopkParams p) {
  fly_topk::small_body<NT, TPR, KM>(p);
}
template <int NT>
__global__ void __launch_bounds__(NT) k_radix(const TopkParams p) {
  fly_topk::radix_body<NT>(p);
}
template <int NT>
__global__ void __launch_bounds__(NT) k_sinit(const TopkParams p) {
  fly_topk::split_init_body<NT>(p);
}
template <int NT>
__global__ void __launch_bounds__(NT) k_spass(const TopkParams p) {
  fly_topk::split_pass_body<NT>(p);
}
template <int NT>
__global__ void __launch_bounds__(NT) k_stie(const TopkParams p) {
  fly_topk::split_tie_body<NT>(p);
}
template <int NT>
__global__ void __launch_bounds__(NT) k_ssort(const TopkParams p) {
  fly_topk::split_sort_body<NT>(p);
}

enum Kind { SMALL, RADIX, SPLIT };
struct Cfg {
  Kind kind;
  int nt, tpr, kmax, chunk;
  void (*f0)(TopkParams);
  void (*f1)(TopkParams);
  void (*f2)(TopkParams);
  void (*f3)(TopkParams);
  std::string name;
};
static std::vector<Cfg> g_cfgs;
static int g_smem_limit = 232448;

template <int NT, int TPR, int KM>
void add_small() {
  char b[64];
  snprintf(b, sizeof b, "small_t%d_w%d_k%d", NT, TPR, KM);
  g_cfgs.push_back({SMALL, NT, TPR, KM, 0, k_small<NT, TPR, KM>, nullptr, nullptr, nullptr, b});
}
template <int NT>
void add_radix() {
  char b[64];
  snprintf(b, sizeof b, "radix_t%d", NT);
  CK(cudaFuncSetAttribute(k_radix<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_limit));
  g_cfgs.push_back({RADIX, NT, 0, 0, 0, k_radix<NT>, nullptr, nullptr, nullptr, b});
}
template <int NT>
void add_split(int chunk) {
  char b[64];
  snprintf(b, sizeof b, "split_t%d_c%d", NT, chunk);
  CK(cudaFuncSetAttribute(k_ssort<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_limit));
  g_cfgs.push_back({SPLIT, NT, 0, 0, chunk, k_sinit<NT>, k_spass<NT>, k_stie<NT>, k_ssort<NT>, b});
}

static bool supports(const Cfg& c, int64_t R, int64_t C, int64_t k) {
  switch (c.kind) {
    case SMALL: return k <= c.kmax;
    case RADIX: return true;
    case SPLIT: return R <= 1024 && C > c.chunk;
  }
  return false;
}
static int64_t ws_need(const Cfg& c, int64_t R, int64_t C, int64_t k) {
  if (c.kind == RADIX) return topk_plan::radix_workspace(R, k);
  if (c.kind == SPLIT) return topk_plan::plan_split(R, C, k, c.chunk).ws_bytes;
  return 0;
}

static void launch(const Cfg& c, TopkParams p, void* ws, cudaStream_t s) {
  p.kpad = (int)topk_plan::next_pow2(p.k);
  if (c.kind == SMALL) {
    int rpc = c.nt / c.tpr;
    c.f0<<<(unsigned)((p.R + rpc - 1) / rpc), c.nt, 0, s>>>(p);
  } else if (c.kind == RADIX) {
    auto pl = topk_plan::plan_radix(p.R, p.C, p.k, g_smem_limit);
    p.cache_row = pl.cache_row;
    p.sort_in_smem = pl.sort_in_smem;
    p.ws_cand = (uint64_t*)ws;
    c.f0<<<p.R, c.nt, pl.smem, s>>>(p);
  } else {
    auto pl = topk_plan::plan_split(p.R, p.C, p.k, c.chunk);  // as src/ops/topk.cpp
    char* w = (char*)ws;
    p.chunk = (int)pl.chunk;
    p.pieces = (int)pl.pieces;
    p.cap_a = (int)pl.cap_a;
    p.cap_b = (int)pl.cap_b;
    p.ldt = (int)pl.ldt;
    p.sort_in_smem = pl.sort_in_smem;
    p.ws_state = (TopkSplitState*)(w + pl.state_offset);
    p.ws_cand = (uint64_t*)(w + pl.cand_offset);
    p.ws_buf_a = (uint64_t*)(w + pl.buf_a_offset);
    p.ws_buf_b = (uint64_t*)(w + pl.buf_b_offset);
    p.ws_tiecnt = (uint32_t*)(w + pl.tie_offset);
    p.ws_ties = (uint64_t*)(w + pl.ties_offset);
    const int64_t want = (132 * std::max(1, 2048 / c.nt) + p.R - 1) / p.R;
    p.splits = (int)std::max<int64_t>(1, std::min<int64_t>(pl.pieces, want));
    c.f0<<<p.R, c.nt, 0, s>>>(p);
    for (int pass = 0; pass < 4; ++pass) {
      p.pass = pass;
      c.f1<<<dim3(p.splits, p.R), c.nt, pl.smem, s>>>(p);
    }
    if (p.deterministic) {
      p.pass = 4;
      c.f2<<<dim3(p.splits, p.R), c.nt, pl.smem, s>>>(p);
    }
    c.f3<<<p.R, c.nt, pl.sort_smem, s>>>(p);
  }
}

// ---- CPU reference --------------------------------------------------------------------------
static uint32_t hkey(float v, bool largest) {
  uint32_t u;
  memcpy(&u, &v, 4);
  bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return largest ? (nan ? 0xffffffffu : ord) : (nan ? 1u : ~ord);
}
// Reference: per row the top-k composites (key << 32 | ~index), best first.
static std::vector<uint64_t> reference(const std::vector<float>& x, int64_t ld, int64_t R,
                                       int64_t C, int64_t k, bool largest) {
  std::vector<uint64_t> ref(R * k), comp(C);
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.data() + r * ld;
    for (int64_t i = 0; i < C; ++i)
      comp[i] = ((uint64_t)hkey(xr[i], largest) << 32) | (uint32_t)~(uint32_t)i;
    std::nth_element(comp.begin(), comp.begin() + (k - 1), comp.end(), std::greater<uint64_t>());
    std::sort(comp.begin(), comp.begin() + k, std::greater<uint64_t>());
    std::copy(comp.begin(), comp.begin() + k, ref.begin() + r * k);
  }
  return ref;
}
// Returns number of bad rows; prints the first problem.
static int64_t check(const std::vector<float>& x, int64_t ld, int64_t R, int64_t C, int64_t k,
                     bool largest, bool det, const std::vector<uint64_t>& ref,
                     const std::vector<float>& vals, const std::vector<int64_t>& inds,
                     const std::string& what) {
  int64_t bad = 0;
  std::vector<char> seen(C, 0);
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.data() + r * ld;
    bool ok = true;
    std::string why;
    for (int64_t j = 0; j < k && ok; ++j) {
      float v = vals[r * k + j];
      int64_t id = inds[r * k + j];
      uint64_t rc = ref[r * k + j];
      uint32_t want = (uint32_t)(rc >> 32);
      if (hkey(v, largest) != want) { ok = false; why = "value"; break; }
      if (id < 0 || id >= C) { ok = false; why = "index range"; break; }
      if (hkey(xr[id], largest) != want) { ok = false; why = "x[idx] != value"; break; }
      if (det && (uint32_t)id != ~(uint32_t)rc) { ok = false; why = "det index order"; break; }
      if (seen[id]) { ok = false; why = "duplicate index"; break; }
      seen[id] = 1;
    }
    for (int64_t j = 0; j < k; ++j) {
      int64_t id = inds[r * k + j];
      if (id >= 0 && id < C) seen[id] = 0;
    }
    if (!ok) {
      if (bad == 0)
        fprintf(stderr, "FAIL %s row %lld: %s\n", what.c_str(), (long long)r, why.c_str());
      ++bad;
    }
  }
  return bad;
}

struct Dev {
  float* x = nullptr;
  float* v = nullptr;
  int64_t* i = nullptr;
  void* ws = nullptr;
  size_t xb = 0, vb = 0, ib = 0, wsb = 0;
  void need(size_t xbytes, size_t vbytes, size_t ibytes, size_t wbytes) {
    auto grow = [](void** p, size_t* have, size_t want) {
      if (want > *have) {
        if (*p) CK(cudaFree(*p));
        CK(cudaMalloc(p, want));
        *have = want;
      }
    };
    grow((void**)&x, &xb, xbytes);
    grow((void**)&v, &vb, vbytes);
    grow((void**)&i, &ib, ibytes);
    grow(&ws, &wsb, std::max<size_t>(wbytes, 256));
  }
};

static int64_t g_fail = 0;

static void upload(Dev& d, const std::vector<float>& hx, int64_t ld, int64_t R, int64_t C,
                   int64_t k, int xoff, size_t ws) {
  size_t xbytes = (size_t)((R - 1) * ld + C + xoff) * 4;
  d.need(xbytes, R * k * 4, R * k * 8, ws);
  CK(cudaMemcpy(d.x + xoff, hx.data(), (size_t)((R - 1) * ld + C) * 4, cudaMemcpyHostToDevice));
}
static TopkParams params(Dev& d, int64_t ld, int64_t R, int64_t C, int64_t k, bool largest,
                         bool det, int xoff) {
  TopkParams p{};
  p.x = d.x + xoff;
  p.ldx = ld;
  p.values = d.v;
  p.ldv = k;
  p.indices = d.i;
  p.ldi = k;
  p.R = (int)R;
  p.C = (int)C;
  p.k = (int)k;
  p.largest = largest;
  p.deterministic = det;
  return p;
}
// Runs one config on the uploaded data and checks it against the reference.
static void run_check(const Cfg& c, Dev& d, const std::vector<float>& hx,
                      const std::vector<uint64_t>& ref, int64_t ld, int64_t R, int64_t C,
                      int64_t k, bool largest, bool det, int xoff, const std::string& tag) {
  CK(cudaMemset(d.v, 0xff, R * k * 4));
  CK(cudaMemset(d.i, 0xff, R * k * 8));
  TopkParams p = params(d, ld, R, C, k, largest, det, xoff);
  launch(c, p, d.ws, 0);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> hv(R * k);
  std::vector<int64_t> hi(R * k);
  CK(cudaMemcpy(hv.data(), d.v, R * k * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hi.data(), d.i, R * k * 8, cudaMemcpyDeviceToHost));
  char b[256];
  snprintf(b, sizeof b, "%s %s R=%lld C=%lld k=%lld ld=%lld off=%d largest=%d det=%d",
           c.name.c_str(), tag.c_str(), (long long)R, (long long)C, (long long)k, (long long)ld,
           xoff, largest, det);
  int64_t bad = check(hx, ld, R, C, k, largest, det, ref, hv, hi, b);
  if (bad) {
    ++g_fail;
    fprintf(stderr, "  -> %lld bad rows\n", (long long)bad);
  }
  if (det) {  // run again: identical?
    launch(c, p, d.ws, 0);
    CK(cudaDeviceSynchronize());
    std::vector<int64_t> hi2(R * k);
    CK(cudaMemcpy(hi2.data(), d.i, R * k * 8, cudaMemcpyDeviceToHost));
    if (hi2 != hi) {
      ++g_fail;
      fprintf(stderr, "FAIL %s: det rerun differs\n", b);
    }
  }
}
static size_t max_ws(int64_t R, int64_t C, int64_t k) {
  size_t w = 0;
  for (auto& c : g_cfgs)
    if (supports(c, R, C, k)) w = std::max<size_t>(w, ws_need(c, R, C, k));
  return w;
}

static std::vector<float> gen(int64_t n, int mode, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    switch (mode) {
      case 0: v[i] = u(g); break;                        // uniform
      case 1: v[i] = (float)(int)(g() % 5) - 2.f; break;  // heavy ties (incl. -0? no)
      case 2: {                                            // specials
        uint64_t r = g() % 16;
        v[i] = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? -INFINITY : r == 3 ? -0.0f
             : r == 4 ? 0.0f : r == 5 ? -NAN : u(g);
        break;
      }
      case 3: v[i] = 1.0f; break;  // all equal
    }
  }
  return v;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s suite.json outdir [quick]\n", argv[0]);
    return 1;
  }
  std::string outdir = argv[2];
  bool quick = argc > 3;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_smem_limit = (int)prop.sharedMemPerBlockOptin;
  printf("device %s, %d SMs, smem optin %d\n", prop.name, prop.multiProcessorCount, g_smem_limit);

  add_small<256, 8, 4>(); add_small<256, 8, 8>(); add_small<256, 8, 16>(); add_small<256, 8, 32>();
  add_small<256, 16, 4>(); add_small<256, 16, 8>(); add_small<256, 16, 16>(); add_small<256, 16, 32>();
  add_small<256, 32, 4>(); add_small<256, 32, 8>(); add_small<256, 32, 16>(); add_small<256, 32, 32>();
  add_small<128, 8, 16>(); add_small<128, 16, 16>(); add_small<128, 32, 16>(); add_small<128, 32, 4>();
  add_small<256, 4, 4>(); add_small<256, 4, 16>();
  add_radix<256>(); add_radix<512>(); add_radix<1024>();
  add_split<512>(16384); add_split<512>(32768); add_split<1024>(32768); add_split<1024>(65536);
  add_split<256>(8192); add_split<512>(8192);

  Dev d;
  // ---- correctness on adversarial shapes -------------------------------------------------
  struct Sh { int64_t R, C, k; };
  std::vector<Sh> shapes = {{3, 1, 1},     {5, 7, 3},     {4, 37, 37},   {9, 128, 16},
                            {7, 250, 4},   {3, 1000, 1},  {2, 4099, 33}, {3, 20000, 700},
                            {2, 70001, 5}, {2, 70001, 3000}, {1, 300000, 2}, {5, 3000, 3000}};
  for (auto sh : shapes) {
    for (int mode = 0; mode < 4; ++mode) {
      for (int ldpad : {0, 3}) {
        int64_t ld = sh.C + ldpad;
        int xoff = ldpad ? 1 : 0;
        auto hx = gen((sh.R - 1) * ld + sh.C, mode, 1234 + mode + sh.C);
        fprintf(stderr, "adv R=%lld C=%lld k=%lld mode=%d ldpad=%d\n", (long long)sh.R, (long long)sh.C, (long long)sh.k, mode, ldpad);
        upload(d, hx, ld, sh.R, sh.C, sh.k, xoff, max_ws(sh.R, sh.C, sh.k));
        for (int lg = 0; lg < 2; ++lg) {
          auto ref = reference(hx, ld, sh.R, sh.C, sh.k, lg);
          for (auto& c : g_cfgs) {
            if (!supports(c, sh.R, sh.C, sh.k)) continue;
            for (int det = 0; det < 2; ++det)
              run_check(c, d, hx, ref, ld, sh.R, sh.C, sh.k, lg, det, xoff,
                        "mode" + std::to_string(mode));
          }
        }
      }
    }
  }
  printf("adversarial checks: %lld failures\n", (long long)g_fail);

  // ---- suite: check + time ------------------------------------------------------------------
  std::ifstream fs(argv[1]);
  std::stringstream ss;
  ss << fs.rdbuf();
  std::string js = ss.str();
  std::vector<Sh> cases;
  for (size_t pos = 0; (pos = js.find("\"R\"", pos)) != std::string::npos;) {
    Sh s;
    s.R = atoll(js.c_str() + js.find(':', pos) + 1);
    size_t pc = js.find("\"C\"", pos);
    s.C = atoll(js.c_str() + js.find(':', pc) + 1);
    size_t pk = js.find("\"k\"", pos);
    s.k = atoll(js.c_str() + js.find(':', pk) + 1);
    cases.push_back(s);
    pos = pk;
  }
  cases.push_back({1024, 32000, 8});
  cases.push_back({128, 1048576, 8});
  printf("%zu cases\n", cases.size());
  void* flush;
  size_t flush_bytes = 256u << 20;
  CK(cudaMalloc(&flush, flush_bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  FILE* all = fopen((outdir + "/harness_all.csv").c_str(), "w");
  FILE* jb = fopen((outdir + "/ours_best.json").c_str(), "w");
  fprintf(all, "R,C,k,det,cfg,us\n");
  fprintf(jb, "[\n");
  bool firstj = true;
  auto t_start = std::chrono::steady_clock::now();
  for (auto cs : cases) {
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    if (el > 80) { printf("time budget: stopping before R=%lld C=%lld k=%lld\n", (long long)cs.R, (long long)cs.C, (long long)cs.k); break; }
    auto hx = gen(cs.R * cs.C, 0, 77 + cs.C + cs.k);
    upload(d, hx, cs.C, cs.R, cs.C, cs.k, 0, max_ws(cs.R, cs.C, cs.k));
    auto ref = reference(hx, cs.C, cs.R, cs.C, cs.k, true);
    for (int det = 0; det < 2; ++det) {
      double best = 1e30;
      std::string bestn;
      for (auto& c : g_cfgs) {
        if (!supports(c, cs.R, cs.C, cs.k)) continue;
        if (c.kind == SMALL && cs.C > 8192 && cs.R < 1024) continue;  // hopeless, saves time
        run_check(c, d, hx, ref, cs.C, cs.R, cs.C, cs.k, true, det, 0, "suite");
        TopkParams p = params(d, cs.C, cs.R, cs.C, cs.k, true, det, 0);
        int reps = quick ? 5 : 15;
        std::vector<float> ts;
        for (int r = 0; r < reps + 2; ++r) {
          CK(cudaMemsetAsync(flush, r, flush_bytes));
          CK(cudaEventRecord(e0));
          launch(c, p, d.ws, 0);
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          if (r >= 2) ts.push_back(ms * 1000.f);
        }
        CK(cudaGetLastError());
        std::sort(ts.begin(), ts.end());
        double us = ts[ts.size() / 2];
        fprintf(all, "%lld,%lld,%lld,%d,%s,%.2f\n", (long long)cs.R, (long long)cs.C,
                (long long)cs.k, det, c.name.c_str(), us);
        if (us < best) { best = us; bestn = c.name; }
      }
      double gbs = cs.R * cs.C * 4.0 / (best * 1e-6) / 1e12;
      printf("R=%6lld C=%8lld k=%5lld det=%d best %-22s %9.2f us  %.2f TB/s\n", (long long)cs.R,
             (long long)cs.C, (long long)cs.k, det, bestn.c_str(), best, gbs);
      fflush(stdout);
      fprintf(jb, "%s {\"R\": %lld, \"C\": %lld, \"k\": %lld, \"deterministic\": %s, \"us\": %.3f, \"variant\": \"%s\"}",
              firstj ? "" : ",\n", (long long)cs.R, (long long)cs.C, (long long)cs.k,
              det ? "true" : "false", best, bestn.c_str());
      firstj = false;
    }
  }
  fprintf(jb, "\n]\n");
  fclose(jb);
  fclose(all);
  printf("total failures: %lld\n", (long long)g_fail);
  return g_fail ? 1 : 0;
}
