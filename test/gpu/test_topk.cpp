// SPDX-License-Identifier: Apache-2.0
// fly_topk against a CPU sort: exact values, valid indices pointing at equal elements, sorted
// order, NaN / +-inf / signed zeros / ties, k = 1 and k = C, C = 1, strided and misaligned rows,
// largest = false, both deterministic modes (lowest index first and identical reruns), and each
// bundled variant forced on shapes it supports.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../../kernels/topk/topk_reference.h"
#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"
#include "variant_test_util.hpp"

namespace {

using fly_test::mat;

#define TK_CUDA(x) REQUIRE((x) == cudaSuccess)

struct DevMem {
  void* p = nullptr;
  explicit DevMem(size_t n) {
    if (n) REQUIRE(cudaMalloc(&p, n) == cudaSuccess);
  }
  ~DevMem() {
    if (p) cudaFree(p);
  }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};


enum Data { kUniform = 0, kTies = 1, kSpecials = 2, kAllEqual = 3, kNormal = 4, kTies16 = 5 };
const char* data_name(int d) {
  static const char* n[] = {"uniform", "ties", "specials", "all-equal", "normal", "16 values"};
  return n[d];
}

std::vector<float> make_data(int64_t n, int kind, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) {
    switch (kind) {
      case kUniform: e = u(g); break;
      case kTies: e = float(int(g() % 5)) - 2.f; break;
      case kSpecials: {
        const uint64_t r = g() % 12;
        e = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? -INFINITY : r == 3 ? -0.0f : r == 4 ? 0.0f
          : r == 5 ? -NAN : u(g);
        break;
      }
      case kNormal: e = nd(g); break;                           // the top buckets are small
      case kTies16: e = float(int(g() % 16)) * 0.25f - 1.5f; break;  // 16 distinct numbers
      default: e = 1.0f; break;
    }
  }
  return v;
}

struct Run {
  fly_status status;
  std::string error;            // "" when the result matches the reference
  std::vector<int64_t> indices; // row-major [R, k] (dense copy)
};

// x: host rows with leading stride ld, copied to the device at an element offset xoff (xoff = 1
// makes every row start off 16-byte alignment). Outputs use row stride ldo >= k.
Run run_topk(const std::vector<float>& hx, int64_t ld, int xoff, int64_t R, int64_t C, int64_t k, bool largest,
             bool det, int64_t ldo, const char* force = nullptr) {
  Run out{FLY_SUCCESS, "", {}};
  const size_t xn = size_t((R - 1) * ld + C);
  DevMem x((xn + size_t(xoff)) * 4), v(size_t((R - 1) * ldo + k) * 4), i(size_t((R - 1) * ldo + k) * 8);
  float* xd = static_cast<float*>(x.p) + xoff;
  TK_CUDA(cudaMemcpy(xd, hx.data(), xn * 4, cudaMemcpyHostToDevice));
  TK_CUDA(cudaMemset(v.p, 0xff, size_t((R - 1) * ldo + k) * 4));  // poison: every element must be written
  TK_CUDA(cudaMemset(i.p, 0xff, size_t((R - 1) * ldo + k) * 8));
  fly_tensor xt = mat(xd, FLY_F32, R, C, ld), vt = mat(v.p, FLY_F32, R, k, ldo), it = mat(i.p, FLY_I64, R, k, ldo);
  size_t wsb = 0;
  REQUIRE(fly_topk_workspace_size(&xt, k, largest, det, &wsb) == FLY_SUCCESS);
  DevMem ws(wsb);
  if (force) REQUIRE(fly_force_variant(force) == FLY_SUCCESS);
  out.status = fly_topk(&xt, k, largest, det, &vt, &it, ws.p, wsb, nullptr);
  if (force) fly_force_variant(nullptr);
  if (out.status != FLY_SUCCESS) {
    out.error = fly_get_last_error();
    return out;
  }
  TK_CUDA(cudaDeviceSynchronize());
  std::vector<float> hv(size_t((R - 1) * ldo + k));
  std::vector<int64_t> hi(size_t((R - 1) * ldo + k));
  TK_CUDA(cudaMemcpy(hv.data(), v.p, hv.size() * 4, cudaMemcpyDeviceToHost));
  TK_CUDA(cudaMemcpy(hi.data(), i.p, hi.size() * 8, cudaMemcpyDeviceToHost));
  auto ref = topk_ref::reference(hx.data(), ld, R, C, k, largest);
  out.error = topk_ref::check(hx.data(), ld, R, C, k, largest, det, ref, hv.data(), ldo, hi.data(), ldo);
  for (int64_t r = 0; r < R; ++r)
    out.indices.insert(out.indices.end(), hi.begin() + r * ldo, hi.begin() + r * ldo + k);
  return out;
}

struct Shape {
  int64_t R, C, k;
};

