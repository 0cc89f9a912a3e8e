// SPDX-License-Identifier: Apache-2.0
// The key of one line of a db/<arch>.sql tuning dump (header-only: the tools and the CPU tests
// use it). A line is "INSERT OR REPLACE INTO tuning VALUES ('sm_90a','gemm','bf16','nt',4096,
// 4096,64,0,'variant',...);" and its key is the first eight values joined by '|' with the quotes
// dropped: "sm_90a|gemm|bf16|nt|4096|4096|64|0".
#pragma once
#include <initializer_list>
#include <string>

namespace fly::tools {

// A key from its eight values (arch, op, dtype, layout, k0, k1, k2, k3), as dump_line_key reads it.
inline std::string tuning_key(std::initializer_list<std::string> values) {
  std::string key;
  for (const std::string& v : values) {
    if (!key.empty()) key += '|';
    key += v;
  }
  return key;
}

constexpr int kDumpKeyFields = 8;

// "" for a line that is not a tuning row (a comment, a blank line, fewer than eight values).
inline std::string dump_line_key(const std::string& line) {
  if (line.rfind("INSERT", 0) != 0) return std::string();
  const size_t open = line.find('(');
  if (open == std::string::npos) return std::string();
  std::string key;
  int fields = 0;
  bool inq = false;
  for (size_t i = open + 1; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '\'') {
      inq = !inq;
      continue;
    }
    if (c == ',' && !inq) {
      if (++fields == kDumpKeyFields) return key;
      key += '|';
      continue;
    }
    key += c;
  }
  return std::string();
}

}  // namespace fly::tools
