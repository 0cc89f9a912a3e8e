# SPDX-License-Identifier: Apache-2.0
"""flykernels::cross_entropy_* ops and flykernels.linear_cross_entropy on the CPU (the composition
path, with the kernel's rules) against F.linear + F.cross_entropy: losses and gradients for every
reduction, chunking, ignore_index, num_items_in_batch, bad labels, tracing; and
flykernels.patch(model, linear_cross_entropy=True) of causal language models, on a model written
like Hugging Face's (always) and on tiny Hugging Face models (where transformers is installed).
The CUDA kernel itself: test_gpu_cross_entropy.py and the C++ GPU tests ([cross_entropy])."""
import dataclasses
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import flykernels
from flykernels import _lce, _patch

pytestmark = pytest.mark.skipif(not hasattr(torch.ops.flykernels, "cross_entropy_fwd_bwd_"),
                                reason="this build of the extension has no flykernels::cross_entropy_fwd_bwd_")


def _ref_rows(x, labels, ignore_index):
    """Per-row loss of torch's cross_entropy in FP32 (0 where ignored) and its summed-loss gradient."""
    x = x.detach().float().requires_grad_()
    loss = F.cross_entropy(x, labels, ignore_index=ignore_index, reduction="none")
    loss.sum().backward()
    return loss.detach(), x.grad


# ---- the ops ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_ops_match_torch_cross_entropy(dtype):
    torch.manual_seed(0)
    x = (torch.randn(9, 37) * 3).to(dtype)
    lab = torch.randint(0, 37, (9,))
    lab[[1, 4]] = -100
    ref_loss, ref_g = _ref_rows(x, lab, -100)
    loss, lse, g = torch.ops.flykernels.cross_entropy_fwd_bwd(x, lab, -100, 0.25)
    assert loss.dtype == torch.float32 and lse.dtype == torch.float32 and g.dtype == dtype
    assert torch.allclose(loss, ref_loss, atol=1e-5, rtol=1e-5)
    assert torch.allclose(g.float(), (ref_g * 0.25).to(dtype).float(), atol=1e-6, rtol=0)
    want_lse = torch.logsumexp(x.float(), -1)
    want_lse[[1, 4]] = 0
    assert torch.allclose(lse, want_lse, atol=1e-5)
    assert torch.all(g[[1, 4]] == 0)
    # in place: the logits become the gradient, the same loss
    y = x.clone()
    loss2, lse2 = torch.ops.flykernels.cross_entropy_fwd_bwd_(y, lab, -100, 0.25)
    assert torch.equal(loss2, loss) and torch.equal(lse2, lse) and torch.equal(y, g)
    loss3, lse3 = torch.ops.flykernels.cross_entropy_loss(x, lab, -100)
    assert torch.equal(loss3, loss) and torch.equal(lse3, lse)


def test_ops_bad_labels_nan_and_inf():
    x = torch.zeros(6, 5)
    x[2, 1] = float("nan")
    x[3, 0] = float("inf")
    x[4, 2] = float("-inf")
    lab = torch.tensor([5, -3, 0, 1, 2, 7])  # out of range, negative, a NaN row, +Inf row, -Inf label, ignored
    loss, lse, g = torch.ops.flykernels.cross_entropy_fwd_bwd(x, lab, 7, 1.0)
    assert torch.isnan(loss[0]) and torch.isnan(loss[1]) and torch.isnan(g[:2]).all()  # never an index
    assert torch.isfinite(lse[0]) and torch.isclose(lse[0], torch.tensor(5.0).log())
    assert torch.isnan(loss[2]) and torch.isnan(g[2]).all()
    assert torch.isnan(loss[3]) and torch.isnan(g[3]).all()
    assert loss[4] == float("inf") and torch.isfinite(g[4]).all()
    assert loss[5] == 0 and lse[5] == 0 and (g[5] == 0).all()
    # torch agrees where it does not raise
    ref = F.cross_entropy(x[2:5], lab[2:5], reduction="none")
    assert torch.isnan(ref[0]) and torch.isnan(ref[1]) and ref[2] == float("inf")


