// SPDX-License-Identifier: Apache-2.0
/* FlyKernels: ahead-of-time compiled GPU kernels with a tuning database.
 *
 * Stable C ABI. Every entry point returns a fly_status; on failure a message that names the
 * offending argument is available from fly_get_last_error() (thread-local, valid until the next
 * call on the same thread). Nothing here aborts or prints unless FLYKERNELS_LOG asks for it.
 * One status per mistake, the same from every entry (docs/robustness.md, "Statuses"); everything
 * but the pointer checks is decided before the device is looked for, so without a GPU a call
 * fails the same way except that a valid one ends on FLY_ERROR_NO_DEVICE.
 *
 * Tensors are plain descriptors: device pointer, dtype, rank, sizes and strides in elements.
 * Streams are passed as void* (a cudaStream_t / CUstream; NULL is the legacy default stream of the
 * current context). All launches are asynchronous on that stream.
 */
#ifndef FLYKERNELS_H_
#define FLYKERNELS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FLY_API
#else
#define FLY_API __attribute__((visibility("default")))
#endif

#define FLY_VERSION_MAJOR 0
#define FLY_VERSION_MINOR 1
#define FLY_VERSION_PATCH 0

typedef enum fly_status {
  FLY_SUCCESS = 0,
  FLY_ERROR_INVALID_ARGUMENT = 1, /* NULL descriptor/pointer (a NULL workspace with a size), a dtype
                                   * value outside the enum, rank, negative size/stride, shapes or
                                   * dtypes that disagree with another argument, a bad scalar, an
                                   * output overlapping itself or another argument or the workspace */
  FLY_ERROR_UNSUPPORTED = 2,      /* valid input that no kernel here covers: callers fall back (the
                                   * op's dtype, an input layout such as an inner stride != 1, TMA
                                   * stride rules, sizes past the kernels' limits) */
  FLY_ERROR_NO_DEVICE = 3,        /* no driver (libcuda.so.1) or no CUDA device */
  FLY_ERROR_ARCH_NOT_BUILT = 4,   /* the device's architecture has no kernels in this build */
  FLY_ERROR_KERNEL_IMAGE = 5,     /* kernel archive missing, corrupt or failed to load */
  FLY_ERROR_DATABASE = 6,         /* tuning database missing, corrupt or wrong schema */
  FLY_ERROR_CUDA = 7,             /* a CUDA driver call failed (message carries its name) */
  FLY_ERROR_MISALIGNED = 8,       /* a pointer (tensor data, workspace) breaks an alignment rule */
  FLY_ERROR_WORKSPACE = 9,        /* a needed workspace is missing or smaller than the size query
                                   * said (every op: TopK, attention, ragged-K grouped GEMM) */
  FLY_ERROR_INTERNAL = 10
} fly_status;

typedef enum fly_dtype {
  FLY_DTYPE_INVALID = 0,
  FLY_F16 = 1,
  FLY_BF16 = 2,
  FLY_F32 = 3,
  FLY_F64 = 4,
  FLY_I32 = 5,
  FLY_I64 = 6,
  FLY_U8 = 7,
  /* MX element and scale types (OCP Microscaling v1.0; docs/mxfp.md). */
  FLY_F8_E4M3 = 8,    /* FP8 E4M3 "fn" (no Inf, 0x7F/0xFF NaN), one byte: torch.float8_e4m3fn */
  FLY_F4_E2M1X2 = 9,  /* two FP4 E2M1 values per byte, element 0 in the low nibble, as
                       * torch.float4_e2m1fn_x2. Sizes and strides count bytes (packed pairs):
                       * a logical [M, K] FP4 matrix is a [M, K/2] tensor of this dtype. */
  FLY_E8M0 = 10       /* E8M0 block scale, one byte: 2^(b - 127), 0xFF NaN (torch.float8_e8m0fnu) */
} fly_dtype;

#define FLY_MAX_RANK 8

typedef struct fly_tensor {
  void* data;                      /* device pointer */
  fly_dtype dtype;
  int32_t rank;                    /* 0..FLY_MAX_RANK */
  int64_t sizes[FLY_MAX_RANK];     /* elements */
  int64_t strides[FLY_MAX_RANK];   /* elements (not bytes) */
} fly_tensor;

/* ---- errors, version ------------------------------------------------------------------ */
FLY_API const char* fly_get_last_error(void);
FLY_API const char* fly_status_string(fly_status status);
FLY_API void fly_version(int* major, int* minor, int* patch);
FLY_API const char* fly_version_string(void);

/* ---- tuning database ------------------------------------------------------------------ */
/* Overlay database (read before the embedded one). NULL clears it. The environment variable
 * FLYKERNELS_TUNING_DB names one at first use. Clears the per-shape dispatch cache. */
FLY_API fly_status fly_set_tuning_db(const char* path);

/* ---- introspection (tools, tests) ----------------------------------------------------- */
FLY_API int fly_variant_count(void);                /* variants bundled in this build */
FLY_API const char* fly_variant_name(int index);    /* NULL when out of range */
/* family ("rmsnorm", "topk", "gemm") and parameters ("key=value;key=value") of a variant. */
FLY_API fly_status fly_variant_info(const char* name, const char** family, const char** params);
/* Forces the next dispatches of this thread to use the named variant (the tuner uses this);
 * NULL restores database dispatch. Fails with FLY_ERROR_INVALID_ARGUMENT for unknown names. A
 * forced variant that cannot run the given shape makes the op return FLY_ERROR_UNSUPPORTED. */
