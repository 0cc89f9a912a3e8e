// flytune gemm: for the suite shapes and M buckets (1..16384) of the suite's (N, K) pairs, in each
// requested layout, checks every bundled gemm variant of the dtype on sampled elements against a
// double-precision reference, times it, and writes the winner per (dtype, layout, N, K, M).
//   flytune gemm [--db FILE] [--dump db/sm_90a.sql] [--suite FILE] [--layouts nt,nn,tn,tt]
//                [--dtype bf16] [--quick] [--max-minutes X]
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>

#include "tool_common.hpp"

namespace fly::tools {
namespace {

float half_bits_to_float(uint16_t h, fly_dtype dt) {
  if (dt == FLY_BF16) { __nv_bfloat16 b; std::memcpy(&b, &h, 2); return __bfloat162float(b); }
  __half x; std::memcpy(&x, &h, 2); return __half2float(x);
}

// A[M,K], B[K,N] in a given layout ("nt": A row-major, B column-major, ...), C[M,N] row-major.
struct GemmBuffers {
  fly_dtype dt;
  int64_t M, N, K;
  bool a_row, b_row;
  DeviceBuffer a, b, c;
  GemmBuffers(fly_dtype dt_, int64_t M_, int64_t N_, int64_t K_, const std::string& layout, uint64_t seed)
      : dt(dt_), M(M_), N(N_), K(K_), a_row(layout[0] == 'n'), b_row(layout[1] == 'n'),
        a(size_t(M_ * K_) * 2), b(size_t(K_ * N_) * 2), c(size_t(M_ * N_) * 2) {
    fill_random(a.ptr, size_t(M * K), dt, seed, -1.f, 1.f);
    fill_random(b.ptr, size_t(K * N), dt, seed + 1, -1.f, 1.f);
  }
  int64_t lda() const { return a_row ? K : M; }
  int64_t ldb() const { return b_row ? N : K; }
  fly_status run(cudaStream_t s) const {
    fly_tensor ta = a_row ? tensor2d(a.ptr, dt, M, K, K) : tensor2d(a.ptr, dt, M, K, 1);
    if (!a_row) { ta.strides[0] = 1; ta.strides[1] = M; }
    fly_tensor tb = b_row ? tensor2d(b.ptr, dt, K, N, N) : tensor2d(b.ptr, dt, K, N, 1);
    if (!b_row) { tb.strides[0] = 1; tb.strides[1] = K; }
    fly_tensor tc = tensor2d(c.ptr, dt, M, N, N);
    return fly_gemm(&ta, &tb, &tc, nullptr, nullptr, 0, s);
  }
  // Largest error over sampled elements in units of the tolerance (<= 1 passes).
  double check(cudaStream_t s, uint64_t seed) const {
    TOOL_CUDA(cudaMemsetAsync(c.ptr, 0xFF, size_t(M * N) * 2, s));
    TOOL_FLY(run(s));
    TOOL_CUDA(cudaStreamSynchronize(s));
    std::mt19937_64 rng(seed);
    const int samples = 24;
    std::vector<int64_t> ms, ns;
    for (int i = 0; i < samples; ++i) {
      ms.push_back(i == 0 ? M - 1 : int64_t(rng() % uint64_t(M)));
      ns.push_back(i == 0 ? N - 1 : int64_t(rng() % uint64_t(N)));
    }
    std::vector<uint16_t> arow(static_cast<size_t>(K)), bcol(static_cast<size_t>(K));
    double worst = 0;
    for (int i = 0; i < samples; ++i) {
      const int64_t m = ms[i], n = ns[i];
      const uint16_t* ap = static_cast<const uint16_t*>(a.ptr);
      const uint16_t* bp = static_cast<const uint16_t*>(b.ptr);
      if (a_row) TOOL_CUDA(cudaMemcpy(arow.data(), ap + m * K, size_t(K) * 2, cudaMemcpyDeviceToHost));
      else TOOL_CUDA(cudaMemcpy2D(arow.data(), 2, ap + m, size_t(M) * 2, 2, size_t(K), cudaMemcpyDeviceToHost));
      if (!b_row) TOOL_CUDA(cudaMemcpy(bcol.data(), bp + n * K, size_t(K) * 2, cudaMemcpyDeviceToHost));
      else TOOL_CUDA(cudaMemcpy2D(bcol.data(), 2, bp + n, size_t(N) * 2, 2, size_t(K), cudaMemcpyDeviceToHost));
      uint16_t hc;
      TOOL_CUDA(cudaMemcpy(&hc, static_cast<const uint16_t*>(c.ptr) + m * N + n, 2, cudaMemcpyDeviceToHost));
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(half_bits_to_float(arow[size_t(k)], dt)) * half_bits_to_float(bcol[size_t(k)], dt);
        ref += p;
        mag += std::fabs(p);
      }
      const double got = half_bits_to_float(hc, dt);
      const double tol = (dt == FLY_BF16 ? 1.0 / 128 : 1.0 / 1024) * std::fabs(ref) + 1e-5 * mag + 1e-6;
      const double e = std::fabs(got - ref) / tol;
      worst = std::max(worst, std::isfinite(e) ? e : 1e30);
    }
    return worst;
  }
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

}  // namespace

int tune_gemm(const Args& args) {
  nlohmann::json space = nlohmann::json::parse(std::ifstream("tuning/gemm.json"));
  nlohmann::json suite = load_suite(args.get("suite", "suites/gemm_bf16.json"));
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

  std::vector<std::string> variants;
  for (auto& v : bundled_variants("gemm"))
    if (v.find(std::string("_") + dname + "_") != std::string::npos) variants.push_back(v);
  if (variants.empty()) throw std::runtime_error(std::string("no bundled gemm variant for ") + dname);

  // NOTE: each finished key is written to --db at once and --max-minutes stops cleanly, so a
  // run cut short (a lease, a timeout) keeps what it measured.
  const std::string db = args.get("db", "flykernels_tuning.sqlite");
  const double max_seconds = args.has("max-minutes") ? 60.0 * std::stod(args.get("max-minutes")) : 1e30;
  const auto t0 = std::chrono::steady_clock::now();
  bool out_of_time = false;
  cudaStream_t s = 0;
  Progress bar(shapes.size() * layouts.size() * variants.size(), "flytune gemm");
  std::vector<TuneRow> rows;
  int rejected = 0;
  for (auto& layout : layouts)
    for (auto& [N, K, M] : shapes) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > max_seconds) {
        out_of_time = true;
        break;
      }
      GemmBuffers buf(dt, M, N, K, layout, 1000 + uint64_t(M + N + K));
      std::vector<std::pair<double, std::string>> timed;
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
        const double flop = 2.0 * double(M) * N * K;
        const int reps = quick ? 7 : (flop > 2e11 ? 9 : 15);
        timed.emplace_back(time_median_us([&] { TOOL_FLY(buf.run(s)); }, s, 2, reps), v);
      }
      TOOL_FLY(fly_force_variant(nullptr));
      if (timed.empty()) continue;
      std::sort(timed.begin(), timed.end());
      TuneRow r;
      r.op = "gemm";
      r.dtype = dname;
      r.layout = layout;
      r.k0 = N;
      r.k1 = K;
      r.k2 = M;
      r.variant = timed[0].second;
      r.time_us = timed[0].first;
      if (timed.size() > 1) { r.runner_up = timed[1].second; r.runner_up_us = timed[1].first; }
      rows.push_back(r);
      write_tuning_rows(db, "", {r});
    }
  bar.done();
  if (out_of_time)
    std::fprintf(stderr, "flytune gemm: --max-minutes reached after %zu keys; writing what was measured\n", rows.size());
  write_tuning_rows(db, args.get("dump", ""), rows);
  std::printf("flytune gemm: %zu rows written to %s%s%s; %d variant runs rejected by the check\n", rows.size(),
              db.c_str(), args.has("dump") ? " and " : "", args.get("dump", "").c_str(), rejected);
  return rejected ? 1 : 0;
}

}  // namespace fly::tools
