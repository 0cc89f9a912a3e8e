// SPDX-License-Identifier: Apache-2.0
// flygen: expands the variant spaces declared in tuning/*.json into one compile unit per variant.
//
//   flygen --tuning DIR --db DIR --out DIR [--all [--match REGEX]] [--families a,b]
//
// Writes OUT/<image>.cu for every compile unit the selected variants need and OUT/manifest.tsv
// with one line per variant:
//   name <TAB> family <TAB> source (relative to kernels/) <TAB> image <TAB> params ("k=v;k=v",
//   last: CMake splits lists at ';')
// Selection: every space's "defaults" plus every variant named in a db/*.sql dump, or all of them
// with --all. Unchanged files are not rewritten, so nvcc reruns only for what changed.
//
// Launch axes: a space may declare "launch_axes" (values the launcher reads from the variant's
// params, not compiled in) and a "launch_suffix" pattern that encodes them. A variant whose launch
// values are all the first of their axis keeps the plain name and is its own image; the others
// are named <name><suffix> and share that image (one cubin, one archive payload). Defaults that
// do not mention a launch axis mean its first value. "launch_suffix" may instead be an object of
// one pattern per launch axis ({"split": "_sk{split}", "gm": "_g{gm}"}): each is appended, in the
// axes' (alphabetical) order, only where that axis is off its first value.
//
// Host axes: "host_axes" lists compile axes that stay in the variant's name and params (the
// launcher reads them) but do not shape the kernel (its source reads no FLY_<AXIS>): the variant's
// image is the one of the axis's first value, so variants that differ only there share one cubin
// instead of compiling byte-identical copies (gemm's swap: the launcher exchanges the operands;
// topk split's chunk: the launcher's plan). The image name is only a name: its point need not pass
// the space's constraints (topk_split_fp32_t1024_c8192 holds the t1024 kernels of every chunk).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A value of an axis: an integer (bools become 0/1) or a string.
struct Value {
  bool is_str = false;
  long long i = 0;
  std::string s;
  std::string text() const { return is_str ? s : std::to_string(i); }
};
using Point = std::map<std::string, Value>;

Value to_value(const json& j) {
  Value v;
  if (j.is_string()) { v.is_str = true; v.s = j.get<std::string>(); }
  else if (j.is_boolean()) v.i = j.get<bool>() ? 1 : 0;
  else if (j.is_number_integer()) v.i = j.get<long long>();
  else throw std::runtime_error("axis values must be integers, booleans or strings: " + j.dump());
  return v;
}

// ---- constraint expressions: a small recursive-descent evaluator ---------------------------
class Expr {
 public:
  Expr(const std::string& src, const Point& p) : s_(src), p_(p) {}
  long long eval() {
    Value v = parse_or();
    skip();
    if (pos_ != s_.size()) error("unexpected '" + s_.substr(pos_) + "'");
    if (v.is_str) error("expression is a string");
    return v.i;
  }

