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

Mixture-of-experts weights stored as 3-D parameters (transformers' fused experts modules:
gate_up_proj / up_proj and down_proj [E, ...]) are quantized in place by quantize_ too: the module
becomes an MXExperts (see there) holding each expert in MXLinear's layout.
"""
from __future__ import annotations

import copy
import fnmatch
from typing import Dict, Iterable, List, Optional, Tuple, Union

import torch
from torch import nn

from . import _loader, _mx

__all__ = ["MXExperts", "MXLinear", "quantize_"]


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


# ---- mixture-of-experts weights stored as 3-D parameters -----------------------------------------

# The 3-D expert weights transformers' fused experts modules hold (integrations/moe.py,
# use_experts_implementation): gate and up in one [E, 2I, H] tensor (or up alone when the experts
# are gate-less), down [E, H, I]; [E, H, 2I] / [E, I, H] when the class is "transposed" (gpt-oss).
EXPERT_WEIGHTS = ("gate_up_proj", "up_proj", "down_proj")
# Classes known to hold transposed weights, for a transformers release without the decorator's
# is_transposed attribute (gpt-oss had its [E, H, 2I] layout before the attribute existed).
_TRANSPOSED_CLASSES = {"GptOssExperts": True}


def _hidden_size(mod: nn.Module) -> Optional[int]:
    for a in ("hidden_dim", "hidden_size"):
        v = getattr(mod, a, None)
        if isinstance(v, int):
            return v
    return None


def experts_layout(mod: nn.Module) -> Union[None, str, Tuple[List[str], bool]]:
    """(names of its 3-D expert weights, transposed) when `mod` holds expert weights as
    transformers' fused experts do, a string saying why its layout is unclear, or None (no such
    weights). Found by structure: a 3-D floating-point parameter down_proj and gate_up_proj or
    up_proj with the same expert count. Which dimension is K: the decorator's is_transposed
    attribute where the class has it (transformers >= 5), else a known class, else the module's
    hidden size against the shapes (down_proj's output is the hidden size: [E, H, I] untransposed,
    [E, I, H] transposed)."""
    if isinstance(mod, MXExperts):
        return None
    params = {n: p for n, p in mod._parameters.items()
              if n in EXPERT_WEIGHTS and isinstance(p, torch.Tensor) and p.dim() == 3}
    if "down_proj" not in params or not ({"gate_up_proj", "up_proj"} & params.keys()):
        return None
    if not all(p.is_floating_point() for p in params.values()):
        return "its expert weights are not floating point"
    if len({p.shape[0] for p in params.values()}) != 1:
        return "its 3-D weights disagree on the expert count"
    names = [n for n in EXPERT_WEIGHTS if n in params]
    tr = getattr(mod, "is_transposed", None)
    if isinstance(tr, bool):
        return names, tr
    if type(mod).__name__ in _TRANSPOSED_CLASSES:
        return names, _TRANSPOSED_CLASSES[type(mod).__name__]
    h = _hidden_size(mod)
    d = params["down_proj"].shape
    up = params.get("gate_up_proj", params.get("up_proj")).shape
    plain = h is not None and d[1] == h and up[2] == h
    trans = h is not None and d[2] == h and up[1] == h
    if plain != trans:
        return names, trans
    return ("no is_transposed attribute, and its hidden size does not tell which dimension of its expert "
            "weights is K")


class MXExperts(nn.Module):
    """A mixture-of-experts module whose 3-D expert weights are stored MX-quantized, made in place
    from transformers' fused experts modules (Qwen3-MoE, Mixtral, OLMoE, gpt-oss, DeepSeek, ...)
    by quantize_ or MXExperts.quantize_module(mod, format).

    The module keeps its class's behaviour: its class becomes a subclass of this one and of its own
    class (MX<Name>, isinstance(mod, <Name>) still holds), every other attribute (config, act_fn,
    biases, norms, experts_implementation) stays, and each quantized weight W (gate_up_proj /
    up_proj, down_proj) becomes two uint8 buffers, W_qweight [E, N, K] (MXFP8) or [E, N, K/2]
    (MXFP4) and W_scales [E, N, K/32] (E8M0): expert e is stored exactly as an MXLinear of the
    weight F.linear-style [N, K] (K is the reduction dimension: the last one of transformers'
    default layout, the middle one of a transposed class such as gpt-oss, whose bytes are those of
    the transpose). Reading mod.W gives the dense weight (dequantized exactly, in the original
    layout and dtype); dequantize() gives them all.

    forward: the fused MX grouped GEMM where one takes the call (flykernels._mx.experts_kernel, the
    hook: none exists yet), else every expert weight is dequantized (to the module's dtype: exact
    for weights quantized from BF16 / FP16 / FP32) and the module's own forward runs on them, so
    grouped_mm, batched_mm, the eager loop or any other experts_implementation computes what it
    computes on the dequantized weights. Weight-only: the activations are used as they are. Cost:
    one dense copy of the layer's expert weights per call (all experts, whichever received tokens:
    no host sync, so CUDA graphs capture it) -- correct, not fast. Under flykernels.patch's MoE path
    each grouped GEMM asks flykernels._mx.grouped_gemm_kernel (the GEMM-level hook) first instead."""

    _flykernels_base: type = nn.Module  # the original class (set on each MX<Name> subclass)
    _subclasses: Dict[type, type] = {}

    format: str
    activations: str = "bf16"
    mx_weights: Tuple[str, ...]
    mx_transposed: bool

    @classmethod
    def _subclass_for(cls, base: type) -> type:
        sub = cls._subclasses.get(base)
        if sub is None:
            sub = type(f"MX{base.__name__}", (cls, base), {"_flykernels_base": base, "__module__": __name__,
                                                          "__doc__": f"{base.__name__} with MX expert weights "
                                                                     "(flykernels.nn.MXExperts)."})
            for n in EXPERT_WEIGHTS:
                setattr(sub, n, _weight_property(n))
            cls._subclasses[base] = sub
        return sub

    @classmethod
    def quantize_module(cls, mod: nn.Module, format: str = "mxfp8", names: Optional[Iterable[str]] = None,
                        name: Optional[str] = None) -> nn.Module:
        """Quantizes the expert weights of `mod` (a fused experts module, see experts_layout) in
        place and returns it, now an MXExperts. `names`: which of its 3-D weights (default all);
        `name` only labels errors. Weights on the meta device give empty meta buffers of the right
        shapes (to load_state_dict(..., assign=True) into)."""
        _mx.check_format(format, "flykernels.nn.MXExperts")
        where = f" '{name}'" if name else ""
        layout = experts_layout(mod)
        if not isinstance(layout, tuple):
            raise ValueError(f"flykernels.nn.MXExperts: module{where} ({type(mod).__name__}) is not a fused experts "
                             f"module this can quantize: {layout or 'no 3-D down_proj and gate_up_proj / up_proj'}")
        all_names, transposed = layout
        names = list(all_names if names is None else names)
        if not names or any(n not in all_names for n in names):
            raise ValueError(f"flykernels.nn.MXExperts: {names} are not expert weights of the module{where} "
                             f"(it has {all_names})")
        _check_experts_k(mod, names, transposed, name)
        dtype = mod._parameters[names[0]].dtype
        dtype = dtype if dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.bfloat16
        packed = {}
        for n in names:
            w = mod._parameters[n]
            if w.is_meta:
                e, k, nn_ = (w.shape[0], w.shape[1], w.shape[2]) if transposed else (w.shape[0], w.shape[2], w.shape[1])
                q = torch.empty(e, nn_, _mx.packed_cols(format, k), dtype=torch.uint8, device="meta")
                s = torch.empty(e, nn_, k // _mx.BLOCK, dtype=torch.uint8, device="meta")
            else:
                with torch.no_grad():
                    q, s = _mx.quantize_experts(w.detach(), format, transposed)
            packed[n] = (q, s, w.device)
        # every weight quantized before the module changes: no half-converted module on an error
        mod.__class__ = cls._subclass_for(type(mod))
        for n, (q, s, device) in packed.items():
            del mod._parameters[n]
            mod.register_buffer(f"{n}_qweight", q)
            mod.register_buffer(f"{n}_scales", s)
        mod.format = format
        mod.activations = "bf16"
        mod.mx_weights = tuple(n for n in EXPERT_WEIGHTS if n in packed)
        mod.mx_transposed = transposed
        # follows Module.to(dtype) as MXLinear's does: the dense weights' dtype. Not saved.
        mod.register_buffer("_dtype_tag", torch.empty(0, dtype=dtype, device=device), persistent=False)
        return mod

    @property
    def dtype(self) -> torch.dtype:
        """The dense weights' dtype (the original's, following Module.to(dtype))."""
        return self._dtype_tag.dtype

    def _dense(self, name: str, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        return _mx.dequantize_experts(getattr(self, f"{name}_qweight"), getattr(self, f"{name}_scales"), self.format,
                                      dtype or self.dtype, self.mx_transposed)

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> Dict[str, torch.Tensor]:
        """{name: dense weight} of the quantized expert weights, in the original layout and shape
        (contiguous), exact in FP32 and, for weights quantized from BF16 / FP16, in that dtype
        (default: self.dtype)."""
        return {n: self._dense(n, dtype).contiguous() for n in self.mx_weights}

    def weight_nbytes(self) -> Tuple[int, int]:
        """(bytes the quantized expert weights take now: codes and scales, bytes they took dense
        in self.dtype)."""
        packed = sum(getattr(self, f"{n}_{b}").nbytes for n in self.mx_weights for b in ("qweight", "scales"))
        dense = sum(getattr(self, f"{n}_scales").numel() * _mx.BLOCK for n in self.mx_weights)
        return packed, dense * torch.empty(0, dtype=self.dtype).element_size()

    def forward(self, *args, **kwargs):
        # the kernel reads the packed buffers: not for a copy whose _parameters hold dense weights
        # in their place (flykernels.patch's probe runs the class forward on small dense ones)
        if not any(n in self._parameters for n in self.mx_weights):
            out = _mx.experts_kernel(self, args, kwargs)
            if out is not None:
                return out
        if torch.compiler.is_compiling():
            # Dynamo does not trace copy.copy: the class's forward on self, whose weight properties
            # dequantize on each read (grouped_mm / batched_mm read each weight once; the graph
            # holds the dequantization).
            return self._flykernels_base.forward(self, *args, **kwargs)
        # The class's own forward on a shallow copy whose quantized weights are dense tensors (the
        # weight properties return a _parameters entry where there is one), dequantized once per
        # call however often the forward reads them (the eager loop reads them once per expert):
        # nothing on self changes, so concurrent calls and re-entrant hooks see the module as it
        # is. A dense entry already there (a caller's probe copy, as flykernels.patch makes) is kept.
        view = copy.copy(self)
        view._parameters = dict(self._parameters)
        for n in self.mx_weights:
            if view._parameters.get(n) is None:
                view._parameters[n] = self._dense(n)
        return self._flykernels_base.forward(view, *args, **kwargs)

    def __reduce_ex__(self, protocol):
        # MX<Name> is made at run time, so pickle (torch.save(model), copy.deepcopy) cannot find it
        # by name: rebuild it from the original class, which pickles by reference.
        return _new_mx_experts, (self._flykernels_base,), self.__dict__.copy()

    def extra_repr(self) -> str:
        base = super().extra_repr()
        mine = (f"format={self.format}, activations={self.activations}, weights={list(self.mx_weights)}, "
                f"transposed={self.mx_transposed}")
        return f"{base}, {mine}" if base else mine


def _new_mx_experts(base: type) -> "MXExperts":
    """An empty MX<base> (unpickling: its state follows through nn.Module.__setstate__)."""
    return MXExperts._subclass_for(base).__new__(MXExperts._subclass_for(base))


def _weight_property(name: str) -> property:
    def get(self):
        if name in self._parameters:  # a dense one (unquantized, or a probe's copy)
            return self._parameters[name]
        if name in self.__dict__.get("mx_weights", ()):
            return self._dense(name)
        # not ours: AttributeError makes Python fall back to nn.Module.__getattr__ (buffers, modules)
        raise AttributeError(name)
    return property(get, doc=f"The dense {name} (dequantized from {name}_qweight / {name}_scales when quantized).")


def _check_experts_k(mod: nn.Module, names: Iterable[str], transposed: bool, name: Optional[str]) -> None:
    for n in names:
        w = mod._parameters[n]
        k = w.shape[1] if transposed else w.shape[2]
        if k % _mx.BLOCK != 0:
            raise ValueError(f"flykernels.quantize_: expert weight '{name + '.' if name else ''}{n}' "
                             f"{tuple(w.shape)} has K = {k}, not a multiple of {_mx.BLOCK} (the MX block along K); "
                             "add it to skip= to keep it unquantized")


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
    "mx"), in place, and returns the model. Mixture-of-experts modules holding their experts as
    3-D parameters (transformers' fused experts: gate_up_proj / up_proj and down_proj [E, ...];
    see experts_layout) become MXExperts in place, their expert weights quantized to `format`;
    they run weight-only whatever `activations` says (no MX-activation grouped GEMM yet; a
    warning says so when activations="mx"). Layers whose qualified name matches a `skip` pattern
    (a name, a dotted suffix such as "lm_head" or "experts", or an fnmatch pattern) stay as they
    are; an expert weight is also skipped by its own name ("mlp.experts.down_proj", "down_proj"
    skips the Linear layers of that name too). A layer or expert weight whose K is not a multiple of
    32 is an error naming it (skip it). Experts whose layout is unclear (no is_transposed
    attribute and shapes that do not tell) stay as they are, with a warning. `model` itself an
    nn.Linear: the new MXLinear is returned (nothing to swap in place)."""
    _mx.check_format(format, "flykernels.quantize_")
    _mx.check_activations(activations, "flykernels.quantize_")
    if not isinstance(model, nn.Module):
        raise TypeError(f"flykernels.quantize_: expected an nn.Module, got {type(model).__name__}")
    patterns = [skip] if isinstance(skip, str) else list(skip or [])
    if type(model) is nn.Linear:
        return model if _matches("", patterns) else MXLinear.from_linear(model, format, activations)
    todo = []
    experts = {}  # id -> (module, its name, the weights to quantize)
    for name, mod in model.named_modules():
        if id(mod) not in experts and not _matches(name, patterns):
            layout = experts_layout(mod)
            if isinstance(layout, str):
                _loader.log.warning("flykernels.quantize_: experts '%s' (%s) left unquantized: %s", name,
                                    type(mod).__name__, layout)
            elif layout is not None:
                names = [n for n in layout[0] if not _matches(f"{name}.{n}" if name else n, patterns)]
                if names:
                    _check_experts_k(mod, names, layout[1], name)
                    experts[id(mod)] = (mod, name, names)
        for child_name, child in mod._modules.items():  # every name, also a module's second one
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and not _matches(full, patterns):
                if child.in_features % _mx.BLOCK != 0:
                    raise ValueError(f"flykernels.quantize_: layer '{full}' has in_features = {child.in_features}, "
                                     f"not a multiple of {_mx.BLOCK} (the MX block along K); add it to skip= to keep "
                                     "it unquantized")
                todo.append((mod, child_name, child, full))
    if experts and activations == "mx":
        _loader.log.warning("flykernels.quantize_: %d experts module(s) run weight-only (activations as they are): "
                            "MX activations for expert weights need the MX grouped GEMM, which does not exist yet",
                            len(experts))
    # quantize after the walk (and after every check passed): no half-swapped model on an error
    for mod, name, names in experts.values():
        MXExperts.quantize_module(mod, format, names, name=name)
    done = {}
    for parent, child_name, child, full in todo:
        if id(child) not in done:  # one Linear reachable under two names: one MXLinear
            done[id(child)] = MXLinear.from_linear(child, format, activations, name=full)
        setattr(parent, child_name, done[id(child)])
    return model
