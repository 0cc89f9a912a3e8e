// SPDX-License-Identifier: Apache-2.0
// Kernel parameters of the moe_route family (router, counting sort, row kernels), shared by the
// launcher (src/ops/moe_route.cpp) and the kernels. Dtype fields hold fly_dtype values.
#pragma once
#include <stdint.h>

enum MoeDtype : int32_t { kMoeF16 = 1, kMoeBF16 = 2, kMoeF32 = 3, kMoeI32 = 5, kMoeI64 = 6 };
enum MoeScore : int32_t { kMoeSoftmax = 0, kMoeSigmoid = 1 };
enum MoeFlags : int32_t { kMoeRenorm = 1, kMoeTopkFirst = 2 };
constexpr int kMoeMaxExperts = 1024;  // router registers (32 per lane) and the sort's shared counters
constexpr int kMoeMaxK = 1024;        // row kernels' shared slot table

// moe_route_fwd / moe_route_bwd: one warp per token.
struct MoeRouteParams {
  const void* logits;    // [T, E], row stride ld_logits
  const void* dweights;  // backward: [T, k]
  void* weights;         // forward output [T, k]
  void* ids;             // forward output, backward input [T, k]
  void* dlogits;         // backward output [T, E]
  int64_t ld_logits, ld_dweights, ld_weights, ld_ids, ld_dlogits;
  int64_t T;
  int32_t E, k;
  int32_t logit_dtype, weight_dtype, id_dtype;
  int32_t score, flags;
  int32_t per_lane;  // logits per lane: 2 (E <= 64), 4 (E <= 128), 8 (E <= 256), 32 (E <= 1024)
};

// moe_sort_hist / moe_sort_scan / moe_sort_rank: the stable counting sort of the N = T*k pairs.
// Chunk c of `chunk` pairs is one CTA of hist and rank; counts is the workspace, bucket-major:
// counts[b * chunks + c] for b in [0, E] (bucket E: ids outside [0, E)).
struct MoeSortParams {
  const void* ids;
  int64_t ld_ids;
  int32_t id_dtype;
  int32_t k, E;
  int32_t chunks, chunk;
  int64_t N;
  int32_t* counts;   // workspace [(E + 1) * chunks]
  int32_t* offsets;  // [E] inclusive ends
  int32_t* row_of;   // [T, k], row stride ld_row
  int64_t ld_row;
  int32_t* pair_of;  // [N]
};

// moe_gather (x_perm from x), moe_combine (y from out_perm, weighted or not), moe_unpermute_bwd.
// One CTA per row (gather) or token (combine, bwd), grid-stride; `units` per row: 16-byte
// vectors when vec, else elements.
struct MoeRowsParams {
  const void* src;  // gather: x [T, H]; combine, bwd: out_perm [N, H]
  void* dst;        // gather: x_perm [N, H]; combine: y [T, H]; bwd: dout_perm [N, H]
  const void* dy;   // bwd: [T, H]
  const void* w;    // [T, k] or NULL (unit weights)
  void* dw;         // bwd: [T, k] (w's dtype)
  const int32_t* row_of;
  const int32_t* pair_of;
  const int32_t* offsets;  // [E]: offsets[E - 1] rows are valid
  int64_t ld_src, ld_dst, ld_dy, ld_w, ld_dw, ld_row;
  int64_t rows;  // gather: N; combine, bwd: T
  int64_t n_perm, n_tok;  // N = T * k and T: indices outside them are ignored (never dereferenced)
  int64_t units;
  int32_t k, E;
  int32_t dtype, w_dtype;
  int32_t vec;
};
