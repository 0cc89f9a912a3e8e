// SPDX-License-Identifier: Apache-2.0
// The C++ layer: descriptors, exceptions, and one wrapper per C entry answering as the C entry does.
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>

#include "catch_compat.hpp"
#include "flykernels/flykernels.hpp"

namespace {
void* fake_device_ptr() { return reinterpret_cast<void*>(0x100000); }  // validation never reads it
}  // namespace

TEST_CASE("flykernels.hpp builds descriptors and throws on errors", "[cpp]") {
  fly_tensor t = flykernels::tensor(reinterpret_cast<void*>(0x1000), FLY_BF16, {3, 5, 7});
  CHECK(t.rank == 3);
  CHECK(t.strides[0] == 35);
  CHECK(t.strides[1] == 7);
  CHECK(t.strides[2] == 1);
  fly_tensor u = flykernels::tensor(nullptr, FLY_F32, {2, 3}, {1, 2});
  CHECK(u.strides[0] == 1);
  CHECK(u.strides[1] == 2);
  bool threw = false;
  try {
    flykernels::rms_norm_fwd(t, nullptr, 1e-5, t);  // rank 3: invalid
  } catch (const flykernels::Error& e) {
    threw = true;
    CHECK(e.status() == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(e.what()).find("rank") != std::string::npos);
    CHECK(flykernels::last_error() == fly_get_last_error());
    CHECK(std::string(e.what()).find(flykernels::last_error()) != std::string::npos);
  }
  CHECK(threw);
  CHECK_THROWS_AS(flykernels::ScopedVariant("no_such_variant"), flykernels::Error);
}

TEST_CASE("flykernels.hpp: version, status strings and the tuning-db overlay", "[cpp]") {
  const flykernels::Version v = flykernels::version();
  CHECK(v.major == FLY_VERSION_MAJOR);
  CHECK(v.minor == FLY_VERSION_MINOR);
  CHECK(v.patch == FLY_VERSION_PATCH);
  CHECK(flykernels::version_string() == fly_version_string());
  CHECK(flykernels::version_string().find(std::to_string(v.major) + "." + std::to_string(v.minor)) == 0);
  CHECK(flykernels::status_string(FLY_ERROR_NO_DEVICE) == "FLY_ERROR_NO_DEVICE");
  CHECK(flykernels::status_string(FLY_SUCCESS) == fly_status_string(FLY_SUCCESS));

  try {
    flykernels::set_tuning_db(std::string("/nonexistent/flykernels.sqlite"));
    FAIL("set_tuning_db accepted a missing file");
  } catch (const flykernels::Error& e) {
    CHECK(e.status() == FLY_ERROR_DATABASE);
  }
  CHECK_NOTHROW(flykernels::set_tuning_db(nullptr));  // clears the overlay
}

TEST_CASE("flykernels.hpp: variant introspection matches the C entries", "[cpp]") {
  const int n = flykernels::variant_count();
  CHECK(n == fly_variant_count());
  const auto names = flykernels::variant_names();
  REQUIRE(names.size() == size_t(n));
  CHECK(std::set<std::string>(names.begin(), names.end()).size() == names.size());
  CHECK_THROWS_AS(flykernels::variant_name(-1), std::out_of_range);
  CHECK_THROWS_AS(flykernels::variant_name(n), std::out_of_range);
  if (n > 0) {
    CHECK(flykernels::variant_name(0) == fly_variant_name(0));
    const char* family = nullptr;
    const char* params = nullptr;
    REQUIRE(fly_variant_info(names[0].c_str(), &family, &params) == FLY_SUCCESS);
    const flykernels::VariantInfo info = flykernels::variant_info(names[0]);
    CHECK(info.family == family);
    CHECK(info.params == params);
    CHECK_FALSE(info.family.empty());
    CHECK_NOTHROW(flykernels::force_variant(names[0].c_str()));
    CHECK_NOTHROW(flykernels::force_variant(nullptr));
  }
  try {
    flykernels::variant_info("no_such_variant");
    FAIL("variant_info accepted an unknown name");
  } catch (const flykernels::Error& e) {
    CHECK(e.status() == FLY_ERROR_INVALID_ARGUMENT);
  }
  CHECK_THROWS_AS(flykernels::force_variant("no_such_variant"), flykernels::Error);
  CHECK(flykernels::last_variant() == (fly_last_variant() ? fly_last_variant() : ""));
  CHECK(flykernels::last_decision() == (fly_last_decision() ? fly_last_decision() : ""));
}

TEST_CASE("flykernels.hpp: device_arch reports the device or why there is none", "[cpp]") {
  const char* c_arch = nullptr;
  const fly_status s = fly_device_arch(nullptr, &c_arch);
  if (s == FLY_SUCCESS) {
    CHECK(flykernels::device_arch() == c_arch);
  } else {
    try {
      flykernels::device_arch();
      FAIL("device_arch returned where the C entry failed");
    } catch (const flykernels::Error& e) {
      CHECK(e.status() == s);  // FLY_ERROR_NO_DEVICE on a machine without a GPU (CI)
    }
  }
}

