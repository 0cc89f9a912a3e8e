// SPDX-License-Identifier: Apache-2.0
// Shared helpers of flytune / flybench: arguments, CUDA runtime checks, timing, progress bar,
// suites and tuning-database rows. Tools link the CUDA runtime; the library itself does not.
#pragma once

#include <cuda_runtime.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../src/dispatch_key.hpp"  // the library's key functions (header-only)
#include "dump_key.hpp"
#include "flykernels/flykernels.h"

namespace fly::tools {

struct Args {
  std::string family;                 // first positional argument
  std::map<std::string, std::string> opt;  // --key value / --flag (value "1")
  std::set<std::string> bare;         // options given without a value (--flag, or --key last / before --x)
  std::string get(const std::string& k, const std::string& d = "") const {
    auto it = opt.find(k);
    return it == opt.end() ? d : it->second;
  }
  bool has(const std::string& k) const { return opt.count(k) != 0; }
  // Numeric options: a value that is not a whole number throws "--k: expected ..., got '...'".
  int64_t get_int(const std::string& k, int64_t d) const;
  double get_double(const std::string& k, double d) const;
};
Args parse_args(int argc, char** argv);

// A command-line mistake (unknown option, stray argument): the tools print it and exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Throws UsageError naming the first option of `a` that is not in `known` (space-separated names),
// or the first option that takes a value (kValueOptions) given without one ("--db" last).
void check_options(const Args& a, const std::string& known, const std::string& tool);
// Options that take a value (--db FILE, --suite FILE, ...): given bare they are a usage error.
extern const char* const kValueOptions;
// Only the second check of check_options (for before the family is known).
void check_values(const Args& a, const std::string& tool);
// Everything about the command line that needs no GPU: a named file that must exist (--suite)
// is readable. Throws UsageError. The tools call it before looking for a device, so a mistake is
// diagnosed (exit 2) on a machine without one too.
void check_files(const Args& a);

// Exit codes shared by flytune and flybench (their --help and docs/install.md say so):
// 0 done, 1 a run-time failure, 2 a usage error, 3 no CUDA device (nothing was measured).
constexpr int kExitNoDevice = 3;
// "--version": prints "<tool> <library version>" (the library it runs against) to stdout.
void print_version(const char* tool);

// Data files (suites/, tuning/, db/schema.sql) are read from one directory: --data-dir DIR when
// given (set_data_dir), else <the tool's bin dir>/../share/flykernels (the installed layout), else
// the current directory or the source tree the tool was built from, whichever holds suites/.
void set_data_dir(const std::string& dir);  // "" keeps the automatic choice
std::string data_dir();                      // "" when none of the places holds suites/
std::string data_file(const std::string& relative);  // data_dir()/relative, or `relative` itself
// One help line saying where data files come from (for --help).
std::string data_dir_line();

// Throws std::runtime_error with file:line and the CUDA error string.
#define TOOL_CUDA(expr)                                                                    \
  do {                                                                                     \
    cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess)                                                                 \
      throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorString(e_) + " at " + \
                               __FILE__ + ":" + std::to_string(__LINE__));                 \
  } while (0)
// Throws on a non-success fly_status, with fly_get_last_error().
#define TOOL_FLY(expr)                                                                    \
  do {                                                                                    \
    fly_status s_ = (expr);                                                               \
    if (s_ != FLY_SUCCESS)                                                                \
      throw std::runtime_error(std::string(#expr) + ": " + fly_status_string(s_) + ": " + \
                               fly_get_last_error());                                     \
  } while (0)

// Device buffer owned by RAII.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : bytes(n) { if (n) TOOL_CUDA(cudaMalloc(&ptr, n)); }
  ~DeviceBuffer() { if (ptr) cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) { o.ptr = nullptr; o.bytes = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr) cudaFree(ptr);
      ptr = o.ptr;
      bytes = o.bytes;
      o.ptr = nullptr;
      o.bytes = 0;
    }
    return *this;
  }
};

// Row-major 2-D descriptor over `data` with leading stride `ld` (elements).
fly_tensor tensor2d(void* data, fly_dtype dt, int64_t rows, int64_t cols, int64_t ld);
fly_tensor tensor1d(void* data, fly_dtype dt, int64_t n);
size_t dtype_bytes(fly_dtype dt);
fly_dtype parse_dtype(const std::string& s);  // "fp16" | "bf16" | "fp32"; throws otherwise

// Fills a device buffer with uniform random values in [lo, hi) of dtype dt (host-generated).
void fill_random(void* dev, size_t count, fly_dtype dt, uint64_t seed, float lo = -1.f,
                 float hi = 1.f);
// Host copies converted to double (for references).
std::vector<double> to_host_double(const void* dev, size_t count, fly_dtype dt);

// Timing: runs fn() `warmup` times, then `reps` times each between CUDA events on `stream`,
// flushing L2 before each timed run unless flush_l2 is false: a kernel reads a 256 MiB buffer,
// which leaves the L2 clean (FLYBENCH_FLUSH=write: a memset instead; see l2_flush_method).
// Returns the median in microseconds. Checks cudaGetLastError after every run. warm_ms > 0 extends
// the warm-up by about that many milliseconds of back-to-back runs (at most 25 runs, so short
// kernels pay little): a large GEMM's clock settles under the power limit only after some tens of
// milliseconds, and a cold GPU ranks variants by a clock that sustained work never sees.
double time_median_us(const std::function<void()>& fn, cudaStream_t stream, int warmup = 5,
                      int reps = 25, bool flush_l2 = true, double warm_ms = 0);
