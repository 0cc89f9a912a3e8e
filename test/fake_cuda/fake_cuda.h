// SPDX-License-Identifier: Apache-2.0
// Control side of the stand-in CUDA driver (libfly_fake_cuda.so): tests point FLYKERNELS_LIBCUDA
// at it and link it, then read what the library asked the "driver" to do. It runs no kernels.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FAKE_CUDA_MAX_PARAM_BYTES 4096

typedef struct fake_cuda_launch {
  char kernel[128];        // entry name the function was taken by
  int module;              // index of the module (load order) it came from
  unsigned grid[3], block[3], cluster[3];
  unsigned smem;           // dynamic shared memory bytes
  void* stream;
  int ex;                  // 1: through cuLaunchKernelEx
  int device;              // of the context current at the launch (the stream's)
  size_t param_bytes;      // bytes of the kernel's parameters (from the cubin's .nv.info)
  unsigned char params[FAKE_CUDA_MAX_PARAM_BYTES];  // copy of them, laid out as the kernel sees them
} fake_cuda_launch;

typedef struct fake_cuda_tensor_map {
  int dtype;               // CUtensorMapDataType
  unsigned rank;
  uint64_t address;
  uint64_t dims[5];
  uint64_t strides[4];     // bytes, dims 1..rank-1
  uint32_t box[5];
  uint32_t element_strides[5];
  int interleave, swizzle, l2promotion, oob_fill;
} fake_cuda_tensor_map;

// Devices the fake reports (before the library's first call): count, compute capability of each
// device index >= 1 (device 0 is always 9.0, the H200's values).
void fake_cuda_configure(int device_count, int other_cc_major, int other_cc_minor);
// Device memory: fake addresses (nothing is mapped), 512-byte aligned, never reused. _on: of that
// device (fake_cuda_malloc: device 0); _managed: managed memory, usable from every device.
void* fake_cuda_malloc(size_t bytes);
void* fake_cuda_malloc_on(int device, size_t bytes);
void* fake_cuda_malloc_managed(size_t bytes);
// A stream of the given device's primary context.
void* fake_cuda_stream_create(int device);
// Next call of the named driver function fails with this CUresult (once).
void fake_cuda_fail_next(const char* function, int result);

int fake_cuda_launch_count(void);
const fake_cuda_launch* fake_cuda_get_launch(int index);
int fake_cuda_tensor_map_count(void);
const fake_cuda_tensor_map* fake_cuda_get_tensor_map(int index);
// Index of the recorded map a CUtensorMap (as the library filled it in) came from, or -1.
int fake_cuda_tensor_map_index(const void* cu_tensor_map);
int fake_cuda_module_count(void);
// Device of the context module `index` (load order) was loaded in; -1 for no such module.
int fake_cuda_module_device(int index);
int fake_cuda_memset_count(void);
// Why the fake refused the last call it refused ("" when none): the rule that was broken.
const char* fake_cuda_last_refusal(void);
// Forgets recorded launches, maps, memsets and the last refusal (modules stay loaded).
void fake_cuda_clear_records(void);

#ifdef __cplusplus
}
#endif
