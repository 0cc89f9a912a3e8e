// SPDX-License-Identifier: Apache-2.0
// Version, introspection, database and dispatch controls of the C ABI.
#include "core.hpp"
#include "dispatch.hpp"

extern "C" {

FLY_API void fly_version(int* major, int* minor, int* patch) {
  if (major) *major = FLY_VERSION_MAJOR;
  if (minor) *minor = FLY_VERSION_MINOR;
  if (patch) *patch = FLY_VERSION_PATCH;
}

FLY_API const char* fly_version_string(void) {
#define FLY_STR2(x) #x
#define FLY_STR(x) FLY_STR2(x)
  return FLY_STR(FLY_VERSION_MAJOR) "." FLY_STR(FLY_VERSION_MINOR) "." FLY_STR(FLY_VERSION_PATCH);
}

FLY_API fly_status fly_set_tuning_db(const char* path) {
  fly::clear_error();
  return fly::set_overlay(path);
}

FLY_API int fly_variant_count(void) { return int(fly::all_variants().size()); }

FLY_API const char* fly_variant_name(int index) {
  auto& v = fly::all_variants();
  if (index < 0 || size_t(index) >= v.size()) return nullptr;
  return v[size_t(index)].name.c_str();
}

FLY_API fly_status fly_variant_info(const char* name, const char** family, const char** params) {
  fly::clear_error();
  if (!name) return fly::fail(FLY_ERROR_INVALID_ARGUMENT, "fly_variant_info: name is NULL");
  const fly::Variant* v = fly::find_variant(name);
  if (!v)
    return fly::fail(FLY_ERROR_INVALID_ARGUMENT, "fly_variant_info: no variant named '%s'",
                     fly::printable(name).c_str());
  if (family) *family = v->family.c_str();
  if (params) *params = v->params.c_str();
  return FLY_SUCCESS;
}

FLY_API fly_status fly_force_variant(const char* name) {
  fly::clear_error();
  return fly::set_forced(name);
}
FLY_API const char* fly_last_variant(void) { return fly::last_variant(); }
FLY_API const char* fly_last_decision(void) { return fly::last_decision(); }
static_assert(fly::kKeyDims == 4, "fly_last_key's k[4] is the ABI");
FLY_API void fly_last_key(const char** op, const char** dtype, const char** layout, int64_t k[4]) {
  const fly::DispatchKey& key = fly::last_key();
  if (op) *op = key.op.c_str();
  if (dtype) *dtype = key.dtype.c_str();
  if (layout) *layout = key.layout.c_str();
  if (k)
    for (int i = 0; i < fly::kKeyDims; ++i) k[i] = key.k[i];
}

FLY_API fly_status fly_device_arch(void* stream, const char** arch) {
  fly::clear_error();
  if (!arch) return fly::fail(FLY_ERROR_INVALID_ARGUMENT, "fly_device_arch: arch is NULL");
  fly::ScopedContext ctx;
  const fly::DeviceCtx* dc = nullptr;
  fly_status s = ctx.enter(stream, &dc);
  if (dc) *arch = dc->arch.c_str();
  return s;
}

}  // extern "C"
