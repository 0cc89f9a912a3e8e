// SPDX-License-Identifier: Apache-2.0
// Attention forward and backward on large finite inputs (issue 46): PyTorch's upstream case
// (TestSDPAFailureModesCUDA.test_flash_atteention_large_bf16_nan_values: q, k, v of (1, 1, 1, 64)
// filled with 133120 in BF16, where the forward returned NaN) and inputs whose scores are finite in
// FP32 but far past FP16 / BF16 (q = k = 61440 in FP16, 133120 in BF16: scores 2.4e11 .. 9e12),
// every head-dim class (64, 128, 192, 256, 512), causal and not, decode (Sq 1) with split keys (GQA
// packed and not), every bundled forward variant; V at BF16's maximum, FP16 outputs at 65504; the
// backward (dQ, dK, dV) from the forward's own O and LSE. Inputs are built so that every score is
// exact in FP32 whatever the summation order (the answer is then defined to the last bit: at these
// magnitudes a score's rounding moves its probability by 2^thousands), except the "noisy" rows
// (LSE ~ 10^3, ordinary conditioning) and the "random" ones (only finiteness and bounds asserted).
// Compared with float64: the forward max |O - ref| / max |ref| and the LSE within a few FP32 ulps;
// the backward per element within tol * (the largest sum of |terms| of its tensor) plus the FP32
// noise of dP - Delta scaled by its weights (the problem's own conditioning), and finite everywhere.
// Tag [attention_large]; test/upstream/attention_large_device.sh runs it with compute-sanitizer.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_test_util.hpp"
#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "flykernels/flykernels.hpp"

namespace {

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)

using attn_test::from_float;
using attn_test::to_float;

constexpr float kBf16MaxF = 3.38953139e38f;

enum class Gen {
  kUpstream,  // q = k = v = a, dO = small multiples of 1/8: everything exact, dQ = dK = 0, dV = dO
  kConst,     // q = k = a: every score equal, P uniform over the visible keys; V, dO random
  kSep,       // q = a, k_j = a c_j (c_j 1 for every 97th key from 50, else 1/2, 1/4, 1/8): ties, one class wins
  kNoisy,     // q, k = a + w u: ordinary softmax at LSE ~ 10^3 (the backward's LSE path or its exact path)
  kRandom,    // q, k = a u: not exact, only finiteness and |O| <= max |v| asserted
  kVmax,      // BF16: q = k = 1 (equal scores), V at and near BF16's maximum (forward only)
  kClamp16,   // FP16: V = 65504, P rounded up for P V: O = 65504, not inf (forward only)
  kBigDs,     // FP16: q, k tiny (P uniform over 2 keys), V = 30000 u: |dS| past 65504, dQ, dK small
};

struct LCase {
  fly_dtype dt = FLY_BF16;
  int64_t B = 1, Hq = 1, Hkv = 1, Sq = 1, Sk = 1, D = 64;
  bool causal = false;
  double scale = 0;  // 0: 1/sqrt(D)
  Gen gen = Gen::kConst;
  float a = 133120.f;  // magnitude of q / k
  float w = 0.f;       // kNoisy spread
  float vmag = 1.f;    // |v|, |dO| bound
  const char* force = nullptr;
  bool bwd = true;
  std::string str() const {
    static const char* names[] = {"upstream", "const", "sep", "noisy", "random", "vmax", "clamp16", "bigds"};
    return std::string(dt == FLY_BF16 ? "bf16" : "fp16") + " " + names[int(gen)] + " a" + std::to_string(a) + " B" +
           std::to_string(B) + " Hq" + std::to_string(Hq) + " Hkv" + std::to_string(Hkv) + " Sq" + std::to_string(Sq) +
           " Sk" + std::to_string(Sk) + " D" + std::to_string(D) + (causal ? " causal" : "") +
           (force ? std::string(" force ") + force : "");
  }
  bool exact() const { return gen != Gen::kNoisy && gen != Gen::kRandom && gen != Gen::kBigDs; }
};

// Host tensors: contiguous BHSD, values already representable in the dtype (float copies and bits).
struct Tensor {
  std::vector<float> f;
  std::vector<uint16_t> bits;
  void set(size_t i, float x, fly_dtype dt) {
    bits[i] = from_float(x, dt);
    f[i] = to_float(bits[i], dt);
  }
  void resize(size_t n) {
    f.assign(n, 0.f);
    bits.assign(n, 0);
  }
};

