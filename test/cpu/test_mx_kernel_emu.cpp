// SPDX-License-Identifier: Apache-2.0
// The MX kernels' own source run on the host (no GPU): kernels/mx/mx_quantize.cu and
// kernels/mx/mxfp_gemm.cu compiled as C++ with CUDA's thread indices, __shared__ and
// __syncthreads mapped to host threads and a barrier, and the warp MMA (mma.sync m16n8k32 E4M3)
// replaced by fly_mx_emu_mma below, which gathers the 32 lanes' fragments as the PTX ISA lays them
// out (A: rows g / g+8, k t*4.. and +16; B: k t*4.. and +16, column g; C: rows g / g+8, columns
// t*2, t*2+1). Checks tiling, edges, the E2M1 widening, the scale promotion, bias and the
// epilogue against the FP64 reference, and the quantizer's load/pack paths bit for bit, in CI.
// The real GPU runs are test/gpu/test_mxfp.cpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "catch_compat.hpp"
#include "gemm/gemm_mx.h"

namespace emu {
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local Dim3 thread_idx, block_idx;
Dim3 block_dim, grid_dim;
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> l(m_);
    const unsigned gen = gen_;
    if (++count_ == n_) { count_ = 0; ++gen_; cv_.notify_all(); return; }
    cv_.wait(l, [&] { return gen != gen_; });
  }
 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  unsigned gen_ = 0;
};
Barrier* cta_bar = nullptr;
Barrier* warp_bar[32] = {};
struct WarpStage { uint32_t a[32][4]; uint32_t b[32][2]; };
WarpStage warp_stage[32];
inline float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline __half us2h(uint16_t u) { __half h; std::memcpy(&h, &u, 2); return h; }
}  // namespace emu

#define threadIdx emu::thread_idx
#define blockIdx emu::block_idx
#define blockDim emu::block_dim
#define gridDim emu::grid_dim
#undef __global__
#undef __device__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define __syncthreads() emu::cta_bar->wait()
#define __fdiv_rn(a, b) ((a) / (b))
#define __uint_as_float(u) emu::u2f(u)
#define __ushort_as_half(u) emu::us2h(u)
#define FLY_MX_HOST_EMU 1
#define FLY_THREADS 256
#define FLY_BM 64
#define FLY_BN 64
#include "mx/mx_quantize.cu"
#include "mx/mxfp_gemm.cu"
// The `_hw` quantizer variants' source (FLY_HW_CVT: scaling by the exact reciprocal; the E4M3
// cvt itself is GPU-only, the emulation keeps the software encoder) as a second kernel.
namespace mxq_hw {
#define FLY_HW_CVT 1
#define mx_quantize mx_quantize_hw
#include "mx/mx_quantize.cu"
#undef mx_quantize
#undef FLY_HW_CVT
}  // namespace mxq_hw
// The `_pf1` probe's source (each thread's next block loaded while the current one is encoded).
namespace mxq_pf {
#define FLY_HW_CVT 1
#define FLY_PREFETCH 1
#define mx_quantize mx_quantize_pf
#include "mx/mx_quantize.cu"
#undef mx_quantize
#undef FLY_PREFETCH
#undef FLY_HW_CVT
}  // namespace mxq_pf

namespace {  // the kernel file declares it in its anonymous namespace
void fly_mx_emu_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const int lane = int(threadIdx.x % 32), w = int(threadIdx.x / 32);
  emu::WarpStage& st = emu::warp_stage[w];
  for (int i = 0; i < 4; ++i) st.a[lane][i] = a[i];
  for (int i = 0; i < 2; ++i) st.b[lane][i] = b[i];
  emu::warp_bar[w]->wait();
  double A[16][32], B[32][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        A[g + (i & 1) * 8][t * 4 + j + (i >> 1) * 16] = fly::mx::decode_e4m3(uint8_t(st.a[l][i] >> (8 * j)));
    for (int r = 0; r < 2; ++r)
      for (int j = 0; j < 4; ++j) B[t * 4 + j + r * 16][g] = fly::mx::decode_e4m3(uint8_t(st.b[l][r] >> (8 * j)));
  }
  const int g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e / 2) * 8, col = t * 2 + e % 2;
    double s = 0;
    for (int k = 0; k < 32; ++k) s += A[row][k] * B[k][col];
    d[e] = float(double(d[e]) + s);
  }
  emu::warp_bar[w]->wait();
}

namespace mx = fly::mx;

