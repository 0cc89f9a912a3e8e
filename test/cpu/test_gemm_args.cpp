// SPDX-License-Identifier: Apache-2.0
// fly_gemm / fly_gemm_workspace_size on bad input: a status and a message naming the argument.
// Runs without a GPU (validation happens before any device query); valid input is not asserted
// here (NO_DEVICE on CI, SUCCESS would need real device memory on the GPU machine).
#include <cstring>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "flykernels/flykernels.h"
#include "test_tensors.hpp"
#include "gemm/gemm_decode.h"
#include "gemm/gemm_odd_plan.h"
#include "gemm/gemm_plan.h"
#include "gemm/gemm_streamk.h"

namespace {

using fly_test::mat;
using fly_test::vec;
using fly_test::mentions;

void* const kA = reinterpret_cast<void*>(0x100000);
void* const kB = reinterpret_cast<void*>(0x200000);
void* const kC = reinterpret_cast<void*>(0x300000);
void* const kBias = reinterpret_cast<void*>(0x400000);


fly_status gemm(const fly_tensor& a, const fly_tensor& b, const fly_tensor& c, const fly_tensor* bias = nullptr) {
  return fly_gemm(&a, &b, &c, bias, nullptr, 0, nullptr);
}

// A 64 x 4096 x 4096 NT problem (A and B^T K-major) for the launch-plan tests. Its buffers are
// never dereferenced: the plan only encodes tensor maps.
fly::gemm::Problem decode_problem() {
  alignas(16) static char abuf[64], bbuf[64], cbuf[64];
  fly::gemm::Problem pr{};
  pr.M = 64;
  pr.N = 4096;
  pr.K = 4096;
  pr.a = {abuf, 64, 4096, true};     // A row-major: K-major
  pr.bt = {bbuf, 4096, 4096, true};  // B stored [N, K] (NT): K-major
  pr.c = cbuf;
  pr.ldc = 4096;
  pr.dtype = fly::gemm::Dtype::kBf16;
  return pr;
}

// decode_problem's NT layout at M x N x K: K-major A [M, K] and B^T [N, K], C [M, N] unpadded.
fly::gemm::Problem nt_problem(int64_t M, int64_t N, int64_t K) {
  fly::gemm::Problem pr = decode_problem();
  pr.M = pr.a.rows = M;
  pr.N = pr.bt.rows = N;
  pr.K = pr.a.ld = pr.bt.ld = K;
  pr.ldc = N;
  return pr;
}

// Stands in for cuTensorMapEncodeTiled in plan_gemm: records each map's box rows and L2 promotion,
// and its rank, dims, strides and box in full.
struct EncodeLog {
  struct Map {
    unsigned rank;
    std::vector<uint64_t> dims, strides;
    std::vector<unsigned> box;
  };
  std::vector<unsigned> box_rows;
  std::vector<CUtensorMapL2promotion> l2;
  std::vector<Map> maps;
  auto encoder() {
    return [this](CUtensorMap*, CUtensorMapDataType, cuuint32_t rank, void*, const cuuint64_t* dims,
                  const cuuint64_t* strides, const cuuint32_t* box, const cuuint32_t*, CUtensorMapInterleave,
                  CUtensorMapSwizzle, CUtensorMapL2promotion promo, CUtensorMapFloatOOBfill) {
      box_rows.push_back(box[1]);
      l2.push_back(promo);
      maps.push_back({rank, std::vector<uint64_t>(dims, dims + rank), std::vector<uint64_t>(strides, strides + rank - 1),
                      std::vector<unsigned>(box, box + rank)});
      return CUDA_SUCCESS;
    };
  }
};

}  // namespace

