# SPDX-License-Identifier: Apache-2.0
"""flykernels::add_rms_norm (RMSNorm with a fused residual add) on the CPU: the op against the
unfused composition (forward, gradients, tracing) and flykernels.patch() of decoder layers written
like Hugging Face's (which layers, the probe, the switch, undo, gradients), and tiny Hugging Face
models where transformers is installed. The CUDA kernel itself: test_gpu_patch.py and the C++ GPU
tests ([add_rmsnorm])."""
import logging

import pytest
import torch
import torch.nn as nn

import flykernels
from flykernels import _patch

pytestmark = pytest.mark.skipif(not hasattr(torch.ops.flykernels, "add_rms_norm"),
                                reason="this build of the extension has no flykernels::add_rms_norm")


def _hf_add_norm(x, residual, weight, eps):
    """What a Hugging Face decoder layer computes: hidden = residual + x, then LlamaRMSNorm."""
    h = residual + x
    hf = h.to(torch.float32)
    y = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    return (y if weight is None else weight * y), h


def test_row_view_takes_the_innermost_row_stride():
    """The (rows, row stride) the row-wise ops (add_rms_norm, glu) hand the library. A batched
    [B, S, N] tensor's row stride is S's, N (not B's, S * N: a stride that made the library read
    B * S rows that far apart; found on the GPU, where the library refused the overlap it implied)."""
    from flykernels import _loader
    rv = _loader.ext.row_view
    assert rv(torch.empty(3, 37, 1000)) == (111, 1000)
    assert rv(torch.empty(8, 1, 64)) == (8, 64)
    assert rv(torch.empty(1, 48, 64)) == (48, 64)
    assert rv(torch.empty(2, 3, 5, 16)) == (30, 16)
    assert rv(torch.empty(3, 37, 1024)[..., :1000]) == (111, 1024)  # padded rows
    assert rv(torch.empty(2, 48, 128).transpose(0, 1)) is None       # leading dims do not collapse
    assert rv(torch.empty(4, 6).t()) is None                          # last dim not unit-stride
    assert rv(torch.empty(7)) == (1, 7)
    assert rv(torch.empty(0, 5, 8)) == (0, 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_weight", [True, False])
def test_op_matches_the_composition(dtype, with_weight):
    torch.manual_seed(0)
    x, r = torch.randn(3, 5, 40, dtype=dtype), torch.randn(3, 5, 40, dtype=dtype)
    w = (torch.randn(40) * 0.5 + 1).to(dtype) if with_weight else None
    y, h = torch.ops.flykernels.add_rms_norm(x, r, w, 1e-6)
    ry, rh = _hf_add_norm(x, r, w, 1e-6)
    assert y.dtype == dtype and h.dtype == dtype and y.shape == x.shape
    assert torch.equal(h, rh) and torch.equal(y, ry)  # the CPU path is the composition, bit for bit
    y2, h2, rstd = torch.ops.flykernels.add_rms_norm_train(x, r, w, 1e-6)
    assert torch.equal(y2, y) and torch.equal(h2, h) and rstd.shape == (3, 5) and rstd.dtype == torch.float32
    want = torch.rsqrt(h.float().pow(2).mean(-1) + 1e-6)
    assert torch.allclose(rstd, want)


def test_gradients_against_the_composition():
    torch.manual_seed(1)
    shape = (4, 3, 24)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    r = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(24, dtype=torch.float64, requires_grad=True)
    # both outputs reach the loss (y through the next layer, h as the residual stream)
    assert torch.autograd.gradcheck(lambda a, b, c: torch.ops.flykernels.add_rms_norm(a, b, c, 1e-5), (x, r, w))
    assert torch.autograd.gradcheck(lambda a, b: torch.ops.flykernels.add_rms_norm(a, b, None, 1e-5), (x, r))
    gy, gh = torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64)

    def grads(fn):
        for t in (x, r, w):
            t.grad = None
        y, h = fn(x, r, w, 1e-5)
        (y * gy + h * gh).sum().backward()
        return [t.grad.clone() for t in (x, r, w)]
    def ref64(a, b, c, eps):  # the composition in FP64 (Hugging Face's casts to FP32)
        h = a + b
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * c, h
    got, ref = grads(torch.ops.flykernels.add_rms_norm), grads(ref64)
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    # only h reaches the loss: its gradient passes to x and residual, none to the weight's product
    for t in (x, r, w):
        t.grad = None
    y, h = torch.ops.flykernels.add_rms_norm(x, r, w, 1e-5)
    (h * gh).sum().backward()
    assert torch.equal(x.grad, gh) and torch.equal(r.grad, gh)
    assert w.grad is None or torch.count_nonzero(w.grad) == 0


