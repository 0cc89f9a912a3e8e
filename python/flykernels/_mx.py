# SPDX-License-Identifier: Apache-2.0
"""MX weights for PyTorch layers (docs/mxfp.md, "PyTorch: quantize_ and MXLinear"): the quantizer and
its exact inverse in plain torch ops, and the two custom ops MXLinear's forward calls.

Layout (what fly_mx_quantize / flykernels.torch.mx_quantize write, and fly_scaled_gemm reads as its
B operand), held as uint8 so Module.to(dtype) / .half() never convert it:
  MXFP8: q [N, K] E4M3 codes (torch.float8_e4m3fn bits)
  MXFP4: q [N, K/2] E2M1 codes, two per byte, element 2i in the low nibble (torch.float4_e2m1fn_x2)
  scales [N, K/32] E8M0 bytes (torch.float8_e8m0fnu: 2^(b - 127), 0xFF NaN), one per 32 elements
  of a row, row-major, unswizzled (NO_SWIZZLE).

quantize() is bit for bit fly_mx_quantize's default (OCP) rule: scale 2^(floor(log2 amax) - emax),
emax 8 (E4M3) / 2 (E2M1), clamped to 2^-127; elements x / scale rounded to nearest even with
saturation (+-448 / +-6), the sign kept (also of a zero); a zero block gets scale 0x00, a block
holding NaN or Inf scale 0xFF and NaN codes (E4M3 0x7F; E2M1 has none: 0x7).
dequantize() is exact in FP32 (a code times a power of two).

Ops (torch.library, namespace flykernels; Meta / fake implementations for torch.compile):
  flykernels::mx_linear(x, wq, scales, format, bias)     weight-only: x as it is (BF16/FP16/FP32)
  flykernels::mx_linear_mx(x, wq, scales, format, bias)  x quantized per 32 along K to the same format
y = x @ W^T (+ bias) in x's dtype, x [*, K], wq / scales MXLinear's buffers, format "mxfp8" / "mxfp4".
CPU: the exact dequantized weight (and, for mx_linear_mx, the quantize-dequantize of x) with
F.linear in FP32, then cast. CUDA: one fly_scaled_gemm call through the extension
(csrc/mx_linear.cpp) where the library takes it, else the same dequantize + F.linear on the GPU
(logged once at FLYKERNELS_LOG=info). No host syncs and no data-dependent Python branches: the
choice depends on shapes, dtypes and strides only, so CUDA graphs capture it.
"""
from __future__ import annotations

import threading
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from . import _loader

FORMATS = ("mxfp8", "mxfp4")
ACTIVATIONS = ("bf16", "mx")
BLOCK = 32
_EMAX = {"mxfp8": 8, "mxfp4": 2}
_EXT_FORMAT = {"mxfp8": "e4m3", "mxfp4": "e2m1"}  # flykernels.torch.mx_quantize's names


def check_format(format: str, who: str = "flykernels") -> str:
    if format not in FORMATS:
        raise ValueError(f"{who}: format must be 'mxfp4' or 'mxfp8', got {format!r}")
    return format


def check_activations(activations: str, who: str = "flykernels") -> str:
    if activations not in ACTIVATIONS:
        raise ValueError(f"{who}: activations must be 'bf16' (weight-only: the activations as they are) or 'mx' "
                         f"(quantized per 32 along K like the weights), got {activations!r}")
    return activations


def packed_cols(format: str, k: int) -> int:
    """Bytes per row of q: K (MXFP8) or K/2 (MXFP4)."""
    return k // 2 if format == "mxfp4" else k


def e8m0_to_float(s: torch.Tensor) -> torch.Tensor:
    """FP32 values of E8M0 bytes (uint8): 2^(s - 127) exactly (0x00 = 2^-127, an FP32 subnormal),
    0xFF NaN; built from the bits, the same on every device and under tracing."""
    b = s.to(torch.int32)
    bits = torch.where(b == 0, torch.full_like(b, 0x00400000), b << 23)
    bits = torch.where(b == 255, torch.full_like(b, 0x7FC00000), bits)
    return bits.view(torch.float32)


def _e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """FP32 values of E2M1 codes (the low 4 bits of an integer tensor): s.ee.m, 0.5 * m when
    ee = 0, else 2^(ee - 1) * (1 + m / 2)."""
    c = codes.to(torch.int32)
    e = (c >> 1) & 3
    m = (c & 1).to(torch.float32)
    mag = torch.where(e == 0, 0.5 * m, torch.exp2((e - 1).to(torch.float32)) * (1.0 + 0.5 * m))
    return torch.where((c & 8) != 0, -mag, mag)


