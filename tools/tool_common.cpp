// SPDX-License-Identifier: Apache-2.0
#include "tool_common.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "schema_migrate.hpp"
#include "../kernels/mx/mx_wgmma_params.h"  // mxw::launch_splits, split_ws_bytes (the launcher's split rule)

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
      } else {
        a.bare.insert(key);
        a.opt[key] = val;
        continue;
      }
      a.bare.erase(key);  // the last occurrence decides
      a.opt[key] = val;
    } else if (a.family.empty()) {
      a.family = s;
    } else {
      throw UsageError("unexpected argument '" + s + "'");
    }
  }
  return a;
}

const char* const kValueOptions =
    "data-dir db dump suite json times dtype layouts formats variant variants quant-variant tolerance "
    "max-minutes warm-ms max-m min-m reps rounds";

void check_options(const Args& a, const std::string& known, const std::string& tool) {
  std::set<std::string> names, valued;
  std::stringstream ss(known);
  for (std::string n; ss >> n;) names.insert(n);
  std::stringstream vs(kValueOptions);
  for (std::string n; vs >> n;) valued.insert(n);
  for (auto& [k, v] : a.opt)
    if (!names.count(k))
      throw UsageError("unknown option --" + k + (a.family.empty() ? "" : " for " + tool + " " + a.family) +
                       " (try " + tool + " --help)");
  for (auto& k : a.bare)
    if (valued.count(k)) throw UsageError("--" + k + " needs a value (--" + k + " VALUE; try " + tool + " --help)");
}

void check_values(const Args& a, const std::string& tool) {
  std::stringstream vs(kValueOptions);
  for (std::string n; vs >> n;)
    if (a.bare.count(n)) throw UsageError("--" + n + " needs a value (--" + n + " VALUE; try " + tool + " --help)");
}

void check_files(const Args& a) {
  if (a.has("suite")) {
    const std::string path = a.get("suite");
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || ::access(path.c_str(), R_OK) != 0)
      throw UsageError("--suite " + path + ": no readable file there");
  }
}

void print_version(const char* tool) { std::printf("%s %s\n", tool, fly_version_string()); }

