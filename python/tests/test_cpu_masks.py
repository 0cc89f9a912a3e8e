# SPDX-License-Identifier: Apache-2.0
"""Attention masks (issue 51), on the CPU: what a mask means for our kernel (flykernels/_masks.py:
the classification and the mask-free call it maps to, checked against SDPA itself), and
patch(causal_mask=True) on tiny Hugging Face Llama models under torch.compile (flykernels/_hf_masks.py):
the SDPA calls carry no mask where eager's carry none, and the outputs match stock. The Hugging
Face tests skip where transformers is not installed."""
import inspect
import threading

import pytest
import torch
import torch.nn.functional as F

import flykernels
from flykernels import _hf_masks, _masks, _patch

B, HQ, HK, D = 2, 4, 2, 8
NEG = float("-inf")


def _qkv(sq, sk, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, HQ, sq, D, generator=g).to(dtype)
    k = torch.randn(B, HK, sk, D, generator=g).to(dtype)
    v = torch.randn(B, HK, sk, D, generator=g).to(dtype)
    return q, k, v


def _tril(sq, sk, diagonal=0):
    return torch.ones(sq, sk, dtype=torch.bool).tril(diagonal)


def _additive(attend, dtype=torch.float32, low=NEG):
    return torch.zeros(attend.shape, dtype=dtype).masked_fill(~attend, low)


def _padding(lengths, sk):
    return (torch.arange(sk)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]


def _hf_padded_causal(lengths, s):  # transformers' causal mask of a right-padded batch
    return _tril(s, s)[None, None] & _padding(lengths, s)


CASES = {
    # name: (Sq, Sk, mask builder, kind, key lengths)
    "causal bool": (6, 6, lambda: _tril(6, 6), "causal", None),
    "causal 4-D": (6, 6, lambda: _tril(6, 6)[None, None].expand(B, 1, 6, 6), "causal", None),
    "causal per head": (6, 6, lambda: _tril(6, 6).expand(B, HQ, 6, 6), "causal", None),
    "causal -inf": (6, 6, lambda: _additive(_tril(6, 6)), "causal", None),
    "causal finfo.min": (6, 6, lambda: _additive(_tril(6, 6), low=torch.finfo(torch.float32).min), "causal", None),
    "causal bf16 min": (6, 6, lambda: _additive(_tril(6, 6), torch.bfloat16, torch.finfo(torch.bfloat16).min),
                        "causal", None),
    "top-left Sq < Sk": (3, 6, lambda: _tril(3, 6), "causal", None),
    "bottom-right Sq < Sk": (3, 6, lambda: _tril(3, 6, 3), "causal_bottom_right", None),
    "decode (all keys)": (1, 6, lambda: _tril(1, 6, 5), "none", None),
    "all visible": (6, 6, lambda: torch.ones(B, 1, 1, 6, dtype=torch.bool), "none", None),
    "all zero additive": (6, 6, lambda: torch.zeros(6, 6), "none", None),
    "padding": (6, 6, lambda: _padding([6, 4], 6), "padding", [6, 4]),
    "padding additive": (6, 6, lambda: _additive(_padding([3, 5], 6)), "padding", [3, 5]),
    "padding one row for all": (6, 6, lambda: _padding([4], 6), "padding", [4, 4]),
    "padding + causal": (6, 6, lambda: _hf_padded_causal([6, 4], 6), "other", None),
    "left padding": (6, 6, lambda: _padding([6, 4], 6).flip(-1), "other", None),
    "an empty row": (6, 6, lambda: _padding([6, 0], 6), "other", None),
    "heads differ": (6, 6, lambda: torch.stack([_tril(6, 6), _tril(6, 6, -1)] * 2)[None].expand(B, HQ, 6, 6),
                     "other", None),
    "random": (6, 6, lambda: torch.rand(6, 6, generator=torch.Generator().manual_seed(1)) > 0.5, "other", None),
    "bias": (6, 6, lambda: torch.randn(6, 6, generator=torch.Generator().manual_seed(2)), "other", None),
    "int dtype": (6, 6, lambda: _tril(6, 6).long(), "other", None),
    "not broadcastable": (6, 6, lambda: _tril(5, 6), "other", None),
    "requires grad": (6, 6, lambda: _additive(_tril(6, 6)).requires_grad_(), "other", None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_mask_kinds(name):
    sq, sk, build, kind, lengths = CASES[name]
    q, k, v = _qkv(sq, sk)
    got = _masks.classify(build(), q, k)
    assert got.kind == kind, got
    assert got.key_lengths == lengths, got


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[3] in ("none", "causal")])
def test_mapped_call_computes_what_the_mask_does(name):
    """The mask-free call as_sdpa_args gives equals SDPA with the mask (SDPA's own CPU kernels);
    grouped-query heads repeated for the masked call as SDPA's math path would."""
    sq, sk, build, _, _ = CASES[name]
    q, k, v = _qkv(sq, sk)
    mask = build().detach()
    attn_mask, is_causal = _masks.as_sdpa_args(_masks.classify(mask, q, k))
    assert attn_mask is None
    kr, vr = (t.repeat_interleave(HQ // HK, dim=1) for t in (k, v))
    ref = F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask.to(q.dtype) if mask.is_floating_point() else mask)
    got = F.scaled_dot_product_attention(q, kr, vr, is_causal=is_causal)
    assert torch.allclose(got, ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[3] not in ("none", "causal")])
