// SPDX-License-Identifier: Apache-2.0
// The embedded kernel archive is the variant registry; modules load lazily per context.
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>

#include "archive.hpp"
#include "core.hpp"

extern "C" {
extern const uint8_t fly_embedded_archive_begin[];
extern const uint8_t fly_embedded_archive_end[];
}

namespace fly {

int64_t Variant::get_int(const std::string& key, int64_t dflt) const {
  auto it = kv.find(key);
  if (it == kv.end()) return dflt;
  try {
    return std::stoll(it->second);
  } catch (...) {
    return dflt;
  }
}

std::string Variant::get(const std::string& key, const std::string& dflt) const {
  auto it = kv.find(key);
  return it == kv.end() ? dflt : it->second;
}

namespace {

struct Registry {
  Archive archive;
  std::vector<Variant> variants;
  std::map<std::string, size_t> by_name;
  std::string error;  // non-empty when the embedded archive is unusable
};

const Registry& registry() {
  static const Registry* r = [] {
    auto* reg = new Registry();
    size_t size = size_t(fly_embedded_archive_end - fly_embedded_archive_begin);
    if (!reg->archive.open(fly_embedded_archive_begin, size, &reg->error)) return reg;
    for (auto& e : reg->archive.entries()) {
      Variant v;
      v.name = e.name;
      v.family = e.family;
      v.params = e.params;
      std::stringstream ss(e.params);
      for (std::string kv; std::getline(ss, kv, ';');) {
        size_t eq = kv.find('=');
        if (eq != std::string::npos) v.kv[kv.substr(0, eq)] = kv.substr(eq + 1);
      }
      reg->by_name[v.name] = reg->variants.size();
      reg->variants.push_back(std::move(v));
    }
    return reg;
  }();
  return *r;
}

// One loaded module per (context, variant), loaded at most once even when threads race.
struct ModuleSlot {
  std::mutex mu;
  bool tried = false;
  CUmodule module = nullptr;
  fly_status status = FLY_SUCCESS;
  std::string message;
  std::map<std::string, CUfunction> functions;
};
std::mutex g_slots_mu;
std::map<std::pair<CUcontext, size_t>, std::unique_ptr<ModuleSlot>> g_slots;

}  // namespace

const std::vector<Variant>& all_variants() { return registry().variants; }

const Variant* find_variant(const std::string& name) {
  const Registry& r = registry();
  auto it = r.by_name.find(name);
  return it == r.by_name.end() ? nullptr : &r.variants[it->second];
}

std::vector<const Variant*> variants_of(const std::string& family) {
  std::vector<const Variant*> out;
  for (auto& v : registry().variants)
    if (v.family == family) out.push_back(&v);
  return out;
}

fly_status get_function(const DeviceCtx& dc, const Variant& v, const char* kernel, CUfunction* out) {
  const Registry& r = registry();
  if (!r.error.empty()) return fail(FLY_ERROR_KERNEL_IMAGE, "%s", r.error.c_str());
  auto idx_it = r.by_name.find(v.name);
  if (idx_it == r.by_name.end())
    return fail(FLY_ERROR_KERNEL_IMAGE, "variant %s is not bundled in this build", v.name.c_str());
  size_t idx = idx_it->second;
  ModuleSlot* slot;
  {
    std::lock_guard<std::mutex> lock(g_slots_mu);
    auto& p = g_slots[{dc.ctx, idx}];
    if (!p) p = std::make_unique<ModuleSlot>();
    slot = p.get();
  }
  std::lock_guard<std::mutex> lock(slot->mu);
  if (!slot->tried) {
    slot->tried = true;
    const Driver* d = nullptr;
    fly_status st = driver(&d);
    std::vector<uint8_t> image;
    std::string err;
    if (st != FLY_SUCCESS) {
      slot->status = st;
      slot->message = fly_get_last_error();
    } else if (!r.archive.extract(idx, &image, &err)) {
      slot->status = FLY_ERROR_KERNEL_IMAGE;
      slot->message = err;
    } else {
      CUresult cr = d->cuModuleLoadData(&slot->module, image.data());
      if (cr != CUDA_SUCCESS) {
        cuda_fail(cr, ("cuModuleLoadData(" + v.name + ")").c_str());
        slot->status = FLY_ERROR_KERNEL_IMAGE;
        slot->message = fly_get_last_error();
        slot->module = nullptr;
      } else {
        log(LogLevel::kDebug, "loaded %s (%zu bytes) on device %d", v.name.c_str(), image.size(),
            int(dc.device));
      }
    }
  }
  if (slot->status != FLY_SUCCESS) return fail(slot->status, "%s", slot->message.c_str());
  auto it = slot->functions.find(kernel);
  if (it == slot->functions.end()) {
    const Driver* d = nullptr;
    FLY_TRY(driver(&d));
    CUfunction f = nullptr;
    CUresult cr = d->cuModuleGetFunction(&f, slot->module, kernel);
    if (cr != CUDA_SUCCESS)
      return fail(FLY_ERROR_KERNEL_IMAGE, "variant %s has no kernel %s", v.name.c_str(), kernel);
    it = slot->functions.emplace(kernel, f).first;
  }
  *out = it->second;
  return FLY_SUCCESS;
}

}  // namespace fly
