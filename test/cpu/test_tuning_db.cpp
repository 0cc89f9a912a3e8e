// SPDX-License-Identifier: Apache-2.0
// Tuning database: schema, exact lookup, nearest bucket, fallback, overlay, broken databases.
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "catch_compat.hpp"
#include "core.hpp"
#include "dump_key.hpp"
#include "schema_migrate.hpp"
#include "dispatch.hpp"
#include "tuning_db.hpp"

namespace {

std::string read_schema() {
  std::ifstream in(std::string(FLY_SOURCE_DIR) + "/db/schema.sql");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A temporary database file built from the real schema plus `sql`.
struct TempDb {
  std::string path;
  explicit TempDb(const std::string& sql, bool with_schema = true) {
    char tmpl[] = "/tmp/flydb_XXXXXX";
    int fd = mkstemp(tmpl);
    close(fd);
    path = tmpl;
    std::remove(path.c_str());
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    std::string all = (with_schema ? read_schema() : std::string()) + sql;
    char* err = nullptr;
    int rc = sqlite3_exec(db, all.c_str(), nullptr, nullptr, &err);
    INFO((err ? err : ""));
    sqlite3_free(err);
    sqlite3_close(db);
    REQUIRE(rc == SQLITE_OK);
  }
  ~TempDb() { std::remove(path.c_str()); }
};

std::string row(const std::string& op, const std::string& dt, int64_t k0, int64_t k1, int64_t k2,
                const std::string& variant, int64_t k3 = 0) {
  return "INSERT INTO tuning VALUES ('sm_90a','" + op + "','" + dt + "','row'," + std::to_string(k0) + "," +
         std::to_string(k1) + "," + std::to_string(k2) + "," + std::to_string(k3) + ",'" + variant +
         "',1.0,'',0,'test','2026-01-01');";
}

fly::DispatchKey key(int64_t n, int64_t m) {
  fly::DispatchKey k;
  k.op = "rmsnorm_fwd";
  k.dtype = "bf16";
  k.layout = "row";
  k.k[0] = n;
  k.k[1] = m;
  return k;
}

// A bundled rmsnorm bf16 variant other than `not_this`, or "" when the build has none.
std::string some_bf16_variant(const std::string& not_this = "") {
  for (auto* v : fly::variants_of("rmsnorm"))
    if (v->get("dtype") == "bf16" && v->name != not_this) return v->name;
  return "";
}

// Two distinct bundled rmsnorm bf16 variants for the dispatch tests, and an sm_90a device
// context; false (with a visible skip) when the build has fewer than two.
bool dispatch_setup(std::string* a, std::string* b, fly::DeviceCtx* dc) {
  *a = some_bf16_variant();
  *b = some_bf16_variant(*a);
  if (a->empty() || b->empty()) {
    WARN("SKIPPED: this build has fewer than two rmsnorm bf16 variants");
    return false;
  }
  dc->arch = "sm_90a";
  return true;
}

}  // namespace

TEST_CASE("database schema loads and exact lookups hit", "[db]") {
  TempDb t(row("rmsnorm_fwd", "bf16", 4096, 8192, 0, "A") + row("rmsnorm_fwd", "bf16", 1024, 8192, 0, "B") +
           row("rmsnorm_fwd", "fp16", 4096, 8192, 0, "C"));
  fly::TuningDb db;
  REQUIRE(db.load_file(t.path) == FLY_SUCCESS);
  CHECK(db.rows().size() == 3);
  const fly::TuningRow* r = db.exact("sm_90a", key(4096, 8192));
  REQUIRE(r);
  CHECK(r->variant == "A");
  CHECK(db.exact("sm_90a", key(4096, 8191)) == nullptr);
  CHECK(db.exact("sm_80", key(4096, 8192)) == nullptr);
}

TEST_CASE("nearest bucket orders rows by weighted log2 distance, N first", "[db]") {
  TempDb t(row("rmsnorm_fwd", "bf16", 4096, 64, 0, "N4096_M64") + row("rmsnorm_fwd", "bf16", 1024, 8192, 0, "N1024_M8192") +
           row("rmsnorm_fwd", "bf16", 65536, 8192, 0, "N65536") + row("rmsnorm_fwd", "fp16", 4097, 8192, 0, "other_dtype"));
  fly::TuningDb db;
  REQUIRE(db.load_file(t.path) == FLY_SUCCESS);
  auto near = db.nearest("sm_90a", key(4097, 8192));
  REQUIRE(near.size() == 3);  // the fp16 row is another group
  // N=4096 is 0.0004 octaves away (x4) + M 7 octaves (x2) = 14; N=1024: 2 octaves x4 = 8.
  CHECK(near[0]->variant == "N1024_M8192");
  CHECK(near[1]->variant == "N4096_M64");
  CHECK(near[2]->variant == "N65536");
  int64_t a[fly::kKeyDims] = {4096, 8192, 0, 0}, b[fly::kKeyDims] = {8192, 8192, 0, 0};
  int64_t c[fly::kKeyDims] = {4096, 16384, 0, 0}, d[fly::kKeyDims] = {4096, 8192, 0, 32};
  CHECK(fly::key_distance(a, a) == 0.0);
  CHECK(fly::key_distance(a, b) == 4.0);
  CHECK(fly::key_distance(a, c) == 2.0);
  CHECK(fly::key_distance(a, d) == 5.0);  // k3: 5 octaves, weight 1
}

TEST_CASE("the fourth key dimension: exact matches need it, nearest rows weigh it", "[db]") {
  TempDb t(row("grouped_gemm", "bf16", 4096, 4096, 512, "G8", 8) + row("grouped_gemm", "bf16", 4096, 4096, 512, "G64", 64));
  fly::TuningDb db;
  REQUIRE(db.load_file(t.path) == FLY_SUCCESS);
  fly::DispatchKey k = key(4096, 4096);
  k.op = "grouped_gemm";
  k.k[2] = 512;
  k.k[3] = 64;
  REQUIRE(db.exact("sm_90a", k) != nullptr);
  CHECK(db.exact("sm_90a", k)->variant == "G64");
  k.k[3] = 16;  // no row of its own: nearest is G8 (1 octave) before G64 (2)
  CHECK(db.exact("sm_90a", k) == nullptr);
  auto near = db.nearest("sm_90a", k);
  REQUIRE(near.size() == 2);
  CHECK(near[0]->variant == "G8");
}

TEST_CASE("a schema version 1 database (no k3) still loads, as k3 = 0", "[db]") {
  TempDb t("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
           "INSERT INTO meta VALUES ('schema_version', '1');"
           "CREATE TABLE tuning (arch TEXT, op TEXT, dtype TEXT, layout TEXT, k0 INTEGER, k1 INTEGER, k2 INTEGER,"
           " variant TEXT, time_us REAL, runner_up TEXT, runner_up_us REAL, gpu TEXT, tuned_at TEXT);"
           "INSERT INTO tuning VALUES ('sm_90a','rmsnorm_fwd','bf16','row',4096,64,0,'old',1.0,'',0,'g','d');",
           false);
  fly::TuningDb db;
  REQUIRE(db.load_file(t.path) == FLY_SUCCESS);
  REQUIRE(db.rows().size() == 1);
  CHECK(db.rows()[0].variant == "old");
  CHECK(db.rows()[0].k[3] == 0);
  CHECK(db.exact("sm_90a", key(4096, 64)) != nullptr);
}

TEST_CASE("the runner-up is read where the table has it; a table without the column still loads", "[db]") {
  TempDb with("INSERT INTO tuning VALUES ('sm_90a','rmsnorm_fwd','bf16','row',4096,64,0,0,'best',1.0,'second',1.5,"
              "'g','d');");
  fly::TuningDb a;
  REQUIRE(a.load_file(with.path) == FLY_SUCCESS);
  REQUIRE(a.rows().size() == 1);
  CHECK(a.rows()[0].variant == "best");
  CHECK(a.rows()[0].runner_up == "second");
  TempDb without("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                 "INSERT INTO meta VALUES ('schema_version', '2');"
                 "CREATE TABLE tuning (arch TEXT, op TEXT, dtype TEXT, layout TEXT, k0 INTEGER, k1 INTEGER, k2 INTEGER,"
                 " k3 INTEGER, variant TEXT, time_us REAL);"
                 "INSERT INTO tuning VALUES ('sm_90a','rmsnorm_fwd','bf16','row',4096,64,0,0,'only',1.0);",
                 false);
  fly::TuningDb b;
  REQUIRE(b.load_file(without.path) == FLY_SUCCESS);
  REQUIRE(b.rows().size() == 1);
  CHECK(b.rows()[0].variant == "only");
  CHECK(b.rows()[0].runner_up.empty());
}

TEST_CASE("broken databases are reported, not used", "[db]") {
  fly::TuningDb db;
  SECTION("missing file") {
    CHECK(db.load_file("/nonexistent/dir/x.sqlite") == FLY_ERROR_DATABASE);
    CHECK(std::string(fly_get_last_error()).find("/nonexistent/dir/x.sqlite") != std::string::npos);
  }
  SECTION("not a database") {
    char tmpl[] = "/tmp/flygarbage_XXXXXX";
    int fd = mkstemp(tmpl);
    REQUIRE(write(fd, "this is not sqlite, just text that is long enough to be a header..........", 70) == 70);
    close(fd);
    CHECK(db.load_file(tmpl) == FLY_ERROR_DATABASE);
    std::remove(tmpl);
  }
  SECTION("wrong schema version") {
    TempDb t("UPDATE meta SET value = '99' WHERE key = 'schema_version';");
    CHECK(db.load_file(t.path) == FLY_ERROR_DATABASE);
    CHECK(std::string(fly_get_last_error()).find("schema version") != std::string::npos);
  }
  SECTION("no meta table") {
    TempDb t("CREATE TABLE foo (a INT);", false);
    CHECK(db.load_file(t.path) == FLY_ERROR_DATABASE);
  }
  SECTION("garbage image") {
    const uint8_t junk[64] = {1, 2, 3};
    CHECK(db.load_image(junk, sizeof junk, "junk") == FLY_ERROR_DATABASE);
  }
  SECTION("overlay API rejects a bad file and keeps working") {
    CHECK(fly_set_tuning_db("/nonexistent.sqlite") == FLY_ERROR_DATABASE);
    CHECK(fly_set_tuning_db(nullptr) == FLY_SUCCESS);
  }
}

TEST_CASE("every variant named in the shipped dumps is bundled (for the families built)", "[db][registry]") {
  std::stringstream ss;
  for (const char* dump : {"/db/sm_90a.sql", "/db/sm_90a_gemm_profile.sql"}) {
    std::ifstream in(std::string(FLY_SOURCE_DIR) + dump);
    REQUIRE(in.good());
    ss << in.rdbuf();
  }
  TempDb t("BEGIN;" + ss.str() + "COMMIT;");  // one transaction: one fsync, not one per row
  fly::TuningDb db;
  REQUIRE(db.load_file(t.path) == FLY_SUCCESS);
  const std::pair<const char*, const char*> op_family[] = {{"rmsnorm_fwd", "rmsnorm"}, {"topk", "topk"}, {"gemm", "gemm"},
                                                           {"attention_fwd", "attention"}, {"attention_bwd", "attention_bwd"},
                                                           {"grouped_gemm", "grouped_gemm"},
                                                           {"scaled_gemm", "mxfp"}, {"add_rmsnorm_fwd", "add_rmsnorm"},
                                                           {"add_rmsnorm_bwd", "add_rmsnorm"}, {"scaled_gemm_wo", "mx_decode"}};
  auto check = [&](const std::string& op, const std::string& variant) {
    const char* family = nullptr;
    for (auto& of : op_family) if (op == of.first) family = of.second;
    INFO(op << " " << variant);
    REQUIRE(family);
    if (fly::variants_of(family).empty()) return;  // family filtered out of this build
    const fly::Variant* v = fly::find_variant(variant);
    REQUIRE(v);
    CHECK(v->family == family);
  };
  for (auto& r : db.rows()) check(r.op, r.variant);
  REQUIRE(!db.profile_rows().empty());
  for (auto& p : db.profile_rows()) check(p.op, p.variant);
}

TEST_CASE("dispatch: forced, overlay exact, nearest, default", "[dispatch]") {
  std::string a, b;
  fly::DeviceCtx dc;
  if (!dispatch_setup(&a, &b, &dc)) return;
  fly::DispatchRequest req;
  req.family = "rmsnorm";
  req.key = key(3000, 777);
  req.supports = [](const fly::Variant& v) { return v.get("dtype") == "bf16"; };
  req.fallback = [&] { return b; };
  const fly::Variant* v = nullptr;

  TempDb t(row("rmsnorm_fwd", "bf16", 3000, 777, 0, a) + row("rmsnorm_fwd", "bf16", 100000, 1, 0, b) +
           row("rmsnorm_fwd", "bf16", 5000, 777, 0, "not_bundled_variant"));
  REQUIRE(fly_set_tuning_db(t.path.c_str()) == FLY_SUCCESS);

  SECTION("overlay exact") {
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == a);
    CHECK(std::string(fly_last_decision()) == "overlay:exact");
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);  // cached, same answer
    CHECK(v->name == a);
  }
  SECTION("nearest skips rows whose variant is not bundled") {
    req.key = key(4900, 777);  // nearest row names a variant this build lacks; next is `a`
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == a);
    CHECK(std::string(fly_last_decision()) == "overlay:nearest");
    // The key the dispatch computed (not the row it matched), for tools that write rows.
    const char *op = nullptr, *dtype = nullptr, *layout = nullptr;
    int64_t k[4] = {-1, -1, -1, -1};
    fly_last_key(&op, &dtype, &layout, k);
    CHECK(std::string(op) == "rmsnorm_fwd");
    CHECK(std::string(dtype) == "bf16");
    CHECK(std::string(layout) == "row");
    CHECK((k[0] == 4900 && k[1] == 777 && k[2] == 0 && k[3] == 0));
    fly_last_key(nullptr, nullptr, nullptr, nullptr);  // every output optional
  }
  SECTION("rows the family cannot run fall through to the default") {
    req.key.dtype = "fp16";  // no fp16 rows in the overlay
    req.supports = [&](const fly::Variant& x) { return x.name == b; };
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == b);
  }
  SECTION("default not bundled is an error, not a crash") {
    req.key = key(12345, 1);
    req.supports = [](const fly::Variant&) { return false; };
    req.fallback = [] { return std::string("missing_default"); };
    CHECK(fly::choose_variant(dc, req, &v) == FLY_ERROR_KERNEL_IMAGE);
    CHECK(std::string(fly_get_last_error()).find("missing_default") != std::string::npos);
  }
  SECTION("forced variant wins, unknown names are refused") {
    REQUIRE(fly_force_variant(b.c_str()) == FLY_SUCCESS);
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == b);
    CHECK(std::string(fly_last_decision()) == "forced");
    req.supports = [&](const fly::Variant& x) { return x.name != b; };
    CHECK(fly::choose_variant(dc, req, &v) == FLY_ERROR_UNSUPPORTED);
    CHECK(fly_force_variant("no_such_variant") == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(fly_force_variant(nullptr) == FLY_SUCCESS);
  }
  SECTION("clearing the overlay returns to the embedded database / default") {
    REQUIRE(fly_set_tuning_db(nullptr) == FLY_SUCCESS);
    req.key = key(3000, 777);
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(std::string(fly_last_decision()) != "overlay:exact");
  }
  fly_force_variant(nullptr);
  fly_set_tuning_db(nullptr);
}

