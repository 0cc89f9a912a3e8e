// SPDX-License-Identifier: Apache-2.0
// The edge cases a hostile caller found (issue 21), each pinned: checked size arithmetic, dtype
// values outside the enum, databases that are not regular files / views / WAL-mode, the driver
// path in messages, the bounded dispatch cache, stale and echoed messages, eps beyond fp32.
// CPU only (no driver, or the stand-in one in a child process).
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "catch_compat.hpp"
#include "core.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"
#include "topk/topk_params.h"
#include "dispatch.hpp"
#include "tuning_db.hpp"

namespace {

using fly_test::mat;
using fly_test::mentions;
using fly_test::vec;

void* const kX = reinterpret_cast<void*>(0x10000);
void* const kY = reinterpret_cast<void*>(0x20000);

void set_dtype(fly_tensor* t, int32_t v) { std::memcpy(&t->dtype, &v, sizeof v); }

bool clean_message(const char* m) {
  for (const char* p = m; *p; ++p)
    if (static_cast<unsigned char>(*p) < 0x20) return false;
  return true;
}

std::string temp_path(const char* stem) {
  char tmpl[64];
  std::snprintf(tmpl, sizeof tmpl, "/tmp/%s_XXXXXX", stem);
  int fd = mkstemp(tmpl);
  close(fd);
  std::remove(tmpl);
  return tmpl;
}

bool exists(const std::string& p) {
  struct stat sb;
  return ::stat(p.c_str(), &sb) == 0;
}

void exec_sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  INFO((err ? err : ""));
  sqlite3_free(err);
  sqlite3_close(db);
  REQUIRE(rc == SQLITE_OK);
}

const char* kSchema =
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);"
    "INSERT INTO meta VALUES('schema_version','1');";
const char* kTuningTable =
    "CREATE TABLE tuning(arch TEXT, op TEXT, dtype TEXT, layout TEXT, k0 INTEGER, k1 INTEGER, k2 INTEGER,"
    " variant TEXT, time_us REAL);";

// Runs the driver probe (a fresh process) with FLYKERNELS_LIBCUDA set to `value` (NULL: unset).
std::string probe(const char* value) {
  std::string cmd = value ? "FLYKERNELS_LIBCUDA='" + std::string(value) + "' " : "env -u FLYKERNELS_LIBCUDA ";
  cmd += FLY_DRIVER_PROBE;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  return out;
}

}  // namespace

TEST_CASE("topk workspace sizes never wrap (row-broadcast x, huge k)", "[hardening][topk]") {
  const int64_t big = (int64_t(1) << 31) - 1;
  SECTION("the planning arithmetic reports overflow as -1") {
    CHECK(topk_plan::radix_workspace(big, big) == -1);
    CHECK(topk_plan::radix_workspace((int64_t(1) << 30) + 1, big) == -1);
    CHECK(topk_plan::plan_split(big, big, big, 32768).ws_bytes == -1);
    CHECK(topk_plan::checked_mul(int64_t(1) << 32, int64_t(1) << 31) == -1);
    CHECK(topk_plan::checked_add(INT64_MAX, 1) == -1);
    CHECK(topk_plan::next_pow2(INT64_MAX) == -1);
    // Ordinary shapes keep their sizes.
    CHECK(topk_plan::radix_workspace(4, 10000) == 4 * 16384 * 8);
    CHECK(topk_plan::radix_workspace(1000, 100) == 0);
    const auto sp = topk_plan::plan_split(3, 1 << 20, 100, 32768);
    CHECK(sp.cand_offset == (3 * int64_t(sizeof(TopkSplitState)) + 255) / 256 * 256);
    CHECK(sp.buf_a_offset == (sp.cand_offset + 3 * 128 * 8 + 255) / 256 * 256);
    CHECK(sp.buf_b_offset == (sp.buf_a_offset + 3 * ((1 << 20) / 8) * 8 + 255) / 256 * 256);
    CHECK(sp.tie_offset == (sp.buf_b_offset + 3 * ((1 << 20) / 64) * 8 + 255) / 256 * 256);
    CHECK(sp.ties_offset == (sp.tie_offset + 3 * sp.ldt * 4 + 255) / 256 * 256);
    CHECK(sp.ws_bytes == sp.ties_offset + 3 * topk_plan::kSplitSmallTies * 8);
    CHECK(sp.chunk == 2048);  // 3 rows of 2^20: ~2048 pieces in all (682 a row), at least 2048 long
    CHECK(sp.pieces == 512);
    CHECK(topk_plan::plan_split(16, 1 << 24, 100, 32768).chunk == 32768);  // capped by the variant
  }
  SECTION("the size query rejects what it cannot size") {
    fly_tensor x = mat(kX, FLY_F32, big, big, 0);
    size_t bytes = 7;
    CHECK(fly_topk_workspace_size(&x, big, 1, 0, &bytes) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("workspace"));
    CHECK(bytes == 0);
    x = mat(kX, FLY_F32, (int64_t(1) << 30) + 1, big, 0);
    CHECK(fly_topk_workspace_size(&x, big, 1, 0, &bytes) == FLY_ERROR_UNSUPPORTED);
    CHECK(bytes == 0);
    // A large but representable one is sized exactly: 2^20 rows x 2^15 candidates x 8 bytes.
    x = mat(kX, FLY_F32, int64_t(1) << 20, 1 << 16, 0);
    REQUIRE(fly_topk_workspace_size(&x, 1 << 15, 1, 0, &bytes) == FLY_SUCCESS);
    CHECK(bytes >= (size_t(1) << 38));
  }
}