def test_other_kinds_stay_stock(name):
    sq, sk, build, _, _ = CASES[name]
    q, k, _ = _qkv(sq, sk)
    assert _masks.as_sdpa_args(_masks.classify(build(), q, k)) is None


def test_traced_masks_are_unknown_without_reading_them():
    from torch._subclasses.fake_tensor import FakeTensorMode
    q, k, _ = _qkv(6, 6)
    with FakeTensorMode() as mode:
        fq, fk = mode.from_tensor(q), mode.from_tensor(k)
        fmask = mode.from_tensor(_tril(6, 6))
        assert _masks.classify(fmask, fq, fk).kind == "unknown"
    meta = torch.empty(6, 6, dtype=torch.bool, device="meta")
    assert _masks.classify(meta, q, k).kind == "unknown"
    assert _masks.mask_meta(meta, q, k).startswith("traced")


def test_explain_sdpa_names_the_mask():
    q, k, v = _qkv(6, 6)
    why = flykernels.torch.explain_sdpa(q, k, v, attn_mask=_tril(6, 6))
    assert "causal" in why and "is_causal=True" in why
    why = flykernels.torch.explain_sdpa(q, k, v, attn_mask=_padding([6, 4], 6))
    assert "padding" in why and "[6, 4]" in why
    assert "SDPA raises" in flykernels.torch.explain_sdpa(q, k, v, is_causal=True, attn_mask=_tril(6, 6))


# ---- patch(causal_mask=True) on Hugging Face models ----------------------------------------------------------


@pytest.fixture
def sdpa_calls(monkeypatch):
    """(attn_mask is None, is_causal, Sq) of every F.scaled_dot_product_attention call, compiled or not."""
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append((attn_mask is None, bool(is_causal), q.shape[2]))
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    torch._dynamo.reset()
    yield calls
    torch._dynamo.reset()


def _llama(cfg_name="LlamaConfig", **kw):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cfg_name}")
    cfg = cfg_cls(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, **kw)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def _patch_masks(model):
    report = flykernels.patch(model, rms_norm=False, glu=False, rope=False, add_rms_norm=False, moe=False)
    assert report["skipped"] == {}, report
    assert sum(report["patched"].values()) == 1 and next(iter(report["patched"])).endswith("Model"), report
    return report


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("use_cache", [False, True])
def test_compiled_hf_llama_passes_is_causal(backend, use_cache, patch_on, sdpa_calls):
    model = _llama()
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=use_cache).logits
        assert sdpa_calls and all(c[:2] == (True, True) for c in sdpa_calls)  # eager: no mask, is_causal
        _patch_masks(model)
        try:
            sdpa_calls.clear()
            got = torch.compile(model, backend=backend, fullgraph=True)(input_ids=ids, use_cache=use_cache).logits
            assert len(sdpa_calls) == 2 and all(c == (True, True, 7) for c in sdpa_calls), sdpa_calls
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-4)
        finally:
            assert flykernels.unpatch(model) == 1


def test_compiled_decode_step_passes_no_mask(patch_on, sdpa_calls):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    model = _llama()
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # the cache argument's name: `cache` from transformers 5.25 on, `past_key_values` before
        name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
        out = model(input_ids=ids[:, :5], use_cache=True)
        ref = model(input_ids=ids[:, 5:], use_cache=True, **{name: getattr(out, name)}).logits
        _patch_masks(model)
        try:
            cache = transformers.DynamicCache(config=model.config)
            model(input_ids=ids[:, :5], use_cache=True, **{name: cache})
            sdpa_calls.clear()
            step = torch.compile(model, backend="eager")
            got = step(input_ids=ids[:, 5:], use_cache=True, **{name: cache}).logits
            assert sdpa_calls and all(c == (True, False, 1) for c in sdpa_calls), sdpa_calls
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-4)
        finally:
            flykernels.unpatch(model)


