// SPDX-License-Identifier: Apache-2.0
// Kernel archive: round trip, corruption detection, and the embedded archive's registry.
#include <cstring>
#include <string>

#include "archive.hpp"
#include "catch_compat.hpp"
#include "core.hpp"

namespace {
std::vector<fly::ArchiveInput> sample_inputs() {
  std::vector<fly::ArchiveInput> in(3);
  for (int i = 0; i < 3; ++i) {
    in[i].name = "v" + std::to_string(i);
    in[i].family = i == 2 ? "topk" : "rmsnorm";
    in[i].params = "a=" + std::to_string(i) + ";b=x";
    for (int k = 0; k < 5000 + 1000 * i; ++k) in[i].image.push_back(uint8_t((k * 7 + i) % 251));
  }
  return in;
}
}  // namespace

TEST_CASE("archive round trip restores every image, name, family and params", "[archive]") {
  auto in = sample_inputs();
  std::vector<uint8_t> ar = fly::build_archive(in, 3);
  fly::Archive a;
  std::string err;
  REQUIRE(a.open(ar.data(), ar.size(), &err));
  REQUIRE(a.entries().size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(a.entries()[i].name == in[i].name);
    CHECK(a.entries()[i].family == in[i].family);
    CHECK(a.entries()[i].params == in[i].params);
    std::vector<uint8_t> out;
    REQUIRE(a.extract(i, &out, &err));
    CHECK(out == in[i].image);
  }
  CHECK(ar.size() < 5000 + 6000 + 7000);  // compressed
}

TEST_CASE("a corrupted entry is detected and the others still load", "[archive]") {
  auto in = sample_inputs();
  std::vector<uint8_t> ar = fly::build_archive(in, 3);
  fly::Archive probe;
  std::string err;
  REQUIRE(probe.open(ar.data(), ar.size(), &err));
  const auto e1 = probe.entries()[1];
  ar[size_t(e1.offset + e1.compressed_size / 2)] ^= 0x5a;
  fly::Archive a;
  REQUIRE(a.open(ar.data(), ar.size(), &err));  // the directory is intact
  std::vector<uint8_t> out;
  REQUIRE_FALSE(a.extract(1, &out, &err));
  CHECK(err.find("v1") != std::string::npos);
  CHECK((err.find("corrupt") != std::string::npos || err.find("checksum") != std::string::npos));
  CHECK(a.extract(0, &out, &err));
  CHECK(a.extract(2, &out, &err));
  CHECK_FALSE(a.extract(7, &out, &err));
}

TEST_CASE("malformed archives are rejected with a message", "[archive]") {
  auto ar = fly::build_archive(sample_inputs(), 3);
  fly::Archive a;
  std::string err;
  SECTION("bad magic") {
    ar[0] = 'X';
    CHECK_FALSE(a.open(ar.data(), ar.size(), &err));
    CHECK(err.find("magic") != std::string::npos);
  }
  SECTION("truncated") {
    CHECK_FALSE(a.open(ar.data(), 20, &err));
    CHECK_FALSE(a.open(ar.data(), ar.size() - 10, &err));
  }
  SECTION("directory damaged") {
    ar[ar.size() - 3] ^= 1;
    CHECK_FALSE(a.open(ar.data(), ar.size(), &err));
    CHECK(err.find("directory") != std::string::npos);
  }
  SECTION("null") { CHECK_FALSE(a.open(nullptr, 0, &err)); }
}

TEST_CASE("the embedded archive lists variants with families and parameters", "[archive][registry]") {
  const auto& vs = fly::all_variants();
  REQUIRE(!vs.empty());
  for (auto& v : vs) {
    INFO(v.name);
    CHECK(!v.family.empty());
    CHECK(v.name.rfind(v.family, 0) == 0);  // canonical names start with the family
    CHECK(!v.kv.empty());
    CHECK(fly::find_variant(v.name) == &v);
  }
  CHECK(fly::find_variant("no_such_variant") == nullptr);
  CHECK(fly_variant_count() == int(vs.size()));
  CHECK(fly_variant_name(-1) == nullptr);
  CHECK(fly_variant_name(fly_variant_count()) == nullptr);
  const char* fam = nullptr;
  const char* params = nullptr;
  CHECK(fly_variant_info(vs[0].name.c_str(), &fam, &params) == FLY_SUCCESS);
  CHECK(std::string(fam) == vs[0].family);
  CHECK(fly_variant_info("nope", &fam, &params) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(fly_variant_info(nullptr, &fam, &params) == FLY_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("identical images are stored once and extract under every name", "[archive]") {
  auto in = sample_inputs();
  fly::ArchiveInput alias = in[1];
  alias.name = "v1_alias";
  alias.params = "a=1;b=x;split=4";
  in.push_back(alias);
  std::vector<uint8_t> with_alias = fly::build_archive(in, 3);
  in.pop_back();
  std::vector<uint8_t> without = fly::build_archive(in, 3);
  CHECK(with_alias.size() < without.size() + 200);  // a directory entry, not another payload
  fly::Archive a;
  std::string err;
  REQUIRE(a.open(with_alias.data(), with_alias.size(), &err));
  REQUIRE(a.entries().size() == 4);
  CHECK(a.entries()[3].name == "v1_alias");
  CHECK(a.entries()[3].params == "a=1;b=x;split=4");
  CHECK(a.entries()[3].offset == a.entries()[1].offset);
  std::vector<uint8_t> img1, img3;
  REQUIRE(a.extract(1, &img1, &err));
  REQUIRE(a.extract(3, &img3, &err));
  CHECK(img1 == img3);
  CHECK(img3 == alias.image);
}
