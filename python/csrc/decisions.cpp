// SPDX-License-Identifier: Apache-2.0
// Ours or stock per call (decisions.hpp): the rows, the per-key cache, the autotune callback and
// their Python bindings.
#include "decisions.hpp"

#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace flyk {
namespace {

struct Row {
  std::string arch;  // "sm_90a:H100": the library's arch and the card's model
  DecisionKey key;
  double ours_us = 0, stock_us = 0;
  std::string source;  // "shipped", "tuned", "autotune", an overlay path
};

std::shared_mutex g_mu;          // guards everything below except the atomics
std::vector<Row> g_rows;         // later rows take precedence over earlier ones with the same key
std::string g_device_tag;        // "sm_90a:H100"; empty before the Python side sets it
struct KeyHash {
  size_t operator()(const DecisionKey& k) const {
    size_t h = std::hash<std::string>()(k.op) ^ (std::hash<std::string>()(k.dtype) * 31) ^
               (std::hash<std::string>()(k.layout) * 131);
    for (int64_t v : k.k) h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};
struct KeyEq {
  bool operator()(const DecisionKey& a, const DecisionKey& b) const {
    return a.op == b.op && a.dtype == b.dtype && a.layout == b.layout && std::equal(a.k, a.k + 4, b.k);
  }
};
// The answer per key (no string formatting on the call path); cleared when the rows change.
std::unordered_map<DecisionKey, Decided, KeyHash, KeyEq> g_cache;
std::unordered_set<std::string> g_decisions_logged;
std::atomic<bool> g_decisions_log{false};
std::atomic<bool> g_autotune{false};
py::object* g_autotune_cb = nullptr;  // leaked on purpose: never destroyed after interpreter exit
// The force (flykernels.torch.forced): this thread's, else the process's. The process-wide one is
// what reaches a backward: the autograd engine runs CUDA backward ops on its own worker thread,
// where a thread-local force set around loss.backward() is not seen (the tuner's backward rows
// timed the same side twice before it existed).
thread_local int t_forced = 0;
std::atomic<int> g_forced{0};
int forced_now() { return t_forced != 0 ? t_forced : g_forced.load(std::memory_order_relaxed); }

std::string arch_base(const std::string& tag) { return tag.substr(0, tag.find(':')); }

double log2_distance(const int64_t* a, const int64_t* b) {
  double d = 0;
  for (int i = 0; i < 4; ++i) d += std::fabs(std::log2(double(a[i]) + 1.0) - std::log2(double(b[i]) + 1.0));
  return d;
}

std::string fmt_ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", r);
  return buf;
}

bool same_group(const DecisionKey& a, const DecisionKey& b) {
  return a.op == b.op && a.dtype == b.dtype && a.layout == b.layout;
}

// Rows of the key's group measured on this card model; where there are none, those of other
// cards of the same arch (an H200's rows serve an H100 and the other way round).
std::vector<const Row*> group_rows(const DecisionKey& key) {
  std::vector<const Row*> own, other;
  const std::string base = arch_base(g_device_tag);
  for (const Row& r : g_rows) {
    if (!same_group(r.key, key)) continue;
    if (r.arch == g_device_tag) own.push_back(&r);
    else if (arch_base(r.arch) == base) other.push_back(&r);
  }
  return own.empty() ? other : own;
}

// The answer from the rows alone (no autotune): exact, then nearest with the margin, then stock.
// `exact_found` says whether an exact row decided.
Decided from_rows(const DecisionKey& key, bool* exact_found) {
  *exact_found = false;
  const std::vector<const Row*> rows = group_rows(key);
  const Row* exact = nullptr;
  for (const Row* r : rows)
    if (std::equal(r->key.k, r->key.k + 4, key.k)) exact = r;  // the last one wins
  Decided d;
  if (exact != nullptr) {
    *exact_found = true;
    const double ratio = exact->ours_us > 0 ? exact->stock_us / exact->ours_us : 0;
    const bool ours = ratio > 1.0;
    d.choice = ours ? Choice::kOurs : Choice::kStock;
    const std::string head = exact->source == "autotune" ? "autotune: " : "tuned: ";
    d.rule = head + (ours ? "ours " + fmt_ratio(ratio) : "stock, ours " + fmt_ratio(ratio));
    return d;
  }
  const Row* best = nullptr;
  double best_d = 0;
  for (const Row* r : rows) {
    const double dist = log2_distance(r->key.k, key.k);
    if (best == nullptr || dist < best_d) best = r, best_d = dist;
  }
  if (best == nullptr) {
    d.rule = "no row: stock";
    return d;
  }
  const double ratio = best->ours_us > 0 ? best->stock_us / best->ours_us : 0;
  const bool ours = ratio >= kNearestMargin;
  d.choice = ours ? Choice::kOurs : Choice::kStock;
  std::ostringstream os;
  os << "nearest: " << (ours ? "ours " : "stock, ours ") << fmt_ratio(ratio) << " at [" << best->key.k[0] << ", "
     << best->key.k[1] << ", " << best->key.k[2] << ", " << best->key.k[3] << "]";
  if (!ours) os << " (< " << fmt_ratio(kNearestMargin) << ")";
  d.rule = os.str();
  return d;
}

// Times both through the Python callback; false when it could not (capturing, an error, no callback).
bool autotune_measure(const DecisionKey& key, const std::function<TimingCall()>& timing, double* ours_us,
                      double* stock_us) {
  if (!g_autotune.load() || !timing) return false;
  TimingCall call = timing();
  py::gil_scoped_acquire gil;
  if (g_autotune_cb == nullptr || g_autotune_cb->is_none()) return false;
  // A reference of our own: set_autotune may replace the callback while this one runs (the
  // timed calls release the GIL).
  const py::object cb = *g_autotune_cb;
  try {
    py::list args;
    for (const c10::IValue& v : call.args) args.append(torch::jit::toPyObject(v));
    py::tuple k = py::make_tuple(key.op, key.dtype, key.layout, key.k[0], key.k[1], key.k[2], key.k[3]);
    py::object r = cb(k, call.op, call.overload, args);
    if (r.is_none()) return false;
    auto t = r.cast<std::pair<double, double>>();
    *ours_us = t.first;
    *stock_us = t.second;
    return *ours_us > 0 && *stock_us > 0;
  } catch (py::error_already_set& e) {
    std::fprintf(stderr, "flykernels: autotune of %s failed (%s); the rows decide\n", key.str().c_str(), e.what());
    return false;
  }
}

void log_once(const DecisionKey& key, const Decided& d) {
  if (!g_decisions_log.load(std::memory_order_relaxed)) return;
  const std::string s = key.str();
  {
    std::unique_lock<std::shared_mutex> lock(g_mu);
    if (!g_decisions_logged.insert(s).second) return;
  }
  std::fprintf(stderr, "flykernels: %s -> %s (%s)\n", s.c_str(), d.choice == Choice::kOurs ? "ours" : "stock",
               d.rule.c_str());
}

}  // namespace