_pair_tables = {}  # (device, dtype) -> [256, 2]: the two E2M1 values of each packed byte


def _e2m1_pair_table(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[256, 2] values (low nibble first) of every MXFP4 byte in dtype, on like's device (exact:
    E2M1 values are BF16 / FP16 / FP32 values). Kept per device and dtype for plain tensors; made
    per call (kernels only, no host copy: CUDA graph capture allows it) while tracing (fake or
    functional tensors must not meet a real one, nor be kept) and never kept from a capture (a
    tensor made then holds no values until replay)."""
    plain = type(like) is torch.Tensor and not torch.compiler.is_compiling()
    key = (like.device, dtype)
    if plain and key in _pair_tables:
        return _pair_tables[key]
    b = torch.arange(256, device=like.device, dtype=torch.int32)
    t = torch.stack([_e2m1_values(b & 0xF), _e2m1_values(b >> 4)], dim=-1).to(dtype)
    if plain and not (like.is_cuda and torch.cuda.is_current_stream_capturing()):
        _pair_tables[key] = t
    return t


def dequantize(wq: torch.Tensor, scales: torch.Tensor, format: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The [N, K] weight of MX bytes wq ([N, K] / [N, K/2] uint8, or the float8 / float4 dtypes)
    and scales ([N, K/32] uint8 or float8_e8m0fnu), on their device, exact in FP32 (then cast to
    dtype: exact in BF16 too for weights quantized from BF16).
    BF16 is computed in BF16 (a code times a power of two is one correctly rounded product there,
    as FP32's exact product cast to BF16: the same bits, and a third of the memory traffic);
    other dtypes in FP32, then cast. MXFP4 bytes decode by a 256-entry table of value pairs."""
    check_format(format)
    q = wq.view(torch.uint8)
    s = scales.view(torch.uint8)
    n = q.shape[0]
    work = torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
    if format == "mxfp8":
        vals = q.view(torch.float8_e4m3fn).to(work)
    else:
        vals = F.embedding(q.to(torch.int32), _e2m1_pair_table(q, work)).reshape(n, -1)
    k = vals.shape[1]
    w = vals.reshape(n, k // BLOCK, BLOCK) * e8m0_to_float(s).to(work).reshape(n, k // BLOCK, 1)
    return w.reshape(n, k).to(dtype)


def quantize(w: torch.Tensor, format: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(q, scales) of w [N, K] (any float dtype; K a multiple of 32) as uint8, bit for bit
    fly_mx_quantize's default rule (module docstring), in torch ops on w's device."""
    check_format(format)
    if w.dim() != 2 or w.shape[1] % BLOCK != 0:
        raise ValueError(f"flykernels: MX quantization needs a 2-D [N, K] tensor with K a multiple of {BLOCK}, "
                         f"got shape {tuple(w.shape)}")
    n, k = w.shape
    x = w.to(torch.float32).reshape(n, k // BLOCK, BLOCK)
    special = (~torch.isfinite(x)).any(dim=-1)                      # NaN or Inf in the block
    amax = torch.where(special, torch.zeros((), dtype=x.dtype, device=x.device), x.abs().amax(dim=-1))
    _, e = torch.frexp(amax)                                        # amax = f * 2^e, f in [0.5, 1)
    sb = (e.to(torch.int32) - 1 - _EMAX[format] + 127).clamp(0, 254)  # floor(log2 amax) - emax, biased
    sb = torch.where(amax == 0, torch.zeros_like(sb), sb)
    sb = torch.where(special, torch.full_like(sb, 255), sb)
    v = x / e8m0_to_float(sb).unsqueeze(-1)                         # exact: a power of two
    if format == "mxfp8":
        codes = v.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
        codes = torch.where(special.unsqueeze(-1), torch.full_like(codes, 0x7F), codes)
        q = codes.reshape(n, k)
    else:
        a = v.abs()
        # nearest even on 0, 0.5, 1, 1.5, 2, 3, 4, 6: ties at 0.25, 1.25, 2.5, 5 go down (even
        # code), at 0.75, 1.75, 3.5 up; above 6 saturates
        c = ((a > 0.25).to(torch.uint8) + (a >= 0.75).to(torch.uint8) + (a > 1.25).to(torch.uint8)
             + (a >= 1.75).to(torch.uint8) + (a > 2.5).to(torch.uint8) + (a >= 3.5).to(torch.uint8)
             + (a > 5.0).to(torch.uint8))
        c = c | (torch.signbit(v).to(torch.uint8) << 3)
        c = torch.where(special.unsqueeze(-1), torch.full_like(c, 0x7), c).reshape(n, k)
        q = c[:, 0::2] | (c[:, 1::2] << 4)
    return q.contiguous(), sb.to(torch.uint8).contiguous()


def quantize_weight(w: torch.Tensor, format: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """quantize() on CPU; on CUDA fly_mx_quantize (the same bytes) where the extension can run it."""
    if w.is_cuda and _loader.available and _loader.ext is not None and w.dtype in (torch.bfloat16, torch.float16, torch.float32):
        q, s = _loader.ext.mx_quantize(w.contiguous(), _EXT_FORMAT[format], False)
        return q.view(torch.uint8), s.view(torch.uint8)
    return quantize(w, format)


# ---- the ops' implementations ----------------------------------------------------------------

_logged = set()
_log_lock = threading.Lock()


def _log_once(key: str, msg: str, *args) -> None:
    with _log_lock:
        if key in _logged:
            return
        _logged.add(key)
    _loader.log.info(msg, *args)


def _ext_fn(name: str):
    """The extension's function `name`, or None (no extension, or one built before it existed)."""
    if not _loader.available or _loader.ext is None:
        return None
    return getattr(_loader.ext, name, None)


def _reference(x2: torch.Tensor, wq: torch.Tensor, scales: torch.Tensor, format: str, bias: Optional[torch.Tensor],
               mx_act: bool) -> torch.Tensor:
    """The CPU implementation (and the exact emulation anywhere): FP32 dequantized weight (and
    quantize-dequantized x), F.linear in FP32, cast to x's dtype."""
    xf = x2.to(torch.float32)
    if mx_act:
        xf = dequantize(*quantize(xf, format), format)
    b = bias.to(torch.float32) if bias is not None else None
    return F.linear(xf, dequantize(wq, scales, format), b).to(x2.dtype)


def _dequant_linear_cuda(x2: torch.Tensor, wq: torch.Tensor, scales: torch.Tensor, format: str,
                         bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Dequantize on the GPU (torch ops) to x's dtype, then F.linear (cuBLAS)."""
    w = dequantize(wq, scales, format, x2.dtype)
    return F.linear(x2, w, bias.to(x2.dtype) if bias is not None else None)


def _weight_only_cuda(x2: torch.Tensor, wq: torch.Tensor, scales: torch.Tensor, format: str,
                      bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The weight-only CUDA path, x2 [M, K]: fly_scaled_gemm's weight-only mode (BF16/FP16
    activations, scale_a NULL: the decode kernels at M <= 64; the prefill kernel for BF16 above
    once the library dispatches it, docs/mxfp.md "Weight-only prefill"; csrc/mx_linear.cpp) where
    the library takes the call, else dequantize + F.linear. The one place the kernels are swapped
    in."""
    run = _ext_fn("mx_linear_run")
    if run is None:
        _log_once("wo:noext", "mx_linear: weight-only on CUDA runs dequantize + F.linear (%s)",
                  "the extension has no mx_linear_run" if _loader.ext is not None else _loader.reason)
    elif x2.dtype in (torch.bfloat16, torch.float16):
        b = bias.to(x2.dtype) if bias is not None else None
        out = run(x2, None, wq, scales, format, b, None)
        if out is not None:
            return out
        # the extension noted why (FLYKERNELS_LOG=info: "mx_linear -> stock kernel (reason)")
    else:
        _log_once(f"wo:{x2.dtype}", "mx_linear: %s activations run dequantize + F.linear (the weight-only kernel "
                  "takes bf16 / fp16)", x2.dtype)
    return _dequant_linear_cuda(x2, wq, scales, format, bias)


def _mx_act_cuda(x2: torch.Tensor, wq: torch.Tensor, scales: torch.Tensor, format: str,
                 bias: Optional[torch.Tensor]) -> torch.Tensor:
    """MX activations on CUDA, x2 [M, K]: fly_mx_quantize of x (per 32 along K, the weights'
    format), then fly_scaled_gemm (the MX GEMM F.scaled_mm reaches) into x's dtype; where the
    extension or the library cannot, the exact emulation on the GPU (quantize-dequantize x, then
    dequantize + F.linear)."""
    run = _ext_fn("mx_linear_run")
    if run is not None and x2.dtype in (torch.bfloat16, torch.float16):
        qa, sa = _loader.ext.mx_quantize(x2 if x2.stride(-1) == 1 else x2.contiguous(), _EXT_FORMAT[format], False)
        b = bias.to(x2.dtype) if bias is not None else None
        out = run(qa, sa, wq, scales, format, b, x2.dtype)
        if out is not None:
            return out
        xq = dequantize(qa, sa, format, x2.dtype)
    else:
        if run is None:
            _log_once("mx:noext", "mx_linear_mx: MX activations on CUDA emulated (quantize-dequantize + F.linear: %s)",
                      "the extension has no mx_linear_run" if _loader.ext is not None else _loader.reason)
        else:
            _log_once(f"mx:{x2.dtype}", "mx_linear_mx: %s activations emulated (the MX GEMM writes bf16 / fp16)",
                      x2.dtype)
        xq = dequantize(*quantize(x2, format), format, x2.dtype)
    return _dequant_linear_cuda(xq, wq, scales, format, bias)


def _run(x: torch.Tensor, wq: torch.Tensor, scales: torch.Tensor, format: str, bias: Optional[torch.Tensor],
         mx_act: bool) -> torch.Tensor:
    check_format(format)
    k = x.shape[-1]
    n = wq.shape[0]
    x2 = x.reshape(-1, k)
    if x.is_cuda:
        y = (_mx_act_cuda if mx_act else _weight_only_cuda)(x2, wq, scales, format, bias)
    else:
        y = _reference(x2, wq, scales, format, bias, mx_act)
    return y.reshape(*x.shape[:-1], n)


def _check_shapes(x: torch.Tensor, wq: torch.Tensor, scales: torch.Tensor, format: str,
                  bias: Optional[torch.Tensor], op: str) -> None:
    check_format(format, f"flykernels::{op}")
    k = x.shape[-1]
    torch._check(wq.dim() == 2 and scales.dim() == 2,
                 lambda: f"flykernels::{op}: wq and scales must be 2-D, got {tuple(wq.shape)} and {tuple(scales.shape)}")
    torch._check(wq.shape[1] == packed_cols(format, k),
                 lambda: f"flykernels::{op}: x has K = {k} but wq is {tuple(wq.shape)} ({format}: [N, "
                         f"{'K/2' if format == 'mxfp4' else 'K'}])")
    torch._check(k % BLOCK == 0, lambda: f"flykernels::{op}: K = {k} is not a multiple of {BLOCK}")
    torch._check(scales.shape[0] == wq.shape[0] and scales.shape[1] * BLOCK == k,
                 lambda: f"flykernels::{op}: scales {tuple(scales.shape)} do not match [N, K/32] = "
                         f"[{wq.shape[0]}, {k // BLOCK}]")
    if bias is not None:
        torch._check(bias.dim() == 1 and bias.shape[0] == wq.shape[0],
                     lambda: f"flykernels::{op}: bias {tuple(bias.shape)} is not [N] = [{wq.shape[0]}]")


@torch.library.custom_op("flykernels::mx_linear", mutates_args=())
def mx_linear(x: torch.Tensor, wq: torch.Tensor, scales: torch.Tensor, format: str,
              bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Weight-only MX linear: x [*, K] (as it is) @ dequantize(wq, scales)^T (+ bias), in x's dtype."""
    _check_shapes(x, wq, scales, format, bias, "mx_linear")
    return _run(x, wq, scales, format, bias, mx_act=False)


@torch.library.custom_op("flykernels::mx_linear_mx", mutates_args=())
def mx_linear_mx(x: torch.Tensor, wq: torch.Tensor, scales: torch.Tensor, format: str,
                 bias: Optional[torch.Tensor]) -> torch.Tensor:
    """MX linear with MX activations: x quantized per 32 along K (the weights' format), then the
    MX GEMM, in x's dtype."""
    _check_shapes(x, wq, scales, format, bias, "mx_linear_mx")
    return _run(x, wq, scales, format, bias, mx_act=True)


def _fake(x, wq, scales, format, bias):
    return x.new_empty((*x.shape[:-1], wq.shape[0]))


@mx_linear.register_fake
def _mx_linear_fake(x, wq, scales, format, bias):
    _check_shapes(x, wq, scales, format, bias, "mx_linear")
    return _fake(x, wq, scales, format, bias)


@mx_linear_mx.register_fake
def _mx_linear_mx_fake(x, wq, scales, format, bias):
    _check_shapes(x, wq, scales, format, bias, "mx_linear_mx")
    return _fake(x, wq, scales, format, bias)


# Gradients (for adapters trained on a frozen MX model): dx = dy @ W, the dequantized weight (for
# mx_linear_mx straight through the activation quantization); dbias = the sum of dy; the packed
# weights take none.
def _setup_context(ctx, inputs, output):
    x, wq, scales, format, bias = inputs
    ctx.save_for_backward(wq, scales)
    ctx.format = format
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _backward(ctx, dy):
    wq, scales = ctx.saved_tensors
    dx = None
    if ctx.needs_input_grad[0]:
        w = dequantize(wq, scales, ctx.format, torch.float32 if dy.device.type == "cpu" else dy.dtype)
        dx = (dy.to(w.dtype) @ w).to(dy.dtype)
    db = None
    if ctx.bias_dtype is not None and ctx.needs_input_grad[4]:
        db = dy.reshape(-1, dy.shape[-1]).sum(0).to(ctx.bias_dtype)
    return dx, None, None, None, db


mx_linear.register_autograd(_backward, setup_context=_setup_context)
mx_linear_mx.register_autograd(_backward, setup_context=_setup_context)


# ---- expert weights: 3-D [E, N, K] stacks of the same per-row layout ---------------------------

def quantize_experts(w: torch.Tensor, format: str, transposed: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(q [E, N, K or K/2], scales [E, N, K/32]) uint8 of a stack of expert weights: w [E, N, K]
    (transformers' default layout, used as F.linear(x, w[e]): K is the last dimension) or, with
    `transposed`, w [E, K, N] (used as x @ w[e], gpt-oss: K is the middle dimension). Either way
    each expert is stored as MXLinear stores one weight ([N, K] rows, 32-blocks along K), so a
    grouped MX GEMM reads every expert as fly_scaled_gemm reads its B operand."""
    check_format(format)
    if w.dim() != 3:
        raise ValueError(f"flykernels: expert weights must be 3-D, got shape {tuple(w.shape)}")
    wk = w.transpose(-2, -1) if transposed else w
    e, n, k = wk.shape
    q, s = quantize_weight(wk.reshape(e * n, k), format)
    return q.view(e, n, -1), s.view(e, n, -1)


def dequantize_experts(q: torch.Tensor, scales: torch.Tensor, format: str, dtype: torch.dtype = torch.float32,
                       transposed: bool = False) -> torch.Tensor:
    """The stack quantize_experts packed, exact in FP32 (then cast): [E, N, K], or with
    `transposed` its [E, K, N] transpose (a view: no copy)."""
    e, n = q.shape[0], q.shape[1]
    w = dequantize(q.reshape(e * n, -1), scales.reshape(e * n, -1), format, dtype).view(e, n, -1)
    return w.transpose(-2, -1) if transposed else w


def experts_kernel(mod, args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """THE HOOK for a fused MX grouped GEMM (issue 49, "MX expert weights"): the output of the MX
    experts module `mod` (flykernels.nn.MXExperts) for its forward's arguments, computed from the
    packed expert weights directly, or None where nothing fused takes the call. Today always None:
    no grouped MX GEMM kernel exists yet, so MXExperts.forward dequantizes the expert weights and
    runs the module's own forward (the experts_implementation the model was built with). A kernel
    plugs in here: it reads mod.<name>_qweight / mod.<name>_scales ([E, N, K or K/2] / [E, N, K/32]
    uint8 per weight of mod.mx_weights), mod.format, mod.is_transposed-style layout in
    mod.mx_transposed, and must compute exactly what the module's forward computes on
    mod.dequantize() (routing, gate, biases, weighting), or return None. Not called for a copy of
    the module whose _parameters hold dense weights in place of the packed ones (a probe)."""
    return None


def grouped_gemm_kernel(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, format: str,
                        offs: torch.Tensor) -> Optional[torch.Tensor]:
    """THE GEMM-LEVEL HOOK for a grouped MX GEMM (issue 49): y [S, N] in x's dtype, row i of x [S, K]
    (rows sorted by expert; offs int32 [E], F.grouped_mm's cumulative group ends) times the
    transpose of expert e's weight, for the MX expert weights qweight [E, N, K or K/2] / scales
    [E, N, K/32] (MXExperts' W_qweight / W_scales, untransposed layout), or None where no kernel
    takes the call. Today always None: flykernels.patch's MoE path (which sorts tokens by expert and
    computes offs itself) then dequantizes the weight and runs its grouped GEMM. A weight-only MX
    grouped GEMM (BF16 x, the mx_decode kernel's widening per group) goes here, with the same
    rules as MXLinear's ops: no host sync, choices from shapes / dtypes / strides only."""
    return None
