# SPDX-License-Identifier: Apache-2.0
"""flykernels.patch(model): the CPU-side logic (which modules, the self-check, the switch, undo,
autograd, tracing) on stand-in modules written like Hugging Face's; the patched Hugging Face
models themselves are checked in test_gpu_patch.py."""
import logging

import pytest
import torch
import torch.nn as nn

import flykernels
from flykernels import _patch


class LlamaRMSNorm(nn.Module):  # Hugging Face's formula: the normalized value cast, then the weight
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dt = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dt)


class Gemma3RMSNorm(nn.Module):  # zero-centred weight, FP32 throughout
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(n))

    def forward(self, x):
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class Qwen3RMSNorm(LlamaRMSNorm):  # a release that changed the meaning: the patch must refuse it
    def forward(self, hidden_states):
        return super().forward(hidden_states) * 2


class Block(nn.Module):
    def __init__(self, n, dtype):
        super().__init__()
        self.norm = LlamaRMSNorm(n).to(dtype)
        self.q_norm = Gemma3RMSNorm(n).to(dtype)
        self.proj = nn.Linear(n, n, dtype=dtype)
        self.other = nn.LayerNorm(n, dtype=dtype)

    def forward(self, x):
        return self.q_norm(self.proj(self.norm(x))) + self.other(x)


@pytest.fixture
def patch_on():
    before = flykernels.torch.active()
    flykernels.torch.enable(["patch"])
    yield
    flykernels.torch.disable(["patch"])
    flykernels.torch.enable(before)


def _calls(monkeypatch):
    """Counts F.rms_norm calls made by the patched forwards."""
    n = [0]
    real = _patch.F.rms_norm

    def counting(*a, **k):
        n[0] += 1
        return real(*a, **k)
    monkeypatch.setattr(_patch.F, "rms_norm", counting)
    return n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patch_matches_and_undoes(dtype, patch_on, monkeypatch):
    torch.manual_seed(0)
    m = Block(64, dtype)
    with torch.no_grad():
        m.norm.weight.normal_()
        m.q_norm.weight.normal_()
    x = torch.randn(3, 5, 64, dtype=dtype)
    ref = m(x)
    report = flykernels.patch(m)
    assert report == {"patched": {"LlamaRMSNorm": 1, "Gemma3RMSNorm": 1}, "skipped": {}}
    assert _patch.is_patched(m.norm) and _patch.is_patched(m.q_norm) and not _patch.is_patched(m.other)
    assert "forward" not in type(m.norm).__dict__ or type(m.norm).forward is LlamaRMSNorm.forward  # class untouched
    calls = _calls(monkeypatch)
    got = m(x)
    assert calls[0] == 2
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    assert ((got.float() - ref.float()).norm() / ref.float().norm()).item() < tol
    assert flykernels.patch(m)["patched"] == {}  # patching again does nothing
    with flykernels.torch.disabled():  # the controller's switch: the module's own forward
        calls[0] = 0
        assert torch.equal(m(x), ref)
        assert calls[0] == 0
    assert flykernels.unpatch(m) == 2
    assert not _patch.is_patched(m.norm) and "forward" not in m.norm.__dict__
    calls[0] = 0
    assert torch.equal(m(x), ref) and calls[0] == 0


def test_gradients_reach_the_weights(patch_on):
    torch.manual_seed(1)
    m = Block(32, torch.float64)
    with torch.no_grad():
        m.norm.weight.normal_()
        m.q_norm.weight.normal_()
    x = torch.randn(4, 32, dtype=torch.float64, requires_grad=True)

    def grads():
        for p in m.parameters():
            p.grad = None
        x.grad = None
        m(x).square().sum().backward()
        return [x.grad.clone()] + [p.grad.clone() for p in (m.norm.weight, m.q_norm.weight)]
    ref = grads()
    with flykernels.patched(m) as report:
        assert report["patched"] == {}  # float64 is not a dtype the self-check covers
    m = m.float()
    x = x.detach().float().requires_grad_()
    ref = grads()
    with flykernels.patched(m) as report:
        assert sum(report["patched"].values()) == 2
        got = grads()
    assert not _patch.is_patched(m.norm)  # the context restored what it patched
    for g, r in zip(got, ref):
        assert torch.allclose(g, r, rtol=1e-4, atol=1e-5)


def test_self_check_refuses_a_changed_module(patch_on, caplog):
    m = nn.Sequential(Qwen3RMSNorm(16), LlamaRMSNorm(16))
    with caplog.at_level(logging.WARNING, logger="flykernels"):
        report = flykernels.patch(m)
    assert report["patched"] == {"LlamaRMSNorm": 1}
    assert "disagrees" in report["skipped"]["Qwen3RMSNorm"]
    assert "Qwen3RMSNorm left as it is" in caplog.text
    assert not _patch.is_patched(m[0])
    flykernels.unpatch(m)


def test_inputs_outside_the_fused_op_run_the_modules_forward(patch_on, monkeypatch):
    m = LlamaRMSNorm(16)  # float32 weight
    flykernels.patch(m)
    calls = _calls(monkeypatch)
    x = torch.randn(2, 16, dtype=torch.bfloat16)  # a mixed-dtype call: promotion as the module does it
    assert m(x).dtype == torch.float32 and calls[0] == 0
    m(torch.randn(2, 16))
    assert calls[0] == 1
    flykernels.unpatch(m)


