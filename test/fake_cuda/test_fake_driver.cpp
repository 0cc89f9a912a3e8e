// SPDX-License-Identifier: Apache-2.0
// Everything behind the device check, on the stand-in driver (FLYKERNELS_LIBCUDA = the fake,
// set by ctest): stream and pointer checks, arch check, database dispatch, variant fit, tensor
// maps and launch configuration of every family, injected driver failures. No kernel runs: the
// fake checks the driver's rules and records what it was asked to do.
#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "catch_compat.hpp"
#include "core.hpp"
#include "fake_cuda.h"
#include "flykernels/flykernels.h"
#include "gemm/gemm_decode.h"
#include "gemm/gemm_odd_params.h"
#include "gemm/gemm_params.h"
#include "rmsnorm/rmsnorm_params.h"
#include "test_tensors.hpp"
#include "topk/topk_params.h"
#include "dispatch.hpp"

namespace {

using fly_test::mat;
using fly_test::mentions;
using fly_test::vec;

// Device 1 is an sm_80 part: set before the library's first driver call.
const bool kConfigured = [] {
  fake_cuda_configure(2, 8, 0);
  return true;
}();

template <class P>
P params_of(const fake_cuda_launch* L) {
  P p;
  REQUIRE(L->param_bytes >= sizeof(P));
  std::memcpy(&p, L->params, sizeof(P));
  return p;
}

const fake_cuda_launch* last_launch() {
  const int n = fake_cuda_launch_count();
  REQUIRE(n > 0);
  return fake_cuda_get_launch(n - 1);
}

std::string status_text(fly_status s) { return std::string(fly_status_string(s)) + ": " + fly_get_last_error(); }

// Clears the forced variant when a test ends (fly_force_variant is per thread and sticky).
struct ForceGuard {
  ~ForceGuard() { fly_force_variant(nullptr); }
};

}  // namespace

TEST_CASE("device check: arch, streams, pointers", "[fake][device]") {
  REQUIRE(kConfigured);
  const char* arch = nullptr;
  CHECK(fly_variant_info("nope", nullptr, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
  REQUIRE(fly_device_arch(nullptr, &arch) == FLY_SUCCESS);
  CHECK(std::string(arch) == "sm_90a");
  CHECK(std::string(fly_get_last_error()).empty());

  void* s0 = fake_cuda_stream_create(0);
  void* s1 = fake_cuda_stream_create(1);
  CHECK(fly_device_arch(s0, &arch) == FLY_SUCCESS);
  CHECK(fly_device_arch(s1, &arch) == FLY_ERROR_ARCH_NOT_BUILT);
  CHECK(mentions("sm_80"));
  CHECK(mentions("sm_90a"));
  CHECK(fly_device_arch(reinterpret_cast<void*>(0x5000), &arch) == FLY_ERROR_CUDA);
  CHECK(mentions("cuStreamGetCtx"));

  void* xd = fake_cuda_malloc(8 * 64 * 2);
  void* yd = fake_cuda_malloc(8 * 64 * 2);
  fly_tensor x = mat(xd, FLY_BF16, 8, 64, 64), y = mat(yd, FLY_BF16, 8, 64, 64);
  REQUIRE(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, s0) == FLY_SUCCESS);
  CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, s1) == FLY_ERROR_ARCH_NOT_BUILT);
  // Host memory (not an allocation) and a buffer one row too small.
  static uint16_t host[8 * 64];
  fly_tensor xh = mat(host, FLY_BF16, 8, 64, 64);
  CHECK(fly_rms_norm_fwd(&xh, nullptr, 1e-5, &y, nullptr, s0) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("x: "));
  CHECK(mentions("not device memory"));
  fly_tensor y9 = mat(yd, FLY_BF16, 9, 64, 64), x9 = mat(fake_cuda_malloc(9 * 64 * 2), FLY_BF16, 9, 64, 64);
  CHECK(fly_rms_norm_fwd(&x9, nullptr, 1e-5, &y9, nullptr, s0) == FLY_ERROR_INVALID_ARGUMENT);
  CHECK(mentions("y: spans 1152 bytes"));
}

