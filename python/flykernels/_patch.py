# SPDX-License-Identifier: Apache-2.0
"""flykernels.patch(model): the unfused pieces of Hugging Face transformer blocks onto fused
kernels, in place, undoable.

    import flykernels
    flykernels.patch(model)        # every module it knows, in this model; returns a report
    flykernels.unpatch(model)      # the model's own forwards again
    with flykernels.patched(model): ...

What it replaces today: the RMSNorm modules of the Llama, Mistral, Mixtral, Qwen2, Qwen3,
Qwen3-MoE, gpt-oss, Gemma-2 and Gemma-3 families (their forward is six to eight separate
elementwise and reduction ops in FP32; patched, it is one F.rms_norm call: our kernel where the
decision rows say it is faster, PyTorch's fused kernel otherwise).

How: the module's `forward` becomes an instance attribute (the class is untouched, so other
models are not affected) that calls the fused op while the "patch" family is active
(flykernels.torch.disabled() turns it off like every family, so one switch compares patched and
stock in one process) and the module's own forward otherwise, or where an input is outside what
the fused op matches exactly (a weight of another dtype than the input). Before a class is patched
the first time, its own forward and the fused one run on a small random input on the module's
device and must agree to within the input dtype's rounding, so a transformers release that
changes a module's meaning is left alone, with a message, rather than computed differently.
Works under torch.compile (F.rms_norm is traceable) and CUDA graphs (no host synchronization).
"""
import copy
import logging
import types
import weakref

import torch
import torch.nn.functional as F

from . import _ops

_log = logging.getLogger("flykernels")

# Hugging Face RMSNorm classes by flavour: "scale" computes w * norm(x) (Llama's cast of the
# normalized value before the weight product, or gpt-oss's product in FP32: the same to within
# one rounding); "offset" computes norm(x) * (1 + w) in FP32 (Gemma's zero-centred weight).
RMS_NORM_CLASSES = {
    "LlamaRMSNorm": "scale",
    "MistralRMSNorm": "scale",
    "MixtralRMSNorm": "scale",
    "Qwen2RMSNorm": "scale",
    "Qwen3RMSNorm": "scale",
    "Qwen3MoeRMSNorm": "scale",
    "GptOssRMSNorm": "scale",
    "Gemma2RMSNorm": "offset",
    "Gemma3RMSNorm": "offset",
}

# Agreement the self-check asks (relative L2 over the probe input): two roundings to the input
# dtype apart at most.
_CHECK_TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


_family = _ops.REGISTRY["patch"]
# the modules patch() replaced the forward of (each had its class's forward before)
_patched = weakref.WeakKeyDictionary()
_checked = {}  # (class, flavour, dtype, device type) -> '' (agrees) or why not


def _eps(mod):
    eps = getattr(mod, "variance_epsilon", getattr(mod, "eps", None))
    return float(eps) if isinstance(eps, (int, float)) else None


def _rms_fused(mod, flavour, x):
    w = mod.weight
    if flavour == "offset":
        w = w + 1  # zero-centred weight: autograd reaches mod.weight through it
    return F.rms_norm(x, (x.shape[-1],), w, _eps(mod))


def _rms_forward(flavour):
    def forward(self, hidden_states, *args, **kwargs):
        own = type(self).forward
        if (not _family.on or args or kwargs or not isinstance(hidden_states, torch.Tensor)
                or hidden_states.dtype != self.weight.dtype or hidden_states.shape[-1] != self.weight.shape[0]):
            return own(self, hidden_states, *args, **kwargs)
        return _rms_fused(self, flavour, hidden_states)
    forward.__flykernels_patch__ = flavour
    return forward


def _self_check(mod, flavour):
    """'' when the module's own forward and the fused one agree on a probe input, else why not."""
    w = mod.weight
    key = (type(mod), flavour, w.dtype, w.device.type)
    if key in _checked:
        return _checked[key]
    if w.device.type == "meta" or w.dtype not in _CHECK_TOL:
        return f"weight on {w.device.type} in {w.dtype}: cannot check"
    n = w.shape[0]
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(4, n, generator=gen).to(device=w.device, dtype=w.dtype)
    # The probe: a shallow copy of the module with its weight perturbed (a fresh model's weight is
    # all ones or zeros and would not tell a dropped or mis-offset weight apart); the module itself
    # is not touched.
    probe = copy.copy(mod)
    probe._parameters = dict(mod._parameters)
    probe._parameters["weight"] = torch.nn.Parameter(
        w.detach() + 0.25 * torch.randn(n, generator=gen).to(device=w.device, dtype=w.dtype), requires_grad=False)
    with torch.no_grad():
        try:
            ref = type(mod).forward(probe, x).float()
            got = _rms_fused(probe, flavour, x).float()
        except Exception as e:  # noqa: BLE001  (any failure means: leave this class alone)
            why = f"probe failed: {type(e).__name__}: {e}"
        else:
            err = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
            why = "" if err <= _CHECK_TOL[w.dtype] else f"its forward disagrees with the fused op (rel. L2 {err:.2e})"
    _checked[key] = why
    return why


def patch(model, *, rms_norm=True, check=True):
    """Patches the modules of `model` (an nn.Module: a whole model or one block) that FlyKernels
    knows, in place; returns {"patched": {class: count}, "skipped": {class: reason}}. Patching a
    patched module again does nothing. `check=False` skips the probe of each class (see above)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"flykernels.patch: model must be a torch.nn.Module, not {type(model).__name__}")
    report = {"patched": {}, "skipped": {}}
    if not rms_norm:
        return report
    for mod in model.modules():
        cls = type(mod).__name__
        flavour = RMS_NORM_CLASSES.get(cls)
        if flavour is None or mod in _patched:
            continue
        w = getattr(mod, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 1 or _eps(mod) is None:
            report["skipped"][cls] = "no 1-D weight or no eps attribute (not the layout this patch knows)"
            continue
        why = ("its forward is wrapped already (an instance-level forward, e.g. a device-placement hook), "
               "which the fused op would bypass") if "forward" in mod.__dict__ else ""
        if not why and check:
            why = _self_check(mod, flavour)
        if why:
            report["skipped"][cls] = why
            continue
        _patched[mod] = True
        mod.forward = types.MethodType(_rms_forward(flavour), mod)
        report["patched"][cls] = report["patched"].get(cls, 0) + 1
    for cls, why in report["skipped"].items():
        _log.warning("flykernels.patch: %s left as it is: %s", cls, why)
    if report["patched"]:
        _log.info("flykernels.patch: %s", ", ".join(f"{n} x{c}" for c, n in report["patched"].items()))
    return report


def unpatch(model):
    """Restores the forwards patch() replaced in `model`; returns how many modules it restored."""
    n = 0
    for mod in model.modules():
        if mod not in _patched:
            continue
        del _patched[mod]
        mod.__dict__.pop("forward", None)
        n += 1
    return n


def is_patched(module):
    """Whether patch() replaced this module's forward."""
    return module in _patched


class patched:
    """with flykernels.patched(model): ... patches on entry and restores on exit (only what this
    entry patched)."""

    def __init__(self, model, **kw):
        self.model, self.kw, self.report, self._mods = model, kw, None, []

    def __enter__(self):
        before = {m for m in self.model.modules() if m in _patched}
        self.report = patch(self.model, **self.kw)
        self._mods = [m for m in self.model.modules() if m in _patched and m not in before]
        return self.report

    def __exit__(self, *exc):
        for m in self._mods:
            unpatch(m)
        return False
