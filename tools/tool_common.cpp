#include "tool_common.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>

namespace fly::tools {

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) == 0) {
      std::string key = s.substr(2), val = "1";
      size_t eq = key.find('=');
      if (eq != std::string::npos) {
        val = key.substr(eq + 1);
        key = key.substr(0, eq);
      } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        val = argv[++i];
      }
      a.opt[key] = val;
    } else if (a.family.empty()) {
      a.family = s;
    } else {
      throw std::runtime_error("unexpected argument " + s);
    }
  }
  return a;
}

size_t dtype_bytes(fly_dtype dt) {
  switch (dt) {
    case FLY_F16: case FLY_BF16: return 2;
    case FLY_F32: case FLY_I32: return 4;
    case FLY_F64: case FLY_I64: return 8;
    case FLY_U8: return 1;
    default: return 0;
  }
}

fly_dtype parse_dtype(const std::string& s) {
  if (s == "fp16" || s == "f16" || s == "half") return FLY_F16;
  if (s == "bf16") return FLY_BF16;
  if (s == "fp32" || s == "f32" || s == "float") return FLY_F32;
  throw std::runtime_error("unknown dtype '" + s + "' (fp16, bf16, fp32)");
}

fly_tensor tensor2d(void* data, fly_dtype dt, int64_t rows, int64_t cols, int64_t ld) {
  fly_tensor t{};
  t.data = data;
  t.dtype = dt;
  t.rank = 2;
  t.sizes[0] = rows;
  t.sizes[1] = cols;
  t.strides[0] = ld;
  t.strides[1] = 1;
  return t;
}

fly_tensor tensor1d(void* data, fly_dtype dt, int64_t n) {
  fly_tensor t{};
  t.data = data;
  t.dtype = dt;
  t.rank = 1;
  t.sizes[0] = n;
  t.strides[0] = 1;
  return t;
}

void fill_random(void* dev, size_t count, fly_dtype dt, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  size_t es = dtype_bytes(dt);
  std::vector<uint8_t> host(count * es);
  for (size_t i = 0; i < count; ++i) {
    float f = dist(rng);
    if (dt == FLY_F32) std::memcpy(&host[i * 4], &f, 4);
    else if (dt == FLY_F16) { __half h = __float2half(f); std::memcpy(&host[i * 2], &h, 2); }
    else if (dt == FLY_BF16) { __nv_bfloat16 b = __float2bfloat16(f); std::memcpy(&host[i * 2], &b, 2); }
    else throw std::runtime_error("fill_random: unsupported dtype");
  }
  TOOL_CUDA(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
}

std::vector<double> to_host_double(const void* dev, size_t count, fly_dtype dt) {
  size_t es = dtype_bytes(dt);
  std::vector<uint8_t> host(count * es);
  TOOL_CUDA(cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost));
  std::vector<double> out(count);
  for (size_t i = 0; i < count; ++i) {
    if (dt == FLY_F32) { float f; std::memcpy(&f, &host[i * 4], 4); out[i] = f; }
    else if (dt == FLY_F16) { __half h; std::memcpy(&h, &host[i * 2], 2); out[i] = __half2float(h); }
    else if (dt == FLY_BF16) { __nv_bfloat16 b; std::memcpy(&b, &host[i * 2], 2); out[i] = __bfloat162float(b); }
    else if (dt == FLY_I64) { int64_t v; std::memcpy(&v, &host[i * 8], 8); out[i] = double(v); }
    else throw std::runtime_error("to_host_double: unsupported dtype");
  }
  return out;
}

namespace {
DeviceBuffer& flush_buffer() {
  static DeviceBuffer b(size_t(256) << 20);
  return b;
}
}  // namespace

