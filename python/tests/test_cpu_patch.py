# SPDX-License-Identifier: Apache-2.0
"""flykernels.patch(model): the CPU-side logic (which modules, the self-check, the switch, undo,
autograd, tracing) on stand-in modules written like Hugging Face's; the patched Hugging Face
models themselves are checked in test_gpu_patch.py."""
import copy
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


# ---- rotary embeddings ---------------------------------------------------------------------------
rope_op = pytest.mark.skipif(not hasattr(torch.ops.flykernels, "rope"),
                             reason="this build of the extension has no flykernels::rope")


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _hf_rope(q, k, cos, sin, unsqueeze_dim=1):  # transformers' apply_rotary_pos_emb (Llama)
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _tables(B, S, W, dtype=torch.float64):
    ang = torch.randn(B, S, W, dtype=torch.float64) * 3
    return ang.cos().to(dtype), ang.sin().to(dtype)


@rope_op
def test_rope_op_matches_the_composition_and_its_gradient():
    torch.manual_seed(5)
    q = torch.randn(2, 4, 6, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 6, 16, dtype=torch.float64, requires_grad=True)
    cos, sin = _tables(2, 6, 16)
    got = torch.ops.flykernels.rope(q, k, cos, sin, 16)
    for a, b in zip(got, _hf_rope(q, k, cos, sin)):
        assert torch.allclose(a, b)
    assert torch.autograd.gradcheck(lambda a, b: torch.ops.flykernels.rope(a, b, cos, sin, 16), (q, k))
    # an angle per pair (gpt-oss), one table for every batch, partial rotary (columns 8.. unchanged)
    c8, s8 = _tables(1, 6, 8)
    got = torch.ops.flykernels.rope(q, k, c8, s8, 16)
    ref = _hf_rope(q, k, torch.cat((c8, c8), -1), torch.cat((s8, s8), -1))
    assert all(torch.allclose(a, b) for a, b in zip(got, ref))
    assert torch.autograd.gradcheck(lambda a, b: torch.ops.flykernels.rope(a, b, c8, s8, 8), (q, k))
    qo, ko = torch.ops.flykernels.rope(q, k, c8, s8, 8)
    assert torch.equal(qo[..., 8:], q[..., 8:])
    assert torch.allclose(qo[..., :8], _hf_rope(q[..., :8], k[..., :8], c8, s8)[0])
    # gradients of the tables themselves (not a model's case): through the composition
    ct = cos.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda c: torch.ops.flykernels.rope(q, k, c, sin, 16)[0], (ct,))