TEST_CASE("rmsnorm: launch configuration and parameters across shapes", "[fake][rmsnorm]") {
  void* s = fake_cuda_stream_create(0);
  for (fly_dtype dt : {FLY_F16, FLY_BF16, FLY_F32}) {
    const int64_t es = dt == FLY_F32 ? 4 : 2;
    for (int64_t N : {1, 7, 64, 1000, 4096, 8192, 65536, 262144}) {
      for (int64_t M : {1, 3, 8192}) {
        const int64_t ld = N + (N % 2);
        void* xd = fake_cuda_malloc(size_t(M * ld * es));
        void* yd = fake_cuda_malloc(size_t(M * ld * es));
        void* wd = fake_cuda_malloc(size_t(N * es));
        void* rd = fake_cuda_malloc(size_t(M * 4));
        fly_tensor x = mat(xd, dt, M, N, ld), y = mat(yd, dt, M, N, ld), w = vec(wd, dt, N), r = vec(rd, FLY_F32, M);
        fake_cuda_clear_records();
        const fly_status st = fly_rms_norm_fwd(&x, &w, 1e-6, &y, &r, s);
        INFO(fly::dtype_name(dt) << " M=" << M << " N=" << N << " " << status_text(st) << " " << fake_cuda_last_refusal());
        REQUIRE(st == FLY_SUCCESS);
        REQUIRE(fake_cuda_launch_count() == 1);
        const fake_cuda_launch* L = last_launch();
        CHECK(std::string(L->kernel) == "rmsnorm_fwd");
        const char *kop = nullptr, *kdt = nullptr, *klayout = nullptr;
        int64_t k[4];
        fly_last_key(&kop, &kdt, &klayout, k);  // the launcher's key: (N, M)
        CHECK(std::string(kop) == "rmsnorm_fwd");
        CHECK(std::string(kdt) == fly::dtype_name(dt));
        CHECK((k[0] == N && k[1] == M));
        const fly::Variant* v = fly::find_variant(fly_last_variant());
        REQUIRE(v);
        CHECK(v->family == "rmsnorm");
        CHECK(v->get("dtype") == fly::dtype_name(dt));
        CHECK(L->block[0] == unsigned(v->get_int("tpr") * v->get_int("rpc")));
        const auto p = params_of<RmsNormParams>(L);
        CHECK(p.x == xd);
        CHECK(p.y == yd);
        CHECK(p.w == wd);
        CHECK(p.rstd == rd);
        CHECK(p.M == M);
        CHECK(p.N == N);
        CHECK(p.ldx == (M > 1 ? ld : N));
        CHECK(p.eps == 1e-6f);
        // Every row group has a CTA slot, every row a group, and groups cover the period classes.
        CHECK(int64_t(L->grid[0]) * v->get_int("rpc") >= p.groups);
        CHECK(p.groups >= 1);
        CHECK(p.groups % p.period == 0);
        CHECK(p.groups <= M + p.period);
        CHECK(L->stream == s);
      }
    }
  }
}

