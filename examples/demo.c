// SPDX-License-Identifier: Apache-2.0
/* A C program using libflykernels: RMSNorm over a bf16 [M, N] matrix through the C ABI.
 * Without a GPU it reports FLY_ERROR_NO_DEVICE and exits 0. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flykernels/flykernels.h"

static fly_tensor matrix(void* data, fly_dtype dt, int64_t rows, int64_t cols) {
  fly_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dt;
  t.rank = 2;
  t.sizes[0] = rows;
  t.sizes[1] = cols;
  t.strides[0] = cols;
  t.strides[1] = 1;
  return t;
}

int main(void) {
  const int64_t M = 4096, N = 4097; /* a row length one past an aligned size */
  int devices = 0;
  void *x = NULL, *y = NULL, *rstd = NULL;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
    cudaMalloc(&x, (size_t)(M * N) * 2);
    cudaMalloc(&y, (size_t)(M * N) * 2);
    cudaMalloc(&rstd, (size_t)M * 4);
    cudaMemset(x, 0x3c, (size_t)(M * N) * 2); /* bf16 0x3c3c = 0.0114..., non-zero */
  } else {
    x = y = rstd = (void*)0x1000; /* never dereferenced: the library reports no device first */
  }
  fly_tensor tx = matrix(x, FLY_BF16, M, N), ty = matrix(y, FLY_BF16, M, N);
  fly_tensor tr;
  memset(&tr, 0, sizeof tr);
  tr.data = rstd;
  tr.dtype = FLY_F32;
  tr.rank = 1;
  tr.sizes[0] = M;
  tr.strides[0] = 1;

  fly_status s = fly_rms_norm_fwd(&tx, NULL, 1e-5, &ty, &tr, NULL);
  if (s == FLY_ERROR_NO_DEVICE) {
    printf("demo: no GPU here (%s); %d kernel variants are bundled\n", fly_get_last_error(), fly_variant_count());
    return 0;
  }
  if (s != FLY_SUCCESS) {
    fprintf(stderr, "demo: fly_rms_norm_fwd failed: %s: %s\n", fly_status_string(s), fly_get_last_error());
    return 1;
  }
  float r0 = 0;
  cudaMemcpy(&r0, rstd, 4, cudaMemcpyDeviceToHost);
  printf("demo: rms_norm bf16 [%lld, %lld] ran %s (%s); rstd[0] = %g\n", (long long)M, (long long)N,
         fly_last_variant(), fly_last_decision(), r0);
  cudaFree(x);
  cudaFree(y);
  cudaFree(rstd);
  return 0;
}