struct Inputs {
  Tensor q, k, v, dout;
};

Inputs make_inputs(const LCase& c) {
  Inputs in;
  const size_t nq = size_t(c.B * c.Hq * c.Sq * c.D), nk = size_t(c.B * c.Hkv * c.Sk * c.D);
  in.q.resize(nq);
  in.dout.resize(nq);
  in.k.resize(nk);
  in.v.resize(nk);
  std::mt19937 g(uint32_t(c.D * 131 + c.Sq * 7 + c.Sk * 3 + int(c.gen) * 1009 + (c.dt == FLY_BF16 ? 1 : 0)));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (size_t i = 0; i < nq; ++i) {
    float x = c.a;
    if (c.gen == Gen::kNoisy) x = c.a + c.w * u(g);
    if (c.gen == Gen::kRandom) x = c.a * u(g);
    if (c.gen == Gen::kClamp16) x = (i % size_t(c.D)) == 0 ? 1.f : 0.f;
    if (c.gen == Gen::kVmax) x = 1.f;
    if (c.gen == Gen::kBigDs) x = 1e-3f * u(g);
    in.q.set(i, x, c.dt);
    in.dout.set(i, c.gen == Gen::kUpstream ? float(int((i * 5) % 17) - 8) / 8.f : c.vmag * u(g), c.dt);
  }
  for (size_t i = 0; i < nk; ++i) {
    const int64_t j = int64_t(i / size_t(c.D)) % c.Sk, d = int64_t(i % size_t(c.D));
    float x = c.a, vv = c.vmag * u(g);
    switch (c.gen) {
      case Gen::kUpstream: vv = c.a; break;
      case Gen::kSep: x = j % 97 == 50 ? c.a : std::ldexp(c.a, -int(1 + j % 3)); break;
      case Gen::kNoisy: x = c.a + c.w * u(g); break;
      case Gen::kRandom: x = c.a * u(g); break;
      case Gen::kVmax: x = 1.f; vv = d == 0 ? kBf16MaxF : (d == 1 ? -kBf16MaxF : 0.99f * kBf16MaxF * u(g)); break;
      case Gen::kClamp16: x = (d == 0 && j > 0) ? -1.f : 0.f; vv = 65504.f; break;
      case Gen::kBigDs: x = 1e-2f * u(g); vv = 30000.f * u(g); break;
      default: break;
    }
    in.k.set(i, x, c.dt);
    in.v.set(i, vv, c.dt);
  }
  return in;
}

double scale_of(const LCase& c) { return c.scale != 0 ? c.scale : 1.0 / std::sqrt(double(c.D)); }

// A bound on the FP32 error of a scaled score, in natural-log units, for the inputs whose scores are
// not exact (kNoisy, kRandom): 4 units of roundoff per k16 step of the tensor-core sum (D / 16 of
// them) at the size of sum_d |q_d k_d|. 0 for the exact generators (any order gives the exact sum).
double score_noise(const LCase& c, double abs_dot) {
  if (c.exact()) return 0.0;
  return 4 * std::ldexp(1.0, -24) * std::max(1.0, double(c.D) / 16) * abs_dot * scale_of(c);
}

// float64 forward of every row: O [B, Hq, Sq, D], LSE [B, Hq, Sq]; noise: the largest score_noise.
void fwd_reference(const LCase& c, const Inputs& in, std::vector<double>& o, std::vector<double>& lse,
                   double* noise = nullptr) {
  if (noise) *noise = 0;
  const double scale = scale_of(c);
  o.assign(size_t(c.B * c.Hq * c.Sq * c.D), 0.0);
  lse.assign(size_t(c.B * c.Hq * c.Sq), 0.0);
  std::vector<double> s(size_t(c.Sk));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h / (c.Hq / c.Hkv);
      for (int64_t i = 0; i < c.Sq; ++i) {
        const float* qi = &in.q.f[size_t(((b * c.Hq + h) * c.Sq + i) * c.D)];
        const int64_t nk = c.causal ? std::min(c.Sk, i + 1) : c.Sk;
        double mx = -INFINITY;
        for (int64_t j = 0; j < nk; ++j) {
          const float* kj = &in.k.f[size_t(((b * c.Hkv + hk) * c.Sk + j) * c.D)];
          double acc = 0, abs_dot = 0;
          for (int64_t d = 0; d < c.D; ++d) {
            acc += double(qi[d]) * kj[d];
            abs_dot += std::fabs(double(qi[d]) * kj[d]);
          }
          if (noise) *noise = std::max(*noise, score_noise(c, abs_dot));
          s[size_t(j)] = acc * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < nk; ++j) sum += (s[size_t(j)] = std::exp(s[size_t(j)] - mx));
        double* oi = &o[size_t(((b * c.Hq + h) * c.Sq + i) * c.D)];
        for (int64_t j = 0; j < nk; ++j) {
          const float* vj = &in.v.f[size_t(((b * c.Hkv + hk) * c.Sk + j) * c.D)];
          for (int64_t d = 0; d < c.D; ++d) oi[d] += s[size_t(j)] / sum * vj[d];
        }
        lse[size_t((b * c.Hq + h) * c.Sq + i)] = nk > 0 ? mx + std::log(sum) : -INFINITY;
      }
    }
}