TEST_CASE("topk: every bundled variant's path launches as planned", "[fake][topk]") {
  ForceGuard guard;
  void* s = fake_cuda_stream_create(0);
  std::set<std::string> paths;
  for (const fly::Variant* v : fly::variants_of("topk")) {
    const std::string path = v->get("path");
    const int64_t kmax = v->get_int("kmax", 64);
    const int64_t R = path == "split" ? 4 : 300, C = path == "split" ? 3 * v->get_int("chunk") + 5 : 5000;
    const int64_t k = std::min<int64_t>(kmax, 37);
    for (int det : {0, 1}) {
      void* xd = fake_cuda_malloc(size_t(R * C * 4));
      void* vd = fake_cuda_malloc(size_t(R * k * 4));
      void* id = fake_cuda_malloc(size_t(R * k * 8));
      fly_tensor x = mat(xd, FLY_F32, R, C, C), val = mat(vd, FLY_F32, R, k, k), idx = mat(id, FLY_I64, R, k, k);
      size_t ws_bytes = 0;
      REQUIRE(fly_topk_workspace_size(&x, k, 1, det, &ws_bytes) == FLY_SUCCESS);
      void* ws = ws_bytes ? fake_cuda_malloc(ws_bytes) : nullptr;
      if (ws_bytes) {  // one byte short is refused before anything launches
        CHECK(fly_topk(&x, k, 1, det, &val, &idx, ws, ws_bytes - 1, s) == FLY_ERROR_WORKSPACE);
      }
      REQUIRE(fly_force_variant(v->name.c_str()) == FLY_SUCCESS);
      fake_cuda_clear_records();
      const fly_status st = fly_topk(&x, k, 1, det, &val, &idx, ws, ws_bytes, s);
      INFO(v->name << " det=" << det << " " << status_text(st) << " " << fake_cuda_last_refusal());
      REQUIRE(st == FLY_SUCCESS);
      CHECK(std::string(fly_last_decision()) == "forced");
      paths.insert(path);
      const int n = fake_cuda_launch_count();
      const fake_cuda_launch* L = fake_cuda_get_launch(0);
      const auto p = params_of<TopkParams>(L);
      CHECK(p.R == R);
      CHECK(p.C == C);
      CHECK(p.k == k);
      CHECK(p.deterministic == det);
      CHECK(p.kpad == topk_plan::next_pow2(k));
      if (path == "small") {
        CHECK(n == 1);
        CHECK(std::string(L->kernel) == "fly_topk_small");
        const int64_t rpc = v->get_int("threads") / v->get_int("tpr");
        CHECK(int64_t(L->grid[0]) * rpc >= R);
      } else if (path == "radix") {
        CHECK(n == 1);
        CHECK(std::string(L->kernel) == "fly_topk_radix");
        CHECK(L->grid[0] == unsigned(R));
        const auto plan = topk_plan::plan_radix(R, C, k, 232448);
        CHECK(L->smem == unsigned(plan.smem));
        CHECK(p.cache_row == int(plan.cache_row));
      } else {
        CHECK(n == 1 + 4 + (det ? 1 : 0) + 1);  // init, passes 0..3, the deterministic tie pass, sort
        CHECK(std::string(L->kernel) == "fly_topk_split_init");
        CHECK(std::string(fake_cuda_get_launch(n - 2)->kernel) == (det ? "fly_topk_split_tie" : "fly_topk_split_pass"));
        CHECK(std::string(fake_cuda_get_launch(n - 1)->kernel) == "fly_topk_split_sort");
        CHECK(fake_cuda_get_launch(n - 1)->grid[0] == unsigned(R));
        const fake_cuda_launch* pass = fake_cuda_get_launch(1);
        CHECK(std::string(pass->kernel) == "fly_topk_split_pass");
        CHECK(pass->grid[1] == unsigned(R));
        const auto plan = topk_plan::plan_split(R, C, k, v->get_int("chunk"));
        const auto pp = params_of<TopkParams>(pass);
        CHECK(pp.pieces == plan.pieces);
        CHECK(int64_t(pp.chunk) * pp.pieces >= C);
        CHECK(int64_t(pp.chunk) * (pp.pieces - 1) < C);
        CHECK(pass->grid[0] >= 1u);
        CHECK(pass->grid[0] <= unsigned(plan.pieces));  // the row's CTAs claim its pieces
        CHECK(pass->smem == unsigned(plan.smem));
        CHECK(reinterpret_cast<char*>(pp.ws_state) == static_cast<char*>(ws));
        CHECK(reinterpret_cast<char*>(pp.ws_tiecnt) + int64_t(R) * pp.ldt * 4 <= static_cast<char*>(ws) + ws_bytes);
        CHECK(pp.ldt > pp.pieces);  // offsets of every piece and the total
        CHECK(reinterpret_cast<char*>(pp.ws_cand) + int64_t(R) * pp.kpad * 8 <= static_cast<char*>(ws) + ws_bytes);
      }
    }
  }
  CHECK(paths.count("small") == 1);
  CHECK(paths.count("radix") == 1);
}

TEST_CASE("topk: few long rows dispatch to the split path through the shipped rows", "[fake][topk]") {
  // The nearest-key lookup must not send R <= 16, C >= 2^18 to radix or small (one CTA per row):
  // db/sm_90a.sql carries split rows for that band (docs/topk.md, "Dispatch").
  void* s = fake_cuda_stream_create(0);
  struct Case { int64_t R, C, k; };
  const Case cases[] = {{1, 1 << 18, 1},   {1, 1 << 18, 4096}, {16, 1 << 18, 64},    {8, 1 << 20, 4},
                        {4, 1000003, 2048}, {1, 1 << 24, 16},   {16, 1 << 24, 1024}, {3, 300007, 16},
                        {16, 3000017, 256}, {2, 1 << 22, 100},  {1, 5000000, 7}};
  for (const Case& c : cases)
    for (int det : {0, 1})
      for (int largest : {0, 1}) {
        fly_tensor x = mat(fake_cuda_malloc(size_t(c.R * c.C * 4)), FLY_F32, c.R, c.C, c.C);
        fly_tensor v = mat(fake_cuda_malloc(size_t(c.R * c.k * 4)), FLY_F32, c.R, c.k, c.k);
        fly_tensor i = mat(fake_cuda_malloc(size_t(c.R * c.k * 8)), FLY_I64, c.R, c.k, c.k);
        size_t ws_bytes = 0;
        REQUIRE(fly_topk_workspace_size(&x, c.k, largest, det, &ws_bytes) == FLY_SUCCESS);
        void* ws = fake_cuda_malloc(ws_bytes);
        INFO("R=" << c.R << " C=" << c.C << " k=" << c.k << " det=" << det);
        REQUIRE(fly_topk(&x, c.k, largest, det, &v, &i, ws, ws_bytes, s) == FLY_SUCCESS);
        const std::string ran = fly_last_variant();
        INFO("ran " << ran << " (" << fly_last_decision() << ")");
        CHECK(ran.rfind("topk_split_", 0) == 0);
        CHECK(std::string(fly_last_decision()).rfind("db:", 0) == 0);
      }
}