def test_backward_op_directly():
    torch.manual_seed(2)
    dy, dh, h = (torch.randn(6, 32, dtype=torch.float64) for _ in range(3))
    w = torch.randn(32, dtype=torch.float64)
    rstd = torch.rsqrt(h.pow(2).mean(-1) + 1e-6)
    dx, dw = torch.ops.flykernels.add_rms_norm_backward(dy, dh, h, w, rstd)
    hh = h * rstd[:, None]
    g = dy * w
    want = rstd[:, None] * (g - hh * (g * hh).mean(-1, keepdim=True)) + dh
    assert torch.allclose(dx, want) and torch.allclose(dw, (dy * hh).sum(0))
    dx0, dw0 = torch.ops.flykernels.add_rms_norm_backward(dy, None, h, None, rstd)
    assert torch.allclose(dx0, rstd[:, None] * (dy - hh * (dy * hh).mean(-1, keepdim=True)))
    assert dw0.numel() == 0  # no weight, no dweight


def test_bad_arguments():
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="differ in shape"):
        torch.ops.flykernels.add_rms_norm(x, torch.randn(2, 7), None, 1e-6)
    with pytest.raises(RuntimeError, match="differ in dtype"):
        torch.ops.flykernels.add_rms_norm(x, x.double(), None, 1e-6)
    with pytest.raises(RuntimeError, match="weight"):
        torch.ops.flykernels.add_rms_norm(x, x, torch.ones(9), 1e-6)


def test_traces_with_fake_tensors():
    torch.manual_seed(3)
    x = torch.randn(4, 5, 32, requires_grad=True)
    r = torch.randn(4, 5, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)

    def f(a, b, c):
        y, h = torch.ops.flykernels.add_rms_norm(a, b, c, 1e-6)
        return (y.square() + h).sum()
    cf = torch.compile(f, backend="aot_eager", fullgraph=True)
    got = cf(x, r, w)
    got.backward()
    g1 = [t.grad.clone() for t in (x, r, w)]
    for t in (x, r, w):
        t.grad = None
    ref = f(x, r, w)
    ref.backward()
    assert torch.allclose(got, ref)
    assert all(torch.allclose(a, t.grad, rtol=1e-5, atol=1e-6) for a, t in zip(g1, (x, r, w)))
    with torch.no_grad():  # inference: the forward alone
        cg = torch.compile(lambda a, b: torch.ops.flykernels.add_rms_norm(a, b, None, 1e-6), backend="aot_eager",
                           fullgraph=True)
        for a, b in zip(cg(x, r), _hf_add_norm(x, r, None, 1e-6)):
            assert torch.allclose(a, b)


# ---- decoder layers written like Hugging Face's (transformers 5.17) --------------------------

class LlamaRMSNorm(nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dt = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(dt)


class Attention(nn.Module):
    """Stands in for self_attn: uses the rotary tables and records the arguments it got."""

    def __init__(self, n):
        super().__init__()
        self.head_dim = 8
        self.o_proj = nn.Linear(n, n, bias=False)
        self.seen = None

    def forward(self, hidden_states, position_embeddings, attention_mask=None, past_key_values=None, **kwargs):
        self.seen = dict(kwargs, attention_mask=attention_mask, past_key_values=past_key_values)
        cos, sin = position_embeddings
        return self.o_proj(hidden_states) * (1 + cos.float().mean() * sin.float().mean()).to(hidden_states.dtype), None


class MLP(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.up, self.down = nn.Linear(n, 2 * n), nn.Linear(2 * n, n)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, n=32):
        super().__init__()
        self.self_attn = Attention(n)
        self.mlp = MLP(n)
        self.input_layernorm = LlamaRMSNorm(n)
        self.post_attention_layernorm = LlamaRMSNorm(n)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, past_key_values=past_key_values,
                                          use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class MixtralDecoderLayer(LlamaDecoderLayer):  # another argument order, no use_cache
    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, position_ids=None,
                past_key_values=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, position_embeddings=position_embeddings,
                                          attention_mask=attention_mask, position_ids=position_ids,
                                          past_key_values=past_key_values, **kwargs)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class TupleMLP(MLP):
    def forward(self, x):
        return super().forward(x), torch.zeros(3)


class GptOssDecoderLayer(LlamaDecoderLayer):  # its MLP returns (output, router scores)
    def __init__(self, n=32):
        super().__init__(n)
        self.mlp = TupleMLP(n)

    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, past_key_values=past_key_values,
                                          use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states, _ = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states


class Qwen3DecoderLayer(LlamaDecoderLayer):  # a release that changed the meaning: the norm before the add
    def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None, use_cache=False,
                position_embeddings=None, **kwargs):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, position_embeddings=position_embeddings)
        hidden_states = residual + self.post_attention_layernorm(hidden_states)
        return hidden_states + self.mlp(hidden_states)