TEST_CASE("flykernels.hpp: workspace queries answer as the C entries", "[cpp]") {
  // GEMM: bf16 NT 256 x 512 x 128 (row-major A, column-major B), C row-major.
  fly_tensor a = flykernels::tensor(fake_device_ptr(), FLY_BF16, {256, 128});
  fly_tensor b = flykernels::tensor(fake_device_ptr(), FLY_BF16, {128, 512}, {1, 128});
  fly_tensor c = flykernels::tensor(fake_device_ptr(), FLY_BF16, {256, 512});
  size_t c_bytes = 12345;
  REQUIRE(fly_gemm_workspace_size(&a, &b, &c, &c_bytes) == FLY_SUCCESS);
  CHECK(flykernels::gemm_workspace_size(a, b, c) == c_bytes);
  CHECK(c_bytes % 256 == 0);
  fly_tensor c_wrong = flykernels::tensor(fake_device_ptr(), FLY_BF16, {256, 511});  // N disagrees with B
  try {
    flykernels::gemm_workspace_size(a, b, c_wrong);
    FAIL("gemm_workspace_size accepted mismatched shapes");
  } catch (const flykernels::Error& e) {
    CHECK(e.status() == FLY_ERROR_INVALID_ARGUMENT);
  }

  // Scaled GEMM: MXFP8 32 x 4096 x 4096, BF16 out (0 bytes unless split-K variants are bundled).
  fly_tensor qa = flykernels::tensor(fake_device_ptr(), FLY_F8_E4M3, {32, 4096});
  fly_tensor qb = flykernels::tensor(fake_device_ptr(), FLY_F8_E4M3, {4096, 4096});
  fly_tensor qc = flykernels::tensor(fake_device_ptr(), FLY_BF16, {32, 4096});
  size_t s_bytes = 12345;
  REQUIRE(fly_scaled_gemm_workspace_size(&qa, &qb, &qc, &s_bytes) == FLY_SUCCESS);
  CHECK(flykernels::scaled_gemm_workspace_size(qa, qb, qc) == s_bytes);
  CHECK(s_bytes % 256 == 0);
  try {
    flykernels::scaled_gemm_workspace_size(qa, qb, c_wrong);  // c is not 32 x 4096
    FAIL("scaled_gemm_workspace_size accepted a mismatched c");
  } catch (const flykernels::Error& e) {
    CHECK(e.status() == FLY_ERROR_INVALID_ARGUMENT);
  }

  // TopK: fp32 [64, 50000], k = 100, both modes.
  fly_tensor x = flykernels::tensor(fake_device_ptr(), FLY_F32, {64, 50000});
  for (int det = 0; det <= 1; ++det) {
    size_t t_bytes = 12345;
    REQUIRE(fly_topk_workspace_size(&x, 100, 1, det, &t_bytes) == FLY_SUCCESS);
    CHECK(flykernels::topk_workspace_size(x, 100, true, det != 0) == t_bytes);
  }
  try {
    flykernels::topk_workspace_size(x, 0, true, false);  // k must be >= 1
    FAIL("topk_workspace_size accepted k = 0");
  } catch (const flykernels::Error& e) {
    CHECK(e.status() == FLY_ERROR_INVALID_ARGUMENT);
  }
}

TEST_CASE("flykernels.hpp: the attention workspace query answers as the C entry", "[cpp]") {
  // bf16 decode-like: 1 query row per head against 8192 keys (the shape key splits serve).
  fly_tensor q = flykernels::tensor(fake_device_ptr(), FLY_BF16, {2, 8, 1, 128});
  fly_tensor kv = flykernels::tensor(fake_device_ptr(), FLY_BF16, {2, 8, 8192, 128});
  fly_tensor o = q;
  fly_attention_fwd_params p{};
  p.struct_size = sizeof(p);
  p.q = &q;
  p.k = &kv;
  p.v = &kv;
  p.o = &o;
  size_t c_bytes = 12345;
  const fly_status s = fly_attention_fwd_workspace_size(&p, &c_bytes);
  if (s == FLY_SUCCESS) {
    CHECK(flykernels::attention_fwd_workspace_size(q, kv, kv, o) == c_bytes);
  } else {
    try {
      flykernels::attention_fwd_workspace_size(q, kv, kv, o);
      FAIL("the wrapper returned where the C entry failed");
    } catch (const flykernels::Error& e) {
      CHECK(e.status() == s);
    }
  }
  fly_tensor o_wrong = flykernels::tensor(fake_device_ptr(), FLY_BF16, {2, 8, 1, 64});  // D disagrees with q
  CHECK_THROWS_AS(flykernels::attention_fwd_workspace_size(q, kv, kv, o_wrong), flykernels::Error);
}