@rope_op
def test_rope_op_one_output_used_and_bad_arguments():
    q = torch.randn(1, 2, 3, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 3, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = _tables(1, 3, 8)
    torch.ops.flykernels.rope(q, k, cos, sin, 8)[0].sum().backward()  # k's output unused
    q2 = q.detach().requires_grad_()
    _hf_rope(q2, k.detach(), cos, sin)[0].sum().backward()
    assert torch.allclose(q.grad, q2.grad)
    assert k.grad is None or torch.count_nonzero(k.grad) == 0
    with pytest.raises(RuntimeError, match="rotary_dim must be even"):
        torch.ops.flykernels.rope(q, k, cos, sin, 7)
    with pytest.raises(RuntimeError, match="neither rotary_dim"):
        torch.ops.flykernels.rope(q, k, cos, sin, 4)  # tables of width 8: neither 4 nor 2
    with pytest.raises(RuntimeError, match="must be \\[B, H, S, D\\]"):
        torch.ops.flykernels.rope(q[0], k, cos, sin, 8)


@rope_op
def test_rope_op_traces_with_fake_tensors():
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    cos, sin = _tables(2, 5, 16, torch.float32)
    f = torch.compile(lambda *a: torch.ops.flykernels.rope(*a, 16), backend="aot_eager", fullgraph=True)
    for a, b in zip(f(q, k, cos, sin), _hf_rope(q, k, cos, sin)):
        assert torch.allclose(a, b, atol=1e-6)


def _modeling_module(name, apply_src):
    """A stand-in for transformers' modeling_<family> module: apply_rotary_pos_emb and an attention
    class whose forward looks it up in the module at call time, as Hugging Face's does."""
    import sys
    import types
    m = types.ModuleType(name)
    m.torch, m.nn = torch, nn
    exec(apply_src, m.__dict__)
    exec('''
class {cls}(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.d, self.heads = d, heads
        self.q_proj = nn.Linear(d * heads, d * heads, bias=False)
        self.k_proj = nn.Linear(d * heads, d, bias=False)

    def forward(self, x, cos, sin):
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, -1, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, S, -1, self.d).transpose(1, 2)
        return apply_rotary_pos_emb(q, k, cos, sin)
'''.format(cls="GptOssAttention" if "gpt_oss" in name else "LlamaAttention"), m.__dict__)
    sys.modules[name] = m
    return m


_LLAMA_APPLY = '''
def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)

def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)
'''
_GPT_OSS_APPLY = '''
def _apply_rotary_emb(x, cos, sin):
    first_half, second_half = torch.chunk(x, 2, dim=-1)
    return torch.cat((first_half * cos - second_half * sin, second_half * cos + first_half * sin), dim=-1)

def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return _apply_rotary_emb(q, cos, sin), _apply_rotary_emb(k, cos, sin)
'''


@rope_op
@pytest.mark.parametrize("name,src,half", [("fly_test_models.modeling_llama", _LLAMA_APPLY, False),
                                           ("fly_test_models.modeling_gpt_oss", _GPT_OSS_APPLY, True)])
def test_attention_rope_patched_in_its_module_and_restored(name, src, half, patch_on):
    import sys
    m = _modeling_module(name, src)
    try:
        own = m.apply_rotary_pos_emb
        cls = getattr(m, "GptOssAttention" if half else "LlamaAttention")
        a, b = cls(), cls()
        x = torch.randn(2, 5, 32)
        cos, sin = _tables(2, 5, 8 if half else 16, torch.float32)
        ref = a(x, cos, sin)
        report = flykernels.patch(a)
        assert report["patched"] == {cls.__name__: 1} and flykernels.is_patched(a)
        assert m.apply_rotary_pos_emb is not own and m.apply_rotary_pos_emb.__wrapped__ is own
        assert _patch._rope_half[name] is half  # the probe found the table width the function takes
        got = a(x, cos, sin)  # CPU tensors: the module's own function computes it (the fused op is CUDA's)
        assert all(torch.allclose(u, v) for u, v in zip(got, ref))
        flykernels.patch(b)
        assert flykernels.unpatch(a) == 1 and m.apply_rotary_pos_emb is not own  # b still patched
        assert flykernels.unpatch(b) == 1 and m.apply_rotary_pos_emb is own
    finally:
        del sys.modules[name]


@rope_op
def test_attention_rope_refused_when_its_function_differs(patch_on):
    import sys
    name = "fly_test_models.modeling_llama_changed"
    m = _modeling_module(name, _LLAMA_APPLY.replace("(q * cos) + (rotate_half(q) * sin)",
                                                    "(q * cos) - (rotate_half(q) * sin)"))
    try:
        own = m.apply_rotary_pos_emb
        report = flykernels.patch(m.LlamaAttention())
        assert report["patched"] == {} and "disagrees" in report["skipped"]["LlamaAttention"]
        assert m.apply_rotary_pos_emb is own
        assert flykernels.patch(m.LlamaAttention(), rope=False) == {"patched": {}, "skipped": {}}
    finally:
        del sys.modules[name]


def test_rope_takes_only_what_the_fused_op_computes(monkeypatch):
    """The patched apply_rotary_pos_emb's test of a call: CPU calls are never taken; with is_cuda
    made true, the shapes, dtypes and arguments decide."""
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    cos, sin = _tables(2, 5, 16, torch.float32)
    takes = _patch._rope_takes
    assert not takes(q, k, cos, sin, 1, False)  # CPU tensors
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert takes(q, k, cos, sin, 1, False)
    assert takes(q.transpose(1, 2), k.transpose(1, 2), cos, sin, 2, False)  # [B, S, H, D]
    assert takes(q, k, cos[:1], sin[:1], 1, False)  # one table for every batch
    assert takes(q, k, cos[..., :8], sin[..., :8], 1, True)  # an angle per pair (gpt-oss)
    assert not takes(q, k, cos[..., :8], sin[..., :8], 1, False)
    assert not takes(q, k, cos, sin, torch.tensor([1]), False)  # position_ids where unsqueeze_dim is now
    assert not takes(q, k, cos, sin, None, False)
    assert not takes(q, k, cos, sin, 3, False)
    assert not takes(q, k[:, :, :4], cos, sin, 1, False)  # k's sequence differs
    assert not takes(q, k, cos[:, :4], sin[:, :4], 1, False)
    assert not takes(q, k.double(), cos, sin, 1, False)
    assert not takes(q[..., :15], k[..., :15], cos[..., :15], sin[..., :15], 1, False)  # odd head dim


# ---- mixture-of-experts routing ------------------------------------------------------------------
moe_op = pytest.mark.skipif(not hasattr(torch.ops.flykernels, "moe_route"),
                            reason="this build of the extension has no flykernels::moe_*")


def _route_ref(logits, k, score, flags):
    """The router composition written out in FP64 (what Hugging Face's routers compute)."""
    lg = logits.double()
    if flags & 2:
        v, ids = lg.topk(k, dim=-1)
        w = v.softmax(-1) if score == 0 else v.sigmoid()
    else:
        s = lg.softmax(-1) if score == 0 else lg.sigmoid()
        w, ids = s.topk(k, dim=-1)
    if flags & 1:
        w = w / w.sum(-1, keepdim=True)
    return w, ids


@moe_op
@pytest.mark.parametrize("score,flags", [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (1, 3)])
def test_moe_route_op_matches_the_composition_and_its_gradient(score, flags):
    torch.manual_seed(4)
    logits = torch.randn(37, 24, dtype=torch.float64)
    w, ids = torch.ops.flykernels.moe_route(logits, 5, score, flags, torch.float64)
    rw, rids = _route_ref(logits, 5, score, flags)
    assert ids.dtype == torch.int64 and torch.equal(ids, rids)
    assert torch.allclose(w, rw, rtol=1e-12, atol=1e-14)
    x = logits.clone().requires_grad_()
    fixed = ids  # the selection is a constant of the gradient: gradcheck at a point away from ties
    assert torch.autograd.gradcheck(lambda t: torch.ops.flykernels.moe_route(t, 5, score, flags, torch.float64)[0],
                                    (x,))
    assert torch.equal(torch.ops.flykernels.moe_route(x, 5, score, flags, torch.float64)[1], fixed)


@moe_op
def test_moe_route_ties_dtype_and_bad_arguments():
    logits = torch.zeros(3, 16)
    logits[1, 7] = logits[1, 9] = 1.0
    w, ids = torch.ops.flykernels.moe_route(logits, 4, 0, 1)
    assert ids[0].tolist() == [0, 1, 2, 3]        # exact ties: the lower id first (torch.topk on the CPU
    assert ids[1].tolist() == [7, 9, 0, 1]        # orders them arbitrarily; the kernel's rule is this)
    assert w.dtype == torch.float32 and torch.allclose(w.sum(-1), torch.ones(3))
    wb, _ = torch.ops.flykernels.moe_route(logits.bfloat16(), 4, 0, 1, torch.bfloat16)
    assert wb.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="k = 17 outside"):
        torch.ops.flykernels.moe_route(logits, 17, 0, 0)
    with pytest.raises(RuntimeError, match="score must be"):
        torch.ops.flykernels.moe_route(logits, 2, 3, 0)
    with pytest.raises(RuntimeError, match="flags must be"):
        torch.ops.flykernels.moe_route(logits, 2, 0, 8)