void run_gemm(const MxGemmParams& p) {
  emu::block_dim = {128, 1, 1};
  emu::grid_dim = {unsigned((p.N + 63) / 64), unsigned((p.M + 63) / 64), 1};
  emu::Barrier cta(128);
  std::vector<std::unique_ptr<emu::Barrier>> wb;
  for (int w = 0; w < 4; ++w) { wb.emplace_back(new emu::Barrier(32)); emu::warp_bar[w] = wb.back().get(); }
  emu::cta_bar = &cta;
  for (unsigned by = 0; by < emu::grid_dim.y; ++by)
    for (unsigned bx = 0; bx < emu::grid_dim.x; ++bx) {
      std::vector<std::thread> th;
      for (unsigned t = 0; t < 128; ++t)
        th.emplace_back([&, t] {
          emu::thread_idx = {t, 0, 0};
          emu::block_idx = {bx, by, 0};
          mxfp_gemm(p);
        });
      for (auto& x : th) x.join();
    }
}

float out_to_float(const std::vector<uint16_t>& c, size_t i, bool bf16) {
  if (bf16) return emu::u2f(uint32_t(c[i]) << 16);
  return __half2float(emu::us2h(c[i]));
}

void gemm_emu_case(int64_t M, int64_t N, int64_t K, bool fp4, bool bf16, bool with_bias, int a_lo, int a_hi) {
  const int64_t kbs = K / 32, cols = fp4 ? K / 2 : K;
  std::mt19937 rng(uint32_t(M * 3 + N * 5 + K + fp4));
  std::uniform_int_distribution<int> ub(0, 255), ua(a_lo, a_hi), ubs(-6, 2);
  std::vector<uint8_t> ca(size_t(M * K)), cb(size_t(N * K));
  auto code = [&]() -> uint8_t {
    if (fp4) return uint8_t(ub(rng) & 0xF);
    uint8_t c;
    do c = uint8_t(ub(rng)); while ((c & 0x7F) == 0x7F);
    return c;
  };
  for (auto& c : ca) c = code();
  for (auto& c : cb) c = code();
  std::vector<uint8_t> sa(size_t(M * kbs)), sb(size_t(N * kbs));
  for (auto& s : sa) s = uint8_t(ua(rng) + 127);
  for (auto& s : sb) s = uint8_t(ubs(rng) + 127);
  std::vector<uint8_t> pa(size_t(M * cols)), pb(size_t(N * cols));
  for (int64_t i = 0; i < M * cols; ++i) pa[size_t(i)] = fp4 ? mx::pack_e2m1x2(ca[size_t(2 * i)], ca[size_t(2 * i + 1)]) : ca[size_t(i)];
  for (int64_t i = 0; i < N * cols; ++i) pb[size_t(i)] = fp4 ? mx::pack_e2m1x2(cb[size_t(2 * i)], cb[size_t(2 * i + 1)]) : cb[size_t(i)];
  std::vector<uint16_t> bias(static_cast<size_t>(N)), c(static_cast<size_t>(M * N), uint16_t(0xFFFF));
  std::vector<double> fb(size_t(N), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    const float v = float(int(ub(rng)) - 128) / 32.0f;  // exact in both dtypes
    if (bf16) { uint32_t u; std::memcpy(&u, &v, 4); bias[size_t(n)] = uint16_t(u >> 16); }
    else { __half h = __float2half_rn(v); std::memcpy(&bias[size_t(n)], &h, 2); }
    if (with_bias) fb[size_t(n)] = v;
  }
  MxGemmParams p{};
  p.a = pa.data(); p.b = pb.data(); p.sa = sa.data(); p.sb = sb.data();
  p.bias = with_bias ? bias.data() : nullptr;
  p.c = c.data();
  p.M = M; p.N = N; p.K = K; p.lda = cols; p.ldb = cols; p.ldc = N;
  p.fp4 = fp4; p.out_bf16 = bf16;
  run_gemm(p);
  auto dec = [&](uint8_t x) { return fp4 ? double(mx::decode_e2m1(x)) : double(mx::decode_e4m3(x)); };
  size_t bad = 0, overflowed = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = fb[size_t(n)], sabs = std::fabs(ref);
      for (int64_t k = 0; k < K; ++k) {
        const double v = dec(ca[size_t(m * K + k)]) * std::ldexp(1.0, sa[size_t(m * kbs + k / 32)] - 127) *
                         dec(cb[size_t(n * K + k)]) * std::ldexp(1.0, sb[size_t(n * kbs + k / 32)] - 127);
        ref += v;
        sabs += std::fabs(v);
      }
      const double got = out_to_float(c, size_t(m * N + n), bf16);
      const double tol = (bf16 ? 1.0 / 256 : 1.0 / 1024) * std::fabs(ref) + std::ldexp(sabs, -14) + 1e-6;
      if (!bf16 && std::fabs(ref) > 65519.0) {  // beyond FP16: must be inf of the sign
        if (!(std::isinf(got) && (got > 0) == (ref > 0))) ++bad;
        ++overflowed;
        continue;
      }
      if (!(std::fabs(got - ref) <= tol)) {
        if (bad < 3) UNSCOPED_INFO("m " << m << " n " << n << " got " << got << " ref " << ref);
        ++bad;
      }
    }
  INFO("M " << M << " N " << N << " K " << K << " fp4 " << fp4 << " bf16 " << bf16 << " overflowed " << overflowed);
  CHECK(bad == 0);
  CHECK(overflowed * 10 < size_t(M * N));  // the check is mostly about finite values
}

}  // namespace