FLY_API fly_status fly_force_variant(const char* name);
/* The variant chosen by this thread's last successful dispatch, and where the decision came
 * from ("forced", "overlay:exact", "db:exact", "db:nearest", "default"; ":runner-up" appended
 * when the row's second best ran because its winner did not suit the call, e.g. a split-K winner
 * without its workspace). */
FLY_API const char* fly_last_variant(void);
FLY_API const char* fly_last_decision(void);
/* The dispatch key this thread's last dispatch computed, as the tuning database's rows hold it:
 * op ("rmsnorm_fwd", "attention_fwd", ...), dtype, layout and the shape features k[0..3] (unused
 * ones 0). Tools record it rather than recomputing the launcher's key. Any output may be NULL;
 * the strings stay valid until this thread's next dispatch. Before any dispatch on this thread:
 * "" and zeros. A call refused before it dispatches (bad arguments, no device) leaves it as it was;
 * other threads' calls never change it. An op that launches several kernels (a split decode and its merge, say) leaves
 * the key of the last one it dispatched. */
FLY_API void fly_last_key(const char** op, const char** dtype, const char** layout, int64_t k[4]);
/* Architecture string of the current device ("sm_90a"), or an error. */
FLY_API fly_status fly_device_arch(void* stream, const char** arch);

/* ---- RMSNorm forward -----------------------------------------------------------------
 * y[M,N] = x[M,N] * rsqrt(mean(x^2, dim=-1) + eps) * weight[N]
 * x, y: FP16/BF16/FP32, rank 2, unit inner stride; rows may have a leading stride (>= N).
 * weight: optional (NULL), rank 1 [N], same dtype as x, unit stride.
 * rstd: optional FP32 [M] (unit stride), the reciprocal RMS per row (PyTorch's backward uses it).
 * Pointers need only element alignment: unaligned rows take a scalar head/tail path.
 * y may be x exactly (in place); any other overlap of y or rstd with an argument is refused.
 * M == 0 is a successful no-op. Accumulation in FP32. */
FLY_API fly_status fly_rms_norm_fwd(const fly_tensor* x, const fly_tensor* weight, double eps,
                                    const fly_tensor* y, const fly_tensor* rstd, void* stream);

/* ---- Gated linear units (SwiGLU, GeGLU) ---------------------------------------------------
 * Forward:  out = act(gate) * up
 * Backward: dgate = dout * up * act'(gate), dup = dout * act(gate)
 * Every tensor: rank 2 [M, N], one dtype (FP16/BF16/FP32), unit inner stride, any row stride
 * (>= N; gate and up may be the two halves of one [M, 2N] projection). Outputs may be an input
 * exactly (in place), never a shifted or partial view of one, and dgate and dup are disjoint.
 * Math in FP32 with one rounding per output. M == 0 or N == 0 is a successful no-op. */
typedef enum {
  FLY_GLU_SILU = 0,      /* x * sigmoid(x): SwiGLU (Llama, Mistral, Qwen) */
  FLY_GLU_GELU_TANH = 1, /* GELU, tanh approximation: GeGLU (Gemma's gelu_pytorch_tanh) */
  FLY_GLU_GELU = 2       /* GELU, exact (erf) */
} fly_glu_activation;
FLY_API fly_status fly_glu_fwd(const fly_tensor* gate, const fly_tensor* up, int activation,
                               const fly_tensor* out, void* stream);
FLY_API fly_status fly_glu_bwd(const fly_tensor* dout, const fly_tensor* gate, const fly_tensor* up,
                               int activation, const fly_tensor* dgate, const fly_tensor* dup, void* stream);

/* ---- Rotary position embeddings (rotate-half layout) ---------------------------------------
 * Forward, for c < R/2 (R = rotary_dim, columns [R, D) pass through unchanged):
 *   out[c]       = x[c] cos[c] - x[c + R/2] sin[c]
 *   out[c + R/2] = x[c + R/2] cos[c + R/2] + x[c] sin[c + R/2]
 * applied to q [B, Hq, S, D] and k [B, Hk, S, D] in one launch (k and k_out may both be NULL).
 * cos, sin: [B or 1, S, W], W = R (an angle per column, Hugging Face's tables) or R/2 (one per
 * pair). Backward: the adjoint, from the outputs' gradients to the inputs'. One dtype for every
 * tensor (FP16/BF16/FP32), unit stride in the last dimension, any other strides; an output may be
 * its input exactly (in place), never another argument or a part of one. Math in FP32, one
 * rounding per output. Nothing to rotate (a zero size) is a successful no-op. */
FLY_API fly_status fly_rope_fwd(const fly_tensor* q, const fly_tensor* k, const fly_tensor* cos,
                                const fly_tensor* sin, int rotary_dim, const fly_tensor* q_out,
                                const fly_tensor* k_out, void* stream);
FLY_API fly_status fly_rope_bwd(const fly_tensor* dq_out, const fly_tensor* dk_out, const fly_tensor* cos,
                                const fly_tensor* sin, int rotary_dim, const fly_tensor* dq,
                                const fly_tensor* dk, void* stream);