double time_median_us(const std::function<void()>& fn, cudaStream_t stream, int warmup, int reps,
                      bool flush_l2) {
  for (int i = 0; i < warmup; ++i) fn();
  TOOL_CUDA(cudaGetLastError());
  TOOL_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t a, b;
  TOOL_CUDA(cudaEventCreate(&a));
  TOOL_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    if (flush_l2) TOOL_CUDA(cudaMemsetAsync(flush_buffer().ptr, i & 0xff, flush_buffer().bytes, stream));
    TOOL_CUDA(cudaEventRecord(a, stream));
    fn();
    TOOL_CUDA(cudaEventRecord(b, stream));
    TOOL_CUDA(cudaEventSynchronize(b));
    TOOL_CUDA(cudaGetLastError());
    float t = 0;
    TOOL_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1000.0;
}

double copy_bandwidth_bytes_per_s() {
  static double bw = [] {
    const size_t n = size_t(1) << 30;
    DeviceBuffer src(n), dst(n);
    TOOL_CUDA(cudaMemset(src.ptr, 1, n));
    double us = time_median_us([&] { TOOL_CUDA(cudaMemcpyAsync(dst.ptr, src.ptr, n, cudaMemcpyDeviceToDevice, 0)); },
                               0, 3, 15, false);
    return 2.0 * double(n) / (us * 1e-6);
  }();
  return bw;
}

Progress::Progress(size_t total, std::string title)
    : total_(total), title_(std::move(title)), tty_(isatty(2) != 0) {}

void Progress::step(const std::string& what) {
  ++n_;
  const int width = 30;
  int filled = total_ ? int(width * n_ / total_) : width;
  std::string bar(size_t(filled), '#');
  bar += std::string(size_t(width - filled), '.');
  if (tty_)
    std::fprintf(stderr, "\r%s [%s] %zu/%zu %-50.50s", title_.c_str(), bar.c_str(), n_, total_, what.c_str());
  else
    std::fprintf(stderr, "%s [%s] %zu/%zu %s\n", title_.c_str(), bar.c_str(), n_, total_, what.c_str());
  std::fflush(stderr);
}

void Progress::done() {
  if (tty_) std::fprintf(stderr, "\n");
}

nlohmann::json load_suite(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read suite " + path + " (run from the project root or pass --suite)");
  return nlohmann::json::parse(in);
}

std::string gpu_name() {
  cudaDeviceProp p{};
  TOOL_CUDA(cudaGetDeviceProperties(&p, 0));
  return p.name;
}

std::string gpu_arch() {
  const char* arch = nullptr;
  TOOL_FLY(fly_device_arch(nullptr, &arch));
  return arch;
}

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

namespace {
void exec(sqlite3* db, const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "?";
    sqlite3_free(err);
    throw std::runtime_error("sqlite: " + m);
  }
}
std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
std::string quote(const std::string& s) {
  std::string o = "'";
  for (char c : s) { if (c == '\'') o += "''"; else o += c; }
  return o + "'";
}
}  // namespace

