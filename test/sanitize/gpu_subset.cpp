// SPDX-License-Identifier: Apache-2.0
// Bounded GPU workload for compute-sanitizer (docs/robustness.md): every rmsnorm and topk variant,
// one GEMM variant of each kernel path (plain, multicast cluster, P multicast, split-K, stream-K
// with workspace, kw2, e1/e2 epilogues, swap-AB, kb2, decode when bundled, the cp.async kernel for
// strides TMA cannot take on odd leading dimensions and 2-byte aligned bases), and every bundled
// attention forward/backward, grouped GEMM and MX variant, each forced and run on small shapes it
// takes (outputs poisoned first; workspaces the contract says need no initialization are left
// uninitialized, so initcheck sees a read before write).
//   fly_gpu_subset [rmsnorm] [topk] [gemm] [attention] [attention_bwd] [grouped_gemm] [mx]
//                  [--only NAME]... [--list]   (default: every family)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
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
  // fill < 0: left uninitialized (workspaces whose contents the callee must write before reading).
  explicit Buf(size_t n, int fill = 0x7f) : bytes(n) {
    CUDA_OK(cudaMalloc(&p, n ? n : 1));
    if (fill >= 0) CUDA_OK(cudaMemset(p, fill, n));  // 0x7f7f...: NaN for fp32 and large for 16-bit types
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
    // The packed path on the same call: unforced, with the queried workspace (zero-filled, as the
    // contract asks), the copy kernel (fly_pack_lines_sm90, in this cubin) then a TMA variant.
    size_t ws_bytes = 0;
    fly_force_variant(nullptr);
    if (fly_gemm_workspace_size(&ta, &tb, &tc, &ws_bytes) == FLY_SUCCESS) {
      Buf ws(ws_bytes, 0);
      report(name, fly_gemm(&ta, &tb, &tc, &tbias, ws.p, ws_bytes, nullptr), "tn-ld+1-packed");
    }
    fly_force_variant(name);
  }
  {
    const int64_t M = 333, N = 141, K = 201;
    Buf a((M * K + 1) * 2, 0x3c), b(K * N * 2, 0x3c), c(M * N * 2);
    const fly_tensor ta = flykernels::tensor(static_cast<char*>(a.p) + 2, dt, {M, K}, {K, 1});
    const fly_tensor tb = flykernels::tensor(b.p, dt, {K, N}, {N, 1});
    const fly_tensor tc = flykernels::tensor(c.p, dt, {M, N}, {N, 1});
    report(name, fly_gemm(&ta, &tb, &tc, nullptr, nullptr, 0, nullptr), "nn-2byte");
    size_t ws_bytes = 0;
    fly_force_variant(nullptr);
    if (fly_gemm_workspace_size(&ta, &tb, &tc, &ws_bytes) == FLY_SUCCESS) {
      Buf ws(ws_bytes, 0);
      report(name, fly_gemm(&ta, &tb, &tc, nullptr, ws.p, ws_bytes, nullptr), "nn-2byte-packed");
    }
    fly_force_variant(name);
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

int param(const std::string& ps, const char* key) {  // "key=<int>" of a variant's parameters, 0 if absent
  const std::string all = ";" + ps, k = ";" + std::string(key) + "=";
  const size_t at = all.find(k);
  return at == std::string::npos ? 0 : std::atoi(all.c_str() + at + k.size());
}

fly_dtype dtype16(const std::string& ps) { return has(ps, "dtype=fp16") ? FLY_F16 : FLY_BF16; }

// [B, H, S, D] in the BSHD layout (strides S*H*D... as a [B, S, H, D] buffer), or BHSD.
fly_tensor bhsd(void* p, fly_dtype dt, int64_t B, int64_t H, int64_t S, int64_t D, bool bshd) {
  return bshd ? flykernels::tensor(p, dt, {B, H, S, D}, {S * H * D, D, H * D, 1})
              : flykernels::tensor(p, dt, {B, H, S, D}, {H * S * D, S * D, D, 1});
}

// Each variant on three problems: causal GQA with Sq != Sk in BSHD, a non-causal BHSD one with a
// tail tile and the LSE, and a decode (Sq = 1, long Sk) with the split-key workspace.
void run_attention(const char* name, const std::string& ps) {
  const fly_dtype dt = dtype16(ps);
  const int64_t D = param(ps, "hd");
  struct P { int64_t B, Hq, Hkv, Sq, Sk; bool causal, bshd, lse, ws; const char* what; };
  const P probs[] = {{1, 4, 2, 200, 333, true, true, true, false, "causal"},
                     {2, 2, 2, 129, 129, false, false, true, false, "full"},
                     {2, 8, 2, 1, 4096, false, false, true, true, "decode"}};
  for (const P& p : probs) {
    Buf q(p.B * p.Hq * p.Sq * D * 2, 0x3c), k(p.B * p.Hkv * p.Sk * D * 2, 0x3a), v(p.B * p.Hkv * p.Sk * D * 2, 0x3b);
    Buf o(p.B * p.Hq * p.Sq * D * 2), lse(p.B * p.Hq * p.Sq * 4);
    const fly_tensor tq = bhsd(q.p, dt, p.B, p.Hq, p.Sq, D, p.bshd), tk = bhsd(k.p, dt, p.B, p.Hkv, p.Sk, D, p.bshd);
    const fly_tensor tv = bhsd(v.p, dt, p.B, p.Hkv, p.Sk, D, p.bshd), to = bhsd(o.p, dt, p.B, p.Hq, p.Sq, D, p.bshd);
    const fly_tensor tl = flykernels::tensor(lse.p, FLY_F32, {p.B, p.Hq, p.Sq}, {p.Hq * p.Sq, p.Sq, 1});
    fly_attention_fwd_params prm = flykernels::detail::attention_params(tq, tk, tv, to, p.lse ? &tl : nullptr, p.causal, 0.0);
    size_t ws_bytes = 0;
    if (p.ws) fly_attention_fwd_workspace_size(&prm, &ws_bytes);
    Buf ws(ws_bytes, -1);
    prm.workspace = ws_bytes ? ws.p : nullptr;
    prm.workspace_bytes = ws_bytes;
    report(name, fly_attention_fwd(&prm, nullptr), p.what);
  }
  {  // the packed path: BSHD rows of D + 1 elements (Q, K, V copied to 16-byte rows first), causal
    const int64_t B = 1, Hq = 4, Hkv = 2, Sq = 100, Sk = 150, ld = D + 1;
    Buf q(B * Sq * Hq * ld * 2, 0x3c), k(B * Sk * Hkv * ld * 2, 0x3a), v(B * Sk * Hkv * ld * 2, 0x3b);
    Buf o(B * Sq * Hq * ld * 2), lse(B * Hq * Sq * 4);
    auto t4 = [&](void* d, int64_t h, int64_t s) {
      return flykernels::tensor(d, dt, {B, h, s, D}, {s * h * ld, ld, h * ld, 1});
    };
    const fly_tensor tq = t4(q.p, Hq, Sq), tk = t4(k.p, Hkv, Sk), tv = t4(v.p, Hkv, Sk), to = t4(o.p, Hq, Sq);
    const fly_tensor tl = flykernels::tensor(lse.p, FLY_F32, {B, Hq, Sq}, {Hq * Sq, Sq, 1});
    fly_attention_fwd_params prm = flykernels::detail::attention_params(tq, tk, tv, to, &tl, true, 0.0);
    size_t ws_bytes = 0;
    fly_attention_fwd_workspace_size(&prm, &ws_bytes);
    Buf ws(ws_bytes, -1);
    prm.workspace = ws.p;
    prm.workspace_bytes = ws_bytes;
    report(name, fly_attention_fwd(&prm, nullptr), "packed");
  }
}

void run_attention_bwd(const char* name, const std::string& ps) {
  const fly_dtype dt = dtype16(ps);
  const int64_t D = param(ps, "hd");
  struct P { int64_t B, Hq, Hkv, Sq, Sk; bool causal, bshd; const char* what; };
  const P probs[] = {{1, 4, 2, 200, 333, true, true, "causal"}, {2, 2, 2, 129, 129, false, false, "full"}};
  for (const P& p : probs) {
    const size_t qb = p.B * p.Hq * p.Sq * D * 2, kb = p.B * p.Hkv * p.Sk * D * 2;
    Buf q(qb, 0x3c), k(kb, 0x3a), v(kb, 0x3b), o(qb, 0x3b), dout(qb, 0x3a), lse(p.B * p.Hq * p.Sq * 4, 0x41);
    Buf dq(qb), dk(kb), dv(kb);  // lse 0x41414141 = 12.1: finite, above every row's true log-sum-exp
    const fly_tensor tq = bhsd(q.p, dt, p.B, p.Hq, p.Sq, D, p.bshd), tk = bhsd(k.p, dt, p.B, p.Hkv, p.Sk, D, p.bshd);
    const fly_tensor tv = bhsd(v.p, dt, p.B, p.Hkv, p.Sk, D, p.bshd), to = bhsd(o.p, dt, p.B, p.Hq, p.Sq, D, p.bshd);
    const fly_tensor tdo = bhsd(dout.p, dt, p.B, p.Hq, p.Sq, D, p.bshd), tdq = bhsd(dq.p, dt, p.B, p.Hq, p.Sq, D, p.bshd);
    const fly_tensor tdk = bhsd(dk.p, dt, p.B, p.Hkv, p.Sk, D, p.bshd), tdv = bhsd(dv.p, dt, p.B, p.Hkv, p.Sk, D, p.bshd);
    const fly_tensor tl = flykernels::tensor(lse.p, FLY_F32, {p.B, p.Hq, p.Sq}, {p.Hq * p.Sq, p.Sq, 1});
    const flykernels::AttentionBwdTensors t{&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv};
    fly_attention_bwd_params prm = flykernels::detail::attention_bwd_params(t, p.causal, 0.0);
    size_t ws_bytes = 0;
    fly_attention_bwd_workspace_size(&prm, &ws_bytes);
    Buf ws(ws_bytes, -1);
    prm.workspace = ws.p;
    prm.workspace_bytes = ws_bytes;
    report(name, fly_attention_bwd(&prm, nullptr), p.what);
  }
  {  // the packed path: BSHD rows of D + 1 elements for every operand (q, k, v, dout copied first)
    const int64_t B = 1, Hq = 4, Hkv = 2, Sq = 100, Sk = 150, ld = D + 1;
    const size_t qb = B * Sq * Hq * ld * 2, kb = B * Sk * Hkv * ld * 2;
    Buf q(qb, 0x3c), k(kb, 0x3a), v(kb, 0x3b), o(qb, 0x3b), dout(qb, 0x3a), lse(B * Hq * Sq * 4, 0x41);
    Buf dq(qb), dk(kb), dv(kb);
    auto t4 = [&](void* d, int64_t h, int64_t s) {
      return flykernels::tensor(d, dt, {B, h, s, D}, {s * h * ld, ld, h * ld, 1});
    };
    const fly_tensor tq = t4(q.p, Hq, Sq), tk = t4(k.p, Hkv, Sk), tv = t4(v.p, Hkv, Sk), to = t4(o.p, Hq, Sq);
    const fly_tensor tdo = t4(dout.p, Hq, Sq), tdq = t4(dq.p, Hq, Sq), tdk = t4(dk.p, Hkv, Sk), tdv = t4(dv.p, Hkv, Sk);
    const fly_tensor tl = flykernels::tensor(lse.p, FLY_F32, {B, Hq, Sq}, {Hq * Sq, Sq, 1});
    const flykernels::AttentionBwdTensors t{&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv};
    fly_attention_bwd_params prm = flykernels::detail::attention_bwd_params(t, true, 0.0);
    size_t ws_bytes = 0;
    fly_attention_bwd_workspace_size(&prm, &ws_bytes);
    Buf ws(ws_bytes, -1);
    prm.workspace = ws.p;
    prm.workspace_bytes = ws_bytes;
    report(name, fly_attention_bwd(&prm, nullptr), "packed");
  }
}

// Mode k (the ragged-K weight gradient): out[g] = a[:, k of g] @ b[k of g, :], three groups (one
// empty, one ending 10 columns before Ktot) of Ktot = 200, a M contiguous, b N contiguous, plain
// and padded; the workspace (two tensor maps per group) written by the kernel's prologue.
void run_grouped_gemm_k(const char* name, const std::string& ps) {
  const fly_dtype dt = dtype16(ps);
  const int64_t G = 3, Kt = 200, M = 136, N = 256;
  const int32_t ends[G] = {50, 50, 190};
  Buf offs(sizeof ends, 0), ws(G * 256, -1);
  CUDA_OK(cudaMemcpy(offs.p, ends, sizeof ends, cudaMemcpyHostToDevice));
  for (int64_t pad : {0, 8}) {  // padded lines and groups too
    Buf a(Kt * (M + pad) * 2, 0x3c), b(Kt * (N + pad) * 2, 0x3a), c(G * (M * (N + pad) + pad) * 2);
    const fly_tensor ta = flykernels::tensor(a.p, dt, {M, Kt}, {1, M + pad});
    const fly_tensor tb = flykernels::tensor(b.p, dt, {Kt, N}, {N + pad, 1});
    const fly_tensor to = flykernels::tensor(offs.p, FLY_I32, {G}, {1});
    const fly_tensor tc = flykernels::tensor(c.p, dt, {G, M, N}, {M * (N + pad) + pad, N + pad, 1});
    report(name, fly_grouped_gemm(&ta, &tb, &to, nullptr, &tc, ws.p, ws.bytes, nullptr), pad ? "k padded" : "k");
  }
}

// Three groups (one empty) over T = 200 rows, B with N contiguous and with K contiguous, with bias.
void run_grouped_gemm(const char* name, const std::string& ps) {
  if (has(ps, "mode=k")) return run_grouped_gemm_k(name, ps);
  const fly_dtype dt = dtype16(ps);
  const int64_t G = 3, T = 200, K = 256, N = 384;
  const int32_t ends[G] = {50, 50, 190};  // rows 190..199 past the last end: not written
  Buf offs(sizeof ends, 0);
  CUDA_OK(cudaMemcpy(offs.p, ends, sizeof ends, cudaMemcpyHostToDevice));
  for (bool k_contig : {false, true}) {
    Buf a(T * K * 2, 0x3c), b(G * K * N * 2, 0x3a), c(T * N * 2), bias(G * N * 2, 0x3c);
    const fly_tensor ta = flykernels::tensor(a.p, dt, {T, K}, {K, 1});
    const fly_tensor tb = k_contig ? flykernels::tensor(b.p, dt, {G, K, N}, {K * N, 1, K})
                                   : flykernels::tensor(b.p, dt, {G, K, N}, {K * N, N, 1});
    const fly_tensor to = flykernels::tensor(offs.p, FLY_I32, {G}, {1}), tc = flykernels::tensor(c.p, dt, {T, N}, {N, 1});
    const fly_tensor tbias = flykernels::tensor(bias.p, dt, {G, N}, {N, 1});
    report(name, fly_grouped_gemm(&ta, &tb, &to, k_contig ? nullptr : &tbias, &tc, nullptr, 0, nullptr),
           k_contig ? "b[k]" : "b[n]+bias");
  }
}

// The quantizer from BF16 to both formats, then the block-scaled GEMM on its outputs (both formats).
void run_mx(const char* name, const std::string& fam) {
  const int64_t M = 192, N = 160, K = 320;
  for (int fmt : {FLY_MX_E4M3, FLY_MX_E2M1}) {
    const bool f4 = fmt == FLY_MX_E2M1;
    const int64_t kb = f4 ? K / 2 : K;
    Buf xa(M * K * 2, 0x3c), xb(N * K * 2, 0xbc), qa(M * kb), qb(N * kb), sa(M * K / 32), sb(N * K / 32);
    const fly_tensor txa = flykernels::tensor(xa.p, FLY_BF16, {M, K}, {K, 1}), txb = flykernels::tensor(xb.p, FLY_BF16, {N, K}, {K, 1});
    const fly_dtype et = f4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3;
    const fly_tensor tqa = flykernels::tensor(qa.p, et, {M, kb}, {kb, 1}), tqb = flykernels::tensor(qb.p, et, {N, kb}, {kb, 1});
    const fly_tensor tsa = flykernels::tensor(sa.p, FLY_E8M0, {M, K / 32}, {K / 32, 1});
    const fly_tensor tsb = flykernels::tensor(sb.p, FLY_E8M0, {N, K / 32}, {K / 32, 1});
    if (fam == "mx_quantize") {
      report(name, fly_mx_quantize(&txa, fmt, &tqa, &tsa, nullptr), f4 ? "e2m1 a" : "e4m3 a");
      report(name, fly_mx_quantize(&txb, fmt | FLY_MX_SCALE_RCEIL, &tqb, &tsb, nullptr), f4 ? "e2m1 b" : "e4m3 b");
      continue;
    }
    fly_force_variant(nullptr);  // the quantizer picks its own variant; the GEMM's is forced again below
    fly_mx_quantize(&txa, fmt, &tqa, &tsa, nullptr);
    fly_mx_quantize(&txb, fmt, &tqb, &tsb, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    fly_force_variant(name);
    Buf c(M * N * 2), bias(N * 2, 0x3c);
    const fly_tensor tc = flykernels::tensor(c.p, FLY_BF16, {M, N}, {N, 1}), tbias = flykernels::tensor(bias.p, FLY_BF16, {N}, {1});
    // The queried workspace, left uninitialized (the split-K variants write every partial before
    // the reduction reads it: initcheck / memcheck see the split path); then the split variants'
    // NULL-workspace (unsplit) path as well. 192 x 160, K 320: 3 stages, so every split variant splits.
    size_t ws_bytes = 0;
    fly_scaled_gemm_workspace_size(&tqa, &tqb, &tc, &ws_bytes);
    Buf ws(ws_bytes, -1);
    report(name, fly_scaled_gemm(&tqa, &tsa, &tqb, &tsb, f4 ? nullptr : &tbias, &tc, ws_bytes ? ws.p : nullptr, ws_bytes,
                                 nullptr),
           f4 ? "e2m1 ws" : "e4m3+bias ws");
    if (ws_bytes && std::string(name).find("_s") != std::string::npos)
      report(name, fly_scaled_gemm(&tqa, &tsa, &tqb, &tsb, f4 ? nullptr : &tbias, &tc, nullptr, 0, nullptr),
             f4 ? "e2m1 ws0" : "e4m3+bias ws0");
  }
}

// The weight-only MX GEMM (fly_scaled_gemm, scale_a = NULL). Decode variants: M = 5 and the variant's whole
// activation tile, N = 300 (two CTA tiles, the second partial), K = 1056 (17 stages: clusters split
// K, the last CTA's range short), with and without bias. Inputs 0x3c bytes: finite in every format;
// a third call with tiny scales runs the wide MXFP8 kernel's exact fallback.
// One weight-only call: a [M, K] in `act`, the weights b [N, K] in the format (packed K/2 bytes a
// row for MXFP4), scales all `scale`, bias (or none), all inputs 0x3c bytes.
void weight_only_call(const char* name, fly_dtype act, bool f4, int64_t M, int64_t N, int64_t K, uint8_t scale,
                      bool with_bias, const char* what) {
  const int64_t kb = f4 ? K / 2 : K;
  Buf a(M * K * 2, 0x3c), b(N * kb, 0x3c), sb(N * K / 32, scale), c(M * N * 2), bias(N * 2, 0x3c);
  const fly_tensor ta = flykernels::tensor(a.p, act, {M, K}, {K, 1});
  const fly_tensor tb = flykernels::tensor(b.p, f4 ? FLY_F4_E2M1X2 : FLY_F8_E4M3, {N, kb}, {kb, 1});
  const fly_tensor tsb = flykernels::tensor(sb.p, FLY_E8M0, {N, K / 32}, {K / 32, 1});
  const fly_tensor tc = flykernels::tensor(c.p, act, {M, N}, {N, 1}), tbias = flykernels::tensor(bias.p, act, {N}, {1});
  report(name, fly_scaled_gemm(&ta, nullptr, &tb, &tsb, with_bias ? &tbias : nullptr, &tc, nullptr, 0, nullptr), what);
}

void run_mx_decode(const char* name, const std::string& ps) {
  const fly_dtype act = has(ps, "act=fp16") ? FLY_F16 : FLY_BF16;
  const bool f4 = has(ps, "fmt=e2m1");
  if (std::strncmp(name, "mx_decode_prefill_", 18) == 0) {
    // The prefill kernel (M > 64, BF16): M = 200 (two tile rows, the second partial), N = 300 (a
    // partial W tile), K = 1056 (K % 64 = 32: the last stage's second block zero-filled; few tiles:
    // split-K clusters), with and without bias; scale bytes 0x7c, then 0xF0 (the two-multiply
    // widening); then K = 256 (no split: the persistent path).
    weight_only_call(name, FLY_BF16, f4, 200, 300, 1056, 0x7c, true, "M200+bias");
    weight_only_call(name, FLY_BF16, f4, 200, 300, 1056, 0xF0, false, "M200 scales 0xF0");
    weight_only_call(name, FLY_BF16, f4, 200, 300, 256, 0x7c, false, "M200 K256");
    return;
  }
  int64_t mt = 1;
  for (int64_t v : {1, 2, 4, 8})
    if (has(ps, ("mt=" + std::to_string(v)).c_str())) mt = v;
  weight_only_call(name, act, f4, 5, 300, 1056, 0x7c, true, "M5+bias");
  weight_only_call(name, act, f4, 8 * mt, 300, 1056, 0x7c, false, "M=tile");
  // scale bytes 0x01 send the wide MXFP8 kernel's tiles to its exact fallback
  weight_only_call(name, act, f4, 5, 300, 1056, 0x01, true, "M5 scales 0x01");
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
  const char* every[] = {"rmsnorm", "topk", "gemm", "attention", "attention_bwd", "grouped_gemm", "mx"};
  std::map<std::string, bool> want;
  bool any = false;  // a family or an --only variant named on the command line: only those
  for (int i = 1; i < argc; ++i)
    any = any || std::string(argv[i]) == "--only" ||
          (argv[i][0] != '-' && (i == 1 || std::string(argv[i - 1]) != "--only"));
  for (const char* f : every) want[f] = !any;
  std::vector<std::string> names;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--only" && i + 1 < argc) names.push_back(argv[++i]);  // one variant per process
    else if (std::string(argv[i]) == "--list") list = true;  // names only: a shell loop runs each alone
    else if (want.count(argv[i])) want[argv[i]] = true;
    else {
      std::printf("fly_gpu_subset: unknown family '%s'\n", argv[i]);
      return 2;
    }
  }
  // Families whose every bundled variant runs (the mx flag covers the quantizer, the GEMM and the
  // weight-only decode GEMM).
  const std::map<std::string, std::string> whole = {{"rmsnorm", "rmsnorm"}, {"topk", "topk"}, {"attention", "attention"},
                                                    {"attention_bwd", "attention_bwd"}, {"grouped_gemm", "grouped_gemm"},
                                                    {"mx_quantize", "mx"}, {"mxfp", "mx"}, {"mx_decode", "mx"}};
  for (int i = 0; i < fly_variant_count(); ++i) {
    const char *fam = nullptr, *ps = nullptr;
    fly_variant_info(fly_variant_name(i), &fam, &ps);
    const auto w = whole.find(fam);
    if (w != whole.end() && want[w->second]) names.push_back(fly_variant_name(i));
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
    else if (f == "gemm") run_gemm(n.c_str(), ps);
    else if (f == "attention") run_attention(n.c_str(), ps);
    else if (f == "attention_bwd") run_attention_bwd(n.c_str(), ps);
    else if (f == "grouped_gemm") run_grouped_gemm(n.c_str(), ps);
    else if (f == "mx_quantize" || f == "mxfp") run_mx(n.c_str(), f);
    else if (f == "mx_decode") run_mx_decode(n.c_str(), ps);
    else {
      std::printf("%-48s family %s has no subset runner\n", n.c_str(), fam);
      ++g_failures;
    }
  }
  fly_force_variant(nullptr);
  std::printf("fly_gpu_subset: %zu variants, %d failures\n", names.size(), g_failures);
  return g_failures ? 1 : 0;
}
