// SPDX-License-Identifier: Apache-2.0
// Prints "<status>|<arch>|<message>" from fly_device_arch in a fresh process, so a test can try
// each FLYKERNELS_LIBCUDA value (the library loads the driver once per process).
#include <cstdio>

#include "flykernels/flykernels.h"

int main() {
  const char* arch = nullptr;
  const fly_status s = fly_device_arch(nullptr, &arch);
  std::printf("%s|%s|%s\n", fly_status_string(s), arch ? arch : "-", fly_get_last_error());
  return 0;
}