void* upload(const void* h, size_t bytes) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, std::max<size_t>(bytes, 16)) == cudaSuccess);
  if (bytes) REQUIRE(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  return p;
}

struct FwdResult {
  fly_status status = FLY_SUCCESS;
  std::string msg, variant;
  std::vector<uint16_t> o;
  std::vector<float> lse;
};

FwdResult run_forward(const LCase& c, const Inputs& in) {
  const size_t nq = in.q.bits.size(), nk = in.k.bits.size();
  void *dq = upload(in.q.bits.data(), nq * 2), *dk = upload(in.k.bits.data(), nk * 2),
       *dv = upload(in.v.bits.data(), nk * 2), *dO = nullptr, *dl = nullptr, *dws = nullptr;
  CUDA_OK(cudaMalloc(&dO, std::max<size_t>(nq * 2, 16)));
  CUDA_OK(cudaMemset(dO, 0xff, std::max<size_t>(nq * 2, 16)));  // NaN: unwritten values fail
  const size_t nl = size_t(c.B * c.Hq * c.Sq);
  CUDA_OK(cudaMalloc(&dl, std::max<size_t>(nl * 4, 16)));
  CUDA_OK(cudaMemset(dl, 0xff, std::max<size_t>(nl * 4, 16)));
  const fly_tensor tq = flykernels::tensor(dq, c.dt, {c.B, c.Hq, c.Sq, c.D});
  const fly_tensor tk = flykernels::tensor(dk, c.dt, {c.B, c.Hkv, c.Sk, c.D});
  const fly_tensor tv = flykernels::tensor(dv, c.dt, {c.B, c.Hkv, c.Sk, c.D});
  const fly_tensor to = flykernels::tensor(dO, c.dt, {c.B, c.Hq, c.Sq, c.D});
  const fly_tensor tl = flykernels::tensor(dl, FLY_F32, {c.B, c.Hq, c.Sq});
  fly_attention_fwd_params p{};
  p.struct_size = sizeof(p);
  p.q = &tq;
  p.k = &tk;
  p.v = &tv;
  p.o = &to;
  p.lse = &tl;
  p.softmax_scale = c.scale;
  p.causal = c.causal ? 1 : 0;
  size_t ws = 0;
  FwdResult r;
  r.status = fly_attention_fwd_workspace_size(&p, &ws);
  if (r.status == FLY_SUCCESS && ws > 0) {
    CUDA_OK(cudaMalloc(&dws, ws));
    CUDA_OK(cudaMemset(dws, 0xff, ws));
    p.workspace = dws;
    p.workspace_bytes = ws;
  }
  if (r.status == FLY_SUCCESS) {
    if (c.force) REQUIRE(fly_force_variant(c.force) == FLY_SUCCESS);
    r.status = fly_attention_fwd(&p, nullptr);
    r.variant = fly_last_variant() ? fly_last_variant() : "";
    if (c.force) fly_force_variant(nullptr);
  }
  r.msg = fly_get_last_error();
  CUDA_OK(cudaDeviceSynchronize());
  if (r.status == FLY_SUCCESS) {
    r.o.resize(nq);
    r.lse.resize(nl);
    CUDA_OK(cudaMemcpy(r.o.data(), dO, nq * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(r.lse.data(), dl, nl * 4, cudaMemcpyDeviceToHost));
  }
  for (void* x : {dq, dk, dv, dO, dl, dws}) cudaFree(x);
  return r;
}

// Checks the forward; returns its result (for the backward).
FwdResult check_forward(const LCase& c, const Inputs& in) {
  FwdResult r = run_forward(c, in);
  INFO(c.str() << " -> " << fly_status_string(r.status) << " " << r.msg << " variant " << r.variant);
  REQUIRE(r.status == FLY_SUCCESS);
  std::vector<double> ro, rl;
  double noise = 0;  // non-exact inputs: the scores' own FP32 error (natural-log units)
  fwd_reference(c, in, ro, rl, &noise);
  double err = 0, mag = 0, vmax = 0, omax = 0, lse_err = 0, lse_tol = 0;
  bool finite = true, lse_finite = true;
  for (float x : in.v.f) vmax = std::max(vmax, double(std::fabs(x)));
  for (size_t i = 0; i < r.o.size(); ++i) {
    const double got = to_float(r.o[i], c.dt);
    if (!std::isfinite(got)) finite = false;
    err = std::max(err, std::fabs(got - ro[i]));
    mag = std::max(mag, std::fabs(ro[i]));
    omax = std::max(omax, std::fabs(got));
  }
  for (size_t i = 0; i < r.lse.size(); ++i) {
    if (!std::isfinite(r.lse[i])) {
      lse_finite = false;
      continue;
    }
    lse_err = std::max(lse_err, std::fabs(double(r.lse[i]) - rl[i]));
    // a few FP32 ulps of the LSE (its own rounding, the score's, scale's), at least 2e-3
    lse_tol = std::max(lse_tol, std::max(2e-3, 8 * std::ldexp(1.0, std::ilogb(std::fabs(rl[i]) + 1e-30) - 23)));
  }
  // P's relative error from the scores' own error moves O by up to 2 noise max |v|
  const double rel = mag > 0 ? std::max(0.0, err - 2 * noise * vmax) / mag : err;
  lse_tol += noise;
  INFO("o max |err| / max |ref| " << rel << " (max |ref| " << mag << ", max |o| " << omax << ", max |v| " << vmax
                                  << ", score noise " << noise << "), LSE max |err| " << lse_err << " (tol " << lse_tol
                                  << ")");
  CHECK(finite);
  CHECK(lse_finite);
  CHECK(omax <= vmax * (1 + 1.0 / 128));  // a convex combination of V rows
  CHECK(lse_err <= lse_tol);
  // kRandom: no exact O at these magnitudes (a score's FP32 rounding is worth 2^thousands in P):
  // finite, a convex combination of V, the LSE within the scores' own error; nothing more.
  if (c.gen == Gen::kRandom) return r;
  CHECK(rel < (c.dt == FLY_BF16 ? 2e-2 : 5e-3));
  if (c.gen == Gen::kUpstream)  // softmax over one key is 1: O = v, bit for bit
    for (uint16_t b : r.o) CHECK(to_float(b, c.dt) == c.a);
  if (c.gen == Gen::kClamp16)
    for (uint16_t b : r.o) CHECK(to_float(b, c.dt) == 65504.f);
  return r;
}

bool wide_bwd_bundled(fly_dtype dt) {
  const std::string want = std::string("attention_bwd_") + (dt == FLY_BF16 ? "bf16" : "fp16") + "_hd512_";
  for (int i = 0; i < fly_variant_count(); ++i)
    if (std::string(fly_variant_name(i)).rfind(want, 0) == 0) return true;
  return false;
}

// The backward from the forward's O and LSE; float64 reference with P from the exact scores and
// Delta from the given O (what the backward's contract computes).
void check_backward(const LCase& c, const Inputs& in, const FwdResult& fwd) {
  if (c.D > 256 && !wide_bwd_bundled(c.dt)) {
    WARN("no hd512 backward variant in this build: " << c.str() << " skipped");
    return;
  }
  const size_t nq = in.q.bits.size(), nk = in.k.bits.size(), nl = fwd.lse.size();
  void *dq = upload(in.q.bits.data(), nq * 2), *dk = upload(in.k.bits.data(), nk * 2),
       *dv = upload(in.v.bits.data(), nk * 2), *dO = upload(fwd.o.data(), nq * 2),
       *ddo = upload(in.dout.bits.data(), nq * 2), *dl = upload(fwd.lse.data(), nl * 4);
  void *gdq = nullptr, *gdk = nullptr, *gdv = nullptr, *dws = nullptr;
  CUDA_OK(cudaMalloc(&gdq, std::max<size_t>(nq * 2, 16)));
  CUDA_OK(cudaMalloc(&gdk, std::max<size_t>(nk * 2, 16)));
  CUDA_OK(cudaMalloc(&gdv, std::max<size_t>(nk * 2, 16)));
  CUDA_OK(cudaMemset(gdq, 0xff, std::max<size_t>(nq * 2, 16)));
  CUDA_OK(cudaMemset(gdk, 0xff, std::max<size_t>(nk * 2, 16)));
  CUDA_OK(cudaMemset(gdv, 0xff, std::max<size_t>(nk * 2, 16)));
  const fly_tensor tq = flykernels::tensor(dq, c.dt, {c.B, c.Hq, c.Sq, c.D});
  const fly_tensor tk = flykernels::tensor(dk, c.dt, {c.B, c.Hkv, c.Sk, c.D});
  const fly_tensor tv = flykernels::tensor(dv, c.dt, {c.B, c.Hkv, c.Sk, c.D});
  const fly_tensor to = flykernels::tensor(dO, c.dt, {c.B, c.Hq, c.Sq, c.D});
  const fly_tensor tdo = flykernels::tensor(ddo, c.dt, {c.B, c.Hq, c.Sq, c.D});
  const fly_tensor tl = flykernels::tensor(dl, FLY_F32, {c.B, c.Hq, c.Sq});
  const fly_tensor tdq = flykernels::tensor(gdq, c.dt, {c.B, c.Hq, c.Sq, c.D});
  const fly_tensor tdk = flykernels::tensor(gdk, c.dt, {c.B, c.Hkv, c.Sk, c.D});
  const fly_tensor tdv = flykernels::tensor(gdv, c.dt, {c.B, c.Hkv, c.Sk, c.D});
  fly_attention_bwd_params p{};
  p.struct_size = sizeof(p);
  p.q = &tq;
  p.k = &tk;
  p.v = &tv;
  p.o = &to;
  p.dout = &tdo;
  p.lse = &tl;
  p.dq = &tdq;
  p.dk = &tdk;
  p.dv = &tdv;
  p.softmax_scale = c.scale;
  p.causal = c.causal ? 1 : 0;
  size_t ws = 0;
  fly_status st = fly_attention_bwd_workspace_size(&p, &ws);
  if (st == FLY_SUCCESS && ws > 0) {
    CUDA_OK(cudaMalloc(&dws, ws));
    CUDA_OK(cudaMemset(dws, 0xff, ws));
    p.workspace = dws;
    p.workspace_bytes = ws;
  }
  if (st == FLY_SUCCESS) st = fly_attention_bwd(&p, nullptr);
  const std::string msg = fly_get_last_error();
  const std::string variant = fly_last_variant() ? fly_last_variant() : "";
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint16_t> out[3] = {std::vector<uint16_t>(nq), std::vector<uint16_t>(nk), std::vector<uint16_t>(nk)};
  if (st == FLY_SUCCESS) {
    CUDA_OK(cudaMemcpy(out[0].data(), gdq, nq * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(out[1].data(), gdk, nk * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(out[2].data(), gdv, nk * 2, cudaMemcpyDeviceToHost));
  }
  for (void* x : {dq, dk, dv, dO, ddo, dl, gdq, gdk, gdv, dws}) cudaFree(x);
  INFO(c.str() << " backward -> " << fly_status_string(st) << " " << msg << " variant " << variant);
  REQUIRE(st == FLY_SUCCESS);

  // Reference: ref[t], the sums of |terms| (abs[t]) and the FP32 noise allowance (noise[t]) per element.
  const double scale = scale_of(c);
  std::vector<double> ref[3], abs_[3], noise[3];
  for (int t = 0; t < 3; ++t) {
    const size_t n = t == 0 ? nq : nk;
    ref[t].assign(n, 0.0);
    abs_[t].assign(n, 0.0);
    noise[t].assign(n, 0.0);
  }
  std::vector<double> pr(size_t(c.Sk)), ds(size_t(c.Sk)), en(size_t(c.Sk));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h / (c.Hq / c.Hkv);
      for (int64_t i = 0; i < c.Sq; ++i) {
        const size_t qrow = size_t(((b * c.Hq + h) * c.Sq + i) * c.D);
        const float* qi = &in.q.f[qrow];
        const float* doi = &in.dout.f[qrow];
        const int64_t nkv = c.causal ? std::min(c.Sk, i + 1) : c.Sk;
        double mx = -INFINITY, delta = 0, dabs = 0;
        for (int64_t d = 0; d < c.D; ++d) {
          const double od = to_float(fwd.o[qrow + size_t(d)], c.dt);
          delta += double(doi[d]) * od;
          dabs += std::fabs(double(doi[d]) * od);
        }
        double sc_noise = 0;  // non-exact inputs: P's relative error from the scores' own FP32 error
        for (int64_t j = 0; j < nkv; ++j) {
          const float* kj = &in.k.f[size_t(((b * c.Hkv + hk) * c.Sk + j) * c.D)];
          double acc = 0, abs_dot = 0;
          for (int64_t d = 0; d < c.D; ++d) {
            acc += double(qi[d]) * kj[d];
            abs_dot += std::fabs(double(qi[d]) * kj[d]);
          }
          sc_noise = std::max(sc_noise, 2 * score_noise(c, abs_dot));
          pr[size_t(j)] = acc * scale;
          mx = std::max(mx, pr[size_t(j)]);
        }
        double sum = 0;
        for (int64_t j = 0; j < nkv; ++j) sum += (pr[size_t(j)] = std::exp(pr[size_t(j)] - mx));
        for (int64_t j = 0; j < nkv; ++j) {
          const float* vj = &in.v.f[size_t(((b * c.Hkv + hk) * c.Sk + j) * c.D)];
          double dp = 0, dpabs = 0;
          for (int64_t d = 0; d < c.D; ++d) {
            dp += double(doi[d]) * vj[d];
            dpabs += std::fabs(double(doi[d]) * vj[d]);
          }
          pr[size_t(j)] /= sum;
          ds[size_t(j)] = pr[size_t(j)] * (dp - delta);
          // FP32 noise of dP - Delta, and P's own relative error, weighted
          en[size_t(j)] = pr[size_t(j)] * (std::ldexp(dpabs + dabs, -18) + sc_noise * std::fabs(dp - delta));
        }
        for (int64_t j = 0; j < nkv; ++j) {
          const size_t krow = size_t(((b * c.Hkv + hk) * c.Sk + j) * c.D);
          const float* kj = &in.k.f[krow];
          for (int64_t d = 0; d < c.D; ++d) {
            const size_t qi_d = qrow + size_t(d), kj_d = krow + size_t(d);
            ref[0][qi_d] += scale * ds[size_t(j)] * kj[d];
            abs_[0][qi_d] += scale * std::fabs(ds[size_t(j)] * kj[d]);
            noise[0][qi_d] += scale * en[size_t(j)] * std::fabs(kj[d]);
            ref[1][kj_d] += scale * ds[size_t(j)] * qi[d];
            abs_[1][kj_d] += scale * std::fabs(ds[size_t(j)] * qi[d]);
            noise[1][kj_d] += scale * en[size_t(j)] * std::fabs(qi[d]);
            ref[2][kj_d] += pr[size_t(j)] * doi[d];
            abs_[2][kj_d] += pr[size_t(j)] * std::fabs(doi[d]);
            noise[2][kj_d] += pr[size_t(j)] * sc_noise * std::fabs(doi[d]);
          }
        }
      }
    }
  const double tol = c.dt == FLY_BF16 ? 2e-2 : 5e-3;
  static const char* names[3] = {"dq", "dk", "dv"};
  for (int t = 0; t < 3; ++t) {
    double scale_t = 0, worst = 0;
    for (double x : abs_[t]) scale_t = std::max(scale_t, x);
    bool finite = true, within = true;
    size_t at = 0, n_inf = 0;
    // Where the exact gradient lies beyond the dtype's range, the right answer is the infinity of
    // its sign (FP16 rounds |x| >= 65520 up to inf); anything else non-finite is wrong.
    const double overflow = c.dt == FLY_BF16 ? 3.3961776e38 : 65520.0;
    for (size_t i = 0; i < out[t].size(); ++i) {
      const double got = to_float(out[t][i], c.dt);
      const double allow = tol * scale_t + 8 * noise[t][i] + 1e-30;
      if (!std::isfinite(got)) {
        if (std::isinf(got) && (got > 0) == (ref[t][i] > 0) && std::fabs(ref[t][i]) + allow >= overflow) ++n_inf;
        else finite = false;
        continue;
      }
      const double e = std::fabs(got - ref[t][i]) / allow;
      if (e > worst) {
        worst = e;
        at = i;
      }
      if (e > 1) within = false;
    }
    INFO(names[t] << ": worst |err| / allowance " << worst << " at " << at << " (got "
                  << to_float(out[t][at], c.dt) << ", ref " << ref[t][at] << ", largest sum of |terms| " << scale_t
                  << ", noise " << noise[t][at] << "; " << n_inf << " past the dtype's range, inf as the exact value rounds)");
    CHECK(finite);
    if (c.gen != Gen::kRandom) CHECK(within);
  }
  if (c.gen == Gen::kUpstream) {  // P = 1, dP = Delta exactly: dQ = dK = 0 and dV = dO, bit for bit
    for (uint16_t x : out[0]) CHECK(to_float(x, c.dt) == 0.f);
    for (uint16_t x : out[1]) CHECK(to_float(x, c.dt) == 0.f);
    for (size_t i = 0; i < nk; ++i) CHECK(out[2][i] == in.dout.bits[i]);
  }
}

void check_case(const LCase& c) {
  const Inputs in = make_inputs(c);
  const FwdResult fwd = check_forward(c, in);
  if (c.bwd && fwd.status == FLY_SUCCESS) check_backward(c, in, fwd);
}

// The large magnitudes: squares (and sums of up to 512 of them) exact in FP32.
float big(fly_dtype dt) { return dt == FLY_BF16 ? 133120.f : 61440.f; }  // 130 * 2^10, 15 * 2^12

}  // namespace

TEST_CASE("attention large inputs: PyTorch's upstream case (1, 1, 1, 64) of 133120", "[attention_large][gpu]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F16}) {
    LCase c;
    c.dt = dt;
    c.gen = Gen::kUpstream;
    c.a = dt == FLY_BF16 ? 133120.f : 61440.f;  // 133120 is past FP16's range: FP16 runs 61440
    check_case(c);
  }
}

