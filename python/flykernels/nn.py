# SPDX-License-Identifier: Apache-2.0
"""MX layers (docs/mxfp.md, "PyTorch: quantize_ and MXLinear").

    import flykernels
    flykernels.quantize_(model, "mxfp4", activations="bf16", skip=["lm_head"])  # in place; returns model
    layer = flykernels.nn.MXLinear.from_linear(linear, "mxfp8", activations="mx")

MXLinear keeps the weight as MX bytes, the layout fly_mx_quantize writes and fly_scaled_gemm reads
as its B operand (flykernels/_mx.py): buffers `qweight` uint8 [N, K] (MXFP8, E4M3 codes) or
[N, K/2] (MXFP4, two E2M1 codes a byte, low nibble first) and `scales` uint8 [N, K/32] (E8M0), plus
an optional `bias` parameter. Its forward is one custom op: flykernels::mx_linear (weight-only,
activations="bf16": x as it is) or flykernels::mx_linear_mx (activations="mx": x quantized per 32
along K to the weights' format), which torch.compile traces and CUDA graphs capture.
"""
from __future__ import annotations

import fnmatch
from typing import Iterable, Optional, Union

import torch
from torch import nn

from . import _mx

__all__ = ["MXLinear", "quantize_"]


class MXLinear(nn.Module):
    """A linear layer y = x W^T + b whose W [out_features, in_features] is stored MX-quantized.

    MXLinear(in_features, out_features, bias=True, format="mxfp8", activations="bf16", device=None,
    dtype=None) makes an empty layer (zero codes, scale bytes 0) to load a state_dict into;
    from_linear(linear, format, activations) quantizes an nn.Linear. in_features must be a
    multiple of 32 (the MX block). dtype is the bias's dtype and dequantize()'s default (BF16 by
    default; the output always has the input's dtype). Module.to(dtype) / .half() convert the bias
    and that default, never the packed bytes."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, format: str = "mxfp8",
                 activations: str = "bf16", device=None, dtype: Optional[torch.dtype] = None,
                 name: Optional[str] = None) -> None:
        super().__init__()
        _mx.check_format(format, "flykernels.nn.MXLinear")
        _mx.check_activations(activations, "flykernels.nn.MXLinear")
        where = f" (layer '{name}')" if name else ""
        if in_features % _mx.BLOCK != 0:
            raise ValueError(f"flykernels.nn.MXLinear{where}: in_features = {in_features} is not a multiple of "
                             f"{_mx.BLOCK}: MX formats scale blocks of {_mx.BLOCK} along K, so this layer cannot be "
                             "quantized (leave it out with quantize_(..., skip=[its name]))")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.format = format
        self.activations = activations
        dtype = dtype if dtype is not None else torch.bfloat16
        self.register_buffer("qweight", torch.zeros(out_features, _mx.packed_cols(format, in_features),
                                                    dtype=torch.uint8, device=device))
        self.register_buffer("scales", torch.zeros(out_features, in_features // _mx.BLOCK, dtype=torch.uint8,
                                                   device=device))
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        # Follows Module.to(dtype) like the bias does: dequantize()'s default dtype. Not saved.
        self.register_buffer("_dtype_tag", torch.empty(0, dtype=dtype, device=device), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        """dequantize()'s default dtype (the original weight's, following Module.to(dtype))."""
        return self._dtype_tag.dtype

    @classmethod
    def from_linear(cls, linear: nn.Linear, format: str = "mxfp8", activations: str = "bf16",
                    name: Optional[str] = None) -> "MXLinear":
        """An MXLinear holding linear's weight MX-quantized (fly_mx_quantize on CUDA, its bit-exact
        torch version elsewhere; a meta weight gives empty meta buffers, to load_state_dict(...,
        assign=True) into) and its bias (the same tensor). `name` only labels errors."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"flykernels.nn.MXLinear.from_linear: expected an nn.Linear, got {type(linear).__name__}")
        w = linear.weight
        if not w.is_floating_point():
            raise TypeError(f"flykernels.nn.MXLinear.from_linear: the weight's dtype {w.dtype} is not a float type")
        dtype = w.dtype if w.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.bfloat16
        mod = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, format=format,
                  activations=activations, device="meta", dtype=dtype, name=name)
        if w.is_meta:
            mod.qweight = torch.empty_like(mod.qweight)
            mod.scales = torch.empty_like(mod.scales)
        else:
            with torch.no_grad():
                q, s = _mx.quantize_weight(w.detach(), format)
            mod.qweight, mod.scales = q, s
            mod._dtype_tag = torch.empty(0, dtype=dtype, device=w.device)
        if linear.bias is not None:
            mod.bias = linear.bias
        return mod

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The weight [out_features, in_features] the layer computes with: exact in FP32; in
        `dtype` (default: self.dtype) after one cast, exact in BF16 too for a weight quantized from
        BF16 or FP16."""
        return _mx.dequantize(self.qweight, self.scales, self.format, dtype or self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        op = torch.ops.flykernels.mx_linear if self.activations == "bf16" else torch.ops.flykernels.mx_linear_mx
        return op(x, self.qweight, self.scales, self.format, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"format={self.format}, activations={self.activations}")


def _matches(name: str, patterns: Iterable[str]) -> bool:
    """name ('model.layers.0.mlp.down_proj') matches a pattern that equals it, is a dotted suffix of
    it ('down_proj', 'mlp.down_proj') or matches it or one of its suffixes as an fnmatch pattern
    ('*.mlp.*', 'layers.0.*', 'lm_*')."""
    parts = name.split(".")
    suffixes = [".".join(parts[i:]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(s, p) for p in patterns for s in suffixes)


def quantize_(model: nn.Module, format: str, activations: str = "bf16",
              skip: Optional[Union[str, Iterable[str]]] = None) -> nn.Module:
    """Swaps every nn.Linear of `model` (exactly that type: subclasses such as
    MultiheadAttention's out_proj, which their owners read directly, are left alone) for an
    MXLinear of `format` ("mxfp8" or "mxfp4") running with `activations` ("bf16": weight-only, or
    "mx"), in place, and returns the model. Layers whose qualified name matches a `skip` pattern
    (a name, a dotted suffix such as "lm_head", or an fnmatch pattern) stay as they are. A layer
    whose in_features is not a multiple of 32 is an error naming it (skip it). `model` itself an
    nn.Linear: the new MXLinear is returned (nothing to swap in place)."""
    _mx.check_format(format, "flykernels.quantize_")
    _mx.check_activations(activations, "flykernels.quantize_")
    if not isinstance(model, nn.Module):
        raise TypeError(f"flykernels.quantize_: expected an nn.Module, got {type(model).__name__}")
    patterns = [skip] if isinstance(skip, str) else list(skip or [])
    if type(model) is nn.Linear:
        return model if _matches("", patterns) else MXLinear.from_linear(model, format, activations)
    todo = []
    for name, mod in model.named_modules():
        for child_name, child in mod._modules.items():  # every name, also a module's second one
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and not _matches(full, patterns):
                if child.in_features % _mx.BLOCK != 0:
                    raise ValueError(f"flykernels.quantize_: layer '{full}' has in_features = {child.in_features}, "
                                     f"not a multiple of {_mx.BLOCK} (the MX block along K); add it to skip= to keep "
                                     "it unquantized")
                todo.append((mod, child_name, child, full))
    # quantize after the walk (and after every check passed): no half-swapped model on an error
    done = {}
    for parent, child_name, child, full in todo:
        if id(child) not in done:  # one Linear reachable under two names: one MXLinear
            done[id(child)] = MXLinear.from_linear(child, format, activations, name=full)
        setattr(parent, child_name, done[id(child)])
    return model