/* ---- TopK ---------------------------------------------------------------------------------
 * values[R,k], indices[R,k] = topk(x[R,C], k, dim=-1, largest, sorted=True).
 * x: FP32 (see docs for FP16/BF16), rank 2, unit inner stride, leading stride allowed.
 * values: x's dtype; indices: INT64. Any 1 <= k <= C. R == 0 is a successful no-op.
 * NaN ranks above every number when largest (below when !largest), as torch does.
 * deterministic != 0: ties resolved lowest index first, identical across runs.
 * Some paths need scratch memory: query fly_topk_workspace_size and pass a buffer at least that
 * large (NULL/0 when the query returns 0). */
FLY_API fly_status fly_topk_workspace_size(const fly_tensor* x, int64_t k, int largest,
                                           int deterministic, size_t* bytes);
FLY_API fly_status fly_topk(const fly_tensor* x, int64_t k, int largest, int deterministic,
                            const fly_tensor* values, const fly_tensor* indices, void* workspace,
                            size_t workspace_bytes, void* stream);

/* ---- Dense GEMM -------------------------------------------------------------------------
 * C[M,N] = A[M,K] @ B[K,N] (+ bias[N]); FP16 or BF16 in and out (all the same dtype), FP32
 * accumulation. A and B may each be row- or column-major (read from the strides); leading
 * dimensions may be padded, any number of elements, and bases need only element alignment. An
 * operand TMA cannot address (a base not 16-byte aligned, or a leading dimension not a multiple
 * of 8 elements) is copied into the workspace with aligned lines first when the workspace holds
 * the copy (the packed path), else read by a cp.async kernel (slower). C row-major with unit
 * inner stride. FLY_ERROR_UNSUPPORTED remains for what no kernel takes: A or B neither row- nor
 * column-major, K = 0 with M, N > 0, dimensions of 2^31 or more (docs/gemm.md).
 * Workspace (optional): stream-K variants keep flags and fp32 partial tiles there, and the packed
 * path its copies. Query fly_gemm_workspace_size: device independent; for operands TMA can
 * address also shape independent (about 19 MB when stream-K variants are bundled; 0 otherwise),
 * for others it adds the copies' size (about the operands' bytes; copies over 1 TiB in all are
 * never made: such calls take the cp.async kernel). Pass a 256-byte aligned device
 * buffer that large, zero-filled once before first use: each call leaves its flags (the first
 * 4096 bytes, which the copies never touch) zero again, so it can be reused on one stream and in
 * CUDA graphs, but never by two GEMMs running at once (that can hang or corrupt). NULL/0 (or too
 * small) runs those variants without stream-K; a buffer of 4096 bytes plus the copies runs the
 * packed path without stream-K. Misaligned: FLY_ERROR_MISALIGNED; NULL with a size:
 * FLY_ERROR_INVALID_ARGUMENT. */
FLY_API fly_status fly_gemm_workspace_size(const fly_tensor* a, const fly_tensor* b,
                                           const fly_tensor* c, size_t* bytes);
FLY_API fly_status fly_gemm(const fly_tensor* a, const fly_tensor* b, const fly_tensor* c,
                            const fly_tensor* bias, void* workspace, size_t workspace_bytes,
                            void* stream);

/* ---- Fused attention forward ---------------------------------------------------------
 * O = softmax(Q K^T * softmax_scale [+ causal mask]) V per (batch, head), and the FP32 natural-log
 * log-sum-exp of each query row's scaled scores (what the backward needs).
 * q: [B, Hq, Sq, D]; k, v: [B, Hkv, Sk, D]; o: [B, Hq, Sq, D]; all FP16 or all BF16, D innermost
 *    (stride 1), other strides free (BHSD and BSHD views both). Q, K and V are read by TMA where
 *    their strides are multiples of 8 elements and their bases 16-byte aligned; any other Q, K or V
 *    is first copied into the workspace with 16-byte rows (the packed path: pass the workspace
 *    fly_attention_fwd_workspace_size asks for; without room for the copies such a call returns
 *    FLY_ERROR_WORKSPACE saying how much). o and lse must not overlap q, k, v or each other. O: any strides. Hq a multiple of Hkv (grouped-query:
 *    query head h reads kv head h / (Hq / Hkv)). 1 <= D <= 512: the kernels are compiled for some
 *    head dims and serve the others by the next one up (docs/attention.md lists them).
 * lse: optional (NULL), FP32 [B, Hq, Sq], any strides (a view of SDPA's padded [B, Hq, Sq_pad]
 *    buffer works); a row with no visible key gets O = 0 and LSE = -inf.
 * softmax_scale: 0 means 1/sqrt(D). causal: 0 none, 1 query i sees keys j <= i (top-left aligned,
 *    as SDPA's is_causal, also when Sq != Sk).
 * Workspace (optional): short queries against long keys split the keys over CTAs and combine the
 *    partials there, and the packed path keeps its copies at its end. Query
 *    fly_attention_fwd_workspace_size (it adds the copies' size where Q, K or V needs one) and pass
 *    a 256-byte aligned device buffer that large (NULL/0 runs unsplit, correct but slower, and
 *    refuses operands that need a copy); contents need no initialization.
 * B, Hq or Sq of 0: a successful no-op. Sk of 0 writes O = 0 and LSE = -inf.
 * Versioned: set struct_size = sizeof(fly_attention_fwd_params); fields may be appended in later
 * versions (a caller built against this header keeps working), a struct larger than the library
 * knows is refused with FLY_ERROR_UNSUPPORTED. */