TEST_CASE("attention large inputs: scores past FP16 / BF16, every head-dim class, causal and not", "[attention_large][gpu]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F16})
    for (int64_t d : {64, 128, 192, 256, 512, 40, 300})
      for (bool causal : {false, true})
        for (Gen gen : {Gen::kConst, Gen::kSep}) {
          LCase c;
          c.dt = dt;
          c.gen = gen;
          c.a = big(dt);
          c.D = d;
          c.Hq = 2;
          c.Hkv = 1;
          c.Sq = 200;
          c.Sk = 333;  // three key tiles or more: rescale factors of an unchanged and of a moved max
          c.causal = causal;
          check_case(c);
        }
}

TEST_CASE("attention large inputs: Sq != Sk both ways, off the tile", "[attention_large][gpu]") {
  const int64_t lens[][2] = {{300, 130}, {130, 300}, {17, 1}, {1, 17}, {129, 129}};
  for (auto& l : lens)
    for (fly_dtype dt : {FLY_BF16, FLY_F16})
      for (bool causal : {false, true}) {
        LCase c;
        c.dt = dt;
        c.gen = Gen::kSep;
        c.a = big(dt);
        c.D = 128;
        c.Sq = l[0];
        c.Sk = l[1];
        c.causal = causal;
        check_case(c);
      }
}

