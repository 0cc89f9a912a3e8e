# SPDX-License-Identifier: Apache-2.0
"""FlyKernels as a kernel repository of Hugging Face's `kernels` package (flykernels/hub,
flykernels.kernel_mapping / kernelize / unkernelize), on the CPU. The layers and the repository's
layout are checked everywhere; kernelize through `kernels` where that package is installed (it is
not in CI: kernels pulls sigstore, cryptography and a native kernels-data wheel), and on tiny real
Hugging Face models where transformers is installed too. The GPU side: test_gpu_hub.py."""
import importlib.util
import inspect
import json
import sys
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import flykernels
from flykernels import _hub, _patch
from flykernels.hub import layers

try:  # transformers 5.17 takes kernels 0.16.x only; flykernels needs 0.16 or later
    _hub._kernels()
    kernels_reason = ""
except ImportError as e:
    kernels_reason = str(e)
needs_kernels = pytest.mark.skipif(bool(kernels_reason), reason=f"`kernels` not usable here: {kernels_reason}")


class LlamaRMSNorm(nn.Module):  # Hugging Face's formula: FP32, the normalized value cast, then the weight
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dt = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dt)


class OtherRMSNorm(LlamaRMSNorm):  # a class the layer has no formula for: its own forward must run
    def forward(self, hidden_states):
        return super().forward(hidden_states) * 2 + 1


class GatedAct(nn.Module):  # the "SiluAndMul" contract
    def forward(self, x):
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


def _bind(layer_cls, mod):
    """What kernels.kernelize does to a module: the layer's forward, bound to it, on the instance."""
    mod.forward = types.MethodType(layer_cls.forward, mod)
    return mod


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _count(monkeypatch, obj, name):
    n = [0]
    real = getattr(obj, name)

    def counting(*a, **k):
        n[0] += 1
        return real(*a, **k)
    monkeypatch.setattr(obj, name, counting)
    return n


# ---- the layers, bound as kernelize binds them (no `kernels` needed) ------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_layer_computes_the_modules_forward(dtype, patch_on, monkeypatch):
    torch.manual_seed(0)
    mod = LlamaRMSNorm(64).to(dtype)
    with torch.no_grad():
        mod.weight.normal_(1.0, 0.3)
    x = torch.randn(3, 5, 64, dtype=dtype)
    ref = mod(x)
    _bind(layers.RMSNorm, mod)
    calls = _count(monkeypatch, _patch.F, "rms_norm")
    got = mod(x)
    assert calls[0] == 1  # the fused call ran
    assert _rel(got, ref) < _patch._CHECK_TOL[dtype]
    with flykernels.torch.disabled():  # the switch: the module's own forward, bit for bit
        assert torch.equal(mod(x), ref) and calls[0] == 1
    # an input the fused op would not match exactly (autocast: FP32 input, low-precision weight): own forward
    if dtype != torch.float32:
        calls[0] = 0
        assert torch.equal(mod(x.float()), LlamaRMSNorm.forward(mod, x.float())) and calls[0] == 0


def test_rms_norm_layer_leaves_unknown_classes_to_their_forward(patch_on, monkeypatch):
    mod = OtherRMSNorm(32)
    x = torch.randn(4, 32)
    ref = mod(x)
    _bind(layers.RMSNorm, mod)
    calls = _count(monkeypatch, _patch.F, "rms_norm")
    assert torch.equal(mod(x), ref) and calls[0] == 0