TEST_CASE("gemm: every bundled variant plans legal tensor maps and launches", "[fake][gemm]") {
  ForceGuard guard;
  void* s = fake_cuda_stream_create(0);
  struct Shape { int64_t M, N, K; bool a_row, b_row; };
  const Shape shapes[] = {{4096, 4096, 4096, true, false}, {8, 4096, 4096, true, false}, {128, 8192, 8192, true, false},
                          {4096, 4096, 4096, true, true},  {4096, 4096, 4096, false, false}, {333, 1000, 136, false, true},
                          {1, 2048, 512, true, false}};
  size_t ws_bytes = 0;
  {
    fly_tensor a = mat(fake_cuda_malloc(64), FLY_BF16, 8, 8, 8), b = mat(fake_cuda_malloc(64), FLY_BF16, 8, 8, 8),
               c = mat(fake_cuda_malloc(64), FLY_BF16, 8, 8, 8);
    REQUIRE(fly_gemm_workspace_size(&a, &b, &c, &ws_bytes) == FLY_SUCCESS);
  }
  void* ws = ws_bytes ? fake_cuda_malloc(ws_bytes) : nullptr;
  int variants = 0, launched_variants = 0, stream_k = 0, clusters = 0;
  for (const fly::Variant* v : fly::variants_of("gemm")) {
    ++variants;
    const fly_dtype dt = v->get("dtype") == "bf16" ? FLY_BF16 : FLY_F16;
    bool launched = false;
    for (const Shape& sh : shapes) {
      // A row-major [r, c] or its column-major view.
      auto make = [&](int64_t r, int64_t c, bool row) {
        void* d = fake_cuda_malloc(size_t(r * c * 2));
        return row ? mat(d, dt, r, c, c) : flykernels::tensor(d, dt, {r, c}, {1, r});
      };
      fly_tensor a = make(sh.M, sh.K, sh.a_row), b = make(sh.K, sh.N, sh.b_row), c = make(sh.M, sh.N, true);
      fly_tensor bias = vec(fake_cuda_malloc(size_t(sh.N * 2)), dt, sh.N);
      REQUIRE(fly_force_variant(v->name.c_str()) == FLY_SUCCESS);
      fake_cuda_clear_records();
      const fly_status st = fly_gemm(&a, &b, &c, &bias, ws, ws_bytes, s);
      INFO(v->name << " M=" << sh.M << " N=" << sh.N << " K=" << sh.K << " " << status_text(st) << " / "
                   << fake_cuda_last_refusal());
      // A forced variant either runs the shape or says it cannot; the driver never refuses it.
      REQUIRE((st == FLY_SUCCESS || st == FLY_ERROR_UNSUPPORTED));
      if (st != FLY_SUCCESS) continue;
      launched = true;
      // One launch, after the packed path's copies where TMA cannot address an operand (the
      // column-major 333-row A: lda 333).
      const int n = fake_cuda_launch_count();
      REQUIRE(n >= 1);
      for (int i = 0; i + 1 < n; ++i) CHECK(std::string(fake_cuda_get_launch(i)->kernel) == "fly_pack_lines_sm90");
      CHECK(n == (sh.M == 333 && v->name.rfind("gemm_odd_", 0) != 0 ? 2 : 1));  // a forced cp.async variant: no copies
      // The copy of A the TMA maps then read, and where stream-K's workspace must end (before it).
      const void* a_read = a.data;
      const char* ws_end = static_cast<char*>(ws) + ws_bytes;
      if (n == 2) {
        const auto pk = params_of<fly::gemm::PackParams>(fake_cuda_get_launch(0));
        CHECK(pk.src == a.data);
        a_read = pk.dst;
        ws_end = static_cast<const char*>(pk.dst);
        CHECK(ws_end >= static_cast<char*>(ws) + 4096);
      }
      const fake_cuda_launch* L = last_launch();
      CHECK(L->smem <= 232448u);
      CHECK(L->grid[0] % L->cluster[0] == 0);
      clusters += L->cluster[0] > 1;
      if (v->get_int("rpw", 0) > 0) {
        CHECK(std::string(L->kernel) == "fly_gemm_decode_sm90");
        const auto p = params_of<fly::gemm::DecodeParams>(L);
        CHECK(p.M == sh.M);
        CHECK(p.c == c.data);
        continue;
      }
      if (v->name.rfind("gemm_odd_", 0) == 0) {  // the cp.async kernel (forced: takes aligned calls too)
        CHECK(std::string(L->kernel) == "fly_gemm_odd_sm90");
        const auto p = params_of<fly::gemm::OddGemmParams>(L);
        CHECK(p.core.c == c.data);
        CHECK(p.core.rows == sh.M);
        CHECK(p.tail.p.data == a.data);
        CHECK(p.tail.q.data == b.data);
        continue;
      }
      CHECK(std::string(L->kernel) == "fly_gemm_sm90");
      CHECK(L->block[0] == unsigned(fly::gemm::kThreads));
      const auto p = params_of<fly::gemm::GemmParams>(L);
      CHECK(p.c == c.data);
      CHECK(p.bias == bias.data);
      CHECK(p.k == sh.K);
      CHECK(int64_t(p.rows) * p.cols == sh.M * sh.N);
      const int ip = fake_cuda_tensor_map_index(&p.tm_p), iq = fake_cuda_tensor_map_index(&p.tm_q);
      REQUIRE(ip >= 0);
      REQUIRE(iq >= 0);
      const uint64_t pa = fake_cuda_get_tensor_map(ip)->address, qa = fake_cuda_get_tensor_map(iq)->address;
      const uint64_t ad = reinterpret_cast<uintptr_t>(a_read), bd = reinterpret_cast<uintptr_t>(b.data);
      CHECK(((pa == ad && qa == bd) || (pa == bd && qa == ad)));
      CHECK(p.swap == (pa == bd ? 1 : 0));
      if (p.sk_tiles > 0) {
        ++stream_k;
        CHECK(static_cast<void*>(p.sk_flags) == ws);
        CHECK(reinterpret_cast<char*>(p.sk_ws) + int64_t(L->grid[0]) * 4 * v->get_int("bm", 128) * v->get_int("bn", 128) <=
              ws_end);
      }
    }
    INFO(v->name);
    CHECK(launched);
    launched_variants += launched;
  }
  CHECK(variants > 0);
  CHECK(launched_variants == variants);
  if (ws_bytes) CHECK(stream_k > 0);
  CHECK(clusters > 0);
}