TEST_CASE("a dtype outside the enum is rejected as an integer", "[hardening][dtype]") {
  fly_tensor x = mat(kX, FLY_BF16, 8, 64, 64), y = mat(kY, FLY_BF16, 8, 64, 64);
  for (int32_t bad : {99, -1, 11, 0, 1 << 30, INT32_MIN}) {
    set_dtype(&x, bad);
    CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions(("x: invalid dtype value " + std::to_string(bad)).c_str()));
  }
  set_dtype(&x, FLY_BF16);
  set_dtype(&y, 1234);
  CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("y: invalid dtype value 1234"));
  fly_tensor t = mat(kX, FLY_F32, 4, 64, 64);
  set_dtype(&t, 77);
  size_t bytes = 0;
  CHECK(fly_topk_workspace_size(&t, 4, 1, 0, &bytes) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("x: invalid dtype value 77"));
  CHECK(fly::dtype_value(t) == 77);
}

TEST_CASE("tuning databases: only regular files, read immutably, bounded", "[hardening][db]") {
  fly::TuningDb db;
  SECTION("a FIFO is refused without opening it (open() would block)") {
    const std::string p = temp_path("flyfifo");
    REQUIRE(mkfifo(p.c_str(), 0600) == 0);
    CHECK(db.load_file(p) == FLY_ERROR_DATABASE);
    CHECK(mentions("a FIFO"));
    CHECK(mentions(p.c_str()));
    CHECK(fly_set_tuning_db(p.c_str()) == FLY_ERROR_DATABASE);
    std::remove(p.c_str());
  }
  SECTION("a directory or a device is refused") {
    CHECK(db.load_file("/tmp") == FLY_ERROR_DATABASE);
    CHECK(mentions("a directory"));
    CHECK(db.load_file("/dev/null") == FLY_ERROR_DATABASE);
    CHECK(mentions("character device"));
  }
  SECTION("a recursive view standing in for the tuning table is refused before it runs") {
    const std::string p = temp_path("flyview");
    exec_sql(p, std::string(kSchema) +
                    "CREATE VIEW tuning AS WITH RECURSIVE r(arch, op, dtype, layout, k0, k1, k2, variant, time_us)"
                    " AS (SELECT 'sm_90a','x','x','row',1,1,1,'v',1.0 UNION ALL SELECT arch, op, dtype, layout,"
                    " k0 + 1, k1, k2, variant, time_us FROM r) SELECT * FROM r;");
    CHECK(db.load_file(p) == FLY_ERROR_DATABASE);
    CHECK(mentions("'tuning' is a view, not a table"));
    std::remove(p.c_str());
  }
  SECTION("a view for meta is refused too") {
    const std::string p = temp_path("flyview");
    exec_sql(p, std::string(kTuningTable) + "CREATE VIEW meta AS SELECT 'schema_version' AS key, '1' AS value;");
    CHECK(db.load_file(p) == FLY_ERROR_DATABASE);
    CHECK(mentions("'meta' is a view"));
    std::remove(p.c_str());
  }
  SECTION("a WAL-mode database is read without creating -wal/-shm beside it") {
    const std::string p = temp_path("flywal");
    exec_sql(p, std::string("PRAGMA journal_mode=WAL;") + kSchema + kTuningTable +
                    "INSERT INTO tuning VALUES('sm_90a','rmsnorm_fwd','bf16','row',4096,8,0,'v',1.5);");
    REQUIRE_FALSE(exists(p + "-wal"));
    REQUIRE(db.load_file(p) == FLY_SUCCESS);
    CHECK(db.rows().size() == 1);
    CHECK_FALSE(exists(p + "-wal"));
    CHECK_FALSE(exists(p + "-shm"));
    std::remove(p.c_str());
  }
  SECTION("paths with URI characters open the file they name") {
    const std::string p = temp_path("fly?x=1#%41&mode=rwc");
    exec_sql(p, std::string(kSchema) + kTuningTable);
    CHECK(db.load_file(p) == FLY_SUCCESS);
    std::remove(p.c_str());
  }
  SECTION("a long path with control bytes is echoed escaped and truncated") {
    std::string p = "/nonexistent/";
    p += std::string(100000, 'a');
    p[20] = '\n';
    p[21] = '\x1b';
    CHECK(db.load_file(p) == FLY_ERROR_DATABASE);
    const std::string m = fly_get_last_error();
    CHECK(m.size() < 700);
    CHECK(clean_message(m.c_str()));
    CHECK(m.find("\\x0a\\x1b") != std::string::npos);
    CHECK(m.find("bytes)") != std::string::npos);
  }
}

