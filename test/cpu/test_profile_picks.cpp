// SPDX-License-Identifier: Apache-2.0
// The GEMM profile vote's picks over the shipped profile rows (db/sm_90a_gemm_profile.sql) on a
// fixed set of off-key shapes, against test/cpu/data/gemm_profile_picks.tsv: the picks the vote
// made when profile rows still lived in the tuning table (schema version 2, recorded before the
// profile table). The same rows written back in the version 2 format pick the same. Runs without
// cubins (profile_pick takes the registry's place with a predicate on names).
// FLY_WRITE_PROFILE_PICKS=FILE writes the picks.
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

// `got` line by line against the recorded picks.
void check_picks(const std::string& got) {
  const std::string want = slurp(std::string(FLY_SOURCE_DIR) + "/test/cpu/data/gemm_profile_picks.tsv");
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

// The profile rows of `db` as a schema version 2 file writes them: tuning rows of op
// "<op>_profile", k3 numbering a shape's variants, time_us the ratio.
std::string as_v2(const fly::TuningDb& db) {
  std::string sql =
      "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
      "INSERT INTO meta VALUES ('schema_version', '2');"
      "CREATE TABLE tuning (arch TEXT NOT NULL, op TEXT NOT NULL, dtype TEXT NOT NULL, layout TEXT NOT NULL,"
      " k0 INTEGER NOT NULL, k1 INTEGER NOT NULL, k2 INTEGER NOT NULL, k3 INTEGER NOT NULL DEFAULT 0,"
      " variant TEXT NOT NULL, time_us REAL, runner_up TEXT, runner_up_us REAL, gpu TEXT, tuned_at TEXT,"
      " PRIMARY KEY (arch, op, dtype, layout, k0, k1, k2, k3));\n";
  std::string shape;
  int slot = 0;
  char rel[32];
  for (const fly::ProfileRow& p : db.profile_rows()) {
    const std::string s = p.arch + "','" + p.op + "_profile','" + p.dtype + "','" + p.layout + "'," +
                          std::to_string(p.k[0]) + "," + std::to_string(p.k[1]) + "," + std::to_string(p.k[2]);
    slot = s == shape ? slot + 1 : 0;
    shape = s;
    std::snprintf(rel, sizeof rel, "%.17g", p.rel_time);
    sql += "INSERT INTO tuning VALUES ('" + s + "," + std::to_string(slot) + ",'" + p.variant + "'," + rel +
           ",'',0,'g','d');\n";
  }
  return sql;
}

}  // namespace

TEST_CASE("gemm profile vote: the shipped rows pick as recorded, from either schema version", "[db][profile]") {
  const std::string src = FLY_SOURCE_DIR;
  SqlFile f(slurp(src + "/db/schema.sql") + slurp(src + "/db/sm_90a_gemm_profile.sql"));
  fly::TuningDb db;
  REQUIRE(db.load_file(f.path) == FLY_SUCCESS);
  CHECK(db.rows().empty());
  CHECK(db.profile_rows().size() == 4631);
  const std::string got = picks(db, "gemm");
  if (const char* w = std::getenv("FLY_WRITE_PROFILE_PICKS")) std::ofstream(w) << got;
  check_picks(got);

  SqlFile old(as_v2(db));
  fly::TuningDb v2;
  REQUIRE(v2.load_file(old.path) == FLY_SUCCESS);
  CHECK(v2.rows().empty());
  REQUIRE(v2.profile_rows().size() == db.profile_rows().size());
  check_picks(picks(v2, "gemm"));
}