class Qwen2DecoderLayer(LlamaDecoderLayer):  # a forward the fused one cannot rebuild: positional *args
    def forward(self, hidden_states, *args):
        return super().forward(hidden_states, *args)


def _tables(S, D):
    ang = torch.randn(1, S, D // 2)
    t = torch.cat((ang, ang), dim=-1)
    return t.cos(), t.sin()


def _perturb(layer):
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)


@pytest.mark.parametrize("cls", [LlamaDecoderLayer, MixtralDecoderLayer, GptOssDecoderLayer])
def test_decoder_layer_patched_matches_and_undoes(cls, patch_on, monkeypatch):
    torch.manual_seed(4)
    layer = cls()
    _perturb(layer)
    x = torch.randn(2, 5, 32, requires_grad=True)
    pe = _tables(5, 8)
    kw = dict(position_embeddings=pe, attention_mask=None, position_ids=torch.arange(5)[None], extra_kw="passed on")

    def run():
        for p in list(layer.parameters()) + [x]:
            p.grad = None
        out = layer(x, **kw)
        out.square().sum().backward()
        return [out.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]
    ref = run()
    ref_seen = dict(layer.self_attn.seen)
    report = flykernels.patch(layer, rms_norm=False, glu=False, rope=False)
    assert report == {"patched": {cls.__name__: 1}, "skipped": {}}
    assert _patch.is_patched(layer) and "forward" in layer.__dict__
    calls = [0]
    real = torch.ops.flykernels.add_rms_norm

    def counting(*a):
        calls[0] += 1
        return real(*a)
    monkeypatch.setattr(_patch.torch.ops.flykernels, "add_rms_norm", counting)
    got = run()
    assert calls[0] == 1
    assert layer.self_attn.seen.keys() == ref_seen.keys()  # self_attn got every argument the layer passes
    assert layer.self_attn.seen["extra_kw"] == "passed on"
    assert torch.equal(got[0], ref[0])  # CPU: the op's forward is the composition, bit for bit
    for a, b in zip(got[1:], ref[1:]):  # gradients: the fused backward's formula, FP32 sums in another order
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    with flykernels.torch.disabled():  # the controller's switch: the layer's own forward
        calls[0] = 0
        assert torch.equal(layer(x, **kw), ref[0]) and calls[0] == 0
    # positional arguments bind as the layer's own forward binds them
    calls[0] = 0
    if cls is MixtralDecoderLayer:
        out = layer(x, pe, None, torch.arange(5)[None])
    else:
        out = layer(x, None, torch.arange(5)[None], None, False, pe)
    assert calls[0] == 1 and torch.allclose(out, layer.__class__.forward(layer, x, **kw), atol=1e-6)
    assert flykernels.unpatch(layer) == 1
    assert not _patch.is_patched(layer) and "forward" not in layer.__dict__


def test_decoder_layer_with_its_norms_and_mlp_patched_too(patch_on):
    torch.manual_seed(5)
    layer = LlamaDecoderLayer()
    _perturb(layer)
    x = torch.randn(2, 5, 32)
    pe = _tables(5, 8)
    ref = layer(x, position_embeddings=pe)
    report = flykernels.patch(layer)
    assert report["patched"] == {"LlamaDecoderLayer": 1, "LlamaRMSNorm": 2}
    assert torch.allclose(layer(x, position_embeddings=pe), ref, rtol=1e-5, atol=1e-5)
    assert flykernels.unpatch(layer) == 3


def test_shipped_defaults_take_decoder_layers(patch_on, monkeypatch):
    """A plain patch(model), with the package's shipped defaults, rebuilds decoder layers around the
    fused add + norm; add_rms_norm=False leaves them alone."""
    monkeypatch.setattr(_patch, "_defaults", dict(_patch.SHIPPED_DEFAULTS))
    layer = LlamaDecoderLayer()
    assert flykernels.patch(layer, rms_norm=False, glu=False, rope=False, add_rms_norm=False)["patched"] == {}
    assert flykernels.patch(layer, rms_norm=False, glu=False, rope=False)["patched"] == {"LlamaDecoderLayer": 1}
    assert flykernels.unpatch(layer) == 1


def test_patched_decoder_layer_traces_in_one_graph(patch_on):
    """torch.compile traces the rebuilt forward (argument binding included) without a graph break."""
    torch.manual_seed(9)
    layer = LlamaDecoderLayer()
    _perturb(layer)
    x = torch.randn(2, 5, 32, requires_grad=True)
    pe = _tables(5, 8)
    ref = layer(x, None, None, position_embeddings=pe)
    flykernels.patch(layer, rms_norm=False)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
        got = compiled(x, None, None, position_embeddings=pe)
        got.sum().backward()
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5) and x.grad is not None
    finally:
        torch._dynamo.reset()
        flykernels.unpatch(layer)