typedef struct fly_attention_fwd_params {
  size_t struct_size;      /* sizeof(fly_attention_fwd_params) of the caller's header */
  const fly_tensor* q;     /* [B, Hq, Sq, D] */
  const fly_tensor* k;     /* [B, Hkv, Sk, D] */
  const fly_tensor* v;     /* [B, Hkv, Sk, D] */
  const fly_tensor* o;     /* [B, Hq, Sq, D], written */
  const fly_tensor* lse;   /* optional FP32 [B, Hq, Sq], written */
  double softmax_scale;    /* 0: 1/sqrt(D) */
  int32_t causal;          /* 0 or 1 (top-left) */
  int32_t reserved;        /* must be 0 */
  void* workspace;         /* optional, see fly_attention_fwd_workspace_size */
  size_t workspace_bytes;
} fly_attention_fwd_params;

FLY_API fly_status fly_attention_fwd_workspace_size(const fly_attention_fwd_params* params, size_t* bytes);
FLY_API fly_status fly_attention_fwd(const fly_attention_fwd_params* params, void* stream);

/* ---- Fused attention backward ----------------------------------------------------------
 * dQ, dK, dV of O = softmax(Q K^T * softmax_scale [+ causal mask]) V, from the forward's inputs,
 * its output O, the upstream gradient dO and the forward's FP32 natural-log LSE.
 * q, o, dout, dq: [B, Hq, Sq, D]; k, v, dk, dv: [B, Hkv, Sk, D]; all FP16 or all BF16, D innermost
 *    (stride 1), other strides free (BHSD and BSHD views). q, k, v and dout are read by TMA where
 *    their bases are 16-byte aligned and their strides multiples of 8 elements; any other one is
 *    first copied into the end of the workspace with 16-byte rows (the workspace query adds the
 *    copies; a workspace with room for the backward but not the copies: FLY_ERROR_WORKSPACE).
 *    Grouped-query (Hq a multiple of Hkv): dk, dv of a kv head are the sums over its query heads.
 *    dq, dk, dv must not overlap themselves, each other or any input (no in-place).
 *    1 <= D <= 512: compiled head dims 64, 128, 192, 256 and 512 (the wide-head schedule), others
 *    served by the next one up; D 257..512 returns FLY_ERROR_UNSUPPORTED in a build that does not
 *    bundle the hd 512 backward variants (the default build does).
 * lse: FP32 [B, Hq, Sq], any strides (what fly_attention_fwd wrote). softmax_scale and causal:
 *    as the forward's (0 means 1/sqrt(D); causal top-left).
 * nondeterministic: 0 (the default): the same bits on every run. 1 allows faster non-deterministic
 *    kernels; this version has none and runs the deterministic ones.
 * Workspace (required unless B, Hq or Sq is 0): FP32 Delta = rowsum(dO * O), LSE and row-max rows
 *    (the max: rows whose |LSE| is large get their softmax statistics recomputed exactly),
 *    3 * round256(4 * B * Hq * round_up(Sq, 128)) bytes, plus the copies above where
 *    needed; query fly_attention_bwd_workspace_size and pass a 256-byte aligned device buffer at
 *    least that big
 *    (contents need no initialization; not shared by two calls running at once). Smaller or
 *    NULL: FLY_ERROR_WORKSPACE.
 * B, Hq or Sq of 0: a successful no-op. Sk of 0 writes dq = 0.
 * Versioned like fly_attention_fwd_params: set struct_size = sizeof(fly_attention_bwd_params). */
typedef struct fly_attention_bwd_params {
  size_t struct_size;      /* sizeof(fly_attention_bwd_params) of the caller's header */
  const fly_tensor* q;     /* [B, Hq, Sq, D] */
  const fly_tensor* k;     /* [B, Hkv, Sk, D] */
  const fly_tensor* v;     /* [B, Hkv, Sk, D] */
  const fly_tensor* o;     /* [B, Hq, Sq, D], the forward's output */
  const fly_tensor* dout;  /* [B, Hq, Sq, D], gradient of o */
  const fly_tensor* lse;   /* FP32 [B, Hq, Sq], the forward's natural-log LSE */
  const fly_tensor* dq;    /* [B, Hq, Sq, D], written */
  const fly_tensor* dk;    /* [B, Hkv, Sk, D], written */
  const fly_tensor* dv;    /* [B, Hkv, Sk, D], written */
  double softmax_scale;    /* 0: 1/sqrt(D) */
  int32_t causal;          /* 0 or 1 (top-left) */
  int32_t nondeterministic; /* 0: bit-identical repeat runs; 1: allow atomics (none yet) */
  void* workspace;         /* required, see fly_attention_bwd_workspace_size */
  size_t workspace_bytes;
} fly_attention_bwd_params;

FLY_API fly_status fly_attention_bwd_workspace_size(const fly_attention_bwd_params* params, size_t* bytes);
FLY_API fly_status fly_attention_bwd(const fly_attention_bwd_params* params, void* stream);

