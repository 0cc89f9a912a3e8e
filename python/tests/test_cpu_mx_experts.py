# SPDX-License-Identifier: Apache-2.0
"""MX expert weights on the CPU (CI): flykernels.quantize_ on mixture-of-experts modules that hold
their experts as 3-D parameters (transformers' fused experts), flykernels.nn.MXExperts. Stand-in
modules written like transformers' (the eager loop of Qwen3MoeExperts; gpt-oss's transposed,
biased, interleaved layout) run everywhere; Hugging Face's own classes and models (Qwen3-MoE,
gpt-oss, Mixtral; eager, grouped_mm and batched_mm experts) run where transformers is installed
and skip visibly where it is not. Checked: the packing (each expert bit for bit MXLinear's layout,
round trips), the forward against the original module on the dequantized weights (experts that get
no tokens included), skip rules, the K check, state_dict save / load (also into a meta-built model),
dequantize(), .to(dtype), weight bytes, autograd, torch.compile, the kernel hook, and
flykernels.patch's MoE path on quantized experts."""
import copy
import io
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flykernels
from flykernels import _mx
from flykernels.nn import MXExperts, MXLinear, experts_layout
from conftest import require_experts_impl

FORMATS = ["mxfp8", "mxfp4"]


# ---- stand-ins written like transformers' experts (integrations/moe.py, modeling_*.py) -----------
class Qwen3MoeExperts(nn.Module):
    """transformers' default layout: gate_up_proj [E, 2I, H], down_proj [E, H, I], F.linear per
    expert, the eager loop over the experts that received tokens."""

    def __init__(self, E, H, inter):
        super().__init__()
        self.num_experts, self.hidden_dim, self.intermediate_dim = E, H, inter
        self.gate_up_proj = nn.Parameter(0.3 * torch.randn(E, 2 * inter, H))
        self.down_proj = nn.Parameter(0.3 * torch.randn(E, H, inter))
        self.act_fn = nn.SiLU()

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        mask = F.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            e = e[0]
            pos, tok = torch.where(mask[e])
            gate, up = F.linear(hidden_states[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
            h = F.linear(self.act_fn(gate) * up, self.down_proj[e]) * top_k_weights[tok, pos, None]
            out.index_add_(0, tok, h.to(out.dtype))
        return out


class GptOssExperts(nn.Module):
    """gpt-oss's layout: gate_up_proj [E, H, 2I] (gate / up interleaved), down_proj [E, I, H],
    x @ W[e] + bias (K is the middle dimension); transformers marks it is_transposed."""

    def __init__(self, E, H, inter, with_attribute=True):
        super().__init__()
        self.num_experts, self.hidden_size, self.intermediate_size = E, H, inter
        self.gate_up_proj = nn.Parameter(0.3 * torch.randn(E, H, 2 * inter))
        self.gate_up_proj_bias = nn.Parameter(0.1 * torch.randn(E, 2 * inter))
        self.down_proj = nn.Parameter(0.3 * torch.randn(E, inter, H))
        self.down_proj_bias = nn.Parameter(0.1 * torch.randn(E, H))
        if with_attribute:
            self.is_transposed = True

    def forward(self, hidden_states, router_indices, routing_weights):
        out = torch.zeros_like(hidden_states)
        mask = F.one_hot(router_indices, num_classes=self.num_experts).permute(2, 1, 0)
        for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
            e = e[0]
            pos, tok = torch.where(mask[e])
            gu = hidden_states[tok] @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]
            gate, up = gu[..., ::2].clamp(max=7.0), gu[..., 1::2].clamp(-7.0, 7.0)
            h = (up + 1) * gate * torch.sigmoid(1.702 * gate)
            h = (h @ self.down_proj[e] + self.down_proj_bias[e]) * routing_weights[tok, pos, None]
            out.index_add_(0, tok, h.to(out.dtype))
        return out


class GatelessExperts(nn.Module):
    """Experts without a gate (transformers' has_gate=False, e.g. Nemotron-H): up_proj [E, I, H],
    act, down_proj [E, H, I]."""

    def __init__(self, E, H, inter):
        super().__init__()
        self.num_experts, self.hidden_dim = E, H
        self.up_proj = nn.Parameter(0.3 * torch.randn(E, inter, H))
        self.down_proj = nn.Parameter(0.3 * torch.randn(E, H, inter))
        self.is_transposed = False

    def forward(self, hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for t in range(top_k_index.shape[0]):
            for j in range(top_k_index.shape[1]):
                e = top_k_index[t, j]
                h = F.linear(F.relu(F.linear(hidden_states[t], self.up_proj[e])) ** 2, self.down_proj[e])
                out[t] += top_k_weights[t, j] * h
        return out


class OtherExperts(GptOssExperts):  # a class the layout table does not know
    pass


class Block(nn.Module):
    def __init__(self, experts, H):
        super().__init__()
        self.gate = nn.Linear(H, experts.num_experts, bias=False)
        self.experts = experts
        self.top_k = 2

    def forward(self, x):
        w, ids = torch.topk(torch.softmax(self.gate(x).float(), -1), self.top_k, dim=-1)
        return self.experts(x, ids, (w / w.sum(-1, keepdim=True)).to(x.dtype))


def _routing(T, E, k, gen, unused=()):
    """ids [T, k] (distinct per token, never an expert of `unused`) and weights [T, k]."""
    pool = torch.tensor([e for e in range(E) if e not in unused])
    ids = torch.stack([pool[torch.randperm(len(pool), generator=gen)[:k]] for _ in range(T)])
    return ids, torch.rand(T, k, generator=gen)


def _dense_twin(orig, mx):
    """`orig` (the unquantized module) with its expert weights replaced by mx's dequantized ones."""
    twin = copy.deepcopy(orig)
    with torch.no_grad():
        for n, w in mx.dequantize(torch.float32).items():
            getattr(twin, n).copy_(w)
    return twin


# ---- packing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_packing_is_mxlinear_per_expert_and_round_trips(fmt, transposed, dtype):
    gen = torch.Generator().manual_seed(3)
    E, N, K = 5, 24, 96
    w = (torch.randn(E, N, K, generator=gen) * torch.exp2(torch.randint(-8, 8, (E, N, 1), generator=gen).float()))
    w[1, 3, :32] = 0.0                        # a zero block
    w = w.to(dtype)
    src = w.transpose(-2, -1).contiguous() if transposed else w   # [E, K, N] as gpt-oss stores it
    q, s = _mx.quantize_experts(src, fmt, transposed)
    assert q.dtype == s.dtype == torch.uint8
    assert q.shape == (E, N, _mx.packed_cols(fmt, K)) and s.shape == (E, N, K // 32)
    for e in range(E):  # each expert exactly as MXLinear stores a weight [N, K]
        qe, se = _mx.quantize(w[e], fmt)
        assert torch.equal(q[e], qe) and torch.equal(s[e], se)
    back = _mx.dequantize_experts(q, s, fmt, torch.float32, transposed)
    assert back.shape == src.shape
    for e in range(E):
        ref = _mx.dequantize(q[e], s[e], fmt)
        assert torch.equal(back[e], ref.T if transposed else ref)
    # dequantize -> quantize gives the same bytes, in FP32 and in the source dtype
    for dt in (torch.float32, dtype):
        q2, s2 = _mx.quantize_experts(_mx.dequantize_experts(q, s, fmt, dt, transposed), fmt, transposed)
        assert torch.equal(q2, q) and torch.equal(s2, s)


def test_layout_detection():
    assert experts_layout(Qwen3MoeExperts(4, 32, 16)) == (["gate_up_proj", "down_proj"], False)
    assert experts_layout(GptOssExperts(4, 32, 32)) == (["gate_up_proj", "down_proj"], True)
    # no is_transposed attribute: the hidden size tells (down_proj's output is H)
    assert experts_layout(OtherExperts(4, 32, 64, with_attribute=False)) == (["gate_up_proj", "down_proj"], True)
    assert experts_layout(GptOssExperts(4, 32, 32, with_attribute=False)) == (["gate_up_proj", "down_proj"], True)
    ambiguous = OtherExperts(4, 32, 32, with_attribute=False)
    ambiguous.hidden_size = None
    assert isinstance(experts_layout(ambiguous), str)
    assert experts_layout(nn.Linear(4, 4)) is None
    lone = nn.Module()
    lone.down_proj = nn.Parameter(torch.zeros(2, 4, 4))  # no gate_up_proj / up_proj: not experts
    assert experts_layout(lone) is None


# ---- the module ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["qwen3", "gptoss"])
def test_forward_matches_the_original_on_dequantized_weights(fmt, kind):
    torch.manual_seed(0)
    E, H, inter = 8, 64, 32
    orig = Qwen3MoeExperts(E, H, inter) if kind == "qwen3" else GptOssExperts(E, H, inter)
    mx = MXExperts.quantize_module(copy.deepcopy(orig), fmt)
    assert isinstance(mx, MXExperts) and isinstance(mx, type(orig)) and type(mx).__name__ == f"MX{type(orig).__name__}"
    twin = _dense_twin(orig, mx)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, H, generator=gen)
    ids, w = _routing(6, E, 2, gen, unused=(0, 5, 7))  # three experts receive no tokens
    got, ref = mx(x, ids, w), twin(x, ids, w)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6)
    if kind == "qwen3":  # the same ops on the same (contiguous) values: the same bits
        assert torch.equal(got, ref)
    # the weights read dense, in the original layout; the biases are the original parameters
    for n in ("gate_up_proj", "down_proj"):
        assert getattr(mx, n).shape == getattr(orig, n).shape
        assert torch.equal(getattr(mx, n), getattr(twin, n))
        assert n not in dict(mx.named_parameters())
    if kind == "gptoss":
        assert sorted(n for n, _ in mx.named_parameters()) == ["down_proj_bias", "gate_up_proj_bias"]


def test_gateless_experts():
    torch.manual_seed(0)
    orig = GatelessExperts(6, 64, 32)
    mx = flykernels.quantize_(copy.deepcopy(orig), "mxfp4")
    assert isinstance(mx, MXExperts) and mx.mx_weights == ("up_proj", "down_proj")
    x = torch.randn(4, 64)
    ids, w = _routing(4, 6, 2, torch.Generator().manual_seed(0), unused=(2,))
    assert torch.equal(mx(x, ids, w), _dense_twin(orig, mx)(x, ids, w))
    with pytest.raises(ValueError, match="not expert weights of the module"):
        MXExperts.quantize_module(GatelessExperts(2, 32, 32), "mxfp8", names=["gate_up_proj"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_is_exact(fmt):
    torch.manual_seed(0)
    orig = Qwen3MoeExperts(4, 64, 32).to(torch.bfloat16)
    mx = MXExperts.quantize_module(copy.deepcopy(orig), fmt)
    assert mx.dtype == torch.bfloat16
    d32, d16 = mx.dequantize(torch.float32), mx.dequantize()
    assert set(d32) == {"gate_up_proj", "down_proj"}
    for n in d32:
        assert d16[n].dtype == torch.bfloat16 and d16[n].is_contiguous()
        assert torch.equal(d16[n].float(), d32[n])   # exact in BF16 for weights quantized from BF16
        q, s = _mx.quantize_experts(d16[n], fmt, False)
        assert torch.equal(q, getattr(mx, f"{n}_qweight")) and torch.equal(s, getattr(mx, f"{n}_scales"))
    # the same weight, to within the format's error (relative L2)
    err = (d32["down_proj"] - orig.down_proj.float()).norm() / orig.down_proj.float().norm()
    assert err < (0.05 if fmt == "mxfp8" else 0.2)


def test_to_dtype_keeps_the_bytes_and_weight_bytes():
    mx = MXExperts.quantize_module(GptOssExperts(4, 64, 32), "mxfp4")
    before = {n: b.clone() for n, b in mx.named_buffers()}
    mx.to(torch.float16)
    assert mx.dtype == torch.float16 and mx.gate_up_proj_bias.dtype == torch.float16
    assert mx.dequantize()["down_proj"].dtype == torch.float16
    for n, b in before.items():
        assert torch.equal(getattr(mx, n), b)
    packed, dense = mx.weight_nbytes()
    elems = 4 * 64 * 64 + 4 * 32 * 64
    assert dense == elems * 2 and packed == elems // 2 + elems // 32
    assert "format=mxfp4" in repr(mx) and "transposed=True" in repr(mx)


def test_autograd_reaches_the_input_and_the_biases():
    torch.manual_seed(0)
    orig = GptOssExperts(4, 32, 32)
    mx = MXExperts.quantize_module(copy.deepcopy(orig), "mxfp8")
    twin = _dense_twin(orig, mx)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 32, generator=gen)
    ids, w = _routing(5, 4, 2, gen)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    mx(xa, ids, w).square().sum().backward()
    twin(xb, ids, w).square().sum().backward()
    assert torch.allclose(xa.grad, xb.grad, rtol=1e-4, atol=1e-5)
    assert torch.allclose(mx.down_proj_bias.grad, twin.down_proj_bias.grad, rtol=1e-4, atol=1e-5)


def test_the_kernel_hook_takes_the_call_first(monkeypatch):
    mx = MXExperts.quantize_module(Qwen3MoeExperts(4, 32, 32), "mxfp8")
    seen = []

    def kernel(mod, args, kwargs):
        seen.append(mod)
        return torch.full((3, 32), 7.0)
    monkeypatch.setattr(_mx, "experts_kernel", kernel)
    x = torch.randn(3, 32)
    ids, w = _routing(3, 4, 2, torch.Generator().manual_seed(0))
    assert torch.equal(mx(x, ids, w), torch.full((3, 32), 7.0)) and seen == [mx]
    assert _mx.experts_kernel is kernel
    monkeypatch.undo()
    assert _mx.experts_kernel(mx, (x, ids, w), {}) is None  # none exists yet: the dequantized path


def test_torch_compile_fullgraph():
    torch.manual_seed(0)
    orig = Qwen3MoeExperts(4, 32, 32)

    def grouped(self, x, ids, w):  # a loop-free forward (the eager loop has data-dependent control flow)
        dense = F.linear(x, self.gate_up_proj.flatten(0, 1)).view(x.shape[0], self.num_experts, -1)
        gate, up = dense.chunk(2, dim=-1)
        h = torch.einsum("tei,ehi->teh", self.act_fn(gate) * up, self.down_proj)
        pick = torch.zeros(x.shape[0], self.num_experts).scatter(1, ids, w)
        return (h * pick.unsqueeze(-1)).sum(1)
    cls = type("Qwen3MoeExpertsGrouped", (Qwen3MoeExperts,), {"forward": grouped})
    orig.__class__ = cls
    mx = MXExperts.quantize_module(copy.deepcopy(orig), "mxfp4")
    x = torch.randn(5, 32)
    ids, w = _routing(5, 4, 2, torch.Generator().manual_seed(0))
    ref = _dense_twin(orig, mx)(x, ids, w)
    torch._dynamo.reset()
    got = torch.compile(mx, backend="aot_eager", fullgraph=True)(x, ids, w)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6)


# ---- quantize_ ----------------------------------------------------------------------------------
def _model(kind="qwen3", E=6, H=64, inter=32, layers=2):
    torch.manual_seed(0)
    mk = (lambda: Qwen3MoeExperts(E, H, inter)) if kind == "qwen3" else (lambda: GptOssExperts(E, H, inter))
    return nn.ModuleDict({"layers": nn.ModuleList([Block(mk(), H) for _ in range(layers)]),
                          "lm_head": nn.Linear(H, 40, bias=False)})


def _run(m, x):
    for blk in m["layers"]:
        x = x + blk(x)
    return m["lm_head"](x)


@pytest.mark.parametrize("kind", ["qwen3", "gptoss"])
def test_quantize_swaps_experts_and_linears(kind):
    m = _model(kind)
    ref_model = copy.deepcopy(m)
    assert flykernels.quantize_(m, "mxfp4", skip=["lm_head"]) is m
    for blk in m["layers"]:
        assert isinstance(blk.experts, MXExperts) and isinstance(blk.gate, MXLinear)
    assert type(m["lm_head"]) is nn.Linear
    twin = copy.deepcopy(ref_model)
    for i, blk in enumerate(m["layers"]):
        twin["layers"][i].experts = _dense_twin(ref_model["layers"][i].experts, blk.experts)
        with torch.no_grad():
            twin["layers"][i].gate.weight.copy_(blk.gate.dequantize(torch.float32))
    x = torch.randn(7, 64)
    assert torch.allclose(_run(m, x), _run(twin, x), rtol=1e-4, atol=1e-5)


def test_skip_rules():
    m = _model()
    flykernels.quantize_(m, "mxfp8", skip=["layers.0.experts"])
    assert not isinstance(m["layers"][0].experts, MXExperts) and isinstance(m["layers"][1].experts, MXExperts)
    m = _model()
    flykernels.quantize_(m, "mxfp8", skip="experts")  # a dotted suffix: every experts module
    assert not any(isinstance(b.experts, MXExperts) for b in m["layers"])
    assert all(isinstance(b.gate, MXLinear) for b in m["layers"])
    m = _model()
    flykernels.quantize_(m, "mxfp8", skip=["layers.1.*"])
    assert isinstance(m["layers"][0].experts, MXExperts) and not isinstance(m["layers"][1].experts, MXExperts)
    assert type(m["layers"][1].gate) is nn.Linear
    m = _model()
    flykernels.quantize_(m, "mxfp8", skip=["experts.down_proj"])  # one weight of the experts
    ex = m["layers"][0].experts
    assert ex.mx_weights == ("gate_up_proj",) and isinstance(ex._parameters["down_proj"], nn.Parameter)
    x = torch.randn(4, 64)
    ids, w = _routing(4, 6, 2, torch.Generator().manual_seed(0))
    orig = _model()["layers"][0].experts
    with torch.no_grad():
        orig.gate_up_proj.copy_(ex.gate_up_proj)
    assert torch.equal(ex(x, ids, w), orig(x, ids, w))


def test_k_not_a_multiple_of_32_is_refused_before_anything_changes():
    m = _model(inter=48)  # down_proj's K = 48
    with pytest.raises(ValueError, match=r"layers\.0\.experts\.down_proj.*K = 48.*skip="):
        flykernels.quantize_(m, "mxfp8")
    assert not any(isinstance(mod, (MXExperts, MXLinear)) for mod in m.modules())
    flykernels.quantize_(m, "mxfp8", skip=["down_proj"])
    assert m["layers"][0].experts.mx_weights == ("gate_up_proj",)


def test_unclear_layout_is_left_with_a_warning(caplog):
    ex = OtherExperts(4, 32, 32, with_attribute=False)
    ex.hidden_size = None
    m = nn.ModuleDict({"experts": ex})
    with caplog.at_level(logging.WARNING, logger="flykernels"):
        flykernels.quantize_(m, "mxfp8")
    assert not isinstance(m["experts"], MXExperts)
    assert "experts 'experts'" in caplog.text and "left unquantized" in caplog.text


def test_mx_activations_leave_experts_weight_only(caplog):
    m = _model()
    with caplog.at_level(logging.WARNING, logger="flykernels"):
        flykernels.quantize_(m, "mxfp8", activations="mx")
    assert m["layers"][0].experts.activations == "bf16" and m["layers"][0].gate.activations == "mx"
    assert "run weight-only" in caplog.text


def test_shared_experts_module_is_quantized_once():
    m = _model(layers=1)
    m["alias"] = m["layers"][0].experts
    flykernels.quantize_(m, "mxfp4")
    assert m["alias"] is m["layers"][0].experts and isinstance(m["alias"], MXExperts)


def test_quantized_module_itself_and_twice():
    ex = Qwen3MoeExperts(4, 32, 32)
    assert flykernels.quantize_(ex, "mxfp8") is ex and isinstance(ex, MXExperts)
    before = {n: b.clone() for n, b in ex.named_buffers()}
    flykernels.quantize_(ex, "mxfp4")  # already MX: left as it is
    assert ex.format == "mxfp8" and all(torch.equal(getattr(ex, n), b) for n, b in before.items())


@pytest.mark.parametrize("kind", ["qwen3", "gptoss"])
def test_state_dict_round_trip(kind):
    m = flykernels.quantize_(_model(kind), "mxfp4", skip=["lm_head"])
    sd = m.state_dict()
    assert "layers.0.experts.gate_up_proj_qweight" in sd and "layers.0.experts.down_proj_scales" in sd
    assert not any(k.endswith("experts.gate_up_proj") or k.endswith("_dtype_tag") for k in sd)
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    torch.manual_seed(123)
    fresh = flykernels.quantize_(_model(kind), "mxfp4", skip=["lm_head"])  # other random weights
    fresh.load_state_dict(loaded)
    x = torch.randn(5, 64)
    assert torch.equal(_run(fresh, x), _run(m, x))
    # built on the meta device, quantized (empty meta buffers), then loaded with assign=True
    with torch.device("meta"):
        meta = _model(kind)
    flykernels.quantize_(meta, "mxfp4", skip=["lm_head"])
    assert meta["layers"][0].experts.gate_up_proj_qweight.is_meta
    meta.load_state_dict(loaded, assign=True)
    assert torch.equal(_run(meta, x), _run(m, x))
    # the whole model pickled (the generated MX<Name> class rebuilt from the original) and deep-copied
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    whole = torch.load(buf, weights_only=False)
    assert type(whole["layers"][0].experts) is type(m["layers"][0].experts)
    assert torch.equal(_run(whole, x), _run(m, x)) and torch.equal(_run(copy.deepcopy(m), x), _run(m, x))
    # another format's bytes do not fit
    other = flykernels.quantize_(_model(kind), "mxfp8", skip=["lm_head"])
    with pytest.raises(RuntimeError, match="size mismatch"):
        other.load_state_dict(loaded)


# ---- Hugging Face's classes (skipped visibly without transformers) -------------------------------
HF_MOE = {  # config class: (its MoE fields, tiny)
    "Qwen3MoeConfig": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
    "GptOssConfig": dict(num_local_experts=8, num_experts_per_tok=2, head_dim=16,
                         layer_types=["full_attention", "full_attention"]),
    "MixtralConfig": dict(num_local_experts=8, num_experts_per_tok=2),
}


def _hf_model(cfg_name, impl):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cfg_name}")
    require_experts_impl(transformers, impl)
    cfg = cfg_cls(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=97, **HF_MOE[cfg_name])
    torch.manual_seed(0)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation=impl)
    except (TypeError, ValueError, KeyError) as e:
        pytest.skip(f"experts_implementation={impl}: {e}")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "experts" in n or "router" in n or n.endswith("gate.weight"):
                p.normal_(0.0, 0.3)  # fresh routers are all zeros (every score tied), biases zero
    return model.eval()


