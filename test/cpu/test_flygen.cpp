// SPDX-License-Identifier: Apache-2.0
// tools/flygen, the build's variant generator, run as the build runs it: axis expansion under
// constraints, selection (defaults + database names; --all; --all --match), the generated compile
// units, and refusal of broken spaces.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include "catch_compat.hpp"

namespace fs = std::filesystem;

namespace {

struct Run {
  int rc;
  std::string out;
};

Run run_flygen(const std::string& args) {
  const std::string cmd = std::string(FLY_FLYGEN_PATH) + " " + args + " 2>&1";
  Run r{-1, ""};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) r.out += buf;
  r.rc = pclose(p);
  return r;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A scratch tree: tuning/demo.json (a:{1,2,3} x b:{x,y}, constraint a*2 <= 4, so 4 variants),
// db/ with one row naming demo_2_x.
struct Tree {
  fs::path root;
  explicit Tree(const std::string& family_json, const std::string& db_sql = "") {
    root = fs::temp_directory_path() / ("flygen_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter()++));
    fs::remove_all(root);
    fs::create_directories(root / "tuning");
    fs::create_directories(root / "db");
    std::ofstream(root / "tuning" / "demo.json") << family_json;
    if (!db_sql.empty()) std::ofstream(root / "db" / "sm_90a.sql") << db_sql;
  }
  ~Tree() { fs::remove_all(root); }
  std::string args(const std::string& extra) const {
    return "--tuning " + (root / "tuning").string() + " --db " + (root / "db").string() + " --out " +
           (root / "gen").string() + " " + extra;
  }
  static int& counter() { static int c = 0; return c; }
};

const char* kSpace = R"({
  "family": "demo",
  "spaces": [{
    "source": "demo/demo.cu",
    "name": "demo_{a}_{b}",
    "axes": {"a": [1, 2, 3], "b": ["x", "y"]},
    "constraints": ["a * 2 <= 4"],
    "defaults": [{"a": 1, "b": "y"}]
  }]
})";
const char* kDb = "INSERT OR REPLACE INTO tuning VALUES ('sm_90a','demo','x','-',1,0,0,'demo_2_x',1.0,'',0,'g','d');\n";

}  // namespace

TEST_CASE("flygen selects the defaults and the database's variants by default", "[flygen]") {
  Tree t(kSpace, kDb);
  Run r = run_flygen(t.args(""));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("2 of 4 variants selected") != std::string::npos);
  CHECK(fs::exists(t.root / "gen" / "demo_1_y.cu"));
  CHECK(fs::exists(t.root / "gen" / "demo_2_x.cu"));
  CHECK(!fs::exists(t.root / "gen" / "demo_3_x.cu"));  // a = 3 breaks the constraint
  const std::string cu = slurp(t.root / "gen" / "demo_2_x.cu");
  CHECK(cu.find("#define FLY_A 2") != std::string::npos);
  CHECK(cu.find("#define FLY_B_IS_X 1") != std::string::npos);
  CHECK(cu.find("#include \"demo/demo.cu\"") != std::string::npos);
  const std::string manifest = slurp(t.root / "gen" / "manifest.tsv");
  CHECK(manifest.find("demo_2_x\tdemo\tdemo/demo.cu\tdemo_2_x\ta=2;b=x") != std::string::npos);
}

TEST_CASE("flygen --all expands the space; --match narrows it but keeps defaults and DB rows", "[flygen]") {
  Tree t(kSpace, kDb);
  Run all = run_flygen(t.args("--all"));
  INFO(all.out);
  REQUIRE(all.rc == 0);
  CHECK(all.out.find("4 of 4 variants selected") != std::string::npos);

  Tree m(kSpace, kDb);
  Run match = run_flygen(m.args("--all --match _y$"));
  INFO(match.out);
  REQUIRE(match.rc == 0);
  // demo_1_y and demo_2_y match; demo_2_x stays (database); demo_1_x is left out.
  CHECK(match.out.find("3 of 4 variants selected") != std::string::npos);
  CHECK(fs::exists(m.root / "gen" / "demo_2_y.cu"));
  CHECK(fs::exists(m.root / "gen" / "demo_2_x.cu"));
  CHECK(!fs::exists(m.root / "gen" / "demo_1_x.cu"));
}

// Whether the manifest lists variant `name` of the demo space (compile unit demo_1) with `params`.
static bool demo_1_row(const std::string& manifest, const std::string& name, const std::string& params) {
  return manifest.find(name + "\tdemo\tdemo/demo.cu\tdemo_1\t" + params + "\n") != std::string::npos;
}

// Launch axes: one compile unit per compile point; variants off the axes' first values get the
// suffix and share that unit; a default that does not name a launch axis means its first value.
const char* kLaunchSpace = R"({
  "family": "demo",
  "spaces": [{
    "source": "demo/demo.cu",
    "name": "demo_{a}",
    "axes": {"a": [1, 2]},
    "launch_axes": {"s": [0, 4, 8]},
    "launch_suffix": "_s{s}",
    "constraints": ["s == 0 || a == 1"],
    "defaults": [{"a": 2}]
  }]
})";

