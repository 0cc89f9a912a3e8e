// flybench gemm: the gemm suite through the library's dispatch, NT first, then NN, TN and TT on the
// same shapes: time (median, L2 flushed), TFLOP/s, and for M <= 128 the fraction of the
// weight-read floor (bytes of B / measured copy bandwidth).
//   flybench gemm [--suite FILE] [--layouts nt,nn,tn,tt] [--json PATH]
// --json writes [{"M","N","K","layout","us","tflops","variant"}].
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "tool_common.hpp"

namespace fly::tools {
namespace {

float bits_to_float(uint16_t h, fly_dtype dt) {
  if (dt == FLY_BF16) { __nv_bfloat16 b; std::memcpy(&b, &h, 2); return __bfloat162float(b); }
  __half x; std::memcpy(&x, &h, 2); return __half2float(x);
}

struct Bufs {
  fly_dtype dt;
  int64_t M, N, K;
  bool a_row, b_row;
  DeviceBuffer a, b, c;
  Bufs(fly_dtype dt_, int64_t M_, int64_t N_, int64_t K_, const std::string& layout)
      : dt(dt_), M(M_), N(N_), K(K_), a_row(layout[0] == 'n'), b_row(layout[1] == 'n'),
        a(size_t(M_ * K_) * 2), b(size_t(K_ * N_) * 2), c(size_t(M_ * N_) * 2) {
    fill_random(a.ptr, size_t(M * K), dt, 11 + uint64_t(M), -1.f, 1.f);
    fill_random(b.ptr, size_t(K * N), dt, 17 + uint64_t(N), -1.f, 1.f);
  }
  fly_status run(cudaStream_t s) const {
    fly_tensor ta = tensor2d(a.ptr, dt, M, K, K), tb = tensor2d(b.ptr, dt, K, N, N);
    if (!a_row) { ta.strides[0] = 1; ta.strides[1] = M; }
    if (!b_row) { tb.strides[0] = 1; tb.strides[1] = K; }
    fly_tensor tc = tensor2d(c.ptr, dt, M, N, N);
    return fly_gemm(&ta, &tb, &tc, nullptr, nullptr, 0, s);
  }
  // Spot check of 8 elements against a double reference; true when all are within tolerance.
  bool spot_check() const {
    std::vector<uint16_t> ar(static_cast<size_t>(K)), bc(static_cast<size_t>(K));
    const uint16_t* ap = static_cast<const uint16_t*>(a.ptr);
    const uint16_t* bp = static_cast<const uint16_t*>(b.ptr);
    for (int i = 0; i < 8; ++i) {
      const int64_t m = (i * 2654435761ull) % uint64_t(M), n = (i * 40503ull + 7) % uint64_t(N);
      if (a_row) TOOL_CUDA(cudaMemcpy(ar.data(), ap + m * K, size_t(K) * 2, cudaMemcpyDeviceToHost));
      else TOOL_CUDA(cudaMemcpy2D(ar.data(), 2, ap + m, size_t(M) * 2, 2, size_t(K), cudaMemcpyDeviceToHost));
      if (!b_row) TOOL_CUDA(cudaMemcpy(bc.data(), bp + n * K, size_t(K) * 2, cudaMemcpyDeviceToHost));
      else TOOL_CUDA(cudaMemcpy2D(bc.data(), 2, bp + n, size_t(N) * 2, 2, size_t(K), cudaMemcpyDeviceToHost));
      uint16_t hc;
      TOOL_CUDA(cudaMemcpy(&hc, static_cast<const uint16_t*>(c.ptr) + m * N + n, 2, cudaMemcpyDeviceToHost));
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(bits_to_float(ar[size_t(k)], dt)) * bits_to_float(bc[size_t(k)], dt);
        ref += p;
        mag += std::fabs(p);
      }
      const double tol = (dt == FLY_BF16 ? 1.0 / 128 : 1.0 / 1024) * std::fabs(ref) + 1e-5 * mag + 1e-6;
      if (!(std::fabs(bits_to_float(hc, dt) - ref) <= tol)) return false;
    }
    return true;
  }
};

}  // namespace

int bench_gemm(const Args& args) {
  nlohmann::json suite = load_suite(args.get("suite", "suites/gemm_bf16.json"));
  const fly_dtype dt = parse_dtype(args.get("dtype", suite.value("dtype", std::string("bf16"))));
  std::vector<std::string> layouts;
  {
    std::stringstream ss(args.get("layouts", "nt,nn,tn,tt"));
    std::string l;
    while (std::getline(ss, l, ','))
      if (!l.empty()) layouts.push_back(l);
  }
  cudaStream_t s = 0;
  const double copy_bw = copy_bandwidth_bytes_per_s();  // bytes read + written per second
  std::printf("flybench gemm on %s (%s): copy bandwidth %.2f TB/s\n", gpu_name().c_str(),
              dt == FLY_BF16 ? "bf16" : "fp16", copy_bw / 1e12);
  std::printf("%-6s %6s %6s %6s %10s %8s %8s  %s\n", "layout", "M", "N", "K", "time_us", "TFLOP/s", "%floor",
              "variant");
  nlohmann::json out = nlohmann::json::array();
  bool ok = true;
  for (auto& layout : layouts)
    for (auto& c : suite["cases"]) {
      const int64_t M = c["M"], N = c["N"], K = c["K"];
      Bufs buf(dt, M, N, K, layout);
      TOOL_FLY(buf.run(s));
      TOOL_CUDA(cudaStreamSynchronize(s));
      const bool good = buf.spot_check();
      ok = ok && good;
      const std::string variant = fly_last_variant(), decision = fly_last_decision();
      const double us = time_median_us([&] { TOOL_FLY(buf.run(s)); }, s, 3, 20);
      const double tflops = 2.0 * double(M) * N * K / (us * 1e-6) / 1e12;
      // Weight-read floor: B's bytes at the measured copy bandwidth (copy bandwidth counts read +
      // write bytes, so it is the rate at which the memory moves bytes; a pure read runs as fast).
      const double floor_us = double(K) * N * 2 / copy_bw * 1e6;
      char frac[16] = "";
      if (M <= 128) std::snprintf(frac, sizeof frac, "%.0f%%", 100 * floor_us / us);
      std::printf("%-6s %6lld %6lld %6lld %10.1f %8.1f %8s  %s (%s)%s\n", layout.c_str(), (long long)M, (long long)N,
                  (long long)K, us, tflops, frac, variant.c_str(), decision.c_str(), good ? "" : "  WRONG RESULT");
      out.push_back({{"M", M}, {"N", N}, {"K", K}, {"layout", layout}, {"us", us}, {"tflops", tflops},
                     {"variant", variant}});
    }
  if (args.has("json")) std::ofstream(args.get("json")) << out.dump(1);
  if (!ok) std::fprintf(stderr, "flybench gemm: some case failed its spot check\n");
  return ok ? 0 : 1;
}

}  // namespace fly::tools