TEST_CASE("attention large inputs: decode, split keys of unequal counts, GQA packed and not", "[attention_large][gpu]") {
  // Sk 8269: the splits' key counts differ (the last is shorter); the merge must weigh them by
  // their counts, which the splits' FP32 LSEs (ulp 16384 at these scores) no longer carry.
  for (fly_dtype dt : {FLY_BF16, FLY_F16})
    for (int64_t d : {64, 128, 256, 512})
      for (int64_t hq : {1, 4}) {
        LCase c;
        c.dt = dt;
        c.gen = Gen::kConst;
        c.a = big(dt);
        c.D = d;
        c.Hq = hq;
        c.Hkv = 1;
        c.Sq = 1;
        c.Sk = 8269;
        check_case(c);
      }
}

TEST_CASE("attention large inputs: the backward's LSE path and its exact path, ordinary conditioning", "[attention_large][gpu]") {
  // q, k = a + w u: LSE ~ D a^2 scale, 512 .. 1.6e3 for a = 8 and (D 64) 14: P from the forward's
  // LSE; 3.1e3 .. 9.2e3 for (D 256) 14 and 24: past kBwdExactLse (2048), the preprocessing
  // recomputes the row's max and sum. w spreads the scaled scores over a few units, so P is a real
  // distribution, and the scores are not exact (ordinary FP32 conditioning).
  for (fly_dtype dt : {FLY_BF16, FLY_F16})
    for (float a : {8.f, 14.f, 24.f})
      for (int64_t d : {64, 256})
        for (bool causal : {false, true}) {
          LCase c;
          c.dt = dt;
          c.gen = Gen::kNoisy;
          c.a = a;
          c.w = 0.25f;
          c.D = d;
          c.Hq = 2;
          c.Hkv = 2;
          c.Sq = 150;
          c.Sk = 270;
          c.causal = causal;
          check_case(c);
        }
}

