// SPDX-License-Identifier: Apache-2.0
// Per-call variant choice: forced -> overlay/embedded exact -> profile vote (ops with profile rows)
// -> nearest bucket -> family default.
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "core.hpp"
#include "dispatch.hpp"
#include "tuning_db.hpp"

extern "C" {
extern const uint8_t fly_embedded_db_begin[];
extern const uint8_t fly_embedded_db_end[];
}

namespace fly {

namespace {

struct Decision {
  const Variant* variant;
  std::string how;
  std::string why;  // for the log: the row a nearest decision took, or why the default rule ran
};

// Per-shape decisions of one op, at most kDispatchCacheEntries of them, replaced by the clock
// (second-chance) rule: a hit marks its entry under the shared lock, an insert into a full cache
// evicts the first unmarked entry after the hand, clearing marks on the way.
class DecisionCache {
 public:
  // Under the shared lock (the mark is atomic).
  const Decision* find(const std::string& key) const {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    const Slot& slot = slots_[it->second];
    slot.used.store(true, std::memory_order_relaxed);
    return &slot.decision;
  }
  // Under the unique lock.
  void insert(const std::string& key, const Decision& d) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      slots_[it->second].decision = d;
      return;
    }
    size_t at;
    if (slots_.size() < kDispatchCacheEntries) {
      at = slots_.size();
      slots_.emplace_back();
    } else {
      while (slots_[hand_].used.exchange(false, std::memory_order_relaxed)) hand_ = (hand_ + 1) % slots_.size();
      at = hand_;
      hand_ = (hand_ + 1) % slots_.size();
      index_.erase(slots_[at].key);
    }
    slots_[at].key = key;
    slots_[at].decision = d;
    slots_[at].used.store(false, std::memory_order_relaxed);
    index_.emplace(key, at);
  }
  size_t size() const { return index_.size(); }

 private:
  struct Slot {
    std::string key;
    Decision decision{nullptr, std::string(), std::string()};
    mutable std::atomic<bool> used{false};
    Slot() = default;
    Slot(Slot&& o) noexcept : key(std::move(o.key)), decision(std::move(o.decision)), used(o.used.load()) {}
  };
  std::deque<Slot> slots_;  // deque: slots never move once made
  std::unordered_map<std::string, size_t> index_;
  size_t hand_ = 0;
};

// Profile rows of one (arch, served op), grouped by shape (DispatchRequest::profile_op).
struct ProfileShape {
  std::string layout;
  int64_t k[3] = {0, 0, 0};
  std::vector<std::pair<std::string, double>> rel;  // variant as measured, time over the shape's best
};
using ProfileIndex = std::map<std::string, std::vector<ProfileShape>>;  // "arch|op" -> shapes

// A shape's rows in the database's order; the dtype is not part of the shape (the profile_name
// mapping puts every row under the call's names).
void add_profile_rows(const TuningDb& db, ProfileIndex* index) {
  std::map<std::string, size_t> at;  // "arch|op|layout|k0|k1|k2" -> position in its vector
  for (const ProfileRow& r : db.profile_rows()) {
    std::vector<ProfileShape>& shapes = (*index)[r.arch + "|" + r.op];
    const std::string key = r.arch + "|" + r.op + "|" + r.layout + "|" + std::to_string(r.k[0]) + "|" +
                            std::to_string(r.k[1]) + "|" + std::to_string(r.k[2]) + "|" + db.source();
    auto it = at.find(key);
    if (it == at.end()) {
      it = at.emplace(key, shapes.size()).first;
      shapes.emplace_back();
      shapes.back().layout = r.layout;
      for (int i = 0; i < 3; ++i) shapes.back().k[i] = r.k[i];
    }
    // A time over the shape's best is >= 1 by its definition; a row that says otherwise (a broken
    // overlay) counts as the best, one that is not a number is left out.
    if (std::isfinite(r.rel_time)) shapes[it->second].rel.emplace_back(r.variant, std::max(1.0, r.rel_time));
  }
}

struct DispatchState {
  std::shared_mutex mu;
  bool embedded_loaded = false;
  fly_status embedded_status = FLY_SUCCESS;
  std::string embedded_error;
  TuningDb embedded;
  bool overlay_initialized = false;  // env var consulted
  std::shared_ptr<TuningDb> overlay;
  fly_status overlay_status = FLY_SUCCESS;  // a broken FLYKERNELS_TUNING_DB fails every dispatch
  std::string overlay_error;
  bool profile_built = false;  // `profile` reflects the loaded databases
  ProfileIndex profile;
  std::unordered_map<std::string, DecisionCache> cache;  // by op
};

DispatchState& state() {
  static DispatchState* s = new DispatchState();
  return *s;
}