TEST_CASE("FLYKERNELS_LIBCUDA: empty is unset; failures name the path and dlerror", "[hardening][driver]") {
  SECTION("empty") {
    const std::string out = probe("");
    INFO(out);
    CHECK(out.find("cuInit") == std::string::npos);  // dlopen("") would find the probe itself
    const bool gpu = out.rfind("FLY_SUCCESS|", 0) == 0;
    CHECK((gpu || out.find("libcuda.so.1") != std::string::npos));
  }
  SECTION("a missing file") {
    const std::string out = probe("/nonexistent/libcuda-test.so");
    INFO(out);
    CHECK(out.rfind("FLY_ERROR_NO_DEVICE|", 0) == 0);
    CHECK(out.find("/nonexistent/libcuda-test.so") != std::string::npos);
    CHECK(out.find("No such file") != std::string::npos);
    CHECK(out.find("FLYKERNELS_LIBCUDA") != std::string::npos);
  }
  SECTION("a library that is not a driver") {
    const std::string out = probe(FLY_SO_PATH);
    INFO(out);
    CHECK(out.rfind("FLY_ERROR_NO_DEVICE|", 0) == 0);
    CHECK(out.find(FLY_SO_PATH) != std::string::npos);
    CHECK(out.find("cuInit") != std::string::npos);
  }
  SECTION("the stand-in driver") {
    const std::string out = probe(FLY_FAKE_CUDA_PATH);
    INFO(out);
    CHECK(out == "FLY_SUCCESS|sm_90a|\n");
  }
}

