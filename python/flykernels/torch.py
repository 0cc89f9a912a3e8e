# SPDX-License-Identifier: Apache-2.0
"""The controller: which FlyKernels overrides PyTorch sees.

    import flykernels                     # turns everything on where our kernels can run
    flykernels.torch.available, .reason   # can they run here, and if not why
    flykernels.torch.enable(ops=["rms_norm"]); flykernels.torch.disable()
    with flykernels.torch.disabled(): ... # stock PyTorch inside, the previous state after
    flykernels.torch.active()             # names of the installed families

Families (flykernels._ops.REGISTRY): "rms_norm", "topk" (eager CUDA-key overrides), "gemm"
(torch.compile max-autotune candidates), "sdpa" (SDPA's flash and memory-efficient forward, as the
flash-attention impl "FLY"), "sdpa_cudnn" (SDPA's cuDNN forward without gradients), "sdpa_bwd"
(SDPA's flash / memory-efficient backward) and "grouped_mm" (F.grouped_mm's 2-D x 3-D form). FLYKERNELS_TORCH=0 keeps them off at import.
Compiled graphs keep the kernels they were compiled with: call torch._dynamo.reset() after a switch.

An installed override takes an eligible call only where the decision rows say ours is faster
(docs/pytorch.md, "Decisions"): explain_*() say which rule decided, `forced("ours")` makes eligible
calls run ours regardless (backward included), reload_decisions() rereads the rows.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch  # the real one (this module is flykernels.torch), for the annotations

from . import _decisions, _loader, _ops
from ._decisions import forced  # noqa: F401  (with flykernels.torch.forced("ours"): ...)

Ops = Optional[Union[str, Sequence[str]]]  # a family name, several, or None: all of them

available: bool = _loader.available
reason: str = _loader.reason
_lock = threading.Lock()


def families() -> Dict[str, str]:
    """{name: kind} of every family the controller knows."""
    return {name: fam.kind for name, fam in _ops.REGISTRY.items()}


def _select(ops: Ops, defaults_only: bool = False) -> List[str]:
    if ops is None:
        return [n for n, f in _ops.REGISTRY.items() if not defaults_only or getattr(f, "default_on", True)]
    if isinstance(ops, str):
        ops = [ops]
    unknown = [o for o in ops if o not in _ops.REGISTRY]
    if unknown:
        raise ValueError(f"flykernels: unknown op(s) {unknown}; known: {sorted(_ops.REGISTRY)}")
    return list(ops)


def enable(ops: Ops = None) -> List[str]:
    """Installs the named families (when None: every family that is on by default: all of them
    today; a family registered with default_on=False is installed only when named) and returns the names now active. Works
    whenever the extension loaded; where `available` is False the overrides only pass calls on
    to the stock kernels. Families this torch cannot take are skipped (see why_not)."""
    with _lock:
        for name in _select(ops, defaults_only=True):
            fam = _ops.REGISTRY[name]
            if not fam.supported() and not fam.installed():
                fam.install()
    return active()


def disable(ops: Ops = None) -> List[str]:
    """Removes the named families (all when None): the stock kernels are current again."""
    with _lock:
        for name in _select(ops):
            _ops.REGISTRY[name].remove()
    return active()


def active() -> List[str]:
    """Names of the installed families."""
    return [name for name, fam in _ops.REGISTRY.items() if fam.installed()]


def why_not(op: str) -> str:
    """'' when family `op` can be enabled here, else the reason."""
    return _ops.REGISTRY[_select(op)[0]].supported()


@contextlib.contextmanager
def disabled(ops: Ops = None) -> Iterator[None]:
    """Stock PyTorch for the named families (all when None) inside; on exit exactly the families
    that were active before are active again."""
    names = _select(ops)
    before = [n for n in names if _ops.REGISTRY[n].installed()]
    disable(names)
    try:
        yield
    finally:
        if before:
            enable(before)


def dispatch_counts() -> Dict[str, Tuple[int, int]]:
    """{op: (ours, stock)} calls our overrides took or passed to the stock kernel since the last
    reset_counts() (ops: rms_norm, topk, topk.values, mm, addmm, sdpa_flash, sdpa_efficient,
    sdpa_cudnn, sdpa_flash_bwd, sdpa_efficient_bwd, grouped_mm)."""
    return _loader.ext.counts() if _loader.ext is not None else {}


def reset_counts() -> None:
    if _loader.ext is not None:
        _loader.ext.reset_counts()


def set_log(on: bool = True) -> None:
    """Print each fallback reason once per reason, and each key's decision once with the rule that
    made it, and the flykernels logger at INFO (off: its level unset again); what FLYKERNELS_LOG=info
    does at import."""
    _loader.log.setLevel(logging.INFO if on else logging.NOTSET)
    if _loader.ext is not None:
        _loader.ext.set_log(bool(on))
        _loader.ext.set_decision_log(bool(on))


def reload_decisions() -> int:
    """Rereads the decision rows (shipped, tuned, autotune cache, FLYKERNELS_TUNING_DB); returns
    how many there are. Cached per-key answers are dropped."""
    return _decisions.load()


def set_autotune(on: bool = True) -> None:
    """What FLYKERNELS_AUTOTUNE=1 does at import: the first eligible call of a key no row holds
    exactly times ours and stock, and the answer is cached (memory and the cache folder)."""
    _decisions.set_autotune(on)


def decision(op: str, dtype: str, layout: str, *key: int) -> Tuple[bool, str]:
    """(ours?, rule) for a decision key (python/csrc/decisions.hpp lists each op's key)."""
    return _decisions.decide(op, dtype, layout, *key)


def _with_decision(why: str, key_fn: Callable[[], Optional[tuple]], check_device: bool) -> str:
    """An explain_* answer: the eligibility reason, or, for an eligible call on a device, the rule
    that decides it ('tuned: ours 1.31x', 'tuned: stock, ours 0.93x', 'nearest: ...', 'autotune:
    ...', 'no row: stock'; the word after the colon says who runs it)."""
    if why or not check_device or _loader.ext is None:
        return why
    key = key_fn()
    if key is None:
        return why
    return _decisions.decide(*key)[1]


def explain_rms_norm(x: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
                     eps: Optional[float] = None, check_device: bool = True) -> str:
    """Why F.rms_norm(x, normalized_shape, weight, eps) runs where it does: the reason it is not
    ours to take, or the decision rule (_with_decision); '' for an eligible call when
    check_device=False (the shape logic alone, e.g. on CPU tensors)."""
    why = _loader.ext.explain_rms_norm(x, list(normalized_shape), weight, eps, check_device)
    return _with_decision(why, lambda: _loader.ext.key_rms_norm(x, list(normalized_shape), weight, eps), check_device)


def explain_topk(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, check_device: bool = True) -> str:
    """As explain_rms_norm, for torch.topk(x, k, dim, largest)."""
    why = _loader.ext.explain_topk(x, int(k), int(dim), check_device)
    return _with_decision(why, lambda: _loader.ext.key_topk(x, int(k), int(dim), bool(largest)), check_device)


def explain_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0, is_causal: bool = False,
                 op: str = "sdpa_cudnn", check_device: bool = True, attn_mask: Optional[torch.Tensor] = None) -> str:
    """As explain_rms_norm, for SDPA's call on (q, k, v) [B, H, S, D] reaching op (sdpa_flash,
    sdpa_efficient, sdpa_cudnn, or a backward: sdpa_flash_bwd, sdpa_efficient_bwd) as far as the
    shapes, dtypes and layout say (the library may still decline a head dim or stride). With
    attn_mask: every masked call runs stock; the answer says what the mask is (causal, padding,
    ...: it reads the mask, a host synchronization) and which call without it would run ours."""
    if attn_mask is not None:
        from . import _masks
        return _masks.explain(attn_mask, q, k, bool(is_causal))
    why = _loader.ext.explain_sdpa(q, k, v, float(dropout_p), check_device)
    return _with_decision(why, lambda: _loader.ext.key_sdpa(op, q, k, v, bool(is_causal)), check_device)