TEST_CASE("dispatch: a winner that fails `prefer` yields to its row's runner-up, a forced one does not", "[dispatch]") {
  std::string a, b;
  fly::DeviceCtx dc;
  if (!dispatch_setup(&a, &b, &dc)) return;
  fly::DispatchRequest req;
  req.family = "rmsnorm";
  req.key = key(3000, 777);
  req.fallback = [&] { return b; };
  const fly::Variant* v = nullptr;
  const std::string with_runner_up = "INSERT INTO tuning VALUES ('sm_90a','rmsnorm_fwd','bf16','row',3000,777,0,0,'" + a +
                                     "',1.0,'" + b + "',2.0,'test','2026-01-01');";
  TempDb t(with_runner_up + row("rmsnorm_fwd", "bf16", 6000, 777, 0, a));
  REQUIRE(fly_set_tuning_db(t.path.c_str()) == FLY_SUCCESS);
  SECTION("preferred: the winner") {
    req.prefer = [](const fly::Variant&) { return true; };
    req.cache_tag = "prefer all";
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == a);
    CHECK(std::string(fly_last_decision()) == "overlay:exact");
  }
  SECTION("not preferred: the runner-up, exact and nearest") {
    req.prefer = [&](const fly::Variant& x) { return x.name != a; };
    req.cache_tag = "prefer not a";
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == b);
    CHECK(std::string(fly_last_decision()) == "overlay:exact:runner-up");
    req.key = key(3100, 777);  // nearest row: the same one
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == b);
    CHECK(std::string(fly_last_decision()) == "overlay:nearest:runner-up");
    req.key = key(6000, 777);  // a row without a runner-up: its winner still (it can run the call)
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == a);
    CHECK(std::string(fly_last_decision()) == "overlay:exact");
  }
  SECTION("a forced variant ignores prefer") {
    req.prefer = [](const fly::Variant&) { return false; };
    req.cache_tag = "prefer none";
    REQUIRE(fly_force_variant(a.c_str()) == FLY_SUCCESS);
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == a);
    CHECK(std::string(fly_last_decision()) == "forced");
    fly_force_variant(nullptr);
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);  // neither preferred: the winner
    CHECK(v->name == a);
  }
  fly_set_tuning_db(nullptr);
}