// How the L2 is flushed, for reports.
const char* l2_flush_method();
// Measured device-to-device copy bandwidth (bytes read + written per second), cached per run.
double copy_bandwidth_bytes_per_s();

// One-line progress bar on stderr: "[#####.....] 12/40 topk R=4096 C=4096 k=8".
class Progress {
 public:
  Progress(size_t total, std::string title);
  void step(const std::string& what);
  void done();
 private:
  size_t total_, n_ = 0;
  std::string title_;
  bool tty_;
};

// Suites live in suites/<name>.json (copied from the shared suites); see data_file().
nlohmann::json load_suite(const std::string& path);

// GPU name ("NVIDIA H200") and arch ("sm_90a") of device 0, and today's date (YYYY-MM-DD).
std::string gpu_name();
std::string gpu_arch();
std::string today();

// One tuning result. Columns as in db/schema.sql.
struct TuneRow {
  std::string op, dtype, layout;
  int64_t k0 = 0, k1 = 0, k2 = 0, k3 = 0;
  std::string variant;
  double time_us = 0;
  std::string runner_up;
  double runner_up_us = 0;
};
// A row keyed as the launcher keyed the case just timed (fly_last_key): every dispatch since the
// case began was one of its runs, so the row matches what the library looks up, whatever its key
// rule. Throws when the last dispatch was another op than `op` (`what` names the case).
inline TuneRow launcher_row(const std::string& op, const std::string& what) {
  const char *kop = nullptr, *kdt = nullptr, *klayout = nullptr;
  int64_t k[4];
  fly_last_key(&kop, &kdt, &klayout, k);
  if (op != kop) throw std::runtime_error("flytune: the last dispatch of " + what + " was '" + kop + "', not " + op);
  TuneRow r;
  r.op = kop;
  r.dtype = kdt;
  r.layout = klayout;
  r.k0 = k[0];
  r.k1 = k[1];
  r.k2 = k[2];
  r.k3 = k[3];
  return r;
}
// A row under a key the library's own key function computed (src/dispatch_key.hpp keys::), for a
// tool that needs the key before it launches (flytune grouped_gemm groups its cases by key).
inline TuneRow key_row(const fly::ShapeKey& sk) {
  TuneRow r;
  r.op = sk.key.op;
  r.dtype = sk.key.dtype;
  r.layout = sk.key.layout;
  r.k0 = sk.key.k[0];
  r.k1 = sk.key.k[1];
  r.k2 = sk.key.k[2];
  r.k3 = sk.key.k[3];
  return r;
}
// Throws unless this thread's last dispatch (fly_last_key) computed exactly the key of `r`: a row
// keyed before its launches must be the one the launcher looks up (`what` names the case).
inline void expect_launcher_key(const TuneRow& r, const std::string& what) {
  const TuneRow got = launcher_row(r.op, what);
  if (got.dtype != r.dtype || got.layout != r.layout || got.k0 != r.k0 || got.k1 != r.k1 || got.k2 != r.k2 ||
      got.k3 != r.k3)
    throw std::runtime_error("flytune: " + what + ": the launcher keyed it " + got.op + " " + got.dtype + " " +
                             got.layout + " " + std::to_string(got.k0) + " " + std::to_string(got.k1) + " " +
                             std::to_string(got.k2) + " " + std::to_string(got.k3) + ", not as the tool did");
}
// The winner and runner-up of a row from its (time, variant) list sorted fastest first (non-empty).
inline void set_winners(TuneRow& r, const std::vector<std::pair<double, std::string>>& timed) {
  r.variant = timed[0].second;
  r.time_us = timed[0].first;
  if (timed.size() > 1) {
    r.runner_up = timed[1].second;
    r.runner_up_us = timed[1].first;
  }
}
// Every key of a db/<arch>.sql dump ("arch|op|dtype|layout|k0|k1|k2|k3", dump_key.hpp); empty when
// the file cannot be read.
std::set<std::string> dump_keys(const std::string& dump_path);

// Writes rows into the SQLite database at `db_path` (created with the schema when missing,
// replacing rows with the same key) and re-dumps the arch's rows of that op family into
// `dump_path` (the reviewable db/<arch>.sql file) when it is not empty: rows of other ops in the
// dump are kept.
void write_tuning_rows(const std::string& db_path, const std::string& dump_path,
                       const std::vector<TuneRow>& rows);

// The end of every `flytune <family>`: the rows into the database `db` and the --dump file, a
// summary line, and the exit code (1 when the check rejected any variant run).
int finish_tuning(const Args& args, const char* family, const std::string& db, const std::vector<TuneRow>& rows,
                  int rejected);

// --times FILE: appends every timed variant of one key to FILE as tab-separated lines
// (key, variant, microseconds), sorted fastest first, so a tuning run can be studied afterwards.
void append_times(const Args& args, const std::string& key,
                  const std::vector<std::pair<double, std::string>>& sorted_timed);

// Names of all bundled variants of a family, in the library's order.
std::vector<std::string> bundled_variants(const std::string& family);
// Integer parameter of a bundled variant ("tpr" -> 256); -1 when absent.
int64_t variant_param(const std::string& name, const std::string& key);
// The split count fly_scaled_gemm uses for a bundled mxfp variant on M x N x K with a workspace of
// ws_bytes (docs/mxfp.md "Split-K": mxw::split_count over the current device's SMs, 1 when the
// variant has no split axis or the workspace is too small).
int mx_launch_splits(const std::string& variant, int64_t M, int64_t N, int64_t K, size_t ws_bytes);

}  // namespace fly::tools
