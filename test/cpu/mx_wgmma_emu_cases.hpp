// SPDX-License-Identifier: Apache-2.0
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

// The kernel's parameter block: split-K variants (FLY_SPLIT) take SplitParams (ws, splits).
#if defined(FLY_SPLIT) && FLY_SPLIT > 1
using EmuParams = fly::mxw::SplitParams;
#else
using EmuParams = fly::mxw::Params;
#endif

void run(const EmuParams& p, unsigned grid) {
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

#if defined(FLY_SPLIT) && FLY_SPLIT > 1
// mxfp_splitk_reduce on `grid` blocks of kReduceThreads (no shared memory or barriers: the
// threads run one after the other).
void run_reduce(const fly::mxw::SplitReduceParams& r, unsigned grid) {
  emu::block_dim = {unsigned(fly::mxw::kReduceThreads), 1, 1};
  emu::grid_dim = {grid, 1, 1};
  for (unsigned bx = 0; bx < grid; ++bx)
    for (unsigned t = 0; t < unsigned(fly::mxw::kReduceThreads); ++t) {
      emu::thread_idx = {t, 0, 0};
      emu::block_idx = {bx, 0, 0};
      mxfp_splitk_reduce(r);
    }
}
#endif

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
// splits (split-K variants only, FLY_SPLIT): 0 = the launcher's unsplit call of a split variant
// (ws NULL, splits 1); S >= 1 = S units per tile (S > ceil(K / 128) included: some k ranges are
// empty), the FP32 partials to a NaN-poisoned workspace with a guard after it, then
// mxfp_splitk_reduce on `reduce_grid` blocks. Checked: the GEMM leaves c untouched when S > 1,
// every partial equals the FP64 sum over its split's stages [q ks / S, (q + 1) ks / S) (an empty
// range: exactly 0), nothing past S x M x N is written, and c after the reduction.
int gemm_case(int64_t M, int64_t N, int64_t K, bool fp4, bool bf16, bool with_bias, int a_lo, int a_hi, int b_lo,
              int b_hi, unsigned grid_cap, bool nan_scale = false, int splits = 0, unsigned reduce_grid = 2) {
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
  EmuParams p{};
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
  const int64_t ksteps = (K + fly::mxw::kKStep - 1) / fly::mxw::kKStep;
  const int64_t S = splits > 1 ? splits : 1;
  const int64_t plane = M * N, guard = plane + 67;  // a plane of guard: a shifted store lands in it
  const uint32_t kPoison = 0x7FBADBADu;  // a NaN no kernel produces
  std::vector<float> ws(size_t(S * plane + guard), emu::u2f(kPoison));
#if defined(FLY_SPLIT) && FLY_SPLIT > 1
  p.ws = splits >= 1 ? ws.data() : nullptr;
  p.splits = splits >= 1 ? splits : 1;
#else
  REQUIRE(splits == 0);
#endif
  const unsigned units = unsigned(tiles * S);
  emu::hung = false;
  emu::smem_oob = false;
  emu::over_arrivals = 0;
  emu::folded_stages = 0;
  run(p, units < grid_cap ? units : grid_cap);
  CHECK_FALSE(emu::hung);
  CHECK_FALSE(emu::smem_oob);
  CHECK(emu::over_arrivals == 0);
  auto dec = [&](uint8_t x) { return fp4 ? double(mx::decode_e2m1(x)) : double(mx::decode_e4m3(x)); };
  auto is_poison = [&](float f) { uint32_t u; std::memcpy(&u, &f, 4); return u == kPoison; };
  if (S > 1) {
    // The GEMM's share: partials only (c untouched), each the sum over its split's stages.
    size_t c_written = 0, part_bad = 0, unwritten = 0, empty_planes = 0;
    for (const uint16_t v : c) c_written += v != 0xFFFF;
    CHECK(c_written == 0);
    for (int64_t q = 0; q < S; ++q) {
      const int64_t ks0 = q * ksteps / S, ks1 = (q + 1) * ksteps / S;  // docs/mxfp.md "Split-K"
      empty_planes += ks0 == ks1;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          const float got = ws[size_t(q * plane + m * N + n)];
          if (is_poison(got)) { ++unwritten; continue; }
          if (m == nan_row || n == nan_col) continue;
          double ref = 0, sabs = 0;
          for (int64_t k = ks0 * fly::mxw::kKStep; k < K && k < ks1 * fly::mxw::kKStep; ++k) {
            const double v = dec(ca[size_t(m * K + k)]) * std::ldexp(1.0, sa[size_t(m * kbs + k / 32)] - 127) *
                             dec(cb[size_t(n * K + k)]) * std::ldexp(1.0, sb[size_t(n * kbs + k / 32)] - 127);
            ref += v;
            sabs += std::fabs(v);
          }
          const bool ok = ks0 == ks1 ? (got == 0.0f && !std::signbit(got))
                                     : std::fabs(double(got) - ref) <= std::ldexp(sabs, -18) + std::ldexp(1.0, -120);
          if (!ok) {
            if (part_bad < 3) UNSCOPED_INFO("split " << q << " m " << m << " n " << n << " partial " << got << " ref " << ref);
            ++part_bad;
          }
        }
    }
    size_t guard_hit = 0;
    for (int64_t i = S * plane; i < S * plane + guard; ++i) guard_hit += !is_poison(ws[size_t(i)]);
    INFO("BN " << FLY_BN << " M " << M << " N " << N << " K " << K << " fp4 " << fp4 << " splits " << S
               << " of " << ksteps << " stages: " << empty_planes << " empty");
    CHECK(unwritten == 0);
    CHECK(part_bad == 0);
    CHECK(guard_hit == 0);
    CHECK(empty_planes == size_t(S > ksteps ? S - ksteps : 0));
#if defined(FLY_SPLIT) && FLY_SPLIT > 1
    fly::mxw::SplitReduceParams r{};
    r.ws = ws.data();
    r.bias = p.bias;
    r.c = p.c;
    r.ldc = p.ldc;
    r.M = p.M;
    r.N = p.N;
    r.splits = int32_t(S);
    r.out_bf16 = p.out_bf16;
    run_reduce(r, reduce_grid);
#endif
  } else {
    size_t ws_written = 0;  // unsplit: the workspace is not touched
    for (const float f : ws) ws_written += !is_poison(f);
    CHECK(ws_written == 0);
  }
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

#if defined(FLY_SPLIT) && FLY_SPLIT > 1
// Split-K (docs/mxfp.md "Split-K"): the split count is a launch parameter (the variants' `_s<S>`
// only caps it on the host, mxw::split_count), so one unit runs S = 1 (unsplit epilogue), 2, 3, 4
// and 8 through the same kernel source. Cases: M / N tails (N odd: the partials' and the
// reduction's scalar paths; N even: their pairs), K tails (a partial last stage), K a multiple
// of 128 (the producer's prefetch from the unit's first stage: a chunk boundary inside a unit),
// S > ceil(K / 128) (empty k ranges: zero partials), more units than CTAs (a CTA's units of one
// tile and of different tiles share the ring), bias or none, FP16 and BF16, a NaN block scale.
TEST_CASE("mxfp_wgmma (BN " MXW_STR(FLY_BN) MXW_PIPE_TAG ", split-K) and mxfp_splitk_reduce, run on the host, equal the FP64 reference", "[mx][emu][mxw][splitk]") {
#if defined(MXW_SPLIT_SHORT)  // a second tile width: the first and third cases only (CI time)
  for (bool fp4 : {false, true}) {
    mxw_emu::gemm_case(37, FLY_BN + 9, 1664, fp4, true, true, -12, 12, -20, 4, 3, false, 4, 3);
    mxw_emu::gemm_case(5, 71, 384, fp4, false, false, -9, -3, -9, -3, 1, false, 4);
  }
#else
  for (bool fp4 : {false, true}) {
    // 13 stages in 4 units of 3, 3, 3, 4 stages (the last crosses a prefetch chunk), 3 CTAs
    mxw_emu::gemm_case(37, 100, 1664, fp4, true, true, -12, 12, -20, 4, 3, false, 4, 3);
    // 2 x 3 tiles x 2 splits on 5 CTAs, K tail (2.25 stages: 1 + 2 per split), N odd, FP16
    mxw_emu::gemm_case(130, 2 * FLY_BN + 3, 288, fp4, false, true, -12, -4, -9, -3, 5, false, 2, 1);
    // S = 4 > 3 stages: split 0 empty; M = 5, N odd, no bias, one CTA running every unit
    mxw_emu::gemm_case(5, 71, 384, fp4, true, false, -9, -3, -9, -3, 1, false, 4);
  }
  // S = 8 over 3 stages (five empty), M = 1; S = 3 (uneven ranges 1, 1, 2 of 4 stages), NaN scales
  mxw_emu::gemm_case(1, FLY_BN + 2, 352, false, false, true, -8, -2, -8, -2, 132, false, 8);
  mxw_emu::gemm_case(37, 100, 512, true, true, true, -3, -1, -3, -1, 132, true, 3);
  // S = 1 (the unsplit epilogue of a split kernel) and the launcher's NULL-workspace call
  mxw_emu::gemm_case(37, 100, 96, false, true, true, -20, 10, -6, 2, 132, false, 1);
  mxw_emu::gemm_case(130, FLY_BN + 9, 288, true, false, true, -9, -5, -4, 0, 2, false, 0);
#endif
}
#else
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
#endif