def test_ops_argument_errors_and_empty():
    with pytest.raises(RuntimeError, match="logits must be"):
        torch.ops.flykernels.cross_entropy_loss(torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long), -100)
    with pytest.raises(RuntimeError, match="labels"):
        torch.ops.flykernels.cross_entropy_loss(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long), -100)
    with pytest.raises(RuntimeError, match="integer"):
        torch.ops.flykernels.cross_entropy_loss(torch.zeros(2, 3), torch.zeros(2), -100)
    loss, lse, g = torch.ops.flykernels.cross_entropy_fwd_bwd(torch.zeros(0, 8), torch.zeros(0, dtype=torch.long),
                                                              -100, 1.0)
    assert loss.shape == (0,) and g.shape == (0, 8)


def test_ops_trace_with_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(16, 1000, dtype=torch.bfloat16)
        lab = torch.empty(16, dtype=torch.long)
        loss, lse, g = torch.ops.flykernels.cross_entropy_fwd_bwd(x, lab, -100, 1.0)
        assert loss.shape == (16,) and loss.dtype == torch.float32 and g.shape == x.shape and g.dtype == x.dtype
        loss, lse = torch.ops.flykernels.cross_entropy_fwd_bwd_(x, lab, -100, 1.0)
        assert lse.shape == (16,)
        loss, lse = torch.ops.flykernels.cross_entropy_loss(x, lab, -100)
        assert loss.dtype == torch.float32


# ---- linear_cross_entropy ---------------------------------------------------------------------------
def _case(seed=0, dtype=torch.float32, shape=(3, 7), H=16, V=50, bias=True, ignored=3):
    torch.manual_seed(seed)
    h = torch.randn(*shape, H, dtype=dtype, requires_grad=True)
    w = (torch.randn(V, H) * 0.5).to(dtype).requires_grad_()
    b = (torch.randn(V) * 0.1).to(dtype).requires_grad_() if bias else None
    lab = torch.randint(0, V, shape)
    lab.view(-1)[:ignored] = -100
    return h, w, b, lab


def _grads(loss, params, g=None):
    return torch.autograd.grad(loss, [p for p in params if p is not None], g)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("chunk", [None, 1, 5, 64])