TEST_CASE("dispatch behind the device check: overlay rows, nearest bucket, bad rows", "[fake][db]") {
  void* s = fake_cuda_stream_create(0);
  // Two bundled rmsnorm bf16 variants: the overlay must be able to pick either.
  std::vector<const fly::Variant*> bf16;
  for (const fly::Variant* v : fly::variants_of("rmsnorm"))
    if (v->get("dtype") == "bf16") bf16.push_back(v);
  REQUIRE(bf16.size() >= 2);
  char tmpl[] = "/tmp/flyfake_db_XXXXXX";
  close(mkstemp(tmpl));
  std::remove(tmpl);
  const std::string path = tmpl;
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  const std::string sql =
      "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT); INSERT INTO meta VALUES('schema_version','1');"
      "CREATE TABLE tuning(arch TEXT, op TEXT, dtype TEXT, layout TEXT, k0 INTEGER, k1 INTEGER, k2 INTEGER,"
      " variant TEXT, time_us REAL);"
      "INSERT INTO tuning VALUES('sm_90a','rmsnorm_fwd','bf16','row',4096,64,0,'" + bf16[1]->name + "',1);"
      "INSERT INTO tuning VALUES('sm_90a','rmsnorm_fwd','bf16','row',777,5,0,'no_such_variant',1);";
  REQUIRE(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
  sqlite3_close(db);
  REQUIRE(fly_set_tuning_db(path.c_str()) == FLY_SUCCESS);
  auto run = [&](int64_t M, int64_t N) {
    fly_tensor x = mat(fake_cuda_malloc(size_t(M * N * 2)), FLY_BF16, M, N, N);
    fly_tensor y = mat(fake_cuda_malloc(size_t(M * N * 2)), FLY_BF16, M, N, N);
    fake_cuda_clear_records();
    const fly_status st = fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, s);
    INFO(status_text(st));
    REQUIRE(st == FLY_SUCCESS);
    return std::string(fly_last_variant()) + " " + fly_last_decision();
  };
  CHECK(run(64, 4096) == bf16[1]->name + " overlay:exact");
  CHECK(run(64, 4096) == bf16[1]->name + " overlay:exact");  // cached, same answer
  const fake_cuda_launch* L = last_launch();
  CHECK(L->block[0] == unsigned(bf16[1]->get_int("tpr") * bf16[1]->get_int("rpc")));
  // A row naming an unbundled variant is skipped, never launched.
  const std::string skipped = run(5, 777);
  CHECK(skipped.find("no_such_variant") == std::string::npos);
  fly_set_tuning_db(nullptr);
  std::remove(path.c_str());
  const std::string back = run(64, 4096);
  CHECK(back.find("overlay") == std::string::npos);
}