def _permute_ref(x, ids, E):
    """Hugging Face's grouped_mm path written out: a stable sort by expert, F.grouped_mm's offsets."""
    flat = ids.reshape(-1)
    key = torch.where((flat >= 0) & (flat < E), flat, torch.full_like(flat, E))
    order = torch.sort(key, stable=True).indices
    counts = torch.bincount(key, minlength=E + 1)[:E]
    return x[order // ids.shape[1]], torch.cumsum(counts, 0).to(torch.int32), order


@moe_op
def test_moe_permute_unpermute_match_the_composition_and_their_gradients():
    torch.manual_seed(5)
    T, k, E, H = 11, 3, 6, 8
    x = torch.randn(T, H, dtype=torch.float64, requires_grad=True)
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(T)])
    ids[2, 1] = E  # a dropped pair (expert parallelism's sentinel): last, zero row, no contribution
    ids[4, 0] = -1
    x_perm, offs, row_of, pair_of = torch.ops.flykernels.moe_permute(x, ids, E)
    rx, roffs, order = _permute_ref(x.detach(), ids, E)
    total = int(roffs[-1])
    assert total == T * k - 2 and torch.equal(offs, roffs) and offs.dtype == torch.int32
    assert torch.equal(pair_of.long(), order) and row_of.shape == (T, k) and row_of.dtype == torch.int32
    assert torch.equal(row_of.reshape(-1).long()[order], torch.arange(T * k))
    assert torch.equal(x_perm[:total], rx[:total]) and not x_perm[total:].any()
    w = torch.rand(T, k, dtype=torch.float64, requires_grad=True)
    out = torch.randn(T * k, H, dtype=torch.float64, requires_grad=True)
    y = torch.ops.flykernels.moe_unpermute(out, w, row_of, offs)
    valid = (ids >= 0) & (ids < E)
    ref = ((out[row_of.long()] * w.unsqueeze(-1)) * valid.unsqueeze(-1)).sum(1)
    assert torch.allclose(y, ref)
    assert torch.autograd.gradcheck(lambda o, ww: torch.ops.flykernels.moe_unpermute(o, ww, row_of, offs), (out, w))
    assert torch.autograd.gradcheck(lambda xx: torch.ops.flykernels.moe_permute(xx, ids, E)[0], (x,))
    # Garbage past offsets[-1] (grouped_mm leaves those rows unwritten) never reaches y.
    junk = out.detach().clone()
    junk[total:] = float("nan")
    assert torch.isfinite(torch.ops.flykernels.moe_unpermute(junk, w.detach(), row_of, offs)).all()
    # No tokens: every expert empty.
    e_x, e_off, e_row, e_pair = torch.ops.flykernels.moe_permute(torch.zeros(0, H), torch.zeros(0, k, dtype=torch.long), E)
    assert e_x.shape == (0, H) and e_off.tolist() == [0] * E and e_row.shape == (0, k) and e_pair.shape == (0,)


