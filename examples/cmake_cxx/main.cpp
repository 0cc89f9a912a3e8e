// SPDX-License-Identifier: Apache-2.0
// A C++ program using the installed C++ layer (flykernels.hpp) through find_package(flykernels).
// Without a GPU the calls throw flykernels::Error with FLY_ERROR_NO_DEVICE: it prints that and
// exits 0. With one it prints the device's architecture and the GEMM workspace size.
#include <cstdio>

#include "flykernels/flykernels.hpp"

int main() {
  const flykernels::Version v = flykernels::version();
  std::printf("consumer (C++, find_package): libflykernels %s, %d kernel variants bundled\n",
              flykernels::version_string().c_str(), flykernels::variant_count());
  if (v.major != FLY_VERSION_MAJOR) {
    std::fprintf(stderr, "consumer: header major %d, library major %d\n", FLY_VERSION_MAJOR, v.major);
    return 1;
  }
  // A bf16 NT GEMM descriptor set; the workspace query needs no device.
  void* fake = reinterpret_cast<void*>(0x100000);  // never read: no kernel runs here
  fly_tensor a = flykernels::tensor(fake, FLY_BF16, {128, 256});
  fly_tensor b = flykernels::tensor(fake, FLY_BF16, {256, 512}, {1, 256});
  fly_tensor c = flykernels::tensor(fake, FLY_BF16, {128, 512});
  try {
    std::printf("consumer: gemm workspace %zu bytes\n", flykernels::gemm_workspace_size(a, b, c));
    std::printf("consumer: device %s\n", flykernels::device_arch().c_str());
  } catch (const flykernels::Error& e) {
    if (e.status() != FLY_ERROR_NO_DEVICE) {
      std::fprintf(stderr, "consumer: %s\n", e.what());
      return 1;
    }
    std::printf("consumer: %s\n", e.what());  // "FLY_ERROR_NO_DEVICE: ..."
  }
  return 0;
}