@pytest.mark.parametrize("bias", [True, False])
def test_lce_matches_linear_plus_cross_entropy(reduction, chunk, bias):
    h, w, b, lab = _case(bias=bias)
    out = flykernels.linear_cross_entropy(h, w, lab, bias=b, reduction=reduction, chunk_size=chunk)
    ref = _lce.reference_linear_cross_entropy(h, w, lab, b, reduction=reduction)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(ref) if reduction == "none" else torch.tensor(1.7)
    for a, r in zip(_grads(out, (h, w, b), g), _grads(ref, (h, w, b), g)):
        assert torch.allclose(a, r, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("num_items", [11, "tensor"])
def test_lce_num_items_in_batch(num_items):
    h, w, b, lab = _case(seed=2)
    n = torch.tensor(11) if num_items == "tensor" else num_items
    out = flykernels.linear_cross_entropy(h, w, lab, bias=b, num_items_in_batch=n, chunk_size=4)
    ref = _lce.reference_linear_cross_entropy(h, w, lab, b, num_items_in_batch=n)
    assert torch.allclose(out, ref, atol=1e-6)
    assert torch.allclose(out * 11, F.cross_entropy(F.linear(h, w, b).reshape(-1, 50).float(), lab.reshape(-1),
                                                    reduction="sum"), atol=1e-4)
    for a, r in zip(_grads(out, (h, w, b)), _grads(ref, (h, w, b))):
        assert torch.allclose(a, r, atol=1e-6, rtol=1e-4)


def test_lce_bf16_close_to_the_fp32_reference():
    h, w, b, lab = _case(seed=3, dtype=torch.bfloat16, shape=(4, 33), H=64, V=300, bias=False)
    out = flykernels.linear_cross_entropy(h, w, lab, chunk_size=40)
    ref = _lce.reference_linear_cross_entropy(h, w, lab)
    assert out.dtype == torch.float32
    assert torch.allclose(out, ref, rtol=1e-3, atol=1e-3)
    gh, gw = _grads(out, (h, w))
    rh, rw = _grads(ref, (h, w))
    assert gh.dtype == torch.bfloat16 and gw.dtype == torch.bfloat16
    for a, r in ((gh, rh), (gw, rw)):
        assert ((a.float() - r.float()).norm() / r.float().norm()) < 2e-2


def test_lce_all_ignored_and_no_grad():
    h, w, b, lab = _case(seed=4, ignored=21)
    out = flykernels.linear_cross_entropy(h, w, lab, bias=b)
    assert torch.isnan(out)  # 0 / 0 as torch's mean over no tokens
    assert torch.isnan(_lce.reference_linear_cross_entropy(h, w, lab, b))
    s = flykernels.linear_cross_entropy(h, w, lab, bias=b, reduction="sum")
    assert s == 0
    gh, gw, gb = _grads(s, (h, w, b))
    assert (gh == 0).all() and (gw == 0).all() and (gb == 0).all()
    with torch.no_grad():  # the loss-only op: no gradient buffers
        h2, w2, b2, lab2 = _case(seed=5)
        got = flykernels.linear_cross_entropy(h2, w2, lab2, bias=b2, chunk_size=3)
        assert torch.allclose(got, _lce.reference_linear_cross_entropy(h2, w2, lab2, b2), atol=1e-6)


def test_lce_only_some_inputs_need_gradients():
    h, w, b, lab = _case(seed=6)
    w.requires_grad_(False)
    out = flykernels.linear_cross_entropy(h, w, lab, bias=b, chunk_size=6)
    ref = _lce.reference_linear_cross_entropy(h, w, lab, b)
    (gh,) = torch.autograd.grad(out, [h])
    (rh,) = torch.autograd.grad(ref, [h])
    assert torch.allclose(gh, rh, atol=1e-6, rtol=1e-4)


def test_lce_backward_twice_is_refused():
    h, w, b, lab = _case(seed=7)
    out = flykernels.linear_cross_entropy(h, w, lab, bias=b)
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        out.backward()


def test_lce_bad_arguments():
    h, w, b, lab = _case()
    with pytest.raises(ValueError, match="reduction"):
        flykernels.linear_cross_entropy(h, w, lab, reduction="avg")
    with pytest.raises(ValueError, match="num_items_in_batch"):
        flykernels.linear_cross_entropy(h, w, lab, reduction="none", num_items_in_batch=3)
    with pytest.raises(ValueError, match="weight"):
        flykernels.linear_cross_entropy(h, w[:, :8], lab)
    with pytest.raises(ValueError, match="labels"):
        flykernels.linear_cross_entropy(h, w, lab[:, :3])
    with pytest.raises(ValueError, match="integers"):
        flykernels.linear_cross_entropy(h, w, lab.float())
    with pytest.raises(ValueError, match="bias"):
        flykernels.linear_cross_entropy(h, w, lab, bias=b[:3])
    with pytest.raises(ValueError, match="chunk_size"):
        flykernels.linear_cross_entropy(h, w, lab, chunk_size=0)


def test_default_chunk_rows_bounds_the_logits():
    for V, es in ((128256, 2), (151936, 2), (32000, 2), (128256, 4), (10**7, 2)):
        rows = _lce.default_chunk_rows(V, es)
        assert rows % 128 == 0 and rows >= 128
        assert rows * V * es <= _lce.CHUNK_LOGITS_BYTES or rows == 128
    assert _lce.default_chunk_rows(128256, 2) == 2048
    assert _lce.default_chunk_rows(128256, 2, tokens=100) == 100


def test_lce_without_the_extension_composes(monkeypatch):
    monkeypatch.setattr(_lce, "have_fused", lambda: False)
    h, w, b, lab = _case(seed=8)
    out = flykernels.linear_cross_entropy(h, w, lab, bias=b)
    assert torch.equal(out, _lce.reference_linear_cross_entropy(h, w, lab, b))


# ---- patch(model, linear_cross_entropy=True): a causal LM written like Hugging Face's ----------------
def ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                    **kwargs):
    """Hugging Face's causal-LM loss (transformers/loss/loss_utils.py), restated for the test."""
    logits = logits.float()
    if shift_labels is None:
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1).to(logits.device)
    red = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(logits, shift_labels, ignore_index=ignore_index, reduction=red)
    return loss / num_items_in_batch if red == "sum" else loss