TEST_CASE("gemm rejects malformed descriptors", "[gemm][args]") {
  const int64_t M = 64, N = 128, K = 256;
  fly_tensor a = mat(kA, FLY_BF16, M, K, K, 1), b = mat(kB, FLY_BF16, K, N, N, 1);
  fly_tensor c = mat(kC, FLY_BF16, M, N, N, 1), bias = vec(kBias, FLY_BF16, N);

  SECTION("null descriptors") {
    CHECK(fly_gemm(nullptr, &b, &c, nullptr, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("a"));
    CHECK(fly_gemm(&a, nullptr, &c, nullptr, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("b"));
    CHECK(fly_gemm(&a, &b, nullptr, nullptr, nullptr, 0, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c"));
  }
  SECTION("null data") {
    a.data = nullptr;
    CHECK(gemm(a, b, c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("a"));
    a.data = kA;
    c.data = nullptr;
    CHECK(gemm(a, b, c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c"));
  }
  SECTION("wrong rank") {
    a.rank = 3;
    CHECK(gemm(a, b, c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("a"));
    a.rank = 2;
    fly_tensor bias2 = mat(kBias, FLY_BF16, 1, N, N, 1);
    CHECK(gemm(a, b, c, &bias2) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("bias"));
  }
  SECTION("dtypes") {
    fly_tensor a32 = a, b32 = b, c32 = c;
    a32.dtype = b32.dtype = c32.dtype = FLY_F32;
    CHECK(gemm(a32, b32, c32) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("a: dtype fp32"));
    b.dtype = FLY_F16;
    CHECK(gemm(a, b, c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("b: dtype"));
    b.dtype = FLY_BF16;
    c.dtype = FLY_F16;
    CHECK(gemm(a, b, c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c: dtype"));
    c.dtype = FLY_BF16;
    bias.dtype = FLY_F16;
    CHECK(gemm(a, b, c, &bias) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("bias: dtype"));
  }
  SECTION("shapes") {
    fly_tensor b2 = mat(kB, FLY_BF16, K + 1, N, N, 1);
    CHECK(gemm(a, b2, c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("b: shape"));
    fly_tensor c2 = mat(kC, FLY_BF16, M, N + 1, N + 1, 1);
    CHECK(gemm(a, b, c2) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c: shape"));
    fly_tensor c3 = mat(kC, FLY_BF16, M + 1, N, N, 1);
    CHECK(gemm(a, b, c3) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c: shape"));
    fly_tensor bias2 = vec(kBias, FLY_BF16, N - 1);
    CHECK(gemm(a, b, c, &bias2) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("bias: expected"));
    fly_tensor bias3 = vec(kBias, FLY_BF16, N, 2);
    CHECK(gemm(a, b, c, &bias3) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("bias: stride"));
  }
  SECTION("negative sizes and strides") {
    a.sizes[0] = -1;
    CHECK(gemm(a, b, c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("a"));
    a.sizes[0] = M;
    b.strides[0] = -N;
    CHECK(gemm(a, b, c) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("b"));
  }
  SECTION("overlapping C rows") {
    fly_tensor c2 = mat(kC, FLY_BF16, M, N, N - 1, 1);
    CHECK(gemm(a, b, c2) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("c: row stride"));
  }
  SECTION("workspace query validates too") {
    size_t bytes = 123;
    CHECK(fly_gemm_workspace_size(&a, &b, &c, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("bytes"));
    fly_tensor b2 = mat(kB, FLY_BF16, K + 1, N, N, 1);
    CHECK(fly_gemm_workspace_size(&a, &b2, &c, &bytes) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("b: shape"));
    CHECK(fly_gemm_workspace_size(&a, &b, &c, &bytes) == FLY_SUCCESS);
    // Stream-K variants (split = 1) are bundled (family defaults): room for their flags and one
    // 128 x 256 fp32 partial per CTA of the largest sm_90 grid (144 SMs).
    CHECK(bytes == size_t(fly::gemm::sk_workspace_bytes(144, 128, 256)));
    fly_tensor c0 = mat(kC, FLY_BF16, 0, N, N, 1), a0 = mat(kA, FLY_BF16, 0, K, K, 1);
    CHECK(fly_gemm_workspace_size(&a0, &b, &c0, &bytes) == FLY_SUCCESS);
    CHECK(bytes == 0);  // nothing to compute
    const size_t sk = size_t(fly::gemm::sk_workspace_bytes(144, 128, 256));
    // An operand TMA cannot address (lda = K + 1): the query adds its aligned copy after the front.
    fly_tensor a1 = mat(kA, FLY_BF16, M, K, K + 1, 1);
    CHECK(fly_gemm_workspace_size(&a1, &b, &c, &bytes) == FLY_SUCCESS);
    CHECK(bytes == (sk + 255) / 256 * 256 + size_t((M * K * 2 + 255) / 256 * 256));
    // ... but not a copy no GPU could hold (over 1 TiB, here 2 TiB): such calls take the cp.async
    // kernel; the query says stream-K's part.
    const int64_t big = int64_t(1) << 20;
    fly_tensor ab = mat(kA, FLY_BF16, big, big, big + 1, 1), bb = mat(kB, FLY_BF16, big, 64, 64, 1);
    fly_tensor cb = mat(kC, FLY_BF16, big, 64, 64, 1);
    const fly_status st = fly_gemm_workspace_size(&ab, &bb, &cb, &bytes);
    INFO(fly_get_last_error());
    CHECK(st == FLY_SUCCESS);
    CHECK(bytes == sk);
  }
  SECTION("workspace pointer and size") {
    void* ws_odd = reinterpret_cast<void*>(0x500010);
    CHECK(fly_gemm(&a, &b, &c, nullptr, ws_odd, 1 << 20, nullptr) == FLY_ERROR_MISALIGNED);
    CHECK(mentions("workspace"));
    CHECK(fly_gemm(&a, &b, &c, nullptr, nullptr, 1 << 20, nullptr) == FLY_ERROR_INVALID_ARGUMENT);
    CHECK(mentions("workspace"));
  }
}

TEST_CASE("gemm reports inputs the kernels cannot take as UNSUPPORTED", "[gemm][args]") {
  const int64_t M = 64, N = 128, K = 256;
  fly_tensor a = mat(kA, FLY_BF16, M, K, K, 1), b = mat(kB, FLY_BF16, K, N, N, 1);
  fly_tensor c = mat(kC, FLY_BF16, M, N, N, 1);

  // Leading dimensions and bases TMA cannot address are valid input (the cp.async kernel takes
  // them): not refused here (NO_DEVICE on CI; the device path is [gemm][odd] and [fake][gemm][odd]).
  SECTION("leading dimension breaking TMA's 16-byte rule is no longer refused") {
    fly_tensor a2 = mat(kA, FLY_BF16, M, K, K + 1, 1);  // row-major, lda*2 = 514 bytes
    CHECK(gemm(a2, b, c) != FLY_ERROR_UNSUPPORTED);
    fly_tensor b2 = mat(kB, FLY_BF16, K, N, 1, K + 3);  // column-major B, ldb = K + 3
    CHECK(gemm(a, b2, c) != FLY_ERROR_UNSUPPORTED);
    fly_tensor c2 = mat(kC, FLY_BF16, M, N, N + 1, 1);  // any element-aligned ldc
    CHECK(gemm(a2, b2, c2) != FLY_ERROR_UNSUPPORTED);
  }
  SECTION("base address not 16-byte aligned is no longer refused") {
    a.data = reinterpret_cast<char*>(kA) + 2;
    CHECK(gemm(a, b, c) != FLY_ERROR_UNSUPPORTED);
    a.data = kA;
    b.data = reinterpret_cast<char*>(kB) + 8;
    CHECK(gemm(a, b, c) != FLY_ERROR_UNSUPPORTED);
  }
  SECTION("an odd base is still refused: not element-aligned") {
    a.data = reinterpret_cast<char*>(kA) + 1;
    CHECK(gemm(a, b, c) == FLY_ERROR_MISALIGNED);
  }
  SECTION("strides neither row- nor column-major") {
    fly_tensor a2 = mat(kA, FLY_BF16, M, K, 2 * K, 2);
    CHECK(gemm(a2, b, c) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("a: strides"));
    fly_tensor b2 = mat(kB, FLY_BF16, K, N, 0, 1);  // broadcast rows
    CHECK(gemm(a, b2, c) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("b: strides"));
  }
  SECTION("column-major C") {
    fly_tensor c2 = mat(kC, FLY_BF16, M, N, 1, M);
    CHECK(gemm(a, b, c2) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("c: inner stride"));
  }
  SECTION("empty reduction") {
    fly_tensor a0 = mat(kA, FLY_BF16, M, 0, 0, 1), b0 = mat(kB, FLY_BF16, 0, N, N, 1);
    CHECK(gemm(a0, b0, c) == FLY_ERROR_UNSUPPORTED);
    CHECK(mentions("K = 0"));
  }
  SECTION("empty output is a no-op") {
    fly_tensor a0 = mat(nullptr, FLY_BF16, 0, K, K, 1), c0 = mat(nullptr, FLY_BF16, 0, N, N, 1);
    CHECK(gemm(a0, b, c0) == FLY_SUCCESS);
  }
}

TEST_CASE("forced split-K is offered to few-tile shapes with enough K only", "[gemm][args]") {
  using fly::gemm::forced_split_fits;
  fly::gemm::Problem pr{};
  pr.M = 64;
  pr.N = 4096;
  pr.K = 4096;  // decode-sized
  const fly::gemm::VariantShape swap64{64, 6, true, 1, 0};    // 32 x 1 tiles
  const fly::gemm::VariantShape plain64{64, 6, false, 1, 0};  // 1 x 64 tiles
  const fly::gemm::VariantShape multicast{256, 3, false, 2, 0};
  CHECK(forced_split_fits(pr, swap64, 8, 132));    // 32 x 8 = 256 CTAs <= 2 waves of 132
  CHECK(forced_split_fits(pr, plain64, 4, 132));   // 64 x 4 = 256
  CHECK(!forced_split_fits(pr, plain64, 8, 132));  // 64 x 8 = 512: too many
  pr.M = 4096;                                      // a big shape: 32 x 64 tiles
  CHECK(!forced_split_fits(pr, plain64, 2, 132));
  pr.M = 64;
  pr.K = 256;                                       // 4 k blocks: at most split 2
  CHECK(forced_split_fits(pr, swap64, 2, 132));
  CHECK(!forced_split_fits(pr, swap64, 3, 132));
  pr.K = 4096;
  CHECK(!forced_split_fits(pr, multicast, 2, 132));  // multicast takes the cluster
  CHECK(forced_split_fits(pr, multicast, 0, 132));   // 0: the launcher chooses
  // split = 1 (stream-K): where it cuts some tile. 64x4096x4096 swap64: 32 tiles x 64 k steps on
  // 132 CTAs; plain64: 64 tiles. 4096^3 at bn = 256: 512 tiles = 3 waves + 116. Never with
  // multicast or ping-pong; 1056 tiles = 8 whole waves of 132: nothing to cut.
  CHECK(forced_split_fits(pr, swap64, 1, 132));
  CHECK(forced_split_fits(pr, plain64, 1, 132));
  CHECK(!forced_split_fits(pr, multicast, 1, 132));
  fly::gemm::VariantShape pp = plain64;
  pp.pp = 1;
  CHECK(!forced_split_fits(pr, pp, 1, 132));
  pr.M = 4096;
  CHECK(forced_split_fits(pr, fly::gemm::VariantShape{256, 4, false, 1, 0}, 1, 132));
  pr.M = 128 * 33;
  pr.N = 256 * 32;  // 33 x 32 = 1056 = 8 x 132 tiles
  CHECK(!forced_split_fits(pr, fly::gemm::VariantShape{256, 4, false, 1, 0}, 1, 132));
}

TEST_CASE("stream-K: every k step of every tile is done once, and each cut tile has one owner", "[gemm][args]") {
  using namespace fly::gemm;
  // (total tiles, stream-K tiles, group, grid, k steps per tile) covering: fewer steps per group
  // than a tile (ranges inside one tile, 3+ parts per tile), about one tile per group, 1-2 tiles
  // per group after data-parallel waves, one step per CTA; groups of 1, 2 and 4.
  const int cases[][5] = {{8, 8, 1, 132, 64},    {3, 3, 1, 96, 32},     {96, 96, 1, 132, 64},
                          {112, 112, 1, 132, 64}, {512, 248, 4, 132, 64}, {224, 224, 2, 132, 64},
                          {133, 133, 1, 132, 7},  {5, 5, 1, 5, 1},        {17, 17, 1, 13, 3},
                          {400, 136, 2, 132, 130}, {1, 1, 1, 132, 200},   {544, 148, 4, 132, 2}};
  for (const auto& cs : cases) {
    const int total = cs[0], sk = cs[1], g = cs[2], grid = cs[3], kb = cs[4];
    INFO("tiles " << total << " stream-K " << sk << " group " << g << " grid " << grid << " kb " << kb);
    REQUIRE((total - sk) / g % (grid / g) == 0);  // whole data-parallel waves (stream_k_tiles)
    REQUIRE(sk / g == (total == sk ? sk / g : stream_k_tiles(total / g, grid / g)));
    std::vector<int> done(size_t(total) * kb, 0), owners(size_t(total), 0), owner_of(size_t(total), -1);
    std::vector<std::vector<int>> contribs(static_cast<size_t>(total));
    std::vector<int> first_contrib(size_t(total), -1);
    for (int c = 0; c < grid; ++c) {
      int last_role = kWhole, n_con = 0, n_own = 0;
      SkUnit u;
      for (int i = 0; sk_cta_unit(i, c, total, sk, g, grid, kb, &u); ++i) {
        REQUIRE(u.tile >= 0);
        REQUIRE(u.tile < total);
        REQUIRE(u.kb_begin < u.kb_end);
        REQUIRE(u.kb_end <= kb);
        CHECK(u.role >= last_role);  // whole tiles, then the contributor, then the owner
        last_role = u.role;
        if (u.tile < total - sk) CHECK(u.role == kWhole);  // data-parallel tiles stay whole
        if (g > 1) CHECK(u.tile % g == c % g);             // the member's row of each super tile
        for (int k = u.kb_begin; k < u.kb_end; ++k) ++done[size_t(u.tile) * kb + k];
        if (u.role == kWhole) {
          CHECK(u.kb_begin == 0);
          CHECK(u.kb_end == kb);
        } else if (u.role == kContributor) {
          ++n_con;
          CHECK(u.kb_end < kb);  // the tile's last step is someone else's
          contribs[size_t(u.tile)].push_back(c);
        } else {
          ++n_own;
          CHECK(u.kb_begin > 0);
          CHECK(u.kb_end == kb);  // the owner holds the tile's last step
          ++owners[size_t(u.tile)];
          owner_of[size_t(u.tile)] = c;
          first_contrib[size_t(u.tile)] = u.first_contrib;
        }
      }
      CHECK(n_con <= 1);
      CHECK(n_own <= 1);
    }
    for (size_t s = 0; s < done.size(); ++s) REQUIRE(done[s] == 1);
    for (int t = 0; t < total; ++t) {
      INFO("tile " << t);
      const auto& cv = contribs[size_t(t)];
      if (cv.empty()) {
        CHECK(owners[size_t(t)] == 0);  // done whole by one CTA
        continue;
      }
      REQUIRE(owners[size_t(t)] == 1);
      // The contributors are CTAs first_contrib, + g, ... below the owner: lower CTAs only.
      const int own = owner_of[size_t(t)], first = first_contrib[size_t(t)];
      CHECK(first == cv.front());
      CHECK(int(cv.size()) == (own - first) / g);
      for (size_t j = 0; j < cv.size(); ++j) CHECK(cv[j] == first + g * int(j));
    }
  }
}

TEST_CASE("stream-K plan: the cut tiles, the grid and the workspace", "[gemm][args]") {
  using namespace fly::gemm;
  CHECK(stream_k_tiles(512, 132) == 116 + 132);  // 3 waves + 116: the last wave and one before
  CHECK(stream_k_tiles(264, 132) == 0);          // whole waves
  CHECK(stream_k_tiles(96, 132) == 96);          // under one wave: all
  CHECK(stream_k_tiles(200, 132) == 200);        // under two waves: all
  CHECK(!plan_stream_k(1, 132, 64, 132).active());  // one tile per CTA: nothing to cut
  CHECK(plan_stream_k(1, 3, 4, 132).grid == 12);     // no more CTAs than k steps
  // Super tiles of 4, 2 or 1 tile rows (what divides tiles_m): 4096^3 at bn = 256 (32 x 16 tiles):
  // groups of 4, 33 groups, 128 super tiles = 1 wave + 62 -> 62 stream-K super tiles.
  const StreamKPlan big = plan_stream_k(32, 512, 64, 132);
  CHECK(big.group == 4);
  CHECK(big.grid == 132);
  CHECK(big.sk_tiles == 62 * 4);
  const StreamKPlan two = plan_stream_k(2, 224, 128, 132);  // 256 x 28672 x 8192 at bn = 256
  CHECK(two.group == 2);
  CHECK(two.sk_tiles == 224);
  CHECK(plan_stream_k(17, 17 * 16, 2, 132).group == 1);
  CHECK(!plan_stream_k(1, 100, int64_t(1) << 25, 132).active());  // steps past 32 bits: none

  Problem pr = nt_problem(128, 6144, 4096);  // 96 tiles of 128 x 64 over 64 k steps
  const VariantShape v{64, 8, false, 1, 1};
  EncodeLog log;
  auto encode = log.encoder();
  Launch L{};
  const int64_t need = sk_workspace_bytes(132, 128, 64);
  alignas(256) static char ws[256];
  // No workspace, one too small, or a misaligned one: a plain persistent launch.
  for (Workspace w : {Workspace{}, Workspace{ws, size_t(need - 1)}, Workspace{ws + 16, size_t(need)}}) {
    REQUIRE(plan_gemm(pr, v, 132, encode, &L, 1, w) == CUDA_SUCCESS);
    CHECK(L.params.sk_tiles == 0);
    CHECK(L.grid == 96);
  }
  REQUIRE(plan_gemm(pr, v, 132, encode, &L, 1, Workspace{ws, size_t(need)}) == CUDA_SUCCESS);
  CHECK(L.params.sk_tiles == 96);
  CHECK(L.params.sk_group == 1);  // one tile row
  CHECK(L.grid == 132);
  CHECK(L.cluster == 1);
  CHECK(L.params.split == 1);
  CHECK(L.params.sk_epoch != 0);
  CHECK(static_cast<void*>(L.params.sk_flags) == static_cast<void*>(ws));
  CHECK(reinterpret_cast<char*>(L.params.sk_ws) == ws + sk_flags_bytes(132));
  const uint32_t e1 = L.params.sk_epoch;
  REQUIRE(plan_gemm(pr, v, 132, encode, &L, 1, Workspace{ws, size_t(need)}) == CUDA_SUCCESS);
  CHECK(L.params.sk_epoch != e1);  // new per launch
  // split = 0 never plans stream-K, workspace or not.
  REQUIRE(plan_gemm(pr, v, 132, encode, &L, 0, Workspace{ws, size_t(need)}) == CUDA_SUCCESS);
  CHECK(L.params.sk_tiles == 0);
}

TEST_CASE("narrow tiles (bm = 64): layouts they take, no split-K, plan", "[gemm][args]") {
  using namespace fly::gemm;
  Problem pr = decode_problem();
  VariantShape narrow{32, 8, true, 1, 0, 64};  // swap: P = B^T (4096 rows), Q = A^T (64 rows)
  CHECK(layout_fits(pr, narrow));
  CHECK(!forced_split_fits(pr, narrow, 2, 132));  // no split-K for narrow tiles
  CHECK(forced_split_fits(pr, narrow, 0, 132));
  pr.a.kmajor = false;  // A column-major: Q = A^T is MN-major
  CHECK(!layout_fits(pr, narrow));                                   // a 16-wide half of a 64 chunk
  CHECK(layout_fits(pr, VariantShape{128, 8, true, 1, 0, 64}));      // halves of 64: whole chunks
  CHECK(layout_fits(pr, VariantShape{64, 8, true, 1, 0, kBM}));      // ordinary tiles take all
  pr.a.kmajor = true;

  // The plan: P tiles of 64 rows, P's TMA box 64 rows tall, no split, persistent grid.
  EncodeLog log;
  std::vector<unsigned>& box_rows = log.box_rows;
  auto encode = log.encoder();
  Launch L{};
  REQUIRE(plan_gemm(pr, narrow, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.tiles_m == 64);  // 4096 / 64
  CHECK(L.params.tiles_n == 2);   // 64 / 32
  CHECK(L.params.split == 1);
  CHECK(L.cluster == 1);
  CHECK(L.grid == 128);
  CHECK(L.smem == unsigned(smem_bytes(32, 8, 0, 64)));
  REQUIRE(box_rows.size() == 2);
  CHECK(box_rows[0] == 64);  // P box: the narrow tile's rows
  CHECK(box_rows[1] == 32);  // Q box: bn rows
  // The same shape on ordinary tiles splits K through a cluster.
  box_rows.clear();
  REQUIRE(plan_gemm(pr, VariantShape{64, 6, true, 1, 0}, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.tiles_m == 32);
  CHECK(L.params.split > 1);
  CHECK(box_rows[0] == unsigned(kBM));

  // P multicast (mp = 2): clusters of 2 along the tile columns, each CTA loading 32 of the 64 P
  // rows; only a K-major P can be halved that way.
  VariantShape mp2{32, 8, true, 1, 0, 64, 2};
  CHECK(layout_fits(pr, mp2));
  CHECK(!forced_split_fits(pr, mp2, 2, 132));
  box_rows.clear();
  REQUIRE(plan_gemm(pr, mp2, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.split == 1);
  CHECK(L.cluster == 2);
  CHECK(L.grid == 128);  // 64 tile rows x 1 super column of 2 tiles, clusters of 2
  REQUIRE(box_rows.size() == 2);
  CHECK(box_rows[0] == 32);  // P box: half of the tile's rows
  CHECK(box_rows[1] == 32);
  pr.bt.kmajor = false;  // B row-major: P = B^T is MN-major
  CHECK(!layout_fits(pr, mp2));
  CHECK(layout_fits(pr, VariantShape{32, 8, true, 1, 0, 64, 1}));  // without multicast it is fine
  pr.bt.kmajor = true;
  // More super tiles than the clusters that fit: the grid is capped at whole clusters.
  pr.M = pr.a.rows = 4096;
  pr.N = pr.bt.rows = 8192;
  REQUIRE(plan_gemm(pr, mp2, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.cluster == 2);
  CHECK(L.grid == 132);

  // The L2 promotion (launch axis l2p): both tensor maps get it; 256 B unless told otherwise.
  log.l2.clear();
  std::vector<CUtensorMapL2promotion>& promo = log.l2;
  REQUIRE(plan_gemm(pr, narrow, 132, encode, &L) == CUDA_SUCCESS);
  VariantShape l128 = narrow, none = narrow;
  l128.l2p = 128;
  none.l2p = 0;
  REQUIRE(plan_gemm(pr, l128, 132, encode, &L) == CUDA_SUCCESS);
  REQUIRE(plan_gemm(pr, none, 132, encode, &L) == CUDA_SUCCESS);
  REQUIRE(promo.size() == 6);
  CHECK(promo[0] == CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
  CHECK(promo[1] == CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
  CHECK(promo[2] == CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
  CHECK(promo[3] == CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
  CHECK(promo[4] == CU_TENSOR_MAP_L2_PROMOTION_NONE);
  CHECK(promo[5] == CU_TENSOR_MAP_L2_PROMOTION_NONE);
  CHECK(l2_promotion(64) == CU_TENSOR_MAP_L2_PROMOTION_L2_64B);
  // The k-walk stagger (launch axis ks) reaches the kernel's parameters; off unless asked for.
  CHECK(L.params.k_stagger == 0);
  VariantShape staggered = narrow;
  staggered.ks = 1;
  REQUIRE(plan_gemm(pr, staggered, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.k_stagger == 1);
  CHECK(l2_promotion(512) == CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

TEST_CASE("ping-pong variants (pp = 1): persistent, never split", "[gemm][args]") {
  using namespace fly::gemm;
  Problem pr = decode_problem();
  EncodeLog log;
  auto encode = log.encoder();
  VariantShape pp{128, 5, true, 1, 0, kBM};
  pp.pp = 1;
  CHECK(layout_fits(pr, pp));
  CHECK(!forced_split_fits(pr, pp, 2, 132));  // no forced split-K
  CHECK(forced_split_fits(pr, pp, 0, 132));
  Launch L{};
  // A few-tile shape the ordinary variant would split along K: ping-pong keeps split = 1.
  REQUIRE(plan_gemm(pr, pp, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.split == 1);
  CHECK(L.cluster == 1);
  CHECK(L.grid == 32);  // 4096 / 128 tiles, one column of Q
  VariantShape plain = pp;
  plain.pp = 0;
  REQUIRE(plan_gemm(pr, plain, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.split > 1);
  // Many tiles: a persistent grid of one CTA per SM, each CTA walking several tiles.
  pr.M = pr.a.rows = 4096;
  REQUIRE(plan_gemm(pr, pp, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.grid == 132);
  CHECK(L.params.tiles_m * L.params.tiles_n == 32 * 32);
}

TEST_CASE("narrow tiles splitting K over the warpgroups (kw = 2): exchange area, whole-bn wgmma", "[gemm][args]") {
  using namespace fly::gemm;
  Problem pr = decode_problem();  // swap: P = B^T (4096 rows), Q = A^T (64 rows)
  EncodeLog log;
  auto encode = log.encoder();
  VariantShape kw2{64, 8, true, 1, 0, 64};
  kw2.kw = 2;
  VariantShape kw1 = kw2;
  kw1.kw = 1;
  // The exchange area: both warpgroups' halves of a 64 x bn fp32 tile.
  CHECK(kw_exchange_bytes(64) == 64 * 64 * 4);
  CHECK(smem_bytes(64, 8, 0, 64, 1, 2) - smem_bytes(64, 8, 0, 64, 1, 1) == kw_exchange_bytes(64));
  Launch L{};
  REQUIRE(plan_gemm(pr, kw2, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.smem == unsigned(smem_bytes(64, 8, 0, 64, 1, 2)));
  CHECK(L.params.split == 1);  // narrow tiles: never split-K
  CHECK(L.grid == 64);         // 4096 / 64 tiles of P, one of Q
  REQUIRE(plan_gemm(pr, kw1, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.smem == unsigned(smem_bytes(64, 8, 0, 64, 1, 1)));
  // Each warpgroup's wgmma takes all bn = 64 Q columns, so an MN-major Q (A column-major, with
  // swap) is whole 64-wide chunks at kw = 2 and half chunks at kw = 1.
  pr.a.kmajor = false;
  CHECK(layout_fits(pr, kw2));
  CHECK(!layout_fits(pr, kw1));
  kw2.bn = 32;  // 32 columns: half a chunk either way
  CHECK(!layout_fits(pr, kw2));
}

TEST_CASE("two k blocks per stage (kb = 2): 3-D maps for K-major operands, taller MN-major boxes", "[gemm][args]") {
  using namespace fly::gemm;
  Problem pr = decode_problem();
  pr.K = 4096 + 32;  // a partial last k block: the 3-D view holds the 64 whole ones
  VariantShape narrow{32, 5, true, 1, 0, 64};
  narrow.kb = 2;
  EncodeLog log;
  auto encode = log.encoder();
  Launch L{};
  REQUIRE(plan_gemm(pr, narrow, 132, encode, &L) == CUDA_SUCCESS);
  REQUIRE(log.maps.size() == 4);  // P and Q 2-D, then P and Q 3-D
  CHECK(log.maps[0].rank == 2);
  CHECK(log.maps[0].box == std::vector<unsigned>{64, 64});
  CHECK(log.maps[1].box == std::vector<unsigned>{64, 32});
  const EncodeLog::Map& p3 = log.maps[2];
  CHECK(p3.rank == 3);
  CHECK(p3.dims == std::vector<uint64_t>{64, 4096, 64});   // 64 k, N rows, K / 64 whole blocks
  CHECK(p3.strides == std::vector<uint64_t>{4096 * 2, 128});  // row stride, then one k block
  CHECK(p3.box == std::vector<unsigned>{64, 64, 2});
  CHECK(log.maps[3].dims == std::vector<uint64_t>{64, 64, 64});
  CHECK(log.maps[3].box == std::vector<unsigned>{64, 32, 2});
  CHECK(L.smem == unsigned(smem_bytes(32, 5, 0, 64, 2)));
  CHECK(smem_bytes(32, 5, 0, 64, 2) - smem_bytes(32, 10, 0, 64, 1) == -5 * 16);  // same ring, fewer barriers

  // MN-major operands: one 2-D box of 128 k rows per 64-wide chunk, and no 3-D view.
  pr.a.kmajor = false;  // Q = A^T MN-major (bn = 128: whole chunks)
  pr.a.ld = 64;
  narrow.bn = 128;
  log.maps.clear();
  REQUIRE(plan_gemm(pr, narrow, 132, encode, &L) == CUDA_SUCCESS);
  REQUIRE(log.maps.size() == 3);
  CHECK(log.maps[1].rank == 2);
  CHECK(log.maps[1].box == std::vector<unsigned>{64, 128});
  CHECK(log.maps[2].rank == 3);  // P = B^T is still K-major

  // K shorter than one k step: no step is whole, the kernel only uses the 2-D maps, and no 3-D
  // view is encoded (its 64-element inner extent would run past rows of K < 64 elements).
  pr.a.kmajor = true;
  pr.a.ld = pr.bt.ld = 40;
  pr.K = 40;
  log.maps.clear();
  REQUIRE(plan_gemm(pr, narrow, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(log.maps.size() == 2);
  pr.K = 128;  // exactly one whole step
  pr.a.ld = pr.bt.ld = 128;
  log.maps.clear();
  REQUIRE(plan_gemm(pr, narrow, 132, encode, &L) == CUDA_SUCCESS);
  REQUIRE(log.maps.size() == 4);
  CHECK(log.maps[2].dims == std::vector<uint64_t>{64, 4096, 2});

  // P multicast with kb = 2: each CTA of the pair brings one of the stage's k blocks of all 64 P
  // rows (2-D box {64, 64}, or {64 mn, 64 k} when MN-major), so P has no 3-D view and may be
  // MN-major; Q keeps its 3-D view.
  pr = decode_problem();
  VariantShape mpkb{32, 5, true, 1, 0, 64, 2};
  mpkb.kb = 2;
  log.maps.clear();
  REQUIRE(plan_gemm(pr, mpkb, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.cluster == 2);
  CHECK(L.grid == 128);
  CHECK(L.params.split == 1);
  REQUIRE(log.maps.size() == 3);  // P 2-D, Q 2-D, Q 3-D
  CHECK(log.maps[0].box == std::vector<unsigned>{64, 64});
  CHECK(log.maps[1].box == std::vector<unsigned>{64, 32});
  CHECK(log.maps[2].rank == 3);
  CHECK(log.maps[2].box == std::vector<unsigned>{64, 32, 2});
  pr.bt.kmajor = false;  // P = B^T MN-major
  pr.bt.ld = 4096;
  CHECK(layout_fits(pr, mpkb));
  log.maps.clear();
  REQUIRE(plan_gemm(pr, mpkb, 132, encode, &L) == CUDA_SUCCESS);
  REQUIRE(log.maps.size() == 3);  // P 2-D, Q 2-D and 3-D
  CHECK(log.maps[0].box == std::vector<unsigned>{64, 64});  // 64 mn x one k block
  CHECK(log.maps[2].rank == 3);
  mpkb.kb = 1;
  CHECK(!layout_fits(pr, mpkb));  // one k block: each CTA would need half a 64-wide chunk

  // kb = 4: boxes 4 k blocks deep (3-D {64, rows, 4}; MN-major {64 mn, 256 k}), 3-D maps only
  // when K holds a whole step of 256.
  pr = decode_problem();
  VariantShape kb4{32, 3, false, 1, 0, 64};  // P = A (64 rows), Q = B^T
  kb4.kb = 4;
  log.maps.clear();
  REQUIRE(plan_gemm(pr, kb4, 132, encode, &L) == CUDA_SUCCESS);
  REQUIRE(log.maps.size() == 4);
  CHECK(log.maps[2].box == std::vector<unsigned>{64, 64, 4});
  CHECK(log.maps[3].box == std::vector<unsigned>{64, 32, 4});
  CHECK(L.smem == unsigned(smem_bytes(32, 3, 0, 64, 4)));
  pr.a.kmajor = false;  // P = A MN-major
  log.maps.clear();
  REQUIRE(plan_gemm(pr, kb4, 132, encode, &L) == CUDA_SUCCESS);
  REQUIRE(log.maps.size() == 3);
  CHECK(log.maps[0].box == std::vector<unsigned>{64, 256});
  pr.a.kmajor = true;
  pr.K = 200;  // less than one step of 256: 2-D maps only
  pr.a.ld = pr.bt.ld = 200;
  log.maps.clear();
  REQUIRE(plan_gemm(pr, kb4, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(log.maps.size() == 2);

  // Split-K counts k steps of 128: K = 4096 is 32 of them.
  pr = decode_problem();
  VariantShape plain{64, 3, true, 1, 0};
  plain.kb = 2;
  REQUIRE(plan_gemm(pr, plain, 132, encode, &L, 4) == CUDA_SUCCESS);
  CHECK(L.params.split == 4);
  CHECK(L.params.kb_per_split == 8);  // 32 steps / 4
  pr.K = 256;  // 2 steps: a forced split of 2 would leave slices of one step
  CHECK(!forced_split_fits(pr, plain, 2, 132));
  plain.kb = 1;
  CHECK(forced_split_fits(pr, plain, 2, 132));  // 4 k blocks of 64
}

TEST_CASE("decode variants: NT only, M within the tile, K % 8, cluster split of K", "[gemm][args]") {
  using namespace fly::gemm;
  Problem pr = decode_problem();  // 64 x 4096 x 4096 NT
  const DecodeShape d{8, 16, 8, 0};
  CHECK(decode_fits(pr, d));
  CHECK(!decode_fits(pr, DecodeShape{8, 16, 4, 0}));  // M = 64 > 8 x 4
  pr.M = 32;
  CHECK(decode_fits(pr, DecodeShape{8, 16, 4, 0}));
  pr.M = 64;
  pr.a.kmajor = false;  // TN: A column-major
  CHECK(!decode_fits(pr, d));
  pr.a.kmajor = true;
  pr.bt.kmajor = false;  // NN: B row-major, W = B^T MN-major
  CHECK(!decode_fits(pr, d));
  pr.bt.kmajor = true;
  pr.K = 4100;  // rows of W not whole 8-element chunks
  CHECK(!decode_fits(pr, d));
  pr.K = 4096;
  pr.M = 0;
  CHECK(!decode_fits(pr, d));
  pr.M = 64;
  CHECK(decode_fits(pr, DecodeShape{8, 16, 8, 8}));
  pr.K = 448;  // 7 k blocks: a forced cluster of 8 would leave a CTA without one
  CHECK(!decode_fits(pr, DecodeShape{8, 16, 8, 8}));
  CHECK(decode_fits(pr, DecodeShape{8, 16, 8, 4}));
  pr.K = 4096;

  // Launcher's cluster: 32 tiles of 128 rows on 132 SMs -> 4 (128 CTAs, 16 k blocks each).
  CHECK(choose_decode_cluster(32, 64, 132) == 4);
  CHECK(choose_decode_cluster(112, 64, 132) == 1);  // N = 14336: one wave already
  CHECK(choose_decode_cluster(48, 64, 132) == 2);   // N = 6144: 96 CTAs; 192 would be two waves
  CHECK(choose_decode_cluster(16, 8, 132) == 2);    // few k blocks: at least 4 per CTA

  EncodeLog log;
  auto encode = log.encoder();
  DecodeLaunch L{};
  REQUIRE(plan_decode(pr, d, 132, encode, &L) == CUDA_SUCCESS);
  REQUIRE(log.maps.size() == 1);  // only A goes through TMA
  CHECK(log.maps[0].dims == std::vector<uint64_t>{4096, 64});
  CHECK(log.maps[0].box == std::vector<unsigned>{64, 64});
  CHECK(log.maps[0].strides == std::vector<uint64_t>{4096 * 2});
  CHECK(L.cluster == 4);
  CHECK(L.grid == 128);
  CHECK(L.threads == 256);
  CHECK(L.params.kb_per_cta == 16);
  CHECK(L.params.cl == 4);
  CHECK(L.params.ldw == 4096);
  CHECK(L.smem == unsigned(decode_smem_bytes(8, 16, 8)));
  CHECK(L.smem <= 227u * 1024u);
  // Every decode variant of the space: the region before the ring's barriers holds both the
  // 8-stage activation ring and the partial tile (C's [8 mt][rows] block, rows padded by 4 floats:
  // the main kernel's unswapped partial layout), and the whole fits a block's shared memory.
  for (int nw : {4, 8})
    for (int rpw : {16, 32})
      for (int mt : {1, 2, 4, 8}) {
        INFO("nw " << nw << " rpw " << rpw << " mt " << mt);
        const int region = decode_region_bytes(nw, rpw, mt);
        CHECK(region >= kDecStages * mt * 8 * 128);
        CHECK(region >= mt * 8 * (decode_rows(nw, rpw) + 4) * 4);
        CHECK(region % 8 == 0);  // the barriers follow it
        CHECK(decode_smem_bytes(nw, rpw, mt) == region + 2 * kDecStages * 8 + 1024);
        CHECK(decode_smem_bytes(nw, rpw, mt) <= 227 * 1024);
      }

  // A forced cluster that K cannot fill evenly shrinks to the CTAs that get k blocks:
  // 10 blocks over 4 -> 3 per CTA -> 4 CTAs; over 8 -> 2 per CTA -> 5 CTAs.
  pr.K = 640;
  log.maps.clear();
  REQUIRE(plan_decode(pr, DecodeShape{8, 16, 8, 8}, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.kb_per_cta == 2);
  CHECK(L.cluster == 5);
  CHECK(L.grid == 32 * 5);
  // M = 1: A's row stride is never used; the map still gets a 16-byte multiple.
  pr.M = 1;
  pr.K = 8;
  pr.a.ld = 8;
  log.maps.clear();
  REQUIRE(plan_decode(pr, DecodeShape{4, 16, 2, 0}, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(log.maps[0].box == std::vector<unsigned>{64, 16});
  CHECK(log.maps[0].strides == std::vector<uint64_t>{16});
  CHECK(L.cluster == 1);
  CHECK(L.grid == 64);  // 4096 rows / 64 per CTA
}

TEST_CASE("tiles shaped like cuBLAS's decode kernels: odd bn, P multicast on 128-row tiles, Q multicast on narrow tiles",
          "[gemm][args]") {
  using namespace fly::gemm;
  Problem pr = nt_problem(128, 14336, 4096);
  EncodeLog log;
  auto encode = log.encoder();
  Launch L{};

  // 128 x 112 tiles with P multicast (cuBLAS's 112x128 2x1 kernel on 128 x 14336 x 4096): 128 tiles
  // in 64 clusters of 2 along N, each CTA loading 64 of the 128 P rows.
  VariantShape v112{112, 7, false, 1, 0};
  v112.mp = 2;
  CHECK(layout_fits(pr, v112));
  CHECK(!forced_split_fits(pr, v112, 2, 132));  // the cluster is taken by multicast
  REQUIRE(plan_gemm(pr, v112, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.tiles_m == 1);
  CHECK(L.params.tiles_n == 128);
  CHECK(L.params.split == 1);
  CHECK(L.cluster == 2);
  CHECK(L.grid == 128);
  REQUIRE(log.box_rows.size() == 2);
  CHECK(log.box_rows[0] == 64);   // P box: half of the 128 rows
  CHECK(log.box_rows[1] == 112);  // Q box: the whole 112-row tile
  CHECK(L.smem == unsigned(smem_bytes(112, 7)));
  // An MN-major Q cannot be loaded in 112-wide tiles (64-wide chunks); an MN-major P can be
  // halved (64-row halves are whole chunks), also without multicast.
  pr.bt.kmajor = false;
  CHECK(!layout_fits(pr, v112));
  CHECK(!layout_fits(pr, VariantShape{112, 7, false, 1, 0}));
  CHECK(layout_fits(pr, VariantShape{128, 7, false, 1, 0}));
  pr.bt.kmajor = true;
  pr.a.kmajor = false;
  CHECK(layout_fits(pr, v112));
  pr.a.kmajor = true;

  // Narrow 64 x 96 tiles with Q multicast (cuBLAS's 96x64 1x2 kernel on 128 x 6144 x 4096): the two
  // 64-row tiles of M share the 96-row weight tile, each CTA loading 48 rows; 128 CTAs.
  pr.N = pr.bt.rows = 6144;
  VariantShape n96{96, 10, false, 2, 0, 64};
  CHECK(layout_fits(pr, n96));
  CHECK(!forced_split_fits(pr, n96, 2, 132));
  log.box_rows.clear();
  REQUIRE(plan_gemm(pr, n96, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.tiles_m == 2);
  CHECK(L.params.tiles_n == 64);
  CHECK(L.cluster == 2);
  CHECK(L.grid == 128);
  REQUIRE(log.box_rows.size() == 2);
  CHECK(log.box_rows[0] == 64);  // P box: the narrow tile's rows
  CHECK(log.box_rows[1] == 48);  // Q box: half of the 96 rows
  CHECK(L.smem == unsigned(smem_bytes(96, 10, 0, 64)));
  CHECK(L.smem <= 227u * 1024u);
  // MN-major Q: 48-wide halves are refused; 128-wide narrow tiles with multicast give each CTA and
  // each warpgroup 64 columns, whole chunks.
  // With two k blocks per stage the pair splits each stage's k blocks instead: each CTA brings one
  // whole k block of the 96 rows (a 2-D box; no 3-D view of Q), as P multicast with kb = 2 does.
  VariantShape n96kb2 = n96;
  n96kb2.stages = 5;
  n96kb2.kb = 2;
  log.maps.clear();
  REQUIRE(plan_gemm(pr, n96kb2, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.cluster == 2);
  CHECK(L.grid == 128);
  REQUIRE(log.maps.size() == 3);  // P 2-D, Q 2-D, P 3-D
  CHECK(log.maps[1].box == std::vector<unsigned>{64, 96});
  CHECK(log.maps[2].rank == 3u);
  CHECK(log.maps[2].box == std::vector<unsigned>{64, 64, 2});
  pr.bt.kmajor = false;
  CHECK(!layout_fits(pr, n96));
  CHECK(!layout_fits(pr, n96kb2));  // the warpgroups' 48-column halves are still not whole chunks
  CHECK(layout_fits(pr, VariantShape{128, 8, false, 2, 0, 64}));
}

TEST_CASE("320-wide tiles: two TMA boxes of Q, no split-K, no swap, K-major Q only", "[gemm][args]") {
  using namespace fly::gemm;
  Problem pr = nt_problem(4096, 28672, 8192);
  EncodeLog log;
  auto encode = log.encoder();
  Launch L{};
  const VariantShape v{320, 3, false, 1, 1};
  CHECK(tma_box_rows(320) == 160);
  CHECK(tma_box_rows(256) == 256);
  CHECK(layout_fits(pr, v));
  CHECK(!forced_split_fits(pr, v, 1, 132));  // no stream-K
  CHECK(!forced_split_fits(pr, v, 2, 132));  // no split-K
  REQUIRE(plan_gemm(pr, v, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.tiles_m == 32);
  CHECK(L.params.tiles_n == 90);  // 28672 / 320, the last ragged
  CHECK(L.params.split == 1);
  CHECK(L.grid == 132);
  REQUIRE(log.box_rows.size() == 2);
  CHECK(log.box_rows[0] == 128);
  CHECK(log.box_rows[1] == 160);  // Q: two boxes of 160 rows
  CHECK(L.smem == unsigned(smem_bytes(320, 3, 1)));
  CHECK(L.smem <= 227u * 1024u);
  // Few tiles would make the launcher split K on other tiles; not on these.
  pr.M = pr.a.rows = 128;
  pr.N = pr.bt.rows = 640;
  REQUIRE(plan_gemm(pr, v, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.split == 1);
  CHECK(L.cluster == 1);
  // Q multicast: each CTA loads its 160-row half in one box.
  log.box_rows.clear();
  REQUIRE(plan_gemm(pr, VariantShape{320, 3, false, 2, 1}, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(log.box_rows[1] == 160);
  CHECK(L.cluster == 2);
  // Refused: swap-AB (one epilogue orientation) and an MN-major Q (n160 halves are not 64-wide chunks).
  CHECK(!layout_fits(pr, VariantShape{320, 3, true, 1, 1}));
  pr.bt.kmajor = false;
  CHECK(!layout_fits(pr, v));
  pr.bt.kmajor = true;
  pr.a.kmajor = false;  // an MN-major P is fine
  CHECK(layout_fits(pr, v));
}

TEST_CASE("TMA-store epilogue (epi = 2): C's tensor map only where TMA can address C", "[gemm][args]") {
  using namespace fly::gemm;
  Problem pr = nt_problem(1000, 1104, 4096);
  EncodeLog log;
  auto encode = log.encoder();
  Launch L{};
  const VariantShape v{256, 4, false, 1, 2};
  REQUIRE(plan_gemm(pr, v, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.c_tma == 1);
  REQUIRE(log.maps.size() == 3);  // P, Q, C
  CHECK(log.maps[2].dims == std::vector<uint64_t>{1104, 1000});
  CHECK(log.maps[2].strides == std::vector<uint64_t>{1104 * 2});
  CHECK(log.maps[2].box == std::vector<unsigned>{64, 16});  // one warp's 16 rows x 64 columns
  CHECK(L.smem == unsigned(smem_bytes(256, 4, 2)));
  CHECK(L.smem == unsigned(4 * 49152 + 64 + 1024 + 1024 + 2 * 16384));
  CHECK(L.smem <= 227u * 1024u);
  // Rows of 129 elements (258 bytes), swap-AB, or another epilogue: no map, register stores.
  for (auto [ldc, vv] : {std::pair<int64_t, VariantShape>{129, v}, {1104, VariantShape{256, 4, true, 1, 2}},
                         {1104, VariantShape{256, 4, false, 1, 1}}}) {
    pr.ldc = ldc;
    log.maps.clear();
    REQUIRE(plan_gemm(pr, vv, 132, encode, &L) == CUDA_SUCCESS);
    CHECK(L.params.c_tma == 0);
    CHECK(log.maps.size() == 2);
  }
  // epi = 3: the same map, one 2 KiB box per 64 columns per warp (4 at bn = 256: 3 stages fit).
  pr.ldc = 1104;
  log.maps.clear();
  const VariantShape v3{256, 3, false, 1, 3};
  REQUIRE(plan_gemm(pr, v3, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.c_tma == 1);
  CHECK(log.maps.size() == 3);
  CHECK(L.smem == unsigned(3 * 49152 + 48 + 1024 + 1024 + 2 * 4 * 8192));
  CHECK(L.smem <= 227u * 1024u);
  CHECK(smem_bytes(256, 4, 3) > 227 * 1024);
  CHECK(epi_wg_bytes(128, 3) == 4 * 2 * 2048);
  CHECK(epi_wg_bytes(256, 2) == 4 * 2 * 2048);  // epi = 2: two boxes per warp at any bn
}

TEST_CASE("raster strips: the height that touches the fewest operand bytes per wave", "[gemm][args]") {
  using namespace fly::gemm;
  // 16384 x 4096 at 128 x 256 tiles (128 x 16 tiles), 132 in flight: 16 rows x 9 columns of tiles
  // (16 x 128 + 9 x 256) beat 8 rows x all 16 columns (8 x 128 + 16 x 256).
  CHECK(raster_group(128, 16, 128, 256, 132) == 16);
  CHECK(raster_group(64, 32, 128, 256, 132) == 16);  // 8192^3
  // 2048 x 14336: all 16 tile rows in one strip, walked column by column.
  CHECK(raster_group(16, 56, 128, 256, 132) == 16);
  // Square tiles: 8 rows x 17 columns and 16 x 9 touch the same bytes; the smaller is kept.
  CHECK(raster_group(64, 64, 128, 128, 132) == 8);
  // 64-row P tiles, 256-row Q tiles, 32 columns: 16 rows x 9 columns (and 32 x 5, a tie).
  CHECK(raster_group(128, 32, 64, 256, 132) == 16);
  // A wave spanning several whole strips (few columns: decode) reads the same either way: 8.
  CHECK(raster_group(64, 2, 64, 32, 128) == 8);
  CHECK(raster_group(4, 32, 128, 128, 128) == 8);
  // Fewer tile rows than any strip: all strips are the whole height; the smallest is kept.
  CHECK(raster_group(8, 32, 128, 256, 132) == 8);

  // plan_gemm: the heuristic unless the variant fixes the height (launch axis gm).
  Problem pr = nt_problem(16384, 4096, 4096);
  EncodeLog log;
  auto encode = log.encoder();
  VariantShape v{256, 4, false, 1, 0, kBM};
  Launch L{};
  REQUIRE(plan_gemm(pr, v, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.strip_m == raster_group(L.params.tiles_m, L.params.tiles_n, 128, 256, L.grid));
  v.gm = 32;
  REQUIRE(plan_gemm(pr, v, 132, encode, &L) == CUDA_SUCCESS);
  CHECK(L.params.strip_m == 32);
}

TEST_CASE("cp.async path: who takes it, load granules, launch plan", "[gemm][args][odd]") {
  using namespace fly::gemm;
  alignas(16) static char abuf[64], bbuf[64], cbuf[64];
  Problem pr{};
  pr.M = 77;
  pr.N = 515;
  pr.K = 1003;
  pr.dtype = Dtype::kBf16;
  pr.a = {abuf, 77, 78, false};     // TN: A column-major, lda = M + 1 (156 bytes: 4-byte lines)
  pr.bt = {bbuf, 515, 1004, true};  // B column-major = B^T K-major, ldb = K + 1 (2008 bytes: 8)
  pr.c = cbuf + 2;                  // C 2-byte aligned, ldc odd
  pr.ldc = 516;
  CHECK(needs_odd_path(pr));
  CHECK(operand_granule(pr.a, pr.K, pr.dtype) == 4);
  CHECK(operand_granule(pr.bt, pr.K, pr.dtype) == 8);
  OddLaunch L;
  plan_odd(pr, 128, 6, 132, &L);
  const GemmParams& p = L.params.core;
  CHECK(p.rows == 77);
  CHECK(p.cols == 515);
  CHECK(p.k == 1003);
  CHECK(p.p_kmajor == 0);
  CHECK(p.q_kmajor == 1);
  CHECK(p.swap == 0);
  CHECK(p.tiles_m == 1);
  CHECK(p.tiles_n == 5);
  CHECK(p.split == 4);  // 5 tiles over 16 k steps (ceil(1003 / 64)): split-K clusters of 4
  CHECK(p.kb_per_split == 4);
  CHECK(L.cluster == 4u);
  CHECK(p.c_vec == 0);          // C only 2-byte aligned: element stores
  CHECK(p.sk_tiles == 0);
  CHECK(L.grid == 20);
  CHECK(L.smem == unsigned(odd_smem_bytes(128, 6)));
  CHECK(L.smem <= 232448u);
  CHECK(L.params.tail.p.data == abuf);
  CHECK(L.params.tail.p.ld == 78);
  CHECK(L.params.tail.p.rows == 77);
  CHECK(L.params.tail.q.gran == 8);
  // Granules: the base and ld * 2 decide; a single line ignores ld.
  CHECK(operand_granule({abuf, 10, 64, true}, 100, Dtype::kFp16) == 16);
  CHECK(operand_granule({abuf + 2, 10, 64, true}, 100, Dtype::kFp16) == 2);
  CHECK(operand_granule({abuf + 4, 10, 64, true}, 100, Dtype::kFp16) == 4);
  CHECK(operand_granule({abuf, 10, 1001, true}, 100, Dtype::kFp16) == 2);
  CHECK(operand_granule({abuf, 10, 1002, true}, 100, Dtype::kFp16) == 4);
  CHECK(operand_granule({abuf + 8, 1, 1001, true}, 100, Dtype::kFp16) == 8);  // one row: ld unused
  CHECK(operand_granule({abuf, 10, 1001, false}, 1, Dtype::kFp16) == 16);     // MN-major, one k row
  // TMA-legal operands do not take the path; the tile count of a big problem.
  Problem ok = pr;
  ok.a = {abuf, 77, 80, false};
  ok.bt = {bbuf, 515, 1008, true};
  CHECK_FALSE(needs_odd_path(ok));
  Problem big = pr;
  big.M = 4095;
  big.N = 4097;
  plan_odd(big, 128, 6, 132, &L);
  CHECK(L.params.core.tiles_m == 32);
  CHECK(L.params.core.tiles_n == 33);
  CHECK(L.grid == 132);
  CHECK(L.cluster == 1u);
  CHECK(L.params.core.split == 1);
  CHECK(L.params.core.kb_per_split == 16);
  CHECK(L.params.core.strip_m >= 8);
}