TEST_CASE("flygen launch axes share one compile unit per compile point", "[flygen]") {
  Tree t(kLaunchSpace);
  Run r = run_flygen(t.args("--all"));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  // a=1: s in {0,4,8}; a=2: s=0 only.
  CHECK(r.out.find("4 of 4 variants selected (all), 2 compile units") != std::string::npos);
  CHECK(fs::exists(t.root / "gen" / "demo_1.cu"));
  CHECK(fs::exists(t.root / "gen" / "demo_2.cu"));
  CHECK(!fs::exists(t.root / "gen" / "demo_1_s4.cu"));
  const std::string cu = slurp(t.root / "gen" / "demo_1.cu");
  CHECK(cu.find("FLY_S") == std::string::npos);  // launch values are not compiled in
  const std::string manifest = slurp(t.root / "gen" / "manifest.tsv");
  CHECK(demo_1_row(manifest, "demo_1", "a=1;s=0"));
  CHECK(demo_1_row(manifest, "demo_1_s4", "a=1;s=4"));
  CHECK(demo_1_row(manifest, "demo_1_s8", "a=1;s=8"));

  Tree d(kLaunchSpace);
  Run def = run_flygen(d.args(""));
  INFO(def.out);
  REQUIRE(def.rc == 0);
  CHECK(def.out.find("1 of 4 variants selected") != std::string::npos);  // demo_2 (s = 0) only
}

// Per-axis launch suffixes: each axis's pattern only where that axis is off its first value, so
// adding an axis keeps the names that had only the others.
const char* kAxisSuffixSpace = R"({
  "family": "demo",
  "spaces": [{
    "source": "demo/demo.cu",
    "name": "demo_{a}",
    "axes": {"a": [1]},
    "launch_axes": {"split": [0, 1], "gm": [0, 16]},
    "launch_suffix": {"split": "_sk{split}", "gm": "_g{gm}"}
  }]
})";

TEST_CASE("flygen per-axis launch suffixes name only the axes off their first value", "[flygen]") {
  Tree t(kAxisSuffixSpace);
  Run r = run_flygen(t.args("--all"));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("4 of 4 variants selected (all), 1 compile units") != std::string::npos);
  const std::string manifest = slurp(t.root / "gen" / "manifest.tsv");
  CHECK(demo_1_row(manifest, "demo_1", "a=1;gm=0;split=0"));
  CHECK(demo_1_row(manifest, "demo_1_sk1", "a=1;gm=0;split=1"));
  CHECK(demo_1_row(manifest, "demo_1_g16", "a=1;gm=16;split=0"));
  CHECK(demo_1_row(manifest, "demo_1_g16_sk1", "a=1;gm=16;split=1"));
}

// Host axes: in the name and the params (the launcher reads them), not in the compile unit:
// variants that differ only there share the unit of the axis's first value.
const char* kHostSpace = R"({
  "family": "demo",
  "spaces": [{
    "source": "demo/demo.cu",
    "name": "demo_{a}_h{h}",
    "axes": {"a": [1, 2], "h": [0, 1, 2]},
    "host_axes": ["h"]
  }]
})";

TEST_CASE("flygen host axes keep every name and share the first value's compile unit", "[flygen]") {
  Tree t(kHostSpace);
  Run r = run_flygen(t.args("--all"));
  INFO(r.out);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("6 of 6 variants selected (all), 2 compile units") != std::string::npos);
  CHECK(fs::exists(t.root / "gen" / "demo_1_h0.cu"));
  CHECK(fs::exists(t.root / "gen" / "demo_2_h0.cu"));
  CHECK(!fs::exists(t.root / "gen" / "demo_1_h1.cu"));
  CHECK(slurp(t.root / "gen" / "demo_1_h0.cu").find("#define FLY_H 0\n") != std::string::npos);
  const std::string manifest = slurp(t.root / "gen" / "manifest.tsv");
  CHECK(manifest.find("demo_1_h2\tdemo\tdemo/demo.cu\tdemo_1_h0\ta=1;h=2\n") != std::string::npos);
  CHECK(manifest.find("demo_2_h1\tdemo\tdemo/demo.cu\tdemo_2_h0\ta=2;h=1\n") != std::string::npos);
}

// flygen on `space` with its text `from` replaced by `to` must fail and say `says`.
static void check_refused(std::string space, const std::string& from, const std::string& to, const char* says) {
  const size_t at = space.find(from);
  REQUIRE(at != std::string::npos);
  space.replace(at, from.size(), to);
  Tree t(space);
  Run r = run_flygen(t.args(""));
  CHECK(r.rc != 0);
  CHECK(r.out.find(says) != std::string::npos);
}

TEST_CASE("flygen refuses broken spaces with a message", "[flygen]") {
  SECTION("a default that no variant satisfies") {
    check_refused(kSpace, "{\"a\": 1, \"b\": \"y\"}", "{\"a\": 3, \"b\": \"y\"}", "matches no variant");
  }
  SECTION("a name that does not encode every axis") {
    check_refused(kSpace, "demo_{a}_{b}", "demo_{a}", "does not encode axis b");
  }
  SECTION("launch axes without a suffix that names them") {
    check_refused(kLaunchSpace, "\"launch_suffix\": \"_s{s}\",", "", "launch_suffix");
  }
  SECTION("a per-axis launch suffix missing an axis") {
    check_refused(kAxisSuffixSpace, "\"gm\": \"_g{gm}\"", "\"x\": \"_x{gm}\"", "not a launch axis");
  }
  SECTION("a per-axis launch suffix without a pattern for an axis") {
    check_refused(kAxisSuffixSpace, ", \"gm\": \"_g{gm}\"", "", "no pattern for launch axis gm");
  }
  SECTION("a host axis that is not a compile axis") {
    check_refused(kHostSpace, "\"host_axes\": [\"h\"]", "\"host_axes\": [\"z\"]", "host axis z is not a compile axis");
  }
  SECTION("an unknown argument") {
    Tree t(kSpace);
    Run r = run_flygen(t.args("--bogus"));
    CHECK(r.rc != 0);
    CHECK(r.out.find("unknown argument --bogus") != std::string::npos);
  }
}