@dataclasses.dataclass
class _Out:
    loss: object = None
    aux_loss: object = None
    logits: object = None
    hidden_states: object = None

    def to_tuple(self):
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None)


@dataclasses.dataclass
class _BodyOut:
    last_hidden_state: object = None


class _Config:
    vocab_size, return_dict, final_logit_softcapping = 61, True, None


class _Body(nn.Module):
    def __init__(self, V, H):
        super().__init__()
        self.emb = nn.Embedding(V, H)
        self.lin = nn.Linear(H, H)

    def forward(self, input_ids=None, **kwargs):
        return _BodyOut(last_hidden_state=torch.tanh(self.lin(self.emb(input_ids))))


class LlamaForCausalLM(nn.Module):
    """The shape of transformers 5's forward: model, lm_head over the kept positions, the loss
    from loss_function, (MoE: the router's auxiliary loss added)."""

    def __init__(self, aux=False, bias=False):
        super().__init__()
        self.config = _Config()
        self.model = _Body(61, 24)
        self.lm_head = nn.Linear(24, 61, bias=bias)
        self.aux = aux
        self.router_aux_loss_coef = 0.01
        self.loss_function = ForCausalLMLoss

    def forward(self, input_ids=None, attention_mask=None, labels=None, use_cache=None, logits_to_keep=0,
                **kwargs):
        return_dict = kwargs.pop("return_dict", self.config.return_dict)
        body_kw = {k: v for k, v in kwargs.items() if k not in ("num_items_in_batch", "shift_labels", "ignore_index")}
        hidden = self.model(input_ids=input_ids, **body_kw).last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden[:, keep, :])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        aux = (hidden.float() ** 2).mean() if self.aux else None
        if aux is not None and labels is not None:
            loss = loss + self.router_aux_loss_coef * aux
        out = _Out(loss=loss, aux_loss=aux, logits=logits)
        return out if return_dict else out.to_tuple()