def test_padding_and_given_positions_keep_their_masks(patch_on, sdpa_calls):
    """A padded batch and caller-given (here packed) positions need the mask: it stays, and the
    compiled patched model computes what stock eager does."""
    model = _llama()
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    am = torch.ones_like(ids)
    am[1, 5:] = 0
    packed = torch.tensor([[0, 1, 2, 0, 1, 2, 3]]).expand(2, -1)
    with torch.no_grad():
        ref_pad = model(input_ids=ids, attention_mask=am, use_cache=False).logits
        ref_packed = model(input_ids=ids, position_ids=packed, use_cache=False).logits
        _patch_masks(model)
        try:
            cm = torch.compile(model, backend="eager")
            sdpa_calls.clear()
            got = cm(input_ids=ids, attention_mask=am, use_cache=False).logits
            assert sdpa_calls and not any(c[0] for c in sdpa_calls)
            assert torch.allclose(got[0], ref_pad[0], atol=1e-5, rtol=1e-4)
            assert torch.allclose(got[1, :5], ref_pad[1, :5], atol=1e-5, rtol=1e-4)
            sdpa_calls.clear()
            got = cm(input_ids=ids, position_ids=packed, use_cache=False).logits
            assert sdpa_calls and not any(c[0] for c in sdpa_calls)
            assert torch.allclose(got, ref_packed, atol=1e-5, rtol=1e-4)
        finally:
            flykernels.unpatch(model)


def test_export_keeps_the_mask(patch_on, sdpa_calls):
    """An exported graph runs other shapes than it was traced with: there transformers keeps the
    materialized mask on purpose, and so does the patch."""
    model = _llama()
    _patch_masks(model)

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits
    try:
        torch.export.export(Logits(model), (torch.randint(0, 64, (2, 7)),), strict=False)
        assert sdpa_calls and not any(c[0] for c in sdpa_calls), sdpa_calls
    finally:
        flykernels.unpatch(model)


def test_switch_and_unpatch_restore_transformers(patch_on, sdpa_calls):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    mu = transformers.masking_utils
    own = {n: getattr(mu, n) for n in ("find_packed_sequence_indices", "_ignore_causal_mask_sdpa")}
    model = _llama()
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    _patch_masks(model)
    assert _patch.is_patched(model.model) and "forward" in model.model.__dict__
    assert all(getattr(mu, n) is not f for n, f in own.items())
    # outside a patched model's forward the replacements are transformers' own functions
    assert mu.find_packed_sequence_indices(torch.tensor([[0, 1, 0, 1]])) is not None
    assert mu._ignore_causal_mask_sdpa(None, 5, 5, 0, 0) is True
    with torch.no_grad(), flykernels.torch.disabled():  # the family off: stock's compiled call, a mask
        torch.compile(model, backend="eager")(input_ids=ids, use_cache=False)
    assert sdpa_calls and not any(c[0] for c in sdpa_calls)
    assert flykernels.unpatch(model) == 1
    assert "forward" not in model.model.__dict__ and not _patch.is_patched(model.model)
    assert all(getattr(mu, n) is f for n, f in own.items())
    assert not _hf_masks._state


def test_scope_is_per_call_and_per_thread(patch_on):
    """The 'model made its own positions' answer holds in that model's forward only: not in
    another thread meanwhile, nor in a model nested inside that was given (packed) positions."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    mu = transformers.masking_utils
    model = _llama()
    _patch_masks(model)
    packed = torch.tensor([[0, 1, 0, 1]])

    class Probe:
        def forward(self, input_ids=None, position_ids=None):
            out = {"here": mu.find_packed_sequence_indices(packed)}
            t = threading.Thread(target=lambda: out.update(thread=mu.find_packed_sequence_indices(packed)))
            t.start()
            t.join()
            if position_ids is None:
                out["nested"] = fwd(self, position_ids=packed)["here"]
            return out
    fwd = _hf_masks.forward(inspect.signature(Probe.forward), _patch._family)
    try:
        out = fwd(Probe())
        assert out["here"] is None  # the probe made its positions (none given)
        assert out["thread"] is not None and out["nested"] is not None
        assert mu.find_packed_sequence_indices(packed) is not None  # and after it
    finally:
        flykernels.unpatch(model)


def test_causal_mask_is_a_switch_of_patch(patch_on):
    model = _llama()
    assert flykernels.patch(model, rms_norm=False, glu=False, rope=False, add_rms_norm=False, moe=False,
                            causal_mask=False)["patched"] == {}
    _patch_masks(model)
    assert flykernels.patch(model)["patched"].get("LlamaModel") is None  # patching again does nothing
    flykernels.unpatch(model)


def test_two_models_share_the_replacements(patch_on):
    a, b = _llama(), _llama()
    _patch_masks(a)
    _patch_masks(b)
    flykernels.unpatch(a)
    assert _hf_masks._state  # b still patched
    flykernels.unpatch(b)
    assert not _hf_masks._state


@pytest.mark.parametrize("cfg_name,kw", [("Qwen3Config", {}), ("MistralConfig", {}),
                                         ("Gemma3TextConfig", dict(head_dim=8))])  # Gemma-3: sliding layers too
def test_other_families_compile_with_is_causal(cfg_name, kw, patch_on, sdpa_calls):
    model = _llama(cfg_name, **kw)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits
        _patch_masks(model)
        try:
            sdpa_calls.clear()
            got = torch.compile(model, backend="eager")(input_ids=ids, use_cache=False).logits
            assert sdpa_calls and all(c == (True, True, 7) for c in sdpa_calls), sdpa_calls
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-4)
        finally:
            flykernels.unpatch(model)