thread_local std::string t_forced;
thread_local std::string t_last_variant;
thread_local std::string t_last_decision;
thread_local DispatchKey t_last_key;

// Loads the embedded DB and the environment's overlay once. Caller holds the unique lock.
void ensure_loaded(DispatchState& s) {
  if (!s.embedded_loaded) {
    s.embedded_loaded = true;
    size_t size = size_t(fly_embedded_db_end - fly_embedded_db_begin);
    s.embedded_status = s.embedded.load_image(fly_embedded_db_begin, size, "embedded");
    if (s.embedded_status != FLY_SUCCESS) s.embedded_error = fly_get_last_error();
  }
  if (!s.overlay_initialized) {
    s.overlay_initialized = true;
    const char* env = std::getenv("FLYKERNELS_TUNING_DB");
    if (env && *env) {
      auto db = std::make_shared<TuningDb>();
      s.overlay_status = db->load_file(env);
      if (s.overlay_status == FLY_SUCCESS) s.overlay = db;
      else s.overlay_error = std::string("FLYKERNELS_TUNING_DB: ") + fly_get_last_error();
    }
  }
}

// " N=4096 K=64 ..." of shape values k[] under the request's dimension names (unnamed ones left out).
std::string dims_text(const DispatchRequest& req, const int64_t (&k)[kKeyDims]) {
  std::string s;
  for (int i = 0; i < kKeyDims; ++i)
    if (req.key_names[i][0] != '-') s += " " + std::string(req.key_names[i]) + "=" + std::to_string(k[i]);
  return s;
}

std::string key_text(const DispatchRequest& req) {
  return req.key.op + " " + req.key.dtype + " " + req.key.layout + dims_text(req, req.key.k);
}

void record(const Variant* v, const std::string& how, const DispatchRequest& req, bool cached,
            const std::string& why = std::string()) {
  t_last_variant = v->name;
  t_last_decision = how;
  t_last_key = req.key;
  log(LogLevel::kInfo, "dispatch %s -> %s (%s%s%s%s)", key_text(req).c_str(), v->name.c_str(), how.c_str(),
      why.empty() ? "" : ": ", why.c_str(), cached ? ", cached" : "");
}

// "row N=.. K=.., log2 distance d" of a nearest-bucket decision.
std::string nearest_text(const DispatchRequest& req, const TuningRow& r, double dist) {
  char d[32];
  std::snprintf(d, sizeof d, ", log2 distance %.2f", dist);
  return "row" + dims_text(req, r.k) + d;
}

// The profile vote (DispatchRequest::profile_op): the winning name (under the call's names) and
// its reason, or "" when no listed variant passes `ok`.
std::string profile_vote(const std::vector<ProfileShape>& shapes, const DispatchRequest& req,
                         const std::function<bool(const std::string&)>& ok, std::string* why) {
  if (shapes.empty()) return std::string();
  auto l2 = [](int64_t x) { return std::log2(double(std::max<int64_t>(x, 1))); };
  std::vector<std::pair<double, const ProfileShape*>> near;
  near.reserve(shapes.size());
  for (const ProfileShape& sh : shapes) {
    double d = sh.layout == req.key.layout ? 0.0 : kProfileLayoutPenalty;
    for (int i = 0; i < 3; ++i) d += std::fabs(l2(sh.k[i]) - l2(req.key.k[i]));
    near.emplace_back(d, &sh);
  }
  const size_t n = std::min<size_t>(near.size(), kProfileNeighbours);
  std::partial_sort(near.begin(), near.begin() + long(n), near.end(),
                    [](const auto& a, const auto& b) { return a.first < b.first; });
  // Each neighbour's relative times under the call's names.
  std::vector<std::map<std::string, double>> rel(n);
  std::vector<std::string> names;
  for (size_t j = 0; j < n; ++j)
    for (const auto& [name, r] : near[j].second->rel) {
      const std::string mapped = req.profile_name ? req.profile_name(name) : name;
      if (rel[j].emplace(mapped, r).second && r <= kProfileCap &&
          std::find(names.begin(), names.end(), mapped) == names.end())
        names.push_back(mapped);
    }
  const std::string* best = nullptr;
  double best_score = 0;
  for (const std::string& name : names) {
    if (!ok(name)) continue;
    double score = 0;
    for (size_t j = 0; j < n; ++j) {
      auto it = rel[j].find(name);
      score += std::log(std::min(it == rel[j].end() ? kProfileCap : it->second, kProfileCap));
    }
    if (!best || score < best_score) {
      best = &name;
      best_score = score;
    }
  }
  if (best) {
    const ProfileShape& f = *near[0].second;
    char d[160];
    std::snprintf(d, sizeof d, "%zu nearest profiled shapes (first %s %" PRId64 "/%" PRId64 "/%" PRId64
                  ", log2 distance %.2f): %.3fx their best on average", n, f.layout.c_str(), f.k[0], f.k[1], f.k[2],
                  near[0].first, std::exp(best_score / double(n)));
    *why = d;
  }
  return best ? *best : std::string();
}

}  // namespace

