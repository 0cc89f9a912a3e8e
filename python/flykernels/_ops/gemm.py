# SPDX-License-Identifier: Apache-2.0
"""Dense GEMM candidates for torch.compile(mode="max-autotune"): torch.mm / @ (lowering "mm")
and addmm with an [N] bias and alpha = beta = 1 (lowering "addmm"), fp16/bf16, any of the four
operand layouts. A provider offers our kernel only for static shapes whose layouts the library
takes and where the decision rows say ours wins by COMPILE_MARGIN (no hopeless candidate for
Inductor to benchmark: compile time; no marginal one that loses the graph its fused epilogue); Inductor benchmarks it beside ATen and Triton, and the compiled code
calls the winner."""
import re

import torch

from . import inductor, register

_GEMM_DTYPES = (torch.float16, torch.bfloat16)
_choices = {}  # "mm"/"addmm" -> ExternKernelChoice (created once per process)


# No stream-K workspace under Inductor: CUDA-graph trees route every allocation of the warm-up
# thread into their pool and reject one that outlives the run ("tensor in the cudagraph pool not
# tracked", seen on the H200), so stream-K variants run without stream-K here (fly_gemm's NULL/0).


# The extern kernels Inductor's generated code calls by name (extern_kernels.<name>). Without
# the extension they run the stock ops: a graph compiled while ours won can come back from
# Inductor's caches in a process where the extension did not load or the family is off.
def flykernels_mm(a, b, *, out):
    """out = a @ b through fly_gemm (the extension falls back to at::mm_out where we decline)."""
    from .._loader import ext
    if ext is None:
        torch.mm(a, b, out=out)
    else:
        ext.mm_out(a, b, out, None)


def flykernels_addmm(inp, a, b, *, out, alpha=1, beta=1):
    """out = beta * inp + alpha * (a @ b): fly_gemm with a bias vector, else at::addmm_out."""
    from .._loader import ext
    if ext is None:
        torch.addmm(inp, a, b, beta=beta, alpha=alpha, out=out)
    else:
        ext.addmm_out(inp, a, b, out, float(beta), float(alpha), None)


def flykernels_grouped_mm(a, b, offs, *, out):
    """out = F.grouped_mm(a, b, offs=offs) through fly_grouped_gemm (else the stock op, copied)."""
    from .._loader import ext
    if ext is None:
        out.copy_(torch._grouped_mm(a, b, offs))
    else:
        ext.grouped_mm_out(a, b, offs, out)


_EXTERN = (flykernels_mm, flykernels_addmm, flykernels_grouped_mm)


def _name_extern_kernels(select_algorithm):
    """Puts our functions into Inductor's extern_kernels namespace as soon as it exists, whatever
    is enabled: the FX graph cache and the AOT caches hand back generated code that calls
    extern_kernels.flykernels_mm & co. without running a lowering (so without _extern_choice)."""
    ns = select_algorithm.extern_kernels
    for fn in _EXTERN:
        if not hasattr(ns, fn.__name__):
            setattr(ns, fn.__name__, fn)


inductor.after_import("torch._inductor.select_algorithm", _name_extern_kernels)


def _extern_choice(kind):
    if kind not in _choices:
        from torch._inductor.select_algorithm import ExternKernelChoice, extern_kernels
        fn = {"mm": flykernels_mm, "addmm": flykernels_addmm, "grouped_mm": flykernels_grouped_mm}[kind]
        if hasattr(extern_kernels, fn.__name__):  # ExternKernelChoice refuses duplicate names
            delattr(extern_kernels, fn.__name__)
        _choices[kind] = ExternKernelChoice(fn, name=fn.__name__, has_out_variant=True)
    return _choices[kind]


def operand_ok(sizes, strides):
    """A static 2-D operand the library reads: row- or column-major with any leading dimension
    (fly_gemm takes strides TMA cannot address with its cp.async kernel, docs/gemm.md)."""
    try:
        r, c = (int(v) for v in sizes)
        s0, s1 = (int(v) for v in strides)
    except (TypeError, ValueError):  # symbolic (dynamic) sizes: not offered
        return False
    if r <= 0 or c <= 0:
        return False
    if s1 == 1 and s0 >= c:
        return True
    return s0 == 1 and s1 >= r