def test_rms_norm_layer_gradients_reach_the_weight(patch_on):
    torch.manual_seed(1)
    ref_mod, mod = LlamaRMSNorm(16).double(), LlamaRMSNorm(16).double()
    with torch.no_grad():
        ref_mod.weight.normal_()
        mod.weight.copy_(ref_mod.weight)
    _bind(layers.RMSNorm, mod)
    x = torch.randn(5, 16, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    ref_mod(x).square().sum().backward()
    mod(x2).square().sum().backward()
    assert torch.allclose(x2.grad, x.grad) and torch.allclose(mod.weight.grad, ref_mod.weight.grad)


@pytest.mark.parametrize("cls, act", [(layers.SiluAndMul, F.silu), (layers.GeluTanhAndMul, lambda t: F.gelu(t, approximate="tanh")),
                                      (layers.GeluAndMul, F.gelu)])
def test_and_mul_layers_compute_the_composition(cls, act, patch_on, monkeypatch):
    if not layers._HAVE_GLU:
        pytest.skip("flykernels::glu is not loaded")
    x = torch.randn(3, 7, 2 * 24, dtype=torch.float64, requires_grad=True)
    mod = _bind(cls, GatedAct())
    calls = _count(monkeypatch, _patch, "_glu")
    got = mod(x)
    assert calls[0] == 1
    ref = act(x[..., :24]) * x[..., 24:]
    assert torch.allclose(got, ref)  # the op's CPU path is this composition
    g_got, = torch.autograd.grad(got.sum(), x)
    g_ref, = torch.autograd.grad(ref.sum(), x)
    assert torch.allclose(g_got, g_ref)
    calls[0] = 0
    with flykernels.torch.disabled():  # the switch: the module's own forward
        assert torch.equal(mod(x), GatedAct.forward(mod, x)) and calls[0] == 0


def _rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., :x.shape[-1] // 2]), dim=-1)


def _llama_rope(q, k, cos, sin, unsqueeze_dim=1):  # transformers' apply_rotary_pos_emb (Llama)
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _wrapper_class(func, module):
    """A class as `kernels` makes of a decorated function: its forward calls the function (a
    closure variable), the function belongs to a modeling module."""
    func = types.FunctionType(func.__code__, func.__globals__, func.__name__, func.__defaults__, func.__closure__)
    func.__module__ = module

    class Func(nn.Module):
        def forward(self, *args, **kwargs):
            return func(*args, **kwargs)
    return Func


def test_rope_layer_finds_the_function_and_its_family(patch_on, monkeypatch):
    known = _wrapper_class(_llama_rope, "transformers.models.llama.modeling_llama")
    func, half = layers.rope_function(known)
    assert func.__module__ == "transformers.models.llama.modeling_llama" and half is False
    assert layers.rope_function(_wrapper_class(_llama_rope, "transformers.models.gpt_oss.modeling_gpt_oss"))[1] is True
    other = _wrapper_class(_llama_rope, "transformers.models.glm.modeling_glm")  # interleaved: not ours
    assert layers.rope_function(other)[1] is None
    q, k = torch.randn(2, 4, 6, 32), torch.randn(2, 2, 6, 32)
    ang = torch.randn(2, 6, 16)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    ref = _llama_rope(q, k, cos, sin)
    fused = _count(monkeypatch, _patch, "_rope_fused")
    for cls in (known, other):  # CPU tensors: the function itself, exactly
        got = _bind(layers.RotaryPosEmb, cls())(q, k, cos, sin)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]) and fused[0] == 0
    # where the op takes the call (CUDA tensors; here its CPU path stands in), the fused op, same values
    monkeypatch.setattr(_patch, "_rope_takes", lambda *a: True)
    if not layers._HAVE_ROPE:
        pytest.skip("flykernels::rope is not loaded")
    got = _bind(layers.RotaryPosEmb, known())(q, k, cos, sin)
    assert fused[0] == 1 and torch.allclose(got[0], ref[0], atol=1e-5) and torch.allclose(got[1], ref[1], atol=1e-5)
    assert _bind(layers.RotaryPosEmb, other())(q, k, cos, sin)[0].equal(ref[0]) and fused[0] == 1


