// SPDX-License-Identifier: Apache-2.0
// fly_grouped_gemm in the ragged-K mode (F.grouped_mm's weight gradient: out[g] = a[:, k of g] @
// b[k of g, :], a [M, Ktot], b [Ktot, N], offs along K, out [G, M, N]) on the GPU against a CPU
// reference (double accumulation of exactly representable nonzero random inputs): ragged groups
// (sizes 1, 3, 70, 129, 257: not multiples of 64 or 8), empty groups (zeros written), Ktot = 0
// (all zeros), M and N off the tiles, both dtypes, a M contiguous and b N contiguous (autograd's
// orders; the K-contiguous ones are refused, checked), padded strides, every bundled mode-k variant forced, inf in the k columns of
// other groups and past the last group (the per-group TMA maps must zero-fill the k tail), bad
// device offsets (clamped), bit-identical repeats, and a CUDA graph replayed with new device
// offsets. out is poisoned with 0xFF bytes (NaN) first: every element of every group must be
// written, the padding must stay poisoned.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
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


struct KCase {
  std::vector<int32_t> offs;  // as passed (cumulative ends along K; may be bad on purpose)
  int64_t Ktot, M, N;
  bool a_kcontig;  // a [M, Ktot] row-major (K contiguous) or M contiguous (X.t(), autograd's)
  bool b_kcontig;  // b [Ktot, N] K contiguous or N contiguous (dC, autograd's)
  fly_dtype dt;
  int64_t pad = 0;  // extra elements on every line stride and on out's group stride
  const char* force = nullptr;
  // Leakage check: the k columns of the even groups (and past the last end) hold inf in a and b;
  // only the odd groups are checked (their results must be finite and exact).
  bool inf_others = false;
};

std::string describe(const KCase& c) {
  std::string s = std::string(c.dt == FLY_BF16 ? "bf16" : "fp16") + (c.a_kcontig ? " a k-contig" : " a m-contig") +
                  (c.b_kcontig ? " b k-contig" : " b n-contig") + " Ktot=" + std::to_string(c.Ktot) +
                  " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " pad=" + std::to_string(c.pad) +
                  (c.inf_others ? " inf-in-other-groups" : "") + " offs={";
  for (size_t i = 0; i < c.offs.size() && i < 16; ++i) s += (i ? "," : "") + std::to_string(c.offs[i]);
  if (c.offs.size() > 16) s += ",...(" + std::to_string(c.offs.size()) + ")";
  s += "}";
  if (c.force) s += std::string(" forced ") + c.force;
  return s;
}

std::vector<int32_t> cumulative(const std::vector<int32_t>& sizes) {
  std::vector<int32_t> o;
  int32_t run = 0;
  for (int32_t s : sizes) o.push_back(run += s);
  return o;
}

// Group g's k range as the kernel reads the offsets (docs/grouped_gemm.md): begin offs[g-1], end
// offs[g], both clamped into [0, Ktot], end >= begin.
std::pair<int64_t, int64_t> k_range(const std::vector<int32_t>& offs, size_t g, int64_t ktot) {
  int64_t b = g ? offs[g - 1] : 0;
  b = std::min<int64_t>(std::max<int64_t>(b, 0), ktot);
  int64_t e = offs[g];
  e = std::min<int64_t>(std::max<int64_t>(e, b), ktot);
  return {b, e};
}

