// SPDX-License-Identifier: Apache-2.0
// Descriptor builders shared by the tests (over flykernels::tensor from the public C++ header).
#pragma once

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

}  // namespace fly_test