# ---- the repository as `kernels` loads it --------------------------------------------------------
def test_repository_layout():
    meta = json.loads((_hub.REPO_PATH / "metadata.json").read_text())
    assert meta["name"] == "flykernels-hub" and meta["python-depends"] == [] and meta["backend"]["type"] == "cuda"
    assert {"id", "version", "license"} <= meta.keys()
    # kernels imports the folder's __init__.py under the metadata id; its `layers` is ours
    spec = importlib.util.spec_from_file_location(meta["id"], _hub.REPO_PATH / "__init__.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[meta["id"]] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[meta["id"]]
    assert mod.layers is layers
    for name, cls_name in _hub.LAYERS.items():
        assert hasattr(mod.layers, cls_name), name


@pytest.mark.parametrize("cls_name", sorted(set(_hub.LAYERS.values())))
def test_layer_classes_follow_kernels_rules(cls_name):
    """What kernels checks of a layer (kernels/layer/layer.py, _validate_layer): no constructor, no
    members beyond nn.Module's but can_torch_compile / has_backward, and a forward with the
    parameters of the forward it replaces."""
    cls = getattr(layers, cls_name)
    assert issubclass(cls, nn.Module) and cls.__init__ is nn.Module.__init__
    extra = {n for n, _ in inspect.getmembers(cls)} - {n for n, _ in inspect.getmembers(nn.Module)}
    assert extra == {"can_torch_compile", "has_backward"} and cls.can_torch_compile and cls.has_backward
    replaced = {"RMSNorm": LlamaRMSNorm.forward, "RotaryPosEmb": None}.get(cls_name, GatedAct.forward)
    params = list(inspect.signature(cls.forward).parameters.values())
    if replaced is None:  # kernels' wrapper of apply_rotary_pos_emb: self + the function's parameters
        ref = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        ref += list(inspect.signature(_llama_rope).parameters.values())
    else:
        ref = list(inspect.signature(replaced).parameters.values())
    assert [p.kind for p in params] == [p.kind for p in ref]


def test_kernel_config_mapping_names_the_repository():
    class Decorated(nn.Module):
        kernel_layer_name = "RMSNorm"

    model = nn.Sequential(Decorated(), nn.Linear(2, 2))
    assert _hub.kernel_config_mapping(model) == {"RMSNorm": {"cuda": f"{_hub.REPO_PATH}:RMSNorm"}}
    full = _hub.kernel_config_mapping()
    assert set(full) == set(_hub.LAYERS)
    assert full["rotary_pos_emb"]["cuda"].endswith(":RotaryPosEmb")
    with pytest.raises(ValueError, match="no layer for"):
        _hub.kernel_config_mapping(layers=["LayerNorm"])


def test_clear_errors_without_kernels_or_with_an_old_one(monkeypatch):
    monkeypatch.setitem(sys.modules, "kernels", None)  # import kernels -> ImportError
    with pytest.raises(ImportError, match="pip install 'kernels>=0.16'"):
        flykernels.kernel_mapping()
    with pytest.raises(ImportError, match="needs Hugging Face's `kernels`"):
        flykernels.kernelize(nn.Linear(2, 2))
    old = types.ModuleType("kernels")
    old.__version__ = "0.4.0"
    monkeypatch.setitem(sys.modules, "kernels", old)
    monkeypatch.setattr(_hub.importlib.metadata, "version", lambda name: "0.4.0")
    with pytest.raises(ImportError, match="kernels 0.4.0 is installed"):
        flykernels.kernel_mapping()


# ---- kernelize through `kernels` ------------------------------------------------------------------
def _decorated():
    """Stand-ins decorated as transformers decorates its classes, each call new classes (kernels
    memoizes per repository, the probe per class)."""
    import kernels

    @kernels.use_kernel_forward_from_hub("RMSNorm")
    class LlamaRMSNorm_(LlamaRMSNorm):
        pass
    LlamaRMSNorm_.__name__ = "LlamaRMSNorm"

    @kernels.use_kernel_forward_from_hub("RMSNorm")
    class OtherRMSNorm_(OtherRMSNorm):
        pass
    OtherRMSNorm_.__name__ = "OtherRMSNorm"

    @kernels.use_kernel_forward_from_hub("SiluAndMul")
    class SiluAndMul(GatedAct):
        pass

    class Block(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.norm = LlamaRMSNorm_(n)
            self.other = OtherRMSNorm_(n)
            self.up = nn.Linear(n, 2 * n)
            self.act = SiluAndMul()
            self.ln = nn.LayerNorm(n)

        def forward(self, x):
            return self.ln(self.act(self.up(self.norm(x))) + self.other(x))
    torch.manual_seed(0)
    m = Block(32)
    with torch.no_grad():
        m.norm.weight.normal_(1.0, 0.3)
    return m


@needs_kernels
def test_kernelize_swaps_only_what_it_knows_and_undoes(patch_on, monkeypatch):
    m = _decorated()
    x = torch.randn(4, 32)
    ref = m(x)
    report = flykernels.kernelize(m)
    assert report["kernelized"] == {"LlamaRMSNorm": 1, "SiluAndMul": 1}
    assert "OtherRMSNorm" in report["skipped"]  # no formula for it: left as it is
    assert m.norm.forward.__func__ is layers.RMSNorm.forward and m.act.forward.__func__ is layers.SiluAndMul.forward
    assert "forward" not in m.other.__dict__ and "forward" not in m.ln.__dict__ and "forward" not in m.up.__dict__
    norms, glus = _count(monkeypatch, _patch.F, "rms_norm"), _count(monkeypatch, _patch, "_glu")
    got = m(x)
    assert norms[0] == 1 and glus[0] == 1
    assert _rel(got, ref) < 1e-5
    assert flykernels.kernelize(m)["kernelized"] == {}  # again: nothing more
    assert flykernels.unkernelize(m) == 2
    assert all("forward" not in mod.__dict__ for mod in m.modules())
    assert torch.equal(m(x), ref)


@needs_kernels
def test_kernelize_leaves_a_model_without_decorated_layers_untouched():
    m = nn.Sequential(LlamaRMSNorm(8), nn.Linear(8, 8), nn.SiLU())  # undecorated classes
    assert flykernels.kernelize(m) == {"kernelized": {}, "skipped": {}}
    assert all("forward" not in mod.__dict__ for mod in m.modules())
    assert flykernels.unkernelize(m) == 0


@needs_kernels
def test_kernelize_refuses_a_class_that_disagrees_and_a_patched_module(patch_on):
    m = _decorated()
    type(m.norm).forward = lambda self, hidden_states: LlamaRMSNorm.forward(self, hidden_states) * 2  # changed meaning
    report = flykernels.kernelize(m)
    assert "disagrees" in report["skipped"]["LlamaRMSNorm"] and "forward" not in m.norm.__dict__
    m2 = _decorated()
    flykernels.patch(m2)
    try:
        report = flykernels.kernelize(m2)
        assert "replaced already" in report["skipped"]["LlamaRMSNorm"]
    finally:
        flykernels.unpatch(m2)


@needs_kernels
def test_kernels_own_kernelize_with_our_mapping(patch_on):
    import kernels
    m = _decorated()
    x = torch.randn(4, 32)
    ref = m(x)
    with kernels.use_kernel_mapping(flykernels.kernel_mapping()):
        kernels.kernelize(m, mode=kernels.Mode.INFERENCE, device="cpu")
    # kernels' mapping alone: every module of a mapped name runs our layer, which falls back by itself
    assert m.other.forward.__func__ is layers.RMSNorm.forward
    assert torch.equal(m.other(x), OtherRMSNorm.forward(m.other, x))
    assert _rel(m(x), ref) < 1e-5
    assert flykernels.unkernelize(m) == 3 and torch.equal(m(x), ref)


# ---- tiny real Hugging Face models ----------------------------------------------------------------
HF = {"LlamaConfig": {}, "Qwen3Config": {}}


def _hf_model(cfg_name):
    transformers = pytest.importorskip("transformers")
    cfg = getattr(transformers, cfg_name)(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, vocab_size=97, head_dim=16, **HF[cfg_name])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:  # fresh norms are all ones: a dropped weight would go unnoticed
                p.normal_(1.0, 0.3)
    if not hasattr(type(model.model.norm), "kernel_layer_name"):
        pytest.skip(f"transformers {transformers.__version__} does not decorate its layers with this kernels release")
    return model


@needs_kernels
@pytest.mark.parametrize("cfg_name", list(HF))
def test_hf_model_kernelized_matches_stock(cfg_name, patch_on, monkeypatch):
    model = _hf_model(cfg_name)
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    report = flykernels.kernelize(model)
    try:
        assert report["skipped"] == {}
        norms = sum(1 for m in model.modules() if type(m).__name__.endswith("RMSNorm"))
        assert sum(c for k, c in report["kernelized"].items() if k.endswith("RMSNorm")) == norms > 0
        assert any(k.startswith("rotary_pos_emb") for k in report["kernelized"])
        calls = _count(monkeypatch, _patch.F, "rms_norm")
        with torch.no_grad():
            got = model(input_ids=ids).logits
            assert calls[0] == norms
            assert _rel(got, ref) < 1e-5
            torch._dynamo.reset()
            calls[0] = 0
            compiled = torch.compile(model, backend="eager")  # what Dynamo traces: our layers
            assert _rel(compiled(input_ids=ids).logits, ref) < 1e-5
            assert calls[0] == norms
    finally:
        torch._dynamo.reset()
        assert flykernels.unkernelize(model) == sum(report["kernelized"].values())
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)