def _train_step(model, **kw):
    model.zero_grad(set_to_none=True)
    out = model(**kw)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("aux", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kw", [{}, {"num_items_in_batch": 13}, {"ignore_index": 5}, {"shift_labels": "given"}])
def test_patched_loss_and_gradients_match_stock(aux, bias, kw, patch_on):
    torch.manual_seed(0)
    model = LlamaForCausalLM(aux=aux, bias=bias)
    ids = torch.randint(0, 61, (2, 9))
    labels = ids.clone()
    labels[0, :3] = kw.get("ignore_index", -100)
    kw = dict(kw)
    if kw.get("shift_labels") == "given":
        kw["shift_labels"] = torch.randint(0, 61, (2, 9))
    ref, ref_g = _train_step(model, input_ids=ids, labels=labels, **kw)
    report = flykernels.patch(model, linear_cross_entropy=True)
    assert report["patched"] == {"LlamaForCausalLM": 1}, report
    assert _patch.is_patched(model)
    out, g = _train_step(model, input_ids=ids, labels=labels, **kw)
    assert out.logits is None  # never materialized
    assert torch.allclose(out.loss, ref.loss, atol=1e-6, rtol=1e-5)
    if aux:
        assert torch.allclose(out.aux_loss, ref.aux_loss)
    assert g.keys() == ref_g.keys()
    for n in g:
        assert torch.allclose(g[n], ref_g[n], atol=1e-6, rtol=1e-4), n
    assert flykernels.unpatch(model) == 1
    out, _ = _train_step(model, input_ids=ids, labels=labels, **kw)
    assert out.logits is not None


def test_patched_model_runs_its_own_forward_elsewhere(patch_on):
    torch.manual_seed(1)
    model = LlamaForCausalLM()
    ids = torch.randint(0, 61, (2, 6))
    flykernels.patch(model, linear_cross_entropy=True)
    assert model(input_ids=ids).logits.shape == (2, 6, 61)                      # no labels
    with torch.no_grad():
        assert model(input_ids=ids, labels=ids).logits is not None              # inference (eval loss)
    with pytest.raises(ValueError, match="batch_size"):  # logits_to_keep: the own forward (whose loss raises)
        model(input_ids=ids, labels=ids, logits_to_keep=2)
    assert model(input_ids=ids, labels=ids).logits is None                      # training: fused
    tup = model(input_ids=ids, labels=ids, return_dict=False)                   # a tuple, loss first
    assert isinstance(tup, tuple) and tup[0].dim() == 0 and len(tup) == 1
    model.config.final_logit_softcapping = 30.0                                 # Gemma-2's softcap
    assert model(input_ids=ids, labels=ids).logits is not None
    model.config.final_logit_softcapping = None
    model.loss_function = lambda **kw: torch.zeros(())                          # a custom loss
    assert model(input_ids=ids, labels=ids).logits is not None
    model.loss_function = ForCausalLMLoss
    with flykernels.torch.disabled():                                            # the switch
        assert model(input_ids=ids, labels=ids).logits is not None
    flykernels.unpatch(model)


def test_patch_self_check_refuses_a_different_loss(patch_on, caplog):
    model = LlamaForCausalLM()

    def ForCausalLMLoss(logits, labels, vocab_size, **kw):  # noqa: N802  (same name, another loss)
        return F.cross_entropy(logits.float().view(-1, vocab_size), labels.view(-1)) * 2
    model.loss_function = ForCausalLMLoss
    _patch._checked.clear()
    with caplog.at_level(logging.WARNING, logger="flykernels"):
        report = flykernels.patch(model, linear_cross_entropy=True)
    _patch._checked.clear()
    assert report["patched"] == {} and "LlamaForCausalLM" in report["skipped"]
    assert "disagrees" in report["skipped"]["LlamaForCausalLM"]


def test_linear_cross_entropy_is_opt_in_as_shipped(monkeypatch):
    assert _patch.SHIPPED_DEFAULTS["linear_cross_entropy"] is False
    monkeypatch.setattr(_patch, "_defaults", dict(_patch.SHIPPED_DEFAULTS))
    model = LlamaForCausalLM()
    assert "LlamaForCausalLM" not in flykernels.patch(model)["patched"]
    assert flykernels.patch(model, linear_cross_entropy=True)["patched"] == {"LlamaForCausalLM": 1}
    flykernels.unpatch(model)


# ---- tiny Hugging Face models --------------------------------------------------------------------------
HF_CAUSAL = {
    "LlamaConfig": {}, "MistralConfig": {}, "Qwen2Config": {}, "Qwen3Config": {},
    "Qwen3MoeConfig": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, output_router_logits=True),
    "MixtralConfig": dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=True),
}


@pytest.mark.parametrize("cfg_name", list(HF_CAUSAL))
def test_hf_causal_lms_patched_on_the_cpu(cfg_name, patch_on):
    """Hugging Face's own models (tiny, FP32, CPU, where transformers is installed): the patched
    training loss and every gradient equal stock's; logits None; unpatch restores them."""
    transformers = pytest.importorskip("transformers")
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cfg_name}")
    cfg = cfg_cls(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=97, **HF_CAUSAL[cfg_name])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.train()
    ids = torch.randint(0, 97, (2, 11))
    labels = ids.clone()
    labels[1, :4] = -100
    ref, ref_g = _train_step(model, input_ids=ids, labels=labels)
    ref_n, _ = _train_step(model, input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(15))
    report = flykernels.patch(model, rms_norm=False, glu=False, rope=False, add_rms_norm=False, moe=False,
                              causal_mask=False, linear_cross_entropy=True)
    assert report["skipped"] == {}, report
    assert sum(c for k, c in report["patched"].items() if k.endswith("ForCausalLM")) == 1, report
    out, g = _train_step(model, input_ids=ids, labels=labels)
    assert out.logits is None
    assert torch.allclose(out.loss, ref.loss, atol=1e-6, rtol=1e-5)
    for n in ref_g:
        assert torch.allclose(g[n], ref_g[n], atol=1e-6, rtol=1e-4), n
    out_n, _ = _train_step(model, input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(15))
    assert torch.allclose(out_n.loss, ref_n.loss, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        assert model(input_ids=ids, labels=labels).logits.shape == (2, 11, 97)
    assert flykernels.unpatch(model) == 1