TEST_CASE("the per-shape dispatch cache is bounded", "[hardening][dispatch]") {
  fly::clear_dispatch_cache();
  fly::DeviceCtx dc;
  dc.arch = "sm_90a";
  const fly::Variant* first = nullptr;
  for (int64_t n = 1; n <= int64_t(fly::kDispatchCacheEntries) + 1000; ++n) {
    fly::DispatchRequest req = fly::make_request("rmsnorm", "rmsnorm_fwd", "bf16", "row", {{"N", 64}, {"M", n}});
    req.fallback = [] { return std::string("rmsnorm_bf16_t32_r4_c4_p1"); };
    req.supports = [](const fly::Variant& v) { return v.get("dtype") == "bf16"; };
    const fly::Variant* v = nullptr;
    REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
    if (n == 1) first = v;
    CHECK(fly::dispatch_cache_size("rmsnorm_fwd") <= fly::kDispatchCacheEntries);
  }
  CHECK(fly::dispatch_cache_size("rmsnorm_fwd") == fly::kDispatchCacheEntries);
  CHECK(fly::dispatch_cache_size("topk") == 0);  // per op
  // An evicted shape is decided again, the same way.
  fly::DispatchRequest req = fly::make_request("rmsnorm", "rmsnorm_fwd", "bf16", "row", {{"N", 64}, {"M", 1}});
  req.fallback = [] { return std::string("rmsnorm_bf16_t32_r4_c4_p1"); };
  const fly::Variant* v = nullptr;
  REQUIRE(fly::choose_variant(dc, req, &v) == FLY_SUCCESS);
  CHECK(v == first);
  fly::clear_dispatch_cache();
  CHECK(fly::dispatch_cache_size("rmsnorm_fwd") == 0);
}

TEST_CASE("success clears the message; caller strings are escaped and cut", "[hardening][errors]") {
  REQUIRE(fly_variant_count() > 0);
  const char* name = fly_variant_name(0);
  const char *fam = nullptr, *params = nullptr;
  SECTION("fly_variant_info") {
    CHECK(fly_variant_info("nope", &fam, &params) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(std::strlen(fly_get_last_error()) > 0);
    CHECK(fly_variant_info(name, &fam, &params) == FLY_SUCCESS);
    CHECK(std::string(fly_get_last_error()).empty());
  }
  SECTION("fly_force_variant") {
    CHECK(fly_force_variant("nope") == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(fly_force_variant(name) == FLY_SUCCESS);
    CHECK(std::string(fly_get_last_error()).empty());
    CHECK(fly_force_variant("nope") == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(fly_force_variant(nullptr) == FLY_SUCCESS);
    CHECK(std::string(fly_get_last_error()).empty());
  }
  SECTION("a 16 MiB name with control bytes gives a short, clean message") {
    std::string big(size_t(16) << 20, 'x');
    big[3] = '\x01';
    big[4] = '\t';
    for (auto f : {0, 1}) {
      const fly_status s = f ? fly_force_variant(big.c_str()) : fly_variant_info(big.c_str(), &fam, &params);
      CHECK(s == FLY_ERROR_INVALID_ARGUMENT);
      const std::string m = fly_get_last_error();
      CHECK(m.size() < 300);
      CHECK(clean_message(m.c_str()));
      CHECK(m.find("xxx\\x01\\x09x") != std::string::npos);
      CHECK(m.find("(16777216 bytes)") != std::string::npos);
    }
    CHECK(fly::printable("a\\b") == "a\\x5cb");  // a backslash in the input cannot fake an escape
    CHECK(fly::printable(nullptr) == "(null)");
  }
}

TEST_CASE("eps must fit in fp32", "[hardening][rmsnorm]") {
  fly_tensor x = mat(kX, FLY_BF16, 8, 64, 64), y = mat(kY, FLY_BF16, 8, 64, 64);
  for (double eps : {1e300, 3.5e38, -1e-5, -0.0 - 1e-300}) {
    CHECK(fly_rms_norm_fwd(&x, nullptr, eps, &y, nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("eps"));
  }
  // The largest float passes eps validation (the call then fails later: no device, or fake pointers).
  CHECK(fly_rms_norm_fwd(&x, nullptr, 3.4028234663852886e38, &y, nullptr, nullptr) != FLY_SUCCESS);
  CHECK_FALSE(mentions("eps"));
}