TEST_CASE("dispatch: off the tuned keys the profiled shapes vote; exact rows still win", "[dispatch]") {
  std::string a, b;
  fly::DeviceCtx dc;
  if (!dispatch_setup(&a, &b, &dc)) return;
  fly::DispatchRequest req;
  req.family = "rmsnorm";
  req.key = key(3000, 777);
  req.fallback = [&] { return a; };
  req.profile_op = "rmsnorm_fwd";
  const fly::Variant* v = nullptr;
  // A profile row: (N, M) shape, (slot: unused since schema version 3), variant, time over that
  // shape's best.
  auto prof = [](int64_t n, int64_t m, int, const std::string& variant, double rel, const std::string& layout = "row") {
    return "INSERT INTO profile VALUES ('sm_90a','rmsnorm_fwd','bf16','" + layout + "'," + std::to_string(n) + "," +
           std::to_string(m) + ",0,'" + variant + "'," + std::to_string(rel) + ",'test','2026-01-01');";
  };
  // Five shapes around (3000, 777): `a` is best on the nearest one, `b` on the four others and close
  // behind on the first, so the vote takes `b`; the tuning row nearest the key names `a`. A sixth,
  // far shape where only `a` is listed does not vote (five neighbours).
  std::string sql = row("rmsnorm_fwd", "bf16", 3100, 800, 0, a) + prof(3000, 760, 0, a, 1.0) + prof(3000, 760, 1, b, 1.05);
  const int64_t ns[] = {2800, 3300, 2600, 3600};
  for (int i = 0; i < 4; ++i) sql += prof(ns[i], 777, 0, b, 1.0) + prof(ns[i], 777, 1, a, 1.25);
  sql += prof(100000, 1, 0, a, 1.0);
  TempDb t(sql);
  REQUIRE(fly_set_tuning_db(t.path.c_str()) == FLY_SUCCESS);
  SECTION("the vote beats the nearest row") {
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == b);
    CHECK(std::string(fly_last_decision()) == "db:profile");
  }
  SECTION("an exact row wins over the vote") {
    req.key = key(3100, 800);
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == a);
    CHECK(std::string(fly_last_decision()) == "overlay:exact");
  }
  SECTION("a variant that cannot run the call does not vote: the next best") {
    req.supports = [&](const fly::Variant& x) { return x.name != b; };
    req.cache_tag = "not b";
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == a);
    CHECK(std::string(fly_last_decision()) == "db:profile");
  }
  SECTION("profile_name maps the measured names; unknown ones are skipped") {
    req.profile_name = [&](const std::string& n) { return n == b ? std::string("not_bundled") : n; };
    req.cache_tag = "renamed";
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == a);
  }
  SECTION("without profile_op the nearest row decides, as before") {
    req.profile_op.clear();
    req.cache_tag = "no profile";
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    CHECK(v->name == a);
    CHECK(std::string(fly_last_decision()) == "overlay:nearest");
  }
  fly_set_tuning_db(nullptr);
}