def test_a_wrapped_forward_is_left_alone(patch_on):
    m = LlamaRMSNorm(8)
    marker = lambda x: x + 1  # noqa: E731  (e.g. a device-placement hook's wrapper)
    m.forward = marker
    report = flykernels.patch(m)
    assert report["patched"] == {} and "wrapped already" in report["skipped"]["LlamaRMSNorm"]
    assert m.forward is marker and not _patch.is_patched(m)
    assert flykernels.unpatch(m) == 0 and m.forward is marker


def test_bad_arguments():
    with pytest.raises(TypeError, match="must be a torch.nn.Module"):
        flykernels.patch("model")
    assert flykernels.patch(LlamaRMSNorm(8), rms_norm=False) == {"patched": {}, "skipped": {}}


def test_traceable(patch_on):
    m = Block(32, torch.float32)
    flykernels.patch(m)
    x = torch.randn(2, 32)
    got = torch.compile(m, backend="aot_eager", fullgraph=True)(x)
    with flykernels.torch.disabled():
        ref = m(x)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5)
    flykernels.unpatch(m)


# ---- gated MLPs and the experts' gate (flykernels::glu; its CPU implementation is the composition)
class SiLUActivation(nn.Module):
    def forward(self, x):
        return nn.functional.silu(x)


class GELUTanh(nn.Module):
    def forward(self, x):
        return nn.functional.gelu(x, approximate="tanh")


class LlamaMLP(nn.Module):
    def __init__(self, h, i, act):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.act_fn = act

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


Gemma3MLP = type("Gemma3MLP", (LlamaMLP,), {})


def _default_apply_gate(self, gate_up_out):  # transformers' integrations/moe.py default
    gate, up = gate_up_out.chunk(2, dim=-1)
    return self.act_fn(gate) * up


class Qwen3MoeExperts(nn.Module):
    _apply_gate = _default_apply_gate

    def __init__(self, h, i, e):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, h) * 0.1)
        self.act_fn = SiLUActivation()

    def forward(self, x, expert):
        return self._apply_gate(x @ self.gate_up_proj[expert].t())


glu_op = pytest.mark.skipif(not hasattr(torch.ops.flykernels, "glu"),
                            reason="this build of the extension has no flykernels::glu")


@glu_op
def test_glu_op_matches_the_composition_and_its_gradient():
    torch.manual_seed(2)
    for act, ref_fn in ((0, nn.functional.silu), (1, lambda t: nn.functional.gelu(t, approximate="tanh")),
                        (2, nn.functional.gelu)):
        g = torch.randn(5, 3, 24, dtype=torch.float64, requires_grad=True)
        u = torch.randn(5, 3, 24, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda a, b: torch.ops.flykernels.glu(a, b, act), (g, u))
        assert torch.allclose(torch.ops.flykernels.glu(g, u, act), ref_fn(g) * u)
    with pytest.raises(RuntimeError, match="act must be"):
        torch.ops.flykernels.glu(g, u, 7)


@glu_op
def test_glu_op_traces_with_fake_tensors():
    x = torch.randn(4, 32)
    f = torch.compile(lambda a: torch.ops.flykernels.glu(*a.chunk(2, dim=-1), 0), backend="aot_eager", fullgraph=True)
    assert torch.allclose(f(x), nn.functional.silu(x[:, :16]) * x[:, 16:])


@glu_op
@pytest.mark.parametrize("mlp_cls,act", [(LlamaMLP, SiLUActivation), (Gemma3MLP, GELUTanh)])
def test_mlp_and_experts_patched(mlp_cls, act, patch_on):
    torch.manual_seed(3)
    m = nn.ModuleDict({"mlp": mlp_cls(32, 64, act()), "experts": Qwen3MoeExperts(32, 16, 4),
                       "other": LlamaMLP(32, 64, nn.ReLU())})
    x = torch.randn(6, 32)
    ref = (m["mlp"](x), m["experts"](x, 1), m["other"](x))
    report = flykernels.patch(m)
    assert report["patched"] == {mlp_cls.__name__: 1, "Qwen3MoeExperts": 1}
    assert "ReLU" in report["skipped"]["LlamaMLP"]  # an activation the fused op does not compute
    assert "_apply_gate" in m["experts"].__dict__ and "forward" not in m["experts"].__dict__
    got = (m["mlp"](x), m["experts"](x, 1), m["other"](x))
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert flykernels.unpatch(m) == 2 and "_apply_gate" not in m["experts"].__dict__


def test_mlp_left_alone_without_the_op(patch_on, monkeypatch):
    monkeypatch.setattr(_patch._loader, "ext", None)
    m = LlamaMLP(8, 16, SiLUActivation())
    report = flykernels.patch(m, rms_norm=False)
    assert report["patched"] == {} and "extension is not loaded" in report["skipped"]["LlamaMLP"]
    assert flykernels.patch(m, glu=False) == {"patched": {}, "skipped": {}}