struct KRun {
  const KCase& cs;
  int64_t lda, ldb, ldc, gsc, G;
  std::vector<float> A, B;  // A [M][Ktot], B [Ktot][N] (logical)
  Dev *da = nullptr, *db = nullptr, *dc = nullptr, *doffs = nullptr, *dws = nullptr;
  size_t ws_bytes = 0, c_elems = 0;
  fly_status ws_status = FLY_SUCCESS;
  fly_tensor ta{}, tb{}, tc{}, toffs{};
  KRun(const KCase& c, uint64_t seed) : cs(c) {
    const int64_t M = c.M, N = c.N, K = c.Ktot;
    G = int64_t(c.offs.size());
    const fly_dtype dt = c.dt;
    lda = round8(c.a_kcontig ? K : M) + c.pad;
    ldb = round8(c.b_kcontig ? K : N) + c.pad;
    ldc = N + c.pad;
    gsc = M * ldc + (c.pad ? 8 : 0);
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> d(1, 4), sgn(0, 1);
    auto val = [&] { return (sgn(rng) ? -1.f : 1.f) * float(d(rng)) / 8.f; };  // never zero
    A.resize(size_t(M * K));
    B.resize(size_t(K * N));
    for (auto& v : A) v = val();
    for (auto& v : B) v = val();
    if (c.inf_others) {
      // Columns of the even groups and past the last group's end: +-inf.
      std::vector<int> owner(size_t(K), -1);
      for (size_t g = 0; g < c.offs.size(); ++g) {
        const auto r = k_range(c.offs, g, K);
        for (int64_t k = r.first; k < r.second; ++k) owner[size_t(k)] = int(g);
      }
      const float inf = std::numeric_limits<float>::infinity();
      for (int64_t k = 0; k < K; ++k)
        if (owner[size_t(k)] < 0 || owner[size_t(k)] % 2 == 0) {
          for (int64_t m = 0; m < M; ++m) A[size_t(m * K + k)] = (m % 2 ? -inf : inf);
          for (int64_t n = 0; n < N; ++n) B[size_t(k * N + n)] = (n % 3 ? inf : -inf);
        }
    }
    const int64_t a_lines = c.a_kcontig ? M : K, b_lines = c.b_kcontig ? N : K;
    std::vector<uint16_t> ha(size_t(std::max<int64_t>(a_lines, 1) * lda), 0), hb(size_t(std::max<int64_t>(b_lines, 1) * ldb), 0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k)
        ha[size_t(c.a_kcontig ? m * lda + k : k * lda + m)] = enc(A[size_t(m * K + k)], dt);
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n)
        hb[size_t(c.b_kcontig ? n * ldb + k : k * ldb + n)] = enc(B[size_t(k * N + n)], dt);
    c_elems = size_t(std::max<int64_t>(G, 1) * gsc);
    da = new Dev(ha.size() * 2);
    db = new Dev(hb.size() * 2);
    dc = new Dev(c_elems * 2);
    doffs = new Dev(c.offs.size() * 4);
    REQUIRE(cudaMemcpy(da->p, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(db->p, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
    if (!c.offs.empty())
      REQUIRE(cudaMemcpy(doffs->p, c.offs.data(), c.offs.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    poison();
    ta = c.a_kcontig ? flykernels::tensor(da->p, dt, {M, K}, {lda, 1}) : flykernels::tensor(da->p, dt, {M, K}, {1, lda});
    tb = c.b_kcontig ? flykernels::tensor(db->p, dt, {K, N}, {1, ldb}) : flykernels::tensor(db->p, dt, {K, N}, {ldb, 1});
    tc = flykernels::tensor(dc->p, dt, {G, M, N}, {gsc, ldc, 1});
    toffs = flykernels::tensor(doffs->p, FLY_I32, {G}, {1});
    // A refused layout (K contiguous) is refused by the size query too: the call gets G x 256 bytes.
    ws_status = fly_grouped_gemm_workspace_size(&ta, &tb, &toffs, &tc, &ws_bytes);
    if (ws_status == FLY_SUCCESS) CHECK(ws_bytes == size_t(G) * 256);
    else ws_bytes = size_t(G) * 256;
    dws = new Dev(ws_bytes);
  }
  ~KRun() {
    delete da;
    delete db;
    delete dc;
    delete doffs;
    delete dws;
  }
  void poison() { REQUIRE(cudaMemset(dc->p, 0xFF, c_elems * 2) == cudaSuccess); }
  fly_status call(cudaStream_t s = nullptr) {
    if (cs.force) REQUIRE(fly_force_variant(cs.force) == FLY_SUCCESS);
    const fly_status st = fly_grouped_gemm(&ta, &tb, &toffs, nullptr, &tc, dws->p, ws_bytes, s);
    if (cs.force) fly_force_variant(nullptr);
    return st;
  }
  std::vector<uint16_t> fetch() {
    std::vector<uint16_t> hc(c_elems);
    REQUIRE(cudaMemcpy(hc.data(), dc->p, hc.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
    return hc;
  }
  // out against the reference for offsets `offs` (the ones on the device now).
  void check(const std::vector<int32_t>& offs) {
    const int64_t M = cs.M, N = cs.N, K = cs.Ktot;
    const std::vector<uint16_t> hc = fetch();
    const double rel = cs.dt == FLY_BF16 ? 1.0 / 128 : 1.0 / 1024;
    int64_t bad = 0, checked = 0;
    std::string first;
    std::vector<double> row(static_cast<size_t>(N));
    for (int64_t g = 0; g < G; ++g) {
      const auto r = k_range(offs, size_t(g), K);
      const bool skip = cs.inf_others && g % 2 == 0;  // their inputs are inf: not checked
      for (int64_t m = 0; m < M; ++m) {
        if (!skip) {
          std::fill(row.begin(), row.end(), 0.0);
          for (int64_t k = r.first; k < r.second; ++k) {
            const double av = A[size_t(m * K + k)];
            const float* brow = &B[size_t(k * N)];
            for (int64_t n = 0; n < N; ++n) row[size_t(n)] += av * brow[n];
          }
        }
        for (int64_t n = 0; n < ldc; ++n) {
          const uint16_t v = hc[size_t(g * gsc + m * ldc + n)];
          bool ok;
          const double got = dec(v, cs.dt);
          double want = 0;
          if (n < N) {
            if (skip) continue;
            want = row[size_t(n)];
            ok = std::isfinite(got) && std::fabs(got - want) <= rel * std::fabs(want) + 1e-6;
            ++checked;
          } else {
            ok = v == 0xFFFF;  // row padding: untouched
          }
          if (!ok && bad++ == 0)
            first = "g=" + std::to_string(g) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                    " got=" + std::to_string(got) + " want=" + std::to_string(want);
        }
      }
      // Group padding (pad > 0): untouched.
      for (int64_t i = M * ldc; i < gsc && g + 1 < G; ++i)
        if (hc[size_t(g * gsc + i)] != 0xFFFF && bad++ == 0) first = "group padding written at g=" + std::to_string(g);
    }
    INFO(describe(cs) << ": " << bad << " bad of " << checked << "; first " << first);
    CHECK(bad == 0);
  }
};

void run_case(const KCase& c, uint64_t seed = 1) {
  KRun r(c, seed);
  const fly_status st = r.call();
  INFO(describe(c) << ": " << fly_status_string(st) << ": " << fly_get_last_error());
  REQUIRE(st == FLY_SUCCESS);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  r.check(c.offs);
}

}  // namespace

TEST_CASE("grouped gemm k: ragged, empty and tiny groups, both dtypes, padded strides", "[gpu][grouped_gemm]") {
  const std::vector<int32_t> sizes = {1, 70, 0, 129, 257, 3};
  const int64_t Ktot = 460;
  uint64_t seed = 11;
  for (fly_dtype dt : {FLY_BF16, FLY_F16}) {
    KCase c{cumulative(sizes), Ktot, 136, 264, false, false, dt};
    run_case(c, seed++);
    c.pad = 8;  // padded lines and groups
    c.M = 200;
    c.N = 72;
    run_case(c, seed++);
    c.M = 1;  // a single row of output per group
    c.N = 8;
    run_case(c, seed++);
  }
  // K-contiguous a or b: refused (the ragged K must be the outer dimension of the TMA maps).
  for (bool ak : {false, true})
    for (bool bk : {false, true}) {
      if (!ak && !bk) continue;
      KCase c{cumulative(sizes), 464, 136, 264, ak, bk, FLY_BF16};
      KRun r(c, 1);
      CHECK(r.ws_status == FLY_ERROR_UNSUPPORTED);
      CHECK(r.call() == FLY_ERROR_UNSUPPORTED);
    }
  // Offsets ending before Ktot: the columns past the last end belong to no group (not read).
  KCase tail{{64, 64, 100}, 300, 128, 256, false, false, FLY_BF16};
  run_case(tail, 3);
  // A single group of one k; many groups, most empty; a larger ragged problem.
  run_case(KCase{{1}, 1, 64, 64, false, false, FLY_BF16}, 4);
  std::vector<int32_t> many(40, 0);
  for (int g = 0; g < 40; ++g) many[size_t(g)] = g % 7 == 3 ? g * 3 : 0;
  run_case(KCase{cumulative(many), int64_t(cumulative(many).back()), 130, 136, false, false, FLY_F16}, 5);
  run_case(KCase{cumulative({512, 17, 640, 0, 300, 65, 64, 8}), 1606, 256, 384, false, false, FLY_BF16}, 6);
}

TEST_CASE("grouped gemm k: Ktot = 0 and all-empty groups write zeros", "[gpu][grouped_gemm]") {
  run_case(KCase{{0, 0, 0}, 0, 100, 72, false, false, FLY_BF16}, 7);
  run_case(KCase{{0, 0, 0, 0}, 256, 130, 264, false, false, FLY_F16}, 8);  // Ktot > 0, no group holds any
}

TEST_CASE("grouped gemm k: inf in other groups' k columns never leaks in", "[gpu][grouped_gemm]") {
  // Odd groups are checked; the even groups' columns and those past the last end hold inf in both
  // a and b, so a k tail that is not zero-filled in both operands gives inf or NaN (inf x 0).
  uint64_t seed = 21;
  for (fly_dtype dt : {FLY_BF16, FLY_F16})
    for (int64_t pad : {0, 8}) {
      KCase c{cumulative({37, 5, 70, 1, 129, 64, 3}), 400, 136, 200, false, false, dt};
      c.inf_others = true;
      c.pad = pad;
      run_case(c, seed++);
    }
}

TEST_CASE("grouped gemm k: every bundled mode-k variant forced", "[gpu][grouped_gemm]") {
  const int n = fly_variant_count();
  int forced = 0;
  for (int i = 0; i < n; ++i) {
    const char* vname = fly_variant_name(i);
    const char* family = nullptr;
    const char* params = nullptr;
    REQUIRE(fly_variant_info(vname, &family, &params) == FLY_SUCCESS);
    const std::string name = vname;
    if (std::string(family) != "grouped_gemm" || name.rfind("grouped_gemm_k_", 0) != 0) continue;
    if (const char* only = std::getenv("FLY_TEST_GROUPED_ONLY"))
      if (name.find(only) == std::string::npos) continue;
    const fly_dtype dt = name.find("_fp16_") != std::string::npos ? FLY_F16 : FLY_BF16;
    const int bm = name.find("_bm64_") != std::string::npos ? 64 : 128;
    const int bn = std::stoi(name.substr(name.find("_bn") + 3));
    KCase c{cumulative({1, 70, 0, 129, 3}), 203, 136, 264, false, false, dt};
    c.force = vname;
    c.inf_others = true;
    if ((bm == 128 ? bn : bn / 2) % 64 != 0) {
      KRun r(c, 1);  // an MN-major b tile comes in 64-wide chunks per warpgroup: refused
      CHECK(r.call() == FLY_ERROR_UNSUPPORTED);
    } else {
      run_case(c, 31 + forced);
    }
    ++forced;
  }
  CHECK(forced >= (std::getenv("FLY_TEST_GROUPED_ONLY") ? 1 : 4));  // the mode's defaults are always bundled
}

TEST_CASE("grouped gemm k: bad device offsets are clamped, never out of bounds", "[gpu][grouped_gemm]") {
  KCase c{{50, 20, 150}, 100, 128, 128, false, false, FLY_BF16};  // decreasing: group 1 empty, group 2 [20, 100)
  run_case(c, 41);
  c.offs = {50, 100000, 150};  // past Ktot: group 1 [50, 100), group 2 [100, 100) empty
  run_case(c, 42);
  c.offs = {-5, 70, 2147483647};  // negative: empty; the last clamped to Ktot
  run_case(c, 43);
}

TEST_CASE("grouped gemm k: repeat runs are bit-identical", "[gpu][grouped_gemm]") {
  KCase c{cumulative({300, 0, 77, 1000, 5}), 1382, 256, 320, false, false, FLY_BF16};
  KRun r(c, 51);
  REQUIRE(r.call() == FLY_SUCCESS);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<uint16_t> first = r.fetch();
  for (int i = 0; i < 3; ++i) {
    r.poison();
    REQUIRE(r.call() == FLY_SUCCESS);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(r.fetch() == first);
  }
  r.check(c.offs);
}

TEST_CASE("grouped gemm k: a CUDA graph replays with new device offsets", "[gpu][grouped_gemm]") {
  KCase c{cumulative({100, 28, 0, 128}), 256, 192, 256, false, false, FLY_BF16};
  KRun r(c, 61);
  gemm_test::replay_with_new_offsets(r, {{100, 128, 128, 256}, {0, 3, 200, 256}, {256, 256, 256, 256}, {7, 7, 64, 65}});
}