/* ---- Grouped GEMM (mixture-of-experts; F.grouped_mm's 2-D x 3-D form) ----------------
 * For every group g with rows [offs[g-1], offs[g]) (offs[-1] = 0):
 *   C[rows, :] = A[rows, :] @ B[g] (+ bias[g]), FP32 accumulation, one persistent launch.
 * a: [T, K] row-major (inner stride 1); b: [G, K, N], N contiguous (w) or K contiguous
 *    (w.transpose(-2, -1)), group stride free (groups must not overlap); c: [T, N] row-major;
 *    all FP16 or all BF16. bias: optional [G, N] of the same dtype, inner stride 1.
 * offs: int32 [G] on the device, cumulative group end rows (as F.grouped_mm takes them). The
 *    kernel reads them (no host sync: works under CUDA graph capture). Groups of 0 rows are fine.
 *    Rows at or past offs[G-1] are not written. Bad offsets on the device are never an
 *    out-of-bounds access: each end is clamped to T, and an end below the previous one is an
 *    empty group (docs/grouped_gemm.md); the host cannot check them without a sync.
 * TMA rules: 16-byte aligned bases of a and b (else FLY_ERROR_MISALIGNED), a's row stride, b's
 *    line and group strides multiples of 8 elements (else FLY_ERROR_UNSUPPORTED). T = 0 or N = 0: a successful no-op;
 *    K = 0 with work: FLY_ERROR_UNSUPPORTED. G = 0 needs T = 0.
 * Workspace: none needed today (fly_grouped_gemm_workspace_size says 0); NULL/0 is fine.
 *
 * Ragged-K mode (a and b 2-D, c 3-D: torch._grouped_mm's 2-D x 2-D form, the weight gradient
 * dB_g = A_g^T @ dC_g of F.grouped_mm's backward): for every group g with k range
 * [offs[g-1], offs[g]) (offs[-1] = 0):  c[g] = a[:, k range] @ b[k range, :], FP32 accumulation.
 * a: [M, Ktot] M contiguous (X.t(), what autograd passes); b: [Ktot, N] N contiguous (dC, what
 *    autograd passes); line strides free (no overlap). K-contiguous a or b: FLY_ERROR_UNSUPPORTED
 *    (the ragged K must be the outer dimension of the kernel's TMA maps).
 * c: [G, M, N], inner stride 1, any row stride >= N and group stride (no overlap). FP16 or BF16,
 *    all the same. bias: must be NULL (FLY_ERROR_UNSUPPORTED).
 * offs: int32 [G] on the device, cumulative group ends along K. An empty group's c[g] is written
 *    with zeros, Ktot = 0 too (zeros everywhere); G, M or N of 0: a successful no-op. Bad device
 *    offsets never reach out of bounds: each group's begin and end are clamped into [0, Ktot] and
 *    an end below its begin is an empty group.
 * TMA rules (Ktot > 0): 16-byte aligned bases of a and b (else FLY_ERROR_MISALIGNED), their line
 *    strides multiples of 8 elements (else FLY_ERROR_UNSUPPORTED).
 * Workspace: required, fly_grouped_gemm_workspace_size reports G x 256 bytes (two tensor maps per
 *    group, written on the device by the call: no host sync, CUDA-graph safe), 256-byte aligned,
 *    device memory, contents need no initialization; a call owns it until it completes on the
 *    stream (two calls in flight at once need two workspaces). Smaller or NULL: FLY_ERROR_WORKSPACE. */
FLY_API fly_status fly_grouped_gemm_workspace_size(const fly_tensor* a, const fly_tensor* b,
                                                   const fly_tensor* offs, const fly_tensor* c,
                                                   size_t* bytes);
/* Host-side check of offsets a caller holds in host memory (the kernel never syncs to read them):
 * FLY_ERROR_INVALID_ARGUMENT, naming the entry, when one is negative, smaller than the one before
 * (decreasing) or larger than rows (T); FLY_SUCCESS otherwise. offs may be NULL when groups is 0. */
FLY_API fly_status fly_grouped_gemm_check_offsets(const int32_t* offs, int64_t groups, int64_t rows);
FLY_API fly_status fly_grouped_gemm(const fly_tensor* a, const fly_tensor* b, const fly_tensor* offs,
                                    const fly_tensor* bias, const fly_tensor* c, void* workspace,
                                    size_t workspace_bytes, void* stream);

/* ---- MX block-scaled formats: quantizer and GEMM (docs/mxfp.md) --------------------------
 * MXFP8 = FLY_F8_E4M3 elements, MXFP4 = FLY_F4_E2M1X2 (two per byte, low nibble first; sizes and
 * strides of such a tensor count bytes, so a logical [M, K] matrix is a [M, K/2] tensor), each
 * with one FLY_E8M0 scale per 32 consecutive elements of a row: scales [rows, K/32].
 *
 * fly_mx_quantize: x [M, K] FP16/BF16/FP32 (unit inner stride, leading stride >= K) to q
 * ([M, K] FLY_F8_E4M3 or [M, K/2] FLY_F4_E2M1X2, contiguous rows) and scales [M, K/32] FLY_E8M0
 * (contiguous). K a multiple of 32. `format` is FLY_MX_E4M3 or FLY_MX_E2M1, optionally ORed with
 * FLY_MX_SCALE_RCEIL (default: the OCP rule, scale = 2^(floor(log2 amax) - emax_elem); RCEIL:
 * the smallest power of two with amax / scale <= the element max). Elements x / scale rounded to
 * nearest even with saturation; a zero block gets scale 0x00 (2^-127) and zero codes, a block
 * holding NaN or Inf scale 0xFF and NaN codes (E2M1 has no NaN: code 0x7). M == 0: no-op. */
