# SPDX-License-Identifier: Apache-2.0
"""FlyKernels through Hugging Face's `kernels` package (transformers' own kernel integration).

transformers 5.x decorates layer classes with `@use_kernel_forward_from_hub(<name>)` ("RMSNorm"
on about 130 RMSNorm classes, "rotary_pos_emb" on each model's apply_rotary_pos_emb, ...), and
`kernels.kernelize(model, mode=...)` gives each such module the forward of the layer a mapping
names for <name>, device type and mode. flykernels/hub/ is a local kernel repository (no download)
whose layers call FlyKernels' fused ops (flykernels/hub/layers.py):

    import flykernels
    report = flykernels.kernelize(model)   # our layers only: {"kernelized": {...}, "skipped": {...}}
    flykernels.unkernelize(model)          # the modules' own forwards again

    # or through kernels / transformers directly:
    with kernels.use_kernel_mapping(flykernels.kernel_mapping()):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE)
    model.set_use_kernels(True, KernelConfig(kernel_mapping=flykernels.kernel_config_mapping(model),
                                             use_local_kernel=True))

flykernels.kernelize runs the same per-class self-check as flykernels.patch() before it kernelizes
a module; the mapping alone trusts the layers' class tables (checked against transformers 5.17 by
the tests).
"""
import importlib.metadata
import logging
import pathlib

import torch

from . import _patch

_log = logging.getLogger("flykernels")

REPO_PATH = pathlib.Path(__file__).resolve().parent / "hub"

# Layer name (what transformers / a model decorates with) -> class in flykernels/hub/layers.py
LAYERS = {
    "RMSNorm": "RMSNorm",
    "rotary_pos_emb": "RotaryPosEmb",
    "SiluAndMul": "SiluAndMul",
    "GeluTanhAndMul": "GeluTanhAndMul",
    "GeluAndMul": "GeluAndMul",
}
# The kernels release whose API this is written against (LocalLayerRepository(repo_path, *,
# layer_name), Device / CUDAProperties, use_kernel_mapping(inherit_mapping=)); transformers 5.17
# takes 0.16.x only (KERNELS_MIN_VERSION / KERNELS_MAX_VERSION in its import_utils).
MIN_KERNELS = (0, 16)
# Hopper only: on another card the mapping has no entry and kernels keeps the module's own forward
# (a broader mapping registered beside ours still applies there: kernels takes the smallest
# capability range that holds the device).
HOPPER = (90, 90)


def _layers():
    """flykernels/hub/layers.py, imported on first use: it imports torch._dynamo (a compiler-disabled
    helper), which `import flykernels` must not (test_cpu.py checks that Inductor stays unimported)."""
    from .hub import layers
    return layers


def _version_tuple(v):
    out = []
    for part in v.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def _kernels():
    """The `kernels` package, or an ImportError that says what to install."""
    try:
        import kernels
    except ImportError as e:
        raise ImportError("flykernels' kernel mapping needs Hugging Face's `kernels` package "
                          "(pip install 'kernels>=0.16'; transformers 5.17 takes kernels 0.16.x)") from e
    try:
        version = importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(kernels, "__version__", "0")
    missing = [n for n in ("LocalLayerRepository", "Device", "CUDAProperties", "Mode", "use_kernel_mapping", "kernelize")
               if not hasattr(kernels, n)]
    if _version_tuple(version) < MIN_KERNELS or missing:
        raise ImportError(f"flykernels' kernel mapping needs kernels >= {'.'.join(map(str, MIN_KERNELS))}; "
                          f"kernels {version} is installed" + (f" (it has no {', '.join(missing)})" if missing else "")
                          + ": pip install 'kernels>=0.16'")
    return kernels


def _names(layers):
    names = tuple(LAYERS) if layers is None else tuple(layers)
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        raise ValueError(f"flykernels has no layer for {unknown}; it maps {sorted(LAYERS)}")
    return names


def kernel_mapping(layers=None):
    """The mapping for kernels.use_kernel_mapping / register_kernel_mapping: each layer name of
    LAYERS (or of `layers`) -> {Hopper CUDA device: our layer, "cpu": our layer} as a
    kernels.LocalLayerRepository of flykernels/hub, for every mode (kernels' Mode.FALLBACK: the
    layers are differentiable and traceable). On the CPU each layer runs the module's own forward
    (our kernels are Hopper's), so a model kernelized there computes what it did, and runs ours once
    moved to a Hopper GPU."""
    k = _kernels()
    hopper = k.Device(type="cuda", properties=k.CUDAProperties(min_capability=HOPPER[0], max_capability=HOPPER[1]))
    out = {}
    for name in _names(layers):
        repo = k.LocalLayerRepository(repo_path=REPO_PATH, layer_name=LAYERS[name])
        out[name] = {hopper: repo, "cpu": repo}
    return out