TEST_CASE("mxfp_gemm kernel source, run on the host, equals the FP64 reference", "[mx][emu]") {
  gemm_emu_case(37, 100, 96, false, true, true, -20, 10);   // N and K not multiples of the tile
  gemm_emu_case(37, 100, 96, true, false, false, -8, -2);
  gemm_emu_case(1, 70, 160, true, true, true, -30, 30);      // M = 1
  gemm_emu_case(65, 64, 288, false, false, true, -8, -3);    // two row tiles, three stages
  gemm_emu_case(2, 8, 32, false, true, false, -5, 5);
}

TEST_CASE("mx_quantize kernel source, run on the host, equals the reference bit for bit", "[mx][emu]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> ue(-140, 120);
  for (int hw = 0; hw < 3; ++hw)  // 0: t256, 1: _hw1, 2: _hw1_pf1 (more blocks than threads: the look-ahead runs)
  for (int src = 0; src < 3; ++src)
    for (int fp4 = 0; fp4 < 2; ++fp4)
      for (int vec = 0; vec < 2; ++vec) {
        const int64_t M = hw == 2 ? 20 : 3, K = hw == 2 ? 512 : 160, ldx = vec ? K : K + 3;
        std::vector<float> xv(size_t(M * K));
        std::vector<uint8_t> hx(size_t(M * ldx) * 4);
        for (int64_t r = 0; r < M; ++r)
          for (int64_t kb = 0; kb < K / 32; ++kb) {
            const int e = src == 0 ? ue(rng) % 15 : ue(rng);
            for (int i = 0; i < 32; ++i) {
              float v = std::ldexp(nd(rng), e);
              if (kb == 1 && r == 0) v = 0.0f;
              if (kb == 2 && r == 1 && i == 3) v = NAN;
              const size_t at = size_t(r * ldx + kb * 32 + i);
              if (src == 2) { std::memcpy(&hx[at * 4], &v, 4); }
              else if (src == 1) { uint32_t u; std::memcpy(&u, &v, 4); u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u;
                                   if (std::isnan(v)) u = 0x7FC00000u; std::memcpy(&v, &u, 4); uint16_t h = uint16_t(u >> 16); std::memcpy(&hx[at * 2], &h, 2); }
              else { __half h = __float2half_rn(v); v = __half2float(h); std::memcpy(&hx[at * 2], &h, 2); }
              xv[size_t(r * K + kb * 32 + i)] = v;
            }
          }
        const int64_t qc = fp4 ? K / 2 : K;
        std::vector<uint8_t> q(size_t(M * qc), 0xA5), s(size_t(M * K / 32), 0xA5);
        MxQuantizeParams p{};
        p.x = hx.data(); p.q = q.data(); p.scales = s.data();
        p.M = M; p.K = K; p.ldx = ldx; p.src = src; p.fp4 = fp4; p.rceil = vec;  // both rules
        p.vec_x = vec; p.vec_q = vec;
        emu::block_dim = {256, 1, 1};
        emu::grid_dim = {1, 1, 1};
        for (unsigned t = 0; t < 256; ++t) {
          emu::thread_idx = {t, 0, 0};
          emu::block_idx = {0, 0, 0};
          if (hw == 2) mxq_pf::mx_quantize_pf(p);
          else if (hw) mxq_hw::mx_quantize_hw(p);
          else mx_quantize(p);
        }
        std::vector<uint8_t> codes(size_t(M * K)), ws(size_t(M * K / 32));
        for (int64_t r = 0; r < M; ++r)
          mx::quantize(&xv[size_t(r * K)], K, fp4 != 0, vec ? mx::ScaleMode::kRceil : mx::ScaleMode::kFloor,
                       &codes[size_t(r * K)], &ws[size_t(r * K / 32)]);
        size_t bad = 0;
        for (int64_t i = 0; i < M * qc; ++i)
          bad += q[size_t(i)] != (fp4 ? mx::pack_e2m1x2(codes[size_t(2 * i)], codes[size_t(2 * i + 1)]) : codes[size_t(i)]);
        for (size_t i = 0; i < ws.size(); ++i) bad += s[i] != ws[i];
        INFO("hw " << hw << " src " << src << " fp4 " << fp4 << " vec " << vec);
        CHECK(bad == 0);
      }
}