def gemm_shape_ok(a_dtype, b_dtype, out_dtype, a_sizes, a_strides, b_sizes, b_strides, out_strides, device_type):
    """Whether our candidate is offered (pure logic, tested on CPU)."""
    if device_type != "cuda" or out_dtype not in _GEMM_DTYPES or a_dtype != out_dtype or b_dtype != out_dtype:
        return False
    if not (operand_ok(a_sizes, a_strides) and operand_ok(b_sizes, b_strides)):
        return False
    try:
        return int(out_strides[1]) == 1 and int(a_sizes[1]) == int(b_sizes[0])
    except (TypeError, ValueError):
        return False


_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def gemm_key(dtype, a_sizes, a_strides, b_sizes, b_strides):
    """The decision key (dtype, layout, N, K, M) of a @ b (python/csrc/decisions.hpp: op "mm", for
    addmm's candidate too), or None for shapes that are not static 2-D operands."""
    a_sz, a_st, b_sz, b_st = _static(a_sizes), _static(a_strides), _static(b_sizes), _static(b_strides)
    if None in (a_sz, a_st, b_sz, b_st) or len(a_sz) != 2 or len(b_sz) != 2 or dtype not in _DTYPE_NAMES:
        return None
    (M, K), N = a_sz, b_sz[1]
    layout = ("n" if a_st[1] == 1 else "t") + ("n" if b_st[1] == 1 else "t")
    return (_DTYPE_NAMES[dtype], layout, N, K, M)


# Under torch.compile a candidate must have measured this much faster than stock (stock / ours)
# for the provider to offer it. Inductor picks from one unflushed benchmark of each candidate and
# an extern kernel takes no fused epilogue, so a few-percent row win was a graph-level loss: on an
# H100 (bench/e2e.py, 2026-12-07) Llama decode b8 compiled ran at 0.87x when Inductor took ours on
# the MLP's M = 8 GEMMs, rows of 1.05x.
COMPILE_MARGIN = 1.10
_RATIO = re.compile(r"ours (\d+(?:\.\d+)?)x")


def _decided_ours(op, key):
    """Whether the rows say ours wins this key by COMPILE_MARGIN (what the provider offers)."""
    from .. import _decisions
    if key is None:
        return False
    ours, rule = _decisions.decide(op, *key)
    m = _RATIO.search(rule)
    return bool(ours) and m is not None and float(m.group(1)) >= COMPILE_MARGIN


def _nodes_ok(a, b, layout):
    if not gemm_shape_ok(a.get_dtype(), b.get_dtype(), layout.dtype, a.get_size(), a.get_stride(),
                         b.get_size(), b.get_stride(), layout.stride, layout.device.type):
        return False
    return _decided_ours("mm", gemm_key(layout.dtype, a.get_size(), a.get_stride(), b.get_size(), b.get_stride()))


def _mm_provider(choices, input_nodes, layout):
    if len(input_nodes) != 2 or not _nodes_ok(input_nodes[0], input_nodes[1], layout):
        return []
    return [_extern_choice("mm").bind(input_nodes, layout)]


def _addmm_provider(choices, input_nodes, layout):
    if len(input_nodes) != 3 or not _nodes_ok(input_nodes[1], input_nodes[2], layout):
        return []
    kwargs = None  # alpha/beta as ATen's own addmm choice carries them
    for c in choices:
        if getattr(getattr(c, "choice", None), "name", "") in ("addmm", "bias_addmm"):
            kwargs = dict(getattr(c, "kwargs", None) or {})
            break
    if kwargs is None or kwargs.get("alpha", 1) != 1 or kwargs.get("beta", 1) != 1:
        return []
    bias = input_nodes[0]
    try:  # the [N] bias broadcast over rows: stride (0, 1)
        if [int(s) for s in bias.get_stride()] != [0, 1] or bias.get_dtype() != layout.dtype:
            return []
    except (TypeError, ValueError):
        return []
    return [_extern_choice("addmm").bind(input_nodes, layout, alpha=1, beta=1)]


def _static(values):
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):  # symbolic (dynamic) sizes: not offered
        return None


