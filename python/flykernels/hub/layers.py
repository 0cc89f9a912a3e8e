# SPDX-License-Identifier: Apache-2.0
"""The layers of FlyKernels' kernel repository (see __init__.py).

`kernels.kernelize` gives a module whose class is decorated `@use_kernel_forward_from_hub(<name>)`
the forward of the layer mapped to <name>, bound to that module: `self` below is the Hugging Face
module (its weight, its eps), never an instance of these classes. kernels accepts a layer class
only without a constructor, without members beyond `forward`, `can_torch_compile` and
`has_backward`, and with a forward of as many parameters, of the same kinds, as the module's own;
so what they share are module-level functions here and in flykernels._patch.

Each forward runs the fused op only where it computes what the module's own forward computes
(the same formulas flykernels.patch() puts in, within the same tolerance), and the module's own
forward everywhere else: a class whose formula is not known here, an input the fused op does not
take exactly, or while the controller's "patch" family is off (flykernels.torch.disabled(), or a
machine where FlyKernels does not run: then a kernelized model computes exactly what it did).
kernelize put the replacement on the instance, so type(self).forward is still the module's own.
"""
import inspect

import torch
import torch.nn as nn

from .. import _loader, _patch

# The op library may be absent (an extension that did not load): the layers then run the
# module's own forward. Decided once, at import, so the forwards read a constant.
_HAVE_GLU = _loader.ext is not None and hasattr(torch.ops.flykernels, "glu")
_HAVE_ROPE = _loader.ext is not None and hasattr(torch.ops.flykernels, "rope")


def _rms_takes(mod, flavour, x):
    """Whether F.rms_norm over mod's weight computes what mod's forward computes for x."""
    w = getattr(mod, "weight", None)
    return (flavour is not None and _patch._family.on and isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)
            and w.dim() == 1 and x.dtype == w.dtype and x.shape[-1] == w.shape[0] and _patch._eps(mod) is not None)


class RMSNorm(nn.Module):
    """For "RMSNorm": the RMSNorm classes flykernels.patch() knows (_patch.RMS_NORM_CLASSES: Llama,
    Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE, gpt-oss; Gemma's zero-centred weight) become one
    F.rms_norm call (our kernel where the decision rows say it is faster, PyTorch's fused kernel
    otherwise): one rounding to the input dtype where the class rounds the normalized value and then
    the weight product. transformers decorates about 130 classes with this name; the others keep
    their own forward."""
    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        flavour = _patch.RMS_NORM_CLASSES.get(type(self).__name__)
        if not _rms_takes(self, flavour, hidden_states):
            return type(self).forward(self, hidden_states)
        return _patch._rms_fused(self, flavour, hidden_states)


def _and_mul(mod, x, act):
    """act(first half) * second half of x's last dimension through flykernels::glu (it reads the
    two halves in place), or mod's own forward."""
    if not (_HAVE_GLU and _patch._family.on and isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[-1] % 2 == 0):
        return type(mod).forward(mod, x)
    return _patch._gate_fused(act, x)


class SiluAndMul(nn.Module):
    """For "SiluAndMul" (the name's contract, as in kernels-community/activation: with d half the
    last dimension, silu(x[..., :d]) * x[..., d:]): flykernels::glu, SwiGLU, forward and backward
    fused. No transformers 5.17 class carries this name; models of other libraries and users' own
    modules do."""
    can_torch_compile = True
    has_backward = True

    def forward(self, x):
        return _and_mul(self, x, 0)


class GeluTanhAndMul(nn.Module):
    """For "GeluTanhAndMul": gelu(x[..., :d], approximate="tanh") * x[..., d:] (GeGLU, Gemma's
    activation) through flykernels::glu."""
    can_torch_compile = True
    has_backward = True

    def forward(self, x):
        return _and_mul(self, x, 1)


class GeluAndMul(nn.Module):
    """For "GeluAndMul": gelu(x[..., :d]) * x[..., d:] (exact GELU) through flykernels::glu."""
    can_torch_compile = True
    has_backward = True

    def forward(self, x):
        return _and_mul(self, x, 2)


# The modeling modules whose apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) is the rotate-half
# composition flykernels::rope computes (the attention classes of _patch.ROPE_ATTENTION_CLASSES),
# with whether their tables hold one angle per pair (W = D / 2) rather than cat(freqs, freqs).
ROPE_MODULES = {f"transformers.models.{m}.modeling_{m}": m == "gpt_oss"
                for m in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3", "gpt_oss")}
_rope_of = {}  # the kernels wrapper class of a decorated function -> (that function, half or None)


@torch.compiler.disable  # inspects a closure, once per class; Dynamo need not trace it
def _rope_resolve(cls):
    # `kernels` turns a decorated function into an nn.Module class whose forward calls it (a
    # closure variable `func`, in kernels 0.16 as in 0.19); the module it comes from says whether
    # it is the composition flykernels::rope computes.
    try:
        func = inspect.getclosurevars(cls.forward).nonlocals.get("func")
    except TypeError:
        func = None
    if not callable(func):
        func = None
    half = ROPE_MODULES.get(getattr(func, "__module__", None)) if func is not None else None
    _rope_of[cls] = (func, half)
    return func, half


def rope_function(cls):
    """(the function a kernels wrapper class calls, or None; True / False: one angle per pair or
    cat(freqs, freqs) where it is a function flykernels::rope computes, else None)."""
    hit = _rope_of.get(cls)
    return hit if hit is not None else _rope_resolve(cls)


class RotaryPosEmb(nn.Module):
    """For "rotary_pos_emb" (transformers decorates each model's apply_rotary_pos_emb with it): in
    the modeling modules of ROPE_MODULES, q and k rotated by one flykernels::rope call, forward and
    backward; the function itself elsewhere, and for inputs the op does not take exactly (CPU
    tensors, partial rotary tables, other dtypes)."""
    can_torch_compile = True
    has_backward = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        func, half = rope_function(type(self))
        if (half is None or not _HAVE_ROPE or not _patch._family.on
                or not _patch._rope_takes(q, k, cos, sin, unsqueeze_dim, half)):
            if func is None:  # a kernels release whose wrapper keeps the function elsewhere
                return type(self).forward(self, q, k, cos, sin, unsqueeze_dim)
            return func(q, k, cos, sin, unsqueeze_dim)
        return _patch._rope_fused(q, k, cos, sin, unsqueeze_dim)
