// SPDX-License-Identifier: Apache-2.0
#include "tuning_db.hpp"

#include <sqlite3.h>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace fly {

double key_distance(const int64_t a[kKeyDims], const int64_t b[kKeyDims]) {
  static const double kWeight[kKeyDims] = {4.0, 2.0, 1.0, 1.0};
  double d = 0;
  for (int i = 0; i < kKeyDims; ++i) {
    double la = std::log2(double(std::max<int64_t>(a[i], 1)));
    double lb = std::log2(double(std::max<int64_t>(b[i], 1)));
    d += kWeight[i] * std::fabs(la - lb);
  }
  return d;
}

namespace {

// A URI for sqlite3_open_v2 naming `path` with every byte a URI could misread percent-encoded.
std::string file_uri(const std::string& path) {
  std::string u = "file:";
  for (unsigned char c : path) {
    if (std::isalnum(c) || c == '/' || c == '.' || c == '-' || c == '_' || c == '~') {
      u += char(c);
    } else {
      char esc[4];
      std::snprintf(esc, sizeof esc, "%%%02X", c);
      u += esc;
    }
  }
  // immutable: no locks, no -wal/-shm side files, nothing written beside the user's file.
  return u + "?immutable=1";
}

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// Bounds the work of reading one database (a crafted file cannot make the query loop).
constexpr int kProgressPeriod = 1000;         // virtual machine steps between checks
constexpr int64_t kMaxProgressChecks = 50000;  // 5e7 steps: far beyond any real database
constexpr size_t kMaxRows = 1000000;

int progress_budget(void* ctx) {
  int64_t* left = static_cast<int64_t*>(ctx);
  return --*left < 0 ? 1 : 0;  // nonzero interrupts the statement
}

// A schema version 1 or 2 file keeps its profile rows in `tuning` under op "<op>_profile" (k3 an
// ordinal, time_us the ratio); the op they serve, or "" for an ordinary tuning row.
std::string legacy_profile_op(const std::string& op) {
  static const std::string kSuffix = "_profile";
  if (op.size() <= kSuffix.size() || op.compare(op.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return std::string();
  return op.substr(0, op.size() - kSuffix.size());
}

}  // namespace

fly_status TuningDb::load_file(const std::string& path) {
  const std::string shown = printable(path.c_str(), 256);
  struct stat sb;
  if (::stat(path.c_str(), &sb) != 0)
    return fail(FLY_ERROR_DATABASE, "tuning database %s: cannot open (%s)", shown.c_str(), std::strerror(errno));
  if (!S_ISREG(sb.st_mode))
    return fail(FLY_ERROR_DATABASE, "tuning database %s: %s, not a regular file", shown.c_str(), file_kind(sb.st_mode));
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(file_uri(path).c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) != SQLITE_OK) {
    std::string m = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return fail(FLY_ERROR_DATABASE, "tuning database %s: cannot open (%s)", shown.c_str(), m.c_str());
  }
  fly_status s = load(db, shown);
  sqlite3_close(db);
  return s;
}

fly_status TuningDb::load_image(const uint8_t* data, size_t size, const std::string& what) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(":memory:", &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return fail(FLY_ERROR_DATABASE, "%s: cannot open an in-memory database", what.c_str());
  }
  // sqlite3_deserialize wants a writable sqlite3_malloc'd buffer it may own.
  unsigned char* buf = static_cast<unsigned char*>(sqlite3_malloc64(size ? size : 1));
  if (!buf) { sqlite3_close(db); return fail(FLY_ERROR_DATABASE, "%s: out of memory", what.c_str()); }
  if (size) std::memcpy(buf, data, size);
  int rc = sqlite3_deserialize(db, "main", buf, sqlite3_int64(size), sqlite3_int64(size),
                               SQLITE_DESERIALIZE_FREEONCLOSE | SQLITE_DESERIALIZE_READONLY);
  if (rc != SQLITE_OK) {
    sqlite3_close(db);
    return fail(FLY_ERROR_DATABASE, "%s: not a SQLite image", what.c_str());
  }
  fly_status s = load(db, what);
  sqlite3_close(db);
  return s;
}