namespace {
#ifndef FLY_DATA_FROM_BINDIR
#define FLY_DATA_FROM_BINDIR "../share/flykernels"
#endif
#ifndef FLY_SOURCE_DIR
#define FLY_SOURCE_DIR ""
#endif
bool has_suites(const std::string& dir) {
  struct stat st{};
  return !dir.empty() && ::stat((dir + "/suites").c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
std::string exe_dir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  std::string p(buf, size_t(n));
  return p.substr(0, p.rfind('/'));
}
// The directory the automatic choice picks: installed layout, then cwd, then the source tree.
std::string find_data_dir() {
  const std::string installed = std::string(FLY_DATA_FROM_BINDIR).rfind('/', 0) == 0
                                    ? std::string(FLY_DATA_FROM_BINDIR)
                                    : exe_dir() + "/" + FLY_DATA_FROM_BINDIR;
  for (const std::string& d : {installed, std::string("."), std::string(FLY_SOURCE_DIR)})
    if (has_suites(d)) {
      char* real = ::realpath(d.c_str(), nullptr);  // absolute, so --help and messages say where
      std::string out = real ? real : d;
      std::free(real);
      return out;
    }
  return "";
}
std::string& chosen_data_dir() {
  static std::string dir = find_data_dir();
  return dir;
}
}  // namespace

void set_data_dir(const std::string& dir) {
  if (dir.empty()) return;
  if (!has_suites(dir)) throw UsageError("--data-dir " + dir + ": no suites/ directory there");
  chosen_data_dir() = dir;
}

std::string data_dir() { return chosen_data_dir(); }

std::string data_file(const std::string& relative) {
  const std::string& d = chosen_data_dir();
  return d.empty() ? relative : d + "/" + relative;
}

std::string data_dir_line() {
  const std::string& d = chosen_data_dir();
  return "data: " + (d.empty() ? std::string("not found (no suites/ beside the tool, here, or in the source tree)")
                               : d) +
         " (suites/, tuning/, db/schema.sql; --data-dir DIR overrides)";
}

size_t dtype_bytes(fly_dtype dt) {
  switch (dt) {
    case FLY_F16: case FLY_BF16: return 2;
    case FLY_F32: case FLY_I32: return 4;
    case FLY_F64: case FLY_I64: return 8;
    case FLY_U8: case FLY_F8_E4M3: case FLY_F4_E2M1X2: case FLY_E8M0: return 1;
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
  // NOTE: counter-based (splitmix64 of seed and index) and spread over the host's cores, so a
  // 235M-element GEMM operand fills in tens of milliseconds instead of seconds (mt19937 was the
  // tuner's bottleneck); the values depend only on (seed, index), not on the thread count.
  const size_t es = dtype_bytes(dt);
  if (dt != FLY_F32 && dt != FLY_F16 && dt != FLY_BF16) throw std::runtime_error("fill_random: unsupported dtype");
  std::vector<uint8_t> host(count * es);
  auto work = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 1;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const float u = float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
      const float f = lo + (hi - lo) * u;
      if (dt == FLY_F32) std::memcpy(&host[i * 4], &f, 4);
      else if (dt == FLY_F16) { __half h = __float2half(f); std::memcpy(&host[i * 2], &h, 2); }
      else { __nv_bfloat16 b = __float2bfloat16(f); std::memcpy(&host[i * 2], &b, 2); }
    }
  };
  const size_t nthreads = count < (size_t(1) << 20) ? 1 : std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  const size_t chunk = (count + nthreads - 1) / nthreads;
  for (size_t t = 1; t < nthreads; ++t)
    pool.emplace_back(work, std::min(count, t * chunk), std::min(count, (t + 1) * chunk));
  work(0, std::min(count, chunk));
  for (auto& th : pool) th.join();
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
// NOTE: the L2 flush READS a 256 MiB buffer (twice the H200's L2) with a tiny kernel instead of
// writing it. A memset flush leaves the L2 full of dirty lines, and the timed kernel then pays
// for writing ~50 MB of someone else's data back to HBM: +12 us on a 40 us RMSNorm, more than the
// weight read of a decode GEMM. Reading leaves clean lines that are dropped for free, which is the
// "cold cache" the numbers claim. FLYBENCH_FLUSH=write restores the memset flush for comparison;
// bench/*_torch.py flush the PyTorch side the same way (bench/timing.py).
const char kScrubPtx[] = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry fly_l2_scrub(.param .u64 src, .param .u64 n_vec, .param .u64 sink)
{
  .reg .pred %p<2>;
  .reg .b32 %r<12>;
  .reg .b64 %rd<10>;
  ld.param.u64 %rd1, [src];
  ld.param.u64 %rd2, [n_vec];
  ld.param.u64 %rd3, [sink];
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mov.u32 %r4, %nctaid.x;
  mul.wide.u32 %rd4, %r1, %r2;
  cvt.u64.u32 %rd5, %r3;
  add.u64 %rd4, %rd4, %rd5;
  mul.wide.u32 %rd6, %r4, %r2;
  mov.u32 %r5, 0;
LOOP:
  setp.ge.u64 %p1, %rd4, %rd2;
  @%p1 bra DONE;
  shl.b64 %rd7, %rd4, 4;
  add.u64 %rd7, %rd1, %rd7;
  ld.global.v4.u32 {%r6, %r7, %r8, %r9}, [%rd7];
  xor.b32 %r5, %r5, %r6;
  xor.b32 %r5, %r5, %r7;
  xor.b32 %r5, %r5, %r8;
  xor.b32 %r5, %r5, %r9;
  add.u64 %rd4, %rd4, %rd6;
  bra LOOP;
DONE:
  setp.ne.u32 %p1, %r5, 1;
  @%p1 bra END;
  st.global.u32 [%rd3], %r5;
END:
  ret;
}
)";