void check_shape(const Shape& s, const char* force, int ld_pad, int xoff, int64_t ldo_pad,
                 std::initializer_list<int> kinds = {kUniform, kTies, kSpecials, kAllEqual}) {
  const int64_t ld = s.C + ld_pad;
  for (int kind : kinds) {
    auto hx = make_data((s.R - 1) * ld + s.C, kind, uint64_t(s.R * 1000003 + s.C * 31 + s.k + kind));
    for (int largest = 0; largest < 2; ++largest)
      for (int det = 0; det < 2; ++det) {
        INFO("variant " << (force ? force : "(dispatch)") << " R=" << s.R << " C=" << s.C << " k=" << s.k
                        << " ld=" << ld << " xoff=" << xoff << " ldo=" << s.k + ldo_pad << " data=" << data_name(kind)
                        << " largest=" << largest << " det=" << det);
        Run r = run_topk(hx, ld, xoff, s.R, s.C, s.k, largest, det, s.k + ldo_pad, force);
        REQUIRE(r.status == FLY_SUCCESS);
        CHECK(r.error == "");
      }
  }
}

std::string param(const std::string& params, const std::string& key) {
  std::stringstream ss(params);
  for (std::string kv; std::getline(ss, kv, ';');) {
    const size_t eq = kv.find('=');
    if (eq != std::string::npos && kv.substr(0, eq) == key) return kv.substr(eq + 1);
  }
  return "";
}

}  // namespace

TEST_CASE("topk matches a sort through the library's dispatch", "[topk][gpu]") {
  const Shape shapes[] = {{1, 1, 1},       {3, 1, 1},        {5, 7, 3},      {64, 64, 8},     {100, 128, 2},
                          {33, 300, 16},   {17, 4096, 16},   {5, 4096, 1024}, {9, 1000, 1000}, {300, 2048, 4},
                          {4, 20000, 700}, {3, 70001, 5},    {2, 200000, 3000}, {2, 40000, 10000}};
  for (const Shape& s : shapes) check_shape(s, nullptr, 0, 0, 0);
}

TEST_CASE("topk handles strided, misaligned rows and strided outputs", "[topk][gpu]") {
  const Shape shapes[] = {{37, 130, 4}, {20, 777, 16}, {6, 5000, 300}, {3, 70001, 40}};
  for (const Shape& s : shapes) {
    check_shape(s, nullptr, 3, 1, 5, {kUniform, kSpecials});
    check_shape(s, nullptr, 1, 0, 0, {kTies});
  }
}

TEST_CASE("deterministic topk repeats exactly and takes the lowest index among ties", "[topk][gpu]") {
  const Shape shapes[] = {{64, 256, 8}, {16, 4096, 100}, {2, 300000, 2000}};
  for (const Shape& s : shapes) {
    auto hx = make_data(s.R * s.C, kTies, 99 + uint64_t(s.C));
    INFO("R=" << s.R << " C=" << s.C << " k=" << s.k);
    Run a = run_topk(hx, s.C, 0, s.R, s.C, s.k, true, true, s.k);
    Run b = run_topk(hx, s.C, 0, s.R, s.C, s.k, true, true, s.k);
    REQUIRE(a.status == FLY_SUCCESS);
    REQUIRE(b.status == FLY_SUCCESS);
    CHECK(a.error == "");  // the check compares indices with the lowest-index reference
    CHECK(a.indices == b.indices);
    // Heavy ties: each row's tie run at the threshold must be the lowest indices, i.e. the
    // reference; and the non-deterministic mode must still return a valid top-k.
    Run n = run_topk(hx, s.C, 0, s.R, s.C, s.k, true, false, s.k);
    REQUIRE(n.status == FLY_SUCCESS);
    CHECK(n.error == "");
  }
}

TEST_CASE("every bundled topk variant is correct on shapes it supports", "[topk][gpu]") {
  const int tested = fly_test::for_each_variant("topk", [](const char* name, const char* params) {
    const std::string path = param(params, "path");
    std::vector<Shape> shapes;
    if (path == "small") {
      const int64_t kmax = std::stoll(param(params, "kmax"));
      shapes = {{40, 256, std::min<int64_t>(kmax, 8)}, {6, 3000, kmax}, {3, 33, std::min<int64_t>(kmax, 33)},
                {5, 1, 1}};
    } else if (path == "radix") {
      shapes = {{6, 3000, 100}, {3, 40000, 9000}, {2, 300000, 50}, {7, 50, 50}};
    } else if (path == "split") {
      const int64_t chunk = std::stoll(param(params, "chunk"));
      shapes = {{3, 2 * chunk + 5, 50}, {2, chunk + 1, 2000}};
    } else {
      FAIL("unknown topk path in " << name << ": " << params);
    }
    for (const Shape& s : shapes) check_shape(s, name, 0, 0, 0);
    // Strided / misaligned rows through every path as well.
    check_shape(shapes[0], name, 3, 1, 2, {kUniform});
  });
  CHECK(tested > 0);
}