// A schema version 2 database (profile rows in `tuning` as op "<op>_profile") built from `sql`.
std::string v2_schema() {
  return "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
         "INSERT INTO meta VALUES ('schema_version', '2');"
         "CREATE TABLE tuning (arch TEXT NOT NULL, op TEXT NOT NULL, dtype TEXT NOT NULL, layout TEXT NOT NULL,"
         " k0 INTEGER NOT NULL, k1 INTEGER NOT NULL, k2 INTEGER NOT NULL, k3 INTEGER NOT NULL DEFAULT 0,"
         " variant TEXT NOT NULL, time_us REAL, runner_up TEXT, runner_up_us REAL, gpu TEXT, tuned_at TEXT,"
         " PRIMARY KEY (arch, op, dtype, layout, k0, k1, k2, k3));";
}

TEST_CASE("profile rows: their own table; a version 2 file's <op>_profile tuning rows read as profile rows",
          "[db][profile]") {
  SECTION("version 3: the profile table, in the file's order, never in rows()") {
    TempDb t(row("rmsnorm_fwd", "bf16", 4096, 64, 0, "tuned") +
             "INSERT INTO profile VALUES ('sm_90a','rmsnorm_fwd','bf16','row',4096,64,0,'z_first',1.5,'g','d');"
             "INSERT INTO profile VALUES ('sm_90a','rmsnorm_fwd','bf16','row',4096,64,0,'a_second',1.0,'g','d');");
    fly::TuningDb db;
    REQUIRE(db.load_file(t.path) == FLY_SUCCESS);
    REQUIRE(db.rows().size() == 1);
    CHECK(db.rows()[0].variant == "tuned");
    REQUIRE(db.profile_rows().size() == 2);
    const fly::ProfileRow& p = db.profile_rows()[0];
    CHECK(p.arch == "sm_90a");
    CHECK(p.op == "rmsnorm_fwd");
    CHECK(p.dtype == "bf16");
    CHECK(p.layout == "row");
    CHECK((p.k[0] == 4096 && p.k[1] == 64 && p.k[2] == 0));
    CHECK(p.variant == "z_first");
    CHECK(p.rel_time == 1.5);
    CHECK(db.profile_rows()[1].variant == "a_second");
  }
  SECTION("version 3: a rel_time below 1 is refused when written") {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(":memory:", &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db, read_schema().c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
    CHECK(sqlite3_exec(db, "INSERT INTO profile VALUES ('sm_90a','gemm','bf16','nt',1,1,1,'v',0.9,'g','d');", nullptr,
                       nullptr, nullptr) != SQLITE_OK);
    sqlite3_close(db);
  }
  SECTION("version 2: <op>_profile rows become profile rows of <op>; the rest stay tuning rows") {
    TempDb t(v2_schema() +
                 "INSERT INTO tuning VALUES ('sm_90a','gemm','bf16','nt',4096,4096,64,0,'tuned',9.0,'',0,'g','d');"
                 "INSERT INTO tuning VALUES ('sm_90a','gemm_profile','fp16','nn',100,200,3,0,'v1',1.0,'',0,'g','d');"
                 "INSERT INTO tuning VALUES ('sm_90a','gemm_profile','fp16','nn',100,200,3,1,'v0',1.25,'',0,'g','d');",
             false);
    fly::TuningDb db;
    REQUIRE(db.load_file(t.path) == FLY_SUCCESS);
    REQUIRE(db.rows().size() == 1);
    CHECK(db.rows()[0].op == "gemm");
    REQUIRE(db.profile_rows().size() == 2);
    const fly::ProfileRow& p = db.profile_rows()[1];
    CHECK(p.op == "gemm");
    CHECK(p.dtype == "fp16");
    CHECK(p.layout == "nn");
    CHECK((p.k[0] == 100 && p.k[1] == 200 && p.k[2] == 3));
    CHECK(p.variant == "v0");
    CHECK(p.rel_time == 1.25);
    CHECK(db.profile_rows()[0].variant == "v1");  // the file's order, not the names'
  }
  SECTION("a profile table is read whatever the version says") {
    TempDb t("UPDATE meta SET value = '2' WHERE key = 'schema_version';"
             "INSERT INTO profile VALUES ('sm_90a','gemm','bf16','nt',1,2,3,'v',1.0,'g','d');");
    fly::TuningDb db;
    REQUIRE(db.load_file(t.path) == FLY_SUCCESS);
    REQUIRE(db.profile_rows().size() == 1);
    CHECK(db.profile_rows()[0].variant == "v");
  }
  SECTION("version 3: an op named like a profile is an ordinary tuning row") {
    TempDb t(row("rmsnorm_profile", "bf16", 1, 2, 0, "v"));
    fly::TuningDb db;
    REQUIRE(db.load_file(t.path) == FLY_SUCCESS);
    CHECK(db.rows().size() == 1);
    CHECK(db.profile_rows().empty());
  }
  SECTION("a profile that is a view is refused") {
    TempDb t("DROP TABLE profile; CREATE VIEW profile AS SELECT * FROM tuning;");
    fly::TuningDb db;
    CHECK(db.load_file(t.path) == FLY_ERROR_DATABASE);
    CHECK(std::string(fly_get_last_error()).find("'profile' is a view") != std::string::npos);
  }
}

TEST_CASE("flytune's schema step moves a version 2 file's profile rows into the profile table", "[db][profile]") {
  TempDb t(v2_schema() +
               "INSERT INTO tuning VALUES ('sm_90a','gemm','bf16','nt',4096,4096,64,0,'tuned',9.0,'',0,'g','d');"
               "INSERT INTO tuning VALUES ('sm_90a','gemm_profile','bf16','nn',100,200,3,0,'b',1.0,'',0,'g','d');"
               "INSERT INTO tuning VALUES ('sm_90a','gemm_profile','bf16','nn',100,200,3,1,'a',1.2,'',0,'g','d');"
               "INSERT INTO tuning VALUES ('sm_90a','gemm_profile','bf16','nn',100,200,3,2,'b',1.1,'',0,'g','d');"
               "INSERT INTO tuning VALUES ('sm_90a','gemm_profile','bf16','nn',100,200,4,0,'c',0.5,'',0,'g','d');",
           false);
  fly::TuningDb before;
  REQUIRE(before.load_file(t.path) == FLY_SUCCESS);
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(t.path.c_str(), &db) == SQLITE_OK);
  REQUIRE_NOTHROW(fly::tools::apply_schema(db, read_schema()));
  CHECK(fly::tools::schema_version(db) == "3");
  REQUIRE_NOTHROW(fly::tools::apply_schema(db, read_schema()));  // again: nothing to move
  sqlite3_close(db);
  fly::TuningDb after;
  REQUIRE(after.load_file(t.path) == FLY_SUCCESS);
  REQUIRE(after.rows().size() == 1);
  CHECK(after.rows()[0].variant == "tuned");
  // The rows the library read from the version 2 file, in order, less the repeated (shape, variant)
  // (the vote took the first) and with rel_time at least 1 (the vote read it so).
  REQUIRE(before.profile_rows().size() == 4);
  REQUIRE(after.profile_rows().size() == 3);
  const size_t kept[] = {0, 1, 3};
  for (size_t i = 0; i < 3; ++i) {
    const fly::ProfileRow &a = before.profile_rows()[kept[i]], &b = after.profile_rows()[i];
    INFO(i);
    CHECK((a.arch == b.arch && a.op == b.op && a.dtype == b.dtype && a.layout == b.layout && a.variant == b.variant));
    CHECK((a.k[0] == b.k[0] && a.k[1] == b.k[1] && a.k[2] == b.k[2]));
    CHECK(std::max(1.0, a.rel_time) == b.rel_time);
  }
}

