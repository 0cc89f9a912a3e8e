// SPDX-License-Identifier: Apache-2.0
// fly_grouped_gemm on the GPU against a CPU reference (double accumulation of exactly representable
// random inputs): uniform, ragged and empty groups (all empty, one group holding all rows, sizes
// 1, 3, 7, ...), K and N off the tile multiples, both dtypes, both B orders (N or K contiguous),
// padded strides, bias, every bundled grouped variant forced, device-side offsets that are
// decreasing or past T (clamped, never out of bounds), and a CUDA graph replayed with new offsets
// (the kernel reads them on the device). C is poisoned with 0xFF bytes (NaN) first: every row of a
// group must be written, rows past the last group's end and the padding must stay poisoned.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "flykernels/flykernels.hpp"
#include "gemm_test_util.hpp"

namespace {

using gemm_test::dec;
using gemm_test::Dev;
using gemm_test::enc;
using gemm_test::round8;


struct Case {
  std::vector<int32_t> offs;  // as passed to the kernel (cumulative ends; may be bad on purpose)
  int64_t T, K, N;
  bool b_kmajor;  // B's K contiguous (w.transpose(-2, -1)) or N contiguous
  bool bias;
  fly_dtype dt;
  int64_t pad = 0;  // extra elements on every line stride (A, B, C) and the group stride of B
  const char* force = nullptr;
};

std::string describe(const Case& c) {
  std::string s = std::string(c.dt == FLY_BF16 ? "bf16" : "fp16") + (c.b_kmajor ? " B k-contig" : " B n-contig") +
                  " T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) + " N=" + std::to_string(c.N) +
                  " pad=" + std::to_string(c.pad) + (c.bias ? " bias" : "") + " offs={";
  for (size_t i = 0; i < c.offs.size() && i < 16; ++i) s += (i ? "," : "") + std::to_string(c.offs[i]);
  if (c.offs.size() > 16) s += ",...(" + std::to_string(c.offs.size()) + ")";
  s += "}";
  if (c.force) s += std::string(" forced ") + c.force;
  return s;
}

// Offsets from group sizes.
std::vector<int32_t> cumulative(const std::vector<int32_t>& sizes) {
  std::vector<int32_t> o;
  int32_t run = 0;
  for (int32_t s : sizes) o.push_back(run += s);
  return o;
}

// The rows group g covers as the kernel reads the offsets: ends clamped to T, a decreasing end an
// empty group (docs/grouped_gemm.md).
std::vector<std::pair<int64_t, int64_t>> group_rows(const std::vector<int32_t>& offs, int64_t T) {
  std::vector<std::pair<int64_t, int64_t>> r;
  int64_t begin = 0;
  for (int32_t o : offs) {
    const int64_t end = std::min<int64_t>(o, T);
    r.push_back({begin, std::max(begin, end)});
    if (end > begin) begin = end;
  }
  return r;
}

struct Buffers {
  int64_t lda, ldb, gsb, ldc;
  std::vector<float> A, B, bias;  // A [T][K], B [G][K][N], bias [G][N]
};

// Uploads the case's operands and runs it (optionally captured in a graph by the caller).
struct Run {
  const Case& cs;
  Buffers h;
  Dev *da = nullptr, *db = nullptr, *dc = nullptr, *dbias = nullptr, *doffs = nullptr;
  fly_tensor ta{}, tb{}, tc{}, tbias{}, toffs{};
  explicit Run(const Case& c, uint64_t seed) : cs(c) {
    const int64_t T = c.T, K = c.K, N = c.N, G = int64_t(c.offs.size());
    const fly_dtype dt = c.dt;
    h.lda = round8(K) + c.pad;
    h.ldb = round8(c.b_kmajor ? K : N) + c.pad;                      // line stride of B
    h.gsb = (c.b_kmajor ? N : K) * h.ldb + 8 * (c.pad ? 1 : 0);     // group stride of B
    h.ldc = N + c.pad;
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> d(-4, 4);
    h.A.resize(size_t(T * K));
    h.B.resize(size_t(G * K * N));
    h.bias.resize(size_t(G * N));
    for (auto& v : h.A) v = d(rng) / 8.f;
    for (auto& v : h.B) v = d(rng) / 8.f;
    for (auto& v : h.bias) v = d(rng) / 4.f;
    std::vector<uint16_t> ha(size_t(std::max<int64_t>(T, 1) * h.lda), 0), hb(size_t(std::max<int64_t>(G, 1) * h.gsb), 0),
        hbias(size_t(G * N));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) ha[size_t(t * h.lda + k)] = enc(h.A[size_t(t * K + k)], dt);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n)
          hb[size_t(g * h.gsb + (c.b_kmajor ? n * h.ldb + k : k * h.ldb + n))] = enc(h.B[size_t((g * K + k) * N + n)], dt);
    for (size_t i = 0; i < hbias.size(); ++i) hbias[i] = enc(h.bias[i], dt);
    da = new Dev(ha.size() * 2);
    db = new Dev(hb.size() * 2);
    dc = new Dev(size_t(std::max<int64_t>(T, 1) * h.ldc) * 2);
    dbias = new Dev(hbias.size() * 2);
    doffs = new Dev(c.offs.size() * 4);
    REQUIRE(cudaMemcpy(da->p, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(db->p, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    if (!hbias.empty())
      REQUIRE(cudaMemcpy(dbias->p, hbias.data(), hbias.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    if (!c.offs.empty())
      REQUIRE(cudaMemcpy(doffs->p, c.offs.data(), c.offs.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    poison();
    ta = flykernels::tensor(da->p, dt, {T, K}, {h.lda, 1});
    tb = c.b_kmajor ? flykernels::tensor(db->p, dt, {G, K, N}, {h.gsb, 1, h.ldb})
                    : flykernels::tensor(db->p, dt, {G, K, N}, {h.gsb, h.ldb, 1});
    tc = flykernels::tensor(dc->p, dt, {T, N}, {h.ldc, 1});
    tbias = flykernels::tensor(dbias->p, dt, {G, N}, {N, 1});
    toffs = flykernels::tensor(doffs->p, FLY_I32, {G}, {1});
  }
  ~Run() {
    delete da;
    delete db;
    delete dc;
    delete dbias;
    delete doffs;
  }
  void poison() { REQUIRE(cudaMemset(dc->p, 0xFF, size_t(std::max<int64_t>(cs.T, 1) * h.ldc) * 2) == cudaSuccess); }
  fly_status call(cudaStream_t s = nullptr) {
    if (cs.force) REQUIRE(fly_force_variant(cs.force) == FLY_SUCCESS);
    const fly_status st = fly_grouped_gemm(&ta, &tb, &toffs, cs.bias ? &tbias : nullptr, &tc, nullptr, 0, s);
    if (cs.force) fly_force_variant(nullptr);
    return st;
  }
  // Checks C against the reference for offsets `offs` (the ones on the device now).
  void check(const std::vector<int32_t>& offs) {
    const int64_t T = cs.T, K = cs.K, N = cs.N;
    std::vector<uint16_t> hc(size_t(std::max<int64_t>(T, 1) * h.ldc));
    REQUIRE(cudaMemcpy(hc.data(), dc->p, hc.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    const double rel = cs.dt == FLY_BF16 ? 1.0 / 128 : 1.0 / 1024;
    const auto rows = group_rows(offs, T);
    std::vector<int> group_of(size_t(T), -1);
    for (size_t g = 0; g < rows.size(); ++g)
      for (int64_t t = rows[g].first; t < rows[g].second; ++t) group_of[size_t(t)] = int(g);
    int64_t bad = 0, first_t = -1, first_n = -1;
    double first_got = 0, first_want = 0;
    std::vector<double> row(static_cast<size_t>(N));
    for (int64_t t = 0; t < T; ++t) {
      const int g = group_of[size_t(t)];
      if (g >= 0) {
        for (int64_t n = 0; n < N; ++n) row[size_t(n)] = cs.bias ? h.bias[size_t(g * N + n)] : 0.0;
        for (int64_t k = 0; k < K; ++k) {
          const double av = h.A[size_t(t * K + k)];
          if (av == 0) continue;
          const float* brow = &h.B[size_t((g * K + k) * N)];
          for (int64_t n = 0; n < N; ++n) row[size_t(n)] += av * brow[n];
        }
      }
      for (int64_t n = 0; n < h.ldc; ++n) {
        const uint16_t v = hc[size_t(t * h.ldc + n)];
        bool ok;
        double got = dec(v, cs.dt), want = 0;
        if (g >= 0 && n < N) {
          want = row[size_t(n)];
          ok = std::fabs(got - want) <= rel * std::fabs(want) + 1e-6;
        } else {
          ok = v == 0xFFFF;  // rows of no group and the padding stay poisoned
        }
        if (!ok && bad++ == 0) {
          first_t = t;
          first_n = n;
          first_got = got;
          first_want = want;
        }
      }
    }
    INFO("variant " << fly_last_variant() << " (" << fly_last_decision() << ")");
    INFO("first mismatch at (" << first_t << ", " << first_n << "): got " << first_got << ", want " << first_want
                               << " (group " << (first_t >= 0 ? group_of[size_t(first_t)] : -2) << ")");
    CHECK(bad == 0);
  }
};

void run_case(const Case& cs, uint64_t seed = 1) {
  INFO(describe(cs));
  Run r(cs, seed);
  const fly_status st = r.call();
  INFO(fly_get_last_error());
  REQUIRE(st == FLY_SUCCESS);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  r.check(cs.offs);
}

Case make(const std::vector<int32_t>& sizes, int64_t K, int64_t N, bool kmajor, bool bias, fly_dtype dt,
          int64_t pad = 0) {
  Case c;
  c.offs = cumulative(sizes);
  c.T = c.offs.empty() ? 0 : c.offs.back();
  c.K = K;
  c.N = N;
  c.b_kmajor = kmajor;
  c.bias = bias;
  c.dt = dt;
  c.pad = pad;
  return c;
}

}  // namespace

TEST_CASE("grouped gemm: uniform groups, both B orders and dtypes", "[gpu][grouped_gemm]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F16})
    for (bool km : {true, false}) {
      run_case(make({128, 128, 128, 128}, 256, 256, km, false, dt));
      run_case(make({256, 256}, 512, 384, km, true, dt));
    }
}

TEST_CASE("grouped gemm: ragged groups, K and N off the tile", "[gpu][grouped_gemm]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F16})
    for (bool km : {true, false}) {
      run_case(make({1, 3, 7, 0, 64, 65, 130, 5}, 200, 136, km, true, dt), 2);
      run_case(make({0, 129, 0, 0, 1, 255, 2}, 72, 264, km, false, dt, 8), 3);
      run_case(make({13, 0, 300}, 1000, 72, km, true, dt), 4);  // K not a multiple of 64, N < one tile
    }
}

TEST_CASE("grouped gemm: empty groups, one group holding all rows", "[gpu][grouped_gemm]") {
  for (bool km : {true, false}) {
    run_case(make({0, 0, 333, 0}, 128, 200, km, true, FLY_BF16));
    run_case(make({333}, 128, 200, km, false, FLY_F16));
    // Many small groups (decode-like), mean M below 64.
    std::vector<int32_t> sizes;
    for (int g = 0; g < 40; ++g) sizes.push_back((g * 7) % 11);
    run_case(make(sizes, 256, 128, km, true, FLY_BF16));
  }
  // Offsets all zero with rows present: nothing is written (C stays poisoned).
  Case c = make({0, 0, 0}, 64, 64, true, false, FLY_BF16);
  c.T = 50;
  run_case(c);
  // T = 0 and N = 0: successful no-ops.
  Case z = make({0, 0}, 64, 64, true, false, FLY_BF16);
  {
    Run r(z, 1);
    CHECK(r.call() == FLY_SUCCESS);
  }
}

TEST_CASE("grouped gemm: every bundled variant forced", "[gpu][grouped_gemm]") {
  const int n = fly_variant_count();
  int forced = 0;
  for (int i = 0; i < n; ++i) {
    const char* vname = fly_variant_name(i);
    const char* family = nullptr;
    const char* params = nullptr;
    REQUIRE(fly_variant_info(vname, &family, &params) == FLY_SUCCESS);
    if (std::string(family) != "grouped_gemm") continue;
    const std::string name = vname;
    if (name.rfind("grouped_gemm_k_", 0) == 0) continue;  // mode k: test_grouped_gemm_k.cpp
    // FLY_TEST_GROUPED_ONLY=substr: only matching variants (the compute-sanitizer passes)
    if (const char* only = std::getenv("FLY_TEST_GROUPED_ONLY"))
      if (name.find(only) == std::string::npos) continue;
    const fly_dtype dt = name.find("_fp16_") != std::string::npos ? FLY_F16 : FLY_BF16;
    const int bm = name.find("_bm64_") != std::string::npos ? 64 : 128;
    const int bn = std::stoi(name.substr(name.find("_bn") + 3));
    for (bool km : {true, false}) {
      Case c = make({1, 70, 0, 129, 257, 3}, 136, 264, km, true, dt);
      c.force = vname;
      if (!km && (bm == 128 ? bn : bn / 2) % 64 != 0) {
        // an MN-major B tile comes in 64-wide chunks per warpgroup: refused, not run
        Run r(c, 1);
        CHECK(r.call() == FLY_ERROR_UNSUPPORTED);
        continue;
      }
      run_case(c, 5 + forced);
      if (name.find("_e2") != std::string::npos) {
        // C rows of 131 elements: no tensor map for C, the TMA-store variant stores directly
        Case d = make({5, 40, 17, 0, 200}, 136, 131, km, true, dt);
        d.force = vname;
        run_case(d, 6 + forced);
      }
    }
    ++forced;
  }
  CHECK(forced >= (std::getenv("FLY_TEST_GROUPED_ONLY") ? 1 : 6));  // the family's defaults are always bundled
}

TEST_CASE("grouped gemm: bad device offsets are clamped, never out of bounds", "[gpu][grouped_gemm]") {
  for (bool km : {true, false}) {
    Case c = make({50, 50, 50}, 128, 128, km, true, FLY_BF16);
    c.offs = {50, 20, 150};  // decreasing: group 1 empty, group 2 rows [50, 150)
    run_case(c);
    c.offs = {50, 100000, 150};  // past T: group 1 rows [50, 150), group 2 empty
    run_case(c);
    c.offs = {-5, 70, 2147483647};  // negative: empty; the last clamped to T
    run_case(c);
  }
}

TEST_CASE("grouped gemm: a CUDA graph replays with new device offsets", "[gpu][grouped_gemm]") {
  Case c = make({100, 28, 0, 128}, 256, 192, true, true, FLY_BF16);
  Run r(c, 9);
  gemm_test::replay_with_new_offsets(r, {{100, 128, 128, 256}, {0, 3, 200, 256}, {256, 256, 256, 256}});
}