struct L2Flush {
  DeviceBuffer buf{size_t(256) << 20};
  DeviceBuffer sink{16};
  bool write_mode = false;
  cudaKernel_t scrub = nullptr;
  int blocks = 0;
  L2Flush() {
    const char* env = std::getenv("FLYBENCH_FLUSH");
    write_mode = env && std::string(env) == "write";
    // Zeros: the xor of the buffer is 0, so the kernel never stores to `sink`.
    TOOL_CUDA(cudaMemset(buf.ptr, 0, buf.bytes));
    if (!write_mode) {
      cudaLibrary_t lib = nullptr;
      TOOL_CUDA(cudaLibraryLoadData(&lib, kScrubPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
      TOOL_CUDA(cudaLibraryGetKernel(&scrub, lib, "fly_l2_scrub"));
      int dev = 0, sms = 0;
      TOOL_CUDA(cudaGetDevice(&dev));
      TOOL_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
      blocks = sms * 4;
    }
    TOOL_CUDA(cudaDeviceSynchronize());
  }
  void run(cudaStream_t stream, int i) {
    if (write_mode) {
      TOOL_CUDA(cudaMemsetAsync(buf.ptr, i & 0xff, buf.bytes, stream));
      return;
    }
    void* src = buf.ptr;
    unsigned long long n_vec = buf.bytes / 16;
    void* sink_ptr = sink.ptr;
    void* args[] = {&src, &n_vec, &sink_ptr};
    TOOL_CUDA(cudaLaunchKernel(reinterpret_cast<const void*>(scrub), dim3(blocks), dim3(512), args, 0,
                               stream));
  }
};

L2Flush& l2_flush() {
  static L2Flush f;
  return f;
}
}  // namespace

const char* l2_flush_method() {
  return l2_flush().write_mode ? "write 256 MiB (memset; leaves dirty lines)"
                               : "read 256 MiB (clean L2)";
}

double time_median_us(const std::function<void()>& fn, cudaStream_t stream, int warmup, int reps,
                      bool flush_l2, double warm_ms) {
  for (int i = 0; i < warmup; ++i) fn();
  TOOL_CUDA(cudaGetLastError());
  TOOL_CUDA(cudaStreamSynchronize(stream));
  if (warm_ms > 0) {  // time 3 runs, then about warm_ms worth more (at most 25 runs)
    const auto w0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) fn();
    TOOL_CUDA(cudaStreamSynchronize(stream));
    const double per_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count() / 3;
    const int more = int(std::min(25.0, std::ceil(warm_ms / std::max(per_ms, 1e-3))));
    for (int i = 0; i < more; ++i) fn();
    TOOL_CUDA(cudaGetLastError());
    TOOL_CUDA(cudaStreamSynchronize(stream));
  }
  cudaEvent_t a, b;
  TOOL_CUDA(cudaEventCreate(&a));
  TOOL_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    if (flush_l2) l2_flush().run(stream, i);
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
  if (!in) throw std::runtime_error("cannot read suite " + path + " (pass --suite FILE or --data-dir DIR)");
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

namespace {
// The whole of `v` as a number through `conv` (std::stoll / std::stod), else a message naming --k.
template <class T, class Conv>
T parse_number(const std::string& k, const std::string& v, Conv conv, const char* what) {
  size_t used = 0;
  T x{};
  try { x = conv(v, &used); } catch (...) { used = 0; }
  if (v.empty() || used != v.size()) throw std::runtime_error("--" + k + ": expected " + what + ", got '" + v + "'");
  return x;
}
}  // namespace

int64_t Args::get_int(const std::string& k, int64_t d) const {
  if (!has(k)) return d;
  return parse_number<int64_t>(k, get(k), [](const std::string& v, size_t* u) { return std::stoll(v, u); },
                               "an integer");
}

double Args::get_double(const std::string& k, double d) const {
  if (!has(k)) return d;
  return parse_number<double>(k, get(k), [](const std::string& v, size_t* u) { return std::stod(v, u); }, "a number");
}

void append_times(const Args& args, const std::string& key,
                  const std::vector<std::pair<double, std::string>>& sorted_timed) {
  if (!args.has("times")) return;
  const std::string path = args.get("times");
  FILE* f = std::fopen(path.c_str(), "a");
  if (!f) throw std::runtime_error("--times: cannot open " + path + " for appending");
  for (auto& [us, v] : sorted_timed) std::fprintf(f, "%s\t%s\t%.3f\n", key.c_str(), v.c_str(), us);
  std::fclose(f);
}

std::set<std::string> dump_keys(const std::string& dump_path) {
  std::set<std::string> keys;
  std::ifstream in(dump_path);
  for (std::string line; std::getline(in, line);) {
    std::string k = dump_line_key(line);
    if (!k.empty()) keys.insert(std::move(k));
  }
  return keys;
}

int finish_tuning(const Args& args, const char* family, const std::string& db, const std::vector<TuneRow>& rows,
                  int rejected) {
  write_tuning_rows(db, args.get("dump", ""), rows);
  std::printf("flytune %s: %zu rows written to %s%s%s; %d variant runs rejected by the check\n", family, rows.size(),
              db.c_str(), args.has("dump") ? " and " : "", args.get("dump", "").c_str(), rejected);
  return rejected ? 1 : 0;
}

void write_tuning_rows(const std::string& db_path, const std::string& dump_path,
                       const std::vector<TuneRow>& rows) {
  const std::string arch = gpu_arch(), gpu = gpu_name(), date = today();
  sqlite3* db = nullptr;
  if (sqlite3_open(db_path.c_str(), &db) != SQLITE_OK) throw std::runtime_error("cannot open " + db_path);
  std::string schema_path = data_file("db/schema.sql");
  std::string schema = read_text(schema_path);
  if (schema.empty()) {  // the schema ships with the sources and installs under share/flykernels
    sqlite3_close(db);
    throw std::runtime_error("cannot read " + schema_path + " (pass --data-dir DIR)");
  }
  fly::tools::apply_schema(db, schema);  // migrates a version 1 or 2 file first
  exec(db, "BEGIN");
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db,
                     "INSERT OR REPLACE INTO tuning VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14)",
                     -1, &st, nullptr);
  for (auto& r : rows) {
    sqlite3_bind_text(st, 1, arch.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, r.op.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, r.dtype.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, r.layout.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 5, r.k0);
    sqlite3_bind_int64(st, 6, r.k1);
    sqlite3_bind_int64(st, 7, r.k2);
    sqlite3_bind_int64(st, 8, r.k3);
    sqlite3_bind_text(st, 9, r.variant.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 10, r.time_us);
    sqlite3_bind_text(st, 11, r.runner_up.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 12, r.runner_up_us);
    sqlite3_bind_text(st, 13, gpu.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 14, date.c_str(), -1, SQLITE_TRANSIENT);
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
                       "SELECT arch,op,dtype,layout,k0,k1,k2,k3,variant,time_us,runner_up,runner_up_us,gpu,tuned_at "
                       "FROM tuning ORDER BY arch,op,dtype,layout,k0,k1,k2,k3", -1, &st, nullptr);
    auto col = [&](int c) {
      const unsigned char* t = sqlite3_column_text(st, c);
      return t ? std::string(reinterpret_cast<const char*>(t)) : std::string();
    };
    while (sqlite3_step(st) == SQLITE_ROW) {
      keys.insert(tuning_key({col(0), col(1), col(2), col(3), col(4), col(5), col(6), col(7)}));
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.3f", sqlite3_column_double(st, 9));
      std::string t1 = buf;
      std::snprintf(buf, sizeof buf, "%.3f", sqlite3_column_double(st, 11));
      lines.push_back("INSERT OR REPLACE INTO tuning VALUES (" + quote(col(0)) + "," + quote(col(1)) + "," +
                      quote(col(2)) + "," + quote(col(3)) + "," + col(4) + "," + col(5) + "," + col(6) + "," +
                      col(7) + "," + quote(col(8)) + "," + t1 + "," + quote(col(10)) + "," + buf + "," +
                      quote(col(12)) + "," + quote(col(13)) + ");");
    }
    sqlite3_finalize(st);
    // Keep rows of the existing dump that this database has never seen (other ops' tuning).
    std::ifstream old(dump_path);
    std::string header = "-- " + arch + " tuning rows (written by flytune; reviewable text, built into the embedded DB)";
    for (std::string line; std::getline(old, line);) {
      const std::string key = dump_line_key(line);
      if (!key.empty() && !keys.count(key)) lines.push_back(line);
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

int mx_launch_splits(const std::string& variant, int64_t M, int64_t N, int64_t K, size_t ws_bytes) {
  const int64_t split = variant_param(variant, "split"), bn = variant_param(variant, "bn");
  if (split < 2 || bn <= 0) return 1;
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    sms = 132;
  const int S = mxw::launch_splits(int(split), int(bn), M, N, K, std::min(sms, 132));
  return S > 1 && int64_t(ws_bytes) >= mxw::split_ws_bytes(S, M, N) ? S : 1;
}

}  // namespace fly::tools
