// SPDX-License-Identifier: Apache-2.0
// The dense GEMM's legality rules (kernels/gemm/gemm_legal.h), defined once: the kernel asserts
// them, the launcher checks them, and here every variant tuning/gemm.json's constraints admit
// (flygen --all, as a tuning build expands it) must satisfy them.
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "catch_compat.hpp"
#include "gemm/gemm_legal.h"
#include "gemm/gemm_plan.h"

namespace fs = std::filesystem;

namespace {

std::map<std::string, std::string> parse_params(const std::string& s) {
  std::map<std::string, std::string> kv;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ';')) {
    const auto eq = item.find('=');
    if (eq != std::string::npos) kv[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return kv;
}

int geti(const std::map<std::string, std::string>& kv, const char* k, int dflt) {
  auto it = kv.find(k);
  return it == kv.end() ? dflt : std::atoi(it->second.c_str());
}

}  // namespace

TEST_CASE("every GEMM variant the tuning space admits is a legal tile", "[gemm][legal]") {
  const fs::path out = fs::temp_directory_path() / ("gemm_legal_" + std::to_string(::getpid()));
  fs::remove_all(out);
  const std::string cmd = std::string(FLY_FLYGEN_PATH) + " --tuning " FLY_SOURCE_DIR "/tuning --db " FLY_SOURCE_DIR
                          "/db --out " + out.string() + " --all --families gemm > /dev/null 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream man(out / "manifest.tsv");
  REQUIRE(man.good());
  std::string line;
  int checked = 0;
  while (std::getline(man, line)) {
    std::stringstream ls(line);
    std::string name, family, source, image, params;
    std::getline(ls, name, '\t');
    std::getline(ls, family, '\t');
    std::getline(ls, source, '\t');
    std::getline(ls, image, '\t');
    std::getline(ls, params, '\t');
    if (source != "gemm/gemm_sm90.cu") continue;  // the decode kernel has rules of its own
    const auto kv = parse_params(params);
    fly::gemm::TileShape t;
    t.bm = geti(kv, "bm", fly::gemm::kBM);
    t.bn = geti(kv, "bn", 128);
    t.stages = geti(kv, "stages", 4);
    t.kb = geti(kv, "kb", 1);
    t.kw = geti(kv, "kw", 1);
    t.mc = geti(kv, "mc", 1);
    t.mp = geti(kv, "mp", 1);
    t.epi = geti(kv, "epi", 0);
    t.pp = geti(kv, "pp", 0);
    INFO(name);
    CHECK(fly::gemm::tile_legal(t));
    ++checked;
  }
  fs::remove_all(out);
  CHECK(checked > 1000);  // the whole space, not a stray file
}

TEST_CASE("the legality rules refuse what the kernel cannot run", "[gemm][legal]") {
  using fly::gemm::TileShape;
  using fly::gemm::tile_legal;
  CHECK(tile_legal(TileShape{128, 256, 4, 1, 1, 1, 1, 2, 0}));                    // the large-shape tile
  CHECK(tile_legal(TileShape{64, 32, 8, 2, 2, 1, 2, 0, 0}));                      // the decode kw2 tile
  CHECK_FALSE(tile_legal(TileShape{64, 32, 7, 2, 2, 1, 1, 0, 0}));                // kw2 needs an even ring
  CHECK_FALSE(tile_legal(TileShape{96, 128, 4, 1, 1, 1, 1, 0, 0}));               // 96 rows
  CHECK_FALSE(tile_legal(TileShape{128, 320, 3, 2, 1, 1, 1, 0, 0}));              // 320 wide with kb2
  CHECK_FALSE(tile_legal(TileShape{64, 128, 4, 1, 1, 1, 1, 1, 0}));               // narrow + staged epilogue
  CHECK_FALSE(tile_legal(TileShape{128, 128, 4, 1, 1, 2, 2, 0, 0}));              // two multicasts
  CHECK_FALSE(tile_legal(TileShape{128, 128, 4, 1, 1, 2, 1, 0, 1}));              // ping-pong + multicast
  CHECK_FALSE(tile_legal(TileShape{128, 256, 8, 1, 1, 1, 1, 1, 0}));              // shared memory
  CHECK_FALSE(tile_legal(TileShape{128, 256, 13, 1, 1, 1, 1, 0, 0}));             // ring depth
  CHECK_FALSE(tile_legal(TileShape{128, 64, 4, 4, 1, 2, 1, 0, 0}));               // kb4 + multicast
  // The launcher takes a VariantShape: the same rules through tile_shape().
  fly::gemm::VariantShape v{256, 4, false};
  CHECK(tile_legal(fly::gemm::tile_shape(v)));
  v.kw = 2;
  CHECK_FALSE(tile_legal(fly::gemm::tile_shape(v)));
}
