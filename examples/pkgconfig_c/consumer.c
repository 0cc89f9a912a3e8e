// SPDX-License-Identifier: Apache-2.0
/* A C program built against an installed libflykernels through pkg-config (docs/install.md):
 *   cc consumer.c $(pkg-config --cflags --libs flykernels) \
 *      -Wl,-rpath,"$(pkg-config --variable=libdir flykernels)" -o consumer
 * It needs no CUDA headers. Without a GPU every kernel call reports FLY_ERROR_NO_DEVICE: it prints
 * that status and exits 0. With one it prints the device's architecture. */
#include <stdio.h>
#include <string.h>

#include "flykernels/flykernels.h"

int main(void) {
  int major = 0, minor = 0, patch = 0;
  fly_version(&major, &minor, &patch);
  printf("consumer (C, pkg-config): libflykernels %s (%d.%d.%d), %d kernel variants bundled\n",
         fly_version_string(), major, minor, patch, fly_variant_count());
  if (major != FLY_VERSION_MAJOR) {
    fprintf(stderr, "consumer: header major %d, library major %d\n", FLY_VERSION_MAJOR, major);
    return 1;
  }

  const char* arch = NULL;
  fly_status s = fly_device_arch(NULL, &arch);
  if (s == FLY_SUCCESS) {
    printf("consumer: device %s\n", arch);
    return 0;
  }
  if (s != FLY_ERROR_NO_DEVICE) {
    fprintf(stderr, "consumer: fly_device_arch: %s: %s\n", fly_status_string(s), fly_get_last_error());
    return 1;
  }
  /* No GPU: a valid RMSNorm call must fail cleanly with the same status (the pointers are never read). */
  fly_tensor x, y;
  memset(&x, 0, sizeof x);
  x.data = (void*)0x100000;
  x.dtype = FLY_BF16;
  x.rank = 2;
  x.sizes[0] = 8;
  x.sizes[1] = 4096;
  x.strides[0] = 4096;
  x.strides[1] = 1;
  y = x;
  s = fly_rms_norm_fwd(&x, NULL, 1e-5, &y, NULL, NULL);
  if (s != FLY_ERROR_NO_DEVICE) {
    fprintf(stderr, "consumer: fly_rms_norm_fwd without a GPU returned %s: %s\n", fly_status_string(s),
            fly_get_last_error());
    return 1;
  }
  printf("consumer: %s (%s)\n", fly_status_string(s), fly_get_last_error());
  return 0;
}