#define FLY_MX_E4M3 1
#define FLY_MX_E2M1 2
#define FLY_MX_SCALE_RCEIL 0x100
FLY_API fly_status fly_mx_quantize(const fly_tensor* x, int format, const fly_tensor* q,
                                   const fly_tensor* scales, void* stream);

/* fly_mx_quantize and fly_scaled_gemm are tested on the H200 (docs/mxfp.md); the default GEMM
 * kernel is a first design, correct but not yet fast (no benchmark figures yet).
 * fly_scaled_gemm: C[M,N] = sum_k (A[m,k] * sa[m,k/32]) * (B[n,k] * sb[n,k/32]) (+ bias[N]).
 * a: [M, K] FLY_F8_E4M3 or [M, K/2] FLY_F4_E2M1X2, row-major (unit inner stride).
 * b: the [K, N] operand given column-major, i.e. N rows of K (NT): [N, K] E4M3 or [N, K/2]
 *    E2M1X2 with unit inner stride, the same format as a.
 * scale_a: [M, K/32], scale_b: [N, K/32], FLY_E8M0, contiguous (unswizzled).
 * bias: optional [N] in c's dtype. c: [M, N] FP16 or BF16, unit inner stride.
 * FP32 accumulation; the result equals the GEMM of the exactly dequantized operands up to FP32
 * summation order (block products scale_a * scale_b beyond FP32's range flush to 0 / overflow).
 * K must be a multiple of 32 (else FLY_ERROR_INVALID_ARGUMENT). The kernels read rows with
 * 16-byte loads: row strides in bytes and base pointers must be multiples of 16 (FP8: K % 16,
 * FP4: K % 32, which K % 32 == 0 gives), else FLY_ERROR_UNSUPPORTED / FLY_ERROR_MISALIGNED.
 * workspace (optional): the split-K variants (docs/mxfp.md "Split-K") keep FP32 partials there;
 *    query fly_scaled_gemm_workspace_size and pass a 256-byte aligned device buffer that large
 *    (no initialization needed: no counters or flags; a call owns it until it completes on the
 *    stream). NULL/0 or too small: those variants run unsplit. Misaligned: FLY_ERROR_MISALIGNED;
 *    NULL with a size: FLY_ERROR_INVALID_ARGUMENT.
 * M, N == 0: no-op; K == 0: FLY_ERROR_UNSUPPORTED.
 *
 * Weight-only mode (docs/mxfp.md "Weight-only decode" / "Weight-only prefill"): a FLY_BF16 or
 * FLY_F16 and scale_a NULL:
 *   C[M,N] = sum_k A[m,k] * (B[n,k] * sb[n,k/32]) (+ bias[N]), the activations as they are.
 * a: [M, K] BF16/FP16, unit inner stride, row stride a multiple of 8 elements, 16-byte aligned.
 * b, scale_b: as above (E4M3 [N, K] or E2M1X2 [N, K/2]; [N, K/32] E8M0), what fly_mx_quantize
 *    writes for the weights. c: [M, N] in a's dtype (another dtype: FLY_ERROR_UNSUPPORTED); bias
 *    in c's dtype. FP32 accumulation, each 32-k block's scale applied exactly to its FP32 partial
 *    sum (0x00 = 2^-127, 0xFF = NaN: that column of C is NaN).
 * M <= 64: the decode kernels. M > 64: FLY_ERROR_UNSUPPORTED (dequantize and call fly_gemm) for
 *    now. The prefill kernel for BF16 a (variants mx_decode_prefill_*, run when one is forced with
 *    fly_force_variant until it is verified on a GPU) multiplies each weight rounded to BF16 once
 *    (bf16(B[n,k] * sb[n,k/32]): exact for every weight a quantizer writes; only scales that put
 *    elements outside BF16's range round), as dequantizing to BF16 and a BF16 GEMM would.
 *    No workspace (the query says 0; one passed is ignored).
 * A non-NULL scale_a with a 16-bit a is FLY_ERROR_UNSUPPORTED (the MX-activation mode needs
 * E4M3/E2M1X2 activations). */
/* bytes = max over the bundled split-K variants of S x M x N x 4 rounded up to 256, where
 * S = min(split, ceil(K / 128), floor(132 / tiles)) with tiles = ceil(M / 128) x ceil(N / bn),
 * counted only when S >= 2; 0 when no split variant would split this shape (and in builds without
 * them; 0 in the weight-only mode). Validates a, b, c as fly_scaled_gemm does (shapes, dtypes);
 * needs no device. */
FLY_API fly_status fly_scaled_gemm_workspace_size(const fly_tensor* a, const fly_tensor* b,
                                                  const fly_tensor* c, size_t* bytes);