std::string DecisionKey::str() const {
  std::ostringstream os;
  os << op << ' ' << dtype << ' ' << layout << " [" << k[0] << ", " << k[1] << ", " << k[2] << ", " << k[3] << "]";
  return os.str();
}

int forced() { return forced_now(); }
void set_forced(int mode) { t_forced = mode; }
void set_forced_process(int mode) { g_forced.store(mode); }

Decided decide(const DecisionKey& key, const std::function<TimingCall()>& timing) {
  const int force = forced_now();
  if (force == 1) return {Choice::kOurs, "forced: ours"};
  if (force == 2) return {Choice::kStock, "forced: stock"};
  {
    std::shared_lock<std::shared_mutex> lock(g_mu);
    auto it = g_cache.find(key);
    if (it != g_cache.end()) return it->second;
  }
  bool exact = false;
  Decided d;
  {
    std::shared_lock<std::shared_mutex> lock(g_mu);
    d = from_rows(key, &exact);
  }
  if (!exact && g_autotune.load()) {
    double ours_us = 0, stock_us = 0;
    if (!autotune_measure(key, timing, &ours_us, &stock_us))
      return d;  // not measured now (a CUDA-graph capture, a query without a call): not cached
    std::unique_lock<std::shared_mutex> lock(g_mu);
    g_rows.push_back(Row{g_device_tag, key, ours_us, stock_us, "autotune"});
    d = from_rows(key, &exact);
    return g_cache.emplace(key, d).first->second;
  }
  std::unique_lock<std::shared_mutex> lock(g_mu);
  return g_cache.emplace(key, d).first->second;
}

bool take_ours(const DecisionKey& key, const std::function<TimingCall()>& timing) {
  // The call path: a cached key answers with its choice alone (no copy of the rule's text).
  if (forced_now() == 0 && !g_decisions_log.load(std::memory_order_relaxed)) {
    std::shared_lock<std::shared_mutex> lock(g_mu);
    auto it = g_cache.find(key);
    if (it != g_cache.end()) return it->second.choice == Choice::kOurs;
  }
  const Decided d = decide(key, timing);
  log_once(key, d);
  return d.choice == Choice::kOurs;
}

TimingCall timing_call(const char* op, const char* overload, const torch::jit::Stack& stack, size_t n) {
  TimingCall c{op, overload, {}};
  c.args.assign(stack.end() - static_cast<std::ptrdiff_t>(n), stack.end());
  return c;
}