TEST_CASE("a forced variant that cannot take the shape is reported as unsupported", "[topk][gpu]") {
  for (int vi = 0; vi < fly_variant_count(); ++vi) {
    const char* name = fly_variant_name(vi);
    const char* family = nullptr;
    const char* params = nullptr;
    REQUIRE(fly_variant_info(name, &family, &params) == FLY_SUCCESS);
    if (std::string(family) != "topk" || param(params, "path") != "small") continue;
    const int64_t kmax = std::stoll(param(params, "kmax"));
    auto hx = make_data(4 * 256, kUniform, 5);
    Run r = run_topk(hx, 256, 0, 4, 256, kmax + 1, true, false, kmax + 1, name);
    CHECK(r.status == FLY_ERROR_UNSUPPORTED);
    break;
  }
}

// ---- few very long rows (the split path: many CTAs per row) -------------------------------
namespace {
std::string run_variant() { return fly_last_variant() ? fly_last_variant() : ""; }
}  // namespace

TEST_CASE("topk on few long rows picks the split path and matches a sort", "[topk][long]") {
  // R <= 16, C >= 2^18: through the dispatch (database rows name split variants), any k, both
  // orders, both modes; normal data (small top buckets: compaction), uniform data (a large top
  // bucket: passes over x), 16 distinct values (the k-th key shared by many elements).
  const Shape shapes[] = {{1, 1 << 18, 1}, {1, 1 << 18, 4096}, {4, (1 << 20) + 3, 64}, {3, 300007, 16},
                          {16, 1 << 18, 256}, {2, 1 << 20, 1024}, {1, 3000017, 4}};
  for (const Shape& s : shapes) {
    check_shape(s, nullptr, 0, 0, 0, {kNormal, kUniform, kTies16});
    auto hx = make_data(s.R * s.C, kNormal, 7);
    Run r = run_topk(hx, s.C, 0, s.R, s.C, s.k, true, false, s.k);
    REQUIRE(r.status == FLY_SUCCESS);
    INFO("R=" << s.R << " C=" << s.C << " k=" << s.k << " ran " << run_variant());
    CHECK(run_variant().rfind("topk_split_", 0) == 0);
  }
}

TEST_CASE("split topk: strided and misaligned rows, specials, large k, k = C", "[topk][long]") {
  const char* v = "topk_split_fp32_t512_c32768";  // a default: always bundled
  check_shape({3, 200003, 300}, v, 5, 1, 3, {kNormal, kSpecials, kAllEqual});
  check_shape({2, 100000, 9000}, v, 0, 0, 0, {kNormal, kTies16});   // sort beyond shared memory
  check_shape({1, 70001, 70001}, v, 0, 0, 0, {kUniform});            // every element
  check_shape({5, 65537, 1}, v, 1, 1, 0, {kTies, kSpecials});
}

TEST_CASE("deterministic split topk takes the lowest indices among many ties", "[topk][long]") {
  // 16 distinct values: the k-th value is shared by ~C/16 elements, most of them not taken. The
  // deterministic contract: equal values come lowest index first, so the indices are exactly the
  // reference's (topk_ref::check compares them), and reruns repeat bit for bit.
  const Shape shapes[] = {{1, 1 << 20, 4096}, {16, 1 << 18, 64}, {3, 500009, 1}, {2, (1 << 19) + 7, 30000}};
  for (const Shape& s : shapes) {
    auto hx = make_data(s.R * s.C, kTies16, 1234 + uint64_t(s.C));
    for (int largest = 0; largest < 2; ++largest) {
      INFO("R=" << s.R << " C=" << s.C << " k=" << s.k << " largest=" << largest);
      Run a = run_topk(hx, s.C, 0, s.R, s.C, s.k, largest, true, s.k);
      REQUIRE(a.status == FLY_SUCCESS);
      CHECK(a.error == "");
      INFO("ran " << run_variant());
      CHECK(run_variant().rfind("topk_split_", 0) == 0);
      // The first ties in index order, checked directly: rank j of a row holds the j-th
      // smallest index among the elements equal to its value that the row selects.
      auto ref = topk_ref::reference(hx.data(), s.C, s.R, s.C, s.k, largest);
      for (int64_t r = 0; r < s.R; ++r)
        for (int64_t j = 0; j < s.k; ++j)
          REQUIRE(a.indices[size_t(r * s.k + j)] == int64_t(~uint32_t(ref[size_t(r * s.k + j)])));
      Run b = run_topk(hx, s.C, 0, s.R, s.C, s.k, largest, true, s.k);
      REQUIRE(b.status == FLY_SUCCESS);
      CHECK(a.indices == b.indices);
      Run n = run_topk(hx, s.C, 0, s.R, s.C, s.k, largest, false, s.k);
      REQUIRE(n.status == FLY_SUCCESS);
      CHECK(n.error == "");
    }
  }
}