FLY_API fly_status fly_scaled_gemm(const fly_tensor* a, const fly_tensor* scale_a, const fly_tensor* b,
                                   const fly_tensor* scale_b, const fly_tensor* bias, const fly_tensor* c,
                                   void* workspace, size_t workspace_bytes, void* stream);

/* ---- RMSNorm with a fused residual add (docs/add_rmsnorm.md) ------------------------------
 * Forward:  h = x + residual (rounded to the dtype: the new residual stream, as vLLM's
 *           fused_add_rms_norm and Hugging Face decoder layers use it)
 *           y = h * rsqrt(mean(h^2, dim=-1) + eps) * weight,  rstd[M] = rsqrt(mean(h^2) + eps)
 * Backward: dx = rstd * (dy * weight - hh * mean(dy * weight * hh, dim=-1)) + dh,  hh = h * rstd
 *           (dx is the gradient of x and of residual alike), dweight = sum over rows of dy * hh.
 * x, residual, y, h, dy, dh, dx: rank 2 [M, N], one dtype (FP16/BF16/FP32), unit inner stride,
 *    any row stride (>= N). weight: optional (NULL: ones), [N] of that dtype, unit stride.
 *    rstd: FP32 [M] (optional in the forward, required by the backward: what the forward wrote).
 *    dh: optional (NULL: zero), the gradient arriving on h. dweight: [N] of the dtype, given
 *    exactly when weight is.
 * In place: y and h may each be x or residual exactly (the same pointer and strides; y over x and
 *    h over residual is vLLM's in-place form), dx may be dy or dh exactly; any other overlap of
 *    an output with an argument or another output is refused ("shares memory").
 * Workspace (backward with a weight): FP32 partial sums of dweight, one row per CTA, reduced in a
 *    fixed order (deterministic: the same bits on every run). Query
 *    fly_add_rms_norm_bwd_workspace_size (min(M, 512) x N x 4 bytes rounded up to 256; 0 without a
 *    weight; needs no device) and pass a 256-byte aligned device buffer at least that large
 *    (contents need no initialization; one call at a time). Smaller: FLY_ERROR_WORKSPACE.
 * Math in FP32 with one rounding per output. M == 0 is a successful no-op; N == 0 with rows is
 * FLY_ERROR_INVALID_ARGUMENT (normalizing empty rows is undefined), as fly_rms_norm_fwd. */
FLY_API fly_status fly_add_rms_norm_fwd(const fly_tensor* x, const fly_tensor* residual, const fly_tensor* weight,
                                        double eps, const fly_tensor* y, const fly_tensor* h,
                                        const fly_tensor* rstd, void* stream);
FLY_API fly_status fly_add_rms_norm_bwd_workspace_size(const fly_tensor* h, const fly_tensor* weight,
                                                       size_t* bytes);
FLY_API fly_status fly_add_rms_norm_bwd(const fly_tensor* dy, const fly_tensor* dh, const fly_tensor* h,
                                        const fly_tensor* weight, const fly_tensor* rstd, const fly_tensor* dx,
                                        const fly_tensor* dweight, void* workspace, size_t workspace_bytes,
                                        void* stream);
/* ---- Cross-entropy loss with its gradient (docs/cross_entropy.md) ---------------------------
 * The loss half of a fused linear cross-entropy (training with a large vocabulary: the caller
 * computes the logits of a chunk of tokens with a GEMM, this call turns them into the loss and,
 * in place, into their gradient, and the caller's next GEMMs take that gradient to the hidden
 * states and the weight), or a plain cross-entropy over logits:
 *   lse[r]  = log(sum_j exp(logits[r, j]))
 *   loss[r] = lse[r] - logits[r, labels[r]]
 *   dlogits[r, j] = (exp(logits[r, j] - lse[r]) - (j == labels[r])) * scale
 * logits: [M, V] FP16/BF16/FP32, unit inner stride, any row stride (>= V). labels: [M] INT64.
 * loss: [M] FP32 (required). lse: [M] FP32 or NULL. dlogits: [M, V] of the logits' dtype (unit
 *    inner stride, any row stride) or NULL (loss only); it may be the logits exactly (the same
 *    pointer and strides: in place), no other overlap between any two arguments is allowed.
 * A row whose label is ignore_index: loss 0, lse 0, dlogits row 0 (its logits are not read).
 * A label outside [0, V) that is not ignore_index is never used as an index: the row's loss and
 *    its dlogits row are NaN (lse is computed), so a bad label shows in the loss instead of
 *    reading out of bounds (torch's cross_entropy raises a device-side assert).
 * NaN / Inf as torch's cross_entropy: a NaN or +Inf logit makes its row NaN; -Inf logits add
 *    nothing (a -Inf label logit gives loss +Inf); an all -Inf row is NaN.
 * scale: finite, within FP32 range (1 / the number of valid rows gives the gradient of the mean).
 * FP32 math (online softmax over the row: one pass for max and sum, one for the gradient), one
 * rounding per output; deterministic. M == 0 is a successful no-op; V == 0 with rows is
 * FLY_ERROR_INVALID_ARGUMENT. */
FLY_API fly_status fly_cross_entropy_fwd_bwd(const fly_tensor* logits, const fly_tensor* labels, int64_t ignore_index,
                                             double scale, const fly_tensor* loss, const fly_tensor* lse,
                                             const fly_tensor* dlogits, void* stream);
