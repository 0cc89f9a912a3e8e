// The emulated wgmma MX GEMM (mx_wgmma_emu.hpp + the kernel source, included before this with
// FLY_BN set) against the FP64 GEMM of the dequantized operands: both formats and outputs, bias,
// M = 1, M / N / K tails (K not a multiple of the 128-wide stage), scales over a wide exponent range
// incl. 0x00 and 0xFE, more tiles than CTAs (the persistent loop; the ring lapping across tiles),
// output poisoned with NaN. Also checks the barrier protocol did not hang, over-arrive or leave
// shared memory.
#pragma once

#define MXW_STR2(x) #x
#define MXW_STR(x) MXW_STR2(x)
#if defined(FLY_PIPE) && FLY_PIPE >= 2
#define MXW_PIPE_TAG ", two scratch sets, scale prefetch"
#elif defined(FLY_PIPE) && FLY_PIPE
#define MXW_PIPE_TAG ", two scratch sets"
#else
#define MXW_PIPE_TAG ""
#endif

namespace {
namespace mxw_emu {

namespace mx = fly::mx;

void run(const fly::mxw::Params& p, unsigned grid) {
#if defined(FLY_PIPE)
  const size_t bytes = size_t(fly::mxw::smem_bytes(FLY_BN, FLY_FOLD != 0, FLY_PIPE >= 2));
#else
  const size_t bytes = size_t(fly::mxw::smem_bytes(FLY_BN, FLY_FOLD != 0));
#endif
  std::unique_ptr<uint8_t, void (*)(void*)> buf(static_cast<uint8_t*>(std::aligned_alloc(1024, (bytes + 1023) / 1024 * 1024)), std::free);
  emu::smem_base = buf.get();
  emu::smem_size = bytes;
  emu::block_dim = {unsigned(fly::mxw::kThreads), 1, 1};
  emu::grid_dim = {grid, 1, 1};
  for (unsigned bx = 0; bx < grid; ++bx) {
    std::memset(buf.get(), 0xA5, bytes);  // shared memory starts undefined
    {
      std::lock_guard<std::mutex> l(emu::mu);
      emu::bars.clear();
    }
    emu::Barrier cta(fly::mxw::kThreads);
    emu::cta_bar = &cta;
    emu::AndBarrier pand;
    emu::producer_and = &pand;
    std::vector<std::thread> th;
    for (unsigned t = 0; t < unsigned(fly::mxw::kThreads); ++t)
      th.emplace_back([&, t] {
        emu::thread_idx = {t, 0, 0};
        emu::block_idx = {bx, 0, 0};
        mxfp_wgmma(p);
      });
    for (auto& x : th) x.join();
  }
}

CUtensorMap map_of(const uint8_t* base, int64_t cols_bytes, int64_t rows, int64_t ld, bool fp4, int box_rows) {
  emu::MapInfo mi{base, uint64_t(cols_bytes), uint64_t(rows), uint64_t(ld), fp4 ? 64u : 128u, uint32_t(box_rows),
                  fp4 ? 0 : 1};
  CUtensorMap m;
  std::memset(&m, 0, sizeof m);
  std::memcpy(&m, &mi, sizeof mi);
  return m;
}

float out_to_float(const std::vector<uint16_t>& c, size_t i, bool bf16) {
  if (bf16) return emu::u2f(uint32_t(c[i]) << 16);
  __half h;
  std::memcpy(&h, &c[i], 2);
  return __half2float(h);
}

// Returns the number of stages the producers folded (fold variants, MXFP4).
int gemm_case(int64_t M, int64_t N, int64_t K, bool fp4, bool bf16, bool with_bias, int a_lo, int a_hi, int b_lo,
              int b_hi, unsigned grid_cap, bool nan_scale = false) {
  const int64_t kbs = K / 32, cols = fp4 ? K / 2 : K;
  std::mt19937 rng(uint32_t(M * 3 + N * 5 + K + fp4 + 7 * FLY_BN));
  std::uniform_int_distribution<int> ub(0, 255), ua(a_lo, a_hi), ubs(b_lo, b_hi);
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
  if (a_hi >= 127) for (int64_t kb = 0; kb < kbs; ++kb) sa[size_t(kb)] = 0xFE;
  if (a_lo <= -127 && M > 1) for (int64_t kb = 0; kb < kbs; ++kb) sa[size_t(kbs + kb)] = 0x00;
  // a NaN (0xFF) block scale in row 2 of A and column 5 of B: NaN out there, the rest exact
  const int64_t nan_row = nan_scale && M > 2 ? 2 : -1, nan_col = nan_scale && N > 5 ? 5 : -1;
  if (nan_row >= 0) sa[size_t(nan_row * kbs + kbs - 1)] = 0xFF;
  if (nan_col >= 0) sb[size_t(nan_col * kbs)] = 0xFF;
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
  fly::mxw::Params p{};
  p.tm_a = map_of(pa.data(), cols, M, cols, fp4, fly::mxw::kBM);
  p.tm_b = map_of(pb.data(), cols, N, cols, fp4, FLY_BN);
  p.sa = sa.data();
  p.sb = sb.data();
  p.bias = with_bias ? bias.data() : nullptr;
  p.c = c.data();
  p.ldc = N;
  p.M = int32_t(M);
  p.N = int32_t(N);
  p.K = int32_t(K);
  p.tiles_m = int32_t((M + fly::mxw::kBM - 1) / fly::mxw::kBM);
  p.tiles_n = int32_t((N + FLY_BN - 1) / FLY_BN);
  p.strip_m = p.tiles_m < 8 ? p.tiles_m : 8;
  p.fp4 = fp4;
  p.out_bf16 = bf16;
  const unsigned tiles = unsigned(p.tiles_m * p.tiles_n);
  emu::hung = false;
  emu::smem_oob = false;
  emu::over_arrivals = 0;
  emu::folded_stages = 0;
  run(p, tiles < grid_cap ? tiles : grid_cap);
  CHECK_FALSE(emu::hung);
  CHECK_FALSE(emu::smem_oob);
  CHECK(emu::over_arrivals == 0);
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
      if (m == nan_row || n == nan_col) {
        if (!std::isnan(got)) ++bad;
        continue;
      }
      const double big = bf16 ? 3.38e38 : 65519.0;
      if (std::fabs(ref) > big) {  // beyond the output dtype: must be inf of the sign
        if (!(std::isinf(got) && (got > 0) == (ref > 0))) ++bad;
        ++overflowed;
        continue;
      }
      const double tol = (bf16 ? 1.0 / 256 : 1.0 / 1024) * std::fabs(ref) + std::ldexp(sabs, -14) +
                         (bf16 ? std::ldexp(1.0, -126) : std::ldexp(1.0, -23));
      if (!(std::fabs(got - ref) <= tol)) {
        if (bad < 3) UNSCOPED_INFO("m " << m << " n " << n << " got " << got << " ref " << ref);
        ++bad;
      }
    }
  INFO("BN " << FLY_BN << " M " << M << " N " << N << " K " << K << " fp4 " << fp4 << " bf16 " << bf16
             << " overflowed " << overflowed);
  CHECK(bad == 0);
  CHECK(overflowed * 10 < size_t(M * N));
  return emu::folded_stages;
}

}  // namespace mxw_emu
}  // namespace