TEST_CASE("dispatch: a version 2 overlay's profile rows still vote", "[dispatch][profile]") {
  std::string a, b;
  fly::DeviceCtx dc;
  if (!dispatch_setup(&a, &b, &dc)) return;
  fly::DispatchRequest req;
  req.family = "rmsnorm";
  req.key = key(3000, 777);
  req.fallback = [&] { return a; };
  req.profile_op = "rmsnorm_fwd";
  req.cache_tag = "v2 overlay";
  // As the profile vote test above, in the old format: `b` wins the vote, the nearest row says `a`.
  auto prof = [](int64_t n, int64_t m, int slot, const std::string& variant, double rel) {
    return "INSERT INTO tuning VALUES ('sm_90a','rmsnorm_fwd_profile','bf16','row'," + std::to_string(n) + "," +
           std::to_string(m) + ",0," + std::to_string(slot) + ",'" + variant + "'," + std::to_string(rel) +
           ",'',0,'test','2026-01-01');";
  };
  std::string sql = v2_schema() + row("rmsnorm_fwd", "bf16", 3100, 800, 0, a) + prof(3000, 760, 0, a, 1.0) +
                    prof(3000, 760, 1, b, 1.05);
  const int64_t ns[] = {2800, 3300, 2600, 3600};
  for (int i = 0; i < 4; ++i) sql += prof(ns[i], 777, 0, b, 1.0) + prof(ns[i], 777, 1, a, 1.25);
  TempDb t(sql, false);
  REQUIRE(fly_set_tuning_db(t.path.c_str()) == FLY_SUCCESS);
  const fly::Variant* v = nullptr;
  REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
  CHECK(v->name == b);
  CHECK(std::string(fly_last_decision()) == "db:profile");
  fly_set_tuning_db(nullptr);
}

