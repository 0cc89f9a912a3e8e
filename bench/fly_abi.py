# SPDX-License-Identifier: Apache-2.0
"""The library's C ABI from Python (ctypes), for the bench scripts that call it directly:
fly_tensor descriptors of torch tensors and the loaded library with its string returns typed."""
import ctypes

import torch

FLY_BF16, FLY_F16, FLY_F32 = 2, 1, 3


class FlyTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int32),
                ("sizes", ctypes.c_int64 * 8), ("strides", ctypes.c_int64 * 8)]


def desc(t):
    """A fly_tensor describing torch tensor t (bf16, fp16 or fp32; any strides)."""
    d = FlyTensor()
    d.data = t.data_ptr()
    d.dtype = {torch.bfloat16: FLY_BF16, torch.float16: FLY_F16, torch.float32: FLY_F32}[t.dtype]
    d.rank = t.dim()
    for i in range(t.dim()):
        d.sizes[i] = t.shape[i]
        d.strides[i] = t.stride(i)
    return d


def load(path):
    """libflykernels.so at `path`, with fly_get_last_error / fly_last_variant / fly_variant_name
    returning bytes."""
    lib = ctypes.CDLL(path)
    lib.fly_get_last_error.restype = ctypes.c_char_p
    lib.fly_last_variant.restype = ctypes.c_char_p
    lib.fly_last_decision.restype = ctypes.c_char_p
    lib.fly_variant_name.restype = ctypes.c_char_p
    return lib


def gemm_caller(lib, a, b, c, bias=None, workspace=True):
    """A callable running fly_gemm(a, b, c, bias) on torch's current stream, with a zero-filled
    workspace of fly_gemm_workspace_size bytes (stream-K variants and the packed path for odd
    strides use it; workspace=False passes NULL, 0); raises RuntimeError with the library's
    message on a failed call."""
    ad, bd, cd = desc(a), desc(b), desc(c)
    biasd = desc(bias) if bias is not None else None
    nbytes = ctypes.c_size_t(0)
    if lib.fly_gemm_workspace_size(ctypes.byref(ad), ctypes.byref(bd), ctypes.byref(cd), ctypes.byref(nbytes)):
        raise RuntimeError(lib.fly_get_last_error().decode())
    if not workspace:
        nbytes.value = 0
    ws = torch.zeros(max(nbytes.value, 256), device=c.device, dtype=torch.uint8)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def call():
        if lib.fly_gemm(ctypes.byref(ad), ctypes.byref(bd), ctypes.byref(cd),
                        ctypes.byref(biasd) if biasd is not None else None,
                        ctypes.c_void_p(ws.data_ptr() if nbytes.value else None), ctypes.c_size_t(nbytes.value), stream):
            raise RuntimeError(lib.fly_get_last_error().decode())
    call.workspace = ws  # kept alive with the callable
    return call


def add_nt_args(ap):
    """The options every NT probe takes: --lib and the shape."""
    ap.add_argument("--lib", required=True, help="path to libflykernels.so")
    ap.add_argument("-M", type=int, required=True)
    ap.add_argument("-N", type=int, required=True)
    ap.add_argument("-K", type=int, required=True)


def add_suite_args(ap, layouts, max_m):
    """The options of the scripts that walk the GEMM suite: --lib, --suite, --layouts and the M
    range (--min-m, --max-m); suite_cases(args) reads the cases."""
    ap.add_argument("--lib", required=True, help="path to libflykernels.so")
    ap.add_argument("--suite", default="suites/gemm_bf16.json")
    ap.add_argument("--layouts", default=layouts)
    ap.add_argument("--min-m", type=int, default=1)
    ap.add_argument("--max-m", type=int, default=max_m)


def suite_cases(a):
    """(M, N, K) of the suite's cases with M in [a.min_m, a.max_m]."""
    import json
    with open(a.suite) as f:
        return [(c["M"], c["N"], c["K"]) for c in json.load(f)["cases"] if a.min_m <= c["M"] <= a.max_m]


def nt_problem(M, N, K):
    """bf16 operands of an NT GEMM from seed 0: x [M, K], w [N, K] (B = w.t(), column-major) and an
    uninitialised c [M, N]."""
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    return x, w, torch.empty(M, N, device="cuda", dtype=torch.bfloat16)


def max_rel_err(out, ref):
    """Largest |out - ref| / (|ref| + 1) over all elements (NaN if any element of out is NaN)."""
    return ((out.float() - ref).abs() / (ref.abs() + 1.0)).max().item()


def poisoned_err(fn, out, ref):
    """max_rel_err(out, ref) after fn(), which writes `out`, with `out` filled with NaN beforehand:
    an element fn() leaves unwritten makes the result NaN."""
    out.fill_(float("nan"))
    fn()
    return max_rel_err(out, ref)  # .item() waits for fn()'s kernels


def force_variant(lib, name):
    """fly_force_variant(name); None restores the database's choice. RuntimeError if not bundled."""
    if lib.fly_force_variant(None if name is None else name.encode()) != 0:
        raise RuntimeError(lib.fly_get_last_error().decode())