std::string profile_pick(const std::vector<const TuningDb*>& dbs, const std::string& arch, const DispatchRequest& req,
                         const std::function<bool(const std::string&)>& ok) {
  ProfileIndex index;
  for (const TuningDb* db : dbs) add_profile_rows(*db, &index);
  auto it = index.find(arch + "|" + req.profile_op);
  std::string why;
  return it == index.end() ? std::string() : profile_vote(it->second, req, ok, &why);
}

std::string DispatchKey::str() const {
  std::string s = op + " " + dtype + " " + layout;
  for (int i = 0; i < kKeyDims; ++i) s += " " + std::to_string(k[i]);
  return s;
}

DispatchRequest make_request(const char* family, const ShapeKey& key) {
  DispatchRequest req;
  req.family = family;
  req.key = key.key;
  for (int i = 0; i < kKeyDims; ++i) req.key_names[i] = key.names[i];
  return req;
}

DispatchRequest make_request(const char* family, const char* op, const std::string& dtype, const char* layout,
                             std::initializer_list<KeyDim> dims) {
  return make_request(family, shape_key(op, dtype, layout, dims));
}

size_t dispatch_cache_size(const std::string& op) {
  DispatchState& s = state();
  std::shared_lock<std::shared_mutex> lock(s.mu);
  auto it = s.cache.find(op);
  return it == s.cache.end() ? 0 : it->second.size();
}

void clear_dispatch_cache() {
  DispatchState& s = state();
  std::unique_lock<std::shared_mutex> lock(s.mu);
  s.cache.clear();
}

