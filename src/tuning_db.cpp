#include "tuning_db.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace fly {

double key_distance(const int64_t a[3], const int64_t b[3]) {
  static const double kWeight[3] = {4.0, 2.0, 1.0};
  double d = 0;
  for (int i = 0; i < 3; ++i) {
    double la = std::log2(double(std::max<int64_t>(a[i], 1)));
    double lb = std::log2(double(std::max<int64_t>(b[i], 1)));
    d += kWeight[i] * std::fabs(la - lb);
  }
  return d;
}

fly_status TuningDb::load_file(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    std::string m = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return fail(FLY_ERROR_DATABASE, "tuning database %s: cannot open (%s)", path.c_str(), m.c_str());
  }
  fly_status s = load(db, path);
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
  source_ = what;
  sqlite3_stmt* st = nullptr;
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
  if (version != "1")
    return fail(FLY_ERROR_DATABASE, "tuning database %s: schema version '%s', this library reads 1",
                what.c_str(), version.c_str());
  const char* q = "SELECT arch, op, dtype, layout, k0, k1, k2, variant, coalesce(time_us, 0) FROM tuning";
  if (sqlite3_prepare_v2(db, q, -1, &st, nullptr) != SQLITE_OK) {
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
    for (int i = 0; i < 3; ++i) r.k[i] = sqlite3_column_int64(st, 4 + i);
    r.variant = text(7);
    r.time_us = sqlite3_column_double(st, 8);
    rows_.push_back(std::move(r));
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE)
    return fail(FLY_ERROR_DATABASE, "tuning database %s: read failed (%s)", what.c_str(), sqlite3_errmsg(db));
  return FLY_SUCCESS;
}

static bool same_group(const TuningRow& r, const std::string& arch, const DispatchKey& key) {
  return r.arch == arch && r.op == key.op && r.dtype == key.dtype && r.layout == key.layout;
}

const TuningRow* TuningDb::exact(const std::string& arch, const DispatchKey& key) const {
  for (auto& r : rows_)
    if (same_group(r, arch, key) && r.k[0] == key.k[0] && r.k[1] == key.k[1] && r.k[2] == key.k[2])
      return &r;
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