@moe_op
def test_moe_ops_trace_with_fake_tensors():
    def block(x, logits, w_up, w_down):
        w, ids = torch.ops.flykernels.moe_route(logits, 2, 0, 1)
        xp, offs, row_of, _ = torch.ops.flykernels.moe_permute(x, ids, 4)
        h = torch.ops.flykernels.glu(*torch.nn.functional.grouped_mm(xp, w_up, offs=offs).chunk(2, dim=-1), 0)
        return torch.ops.flykernels.moe_unpermute(torch.nn.functional.grouped_mm(h, w_down, offs=offs), w, row_of, offs)
    torch.manual_seed(6)
    args = tuple(t.bfloat16() for t in (torch.randn(10, 16), torch.randn(10, 4), torch.randn(4, 16, 32),
                                        torch.randn(4, 16, 16)))  # (grouped_mm's shape function takes bf16)
    f = torch.compile(block, backend="aot_eager", fullgraph=True)
    assert torch.allclose(f(*args).float(), block(*args).float(), rtol=2e-2, atol=2e-2)


# Stand-ins written as transformers 5.x writes them (models/qwen3_moe, models/mixtral).
class Qwen3MoeTopKRouter(nn.Module):
    def __init__(self, h, e, k, norm):
        super().__init__()
        self.top_k, self.num_experts, self.norm_topk_prob, self.hidden_dim = k, e, norm, h
        self.weight = nn.Parameter(torch.randn(e, h) * 0.3)

    def forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = nn.functional.linear(hidden_states, self.weight)
        router_probs = torch.nn.functional.softmax(router_logits, dtype=torch.float, dim=-1)
        router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
        router_top_value = router_top_value.to(router_logits.dtype)
        return router_logits, router_top_value, router_indices


class MixtralTopKRouter(Qwen3MoeTopKRouter):
    def __init__(self, h, e, k):
        super().__init__(h, e, k, True)
        del self.norm_topk_prob

    def forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        router_logits = nn.functional.linear(hidden_states, self.weight)
        router_probs = torch.nn.functional.softmax(router_logits.float(), dim=-1)
        router_top_value, router_indices = torch.topk(router_probs, self.top_k, dim=-1)
        router_top_value /= router_top_value.sum(dim=-1, keepdim=True)
        return router_logits, router_top_value, router_indices


