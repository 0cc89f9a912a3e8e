// SPDX-License-Identifier: Apache-2.0
// fly_rms_norm_fwd on bad input: a status and a message naming the argument, never a crash.
// Runs without a GPU (validation happens before any device query).
#include <dlfcn.h>

#include <cstring>
#include <string>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"

namespace {

using fly_test::mat;
using fly_test::vec;
using fly_test::mentions;

// Fake, well-aligned addresses: validation must reject before anything touches them.
void* const kX = reinterpret_cast<void*>(0x10000);
void* const kY = reinterpret_cast<void*>(0x20000);
void* const kW = reinterpret_cast<void*>(0x30000);
void* const kR = reinterpret_cast<void*>(0x40000);


}  // namespace

TEST_CASE("rms_norm rejects bad descriptors with a status and a message", "[rmsnorm][args]") {
  fly_tensor x = mat(kX, FLY_BF16, 8, 64, 64), y = mat(kY, FLY_BF16, 8, 64, 64);
  fly_tensor w = vec(kW, FLY_BF16, 64), r = vec(kR, FLY_F32, 8);

  SECTION("null descriptors") {
    CHECK(fly_rms_norm_fwd(nullptr, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x"));
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, nullptr, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("y"));
  }
  SECTION("null data pointers") {
    x.data = nullptr;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("x: data pointer is NULL"));
    x.data = kX;
    w.data = nullptr;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("weight"));
  }
  SECTION("dtypes") {
    x.dtype = FLY_F64;
    y.dtype = FLY_F64;
    CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("fp64"));
    x.dtype = static_cast<fly_dtype>(99);
    CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("invalid dtype"));
    x.dtype = FLY_BF16;
    y.dtype = FLY_F16;
    CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("y: dtype"));
    y.dtype = FLY_BF16;
    w.dtype = FLY_F32;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("weight: dtype"));
    w.dtype = FLY_BF16;
    r.dtype = FLY_BF16;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("rstd: dtype"));
  }
  SECTION("shapes and ranks") {
    x.rank = 3;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("rank"));
    x.rank = 2;
    y.sizes[1] = 63;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("y: shape"));
    y.sizes[1] = 64;
    w.sizes[0] = 65;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("weight: expected 64"));
    w.sizes[0] = 64;
    r.sizes[0] = 7;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("rstd"));
    r.sizes[0] = 8;
    x.sizes[0] = -1;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("negative"));
  }
  SECTION("strides") {
    x.strides[1] = 2;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("x: inner stride"));
    x.strides[1] = 1;
    y.strides[0] = 32;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("rows overlap"));
    y.strides[0] = 64;
    w.strides[0] = 2;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("weight: stride"));
  }
  SECTION("misaligned pointers") {
    x.data = reinterpret_cast<char*>(kX) + 1;  // not even element-aligned
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_MISALIGNED);
    CHECK(mentions("x: data pointer"));
    x.data = kX;
    r.data = reinterpret_cast<char*>(kR) + 2;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_MISALIGNED);
    CHECK(mentions("rstd"));
  }
  SECTION("overflowing sizes") {
    x.sizes[0] = int64_t(1) << 40;
    x.strides[0] = int64_t(1) << 20;
    CHECK(fly_rms_norm_fwd(&x, &w, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("overflow"));
  }
  SECTION("eps") {
    CHECK(fly_rms_norm_fwd(&x, &w, -1.0, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("eps"));
    CHECK(fly_rms_norm_fwd(&x, &w, 0.0 / 0.0, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  }
  SECTION("empty rows") {
    x.sizes[1] = y.sizes[1] = 0;
    CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, &r, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("N = 0"));
  }
}

TEST_CASE("rms_norm with M = 0 is a successful no-op, even with null data", "[rmsnorm][args]") {
  fly_tensor x = mat(nullptr, FLY_F32, 0, 4096, 4096), y = mat(nullptr, FLY_F32, 0, 4096, 4096);
  fly_tensor r = vec(nullptr, FLY_F32, 0);
  CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, &r, nullptr) == FLY_SUCCESS);
}

TEST_CASE("valid input reaches the device check", "[rmsnorm][device]") {
  fly_tensor x = mat(kX, FLY_BF16, 8, 64, 64), y = mat(kY, FLY_BF16, 8, 64, 64);
  const char* arch = nullptr;
  fly_status dev = fly_device_arch(nullptr, &arch);
  fly_status s = fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, nullptr);
  if (dev == FLY_ERROR_NO_DEVICE) {
    // CI: no GPU. The library loaded and says so.
    CHECK(s == FLY_ERROR_NO_DEVICE);
    CHECK(std::string(fly_get_last_error()).find("CUDA") != std::string::npos);
  } else {
    // GPU machine: the fake pointer is caught before any launch.
    CHECK(s == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("not device memory"));
  }
}

TEST_CASE("libflykernels.so loads with dlopen and exports only the C ABI", "[library]") {
  void* lib = dlopen(FLY_SO_PATH, RTLD_NOW | RTLD_LOCAL);
  INFO(dlerror());
  REQUIRE(lib);
  auto version = reinterpret_cast<const char* (*)()>(dlsym(lib, "fly_version_string"));
  auto count = reinterpret_cast<int (*)()>(dlsym(lib, "fly_variant_count"));
  REQUIRE(version);
  REQUIRE(count);
  CHECK(std::string(version()) == "0.1.0");
  CHECK(count() > 0);
  CHECK(dlsym(lib, "fly_embedded_archive_begin") == nullptr);  // internal symbols stay hidden
  CHECK(dlsym(lib, "_ZN3fly6driverEPPKNS_6DriverE") == nullptr);
  // Dependencies (SQLite, zstd) are linked, not re-exported: their symbols resolve elsewhere.
  void* sq = dlsym(lib, "sqlite3_open");
  Dl_info info{};
  if (sq && dladdr(sq, &info)) CHECK(std::string(info.dli_fname).find("libflykernels") == std::string::npos);
  dlclose(lib);
}

TEST_CASE("status strings and version", "[api]") {
  CHECK(std::string(fly_status_string(FLY_ERROR_UNSUPPORTED)) == "FLY_ERROR_UNSUPPORTED");
  CHECK(std::string(fly_status_string(static_cast<fly_status>(1234))) == "FLY_ERROR_UNKNOWN_STATUS");
  int a = -1, b = -1, c = -1;
  fly_version(&a, &b, &c);
  CHECK(a == FLY_VERSION_MAJOR);
  CHECK(b == FLY_VERSION_MINOR);
  CHECK(c == FLY_VERSION_PATCH);
  fly_version(nullptr, nullptr, nullptr);
}
