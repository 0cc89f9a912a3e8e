// SPDX-License-Identifier: Apache-2.0
// Seeded random driver for fly_fuzz_one: runs everywhere (no clang, no libFuzzer), reproducibly.
//   fly_fuzz_driver [--seed N] [--iterations N] [--seconds S]
// Stops at whichever limit comes first; prints the seed and the iteration of a failure.
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

int fly_fuzz_one(const uint8_t* data, size_t size);
void fly_fuzz_summary(FILE* out);

namespace {
uint64_t g_seed = 1;
uint64_t g_iteration = 0;
void report() { std::fprintf(stderr, "fly_fuzz_driver: seed %llu, iteration %llu\n", (unsigned long long)g_seed,
                             (unsigned long long)g_iteration); }
}  // namespace

int main(int argc, char** argv) {
  uint64_t iterations = 100000;
  double seconds = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--seed")) g_seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--iterations")) iterations = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--seconds")) seconds = std::atof(argv[i + 1]);
    else { std::fprintf(stderr, "usage: %s [--seed N] [--iterations N] [--seconds S]\n", argv[0]); return 2; }
  }
  std::atexit(report);
  std::signal(SIGABRT, [](int) { report(); });  // a broken promise aborts: say where
  std::mt19937_64 rng(g_seed);
  std::vector<uint8_t> buf;
  const auto start = std::chrono::steady_clock::now();
  for (g_iteration = 0; g_iteration < iterations; ++g_iteration) {
    // Each input from its own seed, so one failing iteration reproduces alone (--seed, --iterations).
    std::mt19937_64 one(rng());
    buf.resize(one() % 1000);
    for (auto& byte : buf) byte = uint8_t(one());
    fly_fuzz_one(buf.data(), buf.size());
    if (seconds > 0 && (g_iteration & 255) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds)
      break;
  }
  std::printf("fly_fuzz_driver: %llu calls, seed %llu, no broken promise\n", (unsigned long long)g_iteration,
              (unsigned long long)g_seed);
  fly_fuzz_summary(stdout);
  return 0;
}