def grouped_shape_ok(a_dtype, b_dtype, offs_dtype, out_dtype, a_sizes, a_strides, b_sizes, b_strides,
                     offs_sizes, out_sizes, out_strides, device_type):
    """Whether our grouped candidate is offered for F.grouped_mm(a, b, offs) (pure logic, tested on
    CPU): the 2-D x 3-D form the library takes, A [T, K] row-major, B [G, K, N] N- or K-contiguous
    with 8-element aligned strides, int32 offs [G], a row-major [T, N] output, N % 8 == 0."""
    if device_type != "cuda" or out_dtype not in _GEMM_DTYPES or a_dtype != out_dtype or b_dtype != out_dtype:
        return False
    if offs_dtype != torch.int32:
        return False
    a_sz, a_st, b_sz, b_st = _static(a_sizes), _static(a_strides), _static(b_sizes), _static(b_strides)
    o_sz, c_sz, c_st = _static(offs_sizes), _static(out_sizes), _static(out_strides)
    if None in (a_sz, a_st, b_sz, b_st, o_sz, c_sz, c_st) or len(a_sz) != 2 or len(b_sz) != 3:
        return False
    (T, K), (G, K2, N) = a_sz, b_sz
    if K != K2 or K <= 0 or N <= 0 or N % 8 or o_sz != [G] or c_sz != [T, N]:
        return False
    if a_st[1] != 1 or (T > 1 and (a_st[0] < K or a_st[0] % 8)):
        return False
    n_contig = b_st[2] == 1 and b_st[1] >= N and b_st[1] % 8 == 0
    k_contig = b_st[1] == 1 and b_st[2] >= K and b_st[2] % 8 == 0
    if not (n_contig or k_contig) or (G > 1 and b_st[0] % 8):
        return False
    return c_st[1] == 1 and (T <= 1 or c_st[0] == N)


def grouped_key(dtype, a_sizes, b_sizes, b_strides):
    """The decision key of the 2-D x 3-D form (dtype, layout, N, K, T, G), as the eager override
    computes it (python/csrc/decisions.hpp), or None."""
    a_sz, b_sz, b_st = _static(a_sizes), _static(b_sizes), _static(b_strides)
    if None in (a_sz, b_sz, b_st) or len(a_sz) != 2 or len(b_sz) != 3 or dtype not in _DTYPE_NAMES:
        return None
    (T, K), (G, _, N) = a_sz, b_sz
    return (_DTYPE_NAMES[dtype], "b_kn" if b_st[2] == 1 else "b_nk", N, K, T, G)


def _grouped_provider(choices, input_nodes, layout):
    if len(input_nodes) != 3:  # scaled or offset-less forms
        return []
    a, b, offs = input_nodes
    if not grouped_shape_ok(a.get_dtype(), b.get_dtype(), offs.get_dtype(), layout.dtype, a.get_size(),
                            a.get_stride(), b.get_size(), b.get_stride(), offs.get_size(), layout.size,
                            layout.stride, layout.device.type):
        return []
    if not _decided_ours("grouped_mm", grouped_key(layout.dtype, a.get_size(), b.get_size(), b.get_stride())):
        return []
    return [_extern_choice("grouped_mm").bind(input_nodes, layout)]


class InductorGemm:
    name = "gemm"
    kind = "inductor"
    module = "torch._inductor.kernel.mm"
    lowerings = {"mm": _mm_provider, "addmm": _addmm_provider}

    def supported(self):
        import importlib.util
        from torch.torch_version import TorchVersion
        if TorchVersion(torch.__version__) < (2, 11):
            return f"torch {torch.__version__}: the Inductor hook is written against 2.11"
        from .._loader import ext
        if ext is None:
            return "the extension did not load"
        if importlib.util.find_spec("torch._inductor") is None:  # found, not imported (slow)
            return "this torch has no Inductor"
        return inductor.wrap_errors.get(self.module, "")

    def install(self):
        for name, provider in self.lowerings.items():
            inductor.register_candidates(name, provider, key="flykernels", module=self.module)

    def remove(self):
        for name in self.lowerings:
            inductor.unregister_candidates(name, key="flykernels")

    def installed(self):
        return all(inductor.registered(name, "flykernels") for name in self.lowerings)


class InductorGroupedMm(InductorGemm):
    """Our grouped GEMM as a candidate of Inductor's grouped_mm lowering (kernel/mm_grouped.py;
    2.11 has no plugin hook there, so its selector is wrapped like mm's). On by default since its
    GPU test passed on the H200 (2026-12-02). (Inductor's ATen choice calls
    aten::_grouped_mm, which the eager "grouped_mm" family overrides; this family makes ours a
    candidate of its own, benchmarked beside ATen's and Triton's.)"""
    name = "grouped_mm_compile"
    module = "torch._inductor.kernel.mm_grouped"
    lowerings = {"grouped_mm": _grouped_provider}


register(InductorGemm())
register(InductorGroupedMm())
