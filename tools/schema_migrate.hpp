// SPDX-License-Identifier: Apache-2.0
// Brings a tuning database the tools write into (flytune --db) to the current db/schema.sql
// (header-only: the tools and the CPU tests use it). Version 1 (no k3): `tuning` is rebuilt with
// k3 = 0. Versions 1 and 2 (profile rows in `tuning` as op "<op>_profile"): those rows move to
// the `profile` table as rows of <op>, in their order, k3 (an ordinal) dropped, time_us becoming
// rel_time (at least 1, as the library reads it); where a shape lists a variant twice the first
// row stays, as the library's vote takes the first.
#pragma once
#include <sqlite3.h>

#include <stdexcept>
#include <string>

namespace fly::tools {

namespace schema_detail {
inline void exec(sqlite3* db, const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "?";
    sqlite3_free(err);
    throw std::runtime_error("sqlite: " + m);
  }
}
}  // namespace schema_detail

// The file's schema_version ("" for a new, empty file).
inline std::string schema_version(sqlite3* db) {
  sqlite3_stmt* st = nullptr;
  std::string version;
  if (sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'schema_version'", -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
    version = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  return version;
}

// Applies the schema script `schema` (db/schema.sql), migrating an older file first; one
// transaction, rolled back on failure.
inline void apply_schema(sqlite3* db, const std::string& schema) {
  using schema_detail::exec;
  const std::string version = schema_version(db);
  exec(db, "BEGIN");
  try {
    if (version == "1") exec(db, "ALTER TABLE tuning RENAME TO tuning_v1;");
    exec(db, schema);
    if (version == "1")
      exec(db, "INSERT INTO tuning SELECT arch, op, dtype, layout, k0, k1, k2, 0, variant, time_us, runner_up, "
               "runner_up_us, gpu, tuned_at FROM tuning_v1; DROP TABLE tuning_v1;");
    if (version == "1" || version == "2")
      exec(db, "INSERT OR IGNORE INTO profile SELECT arch, substr(op, 1, length(op) - 8), dtype, layout, k0, k1, k2, "
               "variant, max(coalesce(time_us, 0), 1), gpu, tuned_at FROM tuning "
               "WHERE length(op) > 8 AND substr(op, -8) = '_profile' ORDER BY rowid;"
               "DELETE FROM tuning WHERE length(op) > 8 AND substr(op, -8) = '_profile';");
    exec(db, "COMMIT");
  } catch (...) {
    sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

}  // namespace fly::tools
