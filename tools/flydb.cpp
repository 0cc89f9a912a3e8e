// SPDX-License-Identifier: Apache-2.0
// flydb: builds the embedded tuning database from db/schema.sql and the per-arch dumps.
//   flydb --out tuning.sqlite db/schema.sql db/sm_90a.sql ...
// Fails (and so fails the build) when a dump does not match the schema.
#include <sqlite3.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

int main(int argc, char** argv) try {
  const char* usage = "usage: flydb --out FILE schema.sql [dump.sql...]\n"
                      "Builds the SQLite tuning database from the schema and the SQL dumps (build step).\n";
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf("%s", usage);
    return 0;
  }
  if (argc < 4 || std::string(argv[1]) != "--out") {
    std::fprintf(stderr, "flydb: expected --out FILE and a schema\n%s", usage);
    return 2;
  }
  std::string out = argv[2];
  std::filesystem::remove(out);
  sqlite3* db = nullptr;
  if (sqlite3_open(out.c_str(), &db) != SQLITE_OK) throw std::runtime_error("cannot create " + out);
  for (int i = 3; i < argc; ++i) {
    std::ifstream in(argv[i]);
    if (!in) throw std::runtime_error(std::string("cannot read ") + argv[i]);
    std::stringstream ss;
    ss << in.rdbuf();
    char* err = nullptr;
    std::string sql = "BEGIN;" + ss.str() + "\nCOMMIT;";
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      std::string m = std::string(argv[i]) + ": " + (err ? err : "?");
      sqlite3_free(err);
      sqlite3_close(db);
      throw std::runtime_error(m);
    }
  }
  auto count = [&](const char* sql) {
    sqlite3_stmt* st = nullptr;
    int n = 0;
    if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
      n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return n;
  };
  const int rows = count("SELECT count(*) FROM tuning"), profile = count("SELECT count(*) FROM profile");
  // Profile rows belong in their own table since schema version 3; one written the old way (a
  // tuning row of op "<op>_profile") would not reach the vote.
  const int misplaced = count("SELECT count(*) FROM tuning WHERE length(op) > 8 AND substr(op, -8) = '_profile'");
  if (misplaced) {
    sqlite3_close(db);
    throw std::runtime_error(std::to_string(misplaced) +
                             " tuning rows of an op named <op>_profile: profile rows go in the profile table "
                             "(db/schema.sql, version 3)");
  }
  sqlite3_exec(db, "VACUUM", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  std::printf("flydb: %d tuning rows, %d profile rows -> %s\n", rows, profile, out.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flydb: error: %s\n", e.what());
  return 1;
}