TEST_CASE("attention large inputs: random large q and k, finite and bounded", "[attention_large][gpu]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F16})
    for (int64_t d : {64, 128, 512}) {
      LCase c;
      c.dt = dt;
      c.gen = Gen::kRandom;
      c.a = big(dt);
      c.vmag = dt == FLY_BF16 ? 1.f : 0.1f;  // FP16: dQ = scale sum dS k stays within 65504
      c.D = d;
      c.Hq = 2;
      c.Sq = 100;
      c.Sk = 200;
      c.causal = d == 128;
      check_case(c);
    }
}

TEST_CASE("attention large inputs: V at BF16's maximum, FP16 output at 65504", "[attention_large][gpu]") {
  // BF16: 1000 equal scores, V columns at +-3.39e38: sum_j p_j v_j overflowed FP32 before the
  // probabilities' 2^-bias scaling; O is the column means (finite).
  for (int64_t d : {64, 512}) {
    LCase c;
    c.dt = FLY_BF16;
    c.gen = Gen::kVmax;
    c.D = d;
    c.Sq = 3;
    c.Sk = 1000;
    c.bwd = false;  // dP = dO V^T overflows FP32 (as in any FP32 reference)
    check_case(c);
  }
  // FP16: V = 65504, scores 0 and -1 at scale c = -log2(0.500245): 1000 probabilities just above
  // FP16's rounding midpoint 0.5 + 2^-12, rounded up for P V, so sum_j fp16(p_j) v_j / sum_j p_j is
  // 65535 in FP32 (inf in FP16); the epilogue clamps to 65504 (the exact answer).
  for (int64_t d : {8, 128}) {
    LCase c;
    c.dt = FLY_F16;
    c.gen = Gen::kClamp16;
    c.D = d;
    c.Sq = 2;
    c.Sk = 1001;
    c.scale = -std::log2(0.5 + std::ldexp(1.0, -12) + std::ldexp(1.0, -20)) / 1.4426950408889634;
    c.bwd = false;
    check_case(c);
  }
}

