// SPDX-License-Identifier: Apache-2.0
// flybench: runs the benchmark suites through the library dispatch and prints time and throughput.
//   flybench <family> [--suite FILE] [--json FILE]
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <exception>

#include "tool_common.hpp"

namespace fly::tools {
// Each family's tuner lives in tools/flybench_<family>.cpp (weak: a build may leave one out).
int bench_rmsnorm(const Args&) __attribute__((weak));
int bench_topk(const Args&) __attribute__((weak));
int bench_gemm(const Args&) __attribute__((weak));
int bench_attention(const Args&) __attribute__((weak));
int bench_grouped_gemm(const Args&) __attribute__((weak));
int bench_mxfp(const Args&) __attribute__((weak));
}  // namespace fly::tools

int main(int argc, char** argv) try {
  using namespace fly::tools;
  // options: the family's --flags, so a mistyped one stops the run at once (nullptr: not checked).
  struct Entry { const char* name; int (*fn)(const Args&); const char* what; const char* options = nullptr; };
  const Entry entries[] = {
      {"rmsnorm", bench_rmsnorm, "RMSNorm forward: suite shapes + an N x M grid, 3 dtypes",
       "suite json no-flush"},
      {"topk", bench_topk, "TopK: suite shapes, deterministic off and on",
       "suite json deterministic largest"},
      {"gemm", bench_gemm, "dense GEMM: suite shapes and M buckets, 4 layouts",
       "suite json dtype layouts warm-ms"},
      {"attention", bench_attention, "attention forward: suite shapes and decode cases, 2 dtypes",
       "suite json dtype variant reps no-flush no-decode bwd"},
      {"grouped_gemm", bench_grouped_gemm, "grouped GEMM (mixture-of-experts): suite shapes, B K- or N-contiguous",
       "suite json dtype layouts warm-ms"},
      {"mxfp", bench_mxfp, "MX block-scaled GEMM (MXFP8, MXFP4) and the MX quantizer: suite shapes",
       "suite json no-flush variant quant-variant"},
  };
  Args args = parse_args(argc, argv);
  if (args.has("version")) {
    print_version("flybench");
    return 0;
  }
  check_values(args, "flybench");  // --data-dir (or any option that takes a value) without one
  if (args.has("data-dir")) set_data_dir(args.get("data-dir"));
  if (args.family.empty() && !args.has("help")) check_options(args, "help data-dir version", "flybench");
  if (args.family.empty() || args.has("help")) {
    // --help: usage on stdout, exit 0; no family: the same on stderr, exit 2.
    FILE* out = args.has("help") ? stdout : stderr;
    std::fprintf(out, "usage: flybench <family> [--suite FILE] [--json FILE]\n"
                "Runs suites/<family>.json through the library's dispatch (CUDA events, warm-up,\n"
                "median, L2 flushed) and prints time and throughput per case; --json writes them\n"
                "for bench/<family>_torch.py, which adds the PyTorch baseline side by side.\nfamilies:\n");
    int width = 0;
    for (auto& e : entries) width = std::max(width, int(std::strlen(e.name)));
    for (auto& e : entries) std::fprintf(out, "  %-*s  %s%s\n", width, e.name, e.what, e.fn ? "" : " (not built)");
    std::fprintf(out, "%s\n", data_dir_line().c_str());
    std::fprintf(out, "--version prints the library version. Exit status: 0 done, 1 a run-time failure, 2 a usage\n"
                      "error (checked before looking for a GPU), 3 no CUDA device (nothing timed).\n");
    return args.has("help") ? 0 : 2;
  }
  for (auto& e : entries)
    if (args.family == e.name) {
      if (!e.fn) { std::fprintf(stderr, "flybench: family %s is not in this build\n", e.name); return 2; }
      if (e.options) check_options(args, std::string("help data-dir version ") + e.options, "flybench");
      check_files(args);  // a --suite that is not there: diagnosed before looking for a device
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        std::fprintf(stderr, "flybench: no CUDA device here: nothing to time. Bundled variants: %d (see flyinfo)\n",
                     fly_variant_count());
        return kExitNoDevice;
      }
      return e.fn(args);
    }
  std::fprintf(stderr, "flybench: unknown family '%s' (try --help)\n", args.family.c_str());
  return 2;
} catch (const fly::tools::UsageError& e) {
  std::fprintf(stderr, "flybench: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "\nflybench: error: %s\n", e.what());
  return 1;
}
