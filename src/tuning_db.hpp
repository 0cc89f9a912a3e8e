// SPDX-License-Identifier: Apache-2.0
// Tuning database: SQLite images (embedded, overlay) read into memory once; lookups are pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core.hpp"

struct sqlite3;

namespace fly {

struct TuningRow {
  std::string arch, op, dtype, layout;
  int64_t k[kKeyDims] = {0, 0, 0, 0};
  std::string variant;
  double time_us = 0;
  std::string runner_up;  // the second best of the tuning run ("" when none or not recorded)
};

// One profile row (db/schema.sql `profile`): on a profiled shape k[0..2] (the served op's key order)
// of `layout`, the variant measured and its time over the best time on that shape (>= 1).
struct ProfileRow {
  std::string arch, op, dtype, layout;  // op: the op the profile serves ("gemm")
  int64_t k[3] = {0, 0, 0};
  std::string variant;
  double rel_time = 1;
};

class TuningDb {
 public:
  // Reads every row of a database file (read-only) or an in-memory SQLite image. Checks the
  // schema version (1, 2 or 3). On failure returns FLY_ERROR_DATABASE with a message naming `what`.
  fly_status load_file(const std::string& path);
  fly_status load_image(const uint8_t* data, size_t size, const std::string& what);
  // Tuning rows; never a profile row (a version 1 or 2 file's "<op>_profile" rows are read into
  // profile_rows() as rows of <op>).
  const std::vector<TuningRow>& rows() const { return rows_; }
  // Profile rows in the file's order (DispatchRequest::profile_op).
  const std::vector<ProfileRow>& profile_rows() const { return profile_; }
  const std::string& source() const { return source_; }
  // Row with exactly this key, or nullptr.
  const TuningRow* exact(const std::string& arch, const DispatchKey& key) const;
  // Rows of the same (arch, op, dtype, layout), nearest first (weighted log2 distance over k[]).
  std::vector<const TuningRow*> nearest(const std::string& arch, const DispatchKey& key) const;

 private:
  fly_status load(::sqlite3* db, const std::string& what);
  std::vector<TuningRow> rows_;
  std::vector<ProfileRow> profile_;
  std::string source_;
};

// Weighted log2 distance between two shape keys: k[0] counts 4x, k[1] 2x, k[2] and k[3] 1x.
double key_distance(const int64_t a[kKeyDims], const int64_t b[kKeyDims]);

}  // namespace fly