TEST_CASE("attention large inputs: FP16 dS past FP16's range, outputs within it", "[attention_large][gpu]") {
  // P = 1/2 over two keys, V = 30000 u, dO = u: dS = P (dP - Delta) = +-dO (v1 - v2) / 4 reaches
  // ~1e5 at D 256 (inf once rounded to FP16 for the dK / dQ products), while q, k of 1e-3 and 1e-2
  // keep dQ, dK in the tens. The backward scales such rows' dS by a power of two (DsScale); in the
  // dK/dV kernel each key row meets 5 query tiles, so its scale is set, kept and lowered across tiles.
  for (int64_t d : {64, 256, 512})
    for (bool causal : {false, true}) {
      LCase c;
      c.dt = FLY_F16;
      c.gen = Gen::kBigDs;
      c.D = d;
      c.Hq = 2;
      c.Hkv = 1;
      c.Sq = 300;  // causal: row 0 sees one key (dS = 0), the others two
      c.Sk = 2;
      c.causal = causal;
      check_case(c);
    }
  {  // many keys: P ~ 1/300, dS in the hundreds, no row scaled (the common path)
    LCase c;
    c.dt = FLY_F16;
    c.gen = Gen::kBigDs;
    c.D = 256;
    c.Sq = 200;
    c.Sk = 300;
    check_case(c);
  }
}

TEST_CASE("attention large inputs: every bundled forward variant", "[attention_large][gpu]") {
  int n = 0;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const std::string name = fly_variant_name(i);
    if (name.rfind("attention_fwd_", 0) != 0) continue;
    const int hd = std::atoi(name.c_str() + name.find("_hd") + 3);
    for (bool causal : {false, true}) {
      LCase c;
      c.dt = name.find("_bf16_") != std::string::npos ? FLY_BF16 : FLY_F16;
      c.gen = Gen::kSep;
      c.a = big(c.dt);
      c.D = hd;
      c.Hq = 4;
      c.Hkv = 2;
      c.Sq = 190;
      c.Sk = 300;
      c.causal = causal;
      c.force = name.c_str();
      c.bwd = false;
      check_case(c);
    }
    ++n;
  }
  CHECK(n >= 8);
}