void write_tuning_rows(const std::string& db_path, const std::string& dump_path,
                       const std::vector<TuneRow>& rows) {
  const std::string arch = gpu_arch(), gpu = gpu_name(), date = today();
  sqlite3* db = nullptr;
  if (sqlite3_open(db_path.c_str(), &db) != SQLITE_OK) throw std::runtime_error("cannot open " + db_path);
  std::string schema_path = "db/schema.sql";
  std::string schema = read_text(schema_path);
  if (schema.empty()) {  // the schema ships with the sources; the tables it makes are these
    sqlite3_close(db);
    throw std::runtime_error("cannot read " + schema_path + " (run from the project root)");
  }
  exec(db, schema);
  exec(db, "BEGIN");
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db,
                     "INSERT OR REPLACE INTO tuning VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)",
                     -1, &st, nullptr);
  for (auto& r : rows) {
    sqlite3_bind_text(st, 1, arch.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, r.op.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, r.dtype.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, r.layout.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 5, r.k0);
    sqlite3_bind_int64(st, 6, r.k1);
    sqlite3_bind_int64(st, 7, r.k2);
    sqlite3_bind_text(st, 8, r.variant.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 9, r.time_us);
    sqlite3_bind_text(st, 10, r.runner_up.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 11, r.runner_up_us);
    sqlite3_bind_text(st, 12, gpu.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 13, date.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_DONE) {
      std::string m = sqlite3_errmsg(db);
      sqlite3_finalize(st);
      sqlite3_close(db);
      throw std::runtime_error("sqlite insert: " + m);
    }
    sqlite3_reset(st);
  }
  sqlite3_finalize(st);
  exec(db, "COMMIT");
  if (!dump_path.empty()) {
    // Re-dump every row of this arch from the database, plus the dump's rows of other arches
    // and ops that the database does not hold, sorted, one INSERT per line.
    std::vector<std::string> lines;
    std::set<std::string> keys;
    sqlite3_prepare_v2(db,
                       "SELECT arch,op,dtype,layout,k0,k1,k2,variant,time_us,runner_up,runner_up_us,gpu,tuned_at "
                       "FROM tuning ORDER BY arch,op,dtype,layout,k0,k1,k2", -1, &st, nullptr);
    auto col = [&](int c) {
      const unsigned char* t = sqlite3_column_text(st, c);
      return t ? std::string(reinterpret_cast<const char*>(t)) : std::string();
    };
    while (sqlite3_step(st) == SQLITE_ROW) {
      std::string key = col(0) + "|" + col(1) + "|" + col(2) + "|" + col(3) + "|" + col(4) + "|" + col(5) + "|" + col(6);
      keys.insert(key);
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.3f", sqlite3_column_double(st, 8));
      std::string t1 = buf;
      std::snprintf(buf, sizeof buf, "%.3f", sqlite3_column_double(st, 10));
      lines.push_back("INSERT OR REPLACE INTO tuning VALUES (" + quote(col(0)) + "," + quote(col(1)) + "," +
                      quote(col(2)) + "," + quote(col(3)) + "," + col(4) + "," + col(5) + "," + col(6) + "," +
                      quote(col(7)) + "," + t1 + "," + quote(col(9)) + "," + buf + "," + quote(col(11)) +
                      "," + quote(col(12)) + ");");
    }
    sqlite3_finalize(st);
    // Keep rows of the existing dump that this database has never seen (other ops' tuning).
    std::ifstream old(dump_path);
    std::string header = "-- " + arch + " tuning rows (written by flytune; reviewable text, built into the embedded DB)";
    for (std::string line; std::getline(old, line);) {
      if (line.rfind("INSERT", 0) != 0) continue;
      // key = first seven values
      size_t open = line.find('(');
      std::string vals = line.substr(open + 1);
      std::string key;
      int fields = 0;
      bool inq = false;
      for (char c : vals) {
        if (c == '\'') { inq = !inq; continue; }
        if (c == ',' && !inq) { if (++fields == 7) break; key += '|'; continue; }
        key += c;
      }
      if (!keys.count(key)) lines.push_back(line);
    }
    std::sort(lines.begin(), lines.end());
    std::ofstream out(dump_path);
    out << header << "\n";
    for (auto& l : lines) out << l << "\n";
  }
  sqlite3_close(db);
}

std::vector<std::string> bundled_variants(const std::string& family) {
  std::vector<std::string> out;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const char* fam = nullptr;
    if (fly_variant_info(fly_variant_name(i), &fam, nullptr) == FLY_SUCCESS && family == fam)
      out.push_back(fly_variant_name(i));
  }
  return out;
}

int64_t variant_param(const std::string& name, const std::string& key) {
  const char* params = nullptr;
  if (fly_variant_info(name.c_str(), nullptr, &params) != FLY_SUCCESS) return -1;
  std::stringstream ss(params);
  for (std::string kv; std::getline(ss, kv, ';');) {
    size_t eq = kv.find('=');
    if (eq != std::string::npos && kv.substr(0, eq) == key) {
      try { return std::stoll(kv.substr(eq + 1)); } catch (...) { return -1; }
    }
  }
  return -1;
}

}  // namespace fly::tools