def _hf_experts(model):
    return [m for m in model.modules() if experts_layout(m) is not None or isinstance(m, MXExperts)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("impl", ["eager", "grouped_mm", "batched_mm"])
@pytest.mark.parametrize("cfg_name", ["Qwen3MoeConfig", "GptOssConfig"])
def test_hf_experts_module_matches_the_original(cfg_name, impl, fmt):
    """Hugging Face's experts class (whatever experts_implementation): MXExperts against the
    original module holding the dequantized weights, with experts that receive no tokens."""
    model = _hf_model(cfg_name, impl)
    orig = _hf_experts(model)[0]
    mx = MXExperts.quantize_module(copy.deepcopy(orig), fmt)
    twin = _dense_twin(orig, mx)
    E, H = mx.num_experts, 64
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, H, generator=gen)
    ids, w = _routing(5, E, 2, gen, unused=(1, 2, 6))
    with torch.no_grad():
        got, ref = mx(x, ids, w), twin(x, ids, w)
    # (gpt-oss's transposed weights run as a transposed view of the dequantized [E, N, K] bytes:
    # the same values, another summation order than the contiguous original)
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-5), (got - ref).abs().max()


@pytest.mark.parametrize("impl", ["eager", "grouped_mm"])
@pytest.mark.parametrize("cfg_name", list(HF_MOE))
def test_hf_model_quantized(cfg_name, impl):
    """quantize_ on a tiny Hugging Face MoE model: every experts module swapped, the logits those of
    the same model holding the dequantized weights, state_dict into a fresh quantized model."""
    model = _hf_model(cfg_name, impl)
    dense = copy.deepcopy(model)
    flykernels.quantize_(model, "mxfp4", skip=["lm_head"])
    experts = [(n, m) for n, m in model.named_modules() if isinstance(m, MXExperts)]
    assert len(experts) == 2
    with torch.no_grad():
        for n, m in experts:
            for wn, w in m.dequantize(torch.float32).items():
                getattr(dense.get_submodule(n), wn).copy_(w)
        for n, m in model.named_modules():
            if isinstance(m, MXLinear):
                dense.get_submodule(n).weight.copy_(m.dequantize(torch.float32))
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, ref = model(input_ids=ids).logits, dense(input_ids=ids).logits
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-5), (got - ref).abs().max()
    fresh = _hf_model(cfg_name, impl)
    flykernels.quantize_(fresh, "mxfp4", skip=["lm_head"])
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(fresh(input_ids=ids).logits, got)