def kernel_config_mapping(model=None, layers=None, device="cuda"):
    """The mapping for transformers' KernelConfig(kernel_mapping=..., use_local_kernel=True):
    {name: {device: "<flykernels/hub>:<layer>"}} for the names of `layers` (default: all) that
    `model` registers, when a model is given (KernelConfig refuses a name its model does not
    have). transformers validates it and builds kernels.LocalLayerRepository objects from it."""
    names = _names(layers)
    if model is not None:
        present = set(_decorated_names(model))
        names = tuple(n for n in names if n in present)
    return {n: {device: f"{REPO_PATH}:{LAYERS[n]}"} for n in names}


def _decorated_names(model):
    for mod in model.modules():
        name = getattr(type(mod), "kernel_layer_name", None)
        if name is not None:
            yield name
        for f in getattr(mod, "_kernel_funcs", {}).values():
            name = getattr(type(f), "kernel_layer_name", None)
            if name is not None:
                yield name


def _targets(model):
    """(module kernelize would change, its display name, the model module holding it) for every
    module or kernels function wrapper whose layer name we map, each once (kernels 0.16 shares one
    wrapper per modeling module among all attention modules)."""
    seen = set()
    for mod in model.modules():
        cands = [(mod, type(mod).__name__)]
        cands += [(f, f"{n} ({type(mod).__name__})") for n, f in getattr(mod, "_kernel_funcs", {}).items()]
        for t, label in cands:
            if id(t) in seen or getattr(type(t), "kernel_layer_name", None) not in LAYERS:
                continue
            seen.add(id(t))
            yield t, label, mod


def _ours(fw):
    layers = _layers()
    return getattr(fw, "__func__", None) in {getattr(layers, c).forward for c in LAYERS.values()}


def _model_param(model):
    return next((p for p in model.parameters() if p.device.type != "meta"), None)


