// flybench: runs the benchmark suites through the library dispatch and prints time and throughput.
//   flybench <family> [--suite FILE] [--json FILE]
#include <cstdio>
#include <cstring>
#include <exception>

#include "tool_common.hpp"

namespace fly::tools {
// Each family's tuner lives in tools/flybench_<family>.cpp (weak: a build may leave one out).
int bench_rmsnorm(const Args&) __attribute__((weak));
int bench_topk(const Args&) __attribute__((weak));
int bench_gemm(const Args&) __attribute__((weak));
int bench_attention(const Args&) __attribute__((weak));
}  // namespace fly::tools

int main(int argc, char** argv) try {
  using namespace fly::tools;
  struct Entry { const char* name; int (*fn)(const Args&); const char* what; };
  const Entry entries[] = {
      {"rmsnorm", bench_rmsnorm, "RMSNorm forward: suite shapes + an N x M grid, 3 dtypes"},
      {"topk", bench_topk, "TopK: suite shapes, deterministic off and on"},
      {"gemm", bench_gemm, "dense GEMM: suite shapes and M buckets, 4 layouts"},
      {"attention", bench_attention, "attention forward: suite shapes and decode cases, 2 dtypes"},
  };
  Args args = parse_args(argc, argv);
  if (args.family.empty() || args.has("help")) {
    std::printf("usage: flybench <family> [--suite FILE] [--json FILE]\n"
                "Runs suites/<family>.json through the library's dispatch (CUDA events, warm-up,\n"
                "median, L2 flushed) and prints time and throughput per case; --json writes them\n"
                "for bench/<family>_torch.py, which adds the PyTorch baseline side by side.\nfamilies:\n");
    for (auto& e : entries) std::printf("  %-8s %s%s\n", e.name, e.what, e.fn ? "" : " (not built)");
    return args.family.empty() ? 2 : 0;
  }
  for (auto& e : entries)
    if (args.family == e.name) {
      if (!e.fn) { std::fprintf(stderr, "flybench: family %s is not in this build\n", e.name); return 2; }
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        std::printf("flybench: no CUDA device here: nothing to time. Bundled variants: %d (see flyinfo)\n",
                    fly_variant_count());
        return 0;
      }
      return e.fn(args);
    }
  std::fprintf(stderr, "flybench: unknown family '%s' (try --help)\n", args.family.c_str());
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "\nflybench: error: %s\n", e.what());
  return 1;
}
