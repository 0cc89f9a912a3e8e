// SPDX-License-Identifier: Apache-2.0
// flytune: rebuilds the tuning database on this GPU, one family at a time.
//   flytune <family> [--db FILE] [--dump db/sm_90a.sql] [--suite FILE] [--quick] ...
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <exception>

#include "tool_common.hpp"

namespace fly::tools {
// Each family's tuner lives in tools/flytune_<family>.cpp (weak: a build may leave one out).
int tune_rmsnorm(const Args&) __attribute__((weak));
int tune_topk(const Args&) __attribute__((weak));
int tune_gemm(const Args&) __attribute__((weak));
int tune_attention(const Args&) __attribute__((weak));
int tune_grouped_gemm(const Args&) __attribute__((weak));
int tune_mxfp(const Args&) __attribute__((weak));
}  // namespace fly::tools

int main(int argc, char** argv) try {
  using namespace fly::tools;
  // options: the family's --flags, so a mistyped one stops the run at once (nullptr: not checked).
  struct Entry { const char* name; int (*fn)(const Args&); const char* what; const char* options = nullptr; };
  const Entry entries[] = {
      {"rmsnorm", tune_rmsnorm, "RMSNorm forward: suite shapes + an N x M grid, 3 dtypes",
       "db dump suite quick tolerance exhaustive times"},
      {"topk", tune_topk, "TopK: suite shapes, deterministic off and on",
       "db dump suite quick times variants"},
      {"gemm", tune_gemm, "dense GEMM: suite shapes and M buckets, 4 layouts",
       "db dump suite quick times dtype layouts variants min-m max-m max-minutes missing rounds warm-ms"},
      {"attention", tune_attention, "attention forward: suite shapes and decode cases, 2 dtypes (--bwd: the backward)",
       "db dump suite quick times dtype bwd"},
      {"grouped_gemm", tune_grouped_gemm, "grouped GEMM: suite shapes, B K- or N-contiguous",
       "db dump suite quick times dtype layouts"},
      {"mxfp", tune_mxfp, "MX block-scaled GEMM (MXFP8, MXFP4): suite shapes, every bundled variant",
       "db dump suite quick times formats variants"},
  };
  Args args = parse_args(argc, argv);
  if (args.has("version")) {
    print_version("flytune");
    return 0;
  }
  check_values(args, "flytune");  // --data-dir (or any option that takes a value) without one
  if (args.has("data-dir")) set_data_dir(args.get("data-dir"));
  if (args.family.empty() && !args.has("help")) check_options(args, "help data-dir version", "flytune");
  if (args.family.empty() || args.has("help")) {
    // --help: usage on stdout, exit 0; no family: the same on stderr, exit 2.
    FILE* out = args.has("help") ? stdout : stderr;
    std::fprintf(out, "usage: flytune <family> [--db FILE] [--dump db/<arch>.sql] [--suite FILE] [--quick]\n"
                "Times every bundled variant of the family on its workloads (after checking each\n"
                "against a reference), writes the winners into --db (default flykernels_tuning.sqlite,\n"
                "usable as FLYKERNELS_TUNING_DB) and, with --dump, into the reviewable SQL dump.\n"
                "Build with -DFLY_ALL_VARIANTS=ON to tune over the whole variant space\n"
                "(-DFLY_VARIANT_MATCH=REGEX narrows it). gemm also takes --layouts nt,nn,tn,tt,\n"
                "--dtype bf16|fp16, --variants REGEX (also topk), --min-m/--max-m M and --max-minutes X (each\n"
                "key is written as soon as it is measured, so a run cut short keeps its rows;\n"
                "--missing then tunes only the keys with no row in the dump yet).\n"
                "--rounds R (gemm, default 3) re-times the variants within 5%% of the best R - 1 more\n"
                "times, interleaved, and ranks them by the median (1: one pass); --warm-ms X\n"
                "(gemm, default 30) runs about X ms of back-to-back calls before each timing.\n"
                "--times FILE appends every variant's time per key (tab-separated, fastest first).\n"
                "attention --bwd tunes the backward (attention_bwd rows) on the suite's cases.\n"
                "families:\n");
    int width = 0;
    for (auto& e : entries) width = std::max(width, int(std::strlen(e.name)));
    for (auto& e : entries) std::fprintf(out, "  %-*s  %s%s\n", width, e.name, e.what, e.fn ? "" : " (not built)");
    std::fprintf(out, "%s\n", data_dir_line().c_str());
    std::fprintf(out, "--version prints the library version. Exit status: 0 done, 1 a run-time failure, 2 a usage\n"
                      "error (checked before looking for a GPU), 3 no CUDA device (nothing tuned).\n");
    return args.has("help") ? 0 : 2;
  }
  for (auto& e : entries)
    if (args.family == e.name) {
      if (!e.fn) { std::fprintf(stderr, "flytune: family %s is not in this build\n", e.name); return 2; }
      if (e.options) check_options(args, std::string("help data-dir version ") + e.options, "flytune");
      check_files(args);  // a --suite that is not there: diagnosed before looking for a device
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        std::fprintf(stderr, "flytune: no CUDA device: tuning needs the GPU it tunes for\n");
        return kExitNoDevice;
      }
      return e.fn(args);
    }
  std::fprintf(stderr, "flytune: unknown family '%s' (try --help)\n", args.family.c_str());
  return 2;
} catch (const fly::tools::UsageError& e) {
  std::fprintf(stderr, "flytune: %s\n", e.what());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "\nflytune: error: %s\n", e.what());
  return 1;
}