def _rms_why(mod, check):
    flavour = _patch.RMS_NORM_CLASSES.get(type(mod).__name__)
    if flavour is None:
        return "not a class whose formula the layer knows (flykernels._patch.RMS_NORM_CLASSES)"
    w = getattr(mod, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or _patch._eps(mod) is None:
        return "no 1-D weight or no eps attribute (not the layout the layer knows)"
    return _patch._rms_check(mod, flavour) if check else ""


def _rope_why(wrapper, owner, check):
    func, half = _layers().rope_function(type(wrapper))
    if func is None:
        return "this kernels release keeps the decorated function where the layer cannot find it"
    if half is None:
        return f"apply_rotary_pos_emb of {func.__module__}: not a composition flykernels::rope computes"
    p = _model_param(owner)
    if not check:
        return ""
    if p is None:
        return "no parameters, or on the meta device: cannot check"
    gen = torch.Generator(device="cpu").manual_seed(0)

    def run():  # the function against the fused op on a small random input, the table width it takes
        D = 64
        q = torch.randn(2, 3, 5, D, generator=gen).to(device=p.device, dtype=p.dtype)
        k = torch.randn(2, 1, 5, D, generator=gen).to(device=p.device, dtype=p.dtype)
        ang = (torch.randn(2, 5, D // 2, generator=gen) * 3).to(p.device)
        t = ang if half else torch.cat((ang, ang), dim=-1)
        cos, sin = t.cos().to(p.dtype), t.sin().to(p.dtype)
        ref, got = func(q, k, cos, sin), _patch._rope_fused(q, k, cos, sin, 1)
        return torch.cat([ref[0].flatten(), ref[1].flatten()]), torch.cat([got[0].flatten(), got[1].flatten()])
    return _patch._probe((func, "hub rope", p.dtype, p.device.type), p.dtype, run)


def _and_mul_why(mod, model, check):
    if not check:
        return ""
    p = _model_param(model)
    device = p.device if p is not None else torch.device("cpu")
    dtype = p.dtype if p is not None and p.is_floating_point() else torch.float32
    act = {"SiluAndMul": 0, "GeluTanhAndMul": 1, "GeluAndMul": 2}[type(mod).kernel_layer_name]
    gen = torch.Generator(device="cpu").manual_seed(0)

    def run():
        x = torch.randn(4, 64, generator=gen).to(device=device, dtype=dtype)
        return type(mod).forward(mod, x), _patch._gate_fused(act, x)
    return _patch._probe((type(mod), "hub and-mul", act, dtype, device.type), dtype, run)


def _replaced(t):
    """Whether t's forward is an instance attribute other than ours or its class's own (kernels 0.16
    sets the class's own there where it falls back)."""
    fw = t.__dict__.get("forward")
    return fw is not None and not _ours(fw) and getattr(fw, "__func__", None) is not type(t).forward


def _why_not(t, owner, model, check):
    if t in _patch._patched or _replaced(t):
        return ("its forward is replaced already (flykernels.patch(), another kernel mapping or a hook): "
                "unpatch / unkernelize it first")
    name = type(t).kernel_layer_name
    if name == "RMSNorm":
        return _rms_why(t, check)
    if name == "rotary_pos_emb":
        if not _layers()._HAVE_ROPE:
            return "flykernels::rope is not loaded"
        return _rope_why(t, owner, check)
    if not _layers()._HAVE_GLU:
        return "flykernels::glu is not loaded"
    return _and_mul_why(t, model, check)


def kernelize(model, *, mode=None, device=None, check=True):
    """Gives the modules of `model` that transformers (or the model's own code) decorated with a
    layer name FlyKernels maps (LAYERS) our layer's forward, through kernels.kernelize and
    kernel_mapping(), and touches no other module (other decorated layers keep whatever forward they
    have: no hub download). Before a class's first module, its own forward and the fused op run on a
    small random input and must agree (as flykernels.patch() checks; `check=False` skips it); a
    class that disagrees, or whose formula the layers do not know, is left alone and named in
    report["skipped"]. mode: a kernels.Mode (default TRAINING or INFERENCE as model.training);
    device: the device the model runs on (default: its parameters'). Returns {"kernelized": {class:
    count}, "skipped": {class: reason}}; flykernels.unkernelize(model) undoes it."""
    k = _kernels()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"flykernels.kernelize: model must be a torch.nn.Module, not {type(model).__name__}")
    if mode is None:
        mode = k.Mode.TRAINING if model.training else k.Mode.INFERENCE
    if device is None:
        p = _model_param(model)
        if p is None:
            raise ValueError("flykernels.kernelize: the model has no parameters off the meta device; pass device=")
        device = p.device
    device = torch.device(device)
    report = {"kernelized": {}, "skipped": {}}
    todo = []
    for t, label, owner in _targets(model):
        if "forward" in t.__dict__ and _ours(t.__dict__["forward"]):
            continue  # kernelized by us already
        why = _why_not(t, owner, model, check)
        if why:
            report["skipped"][label] = why
        else:
            todo.append((t, label))
    with k.use_kernel_mapping(kernel_mapping(), inherit_mapping=False):
        for t, label in todo:
            k.kernelize(t, mode=mode, device=device)
            if _ours(t.__dict__.get("forward")):
                report["kernelized"][label] = report["kernelized"].get(label, 0) + 1
            else:  # kernels' fallback: another card, a mode the layer declines
                t.__dict__.pop("forward", None)
                report["skipped"][label] = (f"kernels kept its own forward (no mapping for {device.type} on this "
                                            f"device, or mode {mode})")
    for label, why in report["skipped"].items():
        _log.warning("flykernels.kernelize: %s left as it is: %s", label, why)
    if report["kernelized"]:
        _log.info("flykernels.kernelize: %s", ", ".join(f"{n} x{c}" for n, c in report["kernelized"].items()))
    return report


def unkernelize(model):
    """Gives every module of `model` that runs one of our layers (kernelized by flykernels.kernelize,
    kernels.kernelize with our mapping, or transformers' use_kernels with it) its own forward back;
    returns how many. Modules kernelized with other repositories keep theirs. A model transformers
    kernelized is marked as no longer using kernels, or its next train() / eval() would kernelize it
    again. Note: with kernels 0.16 a decorated function's wrapper (rotary_pos_emb) is one object per
    modeling module, shared by every model of that family in the process, as is its restoration."""
    n = 0
    seen = set()
    for mod in model.modules():
        for t in [mod, *getattr(mod, "_kernel_funcs", {}).values()]:
            if id(t) in seen:
                continue
            seen.add(id(t))
            if _ours(t.__dict__.get("forward")):
                del t.__dict__["forward"]
                t.__dict__.pop("_kernel_repo", None)  # kernels 0.19 records the repository beside it
                n += 1
    if getattr(model, "_use_kernels", False):
        model._use_kernels = False  # transformers: train() / eval() re-kernelize a model while it is set
    return n