def test_decoder_layers_refused(patch_on, caplog):
    torch.manual_seed(6)
    changed, positional = Qwen3DecoderLayer(), Qwen2DecoderLayer()
    _perturb(changed)
    with caplog.at_level(logging.WARNING, logger="flykernels"):
        report = flykernels.patch(nn.ModuleList([changed, positional]), rms_norm=False)
    assert report["patched"] == {}
    assert "disagrees" in report["skipped"]["Qwen3DecoderLayer"]
    assert "not forward(self, hidden_states" in report["skipped"]["Qwen2DecoderLayer"]
    assert "Qwen3DecoderLayer left as it is" in caplog.text
    assert not _patch.is_patched(changed) and "forward" not in changed.__dict__
    # a post_attention_layernorm that is not an RMSNorm the op computes
    other = LlamaDecoderLayer()
    other.post_attention_layernorm = nn.LayerNorm(32)
    assert "no post_attention_layernorm RMSNorm" in flykernels.patch(other, rms_norm=False)["skipped"][
        "LlamaDecoderLayer"]


def test_decoder_layer_inputs_outside_the_op_run_its_forward(patch_on, monkeypatch):
    layer = LlamaDecoderLayer()
    flykernels.patch(layer, rms_norm=False)
    monkeypatch.setattr(_patch, "_decoder_fused", lambda *a: pytest.fail("the fused forward ran"))
    monkeypatch.setattr(LlamaDecoderLayer, "forward", lambda self, *a, **k: "own")
    pe = _tables(5, 8)
    assert layer(torch.randn(2, 5, 32, dtype=torch.float64), position_embeddings=pe) == "own"  # another dtype
    assert layer(torch.randn(2, 5, 16), position_embeddings=pe) == "own"  # another width
    assert layer("not a tensor") == "own"
    # arguments its signature does not bind: the layer's own forward (which raises the mistake)
    assert layer(torch.randn(2, 5, 32), None, None, None, False, pe, "one too many") == "own"
    flykernels.unpatch(layer)


def test_decoder_layer_mixed_dtypes_take_the_layers_own_steps(patch_on):
    """Attention output of another dtype than the residual stream (autocast): the unfused steps."""
    torch.manual_seed(7)
    layer = LlamaDecoderLayer()
    layer.mlp.double()
    real_fwd = Attention.forward

    def attn(self, hidden_states, **kw):
        out, _ = real_fwd(self, hidden_states, **kw)
        return out.double(), None
    layer.self_attn.forward = attn.__get__(layer.self_attn)
    x = torch.randn(2, 5, 32)
    pe = _tables(5, 8)
    ref = layer(x, position_embeddings=pe)
    assert ref.dtype == torch.float64
    flykernels.patch(layer, rms_norm=False, check=False)
    assert _patch.is_patched(layer)
    got = layer(x, position_embeddings=pe)
    assert got.dtype == ref.dtype and torch.allclose(got, ref)
    flykernels.unpatch(layer)


# ---- tiny Hugging Face models (where transformers is installed) ------------------------------

def _tiny(kind):
    transformers = pytest.importorskip("transformers")
    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, head_dim=16)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common)
    elif kind == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    elif kind == "mixtral":
        cfg = transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
    else:
        cfg = transformers.Qwen2Config(**common)
    cfg._attn_implementation = "eager"
    torch.manual_seed(8)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # norms of a fresh model are all ones: perturb them
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("kind,layer_cls", [("llama", "LlamaDecoderLayer"), ("qwen2", "Qwen2DecoderLayer"),
                                            ("qwen3_moe", "Qwen3MoeDecoderLayer"), ("mixtral", "MixtralDecoderLayer")])
def test_hugging_face_model_patched(kind, layer_cls, patch_on):
    model = _tiny(kind)
    ids = torch.randint(0, 128, (2, 7))

    def run():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.logits.detach().clone(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    ref_logits, ref_grads = run()
    report = flykernels.patch(model, rms_norm=False, glu=False, rope=False, moe=False, causal_mask=False)
    assert report["patched"] == {layer_cls: 2}, report
    logits, grads = run()
    assert torch.allclose(logits, ref_logits, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        assert torch.allclose(grads[n], ref_grads[n], rtol=1e-4, atol=1e-6), n
    with torch.no_grad():  # generation with a KV cache goes through the patched layers too
        gen = model.generate(ids[:1], max_new_tokens=3, do_sample=False)
    flykernels.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model.generate(ids[:1], max_new_tokens=3, do_sample=False), gen)