/* ---- Mixture-of-experts routing (router, permute, unpermute) -------------------------------
 * The glue around a MoE layer's grouped GEMMs (docs/moe_route.md), forward and backward.
 *
 * Router: logits [T, E] (FP16/BF16/FP32, unit inner stride, any row stride) -> per token the k
 * selected experts and their weights:
 *   default order:  s = score(logits) over all E (softmax or sigmoid, FP32), the k largest s
 *                   (Mixtral, Qwen3-MoE, OLMoE);
 *   FLY_MOE_TOPK_FIRST: the k largest logits, then s = score over those k only (softmax over the
 *                   k, gpt-oss; sigmoid per value);
 *   FLY_MOE_RENORMALIZE: w = s / sum(s over the k) (Mixtral, Qwen3-MoE's norm_topk_prob), else w = s.
 * Order of the k: descending score, ties to the lower expert id (NaN ranks above every number, as
 * torch.topk). weights [T, k]: FP32 or the logits' dtype; ids [T, k]: INT32 or INT64. Both any
 * row stride (>= k), unit inner stride. 1 <= k <= E <= 1024. FP32 math, one rounding per output.
 * Backward: dlogits [T, E] (the logits' dtype) from dweights [T, k] (the weights' dtype), the
 * logits and the ids the forward chose (the scores are recomputed). T == 0: no-op. */
typedef enum {
  FLY_MOE_SOFTMAX = 0, /* softmax over the experts (or over the k with FLY_MOE_TOPK_FIRST) */
  FLY_MOE_SIGMOID = 1  /* sigmoid of each logit */
} fly_moe_score;
typedef enum {
  FLY_MOE_RENORMALIZE = 1, /* divide the k selected scores by their sum */
  FLY_MOE_TOPK_FIRST = 2   /* select on the logits, score the k selected only */
} fly_moe_route_flags;
FLY_API fly_status fly_moe_route_fwd(const fly_tensor* logits, int64_t k, int score, int flags,
                                     const fly_tensor* weights, const fly_tensor* ids, void* stream);
FLY_API fly_status fly_moe_route_bwd(const fly_tensor* dweights, const fly_tensor* logits, const fly_tensor* ids,
                                     int score, int flags, const fly_tensor* dlogits, void* stream);

/* Permute: the T*k (token, slot) pairs of ids [T, k] (INT32/INT64) in expert order, stable (pairs
 * of one expert keep their order t*k + j), by a counting sort on the device (no host sync):
 *   offsets [E] INT32: cumulative ends, the `offs` of torch's F.grouped_mm (E = offsets' size);
 *   row_of [T, k] INT32: the row of pair (t, j) in expert order; pair_of [T*k] INT32: its inverse;
 *   x_perm [T*k, H] = x[pair_of[r] / k] (x [T, H], FP16/BF16/FP32; x and x_perm both NULL: only
 *   the indices). Ids outside [0, E) (expert-parallel sentinels) go last, past offsets[E-1], with
 *   zero rows in x_perm; every op below ignores rows past offsets[E-1].
 * Needs a workspace (fly_moe_permute_workspace_size, 256-byte aligned, no initialization).
 * x, x_perm: unit inner stride, any row stride. 1 <= E <= 1024, T*k < 2^31. T == 0: no-op. */
FLY_API fly_status fly_moe_permute_workspace_size(int64_t num_tokens, int64_t top_k, int64_t num_experts,
                                                  size_t* bytes);
FLY_API fly_status fly_moe_permute(const fly_tensor* x, const fly_tensor* ids, const fly_tensor* x_perm,
                                   const fly_tensor* offsets, const fly_tensor* row_of, const fly_tensor* pair_of,
                                   void* workspace, size_t workspace_bytes, void* stream);
/* Unpermute: y[t] = sum_j w[t, j] * out_perm[row_of[t, j]] over the valid rows (FP32 sums in slot
 * order, one rounding). weights [T, k]: FP32 or out_perm's dtype; NULL: every weight 1, which is
 * the permute's backward (dx from dx_perm; fly_moe_permute_bwd). out_perm [T*k, H] and y [T, H]:
 * one dtype (FP16/BF16/FP32), unit inner stride, any row stride.
 * Unpermute backward: dout_perm[row_of[t, j]] = w[t, j] * dy[t] (zero rows for invalid pairs) and
 * dweights[t, j] = <dy[t], out_perm[row_of[t, j]]> (FP32 dot; 0 for invalid pairs). */
FLY_API fly_status fly_moe_unpermute(const fly_tensor* out_perm, const fly_tensor* weights, const fly_tensor* row_of,
                                     const fly_tensor* offsets, const fly_tensor* y, void* stream);
FLY_API fly_status fly_moe_permute_bwd(const fly_tensor* dx_perm, const fly_tensor* row_of, const fly_tensor* offsets,
                                       const fly_tensor* dx, void* stream);
FLY_API fly_status fly_moe_unpermute_bwd(const fly_tensor* dy, const fly_tensor* out_perm, const fly_tensor* weights,
                                         const fly_tensor* row_of, const fly_tensor* offsets,
                                         const fly_tensor* dout_perm, const fly_tensor* dweights, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLYKERNELS_H_ */