@pytest.mark.parametrize("cfg_name", ["Qwen3MoeConfig", "GptOssConfig"])
def test_hf_compile_grouped_mm(cfg_name):
    """The whole quantized model under torch.compile(fullgraph=True): the experts' dequantization
    and grouped_mm traced in one graph, the eager logits."""
    model = flykernels.quantize_(_hf_model(cfg_name, "grouped_mm"), "mxfp8", skip=["lm_head"])
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits
        torch._dynamo.reset()
        got = torch.compile(model, backend="aot_eager", fullgraph=True)(input_ids=ids, use_cache=False).logits
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6)


moe_op = pytest.mark.skipif(not hasattr(torch.ops.flykernels, "moe_route"),
                            reason="this build of the extension has no flykernels::moe_*")


@moe_op
@pytest.mark.parametrize("order", ["quantize_then_patch", "patch_then_quantize"])
def test_hf_patched_moe_path_reads_the_quantized_experts(order, monkeypatch):
    """flykernels.patch's MoE path (moe_permute, grouped GEMMs, moe_unpermute) on MX experts, in
    either order: patched, its forward runs and gives the unpatched quantized model's logits."""
    model = _hf_model("Qwen3MoeConfig", "grouped_mm")
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    ref_model = flykernels.quantize_(copy.deepcopy(model), "mxfp8")
    with torch.no_grad():
        ref = ref_model(input_ids=ids).logits
    kw = dict(rms_norm=False, glu=False, rope=False, add_rms_norm=False, moe=True, causal_mask=False)
    if order == "quantize_then_patch":
        flykernels.quantize_(model, "mxfp8")
        report = flykernels.patch(model, **kw)
    else:
        report = flykernels.patch(model, **kw)
        flykernels.quantize_(model, "mxfp8")
    assert report["skipped"] == {}, report
    assert sum(c for k, c in report["patched"].items() if k.endswith("Experts")) == 2
    from flykernels import _patch
    calls = []
    real = _patch._experts_fused
    monkeypatch.setattr(_patch, "_experts_fused", lambda *a: calls.append(1) or real(*a))
    before = flykernels.torch.active()
    flykernels.torch.enable(["patch"])
    try:
        with torch.no_grad():
            got = model(input_ids=ids).logits
    finally:
        flykernels.torch.disable(["patch"])
        flykernels.torch.enable(before)
    assert len(calls) == 2
    assert torch.allclose(got, ref, rtol=1e-4, atol=1e-5)
    # the GEMM-level hook is asked for each quantized weight, and its answer is used
    asked = []

    def kernel(x, q, s, fmt, offs):
        asked.append((q.shape, fmt, offs.shape))
        return None if len(asked) > 1 else torch.zeros(x.shape[0], q.shape[1], dtype=x.dtype)
    monkeypatch.setattr(_mx, "grouped_gemm_kernel", kernel)
    flykernels.torch.enable(["patch"])
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        flykernels.torch.disable(["patch"])
        flykernels.torch.enable(before)
    assert len(asked) == 4 and asked[0][1] == "mxfp8" and asked[0][2] == (8,)
    assert flykernels.unpatch(model) == 4
