# SPDX-License-Identifier: Apache-2.0
"""flykernels.patch on Hugging Face models (small configs, random weights, bf16, on the GPU):
logits and gradients of the patched model against the same model unpatched, eager, under
torch.compile and in a CUDA graph; every RMSNorm module of each family patched, its MLPs or
experts' gate (flykernels::glu) and its attention's rotary embeddings (flykernels::rope); the
sparse-MoE blocks' routing (flykernels::moe_*) and those ops on their own against torch."""
import copy

import pytest
import torch

import flykernels
from conftest import graph_logits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not flykernels.available,
                                reason="needs a CUDA device FlyKernels runs on")
transformers = pytest.importorskip("transformers")

FAMILIES = {  # config class: extra config fields
    "LlamaConfig": {},
    "MistralConfig": {},
    "Qwen2Config": {},
    "Qwen3Config": {},
    "Qwen3MoeConfig": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64),
    "MixtralConfig": dict(num_local_experts=4, num_experts_per_tok=2),
    "Gemma2Config": dict(head_dim=32),
    "Gemma3TextConfig": dict(head_dim=32),
}


def _model(cfg_name):
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cfg_name}")
    cfg = cfg_cls(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, **FAMILIES[cfg_name])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model = model.to(device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:  # fresh norms are all ones / zeros: a dropped weight would go unnoticed
                p.normal_(0.0, 0.5)
            elif n.endswith("gate.weight"):  # a fresh MoE router is all zeros: every score tied,
                p.normal_(0.0, 0.2)          # the experts chosen by tie-breaking alone
    return model


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _norm_count(model):
    return sum(1 for m in model.modules() if type(m).__name__.endswith("RMSNorm"))


@pytest.mark.parametrize("cfg_name", list(FAMILIES))
def test_patched_model_matches_stock(cfg_name):
    model = _model(cfg_name)
    ids = torch.randint(0, 512, (2, 48), device="cuda")

    def run():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                     if p.grad is not None
                                     and any(t in n for t in ("norm", "mlp", "experts", "q_proj", "k_proj"))}
    ref_logits, ref_grads = run()
    # The same model in FP32: a gradient summed over tokens with cancellation (an MoE router's) is
    # bf16 noise in stock too, so each gradient is held to stock's own distance from FP32 as well.
    model32 = copy.deepcopy(model).float()
    model32.zero_grad(set_to_none=True)
    model32(input_ids=ids, labels=ids).loss.backward()
    grads32 = {n: p.grad for n, p in model32.named_parameters() if n in ref_grads}
    del model32
    report = flykernels.patch(model)
    try:
        assert report["skipped"] == {}
        norms = sum(c for k, c in report["patched"].items() if k.endswith("RMSNorm"))
        assert norms == _norm_count(model) > 0
        assert sum(report["patched"].values()) > norms  # the MLPs or the experts' gate as well
        assert any(k.endswith("Attention") for k in report["patched"])  # the rotary embeddings
        logits, grads = run()
        assert _rel(logits, ref_logits) < 2e-2
        assert grads.keys() == ref_grads.keys()
        for n in grads:
            assert _rel(grads[n], ref_grads[n]) < 5e-2 or \
                _rel(grads[n], grads32[n]) < 2 * _rel(ref_grads[n], grads32[n]), n
    finally:
        assert flykernels.unpatch(model) == sum(report["patched"].values())


def test_patched_model_compiles_and_graphs():
    model = _model("LlamaConfig").eval()
    ids = torch.randint(0, 512, (1, 64), device="cuda")
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        flykernels.patch(model)
        try:
            torch._dynamo.reset()
            compiled = torch.compile(model, fullgraph=False)
            got = compiled(input_ids=ids).logits
            assert _rel(got, ref) < 2e-2
            # A CUDA graph of the patched eager forward replays what it captured.
            assert _rel(graph_logits(model, ids), ref) < 2e-2
        finally:
            flykernels.unpatch(model)
            torch._dynamo.reset()