TEST_CASE("driver failures come back as statuses naming the call", "[fake][errors]") {
  ForceGuard guard;
  void* s = fake_cuda_stream_create(0);
  const int64_t M = 16, N = 256;
  fly_tensor x = mat(fake_cuda_malloc(M * N * 2), FLY_F16, M, N, N), y = mat(fake_cuda_malloc(M * N * 2), FLY_F16, M, N, N);
  // A variant no earlier test loaded, so its module load is attempted now.
  std::string fresh;
  const int modules_before = fake_cuda_module_count();
  for (const fly::Variant* v : fly::variants_of("rmsnorm"))
    if (v->get("dtype") == "fp16" && v->name.find("_t1024_") != std::string::npos) fresh = v->name;
  REQUIRE_FALSE(fresh.empty());
  REQUIRE(fly_force_variant(fresh.c_str()) == FLY_SUCCESS);
  fake_cuda_fail_next("cuModuleLoadData", int(CUDA_ERROR_INVALID_IMAGE));
  CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, s) == FLY_ERROR_KERNEL_IMAGE);
  CHECK(mentions("cuModuleLoadData"));
  CHECK(mentions("CUDA_ERROR_INVALID_IMAGE"));
  CHECK(fake_cuda_module_count() == modules_before);
  fly_force_variant(nullptr);

  REQUIRE(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, s) == FLY_SUCCESS);
  fake_cuda_fail_next("cuLaunchKernel", int(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES));
  CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, s) == FLY_ERROR_CUDA);
  CHECK(mentions("cuLaunchKernel"));
  CHECK(mentions("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"));
  CHECK(fly_rms_norm_fwd(&x, nullptr, 1e-5, &y, nullptr, s) == FLY_SUCCESS);
  CHECK(std::string(fly_get_last_error()).empty());

  fly_tensor a = mat(fake_cuda_malloc(256 * 256 * 2), FLY_BF16, 256, 256, 256);
  fly_tensor b = flykernels::tensor(fake_cuda_malloc(256 * 256 * 2), FLY_BF16, {256, 256}, {1, 256});
  fly_tensor c = mat(fake_cuda_malloc(256 * 256 * 2), FLY_BF16, 256, 256, 256);
  fake_cuda_fail_next("cuTensorMapEncodeTiled", int(CUDA_ERROR_INVALID_VALUE));
  CHECK(fly_gemm(&a, &b, &c, nullptr, nullptr, 0, s) == FLY_ERROR_CUDA);
  CHECK(mentions("cuTensorMapEncodeTiled"));
  CHECK(fly_gemm(&a, &b, &c, nullptr, nullptr, 0, s) == FLY_SUCCESS);
  // A forced variant of another family is refused, not launched.
  REQUIRE(fly_force_variant(fresh.c_str()) == FLY_SUCCESS);
  fake_cuda_clear_records();
  CHECK(fly_gemm(&a, &b, &c, nullptr, nullptr, 0, s) == FLY_ERROR_UNSUPPORTED);
  CHECK(mentions("not a gemm variant"));
  CHECK(fake_cuda_launch_count() == 0);
}