fly_status TuningDb::load(sqlite3* db, const std::string& what) {
  rows_.clear();
  profile_.clear();
  source_ = what;
  int64_t budget = kMaxProgressChecks;
  sqlite3_progress_handler(db, kProgressPeriod, progress_budget, &budget);
  sqlite3_stmt* st = nullptr;
  // Every table read must be a table: a view can compute anything (a recursive one never ends).
  bool has_profile = false;
  if (sqlite3_prepare_v2(db, "SELECT name, type FROM sqlite_master WHERE name IN ('meta', 'tuning', 'profile')", -1,
                         &st, nullptr) != SQLITE_OK) {
    std::string m = sqlite3_errmsg(db);
    sqlite3_finalize(st);
    return fail(FLY_ERROR_DATABASE, "tuning database %s: unreadable (%s)", what.c_str(), m.c_str());
  }
  while (sqlite3_step(st) == SQLITE_ROW) {
    const unsigned char* name = sqlite3_column_text(st, 0);
    const unsigned char* type = sqlite3_column_text(st, 1);
    if (!type || std::strcmp(reinterpret_cast<const char*>(type), "table") != 0) {
      std::string n = name ? reinterpret_cast<const char*>(name) : "?";
      std::string t = type ? printable(reinterpret_cast<const char*>(type), 32) : "?";
      sqlite3_finalize(st);
      return fail(FLY_ERROR_DATABASE, "tuning database %s: '%s' is a %s, not a table", what.c_str(), n.c_str(),
                  t.c_str());
    }
    if (name && std::strcmp(reinterpret_cast<const char*>(name), "profile") == 0) has_profile = true;
  }
  sqlite3_finalize(st);
  st = nullptr;
  if (sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'schema_version'", -1, &st, nullptr) != SQLITE_OK) {
    std::string m = sqlite3_errmsg(db);
    sqlite3_finalize(st);
    return fail(FLY_ERROR_DATABASE, "tuning database %s: no meta table (%s); is it a FlyKernels database?",
                what.c_str(), m.c_str());
  }
  std::string version;
  if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
    version = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  // Version 2 added the fourth key dimension k3; a version 1 database reads as k3 = 0. Version 3
  // moved profile rows out of `tuning` into `profile`; an older file's "<op>_profile" rows are
  // read as profile rows of <op>.
  if (version != "1" && version != "2" && version != "3")
    return fail(FLY_ERROR_DATABASE, "tuning database %s: schema version '%s', this library reads 1 to 3",
                what.c_str(), printable(version.c_str(), 32).c_str());
  const bool legacy_profile = version != "3";
  // The runner-up column (db/schema.sql) when the table has it, else "" for every row.
  const char* q = version == "1"
                      ? "SELECT arch, op, dtype, layout, k0, k1, k2, 0, variant, coalesce(time_us, 0) FROM tuning"
                      : "SELECT arch, op, dtype, layout, k0, k1, k2, k3, variant, coalesce(time_us, 0), "
                        "coalesce(runner_up, '') FROM tuning";
  st = nullptr;
  if (version != "1" && sqlite3_prepare_v2(db, q, -1, &st, nullptr) != SQLITE_OK) {
    sqlite3_finalize(st);  // no runner_up column: the same query without it
    st = nullptr;
    q = "SELECT arch, op, dtype, layout, k0, k1, k2, k3, variant, coalesce(time_us, 0) FROM tuning";
  }
  if (!st && sqlite3_prepare_v2(db, q, -1, &st, nullptr) != SQLITE_OK) {
    std::string m = sqlite3_errmsg(db);
    sqlite3_finalize(st);
    return fail(FLY_ERROR_DATABASE, "tuning database %s: bad tuning table (%s)", what.c_str(), m.c_str());
  }
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    TuningRow r;
    auto text = [&](int c) {
      const unsigned char* t = sqlite3_column_text(st, c);
      return t ? std::string(reinterpret_cast<const char*>(t)) : std::string();
    };
    r.arch = text(0);
    r.op = text(1);
    r.dtype = text(2);
    r.layout = text(3);
    for (int i = 0; i < kKeyDims; ++i) r.k[i] = sqlite3_column_int64(st, 4 + i);
    r.variant = text(8);
    r.time_us = sqlite3_column_double(st, 9);
    if (sqlite3_column_count(st) > 10) r.runner_up = text(10);
    const std::string served = legacy_profile ? legacy_profile_op(r.op) : std::string();
    if (!served.empty()) {
      ProfileRow p;
      p.arch = std::move(r.arch);
      p.op = served;
      p.dtype = std::move(r.dtype);
      p.layout = std::move(r.layout);
      for (int i = 0; i < 3; ++i) p.k[i] = r.k[i];  // k3 only numbered the shape's variants
      p.variant = std::move(r.variant);
      p.rel_time = r.time_us;
      profile_.push_back(std::move(p));
    } else {
      rows_.push_back(std::move(r));
    }
    if (rows_.size() + profile_.size() > kMaxRows) break;
  }
  sqlite3_finalize(st);
  st = nullptr;
  // The profile table, in the order its rows were written (a file without one has none). Read in
  // any version: a writer of version 2 rows (python/flykernels/_decisions.py before it kept the
  // version) may have set a version 3 file's schema_version back.
  if (rc == SQLITE_DONE && has_profile && rows_.size() <= kMaxRows) {
    if (sqlite3_prepare_v2(db,
                           "SELECT arch, op, dtype, layout, k0, k1, k2, variant, coalesce(rel_time, 0) FROM profile "
                           "ORDER BY rowid",
                           -1, &st, nullptr) != SQLITE_OK) {
      std::string m = sqlite3_errmsg(db);
      sqlite3_finalize(st);
      rows_.clear();
      return fail(FLY_ERROR_DATABASE, "tuning database %s: bad profile table (%s)", what.c_str(), m.c_str());
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      ProfileRow p;
      auto text = [&](int c) {
        const unsigned char* t = sqlite3_column_text(st, c);
        return t ? std::string(reinterpret_cast<const char*>(t)) : std::string();
      };
      p.arch = text(0);
      p.op = text(1);
      p.dtype = text(2);
      p.layout = text(3);
      for (int i = 0; i < 3; ++i) p.k[i] = sqlite3_column_int64(st, 4 + i);
      p.variant = text(7);
      p.rel_time = sqlite3_column_double(st, 8);
      profile_.push_back(std::move(p));
      if (rows_.size() + profile_.size() > kMaxRows) break;
    }
    sqlite3_finalize(st);
  }
  if (rows_.size() + profile_.size() > kMaxRows) {
    rows_.clear();
    profile_.clear();
    return fail(FLY_ERROR_DATABASE, "tuning database %s: more than %zu rows", what.c_str(), kMaxRows);
  }
  if (rc == SQLITE_INTERRUPT || budget < 0) {
    rows_.clear();
    profile_.clear();
    return fail(FLY_ERROR_DATABASE, "tuning database %s: reading it took too long (more than %lld steps)",
                what.c_str(), (long long)kMaxProgressChecks * kProgressPeriod);
  }
  if (rc != SQLITE_DONE) {
    rows_.clear();
    profile_.clear();
    return fail(FLY_ERROR_DATABASE, "tuning database %s: read failed (%s)", what.c_str(), sqlite3_errmsg(db));
  }
  return FLY_SUCCESS;
}

static bool same_group(const TuningRow& r, const std::string& arch, const DispatchKey& key) {
  return r.arch == arch && r.op == key.op && r.dtype == key.dtype && r.layout == key.layout;
}

const TuningRow* TuningDb::exact(const std::string& arch, const DispatchKey& key) const {
  for (auto& r : rows_)
    if (same_group(r, arch, key) && std::equal(r.k, r.k + kKeyDims, key.k)) return &r;
  return nullptr;
}

std::vector<const TuningRow*> TuningDb::nearest(const std::string& arch, const DispatchKey& key) const {
  std::vector<std::pair<double, const TuningRow*>> c;
  for (auto& r : rows_)
    if (same_group(r, arch, key)) c.emplace_back(key_distance(r.k, key.k), &r);
  std::stable_sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::vector<const TuningRow*> out;
  for (auto& p : c) out.push_back(p.second);
  return out;
}

}  // namespace fly