fly_status choose_variant(const DeviceCtx& dc, const DispatchRequest& req, const Variant** out) {
  auto ok = [&](const Variant* v) {
    return v && v->family == req.family && (!req.supports || req.supports(*v));
  };
  if (!t_forced.empty()) {
    const Variant* v = find_variant(t_forced);
    if (!v || v->family != req.family)
      return fail(FLY_ERROR_UNSUPPORTED, "forced variant %s is not a %s variant", t_forced.c_str(), req.family);
    if (!ok(v))
      return fail(FLY_ERROR_UNSUPPORTED, "forced variant %s cannot run %s", v->name.c_str(), key_text(req).c_str());
    *out = v;
    record(v, "forced", req, false);
    return FLY_SUCCESS;
  }
  DispatchState& s = state();
  std::string ckey = dc.arch + "|" + req.key.str() + "|" + req.cache_tag;
  {
    std::shared_lock<std::shared_mutex> lock(s.mu);
    if (s.embedded_loaded && s.overlay_initialized) {
      if (s.embedded_status != FLY_SUCCESS) return fail(s.embedded_status, "%s", s.embedded_error.c_str());
      if (s.overlay_status != FLY_SUCCESS) return fail(s.overlay_status, "%s", s.overlay_error.c_str());
      auto op = s.cache.find(req.key.op);
      const Decision* hit = op != s.cache.end() ? op->second.find(ckey) : nullptr;
      if (hit) {
        *out = hit->variant;
        record(*out, hit->how, req, true, hit->why);
        return FLY_SUCCESS;
      }
    }
  }
  std::unique_lock<std::shared_mutex> lock(s.mu);
  ensure_loaded(s);
  if (s.embedded_status != FLY_SUCCESS) return fail(s.embedded_status, "%s", s.embedded_error.c_str());
  if (s.overlay_status != FLY_SUCCESS) return fail(s.overlay_status, "%s", s.overlay_error.c_str());

  const Variant* chosen = nullptr;
  std::string how, why;
  auto consider = [&](const TuningRow* r, const char* rule) {
    if (chosen || !r) return;
    const Variant* v = find_variant(r->variant);
    if (!ok(v)) {
      log(LogLevel::kDebug, "dispatch %s: skipping %s row %s (%s)", key_text(req).c_str(), rule, r->variant.c_str(),
          v ? "cannot run this shape" : "not bundled");
      return;
    }
    chosen = v;
    how = rule;
    if (req.prefer && !req.prefer(*v) && !r->runner_up.empty()) {
      const Variant* u = find_variant(r->runner_up);
      if (ok(u) && req.prefer(*u)) {
        chosen = u;
        how = std::string(rule) + ":runner-up";
        why = "the row's winner " + r->variant + " is not preferred for this call";
      }
    }
  };
  if (s.overlay) consider(s.overlay->exact(dc.arch, req.key), "overlay:exact");
  consider(s.embedded.exact(dc.arch, req.key), "db:exact");
  if (!chosen && !req.profile_op.empty()) {
    if (!s.profile_built) {
      s.profile.clear();
      if (s.overlay) add_profile_rows(*s.overlay, &s.profile);
      add_profile_rows(s.embedded, &s.profile);
      s.profile_built = true;
    }
    auto it = s.profile.find(dc.arch + "|" + req.profile_op);
    if (it != s.profile.end()) {
      const std::string name =
          profile_vote(it->second, req, [&](const std::string& n) { return ok(find_variant(n)); }, &why);
      if (!name.empty()) {
        chosen = find_variant(name);
        how = "db:profile";
      }
    }
  }
  if (!chosen) {
    // Nearest bucket over both databases; the overlay wins ties (stable sort, overlay first).
    struct Near { double dist; const TuningRow* row; const char* rule; };
    std::vector<Near> near;
    if (s.overlay)
      for (auto* r : s.overlay->nearest(dc.arch, req.key))
        near.push_back({key_distance(r->k, req.key.k), r, "overlay:nearest"});
    for (auto* r : s.embedded.nearest(dc.arch, req.key))
      near.push_back({key_distance(r->k, req.key.k), r, "db:nearest"});
    std::stable_sort(near.begin(), near.end(), [](const Near& a, const Near& b) { return a.dist < b.dist; });
    for (auto& n : near) {
      consider(n.row, n.rule);
      if (chosen) {
        const std::string runner_up_why = why;
        why = nearest_text(req, *n.row, n.dist);
        if (!runner_up_why.empty()) why += "; " + runner_up_why;
        break;
      }
    }
  }
  if (!chosen) {
    std::string name = req.fallback ? req.fallback() : std::string();
    const Variant* v = find_variant(name);
    if (!v)
      return fail(FLY_ERROR_KERNEL_IMAGE,
                  "default variant '%s' of %s is not bundled in this build (built with FLY_FAMILIES excluding it?)",
                  name.c_str(), req.family);
    if (!ok(v))
      return fail(FLY_ERROR_UNSUPPORTED, "no %s variant in this build can run %s", req.family, key_text(req).c_str());
    chosen = v;
    how = "default";
    why = s.overlay ? "no row in either database for this op, dtype and layout can run it"
                    : "no row in the embedded database for this op, dtype and layout can run it";
  }
  s.cache[req.key.op].insert(ckey, Decision{chosen, how, why});
  *out = chosen;
  record(chosen, how, req, false, why);
  return FLY_SUCCESS;
}

void reload_environment_overlay() {
  DispatchState& s = state();
  std::unique_lock<std::shared_mutex> lock(s.mu);
  s.overlay_initialized = false;
  s.overlay.reset();
  s.overlay_status = FLY_SUCCESS;
  s.overlay_error.clear();
  s.cache.clear();
  s.profile_built = false;
}

fly_status set_overlay(const char* path) {
  DispatchState& s = state();
  std::shared_ptr<TuningDb> db;
  if (path && *path) {
    db = std::make_shared<TuningDb>();
    FLY_TRY(db->load_file(path));
  }
  std::unique_lock<std::shared_mutex> lock(s.mu);
  s.overlay_initialized = true;  // an explicit call replaces the environment's overlay
  s.overlay = db;
  s.overlay_status = FLY_SUCCESS;
  s.overlay_error.clear();
  s.cache.clear();
  s.profile_built = false;
  return FLY_SUCCESS;
}

fly_status set_forced(const char* name) {
  if (!name || !*name) { t_forced.clear(); return FLY_SUCCESS; }
  if (!find_variant(name))
    return fail(FLY_ERROR_INVALID_ARGUMENT, "fly_force_variant: no variant named '%s' in this build",
                printable(name).c_str());
  t_forced = name;
  return FLY_SUCCESS;
}

const char* last_variant() { return t_last_variant.c_str(); }
const char* last_decision() { return t_last_decision.c_str(); }
const DispatchKey& last_key() { return t_last_key; }
const std::string& forced_variant() { return t_forced; }
void append_decision(const char* suffix) { t_last_decision += suffix; }

fly_status resolve_kernel(const DeviceCtx& dc, const DispatchRequest& req, const char* kernel, ResolvedKernel* out) {
  FLY_TRY(choose_variant(dc, req, &out->v));
  FLY_TRY(get_function(dc, *out->v, kernel, &out->f));
  return driver(&out->d);
}

}  // namespace fly
