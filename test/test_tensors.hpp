// SPDX-License-Identifier: Apache-2.0
// Descriptor builders shared by the tests (over flykernels::tensor from the public C++ header).
#pragma once

#include <cstddef>
#include <string>

#include "flykernels/flykernels.hpp"

namespace fly_test {

// [rows, cols] with strides {ld, inner} (elements).
inline fly_tensor mat(void* p, fly_dtype dt, int64_t rows, int64_t cols, int64_t ld, int64_t inner = 1) {
  return flykernels::tensor(p, dt, {rows, cols}, {ld, inner});
}
inline fly_tensor vec(void* p, fly_dtype dt, int64_t n, int64_t stride = 1) {
  return flykernels::tensor(p, dt, {n}, {stride});
}
// Whether this thread's last error message contains `what`.
inline bool mentions(const char* what) { return std::string(fly_get_last_error()).find(what) != std::string::npos; }
// Fake, well-aligned addresses a megabyte apart: argument validation must reject before anything
// touches them.
inline void* fake_address(int i) { return reinterpret_cast<char*>(0x1000000) + size_t(i) * (1 << 20); }
// Whether a valid call on fake addresses ended where it should: at the device check, NO_DEVICE
// without a GPU, "not device memory" with one (the fake addresses are no allocation).
inline bool reached_device(fly_status s) {
  const char* arch = nullptr;
  if (fly_device_arch(nullptr, &arch) == FLY_ERROR_NO_DEVICE) return s == FLY_ERROR_NO_DEVICE;
  return s == FLY_ERROR_INVALID_ARGUMENT && mentions("not device memory");
}

}  // namespace fly_test
