// SPDX-License-Identifier: Apache-2.0
// flytune gemm: for the suite shapes and M buckets (1..16384) of the suite's (N, K) pairs, in each
// requested layout, checks every bundled gemm variant of the dtype on sampled elements against a
// double-precision reference, times it, and writes the winner per (dtype, layout, N, K, M) under
// the key fly_gemm computed for the shape (fly_last_key).
//   flytune gemm [--db FILE] [--dump db/sm_90a.sql] [--suite FILE] [--layouts nt,nn,tn,tt]
//                [--dtype bf16] [--quick] [--max-minutes X] [--variants REGEX] [--times FILE]
//                [--min-m M] [--max-m M] [--missing] [--rounds R] [--warm-ms 30]
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <chrono>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "gemm_check.hpp"

namespace fly::tools {
int tune_gemm(const Args& args) {
  nlohmann::json space = nlohmann::json::parse(std::ifstream(data_file("tuning/gemm.json")));
  nlohmann::json suite = load_suite(args.get("suite", data_file("suites/gemm_bf16.json")));
  const bool quick = args.has("quick");
  const fly_dtype dt = parse_dtype(args.get("dtype", suite.value("dtype", std::string("bf16"))));
  const char* dname = dt == FLY_F16 ? "fp16" : "bf16";
  const std::vector<std::string> layouts = split_list(args.get("layouts", quick ? "nt" : "nt,nn,tn,tt"));
  for (auto& l : layouts)
    if (l != "nt" && l != "nn" && l != "tn" && l != "tt")
      throw std::runtime_error("--layouts: unknown layout '" + l + "' (nt, nn, tn, tt)");

  // Shapes: the suite's cases, plus (unless --quick) every M bucket for each (N, K) pair.
  std::set<std::tuple<int64_t, int64_t, int64_t>> shapes;  // (N, K, M)
  std::set<std::pair<int64_t, int64_t>> nk;
  for (auto& c : suite["cases"]) {
    shapes.insert({c["N"].get<int64_t>(), c["K"].get<int64_t>(), c["M"].get<int64_t>()});
    nk.insert({c["N"].get<int64_t>(), c["K"].get<int64_t>()});
  }
  if (!quick)
    for (auto& p : nk)
      for (auto& m : space["workloads"]["m_buckets"]) {
        const int64_t M = m.get<int64_t>();
        if (double(M) * p.first * p.second > 1.2e12) continue;  // keep one run under ~2 ms
        shapes.insert({p.first, p.second, M});
      }
  // --min-m / --max-m: re-tune only the keys whose M lies in the range.
  const int64_t min_m = args.get_int("min-m", 0), max_m = args.get_int("max-m", INT64_MAX);
  for (auto it = shapes.begin(); it != shapes.end();)
    it = (std::get<2>(*it) < min_m || std::get<2>(*it) > max_m) ? shapes.erase(it) : std::next(it);
  if (shapes.empty()) throw std::runtime_error("no shape left after --min-m / --max-m");

  // --missing: only the keys that have no row yet in the shipped dump (--dump, else
  // db/<arch>.sql), e.g. to finish a run that --max-minutes cut short.
  std::set<std::string> have;
  const std::string arch = gpu_arch();
  if (args.has("missing")) {
    const std::string path = args.get("dump", "db/" + arch + ".sql");
    have = dump_keys(path);
    if (have.empty()) throw std::runtime_error("--missing: no tuning rows read from " + path);
  }
  // Keyed as asked: a shape whose launcher key differs (a "tn" or "tt" one with M = 1, written
  // under "nn" / "nt") is found only where an older run wrote the asked key, else timed again.
  auto tuned = [&](const std::string& layout, int64_t N, int64_t K, int64_t M) {
    const fly::DispatchKey k = fly::keys::gemm(dname, layout, M, N, K).key;
    return !have.empty() && have.count(tuning_key({arch, k.op, k.dtype, k.layout, std::to_string(k.k[0]),
                                                   std::to_string(k.k[1]), std::to_string(k.k[2]), "0"})) != 0;
  };
  size_t todo = 0;
  for (auto& layout : layouts)
    for (auto& [N, K, M] : shapes) todo += tuned(layout, N, K, M) ? 0 : 1;
  if (todo == 0) {
    std::printf("flytune gemm: every selected key already has a row; nothing to do\n");
    return 0;
  }

  // --variants REGEX: tune only the bundled variants whose name matches.
  const std::regex only(args.get("variants", "."));
  std::vector<std::string> variants;
  for (auto& v : bundled_variants("gemm"))
    if (v.find(std::string("_") + dname + "_") != std::string::npos && std::regex_search(v, only))
      variants.push_back(v);
  if (variants.empty()) throw std::runtime_error(std::string("no bundled gemm variant for ") + dname);

  // NOTE: each finished key is written to --db at once and --max-minutes stops cleanly, so a
  // run cut short (a lease, a timeout) keeps what it measured.
  const std::string db = args.get("db", "flykernels_tuning.sqlite");
  // --rounds R: the variants within 5% of the first pass's best (at most 6) are timed R - 1 more
  // times, round-robin in a rotating order, and ranked by the median of their rounds: large shapes
  // heat the GPU, so one pass in a fixed order favours whichever variant ran cool.
  const int rounds = int(args.get_int("rounds", 3));
  // --warm-ms: each timing starts after about this many ms of back-to-back runs (as flybench gemm).
  const double warm_ms = args.get_double("warm-ms", 30);
  if (!(warm_ms >= 0 && warm_ms <= 1000)) throw std::runtime_error("--warm-ms: expected 0..1000");
  if (rounds < 1 || rounds > 15) throw std::runtime_error("--rounds: expected 1..15");
  const double max_seconds = args.has("max-minutes") ? 60.0 * args.get_double("max-minutes", 0) : 1e30;
  const auto t0 = std::chrono::steady_clock::now();
  bool out_of_time = false;
  cudaStream_t s = 0;
  Progress bar(todo * variants.size(), "flytune gemm");
  std::vector<TuneRow> rows;
  int rejected = 0;
  for (auto& layout : layouts)
    for (auto& [N, K, M] : shapes) {
      if (tuned(layout, N, K, M)) continue;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > max_seconds) {
        out_of_time = true;
        break;
      }
      GemmBuffers buf(dt, M, N, K, layout, 1000 + uint64_t(M + N + K));
      std::vector<std::pair<double, std::string>> timed;
      const int reps = quick ? 7 : (2.0 * double(M) * N * K > 2e11 ? 9 : 15);
      const std::string what = layout + " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
      for (auto& v : variants) {
        bar.step(what + " " + v);
        TOOL_FLY(fly_force_variant(v.c_str()));
        if (buf.run(s) == FLY_ERROR_UNSUPPORTED) continue;  // the variant cannot take this shape
        const double err = buf.check(s, uint64_t(M * 7 + N));
        if (!(err <= 1.0)) {
          std::fprintf(stderr, "\nflytune gemm: %s rejected on %s: error %.2f x tolerance\n", v.c_str(), what.c_str(), err);
          ++rejected;
          continue;
        }
        timed.emplace_back(time_median_us([&] { TOOL_FLY(buf.run(s)); }, s, 2, reps, true, warm_ms), v);
      }
      std::sort(timed.begin(), timed.end());
      size_t finalists = 0;
      while (finalists < timed.size() && finalists < 6 && timed[finalists].first <= timed[0].first * 1.05) ++finalists;
      if (rounds > 1 && finalists > 1) {
        std::vector<std::vector<double>> seen(finalists);
        for (size_t i = 0; i < finalists; ++i) seen[i].push_back(timed[i].first);
        for (int r = 1; r < rounds; ++r)
          for (size_t j = 0; j < finalists; ++j) {
            const size_t i = (j + size_t(r)) % finalists;
            TOOL_FLY(fly_force_variant(timed[i].second.c_str()));
            seen[i].push_back(time_median_us([&] { TOOL_FLY(buf.run(s)); }, s, 1, reps, true, warm_ms));
          }
        for (size_t i = 0; i < finalists; ++i) {
          std::sort(seen[i].begin(), seen[i].end());
          timed[i].first = seen[i][seen[i].size() / 2];
        }
        std::sort(timed.begin(), timed.end());
      }
      TOOL_FLY(fly_force_variant(nullptr));
      if (timed.empty()) continue;
      append_times(args, std::string(dname) + " " + what, timed);
      // The launcher's key, not (layout, N, K, M) as asked: fly_gemm keys a one-row A or a
      // one-column B by how it reads them (a "tn" call with M = 1 looks up "nn").
      TuneRow r = launcher_row("gemm", std::string(dname) + " " + what);
      set_winners(r, timed);
      rows.push_back(r);
      write_tuning_rows(db, "", {r});
    }
  bar.done();
  if (out_of_time)
    std::fprintf(stderr, "flytune gemm: --max-minutes reached after %zu keys; writing what was measured\n", rows.size());
  return finish_tuning(args, "gemm", db, rows, rejected);
}

}  // namespace fly::tools
