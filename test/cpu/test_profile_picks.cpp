// SPDX-License-Identifier: Apache-2.0
// The GEMM profile vote's picks over the shipped profile rows (db/sm_90a_gemm_profile.sql) on a
// fixed set of off-key shapes, against test/cpu/data/gemm_profile_picks.tsv: the picks the vote
// made before profile rows had a table of their own. Runs without cubins (profile_pick takes the
// registry's place with a predicate on names). FLY_WRITE_PROFILE_PICKS=FILE writes the picks.
#include <sqlite3.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "core.hpp"
#include "dispatch.hpp"
#include "tuning_db.hpp"

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A database file from `sql` (the caller includes the schema where it wants one).
struct SqlFile {
  std::string path;
  explicit SqlFile(const std::string& sql) {
    char tmpl[] = "/tmp/flypicks_XXXXXX";
    int fd = mkstemp(tmpl);
    close(fd);
    path = tmpl;
    std::remove(path.c_str());
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    char* err = nullptr;
    int rc = sqlite3_exec(db, ("BEGIN;" + sql + "\nCOMMIT;").c_str(), nullptr, nullptr, &err);
    INFO((err ? err : ""));
    sqlite3_free(err);
    sqlite3_close(db);
    REQUIRE(rc == SQLITE_OK);
  }
  ~SqlFile() { std::remove(path.c_str()); }
};

struct Shape {
  std::string layout;
  int64_t n, k, m;
};

// 400 shapes, log-uniform: N, K in [64, 65536], M in [1, 16384], the four layouts (fixed LCG).
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return double(x >> 11) / double(1ull << 53);
  };
  auto pow2 = [](double e) { return int64_t(std::exp2(e) + 0.5); };
  const char* layouts[] = {"nn", "nt", "tn", "tt"};
  for (int i = 0; i < 400; ++i) {
    Shape s;
    s.layout = layouts[i % 4];
    s.n = pow2(6 + 10 * next());
    s.k = pow2(6 + 10 * next());
    s.m = pow2(14 * next());
    out.push_back(s);
  }
  return out;
}

// Picks "layout N K M all-variants no-split-K" per shape, one line each, as gemm.cpp asks for a
// BF16 call (names mapped to bf16), over the profile rows of `db`.
std::string picks(const fly::TuningDb& db, const std::string& profile_op) {
  std::string out;
  for (const Shape& s : shapes()) {
    fly::DispatchRequest req =
        fly::make_request("gemm", "gemm", "bf16", s.layout.c_str(), {{"N", s.n}, {"K", s.k}, {"M", s.m}});
    req.profile_op = profile_op;
    req.profile_name = [](const std::string& name) {
      const size_t at = name.find("_fp16_");
      return at == std::string::npos ? name : name.substr(0, at) + "_bf16_" + name.substr(at + 6);
    };
    const std::string all = fly::profile_pick({&db}, "sm_90a", req, [](const std::string&) { return true; });
    // A call that rules variants out (here the split-K ones) takes the best of the rest.
    const std::string no_kb = fly::profile_pick({&db}, "sm_90a", req, [](const std::string& n) {
      return n.find("_kb") == std::string::npos;
    });
    out += s.layout + "\t" + std::to_string(s.n) + "\t" + std::to_string(s.k) + "\t" + std::to_string(s.m) + "\t" +
           all + "\t" + no_kb + "\n";
  }
  return out;
}

}  // namespace

TEST_CASE("gemm profile vote: the shipped rows pick as recorded", "[db][profile]") {
  const std::string src = FLY_SOURCE_DIR;
  SqlFile f(slurp(src + "/db/schema.sql") + slurp(src + "/db/sm_90a_gemm_profile.sql"));
  fly::TuningDb db;
  REQUIRE(db.load_file(f.path) == FLY_SUCCESS);
  const std::string got = picks(db, "gemm_profile");
  if (const char* w = std::getenv("FLY_WRITE_PROFILE_PICKS")) std::ofstream(w) << got;
  const std::string want = slurp(src + "/test/cpu/data/gemm_profile_picks.tsv");
  REQUIRE(!want.empty());
  std::istringstream g(got), e(want);
  int lines = 0;
  for (std::string a, b; std::getline(e, b);) {
    REQUIRE(std::getline(g, a));
    INFO("line " << lines + 1);
    CHECK(a == b);
    ++lines;
  }
  CHECK(lines == 400);
}