def test_compiled_patched_llama_runs_our_attention(fly):
    """Issue 51: compiled, Hugging Face passed SDPA a materialized causal mask and both attention
    calls of this model went to stock; patched (causal_mask), they carry is_causal and run ours."""
    model = _model("LlamaConfig").eval()
    ids = torch.randint(0, 512, (2, 64), device="cuda")
    ops = ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn")
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits
        flykernels.patch(model)
        try:
            torch._dynamo.reset()
            fly.reset_counts()
            got = torch.compile(model)(input_ids=ids, use_cache=False).logits
            counts = fly.dispatch_counts()
            assert sum(counts[n][0] for n in ops) == 2, counts
            assert _rel(got, ref) < 2e-2
        finally:
            flykernels.unpatch(model)
            torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rope_op_against_the_composition(dtype, fly):
    """flykernels::rope on the GPU (the kernel, counted) against Hugging Face's composition in
    FP64, forward and gradients, in the layout Hugging Face hands over (q a transposed view)."""
    torch.manual_seed(1)
    B, S, Hq, Hk, D = 2, 37, 8, 2, 128
    q64 = torch.randn(B, S, Hq, D, dtype=torch.float64, device="cuda").transpose(1, 2)
    k64 = torch.randn(B, S, Hk, D, dtype=torch.float64, device="cuda").transpose(1, 2)
    ang = torch.randn(B, S, D // 2, dtype=torch.float64, device="cuda") * 5
    cos64, sin64 = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    q, k, cos, sin = (t.to(dtype) for t in (q64, k64, cos64, sin64))
    q.requires_grad_(), k.requires_grad_()

    def rot(x):
        return torch.cat((-x[..., D // 2:], x[..., :D // 2]), -1)
    fly.reset_counts()
    qo, ko = torch.ops.flykernels.rope(q, k, cos, sin, D)
    assert fly.dispatch_counts()["rope"][0] == 1  # the kernel ran, not the composition
    g = torch.randn_like(qo), torch.randn_like(ko)
    torch.autograd.backward((qo, ko), g)
    assert fly.dispatch_counts()["rope_bwd"][0] == 1
    qd, kd, c, s_ = (t.detach().double() for t in (q, k, cos, sin))
    tol = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-6}[dtype]
    for got, x, gr, gx in ((qo, qd, g[0], q.grad), (ko, kd, g[1], k.grad)):
        ref = x * c.unsqueeze(1) + rot(x) * s_.unsqueeze(1)
        assert _rel(got, ref) < tol
        xg = x.clone().requires_grad_()
        (xg * c.unsqueeze(1) + rot(xg) * s_.unsqueeze(1)).backward(gr.double())
        assert _rel(gx, xg.grad) < tol


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("with_weight", [True, False])
def test_add_rms_norm_op_against_the_composition(dtype, with_weight, fly):
    """flykernels::add_rms_norm on the GPU (the kernels, counted) against the composition in FP64,
    forward (y and the residual stream h) and gradients (x, residual, weight), x a row-strided view."""
    torch.manual_seed(2)
    M, N = 3 * 37, 1000
    xbuf = torch.randn(3, 37, N + 24, dtype=torch.float64, device="cuda")
    x64, r64 = xbuf[..., :N], torch.randn(3, 37, N, dtype=torch.float64, device="cuda")
    w64 = torch.rand(N, dtype=torch.float64, device="cuda") + 0.5
    x, r = x64.to(dtype).requires_grad_(), r64.to(dtype).requires_grad_()
    w = w64.to(dtype).requires_grad_() if with_weight else None
    fly.reset_counts()
    y, h = torch.ops.flykernels.add_rms_norm(x, r, w, 1e-6)
    assert fly.dispatch_counts()["add_rms_norm"][0] == 1  # the kernel ran, not the composition
    gy, gh = torch.randn_like(y), torch.randn_like(h)
    torch.autograd.backward((y, h), (gy, gh))
    assert fly.dispatch_counts()["add_rms_norm_bwd"][0] == 1
    xd, rd = x.detach().double().requires_grad_(), r.detach().double().requires_grad_()
    wd = w.detach().double().requires_grad_() if with_weight else None
    hd = xd + rd
    yd = hd * torch.rsqrt(hd.pow(2).mean(-1, keepdim=True) + 1e-6)
    if with_weight:
        yd = yd * wd
    torch.autograd.backward((yd, hd), (gy.double(), gh.double()))
    tol = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}[dtype]
    assert _rel(h, x.detach().double() + r.detach().double()) < tol
    assert _rel(y, yd) < tol
    assert _rel(x.grad, xd.grad) < tol and _rel(r.grad, rd.grad) < tol
    if with_weight:
        assert _rel(w.grad, wd.grad) < tol
    # repeat runs: the same bits (deterministic dweight)
    x.grad = r.grad = None
    if with_weight:
        g1 = w.grad.clone()
        w.grad = None
    y, h = torch.ops.flykernels.add_rms_norm(x, r, w, 1e-6)
    torch.autograd.backward((y, h), (gy, gh))
    if with_weight:
        assert torch.equal(w.grad, g1)


def test_add_rms_norm_propagates_nan_like_the_composition(fly):
    x = torch.ones(3, 64, device="cuda", dtype=torch.bfloat16)
    r = torch.zeros_like(x)
    x[0, 3] = float("nan")
    r[1, 5] = float("inf")
    with torch.no_grad():
        y, h = torch.ops.flykernels.add_rms_norm(x, r, None, 1e-6)
        hr = x + r
        yr = (hr.float() * torch.rsqrt(hr.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
    assert torch.equal(torch.isnan(y), torch.isnan(yr)) and torch.equal(torch.isnan(h), torch.isnan(hr))
    assert torch.equal(y[2], yr[2])


@pytest.mark.parametrize("cfg_name", ["LlamaConfig", "Qwen3MoeConfig"])
def test_patched_decoder_layers_run_the_fused_add_norm(cfg_name, fly):
    model = _model(cfg_name)
    ids = torch.randint(0, 512, (2, 48), device="cuda")
    report = flykernels.patch(model, rms_norm=False, glu=False, rope=False, moe=False, causal_mask=False)
    try:
        layer = cfg_name.replace("Config", "DecoderLayer")
        assert report["patched"] == {layer: 2} and report["skipped"] == {}
        fly.reset_counts()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        counts = fly.dispatch_counts()
        assert counts["add_rms_norm"] == (2, 0) and counts["add_rms_norm_bwd"] == (2, 0)
    finally:
        assert flykernels.unpatch(model) == 2
# ---- mixture-of-experts routing --------------------------------------------------------------------
MOE_FAMILIES = {  # config class: its MoE fields (8 experts, top-2)
    "Qwen3MoeConfig": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True),
    "MixtralConfig": dict(num_local_experts=8, num_experts_per_tok=2),
    "OlmoeConfig": dict(num_experts=8, num_experts_per_tok=2),
}
MOE_OPS = ("moe_route", "moe_route_bwd", "moe_permute", "moe_permute_bwd", "moe_unpermute", "moe_unpermute_bwd")


def _moe_model(cfg_name):
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cfg_name}")
    cfg = cfg_cls(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, **MOE_FAMILIES[cfg_name])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("gate.weight"):  # a fresh router is all zeros: every score tied
                p.normal_(0.0, 0.2)
    return model.to(device="cuda", dtype=torch.bfloat16)


@pytest.mark.parametrize("cfg_name", list(MOE_FAMILIES))
def test_moe_blocks_run_the_fused_routing(cfg_name, fly):
    """The sparse-MoE blocks of Qwen3-MoE, Mixtral and OLMoE patched (routers and experts only):
    logits and gradients against the same model unpatched, and every routing op ran our kernels."""
    model = _moe_model(cfg_name)
    ids = torch.randint(0, 512, (2, 48), device="cuda")

    def run():
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                     if p.grad is not None and ("experts" in n or "gate" in n)}
    ref_logits, ref_grads = run()
    report = flykernels.patch(model, rms_norm=False, glu=False, rope=False)
    try:
        assert report["skipped"] == {}, report
        routers = sum(c for k, c in report["patched"].items() if k.endswith("Router"))
        experts = sum(c for k, c in report["patched"].items() if k.endswith("Experts"))
        assert routers == experts == 2, report
        fly.reset_counts()
        logits, grads = run()
        counts = fly.dispatch_counts()
        for op in MOE_OPS:
            if op == "moe_permute_bwd":
                continue  # the embeddings' input needs no gradient through the first block's x
            assert counts[op][0] >= 2 and counts[op][1] == 0, (op, counts[op])
        assert _rel(logits, ref_logits) < 2e-2
        assert grads.keys() == ref_grads.keys()
        for n in grads:
            assert _rel(grads[n], ref_grads[n]) < 5e-2, n
    finally:
        assert flykernels.unpatch(model) == sum(report["patched"].values())


def test_moe_patched_model_compiles_and_graphs():
    model = _moe_model("Qwen3MoeConfig").eval()
    ids = torch.randint(0, 512, (1, 64), device="cuda")
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        flykernels.patch(model)
        try:
            torch._dynamo.reset()
            got = torch.compile(model, fullgraph=False)(input_ids=ids).logits
            assert _rel(got, ref) < 2e-2
            # A CUDA graph: no host sync anywhere in routing, permute and unpermute.
            assert _rel(graph_logits(model, ids), ref) < 2e-2
        finally:
            flykernels.unpatch(model)
            torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("score,flags", [(0, 0), (0, 1), (1, 1), (0, 2)])
def test_moe_route_op_against_torch(dtype, score, flags, fly):
    """flykernels::moe_route on the GPU (the kernel, counted) against softmax/sigmoid + torch.topk
    (+ renorm) in FP64: the same experts where no two scores tie, weights and dlogits close."""
    torch.manual_seed(2)
    T, E, k = 513, 128, 8
    logits = (torch.randn(T, E, device="cuda") * 2).to(dtype).requires_grad_()
    fly.reset_counts()
    w, ids = torch.ops.flykernels.moe_route(logits, k, score, flags)
    assert fly.dispatch_counts()["moe_route"][0] == 1
    l64 = logits.detach().double().requires_grad_()
    if flags & 2:
        v, rids = l64.topk(k, dim=-1)
        rw = v.softmax(-1) if score == 0 else v.sigmoid()
    else:
        s = l64.softmax(-1) if score == 0 else l64.sigmoid()
        rw, rids = s.topk(k, dim=-1)
    if flags & 1:
        rw = rw / rw.sum(-1, keepdim=True)
    # bf16 logits tie often (128 experts, 8 mantissa bits): tied experts may come in either order,
    # so the chosen scores must equal the reference's top k, and the ids too on rows with no tie
    # among the top k + 1 scores.
    scores = l64 if flags & 2 else (l64.softmax(-1) if score == 0 else l64.sigmoid())
    top = scores.detach().topk(k + 1, dim=-1).values
    assert torch.equal(scores.detach().gather(-1, ids), top[:, :k])
    untied = (top[:, 1:] != top[:, :-1]).all(-1)
    assert untied.float().mean().item() > 0.5
    assert torch.equal(ids[untied], rids[untied])
    same = (ids == rids).all(-1)
    assert _rel(w[same], rw[same]) < 1e-5
    g = torch.randn_like(w)
    w.backward(g)
    assert fly.dispatch_counts()["moe_route_bwd"][0] == 1
    # The reference gradient for the kernel's own selection.
    sel = l64.gather(-1, ids) if flags & 2 else (l64.softmax(-1) if score == 0 else l64.sigmoid()).gather(-1, ids)
    if flags & 2:
        sel = sel.softmax(-1) if score == 0 else sel.sigmoid()
    if flags & 1:
        sel = sel / sel.sum(-1, keepdim=True)
    sel.backward(g.double())
    assert _rel(logits.grad, l64.grad) < (1e-2 if dtype == torch.bfloat16 else 1e-5)


def test_moe_route_ties_against_torch_topk():
    """Exact ties: the kernel takes the lower expert id first. Reports what torch.topk on CUDA does
    (Hugging Face's routers use it) without failing on it: the rule is ours, documented."""
    logits = torch.zeros(4, 64, device="cuda")
    logits[:, 10] = logits[:, 20] = 1.0
    _, ids = torch.ops.flykernels.moe_route(logits, 4, 0, 1)
    assert ids.tolist() == [[10, 20, 0, 1]] * 4
    tk = logits.softmax(-1).topk(4, dim=-1).indices
    print("torch.topk on CUDA, ties:", tk[0].tolist(), "(flykernels: [10, 20, 0, 1])")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_moe_permute_unpermute_against_torch(dtype, fly):
    """permute / unpermute and their backward on the GPU (kernels, counted) against Hugging Face's
    sort + gather + weighted sum, with a skewed load and empty experts."""
    torch.manual_seed(3)
    T, k, E, H = 1000, 8, 64, 256
    probs = torch.softmax(torch.randn(E, device="cuda") * 3, 0)  # skewed loads, some experts empty
    ids = torch.multinomial(probs.expand(T, E), k, replacement=False)
    ids[ids % 9 == 4] = 0  # duplicates allowed too
    x = torch.randn(T, H, device="cuda", dtype=dtype, requires_grad=True)
    fly.reset_counts()
    x_perm, offs, row_of, pair_of = torch.ops.flykernels.moe_permute(x, ids, E)
    order = torch.sort(ids.reshape(-1), stable=True).indices
    assert torch.equal(pair_of.long(), order)
    assert torch.equal(offs, torch.cumsum(torch.bincount(ids.reshape(-1), minlength=E), 0).int())
    assert torch.equal(x_perm, x.detach()[order // k])
    out = torch.randn(T * k, H, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.rand(T, k, device="cuda", requires_grad=True)
    y = torch.ops.flykernels.moe_unpermute(out, w, row_of, offs)
    ref = (out.detach().double()[row_of.long()] * w.detach().double().unsqueeze(-1)).sum(1)
    tol = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-6}[dtype]
    assert _rel(y, ref) < tol
    dy = torch.randn_like(y)
    torch.autograd.backward((y, x_perm), (dy, torch.randn_like(x_perm)))
    c = fly.dispatch_counts()
    assert all(c[op][0] == 1 and c[op][1] == 0 for op in ("moe_permute", "moe_unpermute", "moe_unpermute_bwd",
                                                           "moe_permute_bwd")), c
    assert _rel(w.grad, (out.detach().double()[row_of.long()] * dy.double().unsqueeze(1)).sum(-1)) < tol * 10
    assert _rel(out.grad[row_of.long()], w.detach().double().unsqueeze(-1) * dy.double().unsqueeze(1)) < tol