def explain_grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: Optional[torch.Tensor], bias: Optional[torch.Tensor] = None,
                       check_device: bool = True) -> str:
    """As explain_rms_norm, for F.grouped_mm(a, b, offs=offs)."""
    why = _loader.ext.explain_grouped_mm(a, b, offs, bias, check_device)
    return _with_decision(why, lambda: _loader.ext.key_grouped_mm(a, b, offs), check_device)


def explain_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, swizzle: int = 0,
                      bias: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None,
                      check_device: bool = True) -> str:
    """'' when our MX GEMM would take F.scaled_mm(a, b, scale_a, BlockWise1x32, scale_b, BlockWise1x32,
    swizzle (0 NO_SWIZZLE, 1 SWIZZLE_32_4_4), bias, out_dtype), else why not."""
    return _loader.ext.explain_scaled_mm(a, b, scale_a, scale_b, swizzle, bias, out_dtype, check_device)


def mx_quantize(x: torch.Tensor, format: str = "e4m3", rceil: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """MX-quantizes the rows of x [M, K] (bf16, fp16 or fp32 on CUDA; K a multiple of 32) on the
    GPU: returns (q, scales), q float8_e4m3fn [M, K] (format "e4m3", MXFP8) or float4_e2m1fn_x2
    [M, K/2] ("e2m1", MXFP4), scales float8_e8m0fnu [M, K/32] (NO_SWIZZLE layout). The shared
    exponent follows the OCP MX rule (rceil=True: the smallest power of two that keeps amax in
    range). For F.scaled_mm pass q as mat_a, and the [N, K] weight's q.t() as mat_b."""
    if _loader.ext is None:
        raise RuntimeError(f"flykernels: the extension is not available ({_loader.reason})")
    return _loader.ext.mx_quantize(x, format, rceil)