class MixtralExperts(nn.Module):  # the eager loop of transformers' experts classes
    _apply_gate = _default_apply_gate

    def __init__(self, h, i, e):
        super().__init__()
        self.num_experts, self.hidden_dim, self.intermediate_dim = e, h, i
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, h) * 0.2)
        self.down_proj = nn.Parameter(torch.randn(e, h, i) * 0.2)
        self.act_fn = SiLUActivation()
        self.has_gate, self.has_bias, self.is_transposed, self.is_concatenated = True, False, False, True

    def forward(self, hidden_states, top_k_index, top_k_weights):
        final = torch.zeros_like(hidden_states)
        mask = nn.functional.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
        for e in range(self.num_experts):
            top_k_pos, token_idx = torch.where(mask[e])
            if token_idx.numel() == 0:
                continue
            gate, up = nn.functional.linear(hidden_states[token_idx], self.gate_up_proj[e]).chunk(2, dim=-1)
            cur = nn.functional.linear(self.act_fn(gate) * up, self.down_proj[e])
            final.index_add_(0, token_idx, (cur * top_k_weights[token_idx, top_k_pos, None]).to(final.dtype))
        return final


Qwen3MoeExpertsFused = type("Qwen3MoeExperts", (MixtralExperts,), {})


class SparseMoeBlock(nn.Module):
    def __init__(self, router, experts):
        super().__init__()
        self.gate, self.experts = router, experts

    def forward(self, x):
        b, s, h = x.shape
        flat = x.view(-1, h)
        _, w, ids = self.gate(flat)
        return self.experts(flat, ids, w).reshape(b, s, h)


@moe_op
@pytest.mark.parametrize("flavour", ["qwen3_norm", "qwen3", "mixtral"])
def test_moe_blocks_patched_match_and_undo(flavour, patch_on):
    torch.manual_seed(7)
    H, inter, E, k = 16, 12, 6, 2
    router = MixtralTopKRouter(H, E, k) if flavour == "mixtral" else Qwen3MoeTopKRouter(H, E, k, flavour == "qwen3_norm")
    experts = (MixtralExperts if flavour == "mixtral" else Qwen3MoeExpertsFused)(H, inter, E)
    block = SparseMoeBlock(router, experts)
    x = torch.randn(2, 9, H, requires_grad=True)

    def run():
        block.zero_grad(set_to_none=True)
        x.grad = None
        y = block(x)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        return y.detach(), x.grad.clone(), {n: p.grad.clone() for n, p in block.named_parameters()}
    ref = run()
    report = flykernels.patch(block)
    assert report["patched"] == {type(router).__name__: 1, type(experts).__name__: 1}, report
    assert report["skipped"] == {}
    assert _patch.is_patched(router) and _patch.is_patched(experts)
    got = run()
    assert torch.allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)
    assert torch.allclose(got[1], ref[1], rtol=1e-5, atol=1e-6)
    for n in ref[2]:
        assert torch.allclose(got[2][n], ref[2][n], rtol=1e-4, atol=1e-6), n  # the router weight through moe_route
    # Router weights keep the flavour's dtype (Mixtral: FP32; Qwen3-MoE: the logits' dtype).
    bf_router = copy.copy(router)
    bf_router._parameters = {"weight": nn.Parameter(router.weight.detach().bfloat16())}
    _, w_ref, _ = type(router).forward(bf_router, x.detach().bfloat16().reshape(-1, H))
    _, w_got, _ = router.forward.__func__(bf_router, x.detach().bfloat16().reshape(-1, H))
    assert w_got.dtype == w_ref.dtype
    with flykernels.torch.disabled():
        assert torch.equal(block(x).detach(), ref[0])  # the switch: the modules' own forwards
    assert flykernels.unpatch(block) == 2
    assert "forward" not in router.__dict__ and "forward" not in experts.__dict__
    assert torch.equal(block(x).detach(), ref[0])


@moe_op
def test_moe_self_check_refuses_a_changed_router(patch_on, caplog):
    class Qwen3MoeTopKRouter2(Qwen3MoeTopKRouter):  # a release whose router scores by sigmoid
        def forward(self, hidden_states):
            logits = nn.functional.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
            w, i = logits.sigmoid().topk(self.top_k, dim=-1)
            return logits, w, i
    Qwen3MoeTopKRouter2.__name__ = "Qwen3MoeTopKRouter"
    r = Qwen3MoeTopKRouter2(16, 6, 2, False)
    with caplog.at_level(logging.WARNING, logger="flykernels"):
        report = flykernels.patch(r)
    assert report["patched"] == {} and "disagrees" in report["skipped"]["Qwen3MoeTopKRouter"]
    assert "forward" not in r.__dict__