 private:
  const std::string& s_;
  const Point& p_;
  size_t pos_ = 0;
  [[noreturn]] void error(const std::string& m) {
    throw std::runtime_error("constraint \"" + s_ + "\": " + m);
  }
  void skip() { while (pos_ < s_.size() && std::isspace((unsigned char)s_[pos_])) ++pos_; }
  bool eat(const char* tok) {
    skip();
    size_t n = std::char_traits<char>::length(tok);
    if (s_.compare(pos_, n, tok) == 0) { pos_ += n; return true; }
    return false;
  }
  static Value num(long long x) { Value v; v.i = x; return v; }
  long long need_int(const Value& v) { if (v.is_str) error("string in arithmetic"); return v.i; }
  Value parse_or() {
    Value a = parse_and();
    while (eat("||")) { Value b = parse_and(); a = num(need_int(a) || need_int(b)); }
    return a;
  }
  Value parse_and() {
    Value a = parse_cmp();
    while (eat("&&")) { Value b = parse_cmp(); a = num(need_int(a) && need_int(b)); }
    return a;
  }
  Value parse_cmp() {
    Value a = parse_add();
    for (;;) {
      const char* ops[] = {"==", "!=", "<=", ">=", "<", ">"};
      int which = -1;
      for (int k = 0; k < 6; ++k) if (eat(ops[k])) { which = k; break; }
      if (which < 0) return a;
      Value b = parse_add();
      if (a.is_str != b.is_str) error("comparing a string with a number");
      int c = a.is_str ? a.s.compare(b.s) : (a.i < b.i ? -1 : a.i > b.i ? 1 : 0);
      bool r = which == 0 ? c == 0 : which == 1 ? c != 0 : which == 2 ? c <= 0
             : which == 3 ? c >= 0 : which == 4 ? c < 0 : c > 0;
      a = num(r);
    }
  }
  Value parse_add() {
    Value a = parse_mul();
    for (;;) {
      if (eat("+")) a = num(need_int(a) + need_int(parse_mul()));
      else if (eat("-")) a = num(need_int(a) - need_int(parse_mul()));
      else return a;
    }
  }
  Value parse_mul() {
    Value a = parse_unary();
    for (;;) {
      if (eat("*")) a = num(need_int(a) * need_int(parse_unary()));
      else if (eat("/")) { long long d = need_int(parse_unary()); if (!d) error("division by 0"); a = num(need_int(a) / d); }
      else if (eat("%")) { long long d = need_int(parse_unary()); if (!d) error("modulo by 0"); a = num(need_int(a) % d); }
      else return a;
    }
  }
  Value parse_unary() {
    if (eat("!")) return num(!need_int(parse_unary()));
    if (eat("-")) return num(-need_int(parse_unary()));
    if (eat("(")) { Value v = parse_or(); if (!eat(")")) error("missing ')'"); return v; }
    skip();
    if (pos_ < s_.size() && s_[pos_] == '"') {
      size_t end = s_.find('"', pos_ + 1);
      if (end == std::string::npos) error("unterminated string");
      Value v; v.is_str = true; v.s = s_.substr(pos_ + 1, end - pos_ - 1);
      pos_ = end + 1;
      return v;
    }
    if (pos_ < s_.size() && std::isdigit((unsigned char)s_[pos_])) {
      size_t used = 0;
      long long x = std::stoll(s_.substr(pos_), &used);
      pos_ += used;
      return num(x);
    }
    size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum((unsigned char)s_[pos_]) || s_[pos_] == '_')) ++pos_;
    if (start == pos_) error("expected a value at '" + s_.substr(start) + "'");
    std::string id = s_.substr(start, pos_ - start);
    if (id == "true") return num(1);
    if (id == "false") return num(0);
    auto it = p_.find(id);
    if (it == p_.end()) error("unknown axis '" + id + "'");
    return it->second;
  }
};

std::string upper_ident(std::string s) {
  for (char& c : s) c = std::isalnum((unsigned char)c) ? (char)std::toupper((unsigned char)c) : '_';
  return s;
}

// "gemm_{dtype}_m{bm}" with the point's values substituted. Every axis must appear.
std::string expand_name(const std::string& pattern, const Point& p) {
  std::string out;
  std::set<std::string> used;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '{') { out += pattern[i]; continue; }
    size_t end = pattern.find('}', i);
    if (end == std::string::npos) throw std::runtime_error("unterminated '{' in name " + pattern);
    std::string key = pattern.substr(i + 1, end - i - 1);
    auto it = p.find(key);
    if (it == p.end()) throw std::runtime_error("name " + pattern + " uses unknown axis " + key);
    out += it->second.text();
    used.insert(key);
    i = end;
  }
  for (auto& [k, v] : p)
    if (!used.count(k)) throw std::runtime_error("name " + pattern + " does not encode axis " + k);
  return out;
}

struct Variant {
  std::string name, family, params, source;
  std::string image;  // compile unit (cubin) name: the name over the compile axes only
  Point point;        // compile axes only (host axes at their first value): what the generated unit defines
};

bool point_matches(const Point& p, const json& partial) {
  for (auto& [k, v] : partial.items()) {
    auto it = p.find(k);
    if (it == p.end()) throw std::runtime_error("default names unknown axis " + k);
    if (it->second.text() != to_value(v).text()) return false;
  }
  return true;
}