void register_decision_bindings(py::module_& m) {
  m.def(
      "set_decision_rows",
      [](const std::vector<std::tuple<std::string, std::string, std::string, std::string, int64_t, int64_t, int64_t,
                                      int64_t, double, double, std::string>>& rows) {
        std::vector<Row> v;
        v.reserve(rows.size());
        for (auto& t : rows) {
          Row r;
          r.arch = std::get<0>(t);
          r.key.op = std::get<1>(t);
          r.key.dtype = std::get<2>(t);
          r.key.layout = std::get<3>(t);
          r.key.k[0] = std::get<4>(t);
          r.key.k[1] = std::get<5>(t);
          r.key.k[2] = std::get<6>(t);
          r.key.k[3] = std::get<7>(t);
          r.ours_us = std::get<8>(t);
          r.stock_us = std::get<9>(t);
          r.source = std::get<10>(t);
          v.push_back(std::move(r));
        }
        std::unique_lock<std::shared_mutex> lock(g_mu);
        g_rows = std::move(v);
        g_cache.clear();
        g_decisions_logged.clear();
      },
      "replace the decision rows: (arch, op, dtype, layout, k0, k1, k2, k3, ours_us, stock_us, source), later "
      "rows over earlier ones of the same key");
  m.def("decision_row_count", [] {
    std::shared_lock<std::shared_mutex> lock(g_mu);
    return g_rows.size();
  });
  m.def(
      "set_device_tag",
      [](const std::string& tag) {
        std::unique_lock<std::shared_mutex> lock(g_mu);
        g_device_tag = tag;
        g_cache.clear();
      },
      "the rows' arch value of this process's card, e.g. 'sm_90a:H100'");
  m.def(
      "set_autotune",
      [](bool on, py::object cb) {
        py::object* old = g_autotune_cb;
        g_autotune_cb = new py::object(std::move(cb));
        g_autotune = on && !g_autotune_cb->is_none();
        delete old;
        std::unique_lock<std::shared_mutex> lock(g_mu);
        g_cache.clear();
      },
      py::arg("on"), py::arg("callback") = py::none(),
      "FLYKERNELS_AUTOTUNE: callback(key, op, overload, args) -> (ours_us, stock_us) or None");
  m.def("autotune_enabled", [] { return g_autotune.load(); });
  m.def("set_forced", &set_forced, "this thread's force: 0 none (the process's applies), 1 ours, 2 stock");
  m.def("set_forced_process", &set_forced_process,
        "the process's force, for threads that set none (the autograd engine's): 0 none, 1 ours, 2 stock");
  m.def("forced_state", [] { return py::make_tuple(t_forced, g_forced.load()); }, "(this thread's, the process's)");
  m.def("forced", &forced, "the force in effect on this thread");
  m.def(
      "decide",
      [](const std::string& op, const std::string& dtype, const std::string& layout, int64_t k0, int64_t k1,
         int64_t k2, int64_t k3) {
        DecisionKey key{op, dtype, layout, {k0, k1, k2, k3}};
        const Decided d = decide(key);
        return py::make_tuple(d.choice == Choice::kOurs, d.rule);
      },
      py::arg("op"), py::arg("dtype"), py::arg("layout"), py::arg("k0"), py::arg("k1") = 0, py::arg("k2") = 0,
      py::arg("k3") = 0, "(ours?, rule) for a key, from the rows (no autotune)");
  m.def(
      "decide_timed",
      [](const std::string& op, const std::string& dtype, const std::string& layout, std::vector<int64_t> k,
         const std::string& timing_op, const std::string& overload, const py::list& args) {
        DecisionKey key{op, dtype, layout, {}};
        for (size_t i = 0; i < 4 && i < k.size(); ++i) key.k[i] = k[i];
        std::vector<c10::IValue> iv;
        // toIValue(AnyType), not toTypeInferredIValue: the latter's helper is not exported by libtorch_python
        for (const py::handle& a : args) iv.push_back(torch::jit::toIValue(a, c10::AnyType::get()));
        py::gil_scoped_release nogil;  // as a dispatcher call would run
        const Decided d = decide(key, [&] { return TimingCall{timing_op, overload, iv}; });
        py::gil_scoped_acquire gil;
        return py::make_tuple(d.choice == Choice::kOurs, d.rule);
      },
      "decide() as an override calls it, with a timing call of timing_op(*args) (tests of autotune)");
  m.def(
      "set_decision_log",
      [](bool on) {
        g_decisions_log = on;
        std::unique_lock<std::shared_mutex> lock(g_mu);
        g_decisions_logged.clear();
      },
      "print each key's decision once (FLYKERNELS_LOG=info)");
}

}  // namespace flyk