TEST_CASE("fly_last_key: empty on a thread that has not dispatched", "[dispatch]") {
  std::string op = "unset";
  int64_t k[4] = {-1, -1, -1, -1};
  std::thread t([&] {
    const char *o = nullptr, *d = nullptr, *l = nullptr;
    fly_last_key(&o, &d, &l, k);
    op = std::string(o) + "|" + d + "|" + l;
  });
  t.join();
  CHECK(op == "||");
  CHECK((k[0] == 0 && k[1] == 0 && k[2] == 0 && k[3] == 0));
}

TEST_CASE("make_request: the key every op dispatches on; cache_tag separates cached decisions", "[dispatch]") {
  const fly::DispatchRequest g = fly::make_request("gemm", "gemm", "bf16", "nt", {{"N", 4096}, {"K", 1024}, {"M", 64}});
  CHECK(std::string(g.family) == "gemm");
  CHECK(g.key.op == "gemm");
  CHECK(g.key.dtype == "bf16");
  CHECK(g.key.layout == "nt");
  CHECK(g.key.k[0] == 4096);
  CHECK(g.key.k[1] == 1024);
  CHECK(g.key.k[2] == 64);
  CHECK(std::string(g.key_names[0]) == "N");
  CHECK(std::string(g.key_names[2]) == "M");
  const fly::DispatchRequest r = fly::make_request("rmsnorm", "rmsnorm_fwd", "fp16", "row", {{"N", 7}, {"M", 3}});
  CHECK(r.key.k[0] == 7);
  CHECK(r.key.k[1] == 3);
  CHECK(r.key.k[2] == 0);
  CHECK(std::string(r.key_names[2]) == "-");

  std::string a, b;
  fly::DeviceCtx dc;
  if (!dispatch_setup(&a, &b, &dc)) return;
  TempDb t(row("rmsnorm_fwd", "bf16", 3131, 313, 0, a));
  REQUIRE(fly_set_tuning_db(t.path.c_str()) == FLY_SUCCESS);
  fly::DispatchRequest req = fly::make_request("rmsnorm", "rmsnorm_fwd", "bf16", "row", {{"N", 3131}, {"M", 313}});
  req.fallback = [&] { return b; };
  const fly::Variant* v = nullptr;
  // A call whose circumstances rule `a` out (tag "small") gets another variant (a nearby row of
  // the embedded database or the default) ...
  req.supports = [&](const fly::Variant& x) { return x.name != a; };
  req.cache_tag = "small";
  REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
  CHECK(v->name != a);
  // ... and that cached decision is not handed to the same key under other circumstances.
  req.supports = nullptr;
  req.cache_tag = "large";
  REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
  CHECK(v->name == a);
  fly_set_tuning_db(nullptr);
}