TEST_CASE("mxfp_wgmma (BN " MXW_STR(FLY_BN) ", fold " MXW_STR(FLY_FOLD) MXW_PIPE_TAG ") kernel source, run on the host, equals the FP64 reference", "[mx][emu][mxw]") {
  for (bool fp4 : {false, true}) {
    mxw_emu::gemm_case(37, 100, 96, fp4, true, true, -20, 10, -6, 2, 132);     // N, K tails (K < one stage)
    mxw_emu::gemm_case(1, 70, 160, fp4, false, true, -8, -2, -8, -2, 132);     // M = 1, K = 1.25 stages
    mxw_emu::gemm_case(130, 2 * FLY_BN + 3, 288, fp4, true, false, -30, 30, -6, 6, 2);  // 2 x 3 tiles on 2 CTAs
    mxw_emu::gemm_case(5, 96, 1056, fp4, false, true, -9, -3, -9, -3, 1);      // one CTA, the ring lapping
    mxw_emu::gemm_case(3, 40, 160, fp4, true, true, -127, 127, -127, -31, 132);  // 0xFE / 0x00 rows
    // K a multiple of 128 (4-byte scale rows: the pipe = 2 producer's prefetch path): 13 stages,
    // three chunk boundaries and a chunk past K, on one CTA lapping the ring and on two CTAs
    mxw_emu::gemm_case(9, FLY_BN + 5, 1664, fp4, true, true, -12, 12, -20, 4, 1);
    mxw_emu::gemm_case(130, 2 * FLY_BN, 640, fp4, false, false, -9, -3, -8, -2, 2);
  }
  // scales within 5 binades per row: the fold variants fold every MXFP4 stage (and never MXFP8's);
  // wide spreads above must not have folded a stage whose rows do not allow it (checked by value)
  const int f8 = mxw_emu::gemm_case(130, FLY_BN + 9, 288, false, true, true, -9, -5, -4, 0, 2);
  const int f4 = mxw_emu::gemm_case(130, FLY_BN + 9, 288, true, true, true, -9, -5, -4, 0, 2);
  const int f4b = mxw_emu::gemm_case(1, 3 * FLY_BN, 1056, true, false, false, -100, -96, 90, 95, 132);
  CHECK(f8 == 0);
  CHECK(f4 == (FLY_FOLD ? 2 * 2 * 3 : 0));    // 2 x 2 tiles x 3 stages
  CHECK(f4b == (FLY_FOLD ? 3 * 9 : 0));       // 3 tiles x 9 stages
  // NaN block scales: their stages must not fold (row 2's last block, column 5's first)
  for (bool fp4 : {false, true}) {
    const int fn = mxw_emu::gemm_case(37, 100, 288, fp4, true, true, -3, -1, -3, -1, 132, true);
    // tiles x 3 stages, minus row 2's last stage in every tile and column 5's first stage
    const int tn = (100 + FLY_BN - 1) / FLY_BN;
    CHECK(fn == (FLY_FOLD && fp4 ? tn * 3 - tn - 1 : 0));
  }
}