@moe_op
def test_moe_layouts_the_patch_does_not_know_are_left_alone(patch_on):
    experts = Qwen3MoeExpertsFused(16, 8, 4)
    experts.is_transposed = True
    plain = SparseMoeBlock(Qwen3MoeTopKRouter(16, 4, 2, True), Qwen3MoeExpertsFused(16, 8, 4))
    no_moe = flykernels.patch(plain, moe=False)  # moe off: the experts' gate alone, onto flykernels::glu
    assert no_moe["patched"] == {"Qwen3MoeExperts": 1} and "_apply_gate" in plain.experts.__dict__
    flykernels.unpatch(plain)
    report = flykernels.patch(experts)
    # transposed weights: not the fused experts' layout; the gate alone (flykernels::glu) is still taken
    assert "forward" not in experts.__dict__
    assert report["patched"] == {"Qwen3MoeExperts": 1} and "_apply_gate" in experts.__dict__
    flykernels.unpatch(experts)


def test_moe_left_alone_without_the_ops(patch_on, monkeypatch):
    monkeypatch.setattr(_patch._loader, "ext", None)
    r = Qwen3MoeTopKRouter(8, 4, 2, True)
    report = flykernels.patch(r)
    assert report["patched"] == {} and "extension is not loaded" in report["skipped"]["Qwen3MoeTopKRouter"]
    assert flykernels.patch(r, moe=False) == {"patched": {}, "skipped": {}}


HF_MOE = {  # transformers config class: its MoE fields (tiny, CPU)
    "Qwen3MoeConfig": dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True),
    "MixtralConfig": dict(num_local_experts=6, num_experts_per_tok=2),
    "OlmoeConfig": dict(num_experts=6, num_experts_per_tok=2),
}


@moe_op
@pytest.mark.parametrize("cfg_name", list(HF_MOE))
@pytest.mark.parametrize("impl", ["eager", "grouped_mm"])
def test_hf_moe_models_patched_on_the_cpu(cfg_name, impl, patch_on):
    """Hugging Face's own MoE models (tiny, FP32, CPU, when transformers is installed): the patched
    routers and experts give the stock logits and gradients, whatever experts_implementation."""
    transformers = pytest.importorskip("transformers")
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cfg_name}")
    cfg = cfg_cls(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=97, **HF_MOE[cfg_name])
    torch.manual_seed(0)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation=impl)
    except (TypeError, ValueError) as e:
        pytest.skip(f"experts_implementation={impl}: {e}")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("gate.weight"):  # a fresh router is all zeros: every score tied
                p.normal_(0.0, 0.5)
    ids = torch.randint(0, 97, (2, 11))

    def run():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    ref_logits, ref_grads = run()
    report = flykernels.patch(model, rms_norm=False, glu=False, rope=False, add_rms_norm=False, causal_mask=False)
    assert report["skipped"] == {}, report
    assert sum(c for k, c in report["patched"].items() if k.endswith("Router")) == 2
    assert sum(c for k, c in report["patched"].items() if k.endswith("Experts")) == 2
    logits, grads = run()
    assert torch.allclose(logits, ref_logits, rtol=1e-4, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        assert torch.allclose(grads[n], ref_grads[n], rtol=1e-3, atol=1e-6), n
    assert flykernels.unpatch(model) == 4


def test_shipped_defaults(monkeypatch):
    """As shipped, a plain patch(model) takes sparse-MoE blocks and decoder layers (both
    GPU-verified; test_cpu_add_rmsnorm.py checks the layers) and leaves the causal-LM loss (it drops
    the logits) alone; moe=False leaves the blocks."""
    assert _patch.SHIPPED_DEFAULTS == {"add_rms_norm": True, "moe": True, "linear_cross_entropy": False}
    monkeypatch.setattr(_patch, "_defaults", dict(_patch.SHIPPED_DEFAULTS))
    r = Qwen3MoeTopKRouter(8, 4, 2, True)
    assert flykernels.patch(r, moe=False) == {"patched": {}, "skipped": {}}
    plain = flykernels.patch(r)
    assert "Qwen3MoeTopKRouter" in {**plain["patched"], **plain["skipped"]}
    flykernels.unpatch(r)