TEST_CASE("the embedded database loads", "[db]") {
  // Dispatching anything loads it; a request with no rows falls back to the default.
  const std::string a = some_bf16_variant();
  if (a.empty()) { WARN("SKIPPED: no rmsnorm in this build"); return; }
  fly::DeviceCtx dc;
  dc.arch = "sm_99z";  // no rows for this arch
  fly::DispatchRequest req;
  req.family = "rmsnorm";
  req.key = key(64, 64);
  req.fallback = [&] { return a; };
  const fly::Variant* v = nullptr;
  REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
  CHECK(v->name == a);
  CHECK(std::string(fly_last_decision()) == "default");
}

TEST_CASE("FLYKERNELS_TUNING_DB: a broken file fails dispatch loudly, a good one overlays", "[db][dispatch][env]") {
  const std::string a = some_bf16_variant();
  if (a.empty()) { WARN("SKIPPED: no rmsnorm bf16 variant in this build"); return; }
  fly::DeviceCtx dc;
  dc.arch = "sm_90a";
  fly::DispatchRequest req;
  req.family = "rmsnorm";
  req.key = key(2999, 555);
  req.fallback = [&] { return a; };
  const fly::Variant* v = nullptr;

  setenv("FLYKERNELS_TUNING_DB", "/nonexistent/tuning.sqlite", 1);
  fly::reload_environment_overlay();
  CHECK(fly::choose_variant(dc, req, &v) == FLY_ERROR_DATABASE);
  CHECK(std::string(fly_get_last_error()).find("FLYKERNELS_TUNING_DB") != std::string::npos);
  CHECK(std::string(fly_get_last_error()).find("/nonexistent/tuning.sqlite") != std::string::npos);

  TempDb t(row("rmsnorm_fwd", "bf16", 2999, 555, 0, a));
  setenv("FLYKERNELS_TUNING_DB", t.path.c_str(), 1);
  fly::reload_environment_overlay();
  REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
  CHECK(v->name == a);
  CHECK(std::string(fly_last_decision()) == "overlay:exact");

  unsetenv("FLYKERNELS_TUNING_DB");
  fly::reload_environment_overlay();
  REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
  CHECK(std::string(fly_last_decision()) != "overlay:exact");
}

