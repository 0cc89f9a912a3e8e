// SPDX-License-Identifier: Apache-2.0
// Dispatch state behind the C ABI and the tests: the per-shape decision cache, the overlay and
// forced variant (fly_set_tuning_db, fly_force_variant) and this thread's last decision
// (fly_last_variant, fly_last_decision, fly_last_key). The request and the choice themselves
// (DispatchKey, DispatchRequest, choose_variant, resolve_kernel) are in core.hpp, which every op
// includes; the database they read is tuning_db.hpp.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core.hpp"

namespace fly {

// Clears the per-shape dispatch cache (tests; fly_set_tuning_db does it too).
void clear_dispatch_cache();
// The per-shape dispatch cache keeps at most this many decisions per op (clock replacement).
constexpr size_t kDispatchCacheEntries = 4096;
// Decisions cached for `op` now (tests).
size_t dispatch_cache_size(const std::string& op);
// Forgets the overlay so the next dispatch reads FLYKERNELS_TUNING_DB again (tests).
void reload_environment_overlay();

// Dispatch controls behind the C ABI (src/api.cpp): overlay database, forced variant, and this
// thread's last decision.
fly_status set_overlay(const char* path);
fly_status set_forced(const char* name);
const char* last_variant();
const char* last_decision();
const DispatchKey& last_key();
// The name fly_force_variant set on this thread ("" when none).
const std::string& forced_variant();
// Adds to this thread's last decision (fly_last_decision), e.g. ":packed" after a dispatch.
void append_decision(const char* suffix);

class TuningDb;
// The profile vote choose_variant runs (DispatchRequest::profile_op), over the profile rows of
// `dbs` (in the dispatch's order: overlay, then embedded) for `req` on `arch`, with `ok` in place
// of the registry and `supports`: the winning name, or "" (tests compare picks without cubins).
std::string profile_pick(const std::vector<const TuningDb*>& dbs, const std::string& arch, const DispatchRequest& req,
                         const std::function<bool(const std::string&)>& ok);

}  // namespace fly