void write_if_changed(const fs::path& path, const std::string& text) {
  std::ifstream in(path, std::ios::binary);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str() == text) return;
  }
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int main(int argc, char** argv) try {
  const char* usage =
      "usage: flygen --tuning DIR --db DIR --out DIR [--all [--match REGEX]] [--families a,b]\n"
      "Expands the variant spaces into one compile unit per variant and a manifest (configure step).\n";
  std::string tuning_dir, db_dir, out_dir, families_arg, match_arg;
  bool all = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") { std::printf("%s", usage); return 0; }
    if (a == "--all") { all = true; continue; }
    std::string* slot = a == "--tuning" ? &tuning_dir : a == "--db" ? &db_dir : a == "--out" ? &out_dir
                      : a == "--families" ? &families_arg : a == "--match" ? &match_arg : nullptr;
    if (!slot || i + 1 >= argc) {
      std::fprintf(stderr, "flygen: %s %s\n%s", slot ? "no value after" : "unknown argument", a.c_str(), usage);
      return 2;
    }
    *slot = argv[++i];
  }
  if (tuning_dir.empty() || out_dir.empty()) { std::fprintf(stderr, "%s", usage); return 2; }

  // --match: with --all, only the variants whose name matches (defaults and DB rows stay).
  const std::regex match_re(match_arg.empty() ? std::string(".") : match_arg);
  std::set<std::string> families;
  {
    std::replace(families_arg.begin(), families_arg.end(), ';', ',');
    std::stringstream ss(families_arg);
    std::string f;
    while (std::getline(ss, f, ',')) if (!f.empty()) families.insert(f);
  }
  std::string db_text;
  if (!db_dir.empty() && fs::exists(db_dir))
    for (auto& e : fs::directory_iterator(db_dir))
      if (e.path().extension() == ".sql") db_text += read_file(e.path());

  std::vector<fs::path> files;
  for (auto& e : fs::directory_iterator(tuning_dir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());

  std::vector<Variant> selected;
  std::set<std::string> seen;
  size_t total = 0;
  for (auto& file : files) {
    json doc = json::parse(read_file(file));
    std::string family = doc.at("family").get<std::string>();
    if (!families.empty() && !families.count(family)) continue;
    for (auto& space : doc.at("spaces")) {
      std::vector<std::pair<std::string, std::vector<Value>>> axes;
      for (auto& [k, vals] : space.at("axes").items()) {
        std::vector<Value> vs;
        for (auto& v : vals) vs.push_back(to_value(v));
        if (vs.empty()) throw std::runtime_error(file.string() + ": axis " + k + " is empty");
        axes.emplace_back(k, vs);
      }
      // Launch axes join the odometer after the compile axes; `n_compile` marks the boundary.
      const size_t n_compile = axes.size();
      json launch = space.value("launch_axes", json::object());
      for (auto& [k, vals] : launch.items()) {
        std::vector<Value> vs;
        for (auto& v : vals) vs.push_back(to_value(v));
        if (vs.empty()) throw std::runtime_error(file.string() + ": launch axis " + k + " is empty");
        for (size_t a = 0; a < axes.size(); ++a)
          if (axes[a].first == k) throw std::runtime_error(file.string() + ": axis " + k + " is both compiled and launched");
        axes.emplace_back(k, vs);
      }
      // "launch_suffix": one pattern over all launch axes, added unless every value is its axis's
      // first; or an object of one pattern per axis, each added only off that axis's first value
      // (so a new axis leaves the names of the existing variants alone).
      std::string suffix;
      std::map<std::string, std::string> axis_suffix;
      if (space.contains("launch_suffix") && space["launch_suffix"].is_object()) {
        for (auto& [k, pat] : space["launch_suffix"].items()) {
          if (!launch.contains(k)) throw std::runtime_error(file.string() + ": launch_suffix names " + k + ", not a launch axis");
          axis_suffix[k] = pat.get<std::string>();
        }
        for (auto& [k, vals] : launch.items())
          if (!axis_suffix.count(k)) throw std::runtime_error(file.string() + ": launch_suffix has no pattern for launch axis " + k);
      } else {
        suffix = space.value("launch_suffix", std::string());
      }
      if (axes.size() > n_compile && suffix.empty() && axis_suffix.empty())
        throw std::runtime_error(file.string() + ": launch_axes need a launch_suffix that encodes them");
      std::map<std::string, Value> host_first;  // host axis -> its first value (the shared image's)
      for (auto& h : space.value("host_axes", json::array())) {
        const std::string k = h.get<std::string>();
        size_t a = 0;
        while (a < n_compile && axes[a].first != k) ++a;
        if (a == n_compile) throw std::runtime_error(file.string() + ": host axis " + k + " is not a compile axis");
        host_first.emplace(k, axes[a].second[0]);
      }
      std::vector<std::string> constraints;
      if (space.contains("constraints"))
        for (auto& c : space["constraints"]) constraints.push_back(c.get<std::string>());
      json defaults = space.value("defaults", json::array());
      std::string pattern = space.at("name").get<std::string>();
      std::string source = space.at("source").get<std::string>();
      std::vector<size_t> idx(axes.size(), 0);
      size_t matched_defaults = 0;
      for (bool more = !axes.empty(); more;) {
        Point p;
        for (size_t a = 0; a < axes.size(); ++a) p[axes[a].first] = axes[a].second[idx[a]];
        bool ok = true;
        for (auto& c : constraints) if (!Expr(c, p).eval()) { ok = false; break; }
        if (ok) {
          ++total;
          Variant v;
          Point compile, launched;
          bool first_launch = true;
          for (size_t a = 0; a < axes.size(); ++a) {
            const auto& key = axes[a].first;
            if (a < n_compile) compile[key] = p[key];
            else {
              launched[key] = p[key];
              if (idx[a] != 0) first_launch = false;
            }
          }
          Point image = compile;  // host axes at their first value
          for (auto& [k, first] : host_first) image[k] = first;
          v.image = expand_name(pattern, image);
          v.name = expand_name(pattern, compile);
          if (!axis_suffix.empty()) {
            for (size_t a = n_compile; a < axes.size(); ++a)
              if (idx[a] != 0) {
                const auto& key = axes[a].first;
                v.name += expand_name(axis_suffix.at(key), Point{{key, p[key]}});
              }
          } else if (!first_launch) {
            v.name += expand_name(suffix, launched);
          }
          v.family = family;
          v.source = source;
          v.point = image;
          for (auto& [k, val] : axes) {
            if (!v.params.empty()) v.params += ';';
            v.params += k + "=" + p[k].text();
          }
          bool is_default = false;
          for (auto& d : defaults) {
            bool launch_ok = true;  // a default that does not mention a launch axis means its first value
            for (size_t a = n_compile; a < axes.size(); ++a)
              if (!d.contains(axes[a].first) && idx[a] != 0) launch_ok = false;
            if (launch_ok && point_matches(p, d)) { is_default = true; ++matched_defaults; }
          }
          bool in_db = db_text.find("'" + v.name + "'") != std::string::npos;
          if (!seen.insert(v.name).second)
            throw std::runtime_error("duplicate variant name " + v.name);
          const bool wanted = all && (match_arg.empty() || std::regex_search(v.name, match_re));
          if (wanted || is_default || in_db) selected.push_back(v);
        }
        // odometer over the axes
        size_t a = 0;
        for (; a < axes.size(); ++a) {
          if (++idx[a] < axes[a].second.size()) break;
          idx[a] = 0;
        }
        more = a < axes.size();
      }
      if (matched_defaults < defaults.size())
        throw std::runtime_error(file.string() + ": a default of " + pattern +
                                 " matches no variant that passes the constraints");
    }
  }

  fs::create_directories(out_dir);
  std::string manifest;
  std::set<std::string> images;
  for (auto& v : selected) {
    manifest += v.name + "\t" + v.family + "\t" + v.source + "\t" + v.image + "\t" + v.params + "\n";
    if (!images.insert(v.image).second) continue;  // one compile unit per image
    std::string cu = "// Generated by tools/flygen from tuning/" + v.family + ".json; do not edit.\n";
    cu += "#define FLY_VARIANT_NAME \"" + v.image + "\"\n";
    for (auto& [k, val] : v.point) {
      if (val.is_str) {
        cu += "#define FLY_" + upper_ident(k) + "_IS_" + upper_ident(val.s) + " 1\n";
        cu += "#define FLY_" + upper_ident(k) + "_STR \"" + val.s + "\"\n";
      } else {
        cu += "#define FLY_" + upper_ident(k) + " " + std::to_string(val.i) + "\n";
      }
    }
    cu += "#include \"" + v.source + "\"\n";
    write_if_changed(fs::path(out_dir) / (v.image + ".cu"), cu);
  }
  write_if_changed(fs::path(out_dir) / "manifest.tsv", manifest);
  std::printf("flygen: %zu of %zu variants selected%s, %zu compile units\n", selected.size(), total,
              all ? " (all)" : " (shipped database + defaults)", images.size());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flygen: error: %s\n", e.what());
  return 1;
}