TEST_CASE("dump keys: the first eight values of a tuning row; the shipped dump has no duplicates", "[db]") {
  using fly::tools::dump_line_key;
  CHECK(dump_line_key("INSERT OR REPLACE INTO tuning VALUES ('sm_90a','gemm','bf16','nt',4096,4096,64,0,"
                      "'gemm_bf16_bm64_bn32_st7_sw0_kb2',14.912,'x',15.1,'NVIDIA H200','2026-11-30');") ==
        "sm_90a|gemm|bf16|nt|4096|4096|64|0");
  // A comma inside a quoted value does not end a field.
  CHECK(dump_line_key("INSERT INTO t VALUES ('a,b','op','d','l',1,2,3,4,'v');") == "a,b|op|d|l|1|2|3|4");
  CHECK(dump_line_key("-- sm_90a tuning rows").empty());
  CHECK(dump_line_key("").empty());
  CHECK(dump_line_key("INSERT INTO t VALUES ('a','b',1);").empty());  // fewer than eight values
  // The key the tools build from values (flytune --missing) is the one read from a line.
  CHECK(fly::tools::tuning_key({"sm_90a", "gemm", "bf16", "nt", "4096", "4096", "64", "0"}) ==
        "sm_90a|gemm|bf16|nt|4096|4096|64|0");

  std::ifstream in(std::string(FLY_SOURCE_DIR) + "/db/sm_90a.sql");
  REQUIRE(in.good());
  std::set<std::string> keys;
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("INSERT", 0) != 0) continue;
    const std::string k = dump_line_key(line);
    INFO(line);
    REQUIRE(!k.empty());
    CHECK(k.rfind("sm_90a|", 0) == 0);
    CHECK(keys.insert(k).second);  // INSERT OR REPLACE would silently drop a duplicate
    ++rows;
  }
  CHECK(rows > 100);
}
